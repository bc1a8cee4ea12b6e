//! `make bench-controller N=100`: N tenants on the test control plane, each in a namespace of its
//! own, their control-plane pods made Ready by kwok (no tenant API server behind them). Prints the
//! time until every tenant has its StatefulSet, isolation objects and kubeconfig Secret, per-tenant
//! p50/p99, API requests per tenant while creating and in steady state, and peak memory.
//! A benchmark prints figures; it asserts only that the work was done.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use tenantplane_api::TenantCluster;
use tenantplane_controller::{BuildOptions, Connector, ControllerOptions, names};
use tenantplane_testenv::kubeconfig::{RequestCounter, counting_client};
use tenantplane_testenv::{ControlPlane, Options, repo_path};

mod common;
use common::{memory_kib, percentile};

/// How long steady-state requests are counted.
const STEADY: Duration = Duration::from_secs(60);

fn say(start: Instant, what: &str) {
    eprintln!(
        "bench-controller: {what} ({:.1}s)",
        start.elapsed().as_secs_f64()
    );
}

async fn count<K>(api: Api<K>, lp: &ListParams) -> anyhow::Result<usize>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api.list_metadata(lp).await?.items.len())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let start = Instant::now();
    say(
        start,
        &format!("starting the test control plane for {n} tenants"),
    );
    let plane = tokio::task::spawn_blocking(|| {
        ControlPlane::start(Options {
            dir: None,
            progress: true,
            ..Default::default()
        })
    })
    .await??;
    let nodes = n.div_ceil(100);
    plane.add_kwok_nodes(nodes)?;
    say(start, &format!("{} simulated nodes Ready", nodes + 1));
    plane.install_crds_and_policies()?;
    let admin = plane.client().await?;
    let namespaces: Vec<String> = (0..n).map(|i| format!("bench-{i}")).collect();
    stream::iter(namespaces.iter().cloned())
        .for_each_concurrent(32, |ns| {
            let api: Api<Namespace> = Api::all(admin.clone());
            async move {
                let object =
                    serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
                let _ = api.create(&PostParams::default(), &object).await;
            }
        })
        .await;
    say(start, &format!("{n} namespaces created"));

    let rss_before = memory_kib("VmRSS:");
    let counter = Arc::new(RequestCounter::default());
    let client: Client = counting_client(plane.kubeconfig_path(), counter.clone()).await?;
    let options = ControllerOptions {
        build: BuildOptions {
            ..Default::default()
        },
        connector: Connector::InCluster,
        namespace: None,
        health_interval: None,
        ..Default::default()
    };
    let operator = tokio::spawn(tenantplane_controller::run(
        client,
        options,
        futures::future::pending(),
    ));

    let example: TenantCluster = serde_yaml::from_str(&std::fs::read_to_string(repo_path(
        "examples/tenantcluster-dev.yaml",
    ))?)?;
    let t0 = Instant::now();
    let created: HashMap<String, Instant> = stream::iter(namespaces.iter().cloned())
        .map(|ns| {
            let mut tc = example.clone();
            tc.metadata.namespace = Some(ns.clone());
            // Control planes without CPU and memory caps: the simulated nodes hold the pods, and
            // the quota then only counts objects.
            tc.spec.resources = Default::default();
            let api: Api<TenantCluster> = Api::namespaced(admin.clone(), &ns);
            async move {
                api.create(&PostParams::default(), &tc)
                    .await
                    .with_context(|| format!("creating tenant in {ns}"))?;
                Ok::<_, anyhow::Error>((ns, Instant::now()))
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    say(
        start,
        &format!(
            "{n} TenantClusters created in {:.1}s",
            t0.elapsed().as_secs_f64()
        ),
    );

    // A tenant is done when its kubeconfig Secret exists: the reconcile writes it last, after the
    // isolation objects, the PKI, the Service and the StatefulSet.
    let secrets: Api<Secret> = Api::all(admin.clone());
    let owned = ListParams::default().labels(&format!(
        "{}={}",
        names::LABEL_MANAGED_BY,
        names::MANAGED_BY
    ));
    let mut done: HashMap<String, Instant> = HashMap::new();
    let mut last_report = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(60 * 30);
    while done.len() < n {
        for s in secrets.list_metadata(&owned).await?.items {
            if s.name_any() == names::kubeconfig_secret("dev") {
                done.entry(s.namespace().unwrap_or_default())
                    .or_insert_with(Instant::now);
            }
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            say(
                start,
                &format!("{}/{n} tenants have their kubeconfig Secret", done.len()),
            );
            last_report = Instant::now();
        }
        if Instant::now() > deadline {
            bail!(
                "only {}/{n} tenants completed within 30 minutes",
                done.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let all_done = t0.elapsed();
    let (creation_reads, creation_writes) = counter.get();
    say(start, &format!("all {n} tenants complete"));

    let lp = ListParams::default();
    let statefulsets = count(Api::<StatefulSet>::all(admin.clone()), &lp).await?;
    let policies = count(Api::<NetworkPolicy>::all(admin.clone()), &owned).await?;
    let quotas = count(Api::<ResourceQuota>::all(admin.clone()), &owned).await?;
    let limits = count(Api::<LimitRange>::all(admin.clone()), &owned).await?;
    if statefulsets < n || policies < 2 * n || quotas < n || limits < n {
        bail!(
            "objects missing: {statefulsets} StatefulSets, {policies} NetworkPolicies, {quotas} ResourceQuotas, {limits} LimitRanges for {n} tenants"
        );
    }

    let mut latencies: Vec<Duration> = done
        .iter()
        .filter_map(|(ns, at)| Some(at.duration_since(*created.get(ns)?)))
        .collect();
    latencies.sort();

    counter.reset();
    say(
        start,
        &format!("counting steady-state requests for {}s", STEADY.as_secs()),
    );
    let steady_start = Instant::now();
    while steady_start.elapsed() < STEADY {
        tokio::time::sleep(Duration::from_secs(15)).await;
        say(
            start,
            &format!(
                "steady state: {:.0}s of {}s",
                steady_start.elapsed().as_secs_f64(),
                STEADY.as_secs()
            ),
        );
    }
    let (steady_reads, steady_writes) = counter.get();
    operator.abort();
    let per_minute = 60.0 / STEADY.as_secs_f64();

    println!(
        "\nbench-controller N={n} (operator in-process; tenants' pods made Ready by kwok, no tenant API server)"
    );
    println!(
        "  all tenants complete (StatefulSet, isolation objects, kubeconfig Secret): {:.1}s",
        all_done.as_secs_f64()
    );
    println!(
        "  throughput: {:.1} tenants/s",
        n as f64 / all_done.as_secs_f64()
    );
    println!(
        "  per tenant, create to kubeconfig Secret seen (250 ms polling): p50 {:.2}s  p99 {:.2}s  max {:.2}s",
        percentile(&latencies, 0.5).as_secs_f64(),
        percentile(&latencies, 0.99).as_secs_f64(),
        latencies.last().copied().unwrap_or_default().as_secs_f64()
    );
    println!(
        "  API requests per tenant while creating: {:.1} reads + {:.1} writes",
        creation_reads as f64 / n as f64,
        creation_writes as f64 / n as f64
    );
    println!(
        "  API requests per tenant per minute in steady state (Degraded: TenantUnreachable, rechecked every 5 s): {:.1} reads + {:.1} writes",
        steady_reads as f64 * per_minute / n as f64,
        steady_writes as f64 * per_minute / n as f64
    );
    println!(
        "  memory: peak RSS {} MiB for the process (operator + this harness), {} MiB before the operator started",
        memory_kib("VmHWM:") / 1024,
        rss_before / 1024
    );
    Ok(())
}
