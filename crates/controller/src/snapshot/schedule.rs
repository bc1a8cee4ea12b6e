//! Scheduled snapshots: for each TenantCluster with `spec.snapshots`, a TenantSnapshot when the
//! cron schedule comes due, and the oldest scheduled ones beyond `keep` deleted (with their
//! stored objects, by the snapshot's finalizer).
//!
//! A scheduled snapshot is named after the time it was due (`<tenant>-<yyyymmdd-hhmmss>`), so two
//! operators, or one that restarts, create it once. Missed times (the operator was down) give one
//! snapshot, not one per time missed, as a CronJob with no backlog. A sleeping tenant is not
//! snapshotted: nothing in it changes. What the schedule did is in the tenant's
//! `status.snapshots`, which the tenant's reconcile writes from the snapshots (see [`status`]).

use std::time::Duration;

use croner::Cron;
use croner::parser::{CronParser, Seconds};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{Timestamp, Zoned, tz::TimeZone};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use serde_json::json;
use tenantplane_api::{
    Phase, ScheduleStatus, SnapshotPhase, SnapshotSchedule, TenantCluster, TenantSnapshot,
};
use tracing::{info, warn};

/// The label on a scheduled snapshot: the tenant whose schedule made it.
pub const SCHEDULED_FOR: &str = "tenantplane.io/scheduled-for";

/// How often schedules are looked at.
const TICK: Duration = Duration::from_secs(5);

/// A schedule, parsed: five fields (or six, with seconds first), or an `@` name.
pub fn parse(schedule: &str) -> Result<Cron, ScheduleError> {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(schedule)
        .map_err(|source| ScheduleError {
            schedule: schedule.to_string(),
            source,
        })
}

/// A schedule that is not one, and what to write instead.
#[derive(Debug, thiserror::Error)]
#[error(
    "spec.snapshots.schedule {schedule:?} is not a cron schedule ({source}); write five fields, minute hour day-of-month month day-of-week, such as 0 3 * * *"
)]
pub struct ScheduleError {
    schedule: String,
    #[source]
    source: croner::errors::CronError,
}

/// The time `cron` next comes due after `after`, in UTC.
pub fn next_after(cron: &Cron, after: Timestamp) -> Option<Timestamp> {
    let zoned = Zoned::new(after, TimeZone::UTC);
    cron.find_next_occurrence(&zoned, false)
        .ok()
        .map(|z| z.timestamp())
}

/// A scheduled snapshot's name: the tenant's and the time it was due.
pub fn snapshot_name(tenant: &str, due: Timestamp) -> String {
    format!("{tenant}-{}", due.strftime("%Y%m%d-%H%M%S"))
}

/// Keep the schedules of the tenants in `tenants` until `shutdown` resolves.
pub async fn run(
    client: Client,
    tenants: Store<TenantCluster>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tokio::time::sleep(TICK) => {}
        }
        for tc in tenants.state() {
            let Some(schedule) = tc.spec.snapshots.clone() else {
                continue;
            };
            if tc.metadata.deletion_timestamp.is_some() {
                continue;
            }
            if let Err(e) = tick(&client, &tc, &schedule).await {
                warn!(tenant = %tc.name_any(), namespace = %tc.namespace().unwrap_or_default(), error = %crate::error_chain(&e), "snapshot schedule: taking or pruning the scheduled snapshots failed");
            }
        }
    }
}

/// The tenant's scheduled snapshots, newest first.
async fn scheduled(
    client: &Client,
    tc: &TenantCluster,
) -> Result<Vec<TenantSnapshot>, super::Error> {
    let ns = tc.namespace().unwrap_or_default();
    let api: Api<TenantSnapshot> = Api::namespaced(client.clone(), &ns);
    let mut list = api
        .list(&ListParams::default().labels(&format!("{SCHEDULED_FOR}={}", tc.name_any())))
        .await
        .map_err(super::api(format!("listing TenantSnapshots in {ns}")))?
        .items;
    list.sort_by_key(|s| std::cmp::Reverse(s.creation_timestamp().map(|t| t.0)));
    Ok(list)
}

/// One look at one tenant's schedule: a snapshot if one is due, then retention.
async fn tick(
    client: &Client,
    tc: &TenantCluster,
    schedule: &SnapshotSchedule,
) -> Result<(), super::Error> {
    let cron = parse(&schedule.schedule)?;
    let ns = tc.namespace().unwrap_or_default();
    let tenant = tc.name_any();
    let snapshots = scheduled(client, tc).await?;
    let now = Timestamp::now();
    let asleep = tc.status.as_ref().and_then(|s| s.phase) == Some(Phase::Sleeping);
    let since = snapshots
        .first()
        .and_then(|s| s.creation_timestamp())
        .or_else(|| tc.creation_timestamp())
        .map(|t| t.0)
        .unwrap_or(now);
    if let Some(due) = next_after(&cron, since).filter(|due| *due <= now && !asleep) {
        // The latest time due (missed ones give one snapshot).
        let mut latest = due;
        while let Some(next) = next_after(&cron, latest).filter(|n| *n <= now) {
            latest = next;
        }
        let name = snapshot_name(&tenant, latest);
        let snapshot: TenantSnapshot = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": {SCHEDULED_FOR: tenant},
            },
            "spec": {
                "tenantClusterRef": {"name": tenant},
                "storeRef": schedule.store_ref,
            }
        }))
        .map_err(|e| super::Error::Step(format!("making TenantSnapshot {name}: {e}")))?;
        match Api::<TenantSnapshot>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &snapshot)
            .await
        {
            Ok(_) => {
                info!(%tenant, namespace = %ns, snapshot = %name, "scheduled snapshot created");
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(super::api(format!("creating TenantSnapshot {name}"))(e)),
        }
    }
    retain(client, &ns, &snapshots, schedule.keep.max(1) as usize).await
}

/// Delete the completed scheduled snapshots beyond `keep` (newest kept), and failed ones but the
/// newest failure, which says what went wrong.
async fn retain(
    client: &Client,
    ns: &str,
    newest_first: &[TenantSnapshot],
    keep: usize,
) -> Result<(), super::Error> {
    let api: Api<TenantSnapshot> = Api::namespaced(client.clone(), ns);
    let doomed = newest_first
        .iter()
        .filter(|s| s.phase() == SnapshotPhase::Completed)
        .skip(keep)
        .chain(
            newest_first
                .iter()
                .filter(|s| s.phase() == SnapshotPhase::Failed)
                .skip(1),
        )
        .filter(|s| s.metadata.deletion_timestamp.is_none());
    for snap in doomed {
        let name = snap.name_any();
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {
                info!(namespace = %ns, snapshot = %name, "retention: deleted a scheduled snapshot");
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(super::api(format!("deleting TenantSnapshot {name}"))(e)),
        }
    }
    Ok(())
}

/// `status.snapshots` of a tenant with a schedule: its last scheduled snapshot, when the next is
/// due, and why it cannot run when it cannot.
pub async fn status(client: &Client, tc: &TenantCluster) -> Option<ScheduleStatus> {
    let schedule = tc.spec.snapshots.as_ref()?;
    let cron = match parse(&schedule.schedule) {
        Ok(c) => c,
        Err(e) => {
            return Some(ScheduleStatus {
                message: Some(e.to_string()),
                ..Default::default()
            });
        }
    };
    let snapshots = match scheduled(client, tc).await {
        Ok(s) => s,
        Err(e) => {
            return Some(ScheduleStatus {
                message: Some(e.to_string()),
                ..tc.status.as_ref()?.snapshots.clone().unwrap_or_default()
            });
        }
    };
    let last = snapshots.first();
    let since = last
        .and_then(|s| s.creation_timestamp())
        .map(|t| t.0)
        .unwrap_or_else(Timestamp::now);
    let asleep = tc.status.as_ref().and_then(|s| s.phase) == Some(Phase::Sleeping);
    let message = if asleep {
        Some("no scheduled snapshots while the tenant sleeps: nothing in it changes".to_string())
    } else {
        last.filter(|s| s.phase() == SnapshotPhase::Failed)
            .map(|s| {
                format!(
                    "the last scheduled snapshot, {}, failed: {}",
                    s.name_any(),
                    s.status
                        .as_ref()
                        .and_then(|st| st.message.clone())
                        .unwrap_or_default()
                )
            })
    };
    Some(ScheduleStatus {
        last_schedule_time: last.and_then(|s| s.creation_timestamp()),
        last_snapshot: last.map(|s| s.name_any()),
        next_schedule_time: next_after(&cron, since).map(Time),
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn schedules_come_due_in_utc_and_name_their_snapshots() {
        let daily = parse("0 3 * * *").unwrap();
        assert_eq!(
            next_after(&daily, at("2026-12-05T01:00:00Z")),
            Some(at("2026-12-05T03:00:00Z"))
        );
        assert_eq!(
            next_after(&daily, at("2026-12-05T03:00:00Z")),
            Some(at("2026-12-06T03:00:00Z"))
        );
        let hourly = parse("@hourly").unwrap();
        assert_eq!(
            next_after(&hourly, at("2026-12-05T01:30:00Z")),
            Some(at("2026-12-05T02:00:00Z"))
        );
        let seconds = parse("*/10 * * * * *").unwrap();
        assert_eq!(
            next_after(&seconds, at("2026-12-05T01:30:01Z")),
            Some(at("2026-12-05T01:30:10Z"))
        );
        assert_eq!(
            snapshot_name("dev", at("2026-12-05T03:00:00Z")),
            "dev-20261205-030000"
        );
    }

    #[test]
    fn a_bad_schedule_says_what_to_write() {
        let e = super::super::Error::from(parse("every day").unwrap_err());
        assert_eq!(e.label(), "ScheduleInvalid");
        let e = e.to_string();
        assert!(e.contains("is not a cron schedule"), "{e}");
        assert!(e.contains("0 3 * * *"), "{e}");
        assert!(parse("61 * * * *").is_err());
    }
}
