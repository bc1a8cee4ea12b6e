//! The runtime's probes, as a kubelet's: a tenant control plane is Ready while its /readyz
//! answers, killed when its liveness window passes without an answer, and restarted after a
//! back-off when its processes die.

use kube::Client;
use tenantplane_controller::error_chain;

use super::launch::LaunchSpec;
use super::{HealthView, LocalRuntime, RESTART_BACKOFF};
use crate::probes;
use tenantplane_testenv::Binaries;
use tenantplane_testenv::process::{self, Handle};

impl LocalRuntime {
    /// As a kubelet's probes would: Ready when /readyz answers, not Ready when it does not; dead
    /// processes are restarted after a back-off.
    pub(super) async fn check_health(&self, client: &Client, binaries: &Binaries) {
        let now = std::time::Instant::now();
        // A Ready server is asked at its readiness probe's period, as a kubelet asks it (every
        // second cost an idle API server a fifth of its CPU: a TLS handshake and a datastore read
        // each time); one starting, not Ready or dead is looked at every tick, so tests need not
        // wait a period for it.
        let snapshot: Vec<HealthView> = match self.tenants.lock() {
            Ok(mut t) => t
                .values_mut()
                .filter_map(|t| {
                    let dead = t.processes.is_empty()
                        || t.processes.iter().any(|h| process::exited(h).is_some());
                    let due = t
                        .probed_at
                        .is_none_or(|at| now.duration_since(at) >= t.windows.readiness_period);
                    if t.ready && !dead && !due {
                        return None;
                    }
                    t.probed_at = Some(now);
                    Some(HealthView {
                        uid: t.uid.clone(),
                        namespace: t.namespace.clone(),
                        pod: t.pod.clone(),
                        port: t.port,
                        agent_port: t.agent_port,
                        dir: t.dir.clone(),
                        ready: t.ready,
                        dead,
                        restarts: t.restarts,
                    })
                })
                .collect(),
            Err(_) => return,
        };
        for t in snapshot {
            let ready = !t.dead && probes::answers(&t.dir, "/readyz").await;
            let alive = ready || (!t.dead && probes::answers(&t.dir, "/livez").await);
            if !t.dead && self.failed_liveness(&t.uid, alive) {
                eprintln!(
                    "local runtime: {}/{} failed its liveness probe; restarting it",
                    t.namespace, t.pod
                );
            }
            if ready != t.ready {
                if let Err(e) = probes::set_pod_ready(
                    client,
                    &t.namespace,
                    &t.pod,
                    (t.port, t.agent_port),
                    ready,
                    t.restarts,
                )
                .await
                {
                    eprintln!(
                        "local runtime: updating pod {}/{}: {}",
                        t.namespace,
                        t.pod,
                        error_chain(&e)
                    );
                    continue;
                }
                if let Ok(mut all) = self.tenants.lock()
                    && let Some(entry) = all.get_mut(&t.uid)
                {
                    entry.ready = ready;
                }
            }
            if t.dead {
                self.restart_after_backoff(&t.uid, binaries).await;
            }
        }
    }

    /// Restart dead processes once they have been dead for [`RESTART_BACKOFF`]; the health tick
    /// calls this again until then, so the watch loop never waits.
    async fn restart_after_backoff(&self, uid: &str, binaries: &Binaries) {
        let spec = {
            let Ok(mut tenants) = self.tenants.lock() else {
                return;
            };
            let Some(t) = tenants.get_mut(uid) else {
                return;
            };
            let died_at = *t.died_at.get_or_insert_with(std::time::Instant::now);
            if t.held || died_at.elapsed() < RESTART_BACKOFF {
                return;
            }
            t.died_at = None;
            // In k3s these are one process: when one part dies, the rest goes with it.
            for h in t.processes.drain(..).rev() {
                kill(&h);
            }
            match LaunchSpec::read(&t.dir) {
                Ok(spec) => spec,
                Err(e) => {
                    eprintln!(
                        "local runtime: restarting {}/{}: {}",
                        t.namespace,
                        t.pod,
                        error_chain(&e)
                    );
                    return;
                }
            }
        };
        // Without the lock while kine opens its database; the tenant may be gone after.
        let started = spec.spawn(binaries).await;
        let Ok(mut tenants) = self.tenants.lock() else {
            return;
        };
        match (tenants.get_mut(uid), started) {
            (Some(t), Ok(processes)) => {
                t.processes = processes;
                t.restarts += 1;
                t.liveness = probes::Liveness::started(std::time::Instant::now());
            }
            (None, Ok(processes)) => {
                for h in processes.iter().rev() {
                    process::stop(h);
                }
            }
            (Some(t), Err(e)) => {
                eprintln!(
                    "local runtime: restarting {}/{}: {}",
                    t.namespace,
                    t.pod,
                    error_chain(&e)
                );
            }
            (None, Err(_)) => {}
        }
    }

    /// Record a liveness probe; when the pod's window has passed without an answer, kill the
    /// processes (the next tick finds them dead and restarts them), as a kubelet would.
    fn failed_liveness(&self, uid: &str, alive: bool) -> bool {
        let Ok(mut tenants) = self.tenants.lock() else {
            return false;
        };
        let Some(t) = tenants.get_mut(uid) else {
            return false;
        };
        let windows = t.windows;
        if !t
            .liveness
            .observe(alive, std::time::Instant::now(), windows)
        {
            return false;
        }
        for h in t.processes.drain(..).rev() {
            kill(&h);
        }
        true
    }
}

/// Kill one of our processes at once, as a crash would, and reap it.
fn kill(h: &Handle) {
    // SAFETY: signalling a child process we started (and have not reaped yet).
    unsafe {
        libc::kill(h.pid as libc::pid_t, libc::SIGKILL);
    }
    process::stop(h);
}
