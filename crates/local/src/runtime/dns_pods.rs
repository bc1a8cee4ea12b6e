//! The runtime's side of a tenant's CoreDNS ([`crate::dns`]): which CoreDNS pods run, and
//! starting and stopping them as a kubelet would.

use std::net::SocketAddr;
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use kube::{Client, ResourceExt};

use super::LocalRuntime;
use crate::dns::{DnsServer, is_dns_pod, launch};
use tenantplane_testenv::Binaries;
use tenantplane_testenv::Result;
use tenantplane_testenv::process;

impl LocalRuntime {
    /// Where the CoreDNS of tenant `tenant` in host namespace `namespace` answers, while it runs.
    pub fn dns_address(&self, namespace: &str, tenant: &str) -> Option<SocketAddr> {
        let dns = self.dns.lock().ok()?;
        dns.values()
            .find(|d| d.namespace == namespace && d.tenant == tenant)
            .filter(|d| process::exited(&d.handle).is_none())
            .map(|d| d.address)
    }

    /// What that CoreDNS has written so far (for a failing test's message).
    pub fn dns_log(&self, namespace: &str, tenant: &str) -> String {
        let path = self.dns.lock().ok().and_then(|dns| {
            dns.values()
                .find(|d| d.namespace == namespace && d.tenant == tenant)
                .map(|d| d.log.clone())
        });
        path.and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_else(|| "(no CoreDNS runs for it)".into())
    }

    /// As a kubelet for a tenant's CoreDNS copy: start it once it is scheduled, stop it when it
    /// is being deleted.
    pub(crate) async fn on_dns_pod(
        &self,
        client: &Client,
        binaries: &Binaries,
        dir: &Path,
        pod: Pod,
    ) {
        if !is_dns_pod(&pod) {
            return;
        }
        let uid = pod.uid().unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some() {
            self.stop_dns(&uid);
            return;
        }
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        // On a real node the kubelet runs it, as a container of the image built for it.
        if node.is_some_and(|n| n != tenantplane_testenv::host_cluster::KWOK_NODE) {
            return;
        }
        let scheduled = node.is_some();
        let known = self
            .dns
            .lock()
            .map(|d| d.contains_key(&uid))
            .unwrap_or(true);
        if !scheduled || known {
            return;
        }
        let result = self.launch_dns(client, binaries, dir, &pod).await;
        let Ok(mut pending) = self.pending_dns.lock() else {
            return;
        };
        match result {
            Ok(server) => {
                pending.remove(&uid);
                if let Ok(mut dns) = self.dns.lock() {
                    dns.insert(uid, server);
                }
            }
            Err(e) => {
                let reason = tenantplane_controller::error_chain(&e);
                let changed = pending.get(&uid).is_none_or(|(_, last)| *last != reason);
                if changed {
                    eprintln!(
                        "local runtime: CoreDNS {}/{} not started yet: {reason}",
                        pod.namespace().unwrap_or_default(),
                        pod.name_any()
                    );
                }
                pending.insert(uid, (pod, reason));
            }
        }
    }

    async fn launch_dns(
        &self,
        client: &Client,
        binaries: &Binaries,
        dir: &Path,
        pod: &Pod,
    ) -> Result<DnsServer> {
        let ns = pod.namespace().unwrap_or_default();
        let tenant = pod
            .annotations()
            .get(tenantplane_syncer::naming::ANNOTATION_TENANT)
            .cloned()
            .unwrap_or_default();
        let api = self.ready_api(&ns, &tenant)?;
        launch(client, binaries, dir, pod, &tenant, &api).await
    }

    pub(crate) async fn retry_dns(&self, client: &Client, binaries: &Binaries, dir: &Path) {
        let pods: Vec<Pod> = match self.pending_dns.lock() {
            Ok(p) => p.values().map(|(pod, _)| pod.clone()).collect(),
            Err(_) => return,
        };
        for pod in pods {
            self.on_dns_pod(client, binaries, dir, pod).await;
        }
    }

    pub(crate) fn stop_dns(&self, uid: &str) {
        if let Ok(mut pending) = self.pending_dns.lock() {
            pending.remove(uid);
        }
        let server = self.dns.lock().ok().and_then(|mut d| d.remove(uid));
        if let Some(d) = server {
            process::stop(&d.handle);
        }
    }
}
