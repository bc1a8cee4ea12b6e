//! Services and DNS from inside a tenant pod: the tenant's CoreDNS (a real container) answers
//! the tenant's names, kube-proxy carries a request to a tenant pod, a StatefulSet pod's name
//! resolves under its headless Service, the pod's own ServiceAccount token works against the
//! tenant API, and the downward API gives the tenant's names.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::Api;
use serde_json::json;
use tenantplane_testenv::eventually;

use super::common::{WAIT, cluster_ip};
use super::*;

/// The addresses `nslookup name` answers with (busybox prints the server first, then
/// `Address: …` lines for the name).
fn answers(nslookup: &str) -> Vec<String> {
    nslookup
        .split("Name:")
        .skip(1)
        .flat_map(|part| part.lines())
        .filter_map(|l| l.trim().strip_prefix("Address:"))
        .map(|a| a.trim().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_pod_finds_and_reaches_the_tenants_services() {
    let world = real_tenant("nodes-svc").await;
    let tenant = &world.tenant;
    create_pod(
        tenant,
        "web-a",
        json!({"containers": [agnhost("c", &["netexec", "--http-port=8080", "--udp-port=8081"])]}),
    )
    .await;
    // `app: web-a` is the pod's own label (see `create_pod`); the Service selects it.
    create::<Service>(
        tenant,
        json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"selector": {"app": "web-a"}, "ports": [{"port": 80, "targetPort": 8080}]},
        }),
    )
    .await;
    create::<Service>(
        tenant,
        json!({
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"clusterIP": "None", "selector": {"app": "db"}, "ports": [{"port": 80}]},
        }),
    )
    .await;
    create::<StatefulSet>(
        tenant,
        json!({
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {
                "serviceName": "db",
                "replicas": 1,
                "selector": {"matchLabels": {"app": "db"}},
                "template": {"metadata": {"labels": {"app": "db"}},
                             "spec": {"containers": [busybox("c", "exec sleep 3600")]}},
            },
        }),
    )
    .await;
    create_pod(
        tenant,
        "client",
        json!({"containers": [busybox("c", "exec sleep 3600")]}),
    )
    .await;
    running(tenant, "client").await;
    running(tenant, "web-a").await;
    let (_connect, kubeconfig) = connect(&world).await;

    // The tenant's names, from the tenant's CoreDNS, give the tenant's addresses.
    let web_ip = cluster_ip(tenant, "default", "web").await;
    let said = exec_until_ok(
        &kubeconfig,
        "client",
        "nslookup web.default.svc.cluster.local",
    )
    .await;
    assert_eq!(answers(&said), vec![web_ip.clone()], "{said}");
    let api_ip = cluster_ip(tenant, "default", "kubernetes").await;
    let said = exec_until_ok(
        &kubeconfig,
        "client",
        "nslookup kubernetes.default.svc.cluster.local",
    )
    .await;
    assert_eq!(answers(&said), vec![api_ip], "{said}");
    // busybox's nslookup asks for a name as written; a program's resolver (wget's) applies the
    // search list.
    reaches_the_tenant_api(&kubeconfig, "client").await;

    // Through the Service (kube-proxy on the real node) to the tenant pod.
    let said = exec_until_ok(
        &kubeconfig,
        "client",
        "timeout 10 wget -qO- http://web/hostname",
    )
    .await;
    assert_eq!(said, "web-a");
    let said = exec_until_ok(
        &kubeconfig,
        "client",
        &format!("timeout 10 wget -qO- http://{web_ip}:80/hostname"),
    )
    .await;
    assert_eq!(said, "web-a");

    // A StatefulSet pod: its hostname is its tenant name, and <pod>.<service> resolves to it.
    let db = running(tenant, "db-0").await;
    let db_ip = db.status.and_then(|s| s.pod_ip).unwrap();
    let said = kubectl(&kubeconfig, &["exec", "db-0", "--", "hostname"], "").await;
    assert_eq!(said.1.trim(), "db-0", "{said:?}");
    // Its /etc/hosts names it as the tenant's kubelet would (the host's kubelet wrote the copy's
    // names), so it finds itself before DNS has it; the syncer's writer is not the tenant's to see.
    let said = kubectl(
        &kubeconfig,
        &["exec", "db-0", "--", "cat", "/etc/hosts"],
        "",
    )
    .await;
    assert_eq!(said.0, 0, "{said:?}");
    assert!(
        said.1
            .starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"),
        "{said:?}"
    );
    assert!(
        said.1
            .lines()
            .any(|l| l == format!("{db_ip}\tdb-0.db.default.svc.cluster.local\tdb-0")),
        "{said:?}"
    );
    assert!(!said.1.contains(&world.ns.name), "no host names: {said:?}");
    let said = kubectl(
        &kubeconfig,
        &[
            "exec",
            "db-0",
            "--",
            "sh",
            "-c",
            "echo 10.9.9.9 extra >> /etc/hosts",
        ],
        "",
    )
    .await;
    assert_eq!(
        said.0, 0,
        "the pod's own file, writable as the kubelet's is: {said:?}"
    );
    let shown = Api::<Pod>::namespaced(tenant.clone(), "default")
        .get("db-0")
        .await
        .unwrap();
    assert!(
        shown
            .status
            .as_ref()
            .and_then(|s| s.init_container_statuses.as_ref())
            .is_none_or(|l| l.is_empty()),
        "{:?}",
        shown.status
    );
    let copy = host_copy(&world, "db-0").await;
    assert_eq!(
        copy.spec.unwrap().init_containers.unwrap()[0].name,
        tenantplane_syncer::kinds::pods::hosts::HOSTS_CONTAINER
    );
    // A pod without a subdomain keeps the kubelet's file: its names there are already the tenant's.
    let said = kubectl(
        &kubeconfig,
        &["exec", "client", "--", "cat", "/etc/hosts"],
        "",
    )
    .await;
    assert!(said.1.lines().any(|l| l.ends_with("\tclient")), "{said:?}");
    let said = exec_until_ok(
        &kubeconfig,
        "client",
        "nslookup db-0.db.default.svc.cluster.local",
    )
    .await;
    assert_eq!(answers(&said), vec![db_ip], "{said}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_knows_itself_by_its_tenant_names() {
    let world = real_tenant("nodes-self").await;
    let tenant = &world.tenant;
    // The downward API, as variables and as a file.
    let mut me = busybox(
        "c",
        "echo \"env $POD_NAME $POD_NAMESPACE $POD_SA\"; echo \"file $(cat /info/name)\"; exec sleep 3600",
    );
    me["env"] = json!([
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
    ]);
    me["volumeMounts"] = json!([{"name": "info", "mountPath": "/info"}]);
    create_pod(
        tenant,
        "me",
        json!({
            "containers": [me],
            "volumes": [{"name": "info", "downwardAPI": {"items": [
                {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}}],
        }),
    )
    .await;
    running(tenant, "me").await;
    // Running says the container started, not that its lines are in its log yet.
    let logs = logs_when(tenant, "me", |l| l.lines().count() >= 2).await;
    assert_eq!(
        logs.as_deref(),
        Ok("env me default default\nfile me\n"),
        "the pod's own names, from its variables and its file"
    );

    // The pod's own token, from inside the pod, against the tenant API: agnhost's
    // inclusterclient calls /healthz each second with client-go's in-cluster configuration (the
    // tenant's CA checked, the token sent); a token the tenant did not issue would be refused
    // (401), so every call succeeding shows the tenant knows it. It logs a hash of the header
    // it sent, which must be the pod's own token's.
    let (_connect, kubeconfig) = connect(&world).await;
    create_pod(
        tenant,
        "caller",
        json!({"containers": [agnhost("c", &["inclusterclient", "--poll-interval=1"])]}),
    )
    .await;
    running(tenant, "caller").await;
    // The hash inclusterclient logs: base64url(sha256("salt|" + the Authorization header)).
    let hash = exec_until_ok(
        &kubeconfig,
        "caller",
        "printf 'salt|Bearer %s' \"$(cat /var/run/secrets/kubernetes.io/serviceaccount/token)\" \
         | sha256sum | cut -d' ' -f1 | xxd -r -p | base64 | tr '+/' '-_' | tr -d '='",
    )
    .await;
    let calls = logs_when(tenant, "caller", |l| {
        l.matches("calling /healthz").count() >= 5
    })
    .await
    .expect("inclusterclient called the tenant API five times");
    assert!(!calls.contains("status=failed"), "{calls}");
    assert!(calls.contains("authz_header="), "{calls}");
    let sent = calls
        .lines()
        .filter_map(|l| l.split("authz_header=").nth(1))
        .map(str::trim)
        .collect::<Vec<_>>();
    assert!(
        !sent.is_empty() && sent.iter().all(|h| *h == hash.trim()),
        "every call sent the pod's own token ({hash}): {calls}"
    );
}

/// A profile that shows node addresses: the virtual Node's InternalIP and a pod's hostIP are the
/// host node's, a NodePort Service answers at that address from a tenant pod, and the tenant API
/// server still reaches the kubelet endpoint (its Hostname address) for logs and exec.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_port_answers_at_the_nodes_address_when_the_profile_shows_it() {
    use k8s_openapi::api::core::v1::Node;
    use_real_nodes();
    let world = TestHost::start_with_kubelet("nodes-addr")
        .await
        .ready(
            TenantSetup::seed()
                .allow(json!({"nodePorts": true, "nodeAddresses": true}))
                // Node-port traffic reaches the pod from the node's own address (kube-proxy
                // masquerades it), which the profile's NetworkPolicy does not admit; its quota
                // holds no node ports unless it says so.
                .profile_spec(json!({"networkPolicy": {"enabled": false},
                                     "resourceQuota": {"enforce": false,
                                                       "hard": {"services.nodeports": "10"}}})),
        )
        .await;
    let tenant = &world.tenant;
    create_pod(
        tenant,
        "web-a",
        json!({"containers": [agnhost("c", &["netexec", "--http-port=8080", "--udp-port=-1"])]}),
    )
    .await;
    create::<Service>(
        tenant,
        json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "NodePort", "selector": {"app": "web-a"},
                     "ports": [{"port": 80, "targetPort": 8080}]},
        }),
    )
    .await;
    create_pod(
        tenant,
        "client",
        json!({"containers": [busybox("c", "exec sleep 3600")]}),
    )
    .await;
    running(tenant, "client").await;
    let web = running(tenant, "web-a").await;
    let node_name = web.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
    let internal = |n: &Node| -> Vec<String> {
        n.status
            .iter()
            .flat_map(|s| s.addresses.iter().flatten())
            .filter(|a| a.type_ == "InternalIP")
            .map(|a| a.address.clone())
            .collect()
    };
    let host_node = Api::<Node>::all(world.host.clone())
        .get(&node_name)
        .await
        .unwrap();
    let node_ip = internal(&host_node)
        .into_iter()
        .next()
        .expect("the host node has no InternalIP");
    let shown = eventually(WAIT, || async {
        let n = Api::<Node>::all(tenant.clone())
            .get(&node_name)
            .await
            .ok()?;
        (internal(&n) == [node_ip.clone()]).then_some(n)
    })
    .await;
    assert!(shown.is_some(), "the virtual Node never showed {node_ip}");
    let host_ip = eventually(WAIT, || async {
        let p = Api::<Pod>::namespaced(tenant.clone(), "default")
            .get("web-a")
            .await
            .ok()?;
        p.status?.host_ip.filter(|ip| ip == &node_ip)
    })
    .await;
    assert!(host_ip.is_some(), "the pod's hostIP never became {node_ip}");

    // The tenant API server dials the kubelet endpoint, not the host node's address.
    let started = logs_when(tenant, "web-a", |l| l.contains("Started HTTP server")).await;
    assert!(started.is_ok(), "{started:?}");
    let (_connect, kubeconfig) = connect(&world).await;
    // The tenant Service shows the node port its host copy answers on.
    let node_port = |s: Service| s.spec?.ports?.first()?.node_port;
    let last = std::cell::RefCell::new((None, None));
    let port = eventually(WAIT, || async {
        let mine = Api::<Service>::namespaced(tenant.clone(), "default")
            .get("web")
            .await
            .ok()
            .and_then(node_port);
        let host_name = tenantplane_syncer::naming::host_name_for(&world.name, "default", "web");
        let copy = Api::<Service>::namespaced(world.host.clone(), &world.ns.name)
            .get_opt(&host_name)
            .await;
        let copy = copy.ok().flatten().and_then(node_port);
        *last.borrow_mut() = (mine, copy);
        mine.filter(|_| mine == copy)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "tenant and copy node ports never agreed: {:?}",
            last.borrow()
        )
    });
    let said = exec_until_ok(
        &kubeconfig,
        "client",
        &format!("timeout 10 wget -qO- http://{node_ip}:{port}/hostname"),
    )
    .await;
    assert_eq!(said, "web-a");
}
