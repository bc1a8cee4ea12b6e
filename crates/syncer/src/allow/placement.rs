//! Where a host copy may run: the tolerations, node labels, topology keys and priority a tenant
//! pod asks for, kept only as far as the profile allows; what is left out, said.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    NodeSelectorTerm, PodAffinityTerm, PodSpec, Toleration, WeightedPodAffinityTerm,
};
use tenantplane_api::Allowances;

/// The taints the node lifecycle puts on a node that is failing, full or being taken down (and
/// a cloud's on one not yet ready or shut down): the host keeps pods away from such nodes, so a
/// copy tolerates one only where the profile lists its key in `allow.tolerationKeys`.
pub const LIFECYCLE_TAINTS: &[&str] = &[
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/unschedulable",
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/pid-pressure",
    "node.kubernetes.io/network-unavailable",
    "node.kubernetes.io/out-of-service",
    "node.cloudprovider.kubernetes.io/uninitialized",
    "node.cloudprovider.kubernetes.io/shutdown",
];

/// How long the host's own admission (DefaultTolerationSeconds) lets every pod stay on a node
/// that turned not-ready or unreachable: a tenant may ask for less, never for more.
const DEFAULT_TOLERATION_SECONDS: i64 = 300;

/// A toleration the host's admission gives every pod anyway (its own, or a shorter stay): the
/// tenant's admission adds it to each tenant pod, so keeping it silently opens nothing.
fn given_to_every_pod(t: &Toleration) -> bool {
    let key = t.key.as_deref().unwrap_or_default();
    matches!(
        key,
        "node.kubernetes.io/not-ready" | "node.kubernetes.io/unreachable"
    ) && t.effect.as_deref() == Some("NoExecute")
        && t.operator.as_deref().is_none_or(|o| o == "Exists")
        && t.toleration_seconds
            .is_some_and(|s| (0..=DEFAULT_TOLERATION_SECONDS).contains(&s))
}

/// Node labels every pod may select on, and every virtual Node shows: they say what a node is,
/// not whose it is.
pub const WELL_KNOWN_NODE_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
];

/// The tolerations a host copy keeps, and a sentence per one left out: those of the keys the
/// profile lists, and the bounded stay on a not-ready or unreachable node every pod has. A
/// toleration of a lifecycle taint beyond that would put the copy on nodes the host keeps pods
/// away from.
pub fn tolerations(allow: &Allowances, all: &[Toleration]) -> (Vec<Toleration>, Vec<String>) {
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    for t in all {
        let key = t.key.as_deref().unwrap_or_default();
        let listed = !key.is_empty() && allow.toleration_keys.iter().any(|k| k == key);
        if listed || given_to_every_pod(t) {
            kept.push(t.clone());
            continue;
        }
        let what = if key.is_empty() {
            "a toleration of every taint".to_string()
        } else if LIFECYCLE_TAINTS.contains(&key) {
            format!(
                "the toleration of {key} (a node the host keeps pods away from{})",
                if matches!(
                    key,
                    "node.kubernetes.io/not-ready" | "node.kubernetes.io/unreachable"
                ) {
                    format!("; NoExecute for at most {DEFAULT_TOLERATION_SECONDS}s is kept")
                } else {
                    String::new()
                }
            )
        } else {
            format!("the toleration of {key}")
        };
        dropped.push(format!(
            "{what} is left out (not in the IsolationProfile's allow.tolerationKeys)"
        ));
    }
    (kept, dropped)
}

fn node_label_allowed(allow: &Allowances, key: &str) -> bool {
    WELL_KNOWN_NODE_LABELS.contains(&key) || allow.node_label_keys.iter().any(|k| k == key)
}

/// The node selector a host copy keeps, and a sentence per term left out.
pub fn node_selector(
    allow: &Allowances,
    selector: &BTreeMap<String, String>,
) -> (BTreeMap<String, String>, Vec<String>) {
    let mut kept = BTreeMap::new();
    let mut dropped = Vec::new();
    for (k, v) in selector {
        if node_label_allowed(allow, k) {
            kept.insert(k.clone(), v.clone());
        } else {
            dropped.push(format!(
                "nodeSelector {k}={v} is left out (not in the IsolationProfile's allow.nodeLabelKeys)"
            ));
        }
    }
    (kept, dropped)
}

/// A node affinity term without its expressions on label keys the profile does not allow.
pub fn node_term(allow: &Allowances, term: &mut NodeSelectorTerm) -> Vec<String> {
    let mut dropped = Vec::new();
    if let Some(exprs) = term.match_expressions.as_mut() {
        exprs.retain(|e| {
            let ok = node_label_allowed(allow, &e.key);
            if !ok {
                dropped.push(format!(
                    "the node affinity term on {} is left out (not in the IsolationProfile's allow.nodeLabelKeys)",
                    e.key
                ));
            }
            ok
        });
    }
    dropped
}

/// The priority class a host copy keeps, and a sentence when it is left out.
pub fn priority_class(allow: &Allowances, class: Option<&str>) -> (Option<String>, Vec<String>) {
    match class {
        None => (None, vec![]),
        Some(c) if allow.priority_classes.iter().any(|a| a == c) => (Some(c.to_string()), vec![]),
        Some(c) => (
            None,
            vec![format!(
                "priorityClassName {c:?} is left out (not in the IsolationProfile's allow.priorityClasses); the pod runs at the host's default priority"
            )],
        ),
    }
}

/// The topology spread constraints and pod (anti-)affinity terms a host copy keeps. A topology
/// key is a node label: spreading or co-locating on a label only some host nodes carry places the
/// copy on them, so a key the profile does not allow takes its constraint or term out. What is
/// left out, said.
pub fn topology(allow: &Allowances, spec: &mut PodSpec) -> Vec<String> {
    let mut dropped = Vec::new();
    let mut keep = |what: &str, key: &str| {
        let ok = node_label_allowed(allow, key);
        if !ok {
            dropped.push(format!(
                "the {what} on topology key {key} is left out (not in the IsolationProfile's allow.nodeLabelKeys)"
            ));
        }
        ok
    };
    if let Some(constraints) = spec.topology_spread_constraints.as_mut() {
        constraints.retain(|c| keep("topology spread constraint", &c.topology_key));
        if constraints.is_empty() {
            spec.topology_spread_constraints = None;
        }
    }
    let Some(affinity) = spec.affinity.as_mut() else {
        return dropped;
    };
    type Terms<'a> = (
        &'a mut Option<Vec<PodAffinityTerm>>,
        &'a mut Option<Vec<WeightedPodAffinityTerm>>,
    );
    let mut sets: Vec<(&str, Terms)> = Vec::new();
    if let Some(a) = affinity.pod_affinity.as_mut() {
        sets.push((
            "pod affinity term",
            (
                &mut a.required_during_scheduling_ignored_during_execution,
                &mut a.preferred_during_scheduling_ignored_during_execution,
            ),
        ));
    }
    if let Some(a) = affinity.pod_anti_affinity.as_mut() {
        sets.push((
            "pod anti-affinity term",
            (
                &mut a.required_during_scheduling_ignored_during_execution,
                &mut a.preferred_during_scheduling_ignored_during_execution,
            ),
        ));
    }
    for (what, (required, preferred)) in sets {
        if let Some(terms) = required.as_mut() {
            terms.retain(|t| keep(what, &t.topology_key));
            if terms.is_empty() {
                *required = None;
            }
        }
        if let Some(terms) = preferred.as_mut() {
            terms.retain(|t| keep(what, &t.pod_affinity_term.topology_key));
            if terms.is_empty() {
                *preferred = None;
            }
        }
    }
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn placement_keeps_only_what_the_profile_allows() {
        let all: Vec<Toleration> = serde_json::from_value(json!([
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
            {"operator": "Exists"}
        ]))
        .unwrap();
        let (kept, dropped) = tolerations(&Allowances::default(), &all);
        assert_eq!(kept.len(), 1);
        assert_eq!(dropped.len(), 2, "{dropped:?}");
        // A daemon's tolerations of a failing or full node: the host keeps pods away from it.
        let lifecycle: Vec<Toleration> = serde_json::from_value(json!([
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 86400},
            {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}
        ]))
        .unwrap();
        let (kept, dropped) = tolerations(&Allowances::default(), &lifecycle);
        assert_eq!(kept, lifecycle[..1].to_vec());
        assert_eq!(dropped.len(), 5, "{dropped:?}");
        assert!(dropped[0].contains("node.kubernetes.io/not-ready (a node the host keeps pods away from; NoExecute for at most 300s is kept)"), "{dropped:?}");
        assert!(
            dropped[2].contains("memory-pressure") && dropped[2].contains("allow.tolerationKeys")
        );
        let opened = Allowances {
            toleration_keys: vec!["node.kubernetes.io/memory-pressure".into()],
            ..Default::default()
        };
        assert_eq!(tolerations(&opened, &lifecycle).0.len(), 2);
        let selector = BTreeMap::from([
            ("kubernetes.io/os".to_string(), "linux".to_string()),
            (
                "node-role.kubernetes.io/control-plane".to_string(),
                String::new(),
            ),
        ]);
        let (kept, dropped) = node_selector(&Allowances::default(), &selector);
        assert_eq!(kept.len(), 1);
        assert!(dropped[0].contains("control-plane"));
        let (class, dropped) = priority_class(&Allowances::default(), Some("system-node-critical"));
        assert_eq!(class, None);
        assert_eq!(dropped.len(), 1);
    }

    #[test]
    fn topology_keys_are_node_labels_the_profile_allows() {
        let mut spec: PodSpec = serde_json::from_value(json!({
            "containers": [{"name": "c"}],
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "pool.example.com/gpu-team-b", "whenUnsatisfiable": "DoNotSchedule"},
                {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"}
            ],
            "affinity": {
                "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "ops.example.com/owner", "labelSelector": {"matchLabels": {"app": "x"}}}]},
                "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}
            }
        }))
        .unwrap();
        let dropped = topology(&Allowances::default(), &mut spec);
        assert_eq!(dropped.len(), 2, "{dropped:?}");
        assert!(dropped[0].contains("pool.example.com/gpu-team-b"));
        assert!(dropped[1].contains("pod affinity term on topology key ops.example.com/owner"));
        assert_eq!(
            spec.topology_spread_constraints.as_ref().map(Vec::len),
            Some(1)
        );
        let affinity = spec.affinity.unwrap();
        assert!(
            affinity
                .pod_affinity
                .unwrap()
                .required_during_scheduling_ignored_during_execution
                .is_none()
        );
        assert!(
            affinity
                .pod_anti_affinity
                .unwrap()
                .preferred_during_scheduling_ignored_during_execution
                .is_some()
        );
        let allow = Allowances {
            node_label_keys: vec!["ops.example.com/owner".into()],
            ..Default::default()
        };
        let mut only: PodSpec = serde_json::from_value(json!({"containers": [{"name": "c"}],
            "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "ops.example.com/owner"}]}}}))
        .unwrap();
        assert!(topology(&allow, &mut only).is_empty());
    }
}
