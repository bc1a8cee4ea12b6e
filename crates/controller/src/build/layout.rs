//! The control-plane pod's layout, shared by every distribution's pod and the agent beside it:
//! where the datastore, the PKI and the configuration are mounted, the volumes they come from,
//! the user everything runs as and its read-only root, and what the pod asks of the quota.
//! `control_plane` puts the pod together from these and `k3s` or `kubernetes`; they sit above
//! this module and it names none of them.

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, SecretVolumeSource, SecurityContext, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::pod;
use crate::names;

/// Where the tenant's control plane gets its address: the cluster IP of its API Service, and the
/// host's service range that holds it (the tenant's Services carry their host copies' IPs, so the
/// tenant allocates from the same range).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Addressing {
    /// The cluster IP of the tenant's API Service.
    pub api_ip: String,
    /// The host's Service range that holds it, which the tenant allocates from too.
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
/// The folder of kine's database on the claim.
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
/// The memory the control plane requests of the tenant's quota.
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
