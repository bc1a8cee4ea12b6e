//! One way to converge an object, for the controller and the syncer: server-side apply under one
//! field manager, so a field dropped from the desired object is removed from the live one too;
//! skipped only while the live object carries the hash of the desired object (kept in an
//! annotation) and still holds every field the desired object sets, so a steady state sends no
//! write and a hand edit is put back.

use std::fmt::Debug;

use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tenantplane_api::quantity::same_quantity;

use crate::naming::ANNOTATION_APPLIED_HASH;
use crate::stages::{Stage, Stages};

/// What [`converge`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The live object already matched: nothing was sent.
    Unchanged,
    /// The object did not exist and was created.
    Created,
    /// The live object differed and was updated.
    Updated,
}

/// Why converging failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused the request or could not be reached.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// The object could not be turned into JSON (a bug, not the user's).
    #[error("serializing {kind}: {source}")]
    Serialize {
        /// The kind being serialized.
        kind: String,
        /// What serde said.
        source: serde_json::Error,
    },
    /// A create found an object of the name that is not the one we saw (someone else's).
    #[error("a {kind} named {name} exists that was not made here")]
    NameTaken {
        /// The kind of the object.
        kind: String,
        /// The name the other object holds.
        name: String,
    },
}

/// Which object an apply may touch.
#[derive(Clone, Copy)]
pub enum Target<'a> {
    /// Whatever has the name: created when missing (the controller's own objects).
    Any,
    /// A copy: only the live object we saw (its UID is sent, so the API server refuses the apply
    /// if the object was replaced meanwhile), or, when we saw none, a new object (created by an
    /// apply that any existing object refuses). An object of the name that the cache did not
    /// show is taken only if `ours` says it is ours (a copy of our own the watch has not brought
    /// yet); never another object that happens to have it.
    Copy {
        /// The UID of the live copy we saw, if any.
        live_uid: Option<&'a str>,
        /// Whether an object the cache did not show is a copy of our own.
        ours: &'a (dyn Fn(&ObjectMeta) -> bool + Send + Sync),
        /// Where the host read and write are timed, as `kind` (see [`crate::stages`]).
        stages: &'a Stages,
        /// The kind, as the stages name it.
        kind: &'static str,
    },
}

/// A short hash of a desired object, as it is sent.
pub fn hash_of(value: &Value) -> String {
    let text = value.to_string();
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The apply body for `desired`: its kind, and its hash in [`ANNOTATION_APPLIED_HASH`].
pub fn stamped<K>(desired: &K) -> Result<(Value, String), Error>
where
    K: Resource<DynamicType = ()> + Serialize,
{
    let mut value = serde_json::to_value(desired).map_err(|source| Error::Serialize {
        kind: kind_of::<K>(),
        source,
    })?;
    value["apiVersion"] = json!(K::api_version(&()));
    value["kind"] = json!(K::kind(&()));
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        meta.remove("uid");
    }
    let hash = hash_of(&value);
    value["metadata"]["annotations"][ANNOTATION_APPLIED_HASH] = json!(hash);
    Ok((value, hash))
}

fn kind_of<K: Resource<DynamicType = ()>>() -> String {
    K::kind(&()).to_string()
}

/// Is `live` what applying `body` (stamped with `hash`) would leave?
pub fn up_to_date<K: Serialize + Resource>(live: &K, body: &Value, hash: &str) -> bool {
    let carries = live
        .meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_APPLIED_HASH))
        == Some(&hash.to_string());
    carries && serde_json::to_value(live).is_ok_and(|l| contains(&l, body))
}

/// Make `desired` the live object: nothing when `live` is [`up_to_date`], else one server-side
/// apply under `manager` (forced: the fields are ours).
pub async fn converge<K>(
    api: &Api<K>,
    manager: &str,
    live: Option<&K>,
    desired: &K,
    target: Target<'_>,
) -> Result<Outcome, Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let (body, hash) = stamped(desired)?;
    converge_body(api, manager, live, body, &hash, target).await
}

/// [`converge`] with the body already stamped (for objects whose apply body holds more than the
/// part that decides the hash, such as a pod's immutable spec).
pub async fn converge_body<K>(
    api: &Api<K>,
    manager: &str,
    live: Option<&K>,
    mut body: Value,
    hash: &str,
    target: Target<'_>,
) -> Result<Outcome, Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    if let Some(live) = live
        && up_to_date(live, &body, hash)
    {
        return Ok(Outcome::Unchanged);
    }
    let name = body["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut existed = live.is_some();
    let mut timed = None;
    if let Target::Copy {
        live_uid,
        ours,
        stages,
        kind,
    } = target
    {
        timed = Some((stages, kind));
        if live_uid.is_none() {
            // Server-side apply creates or takes over whatever has the name, so a bare apply
            // is never sent for a name the cache does not show. This one only creates: an apply
            // carrying resourceVersion "1" makes a missing object (the API server gives it its
            // own version) and is refused (409) by any object that exists, ours or someone
            // else's, untouched, since no live object holds the datastore's first revision.
            // One write instead of a read and a write; a refusal falls back to reading.
            let mut create = body.clone();
            create["metadata"]["resourceVersion"] = json!("1");
            match apply(api, manager, &name, &create, Some((stages, kind))).await {
                Ok(()) => return Ok(Outcome::Created),
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        let uid = match live_uid {
            Some(uid) => Some(uid.to_string()),
            // The name is taken: whose is it?
            None => match stages
                .time(Stage::HostRead, kind, api.get_opt(&name))
                .await?
            {
                Some(found) if ours(found.meta()) => {
                    if up_to_date(&found, &body, hash) {
                        return Ok(Outcome::Unchanged);
                    }
                    existed = true;
                    found.meta().uid.clone()
                }
                Some(_) => {
                    return Err(Error::NameTaken {
                        kind: kind_of::<K>(),
                        name,
                    });
                }
                None => None,
            },
        };
        if let Some(uid) = &uid {
            // The API server refuses an apply whose UID is not the live object's (replaced since
            // we saw it: the watch brings the new one, and the next pass decides).
            body["metadata"]["uid"] = json!(uid);
        }
    }
    match apply(api, manager, &name, &body, timed).await {
        Ok(()) if existed => Ok(Outcome::Updated),
        Ok(()) => Ok(Outcome::Created),
        Err(e) => Err(e.into()),
    }
}

/// One forced server-side apply of `body` under `manager`; for a copy (`timed`), timed as a host
/// write whose watch event is then awaited.
async fn apply<K>(
    api: &Api<K>,
    manager: &str,
    name: &str,
    body: &Value,
    timed: Option<(&Stages, &'static str)>,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    let params = PatchParams::apply(manager).force();
    let patch = Patch::Apply(body);
    let write = api.patch(name, &params, &patch);
    let Some((stages, kind)) = timed else {
        return write.await.map(|_| ());
    };
    stages.time(Stage::HostWrite, kind, write).await?;
    stages.wrote(kind, name);
    Ok(())
}

/// Delete `obj` if it is still the object we saw (UID precondition); gone already is fine.
/// `true` when this call deleted it; `false` when it was gone or replaced already.
pub async fn delete_if_present<K>(
    api: &Api<K>,
    obj: &K,
    grace: Option<u32>,
) -> Result<bool, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    let dp = DeleteParams {
        grace_period_seconds: grace,
        preconditions: Some(Preconditions {
            uid: obj.meta().uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(&obj.name_any(), &dp).await {
        Ok(_) => Ok(true),
        // Gone, or replaced by a newer object of the same name (not ours to delete).
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Does `live` hold every field `desired` sets, with the same value? The API server adds defaults
/// and status, so extra fields in `live` are fine. Quantities compare by exact value (`0.5` =
/// `500m`).
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
        (Value::String(l), Value::String(d)) => l == d || same_quantity(l, d),
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn config_map(data: serde_json::Value) -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": "c", "namespace": "n"}, "data": data}))
            .unwrap()
    }

    #[test]
    fn a_live_object_is_up_to_date_only_with_the_same_hash_and_fields() {
        let desired = config_map(json!({"a": "1"}));
        let (body, hash) = stamped(&desired).unwrap();
        assert_eq!(body["kind"], "ConfigMap");
        assert_eq!(
            body["metadata"]["annotations"][ANNOTATION_APPLIED_HASH],
            hash
        );
        let mut live: ConfigMap = serde_json::from_value(body.clone()).unwrap();
        live.metadata.resource_version = Some("7".into());
        assert!(up_to_date(&live, &body, &hash));

        // A key removed from the desired object changes the hash, so the apply removes it.
        let (fewer, fewer_hash) = stamped(&config_map(json!({}))).unwrap();
        assert_ne!(fewer_hash, hash);
        assert!(!up_to_date(&live, &fewer, &fewer_hash));

        // A hand edit keeps the hash but not the fields: put back.
        let mut edited = live.clone();
        edited
            .data
            .as_mut()
            .unwrap()
            .insert("a".into(), "tampered".into());
        assert!(!up_to_date(&edited, &body, &hash));

        // Without the hash (written before it was kept), applied once.
        let mut unstamped = live;
        unstamped.metadata.annotations = None;
        assert!(!up_to_date(&unstamped, &body, &hash));
    }

    #[test]
    fn the_hash_ignores_server_fields_of_the_desired_object() {
        let mut a = config_map(json!({"a": "1"}));
        let (_, before) = stamped(&a).unwrap();
        a.metadata.resource_version = Some("9".into());
        a.metadata.uid = Some("u".into());
        assert_eq!(stamped(&a).unwrap().1, before);
    }

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
        // Exact: a float would call these equal.
        assert!(!contains(
            &json!({"storage": "9007199254740993"}),
            &json!({"storage": "9007199254740992"})
        ));
    }
}
