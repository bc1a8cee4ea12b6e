//! Installing TenantPlane: the plain manifests (`deploy/`) apply to a real control plane, the
//! Helm chart (`charts/tenantplane`) renders the same objects and passes `helm lint`, and the
//! operator's ServiceAccount has the rights of `deploy/operator/rbac.yaml` and no more.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde::Deserialize;
use serde_json::Value;
use tenantplane_testenv::{Binaries, eventually, kubectl, operator, repo_path, wait_for_crds};

/// Every document of every `.yaml` file in `dir` (sorted by file name), as JSON values.
fn manifests(dir: &str) -> Vec<Value> {
    let mut files: Vec<_> = std::fs::read_dir(repo_path(dir))
        .unwrap_or_else(|e| panic!("reading {dir}: {e}"))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|f| {
            documents(
                &std::fs::read_to_string(f).unwrap(),
                &f.display().to_string(),
            )
        })
        .collect()
}

fn documents(yaml: &str, what: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| {
            let v = serde_yaml::Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{what} does not parse as YAML: {e}"));
            serde_json::to_value(v).unwrap()
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// `Kind namespace/name`, or `Kind name` for cluster-scoped objects.
fn identity(object: &Value) -> String {
    let kind = object["kind"].as_str().unwrap_or("?");
    let name = object["metadata"]["name"].as_str().unwrap_or("?");
    match object["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// The labels Helm's chart adds for its own bookkeeping, which the plain manifests do not carry.
/// They are the only difference the comparison ignores, wherever they appear (object labels,
/// selectors, pod template labels).
const HELM_LABELS: &[&str] = &[
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];

fn without_helm_labels(mut object: Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for key in HELM_LABELS {
                    map.remove(*key);
                }
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut object);
    // An object whose only labels were Helm's has none left.
    if let Some(meta) = object["metadata"].as_object_mut()
        && meta
            .get("labels")
            .and_then(Value::as_object)
            .is_some_and(|l| l.is_empty())
    {
        meta.remove("labels");
    }
    object
}

/// Where `helm` differs from `plain`: one line per differing field, by path.
fn differences(path: &str, plain: &Value, helm: &Value, out: &mut Vec<String>) {
    match (plain, helm) {
        (Value::Object(p), Value::Object(h)) => {
            let keys: std::collections::BTreeSet<&String> = p.keys().chain(h.keys()).collect();
            for k in keys {
                let null = Value::Null;
                differences(
                    &format!("{path}.{k}"),
                    p.get(k).unwrap_or(&null),
                    h.get(k).unwrap_or(&null),
                    out,
                );
            }
        }
        (Value::Array(p), Value::Array(h)) if p.len() == h.len() => {
            for (i, (pv, hv)) in p.iter().zip(h).enumerate() {
                differences(&format!("{path}[{i}]"), pv, hv, out);
            }
        }
        _ if plain != helm => out.push(format!("{path}: plain manifest {plain}, helm {helm}")),
        _ => {}
    }
}

/// `helm` from the test binaries, with its configuration and cache in a folder of its own.
fn helm(args: &[&str]) -> std::process::Output {
    let helm = Binaries::locate()
        .and_then(|b| b.helm())
        .unwrap_or_else(|e| panic!("{e}"));
    let home = std::env::temp_dir().join(format!("tenantplane-helm-{}", std::process::id()));
    let out = Command::new(helm)
        .args(args)
        .current_dir(repo_path(""))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .expect("helm runs");
    let _ = std::fs::remove_dir_all(&home);
    out
}

#[test]
fn helm_template_renders_the_plain_manifests() {
    let out = helm(&[
        "template",
        "tenantplane",
        "charts/tenantplane",
        "--namespace",
        "tenantplane-system",
    ]);
    assert!(
        out.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered: BTreeMap<String, Value> = documents(
        &String::from_utf8_lossy(&out.stdout),
        "helm template's output",
    )
    .into_iter()
    .map(without_helm_labels)
    .map(|o| (identity(&o), o))
    .collect();
    let mut plain: BTreeMap<String, Value> = manifests("deploy/operator")
        .into_iter()
        .chain(manifests("deploy/policies"))
        .map(|o| (identity(&o), o))
        .collect();
    // The chart leaves the release namespace to Helm (`--create-namespace`): a Namespace in the
    // chart would refuse to install into one that exists.
    assert!(
        plain.remove("Namespace tenantplane-system").is_some(),
        "deploy/operator/namespace.yaml makes Namespace tenantplane-system"
    );
    let mut problems = Vec::new();
    for (id, expected) in &plain {
        match rendered.get(id) {
            None => problems.push(format!("{id}: in deploy/ but not rendered by the chart")),
            Some(got) => {
                let mut diffs = Vec::new();
                differences("", expected, got, &mut diffs);
                problems.extend(diffs.into_iter().map(|d| format!("{id}: {d}")));
            }
        }
    }
    for id in rendered.keys().filter(|id| !plain.contains_key(*id)) {
        problems.push(format!("{id}: rendered by the chart but not in deploy/"));
    }
    assert!(
        problems.is_empty(),
        "the chart and the plain manifests differ (Helm's own labels aside):\n{}",
        problems.join("\n")
    );
}

#[test]
fn helm_lint_accepts_the_chart() {
    let out = helm(&["lint", "--strict", "charts/tenantplane"]);
    assert!(
        out.status.success(),
        "helm lint failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `helm template` of the chart with one `--set`.
fn template_with(set: &str) -> std::process::Output {
    helm(&[
        "template",
        "tenantplane",
        "charts/tenantplane",
        "--set",
        set,
    ])
}

#[test]
fn the_charts_schema_refuses_values_that_would_render_a_broken_install() {
    // Each refused by the values schema, naming the value, before anything renders.
    for (set, says) in [
        ("replicas=-1", "replicas"),
        ("replicas=0", "replicas"),
        ("logFormat=xml", "logFormat"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("serviceCIDR=ten-dot-96", "serviceCIDR"),
        ("replica=2", "replica"),
    ] {
        let out = template_with(set);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--set {set} rendered");
        assert!(
            stderr.contains("values don't meet the specifications of the schema")
                && stderr.contains(says),
            "--set {set}: {stderr}"
        );
    }
    // What values.yaml documents is accepted: a filter for the log level, a CIDR, one replica.
    for set in [
        "logLevel=info\\,tenantplane_controller=debug",
        "serviceCIDR=10.96.0.0/12",
        "replicas=1",
        "logFormat=text",
    ] {
        let out = template_with(set);
        assert!(
            out.status.success(),
            "--set {set}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_chart_can_leave_out_the_policies() {
    let out = template_with("installPolicies=false");
    assert!(out.status.success());
    let kinds: Vec<String> = documents(&String::from_utf8_lossy(&out.stdout), "helm template")
        .iter()
        .map(|o| o["kind"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(kinds.contains(&"Deployment".to_string()), "{kinds:?}");
    assert!(
        !kinds
            .iter()
            .any(|k| k == "IsolationProfile" || k == "SyncPolicy"),
        "{kinds:?}"
    );
}

fn file_arg(path: &str) -> String {
    format!("--filename={}", repo_path(path).display())
}

/// The README's install steps on this binary's control plane, once, before any other test here
/// touches it: the CRDs and the namespace (deploy/operator/deployment.yaml sorts before
/// namespace.yaml), until the CRDs are established; then deploy/operator and deploy/policies.
/// Returns what the last `kubectl apply` printed.
fn install_as_the_readme_says() -> &'static str {
    static APPLIED: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    APPLIED.get_or_init(|| {
        kubectl(&[
            "apply",
            "--server-side",
            &file_arg("deploy/crds"),
            &file_arg("deploy/operator/namespace.yaml"),
        ])
        .expect("the CRDs and the namespace apply");
        wait_for_crds();
        kubectl(&[
            "apply",
            "--server-side",
            &file_arg("deploy/operator"),
            &file_arg("deploy/policies"),
        ])
        .expect("deploy/operator and deploy/policies apply")
    })
}

#[tokio::test]
async fn the_plain_manifests_install_and_the_operator_pods_are_admitted() {
    let applied = install_as_the_readme_says();
    for object in [
        "namespace/tenantplane-system",
        "serviceaccount/tenantplane",
        "clusterrole.rbac.authorization.k8s.io/tenantplane",
        "deployment.apps/tenantplane",
        "service/tenantplane-metrics",
        "service/tenantplane-kubelet",
        "isolationprofile.tenantplane.io/restricted",
        "syncpolicy.tenantplane.io/default",
    ] {
        assert!(applied.contains(object), "{object} not applied:\n{applied}");
    }
    let replicas = kubectl(&[
        "get",
        "deployment",
        "tenantplane",
        "-n",
        "tenantplane-system",
        "-o",
        "jsonpath={.spec.replicas}",
    ])
    .unwrap();
    assert_eq!(replicas, "2");
    // The namespace enforces Pod Security "restricted": the ReplicaSet's pods exist only if
    // their spec passes it. (kwok's simulated node runs nothing; they are not expected to work.)
    let pods = eventually(Duration::from_secs(60), || async {
        let names = kubectl(&[
            "get",
            "pods",
            "-n",
            "tenantplane-system",
            "-l",
            "app.kubernetes.io/name=tenantplane",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.serviceAccountName}{\"\\n\"}{end}",
        ])
        .ok()?;
        let lines: Vec<String> = names.lines().map(str::to_string).collect();
        (lines.len() == 2).then_some(lines)
    })
    .await;
    let events = kubectl(&["get", "events", "-n", "tenantplane-system"]).unwrap_or_default();
    let pods = pods.unwrap_or_else(|| panic!("the Deployment never had 2 pods; events:\n{events}"));
    for line in pods {
        assert!(line.ends_with(" tenantplane"), "{line}");
    }
}

/// `kubectl auth can-i ... --as` the operator: true for yes, false for no.
fn operator_can(args: &[&str]) -> bool {
    let mut all = vec!["auth", "can-i"];
    all.extend_from_slice(args);
    let user = format!("--as={}", operator::USER);
    all.push(&user);
    match kubectl(&all) {
        Ok(out) => out.trim() == "yes",
        Err(tenantplane_testenv::Error::Kubectl(out)) if out.trim_start().starts_with("no") => {
            false
        }
        Err(e) => panic!("kubectl auth can-i {args:?}: {e}"),
    }
}

fn rules_of(kind: &str) -> Vec<PolicyRule> {
    let object = manifests("deploy/operator")
        .into_iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in deploy/operator"));
    serde_json::from_value(object["rules"].clone()).unwrap()
}

#[test]
fn the_rbac_names_every_resource_and_verb() {
    for kind in ["ClusterRole", "Role"] {
        for rule in rules_of(kind) {
            let words = rule
                .verbs
                .iter()
                .chain(rule.resources.iter().flatten())
                .chain(rule.api_groups.iter().flatten());
            for word in words {
                assert!(!word.contains('*'), "{kind} grants a wildcard: {rule:?}");
            }
            assert!(rule.non_resource_urls.is_none(), "{kind}: {rule:?}");
        }
    }
}

#[tokio::test]
async fn the_operator_service_account_has_its_rights_and_is_not_an_admin() {
    // The CRDs first: kubectl auth can-i finds the TenantPlane resources through discovery.
    install_as_the_readme_says();
    operator::token(); // applies namespace, ServiceAccount and RBAC again, harmlessly
    // Everything rbac.yaml grants, granted to the ServiceAccount.
    let check = |rule: &PolicyRule, ns: Option<&str>| {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                let (resource, sub) = resource.split_once('/').unwrap_or((resource, ""));
                let qualified = if group.is_empty() {
                    resource.to_string()
                } else {
                    format!("{resource}.{group}")
                };
                let names = rule.resource_names.clone().unwrap_or_default();
                let targets: Vec<String> = if names.is_empty() {
                    vec![qualified.clone()]
                } else {
                    names.iter().map(|n| format!("{qualified}/{n}")).collect()
                };
                for verb in &rule.verbs {
                    for target in &targets {
                        let mut args = vec![verb.as_str(), target.as_str()];
                        let subresource = format!("--subresource={sub}");
                        if !sub.is_empty() {
                            args.push(&subresource);
                        }
                        match ns {
                            Some(ns) => args.extend(["--namespace", ns]),
                            None => args.push("--all-namespaces"),
                        }
                        assert!(operator_can(&args), "the operator may not {args:?}");
                    }
                }
            }
        }
    };
    for rule in rules_of("ClusterRole") {
        check(&rule, None);
    }
    for rule in rules_of("Role") {
        check(&rule, Some(operator::NAMESPACE));
    }

    // What it must not do: grant itself more, act as someone else, reach kubelets, touch
    // namespaces, nodes, CRDs or TenantClusters beyond its status, or use other Leases. (It may
    // add an ephemeral container to a pod, `patch pods/ephemeralcontainers`, to start a tenant's
    // `kubectl debug` in the copy: no more than the pods it may create already run.)
    let refused: &[&[&str]] = &[
        &["create", "clusterroles.rbac.authorization.k8s.io"],
        &["create", "clusterrolebindings.rbac.authorization.k8s.io"],
        &[
            "create",
            "rolebindings.rbac.authorization.k8s.io",
            "-n",
            "kube-system",
        ],
        &["bind", "clusterroles.rbac.authorization.k8s.io"],
        &["escalate", "clusterroles.rbac.authorization.k8s.io"],
        &["impersonate", "users"],
        &["impersonate", "serviceaccounts", "-n", "kube-system"],
        &[
            "create",
            "serviceaccounts",
            "--subresource=token",
            "-n",
            "kube-system",
        ],
        &["get", "nodes", "--subresource=proxy"],
        &["create", "pods", "--subresource=eviction", "-n", "default"],
        &["update", "secrets", "-n", "kube-system"],
        &["create", "namespaces"],
        &["delete", "namespaces"],
        &["patch", "nodes"],
        &["delete", "nodes"],
        &["patch", "customresourcedefinitions.apiextensions.k8s.io"],
        &["create", "tenantclusters.tenantplane.io", "-n", "default"],
        &["delete", "tenantclusters.tenantplane.io", "-n", "default"],
        &["update", "tenantclusters.tenantplane.io", "-n", "default"],
        &["patch", "isolationprofiles.tenantplane.io"],
        &["create", "deployments.apps", "-n", "default"],
        &["delete", "daemonsets.apps", "-n", "default"],
        &["create", "servicecidrs.networking.k8s.io"],
        &[
            "create",
            "validatingwebhookconfigurations.admissionregistration.k8s.io",
        ],
        &["get", "leases.coordination.k8s.io", "-n", "kube-system"],
        &[
            "update",
            "leases.coordination.k8s.io/someone-else",
            "-n",
            "tenantplane-system",
        ],
        &[
            "delete",
            "leases.coordination.k8s.io/tenantplane",
            "-n",
            "tenantplane-system",
        ],
        &["*", "*"],
    ];
    for args in refused {
        assert!(!operator_can(args), "the operator may {args:?}");
    }

    // And as the API server answers the ServiceAccount's own requests (dry runs: nothing changes).
    let client = operator::client();
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let role = ClusterRole {
        metadata: kube::api::ObjectMeta {
            name: Some("tenantplane-escalation".into()),
            ..Default::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["*".into()]),
            resources: Some(vec!["*".into()]),
            verbs: vec!["*".into()],
            ..Default::default()
        }]),
        ..Default::default()
    };
    let forbidden =
        |r: Result<(), kube::Error>| matches!(r, Err(kube::Error::Api(e)) if e.code == 403);
    assert!(
        forbidden(
            Api::<ClusterRole>::all(client.clone())
                .create(&dry, &role)
                .await
                .map(|_| ())
        ),
        "creating a ClusterRole must be Forbidden"
    );
    let namespaces = Api::<Namespace>::all(client.clone());
    let dry_delete = DeleteParams {
        dry_run: true,
        ..Default::default()
    };
    assert!(
        forbidden(
            namespaces
                .delete("kube-system", &dry_delete)
                .await
                .map(|_| ())
        ),
        "deleting a namespace must be Forbidden"
    );
    let listed = namespaces
        .list(&ListParams::default())
        .await
        .expect("the operator lists namespaces");
    assert!(!listed.items.is_empty());
}
