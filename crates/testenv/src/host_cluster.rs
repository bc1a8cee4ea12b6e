//! The host cluster of the tests and the dev cluster: etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler and kwok, real binaries on free loopback ports with a
//! PKI of their own ([`pki`]).

mod kwok;
mod pki;
pub mod real_node;

pub use kwok::{KWOK_LOG_LINES, KWOK_NODE};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tenantplane_pki::Leaf;

pub use crate::apiserver::SERVICE_CIDR;
use crate::apiserver::{
    AUDIT_LOG, AUDIT_POLICY, ApiServerConfig, FrontProxy, apiserver_args, flags,
};
use crate::binaries::{Agent, Binaries};
use crate::process::{self, Handle, free_port, tail};
use crate::{Error, Result, kubeconfig};
use pki::{write, write_pki};

/// The default StorageClass, served by the controller manager's host-path provisioner.
const STORAGE_CLASS_YAML: &str = r#"apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/host-path
volumeBindingMode: Immediate
"#;

/// Where the controller manager's host-path provisioner makes the test world's volumes (fixed
/// upstream), one folder per volume.
pub(crate) const HOST_PATH_VOLUMES: &str = "/tmp/hostpath_pv";

/// How long each component may take to answer before we give up and show its log.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// Wait until `crds` (`crd/<name>`) are Established, through `kubectl wait`. A CRD applied a
/// moment ago may have no conditions yet, and `kubectl wait` then fails at once ("accessor
/// error: <nil>") instead of waiting: it is asked again, for up to a minute.
pub(crate) fn wait_established(
    kubectl: impl Fn(&[&str]) -> Result<()>,
    crds: &[&str],
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut args = vec!["wait", "--for=condition=Established", "--timeout=60s"];
    args.extend_from_slice(crds);
    loop {
        match kubectl(&args) {
            Err(e) if Instant::now() < deadline && e.to_string().contains("accessor error") => {
                std::thread::sleep(Duration::from_millis(250));
            }
            done => return done,
        }
    }
}

/// A running control plane. Its processes stop when [`ControlPlane::stop`] is called or the
/// process that started them exits.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    server: String,
    kubeconfig: PathBuf,
    binaries: Binaries,
    /// Every component, in the order started (a restarted one keeps its place).
    processes: std::sync::Mutex<Vec<Handle>>,
    /// kube-apiserver's flags, to start it again ([`ControlPlane::restart_apiserver`]).
    apiserver_args: Vec<String>,
    keep_dir: bool,
    /// Where kwok sends every port-forward of its pods (a test listens there).
    forward_port: u16,
    /// The real node's registry and what it leaves to clean up, when one runs.
    real_node: Option<real_node::RealNodeState>,
}

/// Which nodes run the pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Nodes {
    /// kwok's simulated node only: no container runs (scale benchmarks, the fast suites).
    #[default]
    Simulated,
    /// A real node (kubelet, containerd, runc, CNI bridge, kube-proxy) for workloads, beside the
    /// simulated node that only the local runtime's control-plane pods use. Needs root and a
    /// network namespace of its own ([`real_node::preflight`]).
    Real {
        /// The taint the simulated node gets once the real node is Ready, so workloads go to the
        /// real node and only pods that tolerate it (the local runtime's control-plane pods, as
        /// the operator builds them) go to the simulated one. The caller names it.
        simulated_taint: &'static str,
    },
}

impl Nodes {
    /// Does a real node run?
    pub fn is_real(self) -> bool {
        matches!(self, Nodes::Real { .. })
    }
}

/// Options for starting a control plane.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Folder for data, PKI and logs; a fresh temporary folder (removed on stop) when `None`.
    pub dir: Option<PathBuf>,
    /// Print a line per step on stderr.
    pub progress: bool,
    /// Simulated or real nodes.
    pub nodes: Nodes,
    /// The `tenantplane` binary a real node serves as the operator's image (the snapshot agent
    /// of a control-plane pod the node runs); none, and such a pod cannot pull its agent.
    pub agent: Option<Agent>,
}

impl ControlPlane {
    /// Start every component and wait until the API server is ready, the simulated node is Ready
    /// and the `default` namespace has its service account.
    ///
    /// Over 100 lines as a start-up script in the order a cluster comes up (PKI, etcd, the API
    /// server, the controllers, the nodes), each step waiting on the one before and saying so.
    pub fn start(options: Options) -> Result<Self> {
        let started = Instant::now();
        let say = |what: &str| {
            if options.progress {
                eprintln!("testenv: {what} ({:.1}s)", started.elapsed().as_secs_f64());
            }
        };
        let mut binaries = Binaries::locate()?;
        if let Some(agent) = &options.agent {
            binaries = binaries.with_agent(agent.clone());
        }
        let (dir, keep_dir) = match &options.dir {
            Some(d) => (d.clone(), true),
            None => (
                std::env::temp_dir().join(format!(
                    "tenantplane-testenv-{}-{}",
                    std::process::id(),
                    free_port()?
                )),
                std::env::var_os("TENANTPLANE_TESTENV_KEEP").is_some(),
            ),
        };
        if options.nodes.is_real() {
            real_node::preflight().map_err(|reason| Error::Component {
                name: "real node".into(),
                detail: format!("cannot start here: {reason}"),
                log: String::new(),
            })?;
        }
        std::fs::create_dir_all(dir.join("logs"))?;
        std::fs::create_dir_all(dir.join("kwok"))?;

        say("writing the PKI");
        let (pki, ca) = write_pki(&dir, real_node::NODE_IP)?;
        let admin = ca.issue(&Leaf::client(
            "tenantplane-testenv-admin",
            &["system:masters"],
        ))?;

        let etcd_client = free_port()?;
        let etcd_peer = free_port()?;
        let apiserver_port = free_port()?;
        let server = format!("https://127.0.0.1:{apiserver_port}");
        let kubeconfig_path = dir.join("kubeconfig");
        write(
            &kubeconfig_path,
            &kubeconfig::render(
                "testenv",
                &server,
                ca.cert_pem(),
                &admin.cert_pem,
                &admin.key_pem,
            )?,
        )?;

        let mut plane = ControlPlane {
            dir: dir.clone(),
            server,
            kubeconfig: kubeconfig_path.clone(),
            binaries,
            processes: Default::default(),
            apiserver_args: Vec::new(),
            keep_dir,
            forward_port: free_port()?,
            real_node: None,
        };
        let real = options.nodes.is_real();
        if real {
            say("making the node's network (bridge, forwarding) in this namespace");
            real_node::prepare_network()?;
        }
        // What the API server shows a real kubelet (which asks the API server whether it may).
        let kubelet_client = if real {
            let cert = ca.issue(&Leaf::client(
                "kube-apiserver-kubelet-client",
                &["system:masters"],
            ))?;
            let (crt, key) = (
                dir.join("apiserver-kubelet-client.crt"),
                dir.join("apiserver-kubelet-client.key"),
            );
            write(&crt, &cert.cert_pem)?;
            write(&key, &cert.key_pem)?;
            Some((crt, key))
        } else {
            None
        };

        say("starting etcd");
        let etcd_peer_url = format!("http://127.0.0.1:{etcd_peer}");
        let etcd_url = format!("http://127.0.0.1:{etcd_client}");
        plane.spawn(
            "etcd",
            flags(&[
                ("name", "testenv".into()),
                ("data-dir", dir.join("etcd").display().to_string()),
                ("listen-client-urls", etcd_url.clone()),
                ("advertise-client-urls", etcd_url.clone()),
                ("listen-peer-urls", etcd_peer_url.clone()),
                ("initial-advertise-peer-urls", etcd_peer_url.clone()),
                ("initial-cluster", format!("testenv={etcd_peer_url}")),
                ("initial-cluster-state", "new".into()),
                ("unsafe-no-fsync", "true".into()),
                ("log-level", "warn".into()),
            ]),
            &[],
        )?;

        say("starting kube-apiserver");
        // Writes are audited, so a test can tell who wrote what (by user agent).
        write(&dir.join("audit-policy.yaml"), AUDIT_POLICY)?;
        let audit = flags(&[
            (
                "audit-policy-file",
                dir.join("audit-policy.yaml").display().to_string(),
            ),
            ("audit-log-path", dir.join(AUDIT_LOG).display().to_string()),
            ("audit-log-format", "json".into()),
        ]);
        let mut apiserver = apiserver_args(&ApiServerConfig {
            etcd: etcd_url,
            etcd_prefix: "/registry".into(),
            port: apiserver_port,
            cert_dir: dir.join("apiserver-certs"),
            ca_crt: pki.ca_crt.clone(),
            serving_crt: pki.serving_crt.clone(),
            serving_key: pki.serving_key.clone(),
            sa_key: pki.sa_key.clone(),
            sa_pub: pki.sa_pub.clone(),
            front_proxy: Some(FrontProxy {
                ca: pki.front_proxy_ca.clone(),
                client_crt: pki.front_proxy_crt.clone(),
                client_key: pki.front_proxy_key.clone(),
            }),
            advertise: real.then(|| real_node::NODE_IP.to_string()),
            kubelet_client,
        });
        apiserver.extend(audit);
        // kwok's node names no DNS name; its InternalIP is loopback.
        apiserver.push("--kubelet-preferred-address-types=InternalIP,Hostname".into());
        // As on hardened clusters: an owner reference that blocks its owner's deletion needs
        // update on the owner's finalizers, so the operator's RBAC is tested for it too.
        apiserver.push("--enable-admission-plugins=OwnerReferencesPermissionEnforcement".into());
        plane.apiserver_args = apiserver.clone();
        plane.spawn("kube-apiserver", apiserver, &[])?;
        plane.wait_for_api_server()?;
        say("kube-apiserver is ready");

        let kc = kubeconfig_path.display().to_string();
        // Flags every client component shares: who it is, where it serves its health endpoint.
        let client_args = |cert_dir: &str| -> Result<Vec<(&'static str, String)>> {
            Ok(vec![
                ("kubeconfig", kc.clone()),
                ("authentication-kubeconfig", kc.clone()),
                ("authorization-kubeconfig", kc.clone()),
                ("bind-address", "127.0.0.1".into()),
                ("secure-port", free_port()?.to_string()),
                ("leader-elect", "false".into()),
                ("profiling", "false".into()),
                ("cert-dir", dir.join(cert_dir).display().to_string()),
                // The defaults (20 QPS) make the controller manager, not the code under test,
                // the bottleneck once a benchmark creates hundreds of StatefulSets.
                ("kube-api-qps", "200".into()),
                ("kube-api-burst", "400".into()),
            ])
        };

        say("starting kube-controller-manager and kube-scheduler");
        let mut kcm = client_args("kcm-certs")?;
        kcm.extend([
            ("controllers", "*".into()),
            ("use-service-account-credentials", "true".into()),
            (
                "service-account-private-key-file",
                pki.sa_key.display().to_string(),
            ),
            ("root-ca-file", pki.ca_crt.display().to_string()),
            (
                "cluster-signing-cert-file",
                pki.ca_crt.display().to_string(),
            ),
            ("cluster-signing-key-file", pki.ca_key.display().to_string()),
            ("service-cluster-ip-range", SERVICE_CIDR.into()),
            // Real volume provisioning for PVCs (the tenants' sqlite volumes), as a test cluster.
            ("enable-hostpath-provisioner", "true".into()),
        ]);
        plane.spawn("kube-controller-manager", flags(&kcm), &[])?;
        let mut scheduler = client_args("scheduler-certs")?;
        // A pod the scheduler found unschedulable waits for an event that may help it (a claim
        // bound, a node added); when such an event is missed, only this timer retries it, 5
        // minutes by default: longer than a test waits. CI met it once (a StatefulSet's pod
        // tried before its claim existed, never retried). The flag is deprecated upstream but
        // still served; a real cluster keeps the default.
        scheduler.push(("pod-max-in-unschedulable-pods-duration", "10s".into()));
        plane.spawn("kube-scheduler", flags(&scheduler), &[])?;

        say("starting kwok with one simulated node");
        plane.start_kwok(&kc)?;
        plane.wait_until("the default service account", || {
            Ok(plane
                .kubectl_output(&["get", "serviceaccount", "default", "-n", "default"])
                .is_ok())
        })?;
        let class_path = dir.join("storageclass.yaml");
        write(&class_path, STORAGE_CLASS_YAML)?;
        plane.kubectl_ok(&["apply", "-f", &class_path.display().to_string()])?;
        if let Nodes::Real { simulated_taint } = options.nodes {
            plane.start_real_node(&ca, simulated_taint, &say)?;
        }
        say("control plane is ready");
        Ok(plane)
    }

    fn spawn(&mut self, name: &str, args: Vec<String>, env: &[(&str, &str)]) -> Result<()> {
        let program = self.binaries.path(name);
        let log = self.log_path(name);
        let handle = process::spawn(name, &program, &args, env, &log)
            .map_err(|e| Error::Io(format!("starting {}: {e}", program.display())))?;
        self.handles().push(handle);
        Ok(())
    }

    fn handles(&self) -> std::sync::MutexGuard<'_, Vec<Handle>> {
        // A poisoned lock still holds the handles: a panic elsewhere must not leak processes.
        self.processes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Kill kube-apiserver (SIGKILL, as a crashed or rebooted node's would go) and start it again
    /// with the same flags, its log kept beside the new one; returns once `/readyz` says ok. Its
    /// clients see their connections drop and their watches end, as in a host control plane's
    /// restart.
    pub fn restart_apiserver(&self) -> Result<()> {
        let name = "kube-apiserver";
        let program = self.binaries.path(name);
        let log = self.log_path(name);
        {
            let mut handles = self.handles();
            let slot = handles
                .iter_mut()
                .find(|h| h.name == name)
                .ok_or_else(|| Error::Io("no kube-apiserver runs in this world".into()))?;
            process::kill(slot);
            let _ = std::fs::rename(&log, self.log_path("kube-apiserver.previous"));
            *slot = process::spawn(name, &program, &self.apiserver_args, &[], &log)
                .map_err(|e| Error::Io(format!("starting {}: {e}", program.display())))?;
        }
        self.wait_for_api_server()
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{name}.log"))
    }

    /// Wait for `check` to say yes, failing early (with the log) if a component died.
    fn wait_until(&self, what: &str, mut check: impl FnMut() -> Result<bool>) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if check()? {
                return Ok(());
            }
            for handle in self.handles().iter() {
                if let Some(status) = process::exited(handle) {
                    return Err(Error::Component {
                        name: handle.name.clone(),
                        detail: format!("exited ({status}) while waiting for {what}"),
                        log: tail(&self.log_path(&handle.name), 40),
                    });
                }
            }
            if Instant::now() > deadline {
                return Err(Error::Component {
                    name: "control plane".into(),
                    detail: format!("timed out after {READY_TIMEOUT:?} waiting for {what}"),
                    log: self.logs_tail(20),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Wait until Node `name` (`what`, for the message) is Ready.
    fn wait_for_node(&self, what: &str, name: &str) -> Result<()> {
        self.wait_until(&format!("{what} to be Ready"), || {
            let out = self.kubectl_output(&[
                "get",
                "node",
                name,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ]);
            Ok(out.is_ok_and(|s| s.trim() == "True"))
        })
    }

    fn wait_for_api_server(&self) -> Result<()> {
        self.wait_until("kube-apiserver /readyz", || {
            Ok(self
                .kubectl_output(&["get", "--raw", "/readyz"])
                .is_ok_and(|s| s.trim() == "ok"))
        })
    }

    /// A `kubectl` command for this control plane.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(self.binaries.path("kubectl"));
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()));
        cmd
    }

    fn kubectl_output(&self, args: &[&str]) -> Result<String> {
        let out = self.kubectl().args(args).output()?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(Error::Kubectl(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ))
        }
    }

    fn kubectl_ok(&self, args: &[&str]) -> Result<()> {
        self.kubectl_output(args).map(|_| ())
    }

    /// Wait until the API server serves our CRDs.
    pub fn wait_for_crds(&self) -> Result<()> {
        wait_established(
            |a| self.kubectl_ok(a),
            &[
                "crd/tenantclusters.tenantplane.io",
                "crd/isolationprofiles.tenantplane.io",
                "crd/syncpolicies.tenantplane.io",
                "crd/snapshotstores.tenantplane.io",
                "crd/tenantsnapshots.tenantplane.io",
            ],
        )
    }

    /// Apply the committed CRDs, wait until they are served, then apply the default policies
    /// (before that, the policies' kinds may not be known yet).
    pub fn install_crds_and_policies(&self) -> Result<()> {
        let path = |dir: &str| crate::repo_path(dir).display().to_string();
        self.kubectl_ok(&["apply", "-f", &path("deploy/crds")])?;
        self.wait_for_crds()?;
        self.kubectl_ok(&["apply", "-f", &path("deploy/policies")])
    }

    /// The API server's address, `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The CA that signed the API server's serving certificate, as PEM.
    pub fn ca_pem(&self) -> Result<String> {
        let path = self.dir.join("ca.crt");
        std::fs::read_to_string(&path)
            .map_err(|e| Error::Io(format!("reading {}: {e}", path.display())))
    }

    /// An admin kubeconfig file for this control plane.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server's audit log: one JSON event per write request (see [`AUDIT_POLICY`]).
    pub fn audit_log_path(&self) -> PathBuf {
        self.dir.join(AUDIT_LOG)
    }

    /// The folder with the data, PKI and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the built binaries (kubectl among them) are.
    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// The local registry (`127.0.0.1:<port>`) when a real node runs: images pushed there can be
    /// pulled by its name, as `127.0.0.1:<port>/name:tag`.
    pub fn registry(&self) -> Option<&str> {
        self.real_node.as_ref().map(|n| n.registry.as_str())
    }

    /// The loopback port every port-forward of a simulated pod reaches.
    pub fn forward_port(&self) -> u16 {
        self.forward_port
    }

    /// A client with admin rights, bound to the calling tokio runtime.
    pub async fn client(&self) -> Result<kube::Client> {
        kubeconfig::client(&self.kubeconfig).await
    }

    /// The admin client's configuration.
    pub async fn config(&self) -> Result<kube::Config> {
        kubeconfig::config(&self.kubeconfig).await
    }

    /// The last `lines` lines of every component's log.
    pub fn logs_tail(&self, lines: usize) -> String {
        self.handles()
            .iter()
            .map(|h| {
                format!(
                    "----- {} -----\n{}",
                    h.name,
                    tail(&self.log_path(&h.name), lines)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Stop every component and remove the folder unless it was given or kept.
    pub fn stop(&mut self) {
        // The volumes the provisioner made live outside the world's folder, in a folder every
        // world shares: read which are this world's while its API server still answers.
        let volumes = if self.keep_dir || self.handles().is_empty() {
            Vec::new()
        } else {
            self.host_path_volumes()
        };
        let handles: Vec<Handle> = self.handles().drain(..).collect();
        for handle in handles.into_iter().rev() {
            process::stop(&handle);
        }
        if let Some(node) = self.real_node.take() {
            node.clean_up();
        }
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
            for volume in volumes {
                let _ = std::fs::remove_dir_all(volume);
            }
        }
    }

    /// The folders of this world's host-path volumes (a tenant's claim holds its database there).
    pub(crate) fn host_path_volumes(&self) -> Vec<PathBuf> {
        let paths = self
            .kubectl_output(&[
                "get",
                "persistentvolumes",
                "-o",
                "jsonpath={range .items[*]}{.spec.hostPath.path}{\"\\n\"}{end}",
            ])
            .unwrap_or_default();
        paths
            .lines()
            .map(PathBuf::from)
            .filter(|p| p.starts_with(HOST_PATH_VOLUMES) && p != Path::new(HOST_PATH_VOLUMES))
            .collect()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}
