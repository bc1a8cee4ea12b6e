//! The host API server's open WATCH requests on the kinds the syncers watch, as bench-sync reads
//! them before the tenants, with them and with their pods.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use kube::Client;
use tenantplane_testenv::metrics::{SYNCED_RESOURCES, open_watches, synced_watches};

/// The host API server's open WATCH requests by resource, once the sum over the synced kinds
/// reads the same twice a second apart (watches being opened or closed have settled), or after
/// 20 s.
pub(crate) async fn settled_watches(admin: &Client) -> anyhow::Result<BTreeMap<String, f64>> {
    let read = async || {
        open_watches(admin)
            .await
            .context("reading the host API server's /metrics")
    };
    let mut last = read().await?;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = read().await?;
        if synced_watches(&now) == synced_watches(&last) {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}

/// `kind a/b/c` for every synced kind with an open watch in any of the readings.
pub(crate) fn watches_by_kind(readings: &[&BTreeMap<String, f64>]) -> String {
    let kinds: Vec<String> = SYNCED_RESOURCES
        .iter()
        .filter(|kind| {
            readings
                .iter()
                .any(|r| r.get(**kind).is_some_and(|v| *v > 0.0))
        })
        .map(|kind| {
            let counts: Vec<String> = readings
                .iter()
                .map(|r| r.get(*kind).copied().unwrap_or(0.0).to_string())
                .collect();
            format!("{kind} {}", counts.join("/"))
        })
        .collect();
    if kinds.is_empty() {
        "none".into()
    } else {
        kinds.join(", ")
    }
}
