//! The status a reconcile's progress comes to: phases, conditions and the endpoint, table by
//! table.

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
