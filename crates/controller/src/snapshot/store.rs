//! A SnapshotStore as the operator uses it: an S3 client for its bucket, built from the store's
//! spec and the credentials Secret in the operator's namespace, and the layout of snapshots in it.
//!
//! Each snapshot is two objects under `<prefix><namespace>/<tenant>/`: `<snapshot>-<uid>.db`, the
//! database's bytes, and `<snapshot>-<uid>.json`, a manifest written once the bytes are complete
//! (their size, SHA-256, the tenant's version and distribution). A data object without a
//! manifest is an upload that did not finish.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Secret;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, Certificate, ClientOptions, ObjectStore, ObjectStoreExt, PutPayload,
    RetryConfig, WriteMultipart,
};
use serde::{Deserialize, Serialize};
use tenantplane_api::snapshot::SnapshotStoreSpec;

use super::copy::Hasher;
use crate::error_chain;

/// The credentials Secret's keys.
pub const ACCESS_KEY_ID: &str = "accessKeyId";
/// The credentials Secret's key that holds the secret access key.
pub const SECRET_ACCESS_KEY: &str = "secretAccessKey";

/// Size of one part of a multipart upload: S3 allows 10,000 parts, so this holds snapshots up to
/// 160 GiB, and an upload holds at most `PARTS_IN_FLIGHT + 1` parts in memory.
const PART_SIZE: usize = 16 << 20;
const PARTS_IN_FLIGHT: usize = 2;

/// What goes wrong reaching a store or moving a snapshot's objects in and out of it. Each says
/// what to fix or where it failed; the messages are what the store's or the snapshot's status
/// shows.
#[derive(Debug, thiserror::Error)]
pub enum BucketError {
    /// The store's credentials Secret lacks one of its keys.
    #[error("Secret {secret} has no key {key}: it needs {ACCESS_KEY_ID} and {SECRET_ACCESS_KEY}")]
    MissingKey {
        /// The Secret's name.
        secret: String,
        /// The key it lacks.
        key: &'static str,
    },
    /// `s3.caBundle` is not a usable PEM bundle: why.
    #[error("s3.caBundle: {0}")]
    CaBundle(String),
    /// `s3.caBundle` holds no certificate at all.
    #[error("s3.caBundle holds no PEM certificate")]
    NoCertificate,
    /// The S3 client could not be built from the spec (the chain of causes).
    #[error("{0}")]
    Client(String),
    /// A request to the store failed: what was being done, to which object.
    #[error("{action} {at}: {}", error_chain(.source))]
    Request {
        /// What was being done.
        action: &'static str,
        /// The object, as `s3://bucket/key`.
        at: String,
        /// What the store said.
        #[source]
        source: object_store::Error,
    },
    /// The store's check object read back other bytes than were written to it: where.
    #[error("{0} read back other bytes than were written")]
    ReadBack(String),
    /// The bytes being uploaded broke off: what their source said.
    #[error("reading the snapshot while uploading it: {0}")]
    Source(String),
    /// A manifest object that does not parse.
    #[error("{at} is not a snapshot manifest: {source}")]
    Manifest {
        /// The object, as `s3://bucket/key`.
        at: String,
        /// What the parser said.
        #[source]
        source: serde_json::Error,
    },
}

impl BucketError {
    /// A stable name for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            BucketError::MissingKey { .. }
            | BucketError::CaBundle(_)
            | BucketError::NoCertificate
            | BucketError::Client(_) => "StoreInvalid",
            BucketError::Request { .. } | BucketError::ReadBack(_) => "StoreUnavailable",
            BucketError::Source(_) => "StreamBroken",
            BucketError::Manifest { .. } => "ManifestInvalid",
        }
    }
}

fn request(action: &'static str, at: &str) -> impl FnOnce(object_store::Error) -> BucketError {
    let at = at.to_string();
    move |source| BucketError::Request { action, at, source }
}

/// What a snapshot's manifest says.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// The tenant's namespace.
    pub namespace: String,
    /// The TenantCluster's name.
    pub tenant: String,
    /// The TenantSnapshot's name.
    pub snapshot: String,
    /// The stored snapshot's size in bytes.
    pub size: u64,
    /// `sha256:<hex>`.
    pub checksum: String,
    /// The Kubernetes version the tenant ran, which a restore runs again.
    pub kubernetes_version: String,
    /// The distribution the tenant ran (`k3s` or `kubernetes`).
    pub distribution: String,
    /// RFC 3339.
    pub created: String,
    /// How it is encrypted, if it is; `size` and `checksum` are then the stored bytes'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<ManifestEncryption>,
}

/// An encrypted snapshot's record of the key and of the plaintext.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestEncryption {
    /// The cipher's name ([`super::crypt::CIPHER`]).
    pub cipher: String,
    /// [`super::crypt::SnapshotKey::id`].
    pub key_id: String,
    /// The database's size in bytes, before encryption.
    pub plaintext_size: u64,
    /// `sha256:<hex>` of the database's bytes.
    pub plaintext_checksum: String,
}

/// A store's bucket, ready to use.
#[derive(Clone)]
pub struct Store {
    s3: Arc<dyn ObjectStore>,
    bucket: String,
    prefix: String,
    /// The key snapshots are encrypted with, when the store has one.
    pub key: Option<super::crypt::SnapshotKey>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// A snapshot's two objects.
#[derive(Clone, Debug, PartialEq)]
pub struct Objects {
    /// The database's bytes (`.db`).
    pub data: ObjectPath,
    /// The manifest (`.json`).
    pub manifest: ObjectPath,
}

impl Store {
    /// A client for the store, or what is wrong with its spec or Secret.
    pub fn connect(spec: &SnapshotStoreSpec, credentials: &Secret) -> Result<Self, BucketError> {
        // reqwest's rustls takes the process's provider: ring, as everywhere in the operator.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let key = |name: &'static str| {
            credentials
                .data
                .as_ref()
                .and_then(|d| d.get(name))
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .ok_or_else(|| BucketError::MissingKey {
                    secret: credentials.metadata.name.clone().unwrap_or_default(),
                    key: name,
                })
        };
        let s3 = &spec.s3;
        // No whole-request timeout: a snapshot's body takes as long as it takes. A store that
        // does not answer fails within the connect and read timeouts.
        let mut client = ClientOptions::new()
            .with_timeout_disabled()
            .with_connect_timeout(Duration::from_secs(10))
            .with_read_timeout(Duration::from_secs(60))
            .with_allow_http(s3.endpoint.starts_with("http://"));
        if let Some(pem) = s3.ca_bundle.as_deref().filter(|p| !p.trim().is_empty()) {
            let certs = Certificate::from_pem_bundle(pem.as_bytes())
                .map_err(|e| BucketError::CaBundle(error_chain(&e)))?;
            if certs.is_empty() {
                return Err(BucketError::NoCertificate);
            }
            for c in certs {
                client = client.with_root_certificate(c);
            }
        }
        // A few quick retries: a store that is down fails the snapshot with its error in
        // seconds, not minutes.
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(200),
                max_backoff: Duration::from_secs(5),
                base: 2.0,
            },
            max_retries: 3,
            retry_timeout: Duration::from_secs(30),
        };
        let built = AmazonS3Builder::new()
            .with_endpoint(s3.endpoint.trim_end_matches('/'))
            .with_bucket_name(&s3.bucket)
            .with_region(&s3.region)
            .with_access_key_id(key(ACCESS_KEY_ID)?)
            .with_secret_access_key(key(SECRET_ACCESS_KEY)?)
            .with_allow_http(s3.endpoint.starts_with("http://"))
            .with_virtual_hosted_style_request(false)
            .with_client_options(client)
            .with_retry(retry)
            .build()
            .map_err(|e| BucketError::Client(error_chain(&e)))?;
        let mut prefix = s3.prefix.trim_matches('/').to_string();
        if !prefix.is_empty() {
            prefix.push('/');
        }
        Ok(Self {
            s3: Arc::new(built),
            bucket: s3.bucket.clone(),
            prefix,
            key: None,
        })
    }

    /// Where a snapshot's objects go.
    pub fn objects(&self, namespace: &str, tenant: &str, snapshot: &str, uid: &str) -> Objects {
        let base = format!("{}{namespace}/{tenant}/{snapshot}-{uid}", self.prefix);
        Objects {
            data: ObjectPath::from(format!("{base}.db")),
            manifest: ObjectPath::from(format!("{base}.json")),
        }
    }

    /// Where TenantSnapshot `snap`'s objects are.
    pub fn objects_of(&self, snap: &tenantplane_api::TenantSnapshot) -> Objects {
        use kube::ResourceExt;
        self.objects(
            &snap.namespace().unwrap_or_default(),
            &snap.spec.tenant_cluster_ref.name,
            &snap.name_any(),
            &snap.uid().unwrap_or_default(),
        )
    }

    /// `s3://<bucket>/<key>`, as a status shows an object.
    pub fn location(&self, object: &ObjectPath) -> String {
        format!("s3://{}/{object}", self.bucket)
    }

    /// Write, read back and delete a small object: the store answers and these credentials may
    /// write to the bucket.
    pub async fn probe(&self, operator: &str) -> Result<(), BucketError> {
        let path = ObjectPath::from(format!("{}.tenantplane-probe-{operator}", self.prefix));
        let at = self.location(&path);
        let body = format!("written by the TenantPlane operator {operator} to check the store");
        self.s3
            .put(&path, PutPayload::from(body.clone()))
            .await
            .map_err(request("writing", &at))?;
        let read = self
            .s3
            .get(&path)
            .await
            .map_err(request("reading", &at))?
            .bytes()
            .await
            .map_err(request("reading", &at))?;
        if read != body.as_bytes() {
            return Err(BucketError::ReadBack(at));
        }
        self.s3
            .delete(&path)
            .await
            .map_err(request("deleting", &at))
    }

    /// Stream `bytes` into `object` as a multipart upload, hashing as they pass; the upload is
    /// aborted (nothing left in the bucket) when the stream or the store fails. Returns the size
    /// and the SHA-256 (hex).
    pub async fn upload<S, E>(
        &self,
        object: &ObjectPath,
        bytes: S,
    ) -> Result<(u64, String), BucketError>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let at = self.location(object);
        let upload = self
            .s3
            .put_multipart(object)
            .await
            .map_err(request("starting the upload to", &at))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
        let mut hasher = Hasher::default();
        let mut size = 0u64;
        let mut bytes = bytes;
        loop {
            if let Err(e) = writer.wait_for_capacity(PARTS_IN_FLIGHT).await {
                let _ = writer.abort().await;
                return Err(request("uploading to", &at)(e));
            }
            match bytes.next().await {
                None => break,
                Some(Ok(chunk)) => {
                    hasher.update(&chunk);
                    size += chunk.len() as u64;
                    writer.put(chunk);
                }
                Some(Err(e)) => {
                    let _ = writer.abort().await;
                    return Err(BucketError::Source(e.to_string()));
                }
            }
        }
        writer
            .finish()
            .await
            .map_err(request("finishing the upload to", &at))?;
        Ok((size, hasher.finish()))
    }

    /// Write `manifest` as JSON to `object`.
    pub async fn put_manifest(
        &self,
        object: &ObjectPath,
        manifest: &Manifest,
    ) -> Result<(), BucketError> {
        // A manifest is plain strings and numbers: it always serializes.
        let body = serde_json::to_vec_pretty(manifest).unwrap_or_default();
        self.s3
            .put(object, PutPayload::from(body))
            .await
            .map(|_| ())
            .map_err(request("writing", &self.location(object)))
    }

    /// Read the manifest at `object`.
    pub async fn manifest(&self, object: &ObjectPath) -> Result<Manifest, BucketError> {
        let at = self.location(object);
        let bytes = self
            .s3
            .get(object)
            .await
            .map_err(request("reading", &at))?
            .bytes()
            .await
            .map_err(request("reading", &at))?;
        serde_json::from_slice(&bytes).map_err(|source| BucketError::Manifest { at, source })
    }

    /// The object's bytes as a stream.
    pub async fn download(
        &self,
        object: &ObjectPath,
    ) -> Result<BoxStream<'static, Result<Bytes, BucketError>>, BucketError> {
        let at = self.location(object);
        let got = self.s3.get(object).await.map_err(request("reading", &at))?;
        Ok(got
            .into_stream()
            .map_err(move |e| request("reading", &at)(e))
            .boxed())
    }

    /// Delete an object; one already gone is fine.
    pub async fn delete(&self, object: &ObjectPath) -> Result<(), BucketError> {
        match self.s3.delete(object).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(request("deleting", &self.location(object))(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use tenantplane_api::snapshot::{S3Location, SecretRef};

    fn spec(endpoint: &str, prefix: &str) -> SnapshotStoreSpec {
        SnapshotStoreSpec {
            s3: S3Location {
                endpoint: endpoint.into(),
                bucket: "snaps".into(),
                prefix: prefix.into(),
                region: "us-east-1".into(),
                ca_bundle: None,
            },
            credentials_secret_ref: SecretRef {
                name: "creds".into(),
            },
            default: false,
            encryption: None,
        }
    }

    fn secret(keys: &[(&str, &str)]) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some("creds".into());
        s.data = Some(
            keys.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        );
        s
    }

    #[test]
    fn objects_go_under_the_prefix_by_namespace_and_tenant() {
        let creds = secret(&[(ACCESS_KEY_ID, "a"), (SECRET_ACCESS_KEY, "b")]);
        let store = Store::connect(&spec("http://127.0.0.1:8333", "/tp/"), &creds).unwrap();
        let o = store.objects("team-dev", "dev", "nightly", "1234");
        assert_eq!(o.data.as_ref(), "tp/team-dev/dev/nightly-1234.db");
        assert_eq!(o.manifest.as_ref(), "tp/team-dev/dev/nightly-1234.json");
        assert_eq!(
            store.location(&o.data),
            "s3://snaps/tp/team-dev/dev/nightly-1234.db"
        );
        let bare = Store::connect(&spec("http://127.0.0.1:8333", ""), &creds).unwrap();
        assert_eq!(bare.objects("n", "t", "s", "u").data.as_ref(), "n/t/s-u.db");
    }

    #[test]
    fn missing_credentials_and_bad_cas_say_what_to_fix() {
        let e =
            Store::connect(&spec("http://h:1", ""), &secret(&[(ACCESS_KEY_ID, "a")])).unwrap_err();
        assert!(matches!(e, BucketError::MissingKey { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            "Secret creds has no key secretAccessKey: it needs accessKeyId and secretAccessKey"
        );
        let mut s = spec("https://h:1", "");
        s.s3.ca_bundle = Some("not a certificate".into());
        let creds = secret(&[(ACCESS_KEY_ID, "a"), (SECRET_ACCESS_KEY, "b")]);
        let e = Store::connect(&s, &creds).unwrap_err();
        assert!(e.to_string().contains("caBundle"), "{e}");
        assert_eq!(e.label(), "StoreInvalid");
    }
}
