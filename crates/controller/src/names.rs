//! Names, labels and annotations of everything the controller creates for a tenant, in one place.

use std::collections::BTreeMap;

/// The field manager of every server-side apply, and the Events' reporting controller.
pub const FIELD_MANAGER: &str = "tenantplane";
/// Removes the namespace labels when a TenantCluster goes (everything else is garbage-collected).
pub const FINALIZER: &str = "tenantplane.io/cleanup";

/// The standard label that says who manages an object; the controller watches only its own.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// This operator's value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY: &str = "tenantplane";
/// The TenantCluster an object belongs to, by name.
pub const LABEL_TENANT: &str = "tenantplane.io/tenant";
/// The standard label that says what part of the application an object is.
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
/// The control plane's value of [`LABEL_COMPONENT`].
pub const COMPONENT_CONTROL_PLANE: &str = "control-plane";
/// Marks control-plane pods that the local runtime (tests, `tenantplane dev`) runs instead of a
/// kubelet. Only set when the operator runs with the local connector.
pub const LABEL_RUNTIME: &str = "tenantplane.io/runtime";
/// The local runtime's value of [`LABEL_RUNTIME`].
pub const RUNTIME_LOCAL: &str = "local";
/// Where the local runtime's control-plane pods go: the simulated node it stands behind (label
/// `type=kwok`), through the taint that keeps workloads off it once a real node is there.
pub const LOCAL_RUNTIME_NODE_LABEL: (&str, &str) = ("type", "kwok");
/// The taint on the simulated node that the local runtime's control-plane pods tolerate.
pub const SIMULATED_NODE_TAINT: &str = "tenantplane.io/simulated";
/// Set on a TenantCluster (any value), it makes the operator issue a new admin certificate and
/// rewrite the kubeconfig Secret now; the operator removes it when done.
pub const ROTATE_CERTIFICATES: &str = "tenantplane.io/rotate-certificates";
/// A wake request (its value the time it was made): wakes a tenant asleep for idleness; the
/// operator removes it once the tenant is awake. `tenantplane wake` and `connect` write it.
pub const WAKE: &str = "tenantplane.io/wake";
/// Keeps a tenant awake whatever `spec.sleep.afterIdle` says (any value): for a tenant that
/// must answer at once, or while someone works in it by other means. `spec.sleep.asleep` still
/// puts it to sleep.
pub const KEEP_AWAKE: &str = "tenantplane.io/keep-awake";
/// Where the local runtime says a tenant's API server answers on this machine.
pub const ANNOTATION_LOCAL_ENDPOINT: &str = "tenantplane.io/local-endpoint";

/// The port of the tenant API server, in the pod and on the Service.
pub const API_PORT: i32 = 6443;
/// The snapshot agent's port in the control-plane pod.
pub const AGENT_PORT: i32 = 7443;
/// The snapshot agent's program in its image (the operator's).
pub const AGENT_COMMAND: &str = "/usr/local/bin/tenantplane";
/// The operator's own image, which holds the snapshot agent.
pub const DEFAULT_AGENT_IMAGE: &str =
    concat!("tenantplane/tenantplane:", env!("CARGO_PKG_VERSION"));
/// Where the local runtime's snapshot agent listens (`host:port`), for a pod it stands in for.
pub const ANNOTATION_LOCAL_AGENT: &str = "tenantplane.io/local-agent";
/// The operator container's port that serves the virtual nodes' kubelet endpoint.
pub const KUBELET_PORT_NAME: &str = "kubelet";

/// The default image repository of the tenant control plane.
pub const DEFAULT_K3S_REPOSITORY: &str = "rancher/k3s";
/// Where the `kubernetes` distribution's kube-apiserver and kube-controller-manager come from.
pub const DEFAULT_KUBERNETES_REPOSITORY: &str = "registry.k8s.io";
/// The `kubernetes` distribution's datastore: kine, the release k3s's own datastore code is.
pub const DEFAULT_KINE_IMAGE: &str = "rancher/kine:v0.17.5";

/// The control plane's StatefulSet: the tenant's own name.
pub fn statefulset(tenant: &str) -> String {
    tenant.to_string()
}
/// The tenant API server's Service: the tenant's own name.
pub fn service(tenant: &str) -> String {
    tenant.to_string()
}
/// The EndpointSlice that leads a sleeping tenant's API Service to the operator's wake door.
pub fn wake_endpoint_slice(tenant: &str) -> String {
    format!("{}-wake", service(tenant))
}
/// The StatefulSet's governing Service: headless, so each control-plane pod has a stable DNS name.
pub fn headless_service(tenant: &str) -> String {
    format!("{tenant}-headless")
}
/// The StatefulSet's volume claim template, and the claim it makes for pod `ordinal`.
pub const DATA_VOLUME: &str = "data";
/// The claim the StatefulSet makes for pod `ordinal`.
pub fn data_claim(tenant: &str, ordinal: i32) -> String {
    format!("{DATA_VOLUME}-{}-{ordinal}", statefulset(tenant))
}
/// The control-plane pod: the StatefulSet's only one.
pub fn control_plane_pod(tenant: &str) -> String {
    format!("{tenant}-0")
}
/// The `kubernetes` distribution's component certificates (k3s makes its own).
pub fn control_plane_certs(tenant: &str) -> String {
    format!("{tenant}-control-plane-certs")
}
/// The control plane's configuration files (its admission configuration).
pub fn control_plane_config(tenant: &str) -> String {
    format!("{tenant}-control-plane-config")
}
/// The Secret of the tenant's CAs and service-account key.
pub fn pki_secret(tenant: &str) -> String {
    format!("{tenant}-pki")
}
/// Cluster API's convention: `<cluster>-kubeconfig`, key `value`.
pub fn kubeconfig_secret(tenant: &str) -> String {
    format!("{tenant}-kubeconfig")
}
/// The key of the tenant's admin kubeconfig in [`kubeconfig_secret`].
pub const KUBECONFIG_KEY: &str = "value";
/// The key of the operator's own kubeconfig in the same Secret.
pub const OPERATOR_KUBECONFIG_KEY: &str = "operator";
/// The NetworkPolicy that fences off the tenant's pods.
pub fn isolation_policy(tenant: &str) -> String {
    format!("{tenant}-isolation")
}
/// The NetworkPolicy of the control-plane pod.
pub fn control_plane_policy(tenant: &str) -> String {
    format!("{tenant}-control-plane")
}
/// The ResourceQuota the profile asks for.
pub fn resource_quota(tenant: &str) -> String {
    format!("{tenant}-quota")
}
/// The LimitRange the profile asks for.
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

/// Upstream's image of `component` (`kube-apiserver`, `kube-controller-manager`) at
/// `kubernetes_version`, whose tags are the versions themselves.
pub fn kubernetes_image(repository: &str, component: &str, kubernetes_version: &str) -> String {
    format!("{repository}/{component}:{kubernetes_version}")
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

/// A whole number of seconds as a person reads it, as kubectl's `duration.HumanDuration` shapes
/// ages: `45s`, `5m12s`, `3h25m`, `2d4h`, `30d`, `3y1d`. The CLI's ages use it too, so both
/// speak alike.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_string();
    }
    if seconds < 0 {
        return "0s".to_string();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{days}d")
        } else {
            format!("{days}d{h}h")
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        let d = days % 365;
        return if d == 0 {
            format!("{years}y")
        } else {
            format!("{years}y{d}d")
        };
    }
    format!("{years}y")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_conventions() {
        assert_eq!(kubeconfig_secret("dev"), "dev-kubeconfig");
        assert_eq!(control_plane_pod("dev"), "dev-0");
        assert_eq!(endpoint("dev", "team-dev"), "https://dev.team-dev.svc:6443");
        assert_eq!(service_dns_names("dev", "t")[3], "dev.t.svc.cluster.local");
    }

    #[test]
    fn durations_in_messages_read_as_kubectl_ages_do() {
        assert_eq!(human_duration(30 * 86_400), "30d");
        // Under three hours reads in minutes, as kubectl's ages do.
        assert_eq!(human_duration(7_200), "120m");
        assert_eq!(human_duration(90), "90s");
        assert_eq!(human_duration(120), "2m");
        assert_eq!(human_duration(0), "0s");
    }

    #[test]
    fn ages_read_like_kubectl() {
        let cases = [
            (0, "0s"),
            (59, "59s"),
            (119, "119s"),
            (120, "2m"),
            (312, "5m12s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 25 * 60, "3h25m"),
            (30 * 3600, "30h"),
            (52 * 3600, "2d4h"),
            (10 * 86400, "10d"),
            (3 * 365 * 86400 + 86400, "3y1d"),
            (9 * 365 * 86400, "9y"),
        ];
        for (seconds, want) in cases {
            assert_eq!(human_duration(seconds), want, "{seconds}s");
        }
    }
}
