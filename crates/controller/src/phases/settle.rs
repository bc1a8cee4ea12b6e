//! Whether a tenant that answers and syncs can take a first `kubectl apply` of a pod: its
//! controller manager has made the `default` ServiceAccount in `default` (without it the tenant
//! API server refuses every pod there), and its DNS has a ready endpoint. The tenant turns Ready
//! only then, the first time and after each upgrade or wake, so a script that waits for Ready
//! and then applies does not fail.

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use tenantplane_api::SyncPolicySpec;
use tenantplane_syncer::addons::{DNS_NAMESPACE, DNS_SERVICE};

/// The namespace and the ServiceAccount a first pod uses.
const DEFAULT: &str = "default";

/// What a first pod still waits for in the tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Unsettled {
    /// On its way: what it waits for, in words.
    Waiting(String),
    /// It cannot come: the tenant's DNS pod is refused (the IsolationProfile, or the host's
    /// admission, stops it), which is the platform's to fix. What it waits for, and why not.
    Blocked(String),
}

/// What a first pod still waits for in the tenant; `None` when nothing.
pub(crate) async fn waiting_for(
    tenant: &kube::Client,
    policy: &SyncPolicySpec,
) -> Option<Unsettled> {
    let accounts: Api<ServiceAccount> = Api::namespaced(tenant.clone(), DEFAULT);
    let account = "the ServiceAccount default/default, which the tenant's controller manager makes";
    match accounts.get_opt(DEFAULT).await {
        Ok(Some(_)) => {}
        Ok(None) => return Some(Unsettled::Waiting(account.to_string())),
        Err(e) => return Some(Unsettled::Waiting(format!("{account} (reading it: {e})"))),
    }
    if !runs_dns(policy) {
        return None;
    }
    let slices: Api<EndpointSlice> = Api::namespaced(tenant.clone(), DNS_NAMESPACE);
    let selector = format!("kubernetes.io/service-name={DNS_SERVICE}");
    let dns = format!(
        "the tenant's DNS (Service {DNS_NAMESPACE}/{DNS_SERVICE}) to have a ready endpoint"
    );
    match slices.list(&ListParams::default().labels(&selector)).await {
        Ok(list) if dns_ready(&list.items) => None,
        Ok(_) => {
            let pods: Api<Pod> = Api::namespaced(tenant.clone(), DNS_NAMESPACE);
            let dns_pods = pods
                .list(&ListParams::default().labels(&format!("k8s-app={DNS_SERVICE}")))
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            Some(match refused(&dns_pods) {
                Some(why) => Unsettled::Blocked(format!("{dns}, which cannot come: {why}")),
                None => Unsettled::Waiting(dns),
            })
        }
        Err(e) => Some(Unsettled::Waiting(format!(
            "{dns} (reading its EndpointSlices: {e})"
        ))),
    }
}

/// Why the first of these DNS pods that the syncer or the host refused does not run: its
/// `PodScheduled` condition, as the syncer wrote it.
fn refused(pods: &[Pod]) -> Option<String> {
    pods.iter().find_map(|p| {
        let c = p
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
        let reason = c.reason.as_deref()?;
        ["NotAllowed", "HostRejected"].contains(&reason).then(|| {
            format!(
                "pod {DNS_NAMESPACE}/{} is refused ({reason}: {})",
                p.metadata.name.as_deref().unwrap_or_default(),
                c.message.as_deref().unwrap_or_default()
            )
        })
    })
}

/// Does the tenant's DNS run on the host? Its pod syncs only when every pod does; a policy
/// that syncs no pods, or only some, leaves DNS to whoever set it so, and a first pod need not
/// wait for it.
fn runs_dns(policy: &SyncPolicySpec) -> bool {
    policy.to_host.pods.enabled && policy.to_host.pods.selector.is_none()
}

/// Does one of these slices hold a ready endpoint? An endpoint without the condition counts as
/// ready, as the EndpointSlice API says consumers should read it.
fn dns_ready(slices: &[EndpointSlice]) -> bool {
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .any(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(ready: &[Option<bool>]) -> EndpointSlice {
        let endpoints: Vec<serde_json::Value> = ready
            .iter()
            .map(|r| match r {
                Some(r) => json!({"addresses": ["10.0.0.1"], "conditions": {"ready": r}}),
                None => json!({"addresses": ["10.0.0.1"]}),
            })
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "kube-dns-x", "namespace": "kube-system"},
            "addressType": "IPv4",
            "endpoints": endpoints,
        }))
        .unwrap()
    }

    #[test]
    fn dns_is_ready_once_one_endpoint_is() {
        assert!(!dns_ready(&[]), "no slice yet");
        assert!(!dns_ready(&[slice(&[])]), "no endpoint yet");
        assert!(!dns_ready(&[slice(&[Some(false)])]), "its pod is not Ready");
        assert!(dns_ready(&[slice(&[Some(false)]), slice(&[Some(true)])]));
        assert!(dns_ready(&[slice(&[None])]), "no condition reads as ready");
    }

    #[test]
    fn a_refused_dns_pod_is_named_with_why() {
        let pod = |reason: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "coredns-1", "namespace": "kube-system"},
                "status": {"conditions": [{"type": "PodScheduled", "status": "False",
                    "reason": reason, "message": "image from docker.io"}]}
            }))
            .unwrap()
        };
        assert_eq!(
            refused(&[pod("NotAllowed")]).as_deref(),
            Some("pod kube-system/coredns-1 is refused (NotAllowed: image from docker.io)")
        );
        assert_eq!(refused(&[pod("Unschedulable")]), None, "on its way");
        assert_eq!(refused(&[]), None);
    }

    #[test]
    fn dns_is_waited_for_only_when_every_pod_syncs() {
        let mut policy = SyncPolicySpec::default();
        policy.to_host.pods.enabled = true;
        assert!(runs_dns(&policy));
        policy.to_host.pods.selector = Some(Default::default());
        assert!(!runs_dns(&policy), "a selector may leave DNS out");
        policy.to_host.pods.enabled = false;
        assert!(!runs_dns(&policy));
    }
}
