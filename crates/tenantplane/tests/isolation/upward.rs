//! Isolation, second round: what comes up from the host. A virtual Node shows no host label,
//! annotation, identifier or address beyond the topology a tenant needs; scheduling messages and
//! host Events name no host node the tenant is not shown, no host namespace and no copy name; a
//! pod that names a host node itself neither lands there nor makes that node appear.

use super::*;
use k8s_openapi::api::core::v1::Node;
use kube::api::DeleteParams;

/// What a tenant reads while its pod's copy waits for the host scheduler (kept stable: users
/// and their tools read it).
const WAITING: &str =
    "Waiting for room on the nodes this cluster may use: none of them can take the pod now.";

/// The taint and label that keep every other test's pods off a node these tests make.
const ONLY: &str = "upward.tenantplane.test/only";

/// Make host Node `node` (JSON), simulated by kwok when it carries kwok's annotation.
async fn host_node(host: &Client, node: serde_json::Value) -> Node {
    let node: Node = serde_json::from_value(node).unwrap();
    create(&Api::<Node>::all(host.clone()), &node).await
}

async fn remove_node(host: &Client, name: &str) {
    let _ = Api::<Node>::all(host.clone())
        .delete(name, &DeleteParams::default())
        .await;
}

fn scheduled_condition(p: &Pod) -> Option<k8s_openapi::api::core::v1::PodCondition> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled")
        .cloned()
}

#[tokio::test]
async fn virtual_nodes_scheduling_messages_and_events_name_nothing_of_the_host() {
    let world = TestHost::start("iso-up").await;
    let (ns, host) = (&world.ns, &world.host);
    // A host node as a cloud makes them: instance ids, another team's ownership, pool names.
    let name = format!("pool-{}", ns.name.replace("iso-", ""));
    host_node(
        host,
        json!({
            "metadata": {"name": name,
                "labels": {ONLY: "team-payments", "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                    "topology.kubernetes.io/zone": "zone-a", "topology.kubernetes.io/region": "region-1",
                    "node.kubernetes.io/instance-type": "m7.large",
                    "team.example.com/owner": "payments", "pool": "gpu-batch",
                    "eks.amazonaws.com/nodegroup": "ng-ledger"},
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0",
                    "cloud.example.com/instance-id": "i-0badc0ffee",
                    "csi.volume.kubernetes.io/nodeid": "{\"ebs\":\"i-0badc0ffee\"}"}},
            "spec": {"providerID": "aws:///zone-a/i-0badc0ffee",
                     "podCIDR": "10.244.201.0/24", "podCIDRs": ["10.244.201.0/24"],
                     "taints": [{"key": ONLY, "value": "team-payments", "effect": "NoSchedule"}]},
            "status": {"nodeInfo": {"machineID": "machine-0badc0ffee", "systemUUID": "uuid-0badc0ffee",
                "bootID": "boot-0badc0ffee", "kernelVersion": "6.1.0", "osImage": "Ledger OS",
                "containerRuntimeVersion": "containerd://1.7.0", "kubeletVersion": "v1.33.0",
                "kubeProxyVersion": "v1.33.0", "operatingSystem": "linux", "architecture": "amd64"}}
        }),
    )
    .await;
    // The profile puts the tenant's pods on that node (and nowhere else).
    let tenant = TenantSetup::seed()
        .profile_spec(json!({"nodeSelector": {ONLY: "team-payments"},
               "tolerations": [{"key": ONLY, "operator": "Equal", "value": "team-payments",
                                "effect": "NoSchedule"}]}))
        .ready_in(ns)
        .await;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    create(&pods, &pod("web", json!({}), json!({}))).await;
    // A zone the profile lets pods select, that no node has: the copy waits.
    let nowhere = json!({"nodeSelector": {"topology.kubernetes.io/zone": "zone-nowhere"}});
    create(&pods, &pod("waiting", json!({}), nowhere)).await;

    // The tenant's Node: topology, capacity and conditions; nothing else of the host node.
    let tenant_nodes: Api<Node> = Api::all(tenant.clone());
    let last = std::sync::Mutex::new(String::new());
    let node = eventually(WAIT, || async {
        let bound = pods.get("web").await.ok()?.spec?.node_name;
        *last.lock().unwrap() = format!("web bound to {bound:?}");
        (bound.as_deref() == Some(name.as_str())).then_some(())?;
        tenant_nodes.get_opt(&name).await.ok()?
    })
    .await
    .unwrap_or_else(|| panic!("no virtual node {name}: {}", last.lock().unwrap()));
    let mut keys: Vec<&str> = node.labels().keys().map(String::as_str).collect();
    keys.sort();
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
    assert!(node.annotations().is_empty(), "{:?}", node.annotations());
    let spec = node.spec.clone().unwrap_or_default();
    assert_eq!(spec.provider_id, None);
    assert_eq!(spec.pod_cidr, None);
    assert!(spec.taints.unwrap_or_default().is_empty());
    let status = node.status.clone().unwrap();
    assert!(status.capacity.is_some() && status.allocatable.is_some());
    assert!(
        status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    );
    let host_addresses: Vec<String> = Api::<Node>::all(host.clone())
        .get(&name)
        .await
        .unwrap()
        .status
        .and_then(|s| s.addresses)
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.type_ != "Hostname")
        .map(|a| a.address)
        .collect();
    assert!(
        !host_addresses.is_empty(),
        "kwok gave the host node an address"
    );
    for a in status.addresses.iter().flatten() {
        assert!(!host_addresses.contains(&a.address), "host address {a:?}");
    }
    let info = status.node_info.clone().unwrap();
    assert_eq!(
        (
            info.machine_id.as_str(),
            info.system_uuid.as_str(),
            info.boot_id.as_str()
        ),
        ("", "", "")
    );
    let text = serde_json::to_string(&node).unwrap();
    for secret in [
        "0badc0ffee",
        "payments",
        "gpu-batch",
        "ng-ledger",
        "10.244.201",
    ] {
        assert!(
            !text.contains(secret),
            "the tenant's Node shows {secret}: {text}"
        );
    }

    // The pod whose copy cannot be placed says it waits, not what the host's nodes are.
    let copy = eventually(WAIT, || async {
        let copy: Pod = host_copy(host, &ns.name, "waiting").await;
        let message = scheduled_condition(&copy)?.message?;
        message.contains("nodes are available").then_some(message)
    })
    .await
    .expect("the host scheduler never said why the copy waits");
    let said = eventually(WAIT, || async {
        scheduled_condition(&pods.get("waiting").await.ok()?)?.message
    })
    .await
    .unwrap_or_else(|| panic!("the tenant pod never said it waits (host: {copy})"));
    assert_eq!(said, WAITING);
    let p = pods.get("waiting").await.unwrap();
    assert_eq!(
        p.status.and_then(|s| s.nominated_node_name),
        None,
        "no host node is nominated"
    );
    assert_eq!(told(&tenant, "waiting", "FailedScheduling").await, WAITING);

    // The scheduler's Event names the tenant's pod and its virtual node.
    assert_eq!(
        told(&tenant, "web", "Scheduled").await,
        format!("Successfully assigned default/web to {name}")
    );
    // No Event in the tenant names the host namespace, a copy, or a host node the tenant does
    // not see (the control plane's node runs none of its pods).
    let hidden = tenantplane_testenv::host_cluster::KWOK_NODE;
    assert!(
        tenant_nodes.get_opt(hidden).await.unwrap().is_none(),
        "{hidden} runs no copy of this tenant"
    );
    let events = Api::<Event>::all(tenant.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let from_host = events
        .iter()
        .filter(|e| e.labels().contains_key(naming::LABEL_SYNCED_FROM))
        .count();
    assert!(from_host > 0, "no host Event came up: {events:?}");
    for e in &events {
        let text = serde_json::to_string(e).unwrap();
        for leak in [
            ns.name.as_str(),
            "-x-default-x-dev",
            "-x-kube-system-x-dev",
            hidden,
        ] {
            assert!(!text.contains(leak), "an Event names {leak}: {text}");
        }
        if !e.labels().contains_key(naming::LABEL_SYNCED_FROM) {
            // The tenant's own components' Events (its API server's instance is its own).
            continue;
        }
        let source_host = e.source.as_ref().and_then(|s| s.host.as_deref());
        for named in [source_host, e.reporting_instance.as_deref()]
            .into_iter()
            .flatten()
            .filter(|n| !n.is_empty())
        {
            assert!(
                named == name || Some(named) == e.reporting_component.as_deref(),
                "an Event names a host machine: {text}"
            );
        }
    }
    remove_node(host, &name).await;
}

#[tokio::test]
async fn a_pod_naming_a_host_node_neither_lands_there_nor_shows_it() {
    let world = TestHost::start("iso-up-pin").await;
    let (ns, host) = (&world.ns, &world.host);
    // A host node that runs none of this tenant's pods (nor anyone's: it is tainted).
    let decoy = format!("decoy-{}", ns.name.replace("iso-", ""));
    host_node(
        host,
        json!({
            "metadata": {"name": decoy, "labels": {"kubernetes.io/hostname": decoy}},
            "spec": {"taints": [{"key": ONLY, "value": "nobody", "effect": "NoSchedule"}]}
        }),
    )
    .await;
    let tenant = TenantSetup::seed().allow(json!({})).ready_in(ns).await;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    create(&pods, &pod("pinned", json!({}), json!({"nodeName": decoy}))).await;
    create(&pods, &pod("plain", json!({}), json!({}))).await;
    // The host scheduler places the copy: not on the node the tenant named.
    let placed = eventually(WAIT, || async {
        let copy: Pod = host_copy(host, &ns.name, "pinned").await;
        copy.spec?.node_name
    })
    .await
    .expect("the host scheduler never placed the copy");
    assert_ne!(placed, decoy);
    // Once the tenant shows the copy running and its other pod on its virtual node, the syncer
    // has looked at the named node: it does not appear.
    let settled = eventually(WAIT, || async {
        let pinned = pods.get("pinned").await.ok()?;
        let running = pinned.status?.phase.as_deref() == Some("Running");
        let plain = pods.get("plain").await.ok()?.spec?.node_name;
        plain.filter(|_| running)
    })
    .await
    .expect("the tenant never showed its pods running");
    let names: Vec<String> = Api::<Node>::all(tenant.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    assert!(!names.contains(&decoy), "the named node shows: {names:?}");
    // The nodes that run the copies show (another test's node may run some of them).
    assert!(names.contains(&placed), "{names:?}");
    assert!(names.contains(&settled), "{names:?}");
    remove_node(host, &decoy).await;
}

#[tokio::test]
async fn a_sync_policy_may_show_more_node_labels() {
    // The platform team opens one host label (kwok's node carries `type: kwok`).
    let world = TenantSetup::seed()
        .sync_policy(json!({"fromHost": {"nodes": {"labels": ["typ*"]}}}))
        .start("iso-up-labels")
        .await;
    let (host, tenant) = (&world.host, &world.tenant);
    let policy_name = world.sync_policy.clone().unwrap();
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    create(&pods, &pod("web", json!({}), json!({}))).await;
    let node_name = eventually(WAIT, || async {
        pods.get("web").await.ok()?.spec?.node_name
    })
    .await
    .expect("the pod was never bound to a virtual node");
    let node = Api::<Node>::all(tenant.clone())
        .get(&node_name)
        .await
        .unwrap();
    let host_node = Api::<Node>::all(host.clone())
        .get(&node_name)
        .await
        .unwrap();
    let opened: Vec<(&String, &String)> = host_node
        .labels()
        .iter()
        .filter(|(k, _)| k.starts_with("typ"))
        .collect();
    assert!(!opened.is_empty(), "the host node has a label to open");
    for (k, v) in opened {
        assert_eq!(node.labels().get(k), Some(v), "{:?}", node.labels());
    }
    assert!(
        node.labels().keys().all(|k| k.starts_with("typ")
            || k.contains("kubernetes.io/")
            || k.starts_with("tenantplane.io/")),
        "{:?}",
        node.labels()
    );
    let _ = Api::<tenantplane_api::SyncPolicy>::all(host.clone())
        .delete(&policy_name, &DeleteParams::default())
        .await;
}
