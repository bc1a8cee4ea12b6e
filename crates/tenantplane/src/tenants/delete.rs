//! `delete`, and `--wait` until the operator has cleaned up and the tenant's pods and claims have
//! left its namespace.

use std::time::Duration;

use anyhow::bail;
use futures::StreamExt;
use kube::api::{Api, DeleteParams};
use kube::{Client, ResourceExt};
use tenantplane_api::TenantCluster;

use super::progress::{fatal_watch_error, watch_one};
use super::settled::{self, Leaving};
use crate::format::show_duration;
use crate::host::{explain, is_not_found, tenant_not_found};

pub async fn delete(
    client: &Client,
    namespace: &str,
    name: &str,
    wait: Option<Duration>,
) -> anyhow::Result<()> {
    let started = tokio::time::Instant::now();
    let api: Api<TenantCluster> = Api::namespaced(client.clone(), namespace);
    let what = format!("TenantCluster {name} in namespace {namespace}");
    let deleting = match api.delete(name, &DeleteParams::default()).await {
        Ok(either) => either,
        Err(e) if is_not_found(&e) => return Err(tenant_not_found(name, namespace)),
        Err(e) => return Err(explain(e, &what)),
    };
    // Gone at once when no finalizer holds it; else the object, now with a deletion timestamp.
    let Some(tc) = deleting.left() else {
        println!("{what} deleted");
        return Ok(());
    };
    let Some(timeout) = wait else {
        println!(
            "{what} is being deleted; its control plane, kubeconfig and isolation objects go with it (add --wait to wait for it)"
        );
        return Ok(());
    };
    println!("{what} is being deleted; waiting for the operator to clean up");
    let uid = tc.uid();
    let mut latest = tc;
    let mut updates = watch_one(api, name).boxed();
    let deadline = started + timeout;
    loop {
        let update = tokio::select! {
            update = updates.next() => update,
            _ = tokio::time::sleep_until(deadline) => {
                let finalizers = latest.finalizers().join(", ");
                bail!(
                    "{what} is still there after {}, held by finalizers [{finalizers}]; the operator removes tenantplane.io/cleanup: is it running?",
                    show_duration(timeout)
                );
            }
        };
        match update {
            None => bail!("the watch on {what} ended"),
            Some(Err(e)) => {
                if let Some(fatal) = fatal_watch_error(&e) {
                    bail!(fatal);
                }
            }
            Some(Ok(Some(tc))) if tc.uid() == uid => latest = tc,
            Some(Ok(_)) => break,
        }
    }
    // Gone from the API; its pods and claims go after it.
    settled::until_left(
        client,
        namespace,
        name,
        Leaving::PodsAndClaims,
        deadline,
        started,
    )
    .await?;
    println!(
        "{what} deleted after {}s, with its pods and claims",
        started.elapsed().as_secs()
    );
    Ok(())
}
