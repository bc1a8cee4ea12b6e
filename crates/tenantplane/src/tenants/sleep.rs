//! `sleep` and `wake`: both write the TenantCluster (as GitOps would), and the operator does
//! the rest. `sleep` sets `spec.sleep.asleep`; `wake` sets it back to false and writes the wake
//! annotation, which also wakes a tenant asleep for idleness. `connect` wakes the same way.

use std::time::Duration;

use kube::Client;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tenantplane_api::{Phase, TenantCluster};

use super::create::wait_for_phase;
use super::get;
use super::progress::phase_of;
use super::settled::{self, Leaving};
use crate::host::{explain, program};

/// Put tenant `name` to sleep; with `wait`, until it is Sleeping.
pub async fn sleep(
    client: &Client,
    namespace: &str,
    name: &str,
    wait: Option<Duration>,
) -> anyhow::Result<()> {
    let started = tokio::time::Instant::now();
    let tc = get(client, namespace, name).await?;
    let api: Api<TenantCluster> = Api::namespaced(client.clone(), namespace);
    let patched = if tc.spec.sleep.asleep {
        println!("TenantCluster {name} in namespace {namespace} is already asked to sleep");
        tc
    } else {
        let patch = json!({"spec": {"sleep": {"asleep": true}}});
        let patched = api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| explain(e, &format!("TenantCluster {name} in namespace {namespace}")))?;
        println!(
            "TenantCluster {name} in namespace {namespace} goes to sleep: its control plane stops and its pods leave the host; its objects, claims and Services stay"
        );
        patched
    };
    match wait {
        None => {
            println!(
                "Follow it with `{} status {name} -n {namespace}`; wake it with `{} wake {name} -n {namespace}`",
                program(),
                program()
            );
            Ok(())
        }
        Some(timeout) => {
            wait_for_phase(api, &patched, Phase::Sleeping, timeout, started).await?;
            // Sleeping once its control plane is scaled down; its pods leave after that.
            let deadline = started + timeout;
            settled::until_left(client, namespace, name, Leaving::Pods, deadline, started).await?;
            println!(
                "TenantCluster {name} in namespace {namespace} is Sleeping after {}s, no pod of it left",
                started.elapsed().as_secs()
            );
            Ok(())
        }
    }
}

/// Wake tenant `name`; with `wait`, until it is Ready.
pub async fn wake(
    client: &Client,
    namespace: &str,
    name: &str,
    wait: Option<Duration>,
) -> anyhow::Result<()> {
    let started = tokio::time::Instant::now();
    let api: Api<TenantCluster> = Api::namespaced(client.clone(), namespace);
    let tc = get(client, namespace, name).await?;
    let asleep = phase_of(&tc) == Some(Phase::Sleeping) || tc.spec.sleep.asleep;
    let patched = request_wake(client, namespace, name).await?;
    if asleep {
        println!("TenantCluster {name} in namespace {namespace} is waking up");
    } else {
        println!("TenantCluster {name} in namespace {namespace} is not asleep");
    }
    match wait {
        None => Ok(()),
        Some(timeout) => {
            let tc = wait_for_phase(api, &patched, Phase::Ready, timeout, started).await?;
            // Ready once it answers; its pods' copies are made again after that.
            let deadline = started + timeout;
            settled::until_running_again(client, namespace, name, deadline, started).await?;
            println!(
                "TenantCluster {} in namespace {namespace} is Ready after {}s, its pods running on the host",
                tc.name_any(),
                started.elapsed().as_secs()
            );
            Ok(())
        }
    }
}

/// How long a connection waits for a sleeping tenant to wake before it is refused with an error.
pub const WAKE_WITHIN: Duration = Duration::from_secs(120);

/// Whether `tc` sleeps, or is asked to.
pub fn is_asleep(tc: &TenantCluster) -> bool {
    tc.spec.sleep.asleep
        || tc
            .status
            .as_ref()
            .and_then(|s| s.sleep.as_ref())
            .is_some_and(|s| s.waking_since.is_none())
}

/// Wake tenant `name` if it sleeps, and wait (printing progress) until it is Ready, for at
/// most [`WAKE_WITHIN`]: what `connect` does before it forwards a connection. `Ok(false)`: it
/// was awake already.
pub async fn wake_if_asleep(client: &Client, namespace: &str, name: &str) -> anyhow::Result<bool> {
    let started = tokio::time::Instant::now();
    let tc = get(client, namespace, name).await?;
    let waking = tc
        .status
        .as_ref()
        .and_then(|s| s.sleep.as_ref())
        .is_some_and(|s| s.waking_since.is_some());
    if !is_asleep(&tc) && !waking {
        return Ok(false);
    }
    println!("TenantCluster {name} in namespace {namespace} is asleep: waking it up");
    let patched = request_wake(client, namespace, name).await?;
    let api: Api<TenantCluster> = Api::namespaced(client.clone(), namespace);
    wait_for_phase(api, &patched, Phase::Ready, WAKE_WITHIN, started).await?;
    println!(
        "TenantCluster {name} in namespace {namespace} woke up in {}s",
        started.elapsed().as_secs()
    );
    Ok(true)
}

/// Ask the operator to wake tenant `name`, as a request at its wake door does (the wake
/// annotation, and `spec.sleep.asleep` back to false when set). The object as written.
pub async fn request_wake(
    client: &Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<TenantCluster> {
    let tc = get(client, namespace, name).await?;
    tenantplane_controller::wake::request_wake(client, namespace, name, tc.spec.sleep.asleep)
        .await
        .map_err(|e| {
            anyhow::anyhow!("waking TenantCluster {name} in namespace {namespace}: {e}")
        })?;
    get(client, namespace, name).await
}
