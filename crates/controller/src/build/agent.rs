//! The snapshot agent's container in every control-plane pod, whichever the distribution: our
//! own binary beside kine, with the data claim (to copy the database), the PKI (its TLS) and a
//! scratch folder for copies. See `crate::snapshot::agent`.

use k8s_openapi::api::core::v1::{Container, ContainerPort, ResourceRequirements, Volume};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::layout::{
    DATA_VOLUME_SIZE, DATABASE, PKI_MOUNT, PKI_VOLUME, data_mount, mount, read_only_mount,
    scratch_volume, security_context,
};
use crate::names;

/// The snapshot agent's container.
pub const CONTAINER: &str = "snapshot-agent";
/// The init container that puts a restore in place before the datastore starts.
pub const RESTORE_CONTAINER: &str = "snapshot-restore";
const SCRATCH_VOLUME: &str = "snapshots";
/// Where copies are made before they are sent; as large as the data claim, the largest copy.
pub const SCRATCH: &str = "/var/lib/tenantplane/snapshots";

/// The agent's arguments (the local runtime reads them back from the pod).
pub fn args(restore: Option<&str>) -> Vec<String> {
    let mut args = vec![
        "agent".to_string(),
        format!("--listen=0.0.0.0:{}", names::AGENT_PORT),
        format!("--database={DATABASE}"),
        format!("--pki={PKI_MOUNT}"),
        format!("--scratch={SCRATCH}"),
    ];
    if let Some(id) = restore {
        args.push(format!("--restore={id}"));
    }
    args
}

/// Does this control-plane pod run the agent?
pub fn runs_in(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .any(|c| c.name == CONTAINER)
}

/// The restore this pod's init container waits for, if it has one.
pub fn pending_restore(pod: &k8s_openapi::api::core::v1::Pod) -> Option<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| c.name == RESTORE_CONTAINER)
        .flat_map(|c| c.args.iter().flatten())
        .find_map(|a| a.strip_prefix("--restore=").map(str::to_string))
}

/// The init container that waits for restore `id`, puts it in place and exits (at once when
/// the pod starts again with it already in place). It is the agent, with the same mounts.
pub fn restore_container(image: &str, id: &str) -> Container {
    let (mut container, _) = container(image);
    container.name = RESTORE_CONTAINER.into();
    container.args = Some(args(Some(id)));
    container
}

/// The agent container and the scratch volume it needs.
pub fn container(image: &str) -> (Container, Volume) {
    let container = Container {
        name: CONTAINER.into(),
        image: Some(image.into()),
        command: Some(vec![names::AGENT_COMMAND.into()]),
        args: Some(args(None)),
        ports: Some(vec![ContainerPort {
            name: Some("agent".into()),
            container_port: names::AGENT_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        // It idles between snapshots; a copy is a stream through 256 KiB buffers and sqlite's
        // page cache, whatever the database's size.
        resources: Some(ResourceRequirements {
            requests: Some(
                [
                    ("cpu".to_string(), Quantity("10m".into())),
                    ("memory".to_string(), Quantity("16Mi".into())),
                ]
                .into(),
            ),
            limits: Some([("memory".to_string(), Quantity("128Mi".into()))].into()),
            claims: None,
        }),
        volume_mounts: Some(vec![
            data_mount(),
            read_only_mount(PKI_VOLUME, PKI_MOUNT),
            mount(SCRATCH_VOLUME, SCRATCH),
        ]),
        security_context: Some(security_context()),
        ..Default::default()
    };
    (container, scratch_volume(SCRATCH_VOLUME, DATA_VOLUME_SIZE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::BuildOptions;
    use crate::build::fixtures::{kubernetes_tenant, pod_spec as pod, tenant};

    #[test]
    fn every_distribution_runs_the_agent_beside_its_datastore_restricted() {
        for tc in [tenant(), kubernetes_tenant()] {
            let spec = pod(&tc, &BuildOptions::default());
            let agent = spec
                .containers
                .iter()
                .find(|c| c.name == CONTAINER)
                .unwrap_or_else(|| panic!("no agent in {:?}", tc.spec.control_plane.distribution));
            assert_eq!(agent.image.as_deref(), Some(names::DEFAULT_AGENT_IMAGE));
            assert_eq!(
                agent.command.as_deref(),
                Some(&[names::AGENT_COMMAND.to_string()][..])
            );
            let args = agent.args.clone().unwrap();
            assert_eq!(args[0], "agent");
            assert!(args.contains(&format!("--database={DATABASE}")), "{args:?}");
            assert!(args.contains(&format!("--pki={PKI_MOUNT}")), "{args:?}");
            assert_eq!(
                agent.ports.as_ref().unwrap()[0].container_port,
                names::AGENT_PORT
            );
            let sc = agent.security_context.as_ref().unwrap();
            assert_eq!(sc.read_only_root_filesystem, Some(true));
            assert_eq!(sc.allow_privilege_escalation, Some(false));
            let mounts: Vec<(&str, &str, bool)> = agent
                .volume_mounts
                .iter()
                .flatten()
                .map(|m| {
                    (
                        m.name.as_str(),
                        m.mount_path.as_str(),
                        m.read_only == Some(true),
                    )
                })
                .collect();
            assert_eq!(
                mounts,
                [
                    (names::DATA_VOLUME, super::super::layout::DATA_DIR, false),
                    (PKI_VOLUME, PKI_MOUNT, true),
                    (SCRATCH_VOLUME, SCRATCH, false),
                ]
            );
            // Its scratch folder holds one copy of the database at most.
            let scratch = spec
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == SCRATCH_VOLUME)
                .unwrap();
            assert_eq!(
                scratch.empty_dir.as_ref().unwrap().size_limit,
                Some(Quantity(DATA_VOLUME_SIZE.into()))
            );
            // Small, and never BestEffort.
            let r = agent.resources.as_ref().unwrap();
            assert!(r.requests.is_some() && r.limits.is_some());
        }
    }

    #[test]
    fn a_restore_is_in_place_before_the_datastore_opens_it() {
        for mut tc in [tenant(), kubernetes_tenant()] {
            let restore = serde_json::json!({"restore": {"snapshot": "team/first", "id": "r-1"}});
            tc.status = Some(serde_json::from_value(restore).unwrap());
            let spec = pod(&tc, &BuildOptions::default());
            let init: Vec<&Container> = spec.init_containers.iter().flatten().collect();
            let at = init
                .iter()
                .position(|c| c.name == RESTORE_CONTAINER)
                .unwrap_or_else(|| panic!("no restore step in {init:?}"));
            assert_eq!(
                pending_restore(&k8s_openapi::api::core::v1::Pod {
                    spec: Some(spec.clone()),
                    ..Default::default()
                })
                .as_deref(),
                Some("r-1")
            );
            // No sidecar (kine in a `kubernetes` pod) starts before it: one that had opened the
            // old file would go on with it.
            assert!(
                init[..at]
                    .iter()
                    .all(|c| c.restart_policy.as_deref() != Some(super::super::layout::SIDECAR)),
                "{:?}",
                init.iter().map(|c| &c.name).collect::<Vec<_>>()
            );
            let kine_first = init.iter().position(|c| c.name == "kine");
            assert!(kine_first.is_none_or(|k| k > at));
        }
    }

    #[test]
    fn the_local_runtime_keeps_the_agent_for_pods_the_real_node_runs() {
        // A pod the local runtime stands in for runs the agent as a process of this build; one
        // the real node runs pulls the operator's image (the test world builds it).
        let options = BuildOptions {
            local_runtime: true,
            ..Default::default()
        };
        for tc in [tenant(), kubernetes_tenant()] {
            assert!(
                pod(&tc, &options)
                    .containers
                    .iter()
                    .any(|c| c.name == CONTAINER)
            );
        }
    }

    #[test]
    fn without_an_agent_image_there_is_no_agent() {
        let options = BuildOptions {
            agent_image: None,
            ..Default::default()
        };
        let spec = pod(&tenant(), &options);
        assert!(spec.containers.iter().all(|c| c.name != CONTAINER));
        assert!(
            spec.volumes
                .iter()
                .flatten()
                .all(|v| v.name != SCRATCH_VOLUME)
        );
    }

    #[test]
    fn a_restore_is_a_flag() {
        assert!(args(Some("r-1")).contains(&"--restore=r-1".to_string()));
        assert!(!args(None).iter().any(|a| a.starts_with("--restore")));
    }
}
