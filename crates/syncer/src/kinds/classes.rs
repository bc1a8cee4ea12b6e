//! Host classes (StorageClasses, IngressClasses) shown in the tenant, so the tenant's claims and
//! Ingresses can name them: only those the profile lets the tenant name, without their
//! parameters. A tenant's own class of the same name wins.

use std::marker::PhantomData;

use k8s_openapi::api::networking::v1::IngressClass;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ObjectMeta};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use tenantplane_api::{Allowances, SyncPolicySpec};

use crate::converge::{self, Target, delete_if_present};
use crate::error::Result;
use crate::host::Scope;
use crate::key::{Key, Object};
use crate::kind_trait::{Kind, shown_watch_config};
use crate::naming::{self, SYNCER_MANAGER};
use crate::tenant::Tenant;

/// A cluster-scoped host kind shown in tenants.
pub trait Class: Object + Resource<Scope = k8s_openapi::ClusterResourceScope> {
    /// The kind, as keys, messages and metrics name it (`StorageClass`).
    const NAME: &'static str;
    /// Its switch in the SyncPolicy (`fromHost.storageClasses`).
    const SETTING: &'static str;
    /// Shown under `policy`?
    fn shown(policy: &SyncPolicySpec) -> bool;
    /// May the tenant name host class `name` (the profile's list for the kind)? Only such a
    /// class is shown: the others are another team's, or the platform's own.
    fn allowed(allow: &Allowances, name: &str) -> bool;
    /// Leave out what the tenant has no business reading: a class's parameters name the host's
    /// storage, keys and controllers (a KMS key's Secret, a balancer's configuration).
    fn without_parameters(&mut self);
    /// Does the shown copy `self` hold a field that `wanted` changes and the API server never
    /// lets change (a StorageClass's parameters)? Such a copy is made again.
    fn immutably_differs(&self, _wanted: &Self) -> bool {
        false
    }
}

impl Class for StorageClass {
    const NAME: &'static str = "StorageClass";
    const SETTING: &'static str = "fromHost.storageClasses";
    fn shown(policy: &SyncPolicySpec) -> bool {
        policy.from_host.storage_classes.enabled
    }
    fn allowed(allow: &Allowances, name: &str) -> bool {
        allow.storage_classes.iter().any(|c| c == name)
    }
    fn without_parameters(&mut self) {
        self.parameters = None;
        self.mount_options = None;
    }
    fn immutably_differs(&self, wanted: &Self) -> bool {
        self.parameters != wanted.parameters
            || self.provisioner != wanted.provisioner
            || self.reclaim_policy != wanted.reclaim_policy
            || self.volume_binding_mode != wanted.volume_binding_mode
    }
}

impl Class for IngressClass {
    const NAME: &'static str = "IngressClass";
    const SETTING: &'static str = "fromHost.ingressClasses";
    fn shown(policy: &SyncPolicySpec) -> bool {
        policy.from_host.ingress_classes.enabled
    }
    fn allowed(allow: &Allowances, name: &str) -> bool {
        allow.ingress_classes.iter().any(|c| c == name)
    }
    fn without_parameters(&mut self) {
        if let Some(spec) = self.spec.as_mut() {
            spec.parameters = None;
        }
    }
}

/// The syncer of one class kind.
pub struct Classes<K>(PhantomData<K>);

impl<K: Class> Kind for Classes<K> {
    const NAME: &'static str = <K as Class>::NAME;
    type Object = K;
    const SETTING: &'static str = <K as Class>::SETTING;

    fn enabled(policy: &SyncPolicySpec) -> bool {
        K::shown(policy)
    }

    fn tenant_watch(_: &SyncPolicySpec) -> Option<watcher::Config> {
        Some(shown_watch_config())
    }

    fn host_scope(policy: &SyncPolicySpec) -> Option<Scope> {
        Self::enabled(policy).then_some(Scope::Cluster)
    }

    fn host_api(client: Client, _: Option<&str>) -> Api<K> {
        Api::all(client)
    }

    fn host_keys(obj: &K, _: &str) -> Vec<Key> {
        vec![Key::of::<Self>("", obj.name_any())]
    }

    fn converge<'a>(cx: &'a Tenant, key: &'a Key) -> futures::future::BoxFuture<'a, Result<()>> {
        Box::pin(show_class::<K>(cx, &key.name))
    }
}

/// The tenant's copy of host class `host`, labelled as shown by this tenant's syncer, without
/// its parameters.
pub fn shown_class<K: Class>(host: &K, tenant: &str) -> K {
    let mut copy = host.clone();
    copy.without_parameters();
    let mut labels = naming::copyable(host.meta().labels.as_ref());
    labels.insert(naming::LABEL_SYNCED_FROM.into(), tenant.to_string());
    *copy.meta_mut() = ObjectMeta {
        name: host.meta().name.clone(),
        labels: Some(labels),
        ..Default::default()
    };
    copy
}

/// Show host class `name` in the tenant as the host has it, from the two sides' caches.
async fn show_class<K: Class>(cx: &Tenant, name: &str) -> Result<()> {
    let api: Api<K> = Api::all(cx.tenant.clone());
    let current = cx.tenant_get::<K>("", name);
    let ours = current
        .as_ref()
        .is_some_and(|c| c.labels().get(naming::LABEL_SYNCED_FROM) == Some(&cx.tr.tenant.name));
    let host = cx.host_get::<K>(false, name);
    let Some(host) = host
        .filter(|_| Classes::<K>::enabled(&cx.policy))
        .filter(|_| K::allowed(&cx.tr.allow, name))
    else {
        if let (Some(c), true) = (current, ours) {
            delete_if_present(&api, &*c, None).await?;
        }
        return Ok(());
    };
    if current.is_some() && !ours {
        return Ok(()); // the tenant's own object of that name wins
    }
    let wanted = shown_class(&*host, cx.tr.name());
    let mut current = current;
    if let Some(c) = current.as_deref().filter(|c| c.immutably_differs(&wanted)) {
        // Shown before its parameters were left out (or the host's class was made again): a
        // field that cannot change in place, so the copy is made again.
        delete_if_present(&api, c, None).await?;
        current = None;
    }
    converge::converge(
        &api,
        SYNCER_MANAGER,
        current.as_deref(),
        &wanted,
        Target::Any,
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_shown_class_keeps_the_host_spec_and_names_the_tenant() {
        let host: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": "standard", "uid": "h1", "resourceVersion": "3",
                         "labels": {"tier": "ssd", "tenantplane.io/synced-from": "x"}},
            "provisioner": "example.org/disk",
            "parameters": {"csi.storage.k8s.io/provisioner-secret-name": "kms-key-team-b"},
            "mountOptions": ["debug"]
        }))
        .unwrap();
        let shown = shown_class(&host, "dev");
        assert_eq!(shown.provisioner, "example.org/disk");
        // A copy shown with its parameters (before they were left out) is made again.
        assert!(host.immutably_differs(&shown));
        assert!(!shown.immutably_differs(&shown_class(&host, "dev")));
        assert_eq!(
            (shown.parameters.clone(), shown.mount_options.clone()),
            (None, None)
        );
        let allow = Allowances {
            storage_classes: vec!["standard".into()],
            ..Default::default()
        };
        assert!(StorageClass::allowed(&allow, "standard"));
        assert!(!StorageClass::allowed(&allow, "team-b-encrypted"));
        assert!(!IngressClass::allowed(&allow, "standard"));
        let ingress: IngressClass = serde_json::from_value(json!({
            "metadata": {"name": "internal"},
            "spec": {"controller": "example.org/lb", "parameters": {"kind": "LB", "name": "internal-only"}}
        }))
        .unwrap();
        let shown_ingress = shown_class(&ingress, "dev").spec.unwrap();
        assert_eq!(shown_ingress.parameters, None);
        assert_eq!(shown_ingress.controller.as_deref(), Some("example.org/lb"));
        assert_eq!(shown.metadata.uid, None);
        let labels = shown.metadata.labels.unwrap();
        assert_eq!(labels["tier"], "ssd");
        assert_eq!(labels[naming::LABEL_SYNCED_FROM], "dev");
    }
}
