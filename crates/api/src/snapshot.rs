//! Snapshots: `SnapshotStore` (cluster-scoped, where snapshots go: an S3-compatible bucket) and
//! `TenantSnapshot` (namespaced, one consistent copy of a tenant's datastore in a store).
//!
//! A snapshot is not owned by its TenantCluster: it outlives the tenant, and deleting it deletes
//! the stored object (behind a finalizer). The store's credentials live in a Secret in the
//! operator's namespace, never in a tenant's.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::conditions::conditions_schema;
use crate::string_enum;

/// The condition a SnapshotStore reports: the operator wrote, read and deleted a probe object.
pub const STORE_AVAILABLE: &str = "Available";

/// Where snapshots are kept: a bucket (and a prefix in it) of an S3-compatible object store.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "tenantplane.io",
    version = "v1alpha1",
    kind = "SnapshotStore",
    plural = "snapshotstores",
    shortname = "sstore",
    status = "SnapshotStoreStatus",
    derive = "PartialEq",
    doc = "An S3-compatible bucket where the operator keeps TenantSnapshots.",
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".spec.s3.endpoint"}"#,
    printcolumn = r#"{"name":"Bucket","type":"string","jsonPath":".spec.s3.bucket"}"#,
    printcolumn = r#"{"name":"Default","type":"boolean","jsonPath":".spec.default"}"#,
    printcolumn = r#"{"name":"Available","type":"string","jsonPath":".status.conditions[?(@.type==\"Available\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStoreSpec {
    /// The bucket and how to reach it.
    pub s3: S3Location,

    /// The Secret, in the operator's namespace, with the keys `accessKeyId` and
    /// `secretAccessKey`. It never leaves that namespace: the operator moves the bytes.
    pub credentials_secret_ref: SecretRef,

    /// Use this store for snapshots that name none (`TenantSnapshot.spec.storeRef` unset, and a
    /// TenantCluster's `spec.snapshots` without a `storeRef`). At most one store is the default.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,

    /// Encrypt snapshots as they are stored (ChaCha20-Poly1305), with a key kept in the operator's
    /// namespace. A lost key is a lost snapshot: nothing reads it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<StoreEncryption>,
}

/// A store's snapshot key.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StoreEncryption {
    /// The Secret, in the operator's namespace, whose key `key` holds 32 random bytes in base64
    /// (`head -c 32 /dev/urandom | base64`). Keep a copy elsewhere: snapshots made with it are
    /// read with it alone.
    pub key_secret_ref: SecretRef,
}

/// An S3-compatible bucket.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct S3Location {
    /// The store's URL, such as `https://s3.eu-west-1.amazonaws.com` or
    /// `http://seaweedfs.storage.svc:8333`. Buckets are addressed by path.
    #[schemars(length(max = 2048))]
    #[x_kube(validation = crate::rules::http_url("s3.endpoint"))]
    pub endpoint: String,

    /// The bucket. It must exist; the operator does not create buckets.
    #[schemars(length(min = 3, max = 63))]
    pub bucket: String,

    /// A folder in the bucket under which every snapshot of this store goes, such as
    /// `tenantplane/`. Empty: the bucket's root.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 512))]
    pub prefix: String,

    /// The region the requests are signed for; stores that do not care accept the default.
    #[serde(default = "default_region")]
    #[schemars(length(max = 64))]
    pub region: String,

    /// PEM certificates the store's TLS certificate must chain to, when it is not signed by a
    /// public CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub ca_bundle: Option<String>,
}

fn default_region() -> String {
    "us-east-1".to_string()
}

/// A Secret by name (in the operator's namespace).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct SecretRef {
    /// Name of the Secret, in the operator's namespace.
    #[schemars(length(max = 253))]
    #[x_kube(validation = crate::rules::object_name("the Secret"))]
    pub name: String,
}

/// Whether the operator can use the store.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStoreStatus {
    /// `Available`: True once the operator wrote, read back and deleted a probe object; False
    /// with the store's own error when it could not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,

    /// When the operator last checked the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checked: Option<Time>,

    /// The spec generation the last check used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

string_enum! {
    /// Where a snapshot stands.
    pub enum SnapshotPhase ("status.phase", default = Pending) {
        /// Waiting for the tenant to be Ready.
        Pending = "Pending",
        /// The copy is being taken and uploaded.
        Running = "Running",
        /// The copy is in the store, whole.
        Completed = "Completed",
        /// The copy was given up; `status.message` says why.
        Failed = "Failed",
    }
}

/// One consistent copy of a tenant's datastore, kept in a SnapshotStore.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "tenantplane.io",
    version = "v1alpha1",
    kind = "TenantSnapshot",
    plural = "tenantsnapshots",
    shortname = "tsnap",
    namespaced,
    status = "TenantSnapshotStatus",
    derive = "PartialEq",
    doc = "A consistent copy of one TenantCluster's datastore in a SnapshotStore.",
    printcolumn = r#"{"name":"Tenant","type":"string","jsonPath":".spec.tenantClusterRef.name"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".status.size"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.kubernetesVersion"}"#,
    printcolumn = r#"{"name":"Store","type":"string","jsonPath":".status.store"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = crate::rules::immutable("spec"))]
#[serde(rename_all = "camelCase")]
pub struct TenantSnapshotSpec {
    /// The TenantCluster to copy, in this namespace.
    pub tenant_cluster_ref: LocalRef,

    /// The SnapshotStore to keep it in; unset, the store marked `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_ref: Option<LocalRef>,
}

/// An object by name.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct LocalRef {
    /// Name of the object.
    #[schemars(length(max = 253))]
    #[x_kube(validation = crate::rules::object_name("the name"))]
    pub name: String,
}

/// What the copy holds and where it went.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TenantSnapshotStatus {
    /// Pending, Running, Completed or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SnapshotPhase>,

    /// The store it went to (the default store's name when the spec named none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,

    /// Where the copy is: `s3://<bucket>/<key>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,

    /// The copy's size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,

    /// `sha256:<hex>` of the stored bytes; a restore checks it before it touches anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,

    /// The Kubernetes version the tenant's API server reported when it was copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,

    /// The store key that encrypted it (a digest of the key, not the key), if it is encrypted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,

    /// The tenant's distribution (`k3s` or `kubernetes`) when it was copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distribution: Option<String>,

    /// When the copy began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When it completed or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,

    /// Why it failed, or what it waits for, in the words of whatever refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl TenantSnapshot {
    /// Where it stands (Pending until the operator first writes status).
    pub fn phase(&self) -> SnapshotPhase {
        self.status
            .as_ref()
            .and_then(|s| s.phase)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::admission_errors;
    use kube::CustomResourceExt;
    use serde_json::json;

    fn store(endpoint: &str) -> serde_json::Value {
        json!({
            "apiVersion": "tenantplane.io/v1alpha1", "kind": "SnapshotStore",
            "metadata": {"name": "s"},
            "spec": {"s3": {"endpoint": endpoint, "bucket": "snaps"},
                     "credentialsSecretRef": {"name": "creds"}}
        })
    }

    #[test]
    fn a_store_endpoint_is_an_http_or_https_url() {
        let crd = SnapshotStore::crd();
        for ok in [
            "http://127.0.0.1:8333",
            "https://s3.eu-west-1.amazonaws.com",
        ] {
            assert_eq!(
                admission_errors(&crd, &store(ok), None).unwrap(),
                Vec::<String>::new()
            );
        }
        let errors = admission_errors(&crd, &store("s3.example.com"), None).unwrap();
        assert_eq!(
            errors,
            [
                "s3.endpoint must be an http:// or https:// URL such as https://s3.example.com; got s3.example.com"
            ]
        );
    }

    #[test]
    fn a_snapshots_spec_cannot_change() {
        let crd = TenantSnapshot::crd();
        let snap = |tenant: &str| {
            json!({
                "apiVersion": "tenantplane.io/v1alpha1", "kind": "TenantSnapshot",
                "metadata": {"name": "s", "namespace": "team-dev"},
                "spec": {"tenantClusterRef": {"name": tenant}}
            })
        };
        assert!(
            admission_errors(&crd, &snap("dev"), Some(&snap("dev")))
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            admission_errors(&crd, &snap("other"), Some(&snap("dev"))).unwrap(),
            ["spec is immutable: create a new object instead"]
        );
    }
}
