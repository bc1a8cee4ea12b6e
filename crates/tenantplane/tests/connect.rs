//! `tenantplane connect`, as the built binary, against the test control plane: a Ready tenant's
//! API server reached through a local port that the host API server's pods/portforward carries
//! (kwok forwards the control-plane pod's port 6443 to where the local runtime runs the tenant's
//! API server), the kubeconfig it writes or merges, a replaced pod, and its errors and exit codes.

mod common;

use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_yaml::Value;
use tenantplane_testenv::{eventually, install_crds_and_policies, namespace, shared};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use common::{ReadyTenant, WAIT};

/// Longest a one-shot command or the wait for a printed line may take.
const LIMIT: Duration = Duration::from_secs(60);

fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_tenantplane")
}

fn host_kubeconfig() -> OsString {
    shared().kubeconfig_path().as_os_str().to_owned()
}

/// `program args…` with `KUBECONFIG` and a HOME of its own.
fn command(program: &Path, args: &[&str], kubeconfig: &OsString) -> Command {
    let home = shared().dir().join("connect-home");
    std::fs::create_dir_all(&home).unwrap();
    let mut command = Command::new(program);
    command
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", &home)
        .kill_on_drop(true);
    command
}

/// Run to the end: (exit code, stdout, stderr).
async fn run(program: &Path, args: &[&str], kubeconfig: &OsString) -> (i32, String, String) {
    let out = tokio::time::timeout(LIMIT, command(program, args, kubeconfig).output())
        .await
        .unwrap_or_else(|_| panic!("{} {args:?} did not finish in time", program.display()))
        .unwrap();
    let said = (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    eprintln!("$ {} {}\n{said:?}", program.display(), args.join(" "));
    said
}

/// `kubectl get --raw /version` through the kubeconfig `connect` wrote, given 5 s.
async fn version_within_5s(kubeconfig: &str) -> (i32, String, String) {
    let args = [
        "--kubeconfig",
        kubeconfig,
        "--request-timeout=5s",
        "get",
        "--raw",
        "/version",
    ];
    run(&kubectl(), &args, &host_kubeconfig()).await
}

fn kubectl() -> std::path::PathBuf {
    shared().binaries().path("kubectl")
}

/// A running `tenantplane connect`, its stdout read line by line.
struct Connect {
    child: Child,
    stdout: Lines<BufReader<ChildStdout>>,
    /// Every line it printed so far.
    printed: Vec<String>,
    /// Every line it wrote to stderr so far (read as they come).
    errors: Arc<Mutex<Vec<String>>>,
}

impl Connect {
    fn start(args: &[&str], kubeconfig: &OsString) -> Connect {
        let mut child = command(Path::new(binary()), args, kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let errors = Arc::new(Mutex::new(Vec::new()));
        let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        let collected = errors.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = stderr.next_line().await {
                eprintln!("connect (stderr): {line}");
                collected.lock().unwrap().push(line);
            }
        });
        Connect {
            child,
            stdout,
            printed: Vec::new(),
            errors,
        }
    }

    fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap().clone()
    }

    /// Read until a line starts with `prefix`; that line.
    async fn line_starting(&mut self, prefix: &str) -> String {
        let found = tokio::time::timeout(LIMIT, async {
            while let Some(line) = self.stdout.next_line().await.unwrap() {
                eprintln!("connect: {line}");
                self.printed.push(line.clone());
                if line.starts_with(prefix) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(line)) => line,
            _ => panic!(
                "connect never printed {prefix:?}; it printed {:#?}",
                self.printed
            ),
        }
    }

    /// Wait until it says it forwards, then until it is ready; the local port.
    async fn ready(&mut self) -> u16 {
        let line = self.line_starting("Forwarding 127.0.0.1:").await;
        let port = line["Forwarding 127.0.0.1:".len()..]
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        self.line_starting("Press Ctrl-C to stop.").await;
        port
    }

    /// Send `signal` (`INT`, `TERM`); the exit code, and what it printed after.
    async fn stop(mut self, signal: &str) -> (i32, String) {
        let pid = self.child.id().unwrap().to_string();
        let sent = std::process::Command::new("kill")
            .args(["-s", signal, &pid])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -s {signal} {pid}");
        let status = tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .expect("connect stops within 15s of the signal")
            .unwrap();
        let mut rest = String::new();
        while let Ok(Some(line)) = self.stdout.next_line().await {
            rest.push_str(&line);
            rest.push('\n');
        }
        eprintln!("connect after the signal: {rest}");
        (status.code().unwrap_or(-1), rest)
    }
}

fn read_yaml(path: &Path) -> Value {
    serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `kubectl --kubeconfig FILE get namespaces -o name` through the forward; it must succeed.
async fn tenant_namespaces(kubeconfig: &Path) -> String {
    let (code, stdout, stderr) = try_tenant_namespaces(kubeconfig).await;
    assert_eq!(code, 0, "kubectl through connect: {stderr}");
    stdout
}

/// `kubectl --kubeconfig FILE get namespaces -o name` through the forward: exit code, stdout and
/// stderr.
async fn try_tenant_namespaces(kubeconfig: &Path) -> (i32, String, String) {
    run(
        &kubectl(),
        &[
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "get",
            "namespaces",
            "-o",
            "name",
        ],
        &host_kubeconfig(),
    )
    .await
}

#[tokio::test]
async fn connect_reaches_the_tenant_through_the_host_api_server() {
    let world = ReadyTenant::start("connect").await;
    let (ns, operator) = (&world.ns, &world.operator);
    let n = ns.name.as_str();
    // A namespace only the tenant has: what answers through the forward is the tenant.
    let tenant = world.tenant;
    let only_in_tenant = format!("only-in-{n}");
    let marker: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": only_in_tenant}})).unwrap();
    Api::<Namespace>::all(tenant)
        .create(&PostParams::default(), &marker)
        .await
        .unwrap();
    let on_host = Api::<Namespace>::all(ns.client.clone())
        .get_opt(&only_in_tenant)
        .await
        .unwrap();
    assert!(on_host.is_none(), "the host has no such namespace");

    // connect --kubeconfig-out: a free port, the kubeconfig written private.
    let out = shared().dir().join(format!("{n}-connect.kubeconfig"));
    let started = Instant::now();
    let out_arg = out.display().to_string();
    let mut connect = Connect::start(
        &["connect", "dev", "-n", n, "--kubeconfig-out", &out_arg],
        &host_kubeconfig(),
    );
    let port = connect.ready().await;
    let ready_after = started.elapsed();
    assert!(
        connect
            .printed
            .iter()
            .any(|l| l.contains(&format!("kubectl --kubeconfig {out_arg} get namespaces"))),
        "it says what to run: {:#?}",
        connect.printed
    );
    let doc = read_yaml(&out);
    let cluster = &doc["clusters"][0]["cluster"];
    assert_eq!(
        cluster["server"],
        format!("https://127.0.0.1:{port}").as_str()
    );
    assert_eq!(cluster["tls-server-name"], format!("dev.{n}.svc").as_str());
    let context = format!("tenantplane-{n}-dev");
    assert_eq!(doc["current-context"], context.as_str());
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&out).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the kubeconfig holds a key");
    }
    let first = Instant::now();
    let listed = tenant_namespaces(&out).await;
    let first_answer = first.elapsed();
    assert!(
        listed.contains(&format!("namespace/{only_in_tenant}")),
        "{listed}"
    );
    let (code, version, stderr) = run(
        &kubectl(),
        &["--kubeconfig", &out_arg, "get", "--raw", "/version"],
        &host_kubeconfig(),
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    assert!(version.contains("gitVersion"), "{version}");
    eprintln!(
        "measured: connect ready after {:.2}s; first kubectl answer through it in {:.2}s",
        ready_after.as_secs_f64(),
        first_answer.as_secs_f64()
    );

    // The same port again: in use, say so.
    let port_arg = port.to_string();
    let (code, _, stderr) = run(
        Path::new(binary()),
        &["connect", "dev", "-n", n, "--local-port", &port_arg],
        &host_kubeconfig(),
    )
    .await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!("error: port {port} on 127.0.0.1 is in use")),
        "{stderr}"
    );

    // The tenant's API server crashes: a connection meanwhile fails with a line on stderr, connect
    // stays up, and once the runtime restarted it (after its back-off) connections work again.
    // Held down until connect has said so, not raced against the runtime's restart.
    assert!(operator.runtime.hold_down(n, "dev-0", true));
    assert!(operator.runtime.crash_api_server(n, "dev-0"));
    let (code, _, _) = version_within_5s(&out_arg).await;
    assert_ne!(code, 0, "the tenant's API server is down");
    // A connection whose client gave up before the forward failed leaves nothing to say (a
    // loaded host can take longer than kubectl's 5 s): connections are made until one fails
    // while its client still waits.
    let said = eventually(Duration::from_secs(60), || async {
        let errors = connect.errors();
        if !errors
            .iter()
            .any(|l| l.starts_with("connection from 127.0.0.1:"))
        {
            let _ = version_within_5s(&out_arg).await;
        }
        let errors = connect.errors();
        errors
            .iter()
            .any(|l| l.starts_with("connection from 127.0.0.1:"))
            .then_some(errors)
    })
    .await;
    assert!(said.is_some(), "a failed connection is a line on stderr");
    assert!(
        connect.child.try_wait().unwrap().is_none(),
        "connect is still running"
    );
    assert!(operator.runtime.hold_down(n, "dev-0", false));
    let back = eventually(WAIT, || async {
        let (code, _, _) = version_within_5s(&out_arg).await;
        (code == 0).then_some(())
    })
    .await;
    assert!(
        back.is_some(),
        "the restarted API server answers through connect; connect said {:?}; {}",
        connect.errors(),
        operator.runtime.describe(n, "dev-0")
    );

    // The pod is replaced (the StatefulSet makes a new one, the local runtime starts it on a new
    // loopback port): new connections reach the new pod.
    let pods = Api::<Pod>::namespaced(ns.client.clone(), n);
    let old_uid = pods.get("dev-0").await.unwrap().metadata.uid;
    pods.delete("dev-0", &DeleteParams::default())
        .await
        .unwrap();
    let replaced = eventually(WAIT, || async {
        let pod = pods.get_opt("dev-0").await.ok()??;
        (pod.metadata.uid != old_uid && tenantplane_controller::observe::pod_is_ready(&pod))
            .then_some(())
    })
    .await;
    assert!(
        replaced.is_some(),
        "dev-0 was never replaced by a Ready pod"
    );
    let replaced_at = Instant::now();
    let answered = eventually(WAIT, || async {
        let (code, stdout, _) = run(
            &kubectl(),
            &["--kubeconfig", &out_arg, "get", "namespaces", "-o", "name"],
            &host_kubeconfig(),
        )
        .await;
        (code == 0).then_some(stdout)
    })
    .await
    .expect("the replaced pod answers through the same connect");
    assert!(answered.contains(&format!("namespace/{only_in_tenant}")));
    eprintln!(
        "measured: through the replaced pod {:.2}s after it was Ready",
        replaced_at.elapsed().as_secs_f64()
    );

    // Ctrl-C: a clean stop, exit 0.
    let (code, rest) = connect.stop("INT").await;
    assert_eq!(code, 0, "{rest}");
    assert!(
        rest.contains(&format!("Stopped forwarding 127.0.0.1:{port}.")),
        "{rest}"
    );

    // Without --kubeconfig-out: merged into the first file of KUBECONFIG and made current while
    // it runs; on SIGTERM the current context is what it was, and the context stays. (That file's
    // current context names the host's context in the second file, which the binary then uses.)
    let mine = shared().dir().join(format!("{n}-user.kubeconfig"));
    std::fs::write(
        &mine,
        "apiVersion: v1
kind: Config
clusters:
- name: elsewhere
  cluster:
    server: https://127.0.0.1:1
users:
- name: someone
  user:
    token: not-a-real-token
contexts:
- name: elsewhere
  context:
    cluster: elsewhere
    user: someone
current-context: testenv
",
    )
    .unwrap();
    let both = std::env::join_paths([mine.as_os_str(), &host_kubeconfig()]).unwrap();
    let mut merged = Connect::start(
        &["connect", "dev", "-n", n, "--context-name", "mine"],
        &both,
    );
    let port = merged.ready().await;
    assert!(
        merged.printed.iter().any(|l| l.contains(&format!(
            "Merged into {}: added cluster mine, user mine and context mine; the current context is now mine (was testenv)",
            mine.display()
        ))),
        "{:#?}",
        merged.printed
    );
    let doc = read_yaml(&mine);
    assert_eq!(doc["current-context"], "mine");
    assert_eq!(doc["clusters"][0]["name"], "elsewhere", "kept");
    assert_eq!(
        doc["clusters"][1]["cluster"]["server"],
        format!("https://127.0.0.1:{port}").as_str()
    );
    for (args, kubeconfig) in [
        (&["--context", "mine"][..], mine.as_os_str().to_owned()),
        // As it says: plain kubectl now talks to the tenant.
        (&[][..], both.clone()),
    ] {
        let args: Vec<&str> = args
            .iter()
            .copied()
            .chain(["get", "namespaces", "-o", "name"])
            .collect();
        let (code, listed, stderr) = run(&kubectl(), &args, &kubeconfig).await;
        assert_eq!(code, 0, "{stderr}");
        assert!(
            listed.contains(&format!("namespace/{only_in_tenant}")),
            "{listed}"
        );
    }
    let (code, rest) = merged.stop("TERM").await;
    assert_eq!(code, 0, "{rest}");
    assert!(
        rest.contains("the current context is testenv again"),
        "{rest}"
    );
    let doc = read_yaml(&mine);
    assert_eq!(doc["current-context"], "testenv");
    assert_eq!(doc["contexts"][1]["name"], "mine", "the context stays");
}

#[tokio::test]
async fn connect_says_what_to_fix_and_exits_1() {
    install_crds_and_policies();
    // No operator: a TenantCluster made here is never Ready.
    let ns = namespace("connect-errors").await;
    let n = ns.name.as_str();
    let tp = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(Path::new(binary()), &args, &host_kubeconfig()).await
    };
    let args =
        |name: &str| -> Vec<String> { ["connect", name, "-n", n].map(String::from).to_vec() };

    let (code, _, stderr) = tp(args("nope")).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "error: TenantCluster nope not found in namespace {n}; list the tenants with `tenantplane list -n {n}`"
        )),
        "{stderr}"
    );

    let (code, _, stderr) = tp(["create", "slow", "-n", n].map(String::from).to_vec()).await;
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, stderr) = tp(args("slow")).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "error: TenantCluster slow in namespace {n} has no API server to connect to: Service slow in namespace {n} not found"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("the operator has not reported on it yet (is it running?)"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "wait until `tenantplane status slow -n {n}` says Ready"
        )),
        "{stderr}"
    );
    assert!(!stdout.contains("Forwarding"), "{stdout}");
    let kubeconfig_out = shared().dir().join(format!("{n}-never.kubeconfig"));
    let mut with_out = args("slow");
    with_out.extend([
        "--kubeconfig-out".into(),
        kubeconfig_out.display().to_string(),
    ]);
    let (code, _, _) = tp(with_out).await;
    assert_eq!(code, 1);
    assert!(
        !kubeconfig_out.exists(),
        "nothing is written for a tenant that is not Ready"
    );
}

#[tokio::test]
async fn connect_wakes_a_sleeping_tenant_and_a_connection_wakes_it_again() {
    use kube::api::{Patch, PatchParams};
    use tenantplane_api::{Phase, TenantCluster};
    let world = ReadyTenant::start("connect-wake").await;
    let (ns, host) = (&world.ns.name, &world.host);
    let tenants: Api<TenantCluster> = Api::namespaced(host.clone(), ns);
    let asleep = Patch::Merge(serde_json::json!({"spec": {"sleep": {"asleep": true}}}));
    tenants
        .patch("dev", &PatchParams::default(), &asleep)
        .await
        .unwrap();
    common::wait_for_phase(host, ns, "dev", Phase::Sleeping).await;

    // `connect` finds it asleep, wakes it with progress lines, then forwards.
    let out = shared().dir().join(format!("{ns}-wake.kubeconfig"));
    let out_arg = out.display().to_string();
    let mut connect = Connect::start(
        &["connect", "dev", "-n", ns, "--kubeconfig-out", &out_arg],
        &host_kubeconfig(),
    );
    connect
        .line_starting(&format!(
            "TenantCluster dev in namespace {ns} is asleep: waking it up"
        ))
        .await;
    let woke = connect
        .line_starting(&format!("TenantCluster dev in namespace {ns} woke up in "))
        .await;
    eprintln!("{woke}");
    connect.ready().await;
    assert!(tenant_namespaces(&out).await.contains("namespace/default"));

    // Asleep again while `connect` runs: the next connection wakes it and is answered.
    tenants
        .patch("dev", &PatchParams::default(), &asleep)
        .await
        .unwrap();
    common::wait_for_phase(host, ns, "dev", Phase::Sleeping).await;
    let started = Instant::now();
    // The connection wakes the tenant. The forward carries TLS end to end, so kubectl's handshake
    // waits for the wake, and kubectl gives up on a handshake after 10 s: on a loaded machine a
    // wake can take longer, and a user then runs the command again, which is answered.
    let (code, answer, stderr) = try_tenant_namespaces(&out).await;
    let answer = if code != 0 && stderr.contains("TLS handshake timeout") {
        eprintln!(
            "the wake outlasted kubectl's TLS handshake ({:.1?}); again",
            started.elapsed()
        );
        tenant_namespaces(&out).await
    } else {
        assert_eq!(code, 0, "kubectl through connect: {stderr}");
        answer
    };
    assert!(answer.contains("namespace/default"));
    eprintln!(
        "a connection to the sleeping tenant was answered after {:.1?}",
        started.elapsed()
    );
    // The status follows the answer: the next reconcile after the wake reads it Ready.
    let tc = common::wait_for_phase(host, ns, "dev", Phase::Ready).await;
    assert!(!tc.spec.sleep.asleep, "the wake set the spec back");
    let (code, _) = connect.stop("INT").await;
    assert_eq!(code, 0);
}
