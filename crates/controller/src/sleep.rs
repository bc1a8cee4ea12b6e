//! Sleep and wake: whether a tenant should sleep (pure), and what it was last used.
//!
//! A tenant sleeps when `spec.sleep.asleep` asks, or when nobody used it for
//! `spec.sleep.afterIdle`. "Used" is a request the tenant's API server audits: its audit policy
//! ([`crate::build::audit`]) leaves out its own components, its workloads' service accounts, the
//! operator's user and health probes, so what it counts is people and clients outside the
//! tenant, known by identity. The operator reads that count from the API server's
//! `apiserver_audit_level_total` (no request waits on it: the audit log is written in batches)
//! each time it looks at an awake tenant with `afterIdle`, at most [`POLL_EVERY`] apart.
//!
//! A tenant asleep for idleness wakes on a wake request, the [`WAKE`](crate::names::WAKE)
//! annotation (`tenantplane wake` and `connect` write it); one asleep by its spec wakes when the
//! spec says so (they set `spec.sleep.asleep` back to false too).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tenantplane_api::{SleepCause, SleepStatus, TenantCluster};

use crate::context::TenantKey;
use crate::names::{KEEP_AWAKE, WAKE};

/// How often an awake tenant with `afterIdle` has its activity read, at most: a quarter of
/// `afterIdle`, between these bounds. Each read is one `GET /metrics` of the tenant's API
/// server (about 70 ms of its CPU).
pub const POLL_EVERY: Duration = Duration::from_secs(60);
const POLL_AT_LEAST: Duration = Duration::from_secs(15);

/// How soon to look at an awake tenant with `afterIdle` again.
pub fn poll_interval(after_idle: Duration) -> Duration {
    (after_idle / 4).clamp(POLL_AT_LEAST, POLL_EVERY)
}

/// The sleep the tenant should be in: `None` awake, else since when and why.
///
/// `last_used`: when a request last counted, as far as this operator saw (`None`: not looked
/// yet since it started or the tenant woke, so the idle clock has not started).
pub fn wanted(
    tc: &TenantCluster,
    now: Timestamp,
    last_used: Option<Timestamp>,
) -> Option<SleepStatus> {
    let current = tc.status.as_ref().and_then(|s| s.sleep.clone());
    // Whole seconds, as the API server stores a time: the next look reads back the same.
    let now = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let asleep = |cause| SleepStatus {
        since: Time(now),
        cause,
        waking_since: None,
    };
    if tc.spec.sleep.asleep {
        return Some(match current {
            Some(s) if s.waking_since.is_none() && s.cause == SleepCause::Requested => s,
            _ => asleep(SleepCause::Requested),
        });
    }
    if let Some(s) = current.filter(|s| s.waking_since.is_none()) {
        return match s.cause {
            // The spec no longer asks: wake.
            SleepCause::Requested => None,
            SleepCause::Idle if wake_requested_since(tc, s.since.0) => None,
            SleepCause::Idle => Some(s),
        };
    }
    if tc.annotations().contains_key(KEEP_AWAKE) {
        return None;
    }
    let after_idle = tc.spec.sleep.after_idle()?;
    let idle_for = now.duration_since(last_used?).as_secs();
    (idle_for >= after_idle.as_secs() as i64).then(|| asleep(SleepCause::Idle))
}

/// Whether the wake annotation asks for a wake made after `since` (one that does not say when
/// counts: a person wrote it by hand).
fn wake_requested_since(tc: &TenantCluster, since: Timestamp) -> bool {
    tc.annotations()
        .get(WAKE)
        .is_some_and(|at| at.parse::<Timestamp>().map_or(true, |at| at >= since))
}

/// Whether the wake annotation is there: an awake tenant has it removed.
pub fn has_wake_request(tc: &TenantCluster) -> bool {
    tc.annotations().contains_key(WAKE)
}

/// Requests counted per tenant: the audit count last read and when it last changed.
#[derive(Default)]
pub struct Activity {
    seen: Mutex<BTreeMap<TenantKey, Seen>>,
}

#[derive(Clone, Copy)]
struct Seen {
    events: u64,
    changed_at: Timestamp,
}

impl Activity {
    /// Record the tenant's audit count read at `now`; a count that moved (or went back: the API
    /// server restarted) is use. The first count starts the idle clock.
    pub fn observe(&self, key: &TenantKey, events: u64, now: Timestamp) {
        if let Ok(mut seen) = self.seen.lock() {
            let entry = seen.entry(key.clone()).or_insert(Seen {
                events,
                changed_at: now,
            });
            if entry.events != events {
                *entry = Seen {
                    events,
                    changed_at: now,
                };
            }
        }
    }

    /// When the tenant was last used, as far as seen.
    pub fn last_used(&self, key: &TenantKey) -> Option<Timestamp> {
        self.seen.lock().ok()?.get(key).map(|s| s.changed_at)
    }

    /// Forget the tenant (it sleeps, or is gone): on wake the clock starts again.
    pub fn forget(&self, key: &TenantKey) {
        if let Ok(mut seen) = self.seen.lock() {
            seen.remove(key);
        }
    }
}

/// The count of audited requests in an API server's `/metrics` text: the series of
/// `apiserver_audit_level_total` whose level is not `None` (one per request, where
/// `apiserver_audit_event_total` counts a watch twice).
pub fn audit_events(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("apiserver_audit_level_total"))
        .filter(|rest| rest.starts_with([' ', '{']) && !rest.contains("level=\"None\""))
        .filter_map(|rest| rest.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures::tenant;
    use tenantplane_api::TenantClusterStatus;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn with_sleep(mut tc: TenantCluster, sleep: Option<SleepStatus>) -> TenantCluster {
        tc.status = Some(TenantClusterStatus {
            sleep,
            ..Default::default()
        });
        tc
    }

    fn idle_after(secs: &str) -> TenantCluster {
        let mut tc = tenant();
        tc.spec.sleep.after_idle = Some(secs.into());
        tc
    }

    #[test]
    fn the_spec_puts_a_tenant_to_sleep_and_keeps_when_it_began() {
        let mut tc = tenant();
        tc.spec.sleep.asleep = true;
        let first = wanted(&tc, at(100), None).unwrap();
        assert_eq!(
            (first.since.0, first.cause),
            (at(100), SleepCause::Requested)
        );
        let tc = with_sleep(tc, Some(first.clone()));
        assert_eq!(wanted(&tc, at(500), None), Some(first), "since stays");
        // The spec says awake again: wake.
        let mut awake = tc;
        awake.spec.sleep.asleep = false;
        assert_eq!(wanted(&awake, at(600), None), None);
    }

    #[test]
    fn idleness_puts_a_tenant_to_sleep_only_after_the_clock_started_and_ran_out() {
        let tc = idle_after("10m");
        assert_eq!(wanted(&tc, at(10_000), None), None, "not looked yet");
        assert_eq!(wanted(&tc, at(1_000 + 599), Some(at(1_000))), None);
        let asleep = wanted(&tc, at(1_000 + 600), Some(at(1_000))).unwrap();
        assert_eq!(asleep.cause, SleepCause::Idle);
        assert_eq!(
            wanted(&tenant(), at(1_000_000), Some(at(0))),
            None,
            "no afterIdle"
        );
        let mut kept = idle_after("10m");
        kept.annotations_mut()
            .insert(KEEP_AWAKE.into(), "true".into());
        assert_eq!(
            wanted(&kept, at(1_000 + 600), Some(at(1_000))),
            None,
            "kept awake"
        );
        kept.spec.sleep.asleep = true;
        assert!(
            wanted(&kept, at(1_000 + 600), Some(at(1_000))).is_some(),
            "the spec still rules"
        );
    }

    #[test]
    fn an_idle_sleep_lasts_until_a_wake_request_made_after_it() {
        let since = at(1_000);
        let sleep = SleepStatus {
            since: Time(since),
            cause: SleepCause::Idle,
            waking_since: None,
        };
        let tc = with_sleep(idle_after("1m"), Some(sleep.clone()));
        assert_eq!(wanted(&tc, at(5_000), Some(at(4_999))), Some(sleep.clone()));
        let mut old = tc.clone();
        old.annotations_mut()
            .insert(WAKE.into(), at(999).to_string());
        assert_eq!(
            wanted(&old, at(5_000), None),
            Some(sleep.clone()),
            "stale request"
        );
        let mut new = tc.clone();
        new.annotations_mut()
            .insert(WAKE.into(), at(2_000).to_string());
        assert_eq!(wanted(&new, at(5_000), None), None);
        let mut by_hand = tc;
        by_hand.annotations_mut().insert(WAKE.into(), "now".into());
        assert_eq!(wanted(&by_hand, at(5_000), None), None);
        // Waking: awake as far as sleep goes, until idle again.
        let waking = with_sleep(
            idle_after("1m"),
            Some(SleepStatus {
                waking_since: Some(Time(at(5_000))),
                ..sleep
            }),
        );
        assert_eq!(wanted(&waking, at(5_010), None), None);
    }

    #[test]
    fn activity_is_a_count_that_moved() {
        let a = Activity::default();
        let key = ("ns".to_string(), "dev".to_string());
        assert_eq!(a.last_used(&key), None);
        a.observe(&key, 5, at(10));
        a.observe(&key, 5, at(20));
        assert_eq!(a.last_used(&key), Some(at(10)));
        a.observe(&key, 7, at(30));
        assert_eq!(a.last_used(&key), Some(at(30)));
        a.observe(&key, 1, at(40));
        assert_eq!(
            a.last_used(&key),
            Some(at(40)),
            "a restarted server counts again"
        );
        a.forget(&key);
        assert_eq!(a.last_used(&key), None);
    }

    #[test]
    fn the_audit_count_is_read_from_the_metrics_text() {
        let text = "# TYPE apiserver_audit_level_total counter\napiserver_audit_level_total{level=\"Metadata\"} 42\napiserver_audit_level_total{level=\"None\"} 900\napiserver_audit_event_total 50\n";
        assert_eq!(audit_events(text), 42, "requests at level None are not use");
        assert_eq!(
            audit_events("apiserver_audit_level_total{level=\"Metadata\"} 3e+00\n"),
            3
        );
        assert_eq!(audit_events(""), 0);
    }

    #[test]
    fn polls_are_a_quarter_of_after_idle_within_bounds() {
        assert_eq!(
            poll_interval(Duration::from_secs(60)),
            Duration::from_secs(15)
        );
        assert_eq!(
            poll_interval(Duration::from_secs(120)),
            Duration::from_secs(30)
        );
        assert_eq!(
            poll_interval(Duration::from_secs(3600)),
            Duration::from_secs(60)
        );
    }
}
