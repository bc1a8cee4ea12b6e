//! A tenant's control plane as a StatefulSet, whichever distribution runs it: the parts both
//! share (the data claim, the PKI Secret, placement for the local runtime) around the pod, which
//! [`super::k3s`] and [`super::kubernetes`] each build from [`super::layout`].

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PodSpec, PodTemplateSpec, Secret, Toleration,
    Volume, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tenantplane_api::{Distribution, TenantCluster};

use super::BuildOptions;
use super::layout::{
    ANNOTATION_CONFIG_DIGEST, Addressing, CONFIG_VOLUME, DATA_VOLUME_SIZE, PKI_VOLUME, Pod,
    RUN_AS_USER, SIDECAR, secret_volume,
};
use super::meta::{identity, match_labels, owned_metadata};
use super::pod;
use crate::tenant_pki::TenantPki;
use crate::{Error, names};

/// The images tenant `tc`'s control plane runs, as one line for events and messages.
pub fn images(tc: &TenantCluster, options: &BuildOptions) -> Vec<String> {
    match tc.spec.control_plane.distribution {
        Distribution::K3s => vec![super::k3s::control_plane_image(tc, options)],
        Distribution::Kubernetes => super::kubernetes::images(tc, options),
    }
}

/// The Kubernetes version a control-plane pod runs, read from its server's image tag
/// (`rancher/k3s:v1.30.4-k3s1`, `registry.k8s.io/kube-apiserver:v1.36.3`); `None` for an image
/// whose tag is not a version (a pinned `controlPlane.image`).
pub fn running_version(pod: &k8s_openapi::api::core::v1::Pod) -> Option<String> {
    let image = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == "k3s" || c.name == "kube-apiserver")?
        .image
        .as_deref()?;
    let tag = image.rsplit_once(':')?.1;
    let version = tag.split('-').next()?;
    let parts: Vec<&str> = version.trim_start_matches('v').split('.').collect();
    (version.starts_with('v')
        && parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())))
    .then(|| version.to_string())
}

/// The snapshot agent's image for a control-plane pod, if it runs one: the operator's own. With
/// the local runtime (tests, the dev cluster), a pod it stands in for runs the agent as a process
/// of this build instead, and a pod the real node runs pulls the image the test world builds from
/// this binary (testenv/agent-image.sh).
pub fn agent_image(options: &BuildOptions) -> Option<&str> {
    options.agent_image.as_deref()
}

/// The StatefulSet of tenant `tc`'s control plane. Its pod passes Pod Security `restricted`:
/// non-root, no privilege escalation, no capabilities, RuntimeDefault seccomp, a read-only root,
/// no service-account token.
pub fn desired_statefulset(
    tc: &TenantCluster,
    addressing: &Addressing,
    options: &BuildOptions,
    config_digest: &str,
) -> Result<StatefulSet, Error> {
    let (tenant, ns) = identity(tc)?;
    let distribution = tc.spec.control_plane.distribution;
    let Pod {
        init_containers,
        mut containers,
        mut volumes,
    } = match distribution {
        Distribution::K3s => super::k3s::pod(tc, &tenant, &ns, addressing, options),
        Distribution::Kubernetes => super::kubernetes::pod(tc, &tenant, addressing, options),
    };
    // The local runtime stands in for k3s only; a `kubernetes` pod runs on a real node as written.
    let local = options.local_runtime && distribution == Distribution::K3s;
    let mut init_containers = init_containers;
    if let Some(image) = agent_image(options) {
        let (agent, scratch) = super::agent::container(image);
        containers.push(agent);
        volumes.push(scratch);
        // A restore accepted for this tenant: the pod puts it in place before kine starts (once;
        // the mark it leaves lets later starts go straight on). Before the first sidecar, then:
        // in a `kubernetes` pod kine is one, started in order with the init containers, and a
        // kine already running would keep the file the restore replaces open.
        if let Some(id) = tc
            .status
            .as_ref()
            .and_then(|s| s.restore.as_ref()?.id.as_deref())
        {
            let first_sidecar = init_containers
                .iter()
                .position(|c| c.restart_policy.as_deref() == Some(SIDECAR))
                .unwrap_or(init_containers.len());
            init_containers.insert(first_sidecar, super::agent::restore_container(image, id));
        }
    }
    let mut pod_labels = names::labels(&tenant);
    pod_labels.extend(names::control_plane_selector(&tenant));
    if local {
        pod_labels.insert(names::LABEL_RUNTIME.into(), names::RUNTIME_LOCAL.into());
    }
    let annotations = BTreeMap::from([(
        ANNOTATION_CONFIG_DIGEST.to_string(),
        config_digest.to_string(),
    )]);
    let mut all_volumes = vec![
        secret_volume(PKI_VOLUME, &names::pki_secret(&tenant)),
        Volume {
            name: CONFIG_VOLUME.into(),
            config_map: Some(k8s_openapi::api::core::v1::ConfigMapVolumeSource {
                name: names::control_plane_config(&tenant),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    all_volumes.extend(volumes);
    Ok(StatefulSet {
        metadata: owned_metadata(tc, names::statefulset(&tenant))?,
        spec: Some(StatefulSetSpec {
            service_name: Some(names::headless_service(&tenant)),
            replicas: Some(tc.spec.control_plane.replicas),
            pod_management_policy: Some("Parallel".into()),
            // The datastore goes with the tenant (the finalizer deletes it too, for claims made
            // before this policy); scaling down keeps it.
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some("Delete".into()),
                    when_scaled: Some("Retain".into()),
                },
            ),
            selector: match_labels(names::control_plane_selector(&tenant)),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(annotations),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    security_context: Some(pod::restricted_pod(RUN_AS_USER)),
                    init_containers: (!init_containers.is_empty()).then_some(init_containers),
                    containers,
                    volumes: Some(all_volumes),
                    node_selector: local_runtime_node_selector(local),
                    tolerations: local_runtime_tolerations(local),
                    ..Default::default()
                }),
            },
            volume_claim_templates: Some(vec![data_claim_template()]),
            ..Default::default()
        }),
        status: None,
    })
}

/// The local runtime's pods go to the simulated node it stands behind (tests and the dev cluster
/// only; a real pod goes wherever the scheduler puts it).
fn local_runtime_node_selector(local: bool) -> Option<BTreeMap<String, String>> {
    let (key, value) = names::LOCAL_RUNTIME_NODE_LABEL;
    local.then(|| BTreeMap::from([(key.to_string(), value.to_string())]))
}

fn local_runtime_tolerations(local: bool) -> Option<Vec<Toleration>> {
    local.then(|| {
        vec![Toleration {
            key: Some(names::SIMULATED_NODE_TAINT.into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }]
    })
}

/// The claim of each control-plane pod for its sqlite datastore.
fn data_claim_template() -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(names::DATA_VOLUME.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some([("storage".into(), Quantity(DATA_VOLUME_SIZE.into()))].into()),
                limits: None,
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// The PKI Secret for a freshly generated PKI. Created once, never overwritten.
pub fn pki_secret(tc: &TenantCluster, pki: &TenantPki) -> Result<Secret, Error> {
    let (tenant, _) = identity(tc)?;
    Ok(Secret {
        metadata: owned_metadata(tc, names::pki_secret(&tenant))?,
        type_: Some("Opaque".into()),
        data: Some(pki.to_secret_data()),
        ..Default::default()
    })
}
