//! The idle hops of bench-sync: in a tenant that does nothing else, one pod at a time, the time
//! from its create to its host copy, from the copy Running to the tenant pod Running, and from a
//! label change to the label on the copy.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tenantplane_syncer::naming::{ANNOTATION_VIRTUAL_NAME, LABEL_SYNCED_FROM, host_label_key};

use crate::common::percentile;
use crate::sync_pods::{
    Timeline, Times, bench_pod, hops, is_running, record, secs, timeline, until_listed, watch_pods,
};
use crate::sync_tenants::{TENANT, TENANT_NAMESPACE};

/// The label the idle pods carry (not the bulk runs' `bench=sync`, so their watches ignore them).
const IDLE_LABEL: (&str, &str) = ("bench", "idle");
/// The label the third hop sets.
const HOP_LABEL: &str = "hop";
/// How long one step of one round may take before the benchmark gives up.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// The three idle hops, each sorted, over `rounds` pods made one after another in the tenant
/// `tenant` whose host namespace is `host_ns`.
pub(crate) async fn idle_hops(
    start: Instant,
    admin: &Client,
    host_ns: &str,
    tenant: &Client,
    rounds: usize,
) -> anyhow::Result<[Vec<Duration>; 3]> {
    let names: Vec<String> = (0..rounds).map(|i| format!("idle-{i:03}")).collect();
    let times = timeline(&names);
    let hop_key = host_label_key(TENANT, HOP_LABEL);
    let (host_watch, host_listed) = watch_pods(
        "host (idle hops)",
        Api::<Pod>::namespaced(admin.clone(), host_ns),
        watcher::Config::default().labels(&format!("{LABEL_SYNCED_FROM}={TENANT}")),
        {
            let times = times.clone();
            move |pod| {
                let Some(name) = pod.annotations().get(ANNOTATION_VIRTUAL_NAME) else {
                    return;
                };
                record(&times, name, |t| &mut t.host_created);
                if is_running(pod) {
                    record(&times, name, |t| &mut t.host_running);
                }
                if pod.labels().contains_key(&hop_key) {
                    record(&times, name, |t| &mut t.host_relabelled);
                }
            }
        },
    );
    let pods = Api::<Pod>::namespaced(tenant.clone(), TENANT_NAMESPACE);
    let (tenant_watch, tenant_listed) = watch_pods(
        "tenant (idle hops)",
        pods.clone(),
        watcher::Config::default().labels(&format!("{}={}", IDLE_LABEL.0, IDLE_LABEL.1)),
        {
            let times = times.clone();
            move |pod| {
                if is_running(pod) {
                    record(&times, &pod.name_any(), |t| &mut t.tenant_running);
                }
            }
        },
    );
    until_listed("host", host_listed).await?;
    until_listed("tenant", tenant_listed).await?;

    let result = async {
        for (i, name) in names.iter().enumerate() {
            let mut pod = bench_pod(name);
            pod.labels_mut()
                .insert(IDLE_LABEL.0.into(), IDLE_LABEL.1.into());
            pods.create(&PostParams::default(), &pod)
                .await
                .with_context(|| format!("idle hops: creating pod {name}"))?;
            record(&times, name, |t| &mut t.created);
            until(&times, name, "Running in the tenant", |t| t.tenant_running).await?;
            let label = serde_json::json!({"metadata": {"labels": {HOP_LABEL: "changed"}}});
            pods.patch(name, &PatchParams::default(), &Patch::Merge(&label))
                .await
                .with_context(|| format!("idle hops: labelling pod {name}"))?;
            record(&times, name, |t| &mut t.relabelled);
            until(&times, name, "labelled on the host", |t| t.host_relabelled).await?;
            // Gone before the next round, so each round's syncer has nothing else to do.
            pods.delete(name, &DeleteParams::default().grace_period(0))
                .await
                .with_context(|| format!("idle hops: deleting pod {name}"))?;
            let deadline = Instant::now() + STEP_TIMEOUT;
            while pods.get_opt(name).await?.is_some() {
                if Instant::now() > deadline {
                    bail!(
                        "idle hops: pod {name} was not gone from the tenant after {STEP_TIMEOUT:?}"
                    );
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if (i + 1) % 10 == 0 {
                eprintln!(
                    "bench-sync: idle hops: {}/{rounds} pods timed ({:.1}s)",
                    i + 1,
                    start.elapsed().as_secs_f64()
                );
            }
        }
        Ok(())
    }
    .await;
    host_watch.abort();
    tenant_watch.abort();
    result?;
    Ok([
        hops(&times, |t| t.created, |t| t.host_created),
        hops(&times, |t| t.host_running, |t| t.tenant_running),
        hops(&times, |t| t.relabelled, |t| t.host_relabelled),
    ])
}

/// Wait until `field` of pod `name` is recorded.
async fn until(
    times: &Timeline,
    name: &str,
    what: &str,
    field: fn(&Times) -> Option<Instant>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        if times.lock().unwrap().get(name).and_then(field).is_some() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("idle hops: pod {name} was not {what} after {STEP_TIMEOUT:?}");
        }
        // The watches record when each step happened; this only notices that it did.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The `idle hop` lines: p50 and p99 of each hop.
pub(crate) fn idle_hop_lines(hops: &[Vec<Duration>; 3]) -> Vec<String> {
    let what = [
        "create -> host copy",
        "host Running -> tenant Running",
        "label change -> on the copy",
    ];
    what.iter()
        .zip(hops)
        .map(|(what, v)| {
            format!(
                "idle hop {what} ({} pods, one at a time): p50 {}  p99 {}  max {}",
                v.len(),
                ms(percentile(v, 0.5)),
                ms(percentile(v, 0.99)),
                secs(v.last().copied().unwrap_or_default())
            )
        })
        .collect()
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}
