//! The syncer against the real parts: the host is the test control plane (its scheduler places
//! the copies, kwok runs them, its Pod Security admission judges them); the tenant is the local
//! runtime's kube-apiserver and kube-controller-manager (its Deployment and ReplicaSet
//! controllers make the pods).

use std::collections::BTreeSet;

#[path = "../common/mod.rs"]
mod common;
use common::*;

// One module per concern, sharing the helpers below; one binary, so one test control plane for
// them all, as before. Scale is `sync_scale.rs`: it counts the host's watches, so its control
// plane must serve nothing else.
mod config;
mod nodes;
mod pods;
mod services;
mod volumes;
mod workloads;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tenantplane_api::conditions::SYNCED;
use tenantplane_api::{Phase, SyncPolicy, TenantCluster};
use tenantplane_syncer::{OBJECTS_REFUSED, naming};
use tenantplane_testenv::{TestNamespace, eventually};

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
