//! The simulated node: kwok keeps it Ready and drives its pods to Running, answering logs, exec
//! and port-forward from files of its own. Every control plane has one, beside a real node or not.

use super::ControlPlane;
use super::pki::write;
use crate::Result;
use crate::apiserver::flags;
use crate::process::free_port;
use std::path::PathBuf;

/// The simulated node that kwok keeps Ready and whose pods it drives to Running.
pub const KWOK_NODE: &str = "kwok-node-0";

const KWOK_NODE_YAML: &str = include_str!("../../../../testenv/kwok/node.yaml");
const KWOK_STAGES: &[(&str, &str)] = &[
    (
        "node-initialize.yaml",
        include_str!("../../../../testenv/kwok/stages/node-initialize.yaml"),
    ),
    (
        "node-heartbeat.yaml",
        include_str!("../../../../testenv/kwok/stages/node-heartbeat.yaml"),
    ),
    (
        "pod-ready.yaml",
        include_str!("../../../../testenv/kwok/stages/pod-ready.yaml"),
    ),
    (
        "pod-complete.yaml",
        include_str!("../../../../testenv/kwok/stages/pod-complete.yaml"),
    ),
    (
        "pod-delete.yaml",
        include_str!("../../../../testenv/kwok/stages/pod-delete.yaml"),
    ),
];

/// What kwok answers for logs, attach, exec and port-forward of its pods (placeholders filled in).
const KWOK_DEBUGGING_YAML: &str = include_str!("../../../../testenv/kwok/debugging/pods.yaml");
/// The log every simulated container has (CRI format, as a container runtime writes it).
pub const KWOK_LOG_LINES: &[&str] = &["hello from a simulated container", "second line"];

impl ControlPlane {
    /// Start kwok with its one simulated node ([`KWOK_NODE`]), talking to the API server as
    /// `kubeconfig`, and wait until the node is Ready.
    pub(super) fn start_kwok(&mut self, kc: &str) -> Result<()> {
        let kwok_dir = self.dir.join("kwok");
        crate::local_forward::install_crd(&kwok_dir, |a| self.kubectl_ok(a))?;
        let mut config_args = Vec::new();
        for (name, body) in KWOK_STAGES {
            let path = kwok_dir.join(name);
            write(&path, body)?;
            config_args.push(format!("--config={}", path.display()));
        }
        let log: String = KWOK_LOG_LINES
            .iter()
            .map(|l| format!("2026-01-01T00:00:00.000000000Z stdout F {l}\n"))
            .collect();
        write(&self.kwok_log_file(), &log)?;
        std::fs::create_dir_all(self.kwok_exec_dir())?;
        let debugging = KWOK_DEBUGGING_YAML
            .replace("LOGS_FILE", &self.kwok_log_file().display().to_string())
            .replace("EXEC_DIR", &self.kwok_exec_dir().display().to_string())
            .replace("FORWARD_PORT", &self.forward_port.to_string());
        let path = kwok_dir.join("debugging.yaml");
        write(&path, &debugging)?;
        config_args.push(format!("--config={}", path.display()));
        // The node's address is loopback so the API server's calls to "its kubelet" stay on this
        // machine; pod IPs come from a CIDR that nothing here ever connects to.
        let kwok_port = free_port()?;
        let mut kwok_args = flags(&[
            ("kubeconfig", kc.to_string()),
            ("manage-all-nodes", "false".into()),
            (
                "manage-nodes-with-annotation-selector",
                "kwok.x-k8s.io/node=fake".into(),
            ),
            ("server-address", format!("127.0.0.1:{kwok_port}")),
            ("node-port", kwok_port.to_string()),
            ("node-ip", "127.0.0.1".into()),
            ("cidr", "10.244.0.0/16".into()),
            ("node-lease-duration-seconds", "40".into()),
            // Control-plane pods' forwards come from PortForward objects (crate::local_forward).
            ("enable-crds", "PortForward".into()),
        ]);
        kwok_args.extend(config_args);
        // A work dir of its own, so kwok never reads a user's ~/.kwok configuration.
        let kwok_work = kwok_dir.display().to_string();
        self.spawn("kwok", kwok_args, &[("KWOK_WORKDIR", kwok_work.as_str())])?;
        let node_path = kwok_dir.join("node.yaml");
        write(&node_path, KWOK_NODE_YAML)?;
        self.kubectl_ok(&["apply", "-f", &node_path.display().to_string()])?;
        self.wait_for_node("the simulated node", KWOK_NODE)?;
        Ok(())
    }

    /// Add simulated nodes `kwok-node-1` … `kwok-node-<count>` (each takes 110 pods), for
    /// benchmarks with more pods than one node holds. Waits until they are Ready.
    pub fn add_kwok_nodes(&self, count: usize) -> Result<()> {
        for i in 1..=count.min(255) {
            let name = format!("kwok-node-{i}");
            let yaml = KWOK_NODE_YAML
                .replace(KWOK_NODE, &name)
                .replace("10.244.0.0/24", &format!("10.244.{i}.0/24"));
            let path = self.dir.join("kwok").join(format!("{name}.yaml"));
            write(&path, &yaml)?;
            self.kubectl_ok(&["apply", "-f", &path.display().to_string()])?;
        }
        // A node just applied has no conditions yet, and the filter then fails: not Ready yet.
        self.wait_until("the added nodes to be Ready", || {
            let out = self.kubectl_output(&[
                "get",
                "nodes",
                "-o",
                "jsonpath={.items[*].status.conditions[?(@.type==\"Ready\")].status}",
            ]);
            Ok(out.is_ok_and(|out| {
                out.split_whitespace().filter(|s| *s == "True").count() > count.min(255)
            }))
        })
    }

    /// The log file kwok serves for every simulated container ([`KWOK_LOG_LINES`]).
    pub fn kwok_log_file(&self) -> PathBuf {
        self.dir.join("kwok").join("container.log")
    }

    /// Where commands exec'd in simulated containers run.
    pub fn kwok_exec_dir(&self) -> PathBuf {
        self.dir.join("kwok").join("exec")
    }
}
