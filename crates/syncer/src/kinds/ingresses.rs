//! Ingresses go down when the policy says so, their backends and TLS Secrets translated, without
//! the annotations that make an ingress controller run what the tenant wrote; the host's address
//! comes back.

use std::sync::Arc;

use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::copy::CopyDown;
use crate::copy_down_kind;
use crate::error::Result;
use kube::runtime::watcher;
use tenantplane_api::SyncPolicySpec;

use crate::kind::{Key, Kind, tenant_watch_config};
use crate::kinds::secrets::Secrets;
use crate::tell::Review;
use crate::tenant::Tenant;
use crate::translate::Translator;

pub struct Ingresses;

copy_down_kind!(Ingresses, Ingress, "Ingress", then = address_up;
    fn tenant_watch(p: &SyncPolicySpec) -> Option<watcher::Config> {
        p.to_host.ingresses.enabled.then(tenant_watch_config)
    }

    fn tenant_keys(i: &Ingress) -> Vec<Key> {
        let mut keys = vec![Key::for_object::<Self>(i)];
        keys.extend(tls_keys(i));
        keys
    }
);

impl CopyDown for Ingresses {
    fn wanted(cx: &Tenant, i: &Ingress) -> bool {
        cx.policy.to_host.ingresses.enabled && cx.selected(Self::NAME, &i.metadata)
    }

    fn review(tr: &Translator, ingress: &Ingress) -> Review {
        Review {
            refused: crate::allow::ingress_refusals(
                &tr.allow,
                &ingress.spec.clone().unwrap_or_default(),
            ),
            dropped: tr.annotations(Self::NAME, &ingress.metadata).1,
        }
    }

    fn translate(tr: &Translator, ingress: &Ingress) -> Ingress {
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
        let mut metadata = tr.host_meta(Self::NAME, &ingress.metadata);
        // Snippet annotations make an ingress controller run configuration the tenant wrote, with
        // the controller's rights on the host (ingress-nginx reads Secrets that way): never copied.
        if let Some(a) = metadata.annotations.as_mut() {
            a.retain(|k, _| !never_copied(k));
        }
        Ingress {
            metadata,
            spec: Some(spec),
            status: None,
        }
    }
}

/// Ingress annotations never copied, whatever the profile allows: snippets (configuration the
/// controller runs with its own rights), and those that name Secrets or Services of any namespace,
/// URLs the controller calls, or hosts beyond the Ingress's own.
fn never_copied(key: &str) -> bool {
    const NAMING_OTHERS: &[&str] = &[
        "auth-url",
        "auth-signin",
        "auth-secret",
        "auth-tls-secret",
        "auth-tls-match-cn",
        "proxy-ssl-secret",
        "default-backend",
        "mirror-target",
        "mirror-host",
        "server-alias",
    ];
    let key = key.to_ascii_lowercase();
    let name = key.rsplit('/').next().unwrap_or_default();
    key.contains("snippet") || NAMING_OTHERS.contains(&name)
}

/// The keys an Ingress change wakes: itself and its TLS Secrets.
pub fn tls_keys(i: &Ingress) -> Vec<Key> {
    let ns = i.namespace().unwrap_or_default();
    i.spec
        .iter()
        .flat_map(|s| s.tls.iter().flatten())
        .filter_map(|t| t.secret_name.clone())
        .map(|s| Key::of::<Secrets>(ns.clone(), s))
        .collect()
}

/// Is Secret `ns/name` the TLS certificate of a synced Ingress?
pub fn uses_tls_secret(cx: &Tenant, ns: &str, name: &str) -> bool {
    cx.policy.to_host.ingresses.enabled
        && cx.tenant_list::<Ingress>().iter().any(|i| {
            i.namespace().as_deref() == Some(ns)
                && cx.selected(Ingresses::NAME, &i.metadata)
                && i.spec
                    .iter()
                    .flat_map(|s| s.tls.iter().flatten())
                    .any(|t| t.secret_name.as_deref() == Some(name))
        })
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
    use crate::translate::tests::translator;

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
        let plain = Ingresses::translate(&translator(), &ingress);
        let annotations = plain.metadata.annotations.unwrap();
        assert!(
            !annotations.keys().any(|k| k.starts_with("nginx.")),
            "none unless the profile allows them"
        );
        let mut tr = translator();
        tr.allow.annotations.ingresses = vec!["nginx.ingress.kubernetes.io/*".into()];
        let host = Ingresses::translate(&tr, &ingress);
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
