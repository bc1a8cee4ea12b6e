//! The one interface every resource kind's syncer implements: what it watches on each side,
//! which keys a change maps to, and its converge step. The engine knows kinds only through it.

use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ObjectMeta};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use tenantplane_api::SyncPolicySpec;

use crate::error::Result;
use crate::host::Scope;
use crate::key::{Key, Object};
use crate::naming;
use crate::tenant::Tenant;

// Keys of a kind, by its name: here rather than in `key`, which sits below the kinds.
impl Key {
    /// The key of kind `S` for `namespace/name`.
    pub fn of<S: Kind>(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self::new(S::NAME, namespace, name)
    }

    /// The key of kind `S` for a tenant object.
    pub fn for_object<S: Kind>(obj: &impl Resource) -> Self {
        Self::of::<S>(
            obj.meta().namespace.clone().unwrap_or_default(),
            obj.meta().name.clone().unwrap_or_default(),
        )
    }
}

/// How long a tenant watch runs before the API server ends it and it is renewed. Shorter than
/// the watch client's read timeout, so a quiet watch is never cut by the client, while a request
/// that hangs (an API server coming back) fails and is retried.
const TENANT_WATCH_SECONDS: u32 = 50;

/// The tenant-side watch of everything of a kind.
pub fn tenant_watch_config() -> watcher::Config {
    watcher::Config::default().timeout(TENANT_WATCH_SECONDS)
}

/// The tenant-side watch of what the syncer shows in the tenant (it carries our label): always
/// watched, so objects left from an earlier policy are removed.
pub fn shown_watch_config() -> watcher::Config {
    tenant_watch_config().labels(naming::LABEL_SYNCED_FROM)
}

/// One resource kind's syncer.
pub trait Kind: Sized + Send + Sync + 'static {
    /// The kind, as keys, messages and metrics name it.
    const NAME: &'static str;
    /// The Kubernetes type the kind syncs.
    type Object: Object;
    /// Where the kind's switch sits in the SyncPolicy, as a person writes it (`toHost.pods`).
    const SETTING: &'static str;

    /// How the `Synced` summary names the kind's objects: its setting, lower-case (`configmaps`).
    fn listed_as() -> String {
        let field = Self::SETTING.rsplit('.').next().unwrap_or(Self::SETTING);
        field.to_lowercase()
    }

    /// Does the kind sync at all under `policy` (its `enabled` switch)?
    fn enabled(policy: &SyncPolicySpec) -> bool;

    /// The policy's label selector for the kind, if it has one: only the tenant objects it
    /// selects sync.
    fn selector(_policy: &SyncPolicySpec) -> Option<&LabelSelector> {
        None
    }

    /// Does the policy sync tenant object `meta` of this kind: the kind is enabled and its
    /// selector (if any) selects the object?
    fn synced(cx: &Tenant, meta: &ObjectMeta) -> bool {
        cx.synced(Self::NAME, meta)
    }

    /// The tenant-side watch under `policy`; `None`: the tenant side is not watched.
    fn tenant_watch(_policy: &SyncPolicySpec) -> Option<watcher::Config> {
        Some(tenant_watch_config())
    }

    /// The keys a change of tenant object `obj` wakes. The first is the object's own: a change
    /// of the object itself (not of its status) ends its back-off.
    fn tenant_keys(obj: &Self::Object) -> Vec<Key> {
        vec![Key::for_object::<Self>(obj)]
    }

    /// The shared host watch this kind reads under `policy`, if any.
    fn host_scope(policy: &SyncPolicySpec) -> Option<Scope>;

    /// The Api of that host watch (`namespace`: the operator's scope, if it has one).
    fn host_api(client: Client, namespace: Option<&str>) -> Api<Self::Object>;

    /// The keys a change of host object `obj` in this tenant's slice wakes. Marks are enough to
    /// wake a key (its converge step checks ownership).
    fn host_keys(obj: &Self::Object, tenant: &str) -> Vec<Key> {
        naming::virtual_of(obj.meta(), tenant)
            .map(|v| vec![Key::of::<Self>(v.namespace, v.name)])
            .unwrap_or_default()
    }

    /// Converge one key: read the caches, write only what differs.
    fn converge<'a>(cx: &'a Tenant, key: &'a Key) -> BoxFuture<'a, Result<()>>;

    /// Every key to look at in a periodic resync or after a host relist.
    fn everything(cx: &Tenant) -> Vec<Key> {
        let mut keys: Vec<Key> = cx
            .tenant_list::<Self::Object>()
            .iter()
            .map(|o| Key::for_object::<Self>(&**o))
            .collect();
        for h in cx.host_slice::<Self::Object>() {
            keys.extend(Self::host_keys(&h, cx.tr.name()));
        }
        keys
    }
}

/// A host Api in the operator's scope: one namespace, or every namespace.
pub fn scoped_api<K>(client: Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    }
}

/// The name of a cluster-scoped object, or a namespaced one's `namespace/name`, for logs.
pub fn describe_object(obj: &impl Resource) -> String {
    match obj.meta().namespace.as_deref() {
        Some(ns) => format!("{ns}/{}", obj.name_any()),
        None => obj.name_any(),
    }
}
