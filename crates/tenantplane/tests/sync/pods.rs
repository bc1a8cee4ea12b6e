//! Pods: a Deployment's pods run as host copies and everything about them converges (edits,
//! deletions, orphans, an operator restart); two tenants never collide; the syncer resumes after
//! an outage; a pod's status follows its copy's; a host pod that only has a copy's name is never
//! taken over.

use super::*;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{Event, Node, Secret};
use tenantplane_testenv::{install_crds_and_policies, namespace};

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
                    token,
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
async fn a_host_pod_with_a_copys_name_is_never_taken_over() {
    install_crds_and_policies();
    let ns = namespace("sync-foreign").await;
    let _operator = start_operator(&ns);
    let host = ns.client.clone();
    create_ready(&host, &tenant_named(&ns.name, "dev")).await;
    let tenant = tenant_client(&host, &ns.name, "dev").await;
    // Someone else's pod on the host, under the name the copy of tenant pod default/web gets.
    let copy_name = naming::host_name_for("dev", "default", "web");
    let mut foreign = bare_pod(&copy_name, json!({"owner": "someone-else"}));
    foreign.metadata.namespace = Some(ns.name.clone());
    let hosts = Api::<Pod>::namespaced(host.clone(), &ns.name);
    let made = hosts
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    Api::<Pod>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &bare_pod("web", json!({})))
        .await
        .unwrap();

    // `Synced` names the taken name; the pod is as its owner made it.
    let said = eventually(WAIT, || async {
        let (status, reason, message) = synced_condition(&host, &ns.name, "dev").await;
        let named = reason == OBJECTS_REFUSED && message.contains("- HostNameTaken: ");
        (status == "False" && named).then_some(message)
    })
    .await
    .expect("Synced says HostNameTaken");
    assert!(said.contains(&copy_name), "{said}");
    let now = hosts.get(&copy_name).await.unwrap();
    assert_eq!(now.uid(), made.uid());
    assert_eq!(now.labels(), made.labels());
    assert_eq!(now.annotations(), made.annotations());
    let managers: Vec<String> = now
        .managed_fields()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(
        !managers.iter().any(|m| m == naming::SYNCER_MANAGER),
        "the syncer wrote to someone else's pod: {managers:?}"
    );

    // Once the name is free, the copy is made.
    hosts
        .delete(&copy_name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let pods = converged(&host, &tenant, &ns.name, "dev", 1).await;
    let copies = host_pods(&host, &ns.name, "dev").await;
    assert_eq!(copies.len(), 1);
    assert_eq!(
        copies[0].annotations()[naming::ANNOTATION_VIRTUAL_UID],
        pods[0].uid().unwrap()
    );
}
