//! The control plane's life as a real cluster needs it, on the real test control plane: Ready
//! only once a first pod is taken, the headless Service that governs the StatefulSet (and the migration of tenants made before it),
//! the data claim deleted with the tenant, version upgrades that read as Provisioning, and the
//! endpoint only while the tenant answers (also when an older operator wrote it).

mod common;

use std::collections::BTreeSet;

use common::*;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tenantplane_api::{Phase, TenantCluster};
use tenantplane_controller::names;
use tenantplane_testenv::eventually;

async fn put_config_map(tenant: &Client, name: &str) {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "data": {"kept": "yes"},
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
}

fn owned_by(meta: &kube::api::ObjectMeta, tc: &TenantCluster) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| Some(&o.uid) == tc.metadata.uid.as_ref() && o.controller == Some(true))
}

#[tokio::test]
async fn a_pod_applied_the_moment_the_tenant_reads_ready_is_taken() {
    let world = TestHost::start("lc-first").await;
    let ns = &world.ns;
    example_ready(ns).await;
    // No retry: a script that waits for Ready and then applies gets one try.
    let tenant = tenant_client(&ns.client, &ns.name, "dev").await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "first", "namespace": "default"},
        "spec": {"containers": [container("web")]},
    }))
    .unwrap();
    let made = Api::<Pod>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await;
    assert!(made.is_ok(), "the first pod was refused: {made:?}");
    // And its DNS has a ready endpoint: a first pod finds names.
    let slices = Api::<EndpointSlice>::namespaced(tenant, "kube-system")
        .list(&ListParams::default().labels("kubernetes.io/service-name=kube-dns"))
        .await
        .unwrap();
    let ready = slices
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .any(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true));
    assert!(ready, "the tenant's DNS has no ready endpoint: {slices:?}");
}

#[tokio::test]
async fn a_headless_service_governs_the_statefulset_and_old_tenants_move_to_it_keeping_data() {
    let mut world = TestHost::start("lc-headless").await;
    let ns = &world.ns;
    let tc = example_ready(ns).await;
    let services: Api<Service> = Api::namespaced(ns.client.clone(), &ns.name);
    let statefulsets: Api<StatefulSet> = Api::namespaced(ns.client.clone(), &ns.name);

    // Both Services, owned by the tenant: one with a cluster IP, one headless.
    let api = services.get("dev").await.unwrap();
    let ip = api.spec.as_ref().unwrap().cluster_ip.clone().unwrap();
    assert!(ip.starts_with("10.96."), "{ip}");
    let headless = services.get("dev-headless").await.unwrap();
    let spec = headless.spec.as_ref().unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(spec.publish_not_ready_addresses, Some(true));
    assert!(owned_by(&api.metadata, &tc) && owned_by(&headless.metadata, &tc));
    let sts = statefulsets.get("dev").await.unwrap();
    let sts_spec = sts.spec.as_ref().unwrap();
    assert_eq!(sts_spec.service_name.as_deref(), Some("dev-headless"));
    // The range k3s is given is the one the host says it allocates from.
    let args = sts_spec.template.spec.as_ref().unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    assert!(
        args.contains(&format!(
            "--service-cidr={}",
            tenantplane_testenv::host_cluster::SERVICE_CIDR
        )),
        "{args:?}"
    );

    let tenant = tenant_client(&ns.client, &ns.name, "dev").await;
    put_config_map(&tenant, "from-before").await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ns.client.clone(), &ns.name);
    let claim_uid = claims.get("data-dev-0").await.unwrap().uid();

    // What an earlier version left: the StatefulSet governed by the API Service, no headless one.
    world.operator.tasks[0].abort();
    let orphan = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        ..Default::default()
    };
    statefulsets.delete("dev", &orphan).await.unwrap();
    let gone = eventually(WAIT, || async {
        statefulsets
            .get_opt("dev")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    assert!(gone.is_some(), "the StatefulSet went");
    let mut old = sts.clone();
    old.metadata = kube::api::ObjectMeta {
        name: sts.metadata.name.clone(),
        namespace: sts.metadata.namespace.clone(),
        labels: sts.metadata.labels.clone(),
        owner_references: sts.metadata.owner_references.clone(),
        ..Default::default()
    };
    old.status = None;
    old.spec.as_mut().unwrap().service_name = Some("dev".into());
    statefulsets
        .create(&PostParams::default(), &old)
        .await
        .unwrap();
    services
        .delete("dev-headless", &DeleteParams::default())
        .await
        .unwrap();

    world.operator.restart_controller(ns);
    let migrated = eventually(WAIT, || async {
        let sts = statefulsets.get_opt("dev").await.ok()??;
        let governed = sts.spec.as_ref()?.service_name.as_deref() == Some("dev-headless");
        let headless = services.get_opt("dev-headless").await.ok()?.is_some();
        (governed && headless && sts.metadata.deletion_timestamp.is_none()).then_some(sts)
    })
    .await
    .expect("the StatefulSet is recreated with the headless Service");
    assert!(owned_by(&migrated.metadata, &tc));
    wait_for_phase(&ns.client, &ns.name, "dev", Phase::Ready).await;
    assert_eq!(
        claims.get("data-dev-0").await.unwrap().uid(),
        claim_uid,
        "the same data claim"
    );
    let tenant = tenant_client(&ns.client, &ns.name, "dev").await;
    let kept = eventually(WAIT, || async {
        Api::<ConfigMap>::namespaced(tenant.clone(), "default")
            .get_opt("from-before")
            .await
            .ok()?
    })
    .await;
    assert!(kept.is_some(), "the tenant's data survived the migration");
}

#[tokio::test]
async fn a_deleted_tenant_takes_its_data_and_a_new_one_of_the_same_name_starts_empty() {
    let world = ReadyTenant::start("lc-data").await;
    let (ns, tenant, tc) = (&world.ns, &world.tenant, &world.ready);
    put_config_map(tenant, "from-the-first").await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ns.client.clone(), &ns.name);
    let first = claims.get("data-dev-0").await.unwrap();
    assert!(
        first
            .owner_references()
            .iter()
            .any(|o| o.kind == "StatefulSet" && o.name == "dev"),
        "the retention policy makes the StatefulSet own its claim: {:?}",
        first.owner_references()
    );
    // A claim an earlier, larger control plane left, owned by nothing: the finalizer's to delete.
    let mut stray = PersistentVolumeClaim {
        metadata: kube::api::ObjectMeta {
            name: Some(names::data_claim("dev", 1)),
            labels: Some(names::control_plane_selector("dev")),
            ..Default::default()
        },
        spec: first.spec.clone(),
        ..Default::default()
    };
    if let Some(spec) = stray.spec.as_mut() {
        spec.volume_name = None;
    }
    claims.create(&PostParams::default(), &stray).await.unwrap();

    let tenants: Api<TenantCluster> = Api::namespaced(ns.client.clone(), &ns.name);
    tenants
        .delete("dev", &DeleteParams::default())
        .await
        .unwrap();
    let cleaned = eventually(WAIT, || async {
        let left: Vec<String> = claims
            .list(&Default::default())
            .await
            .ok()?
            .items
            .iter()
            .map(|c| c.name_any())
            .collect();
        let tc_gone = tenants.get_opt("dev").await.ok()?.is_none();
        (tc_gone && left.is_empty()).then_some(())
    })
    .await;
    assert!(
        cleaned.is_some(),
        "claims left: {:?}",
        claims
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|c| c.name_any())
            .collect::<Vec<_>>()
    );

    let again = create_ready(&ns.client, &example(&ns.name)).await;
    assert_ne!(again.uid(), tc.uid());
    let second = claims.get("data-dev-0").await.unwrap();
    assert_ne!(second.uid(), first.uid(), "a new claim");
    let tenant = tenant_client(&ns.client, &ns.name, "dev").await;
    let old = Api::<ConfigMap>::namespaced(tenant, "default")
        .get_opt("from-the-first")
        .await
        .unwrap();
    assert!(old.is_none(), "the new tenant sees nothing of the old one");
}

#[tokio::test]
async fn an_upgrade_reads_as_provisioning_and_the_endpoint_is_there_only_while_it_answers() {
    let world = TestHost::start("lc-upgrade").await;
    let ns = &world.ns;
    let ready = example_ready(ns).await;
    let endpoint = names::endpoint("dev", &ns.name);
    assert_eq!(
        ready.status.as_ref().unwrap().endpoint.as_deref(),
        Some(endpoint.as_str())
    );
    let tenants: Api<TenantCluster> = Api::namespaced(ns.client.clone(), &ns.name);
    // Every status the tenant passes through until it is Ready on the new version.
    let watch = watcher(
        tenants.clone(),
        watcher::Config::default().fields("metadata.name=dev"),
    )
    .applied_objects();
    let seen = tokio::spawn(async move {
        let mut seen = Vec::new();
        let mut left_ready = false;
        let mut watch = std::pin::pin!(watch);
        while let Some(Ok(tc)) = watch.next().await {
            let status = tc.status.clone().unwrap_or_default();
            let phase = status.phase;
            // Each condition's reason, so a failure says why the tenant read what it read.
            let reasons: Vec<String> = status
                .conditions
                .iter()
                .map(|c| format!("{}={}: {}", c.type_, c.reason, c.message))
                .collect();
            seen.push((phase, status.endpoint.clone(), reasons));
            left_ready |= phase != Some(Phase::Ready);
            if left_ready && phase == Some(Phase::Ready) && tc.spec.kubernetes_version == "v1.31.0"
            {
                break;
            }
        }
        seen
    });
    let statefulsets: Api<StatefulSet> = Api::namespaced(ns.client.clone(), &ns.name);
    let before = statefulsets.get("dev").await.unwrap();
    tenants
        .patch(
            "dev",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"kubernetesVersion": "v1.31.0"}})),
        )
        .await
        .unwrap();
    let seen = tokio::time::timeout(WAIT * 2, seen)
        .await
        .expect("the tenant is Ready on the new version")
        .unwrap();
    let after = statefulsets.get("dev").await.unwrap();
    let image = |s: &StatefulSet| {
        s.spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
            .image
            .clone()
            .unwrap()
    };
    assert_eq!(image(&before), "rancher/k3s:v1.30.4-k3s1");
    assert_eq!(image(&after), "rancher/k3s:v1.31.0-k3s1");
    let phases: BTreeSet<String> = seen.iter().map(|(p, _, _)| format!("{p:?}")).collect();
    assert!(
        !seen.iter().any(|(p, _, _)| *p == Some(Phase::Degraded)),
        "an upgrade is not Degraded: {seen:?}"
    );
    assert!(
        seen.iter().any(|(p, _, _)| *p == Some(Phase::Provisioning)),
        "it shows Provisioning while the new control plane comes up: {phases:?}"
    );
    for (phase, ep, _) in &seen {
        match phase {
            Some(Phase::Ready) => assert_eq!(ep.as_deref(), Some(endpoint.as_str())),
            _ => assert_eq!(ep, &None, "no endpoint while {phase:?}"),
        }
    }
}

#[tokio::test]
async fn a_wedged_control_plane_is_restarted_by_its_liveness_probe() {
    let world = TestHost::start("lc-wedged").await;
    let ns = &world.ns;
    let operator = &world.operator;
    example_ready(ns).await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(ns.client.clone(), &ns.name);
    let restarts = |pod: &k8s_openapi::api::core::v1::Pod| {
        pod.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .map_or(0, |c| c.restart_count)
    };
    let before = restarts(&pods.get("dev-0").await.unwrap());
    // Stopped, not dead: the process is there and answers nothing, as a wedged k3s.
    assert!(operator.runtime.wedge_api_server(&ns.name, "dev-0"));
    wait_for_phase(&ns.client, &ns.name, "dev", Phase::Degraded).await;
    // The pod's liveness window (a minute without /livez), the restart back-off, a fresh start.
    let tenants: Api<TenantCluster> = Api::namespaced(ns.client.clone(), &ns.name);
    let back = eventually(WAIT * 3, || async {
        let tc = tenants.get("dev").await.ok()?;
        (tc.status?.phase == Some(Phase::Ready)).then_some(())
    })
    .await;
    assert!(back.is_some(), "the liveness probe restarted it");
    let after = restarts(&pods.get("dev-0").await.unwrap());
    assert!(after > before, "restartCount {before} → {after}");
}

#[tokio::test]
async fn a_status_merge_patches_wrote_is_taken_over_so_its_stale_endpoint_goes() {
    tenantplane_testenv::install_crds_and_policies();
    let ns = tenantplane_testenv::namespace("status-upgrade").await;
    let tenants: Api<TenantCluster> = Api::namespaced(ns.client.clone(), &ns.name);
    tenants
        .create(&PostParams::default(), &example(&ns.name))
        .await
        .unwrap();
    // As an operator from before server-side apply left it: a merge patch's Update entry owns it.
    let stale =
        json!({"status": {"phase": "Ready", "endpoint": "https://stale", "observedGeneration": 1}});
    tenants
        .patch_status("dev", &PatchParams::default(), &Patch::Merge(stale))
        .await
        .unwrap();
    let _operator = start_operator(&ns);
    let provisioning = eventually(WAIT, || async {
        let tc = tenants.get("dev").await.ok()?;
        (tc.status.as_ref()?.phase != Some(Phase::Ready)).then_some(tc)
    })
    .await
    .expect("the operator never wrote the status");
    assert_eq!(
        provisioning.status.unwrap().endpoint,
        None,
        "the endpoint stays only while the tenant answers"
    );
}
