//! One tenant per host namespace, against the real control plane: a second TenantCluster in a
//! namespace provisions nothing and says `NamespaceInUse`; deleting it leaves the first one's
//! Pod Security labels alone; once the first is gone, the second takes the namespace over.

use std::time::{Duration, Instant};

mod common;
use common::*;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{LimitRange, Namespace, ResourceQuota, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use tenantplane_api::conditions::{READY, SYNCED};
use tenantplane_api::{Phase, TenantCluster};
use tenantplane_controller::names;
use tenantplane_testenv::eventually;

const FIRST: &str = "first";
const SECOND: &str = "second";
const ENFORCE: &str = "pod-security.kubernetes.io/enforce";

/// The names of every host object of `kind` in `ns` carrying the label the controller puts on
/// what it creates for `tenant`.
async fn owned<K>(client: &Client, ns: &str, tenant: &str) -> Vec<String>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let lp = ListParams::default().labels(&format!("{}={tenant}", names::LABEL_TENANT));
    Api::<K>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| format!("{}/{}", K::kind(&()), o.name_any()))
        .collect()
}

/// Everything of the controller's making for `tenant` on the host, by label and by name.
async fn host_objects(client: &Client, ns: &str, tenant: &str) -> Vec<String> {
    let mut found = Vec::new();
    found.extend(owned::<StatefulSet>(client, ns, tenant).await);
    found.extend(owned::<Service>(client, ns, tenant).await);
    found.extend(owned::<Secret>(client, ns, tenant).await);
    found.extend(owned::<NetworkPolicy>(client, ns, tenant).await);
    found.extend(owned::<ResourceQuota>(client, ns, tenant).await);
    found.extend(owned::<LimitRange>(client, ns, tenant).await);
    let sts = Api::<StatefulSet>::namespaced(client.clone(), ns);
    if sts
        .get_opt(&names::statefulset(tenant))
        .await
        .unwrap()
        .is_some()
    {
        found.push(format!("StatefulSet/{tenant} (by name)"));
    }
    let svc = Api::<Service>::namespaced(client.clone(), ns);
    if svc
        .get_opt(&names::service(tenant))
        .await
        .unwrap()
        .is_some()
    {
        found.push(format!("Service/{tenant} (by name)"));
    }
    let secrets = Api::<Secret>::namespaced(client.clone(), ns);
    for name in [names::pki_secret(tenant), names::kubeconfig_secret(tenant)] {
        if secrets.get_opt(&name).await.unwrap().is_some() {
            found.push(format!("Secret/{name} (by name)"));
        }
    }
    found.sort();
    found.dedup();
    found
}

async fn pod_security_level(client: &Client, ns: &str) -> Option<String> {
    Api::<Namespace>::all(client.clone())
        .get(ns)
        .await
        .unwrap()
        .labels()
        .get(ENFORCE)
        .cloned()
}

/// Wait until `name` says its namespace is held by `holder`: Degraded, `Ready` and `Synced` False
/// with reason NamespaceInUse and a message naming the holder.
async fn in_use_by(client: &Client, ns: &str, name: &str, holder: &str) {
    let tc = wait_for_phase(client, ns, name, Phase::Degraded).await;
    let expected = format!(
        "namespace {ns} already holds TenantCluster {holder:?}; one TenantCluster per namespace: create this one in a namespace of its own, or delete {holder:?}"
    );
    for type_ in [READY, SYNCED] {
        let c = condition(&tc, type_);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            ("False", "NamespaceInUse", expected.as_str()),
            "{ns}/{name}'s {type_} condition should say {holder} holds the namespace"
        );
    }
}

/// Delete `name` and wait until it is gone (its finalizer ran).
async fn delete_and_wait(client: &Client, ns: &str, name: &str) {
    let tenants: Api<TenantCluster> = Api::namespaced(client.clone(), ns);
    tenants
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    let gone = eventually(WAIT, || async {
        tenants.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "{ns}/{name} was not gone {}s after its deletion (its finalizer did not finish)",
        WAIT.as_secs()
    );
}

#[tokio::test]
async fn a_second_tenant_in_a_namespace_provisions_nothing_until_the_first_is_gone() {
    let started = Instant::now();
    let world = TestHost::start("one-per-ns").await;
    let (ns, c) = (&world.ns, &world.host);
    let n = ns.name.as_str();
    let tenants: Api<TenantCluster> = Api::namespaced(c.clone(), n);

    // The first tenant holds the namespace.
    create_ready(c, &tenant_named(n, FIRST)).await;
    assert_eq!(
        pod_security_level(c, n).await.as_deref(),
        Some("restricted"),
        "the first tenant labels its namespace"
    );

    // The second one says why it waits, and builds nothing.
    tenants
        .create(&PostParams::default(), &tenant_named(n, SECOND))
        .await
        .unwrap();
    in_use_by(c, n, SECOND, FIRST).await;
    // A few rechecks (every 10 s) later, still nothing of it on the host.
    tokio::time::sleep(Duration::from_secs(12)).await;
    in_use_by(c, n, SECOND, FIRST).await;
    assert_eq!(
        host_objects(c, n, SECOND).await,
        Vec::<String>::new(),
        "a TenantCluster whose namespace is held by another must create nothing on the host"
    );

    // Deleting it leaves what the first one relies on.
    delete_and_wait(c, n, SECOND).await;
    assert_eq!(
        pod_security_level(c, n).await.as_deref(),
        Some("restricted"),
        "deleting the second tenant removed the first one's Pod Security labels"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let first = tenants.get(FIRST).await.unwrap();
    assert_eq!(
        first.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Ready),
        "the first tenant should stay Ready when the second goes: {:#?}",
        first.status
    );
    assert!(
        host_objects(c, n, FIRST)
            .await
            .contains(&format!("NetworkPolicy/{}", names::isolation_policy(FIRST))),
        "the first tenant's isolation policy should stay"
    );

    // Created again, then the first one goes: the second takes the namespace over.
    tenants
        .create(&PostParams::default(), &tenant_named(n, SECOND))
        .await
        .unwrap();
    in_use_by(c, n, SECOND, FIRST).await;
    let handover = Instant::now();
    delete_and_wait(c, n, FIRST).await;
    let tc = wait_for_phase(c, n, SECOND, Phase::Ready).await;
    eprintln!(
        "the second tenant was Ready {:.1}s after the first one's deletion",
        handover.elapsed().as_secs_f64()
    );
    assert_eq!(condition(&tc, READY).reason, "ControlPlaneReady");
    assert_eq!(condition(&tc, SYNCED).status, "True");
    assert_eq!(
        pod_security_level(c, n).await.as_deref(),
        Some("restricted"),
        "the namespace has the Pod Security labels of the tenant that took it over"
    );
    let built = host_objects(c, n, SECOND).await;
    for expected in [
        format!("StatefulSet/{SECOND}"),
        format!("Service/{SECOND}"),
        format!("Secret/{}", names::kubeconfig_secret(SECOND)),
        format!("NetworkPolicy/{}", names::isolation_policy(SECOND)),
    ] {
        assert!(
            built.contains(&expected),
            "the second tenant, now holding the namespace, should have {expected}: {built:?}"
        );
    }
    eprintln!(
        "one tenant per namespace: {:.1}s in all",
        started.elapsed().as_secs_f64()
    );
}
