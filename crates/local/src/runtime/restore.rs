//! A control-plane pod whose init container waits for a restore: as a kubelet would, the local
//! runtime runs that init container (the agent with `--restore=<id>`) before anything else, and
//! starts the rest only once it has put the restore in place (or been told to give it up).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tenantplane_controller::build::agent;
use tenantplane_controller::names;
use tenantplane_controller::snapshot::agent::restored_mark;

use tenantplane_testenv::Binaries;
use tenantplane_testenv::process::{self, Handle, free_port};
use tenantplane_testenv::{Error, Result};

/// The restore init containers running, by pod UID.
#[derive(Clone, Default)]
pub(super) struct Restores(Arc<Mutex<HashMap<String, Handle>>>);

impl Restores {
    /// `Ok` once the pod's restore (if it has one) is done and the rest may start; otherwise
    /// its init container runs (started here, its address on the pod for the operator) and the
    /// error says what it waits for.
    pub(super) async fn done(
        &self,
        client: &Client,
        binaries: &Binaries,
        pod: &Pod,
        database: &Path,
        tls: &Path,
        scratch: &Path,
    ) -> Result<()> {
        let uid = pod.uid().unwrap_or_default();
        let Some(id) = agent::pending_restore(pod) else {
            return Ok(());
        };
        if restored_mark(database, &id).exists() {
            if let Some(h) = self.lock().remove(&uid) {
                process::stop(&h);
            }
            return Ok(());
        }
        let Some(program) = binaries.agent().map(|a| a.binary.as_path()) else {
            return Err(Error::Io(format!(
                "pod {} waits for restore {id} but the test world runs no snapshot agent",
                pod.name_any()
            )));
        };
        let running = self
            .lock()
            .get(&uid)
            .is_some_and(|h| process::exited(h).is_none());
        if !running {
            let port = free_port()?;
            let args = vec![
                "agent".to_string(),
                format!("--listen=127.0.0.1:{port}"),
                format!("--database={}", database.display()),
                format!("--pki={}", tls.display()),
                format!("--scratch={}", scratch.display()),
                format!("--restore={id}"),
            ];
            let log = tls
                .parent()
                .unwrap_or(tls)
                .join("logs")
                .join("snapshot-restore.log");
            if let Some(dir) = log.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let handle = process::spawn("tenant-snapshot-restore", program, &args, &[], &log)?;
            self.lock().insert(uid, handle);
            // As the pod's address would be: where the operator finds the init container.
            Api::<Pod>::namespaced(client.clone(), &pod.namespace().unwrap_or_default())
                .patch(
                    &pod.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {
                        names::ANNOTATION_LOCAL_AGENT: format!("127.0.0.1:{port}"),
                    }}})),
                )
                .await?;
        }
        Err(Error::Io(format!(
            "its init container waits for restore {id} from the operator"
        )))
    }

    /// Stop the init container of a pod that goes.
    pub(super) fn stop(&self, uid: &str) {
        if let Some(h) = self.lock().remove(uid) {
            process::stop(&h);
        }
    }

    pub(super) fn stop_all(&self) {
        for (_, h) in self.lock().drain() {
            process::stop(&h);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Handle>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}
