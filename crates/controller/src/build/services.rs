//! The control plane's two Services: the one tenants and synced pods dial, and the headless one
//! that governs the StatefulSet.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
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
