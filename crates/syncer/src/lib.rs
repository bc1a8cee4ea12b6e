//! The syncer: per Ready tenant, a supervised task that converges the tenant API and the tenant's
//! host namespace under the tenant's SyncPolicy. Tenant objects are copied to the host under
//! translated names (see [`naming`]); their state comes back (pod status, virtual nodes, Events);
//! deletes flow both ways; host copies edited by hand are restored and copies whose tenant
//! object is gone are removed.
//!
//! The modules form layers, each using only those below it (no module imports one above):
//!
//! - top: [`Syncers`] here, and `run`, one tenant's engine and its workers;
//! - [`kinds`]: the one list of kinds, one module per kind behind [`kind_trait::Kind`]
//!   (`kinds::pods` above the kinds whose objects a pod uses; a kind names another's keys and
//!   switch by its objects' type, not by importing it); `wiring` feeds a kind's watches to the
//!   engine; [`copy`] drives the kinds whose copy is "translate, then converge"; [`tell`] and
//!   [`tenant_terms`] speak to the tenant;
//! - [`tenant`]: what a kind reads and writes through (caches, clients, queue, verdicts);
//! - below: [`translate`], [`key`], [`host`] (the host watches every tenant shares), [`relist`]
//!   (a watch that lists again after an error), [`queue`],
//!   [`backoff`], [`converge`] (the one way an object is converged, shared with the controller),
//!   [`allow`], [`naming`], [`health`], [`spec`].

pub mod addons;
pub mod allow;
pub mod backoff;
pub mod converge;
pub mod copy;
pub mod error;
pub mod health;
pub mod host;
pub mod identity;
pub mod key;
pub mod kind_trait;
pub mod kinds;
pub mod naming;
pub mod queue;
pub mod relist;
pub mod retired;
mod run;
pub mod spec;
pub mod stages;
pub mod tell;
pub mod tenant;
pub mod tenant_terms;
pub mod translate;
mod wiring;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::core::v1::{
    ConfigMap, Endpoints, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::reflector::ObjectRef;
use tenantplane_api::TenantCluster;
use tokio::sync::watch;
use tracing::{Instrument, info, warn};

pub use error::Error;
pub use health::{
    Failure, Health, OBJECTS_REFUSED, Observer, SYNC_STARTING, WATCH_FAILED, refused_by_policy,
};
pub use key::Key;
pub use kinds::summary;
pub use spec::{KubeletEndpoint, SyncerSpec};

struct Running {
    spec: SyncerSpec,
    /// Set to ask the engine to finish the keys in hand and stop.
    stop: watch::Sender<bool>,
    health: watch::Receiver<Health>,
    task: tokio::task::JoinHandle<()>,
    /// Since when its watches fail although the tenant answers the operator.
    watches_failing_since: Option<std::time::Instant>,
}

/// How long a syncer's watches may fail while the tenant answers before the syncer is started
/// again with a fresh client (its connections may be stuck on an API server that went away).
const STUCK_WATCHES: Duration = Duration::from_secs(20);

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The syncers of every tenant this operator serves.
#[derive(Clone)]
pub struct Syncers {
    running: Arc<Mutex<HashMap<(String, String), Running>>>,
    host: Client,
    /// Reconciles the TenantCluster when a syncer's health changes.
    notify: UnboundedSender<ObjectRef<TenantCluster>>,
    observer: Arc<dyn Observer>,
    /// Shared by every tenant's syncer.
    watches: Arc<host::HostWatches>,
    retries: Retries,
}

/// How a tenant's syncer retries an object that failed: the first retry of one the host or the
/// profile refused, and the longest wait the back-off grows to (each failure in a row doubles
/// it). The operator's `--sync-retry-refused-after` and `--sync-retry-max` set them; tests that
/// count retries shorten them rather than wait minutes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retries {
    /// How long before the first retry of an object the host or the profile refused.
    pub refused_first: Duration,
    /// The longest wait between retries of one object.
    pub max: Duration,
}

impl Default for Retries {
    fn default() -> Self {
        Self {
            refused_first: Duration::from_secs(10),
            max: queue::MAX_BACKOFF,
        }
    }
}

/// How long a reconcile waits for a new syncer's first lists before it reports `SyncStarting`.
const FIRST_LIST_WAIT: Duration = Duration::from_secs(10);

impl Syncers {
    /// No syncer running yet. `host` is the operator's client, `notify` asks the controller to
    /// reconcile a tenant again, and `observer` is told what the syncers did, for the metrics.
    pub fn new(
        host: Client,
        notify: UnboundedSender<ObjectRef<TenantCluster>>,
        observer: Arc<dyn Observer>,
    ) -> Self {
        Self {
            running: Arc::new(Mutex::new(HashMap::new())),
            host,
            notify,
            observer,
            watches: Arc::new(crate::host::HostWatches::new()),
            retries: Retries::default(),
        }
    }

    /// Retry failed objects as `retries` says (the default: 10 s after a refusal, at most 5 min).
    pub fn with_retries(mut self, retries: Retries) -> Self {
        self.retries = retries;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Running>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Make sure `spec`'s syncer runs (restarting it when the spec changed) and return its
    /// verdict for the `Synced` condition.
    pub async fn ensure(&self, spec: SyncerSpec, tenant: Client) -> Result<String, Failure> {
        let key = (spec.host_namespace.clone(), spec.tenant.clone());
        let summary = kinds::summary(&spec.policy);
        let mut health = {
            let mut running = self.lock();
            // The caller just reached the tenant: watches failing for long are stuck, not waiting.
            if let Some(r) = running.get_mut(&key) {
                let failing = r.health.borrow().watches_failing();
                r.watches_failing_since = match (failing, r.watches_failing_since) {
                    (false, _) => None,
                    (true, None) => Some(std::time::Instant::now()),
                    (true, since) => since,
                };
            }
            let stuck = running
                .get(&key)
                .and_then(|r| r.watches_failing_since)
                .is_some_and(|since| since.elapsed() > STUCK_WATCHES);
            match running.get(&key) {
                Some(r) if r.spec == spec && !r.task.is_finished() && !stuck => r.health.clone(),
                _ => {
                    if stuck {
                        drop(running.remove(&key));
                        warn!(tenant = %spec.tenant, namespace = %spec.host_namespace, "restarting the syncer: its watches fail while the tenant answers");
                    } else if running.remove(&key).is_some() {
                        info!(tenant = %spec.tenant, namespace = %spec.host_namespace, "restarting the syncer: its settings changed");
                    } else {
                        info!(tenant = %spec.tenant, namespace = %spec.host_namespace, "starting the syncer");
                    }
                    let (tx, rx) = watch::channel(Health::default());
                    let (stop, stop_rx) = watch::channel(false);
                    let notify = self.notify.clone();
                    let target =
                        ObjectRef::<TenantCluster>::new(&spec.tenant).within(&spec.host_namespace);
                    let reporter = tenant::Verdicts {
                        health: Arc::new(tx),
                        notify: Arc::new(move || {
                            let _ = notify.unbounded_send(target.clone());
                        }),
                        summary: summary.clone(),
                        observer: self.observer.clone(),
                        stages: stages::Stages::new(self.observer.clone()),
                    };
                    let task = tokio::spawn(
                        run::supervise(
                            spec.clone(),
                            tenant,
                            self.host.clone(),
                            self.watches.clone(),
                            reporter,
                            stop_rx,
                            self.retries,
                        )
                        .instrument(tracing::info_span!(
                            "syncer",
                            namespace = %spec.host_namespace,
                            tenant = %spec.tenant
                        )),
                    );
                    running.insert(
                        key,
                        Running {
                            spec,
                            stop,
                            health: rx.clone(),
                            task,
                            watches_failing_since: None,
                        },
                    );
                    rx
                }
            }
        };
        if !health.borrow().ready {
            let _ = tokio::time::timeout(FIRST_LIST_WAIT, health.wait_for(|h| h.ready)).await;
        }
        health.borrow().verdict(&summary)
    }

    /// Stop every syncer gracefully (on shutdown): each finishes the objects it is converging,
    /// for at most `grace`; what is left then is aborted, and picked up by the next leader.
    pub async fn shutdown(&self, grace: Duration) {
        let mut running: Vec<Running> = self.lock().drain().map(|(_, r)| r).collect();
        for r in &running {
            let _ = r.stop.send(true);
        }
        let count = running.len();
        let all = futures::future::join_all(running.iter_mut().map(|r| &mut r.task));
        match tokio::time::timeout(grace, all).await {
            Ok(_) => info!(
                count,
                "syncers stopped, each after finishing the objects in hand"
            ),
            Err(_) => warn!(
                count,
                "syncers still busy after {}s; stopping them",
                grace.as_secs_f64()
            ),
        }
        // Dropping aborts any still running.
    }

    /// Is a syncer running for this tenant?
    pub fn is_running(&self, namespace: &str, tenant: &str) -> bool {
        self.lock()
            .get(&(namespace.to_string(), tenant.to_string()))
            .is_some_and(|r| !r.task.is_finished())
    }

    /// Stop the tenant's syncer and leave every host copy as it is (a restore: the syncer started
    /// afterwards converges the copies to the restored tenant).
    pub fn stop(&self, namespace: &str, tenant: &str) {
        let stopped = self
            .lock()
            .remove(&(namespace.to_string(), tenant.to_string()));
        if stopped.is_some() {
            info!(tenant = %tenant, namespace = %namespace, "syncer stopped; host copies kept");
        }
    }

    /// Put the tenant's sync to sleep: stop its syncer and delete the host copies of its pods,
    /// so nothing of it runs or counts against quota. Every other copy stays (Services keep
    /// their cluster IPs, claims their data); the syncer started again on wake converges them.
    pub async fn sleep(&self, namespace: &str, tenant: &str) -> Result<(), kube::Error> {
        drop(
            self.lock()
                .remove(&(namespace.to_string(), tenant.to_string())),
        );
        let lp = ListParams::default().labels(&naming::synced_selector(tenant));
        delete_all::<Pod>(&self.host, namespace, &DeleteParams::background(), &lp).await?;
        info!(tenant = %tenant, namespace = %namespace, "syncer stopped for sleep; the pods' host copies deleted");
        Ok(())
    }

    /// Stop the tenant's syncer and remove every host object synced from it.
    pub async fn remove(&self, namespace: &str, tenant: &str) -> Result<(), kube::Error> {
        drop(
            self.lock()
                .remove(&(namespace.to_string(), tenant.to_string())),
        );
        let lp = ListParams::default().labels(&naming::synced_selector(tenant));
        let dp = DeleteParams::background();
        let host = &self.host;
        // Pods first, so nothing runs on copies that are about to go.
        delete_all::<Pod>(host, namespace, &dp, &lp).await?;
        delete_all::<Service>(host, namespace, &dp, &lp).await?;
        delete_all::<Endpoints>(host, namespace, &dp, &lp).await?;
        delete_all::<EndpointSlice>(host, namespace, &dp, &lp).await?;
        delete_all::<ConfigMap>(host, namespace, &dp, &lp).await?;
        delete_all::<Secret>(host, namespace, &dp, &lp).await?;
        delete_all::<PersistentVolumeClaim>(host, namespace, &dp, &lp).await?;
        delete_all::<ServiceAccount>(host, namespace, &dp, &lp).await?;
        delete_all::<Ingress>(host, namespace, &dp, &lp).await?;
        info!(tenant = %tenant, namespace = %namespace, "syncer stopped; synced host objects deleted");
        Ok(())
    }
}

async fn delete_all<K>(
    client: &Client,
    namespace: &str,
    dp: &DeleteParams,
    lp: &ListParams,
) -> Result<(), kube::Error>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    match api.delete_collection(dp, lp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => {
            warn!(namespace = %namespace, kind = %K::kind(&()), error = %crate::error::log_text(&e), "deleting synced objects failed");
            Err(e)
        }
    }
}
