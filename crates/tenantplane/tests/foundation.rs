//! The foundation against the real control plane: our CRDs install and admit exactly what the
//! rules say, and the host's own controllers (StatefulSet, scheduler + kwok, garbage collector)
//! do their part.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use tenantplane_testenv::cases::admission_cases;
use tenantplane_testenv::{
    eventually, install_crds_and_policies, kubectl, namespace, repo_path as repo,
};

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn the_seed_example_applies_with_kubectl() {
    install_crds_and_policies();
    // The example names namespace team-dev, as the seed page does.
    let _ = kubectl(&["create", "namespace", "team-dev"]);
    let example = repo("examples/tenantcluster-dev.yaml");
    let out =
        kubectl(&["apply", "-f", example.to_str().unwrap()]).expect("the example is accepted");
    assert!(out.contains("tenantcluster.tenantplane.io/dev"), "{out}");

    // Defaults and columns as the API server serves them.
    let mode = kubectl(&[
        "get",
        "tc",
        "dev",
        "-n",
        "team-dev",
        "-o",
        "jsonpath={.spec.mode}",
    ])
    .unwrap();
    assert_eq!(mode, "shared");
    let table = kubectl(&["get", "tenantclusters", "-n", "team-dev"]).unwrap();
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "PHASE", "MODE", "VERSION", "ENDPOINT", "AGE"]
    );

    let profiles = kubectl(&[
        "get",
        "isolationprofiles",
        "restricted",
        "-o",
        "jsonpath={.spec.podSecurity}",
    ])
    .unwrap();
    assert_eq!(profiles, "restricted");
    let policy = kubectl(&[
        "get",
        "syncpolicy",
        "default",
        "-o",
        "jsonpath={.spec.fromHost.nodes.mode}",
    ])
    .unwrap();
    assert_eq!(policy, "virtual");
}

fn api_for(client: kube::Client, kind: &str, ns: &str) -> Api<DynamicObject> {
    let (gvk, plural) = match kind {
        "TenantCluster" => (
            GroupVersionKind::gvk("tenantplane.io", "v1alpha1", "TenantCluster"),
            "tenantclusters",
        ),
        "IsolationProfile" => (
            GroupVersionKind::gvk("tenantplane.io", "v1alpha1", "IsolationProfile"),
            "isolationprofiles",
        ),
        _ => (
            GroupVersionKind::gvk("tenantplane.io", "v1alpha1", "SyncPolicy"),
            "syncpolicies",
        ),
    };
    let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
    if kind == "TenantCluster" {
        Api::namespaced_with(client, ns, &resource)
    } else {
        Api::all_with(client, &resource)
    }
}

fn named(mut object: Value, name: &str, ns: &str) -> DynamicObject {
    object["metadata"] = json!({"name": name});
    if object["kind"] == "TenantCluster" {
        object["metadata"]["namespace"] = json!(ns);
    }
    serde_json::from_value(object).expect("a case is a Kubernetes object")
}

/// Create (or create then update) the case's object; the API server's refusal, if any.
async fn submit(
    api: &Api<DynamicObject>,
    old: Option<DynamicObject>,
    new: DynamicObject,
) -> Result<(), String> {
    let pp = PostParams::default();
    let message = |e: kube::Error| match e {
        kube::Error::Api(status) => status.message,
        other => format!("unexpected client error: {other}"),
    };
    match old {
        None => api.create(&pp, &new).await.map(|_| ()).map_err(message),
        Some(old) => {
            let created = api
                .create(&pp, &old)
                .await
                .map_err(|e| format!("creating the `before` object: {}", message(e)))?;
            let mut new = new;
            new.metadata.resource_version = created.metadata.resource_version;
            api.replace(
                &created.metadata.name.clone().unwrap_or_default(),
                &pp,
                &new,
            )
            .await
            .map(|_| ())
            .map_err(message)
        }
    }
}

#[tokio::test]
async fn the_real_api_server_admits_exactly_what_the_rules_say() {
    install_crds_and_policies();
    let ns = namespace("admission").await;
    let cases = admission_cases();
    let refused = cases.iter().filter(|c| c.expect.is_some()).count();
    assert!(
        refused >= 10,
        "at least ten invalid variants, got {refused}"
    );

    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let object = case.object();
        let kind = object["kind"].as_str().unwrap_or_default().to_string();
        let api = api_for(ns.client.clone(), &kind, &ns.name);
        // A case about names keeps its own; the others get a unique one.
        let name = match case.patch["metadata"]["name"].as_str() {
            Some(own) => own.to_string(),
            None => format!("case-{i}-{}", ns.name),
        };
        let old = case.old_object().map(|o| named(o, &name, &ns.name));
        let verdict = submit(&api, old, named(object, &name, &ns.name)).await;
        match (&case.expect, verdict) {
            (None, Err(e)) => {
                failures.push(format!("{}: expected acceptance, got: {e}", case.name));
            }
            (Some(expected), Ok(())) => failures.push(format!(
                "{}: expected refusal with {expected:?}, was accepted",
                case.name
            )),
            (Some(expected), Err(e)) if !e.contains(expected.as_str()) => {
                failures.push(format!("{}: expected {expected:?} in: {e}", case.name));
            }
            _ => {}
        }
        if kind != "TenantCluster" {
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn a_statefulset_gets_a_running_ready_pod() {
    let ns = namespace("statefulset").await;
    let sts: StatefulSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "web"},
        "spec": {
            "serviceName": "web",
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "registry.invalid/web:1"}]}
            }
        }
    }))
    .unwrap();
    Api::<StatefulSet>::namespaced(ns.client.clone(), &ns.name)
        .create(&PostParams::default(), &sts)
        .await
        .expect("the StatefulSet is created");

    let pods = Api::<Pod>::namespaced(ns.client.clone(), &ns.name);
    let pod = eventually(WAIT, || async {
        let pod = pods.get_opt("web-0").await.ok().flatten()?;
        let status = pod.status.as_ref()?;
        let ready = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        (status.phase.as_deref() == Some("Running") && ready).then_some(pod)
    })
    .await
    .expect("the StatefulSet controller creates web-0, the scheduler binds it and kwok runs it");
    assert_eq!(
        pod.spec.and_then(|s| s.node_name).as_deref(),
        Some(tenantplane_testenv::host_cluster::KWOK_NODE)
    );

    let ready = eventually(WAIT, || async {
        let sts = Api::<StatefulSet>::namespaced(ns.client.clone(), &ns.name)
            .get("web")
            .await
            .ok()?;
        (sts.status?.ready_replicas == Some(1)).then_some(())
    })
    .await;
    assert!(ready.is_some(), "the StatefulSet reports one ready replica");
}

#[tokio::test]
async fn deleting_an_owner_lets_the_garbage_collector_delete_its_dependents() {
    let ns = namespace("gc").await;
    let configmaps = Api::<ConfigMap>::namespaced(ns.client.clone(), &ns.name);
    let owner = configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap(),
        )
        .await
        .unwrap();
    let dependent: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "name": "dependent",
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                "uid": owner.metadata.uid.clone().unwrap()
            }]
        }
    }))
    .unwrap();
    configmaps
        .create(&PostParams::default(), &dependent)
        .await
        .unwrap();

    configmaps
        .delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    let gone = eventually(WAIT, || async {
        matches!(configmaps.get_opt("dependent").await, Ok(None)).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "the garbage collector deletes the dependent of a deleted owner"
    );
}
