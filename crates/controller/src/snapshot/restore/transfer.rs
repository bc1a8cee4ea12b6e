//! The restore's transfer: where the pod's restore step stands (asked of its agent), and the
//! snapshot sent from the store to it in a task, tried three times, its result kept for the next
//! reconcile (see the parent module).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::Api;
use kube::{Client, ResourceExt};
use tenantplane_api::{RestoreStatus, TenantCluster, TenantSnapshot};

use super::super::{SnapshotOptions, agent_client, copy};
use super::readable_with;
use crate::context::{Context, TenantKey, tenant_key};
use crate::names;
use crate::snapshot::agent::RestoreState;
use crate::tenant_pki::TenantPki;

/// How often a transfer is tried before the restore is given up.
const ATTEMPTS: u32 = 3;

/// Transfers under way in this process, by tenant; their result once done.
#[derive(Default)]
pub struct Transfers(Mutex<HashMap<TenantKey, Transfer>>);

pub(super) enum Transfer {
    Running,
    Done(Outcome),
}

/// How a restore's transfer ended.
#[derive(Debug, PartialEq)]
pub(super) enum Outcome {
    /// The snapshot is in place: how it got there, as the status says it.
    Restored(String),
    /// The restore was given up: why, as the agent or the last attempt said it.
    Abandoned(String),
}

impl Transfers {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TenantKey, Transfer>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub(super) enum Where {
    /// Not there yet: what the restore waits for.
    NotYet(String),
    /// The pod's init container waits for the snapshot at `address`.
    Waiting {
        address: String,
        pki: Box<TenantPki>,
    },
    /// The pod's agent says how it ended.
    Finished(Outcome),
}

/// Where restore `id` stands in the control-plane pod.
pub(super) async fn where_is(tc: &TenantCluster, ctx: &Context, id: &str) -> Where {
    let ns = tc.namespace().unwrap_or_default();
    let tenant = tc.name_any();
    let pod_name = names::control_plane_pod(&tenant);
    let waiting = |what: String| Where::NotYet(format!("waiting for {what}"));
    let pod = match Api::<Pod>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&pod_name)
        .await
    {
        Ok(pod) => pod,
        Err(e) => {
            return Where::NotYet(
                super::super::api(format!("reading pod {pod_name}"))(e).to_string(),
            );
        }
    };
    let Some(pod) = pod.filter(|p| p.metadata.deletion_timestamp.is_none()) else {
        return waiting(format!("pod {pod_name} to start with the restore"));
    };
    if crate::build::agent::pending_restore(&pod).as_deref() != Some(id) {
        return waiting(format!(
            "pod {pod_name} to be replaced by one that carries the restore"
        ));
    }
    let address = match ctx.options.connector.agent_address(&tenant, &pod) {
        Ok(address) => address,
        Err(e) => return waiting(format!("the pod's restore step: {e}")),
    };
    let pki = match pki(&ctx.client, &ns, &tenant).await {
        Ok(pki) => pki,
        Err(e) => return Where::NotYet(e.to_string()),
    };
    match agent_client::restore_state(&address, &pki, id).await {
        Err(e) => waiting(format!("the pod's restore step: {e}")),
        Ok(RestoreState::Waiting) => Where::Waiting {
            address,
            pki: Box::new(pki),
        },
        Ok(RestoreState::Restored(sha)) => Where::Finished(Outcome::Restored(format!(
            "the pod put it in place ({})",
            copy::checksum_text(&sha)
        ))),
        Ok(RestoreState::Abandoned(why)) => Where::Finished(Outcome::Abandoned(why)),
        Ok(RestoreState::Unknown) => waiting(format!("pod {pod_name}'s restore step to start")),
    }
}

async fn pki(client: &Client, ns: &str, tenant: &str) -> Result<TenantPki, super::super::Error> {
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get(&names::pki_secret(tenant))
        .await
        .map_err(super::super::api("reading the tenant's PKI Secret"))?;
    TenantPki::from_secret_data(&secret.data.unwrap_or_default())
        .map_err(|e| super::super::Error::Step(format!("the tenant's PKI Secret: {e}")))
}

/// Send the snapshot to the waiting pod in a task; its result waits in the context's [`Transfers`] for the
/// next reconcile.
pub(super) fn start_transfer(
    tc: &TenantCluster,
    ctx: &Context,
    current: &RestoreStatus,
    address: String,
    pki: Box<TenantPki>,
) {
    let key = tenant_key(tc);
    ctx.state::<Transfers>()
        .lock()
        .insert(key.clone(), Transfer::Running);
    let client = ctx.client.clone();
    let options = ctx.options.snapshots.clone();
    let restores = ctx.state::<Transfers>();
    let snapshot = current.snapshot.clone();
    let checksum = current.checksum.clone().unwrap_or_default();
    let id = current.id.clone().unwrap_or_default();
    tokio::spawn(async move {
        let started = std::time::Instant::now();
        let mut last = String::new();
        let mut result = None;
        for attempt in 1..=ATTEMPTS {
            match transfer(&client, &options, &snapshot, &checksum, &address, &pki).await {
                Ok(size) => {
                    result = Some(Outcome::Restored(format!(
                        "{size} bytes in {:.1}s",
                        started.elapsed().as_secs_f64()
                    )));
                    break;
                }
                Err(e) => {
                    tracing::warn!(tenant = %key.1, namespace = %key.0, %snapshot, attempt, error = %crate::error_chain(&e), "restore: sending the snapshot to the pod failed");
                    // An answer lost on the way (the pod put it in place, then went on).
                    if let Ok(RestoreState::Restored(sha)) =
                        agent_client::restore_state(&address, &pki, &id).await
                    {
                        result = Some(Outcome::Restored(format!(
                            "the pod put it in place ({})",
                            copy::checksum_text(&sha)
                        )));
                        break;
                    }
                    last = e.to_string();
                    if attempt < ATTEMPTS {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                }
            }
        }
        let result = match result {
            Some(r) => r,
            None => {
                let why = format!("{ATTEMPTS} attempts to send it failed; the last: {last}");
                // The pod goes on with the data it had (none, for a new tenant, whose status
                // says the control plane waits: its init container is not released).
                if let Err(e) = agent_client::abandon(&address, &pki, &why).await {
                    tracing::warn!(tenant = %key.1, namespace = %key.0, %snapshot, error = %crate::error_chain(&e), "restore: telling the pod to give the restore up failed");
                }
                Outcome::Abandoned(why)
            }
        };
        restores.lock().insert(key, Transfer::Done(result));
    });
}

/// One transfer: the stored object streamed to the agent, which checks it against `checksum`.
async fn transfer(
    client: &Client,
    options: &SnapshotOptions,
    snapshot: &str,
    checksum: &str,
    address: &str,
    pki: &TenantPki,
) -> Result<u64, super::super::Error> {
    let (snapshot_ns, name) = snapshot.split_once('/').unwrap_or(("", snapshot));
    let snap = Api::<TenantSnapshot>::namespaced(client.clone(), snapshot_ns)
        .get(name)
        .await
        .map_err(super::super::api(format!(
            "reading TenantSnapshot {snapshot}"
        )))?;
    let status = snap.status.clone().unwrap_or_default();
    let (_, store) = super::super::open_store(client, options, status.store.as_deref()).await?;
    let objects = store.objects_of(&snap);
    let manifest = store.manifest(&objects.manifest).await?;
    let stored = store.download(&objects.data).await?;
    // The pod receives the database's own bytes: decrypted here when the store encrypted them.
    let (bytes, size, sha256) = match &manifest.encryption {
        Some(encryption) => (
            readable_with(&store, encryption)?
                .decrypt(stored)
                .map_err(std::io::Error::other)
                .boxed(),
            encryption.plaintext_size,
            encryption.plaintext_checksum.clone(),
        ),
        None => (
            stored.map_err(std::io::Error::other).boxed(),
            status.size.unwrap_or_default() as u64,
            checksum.to_string(),
        ),
    };
    agent_client::upload(
        address,
        pki,
        sha256.trim_start_matches("sha256:"),
        size,
        bytes,
    )
    .await?;
    Ok(size)
}
