//! How the kubelet tells whether k3s is up: cheap HTTP for startup and liveness, k3s's own kubectl
//! only for readiness.

use k8s_openapi::api::core::v1::Probe;

use super::DATA_DIR;
use crate::build::pod::{self, ProbeTiming};
use crate::names;

/// k3s's own kubectl asking its API server for a health endpoint; k3s turns anonymous access
/// off, so an HTTP probe of `/readyz` without credentials would get 401. It starts a second k3s
/// process, so only readiness uses it.
fn health_probe(path: &str, timing: ProbeTiming) -> Probe {
    let command = [
        "/bin/k3s",
        "kubectl",
        "--kubeconfig",
        &format!("{DATA_DIR}/kubeconfig.yaml"),
        "get",
        "--raw",
        path,
    ];
    pod::exec_probe(command.map(str::to_string).to_vec(), timing)
}

/// The one path k3s serves without credentials on its HTTPS port (its supervisor answers `pong`
/// before and while its API server runs, and k3s stops when its API server or controller
/// manager exits): liveness and startup ask it over HTTP, with no process started for it.
pub const PING_PATH: &str = "/ping";

/// Startup: k3s has 5 minutes to answer `/ping` (a first start generates its state); until then
/// neither liveness nor readiness counts.
const STARTUP_PERIOD_SECONDS: i32 = 5;
const STARTUP_FAILURE_THRESHOLD: i32 = 60;
/// Liveness: a k3s that has not answered `/ping` for a minute is wedged and restarted.
const LIVENESS_PERIOD_SECONDS: i32 = 10;
const LIVENESS_FAILURE_THRESHOLD: i32 = 6;

/// The startup, liveness and readiness probes of k3s. Timeouts hold under a small CPU cap: a
/// readiness check starts k3s's kubectl, which takes seconds at 250m.
pub fn probes() -> (Probe, Probe, Probe) {
    let ping = |timing| pod::https_probe(PING_PATH, names::API_PORT, timing);
    let startup = ping(ProbeTiming {
        period_seconds: STARTUP_PERIOD_SECONDS,
        timeout_seconds: 5,
        failure_threshold: STARTUP_FAILURE_THRESHOLD,
    });
    let liveness = ping(ProbeTiming {
        period_seconds: LIVENESS_PERIOD_SECONDS,
        timeout_seconds: 5,
        failure_threshold: LIVENESS_FAILURE_THRESHOLD,
    });
    let readiness = health_probe(
        "/readyz",
        ProbeTiming {
            period_seconds: 10,
            timeout_seconds: 10,
            failure_threshold: 3,
        },
    );
    (startup, liveness, readiness)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    use super::*;

    #[test]
    fn liveness_and_startup_ask_k3s_over_https_and_readiness_asks_its_api_server() {
        let (startup, liveness, readiness) = probes();
        for probe in [&startup, &liveness] {
            let get = probe.http_get.as_ref().expect("no process started for it");
            assert_eq!(get.path.as_deref(), Some(PING_PATH));
            assert_eq!(get.scheme.as_deref(), Some("HTTPS"));
            assert_eq!(get.port, IntOrString::Int(names::API_PORT));
            assert!(probe.exec.is_none());
        }
        let command = readiness
            .exec
            .as_ref()
            .unwrap()
            .command
            .clone()
            .unwrap()
            .join(" ");
        assert!(command.ends_with("get --raw /readyz"));
        // k3s's kubectl with the admin kubeconfig k3s writes (anonymous access is off in k3s).
        assert!(command.starts_with(&format!(
            "/bin/k3s kubectl --kubeconfig {DATA_DIR}/kubeconfig.yaml"
        )));
        assert!(readiness.timeout_seconds.unwrap() >= 10, "holds at 250m");
    }

    #[test]
    fn a_wedged_k3s_is_restarted_and_a_slow_start_is_not() {
        let (startup, liveness, readiness) = probes();
        let window = |p: &Probe| p.period_seconds.unwrap() * p.failure_threshold.unwrap();
        assert_eq!(window(&startup), 300, "five minutes to come up");
        assert_eq!(window(&liveness), 60, "a minute without /ping restarts it");
        assert!(liveness.timeout_seconds.unwrap() < liveness.period_seconds.unwrap() + 1);
        assert_eq!(
            readiness.initial_delay_seconds, None,
            "the startup probe gates it"
        );
    }
}
