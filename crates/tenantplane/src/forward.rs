//! The port-forward behind `tenantplane connect`: a listener on 127.0.0.1 whose every accepted
//! connection becomes one pods/portforward stream, through the host API server, to the API port
//! of a Ready pod behind the tenant's API Service. The pod is found once and found again after a
//! forward fails, so a restarted or replaced pod takes the next connections.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tenantplane_controller::names;
use tenantplane_controller::observe::pod_is_ready;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::host::explain;

/// How long a forward waits for the pod's side to finish once the local side is done.
const DRAIN: Duration = Duration::from_secs(10);

/// Where connections go: the tenant's API Service's pods in the host namespace.
pub struct Target {
    client: Client,
    /// Held while a sleeping tenant is woken: connections that find it asleep together wait
    /// for one wake.
    waking: tokio::sync::Mutex<()>,
    pods: Api<Pod>,
    services: Api<Service>,
    namespace: String,
    tenant: String,
    /// The pod the last good forward went to.
    pod: Mutex<Option<String>>,
}

impl Target {
    pub fn new(client: &Client, namespace: &str, tenant: &str) -> Self {
        Target {
            client: client.clone(),
            waking: tokio::sync::Mutex::new(()),
            pods: Api::namespaced(client.clone(), namespace),
            services: Api::namespaced(client.clone(), namespace),
            namespace: namespace.to_string(),
            tenant: tenant.to_string(),
            pod: Mutex::new(None),
        }
    }

    /// The name of a Ready pod that the tenant's API Service selects (by name, the first one).
    pub async fn resolve(&self) -> anyhow::Result<String> {
        let (ns, service) = (&self.namespace, names::service(&self.tenant));
        let what = format!("Service {service} in namespace {ns}");
        let svc = self
            .services
            .get_opt(&service)
            .await
            .map_err(|e| explain(e, &what))?
            .ok_or_else(|| {
                anyhow!(
                    "{what} not found: the operator has not made the tenant's control plane yet"
                )
            })?;
        let selector = svc
            .spec
            .and_then(|s| s.selector)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| anyhow!("{what} selects no pods"))?;
        let list = self
            .pods
            .list(&ListParams::default().labels(&names::selector(&selector)))
            .await
            .map_err(|e| explain(e, &format!("the pods of {what}")))?;
        let mut pods = list.items;
        pods.sort_by_key(|p| p.name_any());
        if let Some(pod) = pods.iter().find(|p| pod_is_ready(p)) {
            return Ok(pod.name_any());
        }
        let states: Vec<String> = pods.iter().map(pod_state).collect();
        match states.as_slice() {
            [] => bail!("{what} selects no pods yet (the control plane is starting or stopped)"),
            _ => bail!("no control-plane pod is Ready: {}", states.join("; ")),
        }
    }

    /// The pod to forward to: the last good one, else a fresh look; a tenant that fell asleep
    /// is woken first (the connection waits, up to the wake bound).
    async fn pod(&self) -> anyhow::Result<String> {
        let known = self.pod.lock().ok().and_then(|p| p.clone());
        if let Some(pod) = known {
            return Ok(pod);
        }
        let pod = match self.resolve().await {
            Ok(pod) => pod,
            Err(_) => {
                // Asleep? Wake it (once for every connection waiting here), then look again.
                let _one_wake = self.waking.lock().await;
                crate::tenants::wake_if_asleep(&self.client, &self.namespace, &self.tenant).await?;
                self.resolve().await?
            }
        };
        self.remember(Some(pod.clone()));
        Ok(pod)
    }

    pub fn remember(&self, pod: Option<String>) {
        if let Ok(mut slot) = self.pod.lock() {
            *slot = pod;
        }
    }

    /// [`Target::pod`] for the connection from `peer`; what went wrong is printed.
    async fn pod_for(&self, peer: SocketAddr) -> Option<String> {
        match self.pod().await {
            Ok(pod) => Some(pod),
            Err(e) => {
                eprintln!(
                    "connection from {peer}: cannot find the tenant's API server: {}",
                    tenantplane_controller::error_chain(e.as_ref())
                );
                None
            }
        }
    }

    /// Carry one accepted connection to the tenant's API port; what goes wrong is printed as a
    /// line, and a failed forward makes the next connection look for the pod again.
    pub async fn forward(&self, socket: TcpStream, peer: SocketAddr) {
        let port = names::API_PORT as u16;
        let Some(pod) = self.pod_for(peer).await else {
            return;
        };
        let (pod, mut forwarder) = match self.pods.portforward(&pod, &[port]).await {
            Ok(f) => (pod, f),
            // The pod we knew is gone (the tenant went to sleep, or the pod was replaced): look
            // again, once, waking the tenant if it sleeps.
            Err(_) => {
                self.remember(None);
                let Some(again) = self.pod_for(peer).await else {
                    return;
                };
                match self.pods.portforward(&again, &[port]).await {
                    Ok(f) => (again, f),
                    Err(e) => {
                        eprintln!(
                            "connection from {peer}: port-forward to pod {again} failed: {}; the next connection looks for the pod again",
                            explain(e, &format!("pods/portforward of pod {again}"))
                        );
                        self.remember(None);
                        return;
                    }
                }
            }
        };
        let (Some(stream), Some(error)) = (forwarder.take_stream(port), forwarder.take_error(port))
        else {
            return;
        };
        let said = tokio::spawn(error);
        if let Err(e) = pipe(socket, stream).await {
            eprintln!("connection from {peer} to pod {pod}: {e}");
        }
        // The pod's side sends its error (if any) before it closes the stream.
        if let Ok(Ok(Some(message))) = tokio::time::timeout(Duration::from_secs(1), said).await {
            eprintln!(
                "connection from {peer}: pod {pod} port {port}: {}; the next connection looks for the pod again",
                message.trim()
            );
            self.remember(None);
        }
        forwarder.abort();
    }
}

/// Accept connections on `listener` until `stop` resolves, each carried by [`Target::forward`]
/// on a task of its own; then every connection still open is dropped.
pub async fn serve(listener: TcpListener, target: Arc<Target>, stop: impl Future<Output = ()>) {
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    let _ = socket.set_nodelay(true);
                    let target = target.clone();
                    connections.spawn(async move { target.forward(socket, peer).await });
                }
                Err(e) => {
                    eprintln!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.shutdown().await;
}

/// Copy both ways. The pod's side ending ends the connection; the local side ending is passed
/// on, and the pod's side gets [`DRAIN`] to finish.
async fn pipe(
    socket: TcpStream,
    stream: impl AsyncRead + AsyncWrite + Unpin,
) -> std::io::Result<()> {
    let (mut local_read, mut local_write) = socket.into_split();
    let (mut pod_read, mut pod_write) = tokio::io::split(stream);
    let to_pod = async {
        tokio::io::copy(&mut local_read, &mut pod_write).await?;
        pod_write.shutdown().await
    };
    let from_pod = async {
        tokio::io::copy(&mut pod_read, &mut local_write).await?;
        local_write.shutdown().await
    };
    tokio::pin!(to_pod, from_pod);
    tokio::select! {
        done = &mut from_pod => done,
        done = &mut to_pod => {
            done?;
            tokio::time::timeout(DRAIN, from_pod).await.unwrap_or(Ok(()))
        }
    }
}

/// `pod dev-0 is Pending, not Ready (reason: message)`.
fn pod_state(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    let why = ready
        .and_then(|c| {
            let text = [c.reason.as_deref(), c.message.as_deref()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(": ");
            (!text.is_empty()).then(|| format!(" ({text})"))
        })
        .unwrap_or_default();
    let deleting = if pod.metadata.deletion_timestamp.is_some() {
        ", being deleted"
    } else {
        ""
    };
    format!(
        "pod {} is {phase}, not Ready{why}{deleting}",
        pod.name_any()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, phase: &str, ready: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "status": {"phase": phase, "conditions": [
                {"type": "Ready", "status": ready, "reason": "ContainersNotReady"}
            ]},
        }))
        .unwrap()
    }

    #[test]
    fn only_ready_pods_not_being_deleted_take_connections() {
        assert!(pod_is_ready(&pod("dev-0", "Running", "True")));
        assert!(!pod_is_ready(&pod("dev-0", "Running", "False")));
        let mut deleting = pod("dev-0", "Running", "True");
        deleting.metadata.deletion_timestamp =
            serde_json::from_value(serde_json::json!("2026-01-01T00:00:00Z")).unwrap();
        assert!(!pod_is_ready(&deleting));
        assert_eq!(
            pod_state(&pod("dev-0", "Running", "False")),
            "pod dev-0 is Running, not Ready (ContainersNotReady)"
        );
    }

    #[tokio::test]
    async fn pipe_copies_both_ways_and_ends_with_the_pod_side() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(b"ping").await.unwrap();
            let mut answer = Vec::new();
            c.read_to_end(&mut answer).await.unwrap();
            answer
        });
        let (socket, _) = listener.accept().await.unwrap();
        let (ours, mut pod) = tokio::io::duplex(64);
        let pod_side = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut got = [0u8; 4];
            pod.read_exact(&mut got).await.unwrap();
            pod.write_all(b"pong").await.unwrap();
            // The pod's side closes: the connection ends though the client never closed.
            drop(pod);
            got
        });
        pipe(socket, ours).await.unwrap();
        assert_eq!(&pod_side.await.unwrap(), b"ping");
        assert_eq!(client.await.unwrap(), b"pong");
    }
}
