//! Properties of the whole build: what holds for every tenant and profile, checked with proptest.

use proptest::prelude::*;
use tenantplane_api::{EgressPolicy, TenantMode};

use super::fixtures::{profile, tenant};
use super::*;

fn addressing() -> layout::Addressing {
    layout::Addressing {
        api_ip: "10.96.0.10".into(),
        service_cidr: "10.96.0.0/12".into(),
    }
}
use crate::status::{Progress, desired_status};

proptest! {
    /// Any spec the API server admits builds every object, and a status, without panicking.
    #[test]
    fn admitted_specs_always_build(
        name in "[a-z]([-a-z0-9]{0,40}[a-z0-9])?",
        ns in "[a-z]([-a-z0-9]{0,40}[a-z0-9])?",
        mode in prop::sample::select(TenantMode::ALL.to_vec()),
        egress in prop::sample::select(EgressPolicy::ALL.to_vec()),
        major in 0u32..3, minor in 0u32..100, patch in 0u32..1000,
        cpu in prop::option::of("[1-9][0-9]{0,2}m?"),
        memory in prop::option::of("[1-9][0-9]{0,3}(Mi|Gi)"),
        cidrs in prop::collection::vec("(10|192)\\.[0-9]{1,3}\\.0\\.0/(8|16|24)", 0..4),
        net in any::<bool>(), quota in any::<bool>(),
    ) {
        let mut tc = tenant();
        tc.metadata.name = Some(name);
        tc.metadata.namespace = Some(ns);
        tc.spec.mode = mode;
        tc.spec.networking.egress_policy = egress;
        tc.spec.kubernetes_version = format!("v{major}.{minor}.{patch}");
        tc.spec.resources.cpu = cpu.map(Into::into);
        tc.spec.resources.memory = memory.map(Into::into);
        let mut p = profile();
        p.spec.network_policy.enabled = net;
        p.spec.network_policy.allowed_egress_cidrs = cidrs;
        p.spec.resource_quota.enforce = quota;
        let options = BuildOptions::default();
        prop_assert!(control_plane::desired_statefulset(&tc, &addressing(), &options, "digest").is_ok());
        prop_assert!(services::desired_service(&tc).is_ok());
        prop_assert_eq!(isolation::network_policies(&tc, &p, &options).unwrap().len(), if net { 2 } else { 0 });
        prop_assert!(quota::resource_quota(&tc, &p).is_ok());
        prop_assert!(quota::limit_range(&tc, &p).is_ok());
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
        let status = desired_status(&tc, &Progress::Accepted, "https://x", &now);
        prop_assert_eq!(status.conditions.len(), 3);
    }

    /// A TenantCluster the API server has not named yet is an error, never a panic.
    #[test]
    fn unnamed_tenants_are_errors(drop_name in any::<bool>()) {
        let mut tc = tenant();
        if drop_name { tc.metadata.name = None } else { tc.metadata.namespace = None }
        prop_assert!(control_plane::desired_statefulset(&tc, &addressing(), &BuildOptions::default(), "digest").is_err());
        prop_assert!(isolation::network_policies(&tc, &profile(), &BuildOptions::default()).is_err());
    }
}
