//! The reconcile loop: dereference the policies, build the desired objects, apply them, observe
//! the control plane, write the kubeconfig, reach the tenant, and report it all in status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{LimitRange, Namespace, Pod, ResourceQuota, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::finalizer::{Error as FinalizerError, Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tenantplane_api::{IsolationProfile, SyncPolicy, TenantCluster};
use tracing::{Instrument, info, warn};

use crate::Error;
use crate::apply;
use crate::build::{self, BuildOptions};
use crate::cache::{self, Caches};
use crate::connector::Connector;
use crate::control_plane::{self, Step};
use crate::credentials;
use crate::names::{self, FIELD_MANAGER, FINALIZER};
use crate::namespace::{Occupant, occupants, other_holder, releases_namespace};
use crate::report::{finish, finish_by, report, report_failure};
use crate::status::{self, Progress};
use crate::telemetry::Telemetry;
use tenantplane_syncer::{SyncerSpec, Syncers};

/// How long a control plane may take to become Ready before the tenant counts as Degraded.
pub const PROVISION_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// How the operator runs.
#[derive(Clone, Debug, Default)]
pub struct ControllerOptions {
    pub build: BuildOptions,
    pub connector: Connector,
    /// Watch TenantClusters in this namespace only; all namespaces when `None`.
    pub namespace: Option<String>,
    /// How often a Ready tenant is checked for reachability.
    pub health_interval: Option<Duration>,
    /// How long the admin certificate lives and when it is renewed.
    pub certificates: CertificateOptions,
    /// Metrics and readiness.
    pub telemetry: Telemetry,
}

/// The lifetime of the leaf certificates the operator issues, and how long before they expire
/// they are renewed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CertificateOptions {
    pub validity: Duration,
    pub renew_before: Duration,
}

impl Default for CertificateOptions {
    fn default() -> Self {
        Self {
            validity: tenantplane_pki::LEAF_VALIDITY,
            renew_before: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

impl CertificateOptions {
    /// A certificate renewed before it is even issued would be renewed at every reconcile.
    pub fn validate(&self) -> Result<(), String> {
        if self.renew_before >= self.validity {
            return Err(format!(
                "--renew-certificates-before ({}s) must be shorter than --certificate-validity ({}s)",
                self.renew_before.as_secs(),
                self.validity.as_secs()
            ));
        }
        if self.validity < Duration::from_secs(10) {
            return Err(format!(
                "--certificate-validity ({}s) must be at least 10s",
                self.validity.as_secs()
            ));
        }
        Ok(())
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub options: ControllerOptions,
    pub recorder: Recorder,
    pub caches: Caches,
    pub syncers: Syncers,
    /// The controller's own cache of TenantClusters: who else is in a tenant's namespace.
    pub tenants: Store<TenantCluster>,
    /// The host's Service range, asked of the host and remembered for a while.
    pub service_ranges: crate::service_range::Discovery,
    /// Reconciles that failed in a row, by tenant, for the back-off.
    pub failures: std::sync::Mutex<BTreeMap<(String, String), u32>>,
    /// When each tenant's status was last written: sync churn is coalesced.
    pub status_writes: crate::report::StatusWrites,
}

pub(crate) fn now() -> Time {
    Time(Timestamp::now())
}

/// Run the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    options: ControllerOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let tenants: Api<TenantCluster> = match &options.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (caches, triggers) = cache::watch(&client, options.namespace.as_deref());
    // Syncers ask for a reconcile when their verdict changes.
    let (sync_tx, sync_rx) = futures::channel::mpsc::unbounded();
    let controller = Controller::new(tenants, watcher::Config::default());
    let store = controller.store();
    let store_for_namespaces = store.clone();
    // A policy change reconciles every tenant that references it.
    let tenants_using = |store: kube::runtime::reflector::Store<TenantCluster>,
                         uses: fn(&TenantCluster, &str) -> bool| {
        move |name: String| {
            store
                .state()
                .into_iter()
                .filter(|tc| uses(tc, &name))
                .map(|tc| ObjectRef::from_obj(&*tc))
                .collect::<Vec<_>>()
        }
    };
    let by_profile = tenants_using(store.clone(), |tc, n| {
        tc.spec.isolation_profile_ref.name == n
    });
    let by_policy = tenants_using(store.clone(), |tc, n| tc.spec.sync_policy_ref.name == n);
    let profile_mapper = move |profile: IsolationProfile| by_profile(profile.name_any());
    let sync_mapper = move |policy: SyncPolicy| by_policy(policy.name_any());
    // A control-plane pod belongs to the StatefulSet; its tenant is in its label.
    let pod_mapper = |pod: Pod| {
        let tenant = pod.labels().get(names::LABEL_TENANT).cloned();
        let ns = pod.namespace();
        tenant.zip(ns).map(|(t, ns)| ObjectRef::new(&t).within(&ns))
    };
    let telemetry = options.telemetry.clone();
    telemetry.metrics.count_phases_with({
        let store = store.clone();
        move || {
            let mut counts = BTreeMap::new();
            for tc in store.state() {
                let phase = tc
                    .status
                    .as_ref()
                    .and_then(|s| s.phase)
                    .unwrap_or(tenantplane_api::Phase::Pending);
                *counts.entry(phase.to_string()).or_insert(0) += 1;
            }
            counts
        }
    });
    tokio::spawn({
        let caches = caches.clone();
        let readiness = telemetry.readiness.clone();
        async move {
            caches.ready().await;
            readiness.set_caches_ready(true);
        }
    });
    let context = Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
        syncers: Syncers::new(client.clone(), sync_tx, telemetry.metrics.clone()),
        client: client.clone(),
        options,
        caches,
        tenants: store.clone(),
        service_ranges: Default::default(),
        failures: Default::default(),
        status_writes: Default::default(),
    });
    let syncers = context.syncers.clone();
    controller
        .owns_stream(triggers.statefulsets)
        .owns_stream(triggers.services)
        .owns_stream(triggers.secrets)
        .owns_stream(triggers.network_policies)
        .owns_stream(triggers.quotas)
        .owns_stream(triggers.limit_ranges)
        .watches_stream(triggers.pods, pod_mapper)
        .watches_stream(triggers.profiles, profile_mapper)
        .watches_stream(triggers.sync_policies, sync_mapper)
        // Namespace changes (our labels removed by hand) reconcile every tenant in it.
        .watches_stream(triggers.namespaces, {
            let store = store_for_namespaces;
            move |ns: Namespace| {
                let name = ns.name_any();
                store
                    .state()
                    .into_iter()
                    .filter(|tc| tc.namespace().as_deref() == Some(name.as_str()))
                    .map(|tc| ObjectRef::from_obj(&*tc))
                    .collect::<Vec<_>>()
            }
        })
        .reconcile_on(sync_rx)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(e) = result {
                warn!(error = %e, "reconcile failed");
            }
        })
        .await;
    // Shut down: the reconciles in flight have finished; let the syncers finish theirs.
    syncers.shutdown(SYNCER_GRACE).await;
}

/// How long the syncers may take to finish what they are converging at shutdown.
const SYNCER_GRACE: Duration = Duration::from_secs(10);

/// The first retry after a failed reconcile, doubled each failure in a row up to the last.
const RETRY_FIRST: Duration = Duration::from_secs(5);
const RETRY_MAX: Duration = Duration::from_secs(300);

/// The wait before retry number `failures` (1 for the first failure): exponential, capped.
pub fn retry_after(failures: u32) -> Duration {
    let doubled = RETRY_FIRST.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    doubled.min(RETRY_MAX)
}

pub(crate) fn tenant_key(tc: &TenantCluster) -> (String, String) {
    (tc.namespace().unwrap_or_default(), tc.name_any())
}

fn error_policy(tc: Arc<TenantCluster>, error: &Error, ctx: Arc<Context>) -> Action {
    let failures = match ctx.failures.lock() {
        Ok(mut all) => {
            let n = all.entry(tenant_key(&tc)).or_insert(0);
            *n = n.saturating_add(1);
            *n
        }
        Err(_) => 1,
    };
    let after = retry_after(failures);
    warn!(tenant = %tc.name_any(), namespace = ?tc.namespace(), category = error.category(), error = %error, failures, retry_in_s = after.as_secs(), "reconcile error; retrying");
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

async fn apply_tenant(tc: &TenantCluster, ctx: &Context) -> Result<Action, Error> {
    let (tenant, ns) = build::identity(tc)?;
    let client = &ctx.client;
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

    // One tenant per namespace: the Pod Security labels and the NetworkPolicies are the
    // namespace's, so a second tenant there provisions nothing until the first is gone.
    if let Some(by) = other_holder(&tc, ctx).await? {
        return finish(ctx, &tc, Progress::NamespaceInUse { by }).await;
    }

    // Dereference.
    let profile_name = &tc.spec.isolation_profile_ref.name;
    let caches = &ctx.caches;
    caches.ready().await;
    let Some(profile) = cache::get(&caches.profiles, None, profile_name) else {
        return finish(
            ctx,
            &tc,
            Progress::PolicyMissing {
                kind: "IsolationProfile",
                name: profile_name.clone(),
            },
        )
        .await;
    };
    let policy_name = &tc.spec.sync_policy_ref.name;
    let Some(sync_policy) = cache::get(&caches.sync_policies, None, policy_name) else {
        return finish(
            ctx,
            &tc,
            Progress::PolicyMissing {
                kind: "SyncPolicy",
                name: policy_name.clone(),
            },
        )
        .await;
    };

    // Isolate the namespace.
    let options = &ctx.options.build;
    let wanted_labels = build::isolation::namespace_labels(&profile);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let live_labels = cache::get(&caches.namespaces, None, &ns)
        .and_then(|n| n.metadata.labels.clone())
        .unwrap_or_default();
    if wanted_labels
        .iter()
        .any(|(k, v)| live_labels.get(k) != Some(v))
    {
        set_namespace_labels(&namespaces, &ns, &wanted_labels).await?;
    }
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    let desired_policies = build::isolation::network_policies(&tc, &profile, options)?;
    for policy in &desired_policies {
        apply::ensure(&policies, &caches.network_policies, policy).await?;
    }
    if desired_policies.is_empty() {
        for name in [
            names::isolation_policy(&tenant),
            names::control_plane_policy(&tenant),
        ] {
            apply::ensure_absent(&policies, &caches.network_policies, &ns, &name).await?;
        }
    }
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &ns);
    apply::ensure_optional(
        &quotas,
        &caches.quotas,
        build::isolation::resource_quota(&tc, &profile)?,
        &ns,
        &names::resource_quota(&tenant),
    )
    .await?;
    let limits: Api<LimitRange> = Api::namespaced(client.clone(), &ns);
    apply::ensure_optional(
        &limits,
        &caches.limit_ranges,
        build::isolation::limit_range(&tc, &profile)?,
        &ns,
        &names::limit_range(&tenant),
    )
    .await?;

    // Control plane: PKI (created once, never regenerated), Service, StatefulSet.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let pki = match credentials::ensure_pki(ctx, &tc, &secrets).await? {
        Ok(pki) => pki,
        Err(detail) => return finish(ctx, &tc, Progress::PkiDamaged(detail)).await,
    };
    // While a change rolls out, a control plane that does not answer is on its way, not broken.
    let (pod, addressing, replacing) = match control_plane::ensure(&tc, ctx).await? {
        Step::Ready {
            pod,
            addressing,
            rolling,
        } => (pod, addressing, rolling),
        Step::Stop(progress) => return finish(ctx, &tc, progress).await,
    };

    tracing::debug!("control plane Ready");
    // Kubeconfig: renewed before its certificate expires, or now when the annotation asks.
    let rotate = tc.annotations().contains_key(names::ROTATE_CERTIFICATES);
    let (kubeconfig, renew_at) =
        credentials::ensure_kubeconfig(ctx, &tc, &secrets, &pki, rotate).await?;
    // Look again when the certificate is due, even if nothing else happens by then.
    let renew_in = Duration::from_secs((renew_at - Timestamp::now().as_second()).max(1) as u64);
    if rotate {
        credentials::forget_rotation_request(ctx, &tc).await?;
    }

    // Reach the tenant and run the sync pass.
    let server = match ctx.options.connector.server(&tenant, &ns, &pod) {
        Ok(s) => s,
        Err(detail) => return finish(ctx, &tc, unreachable(replacing, detail)).await,
    };
    let tenant_client = match ctx
        .options
        .connector
        .client(&kubeconfig, &tenant, &ns, &server)
        .await
    {
        Ok(c) => c,
        Err(detail) => return finish(ctx, &tc, unreachable(replacing, detail)).await,
    };
    tracing::debug!(%server, "asking the tenant for its version");
    // Bounded as a whole: a wedged server can take the connection and never finish TLS, which
    // the client's own timeouts (connect, read) do not cover.
    let asked = tokio::time::timeout(TENANT_ANSWER_WITHIN, tenant_client.apiserver_version());
    let version = match asked.await {
        Ok(Ok(info)) => info.git_version,
        Ok(Err(e)) => {
            let detail = format!("{server}: {e}");
            return finish(ctx, &tc, unreachable(replacing, detail)).await;
        }
        Err(_) => {
            let detail = format!(
                "{server}: no answer to GET /version within {}s",
                TENANT_ANSWER_WITHIN.as_secs()
            );
            return finish(ctx, &tc, unreachable(replacing, detail)).await;
        }
    };
    tracing::debug!(%version, "the tenant answered");
    // Sync: the tenant's syncer runs continuously; its verdict is the Synced condition.
    let watch_client = match ctx
        .options
        .connector
        .watch_client(&kubeconfig, &tenant, &ns, &server)
        .await
    {
        Ok(c) => c,
        Err(detail) => return finish(ctx, &tc, unreachable(replacing, detail)).await,
    };
    let spec = SyncerSpec {
        tenant: tenant.clone(),
        host_namespace: ns.clone(),
        owner: build::owner_reference(&tc)?,
        scope: ctx.options.namespace.clone(),
        policy: sync_policy.spec.clone(),
        profile: profile.spec.clone(),
        server,
        kubeconfig,
        api_ip: addressing.api_ip,
        service_cidr: addressing.service_cidr,
        kubelet: options.kubelet.as_ref().map(|k| k.endpoint.clone()),
    };
    let progress = match ctx.syncers.ensure(spec, watch_client).await {
        Ok(summary) => Progress::Synced { version, summary },
        Err(failure) if replacing => {
            control_plane::waiting(format!("{ROLLING_OUT}; syncing: {}", failure.message))
        }
        Err(failure) => Progress::SyncFailed {
            version,
            reason: failure.reason.to_string(),
            error: failure.message,
        },
    };
    finish_by(ctx, &tc, progress, Some(renew_in)).await
}

/// How long the tenant API server has to answer the reconcile's one question.
const TENANT_ANSWER_WITHIN: Duration = Duration::from_secs(15);

const ROLLING_OUT: &str = "the control plane is rolling out a change";

/// The tenant API server does not answer: Degraded, unless a change is rolling out.
fn unreachable(replacing: bool, detail: String) -> Progress {
    if replacing {
        control_plane::waiting(format!("{ROLLING_OUT}; the tenant API server: {detail}"))
    } else {
        Progress::Unreachable(detail)
    }
}

/// Server-side apply of the namespace's Pod Security labels under our field manager; applying an
/// empty set removes them again.
async fn set_namespace_labels(
    namespaces: &Api<Namespace>,
    ns: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), Error> {
    let patch = json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": ns, "labels": labels},
    });
    namespaces
        .patch(
            ns,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
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
    // The datastore goes with the tenant: a new TenantCluster of the same name starts empty.
    let claims = control_plane::delete_data_claims(tc, ctx).await?;
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
        info!(tenant = %tenant, namespace = %ns, others = ?others, "tenant deleted; the namespace labels stay for the other TenantClusters in it");
        return Ok(Action::await_change());
    }
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    match namespaces.get_opt(&ns).await? {
        Some(n) if n.metadata.deletion_timestamp.is_none() => {
            set_namespace_labels(&namespaces, &ns, &BTreeMap::new()).await?;
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
