//! The admission cases of our CRDs, kept in one file and run twice: against the schema's rules in
//! unit tests, and against the real API server.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// One object (or update) and the message that refuses it, or `None` when it must be accepted.
#[derive(Clone, Debug, Deserialize)]
pub struct AdmissionCase {
    /// What the case checks, in words; failures name it.
    pub name: String,
    /// `tenantcluster`, `isolationprofile` or `syncpolicy`: which shipped example to start from.
    pub base: String,
    /// When present, the object is first created from the base with this patch, then updated.
    #[serde(default)]
    pub before: Option<Value>,
    /// JSON merge patch (RFC 7386) over the base.
    pub patch: Value,
    /// A text the refusal must contain; `None`, the object must be accepted.
    pub expect: Option<String>,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The shipped example a case starts from.
pub fn base_object(base: &str) -> Value {
    let file = match base {
        "tenantcluster" => "examples/tenantcluster-dev.yaml",
        "isolationprofile" => "deploy/policies/isolationprofile-restricted.yaml",
        "syncpolicy" => "deploy/policies/syncpolicy-default.yaml",
        other => panic!(
            "admission case base {other:?} is not tenantcluster, isolationprofile or syncpolicy"
        ),
    };
    let path = workspace_root().join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

impl AdmissionCase {
    /// The object to create, or to update to.
    pub fn object(&self) -> Value {
        let mut object = base_object(&self.base);
        merge_patch(&mut object, &self.patch);
        object
    }

    /// The object as it stood before an update, for transition rules.
    pub fn old_object(&self) -> Option<Value> {
        self.before.as_ref().map(|before| {
            let mut object = base_object(&self.base);
            merge_patch(&mut object, before);
            object
        })
    }
}

/// Every case in `crates/api/tests/admission_cases.yaml`.
pub fn admission_cases() -> Vec<AdmissionCase> {
    let path = workspace_root().join("crates/api/tests/admission_cases.yaml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// RFC 7386 JSON merge patch: objects merge, `null` removes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::merge_patch;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut doc = json!({"a": {"b": 1, "c": 2}, "d": [1, 2]});
        merge_patch(&mut doc, &json!({"a": {"b": null, "e": 3}, "d": [3]}));
        assert_eq!(doc, json!({"a": {"c": 2, "e": 3}, "d": [3]}));
    }
}
