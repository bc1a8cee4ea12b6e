//! One module per resource kind, each behind [`Kind`]; [`all`] is the one
//! list of them the engine runs.

use futures::future::BoxFuture;
use k8s_openapi::api::networking::v1::IngressClass;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Resource;
use tenantplane_api::SyncPolicySpec;

use crate::error::Result;
use crate::key::Key;
use crate::kind_trait::Kind;
use crate::tenant::Tenant;
use crate::wiring::Setup;

pub mod classes;
pub mod configmaps;
pub mod endpoints;
pub mod events;
pub mod ingresses;
pub mod nodes;
pub mod persistentvolumeclaims;
pub mod pods;
pub mod secrets;
pub mod serviceaccounts;
pub mod services;

/// A kind as the engine runs it.
pub struct Entry {
    /// The kind, as keys, messages and metrics name it.
    pub name: &'static str,
    /// Where its switch sits in the SyncPolicy (`toHost.pods`).
    pub setting: &'static str,
    /// Does the kind sync at all under a policy?
    pub enabled: fn(&SyncPolicySpec) -> bool,
    /// How the `Synced` summary names the kind's objects.
    pub listed_as: fn() -> String,
    /// The policy's label selector for the kind, if it has one.
    pub selector: fn(&SyncPolicySpec) -> Option<&LabelSelector>,
    /// Converges one key of the kind.
    pub converge: for<'a> fn(&'a Tenant, &'a Key) -> BoxFuture<'a, Result<()>>,
    /// Every key of the kind to look at in a resync.
    pub everything: fn(&Tenant) -> Vec<Key>,
    /// Wires the kind's tenant watch and its slice of the shared host watch.
    pub wire: fn(&mut Setup<'_>),
}

fn entry<S: Kind>() -> Entry {
    // Kinds name each other's keys and switches by their objects' Kubernetes kind (see
    // `Key::of_object`, `Tenant::syncs`).
    debug_assert_eq!(
        S::NAME,
        S::Object::kind(&()),
        "a kind is named as its objects"
    );
    Entry {
        name: S::NAME,
        setting: S::SETTING,
        enabled: S::enabled,
        listed_as: S::listed_as,
        selector: S::selector,
        converge: S::converge,
        everything: S::everything,
        wire: |setup| setup.wire::<S>(),
    }
}

/// Every kind the syncer knows: the one list. A kind's switch and selector in the SyncPolicy,
/// its watches and its converge step all come from its [`Kind`] implementation.
pub fn all() -> Vec<Entry> {
    vec![
        entry::<pods::Pods>(),
        entry::<services::Services>(),
        entry::<endpoints::EndpointsKind>(),
        entry::<endpoints::slices::EndpointSlices>(),
        entry::<configmaps::ConfigMaps>(),
        entry::<secrets::Secrets>(),
        entry::<persistentvolumeclaims::Claims>(),
        entry::<serviceaccounts::ServiceAccounts>(),
        entry::<ingresses::Ingresses>(),
        entry::<nodes::Nodes>(),
        entry::<events::Events>(),
        entry::<classes::Classes<StorageClass>>(),
        entry::<classes::Classes<IngressClass>>(),
    ]
}

/// The sentence `Synced` shows when all is well under `policy`: the kinds it turns on, to the
/// host and from it, in the list's order.
pub fn summary(policy: &SyncPolicySpec) -> String {
    let entries = all();
    let on = |to_host: bool| -> Vec<String> {
        entries
            .iter()
            .filter(|e| e.setting.starts_with("toHost.") == to_host && (e.enabled)(policy))
            .map(|e| (e.listed_as)())
            .collect()
    };
    crate::health::in_sync(&on(true), &on(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Moved from `health`: the summary of the default policy, as `Synced` shows it.
    #[test]
    fn the_summary_names_what_moves_each_way() {
        assert_eq!(
            summary(&SyncPolicySpec::default()),
            "in sync: pods, services, endpoints, endpointslices, configmaps, secrets, persistentvolumeclaims to the host; virtual nodes, events from the host"
        );
        let mut all = SyncPolicySpec::default();
        all.to_host.service_accounts.enabled = true;
        all.to_host.ingresses.enabled = true;
        all.from_host.storage_classes.enabled = true;
        all.from_host.ingress_classes.enabled = true;
        assert_eq!(
            summary(&all),
            "in sync: pods, services, endpoints, endpointslices, configmaps, secrets, persistentvolumeclaims, serviceaccounts, ingresses to the host; virtual nodes, events, storageclasses, ingressclasses from the host"
        );
    }

    #[test]
    fn every_kind_has_its_own_name() {
        let names: Vec<&str> = all().iter().map(|e| e.name).collect();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(names.len(), unique.len(), "{names:?}");
    }
}
