//! What a tenant's API server would accept but no host copy can carry, refused in the tenant at
//! admission with a reason a person can act on, instead of accepted and never done.
//!
//! Ephemeral containers (`kubectl debug`): the tenant API adds them through the pod's
//! `ephemeralcontainers` subresource, but a host copy's containers are fixed when it is made
//! (the translation leaves `ephemeralContainers` off, and the operator may not write that
//! subresource on the host). Accepted, `kubectl debug` would succeed and its container would
//! wait forever; refused, the user reads why and what to use instead.

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::Client;
use kube::api::Api;
use serde_json::json;

use crate::error::{Error, Result};
use crate::naming::LABEL_SYNCED_FROM;

/// The name of the policy (and its binding) that refuses ephemeral containers.
pub const EPHEMERAL_CONTAINERS: &str = "tenantplane-no-ephemeral-containers";

/// What `kubectl debug` prints when it is refused.
pub const EPHEMERAL_CONTAINERS_MESSAGE: &str = "ephemeral containers (kubectl debug) cannot run \
    in this tenant: its pods run as copies on the host cluster, and a copy's containers are fixed \
    when it is made. Use kubectl exec into a running container, or kubectl debug --copy-to to \
    debug a copy of the pod.";

fn object<K: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<K> {
    serde_json::from_value(value).map_err(|source| Error::Serialize {
        kind: "an admission policy".into(),
        source,
    })
}

/// The policy and binding that refuse adding an ephemeral container to any pod.
pub fn ephemeral_containers_policy(
    tenant: &str,
) -> Result<(ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding)> {
    let meta = json!({"name": EPHEMERAL_CONTAINERS, "labels": {LABEL_SYNCED_FROM: tenant}});
    // Only additions are refused: an update that keeps the containers there are (none can be
    // added) stays allowed, so nothing else about a pod is ever blocked.
    let count = |o: &str| {
        format!("(has({o}.spec.ephemeralContainers) ? size({o}.spec.ephemeralContainers) : 0)")
    };
    let policy = object(json!({
        "metadata": meta,
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                "resources": ["pods/ephemeralcontainers"]
            }]},
            "validations": [{
                "expression": format!("{} <= {}", count("object"), count("oldObject")),
                "message": EPHEMERAL_CONTAINERS_MESSAGE,
                "reason": "Forbidden"
            }]
        }
    }))?;
    let binding = object(json!({
        "metadata": meta,
        "spec": {"policyName": EPHEMERAL_CONTAINERS, "validationActions": ["Deny"]}
    }))?;
    Ok((policy, binding))
}

/// Make the tenant's refusals exist as [`ephemeral_containers_policy`] says.
pub async fn ensure_refusals(tenant: &Client, name: &str) -> Result<()> {
    let (policy, binding) = ephemeral_containers_policy(name)?;
    crate::addons::ensure(
        Api::<ValidatingAdmissionPolicy>::all(tenant.clone()),
        &policy,
    )
    .await?;
    crate::addons::ensure(
        Api::<ValidatingAdmissionPolicyBinding>::all(tenant.clone()),
        &binding,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_adding_an_ephemeral_container_is_refused_and_the_message_says_what_to_do() {
        let (policy, binding) = ephemeral_containers_policy("dev").unwrap();
        let spec = policy.spec.unwrap();
        let rules = spec.match_constraints.unwrap().resource_rules.unwrap();
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["pods/ephemeralcontainers".to_string()][..])
        );
        assert_eq!(
            rules[0].operations.as_deref(),
            Some(&["UPDATE".to_string()][..])
        );
        let v = &spec.validations.unwrap()[0];
        assert!(v.expression.contains("object.spec.ephemeralContainers"));
        assert!(v.expression.contains("oldObject.spec.ephemeralContainers"));
        let message = v.message.as_deref().unwrap();
        assert!(message.contains("kubectl debug") && message.contains("kubectl exec"));
        let binding = binding.spec.unwrap();
        assert_eq!(binding.policy_name.as_deref(), Some(EPHEMERAL_CONTAINERS));
        assert_eq!(binding.validation_actions, Some(vec!["Deny".to_string()]));
    }
}
