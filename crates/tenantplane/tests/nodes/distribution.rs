//! The `kubernetes` distribution on a real node: the operator's pod (kine, kube-apiserver and
//! kube-controller-manager, from the images testenv builds under upstream's names and serves
//! from its registry) runs exactly as written, by the kubelet; the local runtime never touches
//! it. The lifecycle the k3s tenant's tests walk, walked again: Ready with its kubeconfig, sync
//! with logs and exec, `connect`, a datastore crash, certificate rotation, the pod replaced with
//! its data, and delete with the claim; and an upgrade from the previous minor release with the
//! data kept.

use super::*;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use tenantplane_api::{Distribution, TenantCluster};
use tenantplane_controller::names;
use tenantplane_testenv::binaries::kubernetes_versions;

/// The seed tenant with the `kubernetes` distribution at `version`, Ready, with the operator's
/// kubelet endpoint, on this binary's real node.
pub(crate) async fn kubernetes_tenant(prefix: &str, version: &str) -> ReadyTenant {
    use_real_nodes();
    let version = version.to_string();
    TestHost::start_with_kubelet(prefix)
        .await
        .ready(TenantSetup::seed().edit(move |tc| {
            tc.spec.control_plane.distribution = Distribution::Kubernetes;
            tc.spec.kubernetes_version = version;
        }))
        .await
}

/// The tenant's control-plane pod on the host.
pub(crate) async fn control_plane_pod(world: &ReadyTenant) -> Pod {
    find_control_plane_pod(world)
        .await
        .expect("the control-plane pod")
}

/// The tenant's control-plane pod on the host, if there is one now: between a pod's removal and
/// its StatefulSet making the next one there is none.
async fn find_control_plane_pod(world: &ReadyTenant) -> Option<Pod> {
    Api::<Pod>::namespaced(world.host.clone(), &world.ns.name)
        .get_opt(&names::control_plane_pod(&world.name))
        .await
        .ok()
        .flatten()
}

/// The Kubernetes version the tenant API server says it runs.
async fn served_version(tenant: &Client) -> String {
    tenant.apiserver_version().await.unwrap().git_version
}

/// Kill the process of container `name` of `pod` (what a crash does): the process whose cgroup
/// names the container's ID.
fn kill_container_process(pod: &Pod, name: &str) -> bool {
    let Some(id) = container(pod, name)
        .and_then(|c| c.container_id.as_deref())
        .and_then(|id| id.rsplit("://").next())
    else {
        return false;
    };
    let mut killed = false;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        if cgroup.contains(id) {
            // It may be gone already.
            killed |= std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()
                .is_ok_and(|s| s.success());
        }
    }
    killed
}

/// Wait until the TenantCluster is Ready again after `what`, its pod Ready with the new run.
pub(crate) async fn ready_again(world: &ReadyTenant, what: &str) -> TenantCluster {
    let api = Api::<TenantCluster>::namespaced(world.host.clone(), &world.ns.name);
    let ready = eventually(Duration::from_secs(300), || async {
        let tc = api.get(&world.name).await.ok()?;
        let phase = tc.status.as_ref()?.phase?;
        (phase == tenantplane_api::Phase::Ready
            && tc.status.as_ref()?.observed_generation == tc.metadata.generation)
            .then_some(tc)
    })
    .await;
    match ready {
        Some(tc) => tc,
        None => {
            let status = api.get(&world.name).await.ok().and_then(|tc| tc.status);
            panic!(
                "the tenant was not Ready again after {what}: {status:#?}\n{}",
                pod_report(world).await
            )
        }
    }
}

/// Write ConfigMap `default/name` in the tenant, its `written` key holding `text`.
pub(crate) async fn write_config_map(tenant: &Client, name: &str, text: &str) -> ConfigMap {
    let map: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name}, "data": {"written": text}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &map)
        .await
        .unwrap()
}

/// The control-plane pod's status and its containers' last logs, for a failure's message.
async fn pod_report(world: &ReadyTenant) -> String {
    control_plane_report(&world.host, &world.ns.name, &world.name).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kubernetes_tenant_runs_as_written_and_walks_its_lifecycle() {
    use_real_nodes();
    let (current, _) = kubernetes_versions().unwrap();
    let world = kubernetes_tenant("k8s-dist", &current).await;
    let (ns, host, tenant) = (&world.ns.name, &world.host, &world.tenant);

    // The pod as written, on the real node, by the kubelet: upstream's images, no runtime label.
    let pod = control_plane_pod(&world).await;
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(
        spec.node_name.as_deref(),
        Some(tenantplane_testenv::host_cluster::real_node::NODE_NAME)
    );
    assert!(!pod.labels().contains_key(names::LABEL_RUNTIME));
    // The datastore's folder, then kine and the API server as sidecars, then the controller
    // manager: it started once, after the API server was live (no exit on a first start); and
    // the snapshot agent, from the operator's image.
    let images: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .filter_map(|c| c.image.as_deref())
        .collect();
    assert_eq!(
        images,
        [
            names::DEFAULT_KINE_IMAGE.to_string(),
            names::DEFAULT_KINE_IMAGE.to_string(),
            format!("registry.k8s.io/kube-apiserver:{current}"),
            format!("registry.k8s.io/kube-controller-manager:{current}"),
            names::DEFAULT_AGENT_IMAGE.to_string(),
        ]
    );
    for name in [
        "kine",
        "kube-apiserver",
        "kube-controller-manager",
        "snapshot-agent",
    ] {
        let status = container(&pod, name).unwrap();
        assert!(status.ready || name == "kine", "{name}: {status:?}");
        assert!(status.state.as_ref().unwrap().running.is_some(), "{name}");
    }
    assert_eq!(
        container(&pod, "kube-controller-manager")
            .unwrap()
            .restart_count,
        0,
        "the controller manager starts after the API server is live"
    );
    assert_eq!(served_version(tenant).await, current);
    // The kubeconfig Secret and the component certificates.
    let secrets = Api::<Secret>::namespaced(host.clone(), ns);
    assert!(
        secrets
            .get(&names::kubeconfig_secret(&world.name))
            .await
            .is_ok()
    );
    let certs = secrets
        .get(&names::control_plane_certs(&world.name))
        .await
        .unwrap();

    // Pod Security at the door, as in a k3s tenant: the same admission file, read by upstream's
    // API server.
    let mut root = busybox("c", "id");
    root["securityContext"] = serde_json::json!({"privileged": true});
    let refused = Api::<Pod>::namespaced(tenant.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "root"}, "spec": {"containers": [root]}
            }))
            .unwrap(),
        )
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("violates PodSecurity \"restricted:latest\""),
        "{refused}"
    );

    // Data to keep through everything below.
    write_config_map(tenant, "keep", "before").await;

    // Sync, logs and exec: the tenant API server (a real pod) reaches the operator's kubelet.
    create_pod(
        tenant,
        "hello",
        serde_json::json!({"containers": [busybox("c", "echo hello from the tenant; sleep 3600")]}),
    )
    .await;
    running(tenant, "hello").await;
    let logs = logs_when(tenant, "hello", |l| l.contains("hello from the tenant")).await;
    assert!(
        logs.is_ok(),
        "logs through the tenant's own API server: {logs:?}"
    );
    // `connect`: the host's port-forward to the real pod; exec through it.
    let (connect_child, kubeconfig) = connect(&world).await;
    let said = kubectl(&kubeconfig, &["exec", "hello", "--", "hostname"], "").await;
    assert_eq!(said.1.trim(), "hello", "exec through connect: {said:?}");
    let said = kubectl(&kubeconfig, &["version", "-o", "json"], "").await;
    assert!(said.1.contains(&current), "{said:?}");
    drop(connect_child);

    let tcs = Api::<TenantCluster>::namespaced(host.clone(), ns);
    let config_maps = Api::<ConfigMap>::namespaced(tenant.clone(), "default");

    // A datastore crash: kine killed in its container; the kubelet restarts it, the tenant
    // answers again with its data.
    let before = control_plane_pod(&world).await;
    let restarts = container(&before, "kine").unwrap().restart_count;
    let killed_at = std::time::Instant::now();
    assert!(kill_container_process(&before, "kine"), "kine's process");
    let restarted = eventually(Duration::from_secs(120), || async {
        let pod = find_control_plane_pod(&world).await?;
        (container(&pod, "kine")?.restart_count > restarts).then_some(())
    })
    .await;
    assert!(restarted.is_some(), "the kubelet restarts kine");
    let kine_back = killed_at.elapsed();
    let answered = eventually(Duration::from_secs(120), || async {
        config_maps.get("keep").await.ok()
    })
    .await;
    if answered.is_none() {
        panic!(
            "the tenant does not answer {:?} after a datastore crash\n{}",
            killed_at.elapsed(),
            pod_report(&world).await
        );
    }
    eprintln!(
        "datastore crash: kine restarted after {kine_back:?}, the tenant answered after {:?}",
        killed_at.elapsed()
    );

    // Certificate rotation: the component certificates are issued again, the tenant still
    // answers (the components read the files again).
    tcs.patch(
        &world.name,
        &PatchParams::default(),
        &Patch::Merge(
            serde_json::json!({"metadata": {"annotations": {names::ROTATE_CERTIFICATES: "now"}}}),
        ),
    )
    .await
    .unwrap();
    let serving = |s: &Secret| {
        s.data
            .as_ref()
            .map(|d| d[tenantplane_controller::build::kubernetes::SERVING_CRT].clone())
    };
    let reissued = eventually(WAIT, || async {
        let now = secrets
            .get(&names::control_plane_certs(&world.name))
            .await
            .ok()?;
        (serving(&now) != serving(&certs)).then_some(())
    })
    .await;
    assert!(
        reissued.is_some(),
        "the rotation issues the certificates again"
    );
    assert!(config_maps.get("keep").await.is_ok());

    // The pod replaced: a new one, Ready, with the data.
    let old_uid = control_plane_pod(&world).await.metadata.uid;
    Api::<Pod>::namespaced(host.clone(), ns)
        .delete(
            &names::control_plane_pod(&world.name),
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    let replaced = eventually(Duration::from_secs(300), || async {
        let pod = find_control_plane_pod(&world).await?;
        (pod.metadata.uid != old_uid && tenantplane_controller::observe::pod_is_ready(&pod))
            .then_some(())
    })
    .await;
    assert!(replaced.is_some(), "a new pod, Ready");
    let tenant = &common::tenant_client(host, ns, &world.name).await;
    let kept = eventually(WAIT, || async {
        Api::<ConfigMap>::namespaced(tenant.clone(), "default")
            .get("keep")
            .await
            .ok()
    })
    .await;
    assert!(kept.is_some(), "the replaced pod keeps the data");

    // Delete: the claim goes with the tenant.
    tcs.delete(&world.name, &DeleteParams::default())
        .await
        .unwrap();
    let claims = Api::<PersistentVolumeClaim>::namespaced(host.clone(), ns);
    let gone = eventually(Duration::from_secs(120), || async {
        let left = claims.list(&Default::default()).await.ok()?;
        left.items.is_empty().then_some(())
    })
    .await;
    assert!(gone.is_some(), "the data claim goes with the tenant");
}

/// An upgrade from the previous minor release, on a real node: Provisioning while the pod rolls,
/// Ready after, the data kept.
///
/// This stalled in most runs until sqlite had a writable folder for its temporary files: kine
/// runs on a read-only root, and a write that needed one failed with "disk I/O error" (sqlite
/// looked in `/tmp`, read-only, and `.`, not the user's), which kine answers as a failed compare
/// with the current value; the new API server retried those writes forever (thousands a second),
/// none landed, and it never turned Ready. The same stall was behind a few first starts and a
/// datastore crash that never came back. `SQLITE_TMPDIR` now names the database's folder.
#[tokio::test(flavor = "multi_thread")]
async fn a_kubernetes_tenant_upgrades_one_minor_keeping_its_data() {
    use_real_nodes();
    let (current, previous) = kubernetes_versions().unwrap();
    let world = kubernetes_tenant("k8s-upgrade", &previous).await;
    let (ns, host, tenant) = (&world.ns.name, &world.host, &world.tenant);
    let pod = control_plane_pod(&world).await;
    let images: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        .filter_map(|c| c.image.as_deref())
        .collect();
    assert!(
        images.contains(&format!("registry.k8s.io/kube-apiserver:{previous}").as_str()),
        "{images:?}"
    );
    assert_eq!(served_version(tenant).await, previous);
    write_config_map(tenant, "keep", "before").await;

    // An upgrade, one minor: Provisioning while the pod rolls, Ready after, data kept.
    let tcs = Api::<TenantCluster>::namespaced(host.clone(), ns);
    tcs.patch(
        &world.name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"kubernetesVersion": current}})),
    )
    .await
    .unwrap();
    let provisioning = eventually(WAIT, || async {
        let tc = tcs.get(&world.name).await.ok()?;
        (tc.status?.phase? == tenantplane_api::Phase::Provisioning).then_some(())
    })
    .await;
    assert!(provisioning.is_some(), "an upgrade reads as Provisioning");
    ready_again(&world, "the upgrade").await;
    let tenant = &common::tenant_client(host, ns, &world.name).await;
    assert_eq!(served_version(tenant).await, current);
    let config_maps = Api::<ConfigMap>::namespaced(tenant.clone(), "default");
    assert_eq!(
        config_maps.get("keep").await.unwrap().data.unwrap()["written"],
        "before"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_k3s_tenant_becomes_a_kubernetes_one_keeping_its_data() {
    use_real_nodes();
    let (current, _) = kubernetes_versions().unwrap();
    let version = current.clone();
    // A k3s tenant (the local runtime's stand-in keeps its database on the claim, in k3s's
    // layout), at a version the kubernetes distribution's images are built for.
    let world = TestHost::start_with_kubelet("k3s-to-k8s")
        .await
        .ready(TenantSetup::seed().edit(move |tc| tc.spec.kubernetes_version = version))
        .await;
    let (ns, host, tenant) = (&world.ns.name, &world.host, &world.tenant);
    let written = write_config_map(tenant, "keep", "by the k3s tenant").await;
    let claims = Api::<PersistentVolumeClaim>::namespaced(host.clone(), ns);
    let claim = names::data_claim(&world.name, 0);
    let claim_uid = claims.get(&claim).await.unwrap().uid();

    // Without allowModeChange the change is refused, naming the switch.
    let tcs = Api::<TenantCluster>::namespaced(host.clone(), ns);
    let change = |allow: bool| {
        Patch::Merge(serde_json::json!({"spec": {
            "controlPlane": {"distribution": "kubernetes"},
            "migration": {"allowModeChange": allow},
        }}))
    };
    let refused = tcs
        .patch(&world.name, &PatchParams::default(), &change(false))
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("needs spec.migration.allowModeChange: true"),
        "{refused}"
    );

    // With it, the pod is replaced by the kubernetes distribution's, on the same claim.
    tcs.patch(&world.name, &PatchParams::default(), &change(true))
        .await
        .unwrap();
    let replaced = eventually(Duration::from_secs(300), || async {
        let pod = find_control_plane_pod(&world).await?;
        // kube-apiserver and kine run as sidecars (init containers that keep running).
        let spec = pod.spec.as_ref()?;
        let runs_kube_apiserver = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .any(|c| {
                c.image.as_deref() == Some(&format!("registry.k8s.io/kube-apiserver:{current}"))
            });
        runs_kube_apiserver.then_some(pod)
    })
    .await;
    let Some(pod) = replaced else {
        panic!(
            "the control-plane pod was never replaced by the kubernetes distribution's\n{}",
            pod_report(&world).await
        );
    };
    assert!(
        pod.labels().get(names::LABEL_RUNTIME).is_none(),
        "the local runtime's label stayed: {:?}",
        pod.labels()
    );
    ready_again(&world, "the distribution change").await;
    assert_eq!(claims.get(&claim).await.unwrap().uid(), claim_uid);
    let tenant = &common::tenant_client(host, ns, &world.name).await;
    assert_eq!(served_version(tenant).await, current);
    let config_maps = Api::<ConfigMap>::namespaced(tenant.clone(), "default");
    let read = config_maps.get("keep").await.unwrap();
    assert_eq!(read.uid(), written.uid());
    assert_eq!(read.data.unwrap()["written"], "by the k3s tenant");
    // And it writes: its database is its own to write, as the user it runs as.
    write_config_map(tenant, "after", "by the kubernetes tenant").await;
}
