//! The tenant user's CLI, as the built binary, against the test control plane: `create --wait`,
//! `list`, `status`, `kubeconfig --merge`, `delete --wait`, the kubectl plugin, and the errors and
//! exit codes scripts rely on. The host kubeconfig reaches the binary through `KUBECONFIG`.

mod common;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::api::Api;
use serde_json::Value;
use tenantplane_api::TenantCluster;
use tenantplane_testenv::{install_crds_and_policies, namespace, shared};

use common::{TestHost, example, tenant_client};

/// Longest any one command may take (`create --wait` included).
const COMMAND_LIMIT: Duration = Duration::from_secs(240);

struct Output {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit code {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Run `program args…` with `KUBECONFIG=kubeconfig` and a HOME of its own, without blocking the
/// test's runtime (the operator runs on it).
async fn run_with(
    program: &Path,
    args: &[&str],
    kubeconfig: &OsString,
    path: Option<&OsString>,
) -> Output {
    let home = shared().dir().join("cli-home");
    std::fs::create_dir_all(&home).unwrap();
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", &home)
        .kill_on_drop(true);
    if let Some(path) = path {
        command.env("PATH", path);
    }
    let started = Instant::now();
    let out = tokio::time::timeout(COMMAND_LIMIT, command.output())
        .await
        .unwrap_or_else(|_| panic!("{} {args:?} did not finish in time", program.display()))
        .unwrap();
    let output = Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    eprintln!(
        "$ {} {} ({:.1}s)\n{output:?}",
        program.file_name().unwrap().to_string_lossy(),
        args.join(" "),
        started.elapsed().as_secs_f64()
    );
    output
}

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tenantplane"))
}

fn host_kubeconfig() -> OsString {
    shared().kubeconfig_path().as_os_str().to_owned()
}

/// `tenantplane args…` against the test control plane.
async fn tp(args: &[&str]) -> Output {
    run_with(&binary(), args, &host_kubeconfig(), None).await
}

fn ok(out: &Output) {
    assert_eq!(out.code, 0, "expected success: {out:?}");
}

fn failed_with(out: &Output, message: &str) {
    assert_eq!(out.code, 1, "expected exit code 1: {out:?}");
    assert!(
        out.stderr.contains(message),
        "expected {message:?}: {out:?}"
    );
    assert!(out.stderr.starts_with("error: "), "{out:?}");
}

/// The words of a table's lines.
fn rows(table: &str) -> Vec<Vec<&str>> {
    table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect()
}

/// A copy of the host kubeconfig whose context names `namespace`, as `kubectl config
/// set-context --current --namespace` would leave it.
fn kubeconfig_with_namespace(namespace: &str) -> OsString {
    let text = std::fs::read_to_string(shared().kubeconfig_path()).unwrap();
    let mut doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let contexts = doc["contexts"].as_sequence_mut().unwrap();
    for context in contexts {
        context["context"]["namespace"] = namespace.into();
    }
    let path = shared()
        .dir()
        .join(format!("{namespace}-context.kubeconfig"));
    std::fs::write(&path, serde_yaml::to_string(&doc).unwrap()).unwrap();
    path.into_os_string()
}

#[tokio::test]
async fn a_tenant_user_creates_lists_inspects_connects_to_and_deletes_a_tenant() {
    let world = TestHost::start("cli").await;
    let ns = &world.ns;
    let n = ns.name.as_str();

    // create --wait: a line per change, Ready at the end.
    let create = tp(&["create", "dev", "-n", n, "--wait", "--timeout", "3m"]).await;
    ok(&create);
    let lines: Vec<&str> = create.stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!("TenantCluster dev created in namespace {n}")
    );
    let progress: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| {
            l.trim_start()
                .split_once("s  ")
                .is_some_and(|(secs, _)| secs.parse::<u64>().is_ok())
        })
        .collect();
    assert!(progress.len() >= 2, "a line per change: {create:?}");
    assert!(
        progress
            .iter()
            .any(|l| l.contains("Provisioning: Ready False (ControlPlaneNotReady)")),
        "{create:?}"
    );
    assert!(
        progress
            .last()
            .unwrap()
            .contains("Ready: Ready True (ControlPlaneReady), Synced True (SyncSucceeded)"),
        "{create:?}"
    );
    assert!(
        progress.windows(2).all(|w| w[0] != w[1]),
        "no repeated lines: {create:?}"
    );
    assert!(
        create.stdout.contains(&format!(
            "TenantCluster dev in namespace {n} is Ready after"
        )),
        "{create:?}"
    );

    // What it created is the seed example.
    let tc = Api::<TenantCluster>::namespaced(ns.client.clone(), n)
        .get("dev")
        .await
        .unwrap();
    assert_eq!(tc.spec, example(n).spec);

    // version: this client's, the operator's (none as a Deployment here), and the tenant's as
    // asked and as its API server reports it, through a forward as `connect` makes.
    let version = tp(&["version", "dev", "-n", n]).await;
    ok(&version);
    let lines: Vec<&str> = version.stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!("Client:   tenantplane {}", env!("CARGO_PKG_VERSION")),
        "{version:?}"
    );
    assert!(lines[1].starts_with("Operator: "), "{version:?}");
    let reported = tenant_client(&ns.client, n, "dev")
        .await
        .apiserver_version()
        .await
        .unwrap()
        .git_version;
    assert_eq!(
        lines[2],
        format!("Tenant:   {n}/dev asks for v1.30.4 (k3s); its API server reports {reported}"),
        "{version:?}"
    );
    // The test world's tenants run the local runtime's build, not the one they ask for.
    if !reported.starts_with("v1.30.4") {
        assert!(
            lines[3].starts_with("Note:     the tenant API server reports"),
            "{version:?}"
        );
    }

    // list -n: the table, without NAMESPACE.
    let list = tp(&["list", "-n", n]).await;
    ok(&list);
    let table = rows(&list.stdout);
    assert_eq!(table[0], ["NAME", "PHASE", "MODE", "VERSION", "AGE"]);
    assert_eq!(table.len(), 2, "{list:?}");
    assert_eq!(table[1][..4], ["dev", "Ready", "shared", "v1.30.4"]);
    assert!(table[1][4].ends_with('s') || table[1][4].ends_with('m'));

    // list -A: NAMESPACE first, our tenant among them.
    let all = tp(&["list", "-A"]).await;
    ok(&all);
    let table = rows(&all.stdout);
    assert_eq!(
        table[0],
        ["NAMESPACE", "NAME", "PHASE", "MODE", "VERSION", "AGE"]
    );
    assert!(
        table
            .iter()
            .any(|r| r[..5] == [n, "dev", "Ready", "shared", "v1.30.4"]),
        "{all:?}"
    );

    // -o json parses, as a List of the objects without managed fields; -o yaml too.
    let json = tp(&["list", "-n", n, "-o", "json"]).await;
    ok(&json);
    let doc: Value = serde_json::from_str(&json.stdout).expect("list -o json is JSON");
    assert!(
        json.stdout
            .starts_with("{\n  \"apiVersion\": \"v1\",\n  \"kind\": \"List\","),
        "kubectl's field order: {json:?}"
    );
    assert_eq!(doc["kind"], "List");
    assert_eq!(doc["items"].as_array().unwrap().len(), 1);
    let item = &doc["items"][0];
    assert_eq!(item["kind"], "TenantCluster");
    assert_eq!(item["metadata"]["name"], "dev");
    assert_eq!(item["status"]["phase"], "Ready");
    assert!(item["metadata"].get("managedFields").is_none());
    let yaml = tp(&["list", "-A", "-o", "yaml"]).await;
    ok(&yaml);
    let doc: serde_yaml::Value = serde_yaml::from_str(&yaml.stdout).expect("list -o yaml is YAML");
    assert_eq!(doc["kind"], "List");

    // -o wide: ENDPOINT and the Ready reason.
    let wide = tp(&["list", "-n", n, "-o", "wide"]).await;
    ok(&wide);
    let table = rows(&wide.stdout);
    assert_eq!(
        table[0],
        [
            "NAME", "PHASE", "MODE", "VERSION", "AGE", "ENDPOINT", "REASON"
        ]
    );
    let endpoint = format!("https://dev.{n}.svc:6443");
    assert_eq!(table[1][5..], [endpoint.as_str(), "ControlPlaneReady"]);

    // Without -n: the context's namespace.
    let in_context = run_with(&binary(), &["list"], &kubeconfig_with_namespace(n), None).await;
    ok(&in_context);
    assert_eq!(rows(&in_context.stdout)[1][0], "dev");

    // status: phase, endpoint, and the conditions as a table.
    let status = tp(&["status", "dev", "-n", n]).await;
    ok(&status);
    assert!(status.stdout.contains("Phase:      Ready\n"), "{status:?}");
    assert!(
        status.stdout.contains(&format!("Endpoint:   {endpoint}\n")),
        "{status:?}"
    );
    // The admin certificate's expiry, a year out (the kubeconfig Secret is readable here).
    let expiry = status
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("Admin cert: expires "))
        .unwrap_or_else(|| panic!("no admin certificate line: {status:?}"));
    assert!(expiry.contains("(in 36"), "{expiry}");
    let table: Vec<Vec<&str>> = rows(&status.stdout)
        .into_iter()
        .skip_while(|r| r.first() != Some(&"TYPE"))
        .collect();
    assert_eq!(
        table[0],
        ["TYPE", "STATUS", "REASON", "MESSAGE", "AGE"],
        "{status:?}"
    );
    assert_eq!(table[1][..3], ["Ready", "True", "ControlPlaneReady"]);
    assert_eq!(table[2][..3], ["Synced", "True", "SyncSucceeded"]);
    assert_eq!(table[3][..3], ["ModeSupported", "True", "Shared"]);
    assert!(
        status.stdout.contains("the tenant runs in shared mode"),
        "{status:?}"
    );
    let as_json = tp(&["status", "dev", "-n", n, "-o", "json"]).await;
    ok(&as_json);
    let doc: Value = serde_json::from_str(&as_json.stdout).unwrap();
    assert_eq!(doc["status"]["endpoint"], endpoint.as_str());

    // kubeconfig --merge into the first file of KUBECONFIG: an unrelated context stays, an entry
    // of the same name is replaced, and the merged context reaches the tenant.
    let mine = shared().dir().join(format!("{n}-user.kubeconfig"));
    let before = "apiVersion: v1
kind: Config
preferences: {}
clusters:
- name: elsewhere
  cluster:
    server: https://elsewhere.example:6443
- name: tenant-dev
  cluster:
    server: https://stale.example:6443
users:
- name: someone
  user:
    token: not-a-real-token
contexts:
- name: elsewhere
  context:
    cluster: elsewhere
    user: someone
    namespace: shop
";
    std::fs::write(&mine, before).unwrap();
    let both = std::env::join_paths([mine.as_os_str(), &host_kubeconfig()]).unwrap();
    let merge = run_with(
        &binary(),
        &[
            "kubeconfig",
            "dev",
            "-n",
            n,
            "--merge",
            "--context-name",
            "tenant-dev",
        ],
        &both,
        None,
    )
    .await;
    ok(&merge);
    assert!(
        merge.stdout.contains(&format!(
            "into {}: added user tenant-dev and context tenant-dev; replaced cluster tenant-dev",
            mine.display()
        )),
        "{merge:?}"
    );
    let after: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&mine).unwrap()).unwrap();
    let before: serde_yaml::Value = serde_yaml::from_str(before).unwrap();
    assert_eq!(after["clusters"][0], before["clusters"][0]);
    assert_eq!(after["users"][0], before["users"][0]);
    assert_eq!(after["contexts"][0], before["contexts"][0]);
    assert_eq!(after["clusters"].as_sequence().unwrap().len(), 2);
    assert_ne!(
        after["clusters"][1]["cluster"]["server"],
        "https://stale.example:6443"
    );
    assert!(after.get("current-context").is_none(), "left alone");
    let kubectl = shared().binaries().path("kubectl");
    let mine_os = mine.as_os_str().to_owned();
    let tenant_namespaces = run_with(
        &kubectl,
        &["--context", "tenant-dev", "get", "namespaces", "-o", "name"],
        &mine_os,
        None,
    )
    .await;
    ok(&tenant_namespaces);
    assert!(
        tenant_namespaces.stdout.contains("namespace/kube-system"),
        "{tenant_namespaces:?}"
    );

    // The same binary as the kubectl plugin: `kubectl tenant list`.
    let plugins = shared().dir().join(format!("{n}-plugins"));
    std::fs::create_dir_all(&plugins).unwrap();
    std::os::unix::fs::symlink(binary(), plugins.join("kubectl-tenant")).unwrap();
    let path = std::env::join_paths(
        std::iter::once(plugins.clone()).chain(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        )),
    )
    .unwrap();
    let plugin = run_with(
        &kubectl,
        &["tenant", "list", "-n", n],
        &host_kubeconfig(),
        Some(&path),
    )
    .await;
    ok(&plugin);
    assert_eq!(rows(&plugin.stdout)[1][..2], ["dev", "Ready"]);
    let missing = run_with(
        &kubectl,
        &["tenant", "status", "nope", "-n", n],
        &host_kubeconfig(),
        Some(&path),
    )
    .await;
    assert_ne!(missing.code, 0);
    assert!(
        missing.stderr.contains(&format!(
            "TenantCluster nope not found in namespace {n}; list the tenants with `kubectl tenant list -n {n}`"
        )),
        "{missing:?}"
    );
    let operator_verb = run_with(
        &plugins.join("kubectl-tenant"),
        &["controller"],
        &host_kubeconfig(),
        None,
    )
    .await;
    assert_eq!(operator_verb.code, 1, "{operator_verb:?}");

    // delete --wait: gone once the operator's finalizer is done.
    let delete = tp(&["delete", "dev", "-n", n, "--wait", "--timeout", "2m"]).await;
    ok(&delete);
    assert!(
        delete
            .stdout
            .contains(&format!("TenantCluster dev in namespace {n} deleted after")),
        "{delete:?}"
    );
    let gone = Api::<TenantCluster>::namespaced(ns.client.clone(), n)
        .get_opt("dev")
        .await
        .unwrap();
    assert!(gone.is_none());
    // And settled: none of its pods or claims is left, Terminating or not.
    for selector in [
        "tenantplane.io/tenant=dev",
        "tenantplane.io/synced-from=dev",
    ] {
        let params = kube::api::ListParams::default().labels(selector);
        let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(ns.client.clone(), n)
            .list(&params)
            .await
            .unwrap();
        let claims = Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
            ns.client.clone(),
            n,
        )
        .list(&params)
        .await
        .unwrap();
        let left: Vec<String> = pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .chain(
                claims
                    .iter()
                    .map(|c| c.metadata.name.clone().unwrap_or_default()),
            )
            .collect();
        assert!(
            left.is_empty(),
            "delete --wait returned with {left:?} left ({selector})"
        );
    }
}

#[tokio::test]
async fn errors_say_what_to_do_and_exit_1() {
    install_crds_and_policies();
    // No operator here: what is created stays Pending.
    let ns = namespace("cli-errors").await;
    let n = ns.name.as_str();
    let not_found = format!("TenantCluster dev not found in namespace {n}");

    failed_with(&tp(&["status", "dev", "-n", n]).await, &not_found);
    failed_with(&tp(&["delete", "dev", "-n", n]).await, &not_found);
    failed_with(&tp(&["kubeconfig", "dev", "-n", n]).await, &not_found);
    failed_with(
        &tp(&["kubeconfig", "dev", "-n", n, "--merge"]).await,
        &not_found,
    );
    // Without -n, the namespace is the context's.
    let in_context = run_with(
        &binary(),
        &["status", "dev"],
        &kubeconfig_with_namespace(n),
        None,
    )
    .await;
    failed_with(&in_context, &not_found);

    // An empty list is not an error.
    let empty = tp(&["list", "-n", n]).await;
    ok(&empty);
    assert_eq!(empty.stdout, "");
    assert!(
        empty
            .stderr
            .contains(&format!("No TenantClusters found in namespace {n}.")),
        "{empty:?}"
    );

    // The API server's own words for what it refuses.
    failed_with(
        &tp(&["create", "dev", "-n", n, "--version", "1.30"]).await,
        "kubernetesVersion must look like v1.30.4 (a v, then major.minor.patch); got 1.30",
    );
    failed_with(
        &tp(&["create", "dev", "-n", &format!("{n}-missing")]).await,
        &format!("namespace {n}-missing not found; add --create-namespace, create it first"),
    );

    // Created, then the same name again; --wait without an operator runs out of time.
    ok(&tp(&["create", "dev", "-n", n]).await);
    failed_with(
        &tp(&["create", "dev", "-n", n]).await,
        &format!("TenantCluster dev already exists in namespace {n}"),
    );
    failed_with(
        &tp(&["create", "slow", "-n", n, "--wait", "--timeout", "2s"]).await,
        &format!("TenantCluster slow in namespace {n} is not Ready after 2s: no status yet"),
    );
    failed_with(
        &tp(&["kubeconfig", "slow", "-n", n]).await,
        "TenantCluster slow is not Ready yet: the operator has not reported on it yet",
    );

    // Usage errors are exit code 1 too, as with kubectl.
    let bad_flag = tp(&["list", "-n", n, "-o", "xml"]).await;
    assert_eq!(bad_flag.code, 1, "{bad_flag:?}");
    let no_host = run_with(
        &binary(),
        &["list"],
        &shared().dir().join("no-such.kubeconfig").into_os_string(),
        None,
    )
    .await;
    failed_with(&no_host, "no kubeconfig found");
}

#[tokio::test]
async fn create_wait_exits_at_once_on_a_failure_waiting_will_not_fix_and_cleans_up() {
    let world = TestHost::start("cli-degraded").await;
    let ns = &world.ns;
    let n = ns.name.as_str();
    let tenants: Api<TenantCluster> = Api::namespaced(ns.client.clone(), n);
    let create = |keep: bool| {
        let mut args = vec![
            "create",
            "dev",
            "-n",
            n,
            "--isolation-profile",
            "missing-profile",
            "--wait",
        ];
        if keep {
            args.push("--keep");
        }
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            tp(&args).await
        }
    };
    let started = Instant::now();
    let failed = create(false).await;
    let took = started.elapsed();
    failed_with(
        &failed,
        &format!(
            "TenantCluster dev in namespace {n} is Degraded for a reason waiting will not fix: IsolationProfileNotFound: IsolationProfile \"missing-profile\" not found"
        ),
    );
    assert!(
        failed
            .stdout
            .contains("Degraded: Ready False (IsolationProfileNotFound)"),
        "{failed:?}"
    );
    failed_with(
        &failed,
        &format!("TenantCluster dev in namespace {n} is deleted (add --keep to keep it)"),
    );
    eprintln!("create --wait gave up on a missing profile after {took:?}");
    // The object it made is gone (its finalizer taken off by the operator), so the same
    // command can run again once the profile exists.
    let gone = tenantplane_testenv::eventually(Duration::from_secs(60), || async {
        tenants.get_opt("dev").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "the TenantCluster create made is still there"
    );
    // With --keep it stays.
    let kept = create(true).await;
    failed_with(&kept, "IsolationProfileNotFound");
    assert!(!kept.stderr.contains("is deleted"), "{kept:?}");
    assert!(tenants.get_opt("dev").await.unwrap().is_some());
}

#[tokio::test]
async fn create_makes_the_namespace_when_asked() {
    let world = TestHost::start("cli-newns").await;
    let n = format!("{}-made", world.ns.name);
    let without = tp(&["create", "dev", "-n", &n]).await;
    failed_with(&without, "add --create-namespace");
    let with = tp(&["create", "dev", "-n", &n, "--create-namespace"]).await;
    ok(&with);
    assert!(
        with.stdout.contains(&format!("namespace {n} created")),
        "{with:?}"
    );
    let tenants: Api<TenantCluster> = Api::namespaced(world.ns.client.clone(), &n);
    assert!(tenants.get_opt("dev").await.unwrap().is_some());
    // Leave the shared host as found: the tenant, then its namespace.
    ok(&tp(&["delete", "dev", "-n", &n, "--wait"]).await);
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(world.ns.client.clone());
    namespaces.delete(&n, &Default::default()).await.unwrap();
}
