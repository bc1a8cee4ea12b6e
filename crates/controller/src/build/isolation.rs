//! The isolation boundary around a tenant's namespace: Pod Security labels, NetworkPolicies,
//! ResourceQuota and LimitRange, from the IsolationProfile and the TenantCluster.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{LimitRange, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};
use tenantplane_api::{EgressPolicy, IsolationProfile, TenantCluster};

use super::{BuildOptions, identity, owned_metadata, typed};
use crate::{Error, names};

/// The cloud metadata address: never reachable from a tenant unless a profile lists it.
pub const METADATA_CIDR: &str = "169.254.169.254/32";

/// The Pod Security Admission labels for the tenant's namespace.
pub fn namespace_labels(profile: &IsolationProfile) -> BTreeMap<String, String> {
    let level = profile.spec.pod_security.as_str().to_string();
    ["enforce", "warn", "audit"]
        .into_iter()
        .flat_map(|mode| {
            [
                (format!("pod-security.kubernetes.io/{mode}"), level.clone()),
                (
                    format!("pod-security.kubernetes.io/{mode}-version"),
                    "latest".to_string(),
                ),
            ]
        })
        .collect()
}

/// NetworkPolicies of the tenant; empty when the profile turns them off.
///
/// - `<name>-isolation` (every pod of the namespace): ingress only from the namespace itself;
///   egress per `networking.egressPolicy`. Under `deny-by-default` that is the namespace, DNS and
///   the profile's CIDRs; never the host API server, node addresses or the metadata address.
///   `allow-all` opens egress except the metadata address.
/// - `<name>-control-plane` (the tenant API server): ingress on 6443 from the operator; egress
///   to the operator's kubelet endpoint when it serves one.
pub fn network_policies(
    tc: &TenantCluster,
    profile: &IsolationProfile,
    options: &BuildOptions,
) -> Result<Vec<NetworkPolicy>, Error> {
    if !profile.spec.network_policy.enabled {
        return Ok(Vec::new());
    }
    let (tenant, _) = identity(tc)?;
    let dns = json!({
        "to": [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    });
    let same_namespace = json!({"to": [{"podSelector": {}}]});
    let mut egress = match tc.spec.networking.egress_policy {
        EgressPolicy::DenyByDefault => vec![same_namespace, dns],
        EgressPolicy::AllowAll => vec![
            same_namespace,
            dns,
            json!({"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [METADATA_CIDR]}}, {"ipBlock": {"cidr": "::/0"}}]}),
            json!({"to": [{"namespaceSelector": {}}]}),
        ],
    };
    let allowed: Vec<Value> = profile
        .spec
        .network_policy
        .allowed_egress_cidrs
        .iter()
        .map(|cidr| json!({"ipBlock": {"cidr": cidr}}))
        .collect();
    if !allowed.is_empty() {
        egress.push(json!({"to": allowed}));
    }
    let isolation = json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": owned_metadata(tc, names::isolation_policy(&tenant))?,
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {}}]}],
            "egress": egress,
        },
    });
    let operator_peer = match &options.operator_namespace {
        Some(ns) => {
            json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}})
        }
        // Without a known operator namespace, the API server port is open to the cluster's pods;
        // the tenant API server still authenticates every client.
        None => json!({"namespaceSelector": {}}),
    };
    let mut control_plane = json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": owned_metadata(tc, names::control_plane_policy(&tenant))?,
        "spec": {
            "podSelector": {"matchLabels": names::control_plane_selector(&tenant)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [operator_peer.clone()], "ports": [{"protocol": "TCP", "port": names::API_PORT}]}],
        },
    });
    if options.kubelet.is_some() {
        // The tenant API server calls its nodes' kubelet: the operator's endpoint, by the
        // operator container's named port.
        control_plane["spec"]["policyTypes"] = json!(["Ingress", "Egress"]);
        control_plane["spec"]["egress"] = json!([{
            "to": [operator_peer],
            "ports": [{"protocol": "TCP", "port": names::KUBELET_PORT_NAME}],
        }]);
    }
    Ok(vec![
        typed("the isolation NetworkPolicy", isolation)?,
        typed("the control-plane NetworkPolicy", control_plane)?,
    ])
}

/// The ResourceQuota when the profile enforces quota: the tenant's cpu and memory as caps on what
/// the namespace requests (control plane and synced pods together), plus the profile's extra hard
/// limits. Limits are not capped in sum: the control plane's limit is the whole cap by itself.
pub fn resource_quota(
    tc: &TenantCluster,
    profile: &IsolationProfile,
) -> Result<Option<ResourceQuota>, Error> {
    let quota = &profile.spec.resource_quota;
    if !quota.enforce {
        return Ok(None);
    }
    let (tenant, _) = identity(tc)?;
    let mut hard: BTreeMap<String, String> = quota
        .hard
        .iter()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    if let Some(cpu) = &tc.spec.resources.cpu {
        hard.insert("requests.cpu".into(), cpu.clone());
    }
    if let Some(memory) = &tc.spec.resources.memory {
        hard.insert("requests.memory".into(), memory.clone());
    }
    if hard.is_empty() {
        return Ok(None);
    }
    typed(
        "the ResourceQuota",
        json!({
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": owned_metadata(tc, names::resource_quota(&tenant))?,
            "spec": {"hard": hard},
        }),
    )
    .map(Some)
}

/// The LimitRange with the profile's container defaults, when it has any.
pub fn limit_range(
    tc: &TenantCluster,
    profile: &IsolationProfile,
) -> Result<Option<LimitRange>, Error> {
    let limits = &profile.spec.limit_range;
    if limits.default.is_empty() && limits.default_request.is_empty() {
        return Ok(None);
    }
    let (tenant, _) = identity(tc)?;
    let mut item = json!({"type": "Container"});
    if !limits.default.is_empty() {
        item["default"] = json!(limits.default);
    }
    if !limits.default_request.is_empty() {
        item["defaultRequest"] = json!(limits.default_request);
    }
    typed(
        "the LimitRange",
        json!({
            "apiVersion": "v1",
            "kind": "LimitRange",
            "metadata": owned_metadata(tc, names::limit_range(&tenant))?,
            "spec": {"limits": [item]},
        }),
    )
    .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::tests::{profile, tenant};

    #[test]
    fn pod_security_labels_follow_the_profile() {
        let labels = namespace_labels(&profile());
        assert_eq!(labels["pod-security.kubernetes.io/enforce"], "restricted");
        assert_eq!(labels["pod-security.kubernetes.io/warn"], "restricted");
        assert_eq!(labels["pod-security.kubernetes.io/audit"], "restricted");
        assert_eq!(labels.len(), 6);
    }

    fn egress_json(tc: &TenantCluster, p: &IsolationProfile) -> String {
        let policies = network_policies(tc, p, &BuildOptions::default()).unwrap();
        serde_json::to_string(&policies[0].spec.as_ref().unwrap().egress).unwrap()
    }

    #[test]
    fn deny_by_default_allows_only_namespace_and_dns() {
        let tc = tenant();
        let egress = egress_json(&tc, &profile());
        assert!(egress.contains("kube-dns"));
        assert!(!egress.contains("0.0.0.0/0"), "{egress}");
        assert!(!egress.contains("ipBlock"), "{egress}");
    }

    #[test]
    fn allowed_cidrs_are_added_under_deny_by_default() {
        let mut p = profile();
        p.spec.network_policy.allowed_egress_cidrs = vec!["203.0.113.0/24".into()];
        let egress = egress_json(&tenant(), &p);
        assert!(egress.contains("203.0.113.0/24"));
        assert!(!egress.contains("0.0.0.0/0"));
    }

    #[test]
    fn allow_all_still_blocks_the_metadata_address() {
        let mut tc = tenant();
        tc.spec.networking.egress_policy = EgressPolicy::AllowAll;
        let egress = egress_json(&tc, &profile());
        assert!(egress.contains("0.0.0.0/0"));
        assert!(egress.contains(METADATA_CIDR));
    }

    #[test]
    fn the_control_plane_may_call_the_operators_kubelet_endpoint_only_when_there_is_one() {
        let policy = |options: &BuildOptions| {
            network_policies(&tenant(), &profile(), options).unwrap()[1]
                .spec
                .clone()
                .unwrap()
        };
        let without = policy(&BuildOptions::default());
        assert_eq!(without.policy_types.unwrap(), ["Ingress"]);
        assert!(without.egress.is_none());
        let options = crate::build::tests::with_kubelet(BuildOptions {
            operator_namespace: Some("tenantplane-system".into()),
            ..Default::default()
        });
        let with = serde_json::to_value(policy(&options)).unwrap();
        assert_eq!(with["policyTypes"], json!(["Ingress", "Egress"]));
        assert_eq!(
            with["egress"],
            json!([{
                "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tenantplane-system"}}}],
                "ports": [{"protocol": "TCP", "port": "kubelet"}],
            }])
        );
    }

    #[test]
    fn network_policies_can_be_turned_off() {
        let mut p = profile();
        p.spec.network_policy.enabled = false;
        assert!(
            network_policies(&tenant(), &p, &BuildOptions::default())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn quota_caps_come_from_the_tenant_resources() {
        let quota = resource_quota(&tenant(), &profile()).unwrap().unwrap();
        let hard = quota.spec.unwrap().hard.unwrap();
        assert_eq!(hard["requests.cpu"].0, "2");
        assert_eq!(hard["requests.memory"].0, "2Gi");
        assert!(
            !hard.contains_key("limits.cpu"),
            "the control plane's limit alone is the cap"
        );
        assert_eq!(hard["pods"].0, "100");
        let owner = &quota.metadata.owner_references.unwrap()[0];
        assert_eq!(owner.kind, "TenantCluster");
        assert_eq!(owner.controller, Some(true));
    }

    #[test]
    fn no_quota_unless_the_profile_enforces_it() {
        let mut p = profile();
        p.spec.resource_quota.enforce = false;
        assert!(resource_quota(&tenant(), &p).unwrap().is_none());
    }

    #[test]
    fn limit_range_carries_the_defaults() {
        let lr = limit_range(&tenant(), &profile()).unwrap().unwrap();
        let item = &lr.spec.unwrap().limits[0];
        assert_eq!(item.default.as_ref().unwrap()["cpu"].0, "500m");
        assert_eq!(item.default_request.as_ref().unwrap()["memory"].0, "128Mi");
    }
}
