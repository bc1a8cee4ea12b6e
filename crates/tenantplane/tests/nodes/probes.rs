//! Probes and hooks as the kubelet runs them: liveness of every kind (exec, httpGet, tcpSocket,
//! grpc) restarts a container whose probe fails and leaves one whose probe passes; readiness
//! and startup hold a container back until it says so; postStart and preStop hooks run; a
//! Deployment's rollout waits on readiness.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tenantplane_testenv::eventually;

use super::common::WAIT;
use super::*;

/// A probe of `kind` (its body `how`) every second, failing after two misses.
fn probe(how: serde_json::Value) -> serde_json::Value {
    let mut p = how;
    p["periodSeconds"] = 1.into();
    p["failureThreshold"] = 2.into();
    p["timeoutSeconds"] = 1.into();
    p
}

fn liveness(c: serde_json::Value, how: serde_json::Value) -> serde_json::Value {
    with(c, "livenessProbe", probe(how))
}

/// A liveness probe that passes once its server is up: the same checks, with room for a server
/// that is slow to start or answer on a busy machine (ten misses of up to 5 s each), so only a
/// probe that really fails restarts its container (one run saw agnhost answer its first probes
/// late beside two other test binaries, and a passing probe restart it).
fn liveness_ok(c: serde_json::Value, how: serde_json::Value) -> serde_json::Value {
    let mut p = probe(how);
    p["failureThreshold"] = 10.into();
    p["timeoutSeconds"] = 5.into();
    with(c, "livenessProbe", p)
}

fn idle(name: &str) -> serde_json::Value {
    busybox(name, "exec sleep 3600")
}

#[tokio::test(flavor = "multi_thread")]
async fn liveness_probes_of_every_kind_restart_what_fails_and_leave_what_passes() {
    let world = real_tenant("nodes-live").await;
    let tenant = &world.tenant;
    // One pod, one container per probe kind and outcome; the servers are netexec (HTTP on 8080)
    // and grpc-health-checking (gRPC on 5000, service `ok`, until told otherwise), the probes of
    // the others reach them over the pod's own network.
    // A container whose main process is `sleep` ignores SIGTERM (it is PID 1): a short grace
    // period keeps each restart from waiting the default 30 s for SIGKILL.
    create_pod(
        tenant,
        "live",
        json!({"terminationGracePeriodSeconds": 1, "containers": [
            liveness_ok(busybox("exec-ok", "touch /tmp/alive; exec sleep 3600"),
                     json!({"exec": {"command": ["cat", "/tmp/alive"]}})),
            liveness(idle("exec-bad"), json!({"exec": {"command": ["cat", "/tmp/alive"]}})),
            liveness_ok(agnhost("http-ok", &["netexec", "--http-port=8080", "--udp-port=8081"]),
                     json!({"initialDelaySeconds": 2, "httpGet": {"path": "/healthz", "port": 8080}})),
            liveness(idle("http-bad"),
                     json!({"initialDelaySeconds": 2, "httpGet": {"path": "/echo?msg=down&code=500", "port": 8080}})),
            liveness_ok(idle("tcp-ok"), json!({"initialDelaySeconds": 2, "tcpSocket": {"port": 8080}})),
            liveness(idle("tcp-bad"), json!({"initialDelaySeconds": 2, "tcpSocket": {"port": 8089}})),
            liveness_ok(agnhost("grpc-ok", &["grpc-health-checking", "--port=5000", "--http-port=8082", "--service=ok"]),
                     json!({"initialDelaySeconds": 2, "grpc": {"port": 5000, "service": "ok"}})),
        ]}),
    )
    .await;
    let kinds = ["exec", "http", "tcp", "grpc"];
    let all_bad_restarted = |p: &Pod| {
        kinds[..3]
            .iter()
            .all(|k| container(p, &format!("{k}-bad")).is_some_and(|c| c.restart_count >= 1))
    };
    // Seven containers start and three restart under load: more than the usual wait.
    let pod = pod_where_within(
        tenant,
        "live",
        "restarted every failing container",
        2 * WAIT,
        all_bad_restarted,
    )
    .await;
    for kind in kinds {
        let ok = container(&pod, &format!("{kind}-ok")).unwrap();
        assert_eq!(
            (ok.restart_count, ok.ready),
            (0, true),
            "a passing {kind} liveness probe leaves its container: {ok:?}"
        );
    }
    // grpc: the server says NOT_SERVING once told so; its probe then restarts it.
    let (_connect, kubeconfig) = connect(&world).await;
    let said = kubectl(
        &kubeconfig,
        &[
            "exec",
            "live",
            "-c",
            "grpc-ok",
            "--",
            "wget",
            "-qO-",
            "http://127.0.0.1:8082/make-not-serving",
        ],
        "",
    )
    .await;
    assert_eq!(said.0, 0, "{said:?}");
    pod_where(
        tenant,
        "live",
        "restarted the container whose gRPC probe failed",
        |p| container(p, "grpc-ok").is_some_and(|c| c.restart_count >= 1),
    )
    .await;

    // The tenant is told why: the kubelet's Unhealthy events, in tenant terms.
    let events = eventually(WAIT, || async {
        let list = Api::<k8s_openapi::api::core::v1::Event>::namespaced(tenant.clone(), "default")
            .list(&ListParams::default())
            .await
            .ok()?;
        let messages: Vec<String> = list
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("Unhealthy"))
            .filter_map(|e| e.message)
            .collect();
        messages
            .iter()
            .any(|m| m.starts_with("Liveness probe failed"))
            .then_some(messages)
    })
    .await;
    assert!(events.is_some(), "no Unhealthy event reached the tenant");
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_startup_and_hooks_hold_and_run_as_on_the_host() {
    let world = real_tenant("nodes-ready").await;
    let tenant = &world.tenant;
    let file_probe = |path: &str| probe(json!({"exec": {"command": ["cat", path]}}));
    // Ready once /tmp/ready exists; started once /tmp/started exists (its liveness probe, which
    // would fail until then, waits for the start).
    create_pod(
        tenant,
        "gate",
        json!({"containers": [
            with(idle("c"), "readinessProbe", file_probe("/tmp/ready")),
        ]}),
    )
    .await;
    let mut slow = with(
        idle("c"),
        "startupProbe",
        with(file_probe("/tmp/started"), "failureThreshold", 600.into()),
    );
    slow = with(slow, "livenessProbe", file_probe("/tmp/started"));
    create_pod(tenant, "slow", json!({"containers": [slow]})).await;
    // A handler that logs every request it gets, for the preStop hook to call.
    create_pod(
        tenant,
        "handler",
        json!({"containers": [agnhost("c", &["netexec", "--http-port=8080", "--udp-port=8081"])]}),
    )
    .await;
    let handler_ip = pod_where(tenant, "handler", "got an address", |p| {
        phase(p) == Some("Running") && p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some()
    })
    .await
    .status
    .and_then(|s| s.pod_ip)
    .unwrap();
    let hooked = with(
        idle("c"),
        "lifecycle",
        json!({
            "postStart": {"exec": {"command": ["sh", "-c", "echo started by the hook > /tmp/post"]}},
            "preStop": {"exec": {"command": ["wget", "-qO-",
                format!("http://{handler_ip}:8080/echo?msg=prestop-of-hooked")]}},
        }),
    );
    create_pod(tenant, "hooked", json!({"containers": [hooked]})).await;
    let (_connect, kubeconfig) = connect(&world).await;

    let not_ready = |p: &Pod| {
        container(p, "c")
            .is_some_and(|c| !c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some()))
    };
    let gate = pod_where(tenant, "gate", "ran unready", not_ready).await;
    assert_eq!(container(&gate, "c").map(|c| c.started), Some(Some(true)));
    let slow = pod_where(tenant, "slow", "ran unstarted", not_ready).await;
    assert_eq!(
        container(&slow, "c").map(|c| c.started),
        Some(Some(false)),
        "{:?}",
        slow.status
    );
    exec_until_ok(&kubeconfig, "gate", "touch /tmp/ready").await;
    exec_until_ok(&kubeconfig, "slow", "touch /tmp/started").await;
    for name in ["gate", "slow"] {
        let pod = pod_where(tenant, name, "became ready", |p| {
            container(p, "c").is_some_and(|c| c.ready)
        })
        .await;
        let c = container(&pod, "c").unwrap();
        assert_eq!((c.started, c.restart_count), (Some(true), 0), "{c:?}");
    }

    // postStart ran in the container; preStop runs before the container is stopped.
    running(tenant, "hooked").await;
    let post = exec_until_ok(&kubeconfig, "hooked", "cat /tmp/post").await;
    assert_eq!(post, "started by the hook\n");
    Api::<Pod>::namespaced(tenant.clone(), "default")
        .delete("hooked", &Default::default())
        .await
        .unwrap();
    let called = eventually(WAIT, || async {
        let said = kubectl(&kubeconfig, &["logs", "handler"], "").await;
        said.1.contains("prestop-of-hooked").then_some(())
    })
    .await;
    assert!(
        called.is_some(),
        "the preStop hook never called the handler: {:?}",
        kubectl(&kubeconfig, &["logs", "handler"], "").await
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rollout_waits_for_the_new_pods_to_be_ready() {
    let world = real_tenant("nodes-rollout").await;
    let tenant = &world.tenant;
    // Version 1 is ready at once; any later version only once someone touches /tmp/ready.
    let mut c = busybox(
        "c",
        "[ \"$VERSION\" = 1 ] && touch /tmp/ready; exec sleep 3600",
    );
    c["env"] = json!([{"name": "VERSION", "value": "1"}]);
    c["readinessProbe"] = probe(json!({"exec": {"command": ["cat", "/tmp/ready"]}}));
    create::<Deployment>(
        tenant,
        json!({
            "metadata": {"name": "roll", "namespace": "default"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "roll"}},
                "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                "template": {"metadata": {"labels": {"app": "roll"}}, "spec": {"containers": [c]}},
            },
        }),
    )
    .await;
    let (_connect, kubeconfig) = connect(&world).await;
    let said = kubectl(
        &kubeconfig,
        &["rollout", "status", "deployment/roll", "--timeout=50s"],
        "",
    )
    .await;
    assert_eq!(said.0, 0, "version 1 rolls out: {said:?}");
    let pods = Api::<Pod>::namespaced(tenant.clone(), "default");
    let names = |list: Vec<Pod>| list.into_iter().map(|p| p.name_any()).collect::<Vec<_>>();
    let first = names(
        pods.list(&ListParams::default().labels("app=roll"))
            .await
            .unwrap()
            .items,
    );
    assert_eq!(first.len(), 1, "{first:?}");

    Api::<Deployment>::namespaced(tenant.clone(), "default")
        .patch(
            "roll",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
                {"name": "c", "env": [{"name": "VERSION", "value": "2"}]}]}}}})),
        )
        .await
        .unwrap();
    // The new pod runs but is not ready: the rollout stays, and the old pod with it.
    let new = eventually(WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels("app=roll"))
            .await
            .ok()?
            .items;
        list.into_iter().find(|p| {
            !first.contains(&p.name_any())
                && container(p, "c")
                    .is_some_and(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
    })
    .await
    .expect("the new version's pod runs")
    .name_any();
    let said = kubectl(
        &kubeconfig,
        &["rollout", "status", "deployment/roll", "--timeout=5s"],
        "",
    )
    .await;
    assert_ne!(said.0, 0, "the rollout waits on the unready pod: {said:?}");
    assert!(
        pods.get_opt(&first[0]).await.unwrap().is_some(),
        "the old pod stays while the new one is unready"
    );
    exec_until_ok(&kubeconfig, &new, "touch /tmp/ready").await;
    let said = kubectl(
        &kubeconfig,
        &["rollout", "status", "deployment/roll", "--timeout=50s"],
        "",
    )
    .await;
    assert_eq!(
        said.0, 0,
        "the rollout ends once the new pod is ready: {said:?}"
    );
    let gone = eventually(WAIT, || async {
        let list = names(
            pods.list(&ListParams::default().labels("app=roll"))
                .await
                .ok()?
                .items,
        );
        (list == vec![new.clone()]).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the old pod goes once the new one is ready");
}
