//! What of a running pod's spec its copy follows. A pod allows few edits; the tenant's are
//! carried down where the host allows them (container and init container images, tolerations
//! added, an active deadline set or shortened); a resize (the tenant's `pods/resize`) goes to
//! the copy's own `resize` subresource ([`resize_patch`]). The copy records the tenant's
//! generation only when it carries all of the tenant's spec that can change, so the tenant pod's
//! `observedGeneration` never claims what the host does not run (a resize the host has not taken
//! yet, or refused, and ephemeral containers the copy does not run yet).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::tell;
use crate::tenant::Tenant;
use crate::tenant_terms::{self, Terms};

/// `host`, the live copy's spec, with the tenant's edits from `want` (the tenant pod as the
/// copy would be made now) that the host allows on a running pod.
pub fn carried_spec(host: &PodSpec, want: &PodSpec) -> PodSpec {
    let mut spec = host.clone();
    carry_images(&mut spec.containers, &want.containers);
    if let (Some(host_init), Some(want_init)) =
        (spec.init_containers.as_mut(), want.init_containers.as_ref())
    {
        carry_images(host_init, want_init);
    }
    for toleration in want.tolerations.iter().flatten() {
        let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
        if !tolerations.contains(toleration) {
            tolerations.push(toleration.clone());
        }
    }
    spec.active_deadline_seconds =
        match (host.active_deadline_seconds, want.active_deadline_seconds) {
            (None, Some(w)) => Some(w),
            (Some(h), Some(w)) if w < h => Some(w),
            (h, _) => h,
        };
    spec
}

fn carry_images(host: &mut [Container], want: &[Container]) {
    for c in host.iter_mut() {
        if let Some(w) = want.iter().find(|w| w.name == c.name) {
            c.image = w.image.clone();
        }
    }
}

/// The patch of the copy's `resize` subresource that gives its containers (and init containers:
/// sidecars resize too) the requests and limits of `want`, naming only those whose resources
/// `host` does not hold; `None` when there is nothing to resize. The host's admission (quota,
/// limits, its node's room) decides, as for a resize made on the host.
pub fn resize_patch(host: &PodSpec, want: &PodSpec) -> Option<Value> {
    let changed = |host: &[Container], want: &[Container]| -> Vec<Value> {
        want.iter()
            .filter(|w| {
                host.iter().any(|h| {
                    h.name == w.name && !resources_hold(h.resources.as_ref(), w.resources.as_ref())
                })
            })
            .map(|w| json!({"name": w.name, "resources": resizable(w.resources.as_ref())}))
            .collect()
    };
    let containers = changed(&host.containers, &want.containers);
    let init = changed(
        host.init_containers.as_deref().unwrap_or_default(),
        want.init_containers.as_deref().unwrap_or_default(),
    );
    if containers.is_empty() && init.is_empty() {
        return None;
    }
    let mut spec = serde_json::Map::new();
    if !containers.is_empty() {
        spec.insert("containers".into(), Value::Array(containers));
    }
    if !init.is_empty() {
        spec.insert("initContainers".into(), Value::Array(init));
    }
    Some(json!({ "spec": spec }))
}

/// Resize the copy `host_name` (whose spec is `host`) to the resources of `want`, if they
/// differ; the host's refusal is also told on the tenant pod `t` (in `terms`).
pub async fn resize(
    cx: &Tenant,
    t: &Pod,
    host_name: &str,
    host: &PodSpec,
    want: &PodSpec,
    terms: Terms<'_>,
) -> Result<()> {
    let Some(patch) = resize_patch(host, want) else {
        return Ok(());
    };
    let resized = cx
        .host_api::<Pod>()
        .patch_subresource(
            "resize",
            host_name,
            &PatchParams::default(),
            &Patch::Strategic(patch),
        )
        .await
        .map_err(Error::from_api);
    if let Err(e @ Error::HostRejected(_)) = &resized {
        let message = tenant_terms::status_message(&format!("resizing: {e}"), &terms);
        let _ = tell::tell(cx, t, e.reason(), &message).await;
    }
    resized.map(|_| ())
}

/// Does the copy's spec `host` run all of `want` that can change on a running pod?
pub fn carries_all(host: &PodSpec, want: &PodSpec) -> bool {
    let containers_match = |host: &[Container], want: &[Container]| {
        want.iter().all(|w| {
            host.iter().any(|h| {
                h.name == w.name
                    && h.image == w.image
                    && resources_hold(h.resources.as_ref(), w.resources.as_ref())
            })
        })
    };
    let ephemeral = |s: &PodSpec| -> Vec<String> {
        s.ephemeral_containers
            .iter()
            .flatten()
            .map(|c| c.name.clone())
            .collect()
    };
    containers_match(&host.containers, &want.containers)
        && containers_match(
            host.init_containers.as_deref().unwrap_or_default(),
            want.init_containers.as_deref().unwrap_or_default(),
        )
        && want
            .tolerations
            .iter()
            .flatten()
            .all(|t| host.tolerations.iter().flatten().any(|h| h == t))
        && host.active_deadline_seconds == want.active_deadline_seconds
        && ephemeral(want)
            .iter()
            .all(|name| ephemeral(host).contains(name))
}

/// Does `host` hold every request and limit `want` names, at its value? (The host may add
/// defaults of its own, a LimitRange's.)
/// The resources a running pod's container can change: cpu and memory. The rest cannot
/// change on either side (the tenant's API refuses it too), and the copy's own defaults for
/// them (node disk, `allow::bound_disk`) are the syncer's: a copy made before a default changed
/// keeps the one it had, rather than asking the host for a resize it refuses.
const RESIZABLE: &[&str] = &["cpu", "memory"];

/// `r` with only the [`RESIZABLE`] resources.
fn resizable(r: Option<&ResourceRequirements>) -> Option<ResourceRequirements> {
    let only =
        |m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            m.map(|m| {
                m.iter()
                    .filter(|(k, _)| RESIZABLE.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<BTreeMap<_, _>>()
            })
        };
    r.map(|r| ResourceRequirements {
        requests: only(r.requests.as_ref()),
        limits: only(r.limits.as_ref()),
        ..Default::default()
    })
}

fn resources_hold(
    host: Option<&ResourceRequirements>,
    want: Option<&ResourceRequirements>,
) -> bool {
    let empty = BTreeMap::new();
    let want = resizable(want);
    let Some(want) = want.as_ref() else {
        return true;
    };
    let host_requests = host.and_then(|h| h.requests.as_ref()).unwrap_or(&empty);
    let host_limits = host.and_then(|h| h.limits.as_ref()).unwrap_or(&empty);
    let holds = |wanted: Option<&BTreeMap<_, _>>, held: &BTreeMap<_, _>| {
        wanted
            .into_iter()
            .flatten()
            .all(|(k, v)| held.get(k) == Some(v))
    };
    holds(want.requests.as_ref(), host_requests) && holds(want.limits.as_ref(), host_limits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).unwrap()
    }

    fn running() -> PodSpec {
        spec(json!({
            "containers": [{"name": "c", "image": "a:1",
                            "resources": {"requests": {"cpu": "100m", "memory": "10Mi"}}}],
            "initContainers": [{"name": "i", "image": "b:1"}],
            "tolerations": [{"key": "profile", "operator": "Exists"}]
        }))
    }

    #[test]
    fn the_edits_a_running_pod_allows_are_carried_and_then_all_is_carried() {
        let want = spec(json!({
            "containers": [{"name": "c", "image": "a:2",
                            "resources": {"requests": {"cpu": "100m"}}}],
            "initContainers": [{"name": "i", "image": "b:2"}],
            "tolerations": [{"key": "profile", "operator": "Exists"},
                            {"key": "foo", "operator": "Equal", "value": "bar", "effect": "NoSchedule"}],
            "activeDeadlineSeconds": 5000
        }));
        let host = running();
        assert!(!carries_all(&host, &want));
        let carried = carried_spec(&host, &want);
        assert_eq!(carried.containers[0].image.as_deref(), Some("a:2"));
        assert_eq!(
            carried.init_containers.as_ref().unwrap()[0]
                .image
                .as_deref(),
            Some("b:2")
        );
        assert_eq!(carried.tolerations.as_ref().unwrap().len(), 2);
        assert_eq!(carried.active_deadline_seconds, Some(5000));
        // The host's own default (memory) does not count against the tenant's spec.
        assert!(carries_all(&carried, &want));
    }

    #[test]
    fn a_resize_or_an_ephemeral_container_is_not_carried_so_not_claimed() {
        let mut want = running();
        want.containers[0].resources =
            Some(serde_json::from_value(json!({"requests": {"cpu": "200m"}})).unwrap());
        let carried = carried_spec(&running(), &want);
        assert!(!carries_all(&carried, &want));
        let mut want = running();
        want.ephemeral_containers =
            Some(serde_json::from_value(json!([{"name": "debugger", "image": "d"}])).unwrap());
        assert!(!carries_all(&carried_spec(&running(), &want), &want));
        assert!(carries_all(&running(), &running()));
    }

    #[test]
    fn a_resize_patches_only_the_containers_whose_resources_changed() {
        assert_eq!(resize_patch(&running(), &running()), None);
        let mut want = running();
        want.containers[0].resources = Some(
            serde_json::from_value(
                json!({"requests": {"cpu": "200m", "memory": "10Mi"}, "limits": {"cpu": "1"}}),
            )
            .unwrap(),
        );
        let patch = resize_patch(&running(), &want).unwrap();
        assert_eq!(
            patch,
            json!({"spec": {"containers": [{"name": "c", "resources":
                {"requests": {"cpu": "200m", "memory": "10Mi"}, "limits": {"cpu": "1"}}}]}})
        );
        // Once the host holds it, nothing is left to resize and all is carried.
        let mut resized = running();
        resized.containers[0].resources = want.containers[0].resources.clone();
        assert_eq!(resize_patch(&resized, &want), None);
        assert!(carries_all(&resized, &want));
        // A sidecar's resize goes by its own list.
        let mut want = running();
        want.init_containers.as_mut().unwrap()[0].resources =
            Some(serde_json::from_value(json!({"requests": {"cpu": "50m"}})).unwrap());
        let patch = resize_patch(&running(), &want).unwrap();
        assert_eq!(patch["spec"]["initContainers"][0]["name"], "i");
        assert!(patch["spec"].get("containers").is_none());
    }

    /// A copy made before the node disk defaults (or under other ones) is not resized for them:
    /// the host refuses any resize but of cpu and memory, and the copy would never settle.
    #[test]
    fn node_disk_defaults_are_never_resized() {
        let mut want = running();
        want.containers[0].resources = Some(
            serde_json::from_value(
                json!({"requests": {"cpu": "100m", "memory": "10Mi", "ephemeral-storage": "0"},
                "limits": {"ephemeral-storage": "16Gi"}}),
            )
            .unwrap(),
        );
        assert_eq!(resize_patch(&running(), &want), None);
        assert!(carries_all(&running(), &want));
        want.containers[0].resources = Some(
            serde_json::from_value(
                json!({"requests": {"cpu": "300m", "ephemeral-storage": "0"},
                "limits": {"ephemeral-storage": "16Gi"}}),
            )
            .unwrap(),
        );
        assert_eq!(
            resize_patch(&running(), &want).unwrap(),
            json!({"spec": {"containers": [{"name": "c", "resources":
                {"requests": {"cpu": "300m"}, "limits": {}}}]}})
        );
    }

    #[test]
    fn an_active_deadline_is_only_set_or_shortened() {
        let mut host = running();
        host.active_deadline_seconds = Some(100);
        let mut want = running();
        want.active_deadline_seconds = Some(300);
        assert_eq!(
            carried_spec(&host, &want).active_deadline_seconds,
            Some(100)
        );
        want.active_deadline_seconds = Some(50);
        assert_eq!(carried_spec(&host, &want).active_deadline_seconds, Some(50));
    }
}
