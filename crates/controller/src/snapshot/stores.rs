//! SnapshotStores, checked: on every change of a store and every few minutes, the operator
//! writes, reads back and deletes a probe object, and says in the `Available` condition whether
//! that worked, with the store's own error when it did not.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::{Controller, WatchStreamExt, predicates, watcher};
use kube::{Client, ResourceExt};
use tenantplane_api::conditions::{self, ConditionSpec};
use tenantplane_api::snapshot::STORE_AVAILABLE;
use tenantplane_api::{SnapshotStore, SnapshotStoreStatus};
use tracing::{info, warn};

use super::SnapshotOptions;
use crate::context::now;

/// How often an available store is checked again; a failing one, sooner.
pub const RECHECK: Duration = Duration::from_secs(300);
/// How often a failing store is checked again.
pub const RECHECK_FAILING: Duration = Duration::from_secs(30);

struct Ctx {
    client: Client,
    options: SnapshotOptions,
    /// A namespaced operator (one watching one namespace) checks only the stores whose
    /// credentials it finds in its own namespace: another operator's stores are not its own.
    namespaced: bool,
}

/// Check SnapshotStores until `shutdown` resolves.
pub async fn run(
    client: Client,
    options: SnapshotOptions,
    namespaced: bool,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<SnapshotStore> = Api::all(client.clone());
    // A status write changes no generation: only spec changes (and the timer) check again.
    let (reader, writer) = kube::runtime::reflector::store::<SnapshotStore>();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .touched_objects()
        .predicate_filter(predicates::generation, Default::default());
    let ctx = Arc::new(Ctx {
        client,
        options,
        namespaced,
    });
    Controller::for_stream(stream, reader)
        .graceful_shutdown_on(shutdown)
        .run(
            reconcile,
            |store: Arc<SnapshotStore>, e: &super::Error, _| {
                warn!(
                    store = %store.name_any(),
                    error = %crate::error_chain(e),
                    "checking the SnapshotStore failed; checking again in {}s",
                    RECHECK_FAILING.as_secs()
                );
                Action::requeue(RECHECK_FAILING)
            },
            ctx,
        )
        .for_each(|_| async {})
        .await;
}

async fn reconcile(store: Arc<SnapshotStore>, ctx: Arc<Ctx>) -> Result<Action, super::Error> {
    let name = store.name_any();
    let verdict = async {
        let secret = super::credentials(&ctx.client, &ctx.options, &store).await?;
        let connected = super::store::Store::connect(&store.spec, &secret)?;
        let operator = std::env::var("POD_NAME").unwrap_or_else(|_| "operator".into());
        connected.probe(&operator).await?;
        Ok::<_, super::Error>(format!(
            "the operator wrote, read back and deleted a probe object in bucket {}",
            store.spec.s3.bucket
        ))
    }
    .await;
    if ctx.namespaced
        && let Err(e) = &verdict
        && e.is_secret_missing()
    {
        // Not this operator's store.
        return Ok(Action::await_change());
    }
    let (condition, next) = match &verdict {
        Ok(message) => (
            ConditionSpec::new(STORE_AVAILABLE, true, "Checked", message.clone()),
            RECHECK,
        ),
        Err(e) => (
            ConditionSpec::new(STORE_AVAILABLE, false, "Unreachable", e.to_string()),
            RECHECK_FAILING,
        ),
    };
    let mut status = store.status.clone().unwrap_or_default();
    let was = conditions::find(&status.conditions, STORE_AVAILABLE).map(|c| c.status.clone());
    let checked = now();
    conditions::set(
        &mut status.conditions,
        &condition,
        store.metadata.generation,
        &checked,
    );
    status.last_checked = Some(checked);
    status.observed_generation = store.metadata.generation;
    write_status(&ctx.client, &name, &status).await?;
    let is = conditions::find(&status.conditions, STORE_AVAILABLE).map(|c| c.status.clone());
    if was != is {
        match &verdict {
            Ok(_) => info!(store = %name, "SnapshotStore is available"),
            Err(e) => {
                warn!(store = %name, error = %crate::error_chain(e), "SnapshotStore is not available");
            }
        }
    }
    Ok(Action::requeue(next))
}

async fn write_status(
    client: &Client,
    name: &str,
    status: &SnapshotStoreStatus,
) -> Result<(), super::Error> {
    let api: Api<SnapshotStore> = Api::all(client.clone());
    super::apply_status(&api, name, status).await
}
