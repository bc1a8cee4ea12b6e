//! Telling the tenant what the syncer would not do with one of its objects: a Warning Event on
//! the object, once per distinct message (an object looked at again says nothing new).

use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use tenantplane_api::text::{bounded, capped_list};
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

/// How many reasons one sentence gives; a tenant object can give thousands.
const REASONS_LISTED: usize = 5;

impl Review {
    /// The refusal as one error, if there is one: the first few reasons, bounded.
    pub fn refusal(&self) -> Option<Error> {
        (!self.refused.is_empty()).then(|| Error::NotAllowed(said(&self.refused)))
    }

    /// What the copy leaves out, as one bounded sentence; empty when nothing.
    pub fn left_out(&self) -> String {
        said(&self.dropped)
    }
}

/// Up to [`REASONS_LISTED`] sentences and how many more there are, bounded.
fn said(sentences: &[String]) -> String {
    bounded(&capped_list(sentences, REASONS_LISTED, "reason"))
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
        let _ = tell(cx, obj, NOT_COPIED, &review.left_out()).await;
    }
    match review.refusal() {
        Some(e) => match tell(cx, obj, NOT_ALLOWED, &e.to_string()).await {
            // Told: the refusal waits for the object or the profile to change.
            Ok(()) => Err(e),
            // Not told (the tenant API did not take the Event): tried again soon, so the tenant
            // is told why, rather than waiting for a change that may never come.
            Err(failed) => Err(failed),
        },
        None => Ok(()),
    }
}

/// A Warning Event on tenant object `obj`, unless the same was said last time. The note is
/// bounded (the API refuses a longer one, and the tenant would be told nothing). An Event the
/// tenant API did not take is not counted as said: the next converge says it again. Callers that
/// only inform may ignore the error; a refusal must not (see [`enforce`]).
pub async fn tell<K>(cx: &Tenant, obj: &K, reason: &str, message: &str) -> Result<()>
where
    K: Resource<DynamicType = ()>,
{
    let message = bounded(message);
    let uid = obj.uid().unwrap_or_default();
    {
        let mut told = cx.told.lock().unwrap_or_else(|e| e.into_inner());
        let said = told.entry(uid.clone()).or_default();
        if said.get(reason) == Some(&message) {
            return Ok(());
        }
        said.insert(reason.to_string(), message.clone());
    }
    let event = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(message),
        action: "Sync".into(),
        secondary: None,
    };
    if let Err(e) = cx.recorder.publish(&event, &obj.object_ref(&())).await {
        warn!(tenant = %cx.tr.name(), namespace = %cx.tr.host_namespace, reason, error = %crate::error::log_text(&e), "publishing an event in the tenant failed");
        if let Some(said) = cx
            .told
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&uid)
        {
            said.remove(reason);
        }
        return Err(e.into());
    }
    Ok(())
}

/// Was the object of `uid` last told `reason` (and not forgotten since)?
pub fn was_told(cx: &Tenant, uid: &str, reason: &str) -> bool {
    cx.told
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(uid)
        .is_some_and(|said| said.contains_key(reason))
}

/// Forget what was said about the object of `uid` (it synced, or it is gone).
pub fn forget(cx: &Tenant, uid: &str) {
    cx.told
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(uid);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_first_reasons_and_counts_the_rest_within_the_bound() {
        let review = Review {
            refused: (0..2000)
                .map(|i| {
                    format!(
                        "container c{i}: privileged is not allowed {}",
                        "x".repeat(500)
                    )
                })
                .collect(),
            dropped: vec!["annotations a are left out".into()],
        };
        let said = review.refusal().unwrap().to_string();
        assert!(said.starts_with("not allowed on the host: container c0: privileged"));
        assert!(
            said.len() <= tenantplane_api::text::MAX_TEXT_BYTES + 64,
            "{}",
            said.len()
        );
        assert!(said.ends_with("; and 1,999 more reasons"), "{said}");
        let few = Review {
            refused: (0..7).map(|i| format!("r{i}")).collect(),
            dropped: vec![],
        };
        assert_eq!(
            few.refusal().unwrap().to_string(),
            "not allowed on the host: r0; r1; r2; r3; r4; and 2 more reasons"
        );
        assert_eq!(review.left_out(), "annotations a are left out");
        assert!(Review::default().refusal().is_none());
    }
}
