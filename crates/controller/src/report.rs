//! What a reconcile tells: the status it writes (a failure with the words of whoever refused),
//! an Event per changed condition, and when the tenant is looked at again.

use std::time::Duration;

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use serde_json::json;
use tenantplane_api::TenantCluster;
use tracing::{info, warn};

use crate::Error;
use crate::build;
use crate::names;
use crate::namespace::NAMESPACE_IN_USE_RECHECK;
use crate::reconcile::{Context, now, tenant_key};
use crate::status::{self, Progress};

/// Status says what failed, not only the log: the object and the API server's words.
pub(crate) async fn report_failure(
    ctx: &Context,
    tc: &TenantCluster,
    result: &Result<Action, Error>,
) {
    if let Err(e) = result {
        let before = ctx
            .failures
            .lock()
            .map(|all| all.get(&tenant_key(tc)).copied().unwrap_or(0))
            .unwrap_or(0);
        if !e.reaches_status(before) {
            // Retried in RETRY_FIRST; a second failure in a row is reported.
            return;
        }
        let progress = Progress::ApplyFailed(e.to_string());
        if let Err(report_error) = report(ctx, tc, &progress).await {
            warn!(error = %report_error, "reporting a failed reconcile in status failed too");
        }
    }
}

pub(crate) async fn publish(
    ctx: &Context,
    tc: &TenantCluster,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &tc.object_ref(&())).await {
        warn!(error = %e, "publishing an event failed");
    }
}

/// Write the status when it differs from what is stored, and an Event per changed condition.
pub(crate) async fn report(
    ctx: &Context,
    tc: &TenantCluster,
    progress: &Progress,
) -> Result<(), Error> {
    let (tenant, ns) = build::identity(tc)?;
    let desired = status::desired_status(tc, progress, &names::endpoint(&tenant, &ns), &now());
    let current = tc.status.clone().unwrap_or_default();
    if desired == current {
        return Ok(());
    }
    let api: Api<TenantCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let body = json!({"status": status_patch(&current, &desired)?});
    api.patch_status(&tenant, &PatchParams::default(), &Patch::Merge(body))
        .await?;
    for condition in status::changed_conditions(&current, &desired) {
        // Warnings are for what a person must look at: a Degraded tenant. Progress is Normal.
        let degraded = desired.phase == Some(tenantplane_api::Phase::Degraded);
        let type_ = if degraded && condition.status == "False" {
            EventType::Warning
        } else {
            EventType::Normal
        };
        publish(
            ctx,
            tc,
            type_,
            &condition.reason,
            format!("{}: {}", condition.type_, condition.message),
        )
        .await;
    }
    if current.phase != desired.phase
        && let Some(phase) = desired.phase
    {
        info!(tenant = %tenant, namespace = %ns, phase = %phase, "phase changed");
    }
    Ok(())
}

/// The merge patch from `current` to `desired`: what a merge patch leaves out it keeps, so a
/// field `desired` no longer has (the endpoint of a tenant that stopped answering) is null.
fn status_patch(
    current: &tenantplane_api::TenantClusterStatus,
    desired: &tenantplane_api::TenantClusterStatus,
) -> Result<serde_json::Value, Error> {
    let as_json =
        |s| serde_json::to_value(s).map_err(|e| Error::Build(format!("writing the status: {e}")));
    let mut patch = as_json(desired)?;
    if let (serde_json::Value::Object(was), Some(now)) = (as_json(current)?, patch.as_object_mut())
    {
        for field in was.keys() {
            now.entry(field.clone()).or_insert(serde_json::Value::Null);
        }
    }
    Ok(patch)
}

/// Record progress and decide when to look again.
pub(crate) async fn finish(
    ctx: &Context,
    tc: &TenantCluster,
    progress: Progress,
) -> Result<Action, Error> {
    finish_by(ctx, tc, progress, None).await
}

/// [`finish`], looking again no later than `wake_by` (when a certificate is due for renewal).
pub(crate) async fn finish_by(
    ctx: &Context,
    tc: &TenantCluster,
    progress: Progress,
    wake_by: Option<Duration>,
) -> Result<Action, Error> {
    report(ctx, tc, &progress).await?;
    let health = ctx
        .options
        .health_interval
        .unwrap_or(Duration::from_secs(60));
    let after = match progress {
        // Policy watches bring the tenant back when the policy appears.
        Progress::PolicyMissing { .. } | Progress::PkiDamaged(_) => Duration::from_secs(300),
        // Nothing watched says the holder is gone: look again soon, to take over within seconds.
        Progress::NamespaceInUse { .. } => NAMESPACE_IN_USE_RECHECK,
        // Asked of the host, not watched: a new range or a fixed flag is seen within a minute.
        Progress::ServiceRange { .. } => Duration::from_secs(60),
        Progress::Synced { .. } => health,
        _ => Duration::from_secs(5),
    };
    Ok(Action::requeue(wake_by.map_or(after, |w| w.min(after))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_no_longer_in_the_status_is_removed_by_the_patch() {
        let up = tenantplane_api::TenantClusterStatus {
            endpoint: Some("https://dev.team-dev.svc:6443".into()),
            observed_generation: Some(2),
            ..Default::default()
        };
        let down = tenantplane_api::TenantClusterStatus {
            observed_generation: Some(2),
            ..Default::default()
        };
        let patch = status_patch(&up, &down).unwrap();
        assert_eq!(patch["endpoint"], serde_json::Value::Null);
        assert_eq!(patch["observedGeneration"], 2);
        let back = status_patch(&down, &up).unwrap();
        assert_eq!(back["endpoint"], "https://dev.team-dev.svc:6443");
    }
}
