//! One tenant's syncer as a task: wired, then run by its workers until asked to stop, and
//! restarted with a back-off when it fails.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc::UnboundedReceiver;
use futures::future::BoxFuture;
use kube::Client;
use kube::core::Selector;
use kube::runtime::events::{self, Recorder};
use tenantplane_api::SyncPolicySpec;
use tokio::sync::watch;
use tracing::{Instrument, debug, warn};

use crate::backoff;
use crate::health::Failure;
use crate::host::HostWatches;
use crate::key::Key;
use crate::kinds;
use crate::naming::{SYNCER_MANAGER, TenantRef};
use crate::queue::WorkQueue;
use crate::spec::SyncerSpec;
use crate::stages::Stage;
use crate::tenant::{Tenant, TypeMap, Verdicts};
use crate::translate::Translator;
use crate::wiring::Setup;

/// Workers per tenant: writes to two API servers overlap, one key never runs twice at once.
const WORKERS: usize = 32;
/// Everything is looked at again this often, whatever the watches said.
const RESYNC: Duration = Duration::from_secs(300);

/// The first wait before the add-ons are tried again after a failed pass (doubling up to
/// [`RESYNC`]).
const ADDON_RETRY: Duration = Duration::from_secs(2);
/// A stopped engine is started again after this, doubled each time in a row up to the last.
const RESTART_FIRST: Duration = Duration::from_secs(1);
const RESTART_MAX: Duration = Duration::from_secs(60);

/// Run the tenant's syncer; when it stops (a panic, a bad policy) restart it after a growing
/// back-off, reporting why in the health the controller reads.
pub(crate) async fn supervise(
    spec: SyncerSpec,
    tenant: Client,
    host: Client,
    watches: Arc<HostWatches>,
    reporter: Verdicts,
    stop: watch::Receiver<bool>,
    retries: crate::Retries,
) {
    let mut failures = 0u32;
    loop {
        // The engine runs in its own task so that a panic is caught here; the guard stops it
        // when this task is aborted (the syncer stopped or replaced).
        let mut engine = AbortOnDrop(tokio::spawn(
            run(
                spec.clone(),
                tenant.clone(),
                host.clone(),
                watches.clone(),
                reporter.clone(),
                stop.clone(),
                retries,
            )
            // A spawned task leaves the caller's span behind: this keeps the tenant on its lines.
            .in_current_span(),
        ));
        let why = match (&mut engine.0).await {
            Ok(Ok(())) => return,
            // Stopping: whatever ended it, do not start again.
            _ if *stop.borrow() => return,
            Ok(Err(why)) => why,
            Err(e) if e.is_panic() => EngineError::Panicked(e.to_string()),
            Err(_) => return,
        };
        failures = failures.saturating_add(1);
        let wait = backoff::delay(failures, RESTART_FIRST, RESTART_MAX);
        warn!(tenant = %spec.tenant, namespace = %spec.host_namespace, error = %crate::error::log_text(&why), "syncer stopped; restarting after {}s", wait.as_secs_f64());
        reporter.health.send_modify(|h| {
            h.crashed = Some(why.to_string());
            h.ready = false;
        });
        (reporter.notify)();
        tokio::time::sleep(wait).await;
    }
}

/// Aborts the task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One tenant's engine: what its kinds converge through, and its kinds by name.
struct Engine {
    cx: Tenant,
    entries: BTreeMap<&'static str, kinds::Entry>,
    retries: crate::Retries,
}

impl Engine {
    /// Queue every key either side knows about (the periodic resync).
    fn enqueue_everything(&self) {
        for entry in self.entries.values() {
            for key in (entry.everything)(&self.cx) {
                self.cx.queue.add(key);
            }
        }
    }

    /// Converge one key, queued at `since` (the sync lag is measured from there).
    async fn work(&self, key: &Key, since: std::time::Instant) {
        let Some(entry) = self.entries.get(key.kind) else {
            return;
        };
        let cx = &self.cx;
        let stages = &cx.reporter.stages;
        stages.observe(Stage::Queue, key.kind, since.elapsed());
        let result = stages
            .time(Stage::Converge, key.kind, (entry.converge)(cx, key))
            .await;
        let description = key.describe();
        let (ns, tenant) = (&cx.tr.host_namespace, cx.tr.name());
        let observer = &cx.reporter.observer;
        match result {
            Ok(()) => {
                observer.synced(ns, tenant, key.kind, since.elapsed());
                cx.queue.forget(key);
                cx.reporter.set_error(&description, None);
            }
            Err(e) => {
                observer.sync_failed(ns, tenant, key.kind, e.reason());
                if e.waits_for_change() {
                    // Looked at again when the object or the profile changes, not on a clock.
                    cx.queue.forget(key);
                    debug!(tenant = %tenant, namespace = %ns, key = %description, error = %crate::error::log_text(&e), "sync refused; waiting for a change");
                } else {
                    let delay = cx.queue.retry_up_to(
                        key.clone(),
                        e.first_retry_in(&self.retries),
                        self.retries.max,
                    );
                    debug!(tenant = %tenant, namespace = %ns, key = %description, error = %crate::error::log_text(&e), "sync failed; retrying in {}ms", delay.as_millis());
                }
                cx.reporter.set_error(
                    &description,
                    Some(Failure {
                        reason: e.reason(),
                        message: format!("{description}: {e}"),
                    }),
                );
            }
        }
    }
}

/// Why a tenant's engine stopped: what it could not start with. The supervisor reports it in the
/// syncer's health and starts it again after a back-off.
#[derive(Debug, thiserror::Error)]
enum EngineError {
    #[error("the SyncPolicy's {setting}.selector is invalid: {source}")]
    Selector {
        setting: &'static str,
        #[source]
        source: kube::core::ParseExpressionError,
    },
    #[error(transparent)]
    Identity(#[from] crate::identity::IdentityError),
    #[error("it panicked: {0}")]
    Panicked(String),
}

/// The policy's label selectors, by the kind they select.
fn selectors(
    policy: &SyncPolicySpec,
    entries: &[kinds::Entry],
) -> std::result::Result<BTreeMap<&'static str, Selector>, EngineError> {
    let mut out = BTreeMap::new();
    for entry in entries {
        if let Some(s) = (entry.selector)(policy) {
            let s = Selector::try_from(s.clone()).map_err(|source| EngineError::Selector {
                setting: entry.setting,
                source,
            })?;
            out.insert(entry.name, s);
        }
    }
    Ok(out)
}

async fn run(
    spec: SyncerSpec,
    tenant: Client,
    host: Client,
    watches: Arc<HostWatches>,
    reporter: Verdicts,
    stop: watch::Receiver<bool>,
    retries: crate::Retries,
) -> std::result::Result<(), EngineError> {
    // Failures of an earlier run name objects that may be gone; this run finds them again.
    reporter.health.send_modify(|h| h.errors.clear());
    let policy = spec.policy.clone();
    let entries = kinds::all();
    let selectors = selectors(&policy, &entries)?;
    let tenant_ref = TenantRef {
        name: spec.tenant.clone(),
        owner: spec.owner.clone(),
    };
    crate::identity::ensure(&host, &tenant_ref, &spec.host_namespace).await?;
    let queue = WorkQueue::new();
    let (relists, relisted) = futures::channel::mpsc::unbounded();
    let mut setup = Setup {
        policy: &policy,
        tenant: tenant.clone(),
        host: host.clone(),
        scope: spec.scope.as_deref(),
        namespace: spec.host_namespace.clone(),
        tenant_name: spec.tenant.clone(),
        watches: &watches,
        queue: queue.clone(),
        reporter: reporter.clone(),
        futures: Vec::new(),
        ready: Vec::new(),
        subscriptions: Vec::new(),
        tenant_stores: TypeMap::default(),
        host_stores: TypeMap::default(),
        relists,
        fingerprints: Arc::new(Mutex::new(HashMap::new())),
    };
    for entry in &entries {
        (entry.wire)(&mut setup);
    }
    let Setup {
        futures: watch_tasks,
        ready,
        subscriptions,
        tenant_stores,
        host_stores,
        ..
    } = setup;
    let engine = Arc::new(Engine {
        cx: Tenant {
            tr: Translator {
                tenant: tenant_ref,
                host_namespace: spec.host_namespace.clone(),
                api_ip: spec.api_ip.clone(),
                service_cidr: spec.service_cidr.clone(),
                node_selector: spec.profile.node_selector.clone(),
                tolerations: spec.profile.tolerations.clone(),
                allow: spec.profile.allow.clone(),
                default_limits: spec.profile.limit_range.default.clone(),
                kubelet: spec.kubelet.clone(),
            },
            policy: policy.clone(),
            recorder: Recorder::new(
                tenant.clone(),
                events::Reporter {
                    controller: SYNCER_MANAGER.into(),
                    instance: None,
                },
            ),
            tenant,
            host,
            queue: queue.clone(),
            told: Mutex::new(HashMap::new()),
            refresh_scheduled: Mutex::new(HashMap::new()),
            enabled: entries
                .iter()
                .filter(|e| (e.enabled)(&policy))
                .map(|e| e.name)
                .collect(),
            selectors,
            tenant_stores,
            host_stores,
            reporter,
        },
        entries: entries.into_iter().map(|e| (e.name, e)).collect(),
        retries,
    });
    // Unsubscribed from the host watches when the engine stops.
    let _subscriptions = subscriptions;
    let watches = futures::future::join_all(watch_tasks);
    // The watches run until the engine is dropped; the workers until it is asked to stop.
    tokio::select! {
        _ = watches => {}
        () = serve(engine, ready, relisted, stop) => {}
    }
    Ok(())
}

/// Once every watch has listed: the engine is ready, its workers take keys from the queue and
/// the resync runs, until `stop` says so.
async fn serve(
    engine: Arc<Engine>,
    ready: Vec<BoxFuture<'static, ()>>,
    mut relisted: UnboundedReceiver<&'static str>,
    stop: watch::Receiver<bool>,
) {
    let stopped = || {
        let mut stop = stop.clone();
        async move {
            let _ = stop.wait_for(|s| *s).await;
        }
    };
    tokio::select! {
        _ = futures::future::join_all(ready) => {}
        () = stopped() => return,
    }
    engine.cx.reporter.health.send_modify(|h| {
        h.ready = true;
        h.crashed = None;
    });
    (engine.cx.reporter.notify)();
    // Copies the shared host watches listed before this syncer started are looked at too.
    engine.enqueue_everything();
    let workers = (0..WORKERS).map(|_| {
        let engine = engine.clone();
        async move {
            while let Some((key, since)) = engine.cx.queue.next_timed().await {
                engine.work(&key, since).await;
                engine.cx.queue.done(&key);
            }
        }
    });
    // Asked to stop: hand out no more keys; each worker finishes the key it holds.
    let resync_until_stopped = async {
        tokio::select! {
            () = resync(&engine, &mut relisted) => {}
            () = stopped() => engine.cx.queue.close(),
        }
    };
    futures::join!(futures::future::join_all(workers), resync_until_stopped);
}

/// Every object again each `RESYNC`, a kind's when its shared host watch listed again, and the
/// add-ons after each resync (and after a back-off while they fail). Runs until dropped.
async fn resync(engine: &Engine, relisted: &mut UnboundedReceiver<&'static str>) {
    let mut every = tokio::time::interval(RESYNC);
    every.tick().await;
    // Failures of the add-ons in a row: a failed pass (the tenant API server restarting, say)
    // is tried again after a back-off, not at the next resync, so `Synced` says False no
    // longer than the failure lasts.
    let mut addon_failures = u32::from(!engine.cx.ensure_addons().await);
    loop {
        let failures = addon_failures;
        let retry = async move {
            if failures == 0 {
                std::future::pending::<()>().await;
            }
            let wait = crate::backoff::delay(failures, ADDON_RETRY, RESYNC);
            tokio::time::sleep(wait).await;
        };
        let addons_due = tokio::select! {
            _ = every.tick() => {
                engine.enqueue_everything();
                true
            }
            () = retry => true,
            Some(kind) = relisted.next() => {
                if let Some(entry) = engine.entries.get(kind) {
                    for key in (entry.everything)(&engine.cx) {
                        engine.cx.queue.add(key);
                    }
                }
                false
            }
        };
        if addons_due {
            let ok = engine.cx.ensure_addons().await;
            addon_failures = if ok {
                0
            } else {
                addon_failures.saturating_add(1)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

    #[test]
    fn every_selector_of_the_policy_is_read_and_a_bad_one_names_its_setting() {
        let mut policy = SyncPolicySpec::default();
        let pick = LabelSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            ..Default::default()
        };
        let to = &mut policy.to_host;
        for s in [
            &mut to.pods.selector,
            &mut to.services.selector,
            &mut to.endpoints.selector,
            &mut to.config_maps.selector,
            &mut to.secrets.selector,
            &mut to.persistent_volume_claims.selector,
            &mut to.service_accounts.selector,
            &mut to.ingresses.selector,
        ] {
            *s = Some(pick.clone());
        }
        let read = selectors(&policy, &kinds::all()).unwrap();
        // The endpoints selector picks hand-written Endpoints and EndpointSlices alike.
        assert_eq!(read.len(), 9, "{:?}", read.keys());

        policy.to_host.config_maps.selector = Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "app".into(),
                operator: "Near".into(),
                values: None,
            }]),
            ..Default::default()
        });
        let e = selectors(&policy, &kinds::all()).unwrap_err();
        assert!(matches!(e, EngineError::Selector { .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with("the SyncPolicy's toHost.configMaps.selector is invalid"),
            "{e}"
        );
    }
}
