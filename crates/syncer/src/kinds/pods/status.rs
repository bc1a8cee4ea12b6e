//! What comes back up for a pod: the status the tenant pod shows for its host copy, in the
//! tenant's terms (see [`crate::tenant_terms`]): no host node inventory, copy names or host
//! namespace in its messages.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::json;
use std::collections::BTreeMap;

use crate::naming::ANNOTATION_TENANT_GENERATION;
use crate::spec::KubeletEndpoint;
use crate::tenant_terms::{Terms, WAITING_FOR_ROOM, status_message};

/// Conditions the tenant's own API server and controllers write on a pod, never a kubelet:
/// `DisruptionTarget` from its eviction API (a Job's pod failure policy reads it once the pod has
/// ended). A readiness gate's types (`spec.readinessGates`) are a tenant controller's too.
const TENANT_CONDITIONS: &[&str] = &["DisruptionTarget"];

/// Keep in `wanted` the conditions of tenant pod `tenant` that only the tenant's side writes
/// ([`TENANT_CONDITIONS`], its readiness gates), where the copy has none of that type: a status
/// written up replaces the whole list. Any other condition is the kubelet's, and one the copy no
/// longer has (a resize's `PodResizeInProgress`, once done) goes from the tenant pod too.
pub fn keep_tenant_conditions(wanted: &mut PodStatus, tenant: &Pod) {
    let gates: Vec<&str> = tenant
        .spec
        .iter()
        .flat_map(|s| s.readiness_gates.iter().flatten())
        .map(|g| g.condition_type.as_str())
        .collect();
    let conditions = wanted.conditions.get_or_insert_default();
    for c in tenant
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
    {
        let tenants =
            TENANT_CONDITIONS.contains(&c.type_.as_str()) || gates.contains(&c.type_.as_str());
        if tenants && !conditions.iter().any(|h| h.type_ == c.type_) {
            conditions.push(c.clone());
        }
    }
}

/// Leave out of `wanted`'s container statuses the node disk the syncer gave the copy's containers
/// that ask for none ([`crate::allow::bound_disk`]: a default limit, a request of 0).
/// That bound is the host's: a tenant container's `resources` and `allocatedResources` show
/// `ephemeral-storage` only where the tenant pod's container asks for it, as in a cluster of its
/// own (a resize is checked against exactly what the container asked).
pub fn disk_as_asked(wanted: &mut PodStatus, tenant: &Pod) {
    use crate::allow::DISK;
    let Some(spec) = tenant.spec.as_ref() else {
        return;
    };
    let asks = |name: &str, limits: bool| {
        spec.init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .find(|c| c.name == name)
            .and_then(|c| c.resources.as_ref())
            .and_then(|r| if limits { &r.limits } else { &r.requests }.as_ref())
            .is_some_and(|m| m.contains_key(DISK))
    };
    let drop_disk = |map: &mut Option<BTreeMap<String, Quantity>>| {
        if let Some(m) = map.as_mut() {
            m.remove(DISK);
            if m.is_empty() {
                *map = None;
            }
        }
    };
    let statuses = [
        wanted.init_container_statuses.as_mut(),
        wanted.container_statuses.as_mut(),
        wanted.ephemeral_container_statuses.as_mut(),
    ];
    for c in statuses.into_iter().flatten().flatten() {
        if !asks(&c.name, false) {
            drop_disk(&mut c.allocated_resources);
            if let Some(r) = c.resources.as_mut() {
                drop_disk(&mut r.requests);
            }
        }
        if !asks(&c.name, true)
            && let Some(r) = c.resources.as_mut()
        {
            drop_disk(&mut r.limits);
        }
    }
}

/// The status the tenant pod should show for its host copy: the host's, with its messages said
/// in tenant terms and the scheduler's reasons for waiting replaced by one sentence.
/// `observed` is the tenant pod's `status.observedGeneration` now (see [`observed_generation`]);
/// `node_addresses`: the profile shows host node addresses (`allow.nodeAddresses`).
pub fn pod_status_up(
    host: &Pod,
    terms: &Terms,
    kubelet: Option<&KubeletEndpoint>,
    node_addresses: bool,
    observed: Option<i64>,
) -> PodStatus {
    let mut status = host.status.clone().unwrap_or_default();
    // Generations count the tenant pod's specs, not the copy's.
    let host_generation = host.metadata.generation;
    let current = observed_generation(host, observed);
    status.observed_generation = current;
    for c in status.conditions.iter_mut().flatten() {
        if c.observed_generation.is_some() {
            c.observed_generation = if c.observed_generation == host_generation {
                tenant_generation(host).or(current)
            } else {
                current
            };
        }
    }
    // The pod's node is its virtual Node, whose address is the operator's kubelet endpoint: the
    // host node's own address is not the tenant's to see, unless the profile shows it.
    if !node_addresses {
        status.host_ip = kubelet.map(|k| k.address.clone());
        status.host_ips = kubelet.map(|k| {
            vec![k8s_openapi::api::core::v1::HostIP {
                ip: k.address.clone(),
            }]
        });
    }
    // A host node the host scheduler may preempt for; the tenant has no scheduler to tell.
    status.nominated_node_name = None;
    // The tenant API server decided the tenant pod's class at creation, and the field is
    // immutable: the host's (a LimitRange may have changed it) is never written up.
    status.qos_class = None;
    let say = |m: &mut Option<String>| {
        if let Some(text) = m.as_mut() {
            *text = status_message(text, terms);
        }
    };
    say(&mut status.message);
    for c in status.conditions.iter_mut().flatten() {
        if c.type_ == "PodScheduled" && c.status == "False" {
            // "0/3 nodes are available: 1 node(s) had untolerated taint(s)…" describes the host.
            c.message = Some(WAITING_FOR_ROOM.to_string());
        } else {
            say(&mut c.message);
        }
    }
    super::hosts::hide_status(&mut status.init_container_statuses);
    let containers = [
        status.init_container_statuses.as_mut(),
        status.container_statuses.as_mut(),
        status.ephemeral_container_statuses.as_mut(),
    ];
    for c in containers.into_iter().flatten().flatten() {
        container_in_tenant_terms(c, terms);
    }
    status
}

/// The tenant generation copy `host` was last made or updated from.
fn tenant_generation(host: &Pod) -> Option<i64> {
    host.metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_TENANT_GENERATION)?
        .parse()
        .ok()
}

/// The tenant pod's `status.observedGeneration`: the tenant generation the copy carries, once
/// the host's kubelet has observed the copy's current spec; until then what the tenant pod
/// showed (`observed`). The host's own number counts the copy's specs, which move only with
/// what the syncer carries down (images), so it is never shown as it is.
pub fn observed_generation(host: &Pod, observed: Option<i64>) -> Option<i64> {
    let seen = host.status.as_ref().and_then(|s| s.observed_generation);
    match (seen, host.metadata.generation, tenant_generation(host)) {
        (Some(seen), Some(generation), Some(tenant)) if seen >= generation => {
            Some(observed.map_or(tenant, |o| o.max(tenant)))
        }
        _ => observed,
    }
}

/// A container's state messages ("secret \"creds-x-default-x-dev\" not found") in tenant terms.
fn container_in_tenant_terms(c: &mut ContainerStatus, terms: &Terms) {
    for state in [c.state.as_mut(), c.last_state.as_mut()]
        .into_iter()
        .flatten()
    {
        if let Some(w) = state.waiting.as_mut()
            && let Some(m) = w.message.as_mut()
        {
            *m = status_message(m, terms);
        }
        if let Some(t) = state.terminated.as_mut()
            && let Some(m) = t.message.as_mut()
        {
            *m = status_message(m, terms);
        }
    }
}

/// Does the tenant pod already show `wanted`? Compared field by field the syncer writes, so the
/// tenant's own additions (readiness gates from elsewhere) do not cause writes.
pub fn pod_status_differs(current: Option<&PodStatus>, wanted: &PodStatus) -> bool {
    let Some(current) = current else {
        return true;
    };
    type Cond = (String, String, Option<String>, Option<String>, Option<i64>);
    let conds = |s: &PodStatus| -> Vec<Cond> {
        let mut v: Vec<_> = s
            .conditions
            .iter()
            .flatten()
            .map(|c: &PodCondition| {
                (
                    c.type_.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                    c.message.clone(),
                    c.observed_generation,
                )
            })
            .collect();
        v.sort();
        v
    };
    current.phase != wanted.phase
        || current.pod_ip != wanted.pod_ip
        || current.pod_ips != wanted.pod_ips
        || current.host_ip != wanted.host_ip
        || current.container_statuses != wanted.container_statuses
        || current.init_container_statuses != wanted.init_container_statuses
        || current.ephemeral_container_statuses != wanted.ephemeral_container_statuses
        || current.reason != wanted.reason
        || current.message != wanted.message
        || current.observed_generation != wanted.observed_generation
        || conds(current) != conds(wanted)
}

/// The status a deleted pod whose copy is gone ends in, as a kubelet ends a deleted pod: `Failed`
/// unless it ended already, its containers that had not ended terminated. `None`: it has ended.
pub fn terminal_status(t: &Pod) -> Option<serde_json::Value> {
    let status = t.status.clone().unwrap_or_default();
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let ended = |list: Option<Vec<ContainerStatus>>| -> Option<Vec<ContainerStatus>> {
        list.map(|list| {
            list.into_iter()
                .map(|mut c| {
                    if c.state.as_ref().is_none_or(|s| s.terminated.is_none()) {
                        c.state = Some(ContainerState {
                            terminated: Some(ContainerStateTerminated {
                                exit_code: 137,
                                reason: Some("ContainerStatusUnknown".into()),
                                message: Some(
                                    "the pod was deleted and its host copy is gone".into(),
                                ),
                                ..Default::default()
                            }),
                            ..Default::default()
                        });
                        c.ready = false;
                        c.started = Some(false);
                    }
                    c
                })
                .collect()
        })
    };
    Some(json!({
        "phase": "Failed",
        "containerStatuses": ended(status.container_statuses),
        "initContainerStatuses": ended(status.init_container_statuses),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_statuses_show_only_the_node_disk_the_tenant_asked_for() {
        // As a kubelet reports the copy after `bound_disk`: c1 asked no disk, c2 its own.
        let host: PodStatus = serde_json::from_value(json!({"containerStatuses": [
            {"name": "c1", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
             "allocatedResources": {"cpu": "20m", "ephemeral-storage": "0"},
             "resources": {"requests": {"cpu": "20m", "ephemeral-storage": "0"},
                           "limits": {"ephemeral-storage": "16Gi"}}},
            {"name": "c2", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
             "allocatedResources": {"ephemeral-storage": "1Gi"},
             "resources": {"requests": {"ephemeral-storage": "1Gi"},
                           "limits": {"ephemeral-storage": "2Gi"}}}]}))
        .unwrap();
        let tenant: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {
            "containers": [
                {"name": "c1", "resources": {"requests": {"cpu": "20m"}}},
                {"name": "c2", "resources": {"requests": {"ephemeral-storage": "1Gi"},
                                             "limits": {"ephemeral-storage": "2Gi"}}}]}}))
        .unwrap();
        let mut wanted = host.clone();
        disk_as_asked(&mut wanted, &tenant);
        let statuses = wanted.container_statuses.unwrap();
        let c1 = serde_json::to_value(&statuses[0]).unwrap();
        assert_eq!(c1["allocatedResources"], json!({"cpu": "20m"}));
        assert_eq!(c1["resources"], json!({"requests": {"cpu": "20m"}}));
        assert_eq!(statuses[1], host.container_statuses.unwrap()[1]);
    }

    #[test]
    fn a_deleted_pod_ends_failed_unless_it_ended_already() {
        let pod = |status: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "w"}, "status": status})).unwrap()
        };
        let running = pod(json!({"phase": "Running", "containerStatuses": [
            {"name": "a", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
             "state": {"running": {}}},
            {"name": "b", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"terminated": {"exitCode": 0}}}]}));
        let ended = terminal_status(&running).unwrap();
        assert_eq!(ended["phase"], "Failed");
        let a = &ended["containerStatuses"][0];
        assert_eq!(a["state"]["terminated"]["exitCode"], 137);
        assert_eq!(a["ready"], false);
        let b = &ended["containerStatuses"][1];
        assert_eq!(
            b["state"]["terminated"]["exitCode"], 0,
            "an ended container keeps its end"
        );
        assert_eq!(terminal_status(&pod(json!({"phase": "Succeeded"}))), None);
        assert_eq!(terminal_status(&pod(json!({"phase": "Failed"}))), None);
        assert_eq!(terminal_status(&pod(json!({}))).unwrap()["phase"], "Failed");
    }
    use crate::tenant_terms::NOT_SHOWN;
    use serde_json::json;

    fn copy(word: &str) -> Option<crate::naming::Virtual> {
        crate::tenant_terms::plain_copy_name(word, "dev")
    }

    fn up(status: serde_json::Value) -> PodStatus {
        up_with(status, false)
    }

    fn up_with(status: serde_json::Value, node_addresses: bool) -> PodStatus {
        let host: Pod = serde_json::from_value(json!({"metadata": {"name": "web-x-default-x-dev"},
                                                      "status": status}))
        .unwrap();
        pod_status_up(
            &host,
            &Terms {
                host_namespace: "team-dev",
                namespace: "default",
                name: "web",
                copy: Box::new(copy),
                hidden_node: Box::new(|w| w == "pool-b-7"),
                address: Box::new(|_| true),
            },
            Some(&KubeletEndpoint {
                address: "10.96.0.42".into(),
                port: 10250,
            }),
            node_addresses,
            None,
        )
    }

    /// A copy at host generation `generation`, made from tenant generation `tenant`, whose
    /// kubelet observed host generation `seen`.
    fn copy_at(generation: i64, tenant: Option<i64>, seen: Option<i64>) -> Pod {
        let annotations = tenant.map(|t| json!({ANNOTATION_TENANT_GENERATION: t.to_string()}));
        serde_json::from_value(json!({
            "metadata": {"name": "web-x-default-x-dev", "generation": generation,
                         "annotations": annotations},
            "status": {"observedGeneration": seen, "conditions": [
                {"type": "Ready", "status": "True", "observedGeneration": seen},
                {"type": "PodScheduled", "status": "True"}]}
        }))
        .unwrap()
    }

    #[test]
    fn the_tenant_sees_its_own_generation_observed_once_the_kubelet_has_the_copys_spec() {
        // Tolerations changed in the tenant (generation 3): nothing of them goes down, so the
        // copy stays at host generation 1, observed, and carries tenant generation 3.
        assert_eq!(
            observed_generation(&copy_at(1, Some(3), Some(1)), Some(2)),
            Some(3)
        );
        // An image changed (tenant 4, host 2): the kubelet has not seen host generation 2 yet.
        assert_eq!(
            observed_generation(&copy_at(2, Some(4), Some(1)), Some(3)),
            Some(3)
        );
        assert_eq!(
            observed_generation(&copy_at(2, Some(4), Some(2)), Some(3)),
            Some(4)
        );
        // Never backwards, and nothing made up for a copy without the mark or a kubelet.
        assert_eq!(
            observed_generation(&copy_at(1, Some(2), Some(1)), Some(5)),
            Some(5)
        );
        assert_eq!(
            observed_generation(&copy_at(1, None, Some(1)), Some(2)),
            Some(2)
        );
        assert_eq!(observed_generation(&copy_at(1, Some(2), None), None), None);
    }

    #[test]
    fn conditions_show_tenant_generations_and_a_new_one_is_written_up() {
        let terms = Terms {
            host_namespace: "team-dev",
            namespace: "default",
            name: "web",
            copy: Box::new(copy),
            hidden_node: Box::new(|_| false),
            address: Box::new(|_| true),
        };
        let status = |h: &Pod, observed| pod_status_up(h, &terms, None, false, observed);
        let before = status(&copy_at(1, Some(1), Some(1)), None);
        assert_eq!(before.observed_generation, Some(1));
        let after = status(&copy_at(1, Some(2), Some(1)), Some(1));
        assert_eq!(after.observed_generation, Some(2));
        let conds = after.conditions.as_ref().unwrap();
        assert_eq!(conds[0].observed_generation, Some(2), "{conds:?}");
        assert_eq!(conds[1].observed_generation, None, "{conds:?}");
        assert!(pod_status_differs(Some(&before), &after));
        // The kubelet behind: the tenant keeps what it showed, conditions too.
        let behind = status(&copy_at(2, Some(3), Some(1)), Some(2));
        assert_eq!(behind.observed_generation, Some(2));
        assert_eq!(
            behind.conditions.as_ref().unwrap()[0].observed_generation,
            Some(2)
        );
    }

    #[test]
    fn an_unschedulable_copy_says_it_waits_without_the_host_inventory() {
        let s = up(json!({
            "phase": "Pending", "nominatedNodeName": "pool-b-7", "qosClass": "Burstable",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."}]
        }));
        let c = &s.conditions.as_ref().unwrap()[0];
        assert_eq!(c.reason.as_deref(), Some("Unschedulable"));
        assert_eq!(
            c.message.as_deref(),
            Some(
                "Waiting for room on the nodes this cluster may use: none of them can take the pod now."
            )
        );
        assert_eq!(s.nominated_node_name, None);
        assert_eq!(s.qos_class, None);
    }

    #[test]
    fn messages_name_the_tenants_objects_and_no_hidden_node() {
        let s = up(json!({
            "phase": "Failed", "reason": "NodeLost",
            "message": "Node pool-b-7 which was running pod web-x-default-x-dev is unresponsive",
            "conditions": [{"type": "Ready", "status": "False", "reason": "PodFailed",
                            "message": "pod team-dev/web-x-default-x-dev failed"},
                           {"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "c", "ready": false, "restartCount": 0, "image": "a", "imageID": "",
                "state": {"waiting": {"reason": "CreateContainerConfigError",
                                      "message": "secret \"creds-x-default-x-dev\" not found"}},
                "lastState": {"terminated": {"exitCode": 1, "message": "ran on pool-b-7"}}}]
        }));
        assert_eq!(s.message.as_deref(), Some(NOT_SHOWN));
        let conds = s.conditions.as_ref().unwrap();
        assert_eq!(conds[0].message.as_deref(), Some("pod default/web failed"));
        assert_eq!(conds[1].message, None, "a scheduled pod keeps no message");
        let c = &s.container_statuses.as_ref().unwrap()[0];
        let waiting = c.state.as_ref().unwrap().waiting.as_ref().unwrap();
        assert_eq!(
            waiting.message.as_deref(),
            Some("secret \"creds\" not found")
        );
        let last = c.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(last.message.as_deref(), Some(NOT_SHOWN));
    }

    #[test]
    fn a_new_message_is_written_up() {
        let before =
            up(json!({"conditions": [{"type": "Ready", "status": "False", "message": "a"}]}));
        let after =
            up(json!({"conditions": [{"type": "Ready", "status": "False", "message": "b"}]}));
        assert!(pod_status_differs(Some(&before), &after));
        assert!(!pod_status_differs(Some(&after), &after));
        assert!(pod_status_differs(None, &after));
    }

    #[test]
    fn an_ephemeral_container_that_starts_is_written_up() {
        let status = |state: serde_json::Value| {
            up(
                json!({"ephemeralContainerStatuses": [{"name": "dbg", "image": "busybox",
                "imageID": "", "ready": false, "restartCount": 0, "state": state}]}),
            )
        };
        let creating = status(json!({"waiting": {"reason": "ContainerCreating"}}));
        let running = status(json!({"running": {"startedAt": "2026-12-03T00:00:00Z"}}));
        assert!(pod_status_differs(Some(&creating), &running));
        assert!(!pod_status_differs(Some(&running), &running));
    }

    #[test]
    fn conditions_only_the_tenant_writes_stay() {
        let mut wanted = up(json!({"conditions": [{"type": "Ready", "status": "True"}]}));
        let tenant: Pod = serde_json::from_value(json!({
            "spec": {"containers": [], "readinessGates": [{"conditionType": "example.com/lb"}]},
            "status": {"conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},
                {"type": "example.com/lb", "status": "True"},
                // The kubelet's, shown while the copy had it; gone from the copy, gone here.
                {"type": "PodResizeInProgress", "status": "True"}
            ]}
        }))
        .unwrap();
        keep_tenant_conditions(&mut wanted, &tenant);
        let kinds: Vec<(String, String)> = wanted
            .conditions
            .unwrap()
            .into_iter()
            .map(|c| (c.type_, c.status))
            .collect();
        assert_eq!(
            kinds,
            [
                ("Ready".to_string(), "True".to_string()),
                ("DisruptionTarget".to_string(), "True".to_string()),
                ("example.com/lb".to_string(), "True".to_string())
            ],
            "the host's win for its types; the tenant's own stay"
        );
    }

    #[test]
    fn a_pod_shows_its_virtual_nodes_address_not_the_host_nodes() {
        let s = up(
            json!({"hostIP": "10.0.0.5", "hostIPs": [{"ip": "10.0.0.5"}], "podIP": "10.244.0.7"}),
        );
        assert_eq!(s.host_ip.as_deref(), Some("10.96.0.42"));
        assert_eq!(s.host_ips.unwrap()[0].ip, "10.96.0.42");
        assert_eq!(s.pod_ip.as_deref(), Some("10.244.0.7"));
        // A profile that shows node addresses shows the host node's.
        let shown = up_with(
            json!({"hostIP": "10.0.0.5", "hostIPs": [{"ip": "10.0.0.5"}]}),
            true,
        );
        assert_eq!(shown.host_ip.as_deref(), Some("10.0.0.5"));
        assert_eq!(shown.host_ips.unwrap()[0].ip, "10.0.0.5");
    }
}
