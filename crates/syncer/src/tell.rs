//! Telling the tenant what the syncer would not do with one of its objects: a Warning Event on
//! the object, once per distinct message (an object looked at again says nothing new).

use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use tracing::warn;

use crate::converge::delete_if_present;
use crate::error::{Error, Result};
use crate::tenant::Tenant;

/// Event reason: the whole object is kept off the host.
pub const NOT_ALLOWED: &str = "NotAllowed";
/// Event reason: parts of the object are left out of its host copy.
pub const NOT_COPIED: &str = "NotCopied";

/// What the syncer would not copy of one tenant object, said as sentences.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Review {
    /// Why the object may not reach the host at all.
    pub refused: Vec<String>,
    /// What its host copy leaves out.
    pub dropped: Vec<String>,
}

impl Review {
    /// The refusal as one error, if there is one.
    pub fn refusal(&self) -> Option<Error> {
        (!self.refused.is_empty()).then(|| Error::NotAllowed(self.refused.join("; ")))
    }
}

/// Hold tenant object `obj` to `review` before its copy is written: a refused object keeps no
/// copy (`copy`, its live one, is deleted: the object or the profile changed), and the tenant is
/// told; fails with the refusal if there is one.
pub async fn enforce<K>(cx: &Tenant, obj: &K, copy: Option<&K>, review: &Review) -> Result<()>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    if review.refusal().is_some()
        && let Some(copy) = copy
    {
        delete_if_present(&cx.host_api::<K>(), copy, None).await?;
    }
    tell_review(cx, obj, review).await
}

/// Tell the tenant about `review` of `obj` (Events), and fail with the refusal if there is one.
async fn tell_review<K>(cx: &Tenant, obj: &K, review: &Review) -> Result<()>
where
    K: Resource<DynamicType = ()>,
{
    if !review.dropped.is_empty() {
        tell(cx, obj, NOT_COPIED, &review.dropped.join("; ")).await;
    }
    match review.refusal() {
        Some(e) => {
            tell(cx, obj, NOT_ALLOWED, &e.to_string()).await;
            Err(e)
        }
        None => Ok(()),
    }
}

/// A Warning Event on tenant object `obj`, unless the same was said last time.
pub async fn tell<K>(cx: &Tenant, obj: &K, reason: &str, message: &str)
where
    K: Resource<DynamicType = ()>,
{
    {
        let mut told = cx.told.lock().unwrap_or_else(|e| e.into_inner());
        let said = told.entry(obj.uid().unwrap_or_default()).or_default();
        if said.get(reason).map(String::as_str) == Some(message) {
            return;
        }
        said.insert(reason.to_string(), message.to_string());
    }
    let event = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(message.chars().take(1000).collect()),
        action: "Sync".into(),
        secondary: None,
    };
    if let Err(e) = cx.recorder.publish(&event, &obj.object_ref(&())).await {
        warn!(error = %e, "publishing an event in the tenant failed");
    }
}

/// Forget what was said about the object of `uid` (it synced, or it is gone).
pub fn forget(cx: &Tenant, uid: &str) {
    cx.told
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(uid);
}
