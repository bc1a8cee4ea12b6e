//! Reading the control plane's pod and StatefulSet as a kubelet and the StatefulSet controller
//! left them: Ready or not, why not in a line, whether waiting can fix it, whether a rollout is
//! under way. Pure.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use crate::build::agent;

/// Waiting reasons of a container whose image the node cannot get.
const IMAGE_PULL_REASONS: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
];

/// The pod's `Ready` condition is True and it is not being deleted.
pub fn pod_is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn list(l: Option<&Vec<ContainerStatus>>) -> Vec<&ContainerStatus> {
    l.into_iter().flatten().collect()
}

/// The statuses of the init containers that run to completion, and of those that keep running:
/// the containers and the sidecars (init containers with `restartPolicy: Always`, which run
/// beside the containers once started, so a crash of one is a crash of the control plane).
fn statuses(pod: &Pod) -> (Vec<&ContainerStatus>, Vec<&ContainerStatus>) {
    let status = pod.status.as_ref();
    let sidecar = |name: &str| {
        pod.spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten())
            .any(|c| c.name == name && c.restart_policy.as_deref() == Some("Always"))
    };
    let (sidecars, init): (Vec<_>, Vec<_>) =
        list(status.and_then(|s| s.init_container_statuses.as_ref()))
            .into_iter()
            .partition(|c| sidecar(&c.name));
    let mut running = sidecars;
    running.extend(list(status.and_then(|s| s.container_statuses.as_ref())));
    (init, running)
}

/// `reason: message`, either part left out when empty.
fn reason_message(reason: Option<&String>, message: Option<&String>) -> String {
    match (
        reason.filter(|r| !r.is_empty()),
        message.filter(|m| !m.is_empty()),
    ) {
        (Some(r), Some(m)) => format!("{r}: {m}"),
        (Some(r), None) => r.clone(),
        (None, Some(m)) => m.clone(),
        (None, None) => String::new(),
    }
}

/// How a container last failed, when it did: `exit code 1 (Error: the message)`.
fn last_failure(c: &ContainerStatus) -> Option<String> {
    let terminated = c
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| c.last_state.as_ref()?.terminated.as_ref())?;
    if terminated.exit_code == 0 {
        return None;
    }
    let detail = reason_message(terminated.reason.as_ref(), terminated.message.as_ref());
    Some(if detail.is_empty() {
        format!("exit code {}", terminated.exit_code)
    } else {
        format!("exit code {} ({detail})", terminated.exit_code)
    })
}

/// What to check when the snapshot agent's image cannot be pulled.
const AGENT_PULL_ADVICE: &str = "the snapshot agent runs from the operator's own image: check that it is published under the name the operator's --agent-image gives and that the node can pull it";

/// What to check when an image of `distribution` cannot be pulled.
pub fn pull_advice(distribution: tenantplane_api::Distribution) -> &'static str {
    match distribution {
        tenantplane_api::Distribution::K3s => {
            "check that the image is published and that --k3s-repository mirrors it, or pin an image with spec.controlPlane.image"
        }
        tenantplane_api::Distribution::Kubernetes => {
            "check that the image is published and that --kubernetes-repository (kube-apiserver, kube-controller-manager) and --kine-image mirror it"
        }
    }
}

/// Why the pod cannot start in a way waiting will not fix: its image cannot be pulled, or an
/// init container fails. `image` is what the StatefulSet asks for, for the message when the
/// status does not say; `advice` what to check when a pull fails ([`pull_advice`]).
pub fn failing(
    pod: &Pod,
    image: &str,
    version: &str,
    advice: &str,
) -> Option<(&'static str, String)> {
    let (init, main) = statuses(pod);
    for c in init.iter().chain(main.iter()) {
        let Some(waiting) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) else {
            continue;
        };
        if waiting
            .reason
            .as_deref()
            .is_some_and(|r| IMAGE_PULL_REASONS.contains(&r))
        {
            let image = if c.image.is_empty() { image } else { &c.image };
            // The snapshot agent's image is the operator's, whatever the distribution.
            let advice = if [agent::CONTAINER, agent::RESTORE_CONTAINER].contains(&c.name.as_str())
            {
                AGENT_PULL_ADVICE
            } else {
                advice
            };
            return Some((
                "ImagePullFailed",
                format!(
                    "container {} cannot pull image {image} ({}); it runs kubernetesVersion {version}: {advice}",
                    c.name,
                    reason_message(waiting.reason.as_ref(), waiting.message.as_ref())
                ),
            ));
        }
    }
    for c in init {
        if let Some(failure) = last_failure(c) {
            return Some((
                "InitContainerFailed",
                format!(
                    "init container {} failed with {failure} after {} restarts; the pod will not start until it succeeds",
                    c.name, c.restart_count
                ),
            ));
        }
    }
    for c in main {
        let crashing = c
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .is_some_and(|w| w.reason.as_deref() == Some("CrashLoopBackOff"));
        if crashing && let Some(failure) = last_failure(c) {
            return Some((
                "ControlPlaneCrashing",
                format!(
                    "container {} keeps exiting: {failure}, {} restarts",
                    c.name, c.restart_count
                ),
            ));
        }
    }
    None
}

/// A line about why a pod is not Ready: its phase and the first init container, container or
/// condition that says something.
pub fn pod_summary(pod: &Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let phase = status.phase.clone().unwrap_or_else(|| "Unknown".into());
    if pod.metadata.deletion_timestamp.is_some() {
        return format!("{phase}, terminating");
    }
    let (init, main) = statuses(pod);
    let container = |list: &[&ContainerStatus], kind: &str| {
        list.iter().find_map(|c| {
            let waiting = c.state.as_ref()?.waiting.as_ref()?;
            let detail = reason_message(waiting.reason.as_ref(), waiting.message.as_ref());
            Some(format!("{kind} {}: {detail}", c.name))
        })
    };
    // An init container still at work says more than PodInitializing on the main one.
    let running_init = init.iter().find_map(|c| {
        c.state.as_ref()?.running.as_ref()?;
        Some(format!("init container {} running", c.name))
    });
    let condition = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.status != "True" && c.message.is_some())
        .map(|c| {
            format!(
                "{}: {}",
                c.reason.clone().unwrap_or_else(|| c.type_.clone()),
                c.message.clone().unwrap_or_default()
            )
        });
    match container(&init, "init container")
        .or(running_init)
        .or_else(|| container(&main, "container"))
        .or(condition)
    {
        Some(detail) => format!("{phase}, {detail}"),
        None => phase,
    }
}

/// Whether the StatefulSet is rolling out a change (a new version): its controller has not seen
/// the latest spec, or its pods are not all at the newest revision.
pub fn rolling_out(sts: &StatefulSet) -> bool {
    let Some(status) = sts.status.as_ref() else {
        return true;
    };
    let seen = status.observed_generation.unwrap_or(0) >= sts.metadata.generation.unwrap_or(0);
    let updated = match (&status.current_revision, &status.update_revision) {
        (Some(current), Some(update)) => current == update,
        _ => true,
    };
    !seen || !updated
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "dev-0"}, "status": status})).unwrap()
    }

    #[test]
    fn an_image_that_cannot_be_pulled_names_the_version() {
        let p = pod(json!({"phase": "Pending", "initContainerStatuses": [{
            "name": "pki", "ready": false, "restartCount": 0, "image": "rancher/k3s:v1.36.99-k3s1", "imageID": "",
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"rancher/k3s:v1.36.99-k3s1\""}},
        }]}));
        let (reason, message) = failing(
            &p,
            "rancher/k3s:v1.36.99-k3s1",
            "v1.36.99",
            pull_advice(tenantplane_api::Distribution::K3s),
        )
        .unwrap();
        assert_eq!(reason, "ImagePullFailed");
        assert!(message.contains("cannot pull image rancher/k3s:v1.36.99-k3s1 (ImagePullBackOff: Back-off pulling image"), "{message}");
        assert!(message.contains("kubernetesVersion v1.36.99"), "{message}");
        assert!(message.contains("spec.controlPlane.image"), "{message}");
        // The agent's image is the operator's: its own advice, whichever the distribution.
        let p = pod(json!({"phase": "Pending", "containerStatuses": [{
            "name": agent::CONTAINER, "ready": false, "restartCount": 0,
            "image": "tenantplane/tenantplane:0.1.0", "imageID": "",
            "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}},
        }]}));
        let advice = pull_advice(tenantplane_api::Distribution::Kubernetes);
        let (_, message) = failing(&p, "ignored", "v1.36.3", advice).unwrap();
        assert!(message.contains("--agent-image"), "{message}");
        assert!(!message.contains("--kine-image"), "{message}");
    }

    #[test]
    fn a_failing_init_container_says_how_it_failed() {
        let p = pod(json!({"phase": "Pending", "initContainerStatuses": [{
            "name": "pki", "ready": false, "restartCount": 3, "image": "k3s", "imageID": "",
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "cp: can't create '/var/lib/rancher/k3s/server/tls/': Permission denied"}},
        }], "containerStatuses": [{
            "name": "k3s", "ready": false, "restartCount": 0, "image": "k3s", "imageID": "",
            "state": {"waiting": {"reason": "PodInitializing"}},
        }]}));
        let (reason, message) = failing(&p, "k3s", "v1", "").unwrap();
        assert_eq!(reason, "InitContainerFailed");
        assert!(
            message.contains("init container pki failed with exit code 1 (Error: cp: can't create"),
            "{message}"
        );
        let summary = pod_summary(&p);
        assert!(
            summary.starts_with("Pending, init container pki: CrashLoopBackOff"),
            "{summary}"
        );
    }

    #[test]
    fn a_pod_starting_is_not_failing() {
        let p = pod(json!({"phase": "Pending", "initContainerStatuses": [{
            "name": "pki", "ready": false, "restartCount": 0, "image": "k3s", "imageID": "",
            "state": {"running": {}},
        }], "containerStatuses": [{
            "name": "k3s", "ready": false, "restartCount": 0, "image": "k3s", "imageID": "",
            "state": {"waiting": {"reason": "PodInitializing"}},
        }]}));
        assert_eq!(failing(&p, "k3s", "v1", ""), None);
        assert_eq!(pod_summary(&p), "Pending, init container pki running");
        // The local runtime's restart says CrashLoopBackOff without a last state: transient.
        let restarting = pod(json!({"phase": "Running", "containerStatuses": [{
            "name": "k3s", "ready": false, "restartCount": 1, "image": "local", "imageID": "",
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "restarting"}},
        }]}));
        assert_eq!(failing(&restarting, "k3s", "v1", ""), None);
    }

    #[test]
    fn a_sidecar_that_keeps_exiting_is_a_crashing_control_plane() {
        let mut p = pod(json!({"phase": "Running", "initContainerStatuses": [
            {"name": "datastore", "ready": false, "restartCount": 0, "image": "kine", "imageID": "",
             "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
            {"name": "kine", "ready": true, "restartCount": 0, "image": "kine", "imageID": "",
             "state": {"running": {}}},
            {"name": "kube-apiserver", "ready": false, "restartCount": 4, "image": "kube-apiserver", "imageID": "",
             "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 1m20s"}},
             "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "open /etc/tenantplane/certs/apiserver.crt: no such file"}}},
        ], "containerStatuses": [{
            "name": "kube-controller-manager", "ready": false, "restartCount": 0, "image": "kcm", "imageID": "",
            "state": {"waiting": {"reason": "PodInitializing"}},
        }]}));
        p.spec = Some(
            serde_json::from_value(json!({"initContainers": [
                {"name": "datastore"},
                {"name": "kine", "restartPolicy": "Always"},
                {"name": "kube-apiserver", "restartPolicy": "Always"},
            ], "containers": [{"name": "kube-controller-manager"}]}))
            .unwrap(),
        );
        let (reason, message) = failing(&p, "kube-apiserver", "v1.36.3", "").unwrap();
        assert_eq!(
            reason, "ControlPlaneCrashing",
            "not an init container failing"
        );
        assert!(
            message.starts_with("container kube-apiserver keeps exiting: exit code 1 (Error: open"),
            "{message}"
        );
        // A running sidecar is not an init container at work.
        assert_eq!(
            pod_summary(&p),
            "Running, container kube-apiserver: CrashLoopBackOff: back-off 1m20s"
        );
    }

    #[test]
    fn a_rollout_is_seen_in_the_statefulset_status() {
        let sts = |generation: i64, observed: i64, current: &str, update: &str| -> StatefulSet {
            serde_json::from_value(json!({
                "metadata": {"name": "dev", "generation": generation},
                "spec": {"selector": {}, "template": {}, "serviceName": "dev-headless"},
                "status": {"replicas": 1, "observedGeneration": observed, "currentRevision": current, "updateRevision": update},
            }))
            .unwrap()
        };
        assert!(!rolling_out(&sts(2, 2, "a", "a")));
        assert!(rolling_out(&sts(3, 2, "a", "a")), "spec not seen yet");
        assert!(
            rolling_out(&sts(2, 2, "a", "b")),
            "pods at the old revision"
        );
    }
}
