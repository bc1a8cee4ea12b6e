//! Virtual nodes: the tenant sees one Node per host node that runs its pods, with the host
//! node's name, labels, capacity and conditions, and none of its taints or provider details. Its
//! kubelet is the operator's kubelet endpoint. A Node no tenant pod uses any more goes.

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeDaemonEndpoints, NodeStatus, Pod, Taint, Toleration,
};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tenantplane_api::SyncPolicySpec;
use tenantplane_api::sync_policy::NodeSyncMode;

use crate::KubeletEndpoint;
use crate::converge::delete_if_present;
use crate::error::Result;
use crate::host::Scope;
use crate::kind::{Key, Kind, shown_watch_config};
use crate::naming::{self, SYNCER_MANAGER};
use crate::tenant::Tenant;

pub struct Nodes;

impl Kind for Nodes {
    const NAME: &'static str = "Node";
    type Object = Node;

    fn tenant_watch(_: &SyncPolicySpec) -> Option<kube::runtime::watcher::Config> {
        Some(shown_watch_config())
    }

    fn host_scope(policy: &SyncPolicySpec) -> Option<Scope> {
        policy.from_host.nodes.enabled.then_some(Scope::Cluster)
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
    let wanted = virtual_node(&host, cx.tr.name(), cx.tr.kubelet.as_ref());
    let nodes: Api<Node> = Api::all(cx.tenant.clone());
    let current = cx.tenant_get::<Node>("", name);
    match current {
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
        Some(current) if !node_differs(&current, &wanted) => return Ok(true),
        Some(_) => {}
    }
    // Status is a subresource: written separately, also right after creation. A node the
    // cache still shows but that is gone (deleted a moment ago) is created again.
    let labels = json!({
        "metadata": {"labels": wanted.metadata.labels},
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

async fn converge_node(cx: &Tenant, name: &str) -> Result<()> {
    // In use: a tenant pod is bound to it (whatever the policy says now: the tenant deletes
    // pods bound to missing nodes), or a copy runs there whose tenant pod is about to be.
    let on_node = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name);
    let bound_here = cx.tenant_list::<Pod>().iter().any(|p| on_node(p));
    let in_use = bound_here
        || (cx.policy.from_host.nodes.enabled
            && cx
                .host_slice::<Pod>()
                .iter()
                .any(|p| on_node(p) && cx.tr.copy_of(&p.metadata).is_some()));
    let host = cx.host_get::<Node>(false, name);
    let shown = host.as_ref().is_some_and(|h| {
        cx.policy.from_host.nodes.enabled
            && cx.policy.from_host.nodes.mode == NodeSyncMode::All
            && schedulable(h, &cx.tr.node_selector, &cx.tr.tolerations)
    });
    let in_use = in_use || shown;
    let host_exists = host.is_some();
    let current = cx.tenant_get::<Node>("", name);
    if in_use && host_exists {
        return ensure_virtual_node(cx, name).await.map(|_| ());
    }
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

/// The virtual Node the tenant sees for host node `node`: its name, labels, capacity and
/// conditions; no taints, pod CIDRs or provider details of the host. Its kubelet is `kubelet`
/// (the operator's endpoint) when given: its only address, besides its name, and its port.
pub fn virtual_node(host: &Node, tenant: &str, kubelet: Option<&KubeletEndpoint>) -> Node {
    let mut labels = naming::copyable(host.metadata.labels.as_ref());
    labels.insert(naming::LABEL_SYNCED_FROM.into(), tenant.into());
    let status = host.status.clone().unwrap_or_default();
    let (addresses, daemon_endpoints) = match kubelet {
        Some(k) => (
            Some(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: k.address.clone(),
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: host.metadata.name.clone().unwrap_or_default(),
                },
            ]),
            Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint {
                    port: i32::from(k.port),
                }),
            }),
        ),
        None => (status.addresses, status.daemon_endpoints),
    };
    Node {
        metadata: ObjectMeta {
            name: host.metadata.name.clone(),
            labels: Some(labels),
            ..Default::default()
        },
        spec: None,
        status: Some(NodeStatus {
            capacity: status.capacity,
            allocatable: status.allocatable,
            conditions: status.conditions,
            addresses,
            node_info: status.node_info,
            daemon_endpoints,
            ..Default::default()
        }),
    }
}

/// Does the tenant Node show the host node's state as [`virtual_node`] would put it?
pub fn node_differs(tenant: &Node, wanted: &Node) -> bool {
    let status = |n: &Node| {
        let s = n.status.clone().unwrap_or_default();
        let conds: Vec<_> = s
            .conditions
            .iter()
            .flatten()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect();
        (
            s.capacity,
            s.allocatable,
            s.addresses,
            s.daemon_endpoints,
            conds,
        )
    };
    // The API server taints a Node created without a Ready condition, and nothing in the tenant
    // (its node lifecycle controller is off) would remove the taint.
    let tainted = tenant
        .spec
        .as_ref()
        .is_some_and(|s| s.taints.as_ref().is_some_and(|t| !t.is_empty()));
    let labels_missing = wanted
        .metadata
        .labels
        .iter()
        .flatten()
        .any(|(k, v)| tenant.metadata.labels.as_ref().and_then(|l| l.get(k)) != Some(v));
    tainted || labels_missing || status(tenant) != status(wanted)
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

    #[test]
    fn a_virtual_node_shows_the_host_state_without_its_taints() {
        let host: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"zone": "a", "tenantplane.io/x": "y"},
                         "annotations": {"cloud/id": "i-1"}},
            "spec": {"taints": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
                     "providerID": "cloud://i-1", "podCIDR": "10.244.0.0/24"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "capacity": {"pods": "110"}, "addresses": [{"type": "InternalIP", "address": "10.0.0.5"}]}
        }))
        .unwrap();
        let node = virtual_node(&host, "dev", None);
        assert!(node.spec.is_none(), "no taints, provider ID or pod CIDR");
        assert!(node.metadata.annotations.is_none());
        let labels = node.metadata.labels.clone().unwrap();
        assert_eq!(labels["zone"], "a");
        assert_eq!(labels[naming::LABEL_SYNCED_FROM], "dev");
        assert!(!labels.contains_key("tenantplane.io/x"));
        assert!(!node_differs(&node, &node));
        let mut tainted = node.clone();
        tainted.spec = serde_json::from_value(
            json!({"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]}),
        )
        .unwrap();
        assert!(node_differs(&tainted, &node), "a stale taint is removed");
        let mut stale = node.clone();
        stale.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
        assert!(node_differs(&stale, &node));
    }

    #[test]
    fn a_virtual_nodes_kubelet_is_the_operators_endpoint() {
        let host: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.5"},
                                     {"type": "ExternalIP", "address": "203.0.113.9"}],
                       "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}
        }))
        .unwrap();
        let kubelet = KubeletEndpoint {
            address: "10.96.0.42".into(),
            port: 10250,
        };
        let node = virtual_node(&host, "dev", Some(&kubelet));
        let status = node.status.clone().unwrap();
        let addresses: Vec<_> = status
            .addresses
            .unwrap()
            .into_iter()
            .map(|a| (a.type_, a.address))
            .collect();
        assert_eq!(
            addresses,
            [
                ("InternalIP".to_string(), "10.96.0.42".to_string()),
                ("Hostname".to_string(), "n1".to_string())
            ],
            "no host address shows"
        );
        let port = status
            .daemon_endpoints
            .unwrap()
            .kubelet_endpoint
            .unwrap()
            .port;
        assert_eq!(port, 10250);
        let elsewhere = virtual_node(
            &host,
            "dev",
            Some(&KubeletEndpoint {
                address: "10.96.0.42".into(),
                port: 10251,
            }),
        );
        assert!(
            node_differs(&elsewhere, &node),
            "a moved endpoint is rewritten"
        );
    }
}
