//! Pod Security at the tenant's door: the tenant API server enforces the IsolationProfile's
//! level itself, so a pod the host would refuse is refused when it is made, with Pod Security's
//! own message, and a Deployment's is warned about and shown as its ReplicaSet's `FailedCreate`,
//! as in any cluster. The operator's add-ons' namespace is exempt; the host still enforces.

use super::*;
use k8s_openapi::api::apps::v1::Deployment;

/// A container that breaks `restricted` (and `baseline`): privileged.
fn privileged(name: &str) -> serde_json::Value {
    let mut c = container(name);
    c["securityContext"] = json!({"privileged": true});
    c
}

#[tokio::test]
async fn a_pod_the_profile_forbids_is_refused_when_made_and_a_deployment_is_warned() {
    let world = TenantSetup::seed().start("iso-podsec").await;
    let tenant = &world.tenant;

    // A pod: refused at create, with Pod Security's message.
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    let bad = pod("root", json!({}), json!({"containers": [privileged("c")]}));
    let refused = pods.create(&PostParams::default(), &bad).await.unwrap_err();
    let kube::Error::Api(status) = refused else {
        panic!("not an API refusal: {refused}")
    };
    assert_eq!(status.code, 403, "{status:?}");
    assert!(
        status
            .message
            .contains("violates PodSecurity \"restricted:latest\"")
            && status.message.contains("privileged"),
        "{}",
        status.message
    );
    // A compliant one is made as before.
    pods.create(&PostParams::default(), &pod("fine", json!({}), json!({})))
        .await
        .unwrap();

    // The add-ons' namespace is exempt (the tenant's own CoreDNS runs there).
    let system: Api<Pod> = Api::namespaced(tenant.clone(), "kube-system");
    let mut exempt = pod(
        "exempt",
        json!({}),
        json!({"containers": [privileged("c")]}),
    );
    exempt.metadata.namespace = Some("kube-system".into());
    system
        .create(&PostParams::default(), &exempt)
        .await
        .unwrap();

    // A Deployment: accepted with Pod Security's warning, its pods refused with an event.
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [privileged("web")]}
            }
        }
    }))
    .unwrap();
    let request = http::Request::post("/apis/apps/v1/namespaces/default/deployments")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&deployment).unwrap())
        .unwrap();
    let response = tenant.send(request.map(Into::into)).await.unwrap();
    assert_eq!(response.status(), 201);
    let warnings: Vec<String> = response
        .headers()
        .get_all("warning")
        .iter()
        .filter_map(|w| w.to_str().ok().map(str::to_string))
        .collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("would violate PodSecurity") && w.contains("restricted:latest")),
        "{warnings:?}"
    );
    let events: Api<Event> = Api::namespaced(tenant.clone(), "default");
    let failed = eventually(WAIT, || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("FailedCreate")
                    && e.involved_object.kind.as_deref() == Some("ReplicaSet")
            })
    })
    .await
    .expect("the ReplicaSet's FailedCreate event");
    assert!(
        failed
            .message
            .as_deref()
            .is_some_and(|m| m.contains("violates PodSecurity \"restricted:latest\"")),
        "{failed:?}"
    );
}
