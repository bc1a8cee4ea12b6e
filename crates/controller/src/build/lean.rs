//! A tenant control plane fitted to a small cluster, in one place for both distributions: the
//! Go runtime's memory settings every component gets from its container's memory limit. k3s runs
//! its components in one process, which gets the pod's limit; the `kubernetes` distribution's
//! containers each get their own share.
//!
//! Measured on an idle, empty tenant (kine, kube-apiserver and kube-controller-manager v1.36.3
//! from the test control plane; resident memory not backed by a file, which is each tenant's own:
//! the binaries' pages are shared by every tenant on a node):
//!
//! | setting | kube-apiserver | taken? |
//! |---|---|---|
//! | Go's defaults | 186 MiB | |
//! | `GOGC=50` | 148–155 MiB | yes: see [`GOGC`] |
//! | `GOMEMLIMIT=20MiB` (the floor: the live heap, 75 MB, 30 of it OpenAPI) | 99 MiB | no: a limit below the live heap leaves the collector running |
//! | `--watch-cache=false` | 171 MiB | no: every list and watch would go to sqlite |
//! | `--default-watch-cache-size=0` | 186 MiB | no: saves nothing (the caches size themselves) |
//! | `--enable-priority-and-fairness=false` | 187 MiB | no: saves nothing |
//! | `--runtime-config=resource.k8s.io/v1=false` (no DRA) | 144 MiB with `GOGC=50` | no: 4 MiB, and DRA's API is in the conformance suite since 1.35 |
//!
//! kube-controller-manager without the DRA, storage-version and cloud controllers saved 1 MiB
//! (33 → 32), so it keeps k3s's list (`k3s::controllers`). kine's settings stay k3s's:
//! idle it holds 14–18 MiB of its own.

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements};
use tenantplane_api::quantity::ParsedQuantity;

/// `GOGC` of every component: a collection when the heap has grown by half of what was live
/// after the last (Go's default waits until it doubles). Idle, kube-apiserver holds 20% less
/// (186 → 148 MiB); under load the collector runs about twice as often, which costs CPU
/// (`make bench-sync` prints both).
pub const GOGC: &str = "50";

/// `GOMEMLIMIT` as a share of the container's memory limit, in percent: as the limit nears, Go
/// collects harder instead of the container being killed. The rest is room for what Go does not
/// count (thread stacks outside its heap, cgo, the binary's pages in memory).
pub const GOMEMLIMIT_PERCENT: u128 = 85;

/// The variables that set Go's memory use in a container with `resources`: [`GOGC`] always,
/// `GOMEMLIMIT` when its memory is limited.
pub fn go_runtime_env(resources: &ResourceRequirements) -> Vec<EnvVar> {
    let var = |name: &str, value: String| EnvVar {
        name: name.into(),
        value: Some(value),
        value_from: None,
    };
    let mut env = vec![var("GOGC", GOGC.into())];
    if let Some(limit) = resources
        .limits
        .as_ref()
        .and_then(|l| l.get("memory"))
        .and_then(|q| ParsedQuantity::from(q.0.as_str()).value())
    {
        // billionths of a byte → MiB; never 0, which Go would read as "no memory at all".
        let mib = ((limit.billionths() / 1_000_000_000 * GOMEMLIMIT_PERCENT / 100) >> 20).max(1);
        env.push(var("GOMEMLIMIT", format!("{mib}MiB")));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn limited(memory: &str) -> ResourceRequirements {
        ResourceRequirements {
            limits: Some([("memory".to_string(), Quantity(memory.into()))].into()),
            ..Default::default()
        }
    }

    fn value<'a>(env: &'a [EnvVar], name: &str) -> Option<&'a str> {
        env.iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value.as_deref())
    }

    #[test]
    fn the_go_runtime_keeps_under_its_share_of_the_limit() {
        let env = go_runtime_env(&limited("2Gi"));
        assert_eq!(value(&env, "GOGC"), Some("50"));
        assert_eq!(
            value(&env, "GOMEMLIMIT"),
            Some("1740MiB"),
            "85% of 2048 MiB"
        );
        let env = go_runtime_env(&limited("1280Mi"));
        assert_eq!(value(&env, "GOMEMLIMIT"), Some("1088MiB"));
        let env = go_runtime_env(&limited("500M"));
        assert_eq!(value(&env, "GOMEMLIMIT"), Some("405MiB"));
    }

    #[test]
    fn without_a_memory_limit_only_gogc_is_set() {
        let env = go_runtime_env(&ResourceRequirements::default());
        assert_eq!(value(&env, "GOGC"), Some("50"));
        assert_eq!(value(&env, "GOMEMLIMIT"), None);
        // A limit that is not a quantity (admission refuses it) sets no GOMEMLIMIT either.
        assert_eq!(value(&go_runtime_env(&limited("lots")), "GOMEMLIMIT"), None);
        // A tiny limit never becomes 0 (no memory at all, to Go).
        assert_eq!(
            value(&go_runtime_env(&limited("1Ki")), "GOMEMLIMIT"),
            Some("1MiB")
        );
    }
}
