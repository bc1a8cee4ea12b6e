//! Isolation, second round: sizes. A claim asks for no more storage than the profile lets one
//! claim have, and an enforced quota counts storage; no tenant object grows the host's objects
//! (the TenantCluster's `Synced` message, Events, annotations) past a bound; and tenant churn
//! rewrites the TenantCluster's status a few times, not once per object.

use super::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::{DeleteParams, Patch, PatchParams, WatchEvent, WatchParams};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tenantplane_api::text::MAX_TEXT_BYTES;

fn claim(name: &str, size: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    }))
    .unwrap()
}

/// `requests.storage` of the tenant's quota on the host, once it is `want`.
async fn quota_storage_becomes(host: &Client, ns: &str, want: &str) {
    let quotas: Api<ResourceQuota> = Api::namespaced(host.clone(), ns);
    let last = std::sync::Mutex::new(String::new());
    let found = eventually(WAIT, || async {
        let list = quotas.list(&ListParams::default()).await.ok()?;
        let storage = list
            .items
            .iter()
            .filter_map(|q| q.spec.as_ref()?.hard.as_ref()?.get("requests.storage"))
            .map(|q| q.0.clone())
            .collect::<Vec<_>>();
        *last.lock().unwrap() = format!("{storage:?}");
        (storage == [want.to_string()]).then_some(())
    })
    .await;
    assert!(
        found.is_some(),
        "the quota's requests.storage never became {want}: {}",
        last.lock().unwrap()
    );
}

#[tokio::test]
async fn claims_are_capped_one_by_one_and_counted_by_the_quota() {
    let world = TenantSetup::seed()
        .allow(json!({"maxClaimSize": "100Gi"}))
        .start("iso-claim")
        .await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(tenant.clone(), "default");
    // A petabyte, and a byte over the cap: refused, with the size, the cap and the setting.
    create(&claims, &claim("huge", "1Pi")).await;
    create(&claims, &claim("byte-over", "107374182401")).await;
    create(&claims, &claim("small", "1Gi")).await;
    let copy = host_copy::<PersistentVolumeClaim>(host, &ns.name, "small").await;
    let asked = copy.spec.unwrap().resources.unwrap().requests.unwrap();
    assert_eq!(asked["storage"].0, "1Gi");
    let message = told(tenant, "huge", "NotAllowed").await;
    assert!(
        message.contains("spec.resources.requests.storage 1Pi is more than the IsolationProfile's allow.maxClaimSize of 100Gi"),
        "{message}"
    );
    let message = told(tenant, "byte-over", "NotAllowed").await;
    assert!(message.contains("107374182401"), "{message}");
    for name in ["huge", "byte-over"] {
        assert!(
            !has_copy::<PersistentVolumeClaim>(host, &ns.name, name).await,
            "{name} reached the host"
        );
    }
    synced_says(host, &ns.name, "NotAllowed", "allow.maxClaimSize").await;

    // The enforced quota counts storage: the profile's cap, lowered by the tenant's own, never
    // raised by it.
    quota_storage_becomes(host, &ns.name, "200Gi").await;
    let tenants: Api<TenantCluster> = Api::namespaced(host.clone(), &ns.name);
    let set_storage = |storage: &'static str| {
        let tenants = tenants.clone();
        async move {
            tenants
                .patch(
                    "dev",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"resources": {"storage": storage}}})),
                )
                .await
                .unwrap()
        }
    };
    set_storage("50Gi").await;
    quota_storage_becomes(host, &ns.name, "50Gi").await;
    let raised = set_storage("1Pi").await;
    quota_storage_becomes(host, &ns.name, "200Gi").await;
    assert_eq!(
        raised.spec.resources.storage.as_ref().map(|s| s.as_str()),
        Some("1Pi"),
        "the field is kept"
    );
    // Smaller than the control plane's own claim is refused at admission.
    let err = tenants
        .patch(
            "dev",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {"storage": "1Gi"}}})),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("at least 2Gi"), "{err}");
}

#[tokio::test]
async fn a_tenant_object_full_of_reasons_leaves_the_host_objects_small() {
    // Pod Security admits it in the tenant (the tenant API server would refuse it at once): the
    // syncer's refusal is what is measured.
    let world = TenantSetup::seed()
        .profile_spec(json!({"podSecurity": "privileged"}))
        .start("iso-big")
        .await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    // A long name, sixty privileged containers each adding ten capabilities with long names,
    // and five hundred annotations the profile does not allow: thousands of reasons.
    let name = format!("big-{}", "n".repeat(200));
    let containers: Vec<serde_json::Value> = (0..60)
        .map(|i| {
            let mut c = container(&format!("c{i}"));
            let add: Vec<String> = (0..10)
                .map(|j| format!("CAP_{}_{i}_{j}", "X".repeat(200)))
                .collect();
            c["securityContext"] = json!({"privileged": true, "capabilities": {"add": add}});
            c["ports"] = json!([{"containerPort": 80, "hostPort": 8000 + i}]);
            c
        })
        .collect();
    let mut big = pod(&name, json!({}), json!({"containers": containers}));
    big.metadata.annotations = Some(
        (0..500)
            .map(|i| (format!("example.com/key-{i:03}"), "v".repeat(100)))
            .collect(),
    );
    create(&pods, &big).await;
    // An admitted pod with a description of 200,000 characters.
    let mut described = pod("described", json!({}), json!({}));
    described.metadata.annotations = Some(
        [("kubernetes.io/description".to_string(), "d".repeat(200_000))]
            .into_iter()
            .collect(),
    );
    create(&pods, &described).await;

    synced_says(host, &ns.name, "NotAllowed", &name[..60]).await;
    let tc = Api::<TenantCluster>::namespaced(host.clone(), &ns.name)
        .get("dev")
        .await
        .unwrap();
    let synced = condition(&tc, SYNCED).message.clone();
    eprintln!(
        "Synced message: {} bytes; TenantCluster: {} bytes",
        synced.len(),
        serde_json::to_vec(&tc).unwrap().len()
    );
    assert!(synced.len() <= MAX_TEXT_BYTES, "{}", synced.len());
    assert!(synced.contains("more characters cut)"), "{synced}");
    let size = serde_json::to_vec(&tc).unwrap().len();
    assert!(size < 16 * 1024, "the TenantCluster is {size} bytes");
    // What the tenant is told, on the Event and on the pod, is bounded too.
    let message = told(tenant, &name, "NotAllowed").await;
    assert!(message.len() <= MAX_TEXT_BYTES, "{}", message.len());
    assert!(
        message.contains("and ") && message.contains("more"),
        "{message}"
    );
    let message = told(tenant, &name, "NotCopied").await;
    assert!(
        message.len() <= MAX_TEXT_BYTES && message.contains("and 490 more"),
        "{message}"
    );
    let refused = pods.get(&name).await.unwrap();
    let scheduled = refused
        .status
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "PodScheduled"))
        .and_then(|c| c.message)
        .unwrap_or_default();
    assert!(
        !scheduled.is_empty() && scheduled.len() <= MAX_TEXT_BYTES,
        "{}",
        scheduled.len()
    );
    // The host's Events about the TenantCluster quote the message within the API's bound.
    let events = Api::<Event>::namespaced(host.clone(), &ns.name)
        .list(&ListParams::default().fields("involvedObject.name=dev"))
        .await
        .unwrap();
    for e in &events.items {
        let len = e.message.as_deref().unwrap_or_default().len();
        assert!(len <= MAX_TEXT_BYTES, "{:?}: {len}", e.reason);
    }
    // The description reaches the copy, cut to the bound.
    let copy = host_copy::<Pod>(host, &ns.name, "described").await;
    let description = &copy.annotations()["kubernetes.io/description"];
    assert!(description.len() <= MAX_TEXT_BYTES, "{}", description.len());
    assert!(
        description.ends_with("more characters cut)"),
        "{description}"
    );
}

#[tokio::test]
async fn twenty_refused_pods_rewrite_the_tenant_status_a_few_times() {
    // Pod Security admits them in the tenant: the syncer refuses them.
    let world = TenantSetup::seed()
        .profile_spec(json!({"podSecurity": "privileged"}))
        .start("iso-churn")
        .await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let tenants: Api<TenantCluster> = Api::namespaced(host.clone(), &ns.name);
    // Settled: Synced True, as a healthy tenant's status stays.
    let settled = eventually(WAIT, || async {
        let tc = tenants.get("dev").await.ok()?;
        (condition(&tc, SYNCED).status == "True").then_some(tc)
    })
    .await
    .expect("the tenant never synced");
    // Every write of the TenantCluster, from here on.
    let writes = Arc::new(AtomicUsize::new(0));
    let counted = writes.clone();
    let mut stream = tenants
        .watch(
            &WatchParams::default().fields("metadata.name=dev"),
            &settled.resource_version().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    let counter = tokio::spawn(async move {
        while let Ok(Some(event)) = stream.try_next().await {
            if let WatchEvent::Modified(_) = event {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    let started = std::time::Instant::now();
    for i in 0..20 {
        create(
            &pods,
            &pod(
                &format!("refused-{i:02}"),
                json!({}),
                json!({"hostNetwork": true}),
            ),
        )
        .await;
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    // The last state is written, however the writes were coalesced.
    synced_says(
        host,
        &ns.name,
        "NotAllowed",
        "Pod default/refused-00: not allowed on the host: spec.hostNetwork",
    )
    .await;
    synced_says(host, &ns.name, "NotAllowed", "20 objects refused").await;
    synced_says(host, &ns.name, "NotAllowed", "\n(and 17 more)").await;
    let elapsed = started.elapsed();
    counter.abort();
    let n = writes.load(Ordering::SeqCst);
    eprintln!(
        "TenantCluster writes while 20 pods were refused a second apart: {n} in {elapsed:.0?}"
    );
    assert!(n >= 1, "the refusals were never written");
    assert!(n <= 8, "{n} writes of the TenantCluster in {elapsed:.0?}");
    let _ = pods
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
}
