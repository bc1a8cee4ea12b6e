//! Ephemeral containers (`kubectl debug`): the tenant adds one through its pod's
//! `ephemeralcontainers` subresource; the syncer starts it in the running copy through the
//! copy's own. Each is judged as the pod's only container would be (the same review, the same
//! translation: images, field allowlist, references to ConfigMaps and Secrets), so a debug
//! container can do no more than a pod of the tenant could. One the profile refuses is not
//! started, the tenant is told why on the pod, and the pod runs on: refusing it never costs the
//! running copy. Once started, an ephemeral container cannot be changed or removed, on either
//! side.

use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::references::as_container;
use super::{review, translate};
use crate::error::{Error, Result};
use crate::tell;
use crate::tenant::Tenant;
use crate::tenant_terms::{self, Terms};

/// Tenant pod `t` as if `ec` were its only container: what the review and the translation of a
/// pod judge and rewrite.
fn as_pod(t: &Pod, ec: &EphemeralContainer) -> Pod {
    let mut p = t.clone();
    let spec = p.spec.get_or_insert_with(Default::default);
    spec.containers = vec![as_container(ec)];
    spec.init_containers = None;
    spec.ephemeral_containers = None;
    // No hosts file of the syncer's (`hosts`): an ephemeral container may not mount a sub-path,
    // and the kubelet writes it one of its own.
    spec.subdomain = None;
    p
}

/// What becomes of the tenant's ephemeral containers the copy does not run yet: each in host
/// form, or why the profile refuses it.
pub fn judged(
    tr: &crate::translate::Translator,
    t: &Pod,
    copy: &Pod,
    host_name: &str,
) -> Vec<(String, Result<EphemeralContainer>)> {
    let running: Vec<&str> = copy
        .spec
        .iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .map(|c| c.name.as_str())
        .collect();
    let wanted = t
        .spec
        .iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .filter(|ec| !running.contains(&ec.name.as_str()));
    wanted
        .map(|ec| {
            let alone = as_pod(t, ec);
            let judged = match review::review(tr, &alone).refusal() {
                Some(refused) => Err(refused),
                None => {
                    let host = translate::pod(tr, &alone, host_name, &[], None);
                    let c = host
                        .spec
                        .map(|s| s.containers)
                        .unwrap_or_default()
                        .into_iter()
                        .next()
                        .unwrap_or_default();
                    // The API refuses resources on an ephemeral container (it runs in the pod's
                    // own): none of the node disk defaults a container of the copy gets.
                    let c = Container {
                        resources: None,
                        ..c
                    };
                    let mut value = serde_json::to_value(&c).unwrap_or_default();
                    value["targetContainerName"] = json!(ec.target_container_name);
                    Ok(serde_json::from_value(value).unwrap_or_default())
                }
            };
            (ec.name.clone(), judged)
        })
        .collect()
}

/// Start in copy `h` (named `host_name`) the ephemeral containers tenant pod `t` has and the copy
/// does not; tell the tenant on `t` of each one refused, by the profile or by the host (its Pod
/// Security, in `terms`).
pub async fn carry(cx: &Tenant, t: &Pod, h: &Pod, host_name: &str, terms: Terms<'_>) -> Result<()> {
    let mut start = Vec::new();
    for (name, judged) in judged(&cx.tr, t, h, host_name) {
        match judged {
            Ok(ec) => start.push(ec),
            Err(why) => {
                let message = format!("ephemeral container {name:?} is not started: {why}");
                let _ = tell::tell(cx, t, tell::NOT_ALLOWED, &message).await;
            }
        }
    }
    if start.is_empty() {
        return Ok(());
    }
    // A strategic merge by name: the copy's running ephemeral containers stay as they are.
    let patch = json!({"spec": {"ephemeralContainers": start}});
    let started = cx
        .host_api::<Pod>()
        .patch_subresource(
            "ephemeralcontainers",
            &h.name_any(),
            &PatchParams::default(),
            &Patch::Strategic(patch),
        )
        .await
        .map_err(Error::from_api);
    if let Err(e @ Error::HostRejected(_)) = &started {
        let message =
            tenant_terms::status_message(&format!("starting an ephemeral container: {e}"), &terms);
        let _ = tell::tell(cx, t, e.reason(), &message).await;
    }
    started.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::tests::translator;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn tenant_pod(ephemeral: serde_json::Value) -> Pod {
        pod(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
            "spec": {
                "hostname": "web", "subdomain": "site",
                "containers": [{"name": "app", "image": "nginx",
                                "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}],
                "ephemeralContainers": ephemeral
            }
        }))
    }

    #[test]
    fn a_debug_container_is_translated_as_a_container_and_keeps_its_target() {
        let tr = translator();
        let t = tenant_pod(json!([{
            "name": "debugger", "image": "busybox", "targetContainerName": "app",
            "command": ["sh"], "stdin": true, "tty": true,
            "env": [{"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}]
        }]));
        let copy =
            pod(json!({"metadata": {"name": "web-x-default-x-dev"}, "spec": {"containers": []}}));
        let judged = judged(&tr, &t, &copy, "web-x-default-x-dev");
        assert_eq!(judged.len(), 1);
        let (name, ec) = &judged[0];
        assert_eq!(name, "debugger");
        let ec = ec.as_ref().expect("allowed");
        assert_eq!(ec.target_container_name.as_deref(), Some("app"));
        assert_eq!(ec.image_pull_policy.as_deref(), Some("Always"));
        let env = ec.env.as_ref().unwrap();
        let b = env.iter().find(|e| e.name == "B").unwrap();
        let cm = b
            .value_from
            .as_ref()
            .unwrap()
            .config_map_key_ref
            .as_ref()
            .unwrap();
        assert_eq!(cm.name, tr.host_name("default", "cm"));
        // The tenant API's address, as every container of a copy has it.
        assert!(env.iter().any(|e| e.name == "KUBERNETES_SERVICE_HOST"));
        // No sub-path mount (the syncer's hosts file), which an ephemeral container may not have.
        assert!(
            ec.volume_mounts
                .iter()
                .flatten()
                .all(|m| m.sub_path.is_none())
        );
        // No resources, which the API refuses on an ephemeral container (a copy's containers
        // get node disk defaults; this one must not).
        assert_eq!(ec.resources, None);
        // Started once: a copy that runs it is not asked again.
        let mut running = copy;
        running.spec.as_mut().unwrap().ephemeral_containers = Some(vec![ec.clone()]);
        assert!(super::judged(&tr, &t, &running, "web-x-default-x-dev").is_empty());
    }

    #[test]
    fn a_debug_container_the_profile_refuses_says_why_and_is_not_started() {
        let tr = translator();
        let t = tenant_pod(json!([{
            "name": "root", "image": "busybox",
            "securityContext": {"privileged": true}
        }]));
        let copy =
            pod(json!({"metadata": {"name": "web-x-default-x-dev"}, "spec": {"containers": []}}));
        let judged = judged(&tr, &t, &copy, "web-x-default-x-dev");
        let why = judged[0].1.as_ref().unwrap_err();
        assert_eq!(why.reason(), "NotAllowed");
        assert!(why.to_string().contains("privileged"), "{why}");
    }

    #[test]
    fn the_target_is_the_only_field_a_container_lacks() {
        let ec: EphemeralContainer = serde_json::from_value(json!({
            "name": "d", "image": "i", "targetContainerName": "app", "tty": true
        }))
        .unwrap();
        let c = as_container(&ec);
        assert_eq!(
            (c.name.as_str(), c.image.as_deref(), c.tty),
            ("d", Some("i"), Some(true))
        );
    }
}
