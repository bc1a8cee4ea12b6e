//! `tenantplane snapshot create|list|delete`: TenantSnapshots, written as GitOps would write
//! them; the operator takes and deletes the copies.

use std::time::Duration;

use anyhow::{anyhow, bail};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use tenantplane_api::snapshot::LocalRef;
use tenantplane_api::{SnapshotPhase, TenantSnapshot, TenantSnapshotSpec};

use crate::format;
use crate::host::{explain, program};

/// What `snapshot create` makes.
pub struct CreateOptions {
    pub namespace: String,
    pub tenant: String,
    pub name: Option<String>,
    pub store: Option<String>,
    pub wait: Option<Duration>,
}

/// A snapshot name for `tenant` now: `<tenant>-<yyyymmdd-hhmmss>`.
fn default_name(tenant: &str) -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    format!("{tenant}-{}", now.strftime("%Y%m%d-%H%M%S"))
}

pub async fn create(client: &Client, options: CreateOptions) -> anyhow::Result<()> {
    let started = tokio::time::Instant::now();
    let CreateOptions {
        namespace,
        tenant,
        name,
        store,
        wait,
    } = options;
    // The tenant must exist: say so now rather than in the snapshot's status.
    crate::tenants::get(client, &namespace, &tenant).await?;
    let name = name.unwrap_or_else(|| default_name(&tenant));
    let api: Api<TenantSnapshot> = Api::namespaced(client.clone(), &namespace);
    let snapshot = TenantSnapshot {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            ..Default::default()
        },
        spec: TenantSnapshotSpec {
            tenant_cluster_ref: LocalRef {
                name: tenant.clone(),
            },
            store_ref: store.map(|name| LocalRef { name }),
        },
        status: None,
    };
    api.create(&PostParams::default(), &snapshot)
        .await
        .map_err(|e| {
            explain(
                e,
                &format!("TenantSnapshot {name} in namespace {namespace}"),
            )
        })?;
    println!("TenantSnapshot {name} of TenantCluster {tenant} in namespace {namespace} created");
    let Some(timeout) = wait else {
        println!(
            "Follow it with `{} snapshot list -n {namespace}`",
            program()
        );
        return Ok(());
    };
    let done = wait_for(&api, &name, timeout, started).await?;
    let status = done.status.unwrap_or_default();
    println!(
        "TenantSnapshot {name} Completed after {}s: {} at {} ({}, Kubernetes {})",
        started.elapsed().as_secs(),
        size_text(status.size),
        format::or_none(status.location.as_deref()),
        format::or_none(status.checksum.as_deref()),
        format::or_none(status.kubernetes_version.as_deref()),
    );
    Ok(())
}

/// Follow snapshot `name` until Completed (Ok) or Failed (the message as the error), printing
/// a line at each change and every 10 s while it runs.
async fn wait_for(
    api: &Api<TenantSnapshot>,
    name: &str,
    timeout: Duration,
    started: tokio::time::Instant,
) -> anyhow::Result<TenantSnapshot> {
    let mut last = String::new();
    let mut said_at = started;
    loop {
        let snap = api
            .get(name)
            .await
            .map_err(|e| explain(e, &format!("TenantSnapshot {name}")))?;
        let phase = snap.phase();
        let message = snap
            .status
            .as_ref()
            .and_then(|s| s.message.clone())
            .unwrap_or_default();
        match phase {
            SnapshotPhase::Completed => return Ok(snap),
            SnapshotPhase::Failed => bail!("TenantSnapshot {name} Failed: {message}"),
            _ => {}
        }
        let line = if message.is_empty() {
            format!("{phase}: waiting for the operator to take it")
        } else {
            format!("{phase}: {message}")
        };
        let elapsed = started.elapsed();
        if line != last || said_at.elapsed() >= Duration::from_secs(10) {
            println!("[{:>3}s] {line}", elapsed.as_secs());
            last = line;
            said_at = tokio::time::Instant::now();
        }
        if elapsed >= timeout {
            bail!(
                "TenantSnapshot {name} is still {phase} after {}: {message}",
                format::show_duration(timeout)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn size_text(size: Option<i64>) -> String {
    match size {
        None => "<none>".into(),
        Some(b) if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        Some(b) if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        Some(b) if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        Some(b) => format!("{b} B"),
    }
}

/// The snapshots in `namespace` (or every namespace), of `tenant` if given.
pub async fn list(
    client: &Client,
    namespace: Option<&str>,
    tenant: Option<&str>,
) -> anyhow::Result<()> {
    let api: Api<TenantSnapshot> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let mut items = api
        .list(&ListParams::default())
        .await
        .map_err(|e| explain(e, "TenantSnapshots"))?
        .items;
    items.retain(|s| tenant.is_none_or(|t| s.spec.tenant_cluster_ref.name == t));
    items.sort_by_key(|s| s.creation_timestamp().map(|t| t.0));
    if items.is_empty() {
        match namespace {
            Some(ns) => println!("No snapshots found in namespace {ns}."),
            None => println!("No snapshots found."),
        }
        return Ok(());
    }
    let mut header = vec!["NAME", "TENANT", "PHASE", "SIZE", "VERSION", "STORE", "AGE"];
    if namespace.is_none() {
        header.insert(0, "NAMESPACE");
    }
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|s| {
            let status = s.status.clone().unwrap_or_default();
            let mut row = vec![
                s.name_any(),
                s.spec.tenant_cluster_ref.name.clone(),
                s.phase().to_string(),
                size_text(status.size),
                format::or_none(status.kubernetes_version.as_deref()),
                format::or_none(status.store.as_deref()),
                format::age(s.creation_timestamp().as_ref()),
            ];
            if namespace.is_none() {
                row.insert(0, s.namespace().unwrap_or_default());
            }
            row
        })
        .collect();
    print!("{}", format::table(&header, &rows));
    // A failed snapshot's reason is what a person needs next.
    for s in items.iter().filter(|s| s.phase() == SnapshotPhase::Failed) {
        if let Some(message) = s.status.as_ref().and_then(|st| st.message.as_deref()) {
            println!("{} failed: {message}", s.name_any());
        }
    }
    Ok(())
}

/// Delete snapshot `name` (the operator deletes its stored objects first); with `wait`, until
/// it is gone.
pub async fn delete(
    client: &Client,
    namespace: &str,
    name: &str,
    wait: Option<Duration>,
) -> anyhow::Result<()> {
    let started = tokio::time::Instant::now();
    let api: Api<TenantSnapshot> = Api::namespaced(client.clone(), namespace);
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {
            return Err(anyhow!(
                "TenantSnapshot {name} not found in namespace {namespace}; list them with `{} snapshot list -n {namespace}`",
                program()
            ));
        }
        Err(e) => return Err(explain(e, &format!("TenantSnapshot {name}"))),
    }
    println!(
        "TenantSnapshot {name} in namespace {namespace} is being deleted, with its stored copy"
    );
    let Some(timeout) = wait else {
        return Ok(());
    };
    let mut said_at = started;
    loop {
        match api.get_opt(name).await {
            Ok(None) => {
                println!(
                    "TenantSnapshot {name} and its stored copy are gone after {}s",
                    started.elapsed().as_secs()
                );
                return Ok(());
            }
            Ok(Some(s)) => {
                let message = s
                    .status
                    .as_ref()
                    .and_then(|st| st.message.clone())
                    .unwrap_or_else(|| "deleting the stored copy".into());
                if started.elapsed() >= timeout {
                    bail!(
                        "TenantSnapshot {name} is still there after {}: {message}",
                        format::show_duration(timeout)
                    );
                }
                if said_at.elapsed() >= Duration::from_secs(10) {
                    println!("[{:>3}s] {message}", started.elapsed().as_secs());
                    said_at = tokio::time::Instant::now();
                }
            }
            Err(e) => return Err(explain(e, &format!("TenantSnapshot {name}"))),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(size_text(Some(512)), "512 B");
        assert_eq!(size_text(Some(3 << 20)), "3.0 MiB");
        assert_eq!(size_text(None), "<none>");
        assert!(default_name("dev").starts_with("dev-20"));
    }
}
