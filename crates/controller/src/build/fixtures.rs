//! The objects the build's unit tests start from: the seed example tenant, the restricted
//! profile, and options with a kubelet endpoint.

use super::BuildOptions;
use super::layout::Addressing;
use tenantplane_api::{Distribution, IsolationProfile, TenantCluster};

/// The seed example, as the API server would hand it over (uid set).
pub fn tenant() -> TenantCluster {
    let mut tc: TenantCluster =
        serde_yaml::from_str(include_str!("../../../../examples/tenantcluster-dev.yaml")).unwrap();
    tc.metadata.uid = Some("0f1e2d3c-0000-4000-8000-000000000001".into());
    tc
}

/// The seed example with the `kubernetes` distribution, at the version the images are built for.
pub fn kubernetes_tenant() -> TenantCluster {
    let mut tc = tenant();
    tc.spec.control_plane.distribution = Distribution::Kubernetes;
    tc.spec.kubernetes_version = "v1.36.3".into();
    tc
}

/// The API Service's address and the Service range of the tests' host.
pub fn addressing() -> Addressing {
    Addressing {
        api_ip: "10.96.0.10".into(),
        service_cidr: "10.96.0.0/12".into(),
    }
}

/// The control-plane pod `tc` gets under `options`.
pub fn pod_spec(tc: &TenantCluster, options: &BuildOptions) -> k8s_openapi::api::core::v1::PodSpec {
    super::control_plane::desired_statefulset(tc, &addressing(), options, "digest")
        .unwrap()
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
}

/// Options of an operator that serves the kubelet endpoint.
pub fn with_kubelet(options: BuildOptions) -> BuildOptions {
    BuildOptions {
        kubelet: Some(crate::kubelet::KubeletOptions {
            endpoint: crate::kubelet::KubeletEndpoint {
                address: "10.96.0.42".into(),
                port: 10250,
            },
            ca_pem: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----".into(),
        }),
        ..options
    }
}

pub fn profile() -> IsolationProfile {
    serde_yaml::from_str(include_str!(
        "../../../../deploy/policies/isolationprofile-restricted.yaml"
    ))
    .unwrap()
}
