//! `IsolationProfile`: the boundary the platform team puts around every tenant that names it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::string_enum;

string_enum! {
    /// Pod Security Standard enforced (and warned and audited) on the tenant's namespace.
    pub enum PodSecurityLevel ("podSecurity", default = Restricted) {
        /// Unrestricted: any pod is admitted.
        Privileged = "privileged",
        /// Minimally restrictive: known privilege escalations are refused.
        Baseline = "baseline",
        /// Heavily restricted: current pod hardening practice is enforced.
        Restricted = "restricted",
    }
}

/// How a tenant's namespace is fenced off: Pod Security, NetworkPolicy, quota, limits, placement.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "tenantplane.io",
    version = "v1alpha1",
    kind = "IsolationProfile",
    plural = "isolationprofiles",
    shortname = "isop",
    status = "IsolationProfileStatus",
    derive = "PartialEq",
    doc = "The isolation boundary put around the namespace of every TenantCluster that references it.",
    printcolumn = r#"{"name":"PodSecurity","type":"string","jsonPath":".spec.podSecurity"}"#,
    printcolumn = r#"{"name":"NetworkPolicy","type":"boolean","jsonPath":".spec.networkPolicy.enabled"}"#,
    printcolumn = r#"{"name":"Quota","type":"boolean","jsonPath":".spec.resourceQuota.enforce"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IsolationProfileSpec {
    /// Pod Security Admission level for the tenant's namespace (enforce, warn and audit).
    #[serde(default)]
    pub pod_security: PodSecurityLevel,

    /// NetworkPolicy around the tenant's namespace.
    #[serde(default)]
    pub network_policy: NetworkPolicySettings,

    /// ResourceQuota on the tenant's namespace.
    #[serde(default)]
    pub resource_quota: ResourceQuotaSettings,

    /// LimitRange defaults for containers in the tenant's namespace.
    #[serde(default)]
    pub limit_range: LimitRangeSettings,

    /// Node selector put on every synced tenant pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,

    /// Tolerations put on every synced tenant pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,

    /// What tenant objects may ask of the host beyond the default, which is nothing: host
    /// access, classes, Service types and addresses, Ingress hosts, annotations.
    #[serde(default)]
    pub allow: crate::allowances::Allowances,
}

/// NetworkPolicy settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySettings {
    /// Put NetworkPolicies around the tenant's namespace. The TenantCluster's
    /// `networking.egressPolicy` picks the egress default.
    #[serde(default = "yes")]
    pub enabled: bool,

    /// Extra destinations tenant pods may reach under `deny-by-default`, as CIDRs. Link-local
    /// ranges and cloud metadata and identity addresses stay closed inside them (a CIDR that is
    /// all closed, such as 169.254.169.254/32, opens nothing).
    #[serde(
        default,
        rename = "allowedEgressCIDRs",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(length(max = 64), inner(length(max = 64)))]
    #[x_kube(validation = crate::rules::cidrs("networkPolicy.allowedEgressCIDRs"))]
    pub allowed_egress_cidrs: Vec<String>,
}

fn yes() -> bool {
    true
}

impl Default for NetworkPolicySettings {
    fn default() -> Self {
        Self {
            enabled: true,
            allowed_egress_cidrs: Vec::new(),
        }
    }
}

/// ResourceQuota settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ResourceQuotaSettings {
    /// When true, the TenantCluster's `resources.cpu` / `resources.memory` (and `storage`)
    /// become caps of the namespace's ResourceQuota. The quota counts every kind the syncer
    /// writes and every resource the profile opens either way.
    #[serde(default)]
    pub enforce: bool,

    /// Hard limits of the quota over its defaults, such as `pods: "50"` or
    /// `services.nodeports: "0"`; applied whether or not `enforce` is on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16))]
    pub hard: BTreeMap<String, QuantityString>,
}

/// LimitRange settings for containers.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[x_kube(validation = crate::rules::request_within_limit())]
#[serde(rename_all = "camelCase")]
pub struct LimitRangeSettings {
    /// Default limits, such as `cpu: 500m`, `memory: 512Mi`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 8))]
    pub default: BTreeMap<String, QuantityString>,

    /// Default requests, such as `cpu: 100m`, `memory: 128Mi`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 8))]
    pub default_request: BTreeMap<String, QuantityString>,
}

/// A resource quantity as text (`500m`, `1Gi`, `10`), checked at admission.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(transparent)]
pub struct QuantityString(pub String);

impl From<&str> for QuantityString {
    fn from(s: &str) -> Self {
        Self(s.to_string())
    }
}

impl schemars::JsonSchema for QuantityString {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "QuantityString".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "maxLength": 64,
            "x-kubernetes-validations": [crate::rules::quantity()],
        })
    }
}

/// What the controller observed about a profile.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct IsolationProfileStatus {
    /// How many TenantClusters reference this profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<i32>,
}
