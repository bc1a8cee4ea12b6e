//! `make bench-sleep N=10`: N tenants (default 10) on the test control plane, each in a host
//! namespace of its own with a Deployment of PODS pods (default 3), one operator for all and the
//! local runtime for their control planes. Measures the host with every tenant awake and idle
//! (the control planes' memory, the machine's available memory, pods on the host, the machine's
//! CPU over 10 s), puts them all to sleep (as `tenantplane sleep` does) and measures again, then
//! wakes them one at a time as `connect` does (a wake request, then the first request to the
//! tenant's API) and prints the time from the request to its answer, p50 and p99. Last, how
//! many idle tenants fit on this machine awake and asleep, from what one costs in each state.
//! A benchmark prints figures; it asserts only that the work was done.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use tenantplane_api::{Phase, TenantCluster};
use tenantplane_controller::telemetry::Role;
use tenantplane_local::{runtime, tenant};
use tenantplane_syncer::naming::LABEL_SYNCED_FROM;
use tenantplane_testenv::{TestNamespace, install_crds_and_policies, namespace, repo_path, shared};

mod common;
use common::{CpuSnapshot, percentile};
#[allow(dead_code)]
mod sync_pods;
use sync_pods::{PROGRESS_EVERY, say};
#[allow(dead_code)]
mod sync_tenants;
use sync_tenants::{TENANT, tenant_service_account, tenants_ready};
#[allow(dead_code)]
mod sync_report;
use sync_report::memory_lines;

/// How long the awake control planes settle before they are measured, and how long CPU is read.
const SETTLE: Duration = Duration::from_secs(20);
const IDLE_CPU: Duration = Duration::from_secs(10);

/// `MemAvailable` of the machine, in MiB.
fn available_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .unwrap_or(0)
        / 1024
}

/// The tenants' pods on the host: their copies and control-plane pods.
async fn host_pods(admin: &Client, namespaces: &[String]) -> anyhow::Result<(usize, usize)> {
    let mut copies = 0;
    let mut planes = 0;
    for ns in namespaces {
        let pods = Api::<Pod>::namespaced(admin.clone(), ns)
            .list(&ListParams::default())
            .await?;
        for p in pods.items {
            if p.labels().contains_key(LABEL_SYNCED_FROM) {
                copies += 1;
            } else {
                planes += 1;
            }
        }
    }
    Ok((copies, planes))
}

/// Wait until every tenant has phase `phase`, with progress lines.
async fn all_in_phase(
    start: Instant,
    admin: &Client,
    namespaces: &[String],
    phase: Phase,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut last = Instant::now();
    loop {
        let mut done = 0;
        for ns in namespaces {
            let tc = Api::<TenantCluster>::namespaced(admin.clone(), ns)
                .get(TENANT)
                .await?;
            if tc.status.and_then(|s| s.phase) == Some(phase) {
                done += 1;
            }
        }
        if done == namespaces.len() {
            return Ok(());
        }
        if last.elapsed() >= PROGRESS_EVERY {
            say(
                start,
                &format!("{done}/{} tenants {phase}", namespaces.len()),
            );
            last = Instant::now();
        }
        if Instant::now() > deadline {
            bail!(
                "{done}/{} tenants {phase} after 5 minutes",
                namespaces.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The machine's idle CPU over [`IDLE_CPU`]: busy share, and the tenants' processes' millicores.
fn idle_cpu_line(
    what: &str,
    tenant_pids: &HashSet<u32>,
    n: usize,
    before: &CpuSnapshot,
) -> (String, f64) {
    let used = CpuSnapshot::take(tenant_pids).since(before);
    let per_tenant = used.tenant_millicores(IDLE_CPU.as_secs_f64(), n);
    (
        format!(
            "  CPU {what}: the machine {:.0}% busy ({:.1} of {:.1} core-seconds); tenant control planes {per_tenant:.0} millicores each",
            used.busy_percent(),
            used.busy,
            used.total,
        ),
        per_tenant,
    )
}

/// Wait until `want` copies of the tenants' pods are on the host (`what` they wait for).
async fn copies_on_the_host(
    admin: &Client,
    namespaces: &[String],
    want: usize,
    what: &str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (copies, _) = host_pods(admin, namespaces).await?;
        if copies >= want {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{copies}/{want} pod copies {what} after 5 minutes");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let pods: i32 = std::env::var("PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    if n == 0 {
        bail!("N must be at least 1");
    }
    let start = Instant::now();
    say(
        start,
        &format!("starting the test control plane for {n} tenants"),
    );
    let nodes = (n * (pods as usize + 2)).div_ceil(100);
    tokio::task::spawn_blocking(move || {
        shared();
        install_crds_and_policies();
        shared().add_kwok_nodes(nodes)
    })
    .await??;
    let hosts: Vec<TestNamespace> =
        futures::future::join_all((0..n).map(|_| namespace("bench-sleep"))).await;
    let names: Vec<String> = hosts.iter().map(|h| h.name.clone()).collect();
    let admin = hosts[0].client.clone();
    let available_empty = available_mib();

    let options = tenant::local_operator_options(None, None, None);
    let readiness = options.telemetry.readiness.clone();
    readiness.set_role(Role::Leader);
    let operator_client = tenantplane_testenv::operator::client();
    let operator = tokio::spawn(tenantplane_controller::run(
        operator_client,
        options,
        futures::future::pending(),
    ));
    let (runtime, runtime_task) = runtime::start(
        admin.clone(),
        shared().binaries().clone(),
        shared().dir().join("runtime"),
        None,
    );
    let mut tc: TenantCluster = serde_yaml::from_str(&std::fs::read_to_string(repo_path(
        "examples/tenantcluster-dev.yaml",
    ))?)?;
    tc.spec.resources = Default::default();
    for ns in &names {
        tc.metadata.namespace = Some(ns.clone());
        Api::<TenantCluster>::namespaced(admin.clone(), ns)
            .create(&PostParams::default(), &tc)
            .await
            .with_context(|| format!("creating the TenantCluster in {ns}"))?;
    }
    say(start, &format!("{n} TenantClusters created"));
    tenants_ready(start, &admin, &names).await?;
    say(start, &format!("{n}/{n} tenants Ready and Synced"));
    // A small workload in each, so sleep has pods to give back.
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "replicas": pods,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{
                "name": "web", "image": "registry.example/web:1",
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
            }]}}
        }
    }))?;
    for ns in &names {
        let tenant = tenant::tenant_client(&admin, ns, TENANT)
            .await
            .map_err(anyhow::Error::msg)?;
        tenant_service_account(start, &tenant, &format!("{ns}/{TENANT}")).await?;
        Api::<Deployment>::namespaced(tenant, "default")
            .create(&PostParams::default(), &deployment)
            .await?;
    }
    let want = n * pods as usize;
    copies_on_the_host(&admin, &names, want, "on the host").await?;
    say(
        start,
        &format!(
            "{want} pods on the host; settling for {}s",
            SETTLE.as_secs()
        ),
    );
    tokio::time::sleep(SETTLE).await;

    // Awake and idle.
    let awake_memory = memory_lines("awake, idle", &runtime.memory());
    let awake_available = available_mib();
    let awake_pods = host_pods(&admin, &names).await?;
    let tenant_pids: HashSet<u32> = runtime.pids().into_iter().collect();
    say(
        start,
        &format!("measuring idle CPU for {}s, awake", IDLE_CPU.as_secs()),
    );
    let before = CpuSnapshot::take(&tenant_pids);
    tokio::time::sleep(IDLE_CPU).await;
    let (awake_cpu, mcores_awake) = idle_cpu_line("awake, idle", &tenant_pids, n, &before);

    // Asleep.
    let slept = Instant::now();
    for ns in &names {
        Api::<TenantCluster>::namespaced(admin.clone(), ns)
            .patch(
                TENANT,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"sleep": {"asleep": true}}})),
            )
            .await?;
    }
    all_in_phase(start, &admin, &names, Phase::Sleeping).await?;
    let to_sleep = slept.elapsed();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !runtime.pids().is_empty() || host_pods(&admin, &names).await? != (0, 0) {
        if Instant::now() > deadline {
            bail!("the sleeping tenants' processes or pods are still there after 2 minutes");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let gone = slept.elapsed();
    say(
        start,
        &format!(
            "{n} tenants Sleeping after {to_sleep:.1?}; their processes and pods gone after {gone:.1?}"
        ),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let asleep_available = available_mib();
    let asleep_pods = host_pods(&admin, &names).await?;
    let before = CpuSnapshot::take(&tenant_pids);
    tokio::time::sleep(IDLE_CPU).await;
    let (asleep_cpu, _) = idle_cpu_line("asleep", &tenant_pids, n, &before);

    // Wake, one at a time: the request, then the tenant's first answer.
    let mut wakes = Vec::with_capacity(n);
    for (i, ns) in names.iter().enumerate() {
        let asked = Instant::now();
        tenantplane_controller::wake::request_wake(&admin, ns, TENANT, true)
            .await
            .map_err(anyhow::Error::msg)?;
        let answered = loop {
            if asked.elapsed() > tenantplane_controller::wake::WAKE_WITHIN {
                bail!("{ns}/{TENANT} did not answer within the wake bound");
            }
            let ready = Api::<TenantCluster>::namespaced(admin.clone(), ns)
                .get(TENANT)
                .await?
                .status
                .and_then(|s| s.phase)
                == Some(Phase::Ready);
            if ready
                && let Ok(client) = tenant::tenant_client(&admin, ns, TENANT).await
                && client.apiserver_version().await.is_ok()
            {
                break asked.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        say(start, &format!("woke {}/{n} in {answered:.1?}", i + 1));
        wakes.push(answered);
    }
    wakes.sort();
    copies_on_the_host(&admin, &names, want, "back on the host").await?;

    // What one idle tenant costs awake, and asleep: how many fit.
    let awake_mib = available_empty.saturating_sub(awake_available) as f64 / n as f64;
    let asleep_mib = available_empty.saturating_sub(asleep_available) as f64 / n as f64;
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
    let fit = |mib: f64, mcores: f64| {
        let by_memory = if mib > 0.5 {
            (available_empty as f64 / mib) as u64
        } else {
            u64::MAX
        };
        // Half the cores for idle tenants: the host's own control plane and the work need the rest.
        let by_cpu = if mcores > 0.5 {
            (cores * 500.0 / mcores) as u64
        } else {
            u64::MAX
        };
        by_memory.min(by_cpu)
    };
    println!();
    println!(
        "bench-sleep: {n} tenants, {pods} pods each, one operator, {cores:.0} cores, {available_empty} MiB available before the tenants"
    );
    for line in awake_memory {
        println!("{line}");
    }
    println!(
        "  awake, idle: {} pods on the host ({} copies, {} control planes); {awake_available} MiB available ({awake_mib:.0} MiB per tenant)",
        awake_pods.0 + awake_pods.1,
        awake_pods.0,
        awake_pods.1
    );
    println!("{awake_cpu}");
    println!(
        "  asleep: {} pods on the host; {asleep_available} MiB available ({asleep_mib:.0} MiB per tenant); Sleeping after {to_sleep:.1?}, processes and pods gone after {gone:.1?}",
        asleep_pods.0 + asleep_pods.1
    );
    println!("{asleep_cpu}");
    println!(
        "  time to wake (wake request to the tenant's first answer, one at a time): p50 {:.1?}, p99 {:.1?}, max {:.1?}",
        percentile(&wakes, 0.5),
        percentile(&wakes, 0.99),
        wakes.last().copied().unwrap_or_default()
    );
    let awake_fit = fit(awake_mib, mcores_awake);
    let asleep_fit = fit(asleep_mib, 0.0);
    let shown = |v: u64| {
        if v == u64::MAX {
            "no limit seen".to_string()
        } else {
            v.to_string()
        }
    };
    println!(
        "  idle tenants that fit on this machine (memory, and half the cores for idle control planes): awake {}, asleep {} (from {awake_mib:.0} MiB and {mcores_awake:.0} millicores per awake tenant, {asleep_mib:.0} MiB per sleeping one)",
        shown(awake_fit),
        shown(asleep_fit)
    );
    operator.abort();
    runtime_task.abort();
    drop(hosts);
    Ok(())
}
