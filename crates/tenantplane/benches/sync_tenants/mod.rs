//! The tenants of bench-sync: waiting until every one is Ready with Synced True and has the
//! `default` service account pod admission needs, with progress lines and what is still missing.

use std::time::{Duration, Instant};

use anyhow::bail;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::Api;
use kube::{Client, ResourceExt};
use tenantplane_api::conditions::{self, READY, SYNCED};
use tenantplane_api::{Phase, TenantCluster};

use crate::sync_pods::{PROGRESS_EVERY, say};

/// The tenant, as named in examples/tenantcluster-dev.yaml.
pub(crate) const TENANT: &str = "dev";
/// The tenant namespace the pods are created in.
pub(crate) const TENANT_NAMESPACE: &str = "default";

/// The phase and the Ready and Synced conditions, in one line.
pub(crate) fn describe(tc: &TenantCluster) -> String {
    let Some(status) = &tc.status else {
        return "no status yet".into();
    };
    let phase = status
        .phase
        .map(|p| p.to_string())
        .unwrap_or_else(|| "-".into());
    let mut line = format!("phase {phase}");
    for type_ in [READY, SYNCED] {
        match conditions::find(&status.conditions, type_) {
            Some(c) => line.push_str(&format!(
                "; {type_} {} {}: {}",
                c.status, c.reason, c.message
            )),
            None => line.push_str(&format!("; no {type_} condition")),
        }
    }
    line
}

/// Ready with Synced True.
pub(crate) fn ready_and_synced(tc: &TenantCluster) -> bool {
    let status = tc.status.as_ref();
    status.and_then(|s| s.phase) == Some(Phase::Ready)
        && status.is_some_and(|s| conditions::is_true(&s.conditions, SYNCED))
}

/// Every tenant's TenantCluster that is not Ready and Synced, one per line, at most `max`.
pub(crate) async fn tenants_status(admin: &Client, namespaces: &[String], max: usize) -> String {
    let mut lines = Vec::new();
    for ns in namespaces {
        let api: Api<TenantCluster> = Api::namespaced(admin.clone(), ns);
        match api.get(TENANT).await {
            Ok(tc) if ready_and_synced(&tc) => {}
            Ok(tc) => lines.push(format!("{ns}/{TENANT}: {}", describe(&tc))),
            Err(e) => lines.push(format!(
                "{ns}/{TENANT}: reading the TenantCluster failed: {e}"
            )),
        }
    }
    let more = lines.len().saturating_sub(max);
    lines.truncate(max);
    if more > 0 {
        lines.push(format!("and {more} more"));
    }
    if lines.is_empty() {
        "every TenantCluster is Ready and Synced".into()
    } else {
        lines.join("\n  ")
    }
}

/// Wait until the tenant in every one of `namespaces` is Ready with Synced True, printing how
/// many are every few seconds.
pub(crate) async fn tenants_ready(
    start: Instant,
    admin: &Client,
    namespaces: &[String],
) -> anyhow::Result<()> {
    let total = namespaces.len();
    let timeout = Duration::from_secs(300) + Duration::from_secs(30) * total as u32;
    let deadline = Instant::now() + timeout;
    let mut last_report = Instant::now();
    let api: Api<TenantCluster> = Api::all(admin.clone());
    loop {
        let (done, last) = match api.list(&Default::default()).await {
            Ok(list) => {
                let mut done = 0;
                let mut pending = None;
                for ns in namespaces {
                    match list.items.iter().find(|tc| {
                        tc.namespace().as_deref() == Some(ns.as_str()) && tc.name_any() == TENANT
                    }) {
                        Some(tc) if ready_and_synced(tc) => done += 1,
                        Some(tc) => {
                            pending
                                .get_or_insert_with(|| format!("{ns}/{TENANT}: {}", describe(tc)));
                        }
                        None => {
                            pending.get_or_insert_with(|| format!("{ns}/{TENANT}: not found"));
                        }
                    }
                }
                (done, pending.unwrap_or_default())
            }
            Err(e) => (0, format!("listing the TenantClusters failed: {e}")),
        };
        if done == total {
            return Ok(());
        }
        if last_report.elapsed() >= PROGRESS_EVERY {
            say(
                start,
                &format!("{done}/{total} tenants Ready and Synced; e.g. {last}"),
            );
            last_report = Instant::now();
        }
        if Instant::now() > deadline {
            bail!(
                "only {done}/{total} tenants Ready and Synced within {}s:\n  {}",
                timeout.as_secs(),
                tenants_status(admin, namespaces, 10).await
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Wait until the tenant's controller manager has made the `default` service account, which
/// pod admission in the tenant needs.
pub(crate) async fn tenant_service_account(
    start: Instant,
    tenant: &Client,
    which: &str,
) -> anyhow::Result<()> {
    let accounts = Api::<ServiceAccount>::namespaced(tenant.clone(), TENANT_NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last_report = Instant::now();
    loop {
        match accounts.get_opt("default").await {
            Ok(Some(_)) => return Ok(()),
            Ok(None) => {}
            Err(e) if Instant::now() > deadline => {
                bail!("the default service account of tenant {which}: {e}")
            }
            Err(_) => {}
        }
        if Instant::now() > deadline {
            bail!("tenant {which} has no default service account in {TENANT_NAMESPACE} after 60s");
        }
        if last_report.elapsed() >= PROGRESS_EVERY {
            say(
                start,
                &format!("waiting for the default service account of tenant {which}"),
            );
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
