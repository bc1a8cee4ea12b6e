//! One TenantCluster per namespace: which one holds a namespace, and when a deletion may give
//! the namespace's shared labels up. The decisions are pure; the lookups read the controller's
//! cache, or the API server where the cache cannot answer.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use tenantplane_api::TenantCluster;

use crate::Error;
use crate::build;
use crate::context::Context;

/// How often a TenantCluster whose namespace another one holds checks whether it is free.
pub(crate) const NAMESPACE_IN_USE_RECHECK: Duration = Duration::from_secs(10);

/// A TenantCluster as far as sharing a namespace goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Occupant {
    /// The TenantCluster's name.
    pub name: String,
    /// When it was created; the oldest holds the namespace.
    pub created: Option<Timestamp>,
    /// Being deleted (it still holds the namespace until it is gone).
    pub deleting: bool,
}

impl Occupant {
    pub(crate) fn of(tc: &TenantCluster) -> Self {
        Self {
            name: tc.name_any(),
            created: tc.metadata.creation_timestamp.as_ref().map(|t| t.0),
            deleting: tc.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// The TenantCluster that holds a namespace, of those in it: the oldest by creation time, the
/// lowest name among those created in the same second. One without a creation time (never
/// stored) comes last.
pub fn namespace_holder<'a>(
    tenants: impl IntoIterator<Item = (&'a str, Option<Timestamp>)>,
) -> Option<&'a str> {
    tenants
        .into_iter()
        .min_by_key(|&(name, created)| (created.is_none(), created, name))
        .map(|(name, _)| name)
}

/// Whether `tenant`'s deletion may remove the namespace's Pod Security labels, given what is in
/// the namespace (`tenant` listed or not): only the holder's may, and only when every other one is
/// on its way out too. One that remains takes the namespace over with the labels in place; a
/// non-holder never set them.
pub fn releases_namespace(tenant: &Occupant, present: &[Occupant]) -> bool {
    let others = || present.iter().filter(|o| o.name != tenant.name);
    let holder = namespace_holder(
        others()
            .chain(std::iter::once(tenant))
            .map(|o| (o.name.as_str(), o.created)),
    );
    holder == Some(tenant.name.as_str()) && others().all(|o| o.deleting)
}

/// Who holds `tc`'s namespace when it is not `tc` itself, from the controller's cache (complete
/// once listed; a TenantCluster created before `tc` is in it before `tc` is).
pub(crate) async fn other_holder(
    tc: &TenantCluster,
    ctx: &Context,
) -> Result<Option<String>, Error> {
    let (tenant, ns) = build::identity(tc)?;
    let mut present = if ctx.tenants.wait_until_ready().await.is_ok() {
        ctx.tenants
            .state()
            .iter()
            .filter(|t| t.namespace().as_deref() == Some(ns.as_str()))
            .map(|t| Occupant::of(t))
            .collect::<Vec<_>>()
    } else {
        // The cache is gone (shutting down): ask the API server.
        occupants(ctx, &ns).await?
    };
    if !present.iter().any(|o| o.name == tenant) {
        present.push(Occupant::of(tc));
    }
    let holder = namespace_holder(present.iter().map(|o| (o.name.as_str(), o.created)));
    Ok(holder.filter(|h| *h != tenant).map(str::to_string))
}

/// Every TenantCluster in `ns`, as the API server has them now.
pub(crate) async fn occupants(ctx: &Context, ns: &str) -> Result<Vec<Occupant>, Error> {
    let api: Api<TenantCluster> = Api::namespaced(ctx.client.clone(), ns);
    let list = api.list_metadata(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .map(|m| Occupant {
            name: m.name_any(),
            created: m.metadata.creation_timestamp.as_ref().map(|t| t.0),
            deleting: m.metadata.deletion_timestamp.is_some(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Option<Timestamp> {
        Some(Timestamp::from_second(s).unwrap())
    }

    fn occupant(name: &str, created: i64, deleting: bool) -> Occupant {
        Occupant {
            name: name.into(),
            created: at(created),
            deleting,
        }
    }

    #[test]
    fn the_oldest_tenant_holds_the_namespace() {
        assert_eq!(namespace_holder([("b", at(10)), ("a", at(20))]), Some("b"));
        assert_eq!(namespace_holder([("a", at(20)), ("b", at(10))]), Some("b"));
        assert_eq!(namespace_holder([("only", at(5))]), Some("only"));
        assert_eq!(namespace_holder([]), None);
    }

    #[test]
    fn tenants_created_in_the_same_second_go_by_name() {
        assert_eq!(
            namespace_holder([("zeta", at(7)), ("alpha", at(7)), ("mid", at(7))]),
            Some("alpha")
        );
        // Name breaks only the tie: an older tenant with a later name still holds it.
        assert_eq!(
            namespace_holder([("zeta", at(6)), ("alpha", at(7))]),
            Some("zeta")
        );
    }

    #[test]
    fn a_tenant_without_a_creation_time_comes_last() {
        assert_eq!(namespace_holder([("a", None), ("b", at(99))]), Some("b"));
        assert_eq!(namespace_holder([("b", None), ("a", None)]), Some("a"));
    }

    #[test]
    fn the_last_tenant_in_a_namespace_releases_it() {
        let a = occupant("a", 1, true);
        assert!(releases_namespace(&a, std::slice::from_ref(&a)));
        // Missing from the list (a read that raced the deletion): still the only one.
        assert!(releases_namespace(&a, &[]));
    }

    #[test]
    fn a_tenant_that_remains_keeps_the_labels() {
        // The holder goes while the second one waits: the second takes over, labels in place.
        let present = [occupant("first", 1, true), occupant("second", 2, false)];
        assert!(!releases_namespace(&present[0], &present));
        // The second one goes: it never held the namespace.
        let present = [occupant("first", 1, false), occupant("second", 2, true)];
        assert!(!releases_namespace(&present[1], &present));
        assert!(
            !releases_namespace(&present[1], &present[..1]),
            "listed or not"
        );
    }

    #[test]
    fn when_all_go_the_holder_releases_and_the_others_touch_nothing() {
        let present = [
            occupant("first", 1, true),
            occupant("second", 2, true),
            occupant("third", 3, true),
        ];
        assert!(releases_namespace(&present[0], &present));
        assert!(!releases_namespace(&present[1], &present));
        assert!(!releases_namespace(&present[2], &present));
        // One of them remains: nobody releases.
        let present = [occupant("first", 1, true), occupant("second", 2, false)];
        assert!(!releases_namespace(&present[0], &present));
    }
}
