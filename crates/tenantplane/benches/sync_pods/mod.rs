//! The per-pod timeline of bench-sync and the pods it creates and watches: when each pod was
//! created, copied, Running on the host and Running in its tenant, and the waits and progress
//! lines around them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};

/// Pod creations in flight at once, in both runs.
pub(crate) const CONCURRENCY: usize = 32;
/// The label on every benchmark pod, in the tenant and on the host.
pub(crate) const BENCH_LABEL: &str = "bench";
pub(crate) const BENCH_VALUE: &str = "sync";
/// How often a waiting loop prints where it is.
pub(crate) const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// When each step of one pod was seen by this process.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Times {
    /// The create call returned.
    pub(crate) created: Option<Instant>,
    /// The host copy appeared (tenant run only).
    pub(crate) host_created: Option<Instant>,
    /// The host pod was Running (the host copy in the tenant run, the pod itself in the direct run).
    pub(crate) host_running: Option<Instant>,
    /// The tenant pod was Running (tenant run only).
    pub(crate) tenant_running: Option<Instant>,
    /// A label was put on the tenant pod (idle hops only).
    pub(crate) relabelled: Option<Instant>,
    /// The host copy had that label (idle hops only).
    pub(crate) host_relabelled: Option<Instant>,
}

pub(crate) type Timeline = Arc<Mutex<HashMap<String, Times>>>;

pub(crate) fn timeline(names: &[String]) -> Timeline {
    Arc::new(Mutex::new(
        names
            .iter()
            .map(|n| (n.clone(), Times::default()))
            .collect(),
    ))
}

/// Set one field of a pod's times, the first time only.
pub(crate) fn record(
    timeline: &Timeline,
    name: &str,
    field: fn(&mut Times) -> &mut Option<Instant>,
) {
    if let Some(t) = timeline.lock().unwrap().get_mut(name) {
        field(t).get_or_insert_with(Instant::now);
    }
}

pub(crate) fn count(timeline: &Timeline, field: fn(&Times) -> Option<Instant>) -> usize {
    timeline
        .lock()
        .unwrap()
        .values()
        .filter(|t| field(t).is_some())
        .count()
}

/// Up to `max` pod names where `field` is still missing, for a failure message.
pub(crate) fn missing(
    timeline: &Timeline,
    field: fn(&Times) -> Option<Instant>,
    max: usize,
) -> Vec<String> {
    let mut names: Vec<String> = timeline
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, t)| field(t).is_none())
        .map(|(n, _)| n.clone())
        .collect();
    names.sort();
    names.truncate(max);
    names
}

/// `to - from` for every pod that has both, sorted.
pub(crate) fn hops(
    timeline: &Timeline,
    from: fn(&Times) -> Option<Instant>,
    to: fn(&Times) -> Option<Instant>,
) -> Vec<Duration> {
    let mut v: Vec<Duration> = timeline
        .lock()
        .unwrap()
        .values()
        .filter_map(|t| Some(to(t)?.saturating_duration_since(from(t)?)))
        .collect();
    v.sort();
    v
}

/// The latest `field` over all pods.
pub(crate) fn last(timeline: &Timeline, field: fn(&Times) -> Option<Instant>) -> Option<Instant> {
    timeline.lock().unwrap().values().filter_map(field).max()
}

pub(crate) fn secs(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

/// A progress line, named after the benchmark that prints it (`bench-sync`, `bench-sleep`).
pub(crate) fn say(start: Instant, what: &str) {
    let bench = std::env::args()
        .next()
        .and_then(|path| {
            let stem = std::path::Path::new(&path)
                .file_stem()?
                .to_str()?
                .to_string();
            Some(stem.split('-').next()?.to_string())
        })
        .unwrap_or_else(|| "sync".into());
    eprintln!(
        "bench-{bench}: {what} ({:.1}s)",
        start.elapsed().as_secs_f64()
    );
}

/// A bare pod: no service account token (so only the pod is synced), a restricted-compliant
/// security context (the host namespace enforces Pod Security `restricted`), and tiny explicit
/// requests and limits (so neither a LimitRange nor a quota on cpu or memory matters).
pub(crate) fn bench_pod(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {BENCH_LABEL: BENCH_VALUE}},
        "spec": {
            "automountServiceAccountToken": false,
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [{
                "name": "pause",
                "image": "registry.example/pause:3",
                "resources": {
                    "requests": {"cpu": "1m", "memory": "1Mi"},
                    "limits": {"cpu": "10m", "memory": "16Mi"},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                },
            }],
        },
    }))
    .expect("the benchmark pod is a valid Pod")
}

pub(crate) fn is_running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Watch pods and hand every added or changed one to `on_pod`. The returned receiver turns true
/// once the first list is in, so nothing created afterwards is missed.
pub(crate) fn watch_pods(
    what: &'static str,
    api: Api<Pod>,
    config: watcher::Config,
    on_pod: impl Fn(&Pod) + Send + 'static,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::watch::Receiver<bool>,
) {
    let (synced_tx, synced_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        let mut events = watcher(api, config).default_backoff().boxed();
        let mut errors = 0usize;
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => on_pod(&pod),
                Ok(watcher::Event::InitDone) => {
                    let _ = synced_tx.send(true);
                }
                Ok(_) => {}
                Err(e) => {
                    errors += 1;
                    if errors <= 5 || errors.is_power_of_two() {
                        eprintln!("bench-sync: {what} watch error #{errors} (retrying): {e}");
                    }
                }
            }
        }
    });
    (task, synced_rx)
}

pub(crate) async fn until_listed(
    what: &str,
    mut rx: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    tokio::time::timeout(Duration::from_secs(60), rx.wait_for(|listed| *listed))
        .await
        .with_context(|| format!("the {what} watch did not list within 60s"))?
        .with_context(|| format!("the {what} watch stopped"))?;
    Ok(())
}

/// Create the pods, each through its own API (its tenant's, or the host's), `CONCURRENCY` at a
/// time in all, retrying each a few times, and record when each create returned.
pub(crate) async fn create_pods(
    what: &'static str,
    pods: Vec<(Api<Pod>, String)>,
    timeline: Timeline,
) -> anyhow::Result<()> {
    let reported = Arc::new(AtomicUsize::new(0));
    stream::iter(pods)
        .map(|(api, name)| {
            let timeline = timeline.clone();
            let reported = reported.clone();
            async move {
                let pod = bench_pod(&name);
                let mut attempt = 0;
                loop {
                    attempt += 1;
                    match api.create(&PostParams::default(), &pod).await {
                        Ok(_) => break,
                        // An earlier attempt went through after all.
                        Err(kube::Error::Api(e)) if e.code == 409 && attempt > 1 => break,
                        Err(e) if attempt < 5 => {
                            if reported.fetch_add(1, Ordering::Relaxed) < 5 {
                                eprintln!(
                                    "bench-sync: {what}: creating pod {name} failed (attempt {attempt}, retrying): {e}"
                                );
                            }
                            tokio::time::sleep(Duration::from_secs(attempt)).await;
                        }
                        Err(e) => {
                            return Err(anyhow::Error::new(e)
                                .context(format!("{what}: creating pod {name}")));
                        }
                    }
                }
                record(&timeline, &name, |t| &mut t.created);
                Ok(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<anyhow::Result<()>>>()
        .await
        .into_iter()
        .collect()
}

/// One run's name, size and time limit, and when the benchmark started (for progress lines).
#[derive(Clone, Copy)]
pub(crate) struct Run {
    pub(crate) start: Instant,
    pub(crate) what: &'static str,
    pub(crate) n: usize,
    pub(crate) timeout: Duration,
}

/// Wait until `done` says every pod is through, printing `progress` every few seconds; on
/// time-out, fail with `progress` and `diagnose`.
pub(crate) async fn wait_for_pods(
    run: &Run,
    creating: &mut tokio::task::JoinHandle<anyhow::Result<()>>,
    done: impl Fn() -> usize,
    progress: impl Fn() -> String,
    diagnose: impl AsyncFn() -> String,
) -> anyhow::Result<()> {
    let Run {
        start,
        what,
        n,
        timeout,
    } = *run;
    let deadline = Instant::now() + timeout;
    let mut last_report = Instant::now();
    let mut created = false;
    while done() < n {
        if !created && creating.is_finished() {
            created = true;
            (&mut *creating).await??;
            say(start, &format!("{what}: all {n} create calls returned"));
        }
        if last_report.elapsed() >= PROGRESS_EVERY {
            say(start, &format!("{what}: {}", progress()));
            last_report = Instant::now();
        }
        if Instant::now() > deadline {
            creating.abort();
            bail!(
                "{what}: only {}/{n} pods Running after {}s: {}\n{}",
                done(),
                timeout.as_secs(),
                progress(),
                diagnose().await
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if !created {
        (&mut *creating).await??;
    }
    Ok(())
}
