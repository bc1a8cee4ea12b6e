//! Service-account tokens of synced pods: minted by TokenRequest on the tenant API, bound to the
//! tenant pod, kept in a host Secret owned by the host pod (which mounts it where the tenant pod
//! projects its token), and minted again at 80% of their lifetime, as the kubelet does.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{ObjectMeta, PostParams};

use super::meta::pod_meta;
use crate::converge::{self, Target};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::naming::{self, SYNCER_MANAGER, token_secret_name};
use crate::tenant::Tenant;

/// A service-account token a tenant pod mounts, and the key of the host Secret that holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenSource {
    /// The key in the host Secret that holds this token.
    pub key: String,
    /// Who the token is for; `None`, the API server's default audience.
    pub audience: Option<String>,
    /// How long the token is valid, in seconds.
    pub expiration_seconds: i64,
}

/// The default lifetime kube-apiserver gives the tokens it projects (`kube-api-access-*`).
const DEFAULT_TOKEN_SECONDS: i64 = 3607;

/// The service-account tokens a tenant pod mounts, in the order the pod translation numbers them.
pub fn token_sources(pod: &Pod) -> Vec<TokenSource> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten())
        .filter_map(|s| s.service_account_token.as_ref())
        .enumerate()
        .map(|(i, t)| TokenSource {
            key: format!("token-{i}"),
            audience: t.audience.clone().filter(|a| !a.is_empty()),
            expiration_seconds: t.expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS),
        })
        .collect()
}

/// Keep the host Secret with tenant pod `t`'s tokens fresh for its copy `h`; `key`, the pod's,
/// is queued when they are due again.
pub async fn ensure_tokens(cx: &Tenant, key: &Key, t: &Pod, h: &Pod) -> Result<()> {
    let sources = token_sources(t);
    if sources.is_empty() || h.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let host_name = h.name_any();
    let secret_name = token_secret_name(&host_name);
    let h_uid = h.uid().unwrap_or_default();
    let now = Timestamp::now();
    let existing = cx.host_get::<Secret>(true, &secret_name);
    let refresh_at = existing
        .as_ref()
        .filter(|s| s.owner_references().iter().any(|o| o.uid == h_uid))
        .and_then(|s| {
            s.annotations()
                .get(naming::ANNOTATION_TOKEN_REFRESH)
                .cloned()
        })
        .and_then(|t| t.parse::<Timestamp>().ok());
    if let Some(at) = refresh_at
        && at > now
    {
        schedule_refresh(cx, key, &h_uid, at, now);
        return Ok(());
    }
    let ns = t.namespace().unwrap_or_default();
    let sa = t
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let accounts = cx.tenant_api::<ServiceAccount>(&ns);
    let mut data = BTreeMap::new();
    let mut lifetime = i64::MAX;
    for source in &sources {
        let request = TokenRequest {
            metadata: ObjectMeta::default(),
            spec: Some(TokenRequestSpec {
                audiences: Some(source.audience.clone().into_iter().collect()),
                expiration_seconds: Some(source.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(t.name_any()),
                    uid: t.uid(),
                }),
            }),
            status: None,
        };
        let issued = accounts
            .create_token_request(&sa, &PostParams::default(), &request)
            .await?;
        let issued = issued.status.map(|s| (s.expiration_timestamp, s.token));
        let Some((Some(expires), Some(token))) = issued else {
            return Err(Error::TokenRequestFailed(format!("{ns}/{sa}")));
        };
        let seconds = expires.0.duration_since(now).as_secs();
        lifetime = lifetime.min(seconds.max(60));
        data.insert(
            source.key.clone(),
            k8s_openapi::ByteString(token.into_bytes()),
        );
    }
    // Minted again at 80% of the shortest lifetime, as the kubelet does.
    let at = now
        .checked_add(Duration::from_secs((lifetime as u64) * 4 / 5))
        .unwrap_or(now);
    let mut meta = pod_meta(&cx.tr, t, &h.name_any());
    meta.name = Some(secret_name.clone());
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(naming::ANNOTATION_TOKEN_REFRESH.into(), at.to_string());
    // Owned by the host pod, so it goes with it.
    meta.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: host_name,
        uid: h_uid.clone(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    let secret = Secret {
        metadata: meta,
        data: Some(data),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    converge::converge(
        &cx.host_api::<Secret>(),
        SYNCER_MANAGER,
        existing.as_deref(),
        &secret,
        Target::Any,
    )
    .await?;
    schedule_refresh(cx, key, &h_uid, at, now);
    Ok(())
}

fn schedule_refresh(cx: &Tenant, key: &Key, h_uid: &str, at: Timestamp, now: Timestamp) {
    let fresh = cx
        .refresh_scheduled
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(h_uid.to_string(), at)
        != Some(at);
    if fresh {
        // Rounded up, so that the pass finds the token due rather than a moment early.
        let wait = at.duration_since(now).as_secs().max(0) as u64 + 1;
        cx.queue.add_after(key.clone(), Duration::from_secs(wait));
    }
}

/// Forget the refresh of a host pod whose copy goes.
pub fn forget(cx: &Tenant, h_uid: &str) {
    cx.refresh_scheduled
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(h_uid);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::pods::references::tests::pod;

    #[test]
    fn a_pods_projected_token_is_found() {
        let tokens = token_sources(&pod());
        assert_eq!(tokens.len(), 1);
        assert_eq!(tokens[0].expiration_seconds, 3607);
    }
}
