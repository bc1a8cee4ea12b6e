//! The one exponential back-off: the wait before the `attempt`th retry doubles from `first` up
//! to `max`. The work queue (per key), the syncer's supervisor and the controller's reconcile
//! retries all wait by it.
//!
//! Ours rather than `backon`'s (which the watchers use through kube): every caller keeps a count
//! of failures in a row (per key, per tenant), and needs the wait for that count; `backon`'s
//! back-offs are iterators whose state would have to be kept per key instead.

use std::time::Duration;

/// The wait before retry number `attempt` (1 for the first failure; 0 counts as 1): `first`,
/// doubled with each failure after the first, never more than `max`.
pub fn delay(attempt: u32, first: Duration, max: Duration) -> Duration {
    let doublings = attempt.saturating_sub(1);
    first
        .saturating_mul(2u32.saturating_pow(doublings))
        .min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_from_the_first_to_the_cap() {
        let (first, max) = (Duration::from_secs(5), Duration::from_secs(300));
        let waits: Vec<u64> = (1..=9).map(|n| delay(n, first, max).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(delay(0, first, max), first);
        assert_eq!(delay(u32::MAX, first, max), max);
        assert_eq!(
            delay(40, Duration::from_millis(1), Duration::MAX),
            Duration::from_millis(1).saturating_mul(u32::MAX),
            "a count past 32 doublings saturates, never wraps"
        );
    }
}
