//! Config and secrets, and what a SyncPolicy picks: removals (a key, a label, a selector term)
//! reach the host copies, forged copies are left alone.

use super::*;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::storage::v1::StorageClass;

#[tokio::test]
async fn a_policy_picks_what_syncs_selectors_accounts_and_classes() {
    // Only pods labelled sync=yes go down; ServiceAccounts go down; StorageClasses the profile
    // lets the tenant name come up, without their parameters; another team's does not.
    let foreign = format!("team-b-{}", std::process::id());
    let other: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": foreign},
        "provisioner": "example.org/disk",
        "parameters": {"csi.storage.k8s.io/provisioner-secret-name": "kms-key-team-b"}
    }))
    .unwrap();
    let world = TenantSetup::seed()
        .allow(json!({"storageClasses": ["standard"]}))
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
    let host_classes = Api::<StorageClass>::all(host.clone());
    let _ = host_classes.create(&PostParams::default(), &other).await;

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
    assert_eq!(class.parameters, None);
    let shown: Vec<String> = Api::<StorageClass>::all(tenant.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert!(
        !shown.contains(&foreign),
        "another team's class shows: {shown:?}"
    );
    let _ = host_classes.delete(&foreign, &Default::default()).await;
    let skipped = pods.get("skipped").await.unwrap();
    assert!(
        skipped.spec.unwrap().node_name.is_none(),
        "a pod the selector leaves out is not run"
    );
    delete_tenant_and_policy(ns, &policy_name).await;
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
        let selector = s.spec?.selector.unwrap_or_default();
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
