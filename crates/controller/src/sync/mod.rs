//! The syncer: per Ready tenant, a supervised task that watches the tenant API and the tenant's
//! host namespace and converges them under the tenant's SyncPolicy. Tenant objects are copied to
//! the host under translated names (see [`naming`]); their state comes back (pod status, virtual
//! nodes, Events); deletes flow both ways; host copies edited by hand are restored and copies
//! whose tenant object is gone are removed.

mod engine;
pub mod naming;
pub mod queue;
pub mod translate;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::core::v1::{
    ConfigMap, Endpoints, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::Ingress;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::reflector::ObjectRef;
use tenantplane_api::{IsolationProfileSpec, SyncPolicySpec, TenantCluster};
use tokio::sync::watch;

use crate::metrics::Metrics;
use tracing::{Instrument, info, warn};

pub use engine::Key;

/// The reason of a failing watch.
pub const WATCH_FAILED: &str = "WatchFailed";

/// Why a tenant is not (yet) fully synced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// CamelCase, for the `Synced` condition.
    pub reason: &'static str,
    /// Names the resource and the error.
    pub message: String,
}

/// What a syncer reports to the TenantCluster controller.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// Every watch on both sides holds its first list.
    pub ready: bool,
    /// Objects that failed to sync, by a description of the object.
    pub errors: BTreeMap<String, Failure>,
    /// Why the syncer itself stopped, while it waits to restart.
    pub crashed: Option<String>,
}

impl Health {
    /// Does a watch fail (the engine names each failing watch)?
    pub fn watches_failing(&self) -> bool {
        self.errors.values().any(|f| f.reason == WATCH_FAILED)
    }

    /// The `Synced` verdict: a stable summary when all is well, else the first failure and how
    /// many more there are.
    pub fn verdict(&self, policy: &SyncPolicySpec) -> Result<String, Failure> {
        if let Some(why) = &self.crashed {
            return Err(Failure {
                reason: "SyncerRestarting",
                message: format!("the syncer stopped and restarts after a back-off: {why}"),
            });
        }
        if !self.ready {
            return Err(Failure {
                reason: "SyncStarting",
                message: "the syncer is reading the tenant and the host namespace".into(),
            });
        }
        if let Some((_, first)) = self.errors.iter().next() {
            let more = self.errors.len() - 1;
            let message = if more == 0 {
                first.message.clone()
            } else {
                format!("{} (and {more} more)", first.message)
            };
            return Err(Failure {
                reason: first.reason,
                message,
            });
        }
        Ok(summary(policy))
    }
}

/// One sentence naming what moves; stable, so a healthy tenant's status never changes.
pub fn summary(policy: &SyncPolicySpec) -> String {
    let to = &policy.to_host;
    let down: Vec<&str> = [
        ("pods", to.pods.enabled),
        ("services", to.services.enabled),
        ("endpoints", to.endpoints.enabled),
        ("configmaps", to.config_maps.enabled),
        ("secrets", to.secrets.enabled),
        (
            "persistentvolumeclaims",
            to.persistent_volume_claims.enabled,
        ),
        ("serviceaccounts", to.service_accounts.enabled),
        ("ingresses", to.ingresses.enabled),
    ]
    .into_iter()
    .filter_map(|(k, on)| on.then_some(k))
    .collect();
    let from = &policy.from_host;
    let up: Vec<&str> = [
        ("virtual nodes", from.nodes.enabled),
        ("events", from.events.enabled),
        ("storageclasses", from.storage_classes.enabled),
        ("ingressclasses", from.ingress_classes.enabled),
    ]
    .into_iter()
    .filter_map(|(k, on)| on.then_some(k))
    .collect();
    let list = |v: &[&str]| {
        if v.is_empty() {
            "nothing".to_string()
        } else {
            v.join(", ")
        }
    };
    format!(
        "in sync: {} to the host; {} from the host",
        list(&down),
        list(&up)
    )
}

/// Everything a syncer runs with; a change restarts it.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncerSpec {
    pub tenant: String,
    pub host_namespace: String,
    pub owner: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
    pub policy: SyncPolicySpec,
    pub profile: IsolationProfileSpec,
    /// Where the tenant API server answers, and with which kubeconfig (for change detection).
    pub server: String,
    pub kubeconfig: String,
    /// The cluster IP of the tenant API server's Service: synced pods dial it, on 6443 directly
    /// and on 443 through the tenant's `kubernetes` Service, which is given this address.
    pub api_ip: String,
}

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
    metrics: Arc<Metrics>,
}

/// How long a reconcile waits for a new syncer's first lists before it reports `SyncStarting`.
const FIRST_LIST_WAIT: Duration = Duration::from_secs(10);

impl Syncers {
    pub fn new(
        host: Client,
        notify: UnboundedSender<ObjectRef<TenantCluster>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            running: Arc::new(Mutex::new(HashMap::new())),
            host,
            notify,
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Running>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Make sure `spec`'s syncer runs (restarting it when the spec changed) and return its
    /// verdict for the `Synced` condition.
    pub async fn ensure(&self, spec: SyncerSpec, tenant: Client) -> Result<String, Failure> {
        let key = (spec.host_namespace.clone(), spec.tenant.clone());
        let policy = spec.policy.clone();
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
                    let task = tokio::spawn(
                        engine::supervise(
                            spec.clone(),
                            tenant,
                            self.host.clone(),
                            tx,
                            move || {
                                let _ = notify.unbounded_send(target.clone());
                            },
                            self.metrics.clone(),
                            stop_rx,
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
        health.borrow().verdict(&policy)
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
            Err(_) => warn!(count, "syncers still busy after {grace:?}; stopping them"),
        }
        // Dropping aborts any still running.
    }

    /// Is a syncer running for this tenant?
    pub fn is_running(&self, namespace: &str, tenant: &str) -> bool {
        self.lock()
            .get(&(namespace.to_string(), tenant.to_string()))
            .is_some_and(|r| !r.task.is_finished())
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
            warn!(error = %e, "deleting synced objects failed");
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_names_the_first_failure_and_counts_the_rest() {
        let policy = SyncPolicySpec::default();
        let mut h = Health {
            ready: true,
            ..Default::default()
        };
        assert_eq!(
            h.verdict(&policy).unwrap(),
            "in sync: pods, services, endpoints, configmaps, secrets, persistentvolumeclaims to the host; virtual nodes, events from the host"
        );
        for n in ["a", "b"] {
            h.errors.insert(
                format!("Pod default/{n}"),
                Failure {
                    reason: "HostRejected",
                    message: format!("Pod default/{n}: refused"),
                },
            );
        }
        let f = h.verdict(&policy).unwrap_err();
        assert_eq!(f.reason, "HostRejected");
        assert_eq!(f.message, "Pod default/a: refused (and 1 more)");
    }
}
