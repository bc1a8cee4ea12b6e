//! Snapshots of a `kubernetes` tenant on the real node: its snapshot agent runs from the operator's
//! image (which the test world builds from this binary and serves from its registry), pulled by
//! the kubelet like the pod's other images; the operator copies the datastore through it into a
//! real S3 store, and a restore in place goes back through the pod's init container.

use super::distribution::{control_plane_pod, kubernetes_tenant, ready_again, write_config_map};
use super::*;
use common::snapshots::{restore_waiting, s3, snapshot_waiting, store};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use tenantplane_api::{SnapshotPhase, TenantSnapshot, conditions};
use tenantplane_controller::names;
use tenantplane_testenv::binaries::kubernetes_versions;

#[tokio::test(flavor = "multi_thread")]
async fn a_kubernetes_tenant_is_snapshotted_and_restored_through_its_agent_on_the_real_node() {
    use_real_nodes();
    let (current, _) = kubernetes_versions().unwrap();
    let world = kubernetes_tenant("k8s-snap", &current).await;
    let (ns, host, tenant) = (&world.ns.name, &world.host, &world.tenant);

    // The agent beside kine, from the operator's image, running: a real pull and a real process.
    let pod = control_plane_pod(&world).await;
    let agent = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .find(|c| c.name == "snapshot-agent")
        .expect("the pod runs the snapshot agent");
    assert_eq!(agent.image.as_deref(), Some(names::DEFAULT_AGENT_IMAGE));
    let status = container(&pod, "snapshot-agent").expect("the agent's status");
    assert!(status.ready, "the agent is not ready: {status:?}");
    assert!(
        status.image.ends_with(names::DEFAULT_AGENT_IMAGE),
        "{}",
        status.image
    );
    let before = pod.uid().unwrap();

    let store = store(host, ns, &s3().await.endpoint).await;
    write_config_map(tenant, "kept", "before").await;
    let (code, out, err) = snapshot_waiting(&world.name, ns, "first", &store).await;
    assert_eq!(code, 0, "snapshot create failed: {out}\n{err}");
    let snap: TenantSnapshot = Api::namespaced(host.clone(), ns)
        .get("first")
        .await
        .unwrap();
    assert_eq!(snap.phase(), SnapshotPhase::Completed, "{:?}", snap.status);
    let status = snap.status.unwrap();
    assert_eq!(status.distribution.as_deref(), Some("kubernetes"));
    assert_eq!(status.kubernetes_version.as_deref(), Some(current.as_str()));
    assert!(status.size.unwrap_or(0) > 0, "an empty snapshot");

    // After the snapshot: one object deleted, one made. The restore undoes both.
    let config_maps = Api::<ConfigMap>::namespaced(tenant.clone(), "default");
    config_maps
        .delete("kept", &Default::default())
        .await
        .unwrap();
    write_config_map(tenant, "later", "after").await;
    let (code, out, err) = restore_waiting(&world.name, ns, "first", "5m").await;
    assert_eq!(code, 0, "restore failed: {out}\n{err}");
    let tc = ready_again(&world, "the restore").await;
    let restored = conditions::find(&tc.status.unwrap().conditions, conditions::RESTORED)
        .cloned()
        .expect("a Restored condition");
    assert_eq!(restored.status, "True", "{restored:?}");

    // A new pod (the restore's init container ran on the node) with the snapshot's data.
    let pod = control_plane_pod(&world).await;
    assert_ne!(pod.uid().unwrap(), before, "the pod was not replaced");
    let init = container(&pod, "snapshot-restore");
    assert!(
        init.is_some_and(|c| c
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .is_some_and(|t| t.exit_code == 0)),
        "the restore's init container did not finish cleanly: {init:?}"
    );
    let tenant = common::tenant_client(host, ns, &world.name).await;
    let config_maps = Api::<ConfigMap>::namespaced(tenant, "default");
    let kept = config_maps.get_opt("kept").await.unwrap();
    assert_eq!(
        kept.and_then(|c| c.data).map(|d| d["written"].clone()),
        Some("before".to_string()),
        "the ConfigMap deleted after the snapshot did not come back"
    );
    assert!(
        config_maps.get_opt("later").await.unwrap().is_none(),
        "the ConfigMap made after the snapshot is still there"
    );
}
