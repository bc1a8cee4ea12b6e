//! Durations the host honours on a tenant's behalf, capped by the profile's `allow.durations`:
//! a grace period of a year would keep a deleted tenant's container running on the host, and a
//! probe timeout of a year would keep the kubelet waiting on it.

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, PodSpec, Probe};
use tenantplane_api::allowances::DurationCaps;

const SETTING: &str = "the IsolationProfile's allow.durations";

fn cut<T: PartialOrd + Copy + std::fmt::Display>(
    value: &mut Option<T>,
    cap: T,
    what: &str,
    field: &str,
    out: &mut Vec<String>,
) {
    if let Some(v) = value.as_mut()
        && *v > cap
    {
        out.push(format!(
            "{what} {v} is cut to {cap} on the host ({SETTING}.{field})"
        ));
        *v = cap;
    }
}

/// Cap the durations of `spec` in place; a sentence per value cut.
pub fn bound_durations(caps: &DurationCaps, spec: &mut PodSpec) -> Vec<String> {
    let grace = caps.termination_grace_period_seconds;
    let mut out = Vec::new();
    cut(
        &mut spec.termination_grace_period_seconds,
        grace,
        "spec.terminationGracePeriodSeconds",
        "terminationGracePeriodSeconds",
        &mut out,
    );
    if let Some(deadline) = caps.active_deadline_seconds {
        if spec.active_deadline_seconds.is_none() {
            // Said once per pod like any cut, so the tenant knows why its pod ends.
            out.push(format!(
                "the pod runs at most {deadline} s on the host ({SETTING}.activeDeadlineSeconds)"
            ));
            spec.active_deadline_seconds = Some(deadline);
        }
        cut(
            &mut spec.active_deadline_seconds,
            deadline,
            "spec.activeDeadlineSeconds",
            "activeDeadlineSeconds",
            &mut out,
        );
    }
    let containers = spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut());
    for c in containers {
        bound_container(caps, c, &mut out);
    }
    out
}

fn bound_container(caps: &DurationCaps, c: &mut Container, out: &mut Vec<String>) {
    let name = c.name.clone();
    let probes = [
        ("livenessProbe", c.liveness_probe.as_mut()),
        ("readinessProbe", c.readiness_probe.as_mut()),
        ("startupProbe", c.startup_probe.as_mut()),
    ];
    for (what, probe) in probes {
        let Some(p) = probe else { continue };
        bound_probe(caps, &format!("container {name:?}: {what}"), p, out);
    }
    let hooks = c.lifecycle.as_mut().map(|l| {
        [
            ("lifecycle.postStart", l.post_start.as_mut()),
            ("lifecycle.preStop", l.pre_stop.as_mut()),
        ]
    });
    for (what, hook) in hooks.into_iter().flatten() {
        let Some(LifecycleHandler {
            sleep: Some(sleep), ..
        }) = hook
        else {
            continue;
        };
        let mut seconds = Some(sleep.seconds);
        cut(
            &mut seconds,
            caps.termination_grace_period_seconds,
            &format!("container {name:?}: {what}.sleep.seconds"),
            "terminationGracePeriodSeconds",
            out,
        );
        sleep.seconds = seconds.unwrap_or(sleep.seconds);
    }
}

fn bound_probe(caps: &DurationCaps, who: &str, p: &mut Probe, out: &mut Vec<String>) {
    cut(
        &mut p.timeout_seconds,
        caps.probe_timeout_seconds,
        &format!("{who}.timeoutSeconds"),
        "probeTimeoutSeconds",
        out,
    );
    cut(
        &mut p.termination_grace_period_seconds,
        caps.termination_grace_period_seconds,
        &format!("{who}.terminationGracePeriodSeconds"),
        "terminationGracePeriodSeconds",
        out,
    );
}

/// The grace period a delete of a host copy gets: the tenant's, at most the cap.
pub fn bound_grace(caps: &DurationCaps, grace: Option<u32>) -> Option<u32> {
    let cap = u32::try_from(caps.termination_grace_period_seconds.max(0)).unwrap_or(u32::MAX);
    grace.map(|g| g.min(cap))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn durations_past_the_caps_are_cut_and_said() {
        let mut spec: PodSpec = serde_json::from_value(json!({
            "terminationGracePeriodSeconds": 31536000,
            "containers": [{"name": "web",
                "livenessProbe": {"timeoutSeconds": 86400, "terminationGracePeriodSeconds": 31536000,
                                  "exec": {"command": ["true"]}},
                "readinessProbe": {"timeoutSeconds": 5, "exec": {"command": ["true"]}},
                "lifecycle": {"preStop": {"sleep": {"seconds": 31536000}}}}]
        }))
        .unwrap();
        let caps = DurationCaps::default();
        let said = bound_durations(&caps, &mut spec);
        assert_eq!(said.len(), 4, "{said:?}");
        assert!(said[0].contains("spec.terminationGracePeriodSeconds 31536000 is cut to 300"));
        assert!(said[0].contains("allow.durations.terminationGracePeriodSeconds"));
        assert_eq!(spec.termination_grace_period_seconds, Some(300));
        let c = &spec.containers[0];
        let live = c.liveness_probe.as_ref().unwrap();
        assert_eq!(live.timeout_seconds, Some(60));
        assert_eq!(live.termination_grace_period_seconds, Some(300));
        assert_eq!(c.readiness_probe.as_ref().unwrap().timeout_seconds, Some(5));
        let sleep = c.lifecycle.as_ref().unwrap().pre_stop.as_ref().unwrap();
        assert_eq!(sleep.sleep.as_ref().unwrap().seconds, 300);
        assert!(
            bound_durations(&caps, &mut spec).is_empty(),
            "a copy within the caps is left alone"
        );
        let deadline = DurationCaps {
            active_deadline_seconds: Some(3600),
            ..Default::default()
        };
        let said = bound_durations(&deadline, &mut spec);
        assert_eq!(spec.active_deadline_seconds, Some(3600));
        assert!(said[0].contains("at most 3600 s"), "{said:?}");
        assert_eq!(bound_grace(&caps, Some(31536000)), Some(300));
        assert_eq!(bound_grace(&caps, Some(1)), Some(1));
        assert_eq!(bound_grace(&caps, None), None);
    }
}
