//! The control plane one test binary shares ([`shared`]), a fresh namespace for each test
//! ([`namespace`]), and the small waits and paths the behaviour tests use.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, PostParams};

use crate::Error;
use crate::binaries::Agent;
use crate::host_cluster::{ControlPlane, Nodes, Options};
use crate::process;

static SHARED: OnceLock<Result<ControlPlane, Error>> = OnceLock::new();
static NODES: OnceLock<Nodes> = OnceLock::new();
static AGENT: OnceLock<Agent> = OnceLock::new();

/// How many tenants a test binary runs on its one real node at once. The node has the machine's
/// 2 cores, and every tenant's CoreDNS asks 100m of them (as upstream's does) beside the test's
/// own pods: with 17 real-node tests, a tenant's CoreDNS waited on "Insufficient cpu" past its
/// test's wait. A test beyond this many waits for room; a finished test's copies are deleted
/// when its room is given back.
const REAL_NODE_TENANTS: usize = 10;
static REAL_NODE_ROOM: OnceLock<std::sync::Arc<tokio::sync::Semaphore>> = OnceLock::new();

/// Room on the real node for one more tenant, held until dropped; `None` (no wait) when this
/// binary's nodes are simulated. A semaphore of tokio's works across the tests' own runtimes.
pub async fn real_node_room() -> Option<tokio::sync::OwnedSemaphorePermit> {
    if !NODES.get().is_some_and(|n| n.is_real()) {
        return None;
    }
    let room = REAL_NODE_ROOM
        .get_or_init(|| std::sync::Arc::new(tokio::sync::Semaphore::new(REAL_NODE_TENANTS)))
        .clone();
    room.acquire_owned().await.ok()
}

/// Make this test binary's shared control plane run a real node ([`Nodes::Real`]), tainting the
/// simulated node with `simulated_taint`. Every test of such a binary calls it first; panics if
/// the plane already started with simulated nodes.
pub fn use_real_nodes(simulated_taint: &'static str) {
    let nodes = *NODES.get_or_init(|| Nodes::Real { simulated_taint });
    assert!(
        nodes.is_real(),
        "this test binary's control plane already runs simulated nodes"
    );
}

/// The `tenantplane` binary the real node serves as the operator's image (the control planes'
/// snapshot agent), for a binary that calls it before its plane starts (see [`Options::agent`]).
pub fn serve_agent_from(agent: Agent) {
    let _ = AGENT.set(agent);
}

/// The control plane of this test binary, started on first use and stopped when the binary exits.
/// Panics (this is for tests) with the reason and the components' logs when it cannot start.
pub fn shared() -> &'static ControlPlane {
    let plane = SHARED.get_or_init(|| {
        let progress = std::env::var_os("TENANTPLANE_TESTENV_QUIET").is_none();
        let plane = ControlPlane::start(Options {
            dir: None,
            progress,
            nodes: *NODES.get_or_init(Nodes::default),
            agent: AGENT.get().cloned(),
        })?;
        process::remove_at_exit(plane.dir());
        process::remove_found_at_exit(|| match SHARED.get() {
            Some(Ok(plane)) => plane.host_path_volumes(),
            _ => Vec::new(),
        });
        Ok(plane)
    });
    match plane {
        Ok(plane) => plane,
        Err(e) => panic!("the test control plane did not start: {e}"),
    }
}

/// A namespace of its own for one test. When the test panics, dropping it prints the last lines
/// of every component's log.
pub struct TestNamespace {
    /// The namespace's name.
    pub name: String,
    /// A client of the test control plane, as a cluster admin.
    pub client: kube::Client,
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "test in namespace {} failed; control plane logs (last lines):\n{}",
                self.name,
                shared().logs_tail(30)
            );
        }
    }
}

static NAMESPACES: AtomicUsize = AtomicUsize::new(0);

/// A fresh namespace named `<prefix>-<n>` on the shared control plane, with its `default`
/// service account in place, and an admin client for this test's runtime.
pub async fn namespace(prefix: &str) -> TestNamespace {
    let plane = shared();
    let client = plane
        .client()
        .await
        .expect("a client for the test control plane");
    let name = format!("{prefix}-{}", NAMESPACES.fetch_add(1, Ordering::SeqCst));
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("the test namespace can be created");
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), &name);
    for _ in 0..300 {
        if accounts.get_opt("default").await.ok().flatten().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    TestNamespace { name, client }
}

/// Run the shared control plane's kubectl; stdout on success, [`Error::Kubectl`] with stdout and
/// stderr on failure.
pub fn kubectl(args: &[&str]) -> crate::Result<String> {
    let out = shared()
        .kubectl()
        .args(args)
        .output()
        .map_err(|e| Error::Io(format!("running kubectl: {e}")))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(Error::Kubectl(format!(
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

/// A path in this repository.
pub fn repo_path(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// Wait until the shared control plane serves the three CRDs (as the README's install steps do).
pub fn wait_for_crds() {
    shared()
        .wait_for_crds()
        .expect("the CRDs become established");
}

/// Apply the committed CRDs and default policies to the shared control plane, once per test
/// binary.
pub fn install_crds_and_policies() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        shared()
            .install_crds_and_policies()
            .expect("the CRDs and the default policies apply");
    });
}

/// Poll `check` every 200 ms until it returns `Some`, for at most `timeout`; `None` on time-out.
/// Tests use this to wait for the control plane's controllers, never to measure speed.
pub async fn eventually<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
