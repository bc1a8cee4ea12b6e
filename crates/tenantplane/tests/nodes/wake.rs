//! A sleeping tenant woken by requests to its API Service's address from a pod on the real node,
//! as a CI runner in the host cluster would send them: the Service leads to the operator's wake
//! door while the tenant sleeps, and every request is answered by the tenant itself, over TLS
//! its own CA signed, once it is awake.

use super::*;

use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Patch, PatchParams};
use tenantplane_api::{Phase, TenantCluster};
use tenantplane_controller::names;

#[tokio::test]
async fn twenty_requests_to_a_sleeping_tenants_service_wake_it_once_and_all_get_answers() {
    let world = real_tenant("nd-wake").await;
    let (ns, host, name) = (&world.ns.name, &world.host, &world.name);
    let host_kubeconfig = shared().kubeconfig_path().to_path_buf();

    // A client outside the tenant, in a namespace of its own, trusting the tenant's server CA.
    let runner = format!("{ns}-runner");
    tenantplane_testenv::kubectl(&["create", "namespace", &runner]).unwrap();
    let pki = Api::<Secret>::namespaced(host.clone(), ns)
        .get(&names::pki_secret(name))
        .await
        .unwrap();
    let ca = String::from_utf8(
        pki.data.unwrap()[tenantplane_controller::tenant_pki::SERVER_CA_CRT]
            .0
            .clone(),
    )
    .unwrap();
    let config_map: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "tenant-ca", "namespace": runner},
        "data": {"ca.crt": ca}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(host.clone(), &runner)
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap();
    let mut client = agnhost("client", &["pause"]);
    client["volumeMounts"] = serde_json::json!([{"name": "ca", "mountPath": "/ca"}]);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "ci-runner", "namespace": runner},
        "spec": {
            "containers": [client],
            "volumes": [{"name": "ca", "configMap": {"name": "tenant-ca"}}]
        }
    }))
    .unwrap();
    let pods = Api::<Pod>::namespaced(host.clone(), &runner);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let running = eventually(WAIT, || async {
        let p = pods.get("ci-runner").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    assert!(running.is_some(), "the runner pod never ran");

    // The tenant sleeps: its Service leads to the wake door.
    let ip = common::cluster_ip(host, ns, name).await;
    Api::<TenantCluster>::namespaced(host.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"sleep": {"asleep": true}}})),
        )
        .await
        .unwrap();
    common::wait_for_phase(host, ns, name, Phase::Sleeping).await;
    let service = Api::<Service>::namespaced(host.clone(), ns)
        .get(&names::service(name))
        .await
        .unwrap();
    assert_eq!(service.spec.as_ref().unwrap().selector, None);
    let slice = Api::<EndpointSlice>::namespaced(host.clone(), ns)
        .get(&names::wake_endpoint_slice(name))
        .await
        .unwrap();
    assert_eq!(
        slice.endpoints.as_ref().unwrap()[0].addresses,
        [tenantplane_testenv::host_cluster::real_node::OPERATOR_IP]
    );

    // Asleep: nothing of it runs (a request while it goes to sleep is another story).
    let gone = eventually(WAIT, || async {
        let left = Api::<Pod>::namespaced(host.clone(), ns)
            .list(&Default::default())
            .await
            .ok()?;
        left.items.is_empty().then_some(())
    })
    .await;
    assert!(gone.is_some(), "the control-plane pod stayed");

    // Twenty first requests at once, each checking the tenant's own certificate.
    let server = format!("{}.{ns}.svc", names::service(name));
    let script = format!(
        "for i in $(seq 20); do curl -sS --max-time 150 --cacert /ca/ca.crt --resolve {server}:6443:{ip} https://{server}:6443/version -o /tmp/out.$i -w '%{{http_code}} %{{time_connect}} %{{time_total}} %{{errormsg}}\\n' & done; wait; grep -l gitVersion /tmp/out.* | wc -l"
    );
    let started = std::time::Instant::now();
    let said = kubectl(
        &host_kubeconfig,
        &[
            "exec",
            "-n",
            &runner,
            "ci-runner",
            "--",
            "sh",
            "-c",
            &script,
        ],
        "",
    )
    .await;
    eprintln!(
        "20 first requests answered in {:.1?}: {said:?}",
        started.elapsed()
    );
    let codes: Vec<&str> = said
        .1
        .lines()
        .map(|l| l.split(' ').next().unwrap_or(l))
        .collect();
    assert_eq!(
        codes.iter().filter(|c| **c == "200").count(),
        20,
        "every request answered: {said:?}"
    );
    assert_eq!(
        codes.last(),
        Some(&"20"),
        "each answer the tenant's version: {said:?}"
    );

    // Awake, once: the door closed, the Service leads to the pod again.
    common::wait_for_phase(host, ns, name, Phase::Ready).await;
    let events = tenantplane_testenv::kubectl(&[
        "get",
        "events",
        "-n",
        ns,
        "--field-selector",
        "involvedObject.kind=TenantCluster,reason=Waking",
        "-o",
        "name",
    ])
    .unwrap();
    assert_eq!(events.lines().count(), 1, "one wake: {events}");
    let back = eventually(WAIT, || async {
        let slice = Api::<EndpointSlice>::namespaced(host.clone(), ns)
            .get_opt(&names::wake_endpoint_slice(name))
            .await
            .ok()?;
        let service = Api::<Service>::namespaced(host.clone(), ns)
            .get(&names::service(name))
            .await
            .ok()?;
        (slice.is_none() && service.spec?.selector.is_some()).then_some(())
    })
    .await;
    assert!(
        back.is_some(),
        "the wake door's slice stayed, or the selector did not come back"
    );
    drop(world);
}
