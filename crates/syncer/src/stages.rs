//! Where a synced object's time goes, stage by stage. Each stage runs in a tracing span
//! (`sync_stage`, with `stage` and `kind`) and its duration goes to the [`Observer`], which the
//! operator exports as `tenantplane_sync_stage_seconds{stage,kind}`.
//!
//! A pod's path: the tenant watch queues its key (`queue` is the wait for a worker), a worker
//! converges it (`converge`, all of it), reading the host for a name the cache does not show
//! (`host_read`) and writing the copy (`host_write`); the host watch brings the copy back
//! (`host_watch`, from the write's answer to the event), which queues the key again, and its
//! status goes up to the tenant (`tenant_write`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::health::Observer;

/// One stage of a synced object's path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// From the key queued (a watch event) to a worker taking it.
    Queue,
    /// A worker's whole converge of one key.
    Converge,
    /// A read of the host before a create, for a name the cache does not show.
    HostRead,
    /// A write of a copy to the host.
    HostWrite,
    /// From the host's answer to a write to the host watch's event for it.
    HostWatch,
    /// A write to the tenant: a pod's status, its binding.
    TenantWrite,
}

impl Stage {
    /// Every stage, in the order an object meets them.
    pub const ALL: [Stage; 6] = [
        Stage::Queue,
        Stage::Converge,
        Stage::HostRead,
        Stage::HostWrite,
        Stage::HostWatch,
        Stage::TenantWrite,
    ];

    /// The `stage` label.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Queue => "queue",
            Stage::Converge => "converge",
            Stage::HostRead => "host_read",
            Stage::HostWrite => "host_write",
            Stage::HostWatch => "host_watch",
            Stage::TenantWrite => "tenant_write",
        }
    }
}

/// Writes of one kind whose watch event has not come yet, at most this many (an event that never comes, as
/// for a write the host refused after answering, must not make the map grow).
const MAX_PENDING: usize = 10_000;

/// One tenant's stage timings: where they go, and the host writes waiting for their event.
#[derive(Clone)]
pub struct Stages {
    observer: Arc<dyn Observer>,
    /// By kind, then name: every host event of the tenant's copies looks here, by a borrowed name.
    written: Arc<Mutex<HashMap<&'static str, HashMap<String, Instant>>>>,
}

impl Stages {
    pub(crate) fn new(observer: Arc<dyn Observer>) -> Self {
        Self {
            observer,
            written: Arc::default(),
        }
    }

    /// `kind` spent `took` in `stage`.
    pub fn observe(&self, stage: Stage, kind: &'static str, took: Duration) {
        self.observer.stage(stage.name(), kind, took);
    }

    /// Run `work` as `stage` of `kind`: in its span, its duration observed.
    pub async fn time<T>(
        &self,
        stage: Stage,
        kind: &'static str,
        work: impl Future<Output = T>,
    ) -> T {
        let span = tracing::debug_span!("sync_stage", stage = stage.name(), kind);
        let started = Instant::now();
        let out = work.instrument(span).await;
        self.observe(stage, kind, started.elapsed());
        out
    }

    /// The host answered a write of `kind` named `name`: its watch event is due.
    pub fn wrote(&self, kind: &'static str, name: &str) {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        let of_kind = written.entry(kind).or_default();
        if of_kind.len() >= MAX_PENDING {
            of_kind.clear();
        }
        of_kind.insert(name.to_string(), Instant::now());
    }

    /// The host watch brought `kind` named `name`: the time since its write, if one was waiting.
    pub fn echoed(&self, kind: &'static str, name: &str) {
        let since = self
            .written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(kind)
            .and_then(|of_kind| of_kind.remove(name));
        if let Some(since) = since {
            self.observe(Stage::HostWatch, kind, since.elapsed());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Seen(Mutex<Vec<(&'static str, &'static str)>>);

    impl Observer for Seen {
        fn synced(&self, _: &str, _: &str, _: &'static str, _: Duration) {}
        fn sync_failed(&self, _: &str, _: &str, _: &'static str, _: &'static str) {}
        fn stage(&self, stage: &'static str, kind: &'static str, _: Duration) {
            self.0.lock().unwrap().push((stage, kind));
        }
    }

    #[tokio::test]
    async fn a_write_is_timed_until_its_event_once_and_a_timed_stage_is_observed() {
        let seen = Arc::new(Seen::default());
        let stages = Stages::new(seen.clone());
        assert_eq!(stages.time(Stage::HostWrite, "Pod", async { 7 }).await, 7);
        // An event with no write waiting (someone else's change) is no echo.
        stages.echoed("Pod", "a");
        stages.wrote("Pod", "a");
        stages.echoed("Pod", "a");
        stages.echoed("Pod", "a");
        assert_eq!(
            *seen.0.lock().unwrap(),
            [("host_write", "Pod"), ("host_watch", "Pod")]
        );
    }

    #[test]
    fn writes_without_events_are_bounded() {
        let stages = Stages::new(Arc::new(Seen::default()));
        for i in 0..MAX_PENDING + 5 {
            stages.wrote("Pod", &i.to_string());
        }
        assert!(stages.written.lock().unwrap()["Pod"].len() <= MAX_PENDING);
    }
}
