//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go does it: the holder renews the
//! Lease every retry period; a standby takes it over once the record has not changed for the
//! Lease's duration, as timed by the standby's own clock (so clock skew between replicas does
//! not matter); a holder that cannot renew within the renew deadline stops leading. Only the
//! holder runs the controller, so only the holder writes.
//!
//! Ours, not a crate's, because neither maintained one fits (looked at for kube 5 and
//! k8s-openapi 0.29):
//! - kubert's lease (kubert 0.25, the latest) needs kube-client/kube-runtime 1.1 and
//!   k8s-openapi 0.25, so it does not build beside kube 5.
//! - kube-lease-manager 0.13 builds with kube 5, but it judges expiry as the holder's
//!   `renewTime` plus the duration against this replica's wall clock (skew between replicas
//!   moves takeovers, which ours avoids by timing an unchanged record on its own clock); it does
//!   not tell a standby who holds the Lease (our `/readyz` says so, and tests/operator.rs checks
//!   it); it has no renew deadline (a holder that cannot renew stops only when the Lease
//!   expires); and it takes whole seconds and panics on settings that do not nest, where we
//!   refuse them with the flag to change.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use tracing::{info, warn};

use futures::FutureExt;

use crate::names::FIELD_MANAGER;
use crate::options::ControllerOptions;
use crate::telemetry::Role;

/// Which Lease, who we are, and the timings.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    /// The Lease's namespace: the operator's.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica's identity (its pod name); unique among replicas.
    pub identity: String,
    /// How long a standby waits on an unchanged record before taking the Lease over.
    pub duration: Duration,
    /// How long the holder keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// How often the holder renews and a standby tries.
    pub retry_period: Duration,
}

/// Lease flags that do not fit together, and which to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseFlagsError {
    /// No identity was given.
    #[error("the leader election identity is empty: set POD_NAME or --leader-elect-identity")]
    NoIdentity,
    /// `--lease-renew-deadline` is not shorter than `--lease-duration`.
    #[error(
        "--lease-renew-deadline ({renew_deadline:?}) must be shorter than --lease-duration ({duration:?})"
    )]
    RenewAfterExpiry {
        /// The renew deadline given.
        renew_deadline: Duration,
        /// The Lease duration given.
        duration: Duration,
    },
    /// `--lease-retry-period` is not shorter than `--lease-renew-deadline`.
    #[error(
        "--lease-retry-period ({retry_period:?}) must be shorter than --lease-renew-deadline ({renew_deadline:?})"
    )]
    RetryAfterDeadline {
        /// The retry period given.
        retry_period: Duration,
        /// The renew deadline given.
        renew_deadline: Duration,
    },
}

impl LeaseSettings {
    /// The timings must nest: retry period < renew deadline < duration, so that a holder stops
    /// before any standby may take over.
    pub fn validate(&self) -> Result<(), LeaseFlagsError> {
        if self.identity.is_empty() {
            return Err(LeaseFlagsError::NoIdentity);
        }
        if self.renew_deadline >= self.duration {
            return Err(LeaseFlagsError::RenewAfterExpiry {
                renew_deadline: self.renew_deadline,
                duration: self.duration,
            });
        }
        if self.retry_period >= self.renew_deadline {
            return Err(LeaseFlagsError::RetryAfterDeadline {
                retry_period: self.retry_period,
                renew_deadline: self.renew_deadline,
            });
        }
        Ok(())
    }
}

/// What one look at the Lease concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// We hold it (created, renewed or taken over).
    Held,
    /// Another replica holds it and its record is fresh.
    HeldBy(String),
}

/// What to do with the Lease as read, given whether its record has been unchanged for its
/// duration (`expired`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The Lease is ours: renew it.
    Renew,
    /// The Lease is free or its holder stopped renewing: take it.
    TakeOver,
    /// Another replica holds the Lease and renews it: wait. Its identity.
    Wait(String),
}

/// Pure: renew our own Lease, take over a released or expired one, or wait for its holder.
pub fn decide(spec: &LeaseSpec, identity: &str, expired: bool) -> Decision {
    match spec.holder_identity.as_deref().filter(|h| !h.is_empty()) {
        Some(h) if h == identity => Decision::Renew,
        Some(h) if !expired => Decision::Wait(h.to_string()),
        _ => Decision::TakeOver,
    }
}

/// The Lease spec after renewing (`taking_over` false) or taking over.
pub fn next_spec(
    spec: &LeaseSpec,
    settings: &LeaseSettings,
    now: Timestamp,
    taking_over: bool,
) -> LeaseSpec {
    let mut next = spec.clone();
    next.holder_identity = Some(settings.identity.clone());
    next.lease_duration_seconds = Some(settings.duration.as_secs().max(1) as i32);
    next.renew_time = Some(MicroTime(now));
    if taking_over {
        next.acquire_time = Some(MicroTime(now));
        next.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    next
}

/// The record a standby times (holder and renew time): it changes with every renewal.
type Record = (Option<String>, Option<String>);

fn record(spec: &LeaseSpec) -> Record {
    (
        spec.holder_identity.clone(),
        spec.renew_time.as_ref().map(|t| t.0.to_string()),
    )
}

/// One replica's view of the Lease.
pub struct Elector {
    api: Api<Lease>,
    settings: LeaseSettings,
    /// The last record seen and when it was first seen.
    observed: Option<(Record, Instant)>,
}

impl Elector {
    /// An elector of the Lease `settings` name, not leading yet.
    pub fn new(client: Client, settings: LeaseSettings) -> Self {
        Self {
            api: Api::namespaced(client, &settings.namespace),
            settings,
            observed: None,
        }
    }

    /// Which Lease, who we are, and the timings.
    pub fn settings(&self) -> &LeaseSettings {
        &self.settings
    }

    /// Look at the Lease once: create, renew or take it over when we may.
    pub async fn try_acquire_or_renew(&mut self) -> Result<Attempt, kube::Error> {
        let now = Timestamp::now();
        let Some(lease) = self.api.get_opt(&self.settings.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.settings.name.clone()),
                    namespace: Some(self.settings.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(next_spec(&LeaseSpec::default(), &self.settings, now, true)),
            };
            return match self.api.create(&self.post_params(), &lease).await {
                Ok(created) => {
                    self.observe(&created);
                    Ok(Attempt::Held)
                }
                // Another replica created it first.
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::HeldBy(String::new())),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        self.observe(&lease);
        // Time the record with the Lease's own duration: its holder may be configured otherwise.
        let duration = spec
            .lease_duration_seconds
            .map(|s| Duration::from_secs(s.max(0) as u64))
            .unwrap_or(self.settings.duration);
        let expired = self
            .observed
            .as_ref()
            .is_some_and(|(_, since)| since.elapsed() >= duration);
        let taking_over = match decide(&spec, &self.settings.identity, expired) {
            Decision::Wait(holder) => return Ok(Attempt::HeldBy(holder)),
            Decision::Renew => false,
            Decision::TakeOver => true,
        };
        let mut next = lease.clone();
        next.spec = Some(next_spec(&spec, &self.settings, now, taking_over));
        // The resourceVersion in `next` makes this a compare-and-swap: of two standbys taking
        // over at once, one gets 409.
        match self
            .api
            .replace(&self.settings.name, &self.post_params(), &next)
            .await
        {
            Ok(written) => {
                self.observe(&written);
                if taking_over {
                    info!(lease = %self.settings.name, namespace = %self.settings.namespace, previous = %spec.holder_identity.as_deref().unwrap_or("none"), "took over the leader Lease");
                }
                Ok(Attempt::Held)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                Ok(Attempt::HeldBy(spec.holder_identity.unwrap_or_default()))
            }
            Err(e) => Err(e),
        }
    }

    fn observe(&mut self, lease: &Lease) {
        let r = record(&lease.spec.clone().unwrap_or_default());
        if self.observed.as_ref().map(|(seen, _)| seen) != Some(&r) {
            self.observed = Some((r, Instant::now()));
        }
    }

    fn post_params(&self) -> PostParams {
        PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        }
    }

    /// Give the Lease up (on shutdown) so a standby takes over at once instead of after its
    /// duration.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.settings.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        self.api
            .replace(&lease.name_any(), &self.post_params(), &lease)
            .await?;
        info!(lease = %self.settings.name, namespace = %self.settings.namespace, "released the leader Lease");
        Ok(())
    }

    /// Wait until we hold the Lease, trying every retry period; `on_try` hears each attempt's
    /// outcome (who holds it, or the API server's error).
    pub async fn acquire(&mut self, mut on_try: impl FnMut(Result<&Attempt, &kube::Error>)) {
        let mut last_holder = None;
        loop {
            let attempt = self.try_acquire_or_renew().await;
            on_try(attempt.as_ref());
            match attempt {
                Ok(Attempt::Held) => return,
                Ok(Attempt::HeldBy(holder)) => {
                    if last_holder.as_ref() != Some(&holder) {
                        info!(lease = %self.settings.name, namespace = %self.settings.namespace, holder = %holder, "standing by: another replica leads");
                        last_holder = Some(holder);
                    }
                }
                Err(e) => {
                    warn!(lease = %self.settings.name, namespace = %self.settings.namespace, error = %crate::error_chain(&e), "reading the leader Lease failed; retrying");
                }
            }
            tokio::time::sleep(self.settings.retry_period).await;
        }
    }

    /// Renew every retry period while we lead; returns why leadership was lost.
    pub async fn hold(&mut self, mut on_try: impl FnMut(Result<&Attempt, &kube::Error>)) -> Lost {
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(self.settings.retry_period).await;
            let attempt = self.try_acquire_or_renew().await;
            on_try(attempt.as_ref());
            match attempt {
                Ok(Attempt::Held) => renewed = Instant::now(),
                Ok(Attempt::HeldBy(holder)) => return Lost::HeldBy(holder),
                Err(error) if renewed.elapsed() >= self.settings.renew_deadline => {
                    return Lost::NotRenewed {
                        deadline: self.settings.renew_deadline,
                        error,
                    };
                }
                Err(e) => {
                    warn!(lease = %self.settings.name, namespace = %self.settings.namespace, error = %crate::error_chain(&e), "renewing the leader Lease failed; retrying");
                }
            }
        }
    }
}

/// Why this replica stopped leading.
#[derive(Debug, thiserror::Error)]
pub enum Lost {
    /// Another replica holds the Lease now.
    #[error("lost leadership: the Lease is held by {0:?} now")]
    HeldBy(String),
    /// The Lease could not be renewed within the renew deadline.
    #[error("lost leadership: the Lease could not be renewed for {deadline:?}: {error}")]
    NotRenewed {
        /// The renew deadline.
        deadline: Duration,
        /// What the last renewal met.
        error: kube::Error,
    },
}

/// Run the controller while this replica holds the Lease, standing by until then.
///
/// `Ok` once `shutdown` resolved: in-flight reconciles finished (the Lease is renewed meanwhile)
/// and the Lease was released, so a standby takes over at once. `Err` when leadership was lost:
/// the controller is dropped at once, without another write, and the caller should exit so that
/// a restarted process starts clean.
pub async fn run_elected(
    client: Client,
    options: ControllerOptions,
    settings: LeaseSettings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Lost> {
    let telemetry = options.telemetry.clone();
    let readiness = telemetry.readiness.clone();
    let shutdown = shutdown.boxed().shared();
    let mut elector = Elector::new(client.clone(), settings);
    let on_try = |attempt: Result<&Attempt, &kube::Error>| {
        if let Ok(attempt) = attempt {
            readiness.contact();
            if let Attempt::HeldBy(holder) = attempt {
                readiness.set_role(Role::Standby(holder.clone()));
            }
        }
    };
    tokio::select! {
        () = elector.acquire(on_try) => {}
        () = shutdown.clone() => return Ok(()),
    }
    readiness.set_role(Role::Leader);
    telemetry.metrics.set_leader(true);
    info!(identity = %elector.settings().identity, "leading: starting the controller");
    let controller = crate::run(client, options, shutdown.clone());
    let outcome = tokio::select! {
        lost = elector.hold(|attempt| if attempt.is_ok() { readiness.contact() }) => Err(lost),
        () = controller => Ok(()),
    };
    telemetry.metrics.set_leader(false);
    match outcome {
        Ok(()) => {
            if let Err(e) = elector.release().await {
                warn!(lease = %elector.settings().name, namespace = %elector.settings().namespace, error = %crate::error_chain(&e), "releasing the leader Lease failed; a standby takes over when it expires");
            }
            Ok(())
        }
        Err(lost) => {
            readiness.set_role(Role::Starting);
            Err(lost)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> LeaseSettings {
        LeaseSettings {
            namespace: "tenantplane-system".into(),
            name: "tenantplane".into(),
            identity: "a".into(),
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    fn held_by(h: &str) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(h.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_fresh_lease_of_another_is_waited_on_and_an_expired_one_taken() {
        assert_eq!(
            decide(&held_by("b"), "a", false),
            Decision::Wait("b".into())
        );
        assert_eq!(decide(&held_by("b"), "a", true), Decision::TakeOver);
        assert_eq!(decide(&held_by("a"), "a", false), Decision::Renew);
        assert_eq!(decide(&held_by("a"), "a", true), Decision::Renew);
        // Released (holder cleared) or never held: taken at once.
        assert_eq!(
            decide(&LeaseSpec::default(), "a", false),
            Decision::TakeOver
        );
        assert_eq!(decide(&held_by(""), "a", false), Decision::TakeOver);
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_keeps_the_acquire_time() {
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let later = Timestamp::from_second(1_800_000_002).unwrap();
        let taken = next_spec(&held_by("b"), &settings(), now, true);
        assert_eq!(taken.holder_identity.as_deref(), Some("a"));
        assert_eq!(taken.lease_transitions, Some(1));
        assert_eq!(taken.lease_duration_seconds, Some(15));
        let renewed = next_spec(&taken, &settings(), later, false);
        assert_eq!(renewed.acquire_time, taken.acquire_time);
        assert_eq!(renewed.renew_time, Some(MicroTime(later)));
        assert_eq!(renewed.lease_transitions, Some(1));
    }

    #[test]
    fn timings_that_do_not_nest_are_refused_with_the_flag_to_change() {
        let mut s = settings();
        s.renew_deadline = Duration::from_secs(15);
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("--lease-renew-deadline")
        );
        let mut s = settings();
        s.retry_period = Duration::from_secs(10);
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("--lease-retry-period")
        );
        let mut s = settings();
        s.identity.clear();
        assert_eq!(s.validate(), Err(LeaseFlagsError::NoIdentity));
        assert!(settings().validate().is_ok());
    }
}
