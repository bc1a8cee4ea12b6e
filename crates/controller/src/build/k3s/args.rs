//! The `k3s server` command line of a tenant control plane: agentless, without k3s's add-ons,
//! its controllers trimmed to what a cluster without nodes of its own runs, and its API server
//! dialling the virtual Nodes' kubelet at the operator's endpoint.

use super::{BuildOptions, DATA_DIR, KUBELET_CA_FILE};
use crate::build::admission::ADMISSION_CONFIG;
use crate::build::layout::Addressing;
use crate::names;

/// Controllers that are off unless named, which k3s names (its default list is
/// `*,tokencleaner`): a list of our own replaces k3s's, so it names them again.
const ENABLED_CONTROLLERS: &[&str] = &["tokencleaner"];

/// Controllers k3s must not run with no nodes of its own: the syncer owns nodes and volumes.
const DISABLED_CONTROLLERS: &[&str] = &[
    "nodeipam",
    "nodelifecycle",
    "persistentvolume-binder",
    "attachdetach",
    "persistentvolume-expander",
    "cloud-node-lifecycle",
    "ttl",
];

/// The tenant API server's flag for which Node address it dials a kubelet at, and its order.
pub const KUBELET_ADDRESS_TYPES: &str = "kubelet-preferred-address-types=";
/// The order: a Node's Hostname address first, where virtual Nodes name the kubelet endpoint.
pub const KUBELET_ADDRESS_ORDER: &str = "Hostname,InternalIP,ExternalIP";

/// The controller manager's `--controllers`: everything it runs by default and k3s's
/// `tokencleaner`, without what only a cluster with nodes of its own needs. Both distributions
/// run this list.
pub(crate) fn controllers() -> String {
    std::iter::once("*".to_string())
        .chain(ENABLED_CONTROLLERS.iter().map(|c| c.to_string()))
        .chain(DISABLED_CONTROLLERS.iter().map(|c| format!("-{c}")))
        .collect::<Vec<_>>()
        .join(",")
}

/// The arguments of `k3s server` for an agentless tenant control plane. The API Service's
/// cluster IP, which synced pods dial, is in the serving certificate.
pub fn k3s_args(
    tenant: &str,
    namespace: &str,
    addressing: &Addressing,
    options: &BuildOptions,
) -> Vec<String> {
    let api_ip = addressing.api_ip.as_str();
    let controllers = controllers();
    let mut args = vec![
        "server".to_string(),
        "--disable-agent".into(),
        "--disable-scheduler".into(),
        // k3s's packaged add-ons: the operator runs the tenant's DNS itself, and `runtimes` would
        // give the tenant RuntimeClasses (nvidia, crun, wasm…) whose handlers no host node has.
        "--disable=traefik,servicelb,metrics-server,local-storage,coredns,runtimes".into(),
        // A tenant's HelmChart would run an install Job with cluster-admin in the tenant, on the
        // host; nothing of ours needs k3s's helm controller.
        "--disable-helm-controller".into(),
        "--flannel-backend=none".into(),
        "--disable-network-policy".into(),
        "--disable-cloud-controller".into(),
        "--egress-selector-mode=disabled".into(),
        format!("--data-dir={DATA_DIR}"),
        format!("--write-kubeconfig={DATA_DIR}/kubeconfig.yaml"),
        format!("--https-listen-port={}", names::API_PORT),
        format!("--service-cidr={}", addressing.service_cidr),
        "--kube-apiserver-arg=endpoint-reconciler-type=none".into(),
        // Pod Security at the tenant's door, at the profile's level (k3s passes none of its own).
        format!("--kube-apiserver-arg=admission-control-config-file={ADMISSION_CONFIG}"),
        format!("--kube-controller-manager-arg=controllers={controllers}"),
    ];
    // What counts as use of the tenant, for sleep after idleness.
    args.extend(
        crate::build::audit::apiserver_flags()
            .into_iter()
            .map(|f| format!("--kube-apiserver-arg={f}")),
    );
    if options.kubelet.is_some() {
        // Virtual Nodes' kubelet is the operator's endpoint, whose certificate its own CA signs.
        args.push(format!(
            "--kube-apiserver-arg=kubelet-certificate-authority={DATA_DIR}/server/tls/{KUBELET_CA_FILE}"
        ));
        // The endpoint is each virtual Node's Hostname address, dialled first; its InternalIP
        // and ExternalIP are the host node's where the profile shows them (k3s's own order
        // starts with InternalIP).
        args.push(format!(
            "--kube-apiserver-arg={KUBELET_ADDRESS_TYPES}{KUBELET_ADDRESS_ORDER}"
        ));
    }
    args.extend(
        names::service_dns_names(tenant, namespace)
            .into_iter()
            .chain(std::iter::once(api_ip.to_string()))
            .map(|n| format!("--tls-san={n}")),
    );
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures::addressing;

    #[test]
    fn k3s_runs_agentless_without_add_ons() {
        let args = k3s_args("dev", "team-dev", &addressing(), &BuildOptions::default());
        for wanted in [
            "--disable-agent",
            "--disable-scheduler",
            "--flannel-backend=none",
            "--disable-network-policy",
            "--disable-cloud-controller",
            "--egress-selector-mode=disabled",
            "--tls-san=dev.team-dev.svc",
            "--tls-san=10.96.0.10",
            "--service-cidr=10.96.0.0/12",
        ] {
            assert!(
                args.iter().any(|a| a == wanted),
                "missing {wanted} in {args:?}"
            );
        }
        let controllers = args.iter().find(|a| a.contains("controllers=")).unwrap();
        assert!(controllers.contains("-nodelifecycle") && controllers.contains("-attachdetach"));
        assert!(
            controllers.ends_with("controllers=*,tokencleaner,-nodeipam,-nodelifecycle,-persistentvolume-binder,-attachdetach,-persistentvolume-expander,-cloud-node-lifecycle,-ttl"),
            "k3s's own default (*,tokencleaner) is kept: {controllers}"
        );
        assert!(
            args.iter().any(|a| a == "--disable-helm-controller"),
            "{args:?}"
        );
        // The operator runs the tenant's DNS itself (k3s's fails `restricted` on the host).
        let disabled = args.iter().find(|a| a.starts_with("--disable=")).unwrap();
        for addon in ["coredns", "runtimes"] {
            assert!(
                disabled.split([',', '=']).any(|d| d == addon),
                "{addon}: {disabled}"
            );
        }
    }

    #[test]
    fn k3s_allocates_from_the_range_it_is_given() {
        let addressing = Addressing {
            api_ip: "10.0.0.10".into(),
            service_cidr: "10.0.0.0/16".into(),
        };
        let args = k3s_args("dev", "team-dev", &addressing, &BuildOptions::default());
        assert!(args.contains(&"--service-cidr=10.0.0.0/16".to_string()));
        assert!(args.contains(&"--tls-san=10.0.0.10".to_string()));
    }
}
