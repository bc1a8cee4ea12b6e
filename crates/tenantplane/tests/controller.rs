//! The seed page's lifecycle against the real control plane: the operator (scoped to the test's
//! namespace) and the local runtime run in the test; kube-apiserver, the garbage collector, the
//! scheduler and Pod Security admission are the real ones.

use std::path::PathBuf;
use std::time::Duration;

mod common;
use common::*;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, LimitRange, Namespace, PersistentVolume, PersistentVolumeClaim, Pod, ResourceQuota,
    Secret, Service,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use tenantplane_api::conditions::{MODE_SUPPORTED, READY, SYNCED};
use tenantplane_api::{IsolationProfile, Phase, TenantCluster, TenantMode};
use tenantplane_controller::{Connector, names};
use tenantplane_testenv::kubeconfig::{RequestCounter, counting};
use tenantplane_testenv::{eventually, operator, repo_path, shared};

#[tokio::test]
async fn the_seed_lifecycle_from_apply_to_deletion() {
    let world = TestHost::start("lifecycle").await;
    let (ns, c) = (&world.ns, &world.host);
    let tenants: Api<TenantCluster> = Api::namespaced(c.clone(), &ns.name);
    tenants
        .create(&PostParams::default(), &example(&ns.name))
        .await
        .unwrap();

    let tc = wait_for_phase(c, &ns.name, "dev", Phase::Ready).await;
    let status = tc.status.clone().unwrap();
    let endpoint = format!("https://dev.{}.svc:6443", ns.name);
    assert_eq!(status.endpoint.as_deref(), Some(endpoint.as_str()));
    assert_eq!(status.observed_generation, tc.metadata.generation);
    for (type_, reason) in [
        (READY, "ControlPlaneReady"),
        (SYNCED, "SyncSucceeded"),
        (MODE_SUPPORTED, "Shared"),
    ] {
        let cond = condition(&tc, type_);
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_str()),
            ("True", reason),
            "{cond:?}"
        );
        assert_eq!(cond.observed_generation, tc.metadata.generation);
    }

    // The isolation boundary.
    let namespace = Api::<Namespace>::all(c.clone())
        .get(&ns.name)
        .await
        .unwrap();
    assert_eq!(
        namespace.labels()["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    let policies = Api::<NetworkPolicy>::namespaced(c.clone(), &ns.name);
    assert!(policies.get_opt("dev-isolation").await.unwrap().is_some());
    assert!(
        policies
            .get_opt("dev-control-plane")
            .await
            .unwrap()
            .is_some()
    );
    let quota = Api::<ResourceQuota>::namespaced(c.clone(), &ns.name)
        .get("dev-quota")
        .await
        .unwrap();
    let hard = quota.spec.unwrap().hard.unwrap();
    assert_eq!(hard["requests.cpu"].0, "2");
    assert_eq!(hard["requests.memory"].0, "2Gi");
    assert!(
        Api::<LimitRange>::namespaced(c.clone(), &ns.name)
            .get_opt("dev-limits")
            .await
            .unwrap()
            .is_some()
    );

    // The control plane, admitted by the namespace's own Pod Security level.
    let sts = Api::<StatefulSet>::namespaced(c.clone(), &ns.name)
        .get("dev")
        .await
        .unwrap();
    let container = sts.spec.unwrap().template.spec.unwrap().containers[0].clone();
    assert_eq!(container.image.as_deref(), Some("rancher/k3s:v1.30.4-k3s1"));
    let svc = Api::<Service>::namespaced(c.clone(), &ns.name)
        .get("dev")
        .await
        .unwrap();
    let spec = svc.spec.unwrap();
    let ip = spec.cluster_ip.clone().unwrap();
    assert_ne!(
        ip, "None",
        "synced pods dial the tenant API server by address"
    );
    let ports: Vec<i32> = spec.ports.unwrap().iter().map(|p| p.port).collect();
    assert_eq!(ports, [6443, 443]);
    let san = format!("--tls-san={ip}");
    assert!(
        container.args.unwrap_or_default().contains(&san),
        "the address is in the serving certificate"
    );
    let pod = Api::<Pod>::namespaced(c.clone(), &ns.name)
        .get("dev-0")
        .await
        .unwrap();
    assert!(
        pod.annotations()
            .contains_key(names::ANNOTATION_LOCAL_ENDPOINT)
    );

    // The kubeconfig Secret reaches the tenant.
    let secrets = Api::<Secret>::namespaced(c.clone(), &ns.name);
    let kc = secrets.get("dev-kubeconfig").await.unwrap();
    let text = String::from_utf8(kc.data.unwrap()["value"].0.clone()).unwrap();
    assert!(text.contains(&endpoint));
    let server = &pod.annotations()[names::ANNOTATION_LOCAL_ENDPOINT];
    let tenant = Connector::Local
        .client(&text, "dev", &ns.name, server)
        .await
        .unwrap();
    let tenant_namespaces = Api::<Namespace>::all(tenant)
        .list(&Default::default())
        .await
        .unwrap();
    assert!(
        tenant_namespaces
            .items
            .iter()
            .any(|n| n.name_any() == "kube-system")
    );
    let pki_before = secrets.get("dev-pki").await.unwrap().data;

    // `tenantplane kubeconfig` prints a kubeconfig that reaches the tenant from this machine.
    let host_kubeconfig = shared().kubeconfig_path().display().to_string();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tenantplane"))
        .args([
            "kubeconfig",
            "dev",
            "-n",
            &ns.name,
            "--kubeconfig",
            &host_kubeconfig,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tenant_kubeconfig = shared().dir().join(format!("{}-dev.kubeconfig", ns.name));
    std::fs::write(&tenant_kubeconfig, &out.stdout).unwrap();
    let listed = std::process::Command::new(shared().binaries().path("kubectl"))
        .args([
            "--kubeconfig",
            &tenant_kubeconfig.display().to_string(),
            "get",
            "namespaces",
            "-o",
            "name",
        ])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("namespace/kube-system"),
        "{listed:?}"
    );
    let missing = std::process::Command::new(env!("CARGO_BIN_EXE_tenantplane"))
        .args([
            "kubeconfig",
            "nope",
            "-n",
            &ns.name,
            "--kubeconfig",
            &host_kubeconfig,
        ])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        err.contains(&format!(
            "Secret nope-kubeconfig not found in namespace {}",
            ns.name
        )),
        "{err}"
    );

    // Events for each step.
    let events = tenantplane_testenv::kubectl(&[
        "get",
        "events",
        "-n",
        &ns.name,
        "--field-selector",
        "involvedObject.kind=TenantCluster",
        "-o",
        "jsonpath={.items[*].reason}",
    ])
    .unwrap();
    for reason in [
        "PKICreated",
        "ControlPlaneCreated",
        "KubeconfigWritten",
        "ControlPlaneReady",
        "SyncSucceeded",
    ] {
        assert!(
            events.contains(reason),
            "missing event {reason} in {events}"
        );
    }

    // The PKI is never regenerated.
    assert_eq!(secrets.get("dev-pki").await.unwrap().data, pki_before);

    // Deletion: the garbage collector removes what the tenant owned; the finalizer the labels.
    tenants
        .delete("dev", &DeleteParams::foreground())
        .await
        .unwrap();
    let gone = eventually(WAIT, || async {
        let sts = Api::<StatefulSet>::namespaced(c.clone(), &ns.name)
            .get_opt("dev")
            .await
            .ok()?;
        let svc = Api::<Service>::namespaced(c.clone(), &ns.name)
            .get_opt("dev")
            .await
            .ok()?;
        let kc = secrets.get_opt("dev-kubeconfig").await.ok()?;
        let pki = secrets.get_opt("dev-pki").await.ok()?;
        let np = policies.get_opt("dev-isolation").await.ok()?;
        let q = Api::<ResourceQuota>::namespaced(c.clone(), &ns.name)
            .get_opt("dev-quota")
            .await
            .ok()?;
        let tc = tenants.get_opt("dev").await.ok()?;
        (sts.is_none()
            && svc.is_none()
            && kc.is_none()
            && pki.is_none()
            && np.is_none()
            && q.is_none()
            && tc.is_none())
        .then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "everything the tenant owned is garbage-collected"
    );
    let namespace = Api::<Namespace>::all(c.clone())
        .get(&ns.name)
        .await
        .unwrap();
    assert!(
        !namespace
            .labels()
            .contains_key("pod-security.kubernetes.io/enforce")
    );
    drop(world);
}

#[tokio::test]
async fn a_missing_profile_degrades_the_tenant_until_it_appears() {
    let world = TestHost::start("missing-ref").await;
    let (ns, c) = (&world.ns, &world.host);
    let profile_name = format!("profile-{}", ns.name);
    let mut tc = example(&ns.name);
    tc.spec.isolation_profile_ref.name = profile_name.clone();
    Api::<TenantCluster>::namespaced(c.clone(), &ns.name)
        .create(&PostParams::default(), &tc)
        .await
        .unwrap();

    let tc = wait_for_phase(c, &ns.name, "dev", Phase::Degraded).await;
    let ready = condition(&tc, READY);
    assert_eq!(ready.reason, "IsolationProfileNotFound");
    assert!(
        ready
            .message
            .contains(&format!("IsolationProfile {profile_name:?} not found")),
        "{}",
        ready.message
    );

    // Creating the profile heals the tenant with no other touch.
    let text = std::fs::read_to_string(repo_path(
        "deploy/policies/isolationprofile-restricted.yaml",
    ))
    .unwrap();
    let mut profile: IsolationProfile = serde_yaml::from_str(&text).unwrap();
    profile.metadata.name = Some(profile_name.clone());
    Api::<IsolationProfile>::all(c.clone())
        .create(&PostParams::default(), &profile)
        .await
        .unwrap();
    wait_for_phase(c, &ns.name, "dev", Phase::Ready).await;
    let _ = Api::<IsolationProfile>::all(c.clone())
        .delete(&profile_name, &DeleteParams::default())
        .await;
}

#[tokio::test]
async fn dedicated_mode_runs_as_shared_and_says_so() {
    let world = TestHost::start("dedicated").await;
    let (ns, c) = (&world.ns, &world.host);
    let mut tc = example(&ns.name);
    tc.spec.mode = TenantMode::Dedicated;
    Api::<TenantCluster>::namespaced(c.clone(), &ns.name)
        .create(&PostParams::default(), &tc)
        .await
        .unwrap();
    let tc = wait_for_phase(c, &ns.name, "dev", Phase::Ready).await;
    let mode = condition(&tc, MODE_SUPPORTED);
    assert_eq!(
        (mode.status.as_str(), mode.reason.as_str()),
        ("False", "ModeNotImplemented")
    );
    assert_eq!(
        mode.message,
        "mode dedicated is not implemented yet; this tenant runs as shared"
    );
}

#[tokio::test]
async fn a_tenant_api_server_that_goes_away_degrades_and_recovers() {
    let world = TestHost::start("outage").await;
    let (ns, c) = (&world.ns, &world.host);
    let operator = &world.operator;
    example_ready(ns).await;

    // Held down until the status says so: a restart five seconds later can come before a busy
    // operator's next reconcile, and the outage would go unseen.
    assert!(operator.runtime.hold_down(&ns.name, "dev-0", true));
    assert!(operator.runtime.crash_api_server(&ns.name, "dev-0"));
    // The syncer's watches can fail first (Degraded by SyncFailed, Ready still True); the
    // reconcile that finds the API server gone says Ready False.
    let tc = wait_for_status(c, &ns.name, "dev", "read Degraded with Ready False", |s| {
        s.phase == Some(Phase::Degraded)
            && tenantplane_api::conditions::find(&s.conditions, READY)
                .is_some_and(|r| r.status == "False")
    })
    .await;
    let ready = condition(&tc, READY);
    assert_eq!(ready.status, "False");
    assert!(
        ["TenantUnreachable", "ControlPlaneNotReady"].contains(&ready.reason.as_str()),
        "{ready:?}"
    );
    assert!(operator.runtime.hold_down(&ns.name, "dev-0", false));
    wait_for_phase(c, &ns.name, "dev", Phase::Ready).await;
}

#[tokio::test]
async fn tenant_data_lives_in_sqlite_on_its_claim_and_survives_a_datastore_crash() {
    let world = TestHost::start("datastore").await;
    let (ns, c) = (&world.ns, &world.host);
    let operator = &world.operator;
    example_ready(ns).await;
    let runtime = &operator.runtime;

    // kine over sqlite, as k3s, in the `server` folder of the pod's claim's volume (k3s's
    // layout: server/db/state.db); no etcd.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), &ns.name);
    let claim = claims.get("data-dev-0").await.unwrap();
    let volume = claim.spec.unwrap().volume_name.unwrap();
    let volume = Api::<PersistentVolume>::all(c.clone())
        .get(&volume)
        .await
        .unwrap();
    let root = PathBuf::from(volume.spec.unwrap().host_path.unwrap().path);
    let dir = runtime.data_dir(&ns.name, "dev-0").unwrap();
    assert_eq!(dir, root.join("server"));
    let db = runtime.database(&ns.name, "dev-0").unwrap();
    assert_eq!(db, dir.join("db").join("state.db"));
    assert!(db.is_file(), "{}", db.display());
    assert!(!dir.join("etcd").exists());
    let processes = runtime.process_names(&ns.name, "dev-0");
    assert!(
        processes.contains(&"tenant-kine".to_string()),
        "{processes:?}"
    );
    assert!(
        !processes.iter().any(|p| p.contains("etcd")),
        "{processes:?}"
    );

    // An object written before the datastore crashes is there once the tenant is back.
    let tenant = tenant_client(c, &ns.name, "dev").await;
    let maps: Api<ConfigMap> = Api::namespaced(tenant.clone(), "default");
    let kept: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kept"},
        "data": {"written": "before the crash"},
    }))
    .unwrap();
    let written = maps.create(&PostParams::default(), &kept).await.unwrap();
    assert!(runtime.crash_datastore(&ns.name, "dev-0"));
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns.name);
    let restarted = eventually(WAIT, || async {
        let status = pods.get("dev-0").await.ok()?.status?;
        let k3s = status.container_statuses?.into_iter().next()?;
        (k3s.restart_count >= 1 && k3s.ready).then_some(())
    })
    .await;
    assert!(
        restarted.is_some(),
        "the tenant never came back from the crash"
    );
    wait_for_phase(c, &ns.name, "dev", Phase::Ready).await;
    let read = eventually(WAIT, || async { maps.get("kept").await.ok() }).await;
    let read = read.expect("the tenant API server answers after the restart");
    assert_eq!(read.uid(), written.uid());
    assert_eq!(read.data, kept.data);
    assert_eq!(runtime.data_dir(&ns.name, "dev-0").as_ref(), Some(&dir));

    // The folder goes with its claim; a tenant made again with the old name starts empty.
    let tenants: Api<TenantCluster> = Api::namespaced(c.clone(), &ns.name);
    tenants
        .delete("dev", &DeleteParams::foreground())
        .await
        .unwrap();
    let removed = eventually(WAIT, || async {
        let claim = claims.get_opt("data-dev-0").await.ok()?;
        (claim.is_none() && !dir.exists()).then_some(())
    })
    .await;
    assert!(removed.is_some(), "{} outlived its claim", dir.display());
    // The claim goes before the TenantCluster's foreground deletion finishes: make it again only
    // once the old one is gone, or the create meets the old name.
    let gone = eventually(WAIT, || async {
        tenants.get_opt("dev").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(gone.is_some(), "the TenantCluster was never deleted");
    example_ready(ns).await;
    let again = runtime.data_dir(&ns.name, "dev-0").unwrap();
    assert_ne!(again, dir);
    let tenant = tenant_client(c, &ns.name, "dev").await;
    let maps: Api<ConfigMap> = Api::namespaced(tenant, "default");
    assert!(maps.get_opt("kept").await.unwrap().is_none());
}

#[tokio::test]
async fn hand_edits_tampering_and_operator_restarts_converge() {
    let world = TestHost::start("faults").await;
    let (ns, c) = (&world.ns, &world.host);
    example_ready(ns).await;
    let secrets = Api::<Secret>::namespaced(c.clone(), &ns.name);
    let pki = secrets.get("dev-pki").await.unwrap().data;

    // An owned object deleted by hand comes back; one edited by hand is restored.
    let policies = Api::<NetworkPolicy>::namespaced(c.clone(), &ns.name);
    policies
        .delete("dev-isolation", &DeleteParams::default())
        .await
        .unwrap();
    let quotas = Api::<ResourceQuota>::namespaced(c.clone(), &ns.name);
    let edit = serde_json::json!({"spec": {"hard": {"requests.cpu": "64"}}});
    quotas
        .patch(
            "dev-quota",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&edit),
        )
        .await
        .unwrap();
    let restored = eventually(WAIT, || async {
        let np = policies.get_opt("dev-isolation").await.ok()??;
        let q = quotas.get("dev-quota").await.ok()?;
        let cpu = q.spec?.hard?.get("requests.cpu")?.0.clone();
        (cpu == "2").then_some(np)
    })
    .await;
    assert!(
        restored.is_some(),
        "the deleted NetworkPolicy and the edited quota are restored"
    );

    // A tampered kubeconfig Secret is rewritten.
    let tampered = serde_json::json!({"data": {"value": "bm90IGEga3ViZWNvbmZpZw=="}});
    secrets
        .patch(
            "dev-kubeconfig",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&tampered),
        )
        .await
        .unwrap();
    let rewritten = eventually(WAIT, || async {
        let s = secrets.get("dev-kubeconfig").await.ok()?;
        let text = String::from_utf8(s.data?.get("value")?.0.clone()).ok()?;
        text.contains("certificate-authority-data").then_some(())
    })
    .await;
    assert!(rewritten.is_some(), "the kubeconfig Secret is rewritten");

    // The operator restarted: it converges on a changed spec with the same CA and no duplicates.
    drop(world.operator);
    let _operator = start_operator(ns);
    let tenants = Api::<TenantCluster>::namespaced(c.clone(), &ns.name);
    let change = serde_json::json!({"spec": {"networking": {"egressPolicy": "allow-all"}}});
    tenants
        .patch(
            "dev",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&change),
        )
        .await
        .unwrap();
    let converged = eventually(WAIT, || async {
        let tc = tenants.get("dev").await.ok()?;
        let status = tc.status?;
        let np = policies.get("dev-isolation").await.ok()?;
        let egress = serde_json::to_string(&np.spec?.egress).ok()?;
        (status.observed_generation == Some(2)
            && status.phase == Some(Phase::Ready)
            && egress.contains("0.0.0.0/0"))
        .then_some(())
    })
    .await;
    assert!(
        converged.is_some(),
        "the restarted operator applies the new egress policy"
    );
    assert_eq!(
        secrets.get("dev-pki").await.unwrap().data,
        pki,
        "the CA survives the restart"
    );
    let sets = Api::<StatefulSet>::namespaced(c.clone(), &ns.name)
        .list(&Default::default())
        .await
        .unwrap();
    assert_eq!(sets.items.len(), 1);
    let owned_secrets = secrets
        .list(&kube::api::ListParams::default().labels("tenantplane.io/tenant=dev"))
        .await
        .unwrap();
    assert_eq!(
        owned_secrets.items.len(),
        2,
        "one PKI and one kubeconfig Secret"
    );
}

#[tokio::test]
async fn a_reconcile_with_nothing_changed_writes_nothing() {
    let counter = std::sync::Arc::new(RequestCounter::default());
    // Counting what the operator sends as its ServiceAccount.
    let client = counting(operator::config(), counter.clone()).unwrap();
    let world = TestHost::start_using("no-writes", client).await;
    let ns = &world.ns;
    example_ready(ns).await;
    let (_, creation) = counter.get();
    assert!(creation > 5, "creating a tenant takes writes ({creation})");
    eprintln!("writes to bring one tenant to Ready: {creation}");
    // Once Ready, the syncer sets up the tenant's DNS: its copies are writes of their own.
    dns_settled(&ns.client, &ns.name, "dev").await;

    // Let the last status write come back through the watch, then count over several health
    // reconciles (every 2 s here).
    tokio::time::sleep(Duration::from_secs(3)).await;
    counter.reset();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(counter.get().1, 0, "steady-state reconciles sent writes");
    drop(world);
}
