//! Pieces of a pod spec, in the spirit of a pod builder: the security contexts Pod Security
//! `restricted` asks for, resources from a cap and a need, and a probe that runs a command.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ExecAction, HTTPGetAction, PodSecurityContext, Probe, ResourceRequirements,
    SeccompProfile, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tenantplane_api::quantity::ParsedQuantity;

fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".into(),
        localhost_profile: None,
    }
}

/// A container's security context under Pod Security `restricted`: running as `user` (never
/// root), no privilege escalation, no capabilities, RuntimeDefault seccomp.
pub fn restricted_container(user: i64) -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(user),
        run_as_group: Some(user),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..Default::default()
    }
}

/// A pod's security context under Pod Security `restricted`, its volumes owned by `user`'s group.
pub fn restricted_pod(user: i64) -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(user),
        run_as_group: Some(user),
        fs_group: Some(user),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..Default::default()
    }
}

/// One resource of a container: the tenant's cap on it, if any, and what the container needs.
pub struct CapAndNeed<'a> {
    /// The resource's name (`cpu`, `memory`).
    pub resource: &'a str,
    /// The tenant's cap on it, if any.
    pub cap: Option<&'a ParsedQuantity>,
    /// What the container needs.
    pub need: ParsedQuantity,
}

/// Requirements that limit a container to its caps and request its need, never more than the
/// cap (a cap or need that cannot be read requests the cap: admission checks caps). A resource
/// without a cap is neither limited nor requested; with no cap at all the requirements are empty.
pub fn capped_resources<'a>(
    resources: impl IntoIterator<Item = CapAndNeed<'a>>,
) -> ResourceRequirements {
    let mut limits = BTreeMap::new();
    let mut requests = BTreeMap::new();
    for CapAndNeed {
        resource,
        cap,
        need,
    } in resources
    {
        let Some(cap) = cap else {
            // Uncapped: requested all the same, so the container is never BestEffort.
            requests.insert(resource.to_string(), Quantity(need.to_string()));
            continue;
        };
        let request = match (cap.value(), need.value()) {
            (Some(c), Some(n)) if c.exceeds(n) => &need,
            _ => cap,
        };
        limits.insert(resource.to_string(), Quantity(cap.to_string()));
        requests.insert(resource.to_string(), Quantity(request.to_string()));
    }
    ResourceRequirements {
        limits: (!limits.is_empty()).then_some(limits),
        requests: (!requests.is_empty()).then_some(requests),
        claims: None,
    }
}

/// How often a probe runs, how long it waits, and after how many failures it gives up.
#[derive(Clone, Copy, Debug)]
pub struct ProbeTiming {
    /// Seconds between runs.
    pub period_seconds: i32,
    /// Seconds one run may take.
    pub timeout_seconds: i32,
    /// Failures in a row before the probe fails.
    pub failure_threshold: i32,
}

/// A probe that runs `command` in the container.
pub fn exec_probe(command: Vec<String>, timing: ProbeTiming) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(command),
        }),
        period_seconds: Some(timing.period_seconds),
        timeout_seconds: Some(timing.timeout_seconds),
        failure_threshold: Some(timing.failure_threshold),
        ..Default::default()
    }
}

/// A probe that asks `path` over HTTPS on `port`, with no credentials (the kubelet does not
/// check the certificate).
pub fn https_probe(path: &str, port: i32, timing: ProbeTiming) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(port),
            scheme: Some("HTTPS".into()),
            ..Default::default()
        }),
        period_seconds: Some(timing.period_seconds),
        timeout_seconds: Some(timing.timeout_seconds),
        failure_threshold: Some(timing.failure_threshold),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(cap: Option<&str>, need: &str) -> ResourceRequirements {
        capped_resources([CapAndNeed {
            resource: "cpu",
            cap: cap.map(ParsedQuantity::from).as_ref(),
            need: need.into(),
        }])
    }

    #[test]
    fn a_container_requests_its_need_never_above_its_cap() {
        let r = cpu(Some("2"), "250m");
        assert_eq!(r.limits.unwrap()["cpu"].0, "2");
        assert_eq!(r.requests.unwrap()["cpu"].0, "250m");
        let r = cpu(Some("100m"), "250m");
        assert_eq!(r.requests.unwrap()["cpu"].0, "100m", "never above the cap");
        let r = cpu(Some("250m"), "0.25");
        assert_eq!(r.requests.unwrap()["cpu"].0, "250m", "equal: the cap");
        let r = cpu(Some("lots"), "250m");
        assert_eq!(r.requests.unwrap()["cpu"].0, "lots");
    }

    #[test]
    fn without_a_cap_the_need_is_requested_and_nothing_limited() {
        let r = cpu(None, "250m");
        assert_eq!(r.requests.unwrap()["cpu"].0, "250m");
        assert_eq!(r.limits, None);
    }

    #[test]
    fn restricted_contexts_run_unprivileged() {
        let c = restricted_container(10001);
        assert_eq!(c.run_as_non_root, Some(true));
        assert_eq!(c.allow_privilege_escalation, Some(false));
        assert_eq!(c.capabilities.unwrap().drop.unwrap(), ["ALL"]);
        let p = restricted_pod(10001);
        assert_eq!(p.fs_group, Some(10001));
        assert_eq!(p.seccomp_profile.unwrap().type_, "RuntimeDefault");
    }
}
