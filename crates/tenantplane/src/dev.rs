//! `tenantplane dev`: the local dev cluster. The test control plane, the CRDs and default
//! policies, the operator and the local runtime, namespace `team-dev` with the seed example, a
//! progress line per phase, and everything stopped on Ctrl-C.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};
use tenantplane_api::{TenantCluster, conditions};
use tenantplane_controller::names;
use tenantplane_local::runtime;
use tenantplane_testenv::host_cluster::real_node;
use tenantplane_testenv::{Agent, ControlPlane, Nodes, Options, netns};

use crate::manifests;

const NAMESPACE: &str = "team-dev";
const TENANT: &str = "dev";
/// The second example's, with a real node: `examples/tenantcluster-kubernetes.yaml`.
const KUBERNETES_NAMESPACE: &str = "team-upstream";
const KUBERNETES_TENANT: &str = "upstream";
/// Where the kubelet CA is kept, as in a deployed operator's namespace.
const OPERATOR_NAMESPACE: &str = "tenantplane-system";

fn say(started: Instant, what: &str) {
    eprintln!("dev: {what} ({:.0}s)", started.elapsed().as_secs_f64());
}

async fn ensure_namespace(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    let ns =
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    Api::<Namespace>::all(client.clone())
        .patch(
            name,
            &PatchParams::apply("tenantplane-cli"),
            &Patch::Apply(&ns),
        )
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(())
}

/// What runs the dev cluster's pods, as asked on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NodesArg {
    /// A real node where the machine allows it (root, writable cgroups), simulated otherwise.
    Auto,
    /// A real node: kubelet, containerd, runc, CNI bridge, kube-proxy.
    Real,
    /// kwok's simulated node only: no container runs.
    Simulated,
}

/// How this run gets the nodes it was asked for.
enum Plan {
    Here(Nodes),
    /// A real node in namespaces of its own: this command again, in them.
    InNamespaces,
}

fn plan(nodes: NodesArg) -> anyhow::Result<Plan> {
    if nodes == NodesArg::Simulated {
        return Ok(Plan::Here(Nodes::Simulated));
    }
    if let Err(reason) = real_node::machine_allows() {
        if nodes == NodesArg::Real {
            anyhow::bail!("a real node cannot run here: {reason}");
        }
        eprintln!("dev: simulated nodes, as a real node cannot run here: {reason}");
        return Ok(Plan::Here(Nodes::Simulated));
    }
    Ok(match real_node::isolated() {
        // Workloads go to the real node; the local runtime's control-plane pods, which the
        // operator builds to tolerate the taint, to the simulated one.
        Ok(()) => Plan::Here(Nodes::Real {
            simulated_taint: names::SIMULATED_NODE_TAINT,
        }),
        Err(_) => Plan::InNamespaces,
    })
}

pub async fn run(state_dir: PathBuf, nodes: NodesArg) -> anyhow::Result<()> {
    match plan(nodes)? {
        Plan::Here(nodes) => run_here(state_dir, nodes).await,
        Plan::InNamespaces => run_in_namespaces(state_dir).await,
    }
}

/// Run `dev --nodes real` again in new network, mount and PID namespaces, and make its loopback
/// ports answer here, until it ends (Ctrl-C reaches it too: it is in this terminal's group).
async fn run_in_namespaces(state_dir: PathBuf) -> anyhow::Result<()> {
    eprintln!(
        "dev: real nodes, in network, mount and PID namespaces of their own (no packet leaves); \
         their loopback ports answer here too"
    );
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("creating {}", state_dir.display()))?;
    let exe = std::env::current_exe().context("finding this program")?;
    let args = vec![
        "dev".to_string(),
        "--nodes=real".to_string(),
        format!("--state-dir={}", state_dir.canonicalize()?.display()),
    ];
    let mut child = netns::spawn_isolated(&exe, &args).context("starting unshare")?;
    let unshare_pid = child.id().context("unshare exited at once")?;
    let Some(inner) = netns::inner_pid(unshare_pid).await else {
        let status = child.wait().await?;
        anyhow::bail!("the dev cluster did not start in its namespaces ({status})");
    };
    let mirror = tokio::spawn(async move {
        netns::mirror_loopback(inner, |port| {
            tracing::debug!(
                port,
                "a port of the dev cluster is taken here; not mirrored"
            );
        })
        .await
    });
    let status = loop {
        tokio::select! {
            status = child.wait() => break status?,
            // The child stops on Ctrl-C; wait for it to.
            _ = tokio::signal::ctrl_c() => netns::interrupt(inner),
        }
    };
    mirror.abort();
    if !status.success() {
        anyhow::bail!("the dev cluster ended: {status}");
    }
    Ok(())
}

/// The dev cluster in this process: the control plane, the operator, the local runtime, the
/// store and the example tenant, each said as it starts, until Ctrl-C.
///
/// Over 100 lines as a start-up script read top to bottom: each step uses what the ones before
/// started (the plane's client, the kubelet endpoint, the store), and the progress lines follow it.
async fn run_here(state_dir: PathBuf, nodes: Nodes) -> anyhow::Result<()> {
    let started = Instant::now();
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("creating {}", state_dir.display()))?;
    let state_dir = state_dir.canonicalize()?;
    let cluster_dir = state_dir.join("cluster");
    // A fresh cluster each run: stale etcd data from a killed run would confuse more than help.
    if cluster_dir.exists() {
        std::fs::remove_dir_all(&cluster_dir)
            .with_context(|| format!("removing {}", cluster_dir.display()))?;
    }
    let log_path = state_dir.join("operator.log");
    init_logging(&log_path)?;

    say(
        started,
        match nodes {
            Nodes::Real { .. } => {
                "starting the control plane (etcd, kube-apiserver, controller manager, scheduler, \
                 kwok) and a real node (kubelet, containerd, kube-proxy, CNI bridge, registry)"
            }
            Nodes::Simulated => {
                "starting the control plane (etcd, kube-apiserver, controller manager, scheduler, \
                 kwok with a simulated node)"
            }
        },
    );
    // This binary is each control plane's snapshot agent: a process beside a control plane the
    // local runtime stands in for, the operator's image on the real node.
    let agent = Agent::new(
        std::env::current_exe().context("locating this binary")?,
        names::DEFAULT_AGENT_IMAGE,
    );
    let plane = tokio::task::spawn_blocking(move || {
        ControlPlane::start(Options {
            dir: Some(cluster_dir),
            progress: true,
            nodes,
            agent: Some(agent),
        })
    })
    .await??;
    let kubeconfig = state_dir.join("kubeconfig");
    std::fs::copy(plane.kubeconfig_path(), &kubeconfig).context("writing the host kubeconfig")?;
    let client = plane.client().await?;

    say(started, "installing the CRDs and the default policies");
    let crds = tenantplane_api::crds_yaml()?;
    manifests::apply(&client, &crds).await?;
    wait_for_crds(&client).await?;
    for policy in manifests::DEFAULT_POLICIES {
        manifests::apply(&client, policy).await?;
    }

    say(
        started,
        "starting the operator, its kubelet endpoint and the local runtime",
    );
    ensure_namespace(&client, OPERATOR_NAMESPACE).await?;
    let kubelet =
        tenantplane_local::tenant::start_kubelet(plane.config().await?, OPERATOR_NAMESPACE, None)
            .await
            .map_err(anyhow::Error::msg)?;
    say(
        started,
        "starting the snapshot store (SeaweedFS's S3 gateway on loopback) and SnapshotStore default",
    );
    let s3 = snapshot_store(&client, &plane, &state_dir).await?;
    let mut options = tenantplane_local::tenant::local_operator_options(
        None,
        Some(Duration::from_secs(10)),
        Some(kubelet),
    );
    // As a deployed operator: store credentials in its own namespace.
    options.snapshots.secrets_namespace = Some(OPERATOR_NAMESPACE.to_string());
    let operator = tokio::spawn(tenantplane_controller::run(
        client.clone(),
        options,
        futures::future::pending(),
    ));
    let (_runtime, runtime_task) = runtime::start(
        client.clone(),
        // The plane's binaries name the agent (see above).
        plane.binaries().clone(),
        state_dir.join("runtime"),
        None,
    );

    say(
        started,
        &format!("creating namespace {NAMESPACE} and applying examples/tenantcluster-dev.yaml"),
    );
    ensure_namespace(&client, NAMESPACE).await?;
    manifests::apply(&client, manifests::EXAMPLE_TENANT).await?;
    let mut tenants = vec![(NAMESPACE, TENANT)];
    if nodes.is_real() {
        // Its pod runs as written, by the real node's kubelet (the local runtime stands in for
        // k3s only), from the images the test world serves under upstream's names.
        say(
            started,
            &format!(
                "creating namespace {KUBERNETES_NAMESPACE} and applying examples/tenantcluster-kubernetes.yaml"
            ),
        );
        ensure_namespace(&client, KUBERNETES_NAMESPACE).await?;
        manifests::apply(&client, manifests::EXAMPLE_KUBERNETES_TENANT).await?;
        tenants.push((KUBERNETES_NAMESPACE, KUBERNETES_TENANT));
    } else {
        say(
            started,
            "examples/tenantcluster-kubernetes.yaml is left out: its control plane's containers need a real node",
        );
    }

    let ready = tokio::select! {
        r = wait_until_all_ready(&client, &tenants, started) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    if let Err(e) = ready {
        operator.abort();
        runtime_task.abort();
        return Err(e.context(format!("the operator's log is {}", log_path.display())));
    }
    print_next_steps(
        &kubeconfig,
        plane.binaries().path("kubectl").as_path(),
        &log_path,
        nodes.is_real(),
    );

    tokio::signal::ctrl_c().await?;
    eprintln!("dev: stopping the operator, the local runtime and the control plane");
    operator.abort();
    runtime_task.abort();
    let _ = runtime_task.await;
    s3.stop();
    drop(plane);
    eprintln!("dev: stopped");
    Ok(())
}

/// The dev cluster's bucket, and the Secret with the store's keys.
const SNAPSHOT_BUCKET: &str = "tenantplane-snapshots";
const SNAPSHOT_SECRET: &str = "snapshot-store";

/// Start the S3 store, make its bucket, and describe it as SnapshotStore `default` (marked the
/// default) with its keys in a Secret in the operator's namespace.
async fn snapshot_store(
    client: &kube::Client,
    plane: &ControlPlane,
    state_dir: &Path,
) -> anyhow::Result<tenantplane_testenv::s3::S3Server> {
    use tenantplane_controller::snapshot::store::{ACCESS_KEY_ID, SECRET_ACCESS_KEY};
    let s3 = tenantplane_testenv::s3::S3Server::start(plane.binaries(), &state_dir.join("s3"))
        .await
        .context("starting the snapshot store")?;
    s3.create_bucket(SNAPSHOT_BUCKET)
        .await
        .context("making the snapshot bucket")?;
    ensure_namespace(client, OPERATOR_NAMESPACE).await?;
    let manifest = format!(
        r#"apiVersion: v1
kind: Secret
metadata:
  name: {SNAPSHOT_SECRET}
  namespace: {OPERATOR_NAMESPACE}
stringData:
  {ACCESS_KEY_ID}: {access}
  {SECRET_ACCESS_KEY}: {secret}
---
apiVersion: tenantplane.io/v1alpha1
kind: SnapshotStore
metadata:
  name: default
spec:
  default: true
  s3:
    endpoint: {endpoint}
    bucket: {SNAPSHOT_BUCKET}
  credentialsSecretRef:
    name: {SNAPSHOT_SECRET}
"#,
        access = s3.access_key,
        secret = s3.secret_key,
        endpoint = s3.endpoint,
    );
    manifests::apply(client, &manifest).await?;
    Ok(s3)
}

fn init_logging(path: &Path) -> anyhow::Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    // As the operator's: kube-client's own line for each failed request, which names no tenant,
    // is off unless RUST_LOG names its target (see `telemetry::log_filter`).
    let filter = |text: &str| {
        tracing_subscriber::EnvFilter::try_new(tenantplane_controller::telemetry::log_filter(text))
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            std::env::var("RUST_LOG")
                .ok()
                .and_then(|text| filter(&text).ok())
                .unwrap_or_else(|| filter("info").unwrap_or_else(|_| "info".into())),
        )
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file))
        .try_init();
    Ok(())
}

async fn wait_for_crds(client: &kube::Client) -> anyhow::Result<()> {
    let api: Api<TenantCluster> = Api::all(client.clone());
    for _ in 0..100 {
        if api.list(&Default::default()).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("the TenantCluster CRD was not served within 10s")
}

/// Every one of `tenants` (namespace, name) Ready, watched together.
async fn wait_until_all_ready(
    client: &kube::Client,
    tenants: &[(&str, &str)],
    started: Instant,
) -> anyhow::Result<()> {
    futures::future::try_join_all(
        tenants
            .iter()
            .map(|(namespace, name)| wait_until_ready(client, namespace, name, started)),
    )
    .await
    .map(|_| ())
}

/// A line whenever the phase or the Ready message changes, until the tenant is Ready.
async fn wait_until_ready(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    started: Instant,
) -> anyhow::Result<()> {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let api: Api<TenantCluster> = Api::namespaced(client.clone(), namespace);
    // A watch sees every status the operator writes, even a Pending that lasts milliseconds.
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut updates = watcher(api, config)
        .default_backoff()
        .applied_objects()
        .boxed();
    let mut last = String::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        let tc = match tokio::time::timeout(Duration::from_secs(10), updates.next()).await {
            Ok(Some(Ok(tc))) => tc,
            Ok(Some(Err(e))) => anyhow::bail!(
                "watching TenantCluster {namespace}/{name}: {}",
                tenantplane_controller::error_chain(&e)
            ),
            Ok(None) => anyhow::bail!("the watch on TenantCluster {namespace}/{name} ended"),
            Err(_) => {
                say(started, &format!("still waiting; {last}"));
                continue;
            }
        };
        let status = tc.status.unwrap_or_default();
        let phase = status
            .phase
            .map(|p| p.to_string())
            .unwrap_or_else(|| "(none yet)".into());
        let message = conditions::find(&status.conditions, conditions::READY)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        let line = format!("TenantCluster {namespace}/{name}: {phase}: {message}");
        if line != last {
            say(started, &line);
            last = line;
        }
        if phase == "Ready" {
            return Ok(());
        }
    }
    anyhow::bail!(
        "TenantCluster {namespace}/{name} did not become Ready within 5 minutes; last: {last}"
    )
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|dir| dir.join(program).is_file()))
}

fn print_next_steps(kubeconfig: &Path, built_kubectl: &Path, log: &Path, upstream: bool) {
    let kubectl = if on_path("kubectl") {
        "kubectl".to_string()
    } else {
        built_kubectl.display().to_string()
    };
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "tenantplane".into());
    // One write of the whole text, and a reader that went away (`dev | head`) is not a reason to
    // stop the cluster: `println!` would panic on the broken pipe with everything still running.
    let text = format!(
        "\nThe dev cluster is ready. In another terminal:\n\n  export KUBECONFIG={kc}\n  {kubectl} get tenantcluster {TENANT} -n {NAMESPACE} -o jsonpath='{{.status.phase}}{{\"\\n\"}}'\n  {kubectl} describe tenantcluster {TENANT} -n {NAMESPACE}\n  {exe} kubeconfig {TENANT} -n {NAMESPACE} > {TENANT}.kubeconfig\n  {kubectl} --kubeconfig {TENANT}.kubeconfig get namespaces\n  {kubectl} --kubeconfig {TENANT}.kubeconfig apply -f examples/tenant-workload.yaml\n  {kubectl} --kubeconfig {TENANT}.kubeconfig rollout status deploy/web\n  {kubectl} --kubeconfig {TENANT}.kubeconfig exec deploy/web -- wget -qO- http://web/greeting\n  {kubectl} --kubeconfig {TENANT}.kubeconfig get pods -o wide\n  {kubectl} get pods -n {NAMESPACE} -l tenantplane.io/synced-from={TENANT}\n  {exe} snapshot create {TENANT} -n {NAMESPACE} --name first --wait\n  {kubectl} --kubeconfig {TENANT}.kubeconfig delete deploy/web\n  {exe} restore {TENANT} -n {NAMESPACE} --snapshot first --yes --wait\n  {kubectl} --kubeconfig {TENANT}.kubeconfig get deploy/web\n  {exe} sleep {TENANT} -n {NAMESPACE} --wait\n  {exe} wake {TENANT} -n {NAMESPACE} --wait\n\n(kubectl: {kubectl}; operator log: {log})\nCtrl-C stops everything.",
        kc = kubeconfig.display(),
        log = log.display(),
    );
    let text = if upstream {
        text.replace(
            "\n\n(kubectl:",
            &format!(
                "\n\nThe `kubernetes` distribution's tenant (upstream kube-apiserver on the real node):\n\n  {kubectl} get pods -n {KUBERNETES_NAMESPACE} -o wide\n  {exe} connect {KUBERNETES_TENANT} -n {KUBERNETES_NAMESPACE} --kubeconfig-out {KUBERNETES_TENANT}.kubeconfig &\n  {kubectl} --kubeconfig {KUBERNETES_TENANT}.kubeconfig version\n\n(kubectl:"
            ),
        )
    } else {
        text
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}").and_then(|()| out.flush());
}
