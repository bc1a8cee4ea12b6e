//! The local runtime's probes, as a kubelet runs the pod's own: `/readyz` for readiness, and for
//! liveness the control-plane
//! container's `livenessProbe` (period × failure threshold) decides how long a tenant API server
//! may go without answering `/livez` before its processes are killed and started again, and its
//! `startupProbe` how long a fresh start may take before that counts. (k3s's probes ask its
//! supervisor's `/ping`, which answers while k3s runs; the stand-in has no supervisor, so its API
//! server's `/livez` answers for it.)

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Probe};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tenantplane_controller::names;

use tenantplane_testenv::{Result, kubeconfig};

/// How long each `/livez` may take, as the probe's timeout would.
const ANSWER_WITHIN: Duration = Duration::from_secs(3);

/// The windows of the pod's probes, as a kubelet reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    /// How long a fresh start may go unanswered (the startup probe's window); none without one.
    pub startup: Duration,
    /// How long a started server may go unanswered; `None`: no liveness probe, never killed.
    pub liveness: Option<Duration>,
    /// How often a Ready server is asked again (the readiness probe's period; Kubernetes's
    /// default, 10 s, without one).
    pub readiness_period: Duration,
}

fn window(probe: &Probe) -> Duration {
    let period = probe.period_seconds.unwrap_or(10).max(1) as u64;
    let failures = probe.failure_threshold.unwrap_or(3).max(1) as u64;
    let delay = probe.initial_delay_seconds.unwrap_or(0).max(0) as u64;
    Duration::from_secs(delay + period * failures)
}

/// The windows of the pod's first container (k3s).
pub fn windows(pod: &Pod) -> Windows {
    let container = pod.spec.as_ref().and_then(|s| s.containers.first());
    Windows {
        startup: container
            .and_then(|c| c.startup_probe.as_ref())
            .map(window)
            .unwrap_or_default(),
        liveness: container
            .and_then(|c| c.liveness_probe.as_ref())
            .map(window),
        readiness_period: Duration::from_secs(
            container
                .and_then(|c| c.readiness_probe.as_ref())
                .and_then(|p| p.period_seconds)
                .unwrap_or(10)
                .max(1) as u64,
        ),
    }
}

/// What the probe has seen of one run of the processes.
#[derive(Clone, Copy, Debug)]
pub struct Liveness {
    started: Instant,
    /// Answered `/livez` at least once since the start (the startup probe passed).
    answered: bool,
    /// When the answers stopped, if they have.
    silent_since: Option<Instant>,
}

impl Liveness {
    pub fn started(at: Instant) -> Self {
        Self {
            started: at,
            answered: false,
            silent_since: None,
        }
    }

    /// Record one probe at `now`; `true` when the processes must be killed: unanswered for the
    /// whole liveness window after they had answered, or for the startup window (then the
    /// liveness window) after a start that never answered.
    pub fn observe(&mut self, alive: bool, now: Instant, windows: Windows) -> bool {
        let Some(liveness) = windows.liveness else {
            return false;
        };
        if alive {
            self.answered = true;
            self.silent_since = None;
            return false;
        }
        if !self.answered {
            return now.duration_since(self.started) > windows.startup + liveness;
        }
        let since = *self.silent_since.get_or_insert(now);
        now.duration_since(since) >= liveness
    }
}

/// The kubeconfig the probes ask with, in a tenant's folder: the controller manager's (a
/// kubelet's probes send no credentials; the health paths answer anyone).
pub const CLIENT_KUBECONFIG: &str = "controller-manager.kubeconfig";

/// Does the tenant API server in data folder `dir` answer `path` (`/readyz`, `/livez`) with
/// `ok`?
pub async fn answers(dir: &Path, path: &str) -> bool {
    let Ok(client) = kubeconfig::client(&dir.join(CLIENT_KUBECONFIG)).await else {
        return false;
    };
    let Ok(request) = http::Request::get(path).body(Vec::new()) else {
        return false;
    };
    matches!(
        tokio::time::timeout(ANSWER_WITHIN, client.request_text(request)).await,
        Ok(Ok(text)) if text.trim() == "ok"
    )
}

/// A pod IP for status, not loopback (which Endpoints refuse): dialled only when a real node
/// shares the namespace, which makes it real (the local runtime's `pod_address`); the
/// operator reaches the pod by the address in its annotation.
pub(crate) fn pod_ip(port: u16) -> String {
    format!("10.245.{}.{}", port / 256, port % 256)
}

/// What the probes found, in the pod's status as a kubelet writes it (and the address in its
/// annotation).
pub(crate) async fn set_pod_ready(
    client: &Client,
    ns: &str,
    pod: &str,
    (port, agent_port): (u16, Option<u16>),
    ready: bool,
    restarts: i32,
) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let now = Timestamp::now().to_string();
    let flag = if ready { "True" } else { "False" };
    api.patch(
        pod,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {
            names::ANNOTATION_LOCAL_ENDPOINT: format!("https://127.0.0.1:{port}"),
            names::ANNOTATION_LOCAL_AGENT: agent_port.map(|p| format!("127.0.0.1:{p}")),
        }}})),
    )
    .await?;
    let state = if ready {
        json!({"running": {"startedAt": now}})
    } else {
        json!({"waiting": {"reason": "CrashLoopBackOff", "message": "the tenant API server is not answering; restarting"}})
    };
    let status = json!({"status": {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "podIP": pod_ip(port),
        "podIPs": [{"ip": pod_ip(port)}],
        "startTime": now,
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
            {"type": "Ready", "status": flag, "lastTransitionTime": now},
        ],
        "containerStatuses": [{
            "name": "k3s",
            "ready": ready,
            "started": ready,
            "restartCount": restarts,
            "image": "local-runtime",
            "imageID": "",
            "state": state,
        }],
    }});
    api.patch_status(pod, &PatchParams::default(), &Patch::Merge(status))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(container: serde_json::Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "dev-0"}, "spec": {"containers": [container]}}),
        )
        .unwrap()
    }

    const PROD: Windows = Windows {
        startup: Duration::from_secs(300),
        liveness: Some(Duration::from_secs(60)),
        readiness_period: Duration::from_secs(10),
    };

    #[test]
    fn the_windows_are_the_pods_own() {
        let p = pod(json!({"name": "k3s",
            "startupProbe": {"periodSeconds": 5, "failureThreshold": 60},
            "livenessProbe": {"periodSeconds": 10, "failureThreshold": 6},
            "readinessProbe": {"periodSeconds": 10, "failureThreshold": 3}}));
        assert_eq!(windows(&p), PROD);
        let none = pod(json!({"name": "k3s"}));
        assert_eq!(windows(&none).liveness, None);
        assert_eq!(windows(&none).readiness_period, Duration::from_secs(10));
        let often = pod(json!({"name": "k3s", "readinessProbe": {"periodSeconds": 2}}));
        assert_eq!(windows(&often).readiness_period, Duration::from_secs(2));
    }

    #[test]
    fn a_wedged_server_is_killed_after_the_liveness_window_and_not_before() {
        let t0 = Instant::now();
        let mut l = Liveness::started(t0);
        let s = Duration::from_secs;
        assert!(!l.observe(true, t0 + s(3), PROD));
        assert!(!l.observe(false, t0 + s(10), PROD), "silent since 10 s");
        assert!(!l.observe(false, t0 + s(69), PROD));
        assert!(
            l.observe(false, t0 + s(70), PROD),
            "a minute without /livez"
        );
        // An answer in between starts the count again.
        let mut l = Liveness::started(t0);
        l.observe(true, t0, PROD);
        l.observe(false, t0 + s(10), PROD);
        l.observe(true, t0 + s(50), PROD);
        assert!(!l.observe(false, t0 + s(100), PROD));
    }

    #[test]
    fn a_slow_first_start_has_the_startup_window() {
        let t0 = Instant::now();
        let mut l = Liveness::started(t0);
        let s = Duration::from_secs;
        assert!(!l.observe(false, t0 + s(200), PROD));
        assert!(!l.observe(false, t0 + s(360), PROD));
        assert!(l.observe(false, t0 + s(361), PROD));
        let never = Windows {
            liveness: None,
            ..PROD
        };
        assert!(!Liveness::started(t0).observe(false, t0 + s(10_000), never));
    }
}
