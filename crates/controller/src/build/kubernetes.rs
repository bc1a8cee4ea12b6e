//! The `kubernetes` distribution of a tenant's control plane: upstream's components from their
//! own images, at the tenant's Kubernetes version, in one pod: kine over sqlite on the data claim
//! (the same database k3s keeps there), kube-apiserver on it through a unix socket, and
//! kube-controller-manager with the same controllers as k3s's. The certificates k3s would make
//! for itself at start, the operator issues into a Secret of their own ([`certificates_secret`]),
//! renewed before they are due ([`certificates`]); both components reload them from their files.

use k8s_openapi::api::core::v1::{Container, ContainerPort, EnvVar};
use tenantplane_api::TenantCluster;
use tenantplane_api::quantity::ParsedQuantity;

use super::BuildOptions;
use super::admission::ADMISSION_CONFIG;
use super::k3s::{KUBELET_ADDRESS_ORDER, KUBELET_ADDRESS_TYPES, controllers};
use super::layout::{
    Addressing, CONFIG_MOUNT, CONFIG_VOLUME, DATABASE, DATABASE_DIR, PKI_MOUNT, PKI_VOLUME, Pod,
    SIDECAR, TMP_VOLUME, data_mount, mount, read_only_mount, scratch_volume, secret_volume,
    security_context, sqlite_temp_dir,
};
use super::pod::{self, CapAndNeed, ProbeTiming};
use crate::names;
use crate::tenant_pki;

mod args;
mod certificates;
use args::{apiserver_args, controller_manager_args, kine_args};
use certificates::FRONT_PROXY_NAME;
pub use certificates::*;

/// The certificates Secret is mounted here.
pub const CERTS_MOUNT: &str = "/etc/tenantplane/certs";
const CERTS_VOLUME: &str = "certs";
/// kine's etcd API, a unix socket in a folder the pod shares between kine and the API server
/// (never a port: kine asks for no credentials).
const KINE_SOCKET_DIR: &str = "/run/kine";
const KINE_VOLUME: &str = "kine";
/// The controller manager's HTTPS port, where its `/healthz` answers without credentials.
pub const CONTROLLER_MANAGER_PORT: i32 = 10257;

/// The service-account issuer k3s uses, so tokens stay valid across a change of distribution.
const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// The images of a `kubernetes` tenant: kine, then kube-apiserver and kube-controller-manager at
/// its version from `options`' repository.
pub fn images(tc: &TenantCluster, options: &BuildOptions) -> Vec<String> {
    let version = &tc.spec.kubernetes_version;
    vec![
        options.kine_image.clone(),
        names::kubernetes_image(&options.kubernetes_repository, "kube-apiserver", version),
        names::kubernetes_image(
            &options.kubernetes_repository,
            "kube-controller-manager",
            version,
        ),
    ]
}

/// One container's part of the control plane's caps, and what it requests: a third of a k3s
/// server's need each is not right (the API server is most of it), so the caps and the need are
/// split in eighths: kine 1, kube-apiserver 5, kube-controller-manager 2.
const SHARES: [(&str, u128); 3] = [
    ("kine", 1),
    ("kube-apiserver", 5),
    ("kube-controller-manager", 2),
];

/// `quantity` × `eighths` / 8, written as the API server would read it back: CPU in
/// millicores, memory in mebibytes (rounded down, never below 1).
fn share(quantity: &ParsedQuantity, resource: &str, eighths: u128) -> ParsedQuantity {
    let Some(value) = quantity.value() else {
        // Admission refuses a cap that is not a quantity; an old object's goes out unchanged.
        return quantity.clone();
    };
    let part = value.billionths().saturating_mul(eighths) / 8;
    if resource == "cpu" {
        format!("{}m", (part / 1_000_000).max(1)).into()
    } else {
        format!("{}Mi", (part / 1_000_000_000 / (1 << 20)).max(1)).into()
    }
}

fn resources(
    tc: &TenantCluster,
    container: &str,
) -> k8s_openapi::api::core::v1::ResourceRequirements {
    let eighths = SHARES
        .iter()
        .find(|(name, _)| *name == container)
        .map_or(8, |(_, e)| *e);
    let caps = &tc.spec.resources;
    let [cpu_cap, memory_cap] = [("cpu", &caps.cpu), ("memory", &caps.memory)]
        .map(|(resource, cap)| cap.as_ref().map(|c| share(c, resource, eighths)));
    let [cpu_need, memory_need] = [
        ("cpu", super::layout::CONTROL_PLANE_CPU_REQUEST),
        ("memory", super::layout::CONTROL_PLANE_MEMORY_REQUEST),
    ]
    .map(|(resource, total)| share(&total.into(), resource, eighths));
    pod::capped_resources([
        CapAndNeed {
            resource: "cpu",
            cap: cpu_cap.as_ref(),
            need: cpu_need,
        },
        CapAndNeed {
            resource: "memory",
            cap: memory_cap.as_ref(),
            need: memory_need,
        },
    ])
}

/// A container's variables: `own`, then the Go runtime's settings for its share of the caps.
fn env(tc: &TenantCluster, container: &str, own: Vec<EnvVar>) -> Vec<EnvVar> {
    own.into_iter()
        .chain(super::lean::go_runtime_env(&resources(tc, container)))
        .collect()
}

/// The pod: an init container makes kine's folder on a fresh claim (kine makes only the file),
/// then kine and kube-apiserver as sidecars (init containers that keep running, restarted by the
/// kubelet like any container), then kube-controller-manager. The order is the point: the kubelet
/// starts each sidecar after the one before it has started (the API server's startup probe is
/// `/livez`, which checks the datastore), so the controller manager starts against a live API
/// server instead of exiting on its 10 s wait for `/healthz` during a first start; and on
/// deletion it stops them in reverse, so the controller manager goes first and kine last, after
/// the API server's last writes (its identity lease, given back on a clean stop) have landed.
pub(super) fn pod(
    tc: &TenantCluster,
    tenant: &str,
    addressing: &Addressing,
    options: &BuildOptions,
) -> Pod {
    let [kine_image, apiserver_image, controller_manager_image]: [String; 3] = images(tc, options)
        .try_into()
        .unwrap_or_else(|_| unreachable!("images() names three images"));
    let datastore_dir = Container {
        name: "datastore".into(),
        image: Some(kine_image.clone()),
        command: Some(vec![
            "/bin/sh".into(),
            "-c".into(),
            format!("mkdir -p {DATABASE_DIR}"),
        ]),
        security_context: Some(security_context()),
        termination_message_policy: Some(LOGS_ON_ERROR.into()),
        volume_mounts: Some(vec![data_mount()]),
        ..Default::default()
    };
    let kine = Container {
        name: "kine".into(),
        restart_policy: Some(SIDECAR.into()),
        image: Some(kine_image),
        command: Some(vec!["/bin/kine".into()]),
        args: Some(kine_args()),
        env: Some(env(tc, "kine", vec![sqlite_temp_dir()])),
        resources: Some(resources(tc, "kine")),
        security_context: Some(security_context()),
        termination_message_policy: Some(LOGS_ON_ERROR.into()),
        volume_mounts: Some(vec![data_mount(), mount(KINE_VOLUME, KINE_SOCKET_DIR)]),
        ..Default::default()
    };
    let apiserver_probe = |path: &str, timing| pod::https_probe(path, names::API_PORT, timing);
    let apiserver = Container {
        name: "kube-apiserver".into(),
        restart_policy: Some(SIDECAR.into()),
        image: Some(apiserver_image),
        command: Some(vec!["kube-apiserver".into()]),
        args: Some(apiserver_args(addressing, options)),
        ports: Some(vec![ContainerPort {
            name: Some("https".into()),
            container_port: names::API_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        startup_probe: Some(apiserver_probe("/livez", STARTUP)),
        liveness_probe: Some(apiserver_probe("/livez", LIVENESS)),
        readiness_probe: Some(apiserver_probe("/readyz", READINESS)),
        env: Some(env(tc, "kube-apiserver", Vec::new())),
        resources: Some(resources(tc, "kube-apiserver")),
        security_context: Some(security_context()),
        termination_message_policy: Some(LOGS_ON_ERROR.into()),
        volume_mounts: Some(vec![
            read_only_mount(PKI_VOLUME, PKI_MOUNT),
            read_only_mount(CERTS_VOLUME, CERTS_MOUNT),
            read_only_mount(CONFIG_VOLUME, CONFIG_MOUNT),
            mount(KINE_VOLUME, KINE_SOCKET_DIR),
            mount(TMP_VOLUME, "/tmp"),
        ]),
        ..Default::default()
    };
    let healthz = |timing| pod::https_probe("/healthz", CONTROLLER_MANAGER_PORT, timing);
    let controller_manager = Container {
        name: "kube-controller-manager".into(),
        image: Some(controller_manager_image),
        command: Some(vec!["kube-controller-manager".into()]),
        args: Some(controller_manager_args(addressing)),
        startup_probe: Some(healthz(STARTUP)),
        liveness_probe: Some(healthz(LIVENESS)),
        env: Some(env(tc, "kube-controller-manager", Vec::new())),
        resources: Some(resources(tc, "kube-controller-manager")),
        security_context: Some(security_context()),
        termination_message_policy: Some(LOGS_ON_ERROR.into()),
        volume_mounts: Some(vec![
            read_only_mount(PKI_VOLUME, PKI_MOUNT),
            read_only_mount(CERTS_VOLUME, CERTS_MOUNT),
            mount(TMP_VOLUME, "/tmp"),
        ]),
        ..Default::default()
    };
    Pod {
        init_containers: vec![datastore_dir, kine, apiserver],
        containers: vec![controller_manager],
        volumes: vec![
            secret_volume(CERTS_VOLUME, &names::control_plane_certs(tenant)),
            scratch_volume(KINE_VOLUME, "1Mi"),
            scratch_volume(TMP_VOLUME, "64Mi"),
        ],
    }
}

/// A component that exits with an error leaves the end of its log as its termination message,
/// which the operator puts in the tenant's status (`ControlPlaneCrashing`).
const LOGS_ON_ERROR: &str = "FallbackToLogsOnError";

/// Startup: 5 minutes to answer (a first start creates every built-in object); liveness: a
/// component silent for a minute is wedged and restarted; readiness: the API server's own view.
const STARTUP: ProbeTiming = ProbeTiming {
    period_seconds: 5,
    timeout_seconds: 5,
    failure_threshold: 60,
};
const LIVENESS: ProbeTiming = ProbeTiming {
    period_seconds: 10,
    timeout_seconds: 5,
    failure_threshold: 6,
};
const READINESS: ProbeTiming = ProbeTiming {
    period_seconds: 5,
    timeout_seconds: 5,
    failure_threshold: 3,
};

fn pki(file: &str) -> String {
    format!("{PKI_MOUNT}/{file}")
}

fn cert(file: &str) -> String {
    format!("{CERTS_MOUNT}/{file}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::control_plane::desired_statefulset;
    use crate::build::fixtures::{addressing, kubernetes_tenant, with_kubelet};
    use crate::build::layout::DATA_DIR;
    use k8s_openapi::api::core::v1::PodSpec;

    use super::super::fixtures::pod_spec;

    /// Container `name`, of either list (two of the components are sidecars).
    fn container<'a>(spec: &'a PodSpec, name: &str) -> &'a Container {
        all_containers(spec).find(|c| c.name == name).unwrap()
    }

    /// The distribution's containers (the snapshot agent's are tested in `build::agent`).
    fn all_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
        spec.init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .filter(|c| c.name != super::super::agent::CONTAINER)
    }

    fn args(c: &Container) -> Vec<&str> {
        c.args.iter().flatten().map(String::as_str).collect()
    }

    #[test]
    fn upstream_images_at_the_tenant_version() {
        let spec = pod_spec(&kubernetes_tenant(), &BuildOptions::default());
        let images: Vec<(&str, &str)> = all_containers(&spec)
            .map(|c| (c.name.as_str(), c.image.as_deref().unwrap()))
            .collect();
        assert_eq!(
            images,
            [
                ("datastore", "rancher/kine:v0.17.5"),
                ("kine", "rancher/kine:v0.17.5"),
                ("kube-apiserver", "registry.k8s.io/kube-apiserver:v1.36.3"),
                (
                    "kube-controller-manager",
                    "registry.k8s.io/kube-controller-manager:v1.36.3"
                ),
            ]
        );
        let options = BuildOptions {
            kubernetes_repository: "mirror.example/k8s".into(),
            kine_image: "mirror.example/kine:v0.17.5".into(),
            ..Default::default()
        };
        let spec = pod_spec(&kubernetes_tenant(), &options);
        assert_eq!(
            container(&spec, "kube-apiserver").image.as_deref(),
            Some("mirror.example/k8s/kube-apiserver:v1.36.3")
        );
        assert_eq!(
            spec.init_containers.unwrap()[0].image.as_deref(),
            Some("mirror.example/kine:v0.17.5"),
            "kine's image makes its folder"
        );
    }

    #[test]
    fn the_components_start_in_order_and_stop_in_reverse() {
        let spec = pod_spec(&kubernetes_tenant(), &BuildOptions::default());
        let init: Vec<(&str, Option<&str>)> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| (c.name.as_str(), c.restart_policy.as_deref()))
            .collect();
        assert_eq!(
            init,
            [
                ("datastore", None),
                ("kine", Some("Always")),
                ("kube-apiserver", Some("Always")),
            ],
            "the folder once, then kine and the API server as sidecars"
        );
        let main: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            main,
            ["kube-controller-manager", super::super::agent::CONTAINER]
        );
        // The controller manager waits for this probe: `/livez` checks the datastore too.
        let startup = container(&spec, "kube-apiserver")
            .startup_probe
            .as_ref()
            .unwrap();
        assert_eq!(
            startup.http_get.as_ref().unwrap().path.as_deref(),
            Some("/livez")
        );
        // It stops within the pod's grace period: open watches are closed, not waited for.
        let args = container(&spec, "kube-apiserver").args.clone().unwrap();
        let drain = args
            .iter()
            .find_map(|a| a.strip_prefix("--shutdown-watch-termination-grace-period="))
            .and_then(|d| d.strip_suffix('s')?.parse::<i64>().ok())
            .expect("a watch drain period");
        let grace = spec.termination_grace_period_seconds.unwrap_or(30);
        assert!(drain > 0 && drain + 10 <= grace, "{drain}s of {grace}s");
    }

    #[test]
    fn kine_keeps_k3s_database_and_speaks_on_a_socket_only() {
        let spec = pod_spec(&kubernetes_tenant(), &BuildOptions::default());
        let kine = args(container(&spec, "kine"));
        assert!(
            kine.iter()
                .any(|a| a
                    .starts_with("--endpoint=sqlite:///var/lib/rancher/k3s/server/db/state.db?")),
            "{kine:?}"
        );
        assert!(kine.contains(&"--listen-address=unix:///run/kine/kine.sock"));
        assert!(
            kine.contains(&"--metrics-bind-address=0"),
            "no port without credentials"
        );
        let apiserver = args(container(&spec, "kube-apiserver"));
        assert!(apiserver.contains(&"--etcd-servers=unix:///run/kine/kine.sock"));
        let init = &spec.init_containers.as_ref().unwrap()[0];
        assert_eq!(
            init.command.as_ref().unwrap()[2],
            "mkdir -p /var/lib/rancher/k3s/server/db"
        );
        // The same claim at the same place as k3s: a change of distribution keeps the data.
        for c in [container(&spec, "kine"), init] {
            assert!(
                c.volume_mounts
                    .iter()
                    .flatten()
                    .any(|m| m.name == names::DATA_VOLUME && m.mount_path == DATA_DIR)
            );
        }
    }

    #[test]
    fn the_api_server_runs_as_k3s_runs_its_own() {
        let spec = pod_spec(&kubernetes_tenant(), &with_kubelet(BuildOptions::default()));
        let a = args(container(&spec, "kube-apiserver"));
        for wanted in [
            "--endpoint-reconciler-type=none",
            "--admission-control-config-file=/etc/tenantplane/config/admission.yaml",
            "--service-cluster-ip-range=10.96.0.0/12",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--kubelet-certificate-authority=/etc/tenantplane/certs/kubelet-ca.crt",
            "--kubelet-preferred-address-types=Hostname,InternalIP,ExternalIP",
            "--tls-cert-file=/etc/tenantplane/certs/apiserver.crt",
            "--client-ca-file=/etc/tenantplane/pki/client-ca.crt",
        ] {
            assert!(a.contains(&wanted), "missing {wanted} in {a:?}");
        }
        let kcm = args(container(&spec, "kube-controller-manager"));
        assert!(
            kcm.iter()
                .any(|a| *a == format!("--controllers={}", controllers())),
            "the controllers k3s runs: {kcm:?}"
        );
        assert!(kcm.contains(&"--kubeconfig=/etc/tenantplane/certs/controller-manager.kubeconfig"));
        let plain = pod_spec(&kubernetes_tenant(), &BuildOptions::default());
        let a = args(container(&plain, "kube-apiserver"));
        assert!(
            !a.iter()
                .any(|a| a.starts_with("--kubelet-certificate-authority"))
        );
    }

    #[test]
    fn probes_ask_each_component_own_health_endpoint() {
        let spec = pod_spec(&kubernetes_tenant(), &BuildOptions::default());
        let path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
            let get = p.as_ref().unwrap().http_get.as_ref().unwrap();
            (
                get.path.clone().unwrap(),
                get.port.clone(),
                get.scheme.clone(),
            )
        };
        let apiserver = container(&spec, "kube-apiserver");
        let https = Some("HTTPS".to_string());
        let api_port = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(6443);
        assert_eq!(
            path(&apiserver.startup_probe),
            ("/livez".into(), api_port.clone(), https.clone())
        );
        assert_eq!(
            path(&apiserver.liveness_probe),
            ("/livez".into(), api_port.clone(), https.clone())
        );
        assert_eq!(
            path(&apiserver.readiness_probe),
            ("/readyz".into(), api_port, https.clone())
        );
        let kcm = container(&spec, "kube-controller-manager");
        let kcm_port = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(10257);
        assert_eq!(
            path(&kcm.liveness_probe),
            ("/healthz".into(), kcm_port, https)
        );
    }

    #[test]
    fn sqlite_writes_its_temporary_files_in_the_databases_folder_on_the_claim() {
        let spec = pod_spec(&kubernetes_tenant(), &BuildOptions::default());
        let init = spec.init_containers.as_ref().unwrap();
        let (folder, kine) = (&init[0], &init[1]);
        assert_eq!(kine.name, "kine");
        let temp = kine
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "SQLITE_TMPDIR");
        assert_eq!(temp.unwrap().value.as_deref(), Some(DATABASE_DIR));
        // The init container makes that folder before kine starts; the database is in it, on
        // the data claim kine mounts.
        let command = folder.command.as_ref().unwrap().join(" ");
        assert!(
            command.ends_with(&format!("mkdir -p {DATABASE_DIR}")),
            "{command}"
        );
        assert!(DATABASE.starts_with(&format!("{DATABASE_DIR}/")));
        let data = kine
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == names::DATA_VOLUME);
        assert!(DATABASE_DIR.starts_with(&data.unwrap().mount_path));
    }

    #[test]
    fn the_pod_is_restricted_on_a_read_only_root_and_never_local() {
        let options = BuildOptions {
            local_runtime: true,
            ..Default::default()
        };
        let sts = desired_statefulset(&kubernetes_tenant(), &addressing(), &options, "d").unwrap();
        let template = sts.spec.unwrap().template;
        let labels = template.metadata.unwrap().labels.unwrap();
        assert!(
            !labels.contains_key(names::LABEL_RUNTIME),
            "a real node runs it"
        );
        let spec = template.spec.unwrap();
        assert!(spec.node_selector.is_none() && spec.tolerations.is_none());
        assert_eq!(spec.automount_service_account_token, Some(false));
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
            assert_eq!(sc.run_as_non_root, Some(true), "{}", c.name);
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
            assert_eq!(
                sc.capabilities.as_ref().unwrap().drop.as_ref().unwrap(),
                &["ALL"]
            );
        }
    }

    #[test]
    fn caps_and_the_need_are_split_by_eighths() {
        let mut tc = kubernetes_tenant();
        tc.spec.resources.cpu = Some("2".into());
        tc.spec.resources.memory = Some("2Gi".into());
        let spec = pod_spec(&tc, &BuildOptions::default());
        let got = |name: &str, kind: &str, resource: &str| {
            let r = container(&spec, name).resources.clone().unwrap();
            let map = if kind == "limits" {
                r.limits
            } else {
                r.requests
            };
            map.unwrap()[resource].0.clone()
        };
        assert_eq!(got("kine", "limits", "cpu"), "250m");
        assert_eq!(got("kube-apiserver", "limits", "cpu"), "1250m");
        assert_eq!(got("kube-controller-manager", "limits", "cpu"), "500m");
        assert_eq!(got("kine", "limits", "memory"), "256Mi");
        assert_eq!(got("kube-apiserver", "limits", "memory"), "1280Mi");
        assert_eq!(got("kube-apiserver", "requests", "memory"), "320Mi");
        assert_eq!(got("kube-apiserver", "requests", "cpu"), "156m");
        // Each component's Go runtime keeps under 85% of its own share.
        let go = |name: &str, var: &str| {
            container(&spec, name)
                .env
                .iter()
                .flatten()
                .find(|e| e.name == var)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(go("kine", "GOMEMLIMIT").as_deref(), Some("217MiB"));
        assert_eq!(
            go("kube-apiserver", "GOMEMLIMIT").as_deref(),
            Some("1088MiB")
        );
        assert_eq!(
            go("kube-controller-manager", "GOMEMLIMIT").as_deref(),
            Some("435MiB")
        );
        assert!(go("kine", "SQLITE_TMPDIR").is_some());
        for name in ["kine", "kube-apiserver", "kube-controller-manager"] {
            assert_eq!(go(name, "GOGC").as_deref(), Some(super::super::lean::GOGC));
        }
        let mut open = kubernetes_tenant();
        open.spec.resources.cpu = None;
        open.spec.resources.memory = None;
        let spec = pod_spec(&open, &BuildOptions::default());
        for c in all_containers(&spec).filter(|c| c.name != "datastore") {
            assert!(
                !c.env.iter().flatten().any(|e| e.name == "GOMEMLIMIT"),
                "no limit, no GOMEMLIMIT: {}",
                c.name
            );
            let r = c.resources.as_ref().unwrap();
            assert!(
                r.limits.is_none() && r.requests.is_some(),
                "{}: never BestEffort",
                c.name
            );
        }
    }
}
