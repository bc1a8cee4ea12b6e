//! Default deny: what of a tenant object reaches the host, under the `allow` section of the
//! tenant's IsolationProfile. Each check is pure and gives its findings as sentences a tenant
//! can act on: a refusal keeps the whole object off the host; a drop leaves one field or entry
//! out of the host copy, where the object works without it. The syncer tells the tenant both
//! (an Event on the object; a refusal also in `Synced`).

mod bytes;
mod claims;
mod data;
mod durations;
mod images;
mod ingresses;
mod placement;
mod pod_fields;
mod pods;
mod resources;
mod values;

use std::collections::BTreeMap;
use std::net::IpAddr;

use tenantplane_api::Allowances;
use tenantplane_api::allowances::{key_matches, name_matches};
use tenantplane_api::cidr::Cidr;

pub use bytes::{byte_refusals, metadata_bytes};
pub use claims::claim_size_refusals;
pub use data::{DataCap, data_bytes};
pub use durations::{bound_durations, bound_grace};
pub use ingresses::{
    annotation_refusals as ingress_annotation_refusals, ingress_refusals, never_copied,
};
pub use placement::{
    WELL_KNOWN_NODE_LABELS, node_selector, node_term, priority_class, tolerations, topology,
};
pub use pod_fields::{Decision, FIELDS as POD_FIELDS};
pub use pods::pod_refusals;
pub use resources::{
    ALWAYS_ALLOWED as ALWAYS_ALLOWED_RESOURCES, DISK, bound_disk, default_limit_refusals,
    resource_refusals,
};
use values::listed;
pub use values::{pattern_opens, points_elsewhere};

/// Annotations every host copy may carry: they change nothing on the host.
const ALWAYS_ALLOWED_ANNOTATIONS: &[&str] = &[
    "kubectl.kubernetes.io/default-container",
    "kubectl.kubernetes.io/restartedAt",
    "kubernetes.io/description",
];

/// How many annotation keys a sentence names; a tenant object can carry thousands.
const LISTED: usize = 10;

/// The annotations a host copy of `kind` keeps (reserved keys already removed), and a sentence
/// naming the ones left out.
pub fn annotations(
    allow: &Allowances,
    kind: &str,
    all: BTreeMap<String, String>,
) -> (BTreeMap<String, String>, Vec<String>) {
    let extra = allow.annotations.for_kind(kind);
    let mut kept = BTreeMap::new();
    let mut left_out = Vec::new();
    let mut dropped = Vec::new();
    for (k, v) in all {
        if k == "kubectl.kubernetes.io/last-applied-configuration" {
            continue;
        }
        if ALWAYS_ALLOWED_ANNOTATIONS.contains(&k.as_str()) {
            // Allowed to every tenant, so bounded: a description a page long stays a line.
            kept.insert(k, tenantplane_api::text::bounded(&v));
        } else if kind == "Ingress" && k == ingresses::CLASS_KEY {
            // The legacy form of ingressClassName, judged as that is (`ingress_refusals`).
            kept.insert(k, v);
        } else if !extra.iter().any(|p| pattern_opens(p, &k)) {
            if extra.iter().any(|p| key_matches(p, &k)) {
                dropped.push(format!(
                    "annotation {k} is left out of the host copy: a pattern in the IsolationProfile's allow.annotations never opens the keys of Kubernetes' own components or of cloud identities; list the key whole to open it"
                ));
            } else {
                left_out.push(k);
            }
        } else if let Some(why) = points_elsewhere(&v).filter(|_| kind != "Ingress") {
            // An Ingress is refused for it instead (`ingresses`): left out, its auth or
            // allow-list annotation would fail open.
            dropped.push(format!(
                "annotation {k} is left out of the host copy: {why}, which a host controller would follow for the tenant (no IsolationProfile setting opens this)"
            ));
        } else {
            kept.insert(k, v);
        }
    }
    if !left_out.is_empty() {
        let shown = left_out.len().min(LISTED);
        let more = match left_out.len() - shown {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        dropped.insert(0, format!(
            "annotations {}{more} are left out of the host copy (not in the IsolationProfile's allow.annotations)",
            left_out[..shown].join(", ")
        ));
    }
    (kept, dropped)
}

/// Is `ip` inside one of `cidrs`? A range that is not one (`10.0.0.0/33`) holds nothing.
pub fn in_cidrs(cidrs: &[String], ip: &str) -> bool {
    let Ok(ip) = ip.parse::<IpAddr>() else {
        return false;
    };
    cidrs
        .iter()
        .filter_map(|c| Cidr::parse(c))
        .any(|c| c.contains(ip))
}

/// The most ports of one Service where the profile sets none.
pub const DEFAULT_SERVICE_PORTS: i32 = 100;

/// Why a Service may not reach the host under `allow`; empty when it may.
pub fn service_refusals(
    allow: &Allowances,
    spec: &k8s_openapi::api::core::v1::ServiceSpec,
) -> Vec<String> {
    let mut out = Vec::new();
    match spec.type_.as_deref() {
        Some("LoadBalancer") if !allow.load_balancers => out.push(
            "type LoadBalancer is not allowed (the IsolationProfile's allow.loadBalancers is off); use ClusterIP".into(),
        ),
        Some("NodePort") if !allow.node_ports => out.push(
            "type NodePort is not allowed (the IsolationProfile's allow.nodePorts is off); use ClusterIP".into(),
        ),
        Some("ExternalName") => {
            let name = spec.external_name.as_deref().unwrap_or_default();
            let name = name.trim_end_matches('.');
            if !allow.external_names.iter().any(|p| name_matches(p, name)) {
                out.push(format!(
                    "externalName {name:?} is not in the IsolationProfile's allow.externalNames{}",
                    listed(&allow.external_names)
                ));
            }
        }
        _ => {}
    }
    // A class picks which of the host's balancer implementations serves the Service.
    if let Some(class) = spec.load_balancer_class.as_deref()
        && !allow.load_balancer_classes.iter().any(|c| c == class)
    {
        out.push(format!(
            "loadBalancerClass {class:?} is not in the IsolationProfile's allow.loadBalancerClasses{}; name none for the host's default balancer",
            listed(&allow.load_balancer_classes)
        ));
    }
    let ports = spec.ports.as_ref().map_or(0, Vec::len);
    let most = allow.max_service_ports.unwrap_or(DEFAULT_SERVICE_PORTS);
    if ports > usize::try_from(most).unwrap_or(0) {
        out.push(format!(
            "it has {ports} ports, more than the {most} the IsolationProfile's allow.maxServicePorts allows{} (every host node's proxy programs each port); split it into Services of fewer ports",
            if allow.max_service_ports.is_none() { " by default" } else { "" }
        ));
    }
    for ip in spec.external_ips.iter().flatten() {
        if !in_cidrs(&allow.external_ip_cidrs, ip) {
            out.push(format!(
                "externalIPs {ip} is not inside the IsolationProfile's allow.externalIPCIDRs{}",
                listed(&allow.external_ip_cidrs)
            ));
        }
    }
    out
}

/// Why a claim may not reach the host under `allow` (its storage class); empty when it may.
pub fn claim_refusals(allow: &Allowances, class: Option<&str>) -> Vec<String> {
    match class {
        None => vec![],
        Some(c) if allow.storage_classes.iter().any(|a| a == c) => vec![],
        Some("") => vec![format!(
            "storageClassName \"\" (bind to any host volume without a class) is not allowed; name a class the IsolationProfile's allow.storageClasses lists{}, or none for the host's default",
            listed(&allow.storage_classes)
        )],
        Some(c) => vec![format!(
            "storageClassName {c:?} is not in the IsolationProfile's allow.storageClasses{}; name none for the host's default",
            listed(&allow.storage_classes)
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn only_allowed_annotations_reach_the_host() {
        let all = BTreeMap::from([
            (
                "k8s.v1.cni.cncf.io/networks".to_string(),
                "host-net".to_string(),
            ),
            ("prometheus.io/scrape".to_string(), "true".to_string()),
            (
                "kubectl.kubernetes.io/default-container".to_string(),
                "web".to_string(),
            ),
        ]);
        let mut allow = Allowances::default();
        let (kept, dropped) = annotations(&allow, "Pod", all.clone());
        assert_eq!(kept.len(), 1);
        assert!(dropped[0].contains("k8s.v1.cni.cncf.io/networks"));
        allow.annotations.pods = vec!["prometheus.io/*".into()];
        let (kept, _) = annotations(&allow, "Pod", all.clone());
        assert!(kept.contains_key("prometheus.io/scrape"));
        let (kept, _) = annotations(&allow, "Service", all);
        assert!(!kept.contains_key("prometheus.io/scrape"), "per kind");
    }

    #[test]
    fn the_legacy_ingress_class_annotation_is_judged_as_the_class_field_is() {
        let all = BTreeMap::from([(
            "kubernetes.io/ingress.class".to_string(),
            "internal".to_string(),
        )]);
        let (kept, dropped) = annotations(&Allowances::default(), "Ingress", all.clone());
        assert_eq!(kept, all, "kept for the Ingress's own check, not left out");
        assert!(dropped.is_empty());
        let spec = k8s_openapi::api::networking::v1::IngressSpec::default();
        let refused = ingress_annotation_refusals(&Allowances::default(), &spec, &kept);
        assert!(refused[0].contains("allow.ingressClasses"), "{refused:?}");
        let (kept, _) = annotations(&Allowances::default(), "Service", all);
        assert!(kept.is_empty(), "only an Ingress's");
    }

    #[test]
    fn annotations_from_a_tenant_stay_small_on_the_host_and_in_sentences() {
        let mut all: BTreeMap<String, String> = (0..500)
            .map(|i| (format!("example.com/key-{i:03}"), "v".into()))
            .collect();
        all.insert("kubernetes.io/description".into(), "d".repeat(300_000));
        let (kept, dropped) = annotations(&Allowances::default(), "Pod", all);
        let description = &kept["kubernetes.io/description"];
        assert!(description.len() <= tenantplane_api::text::MAX_TEXT_BYTES);
        assert!(
            description.ends_with("more characters cut)"),
            "{description}"
        );
        assert!(dropped[0].contains("example.com/key-009 and 490 more are left out"));
        assert!(dropped[0].len() < 500, "{}", dropped[0]);
    }

    #[test]
    fn services_and_ingresses_ask_only_for_what_is_allowed() {
        let svc = |v: Value| {
            serde_json::from_value::<k8s_openapi::api::core::v1::ServiceSpec>(v).unwrap()
        };
        let none = Allowances::default();
        assert_eq!(
            service_refusals(&none, &svc(json!({"type": "LoadBalancer"}))).len(),
            1
        );
        assert_eq!(
            service_refusals(&none, &svc(json!({"type": "NodePort"}))).len(),
            1
        );
        assert_eq!(
            service_refusals(&none, &svc(json!({"type": "ExternalName", "externalName": "kubernetes.default.svc.cluster.local"}))).len(),
            1
        );
        assert_eq!(
            service_refusals(&none, &svc(json!({"externalIPs": ["10.96.0.1"]}))).len(),
            1
        );
        let allow = Allowances {
            external_names: vec!["*.example.com".into()],
            external_ip_cidrs: vec!["203.0.113.0/24".into()],
            ..Default::default()
        };
        assert!(
            service_refusals(
                &allow,
                &svc(json!({"type": "ExternalName", "externalName": "db.example.com."}))
            )
            .is_empty()
        );
        assert!(service_refusals(&allow, &svc(json!({"externalIPs": ["203.0.113.9"]}))).is_empty());
        // Ports: every host node's proxy programs each.
        let ports = |n: i32| {
            svc(
                json!({"ports": (1..=n).map(|p| json!({"name": format!("p{p}"), "port": p})).collect::<Vec<_>>()}),
            )
        };
        assert!(service_refusals(&none, &ports(100)).is_empty());
        let said = service_refusals(&none, &ports(1200));
        assert_eq!(said.len(), 1);
        assert!(
            said[0].starts_with("it has 1200 ports, more than the 100 the IsolationProfile's allow.maxServicePorts allows by default"),
            "{said:?}"
        );
        let few = Allowances {
            max_service_ports: Some(4),
            ..Default::default()
        };
        assert_eq!(service_refusals(&few, &ports(5)).len(), 1);
        assert!(service_refusals(&few, &ports(4)).is_empty());
        let ing = |v: Value| {
            serde_json::from_value::<k8s_openapi::api::networking::v1::IngressSpec>(v).unwrap()
        };
        let allow = Allowances {
            ingress_hosts: vec!["*.dev.example.com".into()],
            ingress_classes: vec!["nginx".into()],
            ..Default::default()
        };
        assert!(
            ingress_refusals(
                &allow,
                &ing(
                    json!({"ingressClassName": "nginx", "rules": [{"host": "a.dev.example.com"}]})
                )
            )
            .is_empty()
        );
        assert_eq!(ingress_refusals(&allow, &ing(json!({"ingressClassName": "internal", "rules": [{"host": "bank.example.com"}, {}]}))).len(), 3);
    }

    #[test]
    fn a_balancer_class_is_refused_unless_the_profile_lists_it() {
        let spec: k8s_openapi::api::core::v1::ServiceSpec = serde_json::from_value(json!({
            "type": "LoadBalancer", "loadBalancerClass": "ops.example.com/private-vpc"}))
        .unwrap();
        let balancers = Allowances {
            load_balancers: true,
            ..Default::default()
        };
        assert_eq!(
            service_refusals(&balancers, &spec),
            [
                "loadBalancerClass \"ops.example.com/private-vpc\" is not in the IsolationProfile's allow.loadBalancerClasses, which is empty; name none for the host's default balancer"
            ]
        );
        let other = Allowances {
            load_balancer_classes: vec!["example.com/public".into()],
            ..balancers.clone()
        };
        assert!(service_refusals(&other, &spec)[0].contains("which allows example.com/public"));
        let listed = Allowances {
            load_balancer_classes: vec!["ops.example.com/private-vpc".into()],
            ..balancers.clone()
        };
        assert!(service_refusals(&listed, &spec).is_empty());
        let default_class: k8s_openapi::api::core::v1::ServiceSpec =
            serde_json::from_value(json!({"type": "LoadBalancer"})).unwrap();
        assert!(service_refusals(&balancers, &default_class).is_empty());
    }

    #[test]
    fn cidrs_contain_their_addresses_and_claims_name_allowed_classes() {
        let cidrs = vec![
            "10.0.0.0/8".to_string(),
            "fd00::/8".to_string(),
            "192.0.2.7".to_string(),
        ];
        assert!(in_cidrs(&cidrs, "10.1.2.3"));
        assert!(!in_cidrs(&cidrs, "11.0.0.1"));
        assert!(in_cidrs(&cidrs, "fd12::1"));
        assert!(in_cidrs(&cidrs, "192.0.2.7") && !in_cidrs(&cidrs, "192.0.2.8"));
        assert!(!in_cidrs(&cidrs, "not-an-ip"));
        assert!(
            !in_cidrs(&["10.0.0.0/33".to_string()], "10.0.0.1"),
            "not a range, so it holds nothing"
        );
        let allow = Allowances {
            storage_classes: vec!["fast".into()],
            ..Default::default()
        };
        assert!(claim_refusals(&allow, None).is_empty());
        assert!(claim_refusals(&allow, Some("fast")).is_empty());
        assert_eq!(claim_refusals(&allow, Some("")).len(), 1);
        assert_eq!(claim_refusals(&allow, Some("local-path-of-ops")).len(), 1);
    }
}
