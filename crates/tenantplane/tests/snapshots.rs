//! Snapshots against the test control plane and a real S3 store (SeaweedFS on loopback): a
//! store checked, a snapshot of a running tenant taken by the CLI, found byte for byte in the
//! bucket, listed, and deleted with its objects; a store that is down, which fails the snapshot
//! with its error and leaves the tenant as it was.

mod common;

use std::time::Duration;

use common::snapshots::*;
use common::*;
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tenantplane_api::conditions;
use tenantplane_api::{Phase, SnapshotPhase, SnapshotStore, TenantCluster, TenantSnapshot};
use tenantplane_controller::snapshot::store::{ACCESS_KEY_ID, SECRET_ACCESS_KEY};
use tenantplane_testenv::eventually;

#[tokio::test]
async fn a_running_tenant_is_snapshotted_into_the_store_listed_and_deleted_with_its_objects() {
    use object_store::{ObjectStore, ObjectStoreExt};
    let world = ReadyTenant::start("snap").await;
    let (ns, host, tenant) = (&world.ns.name, &world.host, &world.tenant);
    // Something of the tenant's own to find in the copy.
    let proof: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "snapshot-proof", "namespace": "default"},
        "data": {"written": "before the snapshot"}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &proof)
        .await
        .unwrap();
    let endpoint = s3().await.endpoint.clone();
    let store_name = store(host, ns, &endpoint).await;
    available(host, &store_name).await;

    // The CLI takes it and waits, saying what it does.
    let (code, out, err) = tp(&[
        "snapshot",
        "create",
        &world.name,
        "-n",
        ns,
        "--name",
        "first",
        "--store",
        &store_name,
        "--wait",
        "--timeout",
        "3m",
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("TenantSnapshot first Completed after"),
        "{out}"
    );
    let snap = snapshot_done(host, ns, "first").await;
    let status = snap.status.clone().unwrap();
    assert_eq!(snap.phase(), SnapshotPhase::Completed, "{status:?}");
    assert_eq!(status.distribution.as_deref(), Some("k3s"));
    assert!(
        status
            .kubernetes_version
            .as_deref()
            .is_some_and(|v| v.starts_with('v')),
        "{status:?}"
    );
    let checksum = status.checksum.clone().unwrap();
    let location = status.location.clone().unwrap();
    let key = location
        .strip_prefix(&format!("s3://{ns}/"))
        .unwrap_or_else(|| panic!("{location} is not in bucket {ns}"));
    assert!(
        key.starts_with(&format!("tenants/{ns}/{}/first-", world.name)),
        "{key}"
    );
    // Not owned by the tenant: it outlives it.
    assert!(snap.owner_references().is_empty());

    // The bytes in the bucket are the checksum's, a sqlite database holding the tenant's object.
    let objects = bucket(ns);
    let data = objects
        .get(&object_store::path::Path::from(key))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(data.len() as i64, status.size.unwrap());
    let mut hasher = tenantplane_controller::snapshot::copy::Hasher::default();
    hasher.update(&data);
    assert_eq!(format!("sha256:{}", hasher.finish()), checksum);
    assert!(data.starts_with(b"SQLite format 3\0"));
    assert!(
        data.windows(b"snapshot-proof".len())
            .any(|w| w == b"snapshot-proof"),
        "the copy does not hold the tenant's ConfigMap"
    );
    let manifest_key = key.replace(".db", ".json");
    let manifest: serde_json::Value = serde_json::from_slice(
        &objects
            .get(&object_store::path::Path::from(manifest_key.clone()))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["checksum"], checksum.as_str());
    assert_eq!(manifest["tenant"], world.name.as_str());

    let (code, out, _) = tp(&["snapshot", "list", "-n", ns]).await;
    assert_eq!(code, 0);
    let row = out
        .lines()
        .find(|l| l.starts_with("first "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        row.contains("Completed") && row.contains(&store_name),
        "{row}"
    );

    // The tenant kept running throughout.
    still_ready(host, ns, &world.name).await;

    let (code, out, err) = tp(&["snapshot", "delete", "first", "-n", ns, "--wait"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("are gone after"), "{out}");
    let listed: Vec<_> = objects
        .list(Some(&object_store::path::Path::from(format!(
            "tenants/{ns}"
        ))))
        .try_collect()
        .await
        .unwrap();
    assert!(
        listed.is_empty(),
        "objects left after the delete: {listed:?}"
    );
}

#[tokio::test]
async fn a_store_that_is_down_fails_the_snapshot_with_its_error_and_leaves_the_tenant_alone() {
    let world = ReadyTenant::start("snapdown").await;
    let (ns, host) = (&world.ns.name, &world.host);
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let store_name = store(host, ns, &endpoint).await;
    let (status, message) = availability(host, &store_name).await;
    assert_eq!(status, "False");
    assert!(
        message.contains(&endpoint.replace("http://", "")) || message.contains("onnect"),
        "{message}"
    );

    let (code, out, err) = tp(&[
        "snapshot",
        "create",
        &world.name,
        "-n",
        ns,
        "--name",
        "down",
        "--store",
        &store_name,
        "--wait",
        "--timeout",
        "3m",
    ])
    .await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("TenantSnapshot down Failed:"), "{err}");
    let snap = snapshot_done(host, ns, "down").await;
    let status = snap.status.unwrap();
    assert_eq!(status.phase, Some(SnapshotPhase::Failed));
    assert!(
        status.message.as_deref().unwrap_or("").contains("upload"),
        "{status:?}"
    );
    still_ready(host, ns, &world.name).await;
    // A failed snapshot deletes at once: nothing was stored.
    let api: Api<TenantSnapshot> = Api::namespaced(host.clone(), ns);
    api.delete("down", &Default::default()).await.unwrap();
    let gone = eventually(WAIT, || async {
        api.get_opt("down").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(gone.is_some(), "the failed snapshot was not deleted");
}

/// A Service in the tenant's `default` namespace (the syncer copies Services to the host).
async fn tenant_service(tenant: &Client, name: &str) {
    let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"ports": [{"port": 80}]}
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
}

/// Whether the host holds the copy of tenant Service `name` (in the tenant's `default`).
async fn host_copy(host: &Client, ns: &str, tenant: &str, name: &str) -> bool {
    let host_name = tenantplane_syncer::naming::host_name_for(tenant, "default", name);
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(host.clone(), ns)
        .get_opt(&host_name)
        .await
        .unwrap()
        .is_some()
}

async fn config_map(tenant: &Client, name: &str, value: &str) {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "data": {"value": value}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
}

async fn config_map_value(tenant: &Client, name: &str) -> Option<String> {
    Api::<ConfigMap>::namespaced(tenant.clone(), "default")
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|c| c.data?.get("value").cloned())
}

/// The tenant's Restored condition once it says `status`: (reason, message).
async fn restored(host: &Client, ns: &str, name: &str, status: &str) -> (String, String) {
    let api: Api<TenantCluster> = Api::namespaced(host.clone(), ns);
    eventually(Duration::from_secs(180), || async {
        let tc = api.get(name).await.ok()?;
        let c = conditions::find(&tc.status?.conditions, conditions::RESTORED)?.clone();
        (c.status == status).then_some((c.reason, c.message))
    })
    .await
    .unwrap_or_else(|| panic!("TenantCluster {name}'s Restored condition never became {status}"))
}

#[tokio::test]
async fn a_tenant_rolls_back_in_place_and_the_host_follows_a_corrupt_snapshot_is_refused() {
    use object_store::ObjectStoreExt;
    let world = ReadyTenant::start("restore").await;
    let (ns, host, name) = (&world.ns.name, &world.host, &world.name);
    let tenant = world.tenant.clone();
    let endpoint = s3().await.endpoint.clone();
    let store_name = store(host, ns, &endpoint).await;
    available(host, &store_name).await;

    // The state the snapshot holds: a ConfigMap, and a Service copied to the host.
    config_map(&tenant, "settings", "before").await;
    tenant_service(&tenant, "before").await;
    assert!(
        eventually(WAIT, || async {
            host_copy(host, ns, name, "before").await.then_some(())
        })
        .await
        .is_some(),
        "the Service was never copied to the host"
    );
    let (code, out, err) = snapshot_waiting(name, ns, "good", &store_name).await;
    assert_eq!(code, 0, "{out}{err}");

    // What happens after it: the ConfigMap changes, the first Service goes, a second comes.
    Api::<ConfigMap>::namespaced(tenant.clone(), "default")
        .patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"value": "after"}})),
        )
        .await
        .unwrap();
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(tenant.clone(), "default")
        .delete("before", &Default::default())
        .await
        .unwrap();
    tenant_service(&tenant, "after").await;
    assert!(
        eventually(WAIT, || async {
            (host_copy(host, ns, name, "after").await && !host_copy(host, ns, name, "before").await)
                .then_some(())
        })
        .await
        .is_some(),
        "the host never followed the changes"
    );

    // Without --yes, nothing happens and the CLI says why.
    let (code, _, err) = tp(&["restore", name, "-n", ns, "--snapshot", "good"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("--yes"), "{err}");

    // A corrupt copy: the stored bytes changed behind the operator's back. Refused before
    // anything is touched; the tenant runs on with its current data, its pod not restarted.
    let (code, out, err) = snapshot_waiting(name, ns, "damaged", &store_name).await;
    assert_eq!(code, 0, "{out}{err}");
    let damaged = snapshot_done(host, ns, "damaged").await;
    let location = damaged.status.unwrap().location.unwrap();
    let key = location
        .strip_prefix(&format!("s3://{ns}/"))
        .unwrap()
        .to_string();
    let objects = bucket(ns);
    let path = object_store::path::Path::from(key);
    let mut bytes = objects
        .get(&path)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    objects.put(&path, bytes.into()).await.unwrap();
    let pod_uid = |host: Client, ns: String, name: String| async move {
        Api::<k8s_openapi::api::core::v1::Pod>::namespaced(host, &ns)
            .get(&format!("{name}-0"))
            .await
            .unwrap()
            .uid()
    };
    let pod_before = pod_uid(host.clone(), ns.clone(), name.clone()).await;
    let (code, out, err) = restore_waiting(name, ns, "damaged", "2m").await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("corrupt"), "{err}");
    let (reason, message) = restored(host, ns, name, "False").await;
    assert_eq!(reason, "RestoreRefused", "{message}");
    assert!(
        message.contains("refused before anything was touched"),
        "{message}"
    );
    still_ready(host, ns, name).await;
    assert_eq!(
        pod_uid(host.clone(), ns.clone(), name.clone()).await,
        pod_before
    );
    assert_eq!(
        config_map_value(&tenant, "settings").await.as_deref(),
        Some("after")
    );

    // The good one: the CLI waits through the restore, step by step.
    let (code, out, err) = restore_waiting(name, ns, "good", "4m").await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("restored and Ready after"), "{out}");
    assert!(out.contains("Restoring"), "{out}");
    let (reason, message) = restored(host, ns, name, "True").await;
    assert_eq!(reason, "RestoreCompleted", "{message}");
    assert_ne!(
        pod_uid(host.clone(), ns.clone(), name.clone()).await,
        pod_before
    );

    // The tenant holds the snapshot's state, and the host follows it: the copy of the Service
    // made since goes, the one the snapshot holds comes back.
    let tenant = tenant_client(host, ns, name).await;
    assert_eq!(
        config_map_value(&tenant, "settings").await.as_deref(),
        Some("before")
    );
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(tenant.clone(), "default");
    assert!(services.get_opt("before").await.unwrap().is_some());
    assert!(services.get_opt("after").await.unwrap().is_none());
    assert!(
        eventually(WAIT, || async {
            (host_copy(host, ns, name, "before").await && !host_copy(host, ns, name, "after").await)
                .then_some(())
        })
        .await
        .is_some(),
        "the host did not converge to the restored tenant"
    );
    let synced = wait_for_phase(host, ns, name, Phase::Ready).await;
    assert_eq!(condition(&synced, conditions::SYNCED).status, "True");
}

#[tokio::test]
async fn a_new_tenant_is_built_from_the_snapshot_of_one_that_is_gone() {
    let world = ReadyTenant::start("rebuild").await;
    let (ns, host, name) = (&world.ns.name, &world.host, &world.name);
    let endpoint = s3().await.endpoint.clone();
    let store_name = store(host, ns, &endpoint).await;
    available(host, &store_name).await;
    config_map(&world.tenant, "carried", "over").await;
    let (code, out, err) = snapshot_waiting(name, ns, "keep", &store_name).await;
    assert_eq!(code, 0, "{out}{err}");

    // The tenant goes; its snapshot stays.
    let (code, out, err) = tp(&["delete", name, "-n", ns, "--wait"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        snapshot_done(host, ns, "keep").await.phase(),
        SnapshotPhase::Completed
    );

    // A new tenant from it, at the snapshot's version, with a new CA and a new claim.
    let (code, out, err) = tp(&[
        "create",
        "reborn",
        "-n",
        ns,
        "--from-snapshot",
        "keep",
        "--wait",
        "--timeout",
        "4m",
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let (reason, message) = restored(host, ns, "reborn", "True").await;
    assert_eq!(reason, "RestoreCompleted", "{message}");
    let tenant = tenant_client(host, ns, "reborn").await;
    assert_eq!(
        config_map_value(&tenant, "carried").await.as_deref(),
        Some("over")
    );
    let tc: TenantCluster = Api::namespaced(host.clone(), ns)
        .get("reborn")
        .await
        .unwrap();
    let restore = tc.status.unwrap().restore.unwrap();
    assert!(!restore.in_place, "{restore:?}");

    // A snapshot that does not exist is refused with the reason, and a new tenant waits.
    let (code, _, err) = tp(&["create", "ghost", "-n", ns, "--from-snapshot", "nope"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("TenantSnapshot nope not found"), "{err}");
}

#[tokio::test]
async fn a_schedule_takes_snapshots_and_keeps_the_newest() {
    let world = ReadyTenant::start("sched").await;
    let (ns, host, name) = (&world.ns.name, &world.host, &world.name);
    let endpoint = s3().await.endpoint.clone();
    let store_name = store(host, ns, &endpoint).await;
    available(host, &store_name).await;
    let tenants: Api<TenantCluster> = Api::namespaced(host.clone(), ns);
    // A schedule that does not parse is refused at admission, saying what to write.
    let refused = tenants
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"snapshots": {"schedule": "every day"}}})),
        )
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("must be a cron schedule"),
        "{refused}"
    );
    // Every 10 s (a sixth field, seconds), the two newest kept.
    tenants
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"snapshots": {
                "schedule": "*/10 * * * * *", "keep": 2, "storeRef": {"name": store_name},
            }}})),
        )
        .await
        .unwrap();
    let snapshots: Api<TenantSnapshot> = Api::namespaced(host.clone(), ns);
    let scheduled = ListParams::default().labels(&format!(
        "{}={name}",
        tenantplane_controller::snapshot::schedule::SCHEDULED_FOR
    ));
    // Seen: every scheduled snapshot ever listed; wait until four were made.
    let seen = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let four = eventually(Duration::from_secs(120), || async {
        let items = snapshots.list(&scheduled).await.ok()?.items;
        let mut seen = seen.lock().unwrap();
        seen.extend(items.iter().map(|s| s.name_any()));
        (seen.len() >= 4).then_some(())
    })
    .await;
    let seen = seen.into_inner().unwrap();
    assert!(four.is_some(), "scheduled snapshots seen: {seen:?}");
    // Retention: at most two Completed remain, the newest.
    let oldest = seen.iter().next().unwrap();
    let kept = eventually(Duration::from_secs(60), || async {
        let items = snapshots.list(&scheduled).await.ok()?.items;
        let completed: Vec<String> = items
            .iter()
            .filter(|s| {
                s.phase() == SnapshotPhase::Completed && s.metadata.deletion_timestamp.is_none()
            })
            .map(|s| s.name_any())
            .collect();
        // Under load a newer snapshot may still be running while two older ones are the newest
        // Completed: retention keeps those until the newer complete.
        (completed.len() == 2 && !completed.contains(oldest)).then_some(completed)
    })
    .await
    .unwrap_or_else(|| panic!("retention never left the two newest: seen {seen:?}"));
    for k in &kept {
        assert!(k.starts_with(&format!("{name}-")), "{k}");
    }
    // The tenant's status says what the schedule did.
    let status = eventually(Duration::from_secs(90), || async {
        let s = tenants.get(name).await.ok()?.status?.snapshots?;
        (s.last_snapshot.is_some() && s.next_schedule_time.is_some()).then_some(s)
    })
    .await
    .expect("status.snapshots never said what the schedule did");
    assert!(status.message.is_none(), "{status:?}");
    still_ready(host, ns, name).await;
}

/// The image of the tenant's control-plane pod (its server container) once it is Ready.
async fn running_image(host: &Client, ns: &str, name: &str, containing: &str) -> String {
    let tenants: Api<TenantCluster> = Api::namespaced(host.clone(), ns);
    eventually(Duration::from_secs(240), || async {
        let pod = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(host.clone(), ns)
            .get(&format!("{name}-0"))
            .await
            .ok()?;
        let image = pod.spec?.containers[0].image.clone()?;
        let ready = tenants.get(name).await.ok()?.status?.phase == Some(Phase::Ready);
        (image.contains(containing) && ready).then_some(image)
    })
    .await
    .unwrap_or_else(|| panic!("TenantCluster {name} never ran {containing} and was Ready"))
}

#[tokio::test]
async fn an_upgrade_is_snapshotted_first_and_rolls_back() {
    let world = ReadyTenant::start("rollback").await;
    let (ns, host, name) = (&world.ns.name, &world.host, &world.name);
    let endpoint = s3().await.endpoint.clone();
    let store_name = store(host, ns, &endpoint).await;
    available(host, &store_name).await;
    let tenants: Api<TenantCluster> = Api::namespaced(host.clone(), ns);
    // The store is the schedule's (a yearly one that does not come due here).
    tenants
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"snapshots": {
                "schedule": "0 0 1 1 *", "keep": 1, "storeRef": {"name": store_name},
            }}})),
        )
        .await
        .unwrap();
    config_map(&world.tenant, "state", "v1.30").await;

    // The upgrade: a snapshot first, then the new version.
    tenants
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"kubernetesVersion": "v1.31.0"}})),
        )
        .await
        .unwrap();
    running_image(host, ns, name, "v1.31.0").await;
    let tc = tenants.get(name).await.unwrap();
    let upgrade = tc.status.clone().unwrap().upgrade.unwrap();
    assert_eq!(
        upgrade.reason.as_deref(),
        Some("SnapshotTaken"),
        "{upgrade:?}"
    );
    assert_eq!(
        (upgrade.from.as_str(), upgrade.to.as_str()),
        ("v1.30.4", "v1.31.0")
    );
    let guard = upgrade.snapshot.clone().unwrap();
    let snap = snapshot_done(host, ns, &guard).await;
    let snap_status = snap.status.clone().unwrap();
    assert_eq!(snap.phase(), SnapshotPhase::Completed, "{snap_status:?}");
    assert_eq!(snap_status.kubernetes_version.as_deref(), Some("v1.30.4"));
    assert!(
        snap.metadata.creation_timestamp.unwrap().0
            <= conditions::find(&tc.status.unwrap().conditions, conditions::READY)
                .unwrap()
                .last_transition_time
                .0,
        "the snapshot came after the upgrade"
    );
    let (code, out, err) = tp(&["status", name, "-n", ns]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("UpgradeGuarded"), "{out}");

    // Work done at the new version, then the rollback: the old version and the old data.
    let tenant = tenant_client(host, ns, name).await;
    Api::<ConfigMap>::namespaced(tenant.clone(), "default")
        .patch(
            "state",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"value": "v1.31"}})),
        )
        .await
        .unwrap();
    let (code, _, err) = tp(&["rollback", name, "-n", ns]).await;
    assert_eq!(code, 1);
    assert!(err.contains("--yes") && err.contains("v1.30.4"), "{err}");
    let (code, out, err) = tp(&[
        "rollback",
        name,
        "-n",
        ns,
        "--yes",
        "--wait",
        "--timeout",
        "4m",
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("rolling back to v1.30.4"), "{out}");
    running_image(host, ns, name, "v1.30.4").await;
    let tenant = tenant_client(host, ns, name).await;
    assert_eq!(
        config_map_value(&tenant, "state").await.as_deref(),
        Some("v1.30")
    );
    let tc = tenants.get(name).await.unwrap();
    assert_eq!(tc.spec.kubernetes_version, "v1.30.4");
    let status = tc.status.unwrap();
    assert!(status.upgrade.is_none(), "{:?}", status.upgrade);
    // A downgrade without a restore is still refused.
    let refused = tenants
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"kubernetesVersion": "v1.30.0"}})),
        )
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("cannot be downgraded"),
        "{refused}"
    );
}

#[tokio::test]
async fn an_upgrade_past_removed_api_versions_is_refused_until_accepted() {
    let world = TenantSetup::seed()
        .edit(|tc| tc.spec.kubernetes_version = "v1.31.0".into())
        .start("removed-apis")
        .await;
    let (ns, host, name) = (&world.ns.name, &world.host, &world.name);
    // A FlowSchema last applied as flowcontrol.apiserver.k8s.io/v1beta3, which v1.32 no longer
    // serves (as `kubectl apply` of an old manifest leaves it).
    let applied = json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1beta3", "kind": "FlowSchema",
        "metadata": {"name": "legacy"},
        "spec": {"priorityLevelConfiguration": {"name": "global-default"}, "matchingPrecedence": 9000},
    });
    let schema: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
        "metadata": {"name": "legacy", "annotations": {
            "kubectl.kubernetes.io/last-applied-configuration": applied.to_string(),
        }},
        "spec": {"priorityLevelConfiguration": {"name": "global-default"}, "matchingPrecedence": 9000},
    }))
    .unwrap();
    let resource = kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
        "flowcontrol.apiserver.k8s.io",
        "v1",
        "FlowSchema",
    ));
    Api::<kube::api::DynamicObject>::all_with(world.tenant.clone(), &resource)
        .create(&PostParams::default(), &schema)
        .await
        .unwrap();
    let tenants: Api<TenantCluster> = Api::namespaced(host.clone(), ns);
    tenants
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"kubernetesVersion": "v1.32.0"}})),
        )
        .await
        .unwrap();
    let refused = eventually(WAIT, || async {
        let tc = tenants.get(name).await.ok()?;
        let c = conditions::find(&tc.status?.conditions, conditions::UPGRADE_GUARDED)?.clone();
        (c.reason == "RemovedAPIsInUse").then_some(c)
    })
    .await
    .expect("the upgrade was never refused");
    assert_eq!(refused.status, "False");
    for says in [
        "1 FlowSchema",
        "flowcontrol.apiserver.k8s.io/v1beta3",
        "tenantplane.io/accept-removed-apis=v1.32",
    ] {
        assert!(
            refused.message.contains(says),
            "{says}: {}",
            refused.message
        );
    }
    // Held: the control plane runs on at v1.31, Ready.
    running_image(host, ns, name, "v1.31.0").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    running_image(host, ns, name, "v1.31.0").await;
    // Accepted: it goes on (no store here, so without a snapshot, as status says).
    tenants
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "tenantplane.io/accept-removed-apis": "v1.32",
            }}})),
        )
        .await
        .unwrap();
    running_image(host, ns, name, "v1.32.0").await;
    let upgrade = tenants
        .get(name)
        .await
        .unwrap()
        .status
        .unwrap()
        .upgrade
        .unwrap();
    assert_eq!(
        upgrade.reason.as_deref(),
        Some("NoSnapshotStore"),
        "{upgrade:?}"
    );
}

#[tokio::test]
async fn an_encrypted_store_keeps_ciphertext_restores_with_its_key_and_refuses_another() {
    use base64::Engine;
    use object_store::ObjectStoreExt;
    let world = ReadyTenant::start("encrypt").await;
    let (ns, host, name) = (&world.ns.name, &world.host, &world.name);
    let endpoint = s3().await.endpoint.clone();
    let store_name = store(host, ns, &endpoint).await;
    let key = |byte: u8| base64::engine::general_purpose::STANDARD.encode([byte; 32]);
    let secrets: Api<Secret> = Api::namespaced(host.clone(), ns);
    let key_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "snapshot-key", "namespace": ns},
        "stringData": {"key": key(1)},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &key_secret)
        .await
        .unwrap();
    Api::<SnapshotStore>::all(host.clone())
        .patch(
            &store_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"encryption": {
                "keySecretRef": {"name": "snapshot-key"},
            }}})),
        )
        .await
        .unwrap();
    config_map(&world.tenant, "secret-plans", "before").await;
    let (code, out, err) = snapshot_waiting(name, ns, "sealed", &store_name).await;
    assert_eq!(code, 0, "{out}{err}");
    let snap = snapshot_done(host, ns, "sealed").await;
    let status = snap.status.unwrap();
    assert!(status.key_id.is_some(), "{status:?}");
    // In the bucket: ciphertext, not a database, and none of the tenant's names.
    let location = status.location.unwrap();
    let object = location
        .strip_prefix(&format!("s3://{ns}/"))
        .unwrap()
        .to_string();
    let data = bucket(ns)
        .get(&object_store::path::Path::from(object))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(data.starts_with(tenantplane_controller::snapshot::crypt::MAGIC));
    assert!(
        !data
            .windows(b"secret-plans".len())
            .any(|w| w == b"secret-plans")
    );
    assert!(
        !data
            .windows(b"SQLite format".len())
            .any(|w| w == b"SQLite format")
    );

    // Restored with its key.
    Api::<ConfigMap>::namespaced(world.tenant.clone(), "default")
        .delete("secret-plans", &Default::default())
        .await
        .unwrap();
    let (code, out, err) = restore_waiting(name, ns, "sealed", "4m").await;
    assert_eq!(code, 0, "{out}{err}");
    let tenant = tenant_client(host, ns, name).await;
    assert_eq!(
        config_map_value(&tenant, "secret-plans").await.as_deref(),
        Some("before")
    );

    // With another key in the Secret, the restore is refused, saying which key it needs.
    secrets
        .patch(
            "snapshot-key",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"key": key(2)}})),
        )
        .await
        .unwrap();
    let (code, out, err) = restore_waiting(name, ns, "sealed", "2m").await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("put the old key back"), "{err}");
    still_ready(host, ns, name).await;
}

/// Fill the tenant's datastore: `count` ConfigMaps of 512 KiB, so a copy takes seconds.
async fn fill(tenant: &Client, count: usize) {
    let api: Api<ConfigMap> = Api::namespaced(tenant.clone(), "default");
    let blob: String = (0..512 * 1024)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    for i in 0..count {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("ballast-{i}"), "namespace": "default"},
            "data": {"blob": blob},
        }))
        .unwrap();
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
}

#[tokio::test]
async fn an_operator_killed_mid_snapshot_and_mid_restore_completes_them_cleanly() {
    use common::replica::Replica;
    use tenantplane_testenv::{install_crds_and_policies, namespace};
    install_crds_and_policies();
    let ns = namespace("snapkill").await;
    let host = ns.client.clone();
    let name = "dev";
    // The operator as a cluster runs it (a separate process, so a kill is a kill), and the
    // store's credentials in its namespace.
    let (_runtime, runtime_task) = local_runtime_for(&ns);
    let _runtime_task = AbortOnDrop(runtime_task);
    let mut operator = Some(Replica::start(&ns, &format!("a-{}", ns.name), &[]));
    let tenant = TenantSetup::seed().ready_in(&ns).await;
    let s3 = s3().await;
    s3.create_bucket(&ns.name).await.unwrap();
    let operator_ns = tenantplane_testenv::operator::NAMESPACE;
    let secret_name = format!("store-{}", ns.name);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": secret_name, "namespace": operator_ns},
        "stringData": {ACCESS_KEY_ID: s3.access_key, SECRET_ACCESS_KEY: s3.secret_key},
    }))
    .unwrap();
    let secrets = Api::<Secret>::namespaced(host.clone(), operator_ns);
    let _ = secrets.delete(&secret_name, &Default::default()).await;
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let store: SnapshotStore = serde_json::from_value(json!({
        "metadata": {"name": ns.name},
        "spec": {
            "s3": {"endpoint": s3.endpoint, "bucket": ns.name},
            "credentialsSecretRef": {"name": secret_name},
        }
    }))
    .unwrap();
    let stores: Api<SnapshotStore> = Api::all(host.clone());
    let _ = stores.delete(&ns.name, &Default::default()).await;
    stores.create(&PostParams::default(), &store).await.unwrap();
    available(&host, &ns.name).await;
    fill(&tenant, 240).await;
    config_map(&tenant, "marker", "in the snapshot").await;

    // Killed while the snapshot is Running: the next operator takes it again, into the same
    // objects, and it completes; nothing else is left in the bucket.
    let snapshots: Api<TenantSnapshot> = Api::namespaced(host.clone(), &ns.name);
    let snap: TenantSnapshot = serde_json::from_value(json!({
        "metadata": {"name": "big", "namespace": ns.name},
        "spec": {"tenantClusterRef": {"name": name}, "storeRef": {"name": ns.name}},
    }))
    .unwrap();
    snapshots
        .create(&PostParams::default(), &snap)
        .await
        .unwrap();
    let running = eventually(Duration::from_secs(120), || async {
        let s = snapshots.get("big").await.ok()?;
        (s.phase() == SnapshotPhase::Running).then_some(())
    })
    .await;
    if running.is_none() {
        let status = snapshots.get("big").await.map(|s| s.status);
        panic!("the snapshot was not Running within 120 s; it reads {status:?}");
    }
    if let Some(killed) = operator.take() {
        killed.signal("-KILL");
    }
    let during = snapshots.get("big").await.unwrap().phase();
    eprintln!("operator killed while the snapshot was {during}");
    let _second = Replica::start(&ns, &format!("b-{}", ns.name), &[]);
    let done = snapshot_done(&host, &ns.name, "big").await;
    let status = done.status.clone().unwrap();
    assert_eq!(done.phase(), SnapshotPhase::Completed, "{status:?}");
    eprintln!("snapshot: {} bytes", status.size.unwrap_or_default());
    let listed: Vec<object_store::ObjectMeta> = {
        use object_store::ObjectStore;
        bucket(&ns.name).list(None).try_collect().await.unwrap()
    };
    let keys: Vec<String> = listed.iter().map(|o| o.location.to_string()).collect();
    assert_eq!(keys.len(), 2, "{keys:?}");

    // Killed while the restore is under way: the next operator finds where it got to and
    // finishes it; the tenant holds the snapshot's data, whole.
    drop(_second);
    let mut operator = Some(Replica::start(&ns, &format!("c-{}", ns.name), &[]));
    Api::<ConfigMap>::namespaced(tenant.clone(), "default")
        .patch(
            "marker",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"value": "after the snapshot"}})),
        )
        .await
        .unwrap();
    let (code, out, err) = tp(&[
        "restore",
        name,
        "-n",
        &ns.name,
        "--snapshot",
        "big",
        "--yes",
    ])
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let tenants: Api<TenantCluster> = Api::namespaced(host.clone(), &ns.name);
    let restoring = eventually(Duration::from_secs(120), || async {
        let r = tenants.get(name).await.ok()?.status?.restore?;
        (r.phase == Some(tenantplane_api::RestorePhase::Restoring)).then_some(r)
    })
    .await;
    assert!(restoring.is_some(), "the restore never began");
    // Let the pod reach its restore step, so the kill lands while the snapshot is being sent.
    tokio::time::sleep(Duration::from_secs(3)).await;
    if let Some(killed) = operator.take() {
        killed.signal("-KILL");
    }
    eprintln!(
        "operator killed during the restore: {:?}",
        tenants.get(name).await.unwrap().status.unwrap().restore
    );
    let _fourth = Replica::start(&ns, &format!("d-{}", ns.name), &[]);
    let (reason, message) = restored(&host, &ns.name, name, "True").await;
    assert_eq!(reason, "RestoreCompleted", "{message}");
    wait_for_phase(&host, &ns.name, name, Phase::Ready).await;
    let tenant = tenant_client(&host, &ns.name, name).await;
    assert_eq!(
        config_map_value(&tenant, "marker").await.as_deref(),
        Some("in the snapshot")
    );
    let ballast = Api::<ConfigMap>::namespaced(tenant.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|c| c.name_any().starts_with("ballast-"))
        .count();
    assert_eq!(ballast, 240);
}

#[tokio::test]
async fn a_snapshot_taken_under_writes_restores_a_prefix_of_them() {
    let world = ReadyTenant::start("prefix").await;
    let (ns, host, name) = (&world.ns.name, &world.host, &world.name);
    let endpoint = s3().await.endpoint.clone();
    let store_name = store(host, ns, &endpoint).await;
    available(host, &store_name).await;
    // A client writes numbered ConfigMaps, one after the other, throughout the snapshot.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (tenant, stop) = (world.tenant.clone(), stop.clone());
        tokio::spawn(async move {
            let api: Api<ConfigMap> = Api::namespaced(tenant, "default");
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let cm: ConfigMap = serde_json::from_value(json!({
                    "metadata": {"name": format!("write-{n:05}"), "namespace": "default"},
                    "data": {"n": n.to_string(), "body": "x".repeat(4096 + n as usize % 977)},
                }))
                .unwrap();
                if api.create(&PostParams::default(), &cm).await.is_ok() {
                    n += 1;
                }
            }
            n
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (code, out, err) = snapshot_waiting(name, ns, "busy", &store_name).await;
    assert_eq!(code, 0, "{out}{err}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = writer.await.unwrap();
    let (code, out, err) = restore_waiting(name, ns, "busy", "4m").await;
    assert_eq!(code, 0, "{out}{err}");
    let tenant = tenant_client(host, ns, name).await;
    let items = Api::<ConfigMap>::namespaced(tenant, "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut held: Vec<u32> = Vec::new();
    for cm in items.iter().filter(|c| c.name_any().starts_with("write-")) {
        let data = cm.data.clone().unwrap_or_default();
        let n: u32 = data["n"].parse().unwrap();
        assert_eq!(cm.name_any(), format!("write-{n:05}"));
        assert_eq!(
            data["body"].len(),
            4096 + n as usize % 977,
            "write {n} is torn"
        );
        held.push(n);
    }
    held.sort();
    eprintln!("{written} written, {} in the snapshot", held.len());
    assert!(
        !held.is_empty() && held.len() < written as usize,
        "{} of {written}",
        held.len()
    );
    assert_eq!(
        held,
        (0..held.len() as u32).collect::<Vec<_>>(),
        "not a prefix: a gap"
    );
}
