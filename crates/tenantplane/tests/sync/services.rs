//! Services and endpoints: an Ingress and its TLS Secret, the tenant's cluster DNS, a Service
//! without a selector and its Endpoints.

use super::*;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use tenantplane_testenv::dns;

#[tokio::test]
async fn an_ingress_goes_down_with_its_tls_secret_and_its_address_comes_back() {
    let world = TestHost::start("sync-ingress").await;
    let (ns, host) = (&world.ns, &world.host);
    // A host IngressClass the tenant is shown; Ingresses go down.
    let class_name = format!("{}-nginx", ns.name);
    let class: IngressClass = serde_json::from_value(json!({
        "metadata": {"name": class_name},
        "spec": {"controller": "example.org/ingress"}
    }))
    .unwrap();
    let classes: Api<IngressClass> = Api::all(host.clone());
    classes
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let tenant = TenantSetup::seed()
        .sync_policy(json!({
            "toHost": {"ingresses": {"enabled": true}},
            "fromHost": {"ingressClasses": {"enabled": true}}
        }))
        .allow(json!({"ingressClasses": [class_name], "ingressHosts": ["*.example.org"]}))
        .ready_in(ns)
        .await;
    let policy_name = format!("{}-policy", ns.name);

    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}
    }))
    .unwrap();
    Api::<Service>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    let tls: Secret = serde_json::from_value(json!({
        "metadata": {"name": "web-tls", "namespace": "default"},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": "not checked here", "tls.key": "not checked here"}
    }))
    .unwrap();
    Api::<Secret>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &tls)
        .await
        .unwrap();
    let ingress: Ingress = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default",
                     "annotations": {"nginx.ingress.kubernetes.io/configuration-snippet": "return 200;"}},
        "spec": {
            "ingressClassName": class_name,
            "tls": [{"hosts": ["web.example.org"], "secretName": "web-tls"}],
            "rules": [{"host": "web.example.org", "http": {"paths": [{
                "path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": "web", "port": {"number": 80}}}
            }]}}]
        }
    }))
    .unwrap();
    let t_ingresses: Api<Ingress> = Api::namespaced(tenant.clone(), "default");
    t_ingresses
        .create(&PostParams::default(), &ingress)
        .await
        .unwrap();

    // The copy points at the Service's and the Secret's copies, without the snippet; the tenant
    // sees the host's class.
    let h_ingresses: Api<Ingress> = Api::namespaced(host.clone(), &ns.name);
    let copy_name = "web-x-default-x-dev";
    let seen = eventually(WAIT, || async {
        let copy = h_ingresses.get_opt(copy_name).await.ok()??;
        Api::<Secret>::namespaced(host.clone(), &ns.name)
            .get_opt("web-tls-x-default-x-dev")
            .await
            .ok()??;
        Api::<IngressClass>::all(tenant.clone())
            .get_opt(&class_name)
            .await
            .ok()??;
        Some(copy)
    })
    .await
    .expect("the Ingress, its TLS Secret and the class never synced");
    let spec = seen.spec.clone().unwrap();
    assert_eq!(
        spec.ingress_class_name.as_deref(),
        Some(class_name.as_str())
    );
    let backend = &spec.rules.as_ref().unwrap()[0].http.as_ref().unwrap().paths[0].backend;
    assert_eq!(
        backend.service.as_ref().unwrap().name,
        "web-x-default-x-dev"
    );
    assert_eq!(
        spec.tls.as_ref().unwrap()[0].secret_name.as_deref(),
        Some("web-tls-x-default-x-dev")
    );
    assert!(
        seen.annotations().keys().all(|k| !k.contains("snippet")),
        "{:?}",
        seen.annotations()
    );

    // The host's ingress controller publishes an address; the tenant's Ingress shows it.
    h_ingresses
        .patch_status(
            copy_name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}}),
            ),
        )
        .await
        .unwrap();
    let address = eventually(WAIT, || async {
        let t = t_ingresses.get("web").await.ok()?;
        t.status?.load_balancer?.ingress?.first()?.ip.clone()
    })
    .await;
    assert_eq!(address.as_deref(), Some("203.0.113.10"));

    // Deleted in the tenant, gone from the host.
    t_ingresses
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let gone = eventually(WAIT, || async {
        h_ingresses
            .get_opt(copy_name)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "the Ingress copy outlived the tenant's Ingress"
    );
    Api::<TenantCluster>::namespaced(host.clone(), &ns.name)
        .delete("dev", &DeleteParams::default())
        .await
        .unwrap();
    Api::<SyncPolicy>::all(host.clone())
        .delete(&policy_name, &DeleteParams::default())
        .await
        .unwrap();
    classes
        .delete(&class_name, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn the_tenant_gets_a_cluster_dns_and_synced_pods_resolve_through_it() {
    let world = ReadyTenant::start("sync-dns").await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let operator = &world.operator;
    // CoreDNS in the tenant's kube-system, its Service at its host copy's address, and its pod
    // admitted by the host under `restricted` and Running there.
    let last = std::sync::Mutex::new(String::new());
    let dns_ip = eventually(WAIT, || async {
        Api::<Deployment>::namespaced(tenant.clone(), "kube-system")
            .get_opt("coredns")
            .await
            .ok()??;
        let t = Api::<Service>::namespaced(tenant.clone(), "kube-system")
            .get_opt("kube-dns")
            .await
            .ok()??;
        let h = Api::<Service>::namespaced(host.clone(), &ns.name)
            .get_opt("kube-dns-x-kube-system-x-dev")
            .await
            .ok()??;
        let t_ip = t.spec?.cluster_ip?;
        let h_ip = h.spec?.cluster_ip?;
        let copies = Api::<Pod>::namespaced(host.clone(), &ns.name)
            .list(&ListParams::default().labels(&format!("{}=kube-dns", hk("k8s-app"))))
            .await
            .ok()?;
        *last.lock().unwrap() = format!(
            "tenant {t_ip}, host {h_ip}, copies running {}",
            copies.items.iter().filter(|p| running(p)).count()
        );
        (t_ip == h_ip && copies.items.iter().any(running)).then_some(t_ip)
    })
    .await
    .unwrap_or_else(|| panic!("the tenant's DNS never ran: {}", last.lock().unwrap()));
    Api::<Pod>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &bare_pod("after", json!({})))
        .await
        .unwrap();
    let copy = eventually(WAIT, || async {
        Api::<Pod>::namespaced(host.clone(), &ns.name)
            .get_opt("after-x-default-x-dev")
            .await
            .ok()?
    })
    .await
    .expect("the pod was never copied");
    let spec = copy.spec.unwrap();
    assert_eq!(spec.dns_policy.as_deref(), Some("None"));
    let config = spec.dns_config.unwrap();
    assert_eq!(config.nameservers.unwrap(), [dns_ip]);
    let searches = config.searches.unwrap();
    assert_eq!(searches[0], "default.svc.cluster.local");

    // A real lookup: the test control plane's CoreDNS runs the copy's Corefile with its token
    // (the local runtime stands in for the kubelet), and answers as a synced pod would be.
    Api::<Service>::namespaced(tenant.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let (web_ip, _) = shared_address(host, tenant, &ns.name, "web")
        .await
        .expect("the tenant Service never took its copy's address");
    let api_ip = Api::<Service>::namespaced(host.clone(), &ns.name)
        .get("dev")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.cluster_ip)
        .unwrap();
    let last = std::sync::Mutex::new(String::new());
    let resolve = |name: &'static str| {
        let (runtime, searches, last, ns) = (&operator.runtime, &searches, &last, &ns.name);
        async move {
            let server = runtime.dns_address(ns, "dev")?;
            // A pod's resolver: a name with fewer dots than ndots (5) tries the searches first.
            for candidate in searches.iter().map(|s| format!("{name}.{s}")) {
                match dns::lookup_a(server, &candidate).await {
                    Ok(a) if a.rcode == 0 && !a.addresses.is_empty() => {
                        return Some(
                            a.addresses
                                .iter()
                                .map(|a| a.to_string())
                                .collect::<Vec<_>>(),
                        );
                    }
                    Ok(a) => *last.lock().unwrap() = format!("{candidate}: {a:?}"),
                    Err(e) => *last.lock().unwrap() = format!("{candidate}: {e}"),
                }
            }
            None
        }
    };
    let web = eventually(WAIT, || resolve("web")).await;
    assert_eq!(
        web,
        Some(vec![web_ip.clone()]),
        "web did not resolve: {}\nCoreDNS:\n{}",
        last.lock().unwrap(),
        operator.runtime.dns_log(&ns.name, "dev")
    );
    for name in ["web.default", "web.default.svc"] {
        assert_eq!(resolve(name).await, Some(vec![web_ip.clone()]), "{name}");
    }
    // The tenant API, by each of the names a client in a pod uses.
    for name in ["kubernetes", "kubernetes.default", "kubernetes.default.svc"] {
        assert_eq!(resolve(name).await, Some(vec![api_ip.clone()]), "{name}");
    }
    let server = operator.runtime.dns_address(&ns.name, "dev").unwrap();
    let missing = dns::lookup_a(server, "nothing.default.svc.cluster.local")
        .await
        .unwrap();
    assert_eq!(
        missing.rcode, 3,
        "a missing Service is NXDOMAIN: {missing:?}"
    );
    let fqdn = dns::lookup_a(server, "web.default.svc.cluster.local.")
        .await
        .unwrap();
    assert_eq!(
        fqdn.addresses
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>(),
        [web_ip]
    );
    assert!(synced_again(host, &ns.name, "dev").await);
}

#[tokio::test]
async fn a_selectorless_service_keeps_its_endpoints_and_a_deleted_service_stays_deleted() {
    use k8s_openapi::api::core::v1::Endpoints;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let world = TestHost::start("sync-endpoints").await;
    let (ns, host) = (&world.ns, &world.host);
    // The database outside the cluster is at an address the profile lets Endpoints name; the
    // profile honours the tenant's own Service addresses (the default lets the host choose).
    let tenant = TenantSetup::seed()
        .sync_policy(json!({}))
        .allow(json!({"endpointCIDRs": ["10.1.2.0/24"], "chosenClusterIPs": true}))
        .ready_in(ns)
        .await;
    let pp = PostParams::default();
    let services = Api::<Service>::namespaced(tenant.clone(), "default");
    let endpoints = Api::<Endpoints>::namespaced(tenant.clone(), "default");
    // A Service for something outside the cluster, its Endpoints written right after it: the
    // tenant Service is made again with its copy's address, and the Endpoints must survive that.
    services
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": "db", "namespace": "default"},
                "spec": {"ports": [{"name": "pg", "port": 5432}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    endpoints
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": "db", "namespace": "default"},
                "subsets": [{"addresses": [{"ip": "10.1.2.3"}], "ports": [{"name": "pg", "port": 5432}]}]
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let uid = services.get("db").await.unwrap().uid().unwrap();
    let took = shared_address(host, &tenant, &ns.name, "db")
        .await
        .map(|(_, uid)| uid);
    // The copy asked the host for the tenant's own address, so the Service was never made again.
    assert_eq!(
        took,
        Some(uid),
        "the tenant and host addresses never agreed, or the Service was made again"
    );
    // Past the syncer's watch window for the endpoints controller's delete.
    tokio::time::sleep(std::time::Duration::from_secs(8)).await;
    let addresses = |ep: Option<Endpoints>| -> Vec<String> {
        ep.into_iter()
            .flat_map(|e| e.subsets.unwrap_or_default())
            .flat_map(|s| s.addresses.unwrap_or_default())
            .map(|a| a.ip)
            .collect()
    };
    assert_eq!(
        addresses(endpoints.get_opt("db").await.unwrap()),
        ["10.1.2.3"]
    );
    let mirrored = eventually(WAIT, || async {
        let slices = Api::<EndpointSlice>::namespaced(tenant.clone(), "default")
            .list(&ListParams::default().labels("kubernetes.io/service-name=db"))
            .await
            .ok()?;
        slices
            .items
            .iter()
            .any(|s| {
                s.endpoints
                    .iter()
                    .flatten()
                    .any(|e| e.addresses == ["10.1.2.3"])
            })
            .then_some(())
    })
    .await;
    assert!(
        mirrored.is_some(),
        "the tenant never mirrored the Endpoints into an EndpointSlice"
    );
    let host_copy = eventually(WAIT, || async {
        let e = Api::<Endpoints>::namespaced(host.clone(), &ns.name)
            .get_opt("db-x-default-x-dev")
            .await
            .ok()??;
        (addresses(Some(e)) == ["10.1.2.3"]).then_some(())
    })
    .await;
    assert!(host_copy.is_some(), "the Endpoints never reached the host");
    // The slice the tenant mirrored from them stays in the tenant: the host mirrors its own.
    let host_slices = Api::<EndpointSlice>::namespaced(host.clone(), &ns.name);
    let copies_for = |service: &'static str| {
        let host_slices = host_slices.clone();
        async move {
            host_slices
                .list(&ListParams::default().labels(&format!(
                    "kubernetes.io/service-name={service},endpointslice.kubernetes.io/managed-by=syncer.tenantplane.io"
                )))
                .await
                .unwrap()
                .items
        }
    };
    assert!(copies_for("db-x-default-x-dev").await.is_empty());

    // EndpointSlices a person writes for a selector-less Service go down, tied to its copy and
    // holding only the addresses the profile allows; one computed by a tenant controller does
    // not.
    services
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": "cache", "namespace": "default"},
                "spec": {"ports": [{"name": "redis", "port": 6379}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let tenant_slices = Api::<EndpointSlice>::namespaced(tenant.clone(), "default");
    for (name, managed_by, ip) in [
        ("cache-a", "by-hand", "10.1.2.4"),
        ("cache-b", "by-hand", "10.9.9.9"),
        ("cache-c", "endpointslice-controller.k8s.io", "10.1.2.5"),
    ] {
        tenant_slices
            .create(
                &pp,
                &serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": "default", "labels": {
                        "kubernetes.io/service-name": "cache",
                        "endpointslice.kubernetes.io/managed-by": managed_by}},
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
                    "ports": [{"name": "redis", "port": 6379, "protocol": "TCP"}]
                }))
                .unwrap(),
            )
            .await
            .unwrap();
    }
    let copied = eventually(WAIT, || async {
        let copies = copies_for("cache-x-default-x-dev").await;
        (copies.len() == 2).then_some(copies)
    })
    .await
    .expect("the two slices written by hand never reached the host");
    let mut addresses: Vec<Vec<String>> = copied
        .iter()
        .map(|s| {
            s.endpoints
                .iter()
                .flatten()
                .flat_map(|e| e.addresses.clone())
                .collect()
        })
        .collect();
    addresses.sort();
    assert_eq!(addresses, [vec![], vec!["10.1.2.4".to_string()]]);
    assert!(
        host_slices
            .get_opt("cache-c-x-default-x-dev")
            .await
            .unwrap()
            .is_none(),
        "a slice of the tenant's endpointslice controller reached the host"
    );
    // A selector hands the Service's endpoints to the host's controller: the copies go.
    services
        .patch(
            "cache",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"selector": {"app": "cache"}}})),
        )
        .await
        .unwrap();
    let gone = eventually(WAIT, || async {
        copies_for("cache-x-default-x-dev")
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "slices stayed on the host after their Service took a selector"
    );

    // An address the host holds already: the copy takes one of the host's choosing, and the
    // tenant Service is made again with it.
    Api::<Service>::namespaced(host.clone(), &ns.name)
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": "holder"},
                "spec": {"clusterIP": "10.96.200.200", "ports": [{"port": 80}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    services
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": "clash", "namespace": "default"},
                "spec": {"clusterIP": "10.96.200.200", "selector": {"app": "web"}, "ports": [{"port": 80}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let moved = shared_address(host, &tenant, &ns.name, "clash")
        .await
        .map(|(ip, _)| ip);
    assert!(
        moved.as_deref().is_some_and(|ip| ip != "10.96.200.200"),
        "the tenant Service never moved to its copy's address: {moved:?}"
    );

    // Services deleted as soon as they are made stay deleted, on both sides.
    for i in 0..5 {
        let name = format!("brief-{i}");
        services
            .create(
                &pp,
                &serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}
                }))
                .unwrap(),
            )
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200 * i)).await;
        services
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_secs(10)).await;
    let left: Vec<String> = services
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|s| s.name_any())
        .filter(|n| n.starts_with("brief-"))
        .collect();
    assert!(left.is_empty(), "deleted Services came back: {left:?}");
    let gone = eventually(WAIT, || async {
        let copies = Api::<Service>::namespaced(host.clone(), &ns.name)
            .list(&ListParams::default())
            .await
            .ok()?;
        (!copies
            .items
            .iter()
            .any(|s| s.name_any().starts_with("brief-")))
        .then_some(())
    })
    .await;
    assert!(gone.is_some(), "host copies of deleted Services stayed");
}
