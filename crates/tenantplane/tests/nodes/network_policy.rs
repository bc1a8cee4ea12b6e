//! The isolation NetworkPolicies, enforced by packets: kube-network-policies runs on the real
//! node (see testenv's real node), and each assertion is a real connection from a tenant pod.
//! Every address a pod must not reach has a server that answers the node (this test), so a
//! failure from the pod is the policy's drop, not a missing server.

use std::net::SocketAddr;
use std::process::Command as StdCommand;

use serde_json::json;
use tenantplane_api::EgressPolicy;
use tenantplane_testenv::host_cluster::real_node::NODE_IP;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::common::cluster_ip;
use super::*;

/// An HTTP server of the node's at `ip` that answers every request with `answer`; with `own`
/// the address is put on loopback for it and taken off when it is dropped.
struct NodeServer {
    url: String,
    answer: &'static str,
    own: Option<String>,
    task: tokio::task::JoinHandle<()>,
}

impl NodeServer {
    async fn start(ip: &str, own: bool, answer: &'static str) -> Self {
        let own = own.then(|| {
            let cidr = format!("{ip}/32");
            ip_cmd(&["addr", "replace", &cidr, "dev", "lo"]);
            cidr
        });
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = [0u8; 1024];
                    let _ = conn.read(&mut request).await;
                    let reply = format!(
                        "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{answer}",
                        answer.len()
                    );
                    let _ = conn.write_all(reply.as_bytes()).await;
                });
            }
        });
        let server = Self {
            url: format!("http://{addr}/"),
            answer,
            own,
            task,
        };
        // The node itself reaches it: what a pod cannot reach is there.
        assert_eq!(get_from_the_node(&server.url).await, answer);
        server
    }
}

impl Drop for NodeServer {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(cidr) = &self.own {
            ip_cmd(&["addr", "del", cidr, "dev", "lo"]);
        }
    }
}

fn ip_cmd(args: &[&str]) {
    let out = StdCommand::new("ip").args(args).output().unwrap();
    assert!(out.status.success(), "ip {args:?}: {out:?}");
}

/// `wget` of `url` from the tenant pod `pod`, given 5 s: what it printed, if it got a reply.
async fn fetch_from(kubeconfig: &Path, pod: &str, url: &str) -> Result<String, String> {
    let script = format!("timeout 5 wget -qO- {url} 2>&1");
    let (code, out, err) = kubectl(kubeconfig, &["exec", pod, "--", "sh", "-c", &script], "").await;
    if code == 0 {
        Ok(out)
    } else {
        Err(format!("exit {code}: {out}{err}"))
    }
}

/// The pod reaches `url` and gets `answer` (within the usual wait: the enforcer learns of new
/// pods from the API server).
async fn reaches(kubeconfig: &Path, pod: &str, url: &str, answer: &str) {
    let last = std::cell::RefCell::new(String::new());
    let ok = eventually(WAIT, || async {
        let said = fetch_from(kubeconfig, pod, url).await;
        *last.borrow_mut() = format!("{said:?}");
        said.ok().filter(|s| s.contains(answer))
    })
    .await;
    assert!(ok.is_some(), "{pod} never reached {url}: {}", last.borrow());
}

/// The pod does not reach `url`: the connection times out (a dropped packet), twice over, and
/// nothing of `answer` comes back.
async fn does_not_reach(kubeconfig: &Path, pod: &str, url: &str, answer: &str) {
    for _ in 0..2 {
        match fetch_from(kubeconfig, pod, url).await {
            Ok(said) => panic!("{pod} reached {url}, which its policy closes: {said}"),
            Err(e) => {
                assert!(!e.contains(answer), "{pod} got an answer from {url}: {e}");
                // busybox's `timeout` ends wget with SIGTERM (exit 143): no refusal, no reply.
                assert!(e.starts_with("exit 143"), "{pod} to {url}: {e}");
            }
        }
    }
}

fn client_pod() -> serde_json::Value {
    json!({"containers": [busybox("c", "exec sleep 3600")]})
}

fn web_pod() -> serde_json::Value {
    json!({"containers": [agnhost("c", &["netexec", "--http-port=8080"])]})
}

#[tokio::test(flavor = "multi_thread")]
async fn deny_by_default_lets_a_pod_reach_its_own_tenant_and_nothing_else() {
    let (world, other) = tokio::join!(real_tenant("np-deny"), async {
        use_real_nodes();
        TestHost::start_with_kubelet("np-other")
            .await
            .ready(TenantSetup::seed().named("other"))
            .await
    });
    let tenant = &world.tenant;
    create_pod(tenant, "web", web_pod()).await;
    create::<k8s_openapi::api::core::v1::Service>(
        tenant,
        json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        }),
    )
    .await;
    create_pod(tenant, "client", client_pod()).await;
    create_pod(&other.tenant, "neighbour", web_pod()).await;
    let web = running(tenant, "web").await;
    running(tenant, "client").await;
    let neighbour = running(&other.tenant, "neighbour").await;
    let (_connect, kubeconfig) = connect(&world).await;

    // Its own tenant: a pod by address, a Service by name (DNS through the tenant's CoreDNS), and
    // its control plane.
    let web_ip = web.status.and_then(|s| s.pod_ip).unwrap();
    reaches(
        &kubeconfig,
        "client",
        &format!("http://{web_ip}:8080/hostname"),
        "web",
    )
    .await;
    reaches(&kubeconfig, "client", "http://web/hostname", "web").await;
    let said = exec_until_ok(
        &kubeconfig,
        "client",
        "nslookup web.default.svc.cluster.local",
    )
    .await;
    assert!(
        said.contains(&cluster_ip(tenant, "default", "web").await),
        "{said}"
    );
    reaches_the_tenant_api(&kubeconfig, "client").await;

    // Another tenant's pod, which the node reaches.
    let neighbour_ip = neighbour.status.and_then(|s| s.pod_ip).unwrap();
    let neighbour_url = format!("http://{neighbour_ip}:8080/hostname");
    let said = get_from_the_node(&neighbour_url).await;
    assert_eq!(said, "neighbour", "the node reaches the other tenant's pod");
    does_not_reach(&kubeconfig, "client", &neighbour_url, "neighbour").await;

    // The host API server, by its Service address (the node reaches it: the tests' own client).
    does_not_reach(&kubeconfig, "client", "http://10.96.0.1:443/", "400").await;
    // A server on the node's address: where, in this test world, the host API server, the
    // operator's endpoints and the tenants' control planes listen.
    let node = NodeServer::start(NODE_IP, false, "node").await;
    does_not_reach(&kubeconfig, "client", &node.url, node.answer).await;
    // A cloud metadata address.
    let metadata = NodeServer::start("169.254.170.23", true, "metadata").await;
    does_not_reach(&kubeconfig, "client", &metadata.url, metadata.answer).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn allow_all_opens_egress_but_never_the_metadata_addresses() {
    use_real_nodes();
    let world = TestHost::start_with_kubelet("np-allow")
        .await
        .ready(TenantSetup::seed().edit(|tc| {
            tc.spec.networking.egress_policy = EgressPolicy::AllowAll;
        }))
        .await;
    create_pod(&world.tenant, "client", client_pod()).await;
    running(&world.tenant, "client").await;
    let (_connect, kubeconfig) = connect(&world).await;

    let node = NodeServer::start(NODE_IP, false, "node").await;
    reaches(&kubeconfig, "client", &node.url, node.answer).await;
    let metadata = NodeServer::start("169.254.169.254", true, "metadata").await;
    does_not_reach(&kubeconfig, "client", &metadata.url, metadata.answer).await;
}

/// A plain HTTP GET from the node (this test, as root: the enforcer lets it pass); the body.
async fn get_from_the_node(url: &str) -> String {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut conn = TcpStream::connect(host).await.unwrap();
    conn.write_all(format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut said = String::new();
    conn.read_to_string(&mut said).await.unwrap();
    said.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or(said)
}
