//! Volumes: a StatefulSet's claim binds to a host volume (and a DaemonSet runs on every node).

use super::*;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;

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
