//! Host watches shared by every tenant's syncer: one reflector per host kind for the whole
//! operator, however many tenants it serves. Copies are watched by their `synced-from` label and
//! indexed by (host namespace, tenant); a tenant's syncer reads its slice of the index and is woken
//! only by changes to it. Host objects shown in tenants (nodes, classes) are watched once and wake
//! every tenant; host Events are indexed by namespace.

use std::any::{Any, TypeId};
use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex, RwLock};

use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tracing::debug;

use crate::naming::LABEL_SYNCED_FROM;

/// Which host objects a shared watch holds, and whom a change concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Copies, labelled `synced-from`: the tenant of that label in the object's namespace.
    Copies,
    /// Every object of the kind in a namespace (host Events): the tenants of that namespace.
    Namespaced,
    /// Cluster-scoped objects (nodes, classes): every tenant.
    Cluster,
}

/// A host object kind a shared watch can hold.
pub trait HostObject:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static
{
}
impl<K> HostObject for K where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static
{
}

/// (host namespace, tenant); the tenant is empty for [`Scope::Namespaced`].
type Slot = (String, String);

/// One tenant's interest in a shared watch.
pub struct Subscriber<K> {
    /// The tenant's host namespace.
    pub namespace: String,
    /// The tenant's name; empty for a watch scoped by namespace only.
    pub tenant: String,
    /// An object of the tenant's slice changed or went.
    pub changed: Box<dyn Fn(&K) + Send + Sync>,
    /// The watch listed again: deletions may have been missed, so look at everything.
    pub relisted: Box<dyn Fn() + Send + Sync>,
    /// The watch fails (`Some`, with why) or works again (`None`).
    pub failing: Box<dyn Fn(Option<String>) + Send + Sync>,
}

/// A shared watch: the reflector's store, the index by slot, and who listens.
pub struct HostStore<K: HostObject> {
    store: Store<K>,
    scope: Scope,
    index: RwLock<Index<K>>,
    subscribers: RwLock<HashMap<u64, Arc<Subscriber<K>>>>,
    next_id: Mutex<u64>,
    failing: Mutex<Option<String>>,
}

struct Index<K: HostObject> {
    by_slot: HashMap<Slot, HashSet<ObjectRef<K>>>,
    slot_of: HashMap<ObjectRef<K>, Slot>,
    /// Filled during a relist, swapped in when it is done.
    relisting: Option<Box<Index<K>>>,
}

impl<K: HostObject> Default for Index<K> {
    fn default() -> Self {
        Self {
            by_slot: HashMap::new(),
            slot_of: HashMap::new(),
            relisting: None,
        }
    }
}

impl<K: HostObject> Index<K> {
    fn insert(&mut self, obj: ObjectRef<K>, slot: Slot) {
        self.remove(&obj);
        self.by_slot
            .entry(slot.clone())
            .or_default()
            .insert(obj.clone());
        self.slot_of.insert(obj, slot);
    }

    fn remove(&mut self, obj: &ObjectRef<K>) {
        if let Some(old) = self.slot_of.remove(obj)
            && let Some(set) = self.by_slot.get_mut(&old)
        {
            set.remove(obj);
            if set.is_empty() {
                self.by_slot.remove(&old);
            }
        }
    }
}

/// Unsubscribes when dropped.
pub struct Subscription {
    cancel: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(cancel) = self.cancel.take() {
            cancel();
        }
    }
}

impl<K: HostObject> HostStore<K> {
    fn slot(&self, obj: &K) -> Option<Slot> {
        let ns = obj.meta().namespace.clone().unwrap_or_default();
        match self.scope {
            Scope::Copies => {
                let tenant = obj.meta().labels.as_ref()?.get(LABEL_SYNCED_FROM)?.clone();
                Some((ns, tenant))
            }
            Scope::Namespaced => Some((ns, String::new())),
            Scope::Cluster => None,
        }
    }

    fn concerned(&self, slot: Option<&Slot>) -> Vec<Arc<Subscriber<K>>> {
        let subscribers = self.subscribers.read().unwrap_or_else(|e| e.into_inner());
        subscribers
            .values()
            .filter(|s| match (self.scope, slot) {
                (Scope::Cluster, _) => true,
                (Scope::Namespaced, Some((ns, _))) => &s.namespace == ns,
                (Scope::Copies, Some((ns, tenant))) => &s.namespace == ns && &s.tenant == tenant,
                _ => false,
            })
            .cloned()
            .collect()
    }

    fn everyone(&self) -> Vec<Arc<Subscriber<K>>> {
        let subscribers = self.subscribers.read().unwrap_or_else(|e| e.into_inner());
        subscribers.values().cloned().collect()
    }

    fn index(&self) -> std::sync::RwLockWriteGuard<'_, Index<K>> {
        self.index.write().unwrap_or_else(|e| e.into_inner())
    }

    fn on_event(&self, event: watcher::Event<K>) {
        match event {
            watcher::Event::Apply(obj) | watcher::Event::Delete(obj)
                if self.scope == Scope::Cluster =>
            {
                for s in self.everyone() {
                    (s.changed)(&obj);
                }
            }
            watcher::Event::Apply(obj) => {
                let slot = self.slot(&obj);
                let before = {
                    let mut index = self.index();
                    let r = ObjectRef::from_obj(&obj);
                    let before = index.slot_of.get(&r).cloned();
                    match &slot {
                        Some(slot) => index.insert(r, slot.clone()),
                        None => index.remove(&r),
                    }
                    before
                };
                // A relabelled copy concerns the tenant it left as well.
                let mut told = HashSet::new();
                for slot in [slot, before].iter().flatten() {
                    for s in self.concerned(Some(slot)) {
                        if told.insert(Arc::as_ptr(&s) as usize) {
                            (s.changed)(&obj);
                        }
                    }
                }
            }
            watcher::Event::Delete(obj) => {
                let slot = {
                    let mut index = self.index();
                    let r = ObjectRef::from_obj(&obj);
                    let slot = index.slot_of.get(&r).cloned();
                    index.remove(&r);
                    slot.or_else(|| self.slot(&obj))
                };
                for s in self.concerned(slot.as_ref()) {
                    (s.changed)(&obj);
                }
            }
            watcher::Event::Init => {
                self.index().relisting = Some(Box::default());
            }
            watcher::Event::InitApply(obj) => {
                if let Some(slot) = self.slot(&obj) {
                    let mut index = self.index();
                    let r = ObjectRef::from_obj(&obj);
                    match index.relisting.as_mut() {
                        Some(fresh) => fresh.insert(r, slot),
                        None => index.insert(r, slot),
                    }
                }
            }
            watcher::Event::InitDone => {
                {
                    let mut index = self.index();
                    if let Some(fresh) = index.relisting.take() {
                        *index = *fresh;
                    }
                }
                for s in self.everyone() {
                    (s.relisted)();
                }
            }
        }
    }

    fn set_failing(&self, why: Option<String>) {
        let changed = {
            let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
            let changed = *failing != why;
            *failing = why.clone();
            changed
        };
        if changed {
            for s in self.everyone() {
                (s.failing)(why.clone());
            }
        }
    }

    /// Listen to changes of `subscriber`'s slice until the returned guard is dropped.
    pub fn subscribe(self: &Arc<Self>, subscriber: Subscriber<K>) -> Subscription {
        let id = {
            let mut next = self.next_id.lock().unwrap_or_else(|e| e.into_inner());
            *next += 1;
            *next
        };
        // Told the watch's state and listed as one step, under the lock `set_failing` changes it
        // under: a recovery between the two would otherwise reach everyone but the newcomer,
        // which would then report a watch failing long after it recovered (a syncer restarted
        // while the host's API server came back kept `Synced` False for minutes).
        let failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        let subscriber = Arc::new(subscriber);
        if failing.is_some() {
            (subscriber.failing)(failing.clone());
        }
        self.subscribers
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, subscriber);
        drop(failing);
        let me = Arc::downgrade(self);
        Subscription {
            cancel: Some(Box::new(move || {
                if let Some(me) = me.upgrade() {
                    me.subscribers
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&id);
                }
            })),
        }
    }

    /// Once the first list is in.
    pub async fn ready(&self) {
        let _ = self.store.wait_until_ready().await;
    }

    /// The object of that name (and namespace, for namespaced kinds).
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
        let r = ObjectRef::new(name);
        let r = match namespace {
            Some(ns) => r.within(ns),
            None => r,
        };
        self.store.get(&r)
    }

    /// The objects of a slice: a tenant's copies in `namespace` ([`Scope::Copies`]), a
    /// namespace's objects ([`Scope::Namespaced`]), or all ([`Scope::Cluster`]).
    pub fn slice(&self, namespace: &str, tenant: &str) -> Vec<Arc<K>> {
        if self.scope == Scope::Cluster {
            return self.store.state();
        }
        let tenant = if self.scope == Scope::Namespaced {
            ""
        } else {
            tenant
        };
        let refs: Vec<ObjectRef<K>> = {
            let index = self.index.read().unwrap_or_else(|e| e.into_inner());
            index
                .by_slot
                .get(&(namespace.to_string(), tenant.to_string()))
                .map(|set| set.iter().cloned().collect())
                .unwrap_or_default()
        };
        refs.iter().filter_map(|r| self.store.get(r)).collect()
    }

    /// How many objects the watch holds (for tests and figures).
    pub fn len(&self) -> usize {
        self.store.state().len()
    }

    /// Whether the watch holds no object.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Every shared host watch of one operator, started on first use and stopped when this goes.
pub struct HostWatches {
    kinds: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Drop for HostWatches {
    fn drop(&mut self) {
        for t in self.tasks.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            t.abort();
        }
    }
}

impl Default for HostWatches {
    fn default() -> Self {
        Self::new()
    }
}

impl HostWatches {
    /// No watch yet: each starts on first use.
    pub fn new() -> Self {
        Self {
            kinds: Mutex::new(HashMap::new()),
            tasks: Mutex::new(Vec::new()),
        }
    }

    /// The shared watch of `K`, started with `api` on first use.
    pub fn store<K: HostObject>(
        &self,
        scope: Scope,
        api: impl FnOnce() -> Api<K>,
    ) -> Arc<HostStore<K>> {
        let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(existing) = kinds.get(&TypeId::of::<K>())
            && let Ok(store) = existing.clone().downcast::<HostStore<K>>()
        {
            return store;
        }
        let (reader, writer) = reflector::store();
        let shared = Arc::new(HostStore {
            store: reader,
            scope,
            index: RwLock::new(Index::default()),
            subscribers: RwLock::new(HashMap::new()),
            next_id: Mutex::new(0),
            failing: Mutex::new(None),
        });
        let config = match scope {
            Scope::Copies => watcher::Config::default().labels(LABEL_SYNCED_FROM),
            Scope::Namespaced | Scope::Cluster => watcher::Config::default(),
        };
        let stream = crate::relist::watch(api(), config).reflect(writer);
        let weak = Arc::downgrade(&shared);
        let what = format!("watch of {} on the host", K::kind(&()));
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(item) = stream.next().await {
                let Some(shared) = weak.upgrade() else { return };
                match item {
                    Ok(event) => {
                        if crate::relist::answered(&event) {
                            shared.set_failing(None);
                        }
                        shared.on_event(event);
                    }
                    Err(e) => {
                        debug!(error = %crate::error::log_text(&e), watch = %what, "host watch error; it lists again");
                        shared.set_failing(Some(format!("the {what} fails (retrying): {e}")));
                    }
                }
            }
        });
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(task);
        kinds.insert(TypeId::of::<K>(), shared.clone());
        shared
    }
}
