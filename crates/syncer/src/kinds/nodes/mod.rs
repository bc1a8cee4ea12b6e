//! Virtual nodes: the tenant sees one Node per host node that runs its pods' copies (what it
//! shows of the host node is `virtual_node`'s). A node a tenant pod names itself
//! (`spec.nodeName`, a Binding) is not shown for it. A Node no copy runs on any more goes.

use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tenantplane_api::SyncPolicySpec;
use tenantplane_api::sync_policy::NodeSyncMode;

use crate::converge::delete_if_present;
use crate::error::Result;
use crate::host::Scope;
use crate::key::Key;
use crate::kind_trait::{Kind, shown_watch_config};
use crate::naming::{self, SYNCER_MANAGER};
use crate::tenant::Tenant;

pub mod virtual_node;

use virtual_node::{labels_patch, node_differs, virtual_node};

/// Host nodes, shown in the tenant as virtual Nodes.
pub struct Nodes;

impl Kind for Nodes {
    const NAME: &'static str = "Node";
    type Object = Node;
    const SETTING: &'static str = "fromHost.nodes";

    fn enabled(policy: &SyncPolicySpec) -> bool {
        policy.from_host.nodes.enabled
    }

    fn listed_as() -> String {
        "virtual nodes".into()
    }

    fn tenant_watch(_: &SyncPolicySpec) -> Option<kube::runtime::watcher::Config> {
        Some(shown_watch_config())
    }

    fn host_scope(policy: &SyncPolicySpec) -> Option<Scope> {
        Self::enabled(policy).then_some(Scope::Cluster)
    }

    fn host_api(client: Client, _: Option<&str>) -> Api<Node> {
        Api::all(client)
    }

    fn host_keys(n: &Node, _: &str) -> Vec<Key> {
        vec![Key::of::<Self>("", n.name_any())]
    }

    fn converge<'a>(cx: &'a Tenant, key: &'a Key) -> futures::future::BoxFuture<'a, Result<()>> {
        Box::pin(converge_node(cx, &key.name))
    }
}

/// The key of the Node a pod is bound to, if any.
pub fn node_key(p: &Pod) -> Option<Key> {
    let node = p.spec.as_ref()?.node_name.clone()?;
    Some(Key::of::<Nodes>("", node))
}

/// Make the tenant Node for host node `name` exist and show the host's state; `false` when
/// the host node is not known (yet).
pub async fn ensure_virtual_node(cx: &Tenant, name: &str) -> Result<bool> {
    let Some(host) = cx.host_get::<Node>(false, name) else {
        return Ok(false);
    };
    let wanted = virtual_node(
        &host,
        cx.tr.name(),
        cx.tr.kubelet.as_ref(),
        &cx.policy.from_host.nodes.labels,
        cx.tr.allow.node_addresses,
    );
    let nodes: Api<Node> = Api::all(cx.tenant.clone());
    let current = cx.tenant_get::<Node>("", name);
    match &current {
        None => match nodes
            .create(
                &PostParams {
                    field_manager: Some(SYNCER_MANAGER.into()),
                    ..Default::default()
                },
                &wanted,
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        },
        Some(current) if !node_differs(current, &wanted) => return Ok(true),
        Some(_) => {}
    }
    // Status is a subresource: written separately, also right after creation. A node the
    // cache still shows but that is gone (deleted a moment ago) is created again.
    let labels = json!({
        "metadata": {"labels": labels_patch(current.as_deref(), &wanted)},
        "spec": {"taints": null, "unschedulable": null},
    });
    match nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(labels))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {
            nodes
                .create(
                    &PostParams {
                        field_manager: Some(SYNCER_MANAGER.into()),
                        ..Default::default()
                    },
                    &wanted,
                )
                .await?;
        }
        Err(e) => return Err(e.into()),
    }
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": wanted.status})),
        )
        .await?;
    Ok(true)
}

fn node_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref()?.node_name.as_deref()
}

/// Is host node `name` a virtual node of this tenant: a copy of its runs there, or (in `all`
/// mode) its pods may run there. A tenant pod that names the node itself (`spec.nodeName`, a
/// Binding) does not make it one: its copy goes where the host scheduler puts it.
pub fn shown(cx: &Tenant, name: &str) -> bool {
    let nodes = &cx.policy.from_host.nodes;
    let Some(host) = cx
        .host_get::<Node>(false, name)
        .filter(|_| Nodes::enabled(&cx.policy))
    else {
        return false;
    };
    cx.host_slice::<Pod>()
        .iter()
        .any(|p| node_of(p) == Some(name) && cx.tr.copy_of(&p.metadata).is_some())
        || (nodes.mode == NodeSyncMode::All
            && schedulable(&host, &cx.tr.node_selector, &cx.tr.tolerations))
}

async fn converge_node(cx: &Tenant, name: &str) -> Result<()> {
    if shown(cx, name) {
        return ensure_virtual_node(cx, name).await.map(|_| ());
    }
    // A tenant pod bound here whose copy still runs here keeps the Node, whatever the policy
    // says now: the tenant's pod garbage collector deletes pods bound to missing nodes.
    let runs_here = |t: &Pod| {
        let (ns, n) = (t.namespace().unwrap_or_default(), t.name_any());
        node_of(t) == Some(name)
            && cx
                .host_copy::<Pod>(&cx.tr.host_name(&ns, &n), &ns, &n)
                .is_some_and(|h| node_of(&h) == Some(name))
    };
    let in_use = cx.tenant_list::<Pod>().iter().any(|t| runs_here(t));
    let current = cx.tenant_get::<Node>("", name);
    if let Some(node) = current
        && node.labels().get(naming::LABEL_SYNCED_FROM) == Some(&cx.tr.tenant.name)
        && !in_use
    {
        let nodes: Api<Node> = Api::all(cx.tenant.clone());
        delete_if_present(&nodes, &node, None).await?;
    }
    Ok(())
}

/// May a tenant whose pods get `selector` and `tolerations` (the profile's) run on host node
/// `node`? Its labels match the selector, it takes pods, and every scheduling taint is tolerated.
pub fn schedulable(
    node: &Node,
    selector: &std::collections::BTreeMap<String, String>,
    tolerations: &[Toleration],
) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let spec = node.spec.clone().unwrap_or_default();
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        && spec.unschedulable != Some(true)
        && spec
            .taints
            .iter()
            .flatten()
            .filter(|t| t.effect != "PreferNoSchedule")
            .all(|t| tolerations.iter().any(|tol| tolerates(tol, t)))
}

/// Does `toleration` tolerate `taint`, as the scheduler decides?
fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => key.is_empty() || key == taint.key,
        _ => key == taint.key && toleration.value == taint.value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_mode_shows_the_nodes_the_profile_lets_pods_run_on() {
        let node = |labels: serde_json::Value, spec: serde_json::Value| -> Node {
            serde_json::from_value(
                json!({"metadata": {"name": "n", "labels": labels}, "spec": spec}),
            )
            .unwrap()
        };
        let pool = std::collections::BTreeMap::from([("pool".to_string(), "tenants".to_string())]);
        let control_plane = json!({"taints": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]});
        let plain = node(json!({"pool": "tenants"}), json!({}));
        assert!(schedulable(&plain, &pool, &[]));
        assert!(!schedulable(
            &node(json!({"pool": "infra"}), json!({})),
            &pool,
            &[]
        ));
        let tainted = node(json!({"pool": "tenants"}), control_plane);
        assert!(!schedulable(&tainted, &pool, &[]));
        let tolerate: Toleration = serde_json::from_value(
            json!({"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}),
        )
        .unwrap();
        assert!(schedulable(&tainted, &pool, &[tolerate]));
        let soft = node(
            json!({}),
            json!({"taints": [{"key": "x", "effect": "PreferNoSchedule"}]}),
        );
        assert!(schedulable(&soft, &Default::default(), &[]));
        let cordoned = node(json!({}), json!({"unschedulable": true}));
        assert!(!schedulable(&cordoned, &Default::default(), &[]));
    }
}
