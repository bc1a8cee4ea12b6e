//! What a virtual Node shows of its host node: its name, the well-known topology labels (and
//! those the SyncPolicy lists), capacity and conditions; none of its other labels, annotations,
//! taints, addresses or provider and machine identifiers. Its kubelet is the operator's endpoint.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeStatus,
    NodeSystemInfo,
};
use kube::api::ObjectMeta;
use serde_json::Value;

use crate::allow::WELL_KNOWN_NODE_LABELS;
use crate::naming;
use crate::spec::KubeletEndpoint;
use crate::tenant_terms;

/// The labels of host node labels `host` a virtual Node shows: the topology ones and those the
/// SyncPolicy lists (`fromHost.nodes.labels`: keys, or prefixes ending in `*`); never reserved ones.
pub fn shown_labels(
    host: Option<&BTreeMap<String, String>>,
    listed: &[String],
) -> BTreeMap<String, String> {
    let listed = |key: &str| {
        listed.iter().any(|l| match l.strip_suffix('*') {
            Some(prefix) => key.starts_with(prefix),
            None => key == l,
        })
    };
    naming::copyable(host)
        .into_iter()
        .filter(|(k, _)| WELL_KNOWN_NODE_LABELS.contains(&k.as_str()) || listed(k))
        .collect()
}

/// What a virtual Node tells of the host machine: its platform and versions (what `kubectl get
/// nodes -o wide` shows, and what a container learns from `uname` anyway), no machine, boot or
/// system identifiers.
fn system_info(host: &NodeSystemInfo) -> NodeSystemInfo {
    NodeSystemInfo {
        architecture: host.architecture.clone(),
        operating_system: host.operating_system.clone(),
        kubelet_version: host.kubelet_version.clone(),
        kube_proxy_version: host.kube_proxy_version.clone(),
        container_runtime_version: host.container_runtime_version.clone(),
        kernel_version: host.kernel_version.clone(),
        os_image: host.os_image.clone(),
        ..Default::default()
    }
}

/// The virtual Node the tenant sees for host node `node`: its name, topology labels (and those
/// `labels` lists), capacity and conditions; no taints, pod CIDRs or provider details of the
/// host, and its addresses only when `node_addresses` (the profile's `allow.nodeAddresses`).
/// Its kubelet is `kubelet` (the operator's endpoint) when given: its `Hostname` address (the
/// tenant API server dials that type first), its port, and its `InternalIP` too unless the host's
/// are shown. Without it the Node has its name for a `Hostname`, no kubelet.
pub fn virtual_node(
    host: &Node,
    tenant: &str,
    kubelet: Option<&KubeletEndpoint>,
    labels: &[String],
    node_addresses: bool,
) -> Node {
    let mut labels = shown_labels(host.metadata.labels.as_ref(), labels);
    labels.insert(naming::LABEL_SYNCED_FROM.into(), tenant.into());
    let status = host.status.clone().unwrap_or_default();
    let address = |type_: &str, address: &str| NodeAddress {
        type_: type_.into(),
        address: address.into(),
    };
    let mut addresses: Vec<NodeAddress> = if node_addresses {
        status
            .addresses
            .iter()
            .flatten()
            .filter(|a| matches!(a.type_.as_str(), "InternalIP" | "ExternalIP"))
            .cloned()
            .collect()
    } else {
        kubelet
            .map(|k| address("InternalIP", &k.address))
            .into_iter()
            .collect()
    };
    let name = host.metadata.name.clone().unwrap_or_default();
    addresses.push(address(
        "Hostname",
        kubelet.map_or(name.as_str(), |k| k.address.as_str()),
    ));
    let daemon_endpoints = kubelet.map(|k| NodeDaemonEndpoints {
        kubelet_endpoint: Some(DaemonEndpoint {
            port: i32::from(k.port),
        }),
    });
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
            conditions: status.conditions.map(|c| conditions(c, node_addresses)),
            addresses: Some(addresses),
            node_info: status.node_info.as_ref().map(system_info),
            daemon_endpoints,
            ..Default::default()
        }),
    }
}

/// A host node's conditions as the tenant reads them: a kubelet's message can name the node's
/// addresses (a runtime or network plugin error), which the tenant reads only when shown them.
fn conditions(mut conditions: Vec<NodeCondition>, node_addresses: bool) -> Vec<NodeCondition> {
    for c in &mut conditions {
        if let Some(m) = c.message.as_mut() {
            *m = tenant_terms::without_host_addresses(m, &|_| node_addresses);
        }
    }
    conditions
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
            s.node_info,
            conds,
        )
    };
    // The API server taints a Node created without a Ready condition, and nothing in the tenant
    // (its node lifecycle controller is off) would remove the taint.
    let tainted = tenant
        .spec
        .as_ref()
        .is_some_and(|s| s.taints.as_ref().is_some_and(|t| !t.is_empty()));
    // Exactly the wanted labels: one a host node had before it was trimmed goes too.
    let labels = |n: &Node| n.metadata.labels.clone().unwrap_or_default();
    tainted || labels(tenant) != labels(wanted) || status(tenant) != status(wanted)
}

/// The merge patch of a tenant Node's labels to `wanted`'s: the labels it has that `wanted`
/// has not are removed.
pub(crate) fn labels_patch(current: Option<&Node>, wanted: &Node) -> Value {
    let mut patch: serde_json::Map<String, Value> = current
        .and_then(|c| c.metadata.labels.as_ref())
        .into_iter()
        .flatten()
        .map(|(k, _)| (k.clone(), Value::Null))
        .collect();
    for (k, v) in wanted.metadata.labels.iter().flatten() {
        patch.insert(k.clone(), Value::String(v.clone()));
    }
    Value::Object(patch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;
    use serde_json::json;

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
        let node = virtual_node(&host, "dev", None, &[], false);
        assert!(node.spec.is_none(), "no taints, provider ID or pod CIDR");
        assert!(node.metadata.annotations.is_none());
        let labels = node.metadata.labels.clone().unwrap();
        assert_eq!(
            labels,
            BTreeMap::from([(naming::LABEL_SYNCED_FROM.to_string(), "dev".to_string())]),
            "no host label that is not a topology label"
        );
        let addresses = node.status.as_ref().unwrap().addresses.clone().unwrap();
        assert_eq!(addresses.len(), 1, "no host address: {addresses:?}");
        assert_eq!(
            (addresses[0].type_.as_str(), addresses[0].address.as_str()),
            ("Hostname", "n1")
        );
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
        let node = virtual_node(&host, "dev", Some(&kubelet), &[], false);
        let status = node.status.clone().unwrap();
        // Each address as (type, address), in order.
        let addresses_of = |n: Node| -> Vec<(String, String)> {
            n.status
                .and_then(|s| s.addresses)
                .into_iter()
                .flatten()
                .map(|a| (a.type_, a.address))
                .collect()
        };
        assert_eq!(
            addresses_of(node.clone()),
            [
                ("InternalIP".to_string(), "10.96.0.42".to_string()),
                ("Hostname".to_string(), "10.96.0.42".to_string())
            ],
            "no host address shows"
        );
        // A profile that shows node addresses: the host's IPs, the endpoint as the Hostname the
        // tenant API server dials first.
        assert_eq!(
            addresses_of(virtual_node(&host, "dev", Some(&kubelet), &[], true)),
            [
                ("InternalIP".to_string(), "10.0.0.5".to_string()),
                ("ExternalIP".to_string(), "203.0.113.9".to_string()),
                ("Hostname".to_string(), "10.96.0.42".to_string())
            ]
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
            &[],
            false,
        );
        assert!(
            node_differs(&elsewhere, &node),
            "a moved endpoint is rewritten"
        );
    }

    fn identifying_host() -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "ip-10-0-0-5.ec2.internal",
                "labels": {"kubernetes.io/hostname": "ip-10-0-0-5", "kubernetes.io/os": "linux",
                           "kubernetes.io/arch": "arm64", "topology.kubernetes.io/zone": "eu-1a",
                           "topology.kubernetes.io/region": "eu-1",
                           "node.kubernetes.io/instance-type": "m7g.large",
                           "team.example.com/owner": "payments", "pool": "gpu-batch",
                           "eks.amazonaws.com/nodegroup": "ng-7", "example.com/rack": "r12",
                           "tenantplane.io/synced-from": "other"},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                "csi.volume.kubernetes.io/nodeid": "{\"ebs\":\"i-0abc\"}"}},
            "spec": {"providerID": "aws:///eu-1a/i-0abc", "podCIDR": "10.244.3.0/24",
                     "taints": [{"key": "dedicated", "value": "payments", "effect": "NoSchedule"}]},
            "status": {
                "capacity": {"cpu": "2", "memory": "8Gi", "pods": "110"},
                "allocatable": {"cpu": "1900m", "memory": "7Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                "addresses": [{"type": "InternalIP", "address": "10.0.0.5"},
                              {"type": "ExternalIP", "address": "203.0.113.9"},
                              {"type": "InternalDNS", "address": "ip-10-0-0-5.ec2.internal"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {"machineID": "ec2abc", "systemUUID": "ec2-uuid", "bootID": "boot-1",
                             "kernelVersion": "6.1.0", "osImage": "Amazon Linux 2023",
                             "containerRuntimeVersion": "containerd://1.7.0",
                             "kubeletVersion": "v1.33.0", "kubeProxyVersion": "",
                             "operatingSystem": "linux", "architecture": "arm64"},
                "images": [{"names": ["registry.payments.internal/ledger:1"]}],
                "volumesInUse": ["kubernetes.io/csi/ebs^vol-1"]
            }
        }))
        .unwrap()
    }

    #[test]
    fn condition_messages_name_no_host_address_unless_addresses_are_shown() {
        let mut host = identifying_host();
        host.status.as_mut().unwrap().conditions = Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: Some("KubeletNotReady".into()),
            message: Some("network not ready: dial tcp 10.0.0.5:6443: connection refused".into()),
            ..Default::default()
        }]);
        let message = |shown: bool| {
            let node = virtual_node(&host, "dev", None, &[], shown);
            let status = node.status.unwrap();
            status.conditions.unwrap()[0].message.clone().unwrap()
        };
        assert_eq!(
            message(false),
            "network not ready: dial tcp <host address>:6443: connection refused"
        );
        assert_eq!(
            message(true),
            "network not ready: dial tcp 10.0.0.5:6443: connection refused"
        );
    }

    #[test]
    fn a_virtual_node_shows_topology_capacity_and_conditions_only() {
        let host = identifying_host();
        let kubelet = KubeletEndpoint {
            address: "10.96.0.42".into(),
            port: 10250,
        };
        let node = virtual_node(&host, "dev", Some(&kubelet), &[], false);
        let keys: Vec<&str> = node
            .metadata
            .labels
            .iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(
            keys,
            [
                "kubernetes.io/arch",
                "kubernetes.io/hostname",
                "kubernetes.io/os",
                "node.kubernetes.io/instance-type",
                naming::LABEL_SYNCED_FROM,
                "topology.kubernetes.io/region",
                "topology.kubernetes.io/zone",
            ]
        );
        assert_eq!(node.labels()[naming::LABEL_SYNCED_FROM], "dev");
        assert!(node.metadata.annotations.is_none() && node.spec.is_none());
        let status = node.status.clone().unwrap();
        assert_eq!(status.capacity, host.status.as_ref().unwrap().capacity);
        assert_eq!(
            status.allocatable,
            host.status.as_ref().unwrap().allocatable
        );
        assert_eq!(status.conditions, host.status.as_ref().unwrap().conditions);
        assert!(status.images.is_none() && status.volumes_in_use.is_none());
        let info = status.node_info.unwrap();
        assert_eq!(
            (
                info.machine_id.as_str(),
                info.system_uuid.as_str(),
                info.boot_id.as_str()
            ),
            ("", "", ""),
            "no machine identifiers"
        );
        assert_eq!(
            (info.architecture.as_str(), info.kubelet_version.as_str()),
            ("arm64", "v1.33.0")
        );
        let text = serde_json::to_string(&node).unwrap();
        for secret in [
            "10.0.0.5",
            "203.0.113.9",
            "i-0abc",
            "payments",
            "gpu-batch",
            "ng-7",
        ] {
            assert!(!text.contains(secret), "{secret} shows: {text}");
        }
    }

    #[test]
    fn the_sync_policy_may_show_more_labels() {
        let host = identifying_host();
        let listed = ["pool".to_string(), "example.com/*".to_string()];
        let labels = shown_labels(host.metadata.labels.as_ref(), &listed);
        assert_eq!(labels.get("pool").map(String::as_str), Some("gpu-batch"));
        assert_eq!(
            labels.get("example.com/rack").map(String::as_str),
            Some("r12")
        );
        assert!(
            !labels.contains_key("team.example.com/owner"),
            "a prefix, not a suffix"
        );
        assert!(!labels.contains_key("eks.amazonaws.com/nodegroup"));
        let everything = shown_labels(host.metadata.labels.as_ref(), &["*".to_string()]);
        assert_eq!(
            everything.get("tenantplane.io/synced-from"),
            None,
            "a reserved label never shows"
        );
        assert_eq!(everything.len(), 10);
    }

    #[test]
    fn a_node_shown_before_trimming_loses_its_other_labels_and_identifiers() {
        let host = identifying_host();
        let wanted = virtual_node(&host, "dev", None, &[], false);
        let mut old = wanted.clone();
        old.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team.example.com/owner".into(), "payments".into());
        assert!(node_differs(&old, &wanted), "an extra label is removed");
        let patch = labels_patch(Some(&old), &wanted);
        assert_eq!(patch["team.example.com/owner"], Value::Null);
        assert_eq!(patch[naming::LABEL_SYNCED_FROM], "dev");
        let mut identified = wanted.clone();
        identified.status.as_mut().unwrap().node_info =
            host.status.as_ref().unwrap().node_info.clone();
        assert!(
            node_differs(&identified, &wanted),
            "identifiers are removed"
        );
        assert_eq!(
            labels_patch(None, &wanted),
            json!({"kubernetes.io/arch": "arm64", "kubernetes.io/hostname": "ip-10-0-0-5",
                   "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "m7g.large",
                   naming::LABEL_SYNCED_FROM: "dev", "topology.kubernetes.io/region": "eu-1",
                   "topology.kubernetes.io/zone": "eu-1a"})
        );
    }
}
