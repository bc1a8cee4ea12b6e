//! The second phase: the isolation boundary around the tenant's namespace (its Pod Security
//! labels, NetworkPolicies, ResourceQuota and LimitRange), as the IsolationProfile asks.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tenantplane_api::{IsolationProfile, TenantCluster};

use crate::Error;
use crate::apply;
use crate::build;
use crate::cache;
use crate::context::Context;
use crate::names::{self, FIELD_MANAGER};

pub(crate) async fn namespace(
    tc: &TenantCluster,
    profile: &IsolationProfile,
    ctx: &Context,
) -> Result<(), Error> {
    let (tenant, ns) = build::identity(tc)?;
    let client = &ctx.client;
    let caches = &ctx.caches;
    let options = &ctx.options.build;
    let wanted_labels = build::isolation::namespace_labels(profile);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let live_labels = cache::get(&caches.namespaces, None, &ns)
        .and_then(|n| n.metadata.labels.clone())
        .unwrap_or_default();
    if wanted_labels
        .iter()
        .any(|(k, v)| live_labels.get(k) != Some(v))
    {
        set_namespace_labels(&namespaces, &ns, &wanted_labels).await?;
    }
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    let desired_policies = build::isolation::network_policies(tc, profile, options)?;
    for policy in &desired_policies {
        apply::ensure(&policies, &caches.network_policies, policy).await?;
    }
    if desired_policies.is_empty() {
        for name in [
            names::isolation_policy(&tenant),
            names::control_plane_policy(&tenant),
        ] {
            apply::ensure_absent(&policies, &caches.network_policies, &ns, &name).await?;
        }
    }
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &ns);
    apply::ensure(
        &quotas,
        &caches.quotas,
        &build::quota::resource_quota(tc, profile)?,
    )
    .await?;
    let limits: Api<LimitRange> = Api::namespaced(client.clone(), &ns);
    apply::ensure_optional(
        &limits,
        &caches.limit_ranges,
        build::quota::limit_range(tc, profile)?,
        &ns,
        &names::limit_range(&tenant),
    )
    .await?;
    Ok(())
}

/// Server-side apply of the namespace's Pod Security labels under our field manager; applying an
/// empty set removes them again.
pub(crate) async fn set_namespace_labels(
    namespaces: &Api<Namespace>,
    ns: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), Error> {
    let patch = json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": ns, "labels": labels},
    });
    namespaces
        .patch(
            ns,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    Ok(())
}
