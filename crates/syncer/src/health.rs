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

/// The reason of a syncer whose only failures are objects the tenant's users wrote that the
/// profile or the host refused: theirs to fix, each with a Warning Event on it in the tenant.
pub const OBJECTS_REFUSED: &str = "ObjectsRefused";

/// How many refused objects the verdict names, each bounded to [`REFUSAL_ROOM`].
const REFUSALS_NAMED: usize = 3;

/// What of [`MAX_TEXT_BYTES`] each named refusal may take, leaving room for the header and
/// the count.
const REFUSAL_ROOM: usize = 280;

/// Is a failure of `reason` the tenant user's to fix (an object they wrote was refused by the
/// profile or by the host's admission, or its host name is taken), rather than the platform's?
/// The reasons are [`crate::Error::reason`]'s.
pub fn refused_by_policy(reason: &str) -> bool {
    matches!(reason, "NotAllowed" | "HostRejected" | "HostNameTaken")
}

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
        // The platform's failures first: any of them makes the verdict theirs.
        let platform = self.errors.values().find(|f| !refused_by_policy(f.reason));
        if let Some(first) = platform {
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
        if !self.errors.is_empty() {
            return Err(Failure {
                reason: OBJECTS_REFUSED,
                message: refusals(self.errors.values()),
            });
        }
        Ok(summary.to_string())
    }
}

/// `2 objects refused, the tenant's to fix (each has a Warning Event in the tenant):` and the
/// first few, one per line with its reason, within [`MAX_TEXT_BYTES`].
fn refusals<'a>(failures: impl ExactSizeIterator<Item = &'a Failure>) -> String {
    let count = failures.len();
    let noun = if count == 1 { "object" } else { "objects" };
    let mut text = format!(
        "{count} {noun} refused, the tenant's to fix (each has a Warning Event in the tenant):"
    );
    for f in failures.take(REFUSALS_NAMED) {
        text.push_str(&format!(
            "\n- {}: {}",
            f.reason,
            bounded_to(&f.message, REFUSAL_ROOM)
        ));
    }
    if let Some(more) = count.checked_sub(REFUSALS_NAMED).filter(|m| *m > 0) {
        text.push_str(&format!("\n(and {more} more)"));
    }
    text
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
        h.errors.insert(
            "Pod default/c".into(),
            Failure {
                reason: "SyncFailed",
                message: "Pod default/c: the host timed out".into(),
            },
        );
        let f = h.verdict(&policy).unwrap_err();
        assert_eq!(f.reason, "SyncFailed", "the platform's failure comes first");
        assert_eq!(
            f.message,
            "Pod default/c: the host timed out (and 2 more objects)"
        );
    }

    #[test]
    fn refusals_alone_are_the_tenants_and_the_verdict_names_the_first_few() {
        let policy = in_sync(&["pods".into()], &[]);
        let mut h = Health {
            ready: true,
            ..Default::default()
        };
        let refuse = |h: &mut Health, n: &str, reason: &'static str| {
            h.errors.insert(
                format!("Pod default/{n}"),
                Failure {
                    reason,
                    message: format!("Pod default/{n}: refused"),
                },
            );
        };
        refuse(&mut h, "a", "NotAllowed");
        let f = h.verdict(&policy).unwrap_err();
        assert_eq!(f.reason, OBJECTS_REFUSED);
        assert_eq!(
            f.message,
            "1 object refused, the tenant's to fix (each has a Warning Event in the tenant):\n- NotAllowed: Pod default/a: refused"
        );
        for (n, reason) in [
            ("b", "HostRejected"),
            ("c", "HostNameTaken"),
            ("d", "NotAllowed"),
        ] {
            refuse(&mut h, n, reason);
        }
        let f = h.verdict(&policy).unwrap_err();
        assert_eq!(f.reason, OBJECTS_REFUSED);
        let lines: Vec<&str> = f.message.lines().collect();
        assert_eq!(lines.len(), 5, "{}", f.message);
        assert!(lines[0].starts_with("4 objects refused"));
        assert_eq!(lines[2], "- HostRejected: Pod default/b: refused");
        assert_eq!(lines[4], "(and 1 more)");
        // A watch failing on top is the platform's: it names that, counting the refusals.
        h.errors.insert(
            "watch".into(),
            Failure {
                reason: WATCH_FAILED,
                message: "pods: connection refused".into(),
            },
        );
        let f = h.verdict(&policy).unwrap_err();
        assert_eq!(f.reason, WATCH_FAILED);
        assert_eq!(f.message, "pods: connection refused (and 4 more objects)");
        assert!(!refused_by_policy(WATCH_FAILED) && !refused_by_policy("SyncFailed"));
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
                    reason: "SyncFailed",
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
        // Refusals alone: the first few, each cut, and the count, within the bound too.
        for f in h.errors.values_mut() {
            f.reason = "HostNameTaken";
        }
        let f = h.verdict(&policy).unwrap_err();
        assert_eq!(f.reason, OBJECTS_REFUSED);
        assert!(f.message.len() <= MAX_TEXT_BYTES, "{}", f.message.len());
        assert!(f.message.ends_with("\n(and 15 more)"), "{}", f.message);
        h.errors.retain(|k, _| k.starts_with("Pod default/00"));
        assert!(h.verdict(&policy).unwrap_err().message.len() <= MAX_TEXT_BYTES);
    }
}
