//! Isolation, third round: a tenant's footprint on the host is bounded in every dimension. Every
//! resource a pod asks for is decided and counted, node disk is capped, every copy's bytes and
//! counts are bounded, placement stays the host scheduler's, and nothing of the host comes up.
//! Each attack is the red team's, made by a tenant admin against the real control plane.

use super::*;
use k8s_openapi::api::core::v1::{Node, ResourceQuota};
use kube::api::DeleteParams;

/// The tenant's quota on the host, once it holds `key`.
async fn quota_with(host: &Client, ns: &str, key: &str) -> ResourceQuota {
    let quotas: Api<ResourceQuota> = Api::namespaced(host.clone(), ns);
    eventually(WAIT, || async {
        quotas
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|q| {
                q.spec
                    .as_ref()
                    .and_then(|s| s.hard.as_ref())
                    .is_some_and(|h| h.contains_key(key))
            })
    })
    .await
    .unwrap_or_else(|| panic!("the quota never counted {key}"))
}

fn resources(limits: serde_json::Value) -> serde_json::Value {
    let mut c = container("c");
    c["resources"] = json!({"limits": limits});
    c
}

#[tokio::test]
async fn every_resource_a_pod_asks_for_is_decided_counted_and_capped() {
    let world = TenantSetup::seed()
        .allow(json!({"resources": {"example.com/gpu": "2"}}))
        .start("iso-res")
        .await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    // Every resource a pod may consume has a key that counts it, whatever the profile enforces.
    let quota = quota_with(host, &ns.name, "requests.example.com/gpu").await;
    let hard = quota.spec.unwrap().hard.unwrap();
    for (key, value) in [
        ("requests.example.com/gpu", "2"),
        ("requests.ephemeral-storage", "512Gi"),
        ("count/endpointslices.discovery.k8s.io", "2k"),
        ("count/serviceaccounts", "500"),
        ("pods", "100"),
    ] {
        assert_eq!(hard.get(key).map(|q| q.0.as_str()), Some(value), "{key}");
    }
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    let mut huge = resources(json!({"hugepages-2Mi": "2Gi", "memory": "2Gi"}));
    huge["resources"]["requests"] = json!({"hugepages-2Mi": "2Gi", "memory": "2Gi"});
    create(
        &pods,
        &pod("huge", json!({}), json!({"containers": [huge]})),
    )
    .await;
    create(
        &pods,
        &pod(
            "disk",
            json!({}),
            json!({"containers": [resources(json!({"ephemeral-storage": "1Ti"}))]}),
        ),
    )
    .await;
    create(
        &pods,
        &pod(
            "scratch",
            json!({}),
            json!({"volumes": [{"name": "s", "emptyDir": {"sizeLimit": "1Ti"}}]}),
        ),
    )
    .await;
    // An opened resource past its total: the host's quota refuses the copy.
    create(
        &pods,
        &pod(
            "gpus",
            json!({}),
            json!({"containers": [resources(json!({"example.com/gpu": "4"}))]}),
        ),
    )
    .await;
    create(
        &pods,
        &pod(
            "plain",
            json!({}),
            json!({"volumes": [{"name": "s", "emptyDir": {}}, {"name": "m", "emptyDir": {"medium": "Memory"}}]}),
        ),
    )
    .await;
    for (name, needle) in [
        (
            "huge",
            "asks for resource hugepages-2Mi, which the IsolationProfile's allow.resources does not list",
        ),
        (
            "disk",
            "resources.limits.ephemeral-storage 1Ti is more than the IsolationProfile's allow.ephemeralStorage.maxPerContainer of 64Gi",
        ),
        (
            "scratch",
            "emptyDir.sizeLimit 1Ti is more than the IsolationProfile's allow.ephemeralStorage.emptyDirMax of 64Gi",
        ),
    ] {
        let message = told(tenant, name, "NotAllowed").await;
        assert!(message.contains(needle), "{name}: {message}");
        assert!(!has_copy::<Pod>(host, &ns.name, name).await, "{name}");
    }
    let refused = told(tenant, "gpus", "HostRejected").await;
    assert!(
        refused.contains("exceeded quota") && refused.contains("requests.example.com/gpu"),
        "{refused}"
    );
    assert!(!has_copy::<Pod>(host, &ns.name, "gpus").await);
    // A copy gets the profile's node disk defaults where the tenant set none.
    let copy: Pod = host_copy(host, &ns.name, "plain").await;
    let spec = copy.spec.unwrap();
    let r = spec.containers[0].resources.clone().unwrap();
    assert_eq!(r.limits.unwrap()["ephemeral-storage"].0, "16Gi");
    assert_eq!(r.requests.unwrap()["ephemeral-storage"].0, "0");
    let sizes: Vec<Option<String>> = spec
        .volumes
        .unwrap()
        .iter()
        .filter_map(|v| v.empty_dir.as_ref())
        .map(|e| e.size_limit.clone().map(|q| q.0))
        .collect();
    assert_eq!(sizes, [Some("16Gi".to_string()), None]);
}

#[tokio::test]
async fn no_copy_is_larger_than_its_kind_allows_nor_a_service_wider() {
    let world = TenantSetup::seed()
        .allow(json!({}))
        .start("iso-bytes")
        .await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    // 7,003 labels, little data: the data bound does not see labels.
    let labels: serde_json::Map<String, serde_json::Value> = (0..7003)
        .map(|i| (format!("l{i:05}"), json!("v".repeat(60))))
        .collect();
    let labelled: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "labelled", "namespace": "default", "labels": labels},
        "data": {"k": "v"}
    }))
    .unwrap();
    create(&Api::namespaced(tenant.clone(), "default"), &labelled).await;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    // A ConfigMap is copied once a pod uses it; the pod could not run without the copy.
    create(
        &pods,
        &pod(
            "reader",
            json!({}),
            json!({"volumes": [{"name": "c", "configMap": {"name": "labelled"}}]}),
        ),
    )
    .await;
    // Seven environment values of 100,000 characters: a 700 KB pod spec.
    let mut big = container("c");
    big["env"] = json!(
        (0..7)
            .map(|i| json!({"name": format!("V{i}"), "value": "x".repeat(100_000)}))
            .collect::<Vec<_>>()
    );
    create(
        &pods,
        &pod("wordy", json!({}), json!({"containers": [big]})),
    )
    .await;
    // Twenty projected tokens: the syncer's token Secret would hold them all.
    let sources: Vec<_> = (0..20)
        .map(|i| json!({"serviceAccountToken": {"path": format!("t{i}"), "audience": format!("a{i}")}}))
        .collect();
    create(
        &pods,
        &pod(
            "tokens",
            json!({}),
            json!({"volumes": [{"name": "t", "projected": {"sources": sources}}]}),
        ),
    )
    .await;
    // 1,200 ports: every host node's proxy would program each.
    let ports: Vec<_> = (1..=1200)
        .map(|p| json!({"name": format!("p{p}"), "port": p}))
        .collect();
    let wide: Service = serde_json::from_value(json!({
        "metadata": {"name": "wide", "namespace": "default"},
        "spec": {"selector": {"app": "x"}, "ports": ports}
    }))
    .unwrap();
    create(&Api::namespaced(tenant.clone(), "default"), &wide).await;
    create(&pods, &pod("small", json!({}), json!({}))).await;
    host_copy::<Pod>(host, &ns.name, "small").await;
    let message = told(tenant, "labelled", "NotAllowed").await;
    assert!(
        message.contains("its labels and annotations take")
            && message.contains("the IsolationProfile's allow.maxMetadataBytes (the default)"),
        "{message}"
    );
    let message = told(tenant, "reader", "NotAllowed").await;
    assert!(
        message.contains("ConfigMap labelled is not copied to the host, so the pod could not run there: its labels and annotations take"),
        "{message}"
    );
    let message = told(tenant, "wordy", "NotAllowed").await;
    assert!(
        message.contains("more than the 256Ki allowed by the IsolationProfile's allow.maxObjectBytes.Pod (the default)"),
        "{message}"
    );
    let message = told(tenant, "tokens", "NotAllowed").await;
    assert!(
        // Twenty, and the one the tenant's admission adds (kube-api-access).
        message.contains("the pod projects 21 service account tokens; at most 16"),
        "{message}"
    );
    let message = told(tenant, "wide", "NotAllowed").await;
    assert!(
        message.contains("it has 1200 ports, more than the 100 the IsolationProfile's allow.maxServicePorts allows by default"),
        "{message}"
    );
    assert!(!has_copy::<ConfigMap>(host, &ns.name, "labelled").await);
    assert!(!has_copy::<Service>(host, &ns.name, "wide").await);
    for name in ["wordy", "tokens", "reader"] {
        assert!(!has_copy::<Pod>(host, &ns.name, name).await, "{name}");
    }
}

#[tokio::test]
async fn ended_pods_past_the_bound_leave_the_host_oldest_first() {
    let world = TenantSetup::seed()
        .allow(json!({"maxEndedPods": 2}))
        .start("iso-ended")
        .await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    // kwok ends a pod that never restarts five seconds after it runs.
    for i in 0..5 {
        create(
            &pods,
            &pod(
                &format!("done-{i}"),
                json!({}),
                json!({"restartPolicy": "Never"}),
            ),
        )
        .await;
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    }
    let copies: Api<Pod> = Api::namespaced(host.clone(), &ns.name);
    let last = std::sync::Mutex::new(String::new());
    let settled = eventually(WAIT, || async {
        let tenant_pods: Vec<String> = pods
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| p.name_any())
            .collect();
        let ended = copies
            .list(&ListParams::default().labels(naming::LABEL_SYNCED_FROM))
            .await
            .ok()?
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))
            .count();
        *last.lock().unwrap() = format!("tenant pods {tenant_pods:?}, ended copies {ended}");
        (ended == 2 && tenant_pods == ["done-3", "done-4"]).then_some(())
    })
    .await;
    assert!(
        settled.is_some(),
        "the ended copies were not bounded: {}",
        last.lock().unwrap()
    );
}

/// A simulated node of this test's own, tainted so only what tolerates `taint` goes there.
async fn guarded_node(host: &Client, name: &str, cidr: &str, taint: &str) {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"}},
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr],
            "taints": [{"key": taint, "value": "yes", "effect": "NoSchedule"}]}
    }))
    .unwrap();
    create(&Api::<Node>::all(host.clone()), &node).await;
    let ready = eventually(WAIT, || async {
        let n = Api::<Node>::all(host.clone()).get(name).await.ok()?;
        n.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
            .then_some(())
    })
    .await;
    assert!(ready.is_some(), "kwok never made {name} Ready");
}

#[tokio::test]
async fn placement_stays_the_host_schedulers_and_host_names_stay_below() {
    let world = TestHost::start("iso-place").await;
    let (ns, host) = (&world.ns, &world.host);
    let taint = "example.com/guarded";
    let node = format!("guarded-{}", ns.name.replace("iso-", ""));
    guarded_node(host, &node, "10.244.231.0/24", taint).await;
    // Another team's pod there, whose required anti-affinity keeps every other team away.
    let other = tenantplane_testenv::namespace("iso-place-b").await;
    let victim: Pod = serde_json::from_value(json!({
        "metadata": {"name": "victim", "namespace": other.name, "labels": {"team": "b"}},
        "spec": {"nodeName": node, "containers": [container("c")],
            "tolerations": [{"key": taint, "operator": "Exists"}],
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["b"]}]},
                "namespaceSelector": {}, "topologyKey": "kubernetes.io/hostname"}]}}}
    }))
    .unwrap();
    create(&Api::namespaced(host.clone(), &other.name), &victim).await;
    let tenant = TenantSetup::seed()
        .allow(json!({"tolerationKeys": [taint]}))
        .ready_in(ns)
        .await;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    let tolerate = json!([{"key": taint, "operator": "Exists"},
        {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]);
    create(
        &pods,
        &pod(
            "intruder",
            json!({}),
            json!({"nodeName": node, "tolerations": tolerate}),
        ),
    )
    .await;
    create(
        &pods,
        &pod(
            "named",
            json!({}),
            json!({"hostname": "db-0", "subdomain": "db", "setHostnameAsFQDN": true}),
        ),
    )
    .await;
    // Tolerations of the node lifecycle's taints stay below; the profile's key goes up.
    create(
        &pods,
        &pod("tolerant", json!({}), json!({"tolerations": tolerate})),
    )
    .await;
    let tolerant: Pod = host_copy(host, &ns.name, "tolerant").await;
    let keys: Vec<String> = tolerant
        .spec
        .iter()
        .flat_map(|s| s.tolerations.iter().flatten())
        .filter_map(|t| t.key.clone())
        .collect();
    assert!(keys.contains(&taint.to_string()), "{keys:?}");
    assert!(
        !keys
            .iter()
            .any(|k| k.ends_with("memory-pressure") || k.ends_with("unschedulable")),
        "lifecycle tolerations reached the host: {keys:?}"
    );
    // The intruder's copy is pinned by affinity, not bound (the pin itself: nodes/run.rs): the
    // scheduler judges it, and the other team's anti-affinity holds.
    let copy = tenantplane_syncer::naming::host_name_for("dev", "default", "intruder");
    // The node cannot take it: the tenant pod fails as a kubelet would refuse it, and the copy
    // goes without ever running beside the other team's pod.
    let failed = eventually(WAIT, || async {
        let p: Pod = pods.get("intruder").await.ok()?;
        let status = p.status?;
        (status.phase.as_deref() == Some("Failed")).then_some(status.reason)
    })
    .await;
    assert_eq!(
        failed,
        Some(Some(
            tenantplane_syncer::kinds::pods::binding::REJECTED.to_string()
        )),
        "the pod bound to a node that cannot take it never failed"
    );
    let still: Option<Pod> = Api::namespaced(host.clone(), &ns.name)
        .get_opt(&copy)
        .await
        .unwrap();
    assert_eq!(
        still.and_then(|p| p.spec?.node_name),
        None,
        "the copy went beside the other team's pod"
    );
    let message = told(&tenant, "tolerant", "NotCopied").await;
    assert!(
        message
            .contains("node.kubernetes.io/memory-pressure (a node the host keeps pods away from)")
            && message.contains("allow.tolerationKeys"),
        "{message}"
    );
    // The host's full name is no pod's hostname.
    let named: Pod = host_copy(host, &ns.name, "named").await;
    assert_eq!(named.spec.unwrap().set_hostname_as_fqdn, None);
    let message = told(&tenant, "named", "NotCopied").await;
    assert!(
        message.contains("setHostnameAsFQDN is left out"),
        "{message}"
    );
    let _ = Api::<Node>::all(host.clone())
        .delete(&node, &DeleteParams::default())
        .await;
}

/// `n` labels of 60 characters: a copy's size without a field of its own to carry it.
fn labels(n: usize) -> serde_json::Value {
    (0..n)
        .map(|i| (format!("l{i:03}"), json!("v".repeat(60))))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Every kind the syncer writes, one object of each past its kind's byte bound and one within:
/// the host ends with the small ones' copies and none of the large.
#[tokio::test]
async fn every_kind_past_its_byte_bound_stays_off_the_host() {
    let caps = json!({"Pod": "16Ki", "Service": "4Ki", "ConfigMap": "4Ki", "Secret": "4Ki",
        "Endpoints": "4Ki", "EndpointSlice": "4Ki", "Ingress": "4Ki",
        "PersistentVolumeClaim": "4Ki", "ServiceAccount": "4Ki"});
    let world = TenantSetup::seed()
        .allow(json!({"maxObjectBytes": caps, "ingressHosts": ["*.example.com"]}))
        .sync_policy(json!({"toHost": {
            "serviceAccounts": {"enabled": true}, "ingresses": {"enabled": true},
            "configMaps": {"enabled": true, "all": true}, "secrets": {"enabled": true, "all": true}}}))
        .start("iso-kinds")
        .await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let make = |kind: &str, name: &str, big: bool, rest: serde_json::Value| {
        let mut obj = json!({"apiVersion": "v1", "kind": kind,
            "metadata": {"name": name, "namespace": "default",
                "labels": if big { labels(if kind == "Pod" { 200 } else { 60 }) } else { json!({}) }}});
        if let (Some(o), Some(r)) = (obj.as_object_mut(), rest.as_object()) {
            o.extend(r.clone());
        }
        obj
    };
    let claim = json!({"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
    let ingress = |svc: &str| {
        json!({"apiVersion": "networking.k8s.io/v1", "spec": {"rules": [{"host": "a.example.com",
        "http": {"paths": [{"path": "/", "pathType": "Prefix",
            "backend": {"service": {"name": svc, "port": {"number": 80}}}}]}}]}})
    };
    let selectorless = json!({"spec": {"ports": [{"port": 80}]}});
    let slice = |svc: &str| {
        json!({"apiVersion": "discovery.k8s.io/v1", "addressType": "IPv4", "endpoints": [],
        "metadata": {"labels": {"kubernetes.io/service-name": svc}}})
    };
    // (kind, small, big, the rest of each)
    let cases: Vec<(&str, &str, &str, serde_json::Value)> = vec![
        (
            "ConfigMap",
            "cm-small",
            "cm-big",
            json!({"data": {"k": "v"}}),
        ),
        (
            "Secret",
            "secret-small",
            "secret-big",
            json!({"stringData": {"k": "v"}}),
        ),
        ("ServiceAccount", "sa-small", "sa-big", json!({})),
        ("PersistentVolumeClaim", "pvc-small", "pvc-big", claim),
        ("Service", "svc-small", "svc-big", selectorless.clone()),
        (
            "Pod",
            "pod-small",
            "pod-big",
            json!({"spec": {"containers": [container("c")]}}),
        ),
    ];
    let api = |kind: &str, v: &serde_json::Value| -> (kube::api::ApiResource, serde_json::Value) {
        let av = v["apiVersion"].as_str().unwrap_or("v1").to_string();
        let (group, version) = av.rsplit_once('/').unwrap_or(("", &av));
        let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
        (kube::api::ApiResource::from_gvk(&gvk), v.clone())
    };
    let create_any = |kind: &str, obj: serde_json::Value| {
        let tenant = tenant.clone();
        let (ar, obj) = api(kind, &obj);
        async move {
            let dyn_api: Api<kube::api::DynamicObject> =
                Api::namespaced_with(tenant, "default", &ar);
            let obj: kube::api::DynamicObject = serde_json::from_value(obj).unwrap();
            dyn_api.create(&PostParams::default(), &obj).await.unwrap();
        }
    };
    for (kind, small, big, rest) in &cases {
        create_any(kind, make(kind, small, false, rest.clone())).await;
        create_any(kind, make(kind, big, true, rest.clone())).await;
    }
    // Endpoints and EndpointSlices written by hand for selector-less Services; an Ingress.
    for svc in ["ep-small", "ep-big", "slice-svc"] {
        create_any("Service", make("Service", svc, false, selectorless.clone())).await;
    }
    // Hand-written addresses are judged against their Service: once the syncer has it.
    for svc in ["ep-small", "ep-big", "slice-svc"] {
        host_copy::<Service>(host, &ns.name, svc).await;
    }
    create_any("Endpoints", make("Endpoints", "ep-small", false, json!({}))).await;
    create_any("Endpoints", make("Endpoints", "ep-big", true, json!({}))).await;
    let mut small_slice = slice("slice-svc");
    small_slice["metadata"]["name"] = json!("slice-small");
    small_slice["metadata"]["namespace"] = json!("default");
    small_slice["kind"] = json!("EndpointSlice");
    let mut big_slice = small_slice.clone();
    big_slice["metadata"]["name"] = json!("slice-big");
    if let (Some(l), Some(extra)) = (
        big_slice["metadata"]["labels"].as_object_mut(),
        labels(60).as_object(),
    ) {
        l.extend(extra.clone());
    }
    create_any("EndpointSlice", small_slice).await;
    create_any("EndpointSlice", big_slice).await;
    create_any(
        "Ingress",
        make("Ingress", "ing-small", false, ingress("svc-small")),
    )
    .await;
    create_any(
        "Ingress",
        make("Ingress", "ing-big", true, ingress("svc-small")),
    )
    .await;
    let all = [
        ("ConfigMap", "cm"),
        ("Secret", "secret"),
        ("ServiceAccount", "sa"),
        ("PersistentVolumeClaim", "pvc"),
        ("Service", "svc"),
        ("Pod", "pod"),
        ("Endpoints", "ep"),
        ("EndpointSlice", "slice"),
        ("Ingress", "ing"),
    ];
    let host_has = |kind: &'static str, name: String| {
        let host = host.clone();
        let ns = ns.name.clone();
        async move {
            let av = match kind {
                "EndpointSlice" => ("discovery.k8s.io", "v1"),
                "Ingress" => ("networking.k8s.io", "v1"),
                _ => ("", "v1"),
            };
            let ar = kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
                av.0, av.1, kind,
            ));
            let dyn_api: Api<kube::api::DynamicObject> = Api::namespaced_with(host, &ns, &ar);
            dyn_api
                .get_opt(&format!("{name}-x-default-x-dev"))
                .await
                .ok()
                .flatten()
                .is_some()
        }
    };
    for (kind, stem) in all {
        let small = format!("{stem}-small");
        let copied = eventually(WAIT, || async {
            host_has(kind, small.clone()).await.then_some(())
        })
        .await;
        assert!(copied.is_some(), "the small {kind} was never copied");
        let message = told(tenant, &format!("{stem}-big"), "NotAllowed").await;
        assert!(
            message.contains(&format!(
                "the IsolationProfile's allow.maxObjectBytes.{kind}"
            )),
            "{kind}: {message}"
        );
        assert!(
            !host_has(kind, format!("{stem}-big")).await,
            "the large {kind} reached the host"
        );
    }
}

/// Every count key the operator writes is one the host's quota counts (a misspelt key would
/// count nothing), and past a count the host keeps the copy off.
#[tokio::test]
async fn every_kind_the_syncer_writes_is_counted_by_the_host() {
    let world = TenantSetup::seed()
        .allow(json!({}))
        .sync_policy(json!({"toHost": {"configMaps": {"enabled": true, "all": true}}}))
        .start("iso-counts")
        .await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let quotas: Api<ResourceQuota> = Api::namespaced(host.clone(), &ns.name);
    let last = std::sync::Mutex::new(String::new());
    let counted = eventually(WAIT, || async {
        let q = quota_with(host, &ns.name, "count/endpointslices.discovery.k8s.io").await;
        let used = q.status?.used?;
        let missing: Vec<&str> = tenantplane_api::allowances::DEFAULT_COUNTS
            .iter()
            .map(|(k, _)| *k)
            .filter(|k| !used.contains_key(*k))
            .collect();
        *last.lock().unwrap() = format!("{missing:?}");
        missing.is_empty().then_some(used)
    })
    .await;
    let used =
        counted.unwrap_or_else(|| panic!("the host does not count {}", last.lock().unwrap()));
    // The ConfigMaps the host holds now, and room for two more.
    let now: i64 = used["count/configmaps"].0.parse().unwrap();
    let quota_name = quotas.list(&ListParams::default()).await.unwrap().items[0].name_any();
    let profile = format!("{}-profile", ns.name);
    Api::<tenantplane_api::IsolationProfile>::all(host.clone())
        .patch(
            &profile,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resourceQuota": {"hard": {"count/configmaps": (now + 2).to_string()}}}})),
        )
        .await
        .unwrap();
    let lowered = eventually(WAIT, || async {
        let q = quotas.get(&quota_name).await.ok()?;
        let hard = q.spec?.hard?;
        (hard["count/configmaps"].0 == (now + 2).to_string()).then_some(())
    })
    .await;
    assert!(
        lowered.is_some(),
        "the profile's count never reached the quota"
    );
    let cms: Api<ConfigMap> = Api::namespaced(tenant.clone(), "default");
    for i in 0..4 {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("cm-{i}"), "namespace": "default"},
            "data": {"k": "v"}
        }))
        .unwrap();
        create(&cms, &cm).await;
    }
    let message = told_where(tenant, "HostRejected", |n| n.starts_with("cm-"))
        .await
        .expect("no ConfigMap past the count was refused by the host");
    assert!(message.contains("exceeded quota"), "{message}");
    // Nothing past the bound: of the four, at most the two the room held were copied (the
    // tenant's own ConfigMaps, copied meanwhile, may have taken some of it).
    let copied = Api::<ConfigMap>::namespaced(host.clone(), &ns.name)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|c| c.name_any().starts_with("cm-"))
        .count();
    assert!(
        copied <= 2,
        "the host took {copied} ConfigMaps past a count that had room for two"
    );
}
