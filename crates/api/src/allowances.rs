//! What tenant objects may ask of the host, in an `IsolationProfile`. The syncer denies by
//! default: a tenant object that asks for something listed here and not allowed is refused (or
//! the field is left out of the host copy, where the object works without it), and the tenant is
//! told why. The host's Pod Security level is checked on top of this, never instead of it.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// What tenant objects may ask of the host. Everything is off, or empty, unless listed.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Allowances {
    /// Privileged containers (and Windows host-process containers, `procMount: Unmasked`,
    /// unconfined seccomp and AppArmor, SELinux users, roles and types other than the container
    /// ones, and sysctls beyond the namespaced safe set). Otherwise refused.
    #[serde(default)]
    pub privileged: bool,
    /// Pods in the host node's network namespace. Otherwise refused.
    #[serde(default)]
    pub host_network: bool,
    /// Pods in the host node's process namespace. Otherwise refused.
    #[serde(default, rename = "hostPID")]
    pub host_pid: bool,
    /// Pods in the host node's IPC namespace. Otherwise refused.
    #[serde(default, rename = "hostIPC")]
    pub host_ipc: bool,
    /// `hostPath` volumes. Otherwise refused.
    #[serde(default)]
    pub host_path: bool,
    /// Container `hostPort`s. Otherwise refused.
    #[serde(default)]
    pub host_ports: bool,
    /// Capabilities containers may add, such as `NET_BIND_SERVICE`. A pod adding another is
    /// refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 64)))]
    pub capabilities: Vec<String>,
    /// CSI drivers tenant pods may use in inline (`csi`) volumes; a pod using another is
    /// refused (an inline volume's attributes can name storage or objects outside the tenant).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 253)))]
    pub csi_drivers: Vec<String>,
    /// Host RuntimeClasses tenant pods may name in `runtimeClassName`. A pod naming a tenant
    /// RuntimeClass runs under the first of these with the same handler; one naming any other
    /// class is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 253)))]
    pub runtime_classes: Vec<String>,
    /// Host PriorityClasses tenant pods may name in `priorityClassName`; another is left out of
    /// the host copy (the pod runs at the host's default priority).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 253)))]
    pub priority_classes: Vec<String>,
    /// Host StorageClasses tenant claims may name in `storageClassName`; a claim naming another
    /// is refused. A claim that names none gets the host's default class.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 253)))]
    pub storage_classes: Vec<String>,
    /// The most storage one tenant claim may ask for (its `resources.requests.storage`, and
    /// `limits.storage`), a quantity such as `100Gi`; a claim asking for more is refused. Unset:
    /// no cap per claim (an enforced quota's `requests.storage` still caps them all together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_claim_size: Option<crate::QuantityString>,
    /// The most data one tenant ConfigMap or Secret may hold to be copied to the host (its keys
    /// and values as stored: `data` and `binaryData`, or a Secret's `data` and `stringData`), a
    /// quantity such as `256Ki`. A larger one is not copied, and the pods that use it are
    /// refused (a copy could not run without it). With the quota's `count/configmaps` and
    /// `count/secrets` this bounds the bytes a tenant puts on the host. Unset: up to the tenant
    /// API server's own limit of about 1 MiB an object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_data_bytes: Option<crate::QuantityString>,
    /// Taint keys tenant pods may tolerate, beyond the node-condition taints
    /// (`node.kubernetes.io/not-ready` and the like) every pod may tolerate. Other tolerations
    /// are left out of the host copy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 317)))]
    pub toleration_keys: Vec<String>,
    /// Node label keys tenant pods may select on (`nodeSelector`, node affinity), beyond the
    /// well-known ones (`kubernetes.io/hostname`, `kubernetes.io/os`, `kubernetes.io/arch`,
    /// `topology.kubernetes.io/zone` and `region`, `node.kubernetes.io/instance-type`). Other
    /// terms are left out of the host copy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 317)))]
    pub node_label_keys: Vec<String>,
    /// Names of `Localhost` seccomp and AppArmor profiles tenant pods may use (a profile is a
    /// file on the host node, so the tenant would choose the host's confinement). A pod naming
    /// another is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 253)))]
    pub localhost_profiles: Vec<String>,
    /// Registries tenant pods may pull images from (containers, init containers and image
    /// volumes): exact `host[:port]`, or `*.example.com` for any registry under `example.com`.
    /// An image without a registry part is `docker.io`'s. A pod with an image of another
    /// registry is refused. Unset: any registry. Nodes pull with their own credentials too (a
    /// cloud's credential provider, a registry login on the node), whatever pull secrets a pod
    /// names, and no shipped profile can know which registries a host's nodes reach that way:
    /// platform teams whose nodes hold registry credentials list the registries tenants may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), inner(length(max = 253)))]
    pub image_registries: Option<Vec<String>>,
    /// Caps on the durations the host honours on a tenant's behalf: a host copy keeps at most
    /// these, and the tenant is told what was cut.
    #[serde(default)]
    pub durations: DurationCaps,
    /// Services of type `LoadBalancer`. Otherwise refused.
    #[serde(default)]
    pub load_balancers: bool,
    /// Balancer implementations tenant Services may name in `spec.loadBalancerClass` (an
    /// internal network's balancer, another team's). A Service naming another is refused; one
    /// that names none gets the host's default balancer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 253)))]
    pub load_balancer_classes: Vec<String>,
    /// Services of type `NodePort`. Otherwise refused.
    #[serde(default)]
    pub node_ports: bool,
    /// The host nodes' own addresses (`InternalIP`, `ExternalIP`) on the tenant's virtual Nodes
    /// and as its pods' `hostIP`, so node ports and host ports are reached at a node's address
    /// from the tenant as on the host. Off: a virtual Node's and a pod's host address is the
    /// operator's kubelet endpoint, and the host's addresses are never shown.
    #[serde(default)]
    pub node_addresses: bool,
    /// Names `ExternalName` Services may point at: exact DNS names, or `*.example.com` for any
    /// name under `example.com`. Otherwise refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 253)))]
    pub external_names: Vec<String>,
    /// Addresses the Endpoints of selector-less Services may hold, as CIDRs, beyond this
    /// tenant's own pods. Other addresses are left out of the host copy.
    #[serde(
        default,
        rename = "endpointCIDRs",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(length(max = 64), inner(length(max = 64)))]
    #[x_kube(validation = crate::rules::cidrs("allow.endpointCIDRs"))]
    pub endpoint_cidrs: Vec<String>,
    /// Addresses Services may claim in `externalIPs`, as CIDRs. A Service claiming another is
    /// refused.
    #[serde(
        default,
        rename = "externalIPCIDRs",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(length(max = 64), inner(length(max = 64)))]
    #[x_kube(validation = crate::rules::cidrs("allow.externalIPCIDRs"))]
    pub external_ip_cidrs: Vec<String>,
    /// A tenant Service's own cluster IP asked of the host for its copy, so the tenant Service
    /// keeps the address it was made with. Off: the host allocates every copy's address and the
    /// tenant Service is made again with it (a Service that chose its address is told). Either
    /// way, never the range's first address nor its tenth (the cluster DNS on many hosts).
    #[serde(default, rename = "chosenClusterIPs")]
    pub chosen_cluster_ips: bool,
    /// Hosts tenant Ingresses may serve: exact names, or `*.example.com` for any name under
    /// `example.com`. An Ingress with another host, or a rule without a host, is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 253)))]
    pub ingress_hosts: Vec<String>,
    /// IngressClasses tenant Ingresses may name; an Ingress naming another is refused. One that
    /// names none gets the host's default class.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 253)))]
    pub ingress_classes: Vec<String>,
    /// cert-manager issuers tenant Ingresses may name in `cert-manager.io/cluster-issuer` or
    /// `cert-manager.io/issuer` (of either kind). An Ingress naming another is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 253)))]
    pub cert_issuers: Vec<String>,
    /// Annotation keys copied to host copies, by kind, beyond the few every copy may carry.
    /// `example.com/*` allows every key under that prefix. Others are left out of the host copy.
    #[serde(default)]
    pub annotations: AnnotationAllowances,
}

/// The longest durations a host copy keeps. A pod that asks for more gets the cap: a grace period
/// of a year would keep a deleted tenant's container running on the host.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DurationCaps {
    /// The longest `terminationGracePeriodSeconds` (of the pod and of its probes), grace period
    /// of a delete, and lifecycle `sleep`. Default 300.
    #[serde(default = "default_grace_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub termination_grace_period_seconds: i64,
    /// The longest probe `timeoutSeconds`. Default 60.
    #[serde(default = "default_probe_timeout_seconds")]
    #[schemars(range(min = 1, max = 3600))]
    pub probe_timeout_seconds: i32,
    /// The longest `activeDeadlineSeconds`; a pod without one gets this one, so no tenant pod
    /// runs longer. Unset: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub active_deadline_seconds: Option<i64>,
}

fn default_grace_seconds() -> i64 {
    300
}

fn default_probe_timeout_seconds() -> i32 {
    60
}

impl Default for DurationCaps {
    fn default() -> Self {
        Self {
            termination_grace_period_seconds: default_grace_seconds(),
            probe_timeout_seconds: default_probe_timeout_seconds(),
            active_deadline_seconds: None,
        }
    }
}

/// Annotation keys the host copies of each kind may carry.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AnnotationAllowances {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 317)))]
    pub pods: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 317)))]
    pub services: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 317)))]
    pub ingresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 317)))]
    pub persistent_volume_claims: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 317)))]
    pub config_maps: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 317)))]
    pub secrets: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 317)))]
    pub service_accounts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 317)))]
    pub endpoints: Vec<String>,
}

impl AnnotationAllowances {
    /// The keys allowed on copies of `kind` (as the syncer names kinds: `Pod`, `Service`, …).
    pub fn for_kind(&self, kind: &str) -> &[String] {
        match kind {
            "Pod" => &self.pods,
            "Service" => &self.services,
            "Ingress" => &self.ingresses,
            "PersistentVolumeClaim" => &self.persistent_volume_claims,
            "ConfigMap" => &self.config_maps,
            "Secret" => &self.secrets,
            "ServiceAccount" => &self.service_accounts,
            "Endpoints" | "EndpointSlice" => &self.endpoints,
            _ => &[],
        }
    }
}

/// Does `name` match `pattern`: equal, or under the domain of a `*.example.com` pattern?
pub fn name_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(domain) => name
            .strip_suffix(domain)
            .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        None => pattern == name,
    }
}

/// Does annotation `key` match `pattern`: equal, or under the prefix of a `prefix*` pattern?
pub fn key_matches(pattern: &str, key: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => key.starts_with(prefix),
        None => pattern == key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_names_under_a_domain_and_keys_under_a_prefix() {
        assert!(name_matches("*.apps.example.com", "web.apps.example.com"));
        assert!(name_matches("*.apps.example.com", "a.b.apps.example.com"));
        assert!(!name_matches("*.apps.example.com", "apps.example.com"));
        assert!(!name_matches("*.apps.example.com", "evilapps.example.com"));
        assert!(name_matches("db.example.com", "db.example.com"));
        assert!(!name_matches("db.example.com", "x.db.example.com"));
        assert!(key_matches("prometheus.io/*", "prometheus.io/scrape"));
        assert!(!key_matches("prometheus.io/*", "prometheus.iox/scrape"));
        assert!(key_matches("a/b", "a/b") && !key_matches("a/b", "a/bc"));
    }
}
