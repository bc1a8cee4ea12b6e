//! The generic copy-down driver, for the kinds whose copy is "translate, then converge": the
//! host copy exists exactly while the tenant object should be synced, and holds what the kind's
//! pure translation says.

use std::sync::Arc;

use kube::{Client, Resource, ResourceExt};
use tenantplane_api::SyncPolicySpec;

use crate::allow;
use crate::converge::{self, Target, delete_if_present};
use crate::error::{Error, Result};
use crate::host::Scope;
use crate::key::Key;
use crate::kind_trait::{Kind, scoped_api};
use crate::naming::SYNCER_MANAGER;
use crate::tell::{self, Review};
use crate::tenant::Tenant;
use crate::tenant_terms;
use crate::translate::Translator;

/// A kind copied down by [`converge_copy`].
pub trait CopyDown: Kind<Object: Resource<Scope = k8s_openapi::NamespaceResourceScope>> {
    /// Should tenant object `obj` have a host copy now (policy, selector, references)?
    fn wanted(cx: &Tenant, obj: &Self::Object) -> bool;

    /// The host copy of `obj`, named `host_name` (see [`Translator::host_name`]): pure.
    fn translate(tr: &Translator, obj: &Self::Object, host_name: &str) -> Self::Object;

    /// What the host copy of `obj` leaves out, and why it may have none: pure. By default, the
    /// annotations the IsolationProfile does not allow on the kind.
    fn review(tr: &Translator, obj: &Self::Object) -> Review {
        Review {
            refused: vec![],
            dropped: tr.annotations(Self::NAME, obj.meta()).1,
        }
    }

    /// [`Self::translate`], for kinds whose copy depends on what else the tenant has, or on
    /// `live`, the copy as it is.
    fn translate_in(
        cx: &Tenant,
        obj: &Self::Object,
        host_name: &str,
        _live: Option<&Self::Object>,
    ) -> Self::Object {
        Self::translate(&cx.tr, obj, host_name)
    }

    /// [`Self::review`], for kinds whose copy depends on what else the tenant has, or on
    /// `live`, the copy as it is.
    fn review_in(cx: &Tenant, obj: &Self::Object, _live: Option<&Self::Object>) -> Review {
        Self::review(&cx.tr, obj)
    }

    /// Queue the tenant objects whose verdict follows `obj`'s (looked at whenever `obj` is).
    fn wake_dependents(_cx: &Tenant, _obj: &Self::Object) {}

    /// Must the live copy be replaced rather than updated (a field that cannot change did)?
    fn must_replace(_desired: &Self::Object, _live: &Self::Object) -> bool {
        false
    }
}

/// The tenant object and its host copy once both exist.
pub type Pair<K> = Option<(Arc<K>, Arc<K>)>;

/// What converging one copy takes.
#[derive(Debug, PartialEq)]
pub enum Step<K> {
    /// Nothing on either side.
    Nothing,
    /// The copy must go (the tenant object is gone, going, or no longer wanted).
    Delete,
    /// The copy cannot take the desired object in place: delete it, to be made again.
    Replace,
    /// Apply this desired copy.
    Apply(K),
}

/// The step for the desired copy (`None`: the tenant object is gone, going, or not to be
/// synced) and the live copy: pure.
pub fn step<S: CopyDown>(desired: Option<S::Object>, live: Option<&S::Object>) -> Step<S::Object> {
    match (desired, live) {
        (None, None) => Step::Nothing,
        (None, Some(_)) => Step::Delete,
        (Some(desired), Some(live)) if S::must_replace(&desired, live) => Step::Replace,
        (Some(desired), _) => Step::Apply(desired),
    }
}

/// The tenant object, unless it is being deleted: a going object's copy goes with it.
pub fn syncable<K: Resource>(t: Option<&K>) -> Option<&K> {
    t.filter(|t| t.meta().deletion_timestamp.is_none())
}

/// Converge the copy of `key`'s tenant object; the pair when both sides exist afterwards, for
/// kinds that bring state back up.
pub async fn converge_copy<S: CopyDown>(cx: &Tenant, key: &Key) -> Result<Pair<S::Object>> {
    let (ns, name) = (&key.namespace, &key.name);
    // The one translation of the name in this converge: the lookup and the copy share it.
    let host_name = cx.tr.host_name(ns, name);
    let t = cx.tenant_get::<S::Object>(ns, name);
    if let Some(t) = &t {
        S::wake_dependents(cx, t);
    }
    let t = t.filter(|t| S::wanted(cx, t));
    let h = cx.host_copy::<S::Object>(&host_name, ns, name);
    let live_t = syncable(t.as_deref());
    let mut desired = None;
    if let Some(t) = live_t {
        let mut review = S::review_in(cx, t, h.as_deref());
        if review.refused.is_empty() {
            // The copy as it would be written: its size is the host's to bear.
            let copy = S::translate_in(cx, t, &host_name, h.as_deref());
            review.refused = allow::byte_refusals(&cx.tr.allow, S::NAME, copy.meta(), &copy);
            desired = Some(copy);
        }
        tell::enforce(cx, t, h.as_deref(), &review).await?;
    }
    match step::<S>(desired, h.as_deref()) {
        Step::Nothing => Ok(None),
        // Made again on the next pass, once the delete is seen.
        Step::Delete | Step::Replace => {
            if let Some(h) = &h {
                delete_if_present(&cx.host_api::<S::Object>(), &**h, None).await?;
            }
            Ok(None)
        }
        Step::Apply(desired) => {
            let applied = apply_copy(cx, S::NAME, ns, name, h.as_deref(), &desired).await;
            if let (Err(e @ Error::HostRejected(_)), Some(t)) = (&applied, &t) {
                // The host's refusal (its quota, its admission) is the tenant's to read too.
                let terms = tenant_terms::about(cx, ns, name);
                let message = tenant_terms::status_message(&e.to_string(), &terms);
                let _ = tell::tell(cx, &**t, e.reason(), &message).await;
            }
            applied?;
            if let Some(t) = &t {
                tell::forget(cx, &t.uid().unwrap_or_default());
            }
            Ok(t.zip(h))
        }
    }
}

/// Make `desired` the host copy of tenant object `namespace/name` (of the kind named `kind`),
/// whose live copy is `live`.
pub async fn apply_copy<K>(
    cx: &Tenant,
    kind: &'static str,
    namespace: &str,
    name: &str,
    live: Option<&K>,
    desired: &K,
) -> Result<()>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    let uid = live.and_then(|h| h.uid());
    converge::converge(
        &cx.host_api::<K>(),
        SYNCER_MANAGER,
        live,
        desired,
        Target::Copy {
            live_uid: uid.as_deref(),
            ours: &cx.is_copy_of(namespace, name),
            stages: &cx.reporter.stages,
            kind,
        },
    )
    .await
    .map_err(Error::on_host)?;
    Ok(())
}

/// The [`Kind`] of a copy-down kind: the shared watch of host copies (always, so copies left
/// from an earlier policy go) and [`converge_copy`], then `then` with both sides when both exist.
/// `to_host.<field> as "<name>"`: its switch in the SyncPolicy, as Rust and as a person name it.
/// Items after `;` go into the impl (a narrower tenant watch, more keys).
#[macro_export]
macro_rules! copy_down_kind {
    ($kind:ty, $object:ty, $name:literal, to_host.$field:ident as $setting:literal $(, then = $then:path)? $(; $($extra:item)*)?) => {
        impl $crate::kind_trait::Kind for $kind {
            const NAME: &'static str = $name;
            type Object = $object;
            const SETTING: &'static str = concat!("toHost.", $setting);

            fn enabled(policy: &tenantplane_api::SyncPolicySpec) -> bool {
                policy.to_host.$field.enabled
            }

            fn selector(
                policy: &tenantplane_api::SyncPolicySpec,
            ) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector> {
                policy.to_host.$field.selector.as_ref()
            }

            $($($extra)*)?

            fn host_scope(policy: &tenantplane_api::SyncPolicySpec) -> Option<$crate::host::Scope> {
                $crate::copy::copies(policy)
            }

            fn host_api(client: kube::Client, namespace: Option<&str>) -> kube::Api<$object> {
                $crate::copy::copies_api(client, namespace)
            }

            fn converge<'a>(
                cx: &'a $crate::tenant::Tenant,
                key: &'a $crate::key::Key,
            ) -> futures::future::BoxFuture<'a, $crate::error::Result<()>> {
                Box::pin(async move {
                    let _pair = $crate::copy::converge_copy::<Self>(cx, key).await?;
                    $(
                    if let Some((t, h)) = &_pair {
                        $then(cx, t, h).await?;
                    }
                    )?
                    Ok(())
                })
            }
        }
    };
}

/// Copies are always watched on the host.
pub fn copies(_policy: &SyncPolicySpec) -> Option<Scope> {
    Some(Scope::Copies)
}

/// The host Api of a copied-down kind, in the operator's scope (`namespace`, if it has one).
pub fn copies_api<K>(client: Client, namespace: Option<&str>) -> kube::Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    scoped_api(client, namespace)
}
