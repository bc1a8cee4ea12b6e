//! Pre-upgrade check for Kubernetes API versions that a target release no longer serves.
//!
//! A tenant cluster must not be upgraded to a minor version that stops serving an API
//! version its objects were written with (the same idea as `kubent`). This module holds
//!
//! * [`REMOVALS`], a table of built-in API versions removed per release (v1.16 – v1.37),
//! * [`removed_between`] and [`kinds_between`] to pick the removals an upgrade crosses,
//! * [`evidence`] to read, from one object as the API server returns it, which
//!   apiVersion/kind it was written with,
//! * [`scan`] and [`summary`] to turn a set of objects into findings and a one-line
//!   status-condition message.
//!
//! Where the evidence comes from, and its limits:
//!
//! * The live object's own `apiVersion` says nothing: the server always answers in the
//!   version the client asked for.
//! * The `kubectl.kubernetes.io/last-applied-configuration` annotation is what kubent reads.
//!   Only client-side `kubectl apply` writes it, so it can be stale (objects already migrated
//!   by Helm, `kubectl edit` or controllers are still flagged).
//! * `metadata.managedFields[].apiVersion` records the version of each field manager's last
//!   write. Old `Update` entries linger while their manager still owns fields (false
//!   positives), clients that never wrote leave no trace, and the server drops entries whose
//!   version it can no longer convert to on the first write *after* the upgrade, so scan
//!   before upgrading.
//! * API versions served through CRDs are not covered; check each CRD's
//!   `spec.versions[].served` separately.

use std::collections::BTreeMap;

use serde_json::Value;

/// Annotation written by client-side `kubectl apply` with the manifest as applied.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Longest message [`summary`] produces, in bytes (condition messages should stay short).
pub const SUMMARY_MAX_LEN: usize = 900;

/// One built-in API version that stops being served for some kinds in a given release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Removal {
    /// `group/version` no longer served, e.g. `batch/v1beta1`.
    pub group_version: &'static str,
    /// Kinds of that group/version which are no longer served.
    pub kinds: &'static [&'static str],
    /// First release (major, minor) that no longer serves them, e.g. `(1, 25)`.
    pub removed_in: (u32, u32),
    /// What to migrate to (usually a group/version, sometimes advice).
    pub replacement: &'static str,
}

impl Removal {
    /// API group of [`Removal::group_version`]; `""` for the core group.
    pub fn group(&self) -> &'static str {
        group_of(self.group_version)
    }
}

pub use table::REMOVALS;

mod table;

/// Removals that an upgrade from `from` to `to` crosses: `from < removed_in <= to`.
pub fn removed_between(from: (u32, u32), to: (u32, u32)) -> Vec<&'static Removal> {
    REMOVALS
        .iter()
        .filter(|r| from < r.removed_in && r.removed_in <= to)
        .collect()
}

/// API group and kind of every removal in `from < removed_in <= to`, deduplicated and
/// sorted; the group is `""` for the core group.
///
/// The caller lists these kinds at whatever version the server serves now and runs
/// [`scan`] on the result. A group that is gone entirely (`extensions`) has nothing to
/// list; its objects live on under the replacement group.
pub fn kinds_between(from: (u32, u32), to: (u32, u32)) -> Vec<(&'static str, &'static str)> {
    let mut kinds: Vec<_> = removed_between(from, to)
        .into_iter()
        .flat_map(|r| r.kinds.iter().map(move |&kind| (r.group(), kind)))
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    kinds
}

/// The `(apiVersion, kind)` pairs one object was written with, deduplicated in order
/// of discovery:
///
/// * `apiVersion` and `kind` of the manifest in the [`LAST_APPLIED_ANNOTATION`]
///   annotation (ignored when it is not valid JSON or lacks either field);
/// * each `metadata.managedFields[].apiVersion`, paired with the object's own `kind`.
///
/// Items of a List response carry no `kind` of their own; set it on each item before
/// calling this, otherwise the managedFields evidence is skipped.
pub fn evidence(object: &Value) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = Vec::new();
    let mut add = |api_version: &str, kind: &str| {
        if api_version.is_empty() || kind.is_empty() {
            return;
        }
        if !found.iter().any(|(v, k)| v == api_version && k == kind) {
            found.push((api_version.to_owned(), kind.to_owned()));
        }
    };

    let metadata = object.get("metadata");

    let last_applied = metadata
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get(LAST_APPLIED_ANNOTATION))
        .and_then(Value::as_str)
        .and_then(|text| serde_json::from_str::<Value>(text).ok());
    if let Some(manifest) = last_applied
        && let (Some(api_version), Some(kind)) = (
            str_field(&manifest, "apiVersion"),
            str_field(&manifest, "kind"),
        )
    {
        add(api_version, kind);
    }

    if let Some(kind) = str_field(object, "kind") {
        let entries = metadata
            .and_then(|m| m.get("managedFields"))
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        for entry in entries {
            if let Some(api_version) = str_field(entry, "apiVersion") {
                add(api_version, kind);
            }
        }
    }

    found
}

/// Objects that still depend on one removed group/version + kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The removed `group/version` the objects were written with.
    pub group_version: String,
    /// The kind of those objects.
    pub kind: String,
    /// Release that no longer serves it.
    pub removed_in: (u32, u32),
    /// What to migrate to (from [`Removal::replacement`]).
    pub replacement: &'static str,
    /// Number of objects with this evidence (each object counted once).
    pub count: usize,
}

/// Counts the objects whose [`evidence`] names a group/version + kind removed by an
/// upgrade from `from` to `to` (see [`removed_between`]). Each object counts at most once
/// per finding. The result is sorted by group/version, then kind.
pub fn scan<'a>(
    objects: impl IntoIterator<Item = &'a Value>,
    from: (u32, u32),
    to: (u32, u32),
) -> Vec<Finding> {
    let window = removed_between(from, to);
    if window.is_empty() {
        return Vec::new();
    }

    let mut counts: BTreeMap<(String, String), (&'static Removal, usize)> = BTreeMap::new();
    for object in objects {
        // `evidence` is deduplicated, so each object adds at most one to each entry.
        for (api_version, kind) in evidence(object) {
            let removal = window
                .iter()
                .copied()
                .find(|r| r.group_version == api_version && r.kinds.contains(&kind.as_str()));
            if let Some(removal) = removal {
                counts.entry((api_version, kind)).or_insert((removal, 0)).1 += 1;
            }
        }
    }

    counts
        .into_iter()
        .map(|((group_version, kind), (removal, count))| Finding {
            group_version,
            kind,
            removed_in: removal.removed_in,
            replacement: removal.replacement,
            count,
        })
        .collect()
}

/// One line for a status condition message, e.g.
/// `v1.25 no longer serves: 3 CronJob (batch/v1beta1, use batch/v1), 1 PodDisruptionBudget (policy/v1beta1, use policy/v1)`.
///
/// At most [`SUMMARY_MAX_LEN`] bytes: findings that do not fit are folded into
/// `and N more`.
pub fn summary(findings: &[Finding], to: (u32, u32)) -> String {
    let mut out = format!("v{}.{} no longer serves", to.0, to.1);
    if findings.is_empty() {
        out.push_str(" any API version these objects were written with");
        return out;
    }
    out.push(':');

    let more = |n: usize| format!(" and {n} more");
    for (i, f) in findings.iter().enumerate() {
        let sep = if i == 0 { " " } else { ", " };
        let part = format!(
            "{sep}{} {} ({}, use {})",
            f.count, f.kind, f.group_version, f.replacement
        );
        let left_after = findings.len() - i - 1;
        let reserve = if left_after == 0 {
            0
        } else {
            ",".len() + more(left_after).len()
        };
        if out.len() + part.len() + reserve > SUMMARY_MAX_LEN {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&more(findings.len() - i));
            break;
        }
        out.push_str(&part);
    }
    out
}

/// API group of a `group/version` string; `""` for the core group (`"v1"`).
fn group_of(group_version: &str) -> &str {
    group_version
        .rsplit_once('/')
        .map_or("", |(group, _)| group)
}

/// A string field of a JSON object, if present and non-empty.
fn str_field<'v>(value: &'v Value, key: &str) -> Option<&'v str> {
    value
        .get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::HashSet;

    fn last_applied(api_version: &str, kind: &str) -> String {
        json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}}).to_string()
    }

    fn cronjob_applied_as(api_version: &str) -> Value {
        json!({
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {
                "name": "nightly",
                "annotations": {LAST_APPLIED_ANNOTATION: last_applied(api_version, "CronJob")}
            }
        })
    }

    fn finding(group_version: &str, kind: &str, count: usize) -> Finding {
        let removal = REMOVALS
            .iter()
            .find(|r| r.group_version == group_version && r.kinds.contains(&kind))
            .expect("row in table");
        Finding {
            group_version: group_version.to_owned(),
            kind: kind.to_owned(),
            removed_in: removal.removed_in,
            replacement: removal.replacement,
            count,
        }
    }

    #[test]
    fn table_has_no_duplicate_group_version_kind() {
        let mut seen = HashSet::new();
        for r in REMOVALS {
            assert!(!r.kinds.is_empty(), "{} has no kinds", r.group_version);
            for kind in r.kinds {
                assert!(
                    seen.insert((r.group_version, *kind)),
                    "duplicate {} {kind}",
                    r.group_version
                );
            }
        }
    }

    #[test]
    fn table_releases_are_1_16_to_1_37() {
        for r in REMOVALS {
            assert_eq!(r.removed_in.0, 1, "{}", r.group_version);
            assert!(
                (16..=37).contains(&r.removed_in.1),
                "{} {:?}",
                r.group_version,
                r.removed_in
            );
            assert!(r.group_version.contains('/'), "{}", r.group_version);
            assert!(!r.replacement.is_empty(), "{}", r.group_version);
        }
    }

    #[test]
    fn removed_between_1_24_and_1_25() {
        let window = removed_between((1, 24), (1, 25));
        let has = |gv: &str, kind: &str| {
            window
                .iter()
                .any(|r| r.group_version == gv && r.kinds.contains(&kind))
        };
        assert!(has("batch/v1beta1", "CronJob"));
        assert!(has("policy/v1beta1", "PodSecurityPolicy"));
        assert!(!has("autoscaling/v2beta2", "HorizontalPodAutoscaler"));
        assert!(window.iter().all(|r| r.removed_in == (1, 25)));
    }

    #[test]
    fn removed_between_is_half_open_and_spans_hops() {
        assert!(removed_between((1, 25), (1, 25)).is_empty());
        assert!(removed_between((1, 30), (1, 29)).is_empty());
        assert!(removed_between((1, 32), (1, 32)).is_empty());
        let hop = removed_between((1, 31), (1, 32));
        assert!(
            hop.iter()
                .any(|r| r.group_version == "flowcontrol.apiserver.k8s.io/v1beta3")
        );
        let multi = removed_between((1, 24), (1, 26));
        assert!(
            multi
                .iter()
                .any(|r| r.group_version == "autoscaling/v2beta2")
        );
        assert!(multi.iter().any(|r| r.group_version == "batch/v1beta1"));
        assert_eq!(removed_between((1, 0), (1, 99)).len(), REMOVALS.len());
    }

    #[test]
    fn kinds_between_gives_groups_deduplicated() {
        let kinds = kinds_between((1, 36), (1, 37));
        assert!(kinds.contains(&("networking.k8s.io", "IPAddress")));
        assert!(kinds.contains(&("storage.k8s.io", "VolumeAttributesClass")));
        let kinds = kinds_between((1, 15), (1, 16));
        let deployments = kinds
            .iter()
            .filter(|k| **k == ("apps", "Deployment"))
            .count();
        assert_eq!(deployments, 1);
        assert!(kinds.contains(&("extensions", "Deployment")));
        assert_eq!(group_of("v1"), "");
    }

    #[test]
    fn evidence_from_last_applied() {
        let object = cronjob_applied_as("batch/v1beta1");
        assert_eq!(
            evidence(&object),
            vec![("batch/v1beta1".to_owned(), "CronJob".to_owned())]
        );
    }

    #[test]
    fn evidence_from_managed_fields_deduplicated() {
        let object = json!({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {
                "name": "pdb",
                "annotations": {LAST_APPLIED_ANNOTATION: last_applied("policy/v1", "PodDisruptionBudget")},
                "managedFields": [
                    {"manager": "old-operator", "operation": "Update", "apiVersion": "policy/v1beta1"},
                    {"manager": "kube-controller-manager", "operation": "Update",
                     "apiVersion": "policy/v1beta1", "subresource": "status"},
                    {"manager": "kubectl", "operation": "Apply", "apiVersion": "policy/v1"},
                    {"manager": "broken"}
                ]
            }
        });
        assert_eq!(
            evidence(&object),
            vec![
                ("policy/v1".to_owned(), "PodDisruptionBudget".to_owned()),
                (
                    "policy/v1beta1".to_owned(),
                    "PodDisruptionBudget".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn malformed_annotation_is_ignored() {
        let object = json!({
            "kind": "CronJob",
            "metadata": {
                "annotations": {LAST_APPLIED_ANNOTATION: "{\"apiVersion\": \"batch/v1beta1\", "},
                "managedFields": [{"apiVersion": "batch/v1"}]
            }
        });
        assert_eq!(
            evidence(&object),
            vec![("batch/v1".to_owned(), "CronJob".to_owned())]
        );
        let object = json!({"metadata": {"annotations": {LAST_APPLIED_ANNOTATION: 42}}});
        assert!(evidence(&object).is_empty());
        assert!(evidence(&json!("not an object")).is_empty());
    }

    #[test]
    fn scan_counts_each_object_once_per_finding() {
        let both = json!({
            "kind": "CronJob",
            "metadata": {
                "annotations": {LAST_APPLIED_ANNOTATION: last_applied("batch/v1beta1", "CronJob")},
                "managedFields": [{"apiVersion": "batch/v1beta1"}, {"apiVersion": "batch/v1beta1"}]
            }
        });
        let pdb = json!({
            "kind": "PodDisruptionBudget",
            "metadata": {"managedFields": [{"apiVersion": "policy/v1beta1"}]}
        });
        let hpa = json!({
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"managedFields": [{"apiVersion": "autoscaling/v2beta2"}]}
        });
        let objects = [
            both,
            cronjob_applied_as("batch/v1beta1"),
            cronjob_applied_as("batch/v1beta1"),
            cronjob_applied_as("batch/v1"),
            pdb,
            hpa,
        ];
        let findings = scan(&objects, (1, 24), (1, 25));
        assert_eq!(
            findings,
            vec![
                finding("batch/v1beta1", "CronJob", 3),
                finding("policy/v1beta1", "PodDisruptionBudget", 1)
            ]
        );
        assert!(scan(&objects, (1, 25), (1, 25)).is_empty());
        // The HPA shows up once the window reaches 1.26.
        assert_eq!(scan(&objects, (1, 24), (1, 26)).len(), 3);
    }

    #[test]
    fn scan_matches_kind_as_well_as_version() {
        // policy/v1beta1 is removed for PodDisruptionBudget, but "Eviction" is not in the table.
        let object = json!({"kind": "Eviction", "metadata": {"managedFields": [{"apiVersion": "policy/v1beta1"}]}});
        assert!(scan([&object], (1, 24), (1, 25)).is_empty());
    }

    #[test]
    fn summary_text() {
        let findings = [
            finding("batch/v1beta1", "CronJob", 3),
            finding("policy/v1beta1", "PodDisruptionBudget", 1),
        ];
        assert_eq!(
            summary(&findings, (1, 25)),
            "v1.25 no longer serves: 3 CronJob (batch/v1beta1, use batch/v1), \
             1 PodDisruptionBudget (policy/v1beta1, use policy/v1)"
        );
        assert_eq!(
            summary(&[], (1, 33)),
            "v1.33 no longer serves any API version these objects were written with"
        );
    }

    #[test]
    fn summary_is_bounded() {
        let findings: Vec<Finding> = REMOVALS
            .iter()
            .flat_map(|r| {
                r.kinds
                    .iter()
                    .map(move |kind| finding(r.group_version, kind, 12345))
            })
            .collect();
        let text = summary(&findings, (1, 37));
        assert!(text.len() <= SUMMARY_MAX_LEN, "{} bytes", text.len());
        assert!(text.starts_with("v1.37 no longer serves: 12345 "));
        let (shown, more) = text
            .rsplit_once(", and ")
            .expect("has an 'and N more' tail");
        let hidden: usize = more.trim_end_matches(" more").parse().expect("a count");
        assert_eq!(shown.matches(" (").count() + hidden, findings.len());
    }
}
