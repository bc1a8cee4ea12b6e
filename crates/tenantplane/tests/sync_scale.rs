//! Host watches are shared by every tenant's syncer: one operator serving 20 tenants keeps as
//! many watches open on the host as it does serving one, read from the host API server's own
//! metrics. A binary of its own, so that its control plane serves nothing else.

use std::time::{Duration, Instant};

mod common;
use common::*;

use kube::Client;
use kube::api::{Api, PostParams};
use tenantplane_api::conditions::{self, SYNCED};
use tenantplane_api::{Phase, TenantCluster};
use tenantplane_local::runtime;
use tenantplane_testenv::metrics::{open_watches, synced_watches};
use tenantplane_testenv::{install_crds_and_policies, namespace, operator, shared};

const TENANTS: usize = 20;

/// The host's open watches on the kinds the syncer watches, the most seen in a few samples (a
/// watch being renewed is briefly missing).
async fn host_watches(admin: &Client) -> f64 {
    let mut most: f64 = 0.0;
    for _ in 0..5 {
        let watches = open_watches(admin).await.expect("the host's metrics");
        most = most.max(synced_watches(&watches));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    most
}

/// Wait until every tenant in `namespaces` is Ready with `Synced` True.
async fn all_synced(admin: &Client, namespaces: &[String]) {
    let started = Instant::now();
    let mut last_report = Instant::now();
    loop {
        let mut done = 0;
        let mut waiting = Vec::new();
        for ns in namespaces {
            let tc = Api::<TenantCluster>::namespaced(admin.clone(), ns)
                .get_opt("dev")
                .await
                .ok()
                .flatten();
            let status = tc.and_then(|tc| tc.status);
            let ok = status.as_ref().is_some_and(|s| {
                s.phase == Some(Phase::Ready) && conditions::is_true(&s.conditions, SYNCED)
            });
            done += usize::from(ok);
            if !ok {
                waiting.push(format!("{ns}: {}", describe(status.as_ref())));
            }
        }
        if done == namespaces.len() {
            return;
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "{done}/{} tenants Ready and Synced after {:?}",
                namespaces.len(),
                started.elapsed()
            );
            last_report = Instant::now();
        }
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "only {done}/{} tenants became Ready and Synced; the others:\n{}",
            namespaces.len(),
            waiting.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A tenant's phase and the conditions that are not True, with their reasons and messages.
fn describe(status: Option<&tenantplane_api::TenantClusterStatus>) -> String {
    let Some(s) = status else {
        return "no status yet".into();
    };
    let mut out = format!("phase {:?}", s.phase);
    for c in s.conditions.iter().filter(|c| c.status != "True") {
        out.push_str(&format!(
            "; {} {} ({}): {}",
            c.type_, c.status, c.reason, c.message
        ));
    }
    out
}

#[tokio::test]
async fn host_watches_do_not_grow_with_the_number_of_tenants() {
    install_crds_and_policies();
    let first = namespace("scale").await;
    let admin = first.client.clone();
    // One operator for every namespace, as a cluster-wide install runs it.
    let controller = tokio::spawn(tenantplane_controller::run(
        operator::client(),
        tenantplane_local::tenant::local_operator_options(None, Some(Duration::from_secs(2)), None),
        futures::future::pending(),
    ));
    let (_runtime, runtime_task) = runtime::start(
        admin.clone(),
        shared().binaries().clone(),
        shared().dir().join("runtime"),
        None,
    );
    let before = host_watches(&admin).await;
    let create = |ns: String| {
        let admin = admin.clone();
        async move {
            Api::<TenantCluster>::namespaced(admin, &ns)
                .create(&PostParams::default(), &example(&ns))
                .await
                .unwrap();
            ns
        }
    };
    let mut namespaces = vec![create(first.name.clone()).await];
    all_synced(&admin, &namespaces).await;
    let one = host_watches(&admin).await;

    let mut rest = Vec::new();
    for _ in 1..TENANTS {
        rest.push(namespace("scale").await);
    }
    for ns in &rest {
        namespaces.push(create(ns.name.clone()).await);
    }
    all_synced(&admin, &namespaces).await;
    let many = host_watches(&admin).await;
    println!(
        "host WATCH requests on the synced kinds: {before} before any tenant, {one} with 1 tenant, {many} with {TENANTS}"
    );
    assert_eq!(
        one, many,
        "the host's watches grew from {one} with 1 tenant to {many} with {TENANTS}"
    );
    controller.abort();
    runtime_task.abort();
}
