//! What counts as use of a tenant: the tenant API server audits every request but those of its
//! own components, its workloads' service accounts, the operator (its own user, see
//! [`OPERATOR_USER`]) and health probes. The operator reads how many it audited from
//! `apiserver_audit_level_total` to tell an idle tenant (the operator's `sleep` module); the log itself is
//! a small rotating file in the pod's `/tmp`, there for whoever wants to see who woke a tenant.
//! It is written in batches, so no request waits on it. Both distributions read the same policy
//! from the control plane's ConfigMap.

use serde_json::json;

use super::layout::CONFIG_MOUNT;
use crate::tenant_pki::OPERATOR_USER;

/// The policy's key in the ConfigMap, and its path in the pod.
pub const POLICY_KEY: &str = "audit-policy.yaml";
/// The audit policy's path in the pod.
pub const POLICY_FILE: &str = "/etc/tenantplane/config/audit-policy.yaml";
const _: () = assert!(POLICY_FILE.len() == CONFIG_MOUNT.len() + 1 + POLICY_KEY.len());

/// The log: one file of at most 1 MB and one rotated one, in the pod's `/tmp` (64 MiB).
pub const LOG_FILE: &str = "/tmp/tenantplane-audit.log";

/// Users whose requests are the tenant's own machinery, not use: the operator and syncer, the
/// API server's loopback client, the controller manager and scheduler, and k3s's own clients
/// (its supervisor, controllers, admin kubeconfig and cloud controller), as k3s names them.
pub const NOT_USE_USERS: &[&str] = &[
    OPERATOR_USER,
    "system:apiserver",
    "system:kube-controller-manager",
    "system:kube-scheduler",
    "system:kube-proxy",
    "system:k3s-supervisor",
    "system:k3s-controller",
    "system:admin",
    "system:cloud-controller-manager",
    "k3s-cloud-controller-manager",
];

/// Groups whose requests are not use: the tenant's workloads (their service accounts, its DNS
/// among them; a running workload alone does not keep a tenant awake), nodes, and anonymous
/// callers.
pub const NOT_USE_GROUPS: &[&str] = &[
    "system:serviceaccounts",
    "system:nodes",
    "system:unauthenticated",
];

/// The audit policy: metadata of each request that is use, once it is answered (and when a
/// watch starts), nothing of the rest.
pub fn policy() -> String {
    let policy = json!({
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [
            {"level": "None", "users": NOT_USE_USERS},
            {"level": "None", "userGroups": NOT_USE_GROUPS},
            {"level": "None", "nonResourceURLs": ["/healthz*", "/livez*", "/readyz*"]},
            {"level": "Metadata"},
        ],
    });
    serde_yaml::to_string(&policy).unwrap_or_default()
}

/// kube-apiserver's audit flags (without their `--`): the policy, the small log, batched.
pub fn apiserver_flags() -> Vec<String> {
    vec![
        format!("audit-policy-file={POLICY_FILE}"),
        format!("audit-log-path={LOG_FILE}"),
        "audit-log-maxsize=1".into(),
        "audit-log-maxbackup=1".into(),
        "audit-log-mode=batch".into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_audits_people_and_outside_clients_only() {
        let value: serde_json::Value = serde_yaml::from_str(&policy()).unwrap();
        assert_eq!(value["kind"], "Policy");
        let rules = value["rules"].as_array().unwrap();
        assert_eq!(rules[0]["users"][0], OPERATOR_USER);
        assert!(
            rules[1]["userGroups"]
                .as_array()
                .unwrap()
                .contains(&json!("system:serviceaccounts"))
        );
        assert_eq!(rules.last().unwrap(), &json!({"level": "Metadata"}));
        assert!(
            rules[..rules.len() - 1]
                .iter()
                .all(|r| r["level"] == "None")
        );
        assert_eq!(value["omitStages"], json!(["RequestReceived"]));
    }

    #[test]
    fn the_log_is_small_and_batched() {
        let flags = apiserver_flags();
        assert!(flags.contains(&"audit-log-mode=batch".to_string()));
        assert!(flags.contains(&"audit-log-maxsize=1".to_string()));
        assert!(flags.iter().any(|f| f.starts_with("audit-log-path=/tmp/")));
    }
}
