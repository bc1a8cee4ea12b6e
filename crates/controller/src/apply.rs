//! Apply: server-side apply under one field manager, but only when the live object differs from
//! the desired one, so a reconcile that changes nothing sends no write.

use std::fmt::Debug;

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use kube::runtime::reflector::Store;

use crate::names::{FIELD_MANAGER, LABEL_MANAGED_BY, MANAGED_BY};
use crate::{Error, cache};

/// What [`ensure`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Unchanged,
    Created,
    Updated,
}

/// Make `desired` exist as written: apply it when it is missing or when any field it sets differs
/// from the live object (someone deleted or edited it).
/// `live` is the cached object (see `cache`), so checking costs no request.
pub async fn ensure<K>(api: &Api<K>, live: &Store<K>, desired: &K) -> Result<Outcome, Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let name = desired.name_any();
    let live = cache::get(live, desired.meta().namespace.as_deref(), &name);
    let outcome = match live.as_deref() {
        Some(live) if contains(&to_value(live)?, &to_value(desired)?) => {
            return Ok(Outcome::Unchanged);
        }
        Some(_) => Outcome::Updated,
        None => Outcome::Created,
    };
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(desired),
    )
    .await?;
    Ok(outcome)
}

/// [`ensure`] the object when the policy wants one, else [`ensure_absent`] the one named `name`.
pub async fn ensure_optional<K>(
    api: &Api<K>,
    live: &Store<K>,
    desired: Option<K>,
    namespace: &str,
    name: &str,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    match desired {
        Some(desired) => drop(ensure(api, live, &desired).await?),
        None => drop(ensure_absent(api, live, namespace, name).await?),
    }
    Ok(())
}

/// Delete an object we created that should no longer exist. Objects without our label are left
/// alone: they are someone else's.
pub async fn ensure_absent<K>(
    api: &Api<K>,
    live: &Store<K>,
    namespace: &str,
    name: &str,
) -> Result<bool, Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    match cache::get(live, Some(namespace), name) {
        Some(live)
            if live.labels().get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY) =>
        {
            api.delete(name, &DeleteParams::background()).await?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

fn to_value<K: Serialize>(k: &K) -> Result<Value, Error> {
    serde_json::to_value(k).map_err(|e| Error::Build(format!("serializing an object: {e}")))
}

/// Does `live` hold every field `desired` sets, with the same value? The API server adds defaults
/// and status, so extra fields in `live` are fine. Quantities compare by value (`0.5` = `500m`).
pub fn contains(live: &Value, desired: &Value) -> bool {
    match (live, desired) {
        (Value::Object(l), Value::Object(d)) => d.iter().all(|(k, dv)| match l.get(k) {
            Some(lv) => contains(lv, dv),
            // The API server omits zero values (Go's omitempty), so a desired zero is no drift.
            None => is_zero(dv),
        }),
        (Value::Array(l), Value::Array(d)) => {
            l.len() == d.len() && l.iter().zip(d).all(|(lv, dv)| contains(lv, dv))
        }
        (Value::String(l), Value::String(d)) => l == d || quantities_equal(l, d),
        (Value::Number(l), Value::Number(d)) => l.as_f64() == d.as_f64(),
        _ => live == desired,
    }
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.values().all(is_zero),
    }
}

/// Parse a Kubernetes quantity (`500m`, `2Gi`, `1e3`) to a number.
pub fn parse_quantity(s: &str) -> Option<f64> {
    const SUFFIXES: &[(&str, f64)] = &[
        ("Ki", 1024.0),
        ("Mi", 1_048_576.0),
        ("Gi", 1_073_741_824.0),
        ("Ti", 1_099_511_627_776.0),
        ("Pi", 1_125_899_906_842_624.0),
        ("Ei", 1_152_921_504_606_846_976.0),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    let s = s.trim();
    if s.is_empty()
        || !s.starts_with(|c: char| c.is_ascii_digit() || c == '.' || c == '+' || c == '-')
    {
        return None;
    }
    for (suffix, factor) in SUFFIXES {
        if let Some(number) = s.strip_suffix(suffix) {
            return number.parse::<f64>().ok().map(|n| n * factor);
        }
    }
    s.parse::<f64>().ok()
}

fn quantities_equal(a: &str, b: &str) -> bool {
    match (parse_quantity(a), parse_quantity(b)) {
        (Some(x), Some(y)) => (x - y).abs() <= f64::EPSILON * x.abs().max(y.abs()).max(1.0),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn server_defaults_do_not_count_as_drift() {
        let desired = json!({"spec": {"ports": [{"port": 6443}], "clusterIP": "None"}});
        let live = json!({"spec": {"ports": [{"port": 6443, "protocol": "TCP"}], "clusterIP": "None", "type": "ClusterIP"}, "status": {}});
        assert!(contains(&live, &desired));
    }

    #[test]
    fn omitted_zero_values_are_no_drift() {
        let desired = json!({"spec": {"publishNotReadyAddresses": false, "ports": [], "x": 0}});
        assert!(contains(&json!({"spec": {}}), &desired));
        assert!(!contains(
            &json!({"spec": {}}),
            &json!({"spec": {"publishNotReadyAddresses": true}})
        ));
    }

    #[test]
    fn edits_and_deletions_count_as_drift() {
        let desired = json!({"spec": {"replicas": 1, "selector": {"a": "b"}}});
        assert!(!contains(
            &json!({"spec": {"replicas": 2, "selector": {"a": "b"}}}),
            &desired
        ));
        assert!(!contains(&json!({"spec": {"replicas": 1}}), &desired));
        assert!(!contains(
            &json!({"spec": {"replicas": 1, "selector": {"a": "c"}}}),
            &desired
        ));
        let list = json!({"l": [1, 2]});
        assert!(!contains(&json!({"l": [1]}), &list));
        assert!(!contains(&json!({"l": [1, 2, 3]}), &list));
    }

    #[test]
    fn quantities_compare_by_value() {
        assert!(contains(&json!({"cpu": "500m"}), &json!({"cpu": "0.5"})));
        assert!(contains(
            &json!({"memory": "1Gi"}),
            &json!({"memory": "1024Mi"})
        ));
        assert!(!contains(&json!({"cpu": "2"}), &json!({"cpu": "1"})));
        assert!(!contains(&json!({"name": "dev"}), &json!({"name": "prod"})));
        assert_eq!(parse_quantity("2Gi"), Some(2.0 * 1_073_741_824.0));
        assert_eq!(parse_quantity("restricted"), None);
    }
}
