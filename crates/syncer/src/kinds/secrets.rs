//! Secrets go down when a synced pod or Ingress uses them, or all of them when the policy says
//! so. Tenant service-account token Secrets never do (tokens reach pods through `tokens`), and a
//! copy never has a type a host controller acts on.

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;

use crate::copy::CopyDown;
use crate::copy_down_kind;
use crate::kind::{Key, Kind};
use crate::kinds::{ingresses, pods};
use crate::naming;
use crate::tenant::Tenant;
use crate::translate::Translator;

pub struct Secrets;

copy_down_kind!(Secrets, Secret, "Secret";
    fn host_keys(s: &Secret, tenant: &str) -> Vec<Key> {
        host_keys(s, tenant)
    }
);

const TOKEN_TYPE: &str = "kubernetes.io/service-account-token";

impl CopyDown for Secrets {
    fn wanted(cx: &Tenant, s: &Secret) -> bool {
        let setting = &cx.policy.to_host.secrets;
        let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
        setting.enabled
            && cx.selected(Self::NAME, &s.metadata)
            && s.type_.as_deref() != Some(TOKEN_TYPE)
            && (setting.all
                || pods::referenced(cx, &ns, |r| r.secrets.contains(&name))
                || ingresses::uses_tls_secret(cx, &ns, &name))
    }

    fn translate(tr: &Translator, secret: &Secret) -> Secret {
        // A copied token Secret type would make the host's token controller act on it.
        let type_ = match secret.type_.as_deref() {
            Some(TOKEN_TYPE) | None => Some("Opaque".to_string()),
            other => other.map(String::from),
        };
        Secret {
            metadata: tr.host_meta(Self::NAME, &secret.metadata),
            data: secret.data.clone(),
            string_data: None,
            type_,
            immutable: None,
        }
    }

    fn must_replace(desired: &Secret, live: &Secret) -> bool {
        // The type cannot change in place.
        desired.type_ != live.type_
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
        vec![Key::of::<pods::Pods>(v.namespace, v.name)]
    } else {
        vec![Key::of::<Secrets>(v.namespace, v.name)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::tests::translator;
    use serde_json::json;

    #[test]
    fn token_secrets_are_never_copied_as_token_secrets() {
        let s: Secret = serde_json::from_value(json!({
            "metadata": {"name": "t", "namespace": "default"},
            "type": "kubernetes.io/service-account-token"
        }))
        .unwrap();
        assert_eq!(
            Secrets::translate(&translator(), &s).type_.as_deref(),
            Some("Opaque")
        );
    }

    #[test]
    fn a_host_token_secret_wakes_its_pod() {
        let mut meta = translator().host_meta(
            "Secret",
            &serde_json::from_value(json!({"name": "web-0", "namespace": "default"})).unwrap(),
        );
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
}
