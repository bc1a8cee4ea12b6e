//! The isolation boundary around a tenant's namespace: Pod Security labels and NetworkPolicies,
//! from the IsolationProfile and the TenantCluster (its ResourceQuota and LimitRange: `quota`).

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tenantplane_api::cidr::Cidr;
use tenantplane_api::closed_addresses;
use tenantplane_api::{EgressPolicy, IsolationProfile, TenantCluster};

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
    Ok(vec![
        NetworkPolicy {
            metadata: owned_metadata(tc, names::isolation_policy(&tenant))?,
            spec: Some(isolation_policy(tc, profile)),
        },
        NetworkPolicy {
            metadata: owned_metadata(tc, names::control_plane_policy(&tenant))?,
            spec: Some(control_plane_policy(&tenant, options)),
        },
    ])
}

/// `<name>-isolation`: every pod of the namespace takes ingress from its own namespace only, and
/// egress per the tenant's `egressPolicy` and the profile's CIDRs.
fn isolation_policy(tc: &TenantCluster, profile: &IsolationProfile) -> NetworkPolicySpec {
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
    NetworkPolicySpec {
        pod_selector: Some(LabelSelector::default()),
        policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
        ingress: Some(vec![NetworkPolicyIngressRule {
            from: Some(vec![every_pod()]),
            ports: None,
        }]),
        egress: Some(egress),
    }
}

/// `<name>-control-plane`: the tenant API server (and its snapshot agent) takes ingress from the
/// operator only, and reaches the operator's kubelet endpoint when it serves one.
fn control_plane_policy(tenant: &str, options: &BuildOptions) -> NetworkPolicySpec {
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
        pod_selector: Some(match_labels(names::control_plane_selector(tenant))),
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
    control_plane
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
}
