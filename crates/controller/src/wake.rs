//! The wake door: while a tenant sleeps, its API Service leads here, to a port the operator
//! listens on for that tenant alone (the Service has no selector then, and an EndpointSlice the
//! operator writes names this address). A connection that arrives is held, the tenant is asked
//! to wake (once for every connection waiting), and once its control-plane pod is Ready the
//! bytes pass through to it untouched: the TLS is the tenant's own, so a client keeps checking
//! the tenant's serving certificate and its client certificate reaches the tenant. A client
//! sees a slow answer, not an error, for up to [`WAKE_WITHIN`]; past it the connection is
//! closed, and the tenant's status and an Event say why.
//!
//! The leader serves the doors (only it reconciles); a new leader opens them again, on the
//! ports the EndpointSlices name where it can.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::Store;
use serde_json::json;
use tenantplane_api::TenantCluster;
use tokio::net::{TcpListener, TcpStream};
use tracing::{info, warn};

use crate::connector::Connector;
use crate::context::TenantKey;
use crate::{cache, names, observe};

/// How long a connection waits for a sleeping tenant to be Ready before it is closed.
pub const WAKE_WITHIN: Duration = Duration::from_secs(120);

pub use crate::options::WakeOptions;

/// The open doors, one per sleeping tenant.
#[derive(Default)]
pub struct Doors {
    open: Mutex<BTreeMap<TenantKey, Door>>,
}

struct Door {
    port: u16,
    accept: tokio::task::JoinHandle<()>,
    /// Being closed: the tenant is awake, and the door stays open for [`CLOSE_AFTER`] for
    /// connections that proxies still send here.
    retiring: bool,
}

/// How long a door stays open once its tenant is awake and its EndpointSlice gone: kube-proxy
/// takes a moment to route the Service to the pod again, and a connection it sends to a closed
/// door is refused. Meanwhile the door passes connections straight through.
pub const CLOSE_AFTER: Duration = Duration::from_secs(30);

impl Drop for Door {
    fn drop(&mut self) {
        // Connections already accepted run on; no new ones are taken.
        self.accept.abort();
    }
}

/// What a door needs to wake its tenant and reach it.
#[derive(Clone)]
pub struct DoorTarget {
    /// The host client, as the operator.
    pub client: Client,
    /// The tenant's PKI Secret is here: past the bound, the door answers in the tenant's name.
    pub secrets: Store<k8s_openapi::api::core::v1::Secret>,
    /// The controller's cache of TenantClusters (the operator may not `get` one).
    pub tenants: Store<TenantCluster>,
    /// The control-plane pods, to find the tenant's address.
    pub pods: Store<Pod>,
    /// How to reach the tenant's API server.
    pub connector: Connector,
    /// The tenant's host namespace.
    pub namespace: String,
    /// The TenantCluster's name.
    pub tenant: String,
}

/// No door could be opened: every port in the range is taken or refused. The last refusal, if
/// any, says why.
#[derive(Debug, thiserror::Error)]
#[error(
    "no free port for its wake door in {}-{} on {listen} (last: {})",
    ports.start(),
    ports.end(),
    last.as_ref().map(|(port, e)| format!("port {port}: {e}")).unwrap_or_else(|| "every port is taken by another tenant".into())
)]
pub struct NoDoor {
    ports: std::ops::RangeInclusive<u16>,
    listen: IpAddr,
    last: Option<(u16, std::io::Error)>,
}

impl Doors {
    /// The port of tenant `key`'s door, opened if it is not: `preferred` (the port its
    /// EndpointSlice names) when free, else the first free one.
    pub async fn open(
        &self,
        options: &WakeOptions,
        key: &TenantKey,
        preferred: Option<u16>,
        target: DoorTarget,
    ) -> Result<u16, NoDoor> {
        let taken: Vec<u16> = {
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            match open.get(key) {
                Some(door) if !door.retiring => return Ok(door.port),
                // Asleep again before its door closed: a new door, which asks for a new wake.
                Some(_) => drop(open.remove(key)),
                None => {}
            }
            open.values().map(|d| d.port).collect()
        };
        let candidates = preferred
            .filter(|p| options.ports.contains(p))
            .into_iter()
            .chain(options.ports.clone())
            .filter(|p| !taken.contains(p));
        let mut last_error = None;
        for port in candidates {
            match TcpListener::bind(SocketAddr::new(options.listen, port)).await {
                Ok(listener) => {
                    let accept = tokio::spawn(serve(listener, Arc::new(target)));
                    info!(namespace = %key.0, tenant = %key.1, port, "wake door open");
                    if let Ok(mut open) = self.open.lock() {
                        open.insert(
                            key.clone(),
                            Door {
                                port,
                                accept,
                                retiring: false,
                            },
                        );
                    }
                    return Ok(port);
                }
                Err(e) => last_error = Some((port, e)),
            }
        }
        Err(NoDoor {
            ports: options.ports.clone(),
            listen: options.listen,
            last: last_error,
        })
    }

    /// Close tenant `key`'s door after [`CLOSE_AFTER`] (it is awake): connections routed here
    /// meanwhile still reach it.
    pub fn retire(self: &Arc<Self>, key: &TenantKey) {
        let Ok(mut open) = self.open.lock() else {
            return;
        };
        let Some(door) = open.get_mut(key).filter(|d| !d.retiring) else {
            return;
        };
        door.retiring = true;
        let (doors, key, port) = (Arc::downgrade(self), key.clone(), door.port);
        tokio::spawn(async move {
            tokio::time::sleep(CLOSE_AFTER).await;
            if let Some(doors) = doors.upgrade()
                && let Ok(mut open) = doors.open.lock()
                && open.get(&key).is_some_and(|d| d.retiring && d.port == port)
            {
                open.remove(&key);
                info!(namespace = %key.0, tenant = %key.1, "wake door closed");
            }
        });
    }

    /// Close tenant `key`'s door now (it is gone).
    pub fn close(&self, key: &TenantKey) {
        if let Ok(mut open) = self.open.lock()
            && open.remove(key).is_some()
        {
            info!(namespace = %key.0, tenant = %key.1, "wake door closed");
        }
    }

    /// Is tenant `key`'s door open?
    pub fn is_open(&self, key: &TenantKey) -> bool {
        self.open.lock().is_ok_and(|o| o.contains_key(key))
    }
}

/// Take connections until the door closes; each waits for the tenant on a task of its own.
async fn serve(listener: TcpListener, target: Arc<DoorTarget>) {
    // One wake request for every connection this door holds.
    let asked = Arc::new(tokio::sync::OnceCell::new());
    loop {
        match listener.accept().await {
            Ok((socket, peer)) => {
                let _ = socket.set_nodelay(true);
                tokio::spawn(hold(socket, peer, target.clone(), asked.clone()));
            }
            Err(e) => {
                warn!(namespace = %target.namespace, tenant = %target.tenant, error = %e, "wake door: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Hold one connection: wake the tenant, wait for it, then pass the bytes through.
async fn hold(
    mut socket: TcpStream,
    peer: SocketAddr,
    target: Arc<DoorTarget>,
    asked: Arc<tokio::sync::OnceCell<()>>,
) {
    let (ns, tenant) = (&target.namespace, &target.tenant);
    let woken = asked
        .get_or_try_init(|| async {
            info!(namespace = %ns, tenant = %tenant, %peer, "a request to a sleeping tenant: waking it");
            let asleep_by_spec = cache::get(&target.tenants, Some(ns), tenant)
                .is_some_and(|tc| tc.spec.sleep.asleep);
            request_wake(&target.client, ns, tenant, asleep_by_spec).await
        })
        .await;
    if let Err(e) = woken {
        warn!(namespace = %ns, tenant = %tenant, %peer, error = %crate::error_chain(&e), "wake door: asking for a wake failed");
        let why = format!(
            "tenant {tenant} in namespace {ns} is asleep, and asking it to wake failed: {e}"
        );
        refuse(socket, &target, &why).await;
        return;
    }
    let Ok(address) = tokio::time::timeout(WAKE_WITHIN, ready_address(&target)).await else {
        warn!(namespace = %ns, tenant = %tenant, %peer, "wake door: the tenant was not Ready within {}s", WAKE_WITHIN.as_secs());
        let why = format!(
            "tenant {tenant} in namespace {ns} was asleep and is not awake {}s after this request woke it; see `tenantplane status {tenant} -n {ns}`",
            WAKE_WITHIN.as_secs()
        );
        refuse(socket, &target, &why).await;
        return;
    };
    match TcpStream::connect(&address).await {
        Ok(mut upstream) => {
            let _ = upstream.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut socket, &mut upstream).await;
        }
        Err(e) => {
            warn!(namespace = %ns, tenant = %tenant, %peer, %address, error = %e, "wake door: dialling the woken tenant failed");
        }
    }
}

/// Tell the client why it gets no answer from the tenant, as its API server would: finish the
/// TLS handshake with a certificate the tenant's server CA signs for the Service's names (the
/// operator holds that CA, so the client's check passes), and answer its request with 503 and a
/// Status whose message says why. Without the CA at hand the connection is closed.
async fn refuse(socket: TcpStream, target: &DoorTarget, why: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(config) = tls_in_the_tenants_name(target) else {
        return;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let answered = async {
        let mut tls = acceptor.accept(socket).await.ok()?;
        // The request's head; its body, if any, is not read.
        let mut head = Vec::new();
        let mut buffer = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
            let n = tls.read(&mut buffer).await.ok()?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buffer[..n]);
        }
        let body = status_body(why);
        let response = format!(
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        tls.write_all(response.as_bytes()).await.ok()?;
        tls.shutdown().await.ok()
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), answered).await;
}

/// A `Status` as an API server answers a failed request.
fn status_body(message: &str) -> String {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "ServiceUnavailable",
        "code": 503,
    })
    .to_string()
}

/// A TLS server configuration with a certificate for the tenant's Service names, signed by its
/// server CA (from its PKI Secret).
fn tls_in_the_tenants_name(target: &DoorTarget) -> Option<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (ns, tenant) = (&target.namespace, &target.tenant);
    let secret = cache::get(&target.secrets, Some(ns), &names::pki_secret(tenant))?;
    let pki = crate::tenant_pki::TenantPki::from_secret_data(secret.data.as_ref()?).ok()?;
    let names = names::service_dns_names(tenant, ns);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let pair = pki
        .server_ca
        .issue(
            &tenantplane_pki::Leaf::server("tenantplane-wake-door", &refs)
                .valid_for(Duration::from_secs(3600)),
        )
        .ok()?;
    let chain = [pair.cert_pem.as_str(), pki.server_ca.cert_pem()]
        .into_iter()
        .map(|pem| {
            tenantplane_pki::cert_der(pem)
                .ok()
                .map(CertificateDer::from)
        })
        .collect::<Option<Vec<_>>>()?;
    let key = PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes()).ok()?;
    let mut config = rustls::ServerConfig::builder_with_provider(crate::kubelet::tls::provider())
        .with_safe_default_protocol_versions()
        .ok()?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .ok()?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Some(config)
}

/// Ask for a wake as `tenantplane wake` does: the wake annotation, and `spec.sleep.asleep` back
/// to false when the spec holds it asleep.
pub async fn request_wake(
    client: &Client,
    namespace: &str,
    tenant: &str,
    asleep_by_spec: bool,
) -> Result<(), kube::Error> {
    let api: Api<TenantCluster> = Api::namespaced(client.clone(), namespace);
    let mut patch = json!({"metadata": {"annotations": {
        names::WAKE: k8s_openapi::jiff::Timestamp::now().to_string()
    }}});
    if asleep_by_spec {
        patch["spec"] = json!({"sleep": {"asleep": false}});
    }
    api.patch(tenant, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(drop)
}

/// Wait until the tenant is awake (its status says its API server answers, and no longer that
/// it sleeps) and its control-plane pod is Ready and staying; the address to dial it at (never
/// the Service, which leads here while the door is open). A pod that is Ready just after the
/// tenant went to sleep, before it is deleted, is not taken for a woken one.
async fn ready_address(target: &DoorTarget) -> String {
    let pod_name = names::control_plane_pod(&target.tenant);
    loop {
        let awake = cache::get(&target.tenants, Some(&target.namespace), &target.tenant)
            .and_then(|tc| tc.status.clone())
            .is_some_and(|s| {
                s.sleep.is_none()
                    && tenantplane_api::conditions::find(
                        &s.conditions,
                        tenantplane_api::conditions::READY,
                    )
                    .is_some_and(|c| c.status == "True")
            });
        if awake
            && let Some(pod) = cache::get(&target.pods, Some(&target.namespace), &pod_name)
            && pod.metadata.deletion_timestamp.is_none()
            && observe::pod_is_ready(&pod)
            && let Some(address) = pod_address(target, &pod)
        {
            return address;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `host:port` of the pod's API server.
fn pod_address(target: &DoorTarget, pod: &Pod) -> Option<String> {
    match target.connector {
        Connector::InCluster => {
            let ip = pod.status.as_ref()?.pod_ip.clone()?;
            let ip: IpAddr = ip.parse().ok()?;
            Some(SocketAddr::new(ip, names::API_PORT as u16).to_string())
        }
        Connector::Local => {
            let server = target
                .connector
                .server(&target.tenant, &target.namespace, pod)
                .ok()?;
            let url: http::Uri = server.parse().ok()?;
            Some(format!("{}:{}", url.host()?, url.port_u16()?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(ports: std::ops::RangeInclusive<u16>) -> WakeOptions {
        WakeOptions {
            listen: "127.0.0.1".parse().unwrap(),
            advertise: "127.0.0.1".parse().unwrap(),
            ports,
        }
    }

    fn target() -> DoorTarget {
        let (pods, _writer) = kube::runtime::reflector::store();
        let (tenants, _writer) = kube::runtime::reflector::store();
        let (secrets, _writer) = kube::runtime::reflector::store();
        DoorTarget {
            secrets,
            client: Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
                .unwrap(),
            tenants,
            pods,
            connector: Connector::Local,
            namespace: "ns".into(),
            tenant: "dev".into(),
        }
    }

    fn free_range(n: u16) -> std::ops::RangeInclusive<u16> {
        // A range the machine does not use: probe for one, each test from a start of its own
        // (tests run at once, and a range probed free is not bound until the test opens it).
        static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
        let offset = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) * 1_009;
        for start in (40_000 + offset..60_000).step_by(97) {
            let all_free =
                (start..start + n).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok());
            if all_free {
                return start..=start + n - 1;
            }
        }
        panic!("no free port range");
    }

    #[tokio::test]
    async fn each_tenant_gets_a_door_of_its_own_and_keeps_it() {
        let ports = free_range(2);
        let o = options(ports.clone());
        let doors = Doors::default();
        let a = ("ns".to_string(), "a".to_string());
        let b = ("ns".to_string(), "b".to_string());
        let pa = doors.open(&o, &a, None, target()).await.unwrap();
        assert_eq!(
            doors.open(&o, &a, None, target()).await.unwrap(),
            pa,
            "kept"
        );
        let pb = doors.open(&o, &b, Some(pa), target()).await.unwrap();
        assert_ne!(pa, pb, "a port another door holds is not given again");
        let c = ("ns".to_string(), "c".to_string());
        let full = doors.open(&o, &c, None, target()).await.unwrap_err();
        assert!(
            full.to_string().contains("no free port for its wake door"),
            "{full}"
        );
        doors.close(&a);
        assert!(!doors.is_open(&a));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            doors.open(&o, &c, Some(pa), target()).await.unwrap(),
            pa,
            "preferred, once free"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_awake_tenants_door_stays_open_a_while_then_closes() {
        let o = options(free_range(2));
        let doors = Arc::new(Doors::default());
        let a = ("ns".to_string(), "a".to_string());
        let port = doors.open(&o, &a, None, target()).await.unwrap();
        doors.retire(&a);
        tokio::time::sleep(CLOSE_AFTER / 2).await;
        assert!(
            doors.is_open(&a),
            "still open for connections already routed here"
        );
        tokio::time::sleep(CLOSE_AFTER).await;
        assert!(!doors.is_open(&a));
        // Asleep again while retiring: a fresh door.
        let again = doors.open(&o, &a, Some(port), target()).await.unwrap();
        doors.retire(&a);
        let fresh = doors.open(&o, &a, Some(again), target()).await.unwrap();
        assert!(doors.is_open(&a));
        tokio::time::sleep(CLOSE_AFTER * 2).await;
        assert!(
            doors.is_open(&a),
            "the new door is not closed by the old timer"
        );
        let _ = fresh;
    }

    #[tokio::test]
    async fn past_the_bound_the_client_hears_why_over_tls_it_trusts() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let tc = crate::build::fixtures::tenant();
        let pki = crate::tenant_pki::TenantPki::generate("dev").unwrap();
        let secret = crate::build::control_plane::pki_secret(&tc, &pki).unwrap();
        let (secrets, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(secret));
        let ns = tc.metadata.namespace.clone().unwrap();
        let target = DoorTarget {
            secrets,
            namespace: ns.clone(),
            ..target()
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let door = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            refuse(socket, &target, "tenant dev did not wake").await;
        });
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from(
                tenantplane_pki::cert_der(pki.server_ca.cert_pem()).unwrap(),
            ))
            .unwrap();
        let config = rustls::ClientConfig::builder_with_provider(crate::kubelet::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let name = rustls::pki_types::ServerName::try_from(format!("dev.{ns}.svc")).unwrap();
        let tcp = TcpStream::connect(address).await.unwrap();
        let mut tls = connector
            .connect(name, tcp)
            .await
            .expect("the tenant's CA checks out");
        tls.write_all(b"GET /version HTTP/1.1\r\nHost: dev\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tls.read_to_string(&mut answer).await.unwrap();
        door.await.unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 503 Service Unavailable"),
            "{answer}"
        );
        let body: serde_json::Value =
            serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body["kind"], "Status");
        assert_eq!(body["reason"], "ServiceUnavailable");
        assert_eq!(body["code"], 503);
        assert_eq!(body["message"], "tenant dev did not wake");
    }
}
