//! The generic copy-down driver, for the kinds whose copy is "translate, then converge": the
//! host copy exists exactly while the tenant object should be synced, and holds what the kind's
//! pure translation says.

use std::sync::Arc;

use kube::{Client, Resource, ResourceExt};
use tenantplane_api::SyncPolicySpec;

use crate::converge::{self, Target, delete_if_present};
use crate::error::{Error, Result};
use crate::host::Scope;
use crate::kind::{Key, Kind, scoped_api};
use crate::naming::SYNCER_MANAGER;
use crate::tenant::Tenant;
use crate::translate::Translator;

/// A kind copied down by [`converge_copy`].
pub trait CopyDown: Kind<Object: Resource<Scope = k8s_openapi::NamespaceResourceScope>> {
    /// Should tenant object `obj` have a host copy now (policy, selector, references)?
    fn wanted(cx: &Tenant, obj: &Self::Object) -> bool;

    /// The host copy of `obj`: pure.
    fn translate(tr: &Translator, obj: &Self::Object) -> Self::Object;

    /// Must the live copy be replaced rather than updated (a field that cannot change did)?
    fn must_replace(_desired: &Self::Object, _live: &Self::Object) -> bool {
        false
    }
}

/// The tenant object and its host copy once both exist.
pub type Pair<K> = Option<(Arc<K>, Arc<K>)>;

/// Converge the copy of `key`'s tenant object; the pair when both sides exist afterwards, for
/// kinds that bring state back up.
pub async fn converge_copy<S: CopyDown>(cx: &Tenant, key: &Key) -> Result<Pair<S::Object>> {
    let (ns, name) = (&key.namespace, &key.name);
    let t = cx
        .tenant_get::<S::Object>(ns, name)
        .filter(|t| t.meta().deletion_timestamp.is_none() && S::wanted(cx, t));
    let h = cx.host_copy::<S::Object>(ns, name);
    let api = cx.host_api::<S::Object>();
    match (t, h) {
        (None, None) => Ok(None),
        (None, Some(h)) => {
            delete_if_present(&api, &h, None).await?;
            Ok(None)
        }
        (Some(t), h) => {
            let desired = S::translate(&cx.tr, &t);
            if let Some(live) = &h
                && S::must_replace(&desired, live)
            {
                // Made again on the next pass, once the delete is seen.
                delete_if_present(&api, live, None).await?;
                return Ok(None);
            }
            apply_copy(cx, ns, name, h.as_deref(), &desired).await?;
            Ok(h.map(|h| (t, h)))
        }
    }
}

/// Make `desired` the host copy of tenant object `namespace/name`, whose live copy is `live`.
pub async fn apply_copy<K>(
    cx: &Tenant,
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
        },
    )
    .await
    .map_err(Error::on_host)?;
    Ok(())
}

/// The [`Kind`] of a copy-down kind: the shared watch of host copies (always, so copies left
/// from an earlier policy go) and [`converge_copy`], then `then` with both sides when both exist.
/// Items after `;` go into the impl (a narrower tenant watch, more keys).
#[macro_export]
macro_rules! copy_down_kind {
    ($kind:ty, $object:ty, $name:literal $(, then = $then:path)? $(; $($extra:item)*)?) => {
        impl $crate::kind::Kind for $kind {
            const NAME: &'static str = $name;
            type Object = $object;

            $($($extra)*)?

            fn host_scope(policy: &tenantplane_api::SyncPolicySpec) -> Option<$crate::host::Scope> {
                $crate::copy::copies(policy)
            }

            fn host_api(client: kube::Client, namespace: Option<&str>) -> kube::Api<$object> {
                $crate::copy::copies_api(client, namespace)
            }

            fn converge<'a>(
                cx: &'a $crate::tenant::Tenant,
                key: &'a $crate::kind::Key,
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

pub fn copies_api<K>(client: Client, namespace: Option<&str>) -> kube::Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    scoped_api(client, namespace)
}
