//! `tenantplane dev` as a new user meets it (`make demo`): with a real node, the README's example
//! workload answers from a real container through its Service, and Ctrl-C leaves nothing behind.
//! Runs in the network namespace `make test` gives the tests (a real node needs one of its own).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tenantplane_testenv::Binaries;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const LIMIT: Duration = Duration::from_secs(300);

/// One real node per network namespace (its bridge, its kubelet's port, kube-proxy's tables):
/// the tests of this binary take turns.
static ONE_NODE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_tenantplane")
}

/// `program args…` to the end, with `KUBECONFIG`; (exit code, stdout, stderr).
async fn run(program: &Path, args: &[&str], kubeconfig: &Path) -> (i32, String, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        Command::new(program)
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{} {args:?} did not end in 2 minutes", program.display()))
    .unwrap();
    let said = (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    eprintln!("$ {} {}\n{said:?}", program.display(), args.join(" "));
    said
}

/// Processes whose command line names `needle`.
fn processes_naming(needle: &str) -> Vec<String> {
    pids_naming(needle).into_iter().map(|(_, c)| c).collect()
}

/// (pid, command line) of the processes whose command line names `needle`.
fn pids_naming(needle: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(needle) {
                found.push((pid, cmdline));
            }
        }
    }
    found
}

/// `kill -9` the demo, and wait until nothing it started runs but its containerd shims (which
/// outlive it by design until the next start); their pids.
async fn kill_9(mut dev: tokio::process::Child, state: &Path) -> Vec<u32> {
    dev.start_kill().unwrap();
    dev.wait().await.unwrap();
    let state_arg = state.display().to_string();
    let shims_only = tenantplane_testenv::eventually(Duration::from_secs(60), || async {
        let left = pids_naming(&state_arg);
        left.iter()
            .all(|(_, c)| c.contains("containerd-shim"))
            .then(|| left.into_iter().map(|(pid, _)| pid).collect::<Vec<_>>())
    })
    .await;
    shims_only.unwrap_or_else(|| {
        panic!(
            "a killed demo leaves only its shims: {:#?}",
            processes_naming(&state_arg)
        )
    })
}

/// `tenantplane dev --nodes real` on `state`, once it says it is ready.
async fn start_dev(state: &Path) -> tokio::process::Child {
    let state_arg = state.display().to_string();
    let mut dev = Command::new(binary())
        .args(["dev", "--nodes", "real", "--state-dir", &state_arg])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(dev.stderr.take().unwrap()).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = stderr.next_line().await {
            eprintln!("dev: {line}");
        }
    });
    let mut stdout = BufReader::new(dev.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(LIMIT, async {
        while let Ok(Some(line)) = stdout.next_line().await {
            eprintln!("dev (stdout): {line}");
            if line.starts_with("The dev cluster is ready") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        ready.ok(),
        Some(true),
        "the dev cluster never said it was ready"
    );
    // Read to the end, as a terminal would: what follows the ready line is part of what it says.
    tokio::spawn(async move {
        while let Ok(Some(line)) = stdout.next_line().await {
            eprintln!("dev (stdout): {line}");
        }
    });
    dev
}

/// The cgroup (memory, or the one v2 hierarchy) of the dev cluster's node on `state`.
fn node_cgroup(state: &Path) -> PathBuf {
    let kubelet_config = std::fs::read_to_string(state.join("cluster/node/kubelet.yaml")).unwrap();
    let cgroup_root = kubelet_config
        .lines()
        .find_map(|l| l.strip_prefix("cgroupRoot: "))
        .expect("the kubelet has a cgroup root of its own")
        .trim()
        .to_string();
    // cgroup v2 has one hierarchy; v1 (some machines) one per controller.
    let base = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        Path::new("/sys/fs/cgroup")
    } else {
        Path::new("/sys/fs/cgroup/memory")
    };
    base.join(cgroup_root.trim_start_matches('/'))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_runs_the_example_workload_in_real_containers_and_stops_clean() {
    let _turn = ONE_NODE.lock().await;
    let state = std::env::temp_dir().join(format!("tenantplane-dev-test-{}", std::process::id()));
    let state_arg = state.display().to_string();
    let mut dev = start_dev(&state).await;

    let kubeconfig: PathBuf = state.join("kubeconfig");
    let kubectl = Binaries::locate().unwrap().path("kubectl");
    let nodes = run(
        &kubectl,
        &["get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"],
        &kubeconfig,
    )
    .await;
    assert!(
        nodes.1.contains("tenantplane-node-0"),
        "a real node: {nodes:?}"
    );

    // The README's steps: the tenant's kubeconfig, the example workload, its answer.
    let said = run(
        Path::new(binary()),
        &["kubeconfig", "dev", "-n", "team-dev"],
        &kubeconfig,
    )
    .await;
    assert_eq!(said.0, 0, "{said:?}");
    let tenant_kubeconfig = state.join("dev.kubeconfig");
    std::fs::write(&tenant_kubeconfig, said.1).unwrap();
    let tk = tenant_kubeconfig.display().to_string();
    let example = tenantplane_testenv::repo_path("examples/tenant-workload.yaml");
    let said = run(
        &kubectl,
        &[
            "--kubeconfig",
            &tk,
            "apply",
            "-f",
            &example.display().to_string(),
        ],
        &kubeconfig,
    )
    .await;
    assert_eq!(said.0, 0, "{said:?}");
    let said = run(
        &kubectl,
        &[
            "--kubeconfig",
            &tk,
            "rollout",
            "status",
            "deploy/web",
            "--timeout=180s",
        ],
        &kubeconfig,
    )
    .await;
    assert_eq!(said.0, 0, "the example rolls out: {said:?}");
    let answer = tenantplane_testenv::eventually(Duration::from_secs(60), || async {
        let said = run(
            &kubectl,
            &[
                "--kubeconfig",
                &tk,
                "exec",
                "deploy/web",
                "--",
                "wget",
                "-qO-",
                "http://web/greeting",
            ],
            &kubeconfig,
        )
        .await;
        (said.0 == 0).then_some(said.1)
    })
    .await;
    assert_eq!(
        answer.as_deref(),
        Some("hello from the tenant"),
        "the example answers through its Service, from a real container"
    );

    // Ctrl-C: everything it started stops, the node's cgroups and shims with it.
    let memory_cgroup = node_cgroup(&state);
    assert!(
        memory_cgroup.exists(),
        "{} while it runs",
        memory_cgroup.display()
    );
    let pid = dev.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-s", "INT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = tokio::time::timeout(Duration::from_secs(60), dev.wait())
        .await
        .expect("dev stops within a minute of Ctrl-C")
        .unwrap();
    assert!(status.success(), "{status}");
    let left = processes_naming(&state_arg);
    assert!(left.is_empty(), "processes left behind: {left:#?}");
    assert!(
        !memory_cgroup.exists(),
        "cgroup {} left behind",
        memory_cgroup.display()
    );
    let _ = std::fs::remove_dir_all(&state);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_demo_killed_with_kill_9_starts_clean_the_next_time() {
    let _turn = ONE_NODE.lock().await;
    let state = std::env::temp_dir().join(format!("tenantplane-dev-kill-{}", std::process::id()));
    let first = start_dev(&state).await;
    let cgroup = node_cgroup(&state);
    // Pods run (the tenant's CoreDNS at least), so shims and containers are there to be left.
    let kubeconfig = state.join("kubeconfig");
    let kubectl = Binaries::locate().unwrap().path("kubectl");
    let running = tenantplane_testenv::eventually(Duration::from_secs(120), || async {
        let said = run(
            &kubectl,
            &[
                "get",
                "pods",
                "-A",
                "--field-selector=status.phase=Running",
                "-o",
                "name",
            ],
            &kubeconfig,
        )
        .await;
        said.1.contains("coredns").then_some(())
    })
    .await;
    assert!(running.is_some(), "the tenant's CoreDNS never ran");
    let shims = kill_9(first, &state).await;

    let second = start_dev(&state).await;
    assert!(
        !cgroup.exists(),
        "the killed node's cgroup {} is gone",
        cgroup.display()
    );
    let left: Vec<u32> = shims.iter().copied().filter(|pid| alive(*pid)).collect();
    assert!(
        left.is_empty(),
        "no shim of the killed node is left: {left:?}"
    );
    // The next test's node needs the kubelet's port: wait for this one's to go.
    kill_9(second, &state).await;
    let _ = std::fs::remove_dir_all(&state);
}

/// Whether process `pid` lives: it exists and is not a zombie (a killed shim whose new parent,
/// PID 1 of the tests' PID namespace, does not reap it stays one).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name, which is in parentheses and may hold spaces.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z")
    })
}
