//! `SyncPolicy`: which resources move between a tenant and its host namespace, and how.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::string_enum;

/// Which resources move between tenants and the host. The defaults match vcluster's: pods,
/// services, endpoints, referenced configMaps and secrets, and PVCs go down; virtual nodes and
/// events come up.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "tenantplane.io",
    version = "v1alpha1",
    kind = "SyncPolicy",
    plural = "syncpolicies",
    shortname = "syncp",
    status = "SyncPolicyStatus",
    derive = "PartialEq",
    doc = "Which resources the syncer moves between a TenantCluster and its host namespace.",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SyncPolicySpec {
    /// Resources created in the tenant and copied to the host.
    #[serde(default)]
    pub to_host: ToHost,
    /// Resources read from the host and shown in the tenant.
    #[serde(default)]
    pub from_host: FromHost,
}

/// Tenant → host.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ToHost {
    /// Pods, copied to the host to run there (on by default).
    #[serde(default = "SyncToggle::on")]
    pub pods: SyncToggle,
    /// Services, copied to the host (on by default).
    #[serde(default = "SyncToggle::on")]
    pub services: SyncToggle,
    /// Endpoints and EndpointSlices written by hand for selector-less Services (on by default).
    #[serde(default = "SyncToggle::on")]
    pub endpoints: SyncToggle,
    /// ConfigMaps sync only when a synced pod uses them, unless `all` is true.
    #[serde(default = "ReferencedSync::on")]
    pub config_maps: ReferencedSync,
    /// Secrets sync only when a synced pod uses them, unless `all` is true.
    #[serde(default = "ReferencedSync::on")]
    pub secrets: ReferencedSync,
    /// PersistentVolumeClaims, copied to the host to bind its storage (on by default).
    #[serde(default = "SyncToggle::on")]
    pub persistent_volume_claims: SyncToggle,
    /// ServiceAccounts, copied as names only (off by default).
    #[serde(default)]
    pub service_accounts: SyncToggle,
    /// Ingresses, copied when the profile admits them (off by default).
    #[serde(default)]
    pub ingresses: SyncToggle,
}

impl Default for ToHost {
    fn default() -> Self {
        Self {
            pods: SyncToggle::on(),
            services: SyncToggle::on(),
            endpoints: SyncToggle::on(),
            config_maps: ReferencedSync::on(),
            secrets: ReferencedSync::on(),
            persistent_volume_claims: SyncToggle::on(),
            service_accounts: SyncToggle::default(),
            ingresses: SyncToggle::default(),
        }
    }
}

/// Whether one kind syncs, and which of its objects.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct SyncToggle {
    /// Whether the kind syncs at all.
    #[serde(default)]
    pub enabled: bool,
    /// Only objects whose labels match sync; empty means all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

impl SyncToggle {
    /// The kind syncs, every object of it.
    pub fn on() -> Self {
        Self {
            enabled: true,
            selector: None,
        }
    }
}

/// Sync of a kind that pods reference (ConfigMaps, Secrets).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct ReferencedSync {
    /// Whether the kind syncs at all.
    #[serde(default)]
    pub enabled: bool,
    /// Only objects whose labels match sync; empty means all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Sync every object, not only those a synced pod uses.
    #[serde(default)]
    pub all: bool,
}

impl ReferencedSync {
    /// The kind syncs, the objects a synced pod uses.
    pub fn on() -> Self {
        Self {
            enabled: true,
            selector: None,
            all: false,
        }
    }
}

string_enum! {
    /// How host nodes appear in the tenant: `virtual`, the nodes that run tenant pods; `all`,
    /// every node the tenant may schedule to (the profile's node selector and tolerations).
    pub enum NodeSyncMode ("fromHost.nodes.mode", default = Virtual) {
        /// One Node per host node that runs the tenant's pods.
        Virtual = "virtual",
        /// One Node per host node the tenant may schedule to.
        All = "all",
    }
}

/// Host → tenant.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FromHost {
    /// Nodes: `virtual` shows one tenant Node per host node that runs tenant pods; `all` one per
    /// host node the tenant may schedule to, before any pod runs there.
    #[serde(default)]
    pub nodes: NodeSync,
    /// Host Events about the tenant's copies, shown on the tenant's objects (on by default).
    #[serde(default = "FromHostToggle::on")]
    pub events: FromHostToggle,
    /// The host's StorageClasses the profile lets the tenant name (off by default).
    #[serde(default)]
    pub storage_classes: FromHostToggle,
    /// The host's IngressClasses the profile lets the tenant name (off by default).
    #[serde(default)]
    pub ingress_classes: FromHostToggle,
}

impl Default for FromHost {
    fn default() -> Self {
        Self {
            nodes: NodeSync::default(),
            events: FromHostToggle::on(),
            storage_classes: FromHostToggle::default(),
            ingress_classes: FromHostToggle::default(),
        }
    }
}

/// Node sync settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct NodeSync {
    /// Whether the tenant sees Nodes at all.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Which host nodes appear, `virtual` or `all`.
    #[serde(default)]
    pub mode: NodeSyncMode,
    /// Host node labels a virtual Node shows besides the well-known topology ones
    /// (`kubernetes.io/hostname`, `kubernetes.io/os`, `kubernetes.io/arch`,
    /// `topology.kubernetes.io/zone` and `region`, `node.kubernetes.io/instance-type`): label
    /// keys, or prefixes ending in `*` (`example.com/*`). Empty: no other label of the host shows,
    /// since host labels name pools, owners and cloud instances. `tenantplane.io/` keys never show.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
}

fn yes() -> bool {
    true
}

impl Default for NodeSync {
    fn default() -> Self {
        Self {
            enabled: true,
            mode: NodeSyncMode::Virtual,
            labels: Vec::new(),
        }
    }
}

/// Whether a host kind is shown in the tenant.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct FromHostToggle {
    /// Whether the host kind shows in the tenant.
    #[serde(default)]
    pub enabled: bool,
}

impl FromHostToggle {
    /// The host kind shows in the tenant.
    pub fn on() -> Self {
        Self { enabled: true }
    }
}

/// What the controller observed about a policy.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SyncPolicyStatus {
    /// How many TenantClusters reference this policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<i32>,
}
