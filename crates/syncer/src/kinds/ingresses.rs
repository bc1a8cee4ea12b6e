//! Ingresses go down when the policy says so and the profile admits them (see `allow`), their
//! backends and TLS Secrets translated; a TLS Secret follows only an admitted Ingress. The
//! host's address comes back.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::copy::CopyDown;
use crate::copy_down_kind;
use crate::error::Result;
use kube::runtime::watcher;
use tenantplane_api::SyncPolicySpec;

use crate::key::Key;
use crate::kind_trait::{Kind, tenant_watch_config};
use crate::tell::Review;
use crate::tenant::Tenant;
use crate::translate::Translator;

/// Ingresses, copied down when the policy says so and the profile admits them.
pub struct Ingresses;

copy_down_kind!(Ingresses, Ingress, "Ingress", to_host.ingresses as "ingresses", then = after_copy;
    fn tenant_watch(p: &SyncPolicySpec) -> Option<watcher::Config> {
        Self::enabled(p).then(tenant_watch_config)
    }

    fn tenant_keys(i: &Ingress) -> Vec<Key> {
        let mut keys = vec![Key::for_object::<Self>(i)];
        keys.extend(tls_keys(i));
        keys
    }
);

impl CopyDown for Ingresses {
    fn wanted(cx: &Tenant, i: &Ingress) -> bool {
        Self::synced(cx, &i.metadata)
    }

    fn review(tr: &Translator, ingress: &Ingress) -> Review {
        let spec = ingress.spec.clone().unwrap_or_default();
        let (kept, dropped) = tr.annotations(Self::NAME, &ingress.metadata);
        let mut refused = crate::allow::ingress_refusals(&tr.allow, &spec);
        refused.extend(crate::allow::ingress_annotation_refusals(
            &tr.allow, &spec, &kept,
        ));
        Review { refused, dropped }
    }

    fn translate(tr: &Translator, ingress: &Ingress, host_name: &str) -> Ingress {
        let ns = ingress.namespace().unwrap_or_default();
        let mut spec = ingress.spec.clone().unwrap_or_default();
        let backend = |b: &mut IngressBackend| {
            if let Some(s) = b.service.as_mut() {
                s.name = tr.host_name(&ns, &s.name);
            }
            b.resource = None;
        };
        if let Some(b) = spec.default_backend.as_mut() {
            backend(b);
        }
        for rule in spec.rules.iter_mut().flatten() {
            for path in rule.http.iter_mut().flat_map(|h| h.paths.iter_mut()) {
                backend(&mut path.backend);
            }
        }
        for tls in spec.tls.iter_mut().flatten() {
            if let Some(name) = tls.secret_name.as_mut() {
                *name = tr.host_name(&ns, name);
            }
        }
        let mut metadata = tr.host_meta(Self::NAME, &ingress.metadata, host_name);
        // An Ingress carrying them is refused; never copied even so.
        if let Some(a) = metadata.annotations.as_mut() {
            a.retain(|k, _| !crate::allow::never_copied(k));
        }
        Ingress {
            metadata,
            spec: Some(spec),
            status: None,
        }
    }
}

/// The keys an Ingress change wakes: itself and its TLS Secrets.
pub fn tls_keys(i: &Ingress) -> Vec<Key> {
    let ns = i.namespace().unwrap_or_default();
    i.spec
        .iter()
        .flat_map(|s| s.tls.iter().flatten())
        .filter_map(|t| t.secret_name.clone())
        .map(|s| Key::of_object::<Secret>(ns.clone(), s))
        .collect()
}

/// Is Secret `ns/name` the TLS certificate of an Ingress the profile admits and the host took?
/// A refused Ingress pulls nothing onto the host.
pub fn uses_tls_secret(cx: &Tenant, ns: &str, name: &str) -> bool {
    cx.tenant_list::<Ingress>().iter().any(|i| {
        i.namespace().as_deref() == Some(ns)
            && Ingresses::synced(cx, &i.metadata)
            && tls_secrets(i).any(|s| s == name)
            && Ingresses::review(&cx.tr, i).refused.is_empty()
            && cx.is_copied::<Ingress>(ns, &i.name_any())
    })
}

fn tls_secrets(i: &Ingress) -> impl Iterator<Item = &str> {
    i.spec
        .iter()
        .flat_map(|s| s.tls.iter().flatten())
        .filter_map(|t| t.secret_name.as_deref())
}

/// Once the host has the copy: its TLS Secrets follow, and the host's address comes back.
async fn after_copy(cx: &Tenant, t: &Arc<Ingress>, h: &Arc<Ingress>) -> Result<()> {
    let ns = t.namespace().unwrap_or_default();
    for secret in tls_secrets(t).filter(|s| !cx.is_copied::<Secret>(&ns, s)) {
        cx.queue.add(Key::of_object::<Secret>(ns.clone(), secret));
    }
    address_up(cx, t, h).await
}

/// The host's load-balancer address shows on the tenant's Ingress.
async fn address_up(cx: &Tenant, t: &Arc<Ingress>, h: &Arc<Ingress>) -> Result<()> {
    let h_lb = h.status.as_ref().and_then(|s| s.load_balancer.clone());
    if h_lb.as_ref().is_some_and(|lb| lb.ingress.is_some())
        && h_lb != t.status.as_ref().and_then(|s| s.load_balancer.clone())
    {
        cx.tenant_api::<Ingress>(&t.namespace().unwrap_or_default())
            .patch_status(
                &t.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"loadBalancer": h_lb}})),
            )
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::tests::{host_name_of, translator};

    #[test]
    fn an_admitted_annotation_that_calls_a_url_refuses_the_ingress() {
        let ingress: Ingress = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "annotations": {
                "nginx.ingress.kubernetes.io/auth-url": "http://10.96.0.1/"
            }},
            "spec": {"rules": [{"host": "web.example.com"}]}
        }))
        .unwrap();
        let mut tr = translator();
        tr.allow.ingress_hosts = vec!["*".into()];
        // Not admitted by key: left out, the Ingress goes down without it.
        let review = Ingresses::review(&tr, &ingress);
        assert!(
            review.refused.is_empty() && review.dropped.len() == 1,
            "{review:?}"
        );
        tr.allow.annotations.ingresses = vec!["*".into()];
        let review = Ingresses::review(&tr, &ingress);
        assert!(review.refused[0].contains("URL"), "{review:?}");
    }

    #[test]
    fn ingress_backends_are_translated_and_snippets_dropped() {
        let ingress: Ingress = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "annotations": {
                "nginx.ingress.kubernetes.io/configuration-snippet": "more_set_headers x",
                "nginx.ingress.kubernetes.io/auth-tls-secret": "kube-system/ca",
                "nginx.ingress.kubernetes.io/rewrite-target": "/"
            }},
            "spec": {
                "tls": [{"secretName": "web-tls"}],
                "rules": [{"http": {"paths": [{"path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]
            }
        }))
        .unwrap();
        let host_name = host_name_of(&translator(), &ingress.metadata);
        let plain = Ingresses::translate(&translator(), &ingress, &host_name);
        let annotations = plain.metadata.annotations.unwrap();
        assert!(
            !annotations.keys().any(|k| k.starts_with("nginx.")),
            "none unless the profile allows them"
        );
        let mut tr = translator();
        tr.allow.annotations.ingresses = vec!["nginx.ingress.kubernetes.io/*".into()];
        let host = Ingresses::translate(&tr, &ingress, &host_name);
        let annotations = host.metadata.annotations.unwrap();
        assert!(annotations.contains_key("nginx.ingress.kubernetes.io/rewrite-target"));
        assert!(
            !annotations.keys().any(|k| k.contains("snippet")),
            "snippets never, whatever the profile allows"
        );
        assert!(!annotations.contains_key("nginx.ingress.kubernetes.io/auth-tls-secret"));
        let spec = host.spec.unwrap();
        assert_eq!(
            spec.tls.unwrap()[0].secret_name.as_deref(),
            Some("web-tls-x-default-x-dev")
        );
        let rules = spec.rules.unwrap();
        let backend = &rules[0].http.as_ref().unwrap().paths[0].backend;
        assert_eq!(
            backend.service.as_ref().unwrap().name,
            "web-x-default-x-dev"
        );
        assert_eq!(
            tls_keys(&ingress),
            [Key::new("Secret", "default", "web-tls")]
        );
    }
}
