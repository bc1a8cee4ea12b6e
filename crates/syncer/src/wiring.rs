//! How one tenant's engine is wired: each kind's tenant watch, and its slice of the shared host
//! watch, feeding the tenant's work queue and caches.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::future::BoxFuture;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use tenantplane_api::SyncPolicySpec;
use tracing::debug;

use crate::converge::hash_of;
use crate::host::{HostStore, HostWatches, Subscriber, Subscription};
use crate::key::{Key, Object};
use crate::kind_trait::Kind;
use crate::queue::WorkQueue;
use crate::tenant::{TypeMap, Verdicts};

/// The wiring of one engine: each kind adds its watches and caches here.
pub struct Setup<'a> {
    pub policy: &'a SyncPolicySpec,
    pub(crate) tenant: Client,
    pub(crate) host: Client,
    pub(crate) scope: Option<&'a str>,
    pub(crate) namespace: String,
    pub(crate) tenant_name: String,
    pub(crate) watches: &'a HostWatches,
    pub(crate) queue: Arc<WorkQueue<Key>>,
    pub(crate) reporter: Verdicts,
    pub(crate) futures: Vec<BoxFuture<'static, ()>>,
    pub(crate) ready: Vec<BoxFuture<'static, ()>>,
    pub(crate) subscriptions: Vec<Subscription>,
    pub(crate) tenant_stores: TypeMap,
    pub(crate) host_stores: TypeMap,
    pub(crate) relists: futures::channel::mpsc::UnboundedSender<&'static str>,
    /// Fingerprints of tenant objects, so that a change of status alone does not end a back-off.
    pub(crate) fingerprints: Arc<Mutex<HashMap<Key, String>>>,
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
        let stream = crate::relist::watch(Api::<S::Object>::all(self.tenant.clone()), config)
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
                        if failing && crate::relist::answered(&event) {
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
                        debug!(error = %crate::error::log_text(&e), watch = %what, "sync watch error; it lists again");
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
        let stages = self.reporter.stages.clone();
        let what = format!("watch of {} on the host", S::NAME);
        self.subscriptions.push(store.subscribe(Subscriber {
            namespace: self.namespace.clone(),
            tenant: self.tenant_name.clone(),
            changed: Box::new(move |obj: &S::Object| {
                if let Some(name) = &obj.meta().name {
                    stages.echoed(S::NAME, name);
                }
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
