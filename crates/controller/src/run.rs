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
use tracing::warn;

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
    // Snapshot stores and snapshots: controllers of their own beside the tenants'.
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
    ];
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
    let store_for_namespaces = store.clone();
    let schedules = tokio::spawn(crate::snapshot::schedule::run(
        client.clone(),
        store.clone(),
        shutdown.clone(),
    ));
    // A policy change reconciles every tenant that references it.
    let tenants_using = |store: Store<TenantCluster>, uses: fn(&TenantCluster, &str) -> bool| {
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
        syncers: Syncers::new(client.clone(), sync_tx, telemetry.metrics.clone())
            .with_retries(options.sync_retries),
        client: client.clone(),
        options,
        caches,
        tenants: store.clone(),
        service_ranges: Default::default(),
        failures: Default::default(),
        status_writes: Default::default(),
        features: Default::default(),
    });
    let syncers = context.syncers.clone();
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
    for controller in snapshot_controllers {
        let _ = controller.await;
    }
    let _ = schedules.await;
}
