//! The syncer under faults, during a burst of pods through one tenant: when things settle, every
//! tenant pod has exactly one host copy, no copy is left without its tenant pod, and every tenant
//! pod's status is its copy's. A binary of its own: it restarts its control plane's API server,
//! which no other test may share.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

mod common;
use common::*;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tenantplane_api::TenantCluster;
use tenantplane_api::conditions::{self, SYNCED};
use tenantplane_syncer::naming;
use tenantplane_testenv::shared;

/// Pods in the burst: more than the syncer's 32 workers per tenant, few enough for CI.
const BURST: i32 = 300;

/// How long the tenant may take to settle after the fault.
const SETTLE: Duration = Duration::from_secs(300);

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
        self.tenant_pods == BURST as usize
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
    while since.elapsed() < SETTLE {
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
        "the burst did not settle in {SETTLE:?} after the fault: {last:?}\ncopies not Running: {}\n{}\n{}",
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
            "replicas": BURST,
            "selector": {"matchLabels": {"app": "burst"}},
            "template": {
                "metadata": {"labels": {"app": "burst"}},
                "spec": {"containers": [c], "terminationGracePeriodSeconds": 0}
            }
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn copies_stay_exact_when_the_host_api_server_restarts_mid_burst() {
    // Room for the burst on the host: a simulated node takes 110 pods.
    tokio::task::spawn_blocking(|| shared().add_kwok_nodes(BURST as usize / 100 + 1))
        .await
        .unwrap()
        .expect("simulated nodes for the burst");
    // Uncapped, with room in the quota for the burst's pods and their copies' token Secrets.
    let world = TenantSetup::seed()
        .profile_spec(json!({"resourceQuota": {"hard": {
            "pods": (BURST + 20).to_string(),
            "count/secrets": (2 * BURST).to_string()
        }}}))
        .edit(|tc| tc.spec.resources = Default::default())
        .start("faults")
        .await;
    let (ns, host, tenant) = (&world.ns.name, &world.host, &world.tenant);
    Api::<Deployment>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &burst())
        .await
        .unwrap();
    // The fault lands mid-burst: once a third of the copies exist.
    let started = Instant::now();
    loop {
        let copies = tally(host, tenant, ns).await.map_or(0, |t| t.copies);
        if copies >= BURST as usize / 3 {
            eprintln!(
                "{copies} copies after {:?}: restarting the host API server",
                started.elapsed()
            );
            break;
        }
        assert!(
            started.elapsed() < SETTLE,
            "the burst never reached a third of its copies"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let fault = Instant::now();
    tokio::task::spawn_blocking(|| shared().restart_apiserver())
        .await
        .unwrap()
        .expect("the host API server starts again");
    eprintln!("host API server ready again after {:?}", fault.elapsed());
    let (took, t) = settle(host, tenant, ns, fault).await;
    eprintln!(
        "host API server restarted during a {BURST}-pod burst: settled {:.1} s after the restart; duplicates {}, orphans {}, lost {}, status differs {}",
        took.as_secs_f64(),
        t.duplicates,
        t.orphans,
        t.lost,
        t.status_differs
    );
    // Status must not drift: the TenantCluster says Synced again soon after (the restarted API
    // server refuses the operator for about a second while its RBAC caches fill, and every
    // watch is answered with a 410; both once kept a stale `WatchFailed` for minutes).
    let tcs = Api::<TenantCluster>::namespaced(host.clone(), ns);
    let synced = tenantplane_testenv::eventually(Duration::from_secs(60), || async {
        let s = tcs.get("dev").await.ok()?.status?;
        conditions::is_true(&s.conditions, SYNCED).then_some(())
    })
    .await;
    assert!(
        synced.is_some(),
        "the tenant is not Synced 60 s after the burst settled: {:?}\n{}",
        tcs.get("dev")
            .await
            .ok()
            .and_then(|tc| tc.status)
            .map(|s| s.conditions),
        shared().logs_tail(15)
    );
    eprintln!(
        "the tenant is Synced again {:.1} s after the restart",
        fault.elapsed().as_secs_f64()
    );
}
