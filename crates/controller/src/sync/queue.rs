//! A keyed work queue, as client-go has: a key waiting is queued once however often it is added,
//! a key is never worked on by two workers at once, and a key added while it is worked on is
//! worked on again afterwards. Delayed adds wait on a timer.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

struct State<K> {
    queue: VecDeque<K>,
    /// When each waiting or dirty key was first added since it was last handed out.
    since: HashMap<K, Instant>,
    queued: HashSet<K>,
    processing: HashSet<K>,
    /// Added while processing: requeued when the worker is done.
    dirty: HashSet<K>,
    closed: bool,
}

/// See the module documentation.
pub struct WorkQueue<K> {
    state: Mutex<State<K>>,
    notify: Notify,
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                since: HashMap::new(),
                queued: HashSet::new(),
                processing: HashSet::new(),
                dirty: HashSet::new(),
                closed: false,
            }),
            notify: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K>> {
        // A worker that panicked while holding the lock left consistent sets behind: each change
        // is a single insert or remove.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue `key` unless it is queued already.
    pub fn add(&self, key: K) {
        let mut s = self.lock();
        if s.closed {
            return;
        }
        s.since.entry(key.clone()).or_insert_with(Instant::now);
        if s.processing.contains(&key) {
            s.dirty.insert(key);
            return;
        }
        if s.queued.insert(key.clone()) {
            s.queue.push_back(key);
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Queue `key` after `delay`.
    pub fn add_after(self: &Arc<Self>, key: K, delay: Duration) {
        let queue = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(q) = queue.upgrade() {
                q.add(key);
            }
        });
    }

    /// The next key to work on; `None` once the queue is closed.
    pub async fn next(&self) -> Option<K> {
        self.next_timed().await.map(|(key, _)| key)
    }

    /// The next key to work on and when it was first added while waiting.
    pub async fn next_timed(&self) -> Option<(K, Instant)> {
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
                    return Some((key, since));
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

    /// Keys waiting (not those being worked on).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stop handing out keys; workers waiting in [`next`](Self::next) get `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_waiters();
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
}
