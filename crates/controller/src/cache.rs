//! Reflector caches of everything the reconcile reads. Each kind is watched once: the same watch
//! fills the cache and triggers reconciles, so a reconcile reads memory instead of the API
//! server, and a reconcile with nothing to do sends no request at all.

use std::fmt::Debug;
use std::sync::Arc;

use futures::Stream;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, LimitRange, Namespace, Pod, ResourceQuota, Secret, Service,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tenantplane_api::{IsolationProfile, SyncPolicy, TenantCluster};

use crate::names;

/// A watch that keeps a cache, as a stream of the objects it touched (for reconcile triggers).
pub type Trigger<K> = std::pin::Pin<Box<dyn Stream<Item = Result<K, watcher::Error>> + Send>>;

fn cached<K>(api: Api<K>, config: watcher::Config) -> (Store<K>, Trigger<K>)
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    (reader, Box::pin(stream))
}

/// The pause of the controller's merged trigger stream after an error from any one watch.
///
/// kube's controller merges every trigger into one stream behind one exponential back-off, so
/// when a restarted API server answers each of a dozen watches with a 410 (its watch cache starts
/// afresh), the errors count as failures in a row of one stream: the pauses grew to 45 s, and
/// meanwhile no watch, not even the TenantClusters' own, was read, so status was computed
/// against a stale object for minutes. Each watch here backs off on its own errors
/// ([`cached`], [`tenants`]), so the merged stream only pauses briefly and never compounds.
#[derive(Clone, Copy, Debug)]
pub struct TriggerPause(pub std::time::Duration);

impl Iterator for TriggerPause {
    type Item = std::time::Duration;
    fn next(&mut self) -> Option<Self::Item> {
        Some(self.0)
    }
}

impl kube::runtime::utils::Backoff for TriggerPause {
    fn reset(&mut self) {}
}

/// The TenantClusters' own watch: their cache, and a trigger per object applied (a deleted one
/// has nothing left to reconcile; its finalizer's work ran while it was still there).
pub fn tenants(api: Api<TenantCluster>) -> (Store<TenantCluster>, Trigger<TenantCluster>) {
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    (reader, Box::pin(stream))
}

/// The caches a reconcile reads.
#[derive(Clone)]
pub struct Caches {
    /// Namespaces: every one, or only the operator's when it is limited to one.
    pub namespaces: Store<Namespace>,
    /// Every IsolationProfile.
    pub profiles: Store<IsolationProfile>,
    /// Every SyncPolicy.
    pub sync_policies: Store<SyncPolicy>,
    /// The control planes' StatefulSets.
    pub statefulsets: Store<StatefulSet>,
    /// The Services the controller made, such as each tenant's API Service.
    pub services: Store<Service>,
    /// The Secrets the controller made: each tenant's PKI and kubeconfigs.
    pub secrets: Store<Secret>,
    /// The ConfigMaps the controller made, such as each control plane's configuration.
    pub config_maps: Store<ConfigMap>,
    /// The NetworkPolicies the controller made from the profiles.
    pub network_policies: Store<NetworkPolicy>,
    /// The ResourceQuotas the controller made from the profiles.
    pub quotas: Store<ResourceQuota>,
    /// The LimitRanges the controller made from the profiles.
    pub limit_ranges: Store<LimitRange>,
    /// The control-plane pods.
    pub pods: Store<Pod>,
    /// The wake doors' EndpointSlices.
    pub endpoint_slices: Store<EndpointSlice>,
    /// True once every store above holds its first list (see [`Caches::ready`]).
    ready: tokio::sync::watch::Receiver<bool>,
}

/// The watch streams behind [`Caches`]; the controller polls them.
pub struct Triggers {
    /// The watch that fills [`Caches::namespaces`].
    pub namespaces: Trigger<Namespace>,
    /// The watch that fills [`Caches::profiles`].
    pub profiles: Trigger<IsolationProfile>,
    /// The watch that fills [`Caches::sync_policies`].
    pub sync_policies: Trigger<SyncPolicy>,
    /// The watch that fills [`Caches::statefulsets`].
    pub statefulsets: Trigger<StatefulSet>,
    /// The watch that fills [`Caches::services`].
    pub services: Trigger<Service>,
    /// The watch that fills [`Caches::secrets`].
    pub secrets: Trigger<Secret>,
    /// The watch that fills [`Caches::config_maps`].
    pub config_maps: Trigger<ConfigMap>,
    /// The watch that fills [`Caches::network_policies`].
    pub network_policies: Trigger<NetworkPolicy>,
    /// The watch that fills [`Caches::quotas`].
    pub quotas: Trigger<ResourceQuota>,
    /// The watch that fills [`Caches::limit_ranges`].
    pub limit_ranges: Trigger<LimitRange>,
    /// The watch that fills [`Caches::pods`].
    pub pods: Trigger<Pod>,
    /// The watch that fills [`Caches::endpoint_slices`].
    pub endpoint_slices: Trigger<EndpointSlice>,
}

/// A watch of the objects the controller made (its `managed-by` label).
pub fn owned() -> watcher::Config {
    watcher::Config::default().labels(&format!(
        "{}={}",
        names::LABEL_MANAGED_BY,
        names::MANAGED_BY
    ))
}

/// Watches for every cached kind, in `namespace` or everywhere. Namespaced kinds are limited to
/// the objects the controller made (its `managed-by` label); control-plane pods carry it too.
pub fn watch(client: &Client, namespace: Option<&str>) -> (Caches, Triggers) {
    fn scoped<K>(client: &Client, ns: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        match ns {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let namespaces_config = match namespace {
        Some(ns) => watcher::Config::default().fields(&format!("metadata.name={ns}")),
        None => watcher::Config::default(),
    };
    let (namespaces, t_namespaces) = cached(Api::all(client.clone()), namespaces_config);
    let (profiles, t_profiles) = cached(Api::all(client.clone()), watcher::Config::default());
    let (sync_policies, t_sync) = cached(Api::all(client.clone()), watcher::Config::default());
    let (statefulsets, t_sts) = cached(scoped(client, namespace), owned());
    let (services, t_svc) = cached(scoped(client, namespace), owned());
    let (secrets, t_secrets) = cached(scoped(client, namespace), owned());
    let (config_maps, t_config_maps) = cached(scoped(client, namespace), owned());
    let (network_policies, t_np) = cached(scoped(client, namespace), owned());
    let (quotas, t_quotas) = cached(scoped(client, namespace), owned());
    let (limit_ranges, t_limits) = cached(scoped(client, namespace), owned());
    let (pods, t_pods) = cached(scoped(client, namespace), owned());
    let (endpoint_slices, t_slices) = cached(scoped(client, namespace), owned());
    let (ready_tx, ready) = tokio::sync::watch::channel(false);
    let caches = Caches {
        namespaces,
        profiles,
        sync_policies,
        statefulsets,
        services,
        secrets,
        config_maps,
        network_policies,
        quotas,
        limit_ranges,
        pods,
        endpoint_slices,
        ready,
    };
    // A store's readiness wakes only the last of several concurrent waiters (its signal is a
    // oneshot channel, which keeps one waker), so exactly one task waits on the stores and
    // publishes the result where any number of reconciles can wait.
    let stores = caches.clone();
    tokio::spawn(async move {
        let _ = futures::join!(
            stores.namespaces.wait_until_ready(),
            stores.profiles.wait_until_ready(),
            stores.sync_policies.wait_until_ready(),
            stores.statefulsets.wait_until_ready(),
            stores.services.wait_until_ready(),
            stores.secrets.wait_until_ready(),
            stores.config_maps.wait_until_ready(),
            stores.network_policies.wait_until_ready(),
            stores.quotas.wait_until_ready(),
            stores.limit_ranges.wait_until_ready(),
            stores.pods.wait_until_ready(),
            stores.endpoint_slices.wait_until_ready(),
        );
        let _ = ready_tx.send(true);
    });
    (
        caches,
        Triggers {
            namespaces: t_namespaces,
            profiles: t_profiles,
            sync_policies: t_sync,
            statefulsets: t_sts,
            services: t_svc,
            secrets: t_secrets,
            config_maps: t_config_maps,
            network_policies: t_np,
            quotas: t_quotas,
            limit_ranges: t_limits,
            pods: t_pods,
            endpoint_slices: t_slices,
        },
    )
}

impl Caches {
    /// Wait until every cache holds its first full list, so a reconcile never mistakes "not yet
    /// listed" for "missing". Any number of callers may wait at once.
    pub async fn ready(&self) {
        let mut ready = self.ready.clone();
        let _ = ready.wait_for(|r| *r).await;
    }
}

/// The cached object `namespace/name`.
pub fn get<K>(store: &Store<K>, namespace: Option<&str>, name: &str) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    let key = ObjectRef::new(name);
    store.get(&match namespace {
        Some(ns) => key.within(ns),
        None => key,
    })
}
