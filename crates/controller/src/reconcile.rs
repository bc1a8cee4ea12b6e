//! One reconcile: the finalizer around it, the pipeline of phases for a tenant that is there,
//! the cleanup for one being deleted, and the back-off after a failure.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Error as FinalizerError, Event as FinalizerEvent, finalizer};
use tenantplane_api::TenantCluster;
use tracing::{Instrument, info, warn};

use crate::Error;
use crate::build;
use crate::context::{Context, tenant_key};
use crate::names::FINALIZER;
use crate::names::{self, WAKE};
use crate::namespace::{Occupant, occupants, releases_namespace};
use crate::phases::report::{
    accept, finish, finish_by, publish, remove_annotation, report_failure,
};
use crate::phases::{Halt, credentials, isolate, provision, resolve, sync};
use crate::sleep;
use crate::snapshot::restore;
use crate::status::Progress;
use crate::upgrade;
use crate::{apply, wake};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;
use tenantplane_api::{Phase, SleepStatus};

/// The first retry after a failed reconcile, doubled each failure in a row up to the last.
const RETRY_FIRST: Duration = Duration::from_secs(5);
const RETRY_MAX: Duration = Duration::from_secs(300);

/// The wait before retry number `failures` (1 for the first failure): exponential, capped, no
/// jitter (one reconcile per tenant at a time, so there is no herd to spread), by the syncer's
/// one back-off.
pub fn retry_after(failures: u32) -> Duration {
    tenantplane_syncer::backoff::delay(failures, RETRY_FIRST, RETRY_MAX)
}

pub(crate) fn error_policy(tc: Arc<TenantCluster>, error: &Error, ctx: Arc<Context>) -> Action {
    let failures = match ctx.failures.lock() {
        Ok(mut all) => {
            let n = all.entry(tenant_key(&tc)).or_insert(0);
            *n = n.saturating_add(1);
            *n
        }
        Err(_) => 1,
    };
    let after = retry_after(failures);
    warn!(tenant = %tc.name_any(), namespace = %tc.namespace().unwrap_or_default(), category = error.category(), error = %crate::error_chain(error), failures, retry_in_s = after.as_secs(), "reconcile error; retrying");
    Action::requeue(after)
}

/// One reconcile, wrapped in the finalizer that cleans the namespace labels on deletion. Every
/// log line in it carries the tenant's namespace and name (its span); it is counted and timed.
pub async fn reconcile(tc: Arc<TenantCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = tc.namespace().unwrap_or_default();
    let span = tracing::info_span!("reconcile", namespace = %ns, tenant = %tc.name_any());
    let started = std::time::Instant::now();
    let api: Api<TenantCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let key = tenant_key(&tc);
    let result = finalizer(&api, FINALIZER, tc, |event| async {
        match event {
            FinalizerEvent::Apply(tc) => {
                let result = apply_tenant(&tc, &ctx).await;
                report_failure(&ctx, &tc, &result).await;
                result
            }
            FinalizerEvent::Cleanup(tc) => {
                let result = cleanup(&tc, &ctx).await;
                report_failure(&ctx, &tc, &result).await;
                result
            }
        }
    })
    .instrument(span)
    .await
    .map_err(|e| match e {
        // The reconcile's own error keeps its category.
        FinalizerError::ApplyFailed(e) | FinalizerError::CleanupFailed(e) => e,
        other => Error::Finalizer(other.to_string()),
    });
    if result.is_ok()
        && let Ok(mut all) = ctx.failures.lock()
    {
        all.remove(&key);
    }
    ctx.options.telemetry.metrics.reconciled(
        result.as_ref().err().map(Error::category),
        started.elapsed(),
    );
    result
}

/// A tenant that is there, in the lifecycle's five steps; each may stop with where the tenant
/// got to, which goes into status.
async fn apply_tenant(tc: &TenantCluster, ctx: &Context) -> Result<Action, Error> {
    let mut tc = accept(ctx, tc).await?;
    let key = tenant_key(&tc);
    let now = Timestamp::now();
    if let Some(sleep) = sleep::wanted(
        &tc,
        now,
        ctx.state::<crate::sleep::Activity>().last_used(&key),
    ) {
        return asleep(&tc, ctx, sleep).await;
    }
    if let Some(sleep) = tc.status.as_mut().and_then(|s| s.sleep.as_mut())
        && sleep.waking_since.is_none()
    {
        // It wakes: the first status written from here on says since when.
        sleep.waking_since = Some(Time(now));
        let why = if sleep::has_wake_request(&tc) {
            format!("a wake request (annotation {WAKE})")
        } else {
            "spec.sleep.asleep is false".to_string()
        };
        publish(
            ctx,
            &tc,
            EventType::Normal,
            "Waking",
            format!("waking up: {why}; starting the control plane"),
        )
        .await;
    }
    // What the snapshot schedule did (it runs beside the reconcile; this says so in status).
    let schedule = crate::snapshot::schedule::status(&ctx.client, &tc).await;
    if let Some(status) = tc.status.as_mut() {
        status.snapshots = schedule;
    }
    // A restore under way holds the tenant before its control plane is waited for.
    if let restore::Step::Restoring(detail) = restore::step(&mut tc, ctx).await {
        return restoring(&tc, ctx, detail).await;
    }
    // A minor upgrade waits at the running version until it is checked and snapshotted.
    if let upgrade::Guard::Hold(running) = upgrade::guard(&mut tc, ctx).await {
        tc.spec.kubernetes_version = running;
    }
    let tc = tc;
    let phases = async {
        // 1. Resolve the IsolationProfile and SyncPolicy.
        let policies = resolve::policies(&tc, ctx).await?;
        // 2. Apply the isolation boundary to the namespace.
        isolate::namespace(&tc, &policies.profile, ctx).await?;
        // 3. Reconcile the Services and the k3s StatefulSet, with the PKI they mount.
        let pki = credentials::pki(&tc, ctx).await?;
        let control_plane = provision::control_plane(&tc, ctx, &policies.profile, &pki).await?;
        tracing::debug!("control plane Ready");
        // Awake: the API Service leads to the pod again (its selector is back); no more door.
        shut_wake_door(&tc, ctx).await?;
        // 4. The control plane is Ready: its admin kubeconfig into a Secret.
        let kubeconfig = credentials::kubeconfig(&tc, ctx, &pki).await?;
        // 5. Reach the tenant and sync it.
        let renew_in = control_plane
            .certificates_due_in
            .map_or(kubeconfig.renew_in, |due| due.min(kubeconfig.renew_in));
        let progress = sync::tenant(&tc, ctx, &policies, control_plane, &kubeconfig).await?;
        Ok::<_, Halt>((progress, renew_in))
    };
    match phases.await {
        Ok((progress, renew_in)) => {
            let awake = matches!(progress, Progress::Synced { .. });
            let mut look_again = renew_in;
            if awake && let Some(after_idle) = tc.spec.sleep.after_idle() {
                look_again = look_again.min(sleep::poll_interval(after_idle));
            }
            let action = finish_by(ctx, &tc, progress, Some(look_again)).await?;
            if awake && sleep::has_wake_request(&tc) {
                // Awake, and said so: the request is answered (and the next idle sleep is not
                // undone by it).
                remove_annotation(ctx, &tc, WAKE).await?;
            }
            Ok(action)
        }
        Err(Halt::Stop(progress)) => finish(ctx, &tc, progress).await,
        Err(Halt::Failed(e)) => Err(e),
    }
}

/// A tenant whose datastore a restore replaces: its objects as an awake tenant has them (its pod
/// carrying the restore), its syncer stopped, looked at again every two seconds.
async fn restoring(tc: &TenantCluster, ctx: &Context, detail: String) -> Result<Action, Error> {
    let phases = async {
        let policies = resolve::policies(tc, ctx).await?;
        isolate::namespace(tc, &policies.profile, ctx).await?;
        let pki = credentials::pki(tc, ctx).await?;
        provision::apply(tc, ctx, &policies.profile, &pki, provision::Running::Up).await?;
        Ok::<_, Halt>(())
    };
    let progress = Progress::ControlPlaneNotReady {
        detail: format!("restoring: {detail}"),
        stuck: false,
    };
    match phases.await {
        Ok(()) => finish_by(ctx, tc, progress, Some(Duration::from_secs(2))).await,
        Err(Halt::Stop(progress)) => finish(ctx, tc, progress).await,
        Err(Halt::Failed(e)) => Err(e),
    }
}

/// A tenant that should sleep: its syncer stopped and its pods' host copies deleted first (so
/// nothing runs on, and nothing is copied again), then every object as an awake tenant has it
/// but the control plane scaled to zero. Its credentials are still renewed when due.
async fn asleep(tc: &TenantCluster, ctx: &Context, sleep: SleepStatus) -> Result<Action, Error> {
    // An upgrade asked while asleep waits for the wake (its checks and snapshot need the tenant).
    let held = upgrade::held_while_asleep(tc, ctx);
    let tc = held.as_ref().unwrap_or(tc);
    let (tenant, ns) = build::identity(tc)?;
    let already = tc.status.as_ref().and_then(|s| s.phase) == Some(Phase::Sleeping);
    if !already || ctx.syncers.is_running(&ns, &tenant) {
        ctx.syncers
            .sleep(&ns, &tenant)
            .await
            .map_err(|error| Error::Write {
                object: format!("deleting the host copies of tenant {tenant}'s pods in {ns}"),
                error,
            })?;
    }
    ctx.state::<crate::sleep::Activity>()
        .forget(&tenant_key(tc));
    let phases = async {
        let policies = resolve::policies(tc, ctx).await?;
        isolate::namespace(tc, &policies.profile, ctx).await?;
        let pki = credentials::pki(tc, ctx).await?;
        provision::apply(tc, ctx, &policies.profile, &pki, provision::Running::Asleep).await?;
        open_wake_door(tc, ctx).await?;
        let kubeconfig = credentials::kubeconfig(tc, ctx, &pki).await?;
        Ok::<_, Halt>(kubeconfig.renew_in)
    };
    match phases.await {
        Ok(renew_in) => finish_by(ctx, tc, Progress::Sleeping(sleep), Some(renew_in)).await,
        Err(Halt::Stop(progress)) => finish(ctx, tc, progress).await,
        Err(Halt::Failed(e)) => Err(e),
    }
}

/// A sleeping tenant's wake door open, and its API Service led there by an EndpointSlice
/// (with wake options; see [`crate::wake`]).
async fn open_wake_door(tc: &TenantCluster, ctx: &Context) -> Result<(), Error> {
    let Some(options) = &ctx.options.wake else {
        return Ok(());
    };
    let (tenant, ns) = build::identity(tc)?;
    let slice_name = names::wake_endpoint_slice(&tenant);
    let live = crate::cache::get(&ctx.caches.endpoint_slices, Some(&ns), &slice_name);
    let target = wake::DoorTarget {
        client: ctx.client.clone(),
        secrets: ctx.caches.secrets.clone(),
        tenants: ctx.tenants.clone(),
        pods: ctx.caches.pods.clone(),
        connector: ctx.options.connector,
        namespace: ns.clone(),
        tenant: tenant.clone(),
    };
    let preferred = live.as_deref().and_then(build::services::wake_port);
    let opened = !ctx.state::<crate::wake::Doors>().is_open(&tenant_key(tc));
    let port = ctx
        .state::<crate::wake::Doors>()
        .open(options, &tenant_key(tc), preferred, target)
        .await
        .map_err(|e| Error::Build(format!("opening the wake door of tenant {tenant}: {e}")))?;
    let slices: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &ns);
    if opened {
        forget_pod_endpoints(ctx, &ns, &names::service(&tenant)).await?;
    }
    let desired = build::services::wake_endpoint_slice(tc, options.advertise, port)?;
    apply::ensure(&slices, &ctx.caches.endpoint_slices, &desired).await?;
    Ok(())
}

/// Kubernetes leaves the endpoints of a Service that lost its selector as they were: the
/// Endpoints object, the EndpointSlice controller's slices and the mirroring controller's copy
/// of that Endpoints. The pod that is going would stay an endpoint beside the wake door, and
/// take half the connections. They go; on wake the controllers make them again.
async fn forget_pod_endpoints(ctx: &Context, ns: &str, service: &str) -> Result<(), Error> {
    let failed = |what: &str| {
        let object = format!("deleting the {what} of Service {ns}/{service} that led to its pod");
        move |error| Error::Write { object, error }
    };
    let endpoints: Api<k8s_openapi::api::core::v1::Endpoints> =
        Api::namespaced(ctx.client.clone(), ns);
    match endpoints
        .delete(service, &kube::api::DeleteParams::background())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(failed("Endpoints")(e)),
    }
    let slices: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), ns);
    for manager in [
        "endpointslice-controller.k8s.io",
        "endpointslicemirroring-controller.k8s.io",
    ] {
        let theirs = format!(
            "kubernetes.io/service-name={service},endpointslice.kubernetes.io/managed-by={manager}"
        );
        slices
            .delete_collection(
                &kube::api::DeleteParams::background(),
                &kube::api::ListParams::default().labels(&theirs),
            )
            .await
            .map_err(failed("EndpointSlices"))?;
    }
    Ok(())
}

/// The wake door closed and its EndpointSlice gone: the tenant is awake.
async fn shut_wake_door(tc: &TenantCluster, ctx: &Context) -> Result<(), Error> {
    let (tenant, ns) = build::identity(tc)?;
    let slices: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &ns);
    let slice_name = names::wake_endpoint_slice(&tenant);
    apply::ensure_absent(&slices, &ctx.caches.endpoint_slices, &ns, &slice_name).await?;
    ctx.state::<crate::wake::Doors>().retire(&tenant_key(tc));
    Ok(())
}

/// Deletion: owned objects go with the garbage collector; the namespace labels are ours to
/// remove, unless another TenantCluster remains in the namespace (it holds them now) or this one
/// never held the namespace.
async fn cleanup(tc: &TenantCluster, ctx: &Context) -> Result<Action, Error> {
    let (tenant, ns) = build::identity(tc)?;
    // Stop syncing first, so nothing is copied again while the copies are removed.
    ctx.syncers.remove(&ns, &tenant).await?;
    ctx.options.telemetry.metrics.forget_tenant(&ns, &tenant);
    ctx.status_writes.forget(&tenant_key(tc));
    ctx.state::<crate::wake::Doors>().close(&tenant_key(tc));
    ctx.state::<crate::sleep::Activity>()
        .forget(&tenant_key(tc));
    // The datastore goes with the tenant: a new TenantCluster of the same name starts empty.
    let claims = provision::delete_data_claims(tc, ctx).await?;
    if claims > 0 {
        info!(tenant = %tenant, namespace = %ns, claims, "deleted the tenant's data claims");
    }
    // Asked of the API server, not the cache: what is shared stays unless nothing else is there.
    let present = occupants(ctx, &ns).await?;
    if !releases_namespace(&Occupant::of(tc), &present) {
        let others: Vec<&str> = present
            .iter()
            .map(|o| o.name.as_str())
            .filter(|n| *n != tenant)
            .collect();
        info!(tenant = %tenant, namespace = %ns, others = %others.join(", "), "tenant deleted; the namespace labels stay for the other TenantClusters in it");
        return Ok(Action::await_change());
    }
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    match namespaces.get_opt(&ns).await? {
        Some(n) if n.metadata.deletion_timestamp.is_none() => {
            isolate::set_namespace_labels(&namespaces, &ns, &BTreeMap::new()).await?;
        }
        _ => {}
    }
    info!(tenant = %tenant, namespace = %ns, "tenant deleted; namespace labels removed");
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_exponentially_to_five_minutes() {
        let waits: Vec<u64> = (1..=9).map(|n| retry_after(n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(retry_after(0).as_secs(), 5);
        assert_eq!(retry_after(u32::MAX).as_secs(), 300);
    }
}
