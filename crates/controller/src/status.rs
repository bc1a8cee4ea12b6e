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
mod tests {
    use super::*;
    use crate::build::fixtures::tenant;
    use k8s_openapi::jiff::Timestamp;

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    const EP: &str = "https://dev.team-dev.svc:6443";

    #[test]
    fn phases_follow_progress() {
        let tc = tenant();
        let cases = [
            (Progress::Accepted, Phase::Pending),
            (
                Progress::PolicyMissing {
                    kind: "SyncPolicy",
                    name: "default".into(),
                },
                Phase::Degraded,
            ),
            (
                Progress::ControlPlaneNotReady {
                    detail: "x".into(),
                    stuck: false,
                },
                Phase::Provisioning,
            ),
            (
                Progress::ControlPlaneNotReady {
                    detail: "x".into(),
                    stuck: true,
                },
                Phase::Degraded,
            ),
            (Progress::Unreachable("refused".into()), Phase::Degraded),
            (Progress::ApplyFailed("refused".into()), Phase::Degraded),
            (
                Progress::ServiceRange {
                    reason: "ServiceCIDRMismatch",
                    detail: "x".into(),
                },
                Phase::Degraded,
            ),
            (
                Progress::ControlPlaneFailing {
                    reason: "ImagePullFailed",
                    detail: "x".into(),
                },
                Phase::Degraded,
            ),
            (
                Progress::NamespaceInUse { by: "first".into() },
                Phase::Degraded,
            ),
            (
                Progress::SyncStarting {
                    version: "v1".into(),
                    reason: SYNC_STARTING.into(),
                    message: "reading".into(),
                },
                Phase::Provisioning,
            ),
            (
                Progress::SyncFailed {
                    version: "v1".into(),
                    reason: "SyncFailed".into(),
                    error: "e".into(),
                },
                Phase::Degraded,
            ),
            (
                Progress::Synced {
                    version: "v1".into(),
                    summary: "ok".into(),
                    refused: false,
                },
                Phase::Ready,
            ),
            (
                Progress::Synced {
                    version: "v1".into(),
                    summary: "1 object refused".into(),
                    refused: true,
                },
                Phase::Ready,
            ),
        ];
        for (progress, phase) in cases {
            assert_eq!(
                desired_status(&tc, &progress, EP, &at(1)).phase,
                Some(phase),
                "{progress:?}"
            );
        }
    }

    #[test]
    fn objects_the_tenant_refused_leave_it_ready_and_are_named_in_synced() {
        let refused = "1 object refused, the tenant's to fix (each has a Warning Event in the tenant):\n- NotAllowed: Pod default/p: privileged";
        let status = desired_status(
            &tenant(),
            &Progress::Synced {
                version: "v1".into(),
                summary: refused.into(),
                refused: true,
            },
            EP,
            &at(1),
        );
        assert_eq!(status.phase, Some(Phase::Ready));
        assert_eq!(status.endpoint.as_deref(), Some(EP));
        let ready = conditions::find(&status.conditions, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "ControlPlaneReady")
        );
        let synced = conditions::find(&status.conditions, SYNCED).unwrap();
        assert_eq!(synced.status, "False");
        assert_eq!(synced.reason, OBJECTS_REFUSED);
        assert_eq!(synced.message, refused);
    }

    #[test]
    fn a_tenant_settling_is_provisioning_until_stuck_or_blocked() {
        let settling = |stuck: bool, blocked: bool| Progress::Settling {
            version: "v1".into(),
            summary: "in sync".into(),
            refused: false,
            waiting_for: "the tenant's DNS".into(),
            stuck,
            blocked,
        };
        for (stuck, blocked, phase) in [
            (false, false, Phase::Provisioning),
            (true, false, Phase::Degraded),
            (false, true, Phase::Degraded),
        ] {
            let status = desired_status(&tenant(), &settling(stuck, blocked), EP, &at(1));
            assert_eq!(
                status.phase,
                Some(phase),
                "stuck {stuck}, blocked {blocked}"
            );
            assert_eq!(status.endpoint, None);
            let ready = conditions::find(&status.conditions, READY).unwrap();
            assert_eq!(ready.reason, TENANT_SETTLING);
            assert!(
                ready
                    .message
                    .contains("a first pod waits for the tenant's DNS")
            );
            assert_eq!(
                ready.message.contains("for longer than"),
                stuck && !blocked,
                "{}",
                ready.message
            );
            let synced = conditions::find(&status.conditions, SYNCED).unwrap();
            assert_eq!(synced.status, "True");
        }
    }

    #[test]
    fn a_missing_policy_is_named_in_reason_and_message() {
        let status = desired_status(
            &tenant(),
            &Progress::PolicyMissing {
                kind: "IsolationProfile",
                name: "restricted".into(),
            },
            EP,
            &at(1),
        );
        let ready = conditions::find(&status.conditions, READY).unwrap();
        assert_eq!(ready.reason, "IsolationProfileNotFound");
        assert!(
            ready
                .message
                .starts_with("IsolationProfile \"restricted\" not found"),
            "{}",
            ready.message
        );
        assert_eq!(status.endpoint, None);
    }

    #[test]
    fn a_second_tenant_in_a_namespace_names_the_holder_and_what_to_do() {
        let status = desired_status(
            &tenant(),
            &Progress::NamespaceInUse { by: "first".into() },
            EP,
            &at(1),
        );
        let expected = "namespace team-dev already holds TenantCluster \"first\"; one TenantCluster per namespace: create this one in a namespace of its own, or delete \"first\"";
        for type_ in [READY, SYNCED] {
            let c = conditions::find(&status.conditions, type_).unwrap();
            assert_eq!(
                (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
                ("False", "NamespaceInUse", expected),
                "{type_}"
            );
        }
        assert_eq!(status.phase, Some(Phase::Degraded));
        assert_eq!(status.endpoint, None, "it never had a control plane");
    }

    #[test]
    fn other_modes_run_as_shared_and_say_so() {
        let mut tc = tenant();
        tc.spec.mode = TenantMode::Dedicated;
        let status = desired_status(&tc, &Progress::Accepted, EP, &at(1));
        let mode = conditions::find(&status.conditions, MODE_SUPPORTED).unwrap();
        assert_eq!(
            (mode.status.as_str(), mode.reason.as_str()),
            ("False", "ModeNotImplemented")
        );
        assert_eq!(
            mode.message,
            "mode dedicated is not implemented yet; this tenant runs as shared"
        );
    }

    #[test]
    fn the_same_progress_twice_gives_the_same_status() {
        let mut tc = tenant();
        tc.metadata.generation = Some(3);
        let progress = Progress::Synced {
            version: "v1.30.4".into(),
            summary: "ok".into(),
            refused: false,
        };
        let first = desired_status(&tc, &progress, EP, &at(1));
        tc.status = Some(first.clone());
        let second = desired_status(&tc, &progress, EP, &at(99));
        assert_eq!(first, second, "nothing changed, so nothing to write");
        assert!(changed_conditions(&first, &second).is_empty());
        assert!(
            second
                .conditions
                .iter()
                .all(|c| c.observed_generation == Some(3))
        );
        assert_eq!(second.endpoint.as_deref(), Some(EP));
    }

    #[test]
    fn the_endpoint_is_there_only_while_the_tenant_answers() {
        let mut tc = tenant();
        let up = desired_status(
            &tc,
            &Progress::Synced {
                version: "v".into(),
                summary: "ok".into(),
                refused: false,
            },
            EP,
            &at(1),
        );
        tc.status = Some(up.clone());
        assert_eq!(up.endpoint.as_deref(), Some(EP));
        let down = desired_status(&tc, &Progress::Unreachable("gone".into()), EP, &at(2));
        assert_eq!(down.endpoint, None);
        let changed: Vec<&str> = changed_conditions(&up, &down)
            .iter()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(changed, [READY, SYNCED]);
    }

    #[test]
    fn only_what_the_syncer_says_counts_as_sync_churn() {
        let mut tc = tenant();
        let synced = Progress::Synced {
            version: "v".into(),
            summary: "ok".into(),
            refused: false,
        };
        let refused = |n: usize| Progress::SyncFailed {
            version: "v".into(),
            reason: "NotAllowed".into(),
            error: format!("Pod default/a: refused (and {n} more objects)"),
        };
        let up = desired_status(&tc, &synced, EP, &at(1));
        tc.status = Some(up.clone());
        let one = desired_status(&tc, &refused(1), EP, &at(2));
        assert!(
            only_sync_changed(&up, &one),
            "Ready → Degraded by a refusal"
        );
        tc.status = Some(one.clone());
        let two = desired_status(&tc, &refused(2), EP, &at(3));
        assert!(only_sync_changed(&one, &two));
        assert!(only_sync_changed(&two, &up), "and back");
        let down = desired_status(&tc, &Progress::Unreachable("gone".into()), EP, &at(4));
        assert!(!only_sync_changed(&two, &down), "the control plane is news");
        tc.metadata.generation = Some(7);
        let respecced = desired_status(&tc, &refused(2), EP, &at(5));
        assert!(
            !only_sync_changed(&two, &respecced),
            "a new generation is news"
        );
    }
}
