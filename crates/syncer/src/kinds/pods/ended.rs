//! Ended pods are bounded as kube-controller-manager's terminated-pod threshold bounds a
//! cluster's: the host's quota counts only pods that run, so without a bound a tenant could keep
//! any number of Succeeded or Failed copies on the host. Past `allow.maxEndedPods`, the copies
//! that were made first go; their tenant pods go with them, as after the host's pod collector.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::converge::delete_if_present;
use crate::error::Result;
use crate::tenant::Tenant;

/// The bound where the profile sets none.
pub const DEFAULT_MAX_ENDED: i32 = 500;

/// Has pod `p` ended (Succeeded or Failed)?
pub fn ended(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The ended copies among `copies` past the first `max` to keep: the oldest made, as the host's
/// pod collector picks them. Copies already going are not counted.
pub fn past_bound(copies: &[Arc<Pod>], max: usize) -> Vec<Arc<Pod>> {
    let mut done: Vec<&Arc<Pod>> = copies
        .iter()
        .filter(|p| ended(p) && p.metadata.deletion_timestamp.is_none())
        .collect();
    let over = done.len().saturating_sub(max);
    done.sort_by(|a, b| {
        let at = |p: &Pod| p.metadata.creation_timestamp.clone().map(|t| t.0);
        at(a)
            .cmp(&at(b))
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    done.into_iter().take(over).cloned().collect()
}

/// Delete this tenant's ended copies past the profile's bound.
pub async fn trim(cx: &Tenant) -> Result<()> {
    let max = cx.tr.allow.max_ended_pods.unwrap_or(DEFAULT_MAX_ENDED);
    // Only copies whose end the tenant has read: a copy that ended while the syncer was away
    // keeps its final status for its tenant pod first (deleted before, the pod would be run
    // again as one whose copy never ran).
    let told = |p: &Pod| {
        cx.tr.copy_of(&p.metadata).is_some_and(|v| {
            cx.tenant_get::<Pod>(&v.namespace, &v.name)
                .is_none_or(|t| ended(&t))
        })
    };
    let copies: Vec<Arc<Pod>> = cx
        .host_slice::<Pod>()
        .into_iter()
        .filter(|p| told(p))
        .collect();
    let api = cx.host_api::<Pod>();
    for p in past_bound(&copies, usize::try_from(max).unwrap_or(0)) {
        delete_if_present(&api, &*p, None).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, phase: &str, minute: u32, going: bool) -> Arc<Pod> {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "creationTimestamp": format!("2026-01-01T00:{minute:02}:00Z")},
            "status": {"phase": phase}
        }))
        .unwrap();
        if going {
            p.metadata.deletion_timestamp = p.metadata.creation_timestamp.clone();
        }
        Arc::new(p)
    }

    #[test]
    fn the_oldest_ended_copies_past_the_bound_go() {
        let copies = [
            pod("new-done", "Succeeded", 9, false),
            pod("running", "Running", 0, false),
            pod("old-failed", "Failed", 1, false),
            pod("mid-done", "Succeeded", 5, false),
            pod("going", "Succeeded", 0, true),
        ];
        let names = |max| -> Vec<String> {
            past_bound(&copies, max)
                .iter()
                .map(|p| p.metadata.name.clone().unwrap())
                .collect()
        };
        assert_eq!(names(1), ["old-failed", "mid-done"]);
        assert_eq!(names(3), Vec::<String>::new());
        assert_eq!(names(0).len(), 3);
    }
}
