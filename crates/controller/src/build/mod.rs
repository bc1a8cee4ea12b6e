//! Build: pure functions from a TenantCluster and its policies to the objects that should exist.
//! Nothing here does I/O, so every decision is unit-tested.

pub mod control_plane;
pub mod isolation;
pub mod kubeconfig;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use serde::de::DeserializeOwned;
use tenantplane_api::TenantCluster;

use crate::Error;

/// How the operator is set up, as far as desired objects depend on it.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// Image repository of the tenant control plane (`rancher/k3s`).
    pub k3s_repository: String,
    /// The host's service CIDR; tenants use the same one, so a tenant Service can carry the
    /// cluster IP of its host copy.
    pub service_cidr: String,
    /// The namespace the operator runs in, allowed through to tenant API servers.
    pub operator_namespace: Option<String>,
    /// Label control-plane pods for the local runtime (tests and `tenantplane dev` only).
    pub local_runtime: bool,
}

impl Default for BuildOptions {
    fn default() -> Self {
        Self {
            k3s_repository: crate::names::DEFAULT_K3S_REPOSITORY.to_string(),
            service_cidr: "10.96.0.0/12".to_string(),
            operator_namespace: None,
            local_runtime: false,
        }
    }
}

/// The owner reference that lets the garbage collector remove an object with its tenant.
pub fn owner_reference(tc: &TenantCluster) -> Result<OwnerReference, Error> {
    tc.controller_owner_ref(&())
        .ok_or_else(|| Error::Build("the TenantCluster has no name or uid yet".into()))
}

/// Deserialize a JSON literal into a typed object; a mismatch is a bug, reported, not a panic.
pub(crate) fn typed<T: DeserializeOwned>(what: &str, value: serde_json::Value) -> Result<T, Error> {
    serde_json::from_value(value).map_err(|e| Error::Build(format!("building {what}: {e}")))
}

/// The TenantCluster's name and namespace, which the API server always sets.
pub(crate) fn identity(tc: &TenantCluster) -> Result<(String, String), Error> {
    match (tc.metadata.name.clone(), tc.metadata.namespace.clone()) {
        (Some(name), Some(ns)) => Ok((name, ns)),
        _ => Err(Error::Build(
            "the TenantCluster has no name or namespace".into(),
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use tenantplane_api::{IsolationProfile, TenantCluster};

    /// The seed example, as the API server would hand it over (uid set).
    pub fn tenant() -> TenantCluster {
        let mut tc: TenantCluster =
            serde_yaml::from_str(include_str!("../../../../examples/tenantcluster-dev.yaml"))
                .unwrap();
        tc.metadata.uid = Some("0f1e2d3c-0000-4000-8000-000000000001".into());
        tc
    }

    pub fn profile() -> IsolationProfile {
        serde_yaml::from_str(include_str!(
            "../../../../deploy/policies/isolationprofile-restricted.yaml"
        ))
        .unwrap()
    }
}
