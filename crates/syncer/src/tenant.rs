//! One tenant's syncer: its tenant watches and its slices of the shared host watches queue keys;
//! workers converge one key at a time through the key's kind, reading only the caches. A failing
//! key backs off; the verdict reaches the controller through [`Health`].

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::core::{Selector, SelectorExt};
use kube::runtime::events::{self, Recorder};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tenantplane_api::SyncPolicySpec;
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::converge::hash_of;
use crate::health::{Failure, Health, WATCH_FAILED};
use crate::host::{HostStore, HostWatches, Subscriber, Subscription};
use crate::kind::{Key, Kind, Object};
use crate::kinds::{self, Entry};
use crate::naming::{SYNCER_MANAGER, TenantRef};
use crate::queue::WorkQueue;
use crate::translate::Translator;
use crate::{Observer, SyncerSpec};

/// Workers per tenant: writes to two API servers overlap, one key never runs twice at once.
const WORKERS: usize = 32;
/// Everything is looked at again this often, whatever the watches said.
const RESYNC: Duration = Duration::from_secs(300);

/// Values by their type: the caches of each side, one per object type.
#[derive(Default)]
struct TypeMap(HashMap<TypeId, Box<dyn Any + Send + Sync>>);

impl TypeMap {
    fn insert<T: Any + Send + Sync>(&mut self, value: T) {
        self.0.insert(TypeId::of::<T>(), Box::new(value));
    }

    fn get<T: Any>(&self) -> Option<&T> {
        self.0.get(&TypeId::of::<T>())?.downcast_ref()
    }
}

/// What a kind's converge step reads and writes through.
pub struct Tenant {
    pub tr: Translator,
    pub policy: SyncPolicySpec,
    pub tenant: Client,
    pub host: Client,
    pub queue: Arc<WorkQueue<Key>>,
    /// Events in the tenant, as the syncer.
    pub recorder: Recorder,
    /// Tenant pods already told (by Event) why the host refused them, with what message.
    pub told: Mutex<HashMap<String, String>>,
    /// When each host pod's token Secret is due to be minted again, once a pass is scheduled.
    pub refresh_scheduled: Mutex<HashMap<String, Timestamp>>,
    selectors: BTreeMap<&'static str, Selector>,
    tenant_stores: TypeMap,
    host_stores: TypeMap,
    reporter: Verdicts,
    entries: BTreeMap<&'static str, Entry>,
}

impl Tenant {
    /// Does the policy's selector for `kind` (if any) select an object with `labels`?
    pub fn selected(&self, kind: &str, meta: &kube::api::ObjectMeta) -> bool {
        match self.selectors.get(kind) {
            None => true,
            Some(s) => s.matches(meta.labels.as_ref().unwrap_or(&BTreeMap::new())),
        }
    }

    fn tenant_store<K: Object>(&self) -> Option<&Store<K>> {
        self.tenant_stores.get::<Store<K>>()
    }

    /// Tenant object `namespace/name` (namespace empty for cluster-scoped kinds).
    pub fn tenant_get<K: Object>(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let r = ObjectRef::new(name);
        let r = if namespace.is_empty() {
            r
        } else {
            r.within(namespace)
        };
        self.tenant_store::<K>()?.get(&r)
    }

    /// Every tenant object of a kind the syncer watches.
    pub fn tenant_list<K: Object>(&self) -> Vec<Arc<K>> {
        self.tenant_store::<K>()
            .map(|s| s.state())
            .unwrap_or_default()
    }

    fn host_store<K: Object>(&self) -> Option<&Arc<HostStore<K>>> {
        self.host_stores.get::<Arc<HostStore<K>>>()
    }

    /// The host object of that name, in the tenant's host namespace (`namespaced`) or cluster
    /// scope, whoever made it.
    pub fn host_get<K: Object>(&self, namespaced: bool, name: &str) -> Option<Arc<K>> {
        let ns = namespaced.then_some(self.tr.host_namespace.as_str());
        self.host_store::<K>()?.get(ns, name)
    }

    /// The host copy of tenant object `namespace/name`, if there is one and it is ours.
    pub fn host_copy<K: Object>(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let ours = self.is_copy_of(namespace, name);
        self.host_get::<K>(true, &self.tr.host_name(namespace, name))
            .filter(|o| ours(o.meta()))
    }

    /// Does host metadata `meta` make an object this tenant's copy of `namespace/name`?
    pub fn is_copy_of<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> impl Fn(&kube::api::ObjectMeta) -> bool + Send + Sync + 'a {
        move |meta| {
            self.tr
                .copy_of(meta)
                .is_some_and(|v| v.namespace == namespace && v.name == name)
        }
    }

    /// This tenant's slice of a shared host watch (copies: by their marks, unchecked).
    pub fn host_slice<K: Object>(&self) -> Vec<Arc<K>> {
        self.host_store::<K>()
            .map(|s| s.slice(&self.tr.host_namespace, self.tr.name()))
            .unwrap_or_default()
    }

    /// An Api in the tenant's host namespace.
    pub fn host_api<K>(&self) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        Api::namespaced(self.host.clone(), &self.tr.host_namespace)
    }

    /// An Api in tenant namespace `namespace`.
    pub fn tenant_api<K>(&self, namespace: &str) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        Api::namespaced(self.tenant.clone(), namespace)
    }

    /// Queue every key either side knows about (the periodic resync).
    fn enqueue_everything(&self) {
        for entry in self.entries.values() {
            for key in (entry.everything)(self) {
                self.queue.add(key);
            }
        }
    }

    /// Converge one key, queued at `since` (the sync lag is measured from there).
    async fn work(&self, key: &Key, since: std::time::Instant) {
        let Some(entry) = self.entries.get(key.kind) else {
            return;
        };
        let result = (entry.converge)(self, key).await;
        let description = key.describe();
        let (ns, tenant) = (&self.tr.host_namespace, self.tr.name());
        let observer = &self.reporter.observer;
        match result {
            Ok(()) => {
                observer.synced(ns, tenant, key.kind, since.elapsed());
                self.queue.forget(key);
                self.reporter.set_error(&description, None);
            }
            Err(e) => {
                observer.sync_failed(ns, tenant, key.kind, e.reason());
                let delay = self.queue.retry(key.clone(), e.first_retry());
                debug!(key = %description, error = %e, "sync failed; retrying in {delay:?}");
                self.reporter.set_error(
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

/// Where the engine reports failures, and how it tells the controller its verdict changed.
#[derive(Clone)]
pub(crate) struct Verdicts {
    pub health: Arc<watch::Sender<Health>>,
    pub notify: Arc<dyn Fn() + Send + Sync>,
    pub policy: SyncPolicySpec,
    pub observer: Arc<dyn Observer>,
}

impl Verdicts {
    /// Record (or clear) the failure of one object or watch; tell the controller when the verdict
    /// changes.
    fn set_error(&self, what: &str, failure: Option<Failure>) {
        let mut changed = false;
        self.health.send_if_modified(|h| {
            let before = h.verdict(&self.policy);
            let modified = match &failure {
                Some(f) => h.errors.insert(what.to_string(), f.clone()).as_ref() != Some(f),
                None => h.errors.remove(what).is_some(),
            };
            changed = modified && before != h.verdict(&self.policy);
            modified
        });
        if changed {
            (self.notify)();
        }
    }

    fn watch_failing(&self, what: &str, why: Option<String>) {
        self.set_error(
            what,
            why.map(|message| Failure {
                reason: WATCH_FAILED,
                message,
            }),
        );
    }
}

/// Run the tenant's syncer; when it stops (a panic, a bad policy) restart it after a growing
/// back-off, reporting why in the health the controller reads.
pub(crate) async fn supervise(
    spec: SyncerSpec,
    tenant: Client,
    host: Client,
    watches: Arc<HostWatches>,
    reporter: Verdicts,
    stop: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_secs(1);
    loop {
        // The engine runs in its own task so that a panic is caught here; the guard stops it
        // when this task is aborted (the syncer stopped or replaced).
        let mut engine = AbortOnDrop(tokio::spawn(run(
            spec.clone(),
            tenant.clone(),
            host.clone(),
            watches.clone(),
            reporter.clone(),
            stop.clone(),
        )));
        let why = match (&mut engine.0).await {
            Ok(Ok(())) => return,
            // Stopping: whatever ended it, do not start again.
            _ if *stop.borrow() => return,
            Ok(Err(why)) => why,
            Err(e) if e.is_panic() => format!("it panicked: {e}"),
            Err(_) => return,
        };
        warn!(tenant = %spec.tenant, namespace = %spec.host_namespace, error = %why, "syncer stopped; restarting after {backoff:?}");
        reporter.health.send_modify(|h| {
            h.crashed = Some(why);
            h.ready = false;
        });
        (reporter.notify)();
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(60));
    }
}

/// Aborts the task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The wiring of one engine: each kind adds its watches and caches here.
pub struct Setup<'a> {
    pub policy: &'a SyncPolicySpec,
    tenant: Client,
    host: Client,
    scope: Option<&'a str>,
    namespace: String,
    tenant_name: String,
    watches: &'a HostWatches,
    queue: Arc<WorkQueue<Key>>,
    reporter: Verdicts,
    futures: Vec<BoxFuture<'static, ()>>,
    ready: Vec<BoxFuture<'static, ()>>,
    subscriptions: Vec<Subscription>,
    tenant_stores: TypeMap,
    host_stores: TypeMap,
    relists: futures::channel::mpsc::UnboundedSender<&'static str>,
    /// Fingerprints of tenant objects, so that a change of status alone does not end a back-off.
    fingerprints: Arc<Mutex<HashMap<Key, String>>>,
}

/// A tenant object without what changes by itself (status, versions), as a short hash.
fn fingerprint<K: Object>(obj: &K) -> String {
    let mut value = serde_json::to_value(obj).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.remove("status");
    }
    if let Some(meta) = value.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    hash_of(&value)
}

impl Setup<'_> {
    /// Wire kind `S`: its tenant watch and its slice of the shared host watch, as the policy has
    /// them.
    pub fn wire<S: Kind>(&mut self) {
        if let Some(config) = S::tenant_watch(self.policy)
            && self.tenant_stores.get::<Store<S::Object>>().is_none()
        {
            self.tenant_watch::<S>(config);
        }
        if let Some(scope) = S::host_scope(self.policy)
            && self
                .host_stores
                .get::<Arc<HostStore<S::Object>>>()
                .is_none()
        {
            self.host_watch::<S>(scope);
        }
    }

    fn tenant_watch<S: Kind>(&mut self, config: watcher::Config) {
        let (reader, writer) = reflector::store();
        let stream = watcher(Api::<S::Object>::all(self.tenant.clone()), config)
            .default_backoff()
            .reflect(writer);
        let queue = self.queue.clone();
        let fingerprints = self.fingerprints.clone();
        let what = format!("watch of {} on the tenant", S::NAME);
        let reporter = self.reporter.clone();
        self.futures.push(Box::pin(async move {
            let mut stream = std::pin::pin!(stream);
            let mut failing = false;
            while let Some(item) = stream.next().await {
                let (obj, deleted) = match item {
                    Ok(event) => {
                        // Any answer, even an empty list after a reconnect, means it works again.
                        if failing {
                            failing = false;
                            reporter.watch_failing(&what, None);
                        }
                        match event {
                            watcher::Event::Apply(o) | watcher::Event::InitApply(o) => (o, false),
                            watcher::Event::Delete(o) => (o, true),
                            watcher::Event::Init | watcher::Event::InitDone => continue,
                        }
                    }
                    Err(e) => {
                        debug!(error = %e, watch = %what, "sync watch error; the watcher retries");
                        failing = true;
                        reporter.watch_failing(
                            &what,
                            Some(format!("the {what} fails (retrying): {e}")),
                        );
                        continue;
                    }
                };
                let mut keys = S::tenant_keys(&obj).into_iter();
                if let Some(own) = keys.next() {
                    let print = (!deleted).then(|| fingerprint(&obj));
                    let changed = {
                        let mut f = fingerprints.lock().unwrap_or_else(|e| e.into_inner());
                        match &print {
                            Some(p) => f.insert(own.clone(), p.clone()).as_ref() != Some(p),
                            None => {
                                f.remove(&own);
                                true
                            }
                        }
                    };
                    if changed {
                        queue.add_changed(own);
                    } else {
                        queue.add(own);
                    }
                }
                for key in keys {
                    queue.add(key);
                }
            }
        }));
        let ready = reader.clone();
        self.ready.push(Box::pin(async move {
            let _ = ready.wait_until_ready().await;
        }));
        self.tenant_stores.insert(reader);
    }

    fn host_watch<S: Kind>(&mut self, scope: crate::host::Scope) {
        let client = self.host.clone();
        let ns = self.scope.map(str::to_string);
        let store = self
            .watches
            .store::<S::Object>(scope, move || S::host_api(client, ns.as_deref()));
        let tenant = self.tenant_name.clone();
        let queue = self.queue.clone();
        let relists = self.relists.clone();
        let reporter = self.reporter.clone();
        let what = format!("watch of {} on the host", S::NAME);
        self.subscriptions.push(store.subscribe(Subscriber {
            namespace: self.namespace.clone(),
            tenant: self.tenant_name.clone(),
            changed: Box::new(move |obj: &S::Object| {
                for key in S::host_keys(obj, &tenant) {
                    queue.add(key);
                }
            }),
            relisted: Box::new(move || {
                let _ = relists.unbounded_send(S::NAME);
            }),
            failing: Box::new(move |why| reporter.watch_failing(&what, why)),
        }));
        let ready = store.clone();
        self.ready
            .push(Box::pin(async move { ready.ready().await }));
        self.host_stores.insert(store);
    }
}

/// The policy's label selectors, by the kind they select.
fn selectors(
    policy: &SyncPolicySpec,
) -> std::result::Result<BTreeMap<&'static str, Selector>, String> {
    let to = &policy.to_host;
    let all = [
        (kinds::pods::Pods::NAME, "pods", &to.pods.selector),
        (
            kinds::services::Services::NAME,
            "services",
            &to.services.selector,
        ),
        (
            kinds::endpoints::EndpointsKind::NAME,
            "endpoints",
            &to.endpoints.selector,
        ),
        (
            kinds::configmaps::ConfigMaps::NAME,
            "configMaps",
            &to.config_maps.selector,
        ),
        (
            kinds::secrets::Secrets::NAME,
            "secrets",
            &to.secrets.selector,
        ),
        (
            kinds::persistentvolumeclaims::Claims::NAME,
            "persistentVolumeClaims",
            &to.persistent_volume_claims.selector,
        ),
        (
            kinds::serviceaccounts::ServiceAccounts::NAME,
            "serviceAccounts",
            &to.service_accounts.selector,
        ),
        (
            kinds::ingresses::Ingresses::NAME,
            "ingresses",
            &to.ingresses.selector,
        ),
    ];
    let mut out = BTreeMap::new();
    for (kind, field, selector) in all {
        if let Some(s) = selector {
            let s = Selector::try_from(s.clone())
                .map_err(|e| format!("the SyncPolicy's toHost.{field}.selector is invalid: {e}"))?;
            out.insert(kind, s);
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
) -> std::result::Result<(), String> {
    let stopped = || {
        let mut stop = stop.clone();
        async move {
            let _ = stop.wait_for(|s| *s).await;
        }
    };
    // Failures of an earlier run name objects that may be gone; this run finds them again.
    reporter.health.send_modify(|h| h.errors.clear());
    let policy = spec.policy.clone();
    let selectors = selectors(&policy)?;
    let queue = WorkQueue::new();
    let (relists, mut relisted) = futures::channel::mpsc::unbounded();
    let entries = kinds::all();
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
    let engine = Arc::new(Tenant {
        tr: Translator {
            tenant: TenantRef {
                name: spec.tenant.clone(),
                owner: spec.owner.clone(),
            },
            host_namespace: spec.host_namespace.clone(),
            api_ip: spec.api_ip.clone(),
            node_selector: spec.profile.node_selector.clone(),
            tolerations: spec.profile.tolerations.clone(),
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
        selectors,
        tenant_stores,
        host_stores,
        reporter,
        entries: entries.into_iter().map(|e| (e.name, e)).collect(),
    });
    // Unsubscribed from the host watches when the engine stops.
    let _subscriptions = subscriptions;

    let watches = futures::future::join_all(watch_tasks);
    let start = {
        let engine = engine.clone();
        async move {
            tokio::select! {
                _ = futures::future::join_all(ready) => {}
                () = stopped() => return,
            }
            engine.reporter.health.send_modify(|h| {
                h.ready = true;
                h.crashed = None;
            });
            (engine.reporter.notify)();
            // Copies the shared host watches listed before this syncer started are looked at too.
            engine.enqueue_everything();
            let workers = (0..WORKERS).map(|_| {
                let engine = engine.clone();
                async move {
                    while let Some((key, since)) = engine.queue.next_timed().await {
                        engine.work(&key, since).await;
                        engine.queue.done(&key);
                    }
                }
            });
            let resync = async {
                let mut every = tokio::time::interval(RESYNC);
                every.tick().await;
                loop {
                    tokio::select! {
                        _ = every.tick() => engine.enqueue_everything(),
                        Some(kind) = relisted.next() => {
                            if let Some(entry) = engine.entries.get(kind) {
                                for key in (entry.everything)(&engine) {
                                    engine.queue.add(key);
                                }
                            }
                        }
                    }
                }
            };
            // Asked to stop: hand out no more keys; each worker finishes the key it holds.
            let resync_until_stopped = async {
                tokio::select! {
                    () = resync => {}
                    () = stopped() => engine.queue.close(),
                }
            };
            futures::join!(futures::future::join_all(workers), resync_until_stopped);
        }
    };
    // The watches run until the engine is dropped; the workers until it is asked to stop.
    tokio::select! {
        _ = watches => {}
        () = start => {}
    }
    Ok(())
}
