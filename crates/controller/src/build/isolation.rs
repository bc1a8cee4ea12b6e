//! The isolation boundary around a tenant's namespace: Pod Security labels, NetworkPolicies,
//! ResourceQuota and LimitRange, from the IsolationProfile and the TenantCluster.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    LimitRange, LimitRangeItem, LimitRangeSpec, ResourceQuota, ResourceQuotaSpec,
};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tenantplane_api::cidr::Cidr;
use tenantplane_api::closed_addresses;
use tenantplane_api::quantity::{ParsedQuantity, Quantity as ExactQuantity};
use tenantplane_api::{EgressPolicy, IsolationProfile, QuantityString, TenantCluster};

use super::BuildOptions;
use super::meta::{identity, match_labels, owned_metadata};
use crate::{Error, names};

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
///   the profile's CIDRs; never the host API server or node addresses. `allow-all` opens egress.
///   Either way, no rule reaches a closed address (link-local, cloud metadata and identity
///   endpoints: [`closed_addresses`]), in either address family.
/// - `<name>-control-plane` (the tenant API server): ingress on 6443 (and 7443, the snapshot
///   agent) from the operator; egress to the operator's kubelet endpoint when it serves one.
pub fn network_policies(
    tc: &TenantCluster,
    profile: &IsolationProfile,
    options: &BuildOptions,
) -> Result<Vec<NetworkPolicy>, Error> {
    if !profile.spec.network_policy.enabled {
        return Ok(Vec::new());
    }
    let (tenant, _) = identity(tc)?;
    let dns = NetworkPolicyEgressRule {
        to: Some(vec![NetworkPolicyPeer {
            namespace_selector: Some(namespace_named("kube-system")),
            pod_selector: Some(match_labels([("k8s-app", "kube-dns")])),
            ..Default::default()
        }]),
        ports: Some(vec![
            port("UDP", IntOrString::Int(53)),
            port("TCP", IntOrString::Int(53)),
        ]),
    };
    let same_namespace = egress_to(vec![every_pod()]);
    let mut egress = match tc.spec.networking.egress_policy {
        EgressPolicy::DenyByDefault => vec![same_namespace, dns],
        EgressPolicy::AllowAll => vec![
            same_namespace,
            dns,
            egress_to(ip_blocks(["0.0.0.0/0", "::/0"])),
            egress_to(vec![NetworkPolicyPeer {
                namespace_selector: Some(LabelSelector::default()),
                ..Default::default()
            }]),
        ],
    };
    let allowed = ip_blocks(
        profile
            .spec
            .network_policy
            .allowed_egress_cidrs
            .iter()
            .map(String::as_str),
    );
    if !allowed.is_empty() {
        egress.push(egress_to(allowed));
    }
    let isolation = NetworkPolicy {
        metadata: owned_metadata(tc, names::isolation_policy(&tenant))?,
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector::default()),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![every_pod()]),
                ports: None,
            }]),
            egress: Some(egress),
        }),
    };
    let operator_peer = NetworkPolicyPeer {
        namespace_selector: Some(match &options.operator_namespace {
            Some(ns) => namespace_named(ns),
            // Without a known operator namespace, the API server port is open to the cluster's
            // pods; the tenant API server still authenticates every client.
            None => LabelSelector::default(),
        }),
        ..Default::default()
    };
    let mut control_plane = NetworkPolicySpec {
        pod_selector: Some(match_labels(names::control_plane_selector(&tenant))),
        policy_types: Some(vec!["Ingress".into()]),
        ingress: Some(vec![NetworkPolicyIngressRule {
            from: Some(vec![operator_peer.clone()]),
            // The API server, and the snapshot agent (which admits only the operator's
            // certificate).
            ports: Some(vec![
                port("TCP", IntOrString::Int(names::API_PORT)),
                port("TCP", IntOrString::Int(names::AGENT_PORT)),
            ]),
        }]),
        egress: None,
    };
    if let Some(kubelet) = &options.kubelet {
        // The tenant API server calls its nodes' kubelet: the operator's endpoint, by the
        // operator container's named port.
        control_plane.policy_types = Some(vec!["Ingress".into(), "Egress".into()]);
        let mut egress = vec![NetworkPolicyEgressRule {
            to: Some(vec![operator_peer]),
            ports: Some(vec![port(
                "TCP",
                IntOrString::String(names::KUBELET_PORT_NAME.into()),
            )]),
        }];
        // And the endpoint's own address and port, for an operator that is no pod (the dev
        // cluster's and the tests', on the node's address); a Service's cluster IP here opens
        // nothing more, as policies see the pod behind it.
        if let Some(cidr) = Cidr::parse(&kubelet.endpoint.address) {
            egress.push(NetworkPolicyEgressRule {
                to: Some(vec![NetworkPolicyPeer {
                    ip_block: Some(IPBlock {
                        cidr: cidr.to_string(),
                        except: None,
                    }),
                    ..Default::default()
                }]),
                ports: Some(vec![port(
                    "TCP",
                    IntOrString::Int(i32::from(kubelet.endpoint.port)),
                )]),
            });
        }
        control_plane.egress = Some(egress);
    }
    Ok(vec![
        isolation,
        NetworkPolicy {
            metadata: owned_metadata(tc, names::control_plane_policy(&tenant))?,
            spec: Some(control_plane),
        },
    ])
}

/// Every pod of the policy's own namespace.
fn every_pod() -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(LabelSelector::default()),
        ..Default::default()
    }
}

/// The namespace called `name`, by the label the API server puts on every namespace.
fn namespace_named(name: &str) -> LabelSelector {
    match_labels([("kubernetes.io/metadata.name", name)])
}

fn egress_to(peers: Vec<NetworkPolicyPeer>) -> NetworkPolicyEgressRule {
    NetworkPolicyEgressRule {
        to: Some(peers),
        ports: None,
    }
}

fn port(protocol: &str, port: IntOrString) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some(protocol.into()),
        port: Some(port),
        end_port: None,
    }
}

/// The quota key of what all claims of the namespace request together.
const REQUESTS_STORAGE: &str = "requests.storage";

/// The tenant's storage cap: its own `resources.storage`, never above the profile's (the
/// profile is the platform team's; the TenantCluster is the team's). The smaller is chosen by
/// exact value; a value that cannot be read (admission checks both) loses to one that can.
fn storage_cap(tenant: Option<&ParsedQuantity>, profile: Option<&str>) -> Option<String> {
    match (tenant, profile) {
        (Some(t), Some(p)) => match (t.value(), ExactQuantity::parse(p)) {
            (Some(tq), Some(pq)) if tq.exceeds(pq) => Some(p.to_string()),
            (Some(_), _) => Some(t.to_string()),
            (None, _) => Some(p.to_string()),
        },
        (Some(t), None) => Some(t.to_string()),
        (None, p) => p.map(str::to_string),
    }
}

/// An egress peer per CIDR with the closed addresses in its `except`; a CIDR that is all closed
/// (or is no CIDR) gives none, so a profile listing a metadata address opens nothing.
fn ip_blocks<'a>(cidrs: impl IntoIterator<Item = &'a str>) -> Vec<NetworkPolicyPeer> {
    cidrs
        .into_iter()
        .filter_map(|c| {
            let cidr = Cidr::parse(c)?;
            let except = closed_addresses::egress_block(&cidr)?;
            Some(NetworkPolicyPeer {
                ip_block: Some(IPBlock {
                    cidr: cidr.to_string(),
                    except: (!except.is_empty())
                        .then(|| except.iter().map(Cidr::to_string).collect()),
                }),
                ..Default::default()
            })
        })
        .collect()
}

/// The ResourceQuota: every kind's object count and what the profile opens beyond cpu and
/// memory ([`tenantplane_api::Allowances::quota_keys`]), the profile's own hard limits over
/// them (per StorageClass ones, `<class>.storageclass.storage.k8s.io/requests.storage`, among
/// them); and, when the profile enforces quota, the tenant's cpu and memory as caps on what the
/// namespace requests (control plane and synced pods together) and its storage as the cap on
/// what its claims request (`requests.storage`). Limits are not capped in sum: the control
/// plane's limit is the whole cap by itself.
pub fn resource_quota(
    tc: &TenantCluster,
    profile: &IsolationProfile,
) -> Result<ResourceQuota, Error> {
    let quota = &profile.spec.resource_quota;
    let (tenant, _) = identity(tc)?;
    // Every kind's count and what the profile lets pods consume beyond cpu and memory are
    // counted whether or not the tenant's own caps are enforced: nothing a tenant puts on the
    // host goes uncounted. The profile's own hard limit of the same key wins.
    let mut hard = profile.spec.allow.quota_keys();
    hard.extend(quota.hard.iter().map(|(k, v)| (k.clone(), v.0.clone())));
    if quota.enforce {
        if let Some(cpu) = &tc.spec.resources.cpu {
            hard.insert("requests.cpu".into(), cpu.to_string());
        }
        if let Some(memory) = &tc.spec.resources.memory {
            hard.insert("requests.memory".into(), memory.to_string());
        }
        if let Some(storage) = storage_cap(
            tc.spec.resources.storage.as_ref(),
            hard.get(REQUESTS_STORAGE).map(String::as_str),
        ) {
            hard.insert(REQUESTS_STORAGE.into(), storage);
        }
    }
    Ok(ResourceQuota {
        metadata: owned_metadata(tc, names::resource_quota(&tenant))?,
        spec: Some(ResourceQuotaSpec {
            hard: Some(hard.into_iter().map(|(k, v)| (k, Quantity(v))).collect()),
            ..Default::default()
        }),
        status: None,
    })
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
    let quantities = |values: &BTreeMap<String, QuantityString>| {
        (!values.is_empty()).then(|| {
            values
                .iter()
                .map(|(k, v)| (k.clone(), Quantity(v.0.clone())))
                .collect()
        })
    };
    Ok(Some(LimitRange {
        metadata: owned_metadata(tc, names::limit_range(&tenant))?,
        spec: Some(LimitRangeSpec {
            limits: vec![LimitRangeItem {
                type_: "Container".into(),
                default: quantities(&limits.default),
                default_request: quantities(&limits.default_request),
                ..Default::default()
            }],
        }),
    }))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::build::fixtures::{profile, tenant};

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

    /// Every address some egress rule of `policy` lets a pod reach among `ips` (ipBlocks only:
    /// the pod and namespace selectors match pods, never these).
    fn reachable(policy: &NetworkPolicy, ips: &[&str]) -> Vec<String> {
        let spec = policy.spec.as_ref().unwrap();
        let blocks: Vec<_> = spec
            .egress
            .iter()
            .flatten()
            .flat_map(|r| r.to.iter().flatten())
            .filter_map(|peer| peer.ip_block.clone())
            .collect();
        ips.iter()
            .filter(|ip| {
                let ip = ip.parse().unwrap();
                blocks.iter().any(|b| {
                    Cidr::parse(&b.cidr).unwrap().contains(ip)
                        && !b
                            .except
                            .iter()
                            .flatten()
                            .any(|e| Cidr::parse(e).unwrap().contains(ip))
                })
            })
            .map(|ip| ip.to_string())
            .collect()
    }

    #[test]
    fn no_egress_rule_reaches_a_closed_address_whatever_the_policy_or_profile() {
        let closed = [
            "169.254.169.254",
            "169.254.170.23",
            "168.63.129.16",
            "100.100.100.200",
            "192.0.0.192",
            "fd00:ec2::254",
            "fd00:ec2::23",
            "fd20:ce::254",
            "fd00:c1::a9fe:a9fe",
            "fe80::a9fe:a9fe",
            "64:ff9b::a9fe:a9fe",
        ];
        let wide = [
            "0.0.0.0/0",
            "::/0",
            "100.64.0.0/10",
            "168.63.0.0/16",
            "169.254.169.254/32",
            "fd00::/8",
        ];
        for egress in [EgressPolicy::DenyByDefault, EgressPolicy::AllowAll] {
            for allowed in [vec![], wide.iter().map(|c| c.to_string()).collect()] {
                let mut tc = tenant();
                tc.spec.networking.egress_policy = egress;
                let mut p = profile();
                p.spec.network_policy.allowed_egress_cidrs = allowed.clone();
                for policy in network_policies(&tc, &p, &BuildOptions::default()).unwrap() {
                    assert_eq!(
                        reachable(&policy, &closed),
                        Vec::<String>::new(),
                        "{egress:?} {allowed:?}"
                    );
                }
            }
        }
        // What is open stays open.
        let mut tc = tenant();
        tc.spec.networking.egress_policy = EgressPolicy::AllowAll;
        let policies = network_policies(&tc, &profile(), &BuildOptions::default()).unwrap();
        assert_eq!(
            reachable(&policies[0], &["8.8.8.8", "2001:db8::1", "10.96.0.1"]),
            ["8.8.8.8", "2001:db8::1", "10.96.0.1"]
        );
    }

    #[test]
    fn allow_all_excepts_the_closed_blocks_in_both_families() {
        let mut tc = tenant();
        tc.spec.networking.egress_policy = EgressPolicy::AllowAll;
        let policies = network_policies(&tc, &profile(), &BuildOptions::default()).unwrap();
        let egress = serde_json::to_value(&policies[0].spec.as_ref().unwrap().egress).unwrap();
        let blocks: Vec<&Value> = egress
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["to"].as_array().into_iter().flatten())
            .filter(|p| !p["ipBlock"].is_null())
            .collect();
        assert_eq!(blocks.len(), 2, "{egress}");
        assert_eq!(blocks[0]["ipBlock"]["cidr"], "0.0.0.0/0");
        assert!(
            blocks[0]["ipBlock"]["except"]
                .as_array()
                .unwrap()
                .contains(&json!("169.254.0.0/16"))
        );
        assert_eq!(blocks[1]["ipBlock"]["cidr"], "::/0");
        let v6 = blocks[1]["ipBlock"]["except"].as_array().unwrap();
        for c in ["fe80::/10", "fd00:ec2::/32", "fd20:ce::254/128"] {
            assert!(v6.contains(&json!(c)), "{c}: {v6:?}");
        }
    }

    #[test]
    fn a_listed_cidr_that_is_all_closed_opens_nothing() {
        let mut p = profile();
        p.spec.network_policy.allowed_egress_cidrs = vec![
            "169.254.169.254/32".into(),
            "fd00:ec2::254/128".into(),
            "203.0.113.0/24".into(),
        ];
        let egress = egress_json(&tenant(), &p);
        assert!(egress.contains("203.0.113.0/24"), "{egress}");
        assert!(
            !egress.contains("169.254") && !egress.contains("fd00:ec2"),
            "{egress}"
        );
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
        let options = crate::build::fixtures::with_kubelet(BuildOptions {
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
            }, {
                // The endpoint's address itself, for an operator that is no pod.
                "to": [{"ipBlock": {"cidr": "10.96.0.42/32"}}],
                "ports": [{"protocol": "TCP", "port": 10250}],
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
        let quota = resource_quota(&tenant(), &profile()).unwrap();
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
    fn quota_counts_storage_never_above_the_profiles_cap() {
        let storage = |own: Option<&str>, profile_cap: Option<&str>| {
            let mut tc = tenant();
            tc.spec.resources.storage = own.map(ParsedQuantity::from);
            let mut p = profile();
            p.spec.resource_quota.hard.remove(REQUESTS_STORAGE);
            if let Some(cap) = profile_cap {
                p.spec
                    .resource_quota
                    .hard
                    .insert(REQUESTS_STORAGE.into(), cap.into());
            }
            let quota = resource_quota(&tc, &p).unwrap();
            let hard = quota.spec.unwrap().hard.unwrap();
            hard.get(REQUESTS_STORAGE).map(|q| q.0.clone())
        };
        // The shipped profile caps storage: every enforced quota counts it.
        let shipped = resource_quota(&tenant(), &profile()).unwrap();
        assert!(
            !shipped.spec.unwrap().hard.unwrap()[REQUESTS_STORAGE]
                .0
                .is_empty(),
            "restricted counts requests.storage"
        );
        assert_eq!(
            storage(Some("50Gi"), Some("200Gi")).as_deref(),
            Some("50Gi")
        );
        assert_eq!(
            storage(Some("1Pi"), Some("200Gi")).as_deref(),
            Some("200Gi"),
            "a team cannot raise the platform's cap"
        );
        assert_eq!(
            storage(Some("214748364801"), Some("200Gi")).as_deref(),
            Some("200Gi"),
            "one byte over is over"
        );
        assert_eq!(
            storage(Some("214748364800"), Some("200Gi")).as_deref(),
            Some("214748364800")
        );
        assert_eq!(storage(Some("10Gi"), None).as_deref(), Some("10Gi"));
        assert_eq!(storage(None, Some("200Gi")).as_deref(), Some("200Gi"));
        assert_eq!(storage(None, None), None);
        assert_eq!(storage(Some("lots"), Some("1Ti")).as_deref(), Some("1Ti"));
    }

    #[test]
    fn per_class_storage_caps_of_the_profile_reach_the_quota() {
        let mut p = profile();
        let key = "fast.storageclass.storage.k8s.io/requests.storage";
        p.spec.resource_quota.hard.insert(key.into(), "20Gi".into());
        let quota = resource_quota(&tenant(), &p).unwrap();
        assert_eq!(quota.spec.unwrap().hard.unwrap()[key].0, "20Gi");
    }

    /// Unenforced, the quota still counts every kind and what the profile opens beyond cpu and
    /// memory (node disk, and any resource `allow.resources` lists), but not the tenant's cpu.
    fn hard_of(p: &IsolationProfile) -> BTreeMap<String, Quantity> {
        resource_quota(&tenant(), p)
            .unwrap()
            .spec
            .unwrap()
            .hard
            .unwrap()
    }

    #[test]
    fn an_unenforced_quota_still_counts_every_kind_and_what_the_profile_opens() {
        let mut p = profile();
        p.spec.resource_quota.enforce = false;
        p.spec
            .allow
            .resources
            .insert("example.com/gpu".into(), "2".into());
        let hard = hard_of(&p);
        assert!(!hard.contains_key("requests.cpu"), "{hard:?}");
        assert_eq!(hard["requests.ephemeral-storage"].0, "512Gi");
        assert_eq!(hard["requests.example.com/gpu"].0, "2");
        assert_eq!(hard["pods"].0, "100", "the profile's own count wins");
        assert_eq!(hard["count/endpointslices.discovery.k8s.io"].0, "2k");
        // Enforced, the profile's own hard limit of the same key wins over the default total.
        p.spec.resource_quota.enforce = true;
        p.spec
            .resource_quota
            .hard
            .insert("requests.ephemeral-storage".into(), "50Gi".into());
        let hard = hard_of(&p);
        assert_eq!(hard["requests.ephemeral-storage"].0, "50Gi");
        assert_eq!(hard["requests.example.com/gpu"].0, "2");
    }

    #[test]
    fn limit_range_carries_the_defaults() {
        let lr = limit_range(&tenant(), &profile()).unwrap().unwrap();
        let item = &lr.spec.unwrap().limits[0];
        assert_eq!(item.default.as_ref().unwrap()["cpu"].0, "500m");
        assert_eq!(item.default_request.as_ref().unwrap()["memory"].0, "128Mi");
    }
}
