//! The local runtime: for tests and `tenantplane dev` only, it stands in for the kubelet and the
//! k3s image. When a tenant control-plane pod (label `tenantplane.io/runtime=local`) is scheduled,
//! it starts what k3s would run agentless — kine over sqlite (k3s's datastore), a real
//! kube-apiserver on it, and a kube-controller-manager without the node controllers — from the CAs
//! in the pod's PKI Secret, on loopback ports; marks the pod Running and Ready as a kubelet would;
//! and announces the address in the pod's `tenantplane.io/local-endpoint` annotation. When the
//! processes die it marks the pod not Ready and restarts them after a back-off; when the pod goes,
//! the processes go.
//!
//! The database and everything else of a tenant live in its data folder: the `server` folder of
//! the claim's host-path volume, as in k3s's pod, or a folder standing in for a volume of another
//! kind that follows the claim (`<dir>/<namespace>/<claim>-<claim UID>`). Either way a restarted
//! or re-created pod finds its data, and it goes once its claim is gone ([`datastore`]).
//!
//! It runs each tenant's CoreDNS pod too ([`crate::dns`]), so the tenant's DNS answers.

mod datastore;
mod dns_pods;
mod health;
mod inspect;
pub use inspect::ControlPlaneMemory;
mod launch;
mod pod_address;
mod pod_spec;
mod restore;
mod runs;

use pod_spec::{args_value, go_runtime_env, init_env, mounted_config_map_file};
use runs::Runs;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tenantplane_controller::build::k3s::{KUBELET_CA_ENV, KUBELET_CA_FILE};
use tenantplane_controller::tenant_pki::{self, TenantPki};
use tenantplane_controller::{error_chain, names};
use tenantplane_pki::Leaf;

use crate::dns::{DnsServer, TenantApi};
use crate::probes;
use launch::{FromPod, spawn_processes};
use tenantplane_testenv::Binaries;
use tenantplane_testenv::apiserver::{ApiServerConfig, FrontProxy};
use tenantplane_testenv::process::{self, Handle, free_port};
use tenantplane_testenv::{Error, Result, kubeconfig};

/// How long the runtime waits before restarting a tenant whose processes died (a kubelet backs off
/// similarly).
pub const RESTART_BACKOFF: Duration = Duration::from_secs(5);

/// Every how many health ticks (of a second) the data folders of deleted claims are removed.
const PRUNE_TICKS: u64 = 5;

/// One running tenant control plane.
struct Tenant {
    namespace: String,
    /// The TenantCluster's name.
    tenant: String,
    pod: String,
    uid: String,
    port: u16,
    /// Where its snapshot agent listens, if it runs one.
    agent_port: Option<u16>,
    /// The data folder (see [`datastore::volume`]).
    dir: PathBuf,
    /// kine, kube-apiserver, kube-controller-manager (empty while a restart failed).
    processes: Vec<Handle>,
    ready: bool,
    restarts: i32,
    /// When the processes were first seen dead, for the restart back-off.
    died_at: Option<std::time::Instant>,
    /// Held down by a test: dead processes stay dead until released, as a kubelet's back-off,
    /// which doubles after each crash, would keep a crash-looping pod down for minutes.
    held: bool,
    /// The pod's probe windows, and what the liveness probe saw of this run.
    windows: probes::Windows,
    /// When `/readyz` was last asked.
    probed_at: Option<std::time::Instant>,
    liveness: probes::Liveness,
    /// The pod's IP, served when a real node shares the namespace.
    _address: Option<pod_address::PodAddress>,
}

/// What the health check needs of a tenant, copied out so no lock is held across an await.
struct HealthView {
    uid: String,
    namespace: String,
    pod: String,
    port: u16,
    agent_port: Option<u16>,
    dir: PathBuf,
    ready: bool,
    dead: bool,
    restarts: i32,
}

/// Handle to a running local runtime.
#[derive(Clone)]
pub struct LocalRuntime {
    tenants: Arc<Mutex<HashMap<String, Tenant>>>,
    /// Running CoreDNS servers, by host pod UID.
    pub(crate) dns: Arc<Mutex<HashMap<String, DnsServer>>>,
    /// CoreDNS pods not started yet (their tenant API or token not there yet), by UID, with the
    /// last reason, retried every tick.
    pub(crate) pending_dns: Arc<Mutex<HashMap<String, (Pod, String)>>>,
    /// Control-plane pods not started yet (their claim or PKI Secret not there yet), likewise.
    pending: Arc<Mutex<HashMap<String, (Pod, String)>>>,
    /// Restore init containers running, by pod UID.
    restores: restore::Restores,
}

impl LocalRuntime {
    /// How many tenant control planes are running.
    pub fn running(&self) -> usize {
        self.tenants.lock().map(|t| t.len()).unwrap_or(0)
    }
}

/// Start the runtime: it watches control-plane pods (in `namespace`, or everywhere) until the
/// returned task is dropped or aborted. Processes and data live under `dir`.
pub fn start(
    client: Client,
    binaries: Binaries,
    dir: PathBuf,
    namespace: Option<String>,
) -> (LocalRuntime, tokio::task::JoinHandle<()>) {
    let runtime = LocalRuntime {
        tenants: Arc::new(Mutex::new(HashMap::new())),
        dns: Arc::new(Mutex::new(HashMap::new())),
        pending_dns: Arc::new(Mutex::new(HashMap::new())),
        pending: Arc::new(Mutex::new(HashMap::new())),
        restores: Default::default(),
    };
    let handle = runtime.clone();
    let task = tokio::spawn(async move {
        let pods: Api<Pod> = match &namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        // Control-plane pods, and the tenants' CoreDNS copies (they carry their pods' labels).
        let watch = |selector: String, runs: Runs| {
            watcher(pods.clone(), watcher::Config::default().labels(&selector))
                .default_backoff()
                .map(move |e| (runs, e))
        };
        let mut events = futures::stream::select(
            watch(
                format!("{}={}", names::LABEL_RUNTIME, names::RUNTIME_LOCAL),
                Runs::ControlPlane,
            ),
            // Synced pods carry the tenant's labels in their host form; the CoreDNS copies are
            // told apart by their image.
            watch(
                tenantplane_syncer::naming::LABEL_SYNCED_FROM.to_string(),
                Runs::Dns,
            ),
        )
        .boxed();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut ticks: u64 = 0;
        let guard = StopOnDrop(runtime.clone());
        loop {
            tokio::select! {
                event = events.next() => {
                    let r = &guard.0;
                    match event {
                        Some((runs, Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)))) => match runs {
                            Runs::ControlPlane => r.on_pod(&client, &binaries, &dir, pod).await,
                            Runs::Dns => r.on_dns_pod(&client, &binaries, &dir, pod).await,
                        },
                        Some((runs, Ok(watcher::Event::Delete(pod)))) => {
                            let uid = pod.uid().unwrap_or_default();
                            match runs {
                                Runs::ControlPlane => r.stop(&uid),
                                Runs::Dns => r.stop_dns(&uid),
                            }
                        }
                        Some((_, Ok(_))) => {}
                        Some((runs, Err(e))) => eprintln!("local runtime: watch error ({} pods): {}", runs.what(), error_chain(&e)),
                        None => break,
                    }
                }
                _ = tick.tick() => {
                    guard.0.check_health(&client, &binaries).await;
                    guard.0.retry(&client, &binaries, &dir).await;
                    guard.0.retry_dns(&client, &binaries, &dir).await;
                    ticks += 1;
                    if ticks.is_multiple_of(PRUNE_TICKS) {
                        let in_use = guard.0.data_dirs();
                        datastore::prune(&client, &dir, namespace.as_deref(), &in_use).await;
                    }
                }
            }
        }
    });
    (handle, task)
}

/// How long a launch may take before the runtime says it is slow.
const SLOW_LAUNCH: Duration = Duration::from_secs(20);

/// Stops every tenant process when the runtime's task ends.
struct StopOnDrop(LocalRuntime);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Ok(mut dns) = self.0.dns.lock() {
            for (_, d) in dns.drain() {
                process::stop(&d.handle);
            }
        }
        self.0.restores.stop_all();
        if let Ok(mut tenants) = self.0.tenants.lock() {
            for (_, t) in tenants.drain() {
                for h in t.processes.iter().rev() {
                    process::stop(h);
                }
            }
        }
    }
}

impl LocalRuntime {
    async fn on_pod(&self, client: &Client, binaries: &Binaries, dir: &Path, pod: Pod) {
        let uid = pod.uid().unwrap_or_default();
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        if pod.metadata.deletion_timestamp.is_some() {
            // As a kubelet: stop the containers, then let the pod go.
            self.stop(&uid);
            let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..Default::default()
            };
            let _ = api.delete(&name, &dp).await;
            return;
        }
        let scheduled = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
        let known = self
            .tenants
            .lock()
            .map(|t| t.contains_key(&uid))
            .unwrap_or(true);
        if !scheduled || known {
            return;
        }
        // A launch is a few API calls and process starts; one that takes long says so, so a test
        // that times out waiting for the pod shows where the runtime was.
        let result = {
            let launch = self.launch(client, binaries, dir, &pod);
            tokio::pin!(launch);
            match tokio::time::timeout(SLOW_LAUNCH, &mut launch).await {
                Ok(result) => result,
                Err(_) => {
                    eprintln!(
                        "local runtime: starting {ns}/{name} has taken {}s so far",
                        SLOW_LAUNCH.as_secs()
                    );
                    launch.await
                }
            }
        };
        let Ok(mut pending) = self.pending.lock() else {
            return;
        };
        match result {
            Ok(tenant) => {
                pending.remove(&uid);
                if let Ok(mut tenants) = self.tenants.lock() {
                    tenants.insert(uid, tenant);
                }
            }
            Err(e) => {
                // Tried again every tick, as a kubelet would; said again when the reason changes.
                let reason = error_chain(&e);
                if pending.get(&uid).is_none_or(|(_, last)| *last != reason) {
                    eprintln!("local runtime: cannot start {ns}/{name} yet: {reason}");
                }
                pending.insert(uid, (pod, reason));
            }
        }
    }

    /// Try the control-plane pods again that could not start yet.
    async fn retry(&self, client: &Client, binaries: &Binaries, dir: &Path) {
        let pods: Vec<Pod> = match self.pending.lock() {
            Ok(p) => p.values().map(|(pod, _)| pod.clone()).collect(),
            Err(_) => return,
        };
        for pod in pods {
            self.on_pod(client, binaries, dir, pod).await;
        }
    }

    /// Start a tenant pod's processes as k3s would (data folder, certificates, kine, API server,
    /// controller manager, agent), then publish its address. Over 100 lines as one start-up
    /// script in k3s's order: each step uses the folders and certificates made before it.
    async fn launch(
        &self,
        client: &Client,
        binaries: &Binaries,
        dir: &Path,
        pod: &Pod,
    ) -> Result<Tenant> {
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let secret_name = pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .find_map(|v| v.secret.as_ref()?.secret_name.clone())
            .ok_or_else(|| Error::Io(format!("pod {ns}/{name} mounts no PKI Secret")))?;
        let secret = Api::<Secret>::namespaced(client.clone(), &ns)
            .get(&secret_name)
            .await?;
        let pki = TenantPki::from_secret_data(&secret.data.unwrap_or_default())
            .map_err(|e| Error::Io(format!("Secret {ns}/{secret_name}: {e}")))?;
        // Data lives with the volume claim, so a new pod of the same StatefulSet finds it.
        let volume = datastore::volume(client, dir, pod).await?;
        let tenant_dir = volume.dir.clone();
        let tls = tenant_dir.join("tls");
        std::fs::create_dir_all(&tls)?;
        let write = |file: &str, text: &str| -> Result<PathBuf> {
            let path = tls.join(file);
            std::fs::write(&path, text)?;
            Ok(path)
        };
        // As a kubelet: a restore's init container first, the rest once it is done.
        if tenantplane_controller::build::agent::pending_restore(pod).is_some() {
            write(tenant_pki::SERVER_CA_CRT, pki.server_ca.cert_pem())?;
            write(tenant_pki::SERVER_CA_KEY, pki.server_ca.key_pem())?;
            write(tenant_pki::CLIENT_CA_CRT, pki.client_ca.cert_pem())?;
            self.restores
                .done(
                    client,
                    binaries,
                    pod,
                    &datastore::database(&tenant_dir),
                    &tls,
                    &tenant_dir.join("snapshots"),
                )
                .await?;
        }
        let mut sans: Vec<String> = args_value(pod, "--tls-san=")
            .iter()
            .map(|s| s.to_string())
            .collect();
        sans.extend(
            [
                "127.0.0.1",
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
            ]
            .map(String::from),
        );
        let san_refs: Vec<&str> = sans.iter().map(String::as_str).collect();
        let serving = pki.server_ca.issue(&Leaf::server("k3s", &san_refs))?;
        // As k3s: the controller manager is user system:kube-controller-manager (with the role
        // Kubernetes binds to it, not an admin), so the tenant's audit tells its requests from a
        // person's; it starts once the API server answers, its roles made.
        let controller_manager = pki.client_ca.issue(
            &Leaf::client("system:kube-controller-manager", &[])
                .valid_for(tenantplane_pki::LEAF_VALIDITY),
        )?;
        let front_proxy = pki
            .request_header_ca
            .issue(&Leaf::client("front-proxy-client", &[]))?;
        // The port this tenant's API server had, while it is free: a restarted control plane
        // (a wake, a restore) keeps its address, as a cluster keeps the Service's, so a
        // kubeconfig printed before still works.
        let port_file = tenant_dir.join("apiserver-port");
        let port = std::fs::read_to_string(&port_file)
            .ok()
            .and_then(|p| p.trim().parse::<u16>().ok())
            .filter(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
            .map_or_else(free_port, Ok)?;
        std::fs::write(&port_file, port.to_string())?;
        tenantplane_testenv::local_forward::publish(client, pod, names::API_PORT, port).await?;
        let server = format!("https://127.0.0.1:{port}");
        let controller_manager_kubeconfig = tenant_dir.join(probes::CLIENT_KUBECONFIG);
        std::fs::write(
            &controller_manager_kubeconfig,
            kubeconfig::render(
                "tenant",
                &server,
                pki.server_ca.cert_pem(),
                &controller_manager.cert_pem,
                &controller_manager.key_pem,
            )?,
        )?;
        let config = ApiServerConfig {
            etcd: String::new(),
            etcd_prefix: "/registry".into(),
            port,
            cert_dir: tenant_dir.join("apiserver-certs"),
            ca_crt: write(tenant_pki::CLIENT_CA_CRT, pki.client_ca.cert_pem())?,
            serving_crt: write("serving.crt", &serving.cert_pem)?,
            serving_key: write("serving.key", &serving.key_pem)?,
            // k3s hands service.key to both flags; so do we, which checks it works that way.
            sa_key: write(tenant_pki::SERVICE_KEY, &pki.service_key)?,
            sa_pub: tls.join(tenant_pki::SERVICE_KEY),
            front_proxy: Some(FrontProxy {
                ca: write(
                    tenant_pki::REQUEST_HEADER_CA_CRT,
                    pki.request_header_ca.cert_pem(),
                )?,
                client_crt: write("front-proxy-client.crt", &front_proxy.cert_pem)?,
                client_key: write("front-proxy-client.key", &front_proxy.key_pem)?,
            }),
            advertise: None,
            kubelet_client: None,
        };
        write(tenant_pki::SERVER_CA_CRT, pki.server_ca.cert_pem())?;
        write(tenant_pki::SERVER_CA_KEY, pki.server_ca.key_pem())?;
        write(tenant_pki::CLIENT_CA_KEY, pki.client_ca.key_pem())?;
        // As k3s: the API server calls kubelets with a client certificate of the client CA, and
        // trusts the server CA for them unless told otherwise (the operator's kubelet CA, which
        // the init container writes from the pod spec).
        let kubelet_client = pki
            .client_ca
            .issue(&Leaf::client("system:apiserver", &["system:masters"]))?;
        let kubelet_ca = match args_value(
            pod,
            "--kube-apiserver-arg=kubelet-certificate-authority=",
        )
        .first()
        {
            Some(_) => {
                let pem = init_env(pod, KUBELET_CA_ENV).ok_or_else(|| {
                    Error::Io(format!(
                        "pod {ns}/{name} names a kubelet CA but its init container has no {KUBELET_CA_ENV}"
                    ))
                })?;
                write(KUBELET_CA_FILE, &pem)?
            }
            None => tls.join(tenant_pki::SERVER_CA_CRT),
        };
        let mut apiserver_args = vec![
            format!("--kubelet-certificate-authority={}", kubelet_ca.display()),
            format!(
                "--kubelet-client-certificate={}",
                write("client-kube-apiserver.crt", &kubelet_client.cert_pem)?.display()
            ),
            format!(
                "--kubelet-client-key={}",
                write("client-kube-apiserver.key", &kubelet_client.key_pem)?.display()
            ),
            // As the pod says, else as k3s does.
            format!(
                "--kubelet-preferred-address-types={}",
                args_value(pod, "--kube-apiserver-arg=kubelet-preferred-address-types=")
                    .first()
                    .unwrap_or(&"InternalIP,ExternalIP,Hostname")
            ),
        ];
        // As k3s: the admission configuration the pod names, from the ConfigMap it mounts there.
        if let Some(path) =
            args_value(pod, "--kube-apiserver-arg=admission-control-config-file=").first()
        {
            let text = mounted_config_map_file(client, pod, path).await?;
            apiserver_args.push(format!(
                "--admission-control-config-file={}",
                write("admission.yaml", &text)?.display()
            ));
        }
        // As k3s: the audit flags the pod gives, its policy from the mounted ConfigMap and its
        // log in the tenant's folder (the pod's `/tmp`).
        for flag in args_value(pod, "--kube-apiserver-arg=audit-") {
            let (name, value) = flag.split_once('=').unwrap_or((flag, ""));
            let value = match name {
                "policy-file" => {
                    let text = mounted_config_map_file(client, pod, value).await?;
                    write("audit-policy.yaml", &text)?.display().to_string()
                }
                "log-path" => tenant_dir.join("audit.log").display().to_string(),
                _ => value.to_string(),
            };
            apiserver_args.push(format!("--audit-{name}={value}"));
        }
        let service_cidr = args_value(pod, "--service-cidr=")
            .first()
            .map(|s| s.to_string())
            .unwrap_or_else(|| tenantplane_testenv::apiserver::SERVICE_CIDR.to_string());
        let controllers = args_value(pod, "--kube-controller-manager-arg=controllers=")
            .first()
            .map(|s| s.to_string())
            .unwrap_or_else(|| "*".into());
        // The pod's snapshot agent, as its container would run: on a loopback port of its own,
        // with the tenant's database, PKI and a scratch folder in its data folder.
        let agent_port = match binaries.agent() {
            Some(_) if tenantplane_controller::build::agent::runs_in(pod) => Some(free_port()?),
            _ => None,
        };
        let agent = binaries.agent().zip(agent_port).map(|(agent, port)| {
            let args = vec![
                "agent".to_string(),
                format!("--listen=127.0.0.1:{port}"),
                format!("--database={}", datastore::database(&tenant_dir).display()),
                format!("--pki={}", tls.display()),
                format!("--scratch={}", tenant_dir.join("snapshots").display()),
            ];
            (agent.binary.clone(), args)
        });
        let mut tenant = Tenant {
            agent_port,
            namespace: ns,
            tenant: pod
                .labels()
                .get(names::LABEL_TENANT)
                .cloned()
                .unwrap_or_default(),
            pod: name,
            uid: pod.uid().unwrap_or_default(),
            port,
            dir: tenant_dir,
            processes: Vec::new(),
            ready: false,
            restarts: 0,
            died_at: None,
            held: false,
            windows: probes::windows(pod),
            probed_at: None,
            liveness: probes::Liveness::started(std::time::Instant::now()),
            _address: if tenantplane_testenv::host_cluster::real_node::running() {
                Some(pod_address::serve(&probes::pod_ip(port), port).await?)
            } else {
                None
            },
        };
        tenant.processes = spawn_processes(
            binaries,
            &volume,
            &config,
            &controller_manager_kubeconfig,
            FromPod {
                service_cidr,
                controllers,
                apiserver_args,
                env: go_runtime_env(pod),
                agent,
            },
        )
        .await?;
        Ok(tenant)
    }

    /// The API of tenant `tenant` in host namespace `ns`, once its API server is Ready.
    pub(crate) fn ready_api(&self, ns: &str, tenant: &str) -> Result<TenantApi> {
        let found = self.tenants.lock().ok().and_then(|t| {
            let t = t
                .values()
                .find(|t| t.namespace == ns && t.tenant == tenant && t.ready)?;
            Some((t.port, t.dir.join("tls").join(tenant_pki::SERVER_CA_CRT)))
        });
        let (port, ca) = found
            .ok_or_else(|| Error::Io(format!("tenant {ns}/{tenant}'s API server is not ready")))?;
        Ok(TenantApi {
            server: format!("https://127.0.0.1:{port}"),
            ca_pem: std::fs::read_to_string(&ca)?,
        })
    }

    fn stop(&self, uid: &str) {
        if let Ok(mut pending) = self.pending.lock() {
            pending.remove(uid);
        }
        self.restores.stop(uid);
        let tenant = self.tenants.lock().ok().and_then(|mut t| t.remove(uid));
        if let Some(t) = tenant {
            for h in t.processes.iter().rev() {
                process::stop(h);
            }
        }
    }
}

impl LocalRuntime {
    /// The data folders of the tenants that run.
    fn data_dirs(&self) -> HashSet<PathBuf> {
        self.tenants
            .lock()
            .map(|t| t.values().map(|t| t.dir.clone()).collect())
            .unwrap_or_default()
    }
}
