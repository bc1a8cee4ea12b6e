//! Sleep and wake against the test control plane: a tenant put to sleep by its spec and by
//! idleness, one kept awake by a client, its workloads back on wake with claims and Service
//! addresses unchanged, an upgrade and an operator restart while it sleeps.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolumeClaim, Pod, ResourceQuota, Secret, Service,
};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tenantplane_api::conditions::{READY, SYNCED};
use tenantplane_api::{Phase, SleepCause, TenantCluster};
use tenantplane_controller::names;
use tenantplane_syncer::naming::synced_selector;
use tenantplane_testenv::eventually;

/// How long an idle tenant may take to fall asleep past its `afterIdle`: the reads of its
/// activity are at most 15 s apart for `afterIdle: 1m`, and a reconcile may be busy.
const FALLS_ASLEEP_WITHIN: Duration = Duration::from_secs(150);

fn tenants(host: &Client, ns: &str) -> Api<TenantCluster> {
    Api::namespaced(host.clone(), ns)
}

async fn patch_spec(host: &Client, ns: &str, name: &str, spec: serde_json::Value) {
    tenants(host, ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .unwrap();
}

/// What `tenantplane wake` writes (the annotation; the spec too when `spec_too`).
async fn request_wake(host: &Client, ns: &str, name: &str, spec_too: bool) {
    tenantplane_controller::wake::request_wake(host, ns, name, spec_too)
        .await
        .unwrap();
}

/// The reasons of the TenantClusters' Events in `ns`.
fn event_reasons(ns: &str) -> String {
    tenantplane_testenv::kubectl(&[
        "get",
        "events",
        "-n",
        ns,
        "--field-selector",
        "involvedObject.kind=TenantCluster",
        "-o",
        "jsonpath={.items[*].reason}",
    ])
    .unwrap()
}

/// Once the tenant is Ready, the operator removes the wake request.
async fn wake_request_answered(host: &Client, ns: &str, name: &str) {
    let removed = eventually(WAIT, || async {
        let tc = tenants(host, ns).get(name).await.ok()?;
        (!tc.annotations().contains_key(names::WAKE)).then_some(())
    })
    .await;
    assert!(removed.is_some(), "the wake request was never removed");
}

/// The host copies of the tenant's pods.
async fn copies(host: &Client, ns: &str, name: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(host.clone(), ns)
        .list(&ListParams::default().labels(&synced_selector(name)))
        .await
        .unwrap()
        .items
}

/// A Deployment of `replicas` pods, a Service in front of it and a claim, in the tenant's
/// `default` namespace.
async fn workload(tenant: &Client, replicas: i32) {
    let pp = PostParams::default();
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [container("web")]}
            }
        }
    }))
    .unwrap();
    Api::<Deployment>::namespaced(tenant.clone(), "default")
        .create(&pp, &deployment)
        .await
        .unwrap();
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}
    }))
    .unwrap();
    Api::<Service>::namespaced(tenant.clone(), "default")
        .create(&pp, &service)
        .await
        .unwrap();
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(tenant.clone(), "default")
        .create(&pp, &claim)
        .await
        .unwrap();
}

/// Wait until `n` Running host copies of the tenant's `web` pods exist.
async fn web_running(host: &Client, ns: &str, name: &str, n: usize) -> Vec<Pod> {
    let last = std::sync::Mutex::new(String::new());
    let found = eventually(WAIT, || async {
        let running: Vec<Pod> = copies(host, ns, name)
            .await
            .into_iter()
            .filter(|p| p.name_any().starts_with("web-"))
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .collect();
        *last.lock().unwrap() = format!("{} running", running.len());
        (running.len() == n).then_some(running)
    })
    .await;
    found.unwrap_or_else(|| panic!("{n} web copies never ran: {}", last.lock().unwrap()))
}

/// What must stay while a tenant sleeps: Service addresses, claims (by UID) and the Secrets.
#[derive(Debug, PartialEq)]
struct Kept {
    service_ips: Vec<(String, String)>,
    claims: Vec<(String, String)>,
    secrets: Vec<String>,
}

async fn kept(host: &Client, ns: &str) -> Kept {
    let mut service_ips: Vec<(String, String)> = Api::<Service>::namespaced(host.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| {
            let ip = s.spec.and_then(|s| s.cluster_ip).unwrap_or_default();
            (s.metadata.name.unwrap_or_default(), ip)
        })
        .collect();
    service_ips.sort();
    let mut claims: Vec<(String, String)> =
        Api::<PersistentVolumeClaim>::namespaced(host.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|c| (c.name_any(), c.uid().unwrap_or_default()))
            .collect();
    claims.sort();
    let mut secrets: Vec<String> = Api::<Secret>::namespaced(host.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| s.name_any())
        // Service-account token copies belong to the pods, which go.
        .filter(|n| !n.ends_with(".token"))
        .collect();
    secrets.sort();
    Kept {
        service_ips,
        claims,
        secrets,
    }
}

#[tokio::test]
async fn a_tenant_asleep_by_its_spec_gives_back_its_pods_and_keeps_its_data() {
    let mut world = ReadyTenant::start("sl-spec").await;
    let (ns, host, tenant, name) = (
        &world.ns.name.clone(),
        &world.host.clone(),
        &world.tenant.clone(),
        &world.name.clone(),
    );
    workload(tenant, 2).await;
    let before_pods = web_running(host, ns, name, 2).await;
    let claim_copied = eventually(WAIT, || async {
        Api::<PersistentVolumeClaim>::namespaced(host.clone(), ns)
            .get_opt("data-x-default-x-dev")
            .await
            .ok()?
    })
    .await;
    assert!(claim_copied.is_some(), "the claim never reached the host");
    let before = kept(host, ns).await;
    eprintln!("before sleep: {before:?}");

    patch_spec(host, ns, name, json!({"sleep": {"asleep": true}})).await;
    let asleep = wait_for_phase(host, ns, name, Phase::Sleeping).await;
    let status = asleep.status.as_ref().unwrap();
    let sleep = status.sleep.as_ref().expect("status.sleep");
    assert_eq!(sleep.cause, SleepCause::Requested);
    assert_eq!(sleep.waking_since, None);
    assert_eq!(status.endpoint, None, "no endpoint while nothing answers");
    let ready = condition(&asleep, READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Sleeping")
    );
    assert!(
        ready
            .message
            .contains(&format!("tenantplane wake {name} -n {ns}")),
        "says how to wake it: {}",
        ready.message
    );
    let synced = condition(&asleep, SYNCED);
    assert_eq!(
        (synced.status.as_str(), synced.reason.as_str()),
        ("False", "SyncPaused")
    );

    // Nothing of it runs: no pod copies, no control-plane pod, and no pods in its quota.
    let gone = eventually(WAIT, || async {
        let pods = Api::<Pod>::namespaced(host.clone(), ns)
            .list(&ListParams::default())
            .await
            .ok()?;
        let quota = Api::<ResourceQuota>::namespaced(host.clone(), ns)
            .get(&format!("{name}-quota"))
            .await
            .ok()?;
        let used = quota.status?.used?.get("pods")?.0.clone();
        (pods.items.is_empty() && used == "0").then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "pods are left on the host or counted in its quota: {:?}",
        Api::<Pod>::namespaced(host.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|p| p.name_any())
            .collect::<Vec<_>>()
    );
    let statefulset = Api::<StatefulSet>::namespaced(host.clone(), ns)
        .get(&names::statefulset(name))
        .await
        .unwrap();
    assert_eq!(statefulset.spec.unwrap().replicas, Some(0));
    assert_eq!(
        kept(host, ns).await,
        before,
        "Services, claims and Secrets stay"
    );
    let events = event_reasons(ns);
    assert!(
        events.contains("Sleeping"),
        "an Event says it sleeps: {events}"
    );

    // The operator restarted while it sleeps: it stays asleep, since the same time.
    world.operator.restart_controller(&world.ns);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let still = wait_for_phase(host, ns, name, Phase::Sleeping).await;
    assert_eq!(
        still.status.as_ref().unwrap().sleep.as_ref().unwrap().since,
        sleep.since,
        "the same sleep"
    );
    assert!(copies(host, ns, name).await.is_empty());

    // Wake: the workload comes back, with the same Service addresses and claims.
    request_wake(host, ns, name, true).await;
    let awake = wait_for_phase(host, ns, name, Phase::Ready).await;
    assert_eq!(awake.status.as_ref().unwrap().sleep, None);
    wake_request_answered(host, ns, name).await;
    let after_pods = web_running(host, ns, name, 2).await;
    let names_of = |pods: &[Pod]| pods.iter().map(|p| p.name_any()).collect::<Vec<_>>();
    eprintln!(
        "web copies before {:?}, after {:?}",
        names_of(&before_pods),
        names_of(&after_pods)
    );
    assert_eq!(
        kept(host, ns).await,
        before,
        "Services, claims and Secrets as before"
    );
    let events = event_reasons(ns);
    assert!(
        events.contains("Waking"),
        "an Event says it wakes: {events}"
    );
    // The tenant answers again, with its objects.
    let tenant = tenant_client(host, ns, name).await;
    let deployment = Api::<Deployment>::namespaced(tenant.clone(), "default")
        .get("web")
        .await
        .unwrap();
    assert_eq!(deployment.spec.unwrap().replicas, Some(2));
    drop(world);
}

#[tokio::test]
async fn an_idle_tenant_falls_asleep_and_a_wake_request_wakes_it() {
    let world = TenantSetup::seed()
        .edit(|tc| tc.spec.sleep.after_idle = Some("1m".into()))
        .start("sl-idle")
        .await;
    let (ns, host, name) = (&world.ns.name, &world.host, &world.name);
    let started = std::time::Instant::now();
    let asleep = eventually(FALLS_ASLEEP_WITHIN, || async {
        let tc = tenants(host, ns).get(name).await.ok()?;
        (tc.status.as_ref()?.phase == Some(Phase::Sleeping)).then_some(tc)
    })
    .await
    .unwrap_or_else(|| panic!("an idle tenant with afterIdle 1m did not sleep"));
    eprintln!("asleep after {:.0?} idle", started.elapsed());
    let sleep = asleep.status.as_ref().unwrap().sleep.clone().unwrap();
    assert_eq!(sleep.cause, SleepCause::Idle);
    let ready = condition(&asleep, READY);
    assert!(
        ready.message.contains("after 1m without a request"),
        "{}",
        ready.message
    );
    assert!(
        !asleep.spec.sleep.asleep,
        "idleness does not touch the spec"
    );

    // Asleep for idleness, it stays so without a request...
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        tenants(host, ns)
            .get(name)
            .await
            .unwrap()
            .status
            .unwrap()
            .phase,
        Some(Phase::Sleeping)
    );
    // ... and a wake request (the annotation alone) wakes it.
    request_wake(host, ns, name, false).await;
    wait_for_phase(host, ns, name, Phase::Ready).await;
    wake_request_answered(host, ns, name).await;
    // Idle again, it sleeps again: the old request does not keep it awake.
    let again = eventually(FALLS_ASLEEP_WITHIN, || async {
        let tc = tenants(host, ns).get(name).await.ok()?;
        (tc.status.as_ref()?.phase == Some(Phase::Sleeping)).then_some(())
    })
    .await;
    assert!(again.is_some(), "it never fell asleep again");
}

#[tokio::test]
async fn a_tenant_used_every_ten_seconds_stays_awake() {
    let world = TenantSetup::seed()
        .edit(|tc| tc.spec.sleep.after_idle = Some("1m".into()))
        .start("sl-busy")
        .await;
    let (ns, host, name, tenant) = (&world.ns.name, &world.host, &world.name, &world.tenant);
    let namespaces: Api<Namespace> = Api::all(tenant.clone());
    // A person's client, every 10 s, for well over afterIdle: never asleep.
    for round in 0..15 {
        namespaces.list(&ListParams::default()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(10)).await;
        let tc = tenants(host, ns).get(name).await.unwrap();
        let phase = tc.status.as_ref().and_then(|s| s.phase);
        assert_eq!(phase, Some(Phase::Ready), "round {round}: {:?}", tc.status);
    }
    // The client stops: the tenant sleeps after afterIdle.
    let stopped = std::time::Instant::now();
    let asleep = eventually(FALLS_ASLEEP_WITHIN, || async {
        let tc = tenants(host, ns).get(name).await.ok()?;
        (tc.status.as_ref()?.phase == Some(Phase::Sleeping)).then_some(())
    })
    .await;
    assert!(
        asleep.is_some(),
        "it never fell asleep once the client stopped"
    );
    let idle = stopped.elapsed();
    eprintln!("asleep {idle:.0?} after the last request");
    assert!(idle >= Duration::from_secs(45), "too soon: {idle:?}");
}

#[tokio::test]
async fn an_upgrade_while_asleep_waits_for_the_wake_then_runs() {
    let world = ReadyTenant::start("sl-upgrade").await;
    let (ns, host, name) = (&world.ns.name, &world.host, &world.name);
    patch_spec(host, ns, name, json!({"sleep": {"asleep": true}})).await;
    wait_for_phase(host, ns, name, Phase::Sleeping).await;
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
    let statefulsets = Api::<StatefulSet>::namespaced(host.clone(), ns);
    let before = image(&statefulsets.get(&names::statefulset(name)).await.unwrap());
    patch_spec(host, ns, name, json!({"kubernetesVersion": "v1.31.0"})).await;
    // Nothing can be checked or snapshotted while asleep: status says the upgrade waits for
    // the wake, and the template keeps the version it runs.
    let tenants: Api<TenantCluster> = Api::namespaced(host.clone(), ns);
    let waiting = eventually(WAIT, || async {
        let tc = tenants.get(name).await.ok()?;
        let upgrade = tc.status.as_ref()?.upgrade.clone()?;
        (upgrade.reason.as_deref() == Some("WaitingForWake")
            && tc.status.as_ref()?.observed_generation == tc.metadata.generation)
            .then_some(upgrade)
    })
    .await
    .expect("status never said the upgrade waits for the wake");
    assert_eq!(
        (waiting.from.as_str(), waiting.to.as_str()),
        ("v1.30.4", "v1.31.0")
    );
    let held = statefulsets.get(&names::statefulset(name)).await.unwrap();
    assert_eq!(image(&held), before);
    assert_eq!(held.spec.as_ref().unwrap().replicas, Some(0));
    wait_for_phase(host, ns, name, Phase::Sleeping).await;
    // Awake, it is checked and upgraded (no store here: without a snapshot, as status says).
    request_wake(host, ns, name, true).await;
    let upgraded = eventually(Duration::from_secs(180), || async {
        let pod = Api::<Pod>::namespaced(host.clone(), ns)
            .get(&names::control_plane_pod(name))
            .await
            .ok()?;
        let image = pod.spec?.containers[0].image.clone()?;
        let tc = tenants.get(name).await.ok()?;
        (image.contains("v1.31.0") && tc.status.as_ref()?.phase == Some(Phase::Ready)).then_some(tc)
    })
    .await
    .expect("the tenant never ran the new version after the wake");
    let upgrade = upgraded.status.unwrap().upgrade.unwrap();
    assert_eq!(
        upgrade.reason.as_deref(),
        Some("NoSnapshotStore"),
        "{upgrade:?}"
    );
}

#[tokio::test]
async fn after_idle_is_checked_at_admission_with_the_format_in_the_message() {
    let world = TestHost::start("sl-admission").await;
    let (ns, host) = (&world.ns.name, &world.host);
    for (bad, says) in [
        ("30s", "sleep.afterIdle must be at least 1m; got 30s"),
        (
            "soon",
            "sleep.afterIdle must be a duration such as 30m, 2h or 1h30m",
        ),
        (
            "1d",
            "sleep.afterIdle must be a duration such as 30m, 2h or 1h30m",
        ),
    ] {
        let mut tc = example(ns);
        tc.spec.sleep.after_idle = Some(bad.into());
        let err = tenants(host, ns)
            .create(&PostParams::default(), &tc)
            .await
            .expect_err(bad);
        let text = err.to_string();
        assert!(text.contains(says), "{bad}: {text}");
    }
    let mut tc = example(ns);
    tc.spec.sleep.after_idle = Some("1h30m".into());
    tenants(host, ns)
        .create(&PostParams::default(), &tc)
        .await
        .unwrap();
}

#[tokio::test]
async fn the_operator_restarted_while_a_tenant_wakes_finishes_the_wake() {
    let mut world = ReadyTenant::start("sl-restart").await;
    let (ns, host, name) = (
        &world.ns.name.clone(),
        &world.host.clone(),
        &world.name.clone(),
    );
    patch_spec(host, ns, name, json!({"sleep": {"asleep": true}})).await;
    wait_for_phase(host, ns, name, Phase::Sleeping).await;
    request_wake(host, ns, name, true).await;
    // The first waking status, then the operator goes and comes back.
    wait_for_status(host, ns, name, "began to wake", |s| {
        s.sleep.as_ref().is_some_and(|s| s.waking_since.is_some())
    })
    .await;
    world.operator.restart_controller(&world.ns);
    let awake = wait_for_phase(host, ns, name, Phase::Ready).await;
    assert_eq!(awake.status.unwrap().sleep, None);
    wake_request_answered(host, ns, name).await;
    drop(world);
}
