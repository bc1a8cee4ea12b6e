//! What a reconcile tells: the status it writes (a failure with the words of whoever refused),
//! an Event per changed condition, and when the tenant is looked at again.

use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tenantplane_api::{TenantCluster, TenantClusterStatus};
use tracing::{debug, info, warn};

use crate::Error;
use crate::build;
use crate::context::{Context, now, tenant_key};
use crate::names::{self, FIELD_MANAGER};
use crate::namespace::NAMESPACE_IN_USE_RECHECK;
use crate::status::{self, Progress};

/// A tenant seen for the first time says so before anything is built; the reconcile goes on
/// from the status it wrote.
pub(crate) async fn accept(ctx: &Context, tc: &TenantCluster) -> Result<TenantCluster, Error> {
    let (tenant, ns) = build::identity(tc)?;
    let mut tc = tc.clone();
    if tc.status.is_none() {
        report(ctx, &tc, &Progress::Accepted).await?;
        tc.status = Some(status::desired_status(
            &tc,
            &Progress::Accepted,
            &names::endpoint(&tenant, &ns),
            &now(),
        ));
    }
    Ok(tc)
}

/// Status says what failed, not only the log: the object and the API server's words.
pub(crate) async fn report_failure(
    ctx: &Context,
    tc: &TenantCluster,
    result: &Result<Action, Error>,
) {
    if let Err(e) = result {
        if !e.reaches_status(ctx.failures_of(tc)) {
            // Retried after the first back-off; a second failure in a row is reported.
            return;
        }
        let progress = Progress::ApplyFailed(e.to_string());
        if let Err(report_error) = report(ctx, tc, &progress).await {
            warn!(tenant = %tc.name_any(), namespace = %tc.namespace().unwrap_or_default(), error = %crate::error_chain(&report_error), "reporting a failed reconcile in status failed too");
        }
    }
}

/// Remove annotation `key` from the TenantCluster (a JSON merge patch with null): a request it
/// carried (rotate the certificates, wake) is done.
pub(crate) async fn remove_annotation(
    ctx: &Context,
    tc: &TenantCluster,
    key: &str,
) -> Result<(), Error> {
    let (tenant, ns) = build::identity(tc)?;
    let api: Api<TenantCluster> = Api::namespaced(ctx.client.clone(), &ns);
    api.patch(
        &tenant,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {key: null}}})),
    )
    .await?;
    Ok(())
}

/// An Event on the TenantCluster. The note is bounded: it often quotes a tenant's object, and
/// the API refuses a note over 1 KiB (nothing would be said at all).
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
        note: Some(tenantplane_api::text::bounded(&note)),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &tc.object_ref(&())).await {
        warn!(tenant = %tc.name_any(), namespace = %tc.namespace().unwrap_or_default(), reason, error = %crate::error_chain(&e), "publishing an event on the TenantCluster failed");
    }
}

/// Write the status when it differs from what is stored, and an Event per changed condition.
/// A change that is only sync churn, soon after the last write, is not written yet: the answer
/// is how long until it may be (the reconcile looks again then, with the latest state).
pub(crate) async fn report(
    ctx: &Context,
    tc: &TenantCluster,
    progress: &Progress,
) -> Result<Option<Duration>, Error> {
    let (tenant, ns) = build::identity(tc)?;
    let desired = status::desired_status(tc, progress, &names::endpoint(&tenant, &ns), &now());
    // As the cache has it (the reconcile's copy may carry what this reconcile set: the restore's
    // progress, the schedule's, a wake's start), so that those are written too.
    let current = ctx
        .tenants
        .get(&kube::runtime::reflector::ObjectRef::from_obj(tc))
        .and_then(|cached| cached.status.clone())
        .or_else(|| tc.status.clone())
        .unwrap_or_default();
    if desired == current {
        return Ok(None);
    }
    let key = tenant_key(tc);
    let churn = status::only_sync_changed(&current, &desired);
    if let Some(wait) = ctx.status_writes.wait(&key, churn, Instant::now()) {
        debug!(tenant = %tenant, namespace = %ns, wait_ms = wait.as_millis() as u64, "status write coalesced");
        return Ok(Some(wait));
    }
    let api: Api<TenantCluster> = Api::namespaced(ctx.client.clone(), &ns);
    if let Some(fields) = status_owned_by_apply(tc.managed_fields(), &now()) {
        // Once, on a status merge patches wrote: the resourceVersion makes it compare-and-swap.
        let patch = json!({"metadata": {
            "resourceVersion": tc.resource_version(),
            "managedFields": fields,
        }});
        api.patch(&tenant, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }
    api.patch_status(
        &tenant,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(status_apply(&desired)?),
    )
    .await?;
    ctx.status_writes.wrote(key, Instant::now());
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
    Ok(None)
}

/// The server-side apply of `status`: the whole status as this manager wants it, so a field it
/// no longer has (the endpoint of a tenant that stopped answering, a condition no longer set) is
/// removed. Apply needs the kind even for a subresource.
fn status_apply(status: &TenantClusterStatus) -> Result<serde_json::Value, Error> {
    let status = serde_json::to_value(status)
        .map_err(|e| Error::Build(format!("writing the status: {e}")))?;
    Ok(json!({
        "apiVersion": TenantCluster::api_version(&()),
        "kind": TenantCluster::kind(&()),
        "status": status,
    }))
}

/// Status written by merge patches (as operators before server-side apply did, or a hand edit)
/// is owned by `Update` entries, which keep a field after apply stops sending it: a tenant that
/// stopped answering would keep its endpoint. Such entries are folded into this manager's apply
/// entry, as client-go's `csaupgrade` does, so that apply alone owns the status. `None`: there
/// are none, nothing to change.
fn status_owned_by_apply(
    fields: &[ManagedFieldsEntry],
    now: &Time,
) -> Option<Vec<ManagedFieldsEntry>> {
    let on_status = |f: &ManagedFieldsEntry| f.subresource.as_deref() == Some("status");
    let merged = |f: &ManagedFieldsEntry| f.operation.as_deref() == Some("Update") && on_status(f);
    if !fields.iter().any(merged) {
        return None;
    }
    let ours = |f: &ManagedFieldsEntry| {
        f.operation.as_deref() == Some("Apply")
            && f.manager.as_deref() == Some(FIELD_MANAGER)
            && on_status(f)
    };
    let mut owned = serde_json::Value::Object(Default::default());
    let mut kept = Vec::new();
    for f in fields {
        if merged(f) || ours(f) {
            if let Some(set) = &f.fields_v1 {
                union(&mut owned, &set.0);
            }
        } else {
            kept.push(f.clone());
        }
    }
    kept.push(ManagedFieldsEntry {
        api_version: Some(TenantCluster::api_version(&()).into_owned()),
        fields_type: Some("FieldsV1".into()),
        fields_v1: Some(FieldsV1(owned)),
        manager: Some(FIELD_MANAGER.into()),
        operation: Some("Apply".into()),
        subresource: Some("status".into()),
        time: Some(now.clone()),
    });
    Some(kept)
}

/// Add field set `from` to `into` (both trees of `f:` keys).
fn union(into: &mut serde_json::Value, from: &serde_json::Value) {
    match (into, from) {
        (serde_json::Value::Object(to), serde_json::Value::Object(from)) => {
            for (key, value) in from {
                union(
                    to.entry(key.clone())
                        .or_insert(serde_json::Value::Object(Default::default())),
                    value,
                );
            }
        }
        (into, from) => *into = from.clone(),
    }
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
    let deferred = report(ctx, tc, &progress).await?;
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
    let after = [wake_by, deferred]
        .into_iter()
        .flatten()
        .fold(after, Duration::min);
    Ok(Action::requeue(after))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_merge_patches_wrote_is_handed_to_apply_once() {
        let entry = |manager: &str, operation: &str, sub: Option<&str>, set: serde_json::Value| {
            ManagedFieldsEntry {
                manager: Some(manager.into()),
                operation: Some(operation.into()),
                subresource: sub.map(Into::into),
                fields_v1: Some(FieldsV1(set)),
                ..Default::default()
            }
        };
        let at = now();
        let finalizer = entry(
            "tenantplane",
            "Update",
            None,
            json!({"f:metadata": {"f:finalizers": {}}}),
        );
        let merged = entry(
            "",
            "Update",
            Some("status"),
            json!({"f:status": {"f:endpoint": {}, "f:phase": {}}}),
        );
        let applied = entry(
            FIELD_MANAGER,
            "Apply",
            Some("status"),
            json!({"f:status": {"f:phase": {}, "f:conditions": {}}}),
        );
        assert_eq!(
            status_owned_by_apply(&[finalizer.clone(), applied.clone()], &at),
            None,
            "nothing to hand over: no write"
        );
        let fields = status_owned_by_apply(&[finalizer.clone(), merged, applied], &at).unwrap();
        assert_eq!(fields.len(), 2);
        assert_eq!(fields[0], finalizer, "what is not status stays as it was");
        let ours = &fields[1];
        assert_eq!(
            (ours.manager.as_deref(), ours.operation.as_deref()),
            (Some(FIELD_MANAGER), Some("Apply"))
        );
        assert_eq!(ours.subresource.as_deref(), Some("status"));
        assert_eq!(
            ours.fields_v1.as_ref().unwrap().0,
            json!({"f:status": {"f:endpoint": {}, "f:phase": {}, "f:conditions": {}}})
        );
        assert_eq!(status_owned_by_apply(&fields, &at), None, "once");
    }

    #[test]
    fn a_field_no_longer_in_the_status_is_left_out_of_the_apply_so_it_is_removed() {
        let up = TenantClusterStatus {
            endpoint: Some("https://dev.team-dev.svc:6443".into()),
            observed_generation: Some(2),
            ..Default::default()
        };
        let down = TenantClusterStatus {
            observed_generation: Some(2),
            ..Default::default()
        };
        let apply = status_apply(&down).unwrap();
        assert_eq!(apply["apiVersion"], "tenantplane.io/v1alpha1");
        assert_eq!(apply["kind"], "TenantCluster");
        let status = apply["status"].as_object().unwrap();
        assert!(!status.contains_key("endpoint"), "{status:?}");
        assert!(!status.contains_key("conditions"), "{status:?}");
        assert_eq!(status["observedGeneration"], 2);
        let back = status_apply(&up).unwrap();
        assert_eq!(back["status"]["endpoint"], "https://dev.team-dev.svc:6443");
    }
}
