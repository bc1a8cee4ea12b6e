//! What a syncer reports to the TenantCluster controller: whether it has read both sides, which
//! objects fail and why, and the sentence `Synced` shows when all is well; and what it did, for
//! the operator's metrics ([`Observer`]).

use std::collections::BTreeMap;
use std::time::Duration;

use tenantplane_api::text::{MAX_TEXT_BYTES, bounded, bounded_to};

/// Where the syncers report what they did, for the operator's metrics.
pub trait Observer: Send + Sync {
    /// `kind` converged for a tenant, `lag` after it was queued.
    fn synced(&self, namespace: &str, tenant: &str, kind: &'static str, lag: Duration);
    /// `kind` failed for a tenant, with a reason.
    fn sync_failed(&self, namespace: &str, tenant: &str, kind: &'static str, reason: &'static str);
    /// `kind` spent `took` in `stage` (the `stages` module's names), any tenant.
    fn stage(&self, stage: &'static str, kind: &'static str, took: std::time::Duration);
}

/// What of [`MAX_TEXT_BYTES`] the first failure may take, leaving room for the count.
const ROOM: usize = MAX_TEXT_BYTES - 40;

/// The reason of a new syncer that has not read the tenant and the host namespace yet.
pub const SYNC_STARTING: &str = "SyncStarting";

/// The reason of a failing watch.
pub const WATCH_FAILED: &str = "WatchFailed";

/// Why a tenant is not (yet) fully synced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// CamelCase, for the `Synced` condition.
    pub reason: &'static str,
    /// Names the resource and the error.
    pub message: String,
}

/// What a syncer reports to the TenantCluster controller.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// Every watch on both sides holds its first list.
    pub ready: bool,
    /// Objects that failed to sync, by a description of the object.
    pub errors: BTreeMap<String, Failure>,
    /// Why the syncer itself stopped, while it waits to restart.
    pub crashed: Option<String>,
}

impl Health {
    /// Does a watch fail (the engine names each failing watch)?
    pub fn watches_failing(&self) -> bool {
        self.errors.values().any(|f| f.reason == WATCH_FAILED)
    }

    /// The `Synced` verdict: `summary` (see [`in_sync`]) when all is well, else the first failure
    /// and how many more there are.
    pub fn verdict(&self, summary: &str) -> Result<String, Failure> {
        if let Some(why) = &self.crashed {
            return Err(Failure {
                reason: "SyncerRestarting",
                message: format!("the syncer stopped and restarts after a back-off: {why}"),
            });
        }
        if !self.ready {
            return Err(Failure {
                reason: SYNC_STARTING,
                message: "the syncer is reading the tenant and the host namespace".into(),
            });
        }
        if let Some((_, first)) = self.errors.iter().next() {
            // The first failure quotes a tenant object: bounded, leaving room for the count.
            let message = match self.errors.len() - 1 {
                0 => bounded(&first.message),
                1 => format!("{} (and 1 more object)", bounded_to(&first.message, ROOM)),
                more => format!(
                    "{} (and {more} more objects)",
                    bounded_to(&first.message, ROOM)
                ),
            };
            return Err(Failure {
                reason: first.reason,
                message,
            });
        }
        Ok(summary.to_string())
    }
}

/// The sentence `Synced` shows when all is well, naming what moves each way (`down` to the host,
/// `up` from it); stable, so a healthy tenant's status never changes. The lists come from the
/// kinds (`kinds::summary`).
pub fn in_sync(down: &[String], up: &[String]) -> String {
    let list = |v: &[String]| {
        if v.is_empty() {
            "nothing".to_string()
        } else {
            v.join(", ")
        }
    };
    format!(
        "in sync: {} to the host; {} from the host",
        list(down),
        list(up)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_names_the_first_failure_and_counts_the_rest() {
        let policy = in_sync(&["pods".into()], &[]);
        let mut h = Health {
            ready: true,
            ..Default::default()
        };
        assert_eq!(
            h.verdict(&policy).unwrap(),
            "in sync: pods to the host; nothing from the host"
        );
        for n in ["a", "b"] {
            h.errors.insert(
                format!("Pod default/{n}"),
                Failure {
                    reason: "HostRejected",
                    message: format!("Pod default/{n}: refused"),
                },
            );
        }
        let f = h.verdict(&policy).unwrap_err();
        assert_eq!(f.reason, "HostRejected");
        assert_eq!(f.message, "Pod default/a: refused (and 1 more object)");
    }

    #[test]
    fn the_verdict_stays_within_the_bound_whatever_the_tenant_wrote() {
        let policy = in_sync(&[], &[]);
        let mut h = Health {
            ready: true,
            ..Default::default()
        };
        let long = "n".repeat(250);
        for i in 0..18 {
            h.errors.insert(
                format!("Pod default/{i:02}{long}"),
                Failure {
                    reason: "NotAllowed",
                    message: format!("Pod default/{i:02}{long}: {}", "refused; ".repeat(40_000)),
                },
            );
        }
        let f = h.verdict(&policy).unwrap_err();
        assert!(f.message.len() <= MAX_TEXT_BYTES, "{}", f.message.len());
        assert!(f.message.starts_with("Pod default/00nnn"));
        assert!(
            f.message
                .ends_with("more characters cut) (and 17 more objects)"),
            "{}",
            &f.message[f.message.len() - 80..]
        );
        h.errors.retain(|k, _| k.starts_with("Pod default/00"));
        assert!(h.verdict(&policy).unwrap_err().message.len() <= MAX_TEXT_BYTES);
    }
}
