//! The operator as it runs in a cluster: the built binary (`tenantplane controller`) as separate
//! processes against the test control plane, with the local runtime in the test. Leader election
//! between replicas (kill the leader, SIGTERM the next), `/metrics`, `/healthz`, `/readyz`, JSON
//! logs, and certificate renewal. Who wrote what is read from the API server's audit log, which
//! records each replica's user agent. The replicas run as the operator's ServiceAccount, with the
//! RBAC of `deploy/operator`, as a Deployment of it would.

mod common;

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tenantplane_api::{Phase, TenantCluster};
use tenantplane_controller::build::kubeconfig;
use tenantplane_controller::names;
use tenantplane_testenv::{eventually, install_crds_and_policies, namespace, shared};

use common::replica::{LEASE, LEASE_NAMESPACE, Replica, holder, leader_args, wait_for_holder};
use common::{WAIT, local_runtime_for, tenant_client, tenant_named, wait_for_phase};

/// Write requests in the audit log made by the replica named `identity`: (verb, resource, name).
fn writes_by(identity: &str) -> Vec<(String, String, String)> {
    let agent = format!("({identity})");
    let text = std::fs::read_to_string(shared().audit_log_path()).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["userAgent"].as_str().is_some_and(|a| a.ends_with(&agent)))
        .map(|e| {
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            (
                s(&e["verb"]),
                s(&e["objectRef"]["resource"]),
                s(&e["objectRef"]["name"]),
            )
        })
        .collect()
}

/// Delete TenantCluster `name` (the next one the test makes needs the namespace: one tenant per
/// namespace; it is provisioned once this one is gone).
async fn delete(client: &Client, ns: &str, name: &str) {
    Api::<TenantCluster>::namespaced(client.clone(), ns)
        .delete(name, &kube::api::DeleteParams::default())
        .await
        .unwrap();
}

async fn create(client: &Client, ns: &str, name: &str) {
    Api::<TenantCluster>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &tenant_named(ns, name))
        .await
        .unwrap();
}

#[tokio::test]
async fn one_replica_leads_and_a_standby_takes_over_without_writing_before() {
    install_crds_and_policies();
    let ns = namespace("leader").await;
    let c = ns.client.clone();
    let _runtime = local_runtime_for(&ns);
    let args = leader_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = format!("a-{}", ns.name);
    let b = format!("b-{}", ns.name);
    let mut replica_a = Replica::start(&ns, &a, &args);
    wait_for_holder(&c, &a).await;
    let replica_b = Replica::start(&ns, &b, &args);

    // Both answer; the leader is ready once its caches are, the standby once it has read the Lease.
    let a_ready = replica_a
        .ready()
        .await
        .expect("the leader never became ready");
    assert_eq!(a_ready.trim(), "leader: caches synced");
    let b_ready = replica_b
        .ready()
        .await
        .expect("the standby never became ready");
    assert_eq!(
        b_ready.trim(),
        format!("standby: the Lease is held by {a:?}")
    );
    assert_eq!(replica_b.get("/healthz").await.unwrap().0, 200);
    assert_eq!(replica_b.metric("tenantplane_leader").await, Some(0.0));
    assert_eq!(replica_a.metric("tenantplane_leader").await, Some(1.0));

    // The leader converges a tenant; its metrics show it.
    create(&c, &ns.name, "one").await;
    wait_for_phase(&c, &ns.name, "one", Phase::Ready).await;
    let metrics = eventually(WAIT, || async {
        let ready = replica_a
            .metric("tenantplane_tenants{phase=\"Ready\"}")
            .await?;
        (ready == 1.0).then_some(())?;
        let (_, body) = replica_a.get("/metrics").await?;
        // The syncer copies the tenant's DNS Service soon after Ready, not before.
        body.contains("tenantplane_sync_stage_seconds_count{stage=\"host_write\"")
            .then_some(body)
    })
    .await
    .expect("the leader's metrics never counted the Ready tenant and a copy written");
    let series = |prefix: &str| -> f64 {
        metrics
            .lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .filter_map(|rest| rest.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert!(
        series("tenantplane_reconciles_total{result=\"success\"") >= 1.0,
        "{metrics}"
    );
    assert!(series("tenantplane_reconcile_duration_seconds_count{result=\"success\"}") >= 1.0);
    let tenant_labels = format!("namespace=\"{}\",tenant=\"one\"", ns.name);
    assert!(
        series(&format!(
            "tenantplane_sync_lag_seconds_count{{{tenant_labels}"
        )) >= 1.0,
        "no sync lag for the tenant in:\n{metrics}"
    );
    // Where the syncer's time went: its keys waited, were converged, and copies were written.
    for stage in ["queue", "converge", "host_write"] {
        assert!(
            series(&format!(
                "tenantplane_sync_stage_seconds_count{{stage=\"{stage}\""
            )) >= 1.0,
            "no {stage} stage in:\n{metrics}"
        );
    }
    let admin_expiry = series(&format!(
        "tenantplane_certificate_expiry_timestamp_seconds{{{tenant_labels},certificate=\"admin\"}}"
    ));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        admin_expiry > now + 300.0 * 86400.0,
        "admin certificate expiry {admin_expiry}"
    );
    for ca in ["server-ca", "client-ca", "request-header-ca"] {
        let at = series(&format!(
            "tenantplane_certificate_expiry_timestamp_seconds{{{tenant_labels},certificate=\"{ca}\"}}"
        ));
        assert!(at > now + 9.0 * 365.0 * 86400.0, "{ca} expiry {at}");
    }

    // A pod the syncer refuses (privileged, which the profile does not allow) counts as a sync
    // error of kind Pod. (In `kube-system`, which the tenant's Pod Security exempts: elsewhere
    // the tenant API server refuses it at once.)
    let tenant = tenant_client(&c, &ns.name, "one").await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "priv", "namespace": "kube-system"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": true}}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(tenant, "kube-system")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let errors = format!(
        "tenantplane_sync_errors_total{{{tenant_labels},kind=\"Pod\",reason=\"NotAllowed\"}}"
    );
    let counted = eventually(WAIT, || async {
        replica_a.metric(&errors).await.filter(|n| *n >= 1.0)
    })
    .await;
    assert!(counted.is_some(), "no {errors}");

    // Every line the leader logged inside a reconcile names the tenant.
    let lines = replica_a.log_lines();
    let in_reconcile: Vec<&Value> = lines
        .iter()
        .filter(|l| l["span"]["name"] == "reconcile")
        .collect();
    assert!(!in_reconcile.is_empty(), "no reconcile log lines");
    for line in &in_reconcile {
        assert_eq!(line["span"]["namespace"], ns.name.as_str(), "{line}");
        assert_eq!(line["span"]["tenant"], "one", "{line}");
    }
    assert!(
        lines
            .iter()
            .all(|l| l["level"].is_string() && l["timestamp"].is_string()),
        "log lines without level or timestamp"
    );

    // The standby has not written anything.
    assert_eq!(writes_by(&b), vec![], "the standby wrote");
    assert!(
        writes_by(&a)
            .iter()
            .any(|(verb, resource, _)| verb == "patch" && resource == "tenantclusters"),
        "the audit log has no status write by the leader: {:?}",
        writes_by(&a)
    );

    // Kill the leader: no release, so the standby waits out the Lease, takes over, and converges
    // a tenant created meanwhile.
    replica_a.signal("-KILL");
    let killed = Instant::now();
    let _ = replica_a.exit_code().await;
    assert_eq!(
        writes_by(&b),
        vec![],
        "the standby wrote before the leader died"
    );
    delete(&c, &ns.name, "one").await;
    create(&c, &ns.name, "two").await;
    let takeover = wait_for_holder(&c, &b).await;
    wait_for_phase(&c, &ns.name, "two", Phase::Ready).await;
    let converged = killed.elapsed();
    eprintln!(
        "leader killed: {b} held the Lease after {:.1}s and tenant two was Ready after {:.1}s (lease duration 6s)",
        takeover.as_secs_f64(),
        converged.as_secs_f64()
    );
    let b_writes = writes_by(&b);
    assert_eq!(
        (b_writes[0].0.as_str(), b_writes[0].1.as_str()),
        ("update", "leases"),
        "the new leader's first write must take the Lease: {b_writes:?}"
    );
    assert_eq!(replica_b.metric("tenantplane_leader").await, Some(1.0));
    let transitions = Api::<Lease>::namespaced(c.clone(), LEASE_NAMESPACE)
        .get(LEASE)
        .await
        .unwrap()
        .spec
        .unwrap()
        .lease_transitions;
    assert_eq!(transitions, Some(2), "created by a, taken by b");

    // SIGTERM: the leader finishes, releases the Lease and exits 0; the next replica leads at
    // once instead of after the Lease duration.
    let mut replica_b = replica_b;
    replica_b.signal("-TERM");
    assert_eq!(
        replica_b.exit_code().await,
        Some(0),
        "{}",
        replica_b.log_text()
    );
    assert_eq!(holder(&c).await, None, "the Lease was not released");
    let log = replica_b.log_text();
    assert!(log.contains("SIGTERM: finishing in-flight work"), "{log}");
    assert!(log.contains("released the leader Lease"), "{log}");
    assert!(
        log.contains("syncers stopped, each after finishing the objects in hand"),
        "{log}"
    );
    let c_id = format!("c-{}", ns.name);
    let started = Instant::now();
    let _replica_c = Replica::start(&ns, &c_id, &args);
    wait_for_holder(&c, &c_id).await;
    let after_release = started.elapsed();
    eprintln!(
        "after a graceful stop, a new replica held the released Lease {:.1}s after its start",
        after_release.as_secs_f64()
    );
    delete(&c, &ns.name, "two").await;
    create(&c, &ns.name, "three").await;
    wait_for_phase(&c, &ns.name, "three", Phase::Ready).await;
}

/// Certificates issued for 40s and renewed 30s before they expire: the admin certificate is
/// renewed about every 10s, the kubeconfig Secret rewritten, the CAs left alone.
#[tokio::test]
async fn short_lived_admin_certificates_are_renewed_before_they_expire() {
    install_crds_and_policies();
    let ns = namespace("certs").await;
    let c = ns.client.clone();
    let _runtime = local_runtime_for(&ns);
    let _replica = Replica::start(
        &ns,
        &format!("certs-{}", ns.name),
        &[
            "--certificate-validity",
            "40s",
            "--renew-certificates-before",
            "30s",
        ],
    );
    create(&c, &ns.name, "dev").await;
    wait_for_phase(&c, &ns.name, "dev", Phase::Ready).await;
    let secrets: Api<Secret> = Api::namespaced(c.clone(), &ns.name);
    let pki_before = secrets.get(&names::pki_secret("dev")).await.unwrap();
    let admin_cert = |secret: &Secret| -> (String, String) {
        let text = kubeconfig::stored_text(secret).unwrap();
        let parsed = kubeconfig::parse(text).unwrap();
        (parsed.client.cert_pem, parsed.ca_pem)
    };
    let first = admin_cert(&secrets.get(&names::kubeconfig_secret("dev")).await.unwrap());
    let first_life = tenantplane_pki::lifetime(&first.0).unwrap();
    assert_eq!(first_life.not_after - first_life.issued_at, 40);

    // Two renewals in a row, each with a certificate that outlives the one before.
    let mut previous = first.clone();
    for round in 1..=2 {
        let renewed = eventually(WAIT, || async {
            let secret = secrets.get(&names::kubeconfig_secret("dev")).await.ok()?;
            let now = admin_cert(&secret);
            (now.0 != previous.0).then_some(now)
        })
        .await
        .unwrap_or_else(|| panic!("renewal {round} never came"));
        let before = tenantplane_pki::lifetime(&previous.0).unwrap();
        let after = tenantplane_pki::lifetime(&renewed.0).unwrap();
        assert!(after.not_after > before.not_after, "round {round}");
        // Renewed while the old one was still valid, with at most 30s left.
        assert!(
            before.not_after - after.issued_at <= 31,
            "round {round}: renewed too early"
        );
        assert!(
            after.issued_at <= before.not_after,
            "round {round}: renewed after expiry"
        );
        assert_eq!(
            renewed.1, first.1,
            "the server CA in the kubeconfig changed"
        );
        previous = renewed;
    }
    // The renewed kubeconfig works, and the CAs are the same Secret, untouched.
    let tenant = tenant_client(&c, &ns.name, "dev").await;
    tenant.apiserver_version().await.unwrap();
    let pki_after = secrets.get(&names::pki_secret("dev")).await.unwrap();
    assert_eq!(pki_after.resource_version(), pki_before.resource_version());
    let events = Api::<Event>::namespaced(c.clone(), &ns.name)
        .list(&ListParams::default())
        .await
        .unwrap();
    let note = events
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("KubeconfigRewritten"))
        .find_map(|e| e.message.clone())
        .expect("no KubeconfigRewritten Event");
    assert!(note.contains("within the renewal window of 30s"), "{note}");
    assert_eq!(
        wait_for_phase(&c, &ns.name, "dev", Phase::Ready)
            .await
            .name_any(),
        "dev"
    );
}

/// The annotation rotates the admin certificate now, once, and goes away; the CAs stay.
#[tokio::test]
async fn the_rotate_annotation_issues_a_new_certificate_now() {
    install_crds_and_policies();
    let ns = namespace("rotate").await;
    let c = ns.client.clone();
    let _runtime = local_runtime_for(&ns);
    let replica = Replica::start(&ns, &format!("rotate-{}", ns.name), &[]);
    create(&c, &ns.name, "dev").await;
    wait_for_phase(&c, &ns.name, "dev", Phase::Ready).await;
    let secrets: Api<Secret> = Api::namespaced(c.clone(), &ns.name);
    let pki_before = secrets.get(&names::pki_secret("dev")).await.unwrap();
    let cert = |secret: &Secret| {
        kubeconfig::parse(kubeconfig::stored_text(secret).unwrap())
            .unwrap()
            .client
            .cert_pem
    };
    let before = cert(&secrets.get(&names::kubeconfig_secret("dev")).await.unwrap());
    // Let the first certificate age past the debounce of a repeated request.
    tokio::time::sleep(Duration::from_secs(16)).await;

    let tenants: Api<TenantCluster> = Api::namespaced(c.clone(), &ns.name);
    tenants
        .patch(
            "dev",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {names::ROTATE_CERTIFICATES: "now"}}}),
            ),
        )
        .await
        .unwrap();
    let after = eventually(WAIT, || async {
        let tc = tenants.get("dev").await.ok()?;
        if tc.annotations().contains_key(names::ROTATE_CERTIFICATES) {
            return None;
        }
        let now = cert(&secrets.get(&names::kubeconfig_secret("dev")).await.ok()?);
        (now != before).then_some(now)
    })
    .await
    .expect("the annotation never rotated the certificate and went away");
    let life = tenantplane_pki::lifetime(&after).unwrap();
    assert_eq!(life.not_after - life.issued_at, 365 * 86400);
    // Once: a few more reconciles leave it as it is.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        cert(&secrets.get(&names::kubeconfig_secret("dev")).await.unwrap()),
        after
    );
    let pki_after = secrets.get(&names::pki_secret("dev")).await.unwrap();
    assert_eq!(pki_after.resource_version(), pki_before.resource_version());
    let rotated = Api::<Event>::namespaced(c.clone(), &ns.name)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("CertificatesRotated"))
        .count();
    assert_eq!(rotated, 1, "one CertificatesRotated Event");
    // The metric follows the new certificate.
    let series = format!(
        "tenantplane_certificate_expiry_timestamp_seconds{{namespace=\"{}\",tenant=\"dev\",certificate=\"admin\"}}",
        ns.name
    );
    let exported = eventually(WAIT, || async {
        replica
            .metric(&series)
            .await
            .filter(|at| *at as i64 == life.not_after)
    })
    .await;
    assert!(exported.is_some(), "{series} is not {}", life.not_after);
    tenant_client(&c, &ns.name, "dev")
        .await
        .apiserver_version()
        .await
        .unwrap();
}
