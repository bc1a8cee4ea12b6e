//! Runs the admission rules of our CRD schemas locally, as the API server would: defaults first,
//! then every `x-kubernetes-validations` rule (transition rules too when an old object is given).
//! Unit tests use it to check each rule's verdict and message without a cluster.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::cel::Validator;
use serde_json::Value;

/// Why the admission rules could not be run at all.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The CRD's first version has no schema.
    #[error("CRD {0} has no openAPIV3Schema")]
    NoSchema(String),
    /// The schema does not serialize.
    #[error("the schema of CRD {crd} does not serialize: {error}")]
    Schema {
        /// The CRD.
        crd: String,
        /// What serde said.
        error: serde_json::Error,
    },
}

/// Why an object would be refused, one message per failed rule, or why the check itself could not
/// run.
pub fn admission_errors(
    crd: &CustomResourceDefinition,
    object: &Value,
    old: Option<&Value>,
) -> Result<Vec<String>, CheckError> {
    let name = || crd.metadata.name.clone().unwrap_or_else(|| "?".into());
    let schema = crd
        .spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .ok_or_else(|| CheckError::NoSchema(name()))?;
    let schema =
        serde_json::to_value(schema).map_err(|error| CheckError::Schema { crd: name(), error })?;
    let defaulted_old = old.map(|o| kube::core::cel::apply_defaults(&schema, o));
    match Validator::new().validate_with_defaults(&schema, object, defaulted_old.as_ref()) {
        Ok(()) => Ok(Vec::new()),
        Err(errors) => Ok(errors.iter().map(|e| e.message.clone()).collect()),
    }
}
