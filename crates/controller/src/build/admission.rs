//! Pod Security at the tenant's door: the tenant API server's admission configuration, which
//! enforces the IsolationProfile's level as its cluster-wide default, so a pod the host would
//! refuse is refused at `kubectl apply` (or a Deployment warned and its ReplicaSet's
//! `FailedCreate` shown), as in a real cluster. The host's enforcement stays as the second line.
//! Both distributions read the same file, mounted from a ConfigMap.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use tenantplane_api::{PodSecurityLevel, TenantCluster};

use super::layout::CONFIG_MOUNT;
use super::meta::{identity, owned_metadata};
use crate::{Error, names};

/// The file's key in the ConfigMap, and its path in the pod.
pub const ADMISSION_KEY: &str = "admission.yaml";
/// The admission configuration's path in the pod.
pub const ADMISSION_CONFIG: &str = "/etc/tenantplane/config/admission.yaml";
const _: () = assert!(ADMISSION_CONFIG.len() == CONFIG_MOUNT.len() + 1 + ADMISSION_KEY.len());

/// The namespace the operator's add-ons run in inside the tenant (its CoreDNS): exempt, as
/// the host's own `kube-system` usually is.
pub const EXEMPT_NAMESPACE: &str = tenantplane_syncer::addons::DNS_NAMESPACE;

/// The AdmissionConfiguration: PodSecurity enforcing, warning and auditing `level` (at the
/// tenant's own version, `latest`) for every namespace but [`EXEMPT_NAMESPACE`]. A namespace's
/// own `pod-security.kubernetes.io` labels still choose otherwise, as in any cluster.
pub fn admission_configuration(level: PodSecurityLevel) -> String {
    let level = level.as_str();
    let config = json!({
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [{
            "name": "PodSecurity",
            "configuration": {
                "apiVersion": "pod-security.admission.config.k8s.io/v1",
                "kind": "PodSecurityConfiguration",
                "defaults": {
                    "enforce": level,
                    "enforce-version": "latest",
                    "audit": level,
                    "audit-version": "latest",
                    "warn": level,
                    "warn-version": "latest",
                },
                "exemptions": {
                    "usernames": [],
                    "runtimeClasses": [],
                    "namespaces": [EXEMPT_NAMESPACE],
                },
            },
        }],
    });
    serde_yaml::to_string(&config).unwrap_or_default()
}

/// The ConfigMap the control-plane pod mounts at [`CONFIG_MOUNT`]: the admission configuration
/// and the audit policy ([`super::audit`]).
pub fn config_map(tc: &TenantCluster, level: PodSecurityLevel) -> Result<ConfigMap, Error> {
    let (tenant, _) = identity(tc)?;
    Ok(ConfigMap {
        metadata: owned_metadata(tc, names::control_plane_config(&tenant))?,
        data: Some(BTreeMap::from([
            (ADMISSION_KEY.to_string(), admission_configuration(level)),
            (super::audit::POLICY_KEY.to_string(), super::audit::policy()),
        ])),
        ..Default::default()
    })
}

/// A digest of the ConfigMap's data, for the pod template: the API server reads the file only
/// when it starts, so a new level rolls the pod.
pub fn digest(config_map: &ConfigMap) -> String {
    super::meta::digest(
        config_map
            .data
            .iter()
            .flatten()
            .flat_map(|(key, value)| [key.as_str(), value.as_str()]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures::tenant;

    #[test]
    fn the_profile_level_is_every_namespace_default_but_the_add_ons() {
        let text = admission_configuration(PodSecurityLevel::Baseline);
        let value: serde_json::Value = serde_yaml::from_str(&text).unwrap();
        let plugin = &value["plugins"][0];
        assert_eq!(plugin["name"], "PodSecurity");
        let defaults = &plugin["configuration"]["defaults"];
        for mode in ["enforce", "audit", "warn"] {
            assert_eq!(defaults[mode], "baseline", "{mode}");
            assert_eq!(defaults[format!("{mode}-version")], "latest");
        }
        assert_eq!(
            plugin["configuration"]["exemptions"]["namespaces"],
            json!(["kube-system"])
        );
    }

    #[test]
    fn a_new_level_changes_the_digest() {
        let restricted = config_map(&tenant(), PodSecurityLevel::Restricted).unwrap();
        let baseline = config_map(&tenant(), PodSecurityLevel::Baseline).unwrap();
        assert_eq!(
            restricted.metadata.name.as_deref(),
            Some("dev-control-plane-config")
        );
        assert_eq!(digest(&restricted).len(), 16);
        assert_ne!(digest(&restricted), digest(&baseline));
        assert_eq!(digest(&restricted), digest(&restricted.clone()));
    }
}
