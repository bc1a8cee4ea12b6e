//! Helpers of the behaviour tests: the operator and the local runtime for one test namespace, the
//! seed example, waiting for a phase, and a client for a tenant.

#![allow(dead_code)]

use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use tenantplane_api::conditions;
use tenantplane_api::{Phase, TenantCluster};
use tenantplane_controller::ControllerOptions;
use tenantplane_controller::kubelet::KubeletOptions;
use tenantplane_local::{LocalRuntime, runtime, tenant};
use tenantplane_testenv::{
    TestNamespace, eventually, install_crds_and_policies, namespace, operator, repo_path, shared,
};

pub mod replica;
pub mod snapshots;

pub const WAIT: Duration = Duration::from_secs(90);
/// How long a tenant's status may take to change: longer than [`WAIT`], because a tenant's first
/// start is the heaviest step of a test (a `kubernetes` tenant starts four components on the real
/// node) and the operator itself calls a provision normal for ten minutes. Three binaries side by
/// side once took 90 s over it.
pub const STATUS_WAIT: Duration = Duration::from_secs(240);

/// The operator and the local runtime for one namespace; both stop when this is dropped.
pub struct Operator {
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
    pub runtime: LocalRuntime,
    /// The operator's client: ServiceAccount `tenantplane-system/tenantplane`.
    pub client: Client,
    /// The kubelet endpoint it serves, if it does.
    pub kubelet: Option<KubeletOptions>,
}

impl Drop for Operator {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Operator {
    /// Stop the operator and start a new one, as a restart would; the tenant control planes (the
    /// local runtime) keep running.
    pub fn restart_controller(&mut self, ns: &TestNamespace) {
        self.tasks[0].abort();
        self.tasks[0] = tokio::spawn(tenantplane_controller::run(
            self.client.clone(),
            options(&ns.name, self.kubelet.clone()),
            futures::future::pending(),
        ));
    }
}

pub fn options(ns: &str, kubelet: Option<KubeletOptions>) -> ControllerOptions {
    let mut options =
        tenant::local_operator_options(Some(ns.to_string()), Some(Duration::from_secs(2)), kubelet);
    // Each test's operator keeps the credentials of its SnapshotStores in the test's namespace.
    options.snapshots.secrets_namespace = Some(ns.to_string());
    // On a real node, pods reach this process at an address of its own, as an operator pod's:
    // sleeping tenants' API Services lead to wake doors there.
    if tenantplane_testenv::host_cluster::real_node::running() {
        let advertise = tenantplane_testenv::host_cluster::real_node::operator_address()
            .unwrap_or_else(|e| panic!("the operator's address on the node: {e}"));
        options.wake = Some(tenantplane_controller::wake::WakeOptions {
            listen: advertise,
            advertise,
            ports: 7400..=7999,
        });
    }
    options
}

/// [`start_operator`] serving the kubelet endpoint of the virtual nodes too, as a deployed
/// operator does (`kubectl logs`, `exec`, `port-forward` in the tenant).
pub async fn start_operator_with_kubelet(ns: &TestNamespace) -> Operator {
    let kubelet = tenant::start_kubelet(
        operator::config(),
        operator::NAMESPACE,
        Some(ns.name.clone()),
    )
    .await
    .unwrap_or_else(|e| panic!("the kubelet endpoint starts: {e}"));
    start_operator_using(ns, operator::client(), Some(kubelet))
}

/// The operator, authenticated as its ServiceAccount with the rights `deploy/operator/rbac.yaml`
/// gives it (never as an admin), and the local runtime for `ns`.
pub fn start_operator(ns: &TestNamespace) -> Operator {
    start_operator_with(ns, operator::client())
}

/// The operator talking through `client` (made from [`operator::config`]); the local runtime
/// through the namespace's admin client.
pub fn start_operator_with(ns: &TestNamespace, client: Client) -> Operator {
    start_operator_using(ns, client, None)
}

fn start_operator_using(
    ns: &TestNamespace,
    client: Client,
    kubelet: Option<KubeletOptions>,
) -> Operator {
    start_operator_edited(ns, client, kubelet, |_| {})
}

/// The operator with its [`options`] changed by `edit` (a test's shorter timers).
pub fn start_operator_edited(
    ns: &TestNamespace,
    client: Client,
    kubelet: Option<KubeletOptions>,
    edit: impl FnOnce(&mut ControllerOptions),
) -> Operator {
    let mut options = options(&ns.name, kubelet.clone());
    edit(&mut options);
    // The operator's log, shown for failing tests; `RUST_LOG` picks the detail. Without it, not
    // kube-client's line per failed request: a test that stops an API server got thousands, and
    // they buried the test's own message (the operator reports those errors in status).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,kube_client=off")),
        )
        .with_test_writer()
        .try_init();
    let controller = tokio::spawn(tenantplane_controller::run(
        client.clone(),
        options,
        futures::future::pending(),
    ));
    let (runtime, task) = local_runtime_for(ns);
    Operator {
        tasks: vec![controller, task],
        runtime,
        client,
        kubelet,
    }
}

/// The local runtime for the control planes of `ns`, run by the test (the operator may run
/// elsewhere: in this process, or as separate processes).
pub fn local_runtime_for(ns: &TestNamespace) -> (LocalRuntime, tokio::task::JoinHandle<()>) {
    runtime::start(
        ns.client.clone(),
        // This test's build of `tenantplane` is each control plane's snapshot agent.
        shared().binaries().clone().with_agent(agent()),
        shared().dir().join("runtime"),
        Some(ns.name.clone()),
    )
}

/// This test's build of `tenantplane` as the snapshot agent, served as the operator's image.
pub fn agent() -> tenantplane_testenv::Agent {
    tenantplane_testenv::Agent::new(
        env!("CARGO_BIN_EXE_tenantplane"),
        tenantplane_controller::names::DEFAULT_AGENT_IMAGE,
    )
}

/// Aborts a task when the test ends.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Apply the seed example in the test's namespace and wait until it is Ready.
pub async fn example_ready(ns: &TestNamespace) -> TenantCluster {
    Api::<TenantCluster>::namespaced(ns.client.clone(), &ns.name)
        .create(&PostParams::default(), &example(&ns.name))
        .await
        .unwrap();
    wait_for_phase(&ns.client, &ns.name, "dev", Phase::Ready).await
}

/// The seed example, in the test's namespace.
pub fn example(ns: &str) -> TenantCluster {
    let text = std::fs::read_to_string(repo_path("examples/tenantcluster-dev.yaml")).unwrap();
    let mut tc: TenantCluster = serde_yaml::from_str(&text).unwrap();
    tc.metadata.namespace = Some(ns.to_string());
    tc
}

pub async fn wait_for_phase(client: &Client, ns: &str, name: &str, phase: Phase) -> TenantCluster {
    wait_for_status(client, ns, name, &format!("reached {phase}"), |s| {
        s.phase == Some(phase)
    })
    .await
}

/// Wait until the tenant's Ready condition has `reason`.
pub async fn wait_for_ready_reason(
    client: &Client,
    ns: &str,
    name: &str,
    reason: &str,
) -> TenantCluster {
    wait_for_status(
        client,
        ns,
        name,
        &format!("had Ready reason {reason}"),
        |s| conditions::find(&s.conditions, conditions::READY).is_some_and(|c| c.reason == reason),
    )
    .await
}

/// Wait until the tenant's status passes `check` (`what` it waited for names it in the panic,
/// with the last status seen).
pub async fn wait_for_status(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    check: impl Fn(&tenantplane_api::TenantClusterStatus) -> bool,
) -> TenantCluster {
    let api: Api<TenantCluster> = Api::namespaced(client.clone(), ns);
    let last = std::sync::Mutex::new(None);
    let found = eventually(STATUS_WAIT, || async {
        let tc = api.get(name).await.ok()?;
        *last.lock().unwrap() = tc.status.clone();
        check(tc.status.as_ref()?).then_some(tc)
    })
    .await;
    if let Some(tc) = found {
        return tc;
    }
    let last = last.lock().unwrap().clone();
    panic!(
        "{ns}/{name} never {what}; last status: {last:#?}\n{}",
        control_plane_report(client, ns, name).await
    )
}

pub fn condition<'a>(
    tc: &'a TenantCluster,
    type_: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    conditions::find(&tc.status.as_ref().unwrap().conditions, type_)
        .unwrap_or_else(|| panic!("no {type_} condition"))
}

/// A client for tenant `name` in `ns`: its kubeconfig Secret, dialled where the local runtime
/// says the tenant API server answers. Right after a restart or an upgrade the new pod has no
/// address yet: it waits for one.
pub async fn tenant_client(host: &Client, ns: &str, name: &str) -> Client {
    let last_error = std::sync::Mutex::new(String::new());
    let client = eventually(WAIT, || async {
        match tenant::tenant_client(host, ns, name).await {
            Ok(client) => Some(client),
            Err(e) => {
                *last_error.lock().unwrap() = e.to_string();
                None
            }
        }
    })
    .await;
    let Some(client) = client else {
        let error = last_error.lock().unwrap().clone();
        let report = control_plane_report(host, ns, name).await;
        panic!("no client for tenant {ns}/{name}: {error}\n{report}");
    };
    // Pods are refused until the tenant's controller manager made the default ServiceAccount.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    let ready = eventually(WAIT, || async {
        accounts.get_opt("default").await.ok()?.map(|_| ())
    })
    .await;
    if ready.is_none() {
        panic!(
            "the tenant never made ServiceAccount default/default\n{}",
            control_plane_report(host, ns, name).await
        );
    }
    client
}

/// Tenant `name`'s control-plane pod on the host: its status and the last lines each of its
/// containers logged (the run before a restart too), for a failure's message.
pub async fn control_plane_report(host: &Client, ns: &str, name: &str) -> String {
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(host.clone(), ns);
    let pod_name = tenantplane_controller::names::control_plane_pod(name);
    let Some(pod) = pods.get_opt(&pod_name).await.ok().flatten() else {
        return format!("no pod {ns}/{pod_name}");
    };
    let containers: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        .map(|c| c.name.clone())
        .collect();
    // Only a container that restarted has a previous run to show.
    let restarted = |name: &str| {
        pod.status.iter().any(|s| {
            s.init_container_statuses
                .iter()
                .flatten()
                .chain(s.container_statuses.iter().flatten())
                .any(|c| c.name == name && c.restart_count > 0)
        })
    };
    let mut report = format!("its pod: {:#?}\n", pod.status);
    // The scheduler's and the kubelet's word on it (FailedScheduling says why it is Pending).
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(host.clone(), ns)
        .list(&ListParams::default().fields(&format!("involvedObject.name={pod_name}")))
        .await;
    match events {
        Ok(list) => {
            report.push_str("----- its events\n");
            for e in list.items {
                let at = e
                    .last_timestamp
                    .map(|t| t.0.to_string())
                    .or_else(|| e.event_time.map(|t| t.0.to_string()))
                    .unwrap_or_default();
                report.push_str(&format!(
                    "{at} {} {} (x{}): {}\n",
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.count.unwrap_or(1),
                    e.message.unwrap_or_default()
                ));
            }
        }
        Err(e) => report.push_str(&format!("----- its events: {e}\n")),
    }
    for container in containers {
        let runs: &[bool] = if restarted(&container) {
            &[true, false]
        } else {
            &[false]
        };
        for &previous in runs {
            let params = kube::api::LogParams {
                container: Some(container.clone()),
                tail_lines: Some(25),
                previous,
                ..Default::default()
            };
            let text = pods
                .logs(&pod_name, &params)
                .await
                .unwrap_or_else(|e| e.to_string());
            let run = if previous { "previous run" } else { "this run" };
            report.push_str(&format!("----- {container} ({run})\n{text}\n"));
        }
    }
    report
}

/// A container that passes Pod Security `restricted`.
pub fn container(name: &str) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "image": "registry.example/web:1",
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
        "securityContext": {
            "runAsNonRoot": true, "runAsUser": 1000,
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}
        }
    })
}

/// Create IsolationProfile `name`: the shipped `restricted` one with `allow` as its `allow`
/// section (what tenant objects may ask of the host).
pub async fn profile_allowing(host: &Client, name: &str, allow: serde_json::Value) {
    let text = std::fs::read_to_string(repo_path(
        "deploy/policies/isolationprofile-restricted.yaml",
    ))
    .unwrap();
    let mut profile: serde_json::Value = serde_yaml::from_str(&text).unwrap();
    profile["metadata"] = serde_json::json!({"name": name});
    profile["spec"]["allow"] = allow;
    let profile: tenantplane_api::IsolationProfile = serde_json::from_value(profile).unwrap();
    Api::<tenantplane_api::IsolationProfile>::all(host.clone())
        .create(&PostParams::default(), &profile)
        .await
        .unwrap();
}

/// A TenantCluster like the seed example, named `name`, in `ns`.
pub fn tenant_named(ns: &str, name: &str) -> TenantCluster {
    let mut tc = example(ns);
    tc.metadata.name = Some(name.to_string());
    tc
}

/// Create `tc` and wait until it is Ready.
pub async fn create_ready(client: &Client, tc: &TenantCluster) -> TenantCluster {
    let ns = tc.namespace().unwrap();
    Api::<TenantCluster>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), tc)
        .await
        .unwrap();
    wait_for_phase(client, &ns, &tc.name_any(), Phase::Ready).await
}

/// Wait until tenant `name`'s DNS (which the syncer sets up once the tenant is Ready) has settled:
/// its CoreDNS pod runs on the host and the tenant's `kube-dns` Service has its copy's address.
pub async fn dns_settled(host: &Client, ns: &str, name: &str) {
    use k8s_openapi::api::core::v1::{Pod, Service};
    use kube::api::ListParams;
    let tenant = tenant_client(host, ns, name).await;
    let settled = eventually(WAIT, || async {
        let copies = Api::<Pod>::namespaced(host.clone(), ns)
            .list(&ListParams::default().labels(&format!(
                "{}=kube-dns",
                tenantplane_syncer::naming::host_label_key(name, "k8s-app")
            )))
            .await
            .ok()?;
        let running = copies
            .items
            .iter()
            .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
        let t = Api::<Service>::namespaced(tenant.clone(), "kube-system")
            .get_opt("kube-dns")
            .await
            .ok()??;
        let h = Api::<Service>::namespaced(host.clone(), ns)
            .get_opt(&format!("kube-dns-x-kube-system-x-{name}"))
            .await
            .ok()??;
        (running && t.spec?.cluster_ip == h.spec?.cluster_ip).then_some(())
    })
    .await;
    assert!(settled.is_some(), "the tenant's DNS never settled");
}

/// The start most behaviour tests share: the CRDs and policies installed, a fresh namespace, and
/// the operator (with the local runtime) for it. A test that sets something up on the host before
/// its tenant exists starts here and then calls [`TestHost::ready`] or [`TenantSetup::ready_in`].
/// Like [`ReadyTenant`], a test keeps it whole while it runs and borrows its parts:
/// `let (ns, host) = (&world.ns, &world.host);`.
pub struct TestHost {
    // Declared before `ns`, so the operator stops first, as when a test binds them in order.
    pub operator: Operator,
    pub ns: TestNamespace,
    /// The namespace's admin client: the host as a test sees it.
    pub host: Client,
    /// Room for this test's tenant on a real node, held while the test runs.
    pub room: Option<RealNodeRoom>,
}

/// A test's room on its binary's real node: while held, one of the few tenants the node runs at
/// once ([`tenantplane_testenv::real_node_room`]); when dropped (after the test's operator has
/// stopped), the tenant's pod copies are deleted, so the node's CPU goes to the tests still
/// running (a test's namespace is kept, for its logs).
pub struct RealNodeRoom {
    _permit: tokio::sync::OwnedSemaphorePermit,
    namespace: String,
}

impl RealNodeRoom {
    async fn take(namespace: &str) -> Option<Self> {
        Some(Self {
            _permit: tenantplane_testenv::real_node_room().await?,
            namespace: namespace.to_string(),
        })
    }
}

impl Drop for RealNodeRoom {
    fn drop(&mut self) {
        let copies = format!(
            "--selector={}",
            tenantplane_syncer::naming::LABEL_SYNCED_FROM
        );
        if let Err(e) = tenantplane_testenv::kubectl(&[
            "delete",
            "pods",
            "--namespace",
            &self.namespace,
            &copies,
            "--wait=false",
        ]) {
            eprintln!("freeing the real node of {}'s pods: {e}", self.namespace);
        }
    }
}

impl TestHost {
    pub async fn start(prefix: &str) -> Self {
        install_crds_and_policies();
        let ns = namespace(prefix).await;
        let operator = start_operator(&ns);
        Self::of(ns, operator)
    }

    /// [`TestHost::start`] with the operator's options changed by `edit`.
    pub async fn start_edited(prefix: &str, edit: impl FnOnce(&mut ControllerOptions)) -> Self {
        install_crds_and_policies();
        let ns = namespace(prefix).await;
        let operator = start_operator_edited(&ns, operator::client(), None, edit);
        Self::of(ns, operator)
    }

    /// [`TestHost::start`] with the operator serving the virtual nodes' kubelet endpoint.
    pub async fn start_with_kubelet(prefix: &str) -> Self {
        install_crds_and_policies();
        let ns = namespace(prefix).await;
        let room = RealNodeRoom::take(&ns.name).await;
        let operator = start_operator_with_kubelet(&ns).await;
        Self {
            room,
            ..Self::of(ns, operator)
        }
    }

    /// [`TestHost::start`] with the operator talking through `client` (made from
    /// [`operator::config`]).
    pub async fn start_using(prefix: &str, client: Client) -> Self {
        install_crds_and_policies();
        let ns = namespace(prefix).await;
        let operator = start_operator_with(&ns, client);
        Self::of(ns, operator)
    }

    fn of(ns: TestNamespace, operator: Operator) -> Self {
        let host = ns.client.clone();
        Self {
            operator,
            ns,
            host,
            room: None,
        }
    }

    /// The tenant `setup` describes, made here and Ready, with a client for it.
    pub async fn ready(self, setup: TenantSetup) -> ReadyTenant {
        setup.ready_on(self).await
    }
}

/// A tenant Ready in a fresh namespace with its operator, and a client for it.
///
/// Tests keep it whole for as long as they run (dropping it stops the operator) and borrow its
/// parts: `let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);`.
pub struct ReadyTenant {
    pub operator: Operator,
    pub ns: TestNamespace,
    /// The namespace's admin client.
    pub host: Client,
    /// A client for the tenant, once its `default` ServiceAccount exists.
    pub tenant: Client,
    /// The tenant's name (`dev` unless [`TenantSetup::named`]).
    pub name: String,
    /// The TenantCluster as it was when it became Ready.
    pub ready: TenantCluster,
    /// The tenant's own SyncPolicy, if [`TenantSetup::sync_policy`] gave it one.
    pub sync_policy: Option<String>,
    /// Room for the tenant on a real node (see [`TestHost::room`]), given back last.
    pub room: Option<RealNodeRoom>,
}

impl ReadyTenant {
    /// The seed example, Ready, in a fresh namespace named after `prefix`.
    pub async fn start(prefix: &str) -> Self {
        TenantSetup::seed().start(prefix).await
    }
}

type SpecEdit = Box<dyn FnOnce(&mut TenantCluster)>;

/// How a test's tenant differs from the seed example: its name, a SyncPolicy or an
/// IsolationProfile of its own, other changes to its spec.
pub struct TenantSetup {
    name: String,
    sync_policy: Option<serde_json::Value>,
    allow: Option<serde_json::Value>,
    profile_spec: Option<serde_json::Value>,
    edits: Vec<SpecEdit>,
}

impl TenantSetup {
    /// The seed example as it is, named `dev`.
    pub fn seed() -> Self {
        Self {
            name: "dev".to_string(),
            sync_policy: None,
            allow: None,
            profile_spec: None,
            edits: Vec::new(),
        }
    }

    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// A SyncPolicy of its own, `<namespace>-policy`, with `spec`.
    pub fn sync_policy(mut self, spec: serde_json::Value) -> Self {
        self.sync_policy = Some(spec);
        self
    }

    /// An IsolationProfile of its own, `<namespace>-profile`: the shipped `restricted` one with
    /// `allow` as its `allow` section (see [`profile_allowing`]).
    pub fn allow(mut self, allow: serde_json::Value) -> Self {
        self.allow = Some(allow);
        self
    }

    /// An IsolationProfile of its own as [`TenantSetup::allow`] makes it (with an empty `allow`
    /// unless given), and `spec` merged over its spec.
    pub fn profile_spec(mut self, spec: serde_json::Value) -> Self {
        self.profile_spec = Some(spec);
        self
    }

    /// Any other change to the TenantCluster before it is created.
    pub fn edit(mut self, edit: impl FnOnce(&mut TenantCluster) + 'static) -> Self {
        self.edits.push(Box::new(edit));
        self
    }

    /// Install, a fresh namespace named after `prefix`, the operator, and this tenant Ready.
    pub async fn start(self, prefix: &str) -> ReadyTenant {
        TestHost::start(prefix).await.ready(self).await
    }

    /// This tenant made in `ns` (whose operator runs) and Ready: a client for it. For a test that
    /// sets something up on the host between [`TestHost::start`] and its tenant.
    pub async fn ready_in(self, ns: &TestNamespace) -> Client {
        self.make(ns).await.tenant
    }

    async fn ready_on(self, test_host: TestHost) -> ReadyTenant {
        let TestHost {
            operator,
            ns,
            host,
            room,
        } = test_host;
        let made = self.make(&ns).await;
        ReadyTenant {
            operator,
            ns,
            host,
            tenant: made.tenant,
            name: made.name,
            ready: made.ready,
            sync_policy: made.sync_policy,
            room,
        }
    }

    async fn make(self, ns: &TestNamespace) -> Made {
        let host = ns.client.clone();
        let mut tc = tenant_named(&ns.name, &self.name);
        let mut sync_policy = None;
        if let Some(spec) = self.sync_policy {
            let name = format!("{}-policy", ns.name);
            let policy: tenantplane_api::SyncPolicy = serde_json::from_value(serde_json::json!({
                "apiVersion": "tenantplane.io/v1alpha1",
                "kind": "SyncPolicy",
                "metadata": {"name": name},
                "spec": spec
            }))
            .unwrap();
            Api::<tenantplane_api::SyncPolicy>::all(host.clone())
                .create(&PostParams::default(), &policy)
                .await
                .unwrap();
            tc.spec.sync_policy_ref.name = name.clone();
            sync_policy = Some(name);
        }
        if self.allow.is_some() || self.profile_spec.is_some() {
            let profile = format!("{}-profile", ns.name);
            let allow = self.allow.unwrap_or_else(|| serde_json::json!({}));
            profile_allowing(&host, &profile, allow).await;
            if let Some(spec) = self.profile_spec {
                Api::<tenantplane_api::IsolationProfile>::all(host.clone())
                    .patch(
                        &profile,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(serde_json::json!({ "spec": spec })),
                    )
                    .await
                    .unwrap();
            }
            tc.spec.isolation_profile_ref.name = profile;
        }
        for edit in self.edits {
            edit(&mut tc);
        }
        let ready = create_ready(&host, &tc).await;
        let tenant = tenant_client(&host, &ns.name, &self.name).await;
        Made {
            tenant,
            name: self.name,
            ready,
            sync_policy,
        }
    }
}

struct Made {
    tenant: Client,
    name: String,
    ready: TenantCluster,
    sync_policy: Option<String>,
}

/// The cluster IP of Service `ns/name` (it must exist and have one).
pub async fn cluster_ip(client: &Client, ns: &str, name: &str) -> String {
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("Service {ns}/{name}: {e}"))
        .spec
        .and_then(|s| s.cluster_ip)
        .unwrap_or_else(|| panic!("Service {ns}/{name} has no cluster IP"))
}
