//! What goes wrong reaches status, with a reason and the words of whoever refused, on the real
//! test control plane: an object the API server refuses, a right the operator lacks, a service
//! range that disagrees with the host's, and a control-plane pod that cannot start.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tenantplane_api::conditions::READY;
use tenantplane_api::{IsolationProfile, Phase, TenantCluster};
use tenantplane_controller::ControllerOptions;
use tenantplane_controller::service_range;
use tenantplane_testenv::{
    TestNamespace, eventually, install_crds_and_policies, kubeconfig, kubectl, namespace, shared,
};

/// The controller alone (no local runtime), as `client`, with `options`.
fn controller(client: Client, options: ControllerOptions) -> tokio::task::JoinHandle<()> {
    tokio::spawn(tenantplane_controller::run(
        client,
        options,
        futures::future::pending(),
    ))
}

#[tokio::test]
async fn an_object_the_api_server_refuses_is_named_in_ready_with_its_words() {
    let world = TestHost::start("rp-refused").await;
    let ns = &world.ns;
    // A resource name that is neither standard nor qualified: admission refuses the LimitRange.
    let profile_name = format!("{}-bad-limits", ns.name);
    profile_allowing(&ns.client, &profile_name, json!({})).await;
    let profiles: Api<IsolationProfile> = Api::all(ns.client.clone());
    profiles
        .patch(
            &profile_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"limitRange": {"default": {"bogus": "1"}}}})),
        )
        .await
        .unwrap();
    let mut tc = example(&ns.name);
    tc.spec.isolation_profile_ref.name = profile_name.clone();
    Api::<TenantCluster>::namespaced(ns.client.clone(), &ns.name)
        .create(&PostParams::default(), &tc)
        .await
        .unwrap();
    let failed = wait_for_ready_reason(&ns.client, &ns.name, "dev", "ApplyFailed").await;
    let ready = condition(&failed, READY);
    eprintln!("Ready: {}", ready.message);
    assert_eq!(ready.status, "False");
    assert_eq!(failed.status.as_ref().unwrap().phase, Some(Phase::Degraded));
    assert!(
        ready
            .message
            .starts_with(&format!("applying LimitRange {}/dev-limits: ", ns.name)),
        "{}",
        ready.message
    );
    assert!(
        ready.message.contains("bogus") && ready.message.contains("standard"),
        "the API server's own words: {}",
        ready.message
    );
    assert!(
        ready.message.contains("(Invalid, 422)"),
        "{}",
        ready.message
    );

    // Fixed in the profile, the tenant goes on to Ready.
    profiles
        .patch(
            &profile_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"limitRange": {"default": {"bogus": null}}}})),
        )
        .await
        .unwrap();
    wait_for_phase(&ns.client, &ns.name, "dev", Phase::Ready).await;
    profiles
        .delete(&profile_name, &Default::default())
        .await
        .unwrap();
}

/// A ServiceAccount with the operator's ClusterRole but without the right to write LimitRanges.
fn limited_operator(ns: &TestNamespace) -> Client {
    // The operator's ClusterRole, as deploy/operator has it.
    tenantplane_testenv::operator::token();
    let role = kubectl(&["get", "clusterrole", "tenantplane", "-o", "json"]).unwrap();
    let mut role: serde_json::Value = serde_json::from_str(&role).unwrap();
    let name = format!("tenantplane-limited-{}", ns.name);
    let mut rules = Vec::new();
    for mut rule in role["rules"].as_array().unwrap().clone() {
        let resources: Vec<String> =
            serde_json::from_value(rule["resources"].clone()).unwrap_or_default();
        if resources.iter().any(|r| r == "limitranges") {
            // LimitRanges may be read (the controller's cache needs it) but not written.
            let mut others = rule.clone();
            others["resources"] = json!(
                resources
                    .iter()
                    .filter(|r| *r != "limitranges")
                    .collect::<Vec<_>>()
            );
            rules.push(others);
            rule["resources"] = json!(["limitranges"]);
            rule["verbs"] = json!(["get", "list", "watch"]);
        }
        rules.push(rule);
    }
    let manifest = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": name, "namespace": ns.name}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": name}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns.name}]},
    ]});
    role = manifest;
    let file = shared().dir().join(format!("{name}.json"));
    std::fs::write(&file, role.to_string()).unwrap();
    kubectl(&["apply", "-f", &file.display().to_string()]).unwrap();
    let token = kubectl(&["create", "token", &name, "-n", &ns.name, "--duration=1h"]).unwrap();
    let config =
        kubeconfig::token_config(shared().server(), &shared().ca_pem().unwrap(), token.trim())
            .unwrap();
    Client::try_from(config).unwrap()
}

#[tokio::test]
async fn a_right_the_operator_lacks_is_named_in_ready() {
    install_crds_and_policies();
    let ns = namespace("rp-rbac").await;
    let client = limited_operator(&ns);
    let _controller = AbortOnDrop(controller(client, options(&ns.name, None)));
    Api::<TenantCluster>::namespaced(ns.client.clone(), &ns.name)
        .create(&PostParams::default(), &example(&ns.name))
        .await
        .unwrap();
    let failed = wait_for_ready_reason(&ns.client, &ns.name, "dev", "ApplyFailed").await;
    let message = &condition(&failed, READY).message;
    eprintln!("Ready: {message}");
    assert!(
        message.starts_with(&format!("applying LimitRange {}/dev-limits: ", ns.name)),
        "{message}"
    );
    assert!(
        message.contains(&format!(
            "system:serviceaccount:{}:tenantplane-limited-{}",
            ns.name, ns.name
        )) && message.contains("limitranges")
            && message.contains("(Forbidden, 403)"),
        "{message}"
    );
}

#[tokio::test]
async fn the_host_names_its_service_range_and_a_wrong_flag_is_a_mismatch_not_a_loop() {
    install_crds_and_policies();
    let ns = namespace("rp-range").await;
    // Both ways of asking give the range the test control plane was started with.
    let range = service_range::discover(&ns.client, &ns.name).await.unwrap();
    assert_eq!(
        range.cidrs,
        [tenantplane_testenv::host_cluster::SERVICE_CIDR]
    );
    assert!(range.source.starts_with("ServiceCIDR "), "{}", range.source);
    let refused = service_range::from_refusal(&ns.client, &ns.name)
        .await
        .unwrap();
    assert_eq!(
        refused.cidrs,
        [tenantplane_testenv::host_cluster::SERVICE_CIDR]
    );

    let mut opts = options(&ns.name, None);
    opts.build.service_cidr = Some("10.200.0.0/16".into());
    let _controller = AbortOnDrop(controller(tenantplane_testenv::operator::client(), opts));
    Api::<TenantCluster>::namespaced(ns.client.clone(), &ns.name)
        .create(&PostParams::default(), &example(&ns.name))
        .await
        .unwrap();
    let failed = wait_for_ready_reason(&ns.client, &ns.name, "dev", "ServiceCIDRMismatch").await;
    let message = &condition(&failed, READY).message;
    eprintln!("Ready: {message}");
    assert!(
        message.contains("--service-cidr is 10.200.0.0/16")
            && message.contains(&format!(
                "set it to {}",
                tenantplane_testenv::host_cluster::SERVICE_CIDR
            )),
        "{message}"
    );
    assert_eq!(failed.status.as_ref().unwrap().phase, Some(Phase::Degraded));
    // Nothing that would allocate from the wrong range is built, and nothing churns.
    let services: Api<Service> = Api::namespaced(ns.client.clone(), &ns.name);
    let before = services.get("dev").await.unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let after = services.get("dev").await.unwrap();
    assert_eq!(
        (before.uid(), before.resource_version()),
        (after.uid(), after.resource_version()),
        "the API Service is left alone"
    );
    let sts = Api::<StatefulSet>::namespaced(ns.client.clone(), &ns.name)
        .get_opt("dev")
        .await
        .unwrap();
    assert!(sts.is_none(), "no control plane on a wrong range");
}

/// Write the pod's status as its kubelet would.
async fn kubelet_says(pods: &Api<Pod>, status: serde_json::Value) {
    pods.patch_status(
        "dev-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_control_plane_pod_that_cannot_start_says_why() {
    install_crds_and_policies();
    let ns = namespace("rp-pod").await;
    // The controller without the local runtime: this test plays the kubelet.
    let _controller = AbortOnDrop(controller(
        tenantplane_testenv::operator::client(),
        options(&ns.name, None),
    ));
    let mut tc = example(&ns.name);
    tc.spec.kubernetes_version = "v1.36.99".into();
    Api::<TenantCluster>::namespaced(ns.client.clone(), &ns.name)
        .create(&PostParams::default(), &tc)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(ns.client.clone(), &ns.name);
    let made = eventually(WAIT, || async { pods.get_opt("dev-0").await.ok()? }).await;
    assert!(made.is_some(), "the StatefulSet makes its pod");
    let image = "rancher/k3s:v1.36.99-k3s1";
    kubelet_says(&pods, json!({"phase": "Pending", "initContainerStatuses": [{
        "name": "pki", "ready": false, "restartCount": 0, "image": image, "imageID": "",
        "state": {"waiting": {"reason": "ImagePullBackOff",
                              "message": format!("Back-off pulling image \"{image}\": not found")}},
    }]}))
    .await;
    let failed = wait_for_ready_reason(&ns.client, &ns.name, "dev", "ImagePullFailed").await;
    let message = &condition(&failed, READY).message;
    eprintln!("Ready: {message}");
    assert!(
        message.contains(&format!("cannot pull image {image}")),
        "{message}"
    );
    assert!(message.contains("kubernetesVersion v1.36.99"), "{message}");
    assert!(
        message.contains("not found"),
        "the kubelet's words: {message}"
    );
    assert_eq!(failed.status.as_ref().unwrap().phase, Some(Phase::Degraded));

    kubelet_says(&pods, json!({"phase": "Pending", "initContainerStatuses": [{
        "name": "pki", "ready": false, "restartCount": 2, "image": image, "imageID": "sha256:1",
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s restarting failed container"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                     "message": "cp: can't create '/var/lib/rancher/k3s/server/tls/x': Permission denied"}},
    }]}))
    .await;
    let failed = wait_for_ready_reason(&ns.client, &ns.name, "dev", "InitContainerFailed").await;
    let message = &condition(&failed, READY).message;
    eprintln!("Ready: {message}");
    assert!(
        message.contains("init container pki failed with exit code 1")
            && message.contains("Permission denied"),
        "{message}"
    );
    let pod = pods.get("dev-0").await.unwrap();
    assert!(pod.name_any() == "dev-0");
}
