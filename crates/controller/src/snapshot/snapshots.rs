//! TenantSnapshots, taken and deleted.
//!
//! A new snapshot waits (Pending) until its tenant is Ready, then (Running) the operator asks the
//! tenant's snapshot agent for a consistent copy and streams it into the store while hashing it,
//! checks size and hash against the agent's, writes the manifest, and says Completed with the
//! location, size, checksum, version and distribution. Any failure on the way removes what was
//! written and says Failed with the error; the tenant is not touched either way.
//!
//! A snapshot Running when the operator (re)starts, with no copy of this process behind it, is
//! taken again from the start, into the same objects. Deleting a TenantSnapshot deletes its
//! objects first (the finalizer); a store that cannot delete them keeps the object, saying why.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{Controller, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tenantplane_api::{Phase, SnapshotPhase, TenantCluster, TenantSnapshot, TenantSnapshotStatus};
use tracing::{info, warn};

use super::store::{Manifest, Objects, Store};
use super::{FINALIZER, SnapshotOptions, agent_client, copy};
use crate::api_message;
use crate::connector::Connector;
use crate::context::now;
use crate::names::{self, FIELD_MANAGER};
use crate::tenant_pki::TenantPki;

/// How long a snapshot waits for its tenant to be Ready before it fails.
pub const WAIT_FOR_TENANT: Duration = Duration::from_secs(600);

struct Ctx {
    client: Client,
    options: SnapshotOptions,
    connector: Connector,
    recorder: Recorder,
    /// Snapshots this process is copying now, by UID.
    running: Mutex<HashSet<String>>,
}

/// Take and delete TenantSnapshots (in `namespace`, or everywhere) until `shutdown` resolves.
pub async fn run(
    client: Client,
    options: SnapshotOptions,
    connector: Connector,
    namespace: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<TenantSnapshot> = match &namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let ctx = Arc::new(Ctx {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
        client,
        options,
        connector,
        running: Mutex::new(HashSet::new()),
    });
    Controller::new(api, watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(
            reconcile,
            |snap: Arc<TenantSnapshot>, e: &super::Error, _| {
                warn!(
                    tenant = %snap.spec.tenant_cluster_ref.name,
                    namespace = %snap.namespace().unwrap_or_default(),
                    snapshot = %snap.name_any(),
                    error = %crate::error_chain(e),
                    "taking or deleting the TenantSnapshot failed; retrying in 15s"
                );
                Action::requeue(Duration::from_secs(15))
            },
            ctx,
        )
        .for_each(|_| async {})
        .await;
}

async fn reconcile(snap: Arc<TenantSnapshot>, ctx: Arc<Ctx>) -> Result<Action, super::Error> {
    let ns = snap.namespace().unwrap_or_default();
    let api: Api<TenantSnapshot> = Api::namespaced(ctx.client.clone(), &ns);
    if snap.metadata.deletion_timestamp.is_some() {
        return delete(&snap, &api, &ctx).await;
    }
    if !snap.finalizers().iter().any(|f| f == FINALIZER) {
        let mut finalizers = snap.finalizers().to_vec();
        finalizers.push(FINALIZER.into());
        set_finalizers(&api, &snap, finalizers).await?;
        return Ok(Action::await_change());
    }
    let uid = snap.uid().unwrap_or_default();
    match snap.phase() {
        SnapshotPhase::Completed | SnapshotPhase::Failed => return Ok(Action::await_change()),
        SnapshotPhase::Running if is_running(&ctx, &uid) => return Ok(Action::await_change()),
        _ => {}
    }
    // Pending, or Running with nobody copying (the operator restarted): start (again).
    let tenant_name = snap.spec.tenant_cluster_ref.name.clone();
    let tenants: Api<TenantCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let tenant = match tenants.get_opt(&tenant_name).await {
        Ok(Some(t)) => t,
        Ok(None) => {
            return fail(
                &snap,
                &ctx,
                format!("TenantCluster {ns}/{tenant_name} does not exist"),
            )
            .await;
        }
        Err(e) => {
            return Err(super::Error::Step(format!(
                "reading TenantCluster {ns}/{tenant_name}: {}",
                api_message(&e)
            )));
        }
    };
    let phase = tenant
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .unwrap_or_default();
    if phase != Phase::Ready {
        let waited = snap
            .creation_timestamp()
            .map(|t| {
                let elapsed = k8s_openapi::jiff::Timestamp::now().duration_since(t.0);
                elapsed.as_secs().max(0) as u64
            })
            .unwrap_or(0);
        return match not_ready(&ns, &tenant_name, phase, waited) {
            NotReady::GiveUp(why) => fail(&snap, &ctx, why).await,
            NotReady::Wait(message) => {
                let status = TenantSnapshotStatus {
                    phase: Some(SnapshotPhase::Pending),
                    message: Some(message),
                    ..snap.status.clone().unwrap_or_default()
                };
                write_status(&ctx.client, &snap, &status).await?;
                Ok(Action::requeue(Duration::from_secs(5)))
            }
        };
    }
    let (store_object, store) = match super::open_store(
        &ctx.client,
        &ctx.options,
        snap.spec.store_ref.as_ref().map(|r| r.name.as_str()),
    )
    .await
    {
        Ok(s) => s,
        Err(e) => return fail(&snap, &ctx, e).await,
    };
    let objects = store.objects(&ns, &tenant_name, &snap.name_any(), &uid);
    let status = TenantSnapshotStatus {
        phase: Some(SnapshotPhase::Running),
        store: Some(store_object.name_any()),
        location: Some(store.location(&objects.data)),
        start_time: Some(now()),
        distribution: Some(tenant.spec.control_plane.distribution.to_string()),
        message: Some("copying the datastore".into()),
        ..Default::default()
    };
    // Marked running before the status says so: the status write wakes this reconcile again,
    // which must find the copy under way rather than start a second.
    mark_running(&ctx, &uid, true);
    if let Err(e) = write_status(&ctx.client, &snap, &status).await {
        mark_running(&ctx, &uid, false);
        return Err(e);
    }
    info!(namespace = %ns, snapshot = %snap.name_any(), tenant = %tenant_name, "taking a snapshot");
    tokio::spawn(copy_and_record(ctx, tenant, store, objects, snap, status));
    Ok(Action::await_change())
}

/// What a snapshot of a tenant that is not Ready does: waits, or gives up once it waited
/// `WAIT_FOR_TENANT`; a sleeping tenant's message says how to wake it.
#[derive(Debug, PartialEq)]
enum NotReady {
    Wait(String),
    GiveUp(String),
}

fn not_ready(ns: &str, tenant_name: &str, phase: Phase, waited_secs: u64) -> NotReady {
    let hint = if phase == Phase::Sleeping {
        format!("; wake it with `tenantplane wake {tenant_name} -n {ns}`")
    } else {
        String::new()
    };
    if waited_secs > WAIT_FOR_TENANT.as_secs() {
        NotReady::GiveUp(format!(
            "TenantCluster {tenant_name} was not Ready within {} (it is {phase}){hint}",
            names::human_duration(WAIT_FOR_TENANT.as_secs() as i64)
        ))
    } else {
        NotReady::Wait(format!(
            "waiting for TenantCluster {tenant_name} to be Ready (it is {phase}){hint}"
        ))
    }
}

/// Copy the datastore to the store, then write how it went (Completed or Failed, told by an
/// event) and let the snapshot's reconcile start again. A failed copy leaves nothing in the
/// store.
async fn copy_and_record(
    ctx: Arc<Ctx>,
    tenant: TenantCluster,
    store: Store,
    objects: Objects,
    snap: Arc<TenantSnapshot>,
    status: TenantSnapshotStatus,
) {
    let started = std::time::Instant::now();
    let result = take(&ctx, &tenant, &store, &objects, &snap).await;
    let final_status = match result {
        Ok(manifest) => {
            info!(snapshot = %snap.name_any(), size = manifest.size, seconds = started.elapsed().as_secs_f64(), "snapshot completed");
            publish(
                &ctx,
                &snap,
                EventType::Normal,
                "Completed",
                format!(
                    "{} bytes in {:.1}s to {}",
                    manifest.size,
                    started.elapsed().as_secs_f64(),
                    store.location(&objects.data)
                ),
            )
            .await;
            TenantSnapshotStatus {
                phase: Some(SnapshotPhase::Completed),
                size: Some(manifest.size as i64),
                checksum: Some(manifest.checksum),
                kubernetes_version: Some(manifest.kubernetes_version),
                key_id: manifest.encryption.map(|e| e.key_id),
                completion_time: Some(now()),
                message: None,
                ..status
            }
        }
        Err(e) => {
            // Nothing half-written stays in the store.
            let _ = store.delete(&objects.data).await;
            let _ = store.delete(&objects.manifest).await;
            let e = e.to_string();
            publish(&ctx, &snap, EventType::Warning, "Failed", e.clone()).await;
            TenantSnapshotStatus {
                phase: Some(SnapshotPhase::Failed),
                completion_time: Some(now()),
                message: Some(e),
                ..status
            }
        }
    };
    if let Err(e) = write_status(&ctx.client, &snap, &final_status).await {
        warn!(
            tenant = %tenant.name_any(),
            namespace = %tenant.namespace().unwrap_or_default(),
            snapshot = %snap.name_any(),
            error = %crate::error_chain(&e),
            "writing the TenantSnapshot's final status failed"
        );
    }
    mark_running(&ctx, &snap.uid().unwrap_or_default(), false);
}

/// Note that this operator copies the snapshot of `uid` now, or no longer.
fn mark_running(ctx: &Ctx, uid: &str, running: bool) {
    let mut all = ctx.running.lock().unwrap_or_else(|e| e.into_inner());
    if running {
        all.insert(uid.to_string());
    } else {
        all.remove(uid);
    }
}

fn is_running(ctx: &Ctx, uid: &str) -> bool {
    ctx.running
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(uid)
}

/// Copy the tenant's datastore into the store: agent → hash → store, then the manifest.
async fn take(
    ctx: &Ctx,
    tenant: &TenantCluster,
    store: &super::store::Store,
    objects: &super::store::Objects,
    snap: &TenantSnapshot,
) -> Result<Manifest, super::Error> {
    let ns = tenant.namespace().unwrap_or_default();
    let name = tenant.name_any();
    let pod = Api::<Pod>::namespaced(ctx.client.clone(), &ns)
        .get(&names::control_plane_pod(&name))
        .await
        .map_err(super::api("reading the control-plane pod"))?;
    if !crate::build::agent::runs_in(&pod) {
        return Err(format!(
            "the control-plane pod {} runs no snapshot agent: the operator made it without one (no --agent-image)",
            pod.name_any()
        ).into());
    }
    let address = ctx.connector.agent_address(&name, &pod)?;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let pki_secret = secrets
        .get(&names::pki_secret(&name))
        .await
        .map_err(super::api("reading the tenant's PKI Secret"))?;
    let pki = TenantPki::from_secret_data(&pki_secret.data.clone().unwrap_or_default())
        .map_err(|e| format!("the tenant's PKI Secret: {e}"))?;
    // The version that wrote the data: the running pod's (the spec may already name the next
    // one, held back until a pre-upgrade snapshot completes); its server's answer otherwise.
    let reported = tenant_version(ctx, tenant, &pod).await?;
    let version = crate::build::control_plane::running_version(&pod).unwrap_or(reported);
    let download = agent_client::download(&address, &pki).await?;
    // What passes is tallied as the database's bytes, then encrypted if the store has a key.
    let tally = copy::Tally::default();
    let plain = Box::pin(tally.tap(download.bytes));
    let (size, sha256) = match &store.key {
        Some(key) => store.upload(&objects.data, key.encrypt(plain)).await?,
        None => store.upload(&objects.data, plain).await?,
    };
    let (plain_size, plain_sha) = tally.take();
    if plain_size != download.size || !plain_sha.eq_ignore_ascii_case(&download.sha256) {
        return Err(format!(
            "the copy changed on its way: the agent sent {} bytes with sha256:{}, the operator passed on {plain_size} bytes with sha256:{plain_sha}",
            download.size, download.sha256
        ).into());
    }
    let manifest = Manifest {
        namespace: ns,
        tenant: name,
        snapshot: snap.name_any(),
        size,
        checksum: copy::checksum_text(&sha256),
        kubernetes_version: version,
        distribution: tenant.spec.control_plane.distribution.to_string(),
        created: k8s_openapi::jiff::Timestamp::now().to_string(),
        encryption: store
            .key
            .as_ref()
            .map(|key| super::store::ManifestEncryption {
                cipher: super::crypt::CIPHER.into(),
                key_id: key.id(),
                plaintext_size: plain_size,
                plaintext_checksum: copy::checksum_text(&plain_sha),
            }),
    };
    store.put_manifest(&objects.manifest, &manifest).await?;
    Ok(manifest)
}

/// The version the tenant's API server reports.
async fn tenant_version(
    ctx: &Ctx,
    tenant: &TenantCluster,
    pod: &Pod,
) -> Result<String, super::Error> {
    let ns = tenant.namespace().unwrap_or_default();
    let name = tenant.name_any();
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), &ns)
        .get(&names::kubeconfig_secret(&name))
        .await
        .map_err(super::api("reading the kubeconfig Secret"))?;
    let kubeconfig = crate::build::kubeconfig::require_operator_text(&secret)?;
    let server = ctx.connector.server(&name, &ns, pod)?;
    let client = ctx
        .connector
        .client(&kubeconfig, &name, &ns, &server)
        .await?;
    client
        .apiserver_version()
        .await
        .map(|v| v.git_version)
        .map_err(|e| {
            super::Error::Step(format!(
                "asking the tenant's API server for its version: {}",
                api_message(&e)
            ))
        })
}

async fn delete(
    snap: &TenantSnapshot,
    api: &Api<TenantSnapshot>,
    ctx: &Ctx,
) -> Result<Action, super::Error> {
    if !snap.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    if is_running(ctx, &snap.uid().unwrap_or_default()) {
        // The copy in flight finishes (or fails) first, then its objects go.
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    let status = snap.status.clone().unwrap_or_default();
    // A failed snapshot's objects went when it failed: a store that is down does not keep it.
    if let Some(store_name) = status
        .store
        .as_deref()
        .filter(|_| snap.phase() != SnapshotPhase::Failed)
    {
        let removed = async {
            let (_, store) = super::open_store(&ctx.client, &ctx.options, Some(store_name)).await?;
            let objects = store.objects_of(snap);
            store.delete(&objects.data).await?;
            store.delete(&objects.manifest).await?;
            Ok::<_, super::Error>(())
        }
        .await;
        if let Err(e) = removed {
            let message = format!(
                "cannot delete the stored snapshot yet: {e}; it is deleted once the store answers (remove the finalizer {FINALIZER} to keep the objects and drop this TenantSnapshot)"
            );
            let _ = write_status(
                &ctx.client,
                snap,
                &TenantSnapshotStatus {
                    message: Some(message.clone()),
                    ..status
                },
            )
            .await;
            return Err(super::Error::Step(message));
        }
    }
    let finalizers: Vec<String> = snap
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    set_finalizers(api, snap, finalizers).await?;
    Ok(Action::await_change())
}

/// The snapshot's finalizers, as of the version read (a conflict retries the reconcile).
async fn set_finalizers(
    api: &Api<TenantSnapshot>,
    snap: &TenantSnapshot,
    finalizers: Vec<String>,
) -> Result<(), super::Error> {
    api.patch(
        &snap.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {
            "finalizers": finalizers,
            "resourceVersion": snap.resource_version(),
        }})),
    )
    .await
    .map(|_| ())
    .map_err(super::api("updating the finalizers"))
}

async fn fail(
    snap: &TenantSnapshot,
    ctx: &Ctx,
    message: impl std::fmt::Display,
) -> Result<Action, super::Error> {
    let message = message.to_string();
    publish(ctx, snap, EventType::Warning, "Failed", message.clone()).await;
    let status = TenantSnapshotStatus {
        phase: Some(SnapshotPhase::Failed),
        completion_time: Some(now()),
        message: Some(message),
        ..snap.status.clone().unwrap_or_default()
    };
    write_status(&ctx.client, snap, &status).await?;
    Ok(Action::await_change())
}

async fn publish(ctx: &Ctx, snap: &TenantSnapshot, type_: EventType, reason: &str, note: String) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(tenantplane_api::text::bounded(&note)),
        action: "Snapshot".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &snap.object_ref(&())).await {
        warn!(
            tenant = %snap.spec.tenant_cluster_ref.name,
            namespace = %snap.namespace().unwrap_or_default(),
            snapshot = %snap.name_any(),
            reason,
            error = %crate::error_chain(&e),
            "publishing an event on the TenantSnapshot failed"
        );
    }
}

async fn write_status(
    client: &Client,
    snap: &TenantSnapshot,
    status: &TenantSnapshotStatus,
) -> Result<(), super::Error> {
    let api: Api<TenantSnapshot> =
        Api::namespaced(client.clone(), &snap.namespace().unwrap_or_default());
    super::apply_status(&api, &snap.name_any(), status).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_waits_for_its_tenant_then_gives_up_saying_how_to_wake_it() {
        let wait = not_ready("team-a", "dev", Phase::Provisioning, 10);
        assert_eq!(
            wait,
            NotReady::Wait("waiting for TenantCluster dev to be Ready (it is Provisioning)".into())
        );
        let late = WAIT_FOR_TENANT.as_secs() + 1;
        match not_ready("team-a", "dev", Phase::Sleeping, late) {
            NotReady::GiveUp(why) => {
                assert!(
                    why.starts_with("TenantCluster dev was not Ready within "),
                    "{why}"
                );
                assert!(
                    why.ends_with(
                        "(it is Sleeping); wake it with `tenantplane wake dev -n team-a`"
                    ),
                    "{why}"
                );
            }
            other => panic!("expected to give up, got {other:?}"),
        }
    }
}
