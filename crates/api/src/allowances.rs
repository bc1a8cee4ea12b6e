//! What tenant objects may ask of the host, in an `IsolationProfile`. The syncer denies by
//! default: a tenant object that asks for something listed here and not allowed is refused (or
//! the field is left out of the host copy, where the object works without it), and the tenant is
//! told why. The host's Pod Security level is checked on top of this, never instead of it.

use std::collections::BTreeMap;

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
    /// Resources beyond `cpu`, `memory` and `ephemeral-storage` tenant pods may ask for
    /// (extended resources such as `example.com/gpu`, huge pages such as `hugepages-2Mi`), each
    /// with the most all of a tenant's pods may request together: the tenant's ResourceQuota
    /// counts each as `requests.<name>`, so nothing a pod is given goes uncounted. A pod asking
    /// for a resource not listed (in its containers' requests or limits, or pod-level
    /// resources) is refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16))]
    #[x_kube(validation = crate::rules::extra_resource_names())]
    pub resources: BTreeMap<String, crate::QuantityString>,
    /// The node disk tenant pods may use: a container's `ephemeral-storage`, `emptyDir` sizes,
    /// and what all pods together may request.
    #[serde(default)]
    pub ephemeral_storage: EphemeralStorageCaps,
    /// The most bytes of labels and annotations (keys and values together) one host copy may
    /// carry, a quantity such as `64Ki`; a tenant object whose copy would carry more is not
    /// copied, and the tenant is told. Unset: `64Ki`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_metadata_bytes: Option<crate::QuantityString>,
    /// The most bytes one host copy may take as the host stores it (its JSON), by kind
    /// (`Pod`, `Service`, `ConfigMap`, `Secret`, `Endpoints`, `EndpointSlice`, `Ingress`,
    /// `PersistentVolumeClaim`, `ServiceAccount`), over the defaults: `Pod` 256Ki,
    /// `ConfigMap` and `Secret` 1536Ki (1 MiB of data in base64 and its metadata; `maxDataBytes`
    /// caps the data), `Endpoints` and `EndpointSlice` 256Ki, `Service` and `Ingress` 128Ki, the others
    /// 32Ki. A tenant object whose copy (or what the syncer makes for it, such as a pod's
    /// token Secret) would be larger is not copied, and the tenant is told.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16))]
    #[x_kube(validation = crate::rules::object_bytes_kinds())]
    pub max_object_bytes: BTreeMap<String, crate::QuantityString>,
    /// The most ports one tenant Service may have; a Service with more is refused (every host
    /// node's proxy programs each port of each copy). Unset: 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_service_ports: Option<i32>,
    /// The most ended (Succeeded or Failed) pod copies one tenant keeps on the host, as
    /// kube-controller-manager's terminated-pod threshold bounds a cluster's: past it, the
    /// copies that ended first are deleted, and their tenant pods with them (a pod's logs go
    /// with its copy). The quota's `pods` counts only pods that run. Unset: 500.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100000))]
    pub max_ended_pods: Option<i32>,
    /// Taint keys tenant pods may tolerate. Other tolerations are left out of the host copy,
    /// the node lifecycle's too (`node.kubernetes.io/memory-pressure`, `unschedulable`, …: the
    /// host keeps pods off such nodes), but for the stay of at most 300 s on a not-ready or
    /// unreachable node every pod is given.
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

/// The node disk a tenant's pods may use. Defaults a real team's pods do not meet; a platform on
/// small disks lowers them.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(validation = crate::rules::default_within_cap("defaultLimit", "maxPerContainer"))]
#[x_kube(validation = crate::rules::default_within_cap("emptyDirDefault", "emptyDirMax"))]
#[serde(rename_all = "camelCase")]
pub struct EphemeralStorageCaps {
    /// The `ephemeral-storage` limit a host copy's container gets when it sets none (its
    /// request, when unset, stays 0): the kubelet evicts a container writing past it, so no
    /// container fills a node's disk. Default `16Gi`.
    #[serde(default = "default_container_disk")]
    pub default_limit: crate::QuantityString,
    /// The most `ephemeral-storage` one container may request or limit; a pod asking more is
    /// refused. Default `64Gi`.
    #[serde(default = "default_container_disk_max")]
    pub max_per_container: crate::QuantityString,
    /// The `sizeLimit` a host copy's `emptyDir` gets when it sets none. Default `16Gi`.
    #[serde(default = "default_empty_dir")]
    pub empty_dir_default: crate::QuantityString,
    /// The largest `emptyDir` `sizeLimit`; a pod asking more is refused. Default `64Gi`.
    #[serde(default = "default_container_disk_max")]
    pub empty_dir_max: crate::QuantityString,
    /// What all the tenant's pods may request together, the ResourceQuota's
    /// `requests.ephemeral-storage`. Default `512Gi`.
    #[serde(default = "default_total_disk")]
    pub total: crate::QuantityString,
}

fn default_container_disk() -> crate::QuantityString {
    "16Gi".into()
}

fn default_container_disk_max() -> crate::QuantityString {
    "64Gi".into()
}

fn default_empty_dir() -> crate::QuantityString {
    "16Gi".into()
}

fn default_total_disk() -> crate::QuantityString {
    "512Gi".into()
}

impl Default for EphemeralStorageCaps {
    fn default() -> Self {
        Self {
            default_limit: default_container_disk(),
            max_per_container: default_container_disk_max(),
            empty_dir_default: default_empty_dir(),
            empty_dir_max: default_container_disk_max(),
            total: default_total_disk(),
        }
    }
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
    /// Annotation keys the host copies of Pods may carry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 317)))]
    pub pods: Vec<String>,
    /// Annotation keys the host copies of Services may carry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 317)))]
    pub services: Vec<String>,
    /// Annotation keys the host copies of Ingresses may carry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 317)))]
    pub ingresses: Vec<String>,
    /// Annotation keys the host copies of PersistentVolumeClaims may carry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 317)))]
    pub persistent_volume_claims: Vec<String>,
    /// Annotation keys the host copies of ConfigMaps may carry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 317)))]
    pub config_maps: Vec<String>,
    /// Annotation keys the host copies of Secrets may carry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 317)))]
    pub secrets: Vec<String>,
    /// Annotation keys the host copies of ServiceAccounts may carry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 317)))]
    pub service_accounts: Vec<String>,
    /// Annotation keys the host copies of Endpoints and EndpointSlices may carry.
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

/// How many objects of each kind the syncer writes (or has the host write for its copies) one
/// tenant may hold on the host, where the profile's `resourceQuota.hard` says nothing: well above
/// what a team's cluster holds, so only a runaway or an attack meets them. Pods count while
/// they run (ended copies are the syncer's to bound: `allow.maxEndedPods`). Written as the API
/// server writes them back (`1k`, not `1000`), so the quota the operator applies is the one it
/// reads.
pub const DEFAULT_COUNTS: &[(&str, &str)] = &[
    ("pods", "1k"),
    ("services", "500"),
    ("persistentvolumeclaims", "500"),
    ("count/configmaps", "1k"),
    ("count/secrets", "2k"),
    ("count/serviceaccounts", "500"),
    ("count/endpoints", "500"),
    ("count/endpointslices.discovery.k8s.io", "2k"),
    ("count/ingresses.networking.k8s.io", "500"),
];

impl Allowances {
    /// The quota keys the host always enforces for a tenant: the object counts of every kind
    /// the syncer writes ([`DEFAULT_COUNTS`]); each of `resources` as `requests.<name>` with its
    /// total; and node disk as `requests.ephemeral-storage`. So nothing a tenant puts on the
    /// host goes uncounted, whatever the profile enforces besides.
    pub fn quota_keys(&self) -> BTreeMap<String, String> {
        let mut keys: BTreeMap<String, String> = DEFAULT_COUNTS
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        keys.extend(
            self.resources
                .iter()
                .map(|(name, total)| (format!("requests.{name}"), total.0.clone())),
        );
        keys.insert(
            "requests.ephemeral-storage".into(),
            self.ephemeral_storage.total.0.clone(),
        );
        keys
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

    #[test]
    fn the_quota_counts_every_resource_the_profile_opens() {
        let allow = Allowances {
            resources: BTreeMap::from([
                ("example.com/gpu".to_string(), "2".into()),
                ("hugepages-2Mi".to_string(), "1Gi".into()),
            ]),
            ..Default::default()
        };
        let keys = allow.quota_keys();
        for (k, v) in [
            ("requests.ephemeral-storage", "512Gi"),
            ("requests.example.com/gpu", "2"),
            ("requests.hugepages-2Mi", "1Gi"),
            ("count/endpointslices.discovery.k8s.io", "2k"),
            ("count/secrets", "2k"),
            ("pods", "1k"),
        ] {
            assert_eq!(keys.get(k).map(String::as_str), Some(v), "{k}");
        }
        assert_eq!(keys.len(), DEFAULT_COUNTS.len() + 3);
    }
}
