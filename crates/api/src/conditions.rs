//! Conditions: the standard `metav1.Condition` list, keyed by `type`, and the helpers that keep
//! `lastTransitionTime` honest (it moves only when the status does).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::{Schema, SchemaGenerator, json_schema};

/// The tenant answers and its control plane is up.
pub const READY: &str = "Ready";
/// The last sync pass between tenant and host succeeded.
pub const SYNCED: &str = "Synced";
/// The requested `spec.mode` runs as asked (False: it runs as shared).
pub const MODE_SUPPORTED: &str = "ModeSupported";
/// Whether the restore `spec.restore` asks is in place (set only while it asks one).
pub const RESTORED: &str = "Restored";
/// Whether the minor upgrade the spec asks (or the last one) has a snapshot to go back to; False
/// says what it waits for, or why it is refused (set only while `status.upgrade` is).
pub const UPGRADE_GUARDED: &str = "UpgradeGuarded";

/// Schema of a conditions list: a list-map keyed by `type`, so server-side apply merges by type.
pub fn conditions_schema(generator: &mut SchemaGenerator) -> Schema {
    let item = generator.subschema_for::<Condition>();
    json_schema!({
        "type": "array",
        "items": item,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    })
}

/// A condition as the controller means it, before times are stamped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionSpec {
    /// The condition's `type`, one of the constants above (such as [`READY`]).
    pub type_: &'static str,
    /// Whether the condition holds: `True` or `False` in the status.
    pub status: bool,
    /// Why, as one CamelCase word.
    pub reason: String,
    /// What a person reads: what happened, and what to change when it is not right.
    pub message: String,
}

impl ConditionSpec {
    /// A condition of `type_`, before times are stamped.
    pub fn new(
        type_: &'static str,
        status: bool,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

fn status_word(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

/// Find a condition by type.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Is the condition of this type present and True?
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Put `wanted` into `conditions`. The transition time is kept when the status did not change,
/// so a reconcile that changes nothing produces an identical list. The message is bounded: it
/// often quotes what a tenant wrote.
pub fn set(
    conditions: &mut Vec<Condition>,
    wanted: &ConditionSpec,
    generation: Option<i64>,
    now: &Time,
) {
    let status = status_word(wanted.status);
    let message = crate::text::bounded(&wanted.message);
    match conditions.iter_mut().find(|c| c.type_ == wanted.type_) {
        Some(existing) => {
            if existing.status != status {
                existing.status = status.to_string();
                existing.last_transition_time = now.clone();
            }
            existing.reason = wanted.reason.clone();
            existing.message = message;
            existing.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: wanted.type_.to_string(),
            status: status.to_string(),
            reason: wanted.reason.clone(),
            message,
            observed_generation: generation,
            last_transition_time: now.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_with_status() {
        let mut list = Vec::new();
        set(
            &mut list,
            &ConditionSpec::new(READY, false, "Provisioning", "waiting"),
            Some(1),
            &at(10),
        );
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].last_transition_time, at(10));

        set(
            &mut list,
            &ConditionSpec::new(READY, false, "Provisioning", "still waiting"),
            Some(2),
            &at(20),
        );
        assert_eq!(
            list[0].last_transition_time,
            at(10),
            "same status keeps the time"
        );
        assert_eq!(list[0].message, "still waiting");
        assert_eq!(list[0].observed_generation, Some(2));

        set(
            &mut list,
            &ConditionSpec::new(READY, true, "Ready", "up"),
            Some(2),
            &at(30),
        );
        assert_eq!(list[0].last_transition_time, at(30));
        assert!(is_true(&list, READY));
        assert!(!is_true(&list, SYNCED));
    }

    #[test]
    fn conditions_are_keyed_by_type() {
        let mut list = Vec::new();
        set(
            &mut list,
            &ConditionSpec::new(READY, true, "Ready", "up"),
            None,
            &at(1),
        );
        set(
            &mut list,
            &ConditionSpec::new(SYNCED, true, "Synced", "ok"),
            None,
            &at(1),
        );
        set(
            &mut list,
            &ConditionSpec::new(READY, false, "Down", "gone"),
            None,
            &at(2),
        );
        assert_eq!(list.len(), 2);
        assert_eq!(find(&list, READY).map(|c| c.reason.as_str()), Some("Down"));
    }

    #[test]
    fn a_message_quoting_a_tenant_is_bounded() {
        let mut list = Vec::new();
        let huge = format!("Pod default/{}: refused", "n".repeat(411_438));
        for _ in 0..2 {
            set(
                &mut list,
                &ConditionSpec::new(SYNCED, false, "NotAllowed", huge.clone()),
                None,
                &at(1),
            );
            assert!(list[0].message.len() <= crate::text::MAX_TEXT_BYTES);
            assert!(list[0].message.starts_with("Pod default/nnn"));
            assert!(list[0].message.ends_with("more characters cut)"));
        }
    }
}
