//! What converging one tenant pod comes to, decided from the tenant pod and its host copy alone
//! (pure): the copy goes, waits, is made, or is kept in step; or the tenant pod is finished. The
//! pod kind's converge carries the decision out through the API; these tests are of the decision,
//! table by table, as vcluster's syncer tests are.

use k8s_openapi::api::core::v1::Pod;

use super::binding;

/// What the converge does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// The tenant pod is gone (or not synced): its copy goes, if there is one.
    RemoveCopy,
    /// The copy is of an earlier tenant pod of the same name (StatefulSets reuse names): it
    /// goes (unless it is going already), and the new pod's copy is made once it has.
    ReplaceStaleCopy { already_going: bool },
    /// The tenant pod is being deleted and its copy still runs: the copy is deleted with the
    /// tenant's grace period (bounded by the profile).
    DeleteCopy { grace: Option<u32> },
    /// The tenant pod is being deleted and its copy is gone: the tenant pod ends as a kubelet
    /// would end it (a terminal phase first, then deletion).
    FinishTenantPod,
    /// Nothing to do now: the copy is going, the pod waits on its scheduling gates, or its node
    /// refused it for good.
    Wait,
    /// The copy ran and was deleted on the host: the tenant pod goes, as on a node that lost it.
    LoseTenantPod,
    /// No copy yet: one is made (after the review).
    Create,
    /// The copy is there: it is kept in step (review, tokens, binding, status up).
    Keep,
}

/// What the plan needs to know of the copy besides the pod itself: the tenant pod UID it is
/// marked as a copy of (`None` when unmarked or marked without a UID).
pub(super) struct Copy<'a> {
    pub pod: &'a Pod,
    pub of_uid: Option<&'a str>,
}

/// The step for tenant pod `t` (`None`: gone or not synced) and its copy `h`.
pub(super) fn step(t: Option<&Pod>, h: Option<Copy<'_>>) -> Step {
    let Some(t) = t else {
        return Step::RemoveCopy;
    };
    let t_uid = t.metadata.uid.as_deref().unwrap_or_default();
    if let Some(c) = &h
        && c.of_uid.is_some_and(|uid| uid != t_uid)
    {
        return Step::ReplaceStaleCopy {
            already_going: c.pod.metadata.deletion_timestamp.is_some(),
        };
    }
    let copy = h.map(|c| c.pod);
    if t.metadata.deletion_timestamp.is_some() {
        return match copy {
            Some(h) if h.metadata.deletion_timestamp.is_none() => Step::DeleteCopy {
                grace: t.metadata.deletion_grace_period_seconds.map(|g| g as u32),
            },
            Some(_) => Step::Wait,
            None => Step::FinishTenantPod,
        };
    }
    if copy.is_some() {
        return Step::Keep;
    }
    let gated = t
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| !g.is_empty());
    // Refused by its node (`binding::reject_unplaceable`): it ended, and stays so.
    if gated || binding::rejected(t) {
        return Step::Wait;
    }
    // The copy ran (its status came back), so a missing copy was deleted, not yet made.
    let ran = t
        .status
        .as_ref()
        .is_some_and(|s| s.host_ip.is_some() || s.start_time.is_some());
    if ran {
        Step::LoseTenantPod
    } else {
        Step::Create
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        let mut base = json!({"metadata": {"name": "web", "namespace": "default", "uid": "t1"}});
        merge(&mut base, v);
        serde_json::from_value(base).unwrap()
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    const GOING: &str = "2026-12-06T00:00:00Z";

    #[test]
    fn each_tenant_pod_and_copy_come_to_one_step() {
        let live = pod(json!({}));
        let deleting = pod(
            json!({"metadata": {"deletionTimestamp": GOING, "deletionGracePeriodSeconds": 30}}),
        );
        let gated = pod(json!({"spec": {"containers": [], "schedulingGates": [{"name": "wait"}]}}));
        let ran = pod(json!({"status": {"hostIP": "10.0.0.1"}}));
        let rejected = pod(json!({"status": {"phase": "Failed", "reason": binding::REJECTED}}));
        let copy = pod(json!({"metadata": {"uid": "h1"}}));
        let copy_going = pod(json!({"metadata": {"uid": "h1", "deletionTimestamp": GOING}}));
        fn of<'a>(p: &'a Pod, uid: Option<&'a str>) -> Option<Copy<'a>> {
            Some(Copy {
                pod: p,
                of_uid: uid,
            })
        }
        let cases = [
            (
                "tenant pod gone",
                None,
                of(&copy, Some("t1")),
                Step::RemoveCopy,
            ),
            ("tenant pod gone, no copy", None, None, Step::RemoveCopy),
            (
                "copy of an earlier pod",
                Some(&live),
                of(&copy, Some("t0")),
                Step::ReplaceStaleCopy {
                    already_going: false,
                },
            ),
            (
                "copy of an earlier pod, going",
                Some(&live),
                of(&copy_going, Some("t0")),
                Step::ReplaceStaleCopy {
                    already_going: true,
                },
            ),
            (
                "copy whose mark lost its uid",
                Some(&live),
                of(&copy, None),
                Step::Keep,
            ),
            (
                "deleting, copy runs",
                Some(&deleting),
                of(&copy, Some("t1")),
                Step::DeleteCopy { grace: Some(30) },
            ),
            (
                "deleting, copy going",
                Some(&deleting),
                of(&copy_going, Some("t1")),
                Step::Wait,
            ),
            (
                "deleting, copy gone",
                Some(&deleting),
                None,
                Step::FinishTenantPod,
            ),
            (
                "copy in step",
                Some(&live),
                of(&copy, Some("t1")),
                Step::Keep,
            ),
            ("new pod", Some(&live), None, Step::Create),
            ("gated", Some(&gated), None, Step::Wait),
            ("refused by its node", Some(&rejected), None, Step::Wait),
            (
                "copy lost on the host",
                Some(&ran),
                None,
                Step::LoseTenantPod,
            ),
        ];
        for (what, t, h, want) in cases {
            assert_eq!(step(t, h), want, "{what}");
        }
    }
}
