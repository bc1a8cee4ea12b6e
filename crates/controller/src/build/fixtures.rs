//! The objects the build's unit tests start from: the seed example tenant, the restricted
//! profile, and options with a kubelet endpoint.

use super::BuildOptions;
use tenantplane_api::{IsolationProfile, TenantCluster};

/// The seed example, as the API server would hand it over (uid set).
pub fn tenant() -> TenantCluster {
    let mut tc: TenantCluster =
        serde_yaml::from_str(include_str!("../../../../examples/tenantcluster-dev.yaml")).unwrap();
    tc.metadata.uid = Some("0f1e2d3c-0000-4000-8000-000000000001".into());
    tc
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
