//! Nodes and events: the virtual nodes a tenant sees, and what a tenant is told (Events, the
//! `Synced` condition) about a pod the host refuses, which the syncer retries with back-off.

use super::*;
use k8s_openapi::api::core::v1::{Event, Node};

/// Where the pod below is made: the tenant's `kube-system`, which the tenant's own Pod Security
/// exempts (elsewhere the tenant API server refuses it at once), so the host's is what refuses it.
const NS: &str = "kube-system";

/// Pod `kube-system/priv` in the tenant, running as root with no security context: the syncer
/// lets it through, the host's Pod Security (`restricted`) refuses it; the tenant's pods Api.
async fn create_privileged_pod(tenant: &Client) -> Api<Pod> {
    let mut c = container("root");
    c["securityContext"] = json!({"runAsUser": 0});
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "priv", "namespace": NS},
        "spec": {"containers": [c]}
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), NS);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods
}

#[tokio::test]
async fn a_privileged_pod_never_runs_and_the_tenant_is_told_why() {
    let world = ReadyTenant::start("sync-psa").await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let pods = create_privileged_pod(tenant).await;

    // The tenant pod says why it does not run, and so does an Event on it.
    let told = eventually(WAIT, || async {
        let p = pods.get("priv").await.ok()?;
        let cond = p
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodScheduled")?;
        (cond.reason.as_deref() == Some("HostRejected")).then_some(cond.message?)
    })
    .await
    .expect("the tenant pod never said the host refused it");
    assert!(told.contains("restricted"), "{told}");
    let event = eventually(WAIT, || async {
        Api::<Event>::namespaced(tenant.clone(), NS)
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("HostRejected")
                    && e.involved_object.name.as_deref() == Some("priv")
            })
    })
    .await;
    assert!(event.is_some(), "no HostRejected Event on the tenant pod");
    // The TenantCluster names the pod and the reason.
    let (status, _, message) = eventually(WAIT, || async {
        let c = synced_condition(host, &ns.name, "dev").await;
        (c.1 == OBJECTS_REFUSED).then_some(c)
    })
    .await
    .expect("Synced never said ObjectsRefused");
    assert_eq!(status, "False");
    assert!(
        message.contains("\n- HostRejected: Pod kube-system/priv: the host refused it"),
        "{message}"
    );
    // The host's refusal of a tenant user's pod is theirs: the tenant stays Ready.
    let tc = Api::<TenantCluster>::namespaced(host.clone(), &ns.name)
        .get("dev")
        .await
        .unwrap();
    assert_eq!(tc.status.and_then(|s| s.phase), Some(Phase::Ready));
    let copy = Api::<Pod>::namespaced(host.clone(), &ns.name)
        .get_opt("priv-x-kube-system-x-dev")
        .await
        .unwrap();
    assert!(copy.is_none(), "the host holds no copy: {copy:?}");

    // Deleting the pod clears the condition.
    pods.delete("priv", &DeleteParams::default()).await.unwrap();
    let healed = synced_again(host, &ns.name, "dev").await;
    assert!(healed, "Synced stayed False after the pod went");
}

/// Write requests in the host's audit log for `resource` `namespace/name` that the API server
/// refused with `code`.
fn refused_writes(namespace: &str, resource: &str, name: &str, code: i64) -> usize {
    let text =
        std::fs::read_to_string(tenantplane_testenv::shared().audit_log_path()).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| {
            e["objectRef"]["namespace"] == namespace
                && e["objectRef"]["resource"] == resource
                && e["objectRef"]["name"] == name
                && matches!(e["verb"].as_str(), Some("create" | "patch" | "update"))
                && e["responseStatus"]["code"] == code
        })
        .count()
}

#[tokio::test]
async fn a_pod_the_host_refuses_backs_off() {
    // The operator's retry timers a tenth of their defaults (10 s first, 5 min at most), so the
    // back-off's shape shows in 30 s rather than 5 minutes.
    let retries = tenantplane_syncer::Retries {
        refused_first: std::time::Duration::from_secs(1),
        max: std::time::Duration::from_secs(30),
    };
    let world = TestHost::start_edited("sync-backoff", |o| o.sync_retries = retries)
        .await
        .ready(TenantSetup::seed())
        .await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    create_privileged_pod(tenant).await;
    let copy = "priv-x-kube-system-x-dev";
    let first = eventually(WAIT, || async {
        (refused_writes(&ns.name, "pods", copy, 403) > 0).then_some(())
    })
    .await;
    assert!(first.is_some(), "the host never refused the copy");
    let started = std::time::Instant::now();
    let window = retries.max;
    tokio::time::sleep(window).await;
    let attempts = refused_writes(&ns.name, "pods", copy, 403);
    println!(
        "refused creates of one pod in {:?}: {attempts}",
        started.elapsed()
    );
    assert!(
        (2..=6).contains(&attempts),
        "{attempts} host create attempts in {window:?} (1 refused pod)"
    );
    let (status, reason, message) = synced_condition(host, &ns.name, "dev").await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", OBJECTS_REFUSED)
    );
    assert!(message.contains("\n- HostRejected: "), "{message}");
}

#[tokio::test]
async fn in_all_mode_the_tenant_sees_schedulable_nodes_before_any_pod_runs() {
    let world = TenantSetup::seed()
        .sync_policy(json!({"fromHost": {"nodes": {"enabled": true, "mode": "all"}}}))
        .start("sync-nodes")
        .await;
    let (ns, tenant) = (&world.ns, &world.tenant);
    let policy_name = world.sync_policy.clone().unwrap();
    let nodes: Api<Node> = Api::all(tenant.clone());
    let last = std::sync::Mutex::new(String::new());
    let node = eventually(WAIT, || async {
        let node = nodes
            .get_opt(tenantplane_testenv::host_cluster::KWOK_NODE)
            .await
            .ok()??;
        let ready = node
            .status
            .as_ref()?
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        *last.lock().unwrap() = format!("ready {ready}, taints {taints:?}");
        (ready && taints.is_empty()).then_some(node)
    })
    .await;
    let node = node.unwrap_or_else(|| {
        panic!(
            "the tenant never saw a schedulable Ready node: {}",
            last.lock().unwrap()
        )
    });
    assert_eq!(node.labels()[naming::LABEL_SYNCED_FROM], "dev");
    let pods = Api::<Pod>::namespaced(tenant.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(pods.items.is_empty(), "no pod runs in the tenant");
    delete_tenant_and_policy(ns, &policy_name).await;
}
