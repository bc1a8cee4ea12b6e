//! What a TenantCluster says of its snapshots: a restore to build it from (or roll it back to),
//! a schedule of snapshots with their retention, and, in status, how the last restore went, what
//! the schedule did and which snapshot guards an upgrade.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::snapshot::LocalRef;
use crate::string_enum;

/// Put a snapshot in place of the tenant's datastore: on a new TenantCluster, before its control
/// plane first starts; on an existing one, by stopping its pod, replacing the data and starting
/// it again (`tenantplane restore` writes this).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Restore {
    /// The TenantSnapshot, Completed. In another namespace only when that snapshot carries the
    /// annotation `tenantplane.io/restore-to` naming this namespace (its owner's grant).
    pub snapshot_ref: SnapshotRef,

    /// Set anew to restore the same snapshot again; `tenantplane restore` writes the time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub requested_at: Option<String>,
}

/// A TenantSnapshot by name, in this namespace unless another is named.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct SnapshotRef {
    /// Name of the TenantSnapshot.
    #[schemars(length(max = 253))]
    #[x_kube(validation = crate::rules::object_name("restore.snapshotRef.name"))]
    pub name: String,

    /// Namespace of the TenantSnapshot, when it is not the TenantCluster's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub namespace: Option<String>,
}

/// Snapshots taken on a schedule, the oldest beyond `keep` deleted.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSchedule {
    /// A cron schedule in UTC, five fields (`minute hour day-of-month month day-of-week`), such
    /// as `0 3 * * *` for 03:00 every day; `@daily` and `@hourly` work too, and a sixth field
    /// first for seconds.
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = crate::rules::cron_shape("snapshots.schedule"))]
    pub schedule: String,

    /// How many scheduled snapshots to keep (Completed ones; the oldest beyond it are deleted
    /// with their stored objects). Snapshots made by hand or before an upgrade do not count.
    #[serde(default = "default_keep")]
    #[schemars(range(max = 1000))]
    #[x_kube(validation = crate::rules::at_least_one("snapshots.keep"))]
    pub keep: i32,

    /// The store; unset, the store marked `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_ref: Option<LocalRef>,
}

fn default_keep() -> i32 {
    7
}

string_enum! {
    /// Where a restore stands.
    pub enum RestorePhase ("status.restore.phase", default = Restoring) {
        /// Under way: the tenant waits for the control-plane pod that carries the restore.
        Restoring = "Restoring",
        /// The snapshot's data is in place and the tenant runs on it.
        Completed = "Completed",
        /// Refused before anything was touched, or given up with the tenant on the data it had.
        Failed = "Failed",
    }
}

/// The last restore asked of this tenant.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RestoreStatus {
    /// The snapshot, as `namespace/name`.
    pub snapshot: String,

    /// The request's `requestedAt`, to tell a new request of the same snapshot from this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<String>,

    /// Restoring, Completed, or Failed (refused before anything was touched, or given up with
    /// the tenant on the data it had).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RestorePhase>,

    /// The restore the control-plane pod carries: its init container puts it in place once, and
    /// a pod that starts again with it already in place goes straight on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,

    /// The snapshot's checksum, checked before the restore began and again by the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,

    /// When the restore began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When the restore completed or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,

    /// What it does now, or why it failed, in the words of whatever refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// The tenant had data before (a rollback): a restore that fails leaves it on that data.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_place: bool,
}

/// What the snapshot schedule did.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleStatus {
    /// When the last scheduled snapshot was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,

    /// The last scheduled snapshot's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_snapshot: Option<String>,

    /// When the next one is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<Time>,

    /// Why the schedule cannot run (a schedule that does not parse, no store), when it cannot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The snapshot taken before an upgrade, which `tenantplane rollback` restores.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeStatus {
    /// The version upgraded from.
    pub from: String,

    /// The version upgraded to.
    pub to: String,

    /// The TenantSnapshot that guards it (in this namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,

    /// One word for where it stands: `CheckingRemovedAPIs`, `RemovedAPIsInUse`,
    /// `TakingSnapshot`, `SnapshotFailed`, `SnapshotTaken`, `NoSnapshotStore` or
    /// `WaitingForWake`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,

    /// What the upgrade waits for, or why it is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
