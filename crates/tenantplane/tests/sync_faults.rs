//! The syncer under faults, during a burst of pods through one tenant: when things settle, every
//! tenant pod has exactly one host copy, no copy is left without its tenant pod, every tenant
//! pod's status is its copy's, and the TenantCluster says `Synced` again. One test per fault:
//! the host's API server restarted, the operator killed (a standby takes the lead), the tenant's
//! API server restarted (its pod deleted), its datastore (kine) killed.
//!
//! A binary of its own, its tests one at a time: one restarts the control plane's API server,
//! and the bursts would otherwise share two cores. Each prints a `fault drill` line with its
//! figures; `make bench-sync FAULTS=1` runs them with `FAULT_BURST=N` pods (300 here).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

mod common;
use common::replica::{Replica, leader_args, wait_for_holder};
use common::*;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tenantplane_api::TenantCluster;
use tenantplane_api::conditions::{self, SYNCED};
use tenantplane_syncer::naming;
use tenantplane_testenv::{install_crds_and_policies, namespace, shared};

/// Simulated nodes added so far (besides the first).
static NODES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One drill at a time (see the module's comment).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Pods in the burst: `FAULT_BURST`, else 300 (more than the syncer's 32 workers per tenant,
/// few enough for CI).
fn burst_size() -> usize {
    std::env::var("FAULT_BURST")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(300)
}

/// How long the tenant may take to settle after the fault: 5 minutes and 0.3 s per pod.
fn settle_limit() -> Duration {
    Duration::from_secs(300) + Duration::from_millis(300) * burst_size() as u32
}

/// What a settled tenant looks like against the host, counted.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    /// Tenant pods (of the burst) and their host copies.
    tenant_pods: usize,
    copies: usize,
    /// Copies beyond the first of one tenant pod.
    duplicates: usize,
    /// Copies whose tenant pod is gone.
    orphans: usize,
    /// Tenant pods without a copy.
    lost: usize,
    /// Tenant pods whose phase or address is not their copy's.
    status_differs: usize,
    /// Tenant pods Running.
    running: usize,
}

impl Tally {
    fn settled(&self) -> bool {
        self.tenant_pods == burst_size()
            && self.copies == self.tenant_pods
            && self.duplicates + self.orphans + self.lost + self.status_differs == 0
            && self.running == self.tenant_pods
    }
}

fn phase(p: &Pod) -> Option<&str> {
    p.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn address(p: &Pod) -> Option<&str> {
    p.status.as_ref().and_then(|s| s.pod_ip.as_deref())
}

/// Count the burst's tenant pods against their copies on the host.
async fn tally(host: &Client, tenant: &Client, ns: &str) -> Option<Tally> {
    let tenant_pods = Api::<Pod>::namespaced(tenant.clone(), "default")
        .list(&ListParams::default().labels("app=burst"))
        .await
        .ok()?
        .items;
    let selector = format!(
        "{},{}=default",
        naming::synced_selector("dev"),
        naming::LABEL_VIRTUAL_NAMESPACE
    );
    let copies = Api::<Pod>::namespaced(host.clone(), ns)
        .list(&ListParams::default().labels(&selector))
        .await
        .ok()?
        .items;
    let mut by_name: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    for c in &copies {
        if let Some(name) = c.annotations().get(naming::ANNOTATION_VIRTUAL_NAME) {
            by_name.entry(name.clone()).or_default().push(c);
        }
    }
    let by_name: BTreeMap<String, Vec<&Pod>> = by_name
        .into_iter()
        .filter(|(name, _)| name.starts_with("burst-"))
        .collect();
    let tenant_by_name: BTreeMap<String, &Pod> =
        tenant_pods.iter().map(|p| (p.name_any(), p)).collect();
    let mut t = Tally {
        tenant_pods: tenant_pods.len(),
        copies: by_name.values().map(Vec::len).sum(),
        ..Default::default()
    };
    for (name, list) in &by_name {
        t.duplicates += list.len() - 1;
        if !tenant_by_name.contains_key(name) {
            t.orphans += list.len();
        }
    }
    for (name, p) in &tenant_by_name {
        t.running += usize::from(phase(p) == Some("Running"));
        match by_name.get(name).and_then(|l| l.first()) {
            None => t.lost += 1,
            Some(copy) => {
                if phase(copy) != phase(p) || address(copy) != address(p) {
                    t.status_differs += 1;
                }
            }
        }
    }
    Some(t)
}

/// Wait until the burst has settled; the time it took and the last tally (panics with the tally
/// when it never settles).
async fn settle(host: &Client, tenant: &Client, ns: &str, since: Instant) -> (Duration, Tally) {
    let mut last_report = Instant::now();
    let mut last = Tally::default();
    while since.elapsed() < settle_limit() {
        if let Some(t) = tally(host, tenant, ns).await {
            if t.settled() {
                return (since.elapsed(), t);
            }
            last = t;
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            eprintln!("settling after {:?}: {last:?}", since.elapsed());
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!(
        "the burst did not settle in {:?} after the fault: {last:?}\ncopies not Running: {}\n{}\n{}",
        settle_limit(),
        not_running(host, ns).await,
        control_plane_report(host, ns, "dev").await,
        shared().logs_tail(15)
    );
}

/// A few host copies that are not Running: node, phase, conditions.
async fn not_running(host: &Client, ns: &str) -> String {
    let copies = Api::<Pod>::namespaced(host.clone(), ns)
        .list(&ListParams::default().labels(&naming::synced_selector("dev")))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let stuck: Vec<String> = copies
        .iter()
        .filter(|p| phase(p) != Some("Running"))
        .map(|p| {
            let conditions: Vec<String> = p
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .map(|c| {
                    format!(
                        "{}={} {}",
                        c.type_,
                        c.status,
                        c.reason.as_deref().unwrap_or("")
                    )
                })
                .collect();
            format!(
                "{} on {:?}, {:?}, [{}]",
                p.name_any(),
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
                phase(p),
                conditions.join(", ")
            )
        })
        .collect();
    format!(
        "{} in all; {}",
        stuck.len(),
        stuck.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
    )
}

fn burst() -> Deployment {
    let mut c = container("burst");
    c["resources"] = json!({"requests": {"cpu": "1m", "memory": "1Mi"}});
    serde_json::from_value(json!({
        "metadata": {"name": "burst", "namespace": "default"},
        "spec": {
            "replicas": burst_size(),
            "selector": {"matchLabels": {"app": "burst"}},
            "template": {
                "metadata": {"labels": {"app": "burst"}},
                "spec": {"containers": [c], "terminationGracePeriodSeconds": 0}
            }
        }
    }))
    .unwrap()
}

/// The burst's tenant: the seed example, uncapped, with room in its quota for the burst's pods
/// and their copies' token Secrets, on enough simulated nodes (one takes 110 pods).
async fn burst_tenant() -> TenantSetup {
    let n = burst_size();
    // Nodes of its own for each drill, so one that fails and leaves its copies behind does not
    // take the next one's room.
    let nodes = NODES.fetch_add(n / 100 + 1, std::sync::atomic::Ordering::SeqCst) + n / 100 + 1;
    tokio::task::spawn_blocking(move || shared().add_kwok_nodes(nodes))
        .await
        .unwrap()
        .expect("simulated nodes for the burst");
    TenantSetup::seed()
        .profile_spec(json!({"resourceQuota": {"hard": {
            "pods": (n + 20).to_string(),
            "count/secrets": (2 * n).to_string()
        }}}))
        .edit(|tc| tc.spec.resources = Default::default())
}

/// Start the burst and return once a third of its copies exist: when the fault lands.
async fn burst_until_a_third(host: &Client, tenant: &Client, ns: &str) {
    Api::<Deployment>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &burst())
        .await
        .unwrap();
    let started = Instant::now();
    let copies = Api::<Pod>::namespaced(host.clone(), ns);
    let selector = naming::synced_selector("dev");
    loop {
        // The host's count only: the tenant, busy with the burst, answers slower.
        let copies = copies
            .list_metadata(&ListParams::default().labels(&selector))
            .await
            .map_or(0, |l| l.items.len());
        if copies >= burst_size() / 3 {
            eprintln!("{copies} copies after {:?}: the fault", started.elapsed());
            return;
        }
        assert!(
            started.elapsed() < settle_limit(),
            "the burst never reached a third of its copies"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// After the fault at `fault`: the burst settles exactly, and the TenantCluster says `Synced`
/// again within a minute (status must not drift). Prints the drill's line.
async fn settles_exactly(what: &str, host: &Client, tenant: &Client, ns: &str, fault: Instant) {
    let (took, t) = settle(host, tenant, ns, fault).await;
    let tcs = Api::<TenantCluster>::namespaced(host.clone(), ns);
    let synced = tenantplane_testenv::eventually(Duration::from_secs(60), || async {
        let s = tcs.get("dev").await.ok()?.status?;
        conditions::is_true(&s.conditions, SYNCED).then_some(())
    })
    .await;
    assert!(
        synced.is_some(),
        "{what}: the tenant is not Synced 60 s after the burst settled: {:?}\n{}",
        tcs.get("dev")
            .await
            .ok()
            .and_then(|tc| tc.status)
            .map(|s| s.conditions),
        shared().logs_tail(15)
    );
    let drill_line = format!(
        "fault drill | {what} | {} pods | settled {:.1} s after the fault | duplicates {} | orphans {} | lost {} | status differs {} | Synced again after {:.1} s",
        burst_size(),
        took.as_secs_f64(),
        t.duplicates,
        t.orphans,
        t.lost,
        t.status_differs,
        fault.elapsed().as_secs_f64()
    );
    // The burst goes, and its copies with it: the next drill gets the simulated nodes back.
    Api::<Deployment>::namespaced(tenant.clone(), "default")
        .patch(
            "burst",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    let scaled = Instant::now();
    let gone = tenantplane_testenv::eventually(settle_limit(), || async {
        tally(host, tenant, ns)
            .await
            .filter(|t| t.copies == 0 && t.tenant_pods == 0)
    })
    .await;
    assert!(
        gone.is_some(),
        "{what}: the burst scaled to 0 still has copies: {:?}",
        tally(host, tenant, ns).await
    );
    eprintln!(
        "{drill_line} | scaled to 0: copies gone after {:.1} s",
        scaled.elapsed().as_secs_f64()
    );
}

#[tokio::test]
async fn copies_stay_exact_when_the_host_api_server_restarts_mid_burst() {
    let _one = SERIAL.lock().await;
    let world = burst_tenant().await.start("faults-host").await;
    let (ns, host, tenant) = (&world.ns.name, &world.host, &world.tenant);
    burst_until_a_third(host, tenant, ns).await;
    let fault = Instant::now();
    tokio::task::spawn_blocking(|| shared().restart_apiserver())
        .await
        .unwrap()
        .expect("the host API server starts again");
    eprintln!("host API server ready again after {:?}", fault.elapsed());
    // The restarted API server refuses the operator for about a second while its RBAC caches
    // fill, and answers every watch with a 410: both once kept a stale `WatchFailed` for minutes.
    settles_exactly("host API server restarted", host, tenant, ns, fault).await;
}

#[tokio::test]
async fn copies_stay_exact_when_the_operator_is_killed_and_a_standby_takes_over() {
    let _one = SERIAL.lock().await;
    let setup = burst_tenant().await;
    install_crds_and_policies();
    let ns = namespace("faults-operator").await;
    let host = ns.client.clone();
    // The operator as a cluster runs it: two replicas electing a leader, separate processes,
    // so a kill is a kill (no release of the Lease, no syncer finishing its keys).
    let (_runtime, runtime_task) = local_runtime_for(&ns);
    let _runtime_task = AbortOnDrop(runtime_task);
    let args = leader_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = format!("a-{}", ns.name);
    let b = format!("b-{}", ns.name);
    let leader = Replica::start(&ns, &a, &args);
    wait_for_holder(&host, &a).await;
    let _standby = Replica::start(&ns, &b, &args);
    let tenant = setup.ready_in(&ns).await;
    burst_until_a_third(&host, &tenant, &ns.name).await;
    let fault = Instant::now();
    leader.signal("-KILL");
    let takeover = wait_for_holder(&host, &b).await;
    eprintln!(
        "the leader killed; the standby held the Lease {:.1} s after (Lease 6 s)",
        takeover.as_secs_f64()
    );
    settles_exactly(
        "operator killed, standby took over",
        &host,
        &tenant,
        &ns.name,
        fault,
    )
    .await;
}

#[tokio::test]
async fn copies_stay_exact_when_the_tenant_api_server_restarts_mid_burst() {
    let _one = SERIAL.lock().await;
    let world = burst_tenant().await.start("faults-tenant").await;
    let (ns, host, tenant) = (&world.ns.name, &world.host, &world.tenant);
    burst_until_a_third(host, tenant, ns).await;
    // A restart as a person or a rollout does it: the control-plane pod deleted; its StatefulSet
    // makes it again, on the same data.
    let fault = Instant::now();
    let pods = Api::<Pod>::namespaced(host.clone(), ns);
    let pod = tenantplane_controller::names::control_plane_pod("dev");
    let before = pods.get(&pod).await.unwrap();
    pods.delete(&pod, &DeleteParams::default()).await.unwrap();
    control_plane_back(host, ns, &before).await;
    // The local runtime serves the new pod on a port of its own (a cluster keeps the Service's).
    let tenant = tenant_client(host, ns, "dev").await;
    settles_exactly("tenant API server restarted", host, &tenant, ns, fault).await;
}

#[tokio::test]
async fn copies_stay_exact_when_the_tenant_datastore_is_killed_mid_burst() {
    let _one = SERIAL.lock().await;
    let world = burst_tenant().await.start("faults-kine").await;
    let (ns, host, tenant) = (&world.ns.name, &world.host, &world.tenant);
    burst_until_a_third(host, tenant, ns).await;
    // kine killed: the API server stops answering, and the control plane is started again on
    // the same database (in k3s they are one process).
    let fault = Instant::now();
    let pod = tenantplane_controller::names::control_plane_pod("dev");
    let before = Api::<Pod>::namespaced(host.clone(), ns)
        .get(&pod)
        .await
        .unwrap();
    assert!(
        world.operator.runtime.crash_datastore(ns, &pod),
        "no kine runs for {ns}/{pod}"
    );
    control_plane_back(host, ns, &before).await;
    settles_exactly("tenant datastore (kine) killed", host, tenant, ns, fault).await;
}

/// Wait until the tenant's control plane came back from a fault: its pod replaced (another UID)
/// or restarted (a higher restart count) since `before`, and Ready. Until then a tenant that had
/// settled before the fault would look settled.
async fn control_plane_back(host: &Client, ns: &str, before: &Pod) {
    let restarts = |p: &Pod| -> i32 {
        p.status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
            .map(|c| c.restart_count)
            .sum()
    };
    let pods = Api::<Pod>::namespaced(host.clone(), ns);
    let started = Instant::now();
    let back = tenantplane_testenv::eventually(WAIT, || async {
        let now = pods.get(&before.name_any()).await.ok()?;
        let again = now.uid() != before.uid() || restarts(&now) > restarts(before);
        let ready = now
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .any(|c| c.type_ == "Ready" && c.status == "True");
        (again && ready).then_some(())
    })
    .await;
    assert!(
        back.is_some(),
        "the tenant's control plane did not come back:\n{}",
        control_plane_report(host, ns, "dev").await
    );
    eprintln!(
        "the tenant's control plane is Ready again {:.1} s after the fault",
        started.elapsed().as_secs_f64()
    );
}
