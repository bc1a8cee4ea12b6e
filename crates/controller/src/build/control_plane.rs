//! A tenant's control plane as a StatefulSet, whichever distribution runs it: the parts both
//! share (the data claim and where it is mounted, the PKI Secret, the scratch folders, the
//! restricted security context, placement for the local runtime) and the choice of pod, which
//! [`super::k3s`] and [`super::kubernetes`] each build.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
};
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PodSpec, PodTemplateSpec, Secret, SecretVolumeSource, SecurityContext, Toleration, Volume,
    VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tenantplane_api::{Distribution, TenantCluster};

use super::BuildOptions;
use super::meta::{identity, match_labels, owned_metadata};
use super::pod;
use crate::tenant_pki::TenantPki;
use crate::{Error, names};

/// Where the tenant's control plane gets its address: the cluster IP of its API Service, and the
/// host's service range that holds it (the tenant's Services carry their host copies' IPs, so the
/// tenant allocates from the same range).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Addressing {
    pub api_ip: String,
    pub service_cidr: String,
}

/// The pod template annotation that carries a digest of the API server's configuration files,
/// which it reads only when it starts: when they change, the template changes with them and the
/// StatefulSet rolls the pod onto them. (Certificates need no roll: kube-apiserver and the
/// controller manager reload the files they name when the Secret's volume changes.)
pub const ANNOTATION_CONFIG_DIGEST: &str = "tenantplane.io/config-digest";

/// The datastore's claim is mounted here by every distribution (k3s's data directory), so a
/// tenant that changes distribution keeps its database (`server/db/state.db`, kine's sqlite).
pub const DATA_DIR: &str = "/var/lib/rancher/k3s";
/// The folder of kine's database, which kine (or k3s) makes on the claim; a macro, so that
/// `DATABASE` is built from it at compile time instead of spelling the path twice.
macro_rules! database_dir {
    () => {
        "/var/lib/rancher/k3s/server/db"
    };
}
pub const DATABASE_DIR: &str = database_dir!();
/// kine's sqlite database on the claim, where k3s keeps it.
pub const DATABASE: &str = concat!(database_dir!(), "/state.db");
/// An init container's restart policy that makes it a sidecar (Kubernetes 1.29 and later).
pub const SIDECAR: &str = "Always";
/// The PKI Secret is mounted here.
pub const PKI_MOUNT: &str = "/etc/tenantplane/pki";
/// The API server's configuration files (a ConfigMap) are mounted here.
pub const CONFIG_MOUNT: &str = "/etc/tenantplane/config";
/// Size of the sqlite volume: the API's, whose storage caps must hold it.
pub const DATA_VOLUME_SIZE: &str = tenantplane_api::tenant_cluster::CONTROL_PLANE_DATA_SIZE;
/// Every container of the control plane runs as this unprivileged user; without an agent or a
/// kubelet of its own it needs no root.
pub const RUN_AS_USER: i64 = 10001;

/// What the control plane requests of the tenant's quota (an agentless k3s server's need; the
/// `kubernetes` distribution's three containers share the same).
pub const CONTROL_PLANE_CPU_REQUEST: &str = "250m";
pub const CONTROL_PLANE_MEMORY_REQUEST: &str = "512Mi";

/// Where sqlite puts its temporary files, in kine and in k3s (which embeds kine): the database's
/// own folder on the claim. The root filesystem is read-only; without a writable folder, a write
/// that needs a temporary file (a statement journal past the 64 KiB sqlite keeps in memory, for
/// one) fails with "disk I/O error", which kine answers as a failed compare, and the API server
/// retries that write forever (measured on real nodes: thousands of failed writes a second, none
/// landing, the tenant never Ready again, in about half the runs under load). `/tmp` would
/// serve, but it is a small emptyDir whose limit evicts the pod, and kine's start-up VACUUM
/// copies the whole database into the temporary folder; on the claim it shares the database's
/// room, and a full claim fails the VACUUM (which kine then skips) instead of evicting the control
/// plane. sqlite unlinks each temporary file as it opens it, so none is ever seen in the folder.
pub(super) fn sqlite_temp_dir() -> EnvVar {
    EnvVar {
        name: "SQLITE_TMPDIR".into(),
        value: Some(DATABASE_DIR.into()),
        value_from: None,
    }
}

pub(super) const PKI_VOLUME: &str = "pki";
pub(super) const CONFIG_VOLUME: &str = "config";
pub(super) const TMP_VOLUME: &str = "tmp";

/// The containers and volumes of one distribution's pod.
pub(super) struct Pod {
    pub init_containers: Vec<Container>,
    pub containers: Vec<Container>,
    /// Beside the PKI Secret and the configuration, which every pod has.
    pub volumes: Vec<Volume>,
}

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

/// Every container's security context: `restricted`, as the control plane's user, on a
/// read-only root: every place a component writes is a volume.
pub(super) fn security_context() -> SecurityContext {
    SecurityContext {
        read_only_root_filesystem: Some(true),
        ..pod::restricted_container(RUN_AS_USER)
    }
}

/// A Secret's files, readable by their owner only (and the pod's group, as the kubelet gives it).
pub(super) fn secret_volume(name: &str, secret: &str) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            default_mode: Some(0o400),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A folder of the pod's own, gone with it, at most `size`.
pub(super) fn scratch_volume(name: &str, size: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity(size.into())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `volume` at `path`, writable.
pub(super) fn mount(volume: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: volume.into(),
        mount_path: path.into(),
        ..Default::default()
    }
}

/// `volume` at `path`, read-only.
pub(super) fn read_only_mount(volume: &str, path: &str) -> VolumeMount {
    VolumeMount {
        read_only: Some(true),
        ..mount(volume, path)
    }
}

/// The datastore volume, at [`DATA_DIR`].
pub(super) fn data_mount() -> VolumeMount {
    mount(names::DATA_VOLUME, DATA_DIR)
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
