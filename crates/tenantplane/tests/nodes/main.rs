//! Tenants on a real node: the tenant's pods run as real containers (kubelet, containerd, runc)
//! through the syncer, and what a kubelet really does reaches the tenant, in a tenant under
//! `restricted`. The control plane of this binary runs a real node ([`use_real_nodes`]); `make
//! test` runs it in a network namespace of its own. One module per part of a kubelet's work:
//! `run` (output, identity, how containers end), `exec` (exec, cp, attach, debug,
//! port-forward), `network_policy` (the isolation policies, enforced by packets), `probes`
//! (probes, hooks, rollouts), `services` (Services, DNS, identity), `wake` (a sleeping tenant
//! woken by requests to its Service).

#[path = "../common/mod.rs"]
mod common;

mod distribution;
mod exec;
mod network_policy;
mod probes;
mod run;
mod services;
mod snapshot;
mod wake;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::{Api, PostParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tenantplane_testenv::{eventually, shared};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use common::{ReadyTenant, TenantSetup, TestHost, WAIT, control_plane_report};

/// This binary's control plane runs a real node, whose registry serves this test build of
/// `tenantplane` as the operator's image (the snapshot agent of a `kubernetes` tenant's pod). The
/// simulated node is tainted as the operator's local-runtime pods expect.
pub fn use_real_nodes() {
    tenantplane_testenv::serve_agent_from(common::agent());
    tenantplane_testenv::use_real_nodes(tenantplane_controller::names::SIMULATED_NODE_TAINT);
}

/// The seed tenant, Ready, with the operator's kubelet endpoint, on this binary's real node.
pub async fn real_tenant(prefix: &str) -> ReadyTenant {
    use_real_nodes();
    TestHost::start_with_kubelet(prefix)
        .await
        .ready(TenantSetup::seed())
        .await
}

/// The busybox image the tests' pods run.
pub const BUSYBOX: &str = "busybox:1.35.0";
/// The agnhost image (upstream's e2e test image) the tests' pods run.
pub const AGNHOST: &str = "registry.k8s.io/e2e-test-images/agnhost:2.63.0";

/// A container that passes Pod Security `restricted`, running `script` in busybox.
pub fn busybox(name: &str, script: &str) -> serde_json::Value {
    let mut c = common::container(name);
    c["image"] = BUSYBOX.into();
    c["command"] = serde_json::json!(["sh", "-c", script]);
    c
}

/// A container that passes `restricted`, running agnhost's subcommand `args`.
pub fn agnhost(name: &str, args: &[&str]) -> serde_json::Value {
    let mut c = common::container(name);
    c["image"] = AGNHOST.into();
    c["args"] = serde_json::json!(args);
    c
}

/// `object` with `key` set to `value`.
pub fn with(
    mut object: serde_json::Value,
    key: &str,
    value: serde_json::Value,
) -> serde_json::Value {
    object[key] = value;
    object
}

/// Create the tenant object `value` (of kind `K`) in `default`.
pub async fn create<K>(tenant: &Client, value: serde_json::Value) -> K
where
    K: Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + Serialize
        + DeserializeOwned,
    K::DynamicType: Default,
{
    let object: K = serde_json::from_value(value).unwrap();
    Api::<K>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &object)
        .await
        .unwrap()
}

/// Create the tenant pod `default/name`, labelled `app: name`, with `spec`.
pub async fn create_pod(tenant: &Client, name: &str, spec: serde_json::Value) {
    create::<Pod>(
        tenant,
        serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
            "spec": spec,
        }),
    )
    .await;
}

/// Wait until `check` holds for the tenant's pod `name`; the pod.
pub async fn pod_where(
    tenant: &Client,
    name: &str,
    what: &str,
    check: impl Fn(&Pod) -> bool,
) -> Pod {
    pod_where_within(tenant, name, what, WAIT, check).await
}

/// [`pod_where`], waiting up to `within`.
pub async fn pod_where_within(
    tenant: &Client,
    name: &str,
    what: &str,
    within: Duration,
    check: impl Fn(&Pod) -> bool,
) -> Pod {
    let api = Api::<Pod>::namespaced(tenant.clone(), "default");
    let found = eventually(within, || async {
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

/// The pod's phase, once it has a status.
pub fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

/// Wait until the tenant's pod `name` runs.
pub async fn running(tenant: &Client, name: &str) -> Pod {
    pod_where(tenant, name, "ran", |p| phase(p) == Some("Running")).await
}

/// The logs of the tenant's pod `name` once `done` holds for them, read again until `WAIT` is
/// up (a container prints after it shows as started); the error holds the last logs read.
pub async fn logs_when(
    tenant: &Client,
    name: &str,
    done: impl Fn(&str) -> bool,
) -> Result<String, String> {
    let pods = Api::<Pod>::namespaced(tenant.clone(), "default");
    let last = std::cell::RefCell::new(String::new());
    let logs = eventually(WAIT, || async {
        let logs = pods.logs(name, &Default::default()).await.ok()?;
        if done(&logs) {
            return Some(logs);
        }
        *last.borrow_mut() = logs;
        None
    })
    .await;
    logs.ok_or_else(|| last.take())
}

/// The status of container `name` (of any kind) of `pod`.
pub fn container<'a>(pod: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    let status = pod.status.as_ref()?;
    [
        &status.container_statuses,
        &status.init_container_statuses,
        &status.ephemeral_container_statuses,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .find(|c| c.name == name)
}

/// The first container's waiting state, if it waits.
pub fn waiting(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStateWaiting> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .waiting
        .as_ref()
}

/// The first container's terminated state, if it ended.
pub fn terminated(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStateTerminated> {
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

/// The host copy of the tenant's pod `default/name`, as the host shows it.
pub async fn host_copy(world: &ReadyTenant, name: &str) -> Pod {
    let host_name = tenantplane_syncer::naming::host_name_for(&world.name, "default", name);
    Api::<Pod>::namespaced(world.host.clone(), &world.ns.name)
        .get(&host_name)
        .await
        .unwrap_or_else(|e| panic!("the host copy {host_name}: {e}"))
}

/// `tenantplane connect` for the tenant, with its kubeconfig written to a file; the child (kept
/// alive while kubectl runs) and the file.
pub async fn connect(world: &ReadyTenant) -> (Child, PathBuf) {
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
pub async fn kubectl(kubeconfig: &Path, args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = spawn_kubectl(kubeconfig, args);
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

/// `kubectl exec <pod> -- sh -c <script>` until it succeeds (within [`WAIT`]); its stdout.
pub async fn exec_until_ok(kubeconfig: &Path, pod: &str, script: &str) -> String {
    let last = std::cell::RefCell::new(None);
    let ok = eventually(WAIT, || async {
        let said = kubectl(kubeconfig, &["exec", pod, "--", "sh", "-c", script], "").await;
        let ok = (said.0 == 0).then(|| said.1.clone());
        *last.borrow_mut() = Some(said);
        ok
    })
    .await;
    ok.unwrap_or_else(|| panic!("`{script}` in {pod} never succeeded: {:?}", last.borrow()))
}

/// kubectl with every stream piped, for commands that run on (logs -f, attach, port-forward).
pub fn spawn_kubectl(kubeconfig: &Path, args: &[&str]) -> Child {
    Command::new(shared().binaries().path("kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// The stdout lines of a running kubectl.
pub fn stdout_lines(child: &mut Child) -> Lines<BufReader<ChildStdout>> {
    BufReader::new(child.stdout.take().unwrap()).lines()
}

/// The next line, within a minute.
pub async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>, what: &str) -> String {
    tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("no line of {what} within a minute"))
        .unwrap()
        .unwrap_or_else(|| panic!("{what} ended"))
}

/// The tenant pod `pod` reaches its tenant's API server by the name a program would use:
/// `kubernetes.default.svc`, through the resolver's search list, to the API server's TLS port,
/// which answers plain HTTP with 400. (`timeout`, not wget's `-T`: Debian's static busybox 1.35
/// wget crashes with SIGSEGV when given `-T`.)
/// busybox's resolver says `bad address` when an answer is lost (a UDP query timing out on a
/// loaded machine): that one is asked again, a few times; any other failure fails at once.
pub async fn reaches_the_tenant_api(kubeconfig: &Path, pod: &str) {
    let mut said = (0, String::new(), String::new());
    for attempt in 1..=5 {
        said = kubectl(
            kubeconfig,
            &[
                "exec",
                pod,
                "--",
                "timeout",
                "10",
                "wget",
                "-qO-",
                "http://kubernetes.default.svc:443/",
            ],
            "",
        )
        .await;
        if !said.2.contains("bad address") {
            break;
        }
        eprintln!("attempt {attempt}: the resolver lost an answer ({said:?}); asking again");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert!(said.2.contains("400 Bad Request"), "{said:?}");
}
