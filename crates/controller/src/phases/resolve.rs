//! The first phase: this tenant may use its namespace (one TenantCluster per namespace), and the
//! IsolationProfile and SyncPolicy it references exist.

use tenantplane_api::{IsolationProfile, SyncPolicy, TenantCluster};

use super::{Phase, stop};
use crate::cache;
use crate::context::Context;
use crate::namespace::other_holder;
use crate::status::Progress;

/// The policies a tenant references, as the caches hold them.
pub(crate) struct Policies {
    pub profile: std::sync::Arc<IsolationProfile>,
    pub sync_policy: std::sync::Arc<SyncPolicy>,
}

pub(crate) async fn policies(tc: &TenantCluster, ctx: &Context) -> Phase<Policies> {
    // One tenant per namespace: the Pod Security labels and the NetworkPolicies are the
    // namespace's, so a second tenant there provisions nothing until the first is gone.
    if let Some(by) = other_holder(tc, ctx).await? {
        return stop(Progress::NamespaceInUse { by });
    }
    let caches = &ctx.caches;
    caches.ready().await;
    let profile_name = &tc.spec.isolation_profile_ref.name;
    let Some(profile) = cache::get(&caches.profiles, None, profile_name) else {
        return stop(Progress::PolicyMissing {
            kind: "IsolationProfile",
            name: profile_name.clone(),
        });
    };
    let policy_name = &tc.spec.sync_policy_ref.name;
    let Some(sync_policy) = cache::get(&caches.sync_policies, None, policy_name) else {
        return stop(Progress::PolicyMissing {
            kind: "SyncPolicy",
            name: policy_name.clone(),
        });
    };
    Ok(Policies {
        profile,
        sync_policy,
    })
}
