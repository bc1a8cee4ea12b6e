//! Apply: the controller's objects go through the syncer's one converge helper (server-side
//! apply under one field manager, skipped while the live object carries the desired object's
//! hash and fields), so a reconcile that changes nothing sends no write, and a field dropped from
//! the desired object is removed from the live one.

use std::fmt::Debug;

use kube::api::{Api, DeleteParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use kube::runtime::reflector::Store;
use tenantplane_syncer::converge::{self, Target};

pub use tenantplane_syncer::converge::{Outcome, contains};

use crate::names::{FIELD_MANAGER, LABEL_MANAGED_BY, MANAGED_BY};
use crate::{Error, cache};

/// Make `desired` exist as written: apply it when it is missing, when it changed, or when a
/// field it sets differs from the live object (someone deleted or edited it).
/// `live` is the cached object (see `cache`), so checking costs no request.
pub async fn ensure<K>(api: &Api<K>, live: &Store<K>, desired: &K) -> Result<Outcome, Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let live = cache::get(
        live,
        desired.meta().namespace.as_deref(),
        &desired.name_any(),
    );
    converge::converge(api, FIELD_MANAGER, live.as_deref(), desired, Target::Any)
        .await
        .map_err(|e| match e {
            converge::Error::Api(error) => Error::Write {
                object: format!(
                    "applying {} {}/{}",
                    K::kind(&()),
                    desired.meta().namespace.as_deref().unwrap_or_default(),
                    desired.name_any()
                ),
                error,
            },
            other => Error::Apply(other),
        })
}

/// [`ensure`] the object when the policy wants one, else [`ensure_absent`] the one named `name`.
pub async fn ensure_optional<K>(
    api: &Api<K>,
    live: &Store<K>,
    desired: Option<K>,
    namespace: &str,
    name: &str,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    match desired {
        Some(desired) => drop(ensure(api, live, &desired).await?),
        None => drop(ensure_absent(api, live, namespace, name).await?),
    }
    Ok(())
}

/// Delete an object we created that should no longer exist. Objects without our label are left
/// alone: they are someone else's.
pub async fn ensure_absent<K>(
    api: &Api<K>,
    live: &Store<K>,
    namespace: &str,
    name: &str,
) -> Result<bool, Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    match cache::get(live, Some(namespace), name) {
        Some(live)
            if live.labels().get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY) =>
        {
            match api.delete(name, &DeleteParams::background()).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
                Err(error) => Err(Error::Write {
                    object: format!("deleting {} {namespace}/{name}", K::kind(&())),
                    error,
                }),
            }
        }
        _ => Ok(false),
    }
}
