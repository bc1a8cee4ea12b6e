//! The control plane's two Services: the one tenants and synced pods dial, and the headless one
//! that governs the StatefulSet.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tenantplane_api::TenantCluster;

use super::meta::{identity, owned_metadata};
use crate::{Error, names};

/// A TCP port of the Service, sent to the API server's port.
fn api_port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::Int(names::API_PORT)),
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

/// The Service that gives the tenant API server its in-cluster name and a cluster IP. Synced
/// pods dial the IP (a tenant's DNS cannot resolve host names), on 6443 and on 443, where the
/// tenant's own `kubernetes` Service points them.
pub fn desired_service(tc: &TenantCluster) -> Result<Service, Error> {
    let (tenant, _) = identity(tc)?;
    Ok(Service {
        metadata: owned_metadata(tc, names::service(&tenant))?,
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            publish_not_ready_addresses: Some(false),
            selector: Some(names::control_plane_selector(&tenant)),
            ports: Some(vec![
                api_port("https", names::API_PORT),
                api_port("kubernetes", 443),
            ]),
            ..Default::default()
        }),
        status: None,
    })
}

/// The API Service of a sleeping tenant whose requests wake it: no selector, so the
/// EndpointSlice [`wake_endpoint_slice`] is what it leads to.
pub fn desired_sleeping_service(tc: &TenantCluster) -> Result<Service, Error> {
    let mut service = desired_service(tc)?;
    if let Some(spec) = service.spec.as_mut() {
        spec.selector = None;
    }
    Ok(service)
}

/// What the EndpointSlice controller leaves alone: a slice managed by someone else.
pub const SLICE_MANAGER: &str = "tenantplane.io";

/// The sleeping tenant's API Service leads to the operator's wake door at `address:port`, on
/// both of the Service's ports (see the operator's `wake` module).
pub fn wake_endpoint_slice(
    tc: &TenantCluster,
    address: IpAddr,
    port: u16,
) -> Result<EndpointSlice, Error> {
    let (tenant, _) = identity(tc)?;
    let mut metadata = owned_metadata(tc, names::wake_endpoint_slice(&tenant))?;
    let labels = metadata.labels.get_or_insert_with(Default::default);
    labels.insert("kubernetes.io/service-name".into(), names::service(&tenant));
    labels.insert(
        "endpointslice.kubernetes.io/managed-by".into(),
        SLICE_MANAGER.into(),
    );
    let door = |name: &str| EndpointPort {
        name: Some(name.into()),
        port: Some(port.into()),
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    Ok(EndpointSlice {
        metadata,
        address_type: if address.is_ipv4() { "IPv4" } else { "IPv6" }.into(),
        endpoints: Some(vec![Endpoint {
            addresses: vec![address.to_string()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            ..Default::default()
        }]),
        ports: Some(vec![door("https"), door("kubernetes")]),
    })
}

/// The port the wake slice names (to open the door there again after a restart).
pub fn wake_port(slice: &EndpointSlice) -> Option<u16> {
    let port = slice.ports.as_ref()?.first()?.port?;
    u16::try_from(port).ok()
}

/// The StatefulSet's governing Service: headless, and publishing pods before they are Ready, so
/// each control-plane pod has its DNS name (`<tenant>-0.<tenant>-headless`) while it starts.
pub fn desired_headless_service(tc: &TenantCluster) -> Result<Service, Error> {
    let (tenant, _) = identity(tc)?;
    Ok(Service {
        metadata: owned_metadata(tc, names::headless_service(&tenant))?,
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(names::control_plane_selector(&tenant)),
            ports: Some(vec![api_port("https", names::API_PORT)]),
            ..Default::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures::tenant;

    #[test]
    fn a_sleeping_tenants_service_leads_to_the_wake_door_on_both_ports() {
        let tc = tenant();
        let asleep = desired_sleeping_service(&tc).unwrap();
        let awake = desired_service(&tc).unwrap();
        assert_eq!(asleep.spec.as_ref().unwrap().selector, None);
        assert!(awake.spec.as_ref().unwrap().selector.is_some());
        assert_eq!(
            asleep.spec.as_ref().unwrap().ports,
            awake.spec.as_ref().unwrap().ports,
            "the same ports, so the same cluster IP and clients"
        );
        let slice = wake_endpoint_slice(&tc, "10.1.2.3".parse().unwrap(), 7401).unwrap();
        let labels = slice.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["kubernetes.io/service-name"], "dev");
        assert_eq!(
            labels["endpointslice.kubernetes.io/managed-by"],
            SLICE_MANAGER
        );
        assert_eq!(slice.address_type, "IPv4");
        assert_eq!(slice.endpoints.as_ref().unwrap()[0].addresses, ["10.1.2.3"]);
        let names: Vec<_> = slice
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone().unwrap(), p.port.unwrap()))
            .collect();
        assert_eq!(
            names,
            [
                ("https".to_string(), 7401),
                ("kubernetes".to_string(), 7401)
            ]
        );
        assert_eq!(wake_port(&slice), Some(7401));
        let v6 = wake_endpoint_slice(&tc, "fd00::1".parse().unwrap(), 7401).unwrap();
        assert_eq!(v6.address_type, "IPv6");
    }
}
