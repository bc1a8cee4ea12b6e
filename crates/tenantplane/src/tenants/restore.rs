//! `restore` and `rollback`: both write `spec.restore` of the TenantCluster (as GitOps would) and
//! the operator does the rest; `rollback` also puts back the version the tenant ran before its
//! last upgrade, with the snapshot taken before it. `--wait` follows `status.restore`.

use std::time::Duration;

use anyhow::{Context as _, bail};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tenantplane_api::{Phase, RestorePhase, SnapshotPhase, TenantCluster, TenantSnapshot};

use super::get;
use super::progress::phase_of;
use super::settled;
use crate::host::{explain, program};

/// What `restore` is asked.
pub struct RestoreOptions {
    pub namespace: String,
    pub name: String,
    pub snapshot: String,
    /// The snapshot's namespace, when not the tenant's.
    pub snapshot_namespace: Option<String>,
    pub yes: bool,
    pub wait: Option<Duration>,
}

/// Roll tenant `name` back to a snapshot, in place.
pub async fn restore(client: &Client, options: RestoreOptions) -> anyhow::Result<()> {
    let RestoreOptions {
        namespace,
        name,
        snapshot,
        snapshot_namespace,
        yes,
        wait,
    } = options;
    let tc = get(client, &namespace, &name).await?;
    let snapshot_ns = snapshot_namespace.unwrap_or_else(|| namespace.clone());
    let snap = completed_snapshot(client, &snapshot_ns, &snapshot).await?;
    let taken = snap
        .status
        .as_ref()
        .and_then(|s| s.completion_time.as_ref())
        .map(|t| t.0.to_string())
        .unwrap_or_default();
    if !yes {
        bail!(
            "restoring replaces everything in TenantCluster {name} (namespace {namespace}) with snapshot {snapshot_ns}/{snapshot}, taken {taken}: what was created or changed since is lost, and its control plane restarts. Run again with --yes to go ahead"
        );
    }
    let spec = json!({"restore": {
        "snapshotRef": {"name": snapshot, "namespace": (snapshot_ns != namespace).then_some(&snapshot_ns)},
        "requestedAt": now(),
    }});
    let patched = patch(client, &namespace, &name, spec).await?;
    println!(
        "TenantCluster {name} in namespace {namespace}: restoring snapshot {snapshot_ns}/{snapshot} (taken {taken}); the operator checks it before it touches anything"
    );
    if tc.spec.sleep.asleep || phase_of(&tc) == Some(Phase::Sleeping) {
        println!(
            "It is asleep: the restore is put in place when it wakes (`{} wake {name} -n {namespace}`)",
            program()
        );
    }
    follow(client, &patched, wait).await
}

/// Undo tenant `name`'s last upgrade: its snapshot from before the upgrade, at the old version.
pub async fn rollback(
    client: &Client,
    namespace: &str,
    name: &str,
    yes: bool,
    wait: Option<Duration>,
) -> anyhow::Result<()> {
    let tc = get(client, namespace, name).await?;
    let Some(upgrade) = tc.status.as_ref().and_then(|s| s.upgrade.clone()) else {
        bail!(
            "TenantCluster {name} in namespace {namespace} has no upgrade to roll back (status.upgrade is empty): the operator records one when spec.kubernetesVersion moves to a new minor with a SnapshotStore to guard it"
        );
    };
    let Some(snapshot) = upgrade.snapshot.clone() else {
        bail!(
            "the upgrade of TenantCluster {name} from {} to {} has no snapshot to roll back to{}",
            upgrade.from,
            upgrade.to,
            upgrade
                .message
                .as_deref()
                .map(|m| format!(": {m}"))
                .unwrap_or_default()
        );
    };
    completed_snapshot(client, namespace, &snapshot).await?;
    if !yes {
        bail!(
            "rolling back puts TenantCluster {name} (namespace {namespace}) back at {} with snapshot {snapshot}, taken before the upgrade to {}: what was created or changed since is lost. Run again with --yes to go ahead",
            upgrade.from,
            upgrade.to
        );
    }
    let spec = json!({
        "kubernetesVersion": upgrade.from,
        "restore": {"snapshotRef": {"name": snapshot}, "requestedAt": now()},
    });
    let patched = patch(client, namespace, name, spec).await?;
    println!(
        "TenantCluster {name} in namespace {namespace}: rolling back to {} with snapshot {snapshot}",
        upgrade.from
    );
    follow(client, &patched, wait).await
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// The snapshot, if it is there and Completed; otherwise an error that says what to do.
pub(crate) async fn completed_snapshot(
    client: &Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<TenantSnapshot> {
    let snap = Api::<TenantSnapshot>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|e| explain(e, &format!("TenantSnapshot {name} in namespace {namespace}")))?
        .with_context(|| {
            format!(
                "TenantSnapshot {name} not found in namespace {namespace}; list them with `{} snapshot list -n {namespace}`",
                program()
            )
        })?;
    if snap.phase() != SnapshotPhase::Completed {
        bail!(
            "TenantSnapshot {name} in namespace {namespace} is {}, not Completed; only a completed snapshot restores",
            snap.phase()
        );
    }
    Ok(snap)
}

async fn patch(
    client: &Client,
    namespace: &str,
    name: &str,
    spec: serde_json::Value,
) -> anyhow::Result<TenantCluster> {
    let api: Api<TenantCluster> = Api::namespaced(client.clone(), namespace);
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": spec })),
    )
    .await
    .map_err(|e| match e {
        kube::Error::Api(status) if status.code == 422 || status.code == 400 => anyhow::anyhow!(
            "the API server refused the change to TenantCluster {name}: {}",
            status.message.trim()
        ),
        e => explain(e, &format!("TenantCluster {name} in namespace {namespace}")),
    })
}

/// With `wait`: a line each time the restore's message or the tenant's phase changes, until the
/// restore is Completed and the tenant Ready (exit 0) or the restore Failed (exit 1).
async fn follow(
    client: &Client,
    patched: &TenantCluster,
    wait: Option<Duration>,
) -> anyhow::Result<()> {
    let name = patched.metadata.name.clone().unwrap_or_default();
    let namespace = patched.metadata.namespace.clone().unwrap_or_default();
    let Some(timeout) = wait else {
        println!(
            "Follow it with `{} status {name} -n {namespace}` (status.restore and the Restored condition)",
            program()
        );
        return Ok(());
    };
    let started = tokio::time::Instant::now();
    let request = patched.spec.restore.clone();
    let mut last = String::new();
    loop {
        let tc = get(client, &namespace, &name).await?;
        let restore = tc
            .status
            .as_ref()
            .and_then(|s| s.restore.clone())
            .filter(|r| {
                request.as_ref().is_some_and(|q| {
                    r.requested_at == q.requested_at && r.snapshot.ends_with(&q.snapshot_ref.name)
                })
            });
        let phase = phase_of(&tc);
        let line = match &restore {
            Some(r) => format!(
                "{} — {}",
                r.phase.unwrap_or_default(),
                r.message.clone().unwrap_or_default()
            ),
            None => "waiting for the operator to take the request".to_string(),
        };
        let line = match phase {
            Some(p) => format!("{line} (tenant {p})"),
            None => line,
        };
        if line != last {
            println!("[{:>3}s] {line}", started.elapsed().as_secs());
            last = line;
        }
        match restore.as_ref().and_then(|r| r.phase) {
            Some(RestorePhase::Failed) => bail!(
                "the restore of TenantCluster {name} failed: {}",
                restore.and_then(|r| r.message).unwrap_or_default()
            ),
            Some(RestorePhase::Completed) if phase == Some(Phase::Ready) => {
                // The tenant shows its pods as the snapshot had them; their copies follow.
                let deadline = started + timeout;
                settled::until_running_again(client, &namespace, &name, deadline, started).await?;
                println!(
                    "TenantCluster {name} in namespace {namespace} is restored and Ready after {}s, its pods running on the host",
                    started.elapsed().as_secs()
                );
                return Ok(());
            }
            _ => {}
        }
        if started.elapsed() > timeout {
            bail!(
                "TenantCluster {name} in namespace {namespace} is not restored after {}s: {last}",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
