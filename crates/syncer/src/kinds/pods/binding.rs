//! Where a tenant pod's copy runs and which virtual Node the tenant pod is bound to: a pod bound
//! by name keeps its node where the profile lets it, any other is bound to the Node of the host
//! node its copy landed on.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use kube::ResourceExt;
use kube::api::{ObjectMeta, PostParams};
use serde_json::Value;

use super::Pods;
use crate::error::Result;
use crate::key::Key;
use crate::kind_trait::Kind;
use crate::kinds::nodes;
use crate::stages::Stage;
use crate::tenant::Tenant;

/// The host node a tenant pod bound by name (`spec.nodeName`, written so or bound before its copy
/// was made again) runs on: its own, as on the host, where the kubelet admits or rejects it
/// (a host port taken, no room) rather than a scheduler. Only a node the profile lets the
/// tenant run on: its `nodeSelector` matches, it is not cordoned, and `copy`'s tolerations (the
/// profile's and those the tenant may add) cover its taints, since a kubelet checks no
/// scheduling taint. Otherwise the host scheduler places the copy.
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
