//! A watch that lists again after every error, so that its recovery is heard.
//!
//! kube's watcher resumes silently: once a failed watch starts again at its resourceVersion, it
//! emits nothing until an object changes. A syncer that said "the watch fails" would go on
//! saying so (a host API server restarted mid-burst kept `Synced` False for minutes, until the
//! next change to a copy). Here the watcher is started afresh after an error: its first list is
//! the proof that the watch works, and it also catches whatever changed while it was down. A
//! relist costs one list per error, and errors are rare (an API server restarting, a 410 after
//! compaction, which relists anyway).

use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::Api;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;

use crate::backoff;

/// The wait before the first restart after an error; it doubles with each error in a row.
const FIRST_RETRY: Duration = Duration::from_millis(800);
/// The longest wait between restarts (kube's watcher back-off stops there too).
const MAX_RETRY: Duration = Duration::from_secs(30);
/// A watch that ran this long before failing starts its back-off over.
const HEALTHY: Duration = Duration::from_secs(120);

/// The events of `api` under `config`; after an error (yielded as it comes), a pause by the
/// back-off and a fresh watcher, which lists first.
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    struct State<K: 'static> {
        stream: Option<BoxStream<'static, watcher::Result<watcher::Event<K>>>>,
        failures: u32,
        since: Instant,
    }
    let start = State {
        stream: None,
        failures: 0,
        since: Instant::now(),
    };
    futures::stream::unfold(start, move |mut s| {
        let (api, config) = (api.clone(), config.clone());
        async move {
            loop {
                let stream = match s.stream.as_mut() {
                    Some(stream) => stream,
                    None => {
                        if s.failures > 0 {
                            tokio::time::sleep(backoff::delay(s.failures, FIRST_RETRY, MAX_RETRY))
                                .await;
                        }
                        s.since = Instant::now();
                        s.stream
                            .insert(watcher(api.clone(), config.clone()).boxed())
                    }
                };
                match stream.next().await {
                    Some(Ok(event)) => return Some((Ok(event), s)),
                    Some(Err(e)) => {
                        if s.since.elapsed() > HEALTHY {
                            s.failures = 0;
                        }
                        s.failures += 1;
                        s.stream = None;
                        return Some((Err(e), s));
                    }
                    None => s.stream = None,
                }
            }
        }
    })
}

/// Whether an event proves the watch answers: all but `Init`, which a watcher emits before it
/// sends its list.
pub fn answered<K>(event: &watcher::Event<K>) -> bool {
    !matches!(event, watcher::Event::Init)
}
