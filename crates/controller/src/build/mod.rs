//! Build: pure functions from a TenantCluster and its policies to the objects that should exist.
//! Nothing here does I/O, so every decision is unit-tested.

pub mod admission;
pub mod agent;
pub mod audit;
pub mod control_plane;
pub mod isolation;
pub mod k3s;
pub mod kubeconfig;
pub mod kubernetes;
pub mod layout;
pub mod lean;
mod meta;
pub mod pod;
pub mod quota;
pub mod services;

pub use meta::owner_reference;
pub(crate) use meta::{identity, owned_metadata};

/// How the operator is set up, as far as desired objects depend on it.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// Image repository of the tenant control plane (`rancher/k3s`).
    pub k3s_repository: String,
    /// Image repository of the `kubernetes` distribution's kube-apiserver and
    /// kube-controller-manager (`registry.k8s.io`).
    pub kubernetes_repository: String,
    /// The `kubernetes` distribution's kine image.
    pub kine_image: String,
    /// The operator's `--service-cidr`, if given: checked against the range the host says it
    /// allocates from (`service_range`), which is what tenants get either way.
    pub service_cidr: Option<String>,
    /// The namespace the operator runs in, allowed through to tenant API servers.
    pub operator_namespace: Option<String>,
    /// Label control-plane pods for the local runtime (tests and `tenantplane dev` only).
    pub local_runtime: bool,
    /// The operator's kubelet endpoint, if it serves one: tenant API servers trust its CA for
    /// their kubelets, and virtual Nodes name it.
    pub kubelet: Option<crate::kubelet::KubeletOptions>,
    /// The snapshot agent's image (the operator's own); none, control planes run no agent and
    /// their snapshots fail saying so.
    pub agent_image: Option<String>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        Self {
            k3s_repository: crate::names::DEFAULT_K3S_REPOSITORY.to_string(),
            kubernetes_repository: crate::names::DEFAULT_KUBERNETES_REPOSITORY.to_string(),
            kine_image: crate::names::DEFAULT_KINE_IMAGE.to_string(),
            service_cidr: None,
            operator_namespace: None,
            local_runtime: false,
            kubelet: None,
            agent_image: Some(crate::names::DEFAULT_AGENT_IMAGE.to_string()),
        }
    }
}

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod properties;
