//! Upgrades that can be undone. When `spec.kubernetesVersion` moves to a new minor, the control
//! plane stays at the version it runs until two checks pass:
//!
//! 1. **Removed APIs.** The tenant's objects of every kind the target release stops serving at
//!    some version ([`removed_apis`]) are read, and their last-applied configuration and managed
//!    fields say which version wrote them. Any found refuse the upgrade, naming the kinds,
//!    versions and counts, unless the annotation [`ACCEPT_REMOVED_APIS`] names the target minor.
//! 2. **A snapshot.** With a SnapshotStore (the schedule's, else the default), a TenantSnapshot
//!    of the tenant as it is; the upgrade goes on only once it Completed. It is recorded in
//!    `status.upgrade`, and `tenantplane rollback` restores it at the old version.
//!
//! Held, the tenant runs on at its old version: everything is built as if the spec still said
//! it. `status.upgrade` and the `UpgradeGuarded` condition say what the upgrade waits for.

pub mod removed_apis;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tenantplane_api::{SnapshotPhase, SnapshotStore, TenantCluster, TenantSnapshot, UpgradeStatus};

use crate::api_message;
use crate::context::Context;
use crate::names;

/// The annotation that lets an upgrade go on although objects use API versions the target no
/// longer serves: its value is the target minor, such as `v1.32`.
pub const ACCEPT_REMOVED_APIS: &str = "tenantplane.io/accept-removed-apis";
/// The label on the snapshot taken before an upgrade: the tenant's name.
pub const GUARDS_UPGRADE: &str = "tenantplane.io/guards-upgrade";

/// Reasons in `status.upgrade.reason` (and the `UpgradeGuarded` condition).
pub mod reason {
    /// The tenant's objects are being checked for API versions the target no longer serves, or a
    /// check could not run: the upgrade waits.
    pub const CHECKING: &str = "CheckingRemovedAPIs";
    /// Objects use API versions the target no longer serves: the upgrade is refused.
    pub const REMOVED_APIS: &str = "RemovedAPIsInUse";
    /// The snapshot that guards the upgrade is being taken.
    pub const TAKING_SNAPSHOT: &str = "TakingSnapshot";
    /// The guarding snapshot failed.
    pub const SNAPSHOT_FAILED: &str = "SnapshotFailed";
    /// No SnapshotStore to keep a snapshot in: the upgrade goes on without one.
    pub const NO_STORE: &str = "NoSnapshotStore";
    /// The tenant sleeps: the checks and the snapshot wait for it to wake.
    pub const WAITING_FOR_WAKE: &str = "WaitingForWake";
    /// The guarding snapshot is taken: the upgrade goes on.
    pub const GUARDED: &str = "SnapshotTaken";
}

/// What the reconcile builds.
pub(crate) enum Guard {
    /// At the spec's version.
    Proceed,
    /// At this (older) version, until the checks pass.
    Hold(String),
}

/// Look at the version the control plane runs and the one the spec asks; record what an upgrade
/// waits for in `tc.status.upgrade`.
pub(crate) async fn guard(tc: &mut TenantCluster, ctx: &Context) -> Guard {
    let ns = tc.namespace().unwrap_or_default();
    let tenant = tc.name_any();
    let to = tc.spec.kubernetes_version.clone();
    let live = crate::cache::get(
        &ctx.caches.statefulsets,
        Some(&ns),
        &names::statefulset(&tenant),
    );
    let from = live.as_deref().and_then(template_version);
    let previous = tc.status.as_ref().and_then(|s| s.upgrade.clone());
    let upgrading = match (&from, minor(&to)) {
        (Some(from), Some(to_minor)) => minor(from).is_some_and(|m| m < to_minor),
        _ => false,
    };
    if !upgrading {
        let kept = settled(previous, from.as_deref(), &to, &tenant, &ns);
        set(tc, kept);
        return Guard::Proceed;
    }
    let from = from.unwrap_or_default();
    let mut record = previous
        .filter(|p| p.from == from && p.to == to)
        .unwrap_or(UpgradeStatus {
            from: from.clone(),
            to: to.clone(),
            ..Default::default()
        });
    let hold = |tc: &mut TenantCluster, record: UpgradeStatus| {
        set(tc, Some(record));
        Guard::Hold(from.clone())
    };
    // 1. API versions the target no longer serves.
    let (from_v, to_v) = (version_pair(&from), version_pair(&to));
    let findings = match scan(tc, ctx, from_v, to_v).await {
        Ok(f) => f,
        Err(e) => {
            record.reason = Some(reason::CHECKING.into());
            record.message = Some(format!(
                "the upgrade to {to} waits: the tenant's objects could not be checked for API versions {to} no longer serves ({e})"
            ));
            return hold(tc, record);
        }
    };
    let target_minor = format!("v{}.{}", to_v.0, to_v.1);
    let accepted = tc
        .annotations()
        .get(ACCEPT_REMOVED_APIS)
        .is_some_and(|v| v.trim() == target_minor);
    if !findings.is_empty() && !accepted {
        record.reason = Some(reason::REMOVED_APIS.into());
        record.message = Some(format!(
            "the upgrade to {to} is refused: {}; move those objects to the versions named, or accept the risk with the annotation {ACCEPT_REMOVED_APIS}={target_minor}",
            removed_apis::summary(&findings, to_v)
        ));
        return hold(tc, record);
    }
    // 2. The snapshot that can undo it.
    let store = match guarding_store(tc, ctx).await {
        Ok(s) => s,
        Err(e) => {
            record.reason = Some(reason::CHECKING.into());
            record.message = Some(format!("the upgrade to {to} waits: {e}"));
            return hold(tc, record);
        }
    };
    let Some(store) = store else {
        record.reason = Some(reason::NO_STORE.into());
        record.message = Some(format!(
            "upgrading from {from} to {to} without a snapshot: no SnapshotStore is marked default and spec.snapshots names none, so `tenantplane rollback` has nothing to go back to"
        ));
        set(tc, Some(record));
        return Guard::Proceed;
    };
    let name = record.snapshot.clone().unwrap_or_else(|| {
        format!(
            "{tenant}-before-{}-{}",
            to.replace('.', "-"),
            tc.metadata.generation.unwrap_or_default()
        )
    });
    record.snapshot = Some(name.clone());
    let proceed = guarding_snapshot(ctx, &mut record, &ns, &tenant, &name, &store).await;
    set(tc, Some(record));
    if proceed {
        Guard::Proceed
    } else {
        Guard::Hold(from)
    }
}

/// A minor upgrade's record once the template no longer upgrades: done (the template runs the
/// target), a patch release, or a rollback. The record of the last upgrade stays while the spec
/// still names its target; once the target runs, it says how to go back.
fn settled(
    previous: Option<UpgradeStatus>,
    from: Option<&str>,
    to: &str,
    tenant: &str,
    ns: &str,
) -> Option<UpgradeStatus> {
    previous.filter(|p| p.to == to).map(|p| match from {
        Some(running) if running == p.to && p.reason.as_deref() != Some(reason::NO_STORE) => {
            UpgradeStatus {
                message: Some(match &p.snapshot {
                    Some(s) => format!(
                        "upgraded from {} to {}; snapshot {s} holds the tenant as it was: `tenantplane rollback {tenant} -n {ns}` goes back",
                        p.from, p.to
                    ),
                    None => format!("upgraded from {} to {}", p.from, p.to),
                }),
                ..p
            }
        }
        _ => p,
    })
}

/// The snapshot `name` that guards the upgrade in `record`: taken into `store` when missing, and
/// the record says where it stands. True when it is Completed and the upgrade may go on.
async fn guarding_snapshot(
    ctx: &Context,
    record: &mut UpgradeStatus,
    ns: &str,
    tenant: &str,
    name: &str,
    store: &str,
) -> bool {
    let (from, to) = (record.from.clone(), record.to.clone());
    let snapshots: Api<TenantSnapshot> = Api::namespaced(ctx.client.clone(), ns);
    match snapshots.get_opt(name).await {
        Err(e) => {
            record.reason = Some(reason::TAKING_SNAPSHOT.into());
            record.message = Some(format!(
                "the upgrade to {to} waits for snapshot {name}: reading it: {}",
                api_message(&e)
            ));
            false
        }
        Ok(None) => {
            let snapshot: Result<TenantSnapshot, _> = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": ns, "labels": {GUARDS_UPGRADE: tenant}},
                "spec": {"tenantClusterRef": {"name": tenant}, "storeRef": {"name": store}},
            }));
            let created = match snapshot {
                Ok(s) => snapshots
                    .create(&PostParams::default(), &s)
                    .await
                    .map(|_| ())
                    .map_err(|e| api_message(&e)),
                Err(e) => Err(e.to_string()),
            };
            record.reason = Some(reason::TAKING_SNAPSHOT.into());
            record.message = Some(match created {
                Ok(()) => format!(
                    "taking snapshot {name} into store {store} before upgrading from {from} to {to}"
                ),
                Err(e) => {
                    format!("the upgrade to {to} waits: creating snapshot {name} failed: {e}")
                }
            });
            false
        }
        Ok(Some(snap)) => snapshot_said(record, &snap, ns, tenant),
    }
}

/// What guarding snapshot `snap` says of the upgrade in `record`: Completed lets it go on; Failed
/// or still running holds it, saying why.
fn snapshot_said(
    record: &mut UpgradeStatus,
    snap: &TenantSnapshot,
    ns: &str,
    tenant: &str,
) -> bool {
    let (from, to, name) = (&record.from, &record.to, snap.name_any());
    let (reason, message, proceed) = match snap.phase() {
        SnapshotPhase::Completed => (
            reason::GUARDED,
            format!(
                "snapshot {name} holds the tenant at {from}; upgrading to {to} (`tenantplane rollback {tenant} -n {ns}` goes back)"
            ),
            true,
        ),
        SnapshotPhase::Failed => (
            reason::SNAPSHOT_FAILED,
            format!(
                "the upgrade to {to} waits: snapshot {name} failed: {}; delete TenantSnapshot {name} to take it again",
                snap.status
                    .as_ref()
                    .and_then(|s| s.message.clone())
                    .unwrap_or_default()
            ),
            false,
        ),
        phase => (
            reason::TAKING_SNAPSHOT,
            format!("the upgrade to {to} waits for snapshot {name} ({phase}) before it starts"),
            false,
        ),
    };
    record.reason = Some(reason.into());
    record.message = Some(message);
    proceed
}

/// While asleep nothing can be checked or snapshotted: a minor upgrade waits for the wake, the
/// template kept at the version it runs. The tenant as it is then built (its spec at the running
/// version, `status.upgrade` saying so), or `None` when nothing is held.
pub(crate) fn held_while_asleep(tc: &TenantCluster, ctx: &Context) -> Option<TenantCluster> {
    let ns = tc.namespace().unwrap_or_default();
    let live = crate::cache::get(
        &ctx.caches.statefulsets,
        Some(&ns),
        &names::statefulset(&tc.name_any()),
    )?;
    let from = template_version(&live)?;
    let to = tc.spec.kubernetes_version.clone();
    if minor(&from)? >= minor(&to)? {
        return None;
    }
    let mut held = tc.clone();
    held.spec.kubernetes_version = from.clone();
    let message = format!(
        "the upgrade from {from} to {to} waits for the tenant to wake: it is checked for API versions {to} no longer serves, and snapshotted, first"
    );
    set(
        &mut held,
        Some(UpgradeStatus {
            from,
            to,
            snapshot: None,
            reason: Some(reason::WAITING_FOR_WAKE.into()),
            message: Some(message),
        }),
    );
    Some(held)
}

fn set(tc: &mut TenantCluster, upgrade: Option<UpgradeStatus>) {
    if let Some(status) = tc.status.as_mut() {
        status.upgrade = upgrade;
    } else if upgrade.is_some() {
        tc.status = Some(tenantplane_api::TenantClusterStatus {
            upgrade,
            ..Default::default()
        });
    }
}

/// The version the StatefulSet's template runs (its server image's tag).
fn template_version(sts: &StatefulSet) -> Option<String> {
    let spec: PodSpec = sts.spec.as_ref()?.template.spec.clone()?;
    crate::build::control_plane::running_version(&Pod {
        spec: Some(spec),
        ..Default::default()
    })
}

/// The minor of `v1.31.4`.
pub fn minor(version: &str) -> Option<u32> {
    version
        .trim_start_matches('v')
        .split('.')
        .nth(1)?
        .parse()
        .ok()
}

fn version_pair(version: &str) -> (u32, u32) {
    let mut parts = version.trim_start_matches('v').split('.');
    let major = parts.next().and_then(|p| p.parse().ok()).unwrap_or(1);
    let minor = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor)
}

/// Why the guard cannot check an upgrade yet: what it could not read or reach. The upgrade waits
/// with this in its message.
#[derive(Debug, thiserror::Error)]
enum CheckError {
    #[error("{action}: {}", api_message(.source))]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("its {0} is not there yet")]
    NotYet(&'static str),
    #[error(transparent)]
    Kubeconfig(#[from] crate::build::kubeconfig::NoOperatorKubeconfig),
    #[error(transparent)]
    Connect(#[from] crate::connector::ConnectError),
}

fn api_call(action: impl Into<String>) -> impl FnOnce(kube::Error) -> CheckError {
    let action = action.into();
    move |source| CheckError::Api { action, source }
}

/// The store an upgrade's snapshot goes to: the schedule's, else the default; `None` without.
async fn guarding_store(tc: &TenantCluster, ctx: &Context) -> Result<Option<String>, CheckError> {
    if let Some(r) = tc
        .spec
        .snapshots
        .as_ref()
        .and_then(|s| s.store_ref.as_ref())
    {
        return Ok(Some(r.name.clone()));
    }
    let stores = Api::<SnapshotStore>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(api_call("listing SnapshotStores"))?;
    Ok(stores
        .items
        .into_iter()
        .find(|s| s.spec.default)
        .map(|s| s.name_any()))
}

/// The tenant's objects of the kinds an upgrade from `from` to `to` stops serving at some
/// version, read at the version the tenant serves now, and what they were written with.
async fn scan(
    tc: &TenantCluster,
    ctx: &Context,
    from: (u32, u32),
    to: (u32, u32),
) -> Result<Vec<removed_apis::Finding>, CheckError> {
    let kinds = removed_apis::kinds_between(from, to);
    if kinds.is_empty() {
        return Ok(Vec::new());
    }
    let client = tenant_client(tc, ctx).await?;
    let mut objects = Vec::new();
    for (group, kind) in kinds {
        // A group or kind the tenant does not serve holds no objects.
        let Ok(api_group) = kube::discovery::group(&client, group).await else {
            continue;
        };
        let Some((resource, _)) = api_group.recommended_kind(kind) else {
            continue;
        };
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(api_call(format!("listing {kind}")))?;
        for item in list.items {
            // A listed object is JSON already: it serializes back.
            let Ok(mut value) = serde_json::to_value(&item) else {
                continue;
            };
            // List items carry no kind; the evidence reads it.
            value["kind"] = json!(kind);
            objects.push(value);
        }
    }
    Ok(removed_apis::scan(objects.iter(), from, to))
}

/// A client of the tenant's API server, as the operator.
async fn tenant_client(tc: &TenantCluster, ctx: &Context) -> Result<Client, CheckError> {
    let ns = tc.namespace().unwrap_or_default();
    let tenant = tc.name_any();
    let pod = crate::cache::get(
        &ctx.caches.pods,
        Some(&ns),
        &names::control_plane_pod(&tenant),
    )
    .ok_or(CheckError::NotYet("control-plane pod"))?;
    let secret = crate::cache::get(
        &ctx.caches.secrets,
        Some(&ns),
        &names::kubeconfig_secret(&tenant),
    )
    .ok_or(CheckError::NotYet("kubeconfig Secret"))?;
    let kubeconfig = crate::build::kubeconfig::require_operator_text(&secret)?;
    let connector = &ctx.options.connector;
    let server = connector.server(&tenant, &ns, &pod)?;
    Ok(connector.client(&kubeconfig, &tenant, &ns, &server).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(reason: &str, snapshot: Option<&str>) -> UpgradeStatus {
        UpgradeStatus {
            from: "v1.30.4".into(),
            to: "v1.31.0".into(),
            snapshot: snapshot.map(Into::into),
            reason: Some(reason.into()),
            message: Some("before".into()),
        }
    }

    #[test]
    fn a_finished_upgrade_says_how_to_go_back_and_a_changed_target_forgets_it() {
        let guarded = record(reason::GUARDED, Some("dev-before-v1-31-0-2"));
        let done = settled(
            Some(guarded.clone()),
            Some("v1.31.0"),
            "v1.31.0",
            "dev",
            "t",
        )
        .unwrap();
        assert_eq!(
            done.message.as_deref(),
            Some(
                "upgraded from v1.30.4 to v1.31.0; snapshot dev-before-v1-31-0-2 holds the tenant as it was: `tenantplane rollback dev -n t` goes back"
            )
        );
        // Still rolling out: the record stays as it was.
        let rolling = settled(
            Some(guarded.clone()),
            Some("v1.30.4"),
            "v1.31.0",
            "dev",
            "t",
        );
        assert_eq!(rolling, Some(guarded.clone()));
        // Without a snapshot there is nothing to go back to: the warning stays.
        let unguarded = record(reason::NO_STORE, None);
        let kept = settled(
            Some(unguarded.clone()),
            Some("v1.31.0"),
            "v1.31.0",
            "dev",
            "t",
        );
        assert_eq!(kept, Some(unguarded));
        // The spec names another target (a rollback): the record goes.
        assert_eq!(
            settled(Some(guarded), Some("v1.30.4"), "v1.30.4", "dev", "t"),
            None
        );
    }

    #[test]
    fn the_guarding_snapshot_lets_the_upgrade_go_on_only_once_completed() {
        let snap = |phase: &str| -> TenantSnapshot {
            serde_json::from_value(json!({
                "apiVersion": "tenantplane.io/v1alpha1", "kind": "TenantSnapshot",
                "metadata": {"name": "dev-before", "namespace": "t"},
                "spec": {"tenantClusterRef": {"name": "dev"}},
                "status": {"phase": phase, "message": "the store refused it"}
            }))
            .unwrap()
        };
        let mut r = record(reason::TAKING_SNAPSHOT, Some("dev-before"));
        assert!(!snapshot_said(&mut r, &snap("Running"), "t", "dev"));
        assert_eq!(r.reason.as_deref(), Some(reason::TAKING_SNAPSHOT));
        assert!(!snapshot_said(&mut r, &snap("Failed"), "t", "dev"));
        assert_eq!(r.reason.as_deref(), Some(reason::SNAPSHOT_FAILED));
        assert!(
            r.message
                .as_deref()
                .unwrap()
                .contains("failed: the store refused it; delete TenantSnapshot dev-before")
        );
        assert!(snapshot_said(&mut r, &snap("Completed"), "t", "dev"));
        assert_eq!(r.reason.as_deref(), Some(reason::GUARDED));
        assert!(
            r.message
                .as_deref()
                .unwrap()
                .contains("`tenantplane rollback dev -n t` goes back")
        );
    }

    #[test]
    fn versions_read_as_pairs_and_minors() {
        assert_eq!(version_pair("v1.31.4"), (1, 31));
        assert_eq!(minor("v1.32.0"), Some(32));
        assert_eq!(minor("bad"), None);
    }
}
