//! The controller's wiring: what it watches, which tenants each change concerns, and the
//! shared [`Context`] its reconciles run with. The top of the controller's modules.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::Api;
use kube::runtime::Controller;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use tenantplane_api::{IsolationProfile, SyncPolicy, TenantCluster};
use tenantplane_syncer::Syncers;
use tracing::{debug, warn};

use crate::cache;
use crate::context::Context;
use crate::names::{self, FIELD_MANAGER};
use crate::options::ControllerOptions;
use crate::reconcile::{error_policy, reconcile};

/// How long the syncers may take to finish what they are converging at shutdown.
const SYNCER_GRACE: Duration = Duration::from_secs(10);

/// The merged trigger stream's pause after any one watch's error.
const TRIGGER_PAUSE: Duration = Duration::from_millis(200);

/// Run the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    options: ControllerOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    use futures::FutureExt;
    let shutdown = shutdown.shared();
    let tenants: Api<TenantCluster> = match &options.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (caches, triggers) = cache::watch(&client, options.namespace.as_deref());
    // Syncers ask for a reconcile when their verdict changes.
    let (sync_tx, sync_rx) = futures::channel::mpsc::unbounded();
    // The tenants' own watch backs off on its own errors, like every cache's (see
    // `cache::TriggerPause`).
    let (store, tenant_trigger) = cache::tenants(tenants);
    let controller = Controller::for_stream(tenant_trigger, store.clone())
        .trigger_backoff(cache::TriggerPause(TRIGGER_PAUSE));
    // Snapshot stores, snapshots and their schedules: controllers of their own beside the
    // tenants'.
    let snapshot_controllers = [
        tokio::spawn(crate::snapshot::stores::run(
            client.clone(),
            options.snapshots.clone(),
            options.namespace.is_some(),
            shutdown.clone(),
        )),
        tokio::spawn(crate::snapshot::snapshots::run(
            client.clone(),
            options.snapshots.clone(),
            options.connector,
            options.namespace.clone(),
            shutdown.clone(),
        )),
        tokio::spawn(crate::snapshot::schedule::run(
            client.clone(),
            store.clone(),
            shutdown.clone(),
        )),
    ];
    let telemetry = options.telemetry.clone();
    telemetry.metrics.count_phases_with({
        let store = store.clone();
        move || phase_counts(&store)
    });
    tokio::spawn({
        let caches = caches.clone();
        let readiness = telemetry.readiness.clone();
        async move {
            caches.ready().await;
            readiness.set_caches_ready(true);
        }
    });
    let syncers = Syncers::new(client.clone(), sync_tx, telemetry.metrics.clone())
        .with_retries(options.sync_retries);
    let context = Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
        syncers: syncers.clone(),
        client,
        options,
        caches,
        tenants: store,
        service_ranges: Default::default(),
        failures: Default::default(),
        status_writes: Default::default(),
        features: Default::default(),
    });
    watch_what_it_owns(controller, triggers, &context.tenants)
        .reconcile_on(sync_rx)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(e) = result {
                log_failure(&e);
            }
        })
        .await;
    // Shut down: the reconciles in flight have finished; let the syncers finish theirs.
    syncers.shutdown(SYNCER_GRACE).await;
    for controller in snapshot_controllers {
        let _ = controller.await;
    }
}

/// Log a reconcile that failed, naming its tenant where the failure is one tenant's. A trigger
/// for a tenant the cache no longer holds (deleted while a change to what it owned was queued)
/// is no failure: it is said at debug, not as a warning.
fn log_failure<E1, E2>(e: &kube::runtime::controller::Error<E1, E2>)
where
    E1: std::error::Error + 'static,
    E2: std::error::Error + 'static,
{
    use kube::runtime::controller::Error as Failed;
    match e {
        Failed::ObjectNotFound(o) => debug!(
            tenant = %o.name,
            namespace = %o.namespace.as_deref().unwrap_or("none"),
            "a change was queued for a tenant that is gone; nothing to reconcile"
        ),
        Failed::ReconcilerFailed(_, o) => warn!(
            tenant = %o.name,
            namespace = %o.namespace.as_deref().unwrap_or("none"),
            error = %crate::error_chain(e),
            "reconcile failed"
        ),
        _ => warn!(error = %crate::error_chain(e), "the tenants' watch failed"),
    }
}

/// The tenants' controller, woken by changes to the objects they own and to what concerns them:
/// their control-plane pods, their policies and their namespaces.
fn watch_what_it_owns(
    controller: Controller<TenantCluster>,
    triggers: cache::Triggers,
    store: &Store<TenantCluster>,
) -> Controller<TenantCluster> {
    // A policy change reconciles every tenant that references it.
    let profile_mapper = {
        let store = store.clone();
        move |profile: IsolationProfile| {
            tenants_where(&store, |tc| {
                tc.spec.isolation_profile_ref.name == profile.name_any()
            })
        }
    };
    let sync_mapper = {
        let store = store.clone();
        move |policy: SyncPolicy| {
            tenants_where(&store, |tc| {
                tc.spec.sync_policy_ref.name == policy.name_any()
            })
        }
    };
    // Namespace changes (our labels removed by hand) reconcile every tenant in it.
    let namespace_mapper = {
        let store = store.clone();
        move |ns: Namespace| {
            tenants_where(&store, |tc| {
                tc.namespace().as_deref() == Some(ns.name_any().as_str())
            })
        }
    };
    // A control-plane pod belongs to the StatefulSet; its tenant is in its label.
    let pod_mapper = |pod: Pod| {
        let tenant = pod.labels().get(names::LABEL_TENANT).cloned();
        let ns = pod.namespace();
        tenant.zip(ns).map(|(t, ns)| ObjectRef::new(&t).within(&ns))
    };
    controller
        .owns_stream(triggers.statefulsets)
        .owns_stream(triggers.services)
        .owns_stream(triggers.secrets)
        .owns_stream(triggers.config_maps)
        .owns_stream(triggers.network_policies)
        .owns_stream(triggers.quotas)
        .owns_stream(triggers.limit_ranges)
        .owns_stream(triggers.endpoint_slices)
        .watches_stream(triggers.pods, pod_mapper)
        .watches_stream(triggers.profiles, profile_mapper)
        .watches_stream(triggers.sync_policies, sync_mapper)
        .watches_stream(triggers.namespaces, namespace_mapper)
}

/// The tenants in `store` that `concerns` picks, to reconcile.
fn tenants_where(
    store: &Store<TenantCluster>,
    concerns: impl Fn(&TenantCluster) -> bool,
) -> Vec<ObjectRef<TenantCluster>> {
    store
        .state()
        .into_iter()
        .filter(|tc| concerns(tc))
        .map(|tc| ObjectRef::from_obj(&*tc))
        .collect()
}

/// How many tenants are in each phase (one without a status yet is Pending), for the metrics.
fn phase_counts(store: &Store<TenantCluster>) -> BTreeMap<String, i64> {
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
