//! The syncer against the real parts: the host is the test control plane (its scheduler places
//! the copies, kwok runs them, its Pod Security admission judges them); the tenant is the local
//! runtime's kube-apiserver and kube-controller-manager (its Deployment and ReplicaSet
//! controllers make the pods).

use std::collections::BTreeSet;

mod common;
use common::*;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, Node, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use serde_json::json;
use tenantplane_api::conditions::SYNCED;
use tenantplane_api::{SyncPolicy, TenantCluster};
use tenantplane_syncer::naming;
use tenantplane_testenv::{TestNamespace, dns, eventually, install_crds_and_policies, namespace};

fn deployment(replicas: i32) -> Deployment {
    let mut c = container("web");
    c["envFrom"] = json!([{"secretRef": {"name": "creds"}}]);
    c["volumeMounts"] = json!([{"name": "conf", "mountPath": "/etc/web"}]);
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [c],
                    "volumes": [{"name": "conf", "configMap": {"name": "conf"}}],
                    "terminationGracePeriodSeconds": 1
                }
            }
        }
    }))
    .unwrap()
}

fn config_map(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "data": {"value": value}
    }))
    .unwrap()
}

/// Host pods synced from `tenant`'s `default` namespace (its DNS runs in `kube-system`).
async fn host_pods(host: &Client, ns: &str, tenant: &str) -> Vec<Pod> {
    let selector = format!(
        "{},{}=default",
        naming::synced_selector(tenant),
        naming::LABEL_VIRTUAL_NAMESPACE
    );
    Api::<Pod>::namespaced(host.clone(), ns)
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
}

fn virtual_name(p: &Pod) -> String {
    p.annotations()[naming::ANNOTATION_VIRTUAL_NAME].clone()
}

fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The host form of tenant `dev`'s label key `key`.
fn hk(key: &str) -> String {
    naming::host_label_key("dev", key)
}

/// Wait until the tenant has `n` Running pods labelled `app=web`, each bound to a node, and the
/// host has exactly their copies (of the host's `app=web` copies); returns the tenant pods.
async fn converged(host: &Client, tenant: &Client, ns: &str, name: &str, n: usize) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    let last = std::sync::Mutex::new(String::new());
    let found = eventually(WAIT, || async {
        let t = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .ok()?
            .items;
        let h: Vec<Pod> = host_pods(host, ns, name)
            .await
            .into_iter()
            .filter(|p| {
                p.labels()
                    .get(&naming::host_label_key(name, "app"))
                    .map(String::as_str)
                    == Some("web")
            })
            .collect();
        let t_names: BTreeSet<String> = t.iter().map(|p| p.name_any()).collect();
        let h_names: BTreeSet<String> = h
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(virtual_name)
            .collect();
        *last.lock().unwrap() = format!(
            "tenant {:?} running {}, host {:?} running {}",
            t_names,
            t.iter().filter(|p| running(p)).count(),
            h_names,
            h.iter().filter(|p| running(p)).count()
        );
        let bound = t
            .iter()
            .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some());
        (t.len() == n
            && h.len() == n
            && t_names == h_names
            && t.iter().all(running)
            && h.iter().all(running)
            && bound)
            .then_some(t)
    })
    .await;
    found.unwrap_or_else(|| panic!("never converged to {n} pods: {}", last.lock().unwrap()))
}

async fn synced_condition(host: &Client, ns: &str, name: &str) -> (String, String, String) {
    let tc = Api::<TenantCluster>::namespaced(host.clone(), ns)
        .get(name)
        .await
        .unwrap();
    let c = condition(&tc, SYNCED);
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

/// Wait until `Synced` is True again; whether it did.
async fn synced_again(host: &Client, ns: &str, name: &str) -> bool {
    eventually(WAIT, || async {
        let c = synced_condition(host, ns, name).await;
        (c.0 == "True").then_some(())
    })
    .await
    .is_some()
}

/// A bare pod labelled `app=web` (plus `labels`) in the tenant's `default` namespace.
fn bare_pod(name: &str, labels: serde_json::Value) -> Pod {
    let mut all = json!({"app": "web"});
    if let (Some(all), Some(extra)) = (all.as_object_mut(), labels.as_object()) {
        all.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": all},
        "spec": {"containers": [container("web")]}
    }))
    .unwrap()
}

/// Wait until tenant Service `default/name` of tenant `dev` has its host copy's cluster IP; that
/// address and the tenant Service's UID then.
async fn shared_address(
    host: &Client,
    tenant: &Client,
    ns: &str,
    name: &str,
) -> Option<(String, String)> {
    eventually(WAIT, || async {
        let t = Api::<Service>::namespaced(tenant.clone(), "default")
            .get_opt(name)
            .await
            .ok()??;
        let h = Api::<Service>::namespaced(host.clone(), ns)
            .get_opt(&format!("{name}-x-default-x-dev"))
            .await
            .ok()??;
        let uid = t.uid()?;
        let ip = t.spec?.cluster_ip?;
        (Some(&ip) == h.spec.as_ref().and_then(|h| h.cluster_ip.as_ref())).then_some((ip, uid))
    })
    .await
}

#[tokio::test]
async fn a_deployment_runs_on_the_host_and_everything_converges() {
    let mut world = ReadyTenant::start("sync").await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let pp = PostParams::default();

    // What the pods use, and something they do not.
    let cms: Api<ConfigMap> = Api::namespaced(tenant.clone(), "default");
    cms.create(&pp, &config_map("conf", "one")).await.unwrap();
    cms.create(&pp, &config_map("unused", "x")).await.unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "creds", "namespace": "default"},
        "stringData": {"PASSWORD": "hunter2"}
    }))
    .unwrap();
    Api::<Secret>::namespaced(tenant.clone(), "default")
        .create(&pp, &secret)
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(tenant.clone(), "default");
    deployments.create(&pp, &deployment(3)).await.unwrap();
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80}]}
    }))
    .unwrap();
    Api::<Service>::namespaced(tenant.clone(), "default")
        .create(&pp, &svc)
        .await
        .unwrap();

    // 3 pods in the tenant, 3 copies on the host, Running on both sides, bound to a virtual node.
    let tenant_pods = converged(host, tenant, &ns.name, "dev", 3).await;
    let copies = host_pods(host, &ns.name, "dev").await;
    let api_ip = Api::<Service>::namespaced(host.clone(), &ns.name)
        .get("dev")
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap();
    // The tenant's own `kubernetes` Service has that address too: never the host API server's.
    let kubernetes = eventually(WAIT, || async {
        let svc = Api::<Service>::namespaced(tenant.clone(), "default")
            .get("kubernetes")
            .await
            .ok()?;
        (svc.spec?.cluster_ip.as_deref() == Some(api_ip.as_str())).then_some(())
    })
    .await;
    assert!(
        kubernetes.is_some(),
        "the tenant's kubernetes Service never took {api_ip}"
    );
    for copy in &copies {
        let v = virtual_name(copy);
        assert_eq!(copy.name_any(), format!("{v}-x-default-x-dev"));
        let spec = copy.spec.as_ref().unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some("dev-workloads"),
            "the tenant's own host account, never the namespace's default"
        );
        let t = tenant_pods.iter().find(|p| p.name_any() == v).unwrap();
        assert_eq!(
            copy.annotations()[naming::ANNOTATION_VIRTUAL_UID],
            t.uid().unwrap()
        );
        let env = spec.containers[0].env.clone().unwrap_or_default();
        let host_var = env
            .iter()
            .find(|e| e.name == "KUBERNETES_SERVICE_HOST")
            .unwrap();
        assert_eq!(
            host_var.value.as_deref(),
            Some(api_ip.as_str()),
            "pods reach the tenant API, not the host's"
        );
        assert_eq!(
            t.status.as_ref().unwrap().pod_ip,
            copy.status.as_ref().unwrap().pod_ip,
            "the host pod's IP shows in the tenant"
        );
    }
    let node_name = tenant_pods[0]
        .spec
        .as_ref()
        .unwrap()
        .node_name
        .clone()
        .unwrap();
    let node = Api::<Node>::all(tenant.clone())
        .get(&node_name)
        .await
        .unwrap();
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone());
    assert!(
        taints.as_ref().is_none_or(|t| t.is_empty()),
        "a virtual node carries no taint: {taints:?}"
    );
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "True");

    // Only the ConfigMap and Secret the pods use are on the host; the token is minted by the
    // tenant, kept in a Secret the host pod owns, and the tenant API accepts it.
    let host_cms: Api<ConfigMap> = Api::namespaced(host.clone(), &ns.name);
    let host_secrets: Api<Secret> = Api::namespaced(host.clone(), &ns.name);
    assert!(
        host_cms
            .get_opt("conf-x-default-x-dev")
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        host_cms
            .get_opt("unused-x-default-x-dev")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        host_secrets
            .get_opt("creds-x-default-x-dev")
            .await
            .unwrap()
            .is_some()
    );
    let first = &copies[0];
    let token_secret = host_secrets
        .get(&format!("{}.token", first.name_any()))
        .await
        .unwrap();
    assert_eq!(
        token_secret.owner_references()[0].uid,
        first.uid().unwrap(),
        "owned by the host pod, so it goes with it"
    );
    let token = String::from_utf8(token_secret.data.unwrap()["token-0"].0.clone()).unwrap();
    let review = Api::<TokenReview>::all(tenant.clone())
        .create(
            &pp,
            &TokenReview {
                spec: TokenReviewSpec {
                    token: Some(token),
                    audiences: None,
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let status = review.status.unwrap();
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    assert_eq!(
        status.user.unwrap().username.as_deref(),
        Some("system:serviceaccount:default:default")
    );

    // The tenant Service carries its host copy's cluster IP.
    let ip = shared_address(host, tenant, &ns.name, "web").await;
    assert!(
        ip.is_some(),
        "the tenant Service never took the host's cluster IP"
    );

    // Host Events about the copies show up in the tenant, about the tenant's pods.
    let scheduled = eventually(WAIT, || async {
        let events = Api::<Event>::namespaced(tenant.clone(), "default")
            .list(&ListParams::default())
            .await
            .ok()?;
        events.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("Scheduled")
                && e.involved_object.kind.as_deref() == Some("Pod")
        })
    })
    .await;
    let scheduled = scheduled.expect("no Scheduled event reached the tenant");
    assert!(
        tenant_pods
            .iter()
            .any(|p| p.uid() == scheduled.involved_object.uid),
        "the event is about a tenant pod"
    );
    assert_eq!(synced_condition(host, &ns.name, "dev").await.0, "True");

    // Scale down: copies go with their pods.
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    let left = converged(host, tenant, &ns.name, "dev", 1).await;

    // A hand edit on the host is undone: a label and the ConfigMap's data.
    let host_pods_api: Api<Pod> = Api::namespaced(host.clone(), &ns.name);
    let copy_name = format!("{}-x-default-x-dev", left[0].name_any());
    host_pods_api
        .patch(
            &copy_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {hk("app"): "hijacked"}}})),
        )
        .await
        .unwrap();
    host_cms
        .patch(
            "conf-x-default-x-dev",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"value": "tampered"}})),
        )
        .await
        .unwrap();
    let restored = eventually(WAIT, || async {
        let p = host_pods_api.get(&copy_name).await.ok()?;
        let c = host_cms.get("conf-x-default-x-dev").await.ok()?;
        (p.labels().get(&hk("app")).map(String::as_str) == Some("web")
            && c.data?.get("value").map(String::as_str) == Some("one"))
        .then_some(())
    })
    .await;
    assert!(restored.is_some(), "hand edits on the host were not undone");
    // A tenant edit flows down.
    cms.patch(
        "conf",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"value": "two"}})),
    )
    .await
    .unwrap();
    let updated = eventually(WAIT, || async {
        let c = host_cms.get("conf-x-default-x-dev").await.ok()?;
        (c.data?.get("value").map(String::as_str) == Some("two")).then_some(())
    })
    .await;
    assert!(
        updated.is_some(),
        "a tenant ConfigMap edit did not reach the host"
    );

    // Deleted on the host: the tenant pod goes as on a lost node, and its ReplicaSet makes a
    // new one, which runs on the host again.
    let before = left[0].uid();
    host_pods_api
        .delete(&copy_name, &DeleteParams::default())
        .await
        .unwrap();
    let replaced = eventually(WAIT, || async {
        let t = converged_once(host, tenant, &ns.name, "dev").await?;
        (t.len() == 1 && t[0].uid() != before).then_some(())
    })
    .await;
    assert!(
        replaced.is_some(),
        "the pod deleted on the host was not replaced"
    );

    // An orphan (a copy whose tenant object does not exist) is removed; an object that only
    // carries the marks (written through a template, say) is not the syncer's and stays.
    let tc = Api::<TenantCluster>::namespaced(host.clone(), &ns.name)
        .get("dev")
        .await
        .unwrap();
    host_cms
        .create(&pp, &marked_config_map("ghost", Some(&tc)))
        .await
        .unwrap();
    host_cms
        .create(&pp, &marked_config_map("forged", None))
        .await
        .unwrap();
    let gone = eventually(WAIT, || async {
        host_cms
            .get_opt("ghost-x-default-x-dev")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    assert!(gone.is_some(), "the orphan stayed on the host");
    assert!(
        host_cms
            .get_opt("forged-x-default-x-dev")
            .await
            .unwrap()
            .is_some(),
        "an object with forged marks was taken for a copy"
    );

    // An operator restart mid-sync: objects made while it is down converge once it is back,
    // with no duplicates.
    world.operator.tasks[0].abort();
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    world.operator.restart_controller(ns);
    converged(host, tenant, &ns.name, "dev", 2).await;

    // Deleting the Deployment removes every copy; deleting the tenant leaves nothing synced.
    deployments
        .delete("web", &DeleteParams::foreground())
        .await
        .unwrap();
    let emptied = eventually(WAIT, || async {
        host_pods(host, &ns.name, "dev")
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(emptied.is_some(), "copies outlived their Deployment");
    Api::<TenantCluster>::namespaced(host.clone(), &ns.name)
        .delete("dev", &DeleteParams::foreground())
        .await
        .unwrap();
    let clean = eventually(WAIT, || async {
        let lp = ListParams::default().labels(&naming::synced_selector("dev"));
        let cms = Api::<ConfigMap>::namespaced(host.clone(), &ns.name)
            .list(&lp)
            .await
            .ok()?;
        let secrets = Api::<Secret>::namespaced(host.clone(), &ns.name)
            .list(&lp)
            .await
            .ok()?;
        let services = Api::<Service>::namespaced(host.clone(), &ns.name)
            .list(&lp)
            .await
            .ok()?;
        let pods = host_pods(host, &ns.name, "dev").await;
        (cms.items.is_empty()
            && secrets.items.is_empty()
            && services.items.is_empty()
            && pods.is_empty())
        .then_some(())
    })
    .await;
    assert!(
        clean.is_some(),
        "synced objects outlived their TenantCluster"
    );
    drop(world);
}

/// A host ConfigMap carrying the marks of a copy of tenant ConfigMap `default/<name>` of tenant
/// `dev`, owned by `owner` (a real copy) or by nothing (forged marks).
fn marked_config_map(name: &str, owner: Option<&TenantCluster>) -> ConfigMap {
    let mut cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "name": format!("{name}-x-default-x-dev"),
            "labels": naming::owner_labels("dev", "default", name),
            "annotations": {
                naming::ANNOTATION_TENANT: "dev",
                naming::ANNOTATION_VIRTUAL_NAMESPACE: "default",
                naming::ANNOTATION_VIRTUAL_NAME: name,
                naming::ANNOTATION_VIRTUAL_UID: "nope",
            }
        },
        "data": {"a": "b"}
    }))
    .unwrap();
    if let Some(tc) = owner {
        let uid = tc.uid().unwrap();
        cm.metadata
            .annotations
            .get_or_insert_default()
            .insert(naming::ANNOTATION_TENANT_UID.into(), uid.clone());
        cm.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "tenantplane.io/v1alpha1".into(),
                kind: "TenantCluster".into(),
                name: "dev".into(),
                uid,
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
        ]);
    }
    cm
}

/// The tenant's `app=web` pods once both sides agree, all Running; `None` otherwise.
async fn converged_once(host: &Client, tenant: &Client, ns: &str, name: &str) -> Option<Vec<Pod>> {
    let t = Api::<Pod>::namespaced(tenant.clone(), "default")
        .list(&ListParams::default().labels("app=web"))
        .await
        .ok()?
        .items;
    let h = host_pods(host, ns, name).await;
    let t_names: BTreeSet<String> = t.iter().map(|p| p.name_any()).collect();
    let h_names: BTreeSet<String> = h.iter().map(virtual_name).collect();
    (t_names == h_names && t.iter().all(running) && h.iter().all(running)).then_some(t)
}

/// Pod `default/priv` in the tenant, running as root with no security context: the syncer lets
/// it through, the host's Pod Security (`restricted`) refuses it; the tenant's pods Api.
async fn create_privileged_pod(tenant: &Client) -> Api<Pod> {
    let mut c = container("root");
    c["securityContext"] = json!({"runAsUser": 0});
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "priv", "namespace": "default"},
        "spec": {"containers": [c]}
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods
}

#[tokio::test]
async fn a_privileged_pod_never_runs_and_the_tenant_is_told_why() {
    let world = ReadyTenant::start("sync-psa").await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let pods = create_privileged_pod(tenant).await;

    // The tenant pod says why it does not run, and so does an Event on it.
    let told = eventually(WAIT, || async {
        let p = pods.get("priv").await.ok()?;
        let cond = p
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodScheduled")?;
        (cond.reason.as_deref() == Some("HostRejected")).then_some(cond.message?)
    })
    .await
    .expect("the tenant pod never said the host refused it");
    assert!(told.contains("restricted"), "{told}");
    let event = eventually(WAIT, || async {
        Api::<Event>::namespaced(tenant.clone(), "default")
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("HostRejected")
                    && e.involved_object.name.as_deref() == Some("priv")
            })
    })
    .await;
    assert!(event.is_some(), "no HostRejected Event on the tenant pod");
    // The TenantCluster names the pod and the reason.
    let (status, _, message) = eventually(WAIT, || async {
        let c = synced_condition(host, &ns.name, "dev").await;
        (c.1 == "HostRejected").then_some(c)
    })
    .await
    .expect("Synced never said HostRejected");
    assert_eq!(status, "False");
    assert!(
        message.starts_with("Pod default/priv: the host refused it"),
        "{message}"
    );
    assert!(host_pods(host, &ns.name, "dev").await.is_empty());

    // Deleting the pod clears the condition.
    pods.delete("priv", &DeleteParams::default()).await.unwrap();
    let healed = synced_again(host, &ns.name, "dev").await;
    assert!(healed, "Synced stayed False after the pod went");
}

#[tokio::test]
async fn two_tenants_with_the_same_pod_never_collide() {
    install_crds_and_policies();
    // One tenant per namespace: each has its operator here, as a namespaced install would.
    let (a, b) = (namespace("sync-two").await, namespace("sync-two").await);
    let _operators = (start_operator(&a), start_operator(&b));
    let host = a.client.clone();
    let spaces = [(&a, "alpha"), (&b, "beta")];
    for (ns, name) in spaces {
        create_ready(&host, &tenant_named(&ns.name, name)).await;
    }
    let mut uids = Vec::new();
    for (ns, name) in spaces {
        let tenant = tenant_client(&host, &ns.name, name).await;
        let pod = bare_pod("web", json!({}));
        let created = Api::<Pod>::namespaced(tenant.clone(), "default")
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        uids.push((ns, name, tenant, created.uid().unwrap()));
    }
    for (ns, name, tenant, uid) in &uids {
        let pods = converged(&host, tenant, &ns.name, name, 1).await;
        assert_eq!(pods[0].uid().as_ref(), Some(uid));
        let copies = host_pods(&host, &ns.name, name).await;
        assert_eq!(copies.len(), 1);
        assert_eq!(copies[0].name_any(), format!("web-x-default-x-{name}"));
        assert_eq!(
            &copies[0].annotations()[naming::ANNOTATION_VIRTUAL_UID],
            uid
        );
    }
}

#[tokio::test]
async fn the_syncer_resumes_when_the_tenant_api_server_returns() {
    let world = ReadyTenant::start("sync-outage").await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let operator = &world.operator;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    let pod = |name: &str| bare_pod(name, json!({}));
    pods.create(&PostParams::default(), &pod("before"))
        .await
        .unwrap();
    converged(host, tenant, &ns.name, "dev", 1).await;

    // The tenant API server goes away; meanwhile the copy is deleted on the host.
    assert!(operator.runtime.crash_api_server(&ns.name, "dev-0"));
    Api::<Pod>::namespaced(host.clone(), &ns.name)
        .delete("before-x-default-x-dev", &DeleteParams::default())
        .await
        .unwrap();
    let back = eventually(WAIT, || async {
        pods.list(&ListParams::default()).await.ok()
    })
    .await;
    assert!(back.is_some(), "the tenant API server never came back");

    // Once it is back, the syncer carries on: the lost pod is gone from the tenant too, and a new
    // pod runs on the host.
    pods.create(&PostParams::default(), &pod("after"))
        .await
        .unwrap();
    let t = converged(host, tenant, &ns.name, "dev", 1).await;
    assert_eq!(t[0].name_any(), "after");
    let healed = synced_again(host, &ns.name, "dev").await;
    assert!(healed, "Synced did not return to True");
}

#[tokio::test]
async fn the_readme_example_workload_runs_in_a_tenant() {
    let world = ReadyTenant::start("sync-example").await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let text = std::fs::read_to_string(tenantplane_testenv::repo_path(
        "examples/tenant-workload.yaml",
    ))
    .unwrap();
    let pp = PostParams::default();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_json::to_value(serde_yaml::Value::deserialize(doc).unwrap()).unwrap();
        match value["kind"].as_str().unwrap() {
            "ConfigMap" => drop(
                Api::<ConfigMap>::namespaced(tenant.clone(), "default")
                    .create(&pp, &serde_json::from_value(value).unwrap())
                    .await
                    .unwrap(),
            ),
            "Deployment" => drop(
                Api::<Deployment>::namespaced(tenant.clone(), "default")
                    .create(&pp, &serde_json::from_value(value).unwrap())
                    .await
                    .unwrap(),
            ),
            "Service" => drop(
                Api::<Service>::namespaced(tenant.clone(), "default")
                    .create(&pp, &serde_json::from_value(value).unwrap())
                    .await
                    .unwrap(),
            ),
            other => panic!("the example has a {other}; teach this test about it"),
        }
    }
    converged(host, tenant, &ns.name, "dev", 3).await;
    assert!(
        Api::<ConfigMap>::namespaced(host.clone(), &ns.name)
            .get_opt("web-config-x-default-x-dev")
            .await
            .unwrap()
            .is_some()
    );
}

/// Delete the tenant made with a SyncPolicy of its own ([`TenantSetup::sync_policy`]), wait until
/// it is gone, then its policy.
async fn delete_tenant_and_policy(ns: &TestNamespace, policy: &str) {
    let tenants = Api::<TenantCluster>::namespaced(ns.client.clone(), &ns.name);
    tenants
        .delete("dev", &DeleteParams::default())
        .await
        .unwrap();
    let gone = eventually(WAIT, || async {
        let tcs = tenants.list(&ListParams::default()).await.ok()?;
        tcs.items.is_empty().then_some(())
    })
    .await;
    assert!(gone.is_some(), "the TenantCluster never went");
    Api::<SyncPolicy>::all(ns.client.clone())
        .delete(policy, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_policy_picks_what_syncs_selectors_accounts_and_classes() {
    // Only pods labelled sync=yes go down; ServiceAccounts go down; StorageClasses come up.
    let world = TenantSetup::seed()
        .sync_policy(json!({
            "toHost": {
                "pods": {"enabled": true, "selector": {"matchLabels": {"sync": "yes"}}},
                "serviceAccounts": {"enabled": true}
            },
            "fromHost": {"storageClasses": {"enabled": true}}
        }))
        .start("sync-policy")
        .await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let policy_name = world.sync_policy.clone().unwrap();

    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    for (name, sync) in [("kept", "yes"), ("skipped", "no")] {
        let pod = bare_pod(name, json!({"sync": sync}));
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let account: ServiceAccount = serde_json::from_value(json!({
        "metadata": {"name": "builder", "namespace": "default"}
    }))
    .unwrap();
    Api::<ServiceAccount>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &account)
        .await
        .unwrap();

    let seen = eventually(WAIT, || async {
        let copies = host_pods(host, &ns.name, "dev").await;
        let account = Api::<ServiceAccount>::namespaced(host.clone(), &ns.name)
            .get_opt("builder-x-default-x-dev")
            .await
            .ok()??;
        let class = Api::<StorageClass>::all(tenant.clone())
            .get_opt("standard")
            .await
            .ok()??;
        let kept = pods.get("kept").await.ok()?;
        (copies.len() == 1 && running(&kept)).then_some((copies, account, class))
    })
    .await;
    let (copies, account, class) = seen.expect("the policy's selection never synced");
    assert_eq!(virtual_name(&copies[0]), "kept");
    assert_eq!(account.automount_service_account_token, Some(false));
    assert_eq!(class.labels()[naming::LABEL_SYNCED_FROM], "dev");
    let skipped = pods.get("skipped").await.unwrap();
    assert!(
        skipped.spec.unwrap().node_name.is_none(),
        "a pod the selector leaves out is not run"
    );
    delete_tenant_and_policy(ns, &policy_name).await;
}

#[tokio::test]
async fn an_ingress_goes_down_with_its_tls_secret_and_its_address_comes_back() {
    let world = TestHost::start("sync-ingress").await;
    let (ns, host) = (&world.ns, &world.host);
    // A host IngressClass the tenant is shown; Ingresses go down.
    let class_name = format!("{}-nginx", ns.name);
    let class: IngressClass = serde_json::from_value(json!({
        "metadata": {"name": class_name},
        "spec": {"controller": "example.org/ingress"}
    }))
    .unwrap();
    let classes: Api<IngressClass> = Api::all(host.clone());
    classes
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let tenant = TenantSetup::seed()
        .sync_policy(json!({
            "toHost": {"ingresses": {"enabled": true}},
            "fromHost": {"ingressClasses": {"enabled": true}}
        }))
        .allow(json!({"ingressClasses": [class_name], "ingressHosts": ["*.example.org"]}))
        .ready_in(ns)
        .await;
    let policy_name = format!("{}-policy", ns.name);

    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}
    }))
    .unwrap();
    Api::<Service>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    let tls: Secret = serde_json::from_value(json!({
        "metadata": {"name": "web-tls", "namespace": "default"},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": "not checked here", "tls.key": "not checked here"}
    }))
    .unwrap();
    Api::<Secret>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &tls)
        .await
        .unwrap();
    let ingress: Ingress = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default",
                     "annotations": {"nginx.ingress.kubernetes.io/configuration-snippet": "return 200;"}},
        "spec": {
            "ingressClassName": class_name,
            "tls": [{"hosts": ["web.example.org"], "secretName": "web-tls"}],
            "rules": [{"host": "web.example.org", "http": {"paths": [{
                "path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": "web", "port": {"number": 80}}}
            }]}}]
        }
    }))
    .unwrap();
    let t_ingresses: Api<Ingress> = Api::namespaced(tenant.clone(), "default");
    t_ingresses
        .create(&PostParams::default(), &ingress)
        .await
        .unwrap();

    // The copy points at the Service's and the Secret's copies, without the snippet; the tenant
    // sees the host's class.
    let h_ingresses: Api<Ingress> = Api::namespaced(host.clone(), &ns.name);
    let copy_name = "web-x-default-x-dev";
    let seen = eventually(WAIT, || async {
        let copy = h_ingresses.get_opt(copy_name).await.ok()??;
        Api::<Secret>::namespaced(host.clone(), &ns.name)
            .get_opt("web-tls-x-default-x-dev")
            .await
            .ok()??;
        Api::<IngressClass>::all(tenant.clone())
            .get_opt(&class_name)
            .await
            .ok()??;
        Some(copy)
    })
    .await
    .expect("the Ingress, its TLS Secret and the class never synced");
    let spec = seen.spec.clone().unwrap();
    assert_eq!(
        spec.ingress_class_name.as_deref(),
        Some(class_name.as_str())
    );
    let backend = &spec.rules.as_ref().unwrap()[0].http.as_ref().unwrap().paths[0].backend;
    assert_eq!(
        backend.service.as_ref().unwrap().name,
        "web-x-default-x-dev"
    );
    assert_eq!(
        spec.tls.as_ref().unwrap()[0].secret_name.as_deref(),
        Some("web-tls-x-default-x-dev")
    );
    assert!(
        seen.annotations().keys().all(|k| !k.contains("snippet")),
        "{:?}",
        seen.annotations()
    );

    // The host's ingress controller publishes an address; the tenant's Ingress shows it.
    h_ingresses
        .patch_status(
            copy_name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}}),
            ),
        )
        .await
        .unwrap();
    let address = eventually(WAIT, || async {
        let t = t_ingresses.get("web").await.ok()?;
        t.status?.load_balancer?.ingress?.first()?.ip.clone()
    })
    .await;
    assert_eq!(address.as_deref(), Some("203.0.113.10"));

    // Deleted in the tenant, gone from the host.
    t_ingresses
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let gone = eventually(WAIT, || async {
        h_ingresses
            .get_opt(copy_name)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "the Ingress copy outlived the tenant's Ingress"
    );
    Api::<TenantCluster>::namespaced(host.clone(), &ns.name)
        .delete("dev", &DeleteParams::default())
        .await
        .unwrap();
    Api::<SyncPolicy>::all(host.clone())
        .delete(&policy_name, &DeleteParams::default())
        .await
        .unwrap();
    classes
        .delete(&class_name, &DeleteParams::default())
        .await
        .unwrap();
}

/// Write requests in the host's audit log for `resource` `namespace/name` that the API server
/// refused with `code`.
fn refused_writes(namespace: &str, resource: &str, name: &str, code: i64) -> usize {
    let text =
        std::fs::read_to_string(tenantplane_testenv::shared().audit_log_path()).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| {
            e["objectRef"]["namespace"] == namespace
                && e["objectRef"]["resource"] == resource
                && e["objectRef"]["name"] == name
                && matches!(e["verb"].as_str(), Some("create" | "patch" | "update"))
                && e["responseStatus"]["code"] == code
        })
        .count()
}

#[tokio::test]
async fn removals_reach_the_host_copies_and_forged_copies_are_left_alone() {
    let world = ReadyTenant::start("sync-removals").await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let pp = PostParams::default();
    let cms: Api<ConfigMap> = Api::namespaced(tenant.clone(), "default");
    let mut conf = config_map("conf", "one");
    conf.data
        .get_or_insert_default()
        .insert("extra".into(), "two".into());
    conf.metadata.labels = Some(
        [("team", "a"), ("env", "x")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    cms.create(&pp, &conf).await.unwrap();
    let mut pod = bare_pod("web", json!({"tier": "front"}));
    let spec = pod.spec.as_mut().unwrap();
    spec.volumes = Some(vec![
        serde_json::from_value(json!({"name": "conf", "configMap": {"name": "conf"}})).unwrap(),
    ]);
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    pods.create(&pp, &pod).await.unwrap();
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"app": "web", "tier": "front"}, "ports": [{"port": 80}]}
    }))
    .unwrap();
    let services: Api<Service> = Api::namespaced(tenant.clone(), "default");
    services.create(&pp, &svc).await.unwrap();
    converged(host, tenant, &ns.name, "dev", 1).await;
    let before = host_pods(host, &ns.name, "dev").await[0].uid();

    // A host pod and ConfigMap that carry dev's marks but that the syncer did not make.
    let h_pods: Api<Pod> = Api::namespaced(host.clone(), &ns.name);
    let h_cms: Api<ConfigMap> = Api::namespaced(host.clone(), &ns.name);
    let forged_cm = marked_config_map("forged", None);
    h_cms.create(&pp, &forged_cm).await.unwrap();
    let forged_pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": "impostor-x-default-x-dev",
            "labels": forged_cm.metadata.labels,
            "annotations": {
                naming::ANNOTATION_TENANT: "dev",
                naming::ANNOTATION_VIRTUAL_NAMESPACE: "default",
                naming::ANNOTATION_VIRTUAL_NAME: "impostor",
                naming::ANNOTATION_VIRTUAL_UID: "nope",
            }
        },
        "spec": {"containers": [container("web")]}
    }))
    .unwrap();
    h_pods.create(&pp, &forged_pod).await.unwrap();

    // The tenant takes a key out of the ConfigMap, a label off it and off the pod, and a term
    // out of the Service's selector.
    let merge = |v: serde_json::Value| Patch::Merge(v);
    cms.patch(
        "conf",
        &PatchParams::default(),
        &merge(json!({"data": {"extra": null}, "metadata": {"labels": {"env": null}}})),
    )
    .await
    .unwrap();
    pods.patch(
        "web",
        &PatchParams::default(),
        &merge(json!({"metadata": {"labels": {"tier": null}}})),
    )
    .await
    .unwrap();
    services
        .patch(
            "web",
            &PatchParams::default(),
            &merge(json!({"spec": {"selector": {"tier": null}}})),
        )
        .await
        .unwrap();
    let h_services: Api<Service> = Api::namespaced(host.clone(), &ns.name);
    let last = std::sync::Mutex::new(String::new());
    let removed = eventually(WAIT, || async {
        let cm = h_cms.get("conf-x-default-x-dev").await.ok()?;
        let p = h_pods.get("web-x-default-x-dev").await.ok()?;
        let s = h_services.get("web-x-default-x-dev").await.ok()?;
        let data = cm.data.clone().unwrap_or_default();
        let selector = s.spec.clone()?.selector.unwrap_or_default();
        *last.lock().unwrap() = format!(
            "ConfigMap data {:?} labels {:?}; pod labels {:?}; selector {:?}",
            data.keys().collect::<Vec<_>>(),
            cm.labels(),
            p.labels(),
            selector
        );
        (!data.contains_key("extra")
            && data.contains_key("value")
            && !cm.labels().contains_key(&hk("env"))
            && cm.labels().contains_key(&hk("team"))
            && !p.labels().contains_key(&hk("tier"))
            && p.labels().get(&hk("app")).map(String::as_str) == Some("web")
            && !selector.contains_key(&hk("tier"))
            && selector.contains_key(&hk("app")))
        .then_some(p)
    })
    .await;
    let p = removed.unwrap_or_else(|| {
        panic!(
            "the removals never reached the host: {}",
            last.lock().unwrap()
        )
    });
    assert_eq!(p.uid(), before, "the pod copy was changed in place");
    assert!(
        synced_again(host, &ns.name, "dev").await,
        "Synced did not stay True"
    );
    // The forged objects are still there: no syncer took them for copies.
    assert!(
        h_cms
            .get_opt("forged-x-default-x-dev")
            .await
            .unwrap()
            .is_some()
    );
    let impostor = h_pods.get_opt("impostor-x-default-x-dev").await.unwrap();
    assert!(
        impostor.is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
        "a pod with forged marks was deleted"
    );
}

#[tokio::test]
async fn a_pod_the_host_refuses_backs_off() {
    let world = ReadyTenant::start("sync-backoff").await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    create_privileged_pod(tenant).await;
    let copy = "priv-x-default-x-dev";
    let first = eventually(WAIT, || async {
        (refused_writes(&ns.name, "pods", copy, 403) > 0).then_some(())
    })
    .await;
    assert!(first.is_some(), "the host never refused the copy");
    let started = std::time::Instant::now();
    let window = std::time::Duration::from_secs(300);
    tokio::time::sleep(window).await;
    let attempts = refused_writes(&ns.name, "pods", copy, 403);
    println!(
        "refused creates of one pod in {:?}: {attempts}",
        started.elapsed()
    );
    assert!(
        (2..=6).contains(&attempts),
        "{attempts} host create attempts in 5 minutes (1 refused pod)"
    );
    let (status, reason, _) = synced_condition(host, &ns.name, "dev").await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "HostRejected")
    );
}

/// A Deployment of pods as people write them (no resource requests: the host's LimitRange makes
/// the copies Burstable, while the tenant pods stay BestEffort) and a Job, in the tenant.
/// Deployment `default/web` as people write it: no resource requests.
fn plain_deployment(replicas: i32) -> serde_json::Value {
    let mut c = container("web");
    c.as_object_mut().unwrap().remove("resources");
    json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [c]}}
        }
    })
}

#[tokio::test]
async fn a_plain_deployment_runs_and_a_job_completes() {
    let world = ReadyTenant::start("sync-workloads").await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let pp = PostParams::default();
    Api::<Deployment>::namespaced(tenant.clone(), "default")
        .create(&pp, &serde_json::from_value(plain_deployment(2)).unwrap())
        .await
        .unwrap();
    let mut once = container("once");
    once.as_object_mut().unwrap().remove("resources");
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "once", "namespace": "default"},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "containers": [once]
        }}}
    }))
    .unwrap();
    let jobs: Api<Job> = Api::namespaced(tenant.clone(), "default");
    jobs.create(&pp, &job).await.unwrap();

    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(tenant.clone(), "default")
        .create(&pp, &claim)
        .await
        .unwrap();
    let pods = converged(host, tenant, &ns.name, "dev", 2).await;
    let copied = eventually(WAIT, || async {
        Api::<PersistentVolumeClaim>::namespaced(host.clone(), &ns.name)
            .get_opt("data-x-default-x-dev")
            .await
            .ok()?
    })
    .await;
    assert!(copied.is_some(), "the claim never reached the host");
    for p in &pods {
        assert_eq!(
            p.status.as_ref().unwrap().qos_class.as_deref(),
            Some("BestEffort"),
            "the tenant's own class stays"
        );
    }
    let copy = Api::<Pod>::namespaced(host.clone(), &ns.name)
        .get(&format!("{}-x-default-x-dev", pods[0].name_any()))
        .await
        .unwrap();
    assert_eq!(
        copy.status.unwrap().qos_class.as_deref(),
        Some("Burstable"),
        "the host's LimitRange gave the copy requests"
    );
    let last = std::sync::Mutex::new(String::new());
    let complete = eventually(WAIT, || async {
        let j = jobs.get("once").await.ok()?;
        let status = j.status?;
        *last.lock().unwrap() = format!(
            "succeeded {:?}, failed {:?}, conditions {:?}",
            status.succeeded,
            status.failed,
            status
                .conditions
                .iter()
                .flatten()
                .map(|c| (c.type_.clone(), c.status.clone()))
                .collect::<Vec<_>>()
        );
        status
            .conditions?
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True")
            .then_some(())
    })
    .await;
    assert!(
        complete.is_some(),
        "the Job never completed: {}",
        last.lock().unwrap()
    );
    let (status, reason, message) = synced_condition(host, &ns.name, "dev").await;
    assert_eq!(status, "True", "{reason}: {message}");
}

#[tokio::test]
async fn in_all_mode_the_tenant_sees_schedulable_nodes_before_any_pod_runs() {
    let world = TenantSetup::seed()
        .sync_policy(json!({"fromHost": {"nodes": {"enabled": true, "mode": "all"}}}))
        .start("sync-nodes")
        .await;
    let (ns, tenant) = (&world.ns, &world.tenant);
    let policy_name = world.sync_policy.clone().unwrap();
    let nodes: Api<Node> = Api::all(tenant.clone());
    let last = std::sync::Mutex::new(String::new());
    let node = eventually(WAIT, || async {
        let node = nodes
            .get_opt(tenantplane_testenv::control_plane::KWOK_NODE)
            .await
            .ok()??;
        let ready = node
            .status
            .as_ref()?
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        *last.lock().unwrap() = format!("ready {ready}, taints {taints:?}");
        (ready && taints.is_empty()).then_some(node)
    })
    .await;
    let node = node.unwrap_or_else(|| {
        panic!(
            "the tenant never saw a schedulable Ready node: {}",
            last.lock().unwrap()
        )
    });
    assert_eq!(node.labels()[naming::LABEL_SYNCED_FROM], "dev");
    let pods = Api::<Pod>::namespaced(tenant.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(pods.items.is_empty(), "no pod runs in the tenant");
    delete_tenant_and_policy(ns, &policy_name).await;
}

#[tokio::test]
async fn the_tenant_gets_a_cluster_dns_and_synced_pods_resolve_through_it() {
    let world = ReadyTenant::start("sync-dns").await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let operator = &world.operator;
    // CoreDNS in the tenant's kube-system, its Service at its host copy's address, and its pod
    // admitted by the host under `restricted` and Running there.
    let last = std::sync::Mutex::new(String::new());
    let dns_ip = eventually(WAIT, || async {
        Api::<Deployment>::namespaced(tenant.clone(), "kube-system")
            .get_opt("coredns")
            .await
            .ok()??;
        let t = Api::<Service>::namespaced(tenant.clone(), "kube-system")
            .get_opt("kube-dns")
            .await
            .ok()??;
        let h = Api::<Service>::namespaced(host.clone(), &ns.name)
            .get_opt("kube-dns-x-kube-system-x-dev")
            .await
            .ok()??;
        let t_ip = t.spec?.cluster_ip?;
        let h_ip = h.spec?.cluster_ip?;
        let copies = Api::<Pod>::namespaced(host.clone(), &ns.name)
            .list(&ListParams::default().labels(&format!("{}=kube-dns", hk("k8s-app"))))
            .await
            .ok()?;
        *last.lock().unwrap() = format!(
            "tenant {t_ip}, host {h_ip}, copies running {}",
            copies.items.iter().filter(|p| running(p)).count()
        );
        (t_ip == h_ip && copies.items.iter().any(running)).then_some(t_ip)
    })
    .await
    .unwrap_or_else(|| panic!("the tenant's DNS never ran: {}", last.lock().unwrap()));
    Api::<Pod>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &bare_pod("after", json!({})))
        .await
        .unwrap();
    let copy = eventually(WAIT, || async {
        Api::<Pod>::namespaced(host.clone(), &ns.name)
            .get_opt("after-x-default-x-dev")
            .await
            .ok()?
    })
    .await
    .expect("the pod was never copied");
    let spec = copy.spec.unwrap();
    assert_eq!(spec.dns_policy.as_deref(), Some("None"));
    let config = spec.dns_config.unwrap();
    assert_eq!(config.nameservers.unwrap(), [dns_ip]);
    let searches = config.searches.unwrap();
    assert_eq!(searches[0], "default.svc.cluster.local");

    // A real lookup: the test control plane's CoreDNS runs the copy's Corefile with its token
    // (the local runtime stands in for the kubelet), and answers as a synced pod would be.
    Api::<Service>::namespaced(tenant.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let (web_ip, _) = shared_address(host, tenant, &ns.name, "web")
        .await
        .expect("the tenant Service never took its copy's address");
    let api_ip = Api::<Service>::namespaced(host.clone(), &ns.name)
        .get("dev")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.cluster_ip)
        .unwrap();
    let last = std::sync::Mutex::new(String::new());
    let resolve = |name: &'static str| {
        let (runtime, searches, last, ns) = (&operator.runtime, &searches, &last, &ns.name);
        async move {
            let server = runtime.dns_address(ns, "dev")?;
            // A pod's resolver: a name with fewer dots than ndots (5) tries the searches first.
            for candidate in searches.iter().map(|s| format!("{name}.{s}")) {
                match dns::lookup_a(server, &candidate).await {
                    Ok(a) if a.rcode == 0 && !a.addresses.is_empty() => {
                        return Some(
                            a.addresses
                                .iter()
                                .map(|a| a.to_string())
                                .collect::<Vec<_>>(),
                        );
                    }
                    Ok(a) => *last.lock().unwrap() = format!("{candidate}: {a:?}"),
                    Err(e) => *last.lock().unwrap() = format!("{candidate}: {e}"),
                }
            }
            None
        }
    };
    let web = eventually(WAIT, || resolve("web")).await;
    assert_eq!(
        web,
        Some(vec![web_ip.clone()]),
        "web did not resolve: {}\nCoreDNS:\n{}",
        last.lock().unwrap(),
        operator.runtime.dns_log(&ns.name, "dev")
    );
    for name in ["web.default", "web.default.svc"] {
        assert_eq!(resolve(name).await, Some(vec![web_ip.clone()]), "{name}");
    }
    // The tenant API, by each of the names a client in a pod uses.
    for name in ["kubernetes", "kubernetes.default", "kubernetes.default.svc"] {
        assert_eq!(resolve(name).await, Some(vec![api_ip.clone()]), "{name}");
    }
    let server = operator.runtime.dns_address(&ns.name, "dev").unwrap();
    let missing = dns::lookup_a(server, "nothing.default.svc.cluster.local")
        .await
        .unwrap();
    assert_eq!(
        missing.rcode, 3,
        "a missing Service is NXDOMAIN: {missing:?}"
    );
    let fqdn = dns::lookup_a(server, "web.default.svc.cluster.local.")
        .await
        .unwrap();
    assert_eq!(
        fqdn.addresses
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>(),
        [web_ip]
    );
    assert!(synced_again(host, &ns.name, "dev").await);
}

/// The tenant pod's status field by field, as `pod_status_up` brings it: what a user reads.
fn status_view(p: &Pod) -> serde_json::Value {
    let s = p.status.clone().unwrap_or_default();
    let containers = |c: &Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>| {
        c.iter()
            .flatten()
            .map(|c| {
                json!({"name": c.name, "ready": c.ready, "restarts": c.restart_count,
                       "state": c.state, "started": c.started})
            })
            .collect::<Vec<_>>()
    };
    let mut conditions: Vec<(String, String)> = s
        .conditions
        .iter()
        .flatten()
        .map(|c| (c.type_.clone(), c.status.clone()))
        .collect();
    conditions.sort();
    json!({
        // Not hostIP: the tenant's is its virtual Node's address, never the host node's.
        "phase": s.phase, "podIP": s.pod_ip,
        "containers": containers(&s.container_statuses),
        "init": containers(&s.init_container_statuses),
        "conditions": conditions,
    })
}

#[tokio::test]
async fn a_pod_with_init_and_several_containers_shows_the_host_status_as_it_changes() {
    let world = ReadyTenant::start("sync-status").await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "multi", "namespace": "default", "labels": {"app": "web"}},
        "spec": {
            "initContainers": [container("setup")],
            "containers": [container("web"), container("sidecar")],
            "terminationGracePeriodSeconds": 30
        }
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    pods.create(&PostParams::default(), &pod).await.unwrap();
    converged(host, tenant, &ns.name, "dev", 1).await;
    let h_pods: Api<Pod> = Api::namespaced(host.clone(), &ns.name);
    let copy = "multi-x-default-x-dev";
    let same = || async {
        let t = pods.get("multi").await.ok()?;
        let h = h_pods.get(copy).await.ok()?;
        (status_view(&t) == status_view(&h)).then_some(t)
    };
    let t = eventually(WAIT, same)
        .await
        .expect("the tenant pod never showed the host's status");
    let s = t.status.unwrap();
    assert_eq!(s.container_statuses.unwrap().len(), 2);
    assert_eq!(s.init_container_statuses.unwrap().len(), 1);

    // The host's kubelet reports a container not ready, then restarted: the tenant follows.
    let live = h_pods.get(copy).await.unwrap();
    let mut statuses = live.status.clone().unwrap().container_statuses.unwrap();
    statuses[1].ready = false;
    statuses[1].restart_count = 1;
    let conditions: Vec<serde_json::Value> = live
        .status
        .clone()
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| {
            let down = c.type_ == "Ready" || c.type_ == "ContainersReady";
            json!({"type": c.type_, "status": if down { "False" } else { c.status.as_str() },
                   "lastTransitionTime": c.last_transition_time})
        })
        .collect();
    h_pods
        .patch_status(
            copy,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"containerStatuses": statuses, "conditions": conditions}}),
            ),
        )
        .await
        .unwrap();
    let followed = eventually(WAIT, || async {
        let t = same().await?;
        let s = t.status?;
        let ready = s.conditions?.into_iter().find(|c| c.type_ == "Ready")?;
        let restarts = s
            .container_statuses?
            .iter()
            .map(|c| c.restart_count)
            .sum::<i32>();
        (ready.status == "False" && restarts == 1).then_some(())
    })
    .await;
    assert!(
        followed.is_some(),
        "the tenant pod did not follow the host's readiness and restarts"
    );

    // Deleted in the tenant with its grace period: both sides go.
    pods.delete("multi", &DeleteParams::default())
        .await
        .unwrap();
    let gone = eventually(WAIT, || async {
        let t = pods.get_opt("multi").await.ok()?;
        let h = h_pods.get_opt(copy).await.ok()?;
        (t.is_none() && h.is_none()).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the pod and its copy did not go");
    assert!(synced_again(host, &ns.name, "dev").await);
}

#[tokio::test]
async fn a_daemonset_runs_a_pod_on_every_node_and_a_statefulset_claim_binds() {
    let world = TestHost::start("sync-sets").await;
    let (ns, host) = (&world.ns, &world.host);
    // A host volume for the StatefulSet's claim, of a class only this test uses.
    let class = format!("{}-manual", ns.name);
    let pv: k8s_openapi::api::core::v1::PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": format!("{}-pv", ns.name)},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "storageClassName": class, "hostPath": {"path": "/tmp/unused"}}
    }))
    .unwrap();
    let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(host.clone());
    pvs.create(&PostParams::default(), &pv).await.unwrap();
    let tenant = TenantSetup::seed()
        .sync_policy(json!({"fromHost": {"nodes": {"enabled": true, "mode": "all"}}}))
        .allow(json!({"storageClasses": [class]}))
        .ready_in(ns)
        .await;
    let policy_name = format!("{}-policy", ns.name);
    let pp = PostParams::default();
    let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "agent", "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {"metadata": {"labels": {"app": "agent"}},
                         "spec": {"containers": [container("agent")]}}
        }
    }))
    .unwrap();
    let daemonsets: Api<k8s_openapi::api::apps::v1::DaemonSet> =
        Api::namespaced(tenant.clone(), "default");
    daemonsets.create(&pp, &ds).await.unwrap();
    let sts: k8s_openapi::api::apps::v1::StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {
            "serviceName": "db", "replicas": 1,
            "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}}, "spec": {
                "containers": [{
                    "name": "db", "image": "registry.example/db:1",
                    "securityContext": container("db")["securityContext"],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]
                }]
            }},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": class,
                "resources": {"requests": {"storage": "1Gi"}}
            }}]
        }
    }))
    .unwrap();
    Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(tenant.clone(), "default")
        .create(&pp, &sts)
        .await
        .unwrap();

    let last = std::sync::Mutex::new(String::new());
    let ready = eventually(WAIT, || async {
        let d = daemonsets.get("agent").await.ok()?.status?;
        let claim = Api::<PersistentVolumeClaim>::namespaced(tenant.clone(), "default")
            .get_opt("data-db-0")
            .await
            .ok()??;
        let db = Api::<Pod>::namespaced(tenant.clone(), "default")
            .get_opt("db-0")
            .await
            .ok()??;
        let phase = claim.status.and_then(|s| s.phase);
        *last.lock().unwrap() = format!(
            "daemonset {}/{} ready; claim {phase:?}; db-0 {:?}",
            d.number_ready,
            d.desired_number_scheduled,
            db.status.as_ref().and_then(|s| s.phase.clone())
        );
        (d.desired_number_scheduled >= 1
            && d.number_ready == d.desired_number_scheduled
            && phase.as_deref() == Some("Bound")
            && running(&db))
        .then_some(())
    })
    .await;
    assert!(
        ready.is_some(),
        "the DaemonSet or the StatefulSet never ran: {}",
        last.lock().unwrap()
    );
    delete_tenant_and_policy(ns, &policy_name).await;
    let _ = pvs
        .delete(&format!("{}-pv", ns.name), &DeleteParams::default())
        .await;
}

#[tokio::test]
async fn a_deployment_rolls_out_a_pdb_guards_eviction_and_a_cronjob_runs() {
    let world = ReadyTenant::start("sync-rollout").await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let pp = PostParams::default();
    let mut deployment = plain_deployment(2);
    deployment["spec"]["strategy"] = json!({"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}});
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = json!(1);
    let deployments: Api<Deployment> = Api::namespaced(tenant.clone(), "default");
    deployments
        .create(&pp, &serde_json::from_value(deployment).unwrap())
        .await
        .unwrap();
    converged(host, tenant, &ns.name, "dev", 2).await;

    // A rolling update: new pods come up (Ready through their host copies) before old ones go.
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
                {"name": "web", "image": "registry.example/web:2"}
            ]}}}})),
        )
        .await
        .unwrap();
    let rolled = eventually(WAIT, || async {
        let d = deployments.get("web").await.ok()?;
        let s = d.status?;
        let done = s.observed_generation == d.metadata.generation
            && s.updated_replicas == Some(2)
            && s.available_replicas == Some(2)
            && s.replicas == Some(2);
        let copies = host_pods(host, &ns.name, "dev").await;
        let images: Vec<String> = copies
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .flat_map(|p| p.spec.iter().flat_map(|s| s.containers.iter()))
            .filter_map(|c| c.image.clone())
            .collect();
        (done && images.len() == 2 && images.iter().all(|i| i.ends_with(":2"))).then_some(())
    })
    .await;
    assert!(rolled.is_some(), "the rollout never finished on the host");

    // A PodDisruptionBudget the tenant's eviction API honours.
    let pdb: k8s_openapi::api::policy::v1::PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}
    }))
    .unwrap();
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(tenant.clone(), "default");
    pdbs.create(&pp, &pdb).await.unwrap();
    let counted = eventually(WAIT, || async {
        let s = pdbs.get("web").await.ok()?.status?;
        (s.current_healthy == 2 && s.disruptions_allowed == 0).then_some(())
    })
    .await;
    assert!(counted.is_some(), "the budget never counted the pods");
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    let victim = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items[0]
        .name_any();
    match pods.evict(&victim, &Default::default()).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 429, "{e:?}"),
        other => panic!("an eviction the budget forbids went through: {other:?}"),
    }
    pdbs.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"minAvailable": 1}})),
    )
    .await
    .unwrap();
    let evicted = eventually(WAIT, || async {
        pods.evict(&victim, &Default::default()).await.ok()
    })
    .await;
    assert!(evicted.is_some(), "an allowed eviction was refused");
    let replaced = eventually(WAIT, || async {
        let copies = host_pods(host, &ns.name, "dev").await;
        let live: Vec<_> = copies
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| p.name_any())
            .collect();
        (live.len() == 2 && !live.contains(&format!("{victim}-x-default-x-dev"))).then_some(())
    })
    .await;
    assert!(
        replaced.is_some(),
        "the evicted pod's copy stayed, or no replacement ran"
    );

    // A CronJob: its first Job completes (kwok finishes pods that do not restart).
    let mut tick = container("tick");
    tick.as_object_mut().unwrap().remove("resources");
    let cron: k8s_openapi::api::batch::v1::CronJob = serde_json::from_value(json!({
        "metadata": {"name": "tick", "namespace": "default"},
        "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"backoffLimit": 1, "template": {"spec": {
            "restartPolicy": "OnFailure", "containers": [tick]
        }}}}}
    }))
    .unwrap();
    let crons: Api<k8s_openapi::api::batch::v1::CronJob> =
        Api::namespaced(tenant.clone(), "default");
    crons.create(&pp, &cron).await.unwrap();
    // The first run is up to a minute away.
    let succeeded = eventually(std::time::Duration::from_secs(180), || async {
        crons.get("tick").await.ok()?.status?.last_successful_time
    })
    .await;
    assert!(succeeded.is_some(), "the CronJob's Job never completed");
    let (status, reason, message) = synced_condition(host, &ns.name, "dev").await;
    assert_eq!(status, "True", "{reason}: {message}");
}

#[tokio::test]
async fn a_selectorless_service_keeps_its_endpoints_and_a_deleted_service_stays_deleted() {
    use k8s_openapi::api::core::v1::Endpoints;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let world = TestHost::start("sync-endpoints").await;
    let (ns, host) = (&world.ns, &world.host);
    // The database outside the cluster is at an address the profile lets Endpoints name; the
    // profile honours the tenant's own Service addresses (the default lets the host choose).
    let tenant = TenantSetup::seed()
        .sync_policy(json!({}))
        .allow(json!({"endpointCIDRs": ["10.1.2.0/24"], "chosenClusterIPs": true}))
        .ready_in(ns)
        .await;
    let pp = PostParams::default();
    let services = Api::<Service>::namespaced(tenant.clone(), "default");
    let endpoints = Api::<Endpoints>::namespaced(tenant.clone(), "default");
    // A Service for something outside the cluster, its Endpoints written right after it: the
    // tenant Service is made again with its copy's address, and the Endpoints must survive that.
    services
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": "db", "namespace": "default"},
                "spec": {"ports": [{"name": "pg", "port": 5432}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    endpoints
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": "db", "namespace": "default"},
                "subsets": [{"addresses": [{"ip": "10.1.2.3"}], "ports": [{"name": "pg", "port": 5432}]}]
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let uid = services.get("db").await.unwrap().uid().unwrap();
    let took = shared_address(host, &tenant, &ns.name, "db")
        .await
        .map(|(_, uid)| uid);
    // The copy asked the host for the tenant's own address, so the Service was never made again.
    assert_eq!(
        took,
        Some(uid),
        "the tenant and host addresses never agreed, or the Service was made again"
    );
    // Past the syncer's watch window for the endpoints controller's delete.
    tokio::time::sleep(std::time::Duration::from_secs(8)).await;
    let addresses = |ep: Option<Endpoints>| -> Vec<String> {
        ep.into_iter()
            .flat_map(|e| e.subsets.unwrap_or_default())
            .flat_map(|s| s.addresses.unwrap_or_default())
            .map(|a| a.ip)
            .collect()
    };
    assert_eq!(
        addresses(endpoints.get_opt("db").await.unwrap()),
        ["10.1.2.3"]
    );
    let mirrored = eventually(WAIT, || async {
        let slices = Api::<EndpointSlice>::namespaced(tenant.clone(), "default")
            .list(&ListParams::default().labels("kubernetes.io/service-name=db"))
            .await
            .ok()?;
        slices
            .items
            .iter()
            .any(|s| s.endpoints.iter().any(|e| e.addresses == ["10.1.2.3"]))
            .then_some(())
    })
    .await;
    assert!(
        mirrored.is_some(),
        "the tenant never mirrored the Endpoints into an EndpointSlice"
    );
    let host_copy = eventually(WAIT, || async {
        let e = Api::<Endpoints>::namespaced(host.clone(), &ns.name)
            .get_opt("db-x-default-x-dev")
            .await
            .ok()??;
        (addresses(Some(e)) == ["10.1.2.3"]).then_some(())
    })
    .await;
    assert!(host_copy.is_some(), "the Endpoints never reached the host");

    // An address the host holds already: the copy takes one of the host's choosing, and the
    // tenant Service is made again with it.
    Api::<Service>::namespaced(host.clone(), &ns.name)
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": "holder"},
                "spec": {"clusterIP": "10.96.200.200", "ports": [{"port": 80}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    services
        .create(
            &pp,
            &serde_json::from_value(json!({
                "metadata": {"name": "clash", "namespace": "default"},
                "spec": {"clusterIP": "10.96.200.200", "selector": {"app": "web"}, "ports": [{"port": 80}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let moved = shared_address(host, &tenant, &ns.name, "clash")
        .await
        .map(|(ip, _)| ip);
    assert!(
        moved.as_deref().is_some_and(|ip| ip != "10.96.200.200"),
        "the tenant Service never moved to its copy's address: {moved:?}"
    );

    // Services deleted as soon as they are made stay deleted, on both sides.
    for i in 0..5 {
        let name = format!("brief-{i}");
        services
            .create(
                &pp,
                &serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}
                }))
                .unwrap(),
            )
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200 * i)).await;
        services
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_secs(10)).await;
    let left: Vec<String> = services
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|s| s.name_any())
        .filter(|n| n.starts_with("brief-"))
        .collect();
    assert!(left.is_empty(), "deleted Services came back: {left:?}");
    let gone = eventually(WAIT, || async {
        let copies = Api::<Service>::namespaced(host.clone(), &ns.name)
            .list(&ListParams::default())
            .await
            .ok()?;
        (!copies
            .items
            .iter()
            .any(|s| s.name_any().starts_with("brief-")))
        .then_some(())
    })
    .await;
    assert!(gone.is_some(), "host copies of deleted Services stayed");
}
