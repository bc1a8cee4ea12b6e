//! Tenants on a real node: the tenant's pods run as real containers (kubelet, containerd, runc)
//! through the syncer, and what a kubelet really does reaches the tenant: the container's own
//! output, its exit code, its hostname (the tenant pod's name), exec with stdin, and the tenant's
//! DNS answering from a real CoreDNS container. The control plane of this binary runs a real node
//! ([`use_real_nodes`]); `make test` runs it in a network namespace of its own.

mod common;

use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, LogParams, PostParams};
use tenantplane_testenv::{eventually, shared, use_real_nodes};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use common::{ReadyTenant, TenantSetup, TestHost, WAIT};

/// A container that passes Pod Security `restricted`, running `script` in busybox.
fn busybox(name: &str, script: &str) -> serde_json::Value {
    let mut c = common::container(name);
    c["image"] = "busybox:1.35.0".into();
    c["command"] = serde_json::json!(["sh", "-c", script]);
    c
}

async fn create_pod(tenant: &Client, name: &str, spec: serde_json::Value) {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }))
    .unwrap();
    Api::<Pod>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

/// Wait until `check` holds for the tenant's pod `name`; the pod.
async fn pod_where(tenant: &Client, name: &str, what: &str, check: impl Fn(&Pod) -> bool) -> Pod {
    let api = Api::<Pod>::namespaced(tenant.clone(), "default");
    let found = eventually(WAIT, || async {
        api.get_opt(name).await.ok().flatten().filter(|p| check(p))
    })
    .await;
    match found {
        Some(pod) => pod,
        None => panic!(
            "tenant pod {name} never {what}; it is {:#?}",
            api.get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|p| p.status)
        ),
    }
}

fn terminated(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStateTerminated> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_pod_runs_for_real_and_its_end_reaches_the_tenant() {
    use_real_nodes();
    let world = TestHost::start_with_kubelet("nodes-run")
        .await
        .ready(TenantSetup::seed())
        .await;
    let tenant = &world.tenant;
    create_pod(
        tenant,
        "hello",
        serde_json::json!({
            "restartPolicy": "Never",
            "containers": [busybox(
                "c",
                "echo hello from $(hostname); echo to stderr >&2; \
                 echo bye > /dev/termination-log; exit 3"
            )],
        }),
    )
    .await;
    let pod = pod_where(tenant, "hello", "failed", |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
    })
    .await;
    let ended = terminated(&pod).expect("a Failed pod's container has ended");
    assert_eq!(ended.exit_code, 3, "{ended:?}");
    assert_eq!(ended.reason.as_deref(), Some("Error"), "{ended:?}");
    assert_eq!(ended.message.as_deref(), Some("bye\n"), "{ended:?}");
    let logs = Api::<Pod>::namespaced(tenant.clone(), "default")
        .logs("hello", &LogParams::default())
        .await
        .unwrap();
    assert_eq!(logs, "hello from hello\nto stderr\n");
}

/// `tenantplane connect` for the tenant, with its kubeconfig written to a file; the child (kept
/// alive while kubectl runs) and the file.
async fn connect(world: &ReadyTenant) -> (Child, std::path::PathBuf) {
    let out = shared()
        .dir()
        .join(format!("{}-connect.kubeconfig", world.ns.name));
    let mut child = Command::new(env!("CARGO_BIN_EXE_tenantplane"))
        .args([
            "connect",
            &world.name,
            "-n",
            &world.ns.name,
            "--kubeconfig-out",
        ])
        .arg(&out)
        .env("KUBECONFIG", shared().kubeconfig_path())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.starts_with("Press Ctrl-C") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(ready.ok(), Some(true), "connect never became ready");
    (child, out)
}

/// `kubectl --kubeconfig <tenant> args…` with `stdin`; (exit code, stdout, stderr).
async fn kubectl(
    kubeconfig: &std::path::Path,
    args: &[&str],
    stdin: &str,
) -> (i32, String, String) {
    let mut child = Command::new(shared().binaries().path("kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("kubectl {args:?} did not end within a minute"))
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_passes_stdin_and_the_tenant_dns_answers_from_a_real_container() {
    use_real_nodes();
    let world = TestHost::start_with_kubelet("nodes-exec")
        .await
        .ready(TenantSetup::seed())
        .await;
    let tenant = &world.tenant;
    create_pod(
        tenant,
        "shell",
        serde_json::json!({"containers": [busybox("c", "sleep 3600")]}),
    )
    .await;
    pod_where(tenant, "shell", "ran", |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
    .await;
    let (_connect, kubeconfig) = connect(&world).await;

    // exec -i: stdin reaches the process, and the command ends when stdin does.
    let said = kubectl(
        &kubeconfig,
        &["exec", "-i", "shell", "--", "cat"],
        "line one\nline two\n",
    )
    .await;
    assert_eq!(said.0, 0, "{said:?}");
    assert_eq!(said.1, "line one\nline two\n", "{said:?}");
    let said = kubectl(&kubeconfig, &["exec", "shell", "--", "hostname"], "").await;
    assert_eq!(said.1.trim(), "shell", "the tenant pod's name: {said:?}");
    let said = kubectl(
        &kubeconfig,
        &["exec", "shell", "--", "sh", "-c", "exit 7"],
        "",
    )
    .await;
    assert_eq!(said.0, 7, "exec's exit code comes back: {said:?}");

    // The tenant's CoreDNS, a real container on the real node, answers the tenant's names.
    let lookup = eventually(WAIT, || async {
        let said = kubectl(
            &kubeconfig,
            &[
                "exec",
                "shell",
                "--",
                "nslookup",
                "kubernetes.default.svc.cluster.local",
            ],
            "",
        )
        .await;
        (said.0 == 0).then_some(said)
    })
    .await;
    assert!(lookup.is_some(), "the tenant's DNS never answered");
}
