//! Restores: a TenantSnapshot put in place of a tenant's datastore, in place (a rollback) or into
//! a new TenantCluster, as `spec.restore` asks.
//!
//! 1. **Checked before anything is touched.** The snapshot must be Completed, in this namespace
//!    or granted to it, in a store the operator can read, its manifest and its bytes matching its
//!    checksum (the whole object is read and hashed), and not of a newer Kubernetes minor than
//!    the tenant runs. A refusal says why in `status.restore` and the `Restored` condition; the
//!    tenant runs on as it was.
//! 2. **Restoring.** The syncer stops (host copies stay), `status.restore.id` goes into the pod
//!    template, and the new pod's init container (the agent with `--restore=<id>`) waits. The
//!    operator streams the object from the store to it; the agent checks the hash and the file
//!    and renames it over the database, or leaves the database as it was.
//! 3. **Done.** The pod starts on the restored data and a fresh syncer converges the host to it:
//!    copies of objects the snapshot does not hold go, and its objects get copies.
//!
//! Only the reconcile writes `status.restore`; the transfer runs in a task whose result the
//! next reconcile reads. An operator that restarts mid-transfer finds the pod still waiting and
//! sends the snapshot again; one that restarts after it asks the pod's agent how it went.
//! A transfer that fails three times gives the restore up: an existing tenant goes on with the
//! data it had, a new one waits for another `spec.restore`.

use futures::{StreamExt, TryStreamExt};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;
use tenantplane_api::{
    Phase, Restore, RestorePhase, RestoreStatus, SnapshotPhase, TenantCluster, TenantSnapshot,
};

use super::copy;
use crate::api_message;
use crate::context::{Context, now, tenant_key};

/// The annotation on a TenantSnapshot that lets TenantClusters of other namespaces restore it:
/// a comma-separated list of namespaces.
pub const RESTORE_TO: &str = "tenantplane.io/restore-to";

/// What the reconcile does about restores.
pub(crate) enum Step {
    /// No restore under way: the tenant runs (on the data of the last restore, if any).
    Settled,
    /// A restore is under way: the control plane is applied (with the restore in its pod) but
    /// not waited for, the syncer stays stopped; `detail` says where it is.
    Restoring(String),
}

/// Look at `spec.restore` and move the restore on, writing what happened into
/// `tc.status.restore` (which the reconcile's status write carries).
pub(crate) async fn step(tc: &mut TenantCluster, ctx: &Context) -> Step {
    let Some(request) = tc.spec.restore.clone() else {
        return Step::Settled;
    };
    let ns = tc.namespace().unwrap_or_default();
    let snapshot_ns = request
        .snapshot_ref
        .namespace
        .clone()
        .unwrap_or_else(|| ns.clone());
    let snapshot_key = format!("{snapshot_ns}/{}", request.snapshot_ref.name);
    let status = tc.status.as_ref().and_then(|s| s.restore.clone());
    let same = status
        .as_ref()
        .is_some_and(|s| s.snapshot == snapshot_key && s.requested_at == request.requested_at);
    let current = match status {
        Some(s) if same && s.phase != Some(RestorePhase::Restoring) => return Step::Settled,
        Some(s) if same => s,
        previous => {
            let Some(begun) = begin(tc, ctx, &request, &snapshot_ns, previous).await else {
                return Step::Settled;
            };
            begun
        }
    };
    let (tenant, _) = match crate::build::identity(tc) {
        Ok(x) => x,
        Err(e) => return Step::Restoring(e.to_string()),
    };
    // Nothing syncs while the datastore is replaced: the syncer started afterwards begins
    // from the restored state.
    ctx.syncers.stop(&ns, &tenant);
    let outcome = match progress(tc, ctx, &current).await {
        Progress::Ended(outcome) => outcome,
        Progress::UnderWay(detail) => {
            // Where it is, in status.restore too (`restore --wait` prints each change).
            set(
                tc,
                RestoreStatus {
                    message: Some(detail.clone()),
                    ..current
                },
            );
            return Step::Restoring(detail);
        }
    };
    let (finished, event, reason) = finished(current, outcome);
    if let Some(message) = finished.message.clone() {
        crate::phases::report::publish(ctx, tc, event, reason, message).await;
    }
    let waits = !finished.in_place && finished.phase == Some(RestorePhase::Failed);
    set(tc, finished);
    if waits {
        return Step::Restoring("the restore failed (see status.restore)".into());
    }
    Step::Settled
}

/// A new restore: the snapshot checked, and the restore's status (Restoring) set and told; or
/// `None` when the check refused it (Failed, set and told, the tenant untouched).
async fn begin(
    tc: &mut TenantCluster,
    ctx: &Context,
    request: &Restore,
    snapshot_ns: &str,
    previous: Option<RestoreStatus>,
) -> Option<RestoreStatus> {
    let snapshot_key = format!("{snapshot_ns}/{}", request.snapshot_ref.name);
    let checked = match verify(tc, ctx, snapshot_ns, &request.snapshot_ref.name).await {
        Ok(checked) => checked,
        Err(why) => {
            let message =
                format!("refused before anything was touched: {why}; the tenant runs on as it was");
            crate::phases::report::publish(
                ctx,
                tc,
                EventType::Warning,
                "RestoreRefused",
                message.clone(),
            )
            .await;
            set(
                tc,
                RestoreStatus {
                    snapshot: snapshot_key,
                    requested_at: request.requested_at.clone(),
                    phase: Some(RestorePhase::Failed),
                    // The pod keeps the restore it carries.
                    id: previous.and_then(|p| p.id),
                    completion_time: Some(now()),
                    message: Some(message),
                    ..Default::default()
                },
            );
            return None;
        }
    };
    let in_place = tc.status.as_ref().is_some_and(|s| {
        matches!(
            s.phase,
            Some(Phase::Ready | Phase::Degraded | Phase::Sleeping)
        ) || s.endpoint.is_some()
    });
    let message = format!(
        "snapshot {snapshot_key} ({} bytes, {}) checked; {}",
        checked.size,
        checked.checksum,
        if in_place {
            "stopping the syncer and the control plane to put it in place"
        } else {
            "the control plane starts with it in place"
        }
    );
    crate::phases::report::publish(ctx, tc, EventType::Normal, "Restoring", message.clone()).await;
    let status = RestoreStatus {
        snapshot: snapshot_key,
        requested_at: request.requested_at.clone(),
        phase: Some(RestorePhase::Restoring),
        id: Some(restore_id(&checked.uid, request.requested_at.as_deref())),
        checksum: Some(checked.checksum),
        start_time: Some(now()),
        completion_time: None,
        message: Some(message),
        in_place,
    };
    set(tc, status.clone());
    Some(status)
}

/// Where a restore under way is.
enum Progress {
    /// It ended so.
    Ended(Outcome),
    /// It goes on: where it is, as the status says it.
    UnderWay(String),
}

/// Where the restore under way is: the transfer task's result when it has one, else what the
/// pod's agent says, starting the transfer when the pod waits for it.
async fn progress(tc: &TenantCluster, ctx: &Context, current: &RestoreStatus) -> Progress {
    let key = tenant_key(tc);
    let sending = || {
        format!(
            "sending snapshot {} to the control-plane pod",
            current.snapshot
        )
    };
    let all = ctx.state::<Transfers>();
    {
        let mut transfers = all.lock();
        match transfers.get(&key) {
            Some(Transfer::Running) => return Progress::UnderWay(sending()),
            Some(Transfer::Done(_)) => {
                if let Some(Transfer::Done(result)) = transfers.remove(&key) {
                    return Progress::Ended(result);
                }
            }
            None => {}
        }
    }
    let id = current.id.clone().unwrap_or_default();
    match where_is(tc, ctx, &id).await {
        Where::NotYet(detail) => Progress::UnderWay(detail),
        Where::Waiting { address, pki } => {
            start_transfer(tc, ctx, current, address, pki);
            Progress::UnderWay(sending())
        }
        Where::Finished(result) => Progress::Ended(result),
    }
}

/// The restore's last status for how it ended, with the event that tells it.
fn finished(current: RestoreStatus, outcome: Outcome) -> (RestoreStatus, EventType, &'static str) {
    let (phase, message, event, reason) = match outcome {
        Outcome::Restored(detail) => (
            RestorePhase::Completed,
            format!("restored snapshot {}: {detail}", current.snapshot),
            EventType::Normal,
            "Restored",
        ),
        Outcome::Abandoned(why) => {
            let then = if current.in_place {
                "the tenant went on with the data it had"
            } else {
                "the control plane waits: point spec.restore at another snapshot, or delete this TenantCluster"
            };
            (
                RestorePhase::Failed,
                format!(
                    "restoring snapshot {} failed: {why}; {then}",
                    current.snapshot
                ),
                EventType::Warning,
                "RestoreFailed",
            )
        }
    };
    let status = RestoreStatus {
        phase: Some(phase),
        completion_time: Some(now()),
        message: Some(message),
        ..current
    };
    (status, event, reason)
}

fn set(tc: &mut TenantCluster, restore: RestoreStatus) {
    tc.status.get_or_insert_with(Default::default).restore = Some(restore);
}

/// The id of a restore: the snapshot's UID and the request's time, hashed short (it goes into
/// the pod's arguments and a file name).
fn restore_id(snapshot_uid: &str, requested_at: Option<&str>) -> String {
    let mut hasher = copy::Hasher::default();
    hasher.update(snapshot_uid.as_bytes());
    hasher.update(b"/");
    hasher.update(requested_at.unwrap_or_default().as_bytes());
    hasher.finish()[..12].to_string()
}

/// A snapshot that passed the checks.
struct Checked {
    uid: String,
    size: u64,
    checksum: String,
}

/// Every check a restore passes before it touches anything; the error says what to fix.
async fn verify(
    tc: &TenantCluster,
    ctx: &Context,
    snapshot_ns: &str,
    name: &str,
) -> Result<Checked, super::Error> {
    let snap = Api::<TenantSnapshot>::namespaced(ctx.client.clone(), snapshot_ns)
        .get_opt(name)
        .await
        .map_err(|e| {
            format!(
                "reading TenantSnapshot {snapshot_ns}/{name}: {}",
                api_message(&e)
            )
        })?
        .ok_or_else(|| format!("TenantSnapshot {snapshot_ns}/{name} does not exist"))?;
    admissible(tc, &ctx.options.build, &snap, snapshot_ns, name)?;
    let status = snap.status.clone().unwrap_or_default();
    let (_, store) =
        super::open_store(&ctx.client, &ctx.options.snapshots, status.store.as_deref())
            .await
            .map_err(|e| format!("the snapshot's store: {e}"))?;
    let objects = store.objects_of(&snap);
    let manifest = store.manifest(&objects.manifest).await?;
    let expected = status.checksum.clone().unwrap_or_default();
    if manifest.checksum != expected {
        return Err(format!(
            "the stored manifest says {} but the TenantSnapshot says {expected}: the store's copy is not this snapshot's",
            manifest.checksum
        ).into());
    }
    let size = check_stored(&store, &objects, &manifest, status.size, &expected).await?;
    Ok(Checked {
        uid: snap.uid().unwrap_or_default(),
        size,
        checksum: expected,
    })
}

/// Why a TenantSnapshot cannot be restored into a tenant, found before its store is read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotRestorable {
    /// In another namespace, and not granted to this one.
    #[error(
        "TenantSnapshot {snapshot} is in another namespace and does not grant it to {ns}: its owner may annotate it {RESTORE_TO}={ns}"
    )]
    NotGranted {
        /// The snapshot, as `ns/name`.
        snapshot: String,
        /// The tenant's namespace.
        ns: String,
    },
    /// Not Completed: its phase and message.
    #[error("TenantSnapshot {snapshot} is {phase}, not Completed{message}")]
    NotCompleted {
        /// The snapshot, as `ns/name`.
        snapshot: String,
        /// Its phase.
        phase: String,
        /// `: ` and its status message, or nothing.
        message: String,
    },
    /// The control plane runs no agent to receive it.
    #[error(
        "this tenant's control plane runs no snapshot agent to receive the snapshot (the operator has no --agent-image)"
    )]
    NoAgent,
    /// Taken at a newer minor than the tenant runs.
    #[error(
        "TenantSnapshot {snapshot} was taken at Kubernetes {theirs}, newer than this tenant's {ours}: an API server never reads back data a newer minor wrote; set spec.kubernetesVersion to v1.{minor} or newer"
    )]
    NewerMinor {
        /// The snapshot, as `ns/name`.
        snapshot: String,
        /// The version it was taken at.
        theirs: String,
        /// The tenant's version.
        ours: String,
        /// The snapshot's minor.
        minor: u32,
    },
}

impl From<NotRestorable> for super::Error {
    fn from(e: NotRestorable) -> Self {
        super::Error::Step(e.to_string())
    }
}

/// The checks on TenantSnapshot `snapshot_ns/name` itself, before its store is read: it is
/// granted to this tenant's namespace, Completed, not of a newer minor than the tenant runs, and
/// the control plane runs an agent to receive it. Decided from the objects alone.
fn admissible(
    tc: &TenantCluster,
    build: &crate::BuildOptions,
    snap: &TenantSnapshot,
    snapshot_ns: &str,
    name: &str,
) -> Result<(), NotRestorable> {
    let ns = tc.namespace().unwrap_or_default();
    let snapshot = format!("{snapshot_ns}/{name}");
    if snapshot_ns != ns {
        let granted = snap
            .annotations()
            .get(RESTORE_TO)
            .is_some_and(|list| list.split(',').any(|n| n.trim() == ns));
        if !granted {
            return Err(NotRestorable::NotGranted { snapshot, ns });
        }
    }
    if snap.phase() != SnapshotPhase::Completed {
        return Err(NotRestorable::NotCompleted {
            snapshot,
            phase: snap.phase().to_string(),
            message: snap
                .status
                .as_ref()
                .and_then(|s| s.message.as_deref())
                .map(|m| format!(": {m}"))
                .unwrap_or_default(),
        });
    }
    if crate::build::control_plane::agent_image(build).is_none() {
        return Err(NotRestorable::NoAgent);
    }
    let theirs = snap
        .status
        .as_ref()
        .and_then(|s| s.kubernetes_version.clone())
        .unwrap_or_default();
    let ours = &tc.spec.kubernetes_version;
    if let (Some(snap_minor), Some(our_minor)) = (minor(&theirs), minor(ours))
        && snap_minor > our_minor
    {
        return Err(NotRestorable::NewerMinor {
            snapshot,
            theirs,
            ours: ours.clone(),
            minor: snap_minor,
        });
    }
    Ok(())
}

/// Read the stored object once: its own bytes hashed against `expected` (and `size`, when the
/// snapshot says it), and, encrypted, decrypted through with the store's key to the database's
/// checksum. Its size in bytes when both match.
async fn check_stored(
    store: &super::store::Store,
    objects: &super::store::Objects,
    manifest: &super::store::Manifest,
    size_said: Option<i64>,
    expected: &str,
) -> Result<u64, super::Error> {
    let (stored, plain) = (copy::Tally::default(), copy::Tally::default());
    let bytes = stored
        .tap(
            store
                .download(&objects.data)
                .await?
                .map_err(super::Error::from),
        )
        .boxed();
    let mut drained = match &manifest.encryption {
        Some(encryption) => plain
            .tap(
                readable_with(store, encryption)?
                    .decrypt(bytes)
                    .map_err(super::Error::from),
            )
            .boxed(),
        None => bytes,
    };
    while let Some(chunk) = drained.next().await {
        chunk?;
    }
    let (size, sha256) = stored.take();
    if copy::checksum_text(&sha256) != expected || size_said.is_some_and(|s| s as u64 != size) {
        return Err(format!(
            "the stored object {} is corrupt: it has {size} bytes with sha256:{sha256}, the snapshot says {} bytes with {expected}",
            store.location(&objects.data),
            size_said.unwrap_or_default()
        ).into());
    }
    if let Some(encryption) = &manifest.encryption {
        let (plain_size, plain_sha) = plain.take();
        let got = copy::checksum_text(&plain_sha);
        if got != encryption.plaintext_checksum || plain_size != encryption.plaintext_size {
            return Err(format!(
                "the snapshot decrypts to {plain_size} bytes with {got}, not the {} bytes with {} it was taken with",
                encryption.plaintext_size, encryption.plaintext_checksum
            ).into());
        }
    }
    Ok(size)
}

/// The store's key, if it is the one that encrypted the snapshot.
pub(super) fn readable_with<'a>(
    store: &'a super::store::Store,
    encryption: &super::store::ManifestEncryption,
) -> Result<&'a super::crypt::SnapshotKey, super::crypt::CryptError> {
    use super::crypt::CryptError;
    let key = store.key.as_ref().ok_or_else(|| CryptError::NoKey {
        key_id: encryption.key_id.clone(),
    })?;
    if key.id() != encryption.key_id {
        return Err(CryptError::OtherKey {
            key_id: encryption.key_id.clone(),
            current: key.id(),
        });
    }
    Ok(key)
}

use crate::upgrade::minor;

mod transfer;
pub use transfer::Transfers;
use transfer::{Outcome, Transfer, Where, start_transfer, where_is};
#[cfg(test)]
mod tests;
