//! What tests do to a running tenant control plane and ask of it: crashes and wedges as a real
//! one meets them, and where its data is, which processes run and why it did not come back.

use std::path::PathBuf;

use super::{LocalRuntime, datastore};
use tenantplane_testenv::process;

/// What its processes hold.
impl LocalRuntime {
    /// The memory of each running tenant control plane's processes, read from `/proc` now (a
    /// process that is gone counts 0).
    pub fn memory(&self) -> Vec<ControlPlaneMemory> {
        let Ok(tenants) = self.tenants.lock() else {
            return Vec::new();
        };
        tenants
            .values()
            .map(|t| ControlPlaneMemory {
                namespace: t.namespace.clone(),
                tenant: t.tenant.clone(),
                processes: t
                    .processes
                    .iter()
                    .map(|h| (h.name.clone(), process::memory(h.pid).unwrap_or_default()))
                    .collect(),
            })
            .collect()
    }
}

/// Who runs a tenant control plane.
impl LocalRuntime {
    /// The process IDs of every running tenant control plane's processes.
    pub fn pids(&self) -> Vec<u32> {
        let Ok(tenants) = self.tenants.lock() else {
            return Vec::new();
        };
        tenants
            .values()
            .flat_map(|t| t.processes.iter().map(|h| h.pid))
            .collect()
    }
}

/// One tenant control plane's processes and their resident memory.
#[derive(Debug, Clone)]
pub struct ControlPlaneMemory {
    /// The tenant's host namespace.
    pub namespace: String,
    /// The TenantCluster's name.
    pub tenant: String,
    /// Each process's name (`tenant-kine`, `tenant-kube-apiserver`, …) and memory.
    pub processes: Vec<(String, process::ProcessMemory)>,
}

impl ControlPlaneMemory {
    /// All its processes' memory.
    pub fn total(&self) -> process::ProcessMemory {
        self.processes
            .iter()
            .fold(Default::default(), |sum, (_, m)| sum + *m)
    }
}

/// Faults, as a crash or a wedge would bring them.
impl LocalRuntime {
    /// Kill the kube-apiserver of the tenant pod `namespace/pod`, as a crash would. The runtime
    /// notices, marks the pod not Ready, and restarts it after [`RESTART_BACKOFF`].
    pub fn crash_api_server(&self, namespace: &str, pod: &str) -> bool {
        self.crash(namespace, pod, "kube-apiserver")
    }

    /// Kill the datastore (kine) of the tenant pod `namespace/pod`, as a crash would: the API
    /// server stops answering, and the runtime restarts the tenant's processes after
    /// [`RESTART_BACKOFF`] on the same database.
    pub fn crash_datastore(&self, namespace: &str, pod: &str) -> bool {
        self.crash(namespace, pod, "kine")
    }

    /// Stop the kube-apiserver of tenant pod `namespace/pod` without ending it (SIGSTOP), as a
    /// wedged k3s would be: it answers nothing, and only the liveness probe brings it back.
    pub fn wedge_api_server(&self, namespace: &str, pod: &str) -> bool {
        self.signal(namespace, pod, "kube-apiserver", libc::SIGSTOP)
    }

    /// Keep the tenant pod `namespace/pod` down once its processes die (`true`), until released
    /// (`false`): a test that must see the outage, not race a restart five seconds later, holds it
    /// down first. Whether the pod was found.
    pub fn hold_down(&self, namespace: &str, pod: &str, held: bool) -> bool {
        let Ok(mut tenants) = self.tenants.lock() else {
            return false;
        };
        match tenants
            .values_mut()
            .find(|t| t.namespace == namespace && t.pod == pod)
        {
            Some(t) => {
                t.held = held;
                true
            }
            None => false,
        }
    }

    fn crash(&self, namespace: &str, pod: &str, binary: &str) -> bool {
        self.signal(namespace, pod, binary, libc::SIGKILL)
    }

    fn signal(&self, namespace: &str, pod: &str, binary: &str, signal: libc::c_int) -> bool {
        let Ok(tenants) = self.tenants.lock() else {
            return false;
        };
        let process = tenants
            .values()
            .find(|t| t.namespace == namespace && t.pod == pod)
            .and_then(|t| {
                t.processes
                    .iter()
                    .find(|h| h.name == format!("tenant-{binary}"))
            });
        match process {
            Some(h) => {
                // SAFETY: signalling a child process we started. Not reaped here: the health
                // check finds it exited.
                unsafe {
                    libc::kill(h.pid as libc::pid_t, signal);
                }
                true
            }
            None => false,
        }
    }
}

/// What tests may ask of the runtime about a tenant's data and processes.
impl LocalRuntime {
    /// The data folder of the tenant pod `namespace/pod` while the runtime runs it.
    pub fn data_dir(&self, namespace: &str, pod: &str) -> Option<PathBuf> {
        let tenants = self.tenants.lock().ok()?;
        let t = tenants
            .values()
            .find(|t| t.namespace == namespace && t.pod == pod)?;
        Some(t.dir.clone())
    }

    /// Its sqlite database (kine's), in the data folder.
    pub fn database(&self, namespace: &str, pod: &str) -> Option<PathBuf> {
        self.data_dir(namespace, pod)
            .map(|dir| datastore::database(&dir))
    }

    /// The names of the processes the runtime runs for the tenant pod `namespace/pod`.
    pub fn process_names(&self, namespace: &str, pod: &str) -> Vec<String> {
        let Ok(tenants) = self.tenants.lock() else {
            return Vec::new();
        };
        tenants
            .values()
            .filter(|t| t.namespace == namespace && t.pod == pod)
            .flat_map(|t| t.processes.iter().map(|h| h.name.clone()))
            .collect()
    }

    /// What the runtime knows of tenant pod `namespace/pod`, with the end of each process's log
    /// (for a failing test's message: why a control plane did not come back).
    pub fn describe(&self, namespace: &str, pod: &str) -> String {
        let Ok(tenants) = self.tenants.lock() else {
            return "(the runtime's state is poisoned)".into();
        };
        let Some(t) = tenants
            .values()
            .find(|t| t.namespace == namespace && t.pod == pod)
        else {
            return format!("the local runtime runs no pod {namespace}/{pod}");
        };
        let mut out = format!(
            "{namespace}/{pod}: ready {}, restarts {}, dead for {:?}, processes {:?}\n",
            t.ready,
            t.restarts,
            t.died_at.map(|d| d.elapsed()),
            t.processes
                .iter()
                .map(|h| format!(
                    "{} {}",
                    h.name,
                    process::exited(h).unwrap_or_else(|| "running".into())
                ))
                .collect::<Vec<_>>()
        );
        for name in ["kine", "kube-apiserver", "kube-controller-manager"] {
            for file in [format!("{name}.previous.log"), format!("{name}.log")] {
                let text = std::fs::read_to_string(t.dir.join("logs").join(&file))
                    .unwrap_or_else(|e| format!("({e})"));
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(15)..].join("\n");
                out.push_str(&format!("--- {file} (last 15 lines)\n{tail}\n"));
            }
        }
        out
    }
}
