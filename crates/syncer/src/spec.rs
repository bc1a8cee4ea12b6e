//! What one tenant's syncer runs with: the operator's verdict on the tenant, its policy and
//! profile, and where the tenant API server answers. A change restarts the syncer.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use tenantplane_api::{IsolationProfileSpec, SyncPolicySpec};

/// Everything a syncer runs with; a change restarts it.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncerSpec {
    /// The TenantCluster's name.
    pub tenant: String,
    /// The host namespace the tenant's copies live in.
    pub host_namespace: String,
    /// The TenantCluster's owner reference: every copy carries it.
    pub owner: OwnerReference,
    /// The namespace the operator is limited to, if it is: the host watches stay inside it.
    pub scope: Option<String>,
    /// The tenant's SyncPolicy: which kinds sync.
    pub policy: SyncPolicySpec,
    /// The tenant's IsolationProfile: what tenant objects may ask of the host.
    pub profile: IsolationProfileSpec,
    /// Where the tenant API server answers, and with which kubeconfig (for change detection).
    pub server: String,
    /// The kubeconfig of the tenant API server, as text.
    pub kubeconfig: String,
    /// The cluster IP of the tenant API server's Service: synced pods dial it, on 6443 directly
    /// and on 443 through the tenant's `kubernetes` Service, which is given this address.
    pub api_ip: String,
    /// The host's Service range that holds `api_ip`, which the tenant allocates from too.
    pub service_cidr: String,
    /// The operator's kubelet endpoint, which every virtual Node names as its kubelet; without
    /// it, virtual Nodes have no kubelet (never the host nodes' own addresses).
    pub kubelet: Option<KubeletEndpoint>,
}

/// Where a tenant API server reaches the kubelet of a virtual Node (for logs, exec, attach and
/// port-forward): the operator's kubelet endpoint, which proxies to the host pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeletEndpoint {
    /// An IP address: virtual Nodes give it as their `InternalIP`.
    pub address: String,
    /// The port of the kubelet endpoint.
    pub port: u16,
}
