//! One tenant's sync engine: watches on both sides fill caches and queue keys; workers converge
//! one key at a time, reading only the caches and writing only on difference.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    Binding, ConfigMap, Endpoints, Event as CoreEvent, Node, ObjectReference,
    PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions};
use kube::core::{Selector, SelectorExt};
use kube::runtime::events::{self, Event, EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tenantplane_api::SyncPolicySpec;
use tokio::sync::watch;
use tracing::{debug, warn};

use super::naming::{self, SYNCER_MANAGER};
use super::queue::WorkQueue;
use super::translate::{self, Translator};
use super::{Failure, Health, SyncerSpec};
use crate::apply::contains;
use crate::metrics::Metrics;

/// What a worker converges: one tenant object (namespace, name) of a kind, a node, a host Event
/// or a host class.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    Pod(String, String),
    Service(String, String),
    Endpoints(String, String),
    ConfigMap(String, String),
    Secret(String, String),
    Claim(String, String),
    ServiceAccount(String, String),
    Ingress(String, String),
    Node(String),
    HostEvent(String),
    StorageClass(String),
    IngressClass(String),
}

impl Key {
    /// The kind, as the metrics label it.
    fn kind(&self) -> &'static str {
        match self {
            Key::Pod(..) => "Pod",
            Key::Service(..) => "Service",
            Key::Endpoints(..) => "Endpoints",
            Key::ConfigMap(..) => "ConfigMap",
            Key::Secret(..) => "Secret",
            Key::Claim(..) => "PersistentVolumeClaim",
            Key::ServiceAccount(..) => "ServiceAccount",
            Key::Ingress(..) => "Ingress",
            Key::Node(_) => "Node",
            Key::HostEvent(_) => "Event",
            Key::StorageClass(_) => "StorageClass",
            Key::IngressClass(_) => "IngressClass",
        }
    }

    fn describe(&self) -> String {
        match self {
            Key::Pod(ns, n) => format!("Pod {ns}/{n}"),
            Key::Service(ns, n) => format!("Service {ns}/{n}"),
            Key::Endpoints(ns, n) => format!("Endpoints {ns}/{n}"),
            Key::ConfigMap(ns, n) => format!("ConfigMap {ns}/{n}"),
            Key::Secret(ns, n) => format!("Secret {ns}/{n}"),
            Key::Claim(ns, n) => format!("PersistentVolumeClaim {ns}/{n}"),
            Key::ServiceAccount(ns, n) => format!("ServiceAccount {ns}/{n}"),
            Key::Ingress(ns, n) => format!("Ingress {ns}/{n}"),
            Key::Node(n) => format!("Node {n}"),
            Key::HostEvent(n) => format!("host Event {n}"),
            Key::StorageClass(n) => format!("StorageClass {n}"),
            Key::IngressClass(n) => format!("IngressClass {n}"),
        }
    }
}

/// Workers per tenant: writes to two API servers overlap, one key never runs twice at once.
const WORKERS: usize = 32;
/// Everything is looked at again this often, whatever the watches said.
const RESYNC: Duration = Duration::from_secs(300);
/// A host refusal does not go away by itself; look again at this pace.
const REJECTED_RETRY: Duration = Duration::from_secs(60);

/// Why one key failed.
#[derive(Debug)]
struct KeyError {
    reason: &'static str,
    message: String,
    retry: Option<Duration>,
}

impl From<kube::Error> for KeyError {
    fn from(e: kube::Error) -> Self {
        KeyError {
            reason: "SyncFailed",
            message: e.to_string(),
            retry: None,
        }
    }
}

type KeyResult = Result<(), KeyError>;

/// Caches of one side.
struct Side {
    pods: Store<Pod>,
    services: Store<Service>,
    endpoints: Store<Endpoints>,
    config_maps: Store<ConfigMap>,
    secrets: Store<Secret>,
    claims: Store<PersistentVolumeClaim>,
    service_accounts: Option<Store<ServiceAccount>>,
    ingresses: Option<Store<Ingress>>,
    nodes: Option<Store<Node>>,
}

/// Host-only caches.
struct HostExtra {
    events: Option<Store<CoreEvent>>,
    storage_classes: Option<Store<StorageClass>>,
    ingress_classes: Option<Store<IngressClass>>,
}

/// Tenant-only caches of what the syncer shows there.
struct TenantExtra {
    storage_classes: Option<Store<StorageClass>>,
    ingress_classes: Option<Store<IngressClass>>,
    events: Store<CoreEvent>,
}

struct Selectors {
    pods: Option<Selector>,
    services: Option<Selector>,
    endpoints: Option<Selector>,
    config_maps: Option<Selector>,
    secrets: Option<Selector>,
    claims: Option<Selector>,
    service_accounts: Option<Selector>,
    ingresses: Option<Selector>,
}

fn selector(
    what: &str,
    s: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
) -> Result<Option<Selector>, String> {
    s.clone()
        .map(Selector::try_from)
        .transpose()
        .map_err(|e| format!("the SyncPolicy's toHost.{what}.selector is invalid: {e}"))
}

fn matches(s: &Option<Selector>, meta: &ObjectMeta) -> bool {
    match s {
        None => true,
        Some(s) => s.matches(meta.labels.as_ref().unwrap_or(&BTreeMap::new())),
    }
}

struct Engine {
    tr: Translator,
    policy: SyncPolicySpec,
    selectors: Selectors,
    tenant: Client,
    host: Client,
    t: Side,
    h: Side,
    tx: TenantExtra,
    hx: HostExtra,
    queue: Arc<WorkQueue<Key>>,
    recorder: Recorder,
    reporter: Verdicts,
    failures: Mutex<HashMap<Key, u32>>,
    /// Tenant pods already told (by Event) why the host refused them, with what message.
    told: Mutex<HashMap<String, String>>,
    /// When each host pod's token Secret is due to be minted again, once a pass is scheduled.
    refresh_scheduled: Mutex<HashMap<String, Timestamp>>,
}

/// Run the tenant's engine; when it stops (a panic, a bad policy) restart it after a growing
/// back-off, reporting why in the health the controller reads.
pub async fn supervise(
    spec: SyncerSpec,
    tenant: Client,
    host: Client,
    health: watch::Sender<Health>,
    notify: impl Fn() + Send + Sync + 'static,
    metrics: Arc<Metrics>,
    stop: watch::Receiver<bool>,
) {
    let reporter = Verdicts {
        health: Arc::new(health),
        notify: Arc::new(notify),
        policy: spec.policy.clone(),
        metrics,
    };
    let mut backoff = Duration::from_secs(1);
    loop {
        // The engine runs in its own task so that a panic is caught here; the guard stops it
        // when this task is aborted (the syncer stopped or replaced).
        let mut engine = AbortOnDrop(tokio::spawn(run(
            spec.clone(),
            tenant.clone(),
            host.clone(),
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

/// How long a tenant watch runs before the API server ends it and it is renewed. Shorter than
/// the watch client's read timeout, so a quiet watch is never cut by the client, while a request
/// that hangs (an API server coming back) fails and is retried.
const TENANT_WATCH_SECONDS: u32 = 50;

fn tenant_watch_config() -> watcher::Config {
    watcher::Config::default().timeout(TENANT_WATCH_SECONDS)
}

/// Aborts the task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Where the engine reports failures, and how it tells the controller its verdict changed.
#[derive(Clone)]
struct Verdicts {
    health: Arc<watch::Sender<Health>>,
    notify: Arc<dyn Fn() + Send + Sync>,
    policy: SyncPolicySpec,
    metrics: Arc<Metrics>,
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
}

/// A reflector over `api` whose every touched object becomes keys on `queue`.
fn watch_into<K, F>(
    api: Api<K>,
    config: watcher::Config,
    keys: F,
    queue: &Arc<WorkQueue<Key>>,
    tasks: &mut Watches,
) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    F: Fn(&K) -> Vec<Key> + Send + 'static,
{
    let (reader, writer) = reflector::store();
    let queue = queue.clone();
    let stream = watcher(api, config).default_backoff().reflect(writer);
    let what = format!("watch of {} on the {}", K::kind(&()), tasks.side);
    let reporter = tasks.reporter.clone();
    tasks
        .futures
        .push(Box::pin(drain(stream, what, reporter, move |obj: K| {
            for k in keys(&obj) {
                queue.add(k);
            }
        })));
    reader
}

/// The watch tasks of one engine, and which side is being set up.
struct Watches {
    futures: Vec<std::pin::Pin<Box<dyn futures::Future<Output = ()> + Send>>>,
    side: &'static str,
    reporter: Verdicts,
}

/// Feed a watch's objects to `each`; a failing watch (it retries by itself) is reported until it
/// works again, so `Synced` names it instead of waiting silently.
async fn drain<K>(
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
    what: String,
    reporter: Verdicts,
    mut each: impl FnMut(K) + Send,
) {
    let mut stream = std::pin::pin!(stream);
    let mut failing = false;
    while let Some(item) = stream.next().await {
        match item {
            Ok(event) => {
                // Any answer, even an empty list after a reconnect, means the watch works again.
                if failing {
                    failing = false;
                    reporter.set_error(&what, None);
                }
                match event {
                    watcher::Event::Apply(o)
                    | watcher::Event::Delete(o)
                    | watcher::Event::InitApply(o) => each(o),
                    watcher::Event::Init | watcher::Event::InitDone => {}
                }
            }
            Err(e) => {
                debug!(error = %e, watch = %what, "sync watch error; the watcher retries");
                failing = true;
                reporter.set_error(
                    &what,
                    Some(Failure {
                        reason: super::WATCH_FAILED,
                        message: format!("the {what} fails (retrying): {e}"),
                    }),
                );
            }
        }
    }
}

fn ns_name<K: Resource>(k: &K) -> (String, String) {
    (
        k.meta().namespace.clone().unwrap_or_default(),
        k.meta().name.clone().unwrap_or_default(),
    )
}

async fn run(
    spec: SyncerSpec,
    tenant: Client,
    host: Client,
    reporter: Verdicts,
    stop: watch::Receiver<bool>,
) -> Result<(), String> {
    let stopped = || {
        let mut stop = stop.clone();
        async move {
            let _ = stop.wait_for(|s| *s).await;
        }
    };
    // Failures of an earlier run name objects that may be gone; this run finds them again.
    reporter.health.send_modify(|h| h.errors.clear());
    let policy = spec.policy.clone();
    let to = &policy.to_host;
    let from = &policy.from_host;
    let selectors = Selectors {
        pods: selector("pods", &to.pods.selector)?,
        services: selector("services", &to.services.selector)?,
        endpoints: selector("endpoints", &to.endpoints.selector)?,
        config_maps: selector("configMaps", &to.config_maps.selector)?,
        secrets: selector("secrets", &to.secrets.selector)?,
        claims: selector(
            "persistentVolumeClaims",
            &to.persistent_volume_claims.selector,
        )?,
        service_accounts: selector("serviceAccounts", &to.service_accounts.selector)?,
        ingresses: selector("ingresses", &to.ingresses.selector)?,
    };
    let queue = WorkQueue::new();
    let mut tasks = Watches {
        futures: Vec::new(),
        side: "tenant",
        reporter: reporter.clone(),
    };
    let hns = spec.host_namespace.clone();
    let tenant_name = spec.tenant.clone();
    let owned = watcher::Config::default().labels(&naming::synced_selector(&spec.tenant));

    // Tenant side: every namespace.
    macro_rules! tenant_watch {
        ($kind:ty, $key:ident) => {
            watch_into(
                Api::<$kind>::all(tenant.clone()),
                tenant_watch_config(),
                |o: &$kind| {
                    let (ns, n) = ns_name(o);
                    vec![Key::$key(ns, n)]
                },
                &queue,
                &mut tasks,
            )
        };
    }
    let t_pods = watch_into(
        Api::<Pod>::all(tenant.clone()),
        tenant_watch_config(),
        |p: &Pod| {
            let (ns, name) = ns_name(p);
            let r = translate::references(p);
            let mut keys = vec![Key::Pod(ns.clone(), name)];
            keys.extend(
                r.config_maps
                    .into_iter()
                    .map(|c| Key::ConfigMap(ns.clone(), c)),
            );
            keys.extend(r.secrets.into_iter().map(|s| Key::Secret(ns.clone(), s)));
            keys.extend(r.claims.into_iter().map(|c| Key::Claim(ns.clone(), c)));
            if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                keys.push(Key::Node(node));
            }
            keys
        },
        &queue,
        &mut tasks,
    );
    let t_services = watch_into(
        Api::<Service>::all(tenant.clone()),
        tenant_watch_config(),
        |s: &Service| {
            let (ns, n) = ns_name(s);
            vec![Key::Service(ns.clone(), n.clone()), Key::Endpoints(ns, n)]
        },
        &queue,
        &mut tasks,
    );
    let t_endpoints = tenant_watch!(Endpoints, Endpoints);
    let t_config_maps = tenant_watch!(ConfigMap, ConfigMap);
    let t_secrets = tenant_watch!(Secret, Secret);
    let t_claims = tenant_watch!(PersistentVolumeClaim, Claim);
    let t_service_accounts = to
        .service_accounts
        .enabled
        .then(|| tenant_watch!(ServiceAccount, ServiceAccount));
    let t_ingresses = to.ingresses.enabled.then(|| {
        watch_into(
            Api::<Ingress>::all(tenant.clone()),
            tenant_watch_config(),
            |i: &Ingress| {
                let (ns, n) = ns_name(i);
                let tls = i.spec.iter().flat_map(|s| s.tls.iter().flatten());
                let mut keys: Vec<Key> = tls
                    .filter_map(|t| t.secret_name.clone())
                    .map(|s| Key::Secret(ns.clone(), s))
                    .collect();
                keys.push(Key::Ingress(ns, n));
                keys
            },
            &queue,
            &mut tasks,
        )
    });
    // What the syncer shows in the tenant (it carries our label): always watched, so objects left
    // from an earlier policy are removed.
    macro_rules! shown_watch {
        ($kind:ty, $keys:expr) => {
            watch_into(
                Api::<$kind>::all(tenant.clone()),
                tenant_watch_config().labels(naming::LABEL_SYNCED_FROM),
                $keys,
                &queue,
                &mut tasks,
            )
        };
    }
    let t_nodes = shown_watch!(Node, |n: &Node| vec![Key::Node(n.name_any())]);
    let t_events = shown_watch!(CoreEvent, |_: &CoreEvent| vec![]);
    let t_storage_classes = shown_watch!(StorageClass, |s: &StorageClass| vec![Key::StorageClass(
        s.name_any()
    )]);
    let t_ingress_classes = shown_watch!(IngressClass, |s: &IngressClass| vec![Key::IngressClass(
        s.name_any()
    )]);

    // Host side: the tenant's namespace, only what was synced from this tenant.
    tasks.side = "host";
    let back = {
        let tenant_name = tenant_name.clone();
        move |meta: &ObjectMeta| naming::virtual_of(meta, &tenant_name)
    };
    macro_rules! host_watch {
        ($kind:ty, $key:ident) => {{
            let back = back.clone();
            watch_into(
                Api::<$kind>::namespaced(host.clone(), &hns),
                owned.clone(),
                move |o: &$kind| {
                    back(o.meta())
                        .map(|v| vec![Key::$key(v.namespace, v.name)])
                        .unwrap_or_default()
                },
                &queue,
                &mut tasks,
            )
        }};
    }
    let h_pods = {
        let back = back.clone();
        watch_into(
            Api::<Pod>::namespaced(host.clone(), &hns),
            owned.clone(),
            move |p: &Pod| {
                let mut keys: Vec<Key> = back(&p.metadata)
                    .map(|v| vec![Key::Pod(v.namespace, v.name)])
                    .unwrap_or_default();
                if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                    keys.push(Key::Node(node));
                }
                keys
            },
            &queue,
            &mut tasks,
        )
    };
    let h_services = host_watch!(Service, Service);
    let h_endpoints = host_watch!(Endpoints, Endpoints);
    let h_config_maps = host_watch!(ConfigMap, ConfigMap);
    let h_secrets = {
        let back = back.clone();
        watch_into(
            Api::<Secret>::namespaced(host.clone(), &hns),
            owned.clone(),
            move |s: &Secret| {
                let is_token = s
                    .annotations()
                    .contains_key(naming::ANNOTATION_TOKEN_REFRESH);
                back(&s.metadata)
                    .map(|v| {
                        vec![if is_token {
                            Key::Pod(v.namespace, v.name)
                        } else {
                            Key::Secret(v.namespace, v.name)
                        }]
                    })
                    .unwrap_or_default()
            },
            &queue,
            &mut tasks,
        )
    };
    let h_claims = host_watch!(PersistentVolumeClaim, Claim);
    let h_service_accounts = Some(host_watch!(ServiceAccount, ServiceAccount));
    let h_ingresses = Some(host_watch!(Ingress, Ingress));
    // Host objects shown in the tenant, watched only while the policy shows them.
    macro_rules! shown_from_host {
        ($enabled:expr, $api:expr, $keys:expr) => {
            $enabled
                .then(|| watch_into($api, watcher::Config::default(), $keys, &queue, &mut tasks))
        };
    }
    let h_nodes = shown_from_host!(
        from.nodes.enabled,
        Api::<Node>::all(host.clone()),
        |n: &Node| vec![Key::Node(n.name_any())]
    );
    let h_events = shown_from_host!(
        from.events.enabled,
        Api::<CoreEvent>::namespaced(host.clone(), &hns),
        |e: &CoreEvent| vec![Key::HostEvent(e.name_any())]
    );
    let h_storage_classes = shown_from_host!(
        from.storage_classes.enabled,
        Api::<StorageClass>::all(host.clone()),
        |s: &StorageClass| vec![Key::StorageClass(s.name_any())]
    );
    let h_ingress_classes = shown_from_host!(
        from.ingress_classes.enabled,
        Api::<IngressClass>::all(host.clone()),
        |s: &IngressClass| vec![Key::IngressClass(s.name_any())]
    );

    let engine = Arc::new(Engine {
        tr: Translator {
            tenant: spec.tenant.clone(),
            host_namespace: hns.clone(),
            owner: spec.owner.clone(),
            api_ip: spec.api_ip.clone(),
            node_selector: spec.profile.node_selector.clone(),
            tolerations: spec.profile.tolerations.clone(),
        },
        policy: policy.clone(),
        selectors,
        recorder: Recorder::new(
            tenant.clone(),
            events::Reporter {
                controller: SYNCER_MANAGER.into(),
                instance: None,
            },
        ),
        tenant,
        host,
        t: Side {
            pods: t_pods,
            services: t_services,
            endpoints: t_endpoints,
            config_maps: t_config_maps,
            secrets: t_secrets,
            claims: t_claims,
            service_accounts: t_service_accounts,
            ingresses: t_ingresses,
            nodes: Some(t_nodes),
        },
        h: Side {
            pods: h_pods,
            services: h_services,
            endpoints: h_endpoints,
            config_maps: h_config_maps,
            secrets: h_secrets,
            claims: h_claims,
            service_accounts: h_service_accounts,
            ingresses: h_ingresses,
            nodes: h_nodes,
        },
        tx: TenantExtra {
            storage_classes: Some(t_storage_classes),
            ingress_classes: Some(t_ingress_classes),
            events: t_events,
        },
        hx: HostExtra {
            events: h_events,
            storage_classes: h_storage_classes,
            ingress_classes: h_ingress_classes,
        },
        queue: queue.clone(),
        reporter,
        failures: Mutex::new(HashMap::new()),
        told: Mutex::new(HashMap::new()),
        refresh_scheduled: Mutex::new(HashMap::new()),
    });

    let watches = futures::future::join_all(tasks.futures);
    let start = {
        let engine = engine.clone();
        async move {
            tokio::select! {
                () = engine.wait_ready() => {}
                () = stopped() => return,
            }
            engine.reporter.health.send_modify(|h| {
                h.ready = true;
                h.crashed = None;
            });
            (engine.reporter.notify)();
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
                loop {
                    tokio::time::sleep(RESYNC).await;
                    engine.enqueue_everything();
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

impl Engine {
    async fn wait_ready(&self) {
        let _ = futures::join!(
            self.t.pods.wait_until_ready(),
            self.t.services.wait_until_ready(),
            self.t.endpoints.wait_until_ready(),
            self.t.config_maps.wait_until_ready(),
            self.t.secrets.wait_until_ready(),
            self.t.claims.wait_until_ready(),
            self.h.pods.wait_until_ready(),
            self.h.services.wait_until_ready(),
            self.h.endpoints.wait_until_ready(),
            self.h.config_maps.wait_until_ready(),
            self.h.secrets.wait_until_ready(),
            self.h.claims.wait_until_ready(),
            self.tx.events.wait_until_ready(),
        );
        for store in [&self.t.nodes, &self.h.nodes].into_iter().flatten() {
            let _ = store.wait_until_ready().await;
        }
        for store in [&self.t.service_accounts, &self.h.service_accounts]
            .into_iter()
            .flatten()
        {
            let _ = store.wait_until_ready().await;
        }
        for store in [&self.t.ingresses, &self.h.ingresses].into_iter().flatten() {
            let _ = store.wait_until_ready().await;
        }
        if let Some(s) = &self.hx.events {
            let _ = s.wait_until_ready().await;
        }
        for s in [&self.tx.storage_classes, &self.hx.storage_classes]
            .into_iter()
            .flatten()
        {
            let _ = s.wait_until_ready().await;
        }
        for s in [&self.tx.ingress_classes, &self.hx.ingress_classes]
            .into_iter()
            .flatten()
        {
            let _ = s.wait_until_ready().await;
        }
    }

    /// Queue every object either side knows about (the periodic resync).
    fn enqueue_everything(&self) {
        let q = &self.queue;
        let pairs = |store: &Store<Pod>| store.state();
        for p in pairs(&self.t.pods) {
            let (ns, n) = ns_name(&*p);
            q.add(Key::Pod(ns, n));
        }
        for p in self.h.pods.state() {
            if let Some(v) = naming::virtual_of(&p.metadata, &self.tr.tenant) {
                q.add(Key::Pod(v.namespace, v.name));
            }
        }
        macro_rules! both {
            ($t:expr, $h:expr, $key:ident) => {
                for o in $t.state() {
                    let (ns, n) = ns_name(&*o);
                    q.add(Key::$key(ns, n));
                }
                for o in $h.state() {
                    if let Some(v) = naming::virtual_of(o.meta(), &self.tr.tenant) {
                        q.add(Key::$key(v.namespace, v.name));
                    }
                }
            };
        }
        both!(self.t.services, self.h.services, Service);
        both!(self.t.endpoints, self.h.endpoints, Endpoints);
        both!(self.t.config_maps, self.h.config_maps, ConfigMap);
        both!(self.t.secrets, self.h.secrets, Secret);
        both!(self.t.claims, self.h.claims, Claim);
        for n in self.t.nodes.iter().flat_map(|s| s.state()) {
            q.add(Key::Node(n.name_any()));
        }
    }

    /// Converge one key, queued at `since` (the sync lag is measured from there).
    async fn work(&self, key: &Key, since: Instant) {
        let result = match key {
            Key::Pod(ns, n) => self.sync_pod(ns, n).await,
            Key::Service(ns, n) => self.sync_service(ns, n).await,
            Key::Endpoints(ns, n) => self.sync_endpoints(ns, n).await,
            Key::ConfigMap(ns, n) => self.sync_config_map(ns, n).await,
            Key::Secret(ns, n) => self.sync_secret(ns, n).await,
            Key::Claim(ns, n) => self.sync_claim(ns, n).await,
            Key::ServiceAccount(ns, n) => self.sync_service_account(ns, n).await,
            Key::Ingress(ns, n) => self.sync_ingress(ns, n).await,
            Key::Node(n) => self.sync_node(n).await,
            Key::HostEvent(n) => self.sync_event(n).await,
            Key::StorageClass(n) => self.sync_storage_class(n).await,
            Key::IngressClass(n) => self.sync_ingress_class(n).await,
        };
        let description = key.describe();
        let metrics = &self.reporter.metrics;
        let (ns, tenant) = (&self.tr.host_namespace, &self.tr.tenant);
        match &result {
            Ok(()) => metrics.synced(ns, tenant, key.kind(), since.elapsed()),
            Err(e) => metrics.sync_failed(ns, tenant, key.kind(), e.reason),
        }
        match result {
            Ok(()) => {
                self.failures
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(key);
                self.set_error(&description, None);
            }
            Err(e) => {
                let attempts = {
                    let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
                    let n = f.entry(key.clone()).or_insert(0);
                    *n += 1;
                    *n
                };
                let delay = e.retry.unwrap_or_else(|| {
                    Duration::from_millis(250 * 2u64.pow(attempts.min(8)))
                        .min(Duration::from_secs(60))
                });
                debug!(key = %description, error = %e.message, "sync failed; retrying in {delay:?}");
                self.set_error(
                    &description,
                    Some(Failure {
                        reason: e.reason,
                        message: format!("{description}: {}", e.message),
                    }),
                );
                self.queue.add_after(key.clone(), delay);
            }
        }
    }

    fn set_error(&self, what: &str, failure: Option<Failure>) {
        self.reporter.set_error(what, failure);
    }

    fn host_pods(&self) -> Api<Pod> {
        Api::namespaced(self.host.clone(), &self.tr.host_namespace)
    }

    /// The host copy of tenant object `ns/name` in `store`, if there is one and it is ours.
    fn host_copy<K>(&self, store: &Store<K>, ns: &str, name: &str) -> Option<Arc<K>>
    where
        K: Resource<DynamicType = ()> + Clone,
    {
        let host_name = self.tr.host_name(ns, name);
        store
            .get(&ObjectRef::new(&host_name).within(&self.tr.host_namespace))
            .filter(|o| {
                naming::virtual_of(o.meta(), &self.tr.tenant)
                    .is_some_and(|v| v.namespace == ns && v.name == name)
            })
    }

    // ---- pods ------------------------------------------------------------------------------

    async fn sync_pod(&self, ns: &str, name: &str) -> KeyResult {
        let t = self
            .t
            .pods
            .get(&ObjectRef::new(name).within(ns))
            .filter(|_| self.policy.to_host.pods.enabled);
        let h = self.host_copy(&self.h.pods, ns, name);
        let Some(t) = t else {
            // Gone from the tenant (or pods not synced): the copy goes too.
            if let Some(h) = h {
                self.forget_pod(&h);
                delete_if_present(&self.host_pods(), &h, None).await?;
            }
            return Ok(());
        };
        if !matches(&self.selectors.pods, &t.metadata) {
            if let Some(h) = h {
                delete_if_present(&self.host_pods(), &h, None).await?;
            }
            return Ok(());
        }
        let t_uid = t.uid().unwrap_or_default();
        // A copy of an earlier tenant pod of the same name (StatefulSets reuse names). A copy
        // whose uid mark was removed by hand is not taken for one: its marks are put back.
        if let Some(h) = &h
            && naming::virtual_of(&h.metadata, &self.tr.tenant)
                .is_some_and(|v| !v.uid.is_empty() && v.uid != t_uid)
        {
            if h.metadata.deletion_timestamp.is_none() {
                delete_if_present(&self.host_pods(), h, None).await?;
            }
            return Ok(());
        }
        let tenant_pods: Api<Pod> = Api::namespaced(self.tenant.clone(), ns);
        let bound = t.spec.as_ref().and_then(|s| s.node_name.clone());
        // The copy ran (its status came back), so a missing copy was deleted, not yet made.
        let ran = t
            .status
            .as_ref()
            .is_some_and(|s| s.host_ip.is_some() || s.start_time.is_some());
        if t.metadata.deletion_timestamp.is_some() {
            match &h {
                Some(h) if h.metadata.deletion_timestamp.is_none() => {
                    let grace = t.metadata.deletion_grace_period_seconds.map(|g| g as u32);
                    delete_if_present(&self.host_pods(), h, grace).await?;
                }
                Some(_) => {}
                None => {
                    // The host copy is gone: the tenant pod can go, as a kubelet would confirm.
                    self.told
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&t_uid);
                    delete_if_present(&tenant_pods, &t, Some(0)).await?;
                }
            }
            return Ok(());
        }
        let Some(h) = h else {
            if ran {
                // The copy was deleted on the host: the pod is gone, as on a node that lost it;
                // its controller in the tenant makes a new one.
                delete_if_present(&tenant_pods, &t, Some(0)).await?;
                return Ok(());
            }
            return self.create_host_pod(&t).await;
        };
        self.restore_pod(&t, &h).await?;
        self.ensure_tokens(&t, &h).await?;
        if h.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let host_node = h.spec.as_ref().and_then(|s| s.node_name.clone());
        // Bound only to a virtual node that exists: the tenant's pod garbage collector deletes pods
        // bound to missing nodes. Without virtual nodes the tenant pod stays unbound.
        let node_ready = match (&bound, &host_node) {
            (None, Some(node)) if self.policy.from_host.nodes.enabled => {
                let exists = self.ensure_virtual_node(node).await?;
                if !exists {
                    // The host node is not in the cache yet; bind on the next look.
                    self.queue
                        .add_after(Key::Pod(ns.into(), name.into()), Duration::from_secs(1));
                }
                exists
            }
            _ => false,
        };
        if let (true, Some(node)) = (node_ready, &host_node) {
            let binding = Binding {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some(ns.to_string()),
                    uid: t.uid(),
                    ..Default::default()
                },
                target: ObjectReference {
                    kind: Some("Node".into()),
                    api_version: Some("v1".into()),
                    name: Some(node.clone()),
                    ..Default::default()
                },
            };
            match tenant_pods
                .create_subresource::<_, serde_json::Value>(
                    "binding",
                    name,
                    &PostParams::default(),
                    &binding,
                )
                .await
            {
                Ok(_) => {}
                // Bound meanwhile (our own earlier write, not yet in the cache).
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        let wanted = translate::pod_status_up(&h);
        if h.status.is_some() && translate::pod_status_differs(t.status.as_ref(), &wanted) {
            tenant_pods
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"uid": t_uid}, "status": wanted})),
                )
                .await?;
        }
        self.told
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&t_uid);
        Ok(())
    }

    /// Drop what the engine remembers about a pod whose copy goes.
    fn forget_pod(&self, h: &Pod) {
        if let Some(uid) = h.uid() {
            self.refresh_scheduled
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&uid);
        }
        if let Some(v) = naming::virtual_of(&h.metadata, &self.tr.tenant) {
            self.told
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&v.uid);
        }
    }

    fn tenant_dns(&self) -> Option<String> {
        self.t
            .services
            .get(&ObjectRef::new("kube-dns").within("kube-system"))
            .and_then(|s| s.spec.as_ref()?.cluster_ip.clone())
            .filter(|ip| ip != "None" && !ip.is_empty())
    }

    async fn create_host_pod(&self, t: &Pod) -> KeyResult {
        let ns = t.namespace().unwrap_or_default();
        let services: Vec<Arc<Service>> = self
            .t
            .services
            .state()
            .into_iter()
            .filter(|s| s.namespace().as_deref() == Some(ns.as_str()))
            // The tenant API server's own Service: pods get the variables that reach it.
            .filter(|s| !(ns == "default" && s.name_any() == "kubernetes"))
            .collect();
        let service_refs: Vec<&Service> = services.iter().map(|s| &**s).collect();
        let desired = self.tr.pod(t, &service_refs, self.tenant_dns().as_deref());
        let pp = PostParams {
            field_manager: Some(SYNCER_MANAGER.into()),
            ..Default::default()
        };
        match self.host_pods().create(&pp, &desired).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                self.name_taken(&self.host_pods(), &desired).await
            }
            Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => {
                let message = format!("the host refused it: {}", e.message);
                self.tell_rejected(t, &message).await;
                Err(KeyError {
                    reason: "HostRejected",
                    message,
                    retry: Some(REJECTED_RETRY),
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Tell the tenant why its pod does not run: an Event on the pod and its `PodScheduled`
    /// condition, once per distinct reason.
    async fn tell_rejected(&self, t: &Pod, message: &str) {
        let uid = t.uid().unwrap_or_default();
        {
            let mut told = self.told.lock().unwrap_or_else(|e| e.into_inner());
            if told.get(&uid).map(String::as_str) == Some(message) {
                return;
            }
            told.insert(uid.clone(), message.to_string());
        }
        let event = Event {
            type_: EventType::Warning,
            reason: "HostRejected".into(),
            note: Some(message.chars().take(1000).collect()),
            action: "Sync".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &t.object_ref(&())).await {
            warn!(error = %e, "publishing an event in the tenant failed");
        }
        let api: Api<Pod> =
            Api::namespaced(self.tenant.clone(), &t.namespace().unwrap_or_default());
        let patch = json!({
            "metadata": {"uid": uid},
            "status": {"conditions": [{
                "type": "PodScheduled",
                "status": "False",
                "reason": "HostRejected",
                "message": message,
                "lastTransitionTime": Timestamp::now().to_string(),
            }]}
        });
        if let Err(e) = api
            .patch_status(
                &t.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(patch),
            )
            .await
        {
            warn!(error = %e, "marking a rejected tenant pod failed");
        }
    }

    /// Put back what a hand edit on the host changed: labels, our annotations, images.
    async fn restore_pod(&self, t: &Pod, h: &Pod) -> KeyResult {
        if h.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let desired_meta = self.tr.host_meta(&t.metadata);
        let want_labels = desired_meta.labels.clone().unwrap_or_default();
        let live_labels = h.metadata.labels.clone().unwrap_or_default();
        let want_annotations = desired_meta.annotations.clone().unwrap_or_default();
        let live_annotations = h.metadata.annotations.clone().unwrap_or_default();
        let images = |p: &Pod| -> Vec<(String, Option<String>)> {
            p.spec
                .iter()
                .flat_map(|s| s.containers.iter())
                .map(|c| (c.name.clone(), c.image.clone()))
                .collect()
        };
        // Labels others add on the host (webhooks) stay; ours are put back.
        let labels_ok = want_labels
            .iter()
            .all(|(k, v)| live_labels.get(k) == Some(v));
        let annotations_ok = want_annotations
            .iter()
            .all(|(k, v)| live_annotations.get(k) == Some(v));
        let images_ok = images(t) == images(h);
        if labels_ok && annotations_ok && images_ok {
            return Ok(());
        }
        let containers: Vec<_> = images(t)
            .into_iter()
            .map(|(name, image)| json!({"name": name, "image": image}))
            .collect();
        let patch = json!({
            "metadata": {"labels": want_labels, "annotations": want_annotations, "uid": h.uid()},
            "spec": {"containers": containers},
        });
        self.host_pods()
            .patch(
                &h.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(patch),
            )
            .await?;
        Ok(())
    }

    /// Keep the host Secret with the pod's tenant service-account tokens, minted by TokenRequest
    /// on the tenant API and owned by the host pod, fresh.
    async fn ensure_tokens(&self, t: &Pod, h: &Pod) -> KeyResult {
        let sources = translate::token_sources(t);
        if sources.is_empty() || h.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let host_name = h.name_any();
        let secret_name = translate::token_secret_name(&host_name);
        let h_uid = h.uid().unwrap_or_default();
        let now = Timestamp::now();
        let existing = self
            .h
            .secrets
            .get(&ObjectRef::new(&secret_name).within(&self.tr.host_namespace));
        let refresh_at = existing
            .as_ref()
            .filter(|s| s.owner_references().iter().any(|o| o.uid == h_uid))
            .and_then(|s| {
                s.annotations()
                    .get(naming::ANNOTATION_TOKEN_REFRESH)
                    .cloned()
            })
            .and_then(|t| t.parse::<Timestamp>().ok());
        if let Some(at) = refresh_at
            && at > now
        {
            self.schedule_refresh(t, &h_uid, at, now);
            return Ok(());
        }
        let ns = t.namespace().unwrap_or_default();
        let sa = t
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let accounts: Api<ServiceAccount> = Api::namespaced(self.tenant.clone(), &ns);
        let mut data = BTreeMap::new();
        let mut lifetime = i64::MAX;
        for source in &sources {
            let request = TokenRequest {
                metadata: ObjectMeta::default(),
                spec: TokenRequestSpec {
                    audiences: source.audience.clone().into_iter().collect(),
                    expiration_seconds: Some(source.expiration_seconds),
                    bound_object_ref: Some(BoundObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Pod".into()),
                        name: Some(t.name_any()),
                        uid: t.uid(),
                    }),
                },
                status: None,
            };
            let issued = accounts
                .create_token_request(&sa, &PostParams::default(), &request)
                .await?;
            let status = issued.status.ok_or_else(|| KeyError {
                reason: "TokenRequestFailed",
                message: format!("the tenant API returned no token for ServiceAccount {ns}/{sa}"),
                retry: None,
            })?;
            let seconds = status.expiration_timestamp.0.duration_since(now).as_secs();
            lifetime = lifetime.min(seconds.max(60));
            data.insert(
                source.key.clone(),
                k8s_openapi::ByteString(status.token.into_bytes()),
            );
        }
        // Minted again at 80% of the shortest lifetime, as the kubelet does.
        let at = now
            .checked_add(Duration::from_secs((lifetime as u64) * 4 / 5))
            .unwrap_or(now);
        let mut meta = self.tr.host_meta(&t.metadata);
        meta.name = Some(secret_name.clone());
        meta.annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(naming::ANNOTATION_TOKEN_REFRESH.into(), at.to_string());
        meta.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: host_name,
                uid: h_uid.clone(),
                controller: Some(true),
                block_owner_deletion: None,
            },
        ]);
        let secret = Secret {
            metadata: meta,
            data: Some(data),
            type_: Some("Opaque".into()),
            ..Default::default()
        };
        let secrets: Api<Secret> = Api::namespaced(self.host.clone(), &self.tr.host_namespace);
        secrets
            .patch(
                &secret_name,
                &PatchParams::apply(SYNCER_MANAGER).force(),
                &Patch::Apply(&secret),
            )
            .await?;
        self.schedule_refresh(t, &h_uid, at, now);
        Ok(())
    }

    fn schedule_refresh(&self, t: &Pod, h_uid: &str, at: Timestamp, now: Timestamp) {
        let fresh = self
            .refresh_scheduled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(h_uid.to_string(), at)
            != Some(at);
        if fresh {
            // Rounded up, so that the pass finds the token due rather than a moment early.
            let wait = at.duration_since(now).as_secs().max(0) as u64 + 1;
            let (ns, n) = ns_name(t);
            self.queue
                .add_after(Key::Pod(ns, n), Duration::from_secs(wait));
        }
    }

    // ---- nodes -----------------------------------------------------------------------------

    /// Make the tenant Node for host node `name` exist and show the host's state; `false` when
    /// the host node is not known (yet).
    async fn ensure_virtual_node(&self, name: &str) -> Result<bool, KeyError> {
        let Some(host) = self
            .h
            .nodes
            .as_ref()
            .and_then(|s| s.get(&ObjectRef::new(name)))
        else {
            return Ok(false);
        };
        let wanted = translate::virtual_node(&host, &self.tr.tenant);
        let nodes: Api<Node> = Api::all(self.tenant.clone());
        let current = self
            .t
            .nodes
            .as_ref()
            .and_then(|s| s.get(&ObjectRef::new(name)));
        match current {
            None => match nodes
                .create(
                    &PostParams {
                        field_manager: Some(SYNCER_MANAGER.into()),
                        ..Default::default()
                    },
                    &wanted,
                )
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            },
            Some(current) if !translate::node_differs(&current, &wanted) => return Ok(true),
            Some(_) => {}
        }
        // Status is a subresource: written separately, also right after creation. A node the
        // cache still shows but that is gone (deleted a moment ago) is created again.
        let labels = json!({"metadata": {"labels": wanted.metadata.labels}});
        match nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(labels))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {
                nodes
                    .create(
                        &PostParams {
                            field_manager: Some(SYNCER_MANAGER.into()),
                            ..Default::default()
                        },
                        &wanted,
                    )
                    .await?;
            }
            Err(e) => return Err(e.into()),
        }
        nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": wanted.status})),
            )
            .await?;
        Ok(true)
    }

    async fn sync_node(&self, name: &str) -> KeyResult {
        // In use: a tenant pod is bound to it (whatever the policy says now: the tenant deletes
        // pods bound to missing nodes), or a copy runs there whose tenant pod is about to be.
        let on_node = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name);
        let bound_here = self.t.pods.state().iter().any(|p| on_node(p));
        let in_use = bound_here
            || (self.policy.from_host.nodes.enabled
                && self.h.pods.state().iter().any(|p| {
                    on_node(p) && naming::virtual_of(&p.metadata, &self.tr.tenant).is_some()
                }));
        let host_exists = self
            .h
            .nodes
            .as_ref()
            .is_some_and(|s| s.get(&ObjectRef::new(name)).is_some());
        let current = self
            .t
            .nodes
            .as_ref()
            .and_then(|s| s.get(&ObjectRef::new(name)));
        if in_use && host_exists {
            return self.ensure_virtual_node(name).await.map(|_| ());
        }
        if let Some(node) = current
            && node.labels().get(naming::LABEL_SYNCED_FROM) == Some(&self.tr.tenant)
            && !in_use
        {
            let nodes: Api<Node> = Api::all(self.tenant.clone());
            delete_if_present(&nodes, &node, None).await?;
        }
        Ok(())
    }

    // ---- services and endpoints ------------------------------------------------------------

    /// Give tenant Service `t` the cluster IP `ip` (delete and create: the field is immutable).
    /// `false` when there was nothing to do: it has the IP, is headless, or someone holds it with
    /// a finalizer.
    async fn take_cluster_ip(
        &self,
        t: &Service,
        ip: &str,
        ips: Option<Vec<String>>,
    ) -> Result<bool, KeyError> {
        let (ns, name) = ns_name(t);
        let t_ip = t.spec.as_ref().and_then(|s| s.cluster_ip.as_deref());
        if t_ip == Some("None")
            || t_ip == Some(ip)
            || t.metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| !f.is_empty())
        {
            return Ok(false);
        }
        let tenant_api: Api<Service> = Api::namespaced(self.tenant.clone(), &ns);
        let mut copy = t.clone();
        copy.metadata = ObjectMeta {
            name: t.metadata.name.clone(),
            namespace: t.metadata.namespace.clone(),
            labels: t.metadata.labels.clone(),
            annotations: t.metadata.annotations.clone(),
            owner_references: t.metadata.owner_references.clone(),
            ..Default::default()
        };
        if let Some(spec) = copy.spec.as_mut() {
            spec.cluster_ip = Some(ip.to_string());
            spec.cluster_ips = ips;
            // Node ports are the host's business; the tenant keeps asking for its own.
            for p in spec.ports.iter_mut().flatten() {
                p.node_port = None;
            }
            spec.health_check_node_port = None;
        }
        copy.status = None;
        let pp = PostParams {
            field_manager: Some(SYNCER_MANAGER.into()),
            ..Default::default()
        };
        delete_if_present(&tenant_api, t, None).await?;
        if let Err(e) = tenant_api.create(&pp, &copy).await {
            // Never leave the tenant without its Service: put it back as it was, with an address
            // of the tenant's choosing, and say why the host's was refused.
            let mut original = copy.clone();
            if let Some(spec) = original.spec.as_mut() {
                spec.cluster_ip = None;
                spec.cluster_ips = None;
            }
            tenant_api.create(&pp, &original).await?;
            return Err(KeyError {
                reason: "ServiceIPNotAdopted",
                message: format!(
                    "the tenant refused the cluster IP {ip} ({e}); is the tenant's service CIDR the host's?"
                ),
                retry: Some(REJECTED_RETRY),
            });
        }
        debug!(service = %format!("{ns}/{name}"), ip = %ip, "tenant Service recreated with the host's cluster IP");
        Ok(true)
    }

    async fn sync_service(&self, ns: &str, name: &str) -> KeyResult {
        if ns == "default" && name == "kubernetes" {
            // The tenant API server's own Service stays in the tenant, with the address of the
            // host Service in front of the tenant API server, so `kubernetes.default` reaches
            // the tenant from a synced pod, never the host's API server.
            let Some(t) = self.t.services.get(&ObjectRef::new(name).within(ns)) else {
                return Ok(());
            };
            let ip = self.tr.api_ip.clone();
            self.take_cluster_ip(&t, &ip, Some(vec![ip.clone()]))
                .await?;
            return Ok(());
        }
        let t = self
            .t
            .services
            .get(&ObjectRef::new(name).within(ns))
            .filter(|s| {
                self.policy.to_host.services.enabled
                    && matches(&self.selectors.services, &s.metadata)
            });
        let h = self.host_copy(&self.h.services, ns, name);
        let api: Api<Service> = Api::namespaced(self.host.clone(), &self.tr.host_namespace);
        let tenant_api: Api<Service> = Api::namespaced(self.tenant.clone(), ns);
        let Some(t) = t else {
            if let Some(h) = h {
                // The cache may be between our own delete and create of the tenant Service (it
                // takes the host IP that way): ask the tenant before deleting the copy.
                let live = tenant_api.get_opt(name).await?;
                if live.is_none() || !self.policy.to_host.services.enabled {
                    delete_if_present(&api, &h, None).await?;
                }
            }
            return Ok(());
        };
        if t.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let desired = self.tr.service(&t);
        let Some(h) = h else {
            return self.create_on_host(&api, &desired).await;
        };
        self.apply_if_drifted(&api, &h, &desired).await?;
        // The tenant's Service takes its host copy's cluster IP, so tenant names reach the host.
        let h_ip = h.spec.as_ref().and_then(|s| s.cluster_ip.clone());
        if let Some(h_ip) = h_ip.filter(|ip| ip != "None" && !ip.is_empty()) {
            let h_ips = h.spec.as_ref().and_then(|s| s.cluster_ips.clone());
            if self.take_cluster_ip(&t, &h_ip, h_ips).await? {
                return Ok(());
            }
        }
        // Load balancer addresses come back.
        let h_lb = h.status.as_ref().and_then(|s| s.load_balancer.clone());
        let t_lb = t.status.as_ref().and_then(|s| s.load_balancer.clone());
        if h_lb.as_ref().is_some_and(|lb| lb.ingress.is_some()) && h_lb != t_lb {
            Api::<Service>::namespaced(self.tenant.clone(), ns)
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"loadBalancer": h_lb}})),
                )
                .await?;
        }
        Ok(())
    }

    async fn sync_endpoints(&self, ns: &str, name: &str) -> KeyResult {
        // Only selector-less Services have Endpoints a person wrote; the host computes the rest.
        let selectorless = self
            .t
            .services
            .get(&ObjectRef::new(name).within(ns))
            .is_some_and(|s| {
                s.spec.as_ref().is_none_or(|sp| sp.selector.is_none())
                    && self.policy.to_host.services.enabled
                    && matches(&self.selectors.services, &s.metadata)
            });
        let t = self
            .t
            .endpoints
            .get(&ObjectRef::new(name).within(ns))
            .filter(|e| {
                selectorless
                    && self.policy.to_host.endpoints.enabled
                    && matches(&self.selectors.endpoints, &e.metadata)
                    && !(ns == "default" && name == "kubernetes")
            });
        let h = self.host_copy(&self.h.endpoints, ns, name);
        let api: Api<Endpoints> = Api::namespaced(self.host.clone(), &self.tr.host_namespace);
        self.converge_copy(&api, t.as_deref(), h.as_deref(), |e| self.tr.endpoints(e))
            .await
    }

    // ---- configmaps, secrets, claims, service accounts, ingresses --------------------------

    /// Is `ns/name` used by a pod that syncs?
    fn referenced(&self, ns: &str, pick: impl Fn(&translate::References) -> bool) -> bool {
        self.policy.to_host.pods.enabled
            && self.t.pods.state().iter().any(|p| {
                p.namespace().as_deref() == Some(ns)
                    && matches(&self.selectors.pods, &p.metadata)
                    && pick(&translate::references(p))
            })
    }

    async fn sync_config_map(&self, ns: &str, name: &str) -> KeyResult {
        let setting = &self.policy.to_host.config_maps;
        let t = self
            .t
            .config_maps
            .get(&ObjectRef::new(name).within(ns))
            .filter(|c| {
                setting.enabled
                    && matches(&self.selectors.config_maps, &c.metadata)
                    && (setting.all || self.referenced(ns, |r| r.config_maps.contains(name)))
            });
        let h = self.host_copy(&self.h.config_maps, ns, name);
        let api: Api<ConfigMap> = Api::namespaced(self.host.clone(), &self.tr.host_namespace);
        self.converge_copy(&api, t.as_deref(), h.as_deref(), |c| self.tr.config_map(c))
            .await
    }

    /// Is Secret `ns/name` the TLS certificate of a synced Ingress?
    fn ingress_tls(&self, ns: &str, name: &str) -> bool {
        self.policy.to_host.ingresses.enabled
            && self.t.ingresses.iter().flat_map(|s| s.state()).any(|i| {
                i.namespace().as_deref() == Some(ns)
                    && matches(&self.selectors.ingresses, &i.metadata)
                    && i.spec
                        .iter()
                        .flat_map(|s| s.tls.iter().flatten())
                        .any(|t| t.secret_name.as_deref() == Some(name))
            })
    }

    async fn sync_secret(&self, ns: &str, name: &str) -> KeyResult {
        let setting = &self.policy.to_host.secrets;
        let t = self
            .t
            .secrets
            .get(&ObjectRef::new(name).within(ns))
            .filter(|s| {
                setting.enabled
                    && matches(&self.selectors.secrets, &s.metadata)
                    // Tenant service-account tokens never leave the tenant by this road.
                    && s.type_.as_deref() != Some("kubernetes.io/service-account-token")
                    && (setting.all
                        || self.referenced(ns, |r| r.secrets.contains(name))
                        || self.ingress_tls(ns, name))
            });
        let h = self.host_copy(&self.h.secrets, ns, name).filter(|s| {
            !s.annotations()
                .contains_key(naming::ANNOTATION_TOKEN_REFRESH)
        });
        let api: Api<Secret> = Api::namespaced(self.host.clone(), &self.tr.host_namespace);
        if let (Some(t), Some(h)) = (&t, &h)
            && self.tr.secret(t).type_ != h.type_
        {
            // The type cannot change in place.
            delete_if_present(&api, h, None).await?;
            return Ok(());
        }
        self.converge_copy(&api, t.as_deref(), h.as_deref(), |s| self.tr.secret(s))
            .await
    }

    async fn sync_claim(&self, ns: &str, name: &str) -> KeyResult {
        let t = self
            .t
            .claims
            .get(&ObjectRef::new(name).within(ns))
            .filter(|c| {
                self.policy.to_host.persistent_volume_claims.enabled
                    && matches(&self.selectors.claims, &c.metadata)
            });
        let h = self.host_copy(&self.h.claims, ns, name);
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.host.clone(), &self.tr.host_namespace);
        let live = t
            .as_deref()
            .filter(|c| c.metadata.deletion_timestamp.is_none());
        match (live, h.as_deref()) {
            (Some(t), None) => {
                self.create_on_host(&api, &self.tr.persistent_volume_claim(t))
                    .await
            }
            (None, Some(h)) => delete_if_present(&api, h, None).await,
            (Some(t), Some(h)) => {
                // Phase and capacity come back; the spec is the host's once bound.
                let hs = h.status.clone().unwrap_or_default();
                let ts = t.status.clone().unwrap_or_default();
                if hs.phase != ts.phase
                    || hs.capacity != ts.capacity
                    || hs.access_modes != ts.access_modes
                {
                    Api::<PersistentVolumeClaim>::namespaced(self.tenant.clone(), ns)
                        .patch_status(
                            name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"status": {
                                "phase": hs.phase, "capacity": hs.capacity, "accessModes": hs.access_modes,
                            }})),
                        )
                        .await?;
                }
                Ok(())
            }
            (None, None) => Ok(()),
        }
    }

    /// The tenant object `ns/name` if it should sync (`wanted`), and its host copy.
    fn pair<K>(
        &self,
        tenant: Option<&Store<K>>,
        host: Option<&Store<K>>,
        ns: &str,
        name: &str,
        wanted: impl Fn(&K) -> bool,
    ) -> (Option<Arc<K>>, Option<Arc<K>>)
    where
        K: Resource<DynamicType = ()> + Clone,
    {
        let t = tenant
            .and_then(|s| s.get(&ObjectRef::new(name).within(ns)))
            .filter(|o| wanted(o));
        let h = host.and_then(|s| self.host_copy(s, ns, name));
        (t, h)
    }

    async fn sync_service_account(&self, ns: &str, name: &str) -> KeyResult {
        let (t, h) = self.pair(
            self.t.service_accounts.as_ref(),
            self.h.service_accounts.as_ref(),
            ns,
            name,
            |s| {
                self.policy.to_host.service_accounts.enabled
                    && matches(&self.selectors.service_accounts, &s.metadata)
            },
        );
        let api: Api<ServiceAccount> = Api::namespaced(self.host.clone(), &self.tr.host_namespace);
        self.converge_copy(&api, t.as_deref(), h.as_deref(), |s| {
            self.tr.service_account(s)
        })
        .await
    }

    async fn sync_ingress(&self, ns: &str, name: &str) -> KeyResult {
        let (t, h) = self.pair(
            self.t.ingresses.as_ref(),
            self.h.ingresses.as_ref(),
            ns,
            name,
            |i| {
                self.policy.to_host.ingresses.enabled
                    && matches(&self.selectors.ingresses, &i.metadata)
            },
        );
        let api: Api<Ingress> = Api::namespaced(self.host.clone(), &self.tr.host_namespace);
        self.converge_copy(&api, t.as_deref(), h.as_deref(), |i| self.tr.ingress(i))
            .await?;
        if let (Some(t), Some(h)) = (t, h) {
            let h_lb = h.status.as_ref().and_then(|s| s.load_balancer.clone());
            if h_lb.as_ref().is_some_and(|lb| lb.ingress.is_some())
                && h_lb != t.status.as_ref().and_then(|s| s.load_balancer.clone())
            {
                Api::<Ingress>::namespaced(self.tenant.clone(), ns)
                    .patch_status(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {"loadBalancer": h_lb}})),
                    )
                    .await?;
            }
        }
        Ok(())
    }

    /// The common shape: the copy exists exactly while the tenant object should sync, and holds
    /// what translation says.
    async fn converge_copy<K>(
        &self,
        api: &Api<K>,
        t: Option<&K>,
        h: Option<&K>,
        translate: impl Fn(&K) -> K,
    ) -> KeyResult
    where
        K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
    {
        let t = t.filter(|t| t.meta().deletion_timestamp.is_none());
        match (t, h) {
            (None, None) => Ok(()),
            (None, Some(h)) => delete_if_present(api, h, None).await,
            (Some(t), None) => self.create_on_host(api, &translate(t)).await,
            (Some(t), Some(h)) => self.apply_if_drifted(api, h, &translate(t)).await,
        }
    }

    async fn create_on_host<K>(&self, api: &Api<K>, desired: &K) -> KeyResult
    where
        K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
    {
        let pp = PostParams {
            field_manager: Some(SYNCER_MANAGER.into()),
            ..Default::default()
        };
        match api.create(&pp, desired).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => self.name_taken(api, desired).await,
            Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => Err(KeyError {
                reason: "HostRejected",
                message: format!("the host refused it: {}", e.message),
                retry: Some(REJECTED_RETRY),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// A create found the name taken: by our own copy the cache has not shown yet (fine, the
    /// watch brings it), or by an object the syncer did not make (never touched; the tenant is
    /// told to rename or delete it).
    async fn name_taken<K>(&self, api: &Api<K>, desired: &K) -> KeyResult
    where
        K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
    {
        let name = desired.name_any();
        let ours = api
            .get_opt(&name)
            .await?
            .and_then(|o| naming::virtual_of(o.meta(), &self.tr.tenant))
            .zip(naming::virtual_of(desired.meta(), &self.tr.tenant))
            .is_some_and(|(live, want)| live.namespace == want.namespace && live.name == want.name);
        if ours {
            return Ok(());
        }
        Err(KeyError {
            reason: "HostNameTaken",
            message: format!(
                "a host {} named {name} exists that the syncer did not create; rename or delete it",
                K::kind(&()),
            ),
            retry: Some(REJECTED_RETRY),
        })
    }

    async fn apply_if_drifted<K>(&self, api: &Api<K>, live: &K, desired: &K) -> KeyResult
    where
        K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
    {
        let (Ok(l), Ok(d)) = (serde_json::to_value(live), serde_json::to_value(desired)) else {
            return Ok(());
        };
        if contains(&l, &d) {
            return Ok(());
        }
        let mut body = d;
        // Prove it is still the object we read; typed objects need their kind for apply.
        body["apiVersion"] = json!(K::api_version(&()));
        body["kind"] = json!(K::kind(&()));
        api.patch(
            &desired.name_any(),
            &PatchParams::apply(SYNCER_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
        Ok(())
    }

    // ---- from the host ---------------------------------------------------------------------

    async fn sync_event(&self, host_name: &str) -> KeyResult {
        let Some(events) = &self.hx.events else {
            return Ok(());
        };
        let Some(e) = events.get(&ObjectRef::new(host_name).within(&self.tr.host_namespace)) else {
            return Ok(());
        };
        let involved = &e.involved_object;
        let name = involved.name.clone().unwrap_or_default();
        let at = |store: &Store<_>| -> Option<ObjectMeta> {
            let o: Option<Arc<Pod>> =
                store.get(&ObjectRef::new(&name).within(&self.tr.host_namespace));
            o.map(|o| o.metadata.clone())
        };
        let meta = match involved.kind.as_deref() {
            Some("Pod") => at(&self.h.pods),
            Some("Service") => self
                .h
                .services
                .get(&ObjectRef::new(&name).within(&self.tr.host_namespace))
                .map(|o| o.metadata.clone()),
            Some("PersistentVolumeClaim") => self
                .h
                .claims
                .get(&ObjectRef::new(&name).within(&self.tr.host_namespace))
                .map(|o| o.metadata.clone()),
            _ => None,
        };
        let Some(v) = meta.and_then(|m| naming::virtual_of(&m, &self.tr.tenant)) else {
            return Ok(());
        };
        let about = ObjectReference {
            api_version: involved.api_version.clone(),
            kind: involved.kind.clone(),
            name: Some(v.name.clone()),
            namespace: Some(v.namespace.clone()),
            uid: Some(v.uid.clone()),
            field_path: involved.field_path.clone(),
            resource_version: None,
        };
        let tenant_name = format!(
            "{}.{}",
            v.name.chars().take(200).collect::<String>(),
            &naming::label_value(&format!("{host_name}/"))
        );
        let mut wanted = translate::event_up(&e, &about, &tenant_name);
        wanted
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(naming::LABEL_SYNCED_FROM.into(), self.tr.tenant.clone());
        let current = self
            .tx
            .events
            .get(&ObjectRef::new(&tenant_name).within(&v.namespace));
        let api: Api<CoreEvent> = Api::namespaced(self.tenant.clone(), &v.namespace);
        match current {
            None => match api.create(&PostParams::default(), &wanted).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                // The tenant namespace went away: nothing to tell.
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 403 => Ok(()),
                Err(e) => Err(e.into()),
            },
            Some(c) if c.count != wanted.count || c.message != wanted.message => {
                api.patch(
                    &tenant_name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({
                        "count": wanted.count, "message": wanted.message,
                        "lastTimestamp": wanted.last_timestamp,
                    })),
                )
                .await?;
                Ok(())
            }
            Some(_) => Ok(()),
        }
    }

    async fn sync_storage_class(&self, name: &str) -> KeyResult {
        self.show_class(name, &self.hx.storage_classes, &self.tx.storage_classes)
            .await
    }

    async fn sync_ingress_class(&self, name: &str) -> KeyResult {
        self.show_class(name, &self.hx.ingress_classes, &self.tx.ingress_classes)
            .await
    }

    /// Show host class `name` in the tenant as the host has it, from the two sides' caches.
    async fn show_class<K>(
        &self,
        name: &str,
        host: &Option<Store<K>>,
        tenant: &Option<Store<K>>,
    ) -> KeyResult
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
            + Clone
            + Debug
            + Serialize
            + DeserializeOwned,
    {
        let get = |side: &Option<Store<K>>| side.as_ref()?.get(&ObjectRef::new(name));
        let (host, current) = (get(host), get(tenant));
        self.show_cluster_object(name, host.as_deref(), current.as_deref())
            .await
    }

    /// Show a cluster-scoped host object (a class) in the tenant as it is on the host.
    async fn show_cluster_object<K>(
        &self,
        name: &str,
        host: Option<&K>,
        current: Option<&K>,
    ) -> KeyResult
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
            + Clone
            + Debug
            + Serialize
            + DeserializeOwned,
    {
        let api: Api<K> = Api::all(self.tenant.clone());
        let ours = current.is_some_and(|c| {
            c.meta()
                .labels
                .as_ref()
                .and_then(|l| l.get(naming::LABEL_SYNCED_FROM))
                == Some(&self.tr.tenant)
        });
        let Some(host) = host else {
            if let (Some(c), true) = (current, ours) {
                delete_if_present(&api, c, None).await?;
            }
            return Ok(());
        };
        let mut value = serde_json::to_value(host).map_err(|e| KeyError {
            reason: "SyncFailed",
            message: e.to_string(),
            retry: None,
        })?;
        let mut labels = naming::copyable(host.meta().labels.as_ref());
        labels.insert(naming::LABEL_SYNCED_FROM.into(), self.tr.tenant.clone());
        value["metadata"] = json!({"name": name, "labels": labels});
        value["apiVersion"] = json!(K::api_version(&()));
        value["kind"] = json!(K::kind(&()));
        if let Some(c) = current {
            if !ours {
                return Ok(()); // the tenant's own object of that name wins
            }
            if serde_json::to_value(c).is_ok_and(|l| contains(&l, &value)) {
                return Ok(());
            }
        }
        api.patch(
            name,
            &PatchParams::apply(SYNCER_MANAGER).force(),
            &Patch::Apply(&value),
        )
        .await?;
        Ok(())
    }
}

/// Delete `obj` if it is still the object we saw (UID precondition); gone already is fine.
async fn delete_if_present<K>(api: &Api<K>, obj: &K, grace: Option<u32>) -> KeyResult
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    let dp = DeleteParams {
        grace_period_seconds: grace,
        preconditions: Some(Preconditions {
            uid: obj.meta().uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(&obj.name_any(), &dp).await {
        Ok(_) => Ok(()),
        // Gone, or replaced by a newer object of the same name (not ours to delete).
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
