//! Workloads as people write them: the README example, a plain Deployment and a Job, a rollout,
//! a PodDisruptionBudget and a CronJob.

use super::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use serde::Deserialize;

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
        (s.current_healthy == Some(2) && s.disruptions_allowed == Some(0)).then_some(())
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
