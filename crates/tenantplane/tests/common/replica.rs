//! The operator as a cluster runs it: the built binary (`tenantplane controller`) as a separate
//! process, as the operator's ServiceAccount with deploy/operator's RBAC, and the Lease its
//! replicas elect a leader by.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use serde_json::Value;
use tenantplane_testenv::host_cluster::SERVICE_CIDR;
use tenantplane_testenv::process::free_port;
use tenantplane_testenv::{TestNamespace, eventually, shared};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::WAIT;

/// The Lease as deploy/operator's Role allows it (this binary's one leader election test).
pub const LEASE: &str = "tenantplane";
pub const LEASE_NAMESPACE: &str = tenantplane_testenv::operator::NAMESPACE;

/// One `tenantplane controller` process; killed when dropped.
pub struct Replica {
    pub identity: String,
    child: tokio::process::Child,
    log: PathBuf,
    port: u16,
}

impl Replica {
    /// `/readyz`'s body once it answers 200.
    pub async fn ready(&self) -> Option<String> {
        eventually(WAIT, || async {
            self.get("/readyz").await.filter(|(code, _)| *code == 200)
        })
        .await
        .map(|(_, body)| body)
    }

    pub fn start(ns: &TestNamespace, identity: &str, extra: &[&str]) -> Replica {
        let port = free_port().unwrap();
        let kubelet_port = free_port().unwrap();
        let log = shared().dir().join(format!("operator-{identity}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_tenantplane"));
        command
            // As the operator's ServiceAccount, with deploy/operator's RBAC.
            .arg("--kubeconfig")
            .arg(tenantplane_testenv::operator::kubeconfig_file())
            .args([
                "controller",
                "--connector",
                "local",
                "--service-cidr",
                SERVICE_CIDR,
            ])
            .args(["--watch-namespace", &ns.name])
            .args(["--metrics-address", &format!("127.0.0.1:{port}")])
            .args(["--log-format", "json", "--log-level", "info"])
            .args(["--leader-elect-identity", identity])
            // The kubelet endpoint on a loopback port of its own; its CA in the operator's
            // namespace, as in a deployment.
            .args([
                "--operator-namespace",
                tenantplane_testenv::operator::NAMESPACE,
            ])
            .args(["--kubelet-address", "127.0.0.1"])
            .args(["--kubelet-listen", &format!("127.0.0.1:{kubelet_port}")])
            .args(["--kubelet-port", &kubelet_port.to_string()])
            .args(extra)
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(true);
        Replica {
            identity: identity.to_string(),
            child: command.spawn().unwrap(),
            log,
            port,
        }
    }

    /// GET `path` on the metrics endpoint: status code and body.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: operator\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let code = response.split(' ').nth(1)?.parse().ok()?;
        let body = response.split_once("\r\n\r\n")?.1.to_string();
        Some((code, body))
    }

    /// The value of the metric line that starts with `series` (name and labels).
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let (_, text) = self.get("/metrics").await?;
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    /// The log so far, one JSON object per line; a line that is not JSON fails the test.
    pub fn log_lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| {
                    panic!(
                        "replica {}: a log line is not JSON ({e}): {l}",
                        self.identity
                    )
                })
            })
            .collect()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("the replica runs").to_string();
        let status = std::process::Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// Wait for the process to exit; its exit code.
    pub async fn exit_code(&mut self) -> Option<i32> {
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "replica {} did not exit:\n{}",
                    self.identity,
                    self.log_text()
                )
            })
            .unwrap()
            .code()
    }
}

pub async fn holder(client: &Client) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), LEASE_NAMESPACE)
        .get_opt(LEASE)
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
}

pub async fn wait_for_holder(client: &Client, identity: &str) -> Duration {
    let started = Instant::now();
    let held = eventually(WAIT, || async {
        (holder(client).await.as_deref() == Some(identity)).then_some(())
    })
    .await;
    assert!(
        held.is_some(),
        "{identity} never held the Lease; holder: {:?}",
        holder(client).await
    );
    started.elapsed()
}

pub fn leader_args() -> Vec<String> {
    [
        "--leader-elect",
        "--lease-namespace",
        LEASE_NAMESPACE,
        "--lease-duration",
        "6s",
        "--lease-renew-deadline",
        "4s",
        "--lease-retry-period",
        "1s",
    ]
    .map(str::to_string)
    .to_vec()
}
