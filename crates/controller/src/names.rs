//! Names, labels and annotations of everything the controller creates for a tenant, in one place.

use std::collections::BTreeMap;

/// The field manager of every server-side apply, and the Events' reporting controller.
pub const FIELD_MANAGER: &str = "tenantplane";
/// Removes the namespace labels when a TenantCluster goes (everything else is garbage-collected).
pub const FINALIZER: &str = "tenantplane.io/cleanup";

pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "tenantplane";
pub const LABEL_TENANT: &str = "tenantplane.io/tenant";
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
pub const COMPONENT_CONTROL_PLANE: &str = "control-plane";
/// Marks control-plane pods that the local runtime (tests, `tenantplane dev`) runs instead of a
/// kubelet. Only set when the operator runs with the local connector.
pub const LABEL_RUNTIME: &str = "tenantplane.io/runtime";
pub const RUNTIME_LOCAL: &str = "local";
/// Set on a TenantCluster (any value), it makes the operator issue a new admin certificate and
/// rewrite the kubeconfig Secret now; the operator removes it when done.
pub const ROTATE_CERTIFICATES: &str = "tenantplane.io/rotate-certificates";
/// Where the local runtime says a tenant's API server answers on this machine.
pub const ANNOTATION_LOCAL_ENDPOINT: &str = "tenantplane.io/local-endpoint";

/// The port of the tenant API server, in the pod and on the Service.
pub const API_PORT: i32 = 6443;
/// The operator container's port that serves the virtual nodes' kubelet endpoint.
pub const KUBELET_PORT_NAME: &str = "kubelet";

/// The default image repository of the tenant control plane.
pub const DEFAULT_K3S_REPOSITORY: &str = "rancher/k3s";

pub fn statefulset(tenant: &str) -> String {
    tenant.to_string()
}
pub fn service(tenant: &str) -> String {
    tenant.to_string()
}
/// The StatefulSet's governing Service: headless, so each control-plane pod has a stable DNS name.
pub fn headless_service(tenant: &str) -> String {
    format!("{tenant}-headless")
}
/// The StatefulSet's volume claim template, and the claim it makes for pod `ordinal`.
pub const DATA_VOLUME: &str = "data";
pub fn data_claim(tenant: &str, ordinal: i32) -> String {
    format!("{DATA_VOLUME}-{}-{ordinal}", statefulset(tenant))
}
pub fn control_plane_pod(tenant: &str) -> String {
    format!("{tenant}-0")
}
pub fn pki_secret(tenant: &str) -> String {
    format!("{tenant}-pki")
}
/// Cluster API's convention: `<cluster>-kubeconfig`, key `value`.
pub fn kubeconfig_secret(tenant: &str) -> String {
    format!("{tenant}-kubeconfig")
}
pub const KUBECONFIG_KEY: &str = "value";
pub fn isolation_policy(tenant: &str) -> String {
    format!("{tenant}-isolation")
}
pub fn control_plane_policy(tenant: &str) -> String {
    format!("{tenant}-control-plane")
}
pub fn resource_quota(tenant: &str) -> String {
    format!("{tenant}-quota")
}
pub fn limit_range(tenant: &str) -> String {
    format!("{tenant}-limits")
}

/// Every in-cluster DNS name of the tenant's Service, for the serving certificate.
pub fn service_dns_names(tenant: &str, namespace: &str) -> Vec<String> {
    let svc = service(tenant);
    vec![
        svc.clone(),
        format!("{svc}.{namespace}"),
        format!("{svc}.{namespace}.svc"),
        format!("{svc}.{namespace}.svc.cluster.local"),
    ]
}

/// The in-cluster HTTPS address of the tenant API server.
pub fn endpoint(tenant: &str, namespace: &str) -> String {
    format!("https://{}.{namespace}.svc:{API_PORT}", service(tenant))
}

/// `v1.30.4` runs `<repository>:v1.30.4-k3s1`.
pub fn k3s_image(repository: &str, kubernetes_version: &str) -> String {
    format!("{repository}:{kubernetes_version}-k3s1")
}

/// Labels on every object the controller creates for a tenant.
pub fn labels(tenant: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
        (LABEL_TENANT.to_string(), tenant.to_string()),
    ])
}

/// Labels that select the tenant's control-plane pods.
pub fn control_plane_selector(tenant: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_TENANT.to_string(), tenant.to_string()),
        (
            LABEL_COMPONENT.to_string(),
            COMPONENT_CONTROL_PLANE.to_string(),
        ),
    ])
}

/// Labels as a label selector: `k=v,k2=v2`.
pub fn selector(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A whole number of seconds as a person reads it: `30d`, `12h`, `90m` or `45s`.
pub fn human_duration(secs: i64) -> String {
    match secs {
        s if s != 0 && s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s != 0 && s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s != 0 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_conventions() {
        assert_eq!(kubeconfig_secret("dev"), "dev-kubeconfig");
        assert_eq!(control_plane_pod("dev"), "dev-0");
        assert_eq!(endpoint("dev", "team-dev"), "https://dev.team-dev.svc:6443");
        assert_eq!(
            k3s_image(DEFAULT_K3S_REPOSITORY, "v1.30.4"),
            "rancher/k3s:v1.30.4-k3s1"
        );
        assert_eq!(service_dns_names("dev", "t")[3], "dev.t.svc.cluster.local");
    }

    #[test]
    fn durations_read_in_their_largest_whole_unit() {
        assert_eq!(human_duration(30 * 86_400), "30d");
        assert_eq!(human_duration(7_200), "2h");
        assert_eq!(human_duration(90), "90s");
        assert_eq!(human_duration(120), "2m");
        assert_eq!(human_duration(0), "0s");
    }
}
