//! Status: from what a reconcile observed to a phase, conditions and an endpoint. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tenantplane_api::conditions::{
    self, ConditionSpec, MODE_SUPPORTED, READY, RESTORED, SYNCED, UPGRADE_GUARDED,
};
use tenantplane_api::{
    Phase, RestorePhase, SleepCause, SleepStatus, TenantCluster, TenantClusterStatus, TenantMode,
};
use tenantplane_syncer::{OBJECTS_REFUSED, SYNC_STARTING};

/// Where a reconcile got to, and why it stopped there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Just accepted; nothing built yet.
    Accepted,
    /// A referenced policy does not exist.
    PolicyMissing {
        /// `IsolationProfile` or `SyncPolicy`.
        kind: &'static str,
        /// The policy's name.
        name: String,
    },
    /// Another TenantCluster, `by`, holds the namespace (it is older): this one provisions
    /// nothing until it is gone.
    NamespaceInUse {
        /// The other TenantCluster's name.
        by: String,
    },
    /// The PKI Secret exists but cannot be used.
    PkiDamaged(String),
    /// An object could not be applied: what it was and the API server's answer.
    ApplyFailed(String),
    /// The host's Service range is unknown (`ServiceCIDRUnknown`) or disagrees with the
    /// operator's flag or the API Service's address (`ServiceCIDRMismatch`): nothing that would
    /// allocate from a wrong range is built.
    ServiceRange {
        /// `ServiceCIDRUnknown` or `ServiceCIDRMismatch`.
        reason: &'static str,
        /// What is wrong, in words.
        detail: String,
    },
    /// The control-plane pod cannot start for a reason waiting will not fix (its image cannot
    /// be pulled, its init container fails): `reason` says which.
    ControlPlaneFailing {
        /// Why, as one word.
        reason: &'static str,
        /// What the pod's status says.
        detail: String,
    },
    /// The control-plane pod is not Ready. `stuck` when it has been so for too long, or it was
    /// Ready before.
    ControlPlaneNotReady {
        /// What the pod's status says.
        detail: String,
        /// Whether it has been not Ready for too long, or was Ready before.
        stuck: bool,
    },
    /// The pod is Ready but the tenant API server does not answer.
    Unreachable(String),
    /// The tenant answers while it comes up (after a start or an upgrade) and its syncer is still
    /// reading the tenant and the host namespace, or its watches reconnect to the new server: on
    /// its way.
    SyncStarting {
        /// The Kubernetes version the tenant API server reports.
        version: String,
        /// The syncer's reason (`SyncStarting` or `WatchFailed`), for the `Synced` condition.
        reason: String,
        /// What the syncer is doing, as it says it.
        message: String,
    },
    /// The tenant answered but the syncer reports a failure.
    SyncFailed {
        /// The Kubernetes version the tenant API server reports.
        version: String,
        /// The `Synced` condition's reason.
        reason: String,
        /// What failed, as the syncer reports it.
        error: String,
    },
    /// Everything is up and the sync pass succeeded.
    Synced {
        /// The Kubernetes version the tenant API server reports.
        version: String,
        /// What syncs, as the `Synced` condition's message says it; or, when `refused`, the
        /// objects refused.
        summary: String,
        /// Objects the tenant's users wrote were refused by the profile or the host, and nothing
        /// else fails: theirs to fix, so the tenant stays Ready (`Synced` False says which).
        refused: bool,
    },
    /// The tenant answers and syncs, but a first pod would still fail: it waits for its
    /// `default` ServiceAccount or its DNS (see `phases::settle`). On its way, until `stuck`.
    Settling {
        /// The Kubernetes version the tenant API server reports.
        version: String,
        /// The `Synced` condition's message, as for [`Progress::Synced`].
        summary: String,
        /// Objects the tenant's users wrote were refused, as for [`Progress::Synced`].
        refused: bool,
        /// What a first pod waits for, in words.
        waiting_for: String,
        /// It has waited longer than a control plane may take to come up.
        stuck: bool,
        /// What it waits for cannot come (`waiting_for` says why): the platform's to fix.
        blocked: bool,
    },
    /// Asleep: the control plane scaled to zero, the syncer stopped, the pods' copies removed.
    Sleeping(SleepStatus),
}

fn mode_condition(tc: &TenantCluster) -> ConditionSpec {
    match tc.spec.mode {
        TenantMode::Shared => ConditionSpec::new(
            MODE_SUPPORTED,
            true,
            "Shared",
            "the tenant runs in shared mode",
        ),
        other => ConditionSpec::new(
            MODE_SUPPORTED,
            false,
            "ModeNotImplemented",
            format!("mode {other} is not implemented yet; this tenant runs as shared"),
        ),
    }
}

/// The Ready reason of a tenant that answers and syncs while a first pod would still fail.
pub const TENANT_SETTLING: &str = "TenantSettling";

/// `Synced` of a tenant whose syncer runs: `summary` says what syncs, or, when `refused`, which
/// of the tenant's users' objects were refused.
fn synced_condition(summary: &str, refused: bool) -> ConditionSpec {
    if refused {
        ConditionSpec::new(SYNCED, false, OBJECTS_REFUSED, summary)
    } else {
        ConditionSpec::new(SYNCED, true, "SyncSucceeded", summary)
    }
}

/// `Restored`, while `spec.restore` asks a restore: how the last one went.
fn restore_condition(tc: &TenantCluster) -> Option<ConditionSpec> {
    tc.spec.restore.as_ref()?;
    let restore = tc.status.as_ref()?.restore.as_ref()?;
    let message = restore.message.clone().unwrap_or_default();
    Some(match restore.phase.unwrap_or_default() {
        RestorePhase::Restoring => ConditionSpec::new(RESTORED, false, "Restoring", message),
        RestorePhase::Completed => ConditionSpec::new(RESTORED, true, "RestoreCompleted", message),
        RestorePhase::Failed if message.starts_with("refused") => {
            ConditionSpec::new(RESTORED, false, "RestoreRefused", message)
        }
        RestorePhase::Failed => ConditionSpec::new(RESTORED, false, "RestoreFailed", message),
    })
}

/// `UpgradeGuarded`, while `status.upgrade` records an upgrade: True once a snapshot holds the
/// tenant as it was before it.
fn upgrade_condition(tc: &TenantCluster) -> Option<ConditionSpec> {
    let upgrade = tc.status.as_ref()?.upgrade.as_ref()?;
    let reason = upgrade.reason.clone().unwrap_or_else(|| "Upgrading".into());
    let guarded = reason == crate::upgrade::reason::GUARDED;
    Some(ConditionSpec::new(
        UPGRADE_GUARDED,
        guarded,
        reason,
        upgrade.message.clone().unwrap_or_default(),
    ))
}

/// The phase and the `Ready` and `Synced` conditions that `progress` comes to: one arm per
/// [`Progress`], the whole table of phases and reasons in one place, which is why it is long.
fn verdict(
    tc: &TenantCluster,
    progress: &Progress,
    endpoint: &str,
) -> (Phase, ConditionSpec, ConditionSpec) {
    let waiting = |reason: &str, message: &str| ConditionSpec::new(SYNCED, false, reason, message);
    match progress {
        Progress::Accepted => (
            Phase::Pending,
            ConditionSpec::new(
                READY,
                false,
                "Pending",
                "accepted; resolving the IsolationProfile and SyncPolicy",
            ),
            waiting("Pending", "nothing to sync before the control plane is up"),
        ),
        Progress::PolicyMissing { kind, name } => {
            let message = format!(
                "{kind} {name:?} not found: create it (deploy/policies has ready-made ones) or reference an existing {kind}"
            );
            let reason = format!("{kind}NotFound");
            (
                Phase::Degraded,
                ConditionSpec::new(READY, false, reason.clone(), message.clone()),
                waiting(&reason, &message),
            )
        }
        Progress::NamespaceInUse { by } => {
            let ns = tc.metadata.namespace.as_deref().unwrap_or_default();
            let message = format!(
                "namespace {ns} already holds TenantCluster {by:?}; one TenantCluster per namespace: create this one in a namespace of its own, or delete {by:?}"
            );
            (
                Phase::Degraded,
                ConditionSpec::new(READY, false, "NamespaceInUse", message.clone()),
                waiting("NamespaceInUse", &message),
            )
        }
        Progress::PkiDamaged(detail) => {
            let message = format!(
                "the PKI Secret is damaged ({detail}); restore it from a backup, or delete it to generate a new CA (every existing kubeconfig of this tenant stops working)"
            );
            (
                Phase::Degraded,
                ConditionSpec::new(READY, false, "PKIInvalid", message.clone()),
                waiting("PKIInvalid", &message),
            )
        }
        Progress::ApplyFailed(detail) => (
            Phase::Degraded,
            ConditionSpec::new(READY, false, "ApplyFailed", detail.clone()),
            waiting("ApplyFailed", detail),
        ),
        Progress::ServiceRange { reason, detail }
        | Progress::ControlPlaneFailing { reason, detail } => (
            Phase::Degraded,
            ConditionSpec::new(READY, false, *reason, detail.clone()),
            waiting(reason, "waiting for the control plane before syncing"),
        ),
        Progress::ControlPlaneNotReady { detail, stuck } => (
            if *stuck {
                Phase::Degraded
            } else {
                Phase::Provisioning
            },
            ConditionSpec::new(READY, false, "ControlPlaneNotReady", detail.clone()),
            waiting(
                "ControlPlaneNotReady",
                "waiting for the control plane before syncing",
            ),
        ),
        Progress::Unreachable(detail) => {
            let message = format!("the tenant API server does not answer: {detail}");
            (
                Phase::Degraded,
                ConditionSpec::new(READY, false, "TenantUnreachable", message.clone()),
                waiting("TenantUnreachable", &message),
            )
        }
        Progress::SyncStarting {
            version,
            reason,
            message,
        } => (
            Phase::Provisioning,
            ConditionSpec::new(
                READY,
                false,
                SYNC_STARTING,
                format!("the tenant API server answers (Kubernetes {version}); {message}"),
            ),
            waiting(reason, message),
        ),
        Progress::SyncFailed {
            version,
            reason,
            error,
        } => (
            Phase::Degraded,
            ConditionSpec::new(
                READY,
                true,
                "ControlPlaneReady",
                format!("the tenant API server answers at {endpoint} (Kubernetes {version})"),
            ),
            ConditionSpec::new(SYNCED, false, reason.clone(), error.clone()),
        ),
        Progress::Synced {
            version,
            summary,
            refused,
        } => (
            Phase::Ready,
            ConditionSpec::new(
                READY,
                true,
                "ControlPlaneReady",
                format!("the tenant API server answers at {endpoint} (Kubernetes {version})"),
            ),
            synced_condition(summary, *refused),
        ),
        Progress::Settling {
            version,
            summary,
            refused,
            waiting_for,
            stuck,
            blocked,
        } => (
            if *stuck || *blocked {
                Phase::Degraded
            } else {
                Phase::Provisioning
            },
            ConditionSpec::new(
                READY,
                false,
                TENANT_SETTLING,
                format!(
                    "the tenant API server answers (Kubernetes {version}); a first pod waits for {waiting_for}{}",
                    if *stuck && !*blocked {
                        ", for longer than a control plane may take to come up"
                    } else {
                        ""
                    }
                ),
            ),
            synced_condition(summary, *refused),
        ),
        Progress::Sleeping(sleep) => {
            let name = tc.metadata.name.as_deref().unwrap_or_default();
            let ns = tc.metadata.namespace.as_deref().unwrap_or_default();
            let why = match sleep.cause {
                SleepCause::Requested => "as spec.sleep.asleep asks".to_string(),
                SleepCause::Idle => format!(
                    "after {} without a request",
                    tc.spec
                        .sleep
                        .after_idle
                        .as_deref()
                        .unwrap_or("spec.sleep.afterIdle")
                ),
            };
            (
                Phase::Sleeping,
                ConditionSpec::new(
                    READY,
                    false,
                    "Sleeping",
                    format!(
                        "asleep since {} {why}; wake it with `tenantplane wake {name} -n {ns}`, `tenantplane connect {name} -n {ns}` or any request to its API Service",
                        sleep.since.0
                    ),
                ),
                ConditionSpec::new(
                    SYNCED,
                    false,
                    "SyncPaused",
                    "the syncer is paused while the tenant sleeps: its pods' host copies are removed and come back when it wakes",
                ),
            )
        }
    }
}

/// The status a reconcile should leave, keeping transition times of unchanged conditions.
pub fn desired_status(
    tc: &TenantCluster,
    progress: &Progress,
    endpoint: &str,
    now: &Time,
) -> TenantClusterStatus {
    let previous = tc.status.clone().unwrap_or_default();
    let generation = tc.metadata.generation;
    let (phase, ready, synced) = verdict(tc, progress, endpoint);
    let mut list = previous.conditions.clone();
    for condition in [&ready, &synced, &mode_condition(tc)] {
        conditions::set(&mut list, condition, generation, now);
    }
    match restore_condition(tc) {
        Some(condition) => conditions::set(&mut list, &condition, generation, now),
        None => list.retain(|c| c.type_ != RESTORED),
    }
    match upgrade_condition(tc) {
        Some(condition) => conditions::set(&mut list, &condition, generation, now),
        None => list.retain(|c| c.type_ != UPGRADE_GUARDED),
    }
    let reached_ready = matches!(
        progress,
        Progress::Synced { .. } | Progress::SyncFailed { .. }
    );
    let sleep = match progress {
        Progress::Sleeping(sleep) => Some(sleep.clone()),
        // Awake again once it answers; until then it is waking, since the first such status.
        _ if reached_ready => None,
        _ => previous.sleep.map(|s| SleepStatus {
            waking_since: s.waking_since.or_else(|| Some(now.clone())),
            ..s
        }),
    };
    TenantClusterStatus {
        phase: Some(phase),
        // The address is there while the tenant API server answers, and only then.
        endpoint: reached_ready.then(|| endpoint.to_string()),
        observed_generation: generation,
        conditions: list,
        sleep,
        restore: previous.restore,
        snapshots: previous.snapshots,
        upgrade: previous.upgrade,
    }
}

/// Does `desired` differ from `current` only in the `Synced` condition and the phase it moves?
/// That is what a tenant's objects change (a refused pod, one fixed), as often as the tenant
/// likes: such a write may wait a little and carry a later state along.
pub fn only_sync_changed(current: &TenantClusterStatus, desired: &TenantClusterStatus) -> bool {
    let without_sync = |s: &TenantClusterStatus| {
        let mut s = s.clone();
        s.phase = None;
        s.conditions.retain(|c| c.type_ != SYNCED);
        s
    };
    without_sync(current) == without_sync(desired)
}

/// Conditions whose status or reason changed, for Events.
pub fn changed_conditions<'a>(
    before: &TenantClusterStatus,
    after: &'a TenantClusterStatus,
) -> Vec<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    after
        .conditions
        .iter()
        .filter(|c| {
            conditions::find(&before.conditions, &c.type_)
                .is_none_or(|b| b.status != c.status || b.reason != c.reason)
        })
        .collect()
}

#[cfg(test)]
mod tests;
