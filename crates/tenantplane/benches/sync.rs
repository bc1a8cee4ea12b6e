//! `make bench-sync N=1000 TENANTS=1`: TENANTS tenants (default 1) on the test control plane, each
//! in a host namespace of its own, with their real API servers from the local runtime and one
//! operator (all namespaces) whose syncers copy their pods to the host, where kwok makes them
//! Running. First times IDLE pods (default 50) one at a time in the first tenant (the `idle hop`
//! lines: create → host copy, host Running → tenant Running, label change → on the copy).
//! Then creates N bare pods spread round-robin over the tenants and times each one through
//! its syncer (tenant create → host copy → host Running → tenant Running), then creates the same N
//! pods directly on the host for comparison. Prints both wall times and their ratio, p50/p99 of
//! the syncers' two hops, the operator's host API requests, the host API server's open WATCH
//! requests on the synced kinds before the tenants, with them, and with their pods (and so per
//! tenant), where the syncers' time went by stage (`tenantplane_sync_stage_seconds`), the tenant
//! control planes' memory (idle, and at the end of the tenant run), the process's peak memory
//! and CPU, and every process's CPU (from `/proc`) over 10 s of idleness and in each run.
//! A benchmark prints figures; it asserts only that the work was done.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tenantplane_api::isolation_profile::QuantityString;
use tenantplane_api::{IsolationProfile, TenantCluster};
use tenantplane_controller::telemetry::Role;
use tenantplane_local::{runtime, tenant};
use tenantplane_testenv::kubeconfig::{RequestCounter, counting_client};
use tenantplane_testenv::metrics::synced_watches;
use tenantplane_testenv::{TestNamespace, install_crds_and_policies, namespace, repo_path, shared};

use tenantplane_syncer::naming::{
    ANNOTATION_VIRTUAL_NAME, ANNOTATION_VIRTUAL_NAMESPACE, LABEL_SYNCED_FROM,
};

mod common;
use common::{CpuSnapshot, cpu_time, memory_kib, percentile};
mod sync_pods;
use sync_pods::*;
mod sync_tenants;
use sync_tenants::*;
mod sync_watches;
use sync_watches::*;
mod sync_report;
use sync_report::{memory_lines, stage_lines};
mod sync_idle;
use sync_idle::{idle_hop_lines, idle_hops};

/// Server-side timeout of the tenant watch: the tenant client from [`Connector::client`] gives up
/// on a connection that is silent for 15 s, so the watch is renewed before that.
const TENANT_WATCH_TIMEOUT_SECS: u32 = 10;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    if n == 0 {
        bail!("N must be at least 1");
    }
    let t: usize = std::env::var("TENANTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    if t == 0 {
        bail!("TENANTS must be at least 1");
    }
    // The most pods one tenant gets.
    let per_tenant = n.div_ceil(t);
    // Each run gets 10 minutes, plus half a second per pod.
    let run_timeout = Duration::from_secs(600) + Duration::from_millis(500) * n as u32;
    let start = Instant::now();
    say(
        start,
        &format!("starting the test control plane for {n} pods per run over {t} tenants"),
    );
    // Both runs' pods stay until the end: room for 2N pods plus the tenants' control planes, at
    // most 100 per simulated node (each takes 110).
    let nodes = (2 * n + 10 * t).div_ceil(100);
    tokio::task::spawn_blocking(move || {
        shared();
        install_crds_and_policies();
        shared().add_kwok_nodes(nodes)
    })
    .await??;
    say(start, &format!("{} simulated nodes Ready", nodes + 1));

    // The tenants' host namespaces, one each, and a profile like `restricted` whose pod quota has
    // room for one tenant's pods.
    let hosts: Vec<TestNamespace> =
        futures::future::join_all((0..t).map(|_| namespace("bench-sync"))).await;
    let host_names: Vec<String> = hosts.iter().map(|h| h.name.clone()).collect();
    let admin = hosts[0].client.clone();
    let profile_name = format!("bench-sync-{}", host_names[0]);
    let mut profile: IsolationProfile = serde_yaml::from_str(&std::fs::read_to_string(
        repo_path("deploy/policies/isolationprofile-restricted.yaml"),
    )?)?;
    profile.metadata.name = Some(profile_name.clone());
    profile
        .spec
        .resource_quota
        .hard
        .insert("pods".into(), QuantityString((per_tenant + 10).to_string()));
    let profiles: Api<IsolationProfile> = Api::all(admin.clone());
    profiles
        .create(&PostParams::default(), &profile)
        .await
        .context("creating the benchmark's IsolationProfile")?;

    // One operator for all namespaces (its host requests counted) and one local runtime.
    let rss_before = memory_kib("VmRSS:");
    let cpu_before = cpu_time();
    let counter = Arc::new(RequestCounter::default());
    let operator_client = counting_client(shared().kubeconfig_path(), counter.clone()).await?;
    let options = tenant::local_operator_options(None, None, None);
    // `run` is the controller without the elector; as the leader it reports its caches ready.
    let readiness = options.telemetry.readiness.clone();
    let metrics = options.telemetry.metrics.clone();
    readiness.set_role(Role::Leader);
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
    say(start, "operator started for all namespaces");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !readiness.check().0 {
        if Instant::now() > deadline {
            bail!(
                "the operator's caches are not synced after 60s: {}",
                readiness.check().1
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let watches_before = settled_watches(&admin).await?;
    say(
        start,
        &format!(
            "operator caches synced; {} host WATCH requests open on synced kinds",
            synced_watches(&watches_before)
        ),
    );

    // The tenants: the example, with the benchmark's profile and no cpu or memory caps.
    let mut tc: TenantCluster = serde_yaml::from_str(&std::fs::read_to_string(repo_path(
        "examples/tenantcluster-dev.yaml",
    ))?)?;
    tc.spec.isolation_profile_ref.name = profile_name.clone();
    tc.spec.resources = Default::default();
    for ns in &host_names {
        tc.metadata.namespace = Some(ns.clone());
        Api::<TenantCluster>::namespaced(admin.clone(), ns)
            .create(&PostParams::default(), &tc)
            .await
            .with_context(|| format!("creating the TenantCluster in {ns}"))?;
    }
    say(start, &format!("{t} TenantClusters created"));
    tenants_ready(start, &admin, &host_names).await?;
    say(start, &format!("{t}/{t} tenants Ready and Synced"));
    let watches_tenants = settled_watches(&admin).await?;
    let mut tenants: Vec<Client> = Vec::with_capacity(t);
    for ns in &host_names {
        let tenant = tenant::tenant_client(&admin, ns, TENANT)
            .await
            .map_err(anyhow::Error::msg)?;
        tenant_service_account(start, &tenant, &format!("{ns}/{TENANT}")).await?;
        tenants.push(tenant);
    }

    // The control planes' memory, idle and empty: once Ready, after their start-up settles.
    say(
        start,
        &format!(
            "letting the idle control planes settle for {}s",
            SETTLE.as_secs()
        ),
    );
    tokio::time::sleep(SETTLE).await;
    let memory_idle = memory_lines("idle, empty", &runtime.memory());
    // What idle control planes cost in CPU, settled: what limits how many fit.
    say(
        start,
        &format!("measuring idle CPU for {}s", IDLE_CPU.as_secs()),
    );
    let idle_pids: std::collections::HashSet<u32> = runtime.pids().into_iter().collect();
    let idle_start = CpuSnapshot::take(&idle_pids);
    tokio::time::sleep(IDLE_CPU).await;
    let cpu_idle = CpuSnapshot::take(&idle_pids)
        .since(&idle_start)
        .idle_line(IDLE_CPU.as_secs_f64(), t);

    // Idle hops: one pod at a time in the first tenant, while nothing else happens.
    let rounds: usize = std::env::var("IDLE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let idle = if rounds > 0 {
        say(
            start,
            &format!("idle hops: {rounds} pods, one at a time, in the first tenant"),
        );
        idle_hop_lines(&idle_hops(start, &admin, &host_names[0], &tenants[0], rounds).await?)
    } else {
        Vec::new()
    };

    // Tenant run: watch the host (every namespace) and each tenant, then create, round-robin.
    let names: Vec<String> = (0..n).map(|i| format!("bench-{i:05}")).collect();
    let synced = timeline(&names);
    let (host_watch, host_listed) = watch_pods(
        "host",
        Api::<Pod>::all(admin.clone()),
        watcher::Config::default().labels(&format!("{LABEL_SYNCED_FROM}={TENANT}")),
        {
            let synced = synced.clone();
            move |pod| {
                let annotations = pod.annotations();
                if annotations
                    .get(ANNOTATION_VIRTUAL_NAMESPACE)
                    .map(String::as_str)
                    != Some(TENANT_NAMESPACE)
                {
                    return;
                }
                let Some(name) = annotations.get(ANNOTATION_VIRTUAL_NAME) else {
                    return;
                };
                record(&synced, name, |t| &mut t.host_created);
                if is_running(pod) {
                    record(&synced, name, |t| &mut t.host_running);
                }
            }
        },
    );
    let tenant_pods: Vec<Api<Pod>> = tenants
        .iter()
        .map(|c| Api::namespaced(c.clone(), TENANT_NAMESPACE))
        .collect();
    let mut tenant_watches = Vec::with_capacity(t);
    let mut tenant_listed = Vec::with_capacity(t);
    for api in &tenant_pods {
        let (task, listed) = watch_pods(
            "tenant",
            api.clone(),
            watcher::Config::default()
                .labels(&format!("{BENCH_LABEL}={BENCH_VALUE}"))
                .timeout(TENANT_WATCH_TIMEOUT_SECS),
            {
                let synced = synced.clone();
                move |pod| {
                    if is_running(pod) {
                        record(&synced, &pod.name_any(), |t| &mut t.tenant_running);
                    }
                }
            },
        );
        tenant_watches.push(task);
        tenant_listed.push(listed);
    }
    until_listed("host", host_listed).await?;
    for listed in tenant_listed {
        until_listed("tenant", listed).await?;
    }

    say(
        start,
        &format!(
            "tenant run: creating {n} pods over {t} tenants (round-robin), {CONCURRENCY} at a time"
        ),
    );
    let spread: Vec<(Api<Pod>, String)> = names
        .iter()
        .enumerate()
        .map(|(i, name)| (tenant_pods[i % t].clone(), name.clone()))
        .collect();
    counter.reset();
    let cpu_tenant_start = cpu_time();
    let tenant_pids: std::collections::HashSet<u32> = runtime.pids().into_iter().collect();
    let machine_tenant_start = CpuSnapshot::take(&tenant_pids);
    let tenant_t0 = Instant::now();
    let mut creating = tokio::spawn(create_pods("tenant run", spread, synced.clone()));
    let progress = || {
        format!(
            "{}/{n} created in the tenants, {} copied to the host, {} Running on the host, {} Running in the tenants",
            count(&synced, |t| t.created),
            count(&synced, |t| t.host_created),
            count(&synced, |t| t.host_running),
            count(&synced, |t| t.tenant_running),
        )
    };
    let diagnose = async || {
        let mut text = format!(
            "TenantClusters:\n  {}",
            tenants_status(&admin, &host_names, 10).await
        );
        for (what, field) in [
            (
                "created, no host copy",
                (|t: &Times| t.host_created) as fn(&Times) -> Option<Instant>,
            ),
            ("host copy not Running", |t: &Times| t.host_running),
            ("not Running in the tenant", |t: &Times| t.tenant_running),
        ] {
            let stuck = missing(&synced, field, 5);
            if !stuck.is_empty() {
                text.push_str(&format!("\n  e.g. {what}: {}", stuck.join(", ")));
            }
        }
        text
    };
    wait_for_pods(
        &Run {
            start,
            what: "tenant run",
            n,
            timeout: run_timeout,
        },
        &mut creating,
        || count(&synced, |t| t.tenant_running),
        progress,
        diagnose,
    )
    .await?;
    let tenant_wall = last(&synced, |t| t.tenant_running)
        .unwrap_or(tenant_t0)
        .saturating_duration_since(tenant_t0);
    let cpu_tenant_run = cpu_time().saturating_sub(cpu_tenant_start);
    let machine_tenant_run = CpuSnapshot::take(&tenant_pids).since(&machine_tenant_start);
    let (tenant_reads, tenant_writes) = counter.get();
    let stages = stage_lines(&metrics);
    let memory_loaded = memory_lines(
        &format!("with {per_tenant} pods each, at the end of the tenant run"),
        &runtime.memory(),
    );
    say(
        start,
        &format!(
            "tenant run: all {n} pods Running in their tenants after {}",
            secs(tenant_wall)
        ),
    );
    // This harness's own host watch is closed before the host's watches are read again.
    host_watch.abort();
    let _ = host_watch.await;
    for task in tenant_watches {
        task.abort();
        let _ = task.await;
    }
    let watches_pods = settled_watches(&admin).await?;

    // Direct run: the same pods straight on the host, in a fresh namespace.
    let direct = namespace("bench-direct").await;
    let plain = timeline(&names);
    let direct_pods: Api<Pod> = Api::namespaced(admin.clone(), &direct.name);
    let (direct_watch, direct_listed) = watch_pods(
        "direct",
        direct_pods.clone(),
        watcher::Config::default().labels(&format!("{BENCH_LABEL}={BENCH_VALUE}")),
        {
            let plain = plain.clone();
            move |pod| {
                if is_running(pod) {
                    record(&plain, &pod.name_any(), |t| &mut t.host_running);
                }
            }
        },
    );
    until_listed("direct", direct_listed).await?;
    say(
        start,
        &format!(
            "direct run: creating {n} pods in host namespace {}, {CONCURRENCY} at a time",
            direct.name
        ),
    );
    counter.reset();
    let cpu_direct_start = cpu_time();
    let machine_direct_start = CpuSnapshot::take(&tenant_pids);
    let direct_t0 = Instant::now();
    let mut creating = tokio::spawn(create_pods(
        "direct run",
        names
            .iter()
            .map(|name| (direct_pods.clone(), name.clone()))
            .collect(),
        plain.clone(),
    ));
    wait_for_pods(
        &Run {
            start,
            what: "direct run",
            n,
            timeout: run_timeout,
        },
        &mut creating,
        || count(&plain, |t| t.host_running),
        || {
            format!(
                "{}/{n} created, {} Running",
                count(&plain, |t| t.created),
                count(&plain, |t| t.host_running)
            )
        },
        async || {
            format!(
                "e.g. not Running: {}",
                missing(&plain, |t| t.host_running, 5).join(", ")
            )
        },
    )
    .await?;
    let direct_wall = last(&plain, |t| t.host_running)
        .unwrap_or(direct_t0)
        .saturating_duration_since(direct_t0);
    let cpu_direct_run = cpu_time().saturating_sub(cpu_direct_start);
    let machine_direct_run = CpuSnapshot::take(&tenant_pids).since(&machine_direct_start);
    let (idle_reads, idle_writes) = counter.get();
    direct_watch.abort();
    say(
        start,
        &format!(
            "direct run: all {n} pods Running after {}",
            secs(direct_wall)
        ),
    );

    let to_host = hops(&synced, |t| t.created, |t| t.host_created);
    let back = hops(&synced, |t| t.host_running, |t| t.tenant_running);
    let cpu_total = cpu_time().saturating_sub(cpu_before);
    let peak_rss = memory_kib("VmHWM:");
    let (x, y, z) = (
        synced_watches(&watches_before),
        synced_watches(&watches_tenants),
        synced_watches(&watches_pods),
    );

    println!(
        "\nbench-sync N={n} TENANTS={t} (up to {per_tenant} pods per tenant; one operator, its syncers and the local runtime in-process; pods made Running by kwok; {CONCURRENCY} creates in flight)"
    );
    println!(
        "  tenant run, first create to all {n} pods Running in their tenants: {}",
        secs(tenant_wall)
    );
    println!(
        "  direct run, first create to all {n} pods Running on the host:       {}",
        secs(direct_wall)
    );
    println!(
        "  ratio tenant/direct: {:.2}",
        tenant_wall.as_secs_f64() / direct_wall.as_secs_f64().max(f64::EPSILON)
    );
    println!(
        "  tenant create returned -> host copy seen ({} pods): p50 {}  p99 {}  max {}",
        to_host.len(),
        secs(percentile(&to_host, 0.5)),
        secs(percentile(&to_host, 0.99)),
        secs(to_host.last().copied().unwrap_or_default())
    );
    println!(
        "  host copy Running -> tenant pod Running ({} pods): p50 {}  p99 {}  max {}",
        back.len(),
        secs(percentile(&back, 0.5)),
        secs(percentile(&back, 0.99)),
        secs(back.last().copied().unwrap_or_default())
    );
    for line in &idle {
        println!("{line}");
    }
    println!(
        "  where a pod's time goes in the syncers, to the end of the tenant run (tenantplane_sync_stage_seconds; p50/p99 are the upper bounds of their histogram buckets):"
    );
    for line in &stages {
        println!("    {line}");
    }
    for line in memory_idle.iter().chain(&memory_loaded) {
        println!("{line}");
    }
    println!(
        "  host WATCH requests on synced kinds: before tenants {x}, with {t} tenant(s) {y}, {:.2} per tenant; with all {n} pods Running {z}, {:.2} per tenant",
        (y - x) / t as f64,
        (z - x) / t as f64
    );
    println!(
        "  host WATCH requests by kind (before tenants/with tenants/with pods): {}",
        watches_by_kind(&[&watches_before, &watches_tenants, &watches_pods])
    );
    println!(
        "  operator's host API requests during the tenant run: {tenant_reads} reads + {tenant_writes} writes ({:.2} per pod); during the direct run: {idle_reads} reads + {idle_writes} writes",
        (tenant_reads + tenant_writes) as f64 / n as f64
    );
    println!(
        "  CPU time of the process (operator + syncers + local runtime + this harness's clients and watches; not the control planes' own processes): tenant run {}, direct run {}, since the operator started {}",
        secs(cpu_tenant_run),
        secs(cpu_direct_run),
        secs(cpu_total)
    );
    // Runs end at their last pod's Running; the snapshots after the waits' last poll.
    println!("  {cpu_idle}");
    println!("  {}", machine_tenant_run.line("tenant run", n));
    println!("  {}", machine_direct_run.line("direct run", n));
    println!(
        "  memory: peak RSS {} MiB for the process (operator + syncers + this harness), {} MiB before the operator started",
        peak_rss / 1024,
        rss_before / 1024
    );

    // Clean up: delete the tenants and wait (briefly) for them to go.
    say(start, &format!("deleting the {t} TenantClusters"));
    for ns in &host_names {
        Api::<TenantCluster>::namespaced(admin.clone(), ns)
            .delete(TENANT, &DeleteParams::foreground())
            .await
            .with_context(|| format!("deleting the TenantCluster in {ns}"))?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last_report = Instant::now();
    let all: Api<TenantCluster> = Api::all(admin.clone());
    loop {
        let left = all.list(&Default::default()).await.map(|list| {
            list.items
                .iter()
                .filter(|tc| tc.namespace().is_some_and(|ns| host_names.contains(&ns)))
                .map(|tc| {
                    format!(
                        "{}/{}: {}",
                        tc.namespace().unwrap_or_default(),
                        tc.name_any(),
                        describe(tc)
                    )
                })
                .collect::<Vec<String>>()
        });
        match left {
            Ok(left) if left.is_empty() => {
                say(start, "the TenantClusters are gone");
                break;
            }
            left if Instant::now() > deadline => {
                let left = match left {
                    Ok(left) => left.join("\n  "),
                    Err(e) => format!("listing the TenantClusters failed: {e}"),
                };
                say(
                    start,
                    &format!("TenantClusters still there after 120s:\n  {left}"),
                );
                break;
            }
            Ok(left) if last_report.elapsed() >= PROGRESS_EVERY => {
                say(
                    start,
                    &format!("waiting for {}/{t} TenantClusters to go", left.len()),
                );
                last_report = Instant::now();
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = profiles
        .delete(&profile_name, &DeleteParams::default())
        .await;
    operator.abort();
    runtime_task.abort();
    // Let the runtime's task drop, which stops the tenants' processes.
    let _ = runtime_task.await;
    let _ = operator.await;
    drop(hosts);
    Ok(())
}

/// How long idle control planes run before their memory is read: their start-up's garbage is
/// collected by then.
const SETTLE: Duration = Duration::from_secs(20);

/// How long idle CPU is measured, after [`SETTLE`].
const IDLE_CPU: Duration = Duration::from_secs(10);
