//! `make conformance`'s report: the Kubernetes end-to-end suite's results on the host and in a
//! tenant (ginkgo's JSON reports), side by side, and the parity line.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::{Error, Result};

/// How one spec ended on one side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The spec passed.
    Passed,
    /// The spec failed: why, as the report says.
    Failed(String),
    /// The spec was skipped: why, as the report says.
    Skipped(String),
    /// Selected but never run: the run's time bound ended it first, or the side has no report.
    NotRun,
}

impl Outcome {
    fn word(&self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Failed(_) => "FAILED",
            Outcome::Skipped(_) => "skipped",
            Outcome::NotRun => "not run",
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Suite {
    #[serde(default)]
    spec_reports: Vec<Spec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Spec {
    #[serde(default)]
    container_hierarchy_texts: Option<Vec<String>>,
    leaf_node_type: String,
    leaf_node_text: String,
    state: String,
    #[serde(default)]
    failure: Option<Failure>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Failure {
    #[serde(default)]
    message: String,
}

/// The specs of one ginkgo JSON report that were selected (not skipped by the focus), by full
/// name. Specs the run never reached are [`Outcome::NotRun`].
pub fn outcomes(json: &str) -> Result<BTreeMap<String, Outcome>> {
    let suites: Vec<Suite> = serde_json::from_str(json)
        .map_err(|e| Error::Io(format!("not a ginkgo JSON report: {e}")))?;
    let mut out = BTreeMap::new();
    for spec in suites.into_iter().flat_map(|s| s.spec_reports) {
        if spec.leaf_node_type != "It" {
            continue;
        }
        let message = spec.failure.map(|f| f.message).unwrap_or_default();
        let outcome = match spec.state.as_str() {
            "passed" => Outcome::Passed,
            // Left out by the focus or the skip: not part of this run.
            "skipped" | "pending" if message.is_empty() => continue,
            "skipped" if message.contains("interrupted") => Outcome::NotRun,
            "skipped" | "pending" => Outcome::Skipped(message),
            "interrupted" => Outcome::NotRun,
            _ => Outcome::Failed(message),
        };
        let mut name: Vec<String> = spec.container_hierarchy_texts.unwrap_or_default();
        name.push(spec.leaf_node_text);
        out.insert(name.join(" "), outcome);
    }
    Ok(out)
}

/// Specs the host fails because of what this test world lacks, not because of Kubernetes or of
/// us: a part of a spec's full name, and what is missing. They are named in the report with the
/// reason, never skipped.
pub const WORLD_LACKS: &[(&str, &str)] = &[
    (
        "Sample API Server using the current Aggregator",
        "no sample-apiserver image: it is built from k8s.io/sample-apiserver with an etcd 3.6 \
         image beside it, neither of which testenv builds",
    ),
    ("be consumable via the environment", ENV_NAMES),
    ("be consumable as environment variable names", ENV_NAMES),
    (
        "ImageVolume should succeed with pod and pull policy of Always",
        "no kitten image: upstream's is agnhost on Alpine Linux and the spec reads \
         'Alpine Linux' from the volume's /etc/os-release; Alpine cannot be fetched here",
    ),
];

/// Why the environment-variable specs of ConfigMaps and Secrets fail on the host.
const ENV_NAMES: &str = "the spec runs `sh -c env` in the busybox image and looks for variables \
    such as data-1 that are not shell names; Debian's busybox (1.35, and 1.37 alike) leaves those \
    out of what its shell passes on, and no other busybox build can be fetched here";

/// What this test world lacks that spec `name` needs, if it is one of [`WORLD_LACKS`].
pub fn world_lack(name: &str) -> Option<&'static str> {
    WORLD_LACKS
        .iter()
        .find(|(part, _)| name.contains(part))
        .map(|(_, why)| *why)
}

/// The first line of `message`, at most `max` characters.
fn first_line(message: &str, max: usize) -> String {
    let line = message
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    if line.chars().count() > max {
        format!("{}…", line.chars().take(max).collect::<String>())
    } else {
        line.to_string()
    }
}

/// The table (test, host, tenant, and why the tenant fell short where the host passed, or what
/// this world lacks where the host failed), the host's passes of the specs it ran, the host's
/// failures for what this world lacks by name, and the last line, `conformance parity: X/Y`:
/// passed in the tenant out of passed on the host.
pub fn report(host: &BTreeMap<String, Outcome>, tenant: &BTreeMap<String, Outcome>) -> String {
    let mut names: Vec<&String> = host.keys().chain(tenant.keys()).collect();
    names.sort();
    names.dedup();
    let mut out = String::from(
        "| test | host | tenant | why the tenant differs, or why the host fails |\n|---|---|---|---|\n",
    );
    let (mut on_host, mut both) = (0, 0);
    for name in &names {
        let h = host.get(*name).unwrap_or(&Outcome::NotRun);
        let t = tenant.get(*name).unwrap_or(&Outcome::NotRun);
        let reason = match (h, t) {
            (Outcome::Passed, Outcome::Passed) => String::new(),
            (Outcome::Passed, Outcome::Failed(m) | Outcome::Skipped(m)) => first_line(m, 200),
            (Outcome::Passed, Outcome::NotRun) => "the tenant's run ended before this test".into(),
            (Outcome::Failed(m), _) => match world_lack(name) {
                Some(why) => format!("the host fails it: {why}"),
                None => format!("the host fails it: {}", first_line(m, 200)),
            },
            _ => String::new(),
        };
        if *h == Outcome::Passed {
            on_host += 1;
            if *t == Outcome::Passed {
                both += 1;
            }
        }
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            name.replace('|', "/"),
            h.word(),
            t.word(),
            reason.replace('|', "/")
        ));
    }
    for (label, side) in [("host", host), ("tenant", tenant)] {
        let mut count = BTreeMap::new();
        for name in &names {
            *count
                .entry(side.get(*name).unwrap_or(&Outcome::NotRun).word())
                .or_insert(0) += 1;
        }
        let n = |word: &str| count.get(word).copied().unwrap_or(0);
        out.push_str(&format!(
            "\n{label}: {} passed, {} failed, {} skipped, {} not run",
            n("passed"),
            n("FAILED"),
            n("skipped"),
            n("not run")
        ));
    }
    let ran = names
        .iter()
        .filter(|n| matches!(host.get(**n), Some(Outcome::Passed | Outcome::Failed(_))))
        .count();
    out.push_str(&format!("\n\nhost passed: {on_host}/{ran} run"));
    let lacking: Vec<(&String, &str)> = names
        .iter()
        .filter(|n| matches!(host.get(**n), Some(Outcome::Failed(_))))
        .filter_map(|n| world_lack(n).map(|why| (*n, why)))
        .collect();
    if !lacking.is_empty() {
        out.push_str(&format!(
            "\n\nfailed on the host for what this test world lacks ({}):",
            lacking.len()
        ));
        for (name, why) in lacking {
            out.push_str(&format!("\n- {name}: {why}"));
        }
    }
    out.push_str(&format!("\n\nconformance parity: {both}/{on_host}\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(
        containers: &[&str],
        leaf: &str,
        state: &str,
        message: Option<&str>,
    ) -> serde_json::Value {
        let mut s = serde_json::json!({
            "ContainerHierarchyTexts": containers, "LeafNodeType": "It",
            "LeafNodeText": leaf, "State": state,
        });
        if let Some(m) = message {
            s["Failure"] = serde_json::json!({"Message": m});
        }
        s
    }

    fn suite(specs: Vec<serde_json::Value>) -> String {
        let mut all = vec![serde_json::json!({
            "LeafNodeType": "SynchronizedBeforeSuite", "LeafNodeText": "", "State": "passed"
        })];
        all.extend(specs);
        serde_json::json!([{"SuitePath": "/e2e", "SpecReports": all}]).to_string()
    }

    #[test]
    fn a_report_gives_the_selected_specs_by_full_name() {
        let json = suite(vec![
            spec(
                &["[sig-node] ConfigMap"],
                "works [Conformance]",
                "passed",
                None,
            ),
            spec(
                &["[sig-apps] Job"],
                "completes [Conformance]",
                "failed",
                Some("timed out\nwaiting"),
            ),
            spec(&["[sig-storage] X"], "not selected", "skipped", None),
            spec(
                &["[sig-apps] Y"],
                "needs two nodes [Conformance]",
                "skipped",
                Some("Requires at least 2 nodes"),
            ),
            spec(
                &["[sig-apps] Z"],
                "late [Conformance]",
                "skipped",
                Some("interrupted by timeout"),
            ),
            spec(
                &["[sig-apps] Z"],
                "running at the end [Conformance]",
                "interrupted",
                Some("interrupted"),
            ),
        ]);
        let o = outcomes(&json).unwrap();
        assert_eq!(o.len(), 5, "{o:?}");
        assert_eq!(
            o["[sig-node] ConfigMap works [Conformance]"],
            Outcome::Passed
        );
        assert_eq!(
            o["[sig-apps] Job completes [Conformance]"],
            Outcome::Failed("timed out\nwaiting".into())
        );
        assert!(matches!(
            o["[sig-apps] Y needs two nodes [Conformance]"],
            Outcome::Skipped(_)
        ));
        assert_eq!(o["[sig-apps] Z late [Conformance]"], Outcome::NotRun);
        assert_eq!(
            o["[sig-apps] Z running at the end [Conformance]"],
            Outcome::NotRun
        );
        assert!(
            outcomes("{}")
                .unwrap_err()
                .to_string()
                .contains("not a ginkgo JSON report")
        );
    }

    #[test]
    fn parity_counts_what_passed_in_the_tenant_of_what_passed_on_the_host() {
        let host = BTreeMap::from([
            ("a".to_string(), Outcome::Passed),
            ("b".to_string(), Outcome::Passed),
            ("c".to_string(), Outcome::Passed),
            ("d".to_string(), Outcome::Failed("no".into())),
        ]);
        let tenant = BTreeMap::from([
            ("a".to_string(), Outcome::Passed),
            (
                "b".to_string(),
                Outcome::Failed("pods \"x\" is forbidden | here\nmore".into()),
            ),
            ("d".to_string(), Outcome::Passed),
        ]);
        let r = report(&host, &tenant);
        assert!(r.ends_with("conformance parity: 1/3\n"), "{r}");
        assert!(
            r.contains("| b | passed | FAILED | pods \"x\" is forbidden / here |"),
            "{r}"
        );
        assert!(
            r.contains("| c | passed | not run | the tenant's run ended before this test |"),
            "{r}"
        );
        assert!(
            r.contains("| d | FAILED | passed | the host fails it: no |"),
            "{r}"
        );
        assert!(
            r.contains("host: 3 passed, 1 failed, 0 skipped, 0 not run"),
            "{r}"
        );
        assert!(
            r.contains("tenant: 2 passed, 1 failed, 0 skipped, 1 not run"),
            "{r}"
        );
        assert!(r.contains("\n\nhost passed: 3/4 run\n"), "{r}");
    }

    #[test]
    fn a_host_failure_for_what_the_world_lacks_is_named_with_its_reason() {
        let aggregator = "[sig-api-machinery] Aggregator Should be able to support the 1.17 \
                          Sample API Server using the current Aggregator [Conformance]";
        let host = BTreeMap::from([
            (aggregator.to_string(), Outcome::Failed("timed out".into())),
            ("other".to_string(), Outcome::Failed("broken".into())),
            ("late".to_string(), Outcome::NotRun),
            ("ok".to_string(), Outcome::Passed),
        ]);
        let tenant = BTreeMap::new();
        let r = report(&host, &tenant);
        let why = world_lack(aggregator).expect("the aggregator spec is known");
        assert!(why.contains("sample-apiserver"), "{why}");
        assert!(
            r.contains(&format!("| FAILED | not run | the host fails it: {why} |")),
            "{r}"
        );
        assert!(
            r.contains("| other | FAILED | not run | the host fails it: broken |"),
            "{r}"
        );
        assert!(
            r.contains(&format!(
                "failed on the host for what this test world lacks (1):\n- {aggregator}: {why}\n"
            )),
            "{r}"
        );
        assert!(r.contains("host passed: 1/3 run"), "{r}");
        assert!(r.ends_with("conformance parity: 0/1\n"), "{r}");
        assert_eq!(world_lack("other"), None);
    }
}
