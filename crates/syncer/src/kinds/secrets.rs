//! Secrets go down when a synced pod or Ingress uses them, or all of them when the policy says
//! so. Tenant service-account token Secrets never do (tokens reach pods through `tokens`), and a
//! copy never has a type a host controller acts on.

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;

use kube::api::ObjectMeta;

use crate::allow;
use crate::copy::CopyDown;
use crate::copy_down_kind;
use crate::key::Key;
use crate::kind_trait::Kind;
use crate::kinds::ingresses;
use crate::kinds::pods::references;
use crate::naming;
use crate::tell::{self, Review};
use crate::tenant::Tenant;
use crate::translate::Translator;

/// Secrets, copied down when the policy or a synced pod asks for them.
pub struct Secrets;

copy_down_kind!(Secrets, Secret, "Secret", to_host.secrets as "secrets";
    fn host_keys(s: &Secret, tenant: &str) -> Vec<Key> {
        host_keys(s, tenant)
    }
);

pub(crate) const TOKEN_TYPE: &str = "kubernetes.io/service-account-token";

impl CopyDown for Secrets {
    fn wanted(cx: &Tenant, s: &Secret) -> bool {
        let setting = &cx.policy.to_host.secrets;
        let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
        Self::synced(cx, &s.metadata)
            && s.type_.as_deref() != Some(TOKEN_TYPE)
            && (setting.all
                || references::referenced(cx, &ns, |r| r.secrets.contains(&name))
                || ingresses::uses_tls_secret(cx, &ns, &name))
    }

    fn translate(tr: &Translator, secret: &Secret, host_name: &str) -> Secret {
        // A copied token Secret type would make the host's token controller act on it.
        let type_ = match secret.type_.as_deref() {
            Some(TOKEN_TYPE) | None => Some("Opaque".to_string()),
            other => other.map(String::from),
        };
        Secret {
            metadata: tr.host_meta(Self::NAME, &secret.metadata, host_name),
            data: secret.data.clone(),
            string_data: None,
            type_,
            immutable: None,
        }
    }

    fn review(tr: &Translator, secret: &Secret) -> Review {
        let bytes = allow::data_bytes(secret.string_data.as_ref(), secret.data.as_ref());
        review(tr, Self::NAME, &secret.metadata, bytes)
    }

    fn wake_dependents(cx: &Tenant, s: &Secret) {
        let bytes = allow::data_bytes(s.string_data.as_ref(), s.data.as_ref());
        let name = s.name_any();
        wake_users(cx, &s.metadata, bytes, |r| r.secrets.contains(&name));
    }

    fn must_replace(desired: &Secret, live: &Secret) -> bool {
        // The type cannot change in place.
        desired.type_ != live.type_
    }
}

/// What a data object's copy leaves out: the annotations the profile does not allow, and those
/// that point elsewhere; refused when its `bytes` of data are more than `allow.maxDataBytes`.
pub(crate) fn review(tr: &Translator, kind: &str, meta: &ObjectMeta, bytes: usize) -> Review {
    // Annotations naming other namespaces, providers or URLs are left out by the profile's
    // own check (`allow::annotations`), as for every kind.
    let dropped = tr.annotations(kind, meta).1;
    Review {
        refused: allow::DataCap::of(&tr.allow)
            .and_then(|cap| cap.refusal(bytes))
            .into_iter()
            .collect(),
        dropped,
    }
}

/// A data object of `bytes` bytes wakes the pods (`uses` says which) whose verdict under
/// `allow.maxDataBytes` it changed: those with a copy once it is over the cap (they are refused
/// now), and those without one once it is back within the cap after it was refused.
pub(crate) fn wake_users(
    cx: &Tenant,
    meta: &ObjectMeta,
    bytes: usize,
    uses: impl Fn(&references::References) -> bool,
) {
    let Some(cap) = allow::DataCap::of(&cx.tr.allow) else {
        return;
    };
    let over = cap.exceeded_by(bytes);
    let uid = meta.uid.clone().unwrap_or_default();
    if !over {
        if !tell::was_told(cx, &uid, tell::NOT_ALLOWED) {
            return;
        }
        // Once: the pods it held back are looked at again.
        tell::forget(cx, &uid);
    }
    let ns = meta.namespace.as_deref().unwrap_or_default();
    for p in cx.tenant_list::<Pod>() {
        if p.namespace().as_deref() == Some(ns)
            && cx.is_copied::<Pod>(ns, &p.name_any()) == over
            && uses(&references::references(&p))
        {
            cx.queue.add(Key::of_object::<Pod>(ns, p.name_any()));
        }
    }
}

/// Say `review`'s refusal on tenant object `obj`, as [`tell::enforce`] would.
pub(crate) async fn tell_refused<K: kube::Resource<DynamicType = ()>>(
    cx: &Tenant,
    obj: &K,
    review: &Review,
) {
    if let Some(e) = review.refusal() {
        let _ = tell::tell(cx, obj, tell::NOT_ALLOWED, &e.to_string()).await;
    }
}

/// A host token Secret belongs to a pod: it wakes the pod's key.
fn host_keys(s: &Secret, tenant: &str) -> Vec<Key> {
    let Some(v) = naming::virtual_of(&s.metadata, tenant) else {
        return vec![];
    };
    if s.annotations()
        .contains_key(naming::ANNOTATION_TOKEN_REFRESH)
    {
        vec![Key::of_object::<Pod>(v.namespace, v.name)]
    } else {
        vec![Key::of::<Secrets>(v.namespace, v.name)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::copy::{Step, step, syncable};
    use crate::translate::tests::{host_name_of, translator};
    use serde_json::json;

    #[test]
    fn token_secrets_are_never_copied_as_token_secrets() {
        let s: Secret = serde_json::from_value(json!({
            "metadata": {"name": "t", "namespace": "default"},
            "type": "kubernetes.io/service-account-token"
        }))
        .unwrap();
        let tr = translator();
        assert_eq!(
            Secrets::translate(&tr, &s, &host_name_of(&tr, &s.metadata))
                .type_
                .as_deref(),
            Some("Opaque")
        );
    }

    #[test]
    fn annotations_naming_other_namespaces_stay_in_the_tenant_even_when_all_are_allowed() {
        let mut tr = translator();
        tr.allow.annotations.secrets = vec!["*".into()];
        let s: Secret = serde_json::from_value(json!({
            "metadata": {"name": "mirror", "namespace": "default", "uid": "s1", "annotations": {
                "replicator.v1.mittwald.de/replicate-from": "kube-system/cloud-credentials",
                "reflector.v1.k8s.emberstack.com/reflects": "kube-system/creds, ops/creds",
                "example.com/middleware": "auth@kubernetescrd",
                "example.com/source": "https://vault.internal/v1/secret",
                "example.com/format": "text/plain",
                "example.com/path": "/etc/app/conf",
                "example.com/owner": "team-web"}}
        }))
        .unwrap();
        let copy = Secrets::translate(&tr, &s, &host_name_of(&tr, &s.metadata));
        let kept: Vec<&String> = copy.metadata.annotations.as_ref().unwrap().keys().collect();
        for gone in [
            "replicator.v1.mittwald.de/replicate-from",
            "reflector.v1.k8s.emberstack.com/reflects",
            "example.com/middleware",
            "example.com/source",
        ] {
            assert!(!kept.iter().any(|k| *k == gone), "{gone}: {kept:?}");
        }
        for stays in [
            "example.com/format",
            "example.com/path",
            "example.com/owner",
        ] {
            assert!(kept.iter().any(|k| *k == stays), "{stays}: {kept:?}");
        }
        assert!(kept.iter().any(|k| *k == naming::ANNOTATION_VIRTUAL_UID));
        let review = Secrets::review(&tr, &s);
        assert_eq!(review.dropped.len(), 4, "{:?}", review.dropped);
        let said = review
            .dropped
            .iter()
            .find(|d| d.contains("replicator.v1.mittwald.de/replicate-from"))
            .unwrap();
        assert!(said.contains("\"kube-system/cloud-credentials\""), "{said}");
    }

    #[test]
    fn a_host_token_secret_wakes_its_pod() {
        let tr = translator();
        let tenant_meta =
            serde_json::from_value(json!({"name": "web-0", "namespace": "default"})).unwrap();
        let mut meta = tr.host_meta("Secret", &tenant_meta, &host_name_of(&tr, &tenant_meta));
        meta.annotations.get_or_insert_default().insert(
            naming::ANNOTATION_TOKEN_REFRESH.into(),
            "2026-01-01T00:00:00Z".into(),
        );
        let s = Secret {
            metadata: meta,
            ..Default::default()
        };
        assert_eq!(host_keys(&s, "dev"), [Key::new("Pod", "default", "web-0")]);
    }

    // The copy-down driver's steps, on Secrets (moved from `copy`, which sits below the kinds).
    fn secret(type_: &str, deleting: bool) -> Secret {
        let mut s: Secret = serde_json::from_value(json!({
            "metadata": {"name": "creds", "namespace": "default", "uid": "s1"},
            "type": type_, "data": {"a": "Yg=="}
        }))
        .unwrap();
        if deleting {
            s.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
        }
        s
    }

    #[test]
    fn the_driver_makes_deletes_replaces_or_applies_the_copy() {
        let tr = translator();
        let t = secret("Opaque", false);
        let host_name = host_name_of(&tr, &t.metadata);
        let copy = Secrets::translate(&tr, &t, &host_name);
        let tr_of = |s: &Secret| Some(Secrets::translate(&tr, s, &host_name));
        assert_eq!(step::<Secrets>(None, None), Step::Nothing);
        assert_eq!(step::<Secrets>(None, Some(&copy)), Step::Delete);
        // A going object has no desired copy: its copy is deleted, or none is made.
        let going = secret("Opaque", true);
        assert!(syncable(Some(&going)).is_none());
        assert_eq!(syncable(Some(&t)), Some(&t));
        assert_eq!(step::<Secrets>(tr_of(&t), None), Step::Apply(copy.clone()));
        assert_eq!(
            step::<Secrets>(tr_of(&t), Some(&copy)),
            Step::Apply(copy.clone())
        );
        // A type cannot change in place.
        let tls = secret("kubernetes.io/tls", false);
        assert_eq!(step::<Secrets>(tr_of(&tls), Some(&copy)), Step::Replace);
    }
}
