//! What a tenant pod uses (its ConfigMaps, Secrets, claims and ServiceAccount), by tenant name:
//! only those are synced for it.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod, SecretVolumeSource};
use kube::ResourceExt;

use crate::tenant::Tenant;

/// The ConfigMaps, Secrets and claims a pod uses, by tenant name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct References {
    /// ConfigMaps the pod mounts or reads its environment from.
    pub config_maps: BTreeSet<String>,
    /// Secrets the pod mounts, reads its environment from, or pulls its images with.
    pub secrets: BTreeSet<String>,
    /// PersistentVolumeClaims the pod's volumes name.
    pub claims: BTreeSet<String>,
    /// The ServiceAccount the pod runs as, if it names one.
    pub service_account: Option<String>,
}

/// What a pod uses, so that only those ConfigMaps, Secrets and claims are synced.
pub fn references(pod: &Pod) -> References {
    let mut r = References::default();
    let Some(spec) = pod.spec.as_ref() else {
        return r;
    };
    r.service_account = spec.service_account_name.clone();
    for v in spec.volumes.iter().flatten() {
        if let Some(cm) = &v.config_map {
            r.config_maps.insert(cm.name.clone());
        }
        if let Some(SecretVolumeSource {
            secret_name: Some(name),
            ..
        }) = &v.secret
        {
            r.secrets.insert(name.clone());
        }
        if let Some(pvc) = &v.persistent_volume_claim {
            r.claims.insert(pvc.claim_name.clone());
        }
        if v.ephemeral.is_some() {
            r.claims.insert(ephemeral_claim(&pod.name_any(), &v.name));
        }
        if let Some(s) = v
            .csi
            .as_ref()
            .and_then(|c| c.node_publish_secret_ref.as_ref())
        {
            r.secrets.insert(s.name.clone());
        }
        for s in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(cm) = &s.config_map {
                r.config_maps.insert(cm.name.clone());
            }
            if let Some(secret) = &s.secret {
                r.secrets.insert(secret.name.clone());
            }
        }
    }
    // Ephemeral containers' too: one started by `kubectl debug` reads them as the others do.
    let ephemeral: Vec<_> = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(as_container)
        .collect();
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .chain(&ephemeral)
    {
        for e in c.env.iter().flatten() {
            if let Some(from) = &e.value_from {
                if let Some(k) = &from.config_map_key_ref {
                    r.config_maps.insert(k.name.clone());
                }
                if let Some(k) = &from.secret_key_ref {
                    r.secrets.insert(k.name.clone());
                }
            }
        }
        for e in c.env_from.iter().flatten() {
            if let Some(k) = &e.config_map_ref {
                r.config_maps.insert(k.name.clone());
            }
            if let Some(k) = &e.secret_ref {
                r.secrets.insert(k.name.clone());
            }
        }
    }
    for s in spec.image_pull_secrets.iter().flatten() {
        r.secrets.insert(s.name.clone());
    }
    r
}

/// Is something in tenant namespace `ns` used by a pod that syncs (`pick` says what)?
/// Only pods the host admitted count: a pod refused by the profile or the host pulls nothing
/// onto the host.
pub fn referenced(cx: &Tenant, ns: &str, pick: impl Fn(&References) -> bool) -> bool {
    cx.tenant_list::<Pod>().iter().any(|p| {
        p.namespace().as_deref() == Some(ns)
            && cx.syncs::<Pod>(&p.metadata)
            && pick(&references(p))
            && cx.is_copied::<Pod>(ns, &p.name_any())
    })
}

/// The name of the claim the tenant's ephemeral-volume controller makes for volume `volume` of
/// pod `pod`.
pub fn ephemeral_claim(pod: &str, volume: &str) -> String {
    format!("{pod}-{volume}")
}

/// Ephemeral container `ec` as a container: the fields the two share (all but the target).
pub fn as_container(ec: &EphemeralContainer) -> Container {
    let mut value = serde_json::to_value(ec).unwrap_or_default();
    if let Some(o) = value.as_object_mut() {
        o.remove("targetContainerName");
    }
    serde_json::from_value(value).unwrap_or_default()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "default"},
            "spec": {
                "imagePullSecrets": [{"name": "regcred"}],
                "containers": [{
                    "name": "web", "image": "nginx",
                    "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "conf", "key": "a"}}}],
                    "envFrom": [{"secretRef": {"name": "creds"}}]
                }],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                    {"name": "kube-api-access-abc", "projected": {"sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
                    ]}}
                ]
            }
        }))
        .unwrap()
    }

    #[test]
    fn references_and_tokens_are_found() {
        let r = references(&pod());
        assert_eq!(
            r.config_maps,
            BTreeSet::from(["conf".to_string(), "kube-root-ca.crt".to_string()])
        );
        assert_eq!(
            r.secrets,
            BTreeSet::from(["creds".to_string(), "regcred".to_string()])
        );
        assert_eq!(r.claims, BTreeSet::from(["data".to_string()]));
    }
}
