//! `TenantCluster`: one team's virtual cluster, the user-facing contract of TenantPlane.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::conditions::conditions_schema;
use crate::quantity::ParsedQuantity;
use crate::string_enum;

string_enum! {
    /// How the tenant's control plane and workloads are placed on the host.
    pub enum TenantMode ("mode", default = Shared) {
        /// Control plane and workloads on the host's shared nodes; the only mode implemented.
        Shared = "shared",
        /// Not implemented yet: accepted, and run as shared with `ModeSupported` False.
        Dedicated = "dedicated",
        /// Not implemented yet: accepted, and run as shared with `ModeSupported` False.
        Private = "private",
    }
}

string_enum! {
    /// The tenant control plane's datastore. Only sqlite is implemented so far.
    pub enum DatastoreType ("controlPlane.datastore.type", default = Sqlite) {
        /// kine over sqlite on the control plane's claim, one replica.
        Sqlite = "sqlite",
    }
}

string_enum! {
    /// Which Kubernetes runs the tenant's control plane: k3s (one binary, the seed's), or the
    /// upstream components (kine, kube-apiserver, kube-controller-manager) from their own images.
    pub enum Distribution ("controlPlane.distribution", default = K3s) {
        /// k3s, one binary: the seed's image, or the one `controlPlane.image` pins.
        K3s = "k3s",
        /// kine, kube-apiserver and kube-controller-manager, each from its own image.
        Kubernetes = "kubernetes",
    }
}

string_enum! {
    /// What the tenant's pods may reach outside their namespace.
    pub enum EgressPolicy ("networking.egressPolicy", default = DenyByDefault) {
        /// Only DNS, the tenant's own namespace, its control plane and the profile's allowed CIDRs.
        DenyByDefault = "deny-by-default",
        /// No egress limits.
        AllowAll = "allow-all",
    }
}

string_enum! {
    /// Where a TenantCluster stands, as one word.
    pub enum Phase ("status.phase", default = Pending) {
        /// Accepted, nothing built yet.
        Pending = "Pending",
        /// Objects applied, waiting for the control-plane pod, or a change rolling out.
        Provisioning = "Provisioning",
        /// The tenant answers and everything syncs.
        Ready = "Ready",
        /// Something is wrong; the `Ready` condition's reason and message say what.
        Degraded = "Degraded",
        /// Asleep: the control plane is stopped and the pods have left the host; the objects stay.
        Sleeping = "Sleeping",
    }
}

string_enum! {
    /// Why a tenant sleeps: `spec.sleep.asleep` asks it, or nobody used it for `afterIdle`.
    pub enum SleepCause ("status.sleep.cause", default = Requested) {
        /// `spec.sleep.asleep` asks it.
        Requested = "Requested",
        /// Nobody used the tenant for `spec.sleep.afterIdle`.
        Idle = "Idle",
    }
}

/// The desired state of one virtual cluster.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "tenantplane.io",
    version = "v1alpha1",
    kind = "TenantCluster",
    plural = "tenantclusters",
    shortname = "tc",
    namespaced,
    status = "TenantClusterStatus",
    derive = "PartialEq",
    doc = "A virtual Kubernetes cluster for one team, inside one namespace of the host cluster.",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.kubernetesVersion"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".status.endpoint"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = crate::rules::tenant_name()
)]
#[x_kube(validation = crate::rules::mode_change_allowed())]
#[x_kube(validation = crate::rules::distribution_change_allowed())]
#[x_kube(validation = crate::rules::k3s_shipped_the_version())]
#[x_kube(validation = crate::rules::version_no_downgrade())]
#[serde(rename_all = "camelCase")]
pub struct TenantClusterSpec {
    /// `shared`, `dedicated` or `private`. Only `shared` is implemented; the other modes are
    /// accepted and reconciled as shared, with the ModeSupported condition saying so.
    #[serde(default)]
    pub mode: TenantMode,

    /// The tenant's Kubernetes version, such as `v1.30.4`, at least v1.30.0; it picks the k3s
    /// image (`v1.30.4` runs `rancher/k3s:v1.30.4-k3s1`, a respun release its latest build). It
    /// may move up one minor version at a time, and down only in the change that restores a
    /// snapshot taken at that version (`tenantplane rollback`).
    #[schemars(length(max = 32))]
    #[x_kube(validation = crate::rules::version_format())]
    #[x_kube(validation = crate::rules::version_supported())]
    #[x_kube(validation = crate::rules::version_one_minor_at_a_time())]
    pub kubernetes_version: String,

    /// The IsolationProfile (cluster-scoped) put around this tenant's namespace.
    #[serde(default = "PolicyRef::restricted")]
    pub isolation_profile_ref: PolicyRef,

    /// The SyncPolicy (cluster-scoped) that says which resources move between tenant and host.
    #[serde(default = "PolicyRef::default_sync")]
    pub sync_policy_ref: PolicyRef,

    /// How the tenant's control plane runs.
    #[serde(default)]
    pub control_plane: ControlPlane,

    /// Network isolation of the tenant's workloads.
    #[serde(default)]
    pub networking: Networking,

    /// What may change after creation.
    #[serde(default)]
    pub migration: Migration,

    /// Caps for the control plane and, when the IsolationProfile enforces quota, for the tenant's
    /// ResourceQuota.
    #[serde(default)]
    pub resources: TenantResources,

    /// Sleep: the control plane scaled to zero and the workloads' host copies removed, keeping
    /// the tenant's objects, claims, Services and Secrets; a request to the tenant wakes it.
    #[serde(default, skip_serializing_if = "Sleep::is_default")]
    pub sleep: Sleep,

    /// Build the tenant from a TenantSnapshot, or roll it back to one in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<crate::Restore>,

    /// Take snapshots on a schedule and keep the newest `keep`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshots: Option<crate::SnapshotSchedule>,
}

/// When the tenant sleeps (`tenantplane sleep` and `tenantplane wake` write this).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Sleep {
    /// Sleep now. `tenantplane wake`, `tenantplane connect` and a request to the tenant's API
    /// Service set it back to false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub asleep: bool,

    /// Sleep after this long without a request from a person or a client outside the tenant
    /// (its own control plane, DNS and workloads, and the operator, do not count), such as
    /// `30m` or `1h30m`; at least `1m`. Unset, or with the annotation
    /// `tenantplane.io/keep-awake`, the tenant never sleeps by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = crate::rules::go_duration("sleep.afterIdle"))]
    #[x_kube(validation = crate::rules::duration_at_least("sleep.afterIdle", MIN_AFTER_IDLE))]
    pub after_idle: Option<String>,
}

/// The least `spec.sleep.afterIdle`: shorter would put a tenant to sleep between a person's
/// commands.
pub const MIN_AFTER_IDLE: &str = "1m";

impl Sleep {
    fn is_default(&self) -> bool {
        *self == Sleep::default()
    }

    /// `afterIdle`, read; `None` when unset (or unreadable, which admission refuses).
    pub fn after_idle(&self) -> Option<std::time::Duration> {
        crate::duration::parse(self.after_idle.as_deref()?).ok()
    }
}

/// A reference by name to a cluster-scoped policy object.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct PolicyRef {
    /// Name of the policy object.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = crate::rules::object_name("policy name"))]
    pub name: String,
}

impl PolicyRef {
    /// A reference to the policy object `name`.
    pub fn named(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
    fn restricted() -> Self {
        Self::named("restricted")
    }
    fn default_sync() -> Self {
        Self::named("default")
    }
}

/// The tenant's control plane.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = crate::rules::sqlite_single_replica())]
#[x_kube(validation = crate::rules::image_only_for_k3s())]
#[serde(rename_all = "camelCase")]
pub struct ControlPlane {
    /// `k3s` (the default) or `kubernetes`: kine, kube-apiserver and kube-controller-manager
    /// from their upstream images at `kubernetesVersion`, on the same datastore and claim. It
    /// changes on an existing tenant only with `spec.migration.allowModeChange`, keeping the data.
    #[serde(default)]
    pub distribution: Distribution,

    /// Control-plane replicas. The current milestone supports a single replica.
    #[serde(default = "one")]
    #[x_kube(validation = crate::rules::at_least_one("controlPlane.replicas"))]
    pub replicas: i32,

    /// Datastore backend of the control plane.
    #[serde(default)]
    pub datastore: Datastore,

    /// The control plane's image, such as `registry.example/k3s:v1.30.14-k3s2`, in place of the
    /// k3s release the operator picks for `kubernetesVersion`: a respin the operator does not
    /// know yet, or a build of your own. It must run the same Kubernetes version. Only for the
    /// `k3s` distribution (the `kubernetes` one runs three images, named by the operator's
    /// `--kubernetes-repository` and `--kine-image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = crate::rules::image_reference("controlPlane.image"))]
    pub image: Option<String>,
}

fn one() -> i32 {
    1
}

impl Default for ControlPlane {
    fn default() -> Self {
        Self {
            distribution: Distribution::default(),
            replicas: 1,
            datastore: Datastore::default(),
            image: None,
        }
    }
}

/// The control plane's datastore.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct Datastore {
    /// Datastore backend. Only `sqlite` is implemented.
    #[serde(default, rename = "type")]
    pub type_: DatastoreType,
}

/// Network isolation of the tenant.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Networking {
    /// `deny-by-default` lets the tenant's pods reach only DNS, their own namespace and the
    /// tenant's control plane (plus the profile's allowed CIDRs); `allow-all` lifts egress limits.
    #[serde(default)]
    pub egress_policy: EgressPolicy,
}

/// What may change after creation.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Migration {
    /// Allow `spec.mode` and `spec.controlPlane.distribution` to change. Without it a change of
    /// either is refused.
    #[serde(default)]
    pub allow_mode_change: bool,
}

/// The control plane's datastore claim: it counts against the tenant's storage cap, so no cap
/// may be smaller.
pub const CONTROL_PLANE_DATA_SIZE: &str = "2Gi";
/// The least CPU and memory caps a tenant may set: what its control plane (an agentless k3s
/// server, which the caps limit) needs to start and serve; less starves or OOM-kills it.
pub const CONTROL_PLANE_MIN_CPU: &str = "250m";
/// The least memory cap a tenant may set (see [`CONTROL_PLANE_MIN_CPU`]).
pub const CONTROL_PLANE_MIN_MEMORY: &str = "1Gi";
const FLOOR_WHY: &str = "the caps limit the tenant control plane, which needs that much";

/// Resource caps of the tenant, read once when the object is read.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct TenantResources {
    /// CPU cap, a quantity such as `2` or `500m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = crate::rules::quantity_at_least("resources.cpu", CONTROL_PLANE_MIN_CPU, FLOOR_WHY))]
    pub cpu: Option<ParsedQuantity>,

    /// Memory cap, a quantity such as `2Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = crate::rules::quantity_at_least("resources.memory", CONTROL_PLANE_MIN_MEMORY, FLOOR_WHY))]
    pub memory: Option<ParsedQuantity>,

    /// Storage cap, a quantity such as `100Gi`: what all the tenant's claims may request
    /// together, the control plane's own datastore claim included. It becomes the quota's
    /// `requests.storage`, never above the IsolationProfile's own `requests.storage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = crate::rules::quantity_at_least("resources.storage", CONTROL_PLANE_DATA_SIZE, "the datastore claim of the control plane counts too"))]
    pub storage: Option<ParsedQuantity>,
}

/// What the controller observed, for people and tools.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TenantClusterStatus {
    /// Pending, Provisioning, Ready, Degraded or Sleeping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,

    /// The in-cluster HTTPS address of the tenant API server, once Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,

    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Ready, Synced and ModeSupported, each with a reason and a message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,

    /// While the tenant sleeps: since when, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sleep: Option<SleepStatus>,

    /// The last restore asked of it (`spec.restore`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<crate::RestoreStatus>,

    /// What the snapshot schedule did (`spec.snapshots`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshots: Option<crate::ScheduleStatus>,

    /// The upgrade under way and the snapshot that guards it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<crate::UpgradeStatus>,
}

/// A sleeping tenant's record, kept until it wakes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SleepStatus {
    /// When it went to sleep.
    pub since: Time,
    /// `Requested` (spec.sleep.asleep) or `Idle` (no request for spec.sleep.afterIdle).
    pub cause: SleepCause,
    /// When it began to wake (its control plane starting again); unset while it sleeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waking_since: Option<Time>,
}
