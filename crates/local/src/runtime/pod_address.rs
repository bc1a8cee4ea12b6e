//! With a real node in the namespace, a control-plane pod's IP is made real, as a kubelet's pod
//! network would: the address goes on loopback (so the node's pods route to it through the node)
//! and its API port is forwarded to the tenant API server's loopback port. Pods then reach their
//! tenant's API through its Service, as in a cluster; without a real node nothing dials pod IPs.

use std::net::{IpAddr, SocketAddr};

use tenantplane_controller::names;
use tokio::net::{TcpListener, TcpStream};

use tenantplane_testenv::{Error, Result};

/// The pod IP, served until dropped.
pub(crate) struct PodAddress {
    ip: IpAddr,
    task: tokio::task::JoinHandle<()>,
}

fn ip(args: &[&str]) -> Result<()> {
    tenantplane_testenv::host_cluster::real_node::run("ip", args)
}

/// Put `pod_ip` on loopback and forward its API port to `127.0.0.1:loopback_port`.
pub(crate) async fn serve(pod_ip: &str, loopback_port: u16) -> Result<PodAddress> {
    let ip: IpAddr = pod_ip
        .parse()
        .map_err(|e| Error::Io(format!("pod IP {pod_ip}: {e}")))?;
    let cidr = format!("{ip}/32");
    // `replace` is idempotent: a restarted runtime finds the address already there.
    self::ip(&["addr", "replace", &cidr, "dev", "lo"])?;
    let listener = TcpListener::bind(SocketAddr::new(ip, names::API_PORT as u16))
        .await
        .map_err(|e| Error::Io(format!("listening on {ip}:{}: {e}", names::API_PORT)))?;
    let task = tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", loopback_port)).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    Ok(PodAddress { ip, task })
}

impl Drop for PodAddress {
    fn drop(&mut self) {
        self.task.abort();
        let _ = ip(&["addr", "del", &format!("{}/32", self.ip), "dev", "lo"]);
    }
}
