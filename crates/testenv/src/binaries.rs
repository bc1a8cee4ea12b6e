//! Finding the binaries that `make testenv` builds into the cache: the control plane's and helm.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Error, Result};

/// The binaries every control plane needs.
pub const COMPONENTS: &[&str] = &[
    "etcd",
    "kine",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "coredns",
];

/// Built with the control plane but needed only by the chart tests, so its absence fails those
/// tests alone.
pub const HELM: &str = "helm";

/// The operator's binary as the control planes' snapshot agent: the local runtime runs it beside
/// each control plane it stands in for, and a real node serves it as the operator's image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Agent {
    /// The `tenantplane` binary.
    pub binary: PathBuf,
    /// The image name a real node serves it under: the operator's agent image, which the caller
    /// (who knows the operator) names.
    pub image: String,
}

impl Agent {
    /// The agent `binary`, served as image `image`.
    pub fn new(binary: impl Into<PathBuf>, image: impl Into<String>) -> Self {
        Self {
            binary: binary.into(),
            image: image.into(),
        }
    }
}

/// The folder holding the built binaries.
#[derive(Clone, Debug)]
pub struct Binaries {
    dir: PathBuf,
    /// The snapshot agent the local runtime runs beside each control plane; none, it runs no
    /// agent (snapshots of its tenants fail, saying so).
    agent: Option<Agent>,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

impl Binaries {
    /// `$TENANTPLANE_TESTENV_BIN` when set, else the folder `testenv/build.sh --bin-dir` names.
    /// Every component must be there; otherwise the error says how to build them.
    pub fn locate() -> Result<Self> {
        let dir = match std::env::var_os("TENANTPLANE_TESTENV_BIN") {
            Some(dir) => PathBuf::from(dir),
            None => {
                let script = workspace_root().join("testenv/build.sh");
                let out = Command::new("bash")
                    .arg(&script)
                    .arg("--bin-dir")
                    .output()
                    .map_err(|e| {
                        Error::NotBuilt(format!("cannot run {}: {e}", script.display()))
                    })?;
                if !out.status.success() {
                    return Err(Error::NotBuilt(format!(
                        "{} --bin-dir failed: {}",
                        script.display(),
                        String::from_utf8_lossy(&out.stderr).trim()
                    )));
                }
                PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
            }
        };
        let missing: Vec<&str> = COMPONENTS
            .iter()
            .copied()
            .filter(|name| !dir.join(name).is_file())
            .collect();
        if !missing.is_empty() {
            return Err(Error::NotBuilt(format!(
                "{} missing from {}",
                missing.join(", "),
                dir.display()
            )));
        }
        Ok(Self { dir, agent: None })
    }

    /// The helm binary, or an error saying how to build it.
    pub fn helm(&self) -> Result<PathBuf> {
        let path = self.dir.join(HELM);
        if path.is_file() {
            Ok(path)
        } else {
            Err(Error::NotBuilt(format!(
                "{HELM} missing from {}",
                self.dir.display()
            )))
        }
    }

    /// Run `agent` (the `tenantplane` binary) as the control planes' snapshot agent.
    pub fn with_agent(mut self, agent: Agent) -> Self {
        self.agent = Some(agent);
        self
    }

    /// The snapshot agent, if the runtime runs one.
    pub fn agent(&self) -> Option<&Agent> {
        self.agent.as_ref()
    }

    /// The path of one binary.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The folder of the built binaries.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The Kubernetes release the test world's binaries and images are (`testenv/kube`'s pin), and
/// the previous minor release's (`testenv/kube-previous`), whose kube-apiserver and
/// kube-controller-manager images an upgrade of a `kubernetes` tenant starts from.
pub fn kubernetes_versions() -> Result<(String, String)> {
    let pin = |module: &str| -> Result<String> {
        let path = workspace_root().join("testenv").join(module).join("go.mod");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::NotBuilt(format!("reading {}: {e}", path.display())))?;
        text.lines()
            .filter_map(|l| l.trim().strip_prefix("k8s.io/kubernetes "))
            .filter_map(|rest| rest.split_whitespace().next())
            .find(|v| v.starts_with('v'))
            .map(str::to_string)
            .ok_or_else(|| Error::NotBuilt(format!("{} pins no k8s.io/kubernetes", path.display())))
    };
    Ok((pin("kube")?, pin("kube-previous")?))
}
