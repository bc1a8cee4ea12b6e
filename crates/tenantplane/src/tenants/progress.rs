//! How a tenant's phase and conditions read on a line, and the watch that follows one tenant.

use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tenantplane_api::conditions::{self, READY, SYNCED};
use tenantplane_api::{Phase, TenantCluster};

/// The watch on one object, with kube's back-off between failed attempts: `None` when it is
/// gone (or was never there).
pub(super) fn watch_one(
    api: Api<TenantCluster>,
    name: &str,
) -> impl Stream<Item = Result<Option<TenantCluster>, watcher::Error>> + Send + use<> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    watcher(api, config)
        .default_backoff()
        .scan(false, |seen, event| {
            if matches!(event, Ok(watcher::Event::Init)) {
                *seen = false;
            } else if matches!(event, Ok(watcher::Event::InitApply(_))) {
                *seen = true;
            }
            futures::future::ready(Some((*seen, event)))
        })
        .filter_map(|(seen, event)| async move {
            match event {
                Ok(watcher::Event::Apply(tc) | watcher::Event::InitApply(tc)) => Some(Ok(Some(tc))),
                Ok(watcher::Event::Delete(_)) => Some(Ok(None)),
                Ok(watcher::Event::InitDone) if !seen => Some(Ok(None)),
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            }
        })
}

/// A watch error that waiting longer will not fix.
pub(super) fn fatal_watch_error(error: &watcher::Error) -> Option<String> {
    let (watcher::Error::InitialListFailed(kube::Error::Api(status))
    | watcher::Error::WatchStartFailed(kube::Error::Api(status))) = error
    else {
        return None;
    };
    matches!(status.code, 401 | 403).then(|| {
        format!(
            "cannot watch TenantClusters: {}; ask your cluster admin for the watch right on tenantclusters.tenantplane.io",
            status.message
        )
    })
}

pub(super) fn phase_of(tc: &TenantCluster) -> Option<Phase> {
    let status = tc.status.as_ref()?;
    // A status written for an older spec says nothing about this one.
    let current = status.observed_generation >= tc.metadata.generation;
    status.phase.filter(|_| current)
}

pub(super) fn condition<'a>(tc: &'a TenantCluster, type_: &str) -> Option<&'a Condition> {
    conditions::find(&tc.status.as_ref()?.conditions, type_)
}

/// What a progress line reports; a new line when any of it changes.
pub(super) fn progress_key(tc: &TenantCluster) -> (Option<Phase>, Vec<(String, String)>) {
    let of = |type_| {
        condition(tc, type_)
            .map(|c| (c.status.clone(), c.reason.clone()))
            .unwrap_or_default()
    };
    (phase_of(tc), vec![of(READY), of(SYNCED)])
}

/// The message that explains where the tenant stands: the first of Ready and Synced that is not
/// True, else Ready's.
pub(super) fn explaining_condition(tc: &TenantCluster) -> Option<&Condition> {
    [READY, SYNCED]
        .iter()
        .filter_map(|t| condition(tc, t))
        .find(|c| c.status != "True")
        .or_else(|| condition(tc, READY))
}

pub(super) fn progress_line(elapsed: Duration, tc: &TenantCluster) -> String {
    let phase = phase_of(tc).map_or_else(|| "(no status yet)".to_string(), |p| p.to_string());
    let part = |type_: &str| match condition(tc, type_) {
        Some(c) => format!("{type_} {} ({})", c.status, c.reason),
        None => format!("{type_} -"),
    };
    let mut line = format!(
        "{:>4}s  {phase}: {}, {}",
        elapsed.as_secs(),
        part(READY),
        part(SYNCED)
    );
    if let Some(c) = explaining_condition(tc).filter(|c| !c.message.is_empty()) {
        line.push_str(": ");
        line.push_str(&one_line(&c.message));
    }
    line
}

pub(super) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `Provisioning, ControlPlaneNotReady: pod dev-0 is Pending`: where the tenant stands.
pub(super) fn last_word(tc: &TenantCluster) -> String {
    let Some(phase) = phase_of(tc) else {
        return "no status yet (is the operator running?)".to_string();
    };
    match explaining_condition(tc) {
        Some(c) => format!("{phase}, {}", reason_and_message(c)),
        None => phase.to_string(),
    }
}

pub(super) fn reason_and_message(c: &Condition) -> String {
    format!("{}: {}", c.reason, one_line(&c.message))
}
