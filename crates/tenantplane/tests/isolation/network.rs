//! Isolation, second round: network. Addresses and Endpoints (a tenant choosing its host Service
//! address, an Endpoints copy keeping a gone pod's address), egress to metadata and link-local
//! addresses, and Ingresses under a profile that admits them.

use super::*;

use std::time::Instant;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::{Ingress, NetworkPolicy};

/// The addresses of Endpoints `e` (ready ones), sorted.
fn addresses_of(e: &Endpoints) -> Vec<String> {
    let mut ips: Vec<String> = e
        .subsets
        .iter()
        .flatten()
        .flat_map(|s| s.addresses.iter().flatten().map(|a| a.ip.clone()))
        .collect();
    ips.sort();
    ips
}

/// The address of tenant pod `default/<name>`, once it has one.
async fn pod_ip(pods: &Api<Pod>, name: &str) -> String {
    eventually(WAIT, || async { pods.get(name).await.ok()?.status?.pod_ip })
        .await
        .unwrap_or_else(|| panic!("tenant pod {name} never got an address"))
}

#[tokio::test]
async fn an_endpoints_copy_drops_a_gone_pods_address_at_once() {
    let world = TenantSetup::seed()
        .allow(json!({}))
        .start("iso-stale")
        .await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    // The tenant's CoreDNS first: a pod of this tenant's that starts after "gone" is deleted may
    // be given its address, which the copy then rightly names (CI met that twice: the CoreDNS
    // copy, slow to start, took 10.244.0.13 from the deleted pod).
    dns_settled(host, &ns.name, &world.name).await;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    create(&pods, &pod("gone", json!({}), json!({}))).await;
    create(&pods, &pod("stays", json!({}), json!({}))).await;
    let (gone, stays) = (pod_ip(&pods, "gone").await, pod_ip(&pods, "stays").await);
    // Endpoints written by hand for a Service without a selector, naming both pods.
    let services: Api<Service> = Api::namespaced(tenant.clone(), "default");
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"ports": [{"port": 5432}]}
    }))
    .unwrap();
    create(&services, &svc).await;
    let endpoints: Endpoints = serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": "default"},
        "subsets": [{"addresses": [{"ip": gone}, {"ip": stays}], "ports": [{"port": 5432}]}]
    }))
    .unwrap();
    create(
        &Api::<Endpoints>::namespaced(tenant.clone(), "default"),
        &endpoints,
    )
    .await;
    let copies: Api<Endpoints> = Api::namespaced(host.clone(), &ns.name);
    let mut both = vec![gone.clone(), stays.clone()];
    both.sort();
    let copied = eventually(WAIT, || async {
        let e = copies.get_opt("db-x-default-x-dev").await.ok()??;
        (addresses_of(&e) == both).then_some(())
    })
    .await;
    assert!(copied.is_some(), "the Endpoints copy never named both pods");
    // The pod goes: its address leaves the copy when it does, not on a later pass.
    let started = Instant::now();
    pods.delete("gone", &Default::default()).await.unwrap();
    let last = std::sync::Mutex::new(Vec::new());
    let dropped = eventually(WAIT, || async {
        let e = copies.get_opt("db-x-default-x-dev").await.ok()??;
        let ips = addresses_of(&e);
        *last.lock().unwrap() = ips.clone();
        (!ips.contains(&gone)).then_some(ips)
    })
    .await;
    let took = started.elapsed();
    println!("the gone pod's address left the Endpoints copy after {took:?}");
    if dropped.is_none() {
        // What the syncer had to go on: the pod copies on the host and its verdict.
        let copies: Vec<String> = Api::<Pod>::namespaced(host.clone(), &ns.name)
            .list(&Default::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .map(|p| {
                        let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone());
                        let deleting = p.metadata.deletion_timestamp.is_some();
                        format!("{} ip={ip:?} deleting={deleting}", p.name_any())
                    })
                    .collect()
            })
            .unwrap_or_default();
        let tenant_pod = pods.get_opt("gone").await.ok().flatten().map(|p| {
            let deleting = p.metadata.deletion_timestamp.is_some();
            format!("deleting={deleting}")
        });
        let tc = Api::<TenantCluster>::namespaced(host.clone(), &ns.name)
            .get(&world.name)
            .await
            .ok()
            .and_then(|tc| tc.status);
        let synced = tc
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == SYNCED).cloned());
        panic!(
            "the copy still named the deleted pod's {gone} after {took:?}: {:?}\n\
             host pods: {copies:?}\ntenant pod gone: {tenant_pod:?}\nSynced: {synced:?}",
            last.lock().unwrap()
        );
    }
    assert_eq!(dropped, Some(vec![stays.clone()]));
    // The last address goes too: the copy keeps no subset (the host refuses one with ports and
    // no address, and a refused write left the address in the copy).
    pods.delete("stays", &Default::default()).await.unwrap();
    let emptied = eventually(WAIT, || async {
        let e = copies.get_opt("db-x-default-x-dev").await.ok()??;
        e.subsets.unwrap_or_default().is_empty().then_some(())
    })
    .await;
    assert!(
        emptied.is_some(),
        "the copy kept the last pod's address {stays}"
    );
}

/// The host copy of tenant Service `default/<name>` and the tenant Service, once the tenant
/// Service carries its copy's address: that address.
async fn shared_address(host: &Client, tenant: &Client, ns: &str, name: &str) -> String {
    let last = std::sync::Mutex::new(String::new());
    let ip = eventually(WAIT, || async {
        let t = Api::<Service>::namespaced(tenant.clone(), "default")
            .get_opt(name)
            .await
            .ok()??;
        let h = Api::<Service>::namespaced(host.clone(), ns)
            .get_opt(&format!("{name}-x-default-x-dev"))
            .await
            .ok()??;
        let (t_ip, h_ip) = (t.spec?.cluster_ip, h.spec?.cluster_ip);
        *last.lock().unwrap() = format!("tenant {t_ip:?}, host {h_ip:?}");
        (t_ip.is_some() && t_ip == h_ip).then_some(h_ip?)
    })
    .await;
    ip.unwrap_or_else(|| {
        panic!(
            "Service {name} never carried its copy's address: {}",
            last.lock().unwrap()
        )
    })
}

/// Tenant Service `default/<name>` asking for cluster IP `ip`.
fn service_at(name: &str, ip: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"clusterIP": ip, "ports": [{"port": 53, "protocol": "UDP"}]}
    }))
    .unwrap()
}

#[tokio::test]
async fn a_tenant_never_chooses_its_host_service_address() {
    // The shipped profile: tenant-chosen cluster IPs are not honoured.
    let world = TenantSetup::seed()
        .allow(json!({}))
        .start("iso-svcip")
        .await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let services: Api<Service> = Api::namespaced(tenant.clone(), "default");
    // The range's `.10` (the cluster DNS on many hosts), and an address picked to squat on.
    create(&services, &service_at("fake-dns", "10.96.0.10")).await;
    create(&services, &service_at("squat", "10.96.123.45")).await;
    let plain: Service = serde_json::from_value(json!({
        "metadata": {"name": "plain", "namespace": "default"},
        "spec": {"ports": [{"port": 80}]}
    }))
    .unwrap();
    create(&services, &plain).await;
    for (name, chosen) in [("fake-dns", "10.96.0.10"), ("squat", "10.96.123.45")] {
        let ip = shared_address(host, tenant, &ns.name, name).await;
        assert_ne!(ip, chosen, "{name} got the address it chose on the host");
        let message = told(tenant, name, "NotCopied").await;
        assert!(
            message.contains(chosen) && message.contains("allow.chosenClusterIPs"),
            "{name}: {message}"
        );
    }
    // A Service that chose nothing takes the host's address without a word.
    shared_address(host, tenant, &ns.name, "plain").await;
    // No copy of this tenant holds the range's first or tenth address.
    let copies = Api::<Service>::namespaced(host.clone(), &ns.name)
        .list(&ListParams::default().labels(naming::LABEL_SYNCED_FROM))
        .await
        .unwrap();
    for c in &copies.items {
        let ip = c.spec.as_ref().and_then(|s| s.cluster_ip.clone());
        assert!(
            !matches!(ip.as_deref(), Some("10.96.0.10" | "10.96.0.1")),
            "{} holds {ip:?}",
            c.name_any()
        );
    }
}

#[tokio::test]
async fn a_profile_may_honour_chosen_addresses_but_never_the_reserved_ones() {
    let world = TenantSetup::seed()
        .allow(json!({"chosenClusterIPs": true, "externalNames": ["foo.example.com"]}))
        .start("iso-svcip-on")
        .await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let services: Api<Service> = Api::namespaced(tenant.clone(), "default");
    create(&services, &service_at("fake-dns", "10.96.0.10")).await;
    create(&services, &service_at("pinned", "10.96.124.46")).await;
    assert_eq!(
        shared_address(host, tenant, &ns.name, "pinned").await,
        "10.96.124.46",
        "the profile honours a chosen address"
    );
    let dns = shared_address(host, tenant, &ns.name, "fake-dns").await;
    assert_ne!(dns, "10.96.0.10");
    let message = told(tenant, "fake-dns", "NotCopied").await;
    assert!(message.contains("first and tenth addresses"), "{message}");

    // An ExternalName Service turned ClusterIP keeps the address its tenant gave it, and stays
    // the same object: its copy asks for that address as a new copy would.
    let external: Service = serde_json::from_value(json!({
        "metadata": {"name": "ext", "namespace": "default"},
        "spec": {"type": "ExternalName", "externalName": "foo.example.com"}
    }))
    .unwrap();
    let made = create(&services, &external).await;
    let copies = Api::<Service>::namespaced(host.clone(), &ns.name);
    let copied = eventually(WAIT, || async {
        copies
            .get_opt("ext-x-default-x-dev")
            .await
            .ok()?
            .filter(|c| {
                c.spec.as_ref().and_then(|s| s.external_name.as_deref()) == Some("foo.example.com")
            })
    })
    .await;
    assert!(
        copied.is_some(),
        "the ExternalName Service never got its copy"
    );
    let turned = services
        .patch(
            "ext",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "ClusterIP", "externalName": null,
                                          "ports": [{"port": 80}]}})),
        )
        .await
        .unwrap();
    let given = turned.spec.and_then(|s| s.cluster_ip).unwrap();
    assert_eq!(shared_address(host, tenant, &ns.name, "ext").await, given);
    let now = services.get("ext").await.unwrap();
    assert_eq!(now.uid(), made.uid(), "the tenant Service was made again");
}

/// Addresses of metadata and identity endpoints, in both families and as NAT64 reaches them.
const CLOSED_ENDPOINTS: &[&str] = &[
    "169.254.169.254",
    "169.254.170.23",
    "168.63.129.16",
    "100.100.100.200",
    "192.0.0.192",
    "fd00:ec2::254",
    "fd00:ec2::23",
    "fd20:ce::254",
    "fd00:c1::a9fe:a9fe",
    "fe80::a9fe:a9fe",
    "64:ff9b::a9fe:a9fe",
];

/// Which of `ips` some ipBlock of the egress rules of `policy` admits.
fn admitted(policy: &NetworkPolicy, ips: &[&str]) -> Vec<String> {
    use tenantplane_api::cidr::Cidr;
    let blocks: Vec<_> = policy
        .spec
        .iter()
        .flat_map(|s| s.egress.iter().flatten())
        .flat_map(|r| r.to.iter().flatten())
        .filter_map(|p| p.ip_block.clone())
        .collect();
    ips.iter()
        .filter(|ip| {
            let ip = ip.parse().unwrap();
            blocks.iter().any(|b| {
                Cidr::parse(&b.cidr).is_some_and(|c| c.contains(ip))
                    && !b
                        .except
                        .iter()
                        .flatten()
                        .any(|e| Cidr::parse(e).is_some_and(|c| c.contains(ip)))
            })
        })
        .map(|ip| ip.to_string())
        .collect()
}

#[tokio::test]
async fn no_egress_policy_opens_metadata_or_link_local_addresses() {
    let world = TestHost::start("iso-egress").await;
    let (ns, host) = (&world.ns, &world.host);
    // A profile that lists the world, a metadata address and all of ULA space.
    let wide = json!({"networkPolicy": {"enabled": true, "allowedEgressCIDRs":
        ["0.0.0.0/0", "169.254.169.254/32", "fd00::/8", "100.64.0.0/10"]}});
    TenantSetup::seed().profile_spec(wide).ready_in(ns).await;
    let policies: Api<NetworkPolicy> = Api::namespaced(host.clone(), &ns.name);
    let isolation = |want: &'static str| {
        let policies = policies.clone();
        async move {
            eventually(WAIT, || async {
                let p = policies.get_opt("dev-isolation").await.ok()??;
                serde_json::to_string(&p.spec)
                    .ok()?
                    .contains(want)
                    .then_some(p)
            })
            .await
            .unwrap_or_else(|| panic!("the isolation NetworkPolicy never said {want}"))
        }
    };
    let deny = isolation("0.0.0.0/0").await;
    assert_eq!(admitted(&deny, CLOSED_ENDPOINTS), Vec::<String>::new());
    assert_eq!(
        admitted(&deny, &["8.8.8.8", "fd12::1", "100.64.0.1"]),
        ["8.8.8.8", "fd12::1", "100.64.0.1"],
        "what the profile lists stays open"
    );
    // The same tenant under `allow-all`.
    Api::<TenantCluster>::namespaced(host.clone(), &ns.name)
        .patch(
            "dev",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"spec": {"networking": {"egressPolicy": "allow-all"}}}),
            ),
        )
        .await
        .unwrap();
    let open = isolation("::/0").await;
    assert_eq!(admitted(&open, CLOSED_ENDPOINTS), Vec::<String>::new());
    assert_eq!(
        admitted(&open, &["8.8.8.8", "2001:db8::1"]),
        ["8.8.8.8", "2001:db8::1"]
    );
}

/// Tenant `dev` whose SyncPolicy copies Ingresses down and whose profile admits class `nginx`,
/// every host and every annotation key: only what the values and paths do stands in the way.
async fn tenant_with_ingresses(prefix: &str) -> ReadyTenant {
    TenantSetup::seed()
        .sync_policy(json!({"toHost": {"ingresses": {"enabled": true}}}))
        .allow(json!({"ingressClasses": ["nginx"], "ingressHosts": ["*"],
            "annotations": {"ingresses": ["*"]}}))
        .start(prefix)
        .await
}

/// Ingress `default/<name>` of class nginx for `host` on `path`, with TLS Secret `<name>-tls`.
fn ingress(name: &str, annotations: serde_json::Value, path: &str, path_type: &str) -> Ingress {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {
            "ingressClassName": "nginx",
            "tls": [{"hosts": [format!("{name}.dev.example.com")], "secretName": format!("{name}-tls")}],
            "rules": [{"host": format!("{name}.dev.example.com"), "http": {"paths": [{
                "path": path, "pathType": path_type,
                "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn ingresses_are_judged_by_what_their_annotations_and_paths_do() {
    let world = tenant_with_ingresses("iso-ingress").await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let ingresses: Api<Ingress> = Api::namespaced(tenant.clone(), "default");
    let secrets: Api<Secret> = Api::namespaced(tenant.clone(), "default");
    let attacks = [
        (
            "haproxy",
            json!({"haproxy.org/ssl-certificate": "kube-system/wildcard-tls"}),
            "/",
            "Prefix",
            "namespace \"kube-system\"",
        ),
        (
            "traefik",
            json!({"traefik.ingress.kubernetes.io/router.middlewares": "payments-auth@kubernetescrd"}),
            "/",
            "Prefix",
            "another provider or namespace",
        ),
        (
            "redirect",
            json!({"nginx.ingress.kubernetes.io/permanent-redirect": "https://bank.example.org/login"}),
            "/",
            "Prefix",
            "URL",
        ),
        (
            "mirror",
            json!({"nginx.ingress.kubernetes.io/upstream-vhost": "kubernetes.default.svc.cluster.local"}),
            "/",
            "Prefix",
            "a host this Ingress does not serve",
        ),
        (
            "issuer",
            json!({"cert-manager.io/cluster-issuer": "platform-internal-ca"}),
            "/",
            "Prefix",
            "allow.certIssuers",
        ),
        (
            "legacy-class",
            json!({"kubernetes.io/ingress.class": "internal"}),
            "/",
            "Prefix",
            "allow.ingressClasses",
        ),
        (
            "config",
            json!({}),
            "/x;} location /admin { return 200",
            "ImplementationSpecific",
            "not a plain path",
        ),
        ("braces", json!({}), "/{x}", "Prefix", "not a plain path"),
    ];
    for (name, annotations, path, path_type, _) in &attacks {
        let tls: Secret = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-tls"), "namespace": "default"},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"}
        }))
        .unwrap();
        create(&secrets, &tls).await;
        let mut attack = ingress(name, annotations.clone(), path, path_type);
        if *name == "legacy-class" {
            // The API refuses the annotation beside a different ingressClassName.
            attack.spec.as_mut().unwrap().ingress_class_name = None;
        }
        create(&ingresses, &attack).await;
    }
    // An Ingress that asks for nothing of the kind goes down, and its TLS Secret with it.
    let web_tls: Secret = serde_json::from_value(json!({
        "metadata": {"name": "web-tls", "namespace": "default"},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"}
    }))
    .unwrap();
    create(&secrets, &web_tls).await;
    let ok = json!({"nginx.ingress.kubernetes.io/rewrite-target": "/",
                    "nginx.ingress.kubernetes.io/whitelist-source-range": "203.0.113.0/24"});
    create(&ingresses, &ingress("web", ok, "/api", "Prefix")).await;
    let copy = host_copy::<Ingress>(host, &ns.name, "web").await;
    assert_eq!(
        copy.annotations()
            .get("nginx.ingress.kubernetes.io/whitelist-source-range")
            .map(String::as_str),
        Some("203.0.113.0/24")
    );
    host_copy::<Secret>(host, &ns.name, "web-tls").await;
    for (name, _, _, _, needle) in &attacks {
        let message = told(tenant, name, "NotAllowed").await;
        assert!(message.contains(needle), "{name}: {message}");
        assert!(
            !has_copy::<Ingress>(host, &ns.name, name).await,
            "{name} reached the host"
        );
        // The TLS Secret of a refused Ingress stays in the tenant.
        assert!(
            !has_copy::<Secret>(host, &ns.name, &format!("{name}-tls")).await,
            "the TLS Secret of {name} reached the host"
        );
    }
    synced_says(host, &ns.name, "NotAllowed", "Ingress default/").await;
}
