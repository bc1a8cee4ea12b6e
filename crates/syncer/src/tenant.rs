//! One tenant's syncer as its kinds see it: the caches of its tenant watches and of its slices of
//! the shared host watches, its clients and work queue, and where failures are reported (the
//! verdict reaches the controller through [`Health`]). The workers that converge its keys are
//! `run`'s.

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::core::{Selector, SelectorExt};
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource};
use tenantplane_api::SyncPolicySpec;
use tokio::sync::watch;

use crate::health::{Failure, Health, Observer, WATCH_FAILED};
use crate::host::HostStore;
use crate::key::{Key, Object};
use crate::queue::WorkQueue;
use crate::translate::Translator;

/// Values by their type: the caches of each side, one per object type.
#[derive(Default)]
pub(crate) struct TypeMap(HashMap<TypeId, Box<dyn Any + Send + Sync>>);

impl TypeMap {
    pub(crate) fn insert<T: Any + Send + Sync>(&mut self, value: T) {
        self.0.insert(TypeId::of::<T>(), Box::new(value));
    }

    pub(crate) fn get<T: Any>(&self) -> Option<&T> {
        self.0.get(&TypeId::of::<T>())?.downcast_ref()
    }
}

/// What a kind's converge step reads and writes through.
pub struct Tenant {
    /// Names and translates between the tenant and the host.
    pub tr: Translator,
    /// The tenant's SyncPolicy.
    pub policy: SyncPolicySpec,
    /// A client of the tenant API server, as the syncer.
    pub tenant: Client,
    /// A client of the host API server, as the operator.
    pub host: Client,
    /// The keys waiting to be converged.
    pub queue: Arc<WorkQueue<Key>>,
    /// Events in the tenant, as the syncer.
    pub recorder: Recorder,
    /// What each tenant object was last told (by Event), by its UID and the Event's reason
    /// (see `tell`).
    pub told: Mutex<HashMap<String, BTreeMap<String, String>>>,
    /// When each host pod's token Secret is due to be minted again, once a pass is scheduled.
    pub refresh_scheduled: Mutex<HashMap<String, Timestamp>>,
    /// The kinds the policy turns on, by name.
    pub(crate) enabled: BTreeSet<&'static str>,
    pub(crate) selectors: BTreeMap<&'static str, Selector>,
    pub(crate) tenant_stores: TypeMap,
    pub(crate) host_stores: TypeMap,
    pub(crate) reporter: Verdicts,
}

impl Tenant {
    /// The addresses of this tenant's pod copies on the host.
    pub fn own_pod_ips(&self) -> BTreeSet<String> {
        pod_ips(
            self.host_slice::<Pod>()
                .iter()
                .filter(|p| self.tr.copy_of(&p.metadata).is_some())
                .map(|p| &**p),
        )
    }

    /// Does the policy sync tenant object `meta` of the kind named `kind`: the kind is on and its
    /// selector (if any) selects the object? (See `Kind::synced`.)
    pub fn synced(&self, kind: &str, meta: &kube::api::ObjectMeta) -> bool {
        self.enabled.contains(kind) && self.selected(kind, meta)
    }

    /// [`Self::synced`] for the kind that syncs objects of type `K` (named as their Kubernetes
    /// kind), for a kind that asks about another without importing it.
    pub fn syncs<K: k8s_openapi::Resource>(&self, meta: &kube::api::ObjectMeta) -> bool {
        self.synced(K::KIND, meta)
    }

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

    /// The host object `host_name`, if it is ours and the copy of tenant object
    /// `namespace/name`. Names are not translated here: the caller has the host name.
    pub fn host_copy<K: Object>(
        &self,
        host_name: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<K>> {
        let ours = self.is_copy_of(namespace, name);
        self.host_get::<K>(true, host_name)
            .filter(|o| ours(o.meta()))
    }

    /// Has tenant object `namespace/name` a host copy of ours? For the objects whose verdict
    /// follows another's (what a pod uses, the pods a Secret wakes), not the one converged: the
    /// name is translated here for the question alone.
    pub fn is_copied<K: Object>(&self, namespace: &str, name: &str) -> bool {
        self.host_copy::<K>(&self.tr.host_name(namespace, name), namespace, name)
            .is_some()
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

    /// Keep the tenant's add-ons (its cluster DNS, its refusals) as they should be; a failure is reported in
    /// `Synced` until a later pass succeeds. Whether this pass did.
    pub(crate) async fn ensure_addons(&self) -> bool {
        const WHAT: &str = "the tenant's DNS (Deployment kube-system/coredns)";
        let host_dns = Api::<k8s_openapi::api::core::v1::Service>::namespaced(
            self.host.clone(),
            crate::addons::DNS_NAMESPACE,
        )
        .get_opt(crate::addons::DNS_SERVICE)
        .await
        .ok()
        .flatten()
        .and_then(|s| s.spec?.cluster_ip)
        .filter(|ip| ip != "None" && !ip.is_empty());
        let upstream: Vec<String> = host_dns.into_iter().collect();
        let failure = crate::addons::ensure_dns(&self.tenant, self.tr.name(), &upstream)
            .await
            .err()
            .map(|e| Failure {
                reason: e.reason(),
                message: format!("{WHAT}: {e}"),
            });
        let mut ok = failure.is_none();
        self.reporter.set_error(WHAT, failure);
        const RETIRED: &str = "removing what an earlier release put in the tenant \
            (ValidatingAdmissionPolicy tenantplane-no-ephemeral-containers)";
        let failure = crate::retired::remove_retired(&self.tenant, self.tr.name())
            .await
            .err()
            .map(|e| Failure {
                reason: e.reason(),
                message: format!("{RETIRED}: {e}"),
            });
        ok &= failure.is_none();
        self.reporter.set_error(RETIRED, failure);
        ok
    }
}

/// Where the engine reports failures, and how it tells the controller its verdict changed.
#[derive(Clone)]
pub(crate) struct Verdicts {
    pub health: Arc<watch::Sender<Health>>,
    pub notify: Arc<dyn Fn() + Send + Sync>,
    /// What `Synced` says when all is well (see `kinds::summary`).
    pub summary: String,
    pub observer: Arc<dyn Observer>,
    /// Where each stage of a synced object's time goes.
    pub stages: crate::stages::Stages,
}

impl Verdicts {
    /// Record (or clear) the failure of one object or watch; tell the controller when the verdict
    /// changes.
    pub(crate) fn set_error(&self, what: &str, failure: Option<Failure>) {
        let mut changed = false;
        self.health.send_if_modified(|h| {
            let before = h.verdict(&self.summary);
            let modified = match &failure {
                Some(f) => h.errors.insert(what.to_string(), f.clone()).as_ref() != Some(f),
                None => h.errors.remove(what).is_some(),
            };
            changed = modified && before != h.verdict(&self.summary);
            modified
        });
        if changed {
            (self.notify)();
        }
    }

    pub(crate) fn watch_failing(&self, what: &str, why: Option<String>) {
        self.set_error(
            what,
            why.map(|message| Failure {
                reason: WATCH_FAILED,
                message,
            }),
        );
    }
}

/// The addresses of `pods` that are still theirs: a pod being deleted or finished gives its
/// address back to the pool, where another tenant's pod may get it next.
pub fn pod_ips<'a>(pods: impl Iterator<Item = &'a Pod>) -> BTreeSet<String> {
    pods.filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.status.as_ref())
        .filter(|s| matches!(s.phase.as_deref(), Some("Pending" | "Running")))
        .flat_map(|s| {
            s.pod_ips
                .iter()
                .flatten()
                .map(|i| i.ip.clone())
                .chain(s.pod_ip.clone())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pod_being_deleted_or_finished_no_longer_owns_its_address() {
        let pod = |name: &str, ip: &str, phase: &str, deleting: bool| -> Pod {
            let mut p: Pod = serde_json::from_value(json!({
                "metadata": {"name": name},
                "status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}, {"ip": "fd00::9"}]}
            }))
            .unwrap();
            if deleting {
                p.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                    ));
            }
            p
        };
        let pods = [
            pod("running", "10.244.0.1", "Running", false),
            pod("pending", "10.244.0.2", "Pending", false),
            pod("terminating", "10.244.0.3", "Running", true),
            pod("done", "10.244.0.4", "Succeeded", false),
            pod("failed", "10.244.0.5", "Failed", false),
        ];
        let ips = pod_ips(pods.iter());
        assert_eq!(
            ips.into_iter().collect::<Vec<_>>(),
            ["10.244.0.1", "10.244.0.2", "fd00::9"]
        );
    }
}
