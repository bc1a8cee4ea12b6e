//! Snapshot helpers shared by the test binaries: one S3 store (SeaweedFS on loopback) per binary,
//! a SnapshotStore with a bucket of the test's own, and the CLI's snapshot and restore commands.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;
use tenantplane_api::conditions;
use tenantplane_api::snapshot::STORE_AVAILABLE;
use tenantplane_api::{Phase, SnapshotPhase, SnapshotStore, TenantCluster, TenantSnapshot};
use tenantplane_controller::snapshot::store::{ACCESS_KEY_ID, SECRET_ACCESS_KEY};
use tenantplane_testenv::s3::S3Server;
use tenantplane_testenv::{eventually, shared};
use tokio::sync::OnceCell;

use super::WAIT;

/// One store for the whole test binary; each test has a bucket of its own.
pub static S3: OnceCell<S3Server> = OnceCell::const_new();

pub async fn s3() -> &'static S3Server {
    S3.get_or_init(|| async {
        S3Server::start(shared().binaries(), &shared().dir().join("s3"))
            .await
            .unwrap_or_else(|e| panic!("starting the S3 store: {e}"))
    })
    .await
}

/// A SnapshotStore named after the test's namespace, for a bucket of its own at `endpoint`,
/// with its credentials in the namespace (the test operator's "own" namespace).
pub async fn store(host: &Client, ns: &str, endpoint: &str) -> String {
    let s3 = s3().await;
    s3.create_bucket(ns).await.unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "snapshot-store", "namespace": ns},
        "stringData": {ACCESS_KEY_ID: s3.access_key, SECRET_ACCESS_KEY: s3.secret_key},
    }))
    .unwrap();
    Api::<Secret>::namespaced(host.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let store: SnapshotStore = serde_json::from_value(json!({
        "metadata": {"name": ns},
        "spec": {
            "s3": {"endpoint": endpoint, "bucket": ns, "prefix": "tenants/"},
            "credentialsSecretRef": {"name": "snapshot-store"},
        }
    }))
    .unwrap();
    let stores: Api<SnapshotStore> = Api::all(host.clone());
    let _ = stores.delete(ns, &Default::default()).await;
    stores.create(&PostParams::default(), &store).await.unwrap();
    ns.to_string()
}

/// The store's Available condition once the operator has checked it: (status, message).
pub async fn availability(host: &Client, name: &str) -> (String, String) {
    let stores: Api<SnapshotStore> = Api::all(host.clone());
    eventually(WAIT, || async {
        let s = stores.get(name).await.ok()?;
        let c = conditions::find(&s.status?.conditions, STORE_AVAILABLE)?.clone();
        Some((c.status, c.message))
    })
    .await
    .unwrap_or_else(|| panic!("SnapshotStore {name} was never checked"))
}

/// Wait until SnapshotStore `name` reads Available: a check that failed (an S3 store slow to
/// answer on a loaded machine) is made again after 30 s. Panics with the last message otherwise.
pub async fn available(host: &Client, name: &str) {
    let stores: Api<SnapshotStore> = Api::all(host.clone());
    let last = std::sync::Mutex::new(String::from("never checked"));
    let up = eventually(WAIT, || async {
        let s = stores.get(name).await.ok()?;
        let c = conditions::find(&s.status?.conditions, STORE_AVAILABLE)?.clone();
        *last.lock().unwrap() = format!("{}: {}", c.status, c.message);
        (c.status == "True").then_some(())
    })
    .await;
    let last = last.into_inner().unwrap();
    assert!(
        up.is_some(),
        "SnapshotStore {name} is not available: {last}"
    );
}

pub async fn snapshot_done(host: &Client, ns: &str, name: &str) -> TenantSnapshot {
    let api: Api<TenantSnapshot> = Api::namespaced(host.clone(), ns);
    eventually(Duration::from_secs(180), || async {
        let s = api.get(name).await.ok()?;
        matches!(s.phase(), SnapshotPhase::Completed | SnapshotPhase::Failed).then_some(s)
    })
    .await
    .unwrap_or_else(|| panic!("TenantSnapshot {name} never finished"))
}

pub async fn still_ready(host: &Client, ns: &str, name: &str) {
    let tc: TenantCluster = Api::namespaced(host.clone(), ns).get(name).await.unwrap();
    assert_eq!(tc.status.unwrap().phase, Some(Phase::Ready));
}

/// `tenantplane args…` against the test control plane: (exit code, stdout, stderr).
pub async fn tp(args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_tenantplane"))
        .args(args)
        .env("KUBECONFIG", shared().kubeconfig_path())
        .output()
        .await
        .unwrap();
    let result = (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    eprintln!("$ tenantplane {}\n{result:?}", args.join(" "));
    result
}

/// `tenantplane restore NAME -n NS --snapshot S --yes --wait --timeout T`.
pub async fn restore_waiting(
    name: &str,
    ns: &str,
    snapshot: &str,
    timeout: &str,
) -> (i32, String, String) {
    tp(&[
        "restore",
        name,
        "-n",
        ns,
        "--snapshot",
        snapshot,
        "--yes",
        "--wait",
        "--timeout",
        timeout,
    ])
    .await
}

/// `tenantplane snapshot create TENANT -n NS --name N --store S --wait`.
pub async fn snapshot_waiting(
    tenant: &str,
    ns: &str,
    name: &str,
    store: &str,
) -> (i32, String, String) {
    tp(&[
        "snapshot", "create", tenant, "-n", ns, "--name", name, "--store", store, "--wait",
    ])
    .await
}

/// An object store client of the test's own, to look at what the operator wrote.
pub fn bucket(bucket: &str) -> object_store::aws::AmazonS3 {
    let s3 = S3.get().unwrap();
    object_store::aws::AmazonS3Builder::new()
        .with_endpoint(&s3.endpoint)
        .with_bucket_name(bucket)
        .with_region("us-east-1")
        .with_access_key_id(&s3.access_key)
        .with_secret_access_key(&s3.secret_key)
        .with_allow_http(true)
        .build()
        .unwrap()
}
