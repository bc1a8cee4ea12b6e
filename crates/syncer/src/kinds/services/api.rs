//! The tenant API server's own `default/kubernetes` Endpoints. Its API server runs without an
//! endpoint reconciler (its own address is a host pod's, not the tenant's to see), so the
//! syncer says where it answers for the tenant: the address of the host Service in front of it,
//! which synced pods dial. The tenant's EndpointSlice mirroring makes the slice from it.

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort, EndpointSubset, Endpoints};
use kube::api::{Api, ObjectMeta};

use crate::converge::{self, Target};
use crate::error::Result;
use crate::naming::SYNCER_MANAGER;
use crate::tenant::Tenant;

/// The port the tenant API server answers on at `api_ip` (its Service's target port).
pub const API_PORT: i32 = 6443;

/// The tenant's `default/kubernetes` Endpoints for an API server answering at `api_ip`.
pub fn api_endpoints(api_ip: &str) -> Endpoints {
    Endpoints {
        metadata: ObjectMeta {
            name: Some("kubernetes".into()),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        subsets: Some(vec![EndpointSubset {
            addresses: Some(vec![EndpointAddress {
                ip: api_ip.to_string(),
                ..EndpointAddress::default()
            }]),
            ports: Some(vec![EndpointPort {
                name: Some("https".into()),
                port: API_PORT,
                protocol: Some("TCP".into()),
                ..EndpointPort::default()
            }]),
            ..EndpointSubset::default()
        }]),
    }
}

/// Make the tenant's `default/kubernetes` Endpoints name its API server's address; a write only
/// where they differ.
pub async fn ensure_api_endpoints(cx: &Tenant) -> Result<()> {
    let desired = api_endpoints(&cx.tr.api_ip);
    let api: Api<Endpoints> = cx.tenant_api::<Endpoints>("default");
    let live = api.get_opt("kubernetes").await?;
    converge::converge(&api, SYNCER_MANAGER, live.as_ref(), &desired, Target::Any).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_endpoints_name_the_address_synced_pods_dial() {
        let ep = api_endpoints("10.96.7.7");
        assert_eq!(ep.metadata.name.as_deref(), Some("kubernetes"));
        assert_eq!(ep.metadata.namespace.as_deref(), Some("default"));
        let subset = &ep.subsets.as_ref().unwrap()[0];
        assert_eq!(subset.addresses.as_ref().unwrap()[0].ip, "10.96.7.7");
        let port = &subset.ports.as_ref().unwrap()[0];
        assert_eq!((port.name.as_deref(), port.port), (Some("https"), 6443));
        // Mirrored into an EndpointSlice by the tenant: nothing may tell the mirror to skip it.
        assert!(ep.metadata.labels.is_none());
    }
}
