//! `kubectl logs`, `exec`, `attach`, `port-forward` and `cp` in a tenant, end to end: kubectl
//! calls the tenant API server, which calls the kubelet of the virtual node (the operator's
//! kubelet endpoint), which answers through the host copy's subresources on the test control
//! plane, where kwok serves them for its simulated pods.

mod common;
use common::*;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;
use tenantplane_controller::names;
use tenantplane_testenv::host_cluster::KWOK_LOG_LINES;
use tenantplane_testenv::{eventually, shared};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// kubectl for tenant `name`: its kubeconfig Secret, pointed at where the local runtime serves it.
struct TenantKubectl {
    kubeconfig: PathBuf,
    server: String,
}

impl TenantKubectl {
    async fn new(host: &Client, ns: &str, name: &str, dir: &Path) -> Self {
        let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(host.clone(), ns)
            .get(&names::kubeconfig_secret(name))
            .await
            .unwrap();
        let text = &secret.data.unwrap()[names::KUBECONFIG_KEY].0;
        let kubeconfig = dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&kubeconfig, text).unwrap();
        let pod = Api::<Pod>::namespaced(host.clone(), ns)
            .get(&names::control_plane_pod(name))
            .await
            .unwrap();
        let server = tenantplane_controller::Connector::Local
            .server(name, ns, &pod)
            .unwrap();
        Self { kubeconfig, server }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(shared().binaries().path("kubectl"));
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--server={}", self.server))
            .arg("--request-timeout=60s")
            .args(args);
        cmd
    }

    /// Run kubectl; its stdout, or its stderr as the error. It runs off the test's runtime,
    /// which serves the operator (and its kubelet endpoint) meanwhile.
    async fn run(&self, args: &[&str]) -> Result<String, String> {
        self.run_with_input(args, None).await
    }

    async fn run_with_input(&self, args: &[&str], input: Option<&str>) -> Result<String, String> {
        run_off_runtime(self.command(&[]), args, input).await
    }
}

/// `cmd` with `args` (and `input` on its stdin), run off the test's runtime.
async fn run_off_runtime(
    mut cmd: Command,
    args: &[&str],
    input: Option<&str>,
) -> Result<String, String> {
    cmd.args(args);
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let input = input.map(str::to_string);
    tokio::task::spawn_blocking(move || run_blocking(cmd, &args, input.as_deref()))
        .await
        .unwrap()
}

fn run_blocking(mut cmd: Command, args: &[String], input: Option<&str>) -> Result<String, String> {
    {
        cmd.stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| e.to_string())?;
        if let Some(text) = input {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(text.as_bytes()).unwrap();
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "kubectl {args:?}: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

fn web_pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
        "spec": {
            "containers": [{
                "name": "web",
                "image": "registry.example/web:1",
                "ports": [{"containerPort": 8080}],
                "securityContext": {
                    "runAsNonRoot": true, "runAsUser": 1000,
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"}
                }
            }],
            "terminationGracePeriodSeconds": 1
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn logs_exec_attach_port_forward_and_cp_work_in_a_tenant() {
    let world = TestHost::start_with_kubelet("kubectl")
        .await
        .ready(TenantSetup::seed())
        .await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let operator = &world.operator;
    let kubelet = operator.kubelet.clone().unwrap();
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    pods.create(&PostParams::default(), &web_pod())
        .await
        .unwrap();
    let running = eventually(WAIT, || async {
        let p = pods.get("web").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    assert!(running.is_some(), "the tenant pod never ran");

    // The virtual node names the operator's endpoint as its kubelet, and nothing of the host's
    // (the default profile does not show node addresses).
    let node_name = pods
        .get("web")
        .await
        .unwrap()
        .spec
        .unwrap()
        .node_name
        .unwrap();
    let node = Api::<Node>::all(tenant.clone())
        .get(&node_name)
        .await
        .unwrap();
    let status = node.status.unwrap();
    let addresses: Vec<(String, String)> = status
        .addresses
        .unwrap()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert_eq!(
        addresses,
        [
            ("InternalIP".to_string(), kubelet.endpoint.address.clone()),
            // The address the tenant API server dials first.
            ("Hostname".to_string(), kubelet.endpoint.address.clone())
        ]
    );
    assert_eq!(
        status
            .daemon_endpoints
            .unwrap()
            .kubelet_endpoint
            .unwrap()
            .port,
        i32::from(kubelet.endpoint.port)
    );

    let dir = shared().dir().join(&ns.name);
    std::fs::create_dir_all(&dir).unwrap();
    let kubectl = TenantKubectl::new(host, &ns.name, "dev", &dir).await;

    // kubectl logs: every line, then only the last.
    let logs = kubectl
        .run(&["logs", "web", "-n", "default"])
        .await
        .unwrap();
    assert_eq!(logs.lines().collect::<Vec<_>>(), KWOK_LOG_LINES, "{logs}");
    let last = kubectl
        .run(&["logs", "web", "-n", "default", "--tail=1", "-c", "web"])
        .await
        .unwrap();
    assert_eq!(last.trim(), KWOK_LOG_LINES[1]);

    // kubectl exec, with and without stdin.
    let hi = kubectl
        .run(&["exec", "web", "-n", "default", "--", "echo", "hi"])
        .await
        .unwrap();
    assert_eq!(hi, "hi\n");
    // kwok's simulated exec never closes a command's stdin, so the command reads one line.
    let echoed = kubectl
        .run_with_input(
            &[
                "exec", "-i", "web", "-n", "default", "--", "head", "-n", "1",
            ],
            Some("through stdin\n"),
        )
        .await
        .unwrap();
    assert_eq!(echoed, "through stdin\n");
    let failed = kubectl
        .run(&["exec", "web", "-n", "default", "--", "false"])
        .await
        .unwrap_err();
    // (kwok reports an exit status as an error of its own, not as a kubelet would.)
    assert!(failed.contains("exit status 1"), "{failed}");

    // kubectl cp out of the pod (tar through exec). Into the pod needs the command's stdin to
    // end, which kwok's exec never signals (on the host directly too).
    std::fs::write(
        shared().kwok_exec_dir().join("notes.txt"),
        "written in the pod\n",
    )
    .unwrap();
    let back = dir.join("back.txt");
    kubectl
        .run(&["cp", "default/web:notes.txt", &back.display().to_string()])
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(&back).unwrap(),
        "written in the pod\n"
    );

    // kubectl attach: the stream opens and stays open (kwok sends nothing new on it).
    let mut attach = kubectl
        .command(&["attach", "web", "-n", "default", "-c", "web"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still_attached = attach.try_wait().unwrap().is_none();
    let _ = attach.kill();
    let out = attach.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(still_attached && !stderr.contains("rror"), "{stderr}");

    // kubectl port-forward: bytes both ways, to where kwok forwards every pod port.
    let target = tokio::net::TcpListener::bind(("127.0.0.1", shared().forward_port()))
        .await
        .unwrap();
    let server = tokio::spawn(async move {
        let (mut conn, _) = target.accept().await.unwrap();
        let mut asked = [0u8; 4];
        conn.read_exact(&mut asked).await.unwrap();
        conn.write_all(if &asked == b"ping" { b"pong" } else { b"what" })
            .await
            .unwrap();
    });
    let mut forward = kubectl
        .command(&["port-forward", "pod/web", ":8080", "-n", "default"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = forward.stdout.take().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    // Read on to the end: kubectl writes a line per connection, and a closed pipe would kill it.
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // "Forwarding from 127.0.0.1:PORT -> 8080"
            let port = line
                .strip_prefix("Forwarding from 127.0.0.1:")
                .and_then(|rest| rest.split_whitespace().next()?.parse::<u16>().ok());
            if let (Some(port), Some(tx)) = (port, tx.take_if(|_| port.is_some())) {
                let _ = tx.send(port);
            }
        }
    });
    let port = tokio::time::timeout(Duration::from_secs(60), rx)
        .await
        .ok()
        .and_then(Result::ok);
    let Some(port) = port else {
        let _ = forward.kill();
        let out = forward.wait_with_output().unwrap();
        panic!(
            "kubectl port-forward never listened: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    conn.write_all(b"ping").await.unwrap();
    let mut answer = [0u8; 4];
    let read = tokio::time::timeout(Duration::from_secs(60), conn.read_exact(&mut answer)).await;
    let _ = forward.kill();
    let out = forward.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    match read {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => panic!("the port-forward failed: {e}; kubectl said: {said}"),
        Err(_) => panic!("no answer through the port-forward; kubectl said: {said}"),
    }
    assert_eq!(&answer, b"pong");
    server.await.unwrap();

    // The endpoint itself answers a tenant's API server identity only (a certificate of the
    // tenant's client CA for system:masters, as the tenant admin's is), never the host's admin.
    let ca = dir.join("kubelet-ca.crt");
    std::fs::write(&ca, &kubelet.ca_pem).unwrap();
    let endpoint = [
        format!(
            "--server=https://{}:{}",
            kubelet.endpoint.address, kubelet.endpoint.port
        ),
        format!("--certificate-authority={}", ca.display()),
    ];
    let mut as_tenant = Command::new(shared().binaries().path("kubectl"));
    as_tenant
        .arg(format!("--kubeconfig={}", kubectl.kubeconfig.display()))
        .args(&endpoint);
    let healthz = run_off_runtime(as_tenant, &["get", "--raw", "/healthz"], None).await;
    assert_eq!(healthz.unwrap().trim(), "ok");
    let mut as_tenant = Command::new(shared().binaries().path("kubectl"));
    as_tenant
        .arg(format!("--kubeconfig={}", kubectl.kubeconfig.display()))
        .args(&endpoint);
    let other = run_off_runtime(as_tenant, &["get", "--raw", "/pods"], None).await;
    let other = other.unwrap_err();
    assert!(other.contains("NotFound"), "{other}");
    let mut as_host = shared().kubectl();
    as_host.args(&endpoint);
    let refused = run_off_runtime(as_host, &["get", "--raw", "/healthz"], None)
        .await
        .unwrap_err();
    assert!(!refused.contains("ok"), "{refused}");

    // A pod that has no host copy says so, instead of a dial error. (In `kube-system`, which the
    // tenant's Pod Security exempts: elsewhere the tenant API server refuses it at once.)
    let refused: Pod = serde_json::from_value(json!({
        "metadata": {"name": "priv", "namespace": "kube-system"},
        "spec": {"containers": [{"name": "c", "image": "x", "securityContext": {"privileged": true}}],
                 "nodeName": node_name}
    }))
    .unwrap();
    Api::<Pod>::namespaced(tenant.clone(), "kube-system")
        .create(&PostParams::default(), &refused)
        .await
        .unwrap();
    let said = kubectl
        .run(&["logs", "priv", "-n", "kube-system"])
        .await
        .unwrap_err();
    assert!(
        said.contains("pod kube-system/priv does not run on the host"),
        "{said}"
    );
}
