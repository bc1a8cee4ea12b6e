//! The processes of one tenant control plane — kine, kube-apiserver, kube-controller-manager —
//! and their flags, written next to the tenant's data so that a restart starts the same ones.

use std::path::{Path, PathBuf};

use tenantplane_controller::tenant_pki;

use super::datastore::{self, Volume};
use tenantplane_testenv::Binaries;
use tenantplane_testenv::apiserver::{ApiServerConfig, apiserver_args};
use tenantplane_testenv::process::free_port;
use tenantplane_testenv::process::{self, Handle};
use tenantplane_testenv::{Error, Result};

/// The file in the data folder holding the [`LaunchSpec`].
const LAUNCH_FILE: &str = "launch.json";

/// Everything needed to (re)start a tenant's processes, kept next to its data.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct LaunchSpec {
    kine: Vec<String>,
    /// Where kine listens and the API server dials it.
    kine_socket: PathBuf,
    apiserver: Vec<String>,
    controller_manager: Vec<String>,
    logs: PathBuf,
    /// Variables every process gets (the Go runtime's, from the pod).
    #[serde(default)]
    env: Vec<(String, String)>,
    /// The snapshot agent (the `tenantplane` binary) and its flags, when the pod has one.
    #[serde(default)]
    agent: Option<(PathBuf, Vec<String>)>,
}

/// How long the controller manager waits for the API server to answer before it starts anyway.
const APISERVER_ANSWERS_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

impl LaunchSpec {
    /// The spec written for the tenant whose data folder is `dir`.
    pub(super) fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(LAUNCH_FILE);
        let text = std::fs::read_to_string(&path)?;
        serde_json::from_str(&text).map_err(|e| Error::Io(format!("{}: {e}", path.display())))
    }

    /// Start kine, once it listens the API server, and once that answers the controller
    /// manager. Nothing is left running when this fails.
    pub(super) async fn spawn(&self, binaries: &Binaries) -> Result<Vec<Handle>> {
        let log = |name: &str| self.logs.join(format!("{name}.log"));
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let start_program = |name: &str, program: &Path, args: &[String]| {
            // What the last run wrote, kept beside the new log (as `kubectl logs --previous`).
            let _ = std::fs::rename(log(name), self.logs.join(format!("{name}.previous.log")));
            process::spawn(&format!("tenant-{name}"), program, args, &env, &log(name))
        };
        let start = |name: &str, args: &[String]| start_program(name, &binaries.path(name), args);
        // A socket left by a kine that was killed.
        match std::fs::remove_file(&self.kine_socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        let mut handles = Vec::new();
        // As a container beside kine: the agent only opens the database when asked for a copy.
        if let Some((program, args)) = &self.agent {
            handles.push(start_program("snapshot-agent", program, args)?);
        }
        let kine = start("kine", &self.kine)?;
        handles.push(kine.clone());
        let started = async {
            datastore::wait_for_socket(&kine, &self.kine_socket, &log("kine")).await?;
            handles.push(start("kube-apiserver", &self.apiserver)?);
            // As k3s: the controller manager starts once the API server answers (started at
            // once, it exits on the refused connection, and the pod restarts after a back-off).
            if let Some(dir) = self.logs.parent() {
                let deadline = tokio::time::Instant::now() + APISERVER_ANSWERS_WITHIN;
                while !crate::probes::answers(dir, "/readyz").await
                    && tokio::time::Instant::now() < deadline
                {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            }
            handles.push(start("kube-controller-manager", &self.controller_manager)?);
            Ok::<_, Error>(())
        }
        .await;
        match started {
            Ok(()) => Ok(handles),
            Err(e) => {
                for h in handles.iter().rev() {
                    process::stop(h);
                }
                Err(e)
            }
        }
    }
}

/// What the control-plane pod says of how its processes run.
pub(super) struct FromPod {
    /// `--service-cidr`.
    pub service_cidr: String,
    /// The controller manager's `--controllers`.
    pub controllers: String,
    /// The API server's flags for its kubelets and admission.
    pub apiserver_args: Vec<String>,
    /// Variables every process gets (the Go runtime's).
    pub env: Vec<(String, String)>,
    /// The snapshot agent's program and flags, if it runs one.
    pub agent: Option<(PathBuf, Vec<String>)>,
}

/// Write the [`LaunchSpec`] of a tenant whose data is `volume` and start its processes.
pub(super) async fn spawn_processes(
    binaries: &Binaries,
    volume: &Volume,
    config: &ApiServerConfig,
    controller_manager_kubeconfig: &Path,
    pod: FromPod,
) -> Result<Vec<Handle>> {
    let FromPod {
        service_cidr,
        controllers,
        apiserver_args: pod_apiserver_args,
        env,
        agent,
    } = pod;
    let dir = &volume.dir;
    let kine_socket = datastore::socket(volume);
    let kine = datastore::kine_args(volume, &kine_socket);
    let mut config = config.clone();
    // As k3s: the API server speaks the etcd protocol to kine over its unix socket.
    config.etcd = format!("unix://{}", kine_socket.display());
    let mut apiserver = apiserver_args(&config);
    apiserver.retain(|a| !a.starts_with("--service-cluster-ip-range="));
    apiserver.push(format!("--service-cluster-ip-range={service_cidr}"));
    apiserver.extend(pod_apiserver_args);
    let kc = controller_manager_kubeconfig.display().to_string();
    let tls = dir.join("tls");
    let controller_manager = vec![
        format!("--kubeconfig={kc}"),
        format!("--authentication-kubeconfig={kc}"),
        format!("--authorization-kubeconfig={kc}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={}", free_port()?),
        "--leader-elect=false".into(),
        format!("--controllers={controllers}"),
        "--use-service-account-credentials=true".into(),
        format!(
            "--service-account-private-key-file={}",
            tls.join(tenant_pki::SERVICE_KEY).display()
        ),
        format!(
            "--root-ca-file={}",
            tls.join(tenant_pki::SERVER_CA_CRT).display()
        ),
        format!(
            "--cluster-signing-cert-file={}",
            tls.join(tenant_pki::CLIENT_CA_CRT).display()
        ),
        format!(
            "--cluster-signing-key-file={}",
            tls.join(tenant_pki::CLIENT_CA_KEY).display()
        ),
        format!("--service-cluster-ip-range={service_cidr}"),
        format!("--cert-dir={}", dir.join("kcm-certs").display()),
        "--profiling=false".into(),
    ];
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    let spec = LaunchSpec {
        kine,
        kine_socket,
        apiserver,
        controller_manager,
        logs,
        env,
        agent,
    };
    std::fs::write(
        dir.join(LAUNCH_FILE),
        serde_json::to_string_pretty(&spec).map_err(|e| Error::Io(e.to_string()))?,
    )?;
    spec.spawn(binaries).await
}
