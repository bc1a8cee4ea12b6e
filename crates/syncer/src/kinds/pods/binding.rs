//! Where a tenant pod's copy runs and which virtual Node the tenant pod is bound to: a pod bound
//! by name keeps its node where the profile lets it, any other is bound to the Node of the host
//! node its copy landed on.

use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Binding, Node, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference, Pod, PodSpec,
};
use kube::ResourceExt;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::Pods;
use crate::converge::delete_if_present;
use crate::error::Result;
use crate::key::Key;
use crate::kind_trait::Kind;
use crate::kinds::nodes;
use crate::stages::Stage;
use crate::tenant::Tenant;

/// The host node a tenant pod bound by name (`spec.nodeName`, written so or bound before its copy
/// was made again) asks for: its copy is pinned there by node affinity ([`pin_to_node`]), never
/// bound by name, so the host scheduler still judges it (other teams' anti-affinity, taints,
/// room, ports); one that does not fit fails its tenant pod ([`reject_unplaceable`]). Only a
/// node the profile lets the tenant run on: its `nodeSelector` matches, it is not cordoned, and
/// `copy`'s tolerations cover its taints. Otherwise the host scheduler places the copy wherever it fits.
pub fn bound_by_name(cx: &Tenant, t: &Pod, copy: &Pod) -> Option<String> {
    let node = t.spec.as_ref()?.node_name.clone()?;
    let host = cx.host_get::<Node>(false, &node)?;
    let tolerations = copy
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    nodes::schedulable(&host, &cx.tr.node_selector, &tolerations).then_some(node)
}

/// Pin a copy's spec to host node `node` the way the DaemonSet controller pins its pods: a
/// `metadata.name` field term ANDed into every required node affinity term (or the only term),
/// so the node must also meet every term the copy already had. The scheduler binds it.
pub fn pin_to_node(spec: &mut PodSpec, node: &str) {
    let pin = NodeSelectorRequirement {
        key: "metadata.name".into(),
        operator: "In".into(),
        values: Some(vec![node.to_string()]),
    };
    let required = spec
        .affinity
        .get_or_insert_with(Default::default)
        .node_affinity
        .get_or_insert_with(Default::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(Default::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        let fields = term.match_fields.get_or_insert_with(Vec::new);
        fields.retain(|f| f.key != "metadata.name");
        fields.push(pin.clone());
    }
}

/// The node tenant pod `t`, bound by name, cannot have: its copy `h` is pinned there
/// ([`pin_to_node`]) and the host scheduler found it unfit (`PodScheduled` False,
/// `Unschedulable`).
fn unplaceable<'a>(t: &'a Pod, h: &Pod) -> Option<&'a str> {
    let node = t.spec.as_ref()?.node_name.as_deref()?;
    let spec = h.spec.as_ref()?;
    let pinned = spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms
        .iter()
        .flat_map(|term| term.match_fields.iter().flatten())
        .any(|f| {
            f.key == "metadata.name"
                && f.values
                    .as_ref()
                    .is_some_and(|v| v.iter().any(|n| n == node))
        });
    let held = h.status.as_ref()?.conditions.iter().flatten().any(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    });
    (spec.node_name.is_none() && pinned && held).then_some(node)
}

/// A tenant pod bound by name whose pinned copy the host scheduler cannot place fails, as a
/// kubelet refuses at admission a pod given to it by name that does not fit (its host ports
/// taken, no room): the tenant pod ends `Failed` and says why, its controller makes a new one (a
/// StatefulSet does so for an evicted pod), and the copy goes. Whether it did.
pub async fn reject_unplaceable(cx: &Tenant, t: &Pod, h: &Pod) -> Result<bool> {
    let Some(node) = unplaceable(t, h) else {
        return Ok(false);
    };
    let message = format!(
        "Pod was rejected: node {node} cannot take it now (its room, its host ports or other pods' affinity rule it out)"
    );
    let patch = json!({
        "metadata": {"uid": t.uid()},
        "status": {"phase": "Failed", "reason": REJECTED, "message": message},
    });
    cx.tenant_api::<Pod>(&t.namespace().unwrap_or_default())
        .patch_status(&t.name_any(), &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    delete_if_present(&cx.host_api::<Pod>(), h, Some(0)).await?;
    Ok(true)
}

/// The reason a tenant pod bound by name to a node that cannot take it ends with.
pub const REJECTED: &str = "NodeRejected";

/// Did tenant pod `t` end refused by its node ([`reject_unplaceable`])? It never gets a copy
/// again.
pub fn rejected(t: &Pod) -> bool {
    t.status.as_ref().is_some_and(|s| {
        s.phase.as_deref() == Some("Failed") && s.reason.as_deref() == Some(REJECTED)
    })
}

/// Bind the tenant pod to the virtual node of its copy's host node. Only to a virtual node that
/// exists: the tenant's pod garbage collector deletes pods bound to missing nodes. Without
/// virtual nodes the tenant pod stays unbound.
pub async fn bind(cx: &Tenant, t: &Pod, h: &Pod) -> Result<()> {
    let bound = t.spec.as_ref().and_then(|s| s.node_name.clone());
    let host_node = h.spec.as_ref().and_then(|s| s.node_name.clone());
    let (None, Some(node), true) = (bound, host_node, nodes::Nodes::enabled(&cx.policy)) else {
        return Ok(());
    };
    if !nodes::ensure_virtual_node(cx, &node).await? {
        // The host node is not in the cache yet; bind on the next look.
        cx.queue
            .add_after(Key::for_object::<Pods>(t), Duration::from_secs(1));
        return Ok(());
    }
    let name = t.name_any();
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: t.namespace(),
            uid: t.uid(),
            ..Default::default()
        },
        target: ObjectReference {
            kind: Some("Node".into()),
            api_version: Some("v1".into()),
            name: Some(node),
            ..Default::default()
        },
    };
    let pods = cx.tenant_api::<Pod>(&t.namespace().unwrap_or_default());
    let params = PostParams::default();
    let write = pods.create_subresource::<_, Value>("binding", &name, &params, &binding);
    match cx
        .reporter
        .stages
        .time(Stage::TenantWrite, Pods::NAME, write)
        .await
    {
        Ok(_) => Ok(()),
        // Bound meanwhile (our own earlier write, not yet in the cache).
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A pod bound by name is placed by the scheduler: on the node it named, and only where the
    /// terms it had hold too (the field term is ANDed into each of them).
    #[test]
    fn a_pin_is_an_affinity_term_the_scheduler_judges() {
        let mut bare = PodSpec::default();
        pin_to_node(&mut bare, "node-a");
        let terms = serde_json::to_value(&bare.affinity).unwrap();
        assert_eq!(
            terms,
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}}})
        );
        assert_eq!(bare.node_name, None);
        let mut zoned: PodSpec = serde_json::from_value(json!({"containers": [],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-z"]}]}]}}}}))
        .unwrap();
        pin_to_node(&mut zoned, "node-b");
        let required = zoned
            .affinity
            .and_then(|a| a.node_affinity)
            .and_then(|n| n.required_during_scheduling_ignored_during_execution)
            .unwrap();
        assert_eq!(required.node_selector_terms.len(), 2);
        for term in &required.node_selector_terms {
            let fields = term.match_fields.as_ref().unwrap();
            assert_eq!(fields.len(), 1, "the tenant's own name term is replaced");
            assert_eq!(
                fields[0].values.as_deref(),
                Some(&["node-b".to_string()][..])
            );
        }
        assert!(required.node_selector_terms[0].match_expressions.is_some());
    }

    /// Only a pinned copy the scheduler holds makes its tenant pod bound by name fail; one still
    /// being looked at, placed, or not pinned (the tenant pod bound later) does not.
    #[test]
    fn a_pinned_copy_the_scheduler_holds_is_unplaceable() {
        let tenant: Pod = serde_json::from_value(
            json!({"metadata": {"name": "p"}, "spec": {"containers": [], "nodeName": "n1"}}),
        )
        .unwrap();
        let mut spec = PodSpec::default();
        pin_to_node(&mut spec, "n1");
        let held = json!({"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]});
        let copy = |spec: &PodSpec, status: serde_json::Value| -> Pod {
            serde_json::from_value(
                json!({"metadata": {"name": "c"}, "spec": spec, "status": status}),
            )
            .unwrap()
        };
        assert_eq!(unplaceable(&tenant, &copy(&spec, held.clone())), Some("n1"));
        assert_eq!(unplaceable(&tenant, &copy(&spec, json!({}))), None);
        let mut placed = spec.clone();
        placed.node_name = Some("n1".into());
        assert_eq!(unplaceable(&tenant, &copy(&placed, held.clone())), None);
        assert_eq!(
            unplaceable(&tenant, &copy(&PodSpec::default(), held.clone())),
            None
        );
        let mut unbound = tenant;
        unbound.spec.as_mut().unwrap().node_name = None;
        assert_eq!(unplaceable(&unbound, &copy(&spec, held)), None);
    }
}
