//! What every reconcile shares, and the few helpers every phase uses: the bottom layer of the
//! reconcile, importing no phase.

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use tenantplane_api::TenantCluster;
use tenantplane_syncer::Syncers;

use crate::cache::Caches;
use crate::options::ControllerOptions;
use crate::service_range;

/// A tenant as the reconcile's bookkeeping knows it: (namespace, name).
pub(crate) type TenantKey = (String, String);

/// What every reconcile shares.
pub struct Context {
    /// The host client, as the operator.
    pub client: Client,
    /// How the operator runs.
    pub options: ControllerOptions,
    /// Publishes Events about TenantClusters.
    pub recorder: Recorder,
    /// The caches a reconcile reads.
    pub caches: Caches,
    /// One syncer per Ready tenant.
    pub syncers: Syncers,
    /// The controller's own cache of TenantClusters: who else is in a tenant's namespace.
    pub tenants: Store<TenantCluster>,
    /// The host's Service range, asked of the host and remembered for a while.
    pub service_ranges: service_range::Discovery,
    /// Reconciles that failed in a row, by tenant, for the back-off.
    pub failures: Mutex<BTreeMap<TenantKey, u32>>,
    /// When each tenant's status was last written: sync churn is coalesced.
    pub status_writes: StatusWrites,
    /// What features keep across reconciles, each under a type of its own (when each tenant
    /// was last used, the wake doors, restores under way): see [`Context::state`].
    pub features: FeatureState,
}

impl Context {
    /// The state of type `T` a feature keeps across reconciles, made (empty) when first asked
    /// for. The feature owns `T`, so the context names no feature: `ctx.state::<Activity>()`.
    pub fn state<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        self.features.get()
    }

    /// Failed reconciles of `tc` in a row so far.
    pub(crate) fn failures_of(&self, tc: &TenantCluster) -> u32 {
        self.failures
            .lock()
            .map(|all| all.get(&tenant_key(tc)).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

/// State of features, by its type; each is made on first use and shared after.
///
/// Ours because the type maps that crates offer (`http::Extensions`, `anymap`) take `&mut self`
/// to add an entry, and the context is shared, read-only, by every reconcile.
#[derive(Default)]
pub struct FeatureState(Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>);

impl FeatureState {
    /// The `T`, made with its default the first time.
    pub fn get<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let entry = map
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Arc::new(T::default()) as Arc<dyn Any + Send + Sync>)
            .clone();
        drop(map);
        // The entry under `TypeId::of::<T>()` was made as a `T`: the downcast cannot miss, and
        // a new `T` stands in if it ever did.
        entry.downcast::<T>().unwrap_or_default()
    }
}

pub(crate) fn now() -> Time {
    Time(Timestamp::now())
}

pub(crate) fn tenant_key(tc: &TenantCluster) -> TenantKey {
    (tc.namespace().unwrap_or_default(), tc.name_any())
}

/// How often what a tenant's objects do may rewrite its TenantCluster's status: twenty pods
/// refused a second apart make a few writes, not twenty, and the latest state is always written
/// (a deferred write is looked at again when its slot comes).
pub(crate) const STATUS_COALESCE: Duration = Duration::from_secs(10);

/// When each tenant's status was last written.
#[derive(Default)]
pub struct StatusWrites(Mutex<BTreeMap<TenantKey, Instant>>);

impl StatusWrites {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<TenantKey, Instant>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long a write of tenant `key` must wait; `None`: write now.
    pub(crate) fn wait(&self, key: &TenantKey, sync_churn: bool, now: Instant) -> Option<Duration> {
        wait_before_write(self.lock().get(key).copied(), sync_churn, now)
    }

    pub(crate) fn wrote(&self, key: TenantKey, now: Instant) {
        self.lock().insert(key, now);
    }

    /// Forget a deleted tenant, so the operator holds nothing for tenants long gone.
    pub(crate) fn forget(&self, key: &TenantKey) {
        self.lock().remove(key);
    }
}

/// How long a status write must wait, after the last one at `last`: only a change that is all
/// sync churn waits, and only for the rest of [`STATUS_COALESCE`]. Anything else (the control
/// plane, a new generation) is written at once.
fn wait_before_write(last: Option<Instant>, sync_churn: bool, now: Instant) -> Option<Duration> {
    let since = now.saturating_duration_since(last?);
    (sync_churn && since < STATUS_COALESCE).then(|| STATUS_COALESCE - since)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_churn_is_written_at_most_once_per_slot_and_never_lost() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(wait_before_write(None, true, at(0)), None, "first: at once");
        assert_eq!(
            wait_before_write(Some(at(0)), true, at(3)),
            Some(STATUS_COALESCE - Duration::from_secs(3)),
            "churn waits for the rest of the slot"
        );
        assert_eq!(
            wait_before_write(Some(at(0)), false, at(3)),
            None,
            "news does not"
        );
        assert_eq!(wait_before_write(Some(at(0)), true, at(10)), None);
        assert_eq!(
            wait_before_write(Some(at(5)), true, at(1)),
            Some(STATUS_COALESCE)
        );
        // Twenty refusals a second apart, each asking to write: how many writes get through?
        let writes = StatusWrites::default();
        let key = ("team-dev".to_string(), "dev".to_string());
        let mut written = 0;
        let mut pending = None;
        for s in 0..20 {
            if writes.wait(&key, true, at(s)).is_none() {
                writes.wrote(key.clone(), at(s));
                written += 1;
                pending = None;
            } else {
                pending = Some(s);
            }
        }
        assert_eq!(written, 2, "at 0 s and 10 s");
        let last = pending.expect("the last refusals wait");
        let wait = writes.wait(&key, true, at(last)).unwrap();
        assert!(
            writes.wait(&key, true, at(last) + wait).is_none(),
            "and get their slot"
        );
        writes.forget(&key);
        assert!(
            writes.wait(&key, true, at(last)).is_none(),
            "a deleted tenant leaves nothing behind"
        );
    }
}
