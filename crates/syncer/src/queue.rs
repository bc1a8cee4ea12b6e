//! A keyed work queue, as client-go has: a key waiting is queued once however often it is added,
//! a key is never worked on by two workers at once, and a key added while it is worked on is
//! worked on again afterwards.
//!
//! A key that fails is retried after a per-key exponential back-off, and has at most one retry
//! pending: one timer task serves every delayed key. While a key waits for its retry, ordinary
//! wake-ups (a watch event, often our own status write) do not run it early; a change of the
//! tenant object itself ([`WorkQueue::add_changed`]) does, and starts the back-off afresh.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backoff;

/// The longest a failing key waits for its next try.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

struct State<K> {
    queue: VecDeque<K>,
    /// When each waiting or dirty key was first added since it was last handed out.
    since: HashMap<K, Instant>,
    queued: HashSet<K>,
    processing: HashSet<K>,
    /// Added while processing: requeued when the worker is done.
    dirty: HashSet<K>,
    /// Keys due later, each once: when, and its place on the timeline.
    delayed: HashMap<K, (Instant, u64)>,
    timeline: BTreeMap<(Instant, u64), K>,
    sequence: u64,
    /// Failures in a row, per key.
    failures: HashMap<K, u32>,
    closed: bool,
}

impl<K: Clone + Eq + Hash> State<K> {
    fn push(&mut self, key: K) -> bool {
        self.since.entry(key.clone()).or_insert_with(Instant::now);
        if self.processing.contains(&key) {
            self.dirty.insert(key);
            return false;
        }
        if self.queued.insert(key.clone()) {
            self.queue.push_back(key);
            return true;
        }
        false
    }

    fn undelay(&mut self, key: &K) {
        if let Some(slot) = self.delayed.remove(key) {
            self.timeline.remove(&slot);
        }
    }

    /// Put `key` on the timeline at `at`, replacing a later entry (`keep_earlier`) or any entry.
    fn delay(&mut self, key: K, at: Instant, keep_earlier: bool) -> bool {
        if let Some((current, _)) = self.delayed.get(&key) {
            if keep_earlier && *current <= at {
                return false;
            }
            self.undelay(&key);
        }
        self.sequence += 1;
        let slot = (at, self.sequence);
        self.timeline.insert(slot, key.clone());
        self.delayed.insert(key, slot);
        true
    }

    /// Queue the keys that are due; when the next one is.
    fn promote(&mut self, now: Instant) -> (bool, Option<Instant>) {
        let mut woke = false;
        while let Some((&slot, _)) = self.timeline.first_key_value() {
            if slot.0 > now {
                return (woke, Some(slot.0));
            }
            if let Some(key) = self.timeline.remove(&slot) {
                self.delayed.remove(&key);
                woke |= self.push(key);
            }
        }
        (woke, None)
    }
}

/// See the module documentation.
pub struct WorkQueue<K> {
    state: Mutex<State<K>>,
    notify: Notify,
    /// Wakes the timer task when the timeline changes.
    timer: Arc<Notify>,
}

impl<K> Drop for WorkQueue<K> {
    fn drop(&mut self) {
        // The timer task finds the queue gone and ends.
        self.timer.notify_one();
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    /// A new queue and its timer task (which ends with the queue).
    pub fn new() -> Arc<Self> {
        let timer = Arc::new(Notify::new());
        let queue = Arc::new(Self {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                since: HashMap::new(),
                queued: HashSet::new(),
                processing: HashSet::new(),
                dirty: HashSet::new(),
                delayed: HashMap::new(),
                timeline: BTreeMap::new(),
                sequence: 0,
                failures: HashMap::new(),
                closed: false,
            }),
            notify: Notify::new(),
            timer: timer.clone(),
        });
        tokio::spawn(run_timer(Arc::downgrade(&queue), timer));
        queue
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K>> {
        // A worker that panicked while holding the lock left consistent sets behind: each change
        // is completed before the lock is released.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn woke(&self, woke: bool) {
        if woke {
            self.notify.notify_one();
        }
    }

    /// Queue `key` unless it is queued already, or waits for the retry of a failure.
    pub fn add(&self, key: K) {
        let mut s = self.lock();
        if s.closed || (s.failures.contains_key(&key) && s.delayed.contains_key(&key)) {
            return;
        }
        let woke = s.push(key);
        drop(s);
        self.woke(woke);
    }

    /// The tenant object behind `key` changed: forget its back-off and queue it now.
    pub fn add_changed(&self, key: K) {
        let mut s = self.lock();
        if s.closed {
            return;
        }
        if s.failures.remove(&key).is_some() {
            s.undelay(&key);
        }
        let woke = s.push(key);
        drop(s);
        self.woke(woke);
    }

    /// Queue `key` after `delay`, unless it is due earlier already.
    pub fn add_after(&self, key: K, delay: Duration) {
        let mut s = self.lock();
        if s.closed {
            return;
        }
        if s.delay(key, Instant::now() + delay, true) {
            drop(s);
            self.timer.notify_one();
        }
    }

    /// `key` failed: queue it again after its back-off, which starts at `first` and doubles
    /// with each failure in a row, up to [`MAX_BACKOFF`]. Returns the delay.
    pub fn retry(&self, key: K, first: Duration) -> Duration {
        self.retry_up_to(key, first, MAX_BACKOFF)
    }

    /// [`retry`](Self::retry), the delay growing up to `max` rather than [`MAX_BACKOFF`].
    pub fn retry_up_to(&self, key: K, first: Duration, max: Duration) -> Duration {
        let mut s = self.lock();
        let failures = s.failures.entry(key.clone()).or_insert(0);
        *failures = failures.saturating_add(1);
        let delay = backoff::delay(*failures, first, max);
        if !s.closed {
            s.delay(key, Instant::now() + delay, false);
            drop(s);
            self.timer.notify_one();
        }
        delay
    }

    /// `key` converged: its back-off starts afresh at the next failure.
    pub fn forget(&self, key: &K) {
        let mut s = self.lock();
        if s.failures.remove(key).is_some() {
            s.undelay(key);
        }
    }

    /// The next key to work on; `None` once the queue is closed.
    pub async fn next(&self) -> Option<K> {
        self.next_timed().await.map(|(key, _)| key)
    }

    /// The next key to work on and when it was first added while waiting.
    pub async fn next_timed(&self) -> Option<(K, std::time::Instant)> {
        loop {
            let notified = self.notify.notified();
            {
                let mut s = self.lock();
                if s.closed {
                    return None;
                }
                if let Some(key) = s.queue.pop_front() {
                    s.queued.remove(&key);
                    let since = s.since.remove(&key).unwrap_or_else(Instant::now);
                    s.processing.insert(key.clone());
                    let more = !s.queue.is_empty();
                    drop(s);
                    if more {
                        // Wake another worker for the rest.
                        self.notify.notify_one();
                    }
                    return Some((key, since.into_std()));
                }
            }
            notified.await;
        }
    }

    /// The worker is done with `key`.
    pub fn done(&self, key: &K) {
        let mut s = self.lock();
        s.processing.remove(key);
        if s.dirty.remove(key) && s.queued.insert(key.clone()) {
            s.queue.push_back(key.clone());
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Keys waiting (not those being worked on, nor those due later).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// Whether no key waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys due later (retries and scheduled passes).
    pub fn delayed(&self) -> usize {
        self.lock().delayed.len()
    }

    /// Stop handing out keys; workers waiting in [`next`](Self::next) get `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_waiters();
        self.timer.notify_one();
    }
}

/// The one timer of a queue: sleeps until the earliest delayed key is due and queues it.
async fn run_timer<K: Clone + Eq + Hash + Send + 'static>(
    queue: Weak<WorkQueue<K>>,
    timer: Arc<Notify>,
) {
    loop {
        let changed = timer.notified();
        let next = {
            let Some(q) = queue.upgrade() else { return };
            let mut s = q.lock();
            if s.closed {
                return;
            }
            let (woke, next) = s.promote(Instant::now());
            drop(s);
            q.woke(woke);
            next
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = changed => {}
                }
            }
            None => changed.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_key_is_queued_once_and_redone_when_added_during_work() {
        let q = WorkQueue::new();
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.len(), 2);
        let first = q.next().await.unwrap();
        assert_eq!(first, "a");
        q.add("a"); // while processing
        assert_eq!(q.len(), 1, "only b waits; a is marked dirty");
        q.done(&first);
        assert_eq!(q.next().await, Some("b"));
        assert_eq!(q.next().await, Some("a"));
        q.close();
        assert_eq!(q.next().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_key_backs_off_and_ordinary_wakes_do_not_hurry_it() {
        let q = WorkQueue::new();
        let first = Duration::from_secs(10);
        let mut delays = Vec::new();
        for _ in 0..8 {
            delays.push(q.retry("pod", first).as_secs());
        }
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(q.delayed(), 1, "one pending retry, however many failures");

        q.forget(&"pod");
        let started = Instant::now();
        q.retry("pod", first);
        // Our own status write wakes the key: it still waits for its retry.
        q.add("pod");
        assert!(q.is_empty());
        assert_eq!(q.next().await, Some("pod"));
        assert_eq!(started.elapsed().as_secs(), 10);
        q.done(&"pod");

        // A change of the tenant object runs it now and starts the back-off afresh.
        q.retry("pod", first);
        q.retry("pod", first);
        q.add_changed("pod");
        assert_eq!(q.len(), 1);
        assert_eq!(q.next().await, Some("pod"));
        q.done(&"pod");
        assert_eq!(q.retry("pod", first).as_secs(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn scheduled_passes_keep_the_earliest_and_do_not_block_wakes() {
        let q = WorkQueue::new();
        q.add_after("token", Duration::from_secs(3000));
        q.add_after("token", Duration::from_secs(5));
        q.add_after("token", Duration::from_secs(60));
        assert_eq!(q.delayed(), 1);
        // Not a failure: a watch event still runs it now.
        q.add("token");
        assert_eq!(q.next().await, Some("token"));
        q.done(&"token");
        let started = Instant::now();
        assert_eq!(q.next().await, Some("token"));
        assert_eq!(started.elapsed().as_secs(), 5);
    }
}
