//! The red team's classes of escape, each as an attack a tenant admin makes against the real
//! control plane, asserting on what the host ends up with (copies, their fields, EndpointSlices)
//! and on what the tenant is told (an Event on its object, the `Synced` condition). The syncer
//! denies by default: what the IsolationProfile does not allow never reaches the host.

#[path = "../common/mod.rs"]
mod common;
use common::*;

// Second round (issue: decide every field, bound every size, stop leaking the host upward):
// one module per class, sharing the helpers below.
mod fields;
mod network;
// Third round: every dimension of a tenant's footprint bounded.
mod bounds;
mod pod_security;
mod redteam;
mod sizes;
mod upward;

use k8s_openapi::api::core::v1::{
    ConfigMap, Endpoints, Event, PersistentVolumeClaim, Pod, Service,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tenantplane_api::conditions::SYNCED;
use tenantplane_api::{Phase, TenantCluster};
use tenantplane_syncer::OBJECTS_REFUSED;
use tenantplane_syncer::naming;
use tenantplane_testenv::{TestNamespace, eventually};

/// Tenant pod `default/<name>` with `spec` merged over one restricted container.
pub(crate) fn pod(name: &str, labels: serde_json::Value, spec: serde_json::Value) -> Pod {
    let mut full = json!({"containers": [container("c")], "terminationGracePeriodSeconds": 1});
    if let (Some(full), Some(extra)) = (full.as_object_mut(), spec.as_object()) {
        full.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": full
    }))
    .unwrap()
}

pub(crate) async fn create<K>(api: &Api<K>, obj: &K) -> K
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    api.create(&PostParams::default(), obj).await.unwrap()
}

/// The host copy of tenant object `default/<name>` of tenant `dev`, once it exists.
pub(crate) async fn host_copy<K>(host: &Client, ns: &str, name: &str) -> K
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(host.clone(), ns);
    let copy = format!("{name}-x-default-x-dev");
    eventually(WAIT, || async { api.get_opt(&copy).await.ok()? })
        .await
        .unwrap_or_else(|| panic!("no host copy {copy}"))
}

/// Is there a host copy of tenant object `default/<name>`?
pub(crate) async fn has_copy<K>(host: &Client, ns: &str, name: &str) -> bool
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    Api::<K>::namespaced(host.clone(), ns)
        .get_opt(&format!("{name}-x-default-x-dev"))
        .await
        .unwrap()
        .is_some()
}

/// The message of the Warning Event with `reason` on tenant object `default/<name>`, once there.
pub(crate) async fn told(tenant: &Client, name: &str, reason: &str) -> String {
    told_where(tenant, reason, |n| n == name)
        .await
        .unwrap_or_else(|| panic!("no {reason} Event on {name}"))
}

/// The message of a Warning Event with `reason` on a tenant object of `default` whose name
/// `about` accepts, once there.
pub(crate) async fn told_where(
    tenant: &Client,
    reason: &str,
    about: impl Fn(&str) -> bool,
) -> Option<String> {
    let events: Api<Event> = Api::namespaced(tenant.clone(), "default");
    eventually(WAIT, || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.involved_object.name.as_deref().is_some_and(&about)
            })
            .and_then(|e| e.message)
    })
    .await
}

/// Wait until `Synced` is False naming a refused object with `reason` (as `ObjectsRefused`,
/// `- reason: …`) and a message containing `needle`; a refusal is the tenant user's, so the
/// tenant stays Ready meanwhile.
pub(crate) async fn synced_says(host: &Client, ns: &str, reason: &str, needle: &str) {
    let api: Api<TenantCluster> = Api::namespaced(host.clone(), ns);
    let last = std::sync::Mutex::new(String::new());
    let found = eventually(WAIT, || async {
        let tc = api.get("dev").await.ok()?;
        let c = condition(&tc, SYNCED).clone();
        let phase = tc.status.as_ref().and_then(|s| s.phase);
        *last.lock().unwrap() = format!("{phase:?}, {} {}: {}", c.status, c.reason, c.message);
        let named = c.reason == OBJECTS_REFUSED && c.message.contains(&format!("- {reason}: "));
        (c.status == "False" && named && c.message.contains(needle)).then_some(phase)
    })
    .await;
    if let Some(phase) = found {
        assert_eq!(
            phase,
            Some(Phase::Ready),
            "refused objects leave the tenant Ready"
        );
    }
    assert!(
        found.is_some(),
        "Synced never said {reason} about {needle}; last: {}",
        last.lock().unwrap()
    );
}

#[tokio::test]
async fn host_access_is_refused_even_under_a_privileged_profile() {
    // Pod Security lets everything through here: only the syncer stands in the way.
    let world = TenantSetup::seed()
        .profile_spec(json!({"podSecurity": "privileged"}))
        .start("iso-host")
        .await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    let mut root = container("c");
    root["securityContext"] = json!({"privileged": true, "capabilities": {"add": ["SYS_ADMIN"]}});
    root["ports"] = json!([{"containerPort": 80, "hostPort": 80}]);
    let attacks = [
        ("privileged", json!({"containers": [root]}), "privileged"),
        (
            "hostnet",
            json!({"hostNetwork": true, "hostPID": true}),
            "spec.hostNetwork",
        ),
        (
            "hostpath",
            json!({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}),
            "hostPath",
        ),
        (
            "pki",
            json!({"volumes": [{"name": "pki", "cephfs": {"monitors": ["10.0.0.1:6789"],
                                 "secretRef": {"name": "dev-pki"}}}]}),
            ".cephfs is not allowed",
        ),
    ];
    for (name, spec, _) in &attacks {
        create(&pods, &pod(name, json!({}), spec.clone())).await;
    }
    let plain = create(&pods, &pod("plain", json!({}), json!({}))).await;
    host_copy::<Pod>(host, &ns.name, &plain.name_any()).await;
    for (name, _, needle) in &attacks {
        let message = told(tenant, name, "NotAllowed").await;
        assert!(message.contains(needle), "{name}: {message}");
        assert!(
            !has_copy::<Pod>(host, &ns.name, name).await,
            "{name} reached the host"
        );
        let p = pods.get(name).await.unwrap();
        let scheduled = p
            .status
            .and_then(|s| s.conditions)
            .and_then(|c| c.into_iter().find(|c| c.type_ == "PodScheduled"));
        assert_eq!(
            scheduled.and_then(|c| c.reason).as_deref(),
            Some("NotAllowed"),
            "{name}: the tenant pod says why it does not run"
        );
    }
    synced_says(host, &ns.name, "NotAllowed", "is not allowed").await;
    // A pod refused pulls nothing onto the host: not even the ConfigMap it uses.
    let cms: Api<ConfigMap> = Api::namespaced(tenant.clone(), "default");
    let big: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "payload", "namespace": "default"},
        "data": {"blob": "x".repeat(512 * 1024)}
    }))
    .unwrap();
    create(&cms, &big).await;
    let used: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "used", "namespace": "default"}, "data": {"a": "b"}
    }))
    .unwrap();
    create(&cms, &used).await;
    let volume =
        |cm: &str| json!({"volumes": [{"name": "v", "configMap": {"name": cm}}], "hostIPC": true});
    create(&pods, &pod("loader", json!({}), volume("payload"))).await;
    let mut admitted = volume("used");
    admitted.as_object_mut().unwrap().remove("hostIPC");
    create(&pods, &pod("user", json!({}), admitted)).await;
    host_copy::<ConfigMap>(host, &ns.name, "used").await;
    told(tenant, "loader", "NotAllowed").await;
    assert!(
        !has_copy::<ConfigMap>(host, &ns.name, "payload").await,
        "a refused pod's ConfigMap was copied to the host"
    );
}

#[tokio::test]
async fn volumes_and_claims_reach_only_the_tenants_own_copies() {
    // Pod Security admits what follows in the tenant: the syncer refuses it.
    let world = TenantSetup::seed()
        .allow(json!({"csiDrivers": ["secrets.example.org"]}))
        .profile_spec(json!({"podSecurity": "privileged"}))
        .start("iso-vol")
        .await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    // A CSI driver the profile does not list (its attributes reach a filer), and a probe that
    // the kubelet would dial at the host API from the node: refused.
    let nfs = json!({"volumes": [{"name": "filer", "csi": {"driver": "nfs.csi.k8s.io",
                                  "volumeAttributes": {"server": "filer.internal", "share": "/"}}}]});
    create(&pods, &pod("filer", json!({}), nfs)).await;
    let mut prober = container("c");
    prober["readinessProbe"] = json!({"tcpSocket": {"host": "10.96.0.1", "port": 443}});
    create(
        &pods,
        &pod("prober", json!({}), json!({"containers": [prober]})),
    )
    .await;
    // A CSI volume whose secret names the tenant's PKI Secret on the host, and an ephemeral
    // volume whose template clones the control plane's datastore claim and picks host volumes.
    let spec = json!({"volumes": [
        {"name": "csi", "csi": {"driver": "secrets.example.org", "nodePublishSecretRef": {"name": "dev-pki"}}},
        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {
            "metadata": {"labels": {"tenantplane.io/synced-from": "someone-else"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                     "dataSource": {"kind": "PersistentVolumeClaim", "name": "data-dev-0"},
                     "selector": {"matchLabels": {"team": "payments"}},
                     "volumeName": "pv-of-payments"}}}}
    ]});
    create(&pods, &pod("mounter", json!({}), spec)).await;
    let copy = host_copy::<Pod>(host, &ns.name, "mounter").await;
    let volumes = copy.spec.unwrap().volumes.unwrap();
    let csi = volumes.iter().find(|v| v.name == "csi").unwrap();
    assert_eq!(
        csi.csi
            .as_ref()
            .unwrap()
            .node_publish_secret_ref
            .as_ref()
            .unwrap()
            .name,
        "dev-pki-x-default-x-dev",
        "the secret is the tenant's own copy"
    );
    let scratch = volumes.iter().find(|v| v.name == "scratch").unwrap();
    assert!(
        scratch.ephemeral.is_none(),
        "the host never expands the template"
    );
    assert_eq!(
        scratch.persistent_volume_claim.as_ref().unwrap().claim_name,
        "mounter-scratch-x-default-x-dev"
    );
    // The claim the tenant's controller made goes down without the source, volume or selector.
    let claim = host_copy::<PersistentVolumeClaim>(host, &ns.name, "mounter-scratch").await;
    let spec = claim.spec.clone().unwrap();
    // A clone is only ever of a claim of the same tenant namespace: its copy, never the host's.
    for name in [
        spec.data_source.as_ref().map(|d| d.name.clone()),
        spec.data_source_ref.as_ref().map(|d| d.name.clone()),
    ]
    .into_iter()
    .flatten()
    {
        assert_eq!(name, "data-dev-0-x-default-x-dev", "{spec:?}");
    }
    assert!(
        spec.volume_name.is_none() && spec.selector.is_none(),
        "{spec:?}"
    );
    assert_eq!(claim.labels()[naming::LABEL_SYNCED_FROM], "dev");
    told(tenant, "mounter-scratch", "NotCopied").await;
    // No claim exists on the host that the host's own ephemeral-volume controller made.
    let host_claims = Api::<PersistentVolumeClaim>::namespaced(host.clone(), &ns.name)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        host_claims
            .items
            .iter()
            .all(|c| !c.name_any().ends_with("-scratch")),
        "{:?}",
        host_claims
            .items
            .iter()
            .map(|c| c.name_any())
            .collect::<Vec<_>>()
    );
    for (name, needle) in [("filer", "nfs.csi.k8s.io"), ("prober", "10.96.0.1")] {
        let message = told(tenant, name, "NotAllowed").await;
        assert!(message.contains(needle), "{name}: {message}");
        assert!(
            !has_copy::<Pod>(host, &ns.name, name).await,
            "{name} reached the host"
        );
    }
    // A claim naming a storage class the profile does not list is refused.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(tenant.clone(), "default");
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "fast", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "ops-local",
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    create(&claims, &pvc).await;
    let message = told(tenant, "fast", "NotAllowed").await;
    assert!(message.contains("ops-local"), "{message}");
    assert!(!has_copy::<PersistentVolumeClaim>(host, &ns.name, "fast").await);
}

#[tokio::test]
async fn services_point_only_at_the_tenants_own_pods_and_allowed_names() {
    let world = TestHost::start("iso-svc").await;
    let (ns, host) = (&world.ns, &world.host);
    let quota = json!({"resourceQuota": {"hard": {"services.loadbalancers": "2", "services.nodeports": "4"}}});
    let tenant = TenantSetup::seed()
        .profile_spec(quota)
        .allow(json!({"loadBalancers": true, "externalNames": ["*.example.com"]}))
        .ready_in(ns)
        .await;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    create(&pods, &pod("own", json!({"app": "own"}), json!({}))).await;
    let own_ip = eventually(WAIT, || async {
        pods.get("own").await.ok()?.status?.pod_ip
    })
    .await
    .expect("the tenant pod never got an address");
    // Hand-written Endpoints that name the host API's address and the tenant API's Service
    // beside the tenant's own pod.
    let host_api_ip = cluster_ip(host, "default", "kubernetes").await;
    let services: Api<Service> = Api::namespaced(tenant.clone(), "default");
    let svc = |name: &str, spec: serde_json::Value| -> Service {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec}),
        )
        .unwrap()
    };
    create(&services, &svc("mitm", json!({"ports": [{"port": 443}]}))).await;
    let endpoints: Endpoints = serde_json::from_value(json!({
        "metadata": {"name": "mitm", "namespace": "default"},
        "subsets": [{"addresses": [{"ip": host_api_ip}, {"ip": own_ip}], "ports": [{"port": 443}]}]
    }))
    .unwrap();
    create(
        &Api::<Endpoints>::namespaced(tenant.clone(), "default"),
        &endpoints,
    )
    .await;
    let last = std::sync::Mutex::new(String::new());
    let copied = eventually(WAIT, || async {
        let ep: Endpoints = Api::namespaced(host.clone(), &ns.name)
            .get_opt("mitm-x-default-x-dev")
            .await
            .ok()??;
        let ips: Vec<String> = ep
            .subsets
            .iter()
            .flatten()
            .flat_map(|s| s.addresses.iter().flatten().map(|a| a.ip.clone()))
            .collect();
        *last.lock().unwrap() = format!("{ips:?}");
        (ips == [own_ip.clone()]).then_some(())
    })
    .await;
    assert!(
        copied.is_some(),
        "the host Endpoints should hold only {own_ip}: {}",
        last.lock().unwrap()
    );
    let message = told(&tenant, "mitm", "NotCopied").await;
    assert!(message.contains(&host_api_ip), "{message}");
    // The host's EndpointSlices (mirrored from the copy) never name the host API either.
    let slices = Api::<EndpointSlice>::namespaced(host.clone(), &ns.name)
        .list(&ListParams::default().labels("kubernetes.io/service-name=mitm-x-default-x-dev"))
        .await
        .unwrap();
    for s in &slices.items {
        for e in s.endpoints.iter().flatten() {
            assert!(!e.addresses.contains(&host_api_ip), "{:?}", s.endpoints);
        }
    }

    // ExternalName to a name the profile does not list, and a NodePort (not allowed), are
    // refused; an allowed name and a balancer with source ranges go down as written.
    create(
        &services,
        &svc(
            "apiserver",
            json!({"type": "ExternalName", "externalName": "kubernetes.default.svc.cluster.local"}),
        ),
    )
    .await;
    create(
        &services,
        &svc(
            "exposed",
            json!({"type": "NodePort", "ports": [{"port": 80}]}),
        ),
    )
    .await;
    create(
        &services,
        &svc(
            "db",
            json!({"type": "ExternalName", "externalName": "db.example.com"}),
        ),
    )
    .await;
    create(
        &services,
        &svc(
            "public",
            json!({"type": "LoadBalancer", "ports": [{"port": 80}],
                              "loadBalancerSourceRanges": ["203.0.113.0/24"]}),
        ),
    )
    .await;
    let message = told(&tenant, "apiserver", "NotAllowed").await;
    assert!(message.contains("allow.externalNames"), "{message}");
    let message = told(&tenant, "exposed", "NotAllowed").await;
    assert!(message.contains("NodePort"), "{message}");
    let public = host_copy::<Service>(host, &ns.name, "public").await;
    assert_eq!(
        public
            .spec
            .as_ref()
            .unwrap()
            .load_balancer_source_ranges
            .as_deref(),
        Some(&["203.0.113.0/24".to_string()][..]),
        "the balancer stays closed to everyone else"
    );
    host_copy::<Service>(host, &ns.name, "db").await;
    for name in ["apiserver", "exposed"] {
        assert!(
            !has_copy::<Service>(host, &ns.name, name).await,
            "{name} reached the host"
        );
    }
    synced_says(host, &ns.name, "NotAllowed", "Service default/").await;
}

#[tokio::test]
async fn tenant_labels_annotations_and_placement_never_steer_the_host() {
    let world = ReadyTenant::start("iso-meta").await;
    let (ns, host, tenant) = (&world.ns, &world.host, &world.tenant);
    // Another team's Service in the host namespace selects `app=payments`.
    let theirs: Service = serde_json::from_value(json!({
        "metadata": {"name": "payments"},
        "spec": {"selector": {"app": "payments"}, "ports": [{"port": 80}]}
    }))
    .unwrap();
    create(&Api::<Service>::namespaced(host.clone(), &ns.name), &theirs).await;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    let spoof = pod(
        "spoof",
        json!({"app": "payments"}),
        json!({
            "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
                            {"operator": "Exists"}],
            "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
            "priorityClassName": "system-node-critical"
        }),
    );
    let mut spoof = spoof;
    spoof.metadata.annotations = Some(
        [
            ("k8s.v1.cni.cncf.io/networks", "host-network"),
            ("cni.projectcalico.org/ipAddrs", "[\"10.96.0.1\"]"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    create(&pods, &spoof).await;
    let copy = host_copy::<Pod>(host, &ns.name, "spoof").await;
    let labels = copy.labels();
    assert!(!labels.contains_key("app"), "{labels:?}");
    assert_eq!(labels[&naming::host_label_key("dev", "app")], "payments");
    let annotations = copy.annotations();
    assert!(
        !annotations.keys().any(|k| k.contains("cni")),
        "{annotations:?}"
    );
    let spec = copy.spec.clone().unwrap();
    assert!(
        spec.tolerations.iter().flatten().all(|t| t
            .key
            .as_deref()
            .is_some_and(|k| k.starts_with("node.kubernetes.io/"))),
        "{:?}",
        spec.tolerations
    );
    assert!(
        spec.node_selector
            .iter()
            .flatten()
            .all(|(k, _)| !k.contains("control-plane")),
        "{:?}",
        spec.node_selector
    );
    assert_eq!(spec.priority_class_name, None);
    let message = told(tenant, "spoof", "NotCopied").await;
    for needle in [
        "k8s.v1.cni.cncf.io/networks",
        "control-plane",
        "system-node-critical",
    ] {
        assert!(message.contains(needle), "{needle}: {message}");
    }
    // The pod runs, and the other team's Service never gets it as an endpoint.
    eventually(WAIT, || async {
        let p = pods.get("spoof").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await
    .expect("the spoofing pod never ran");
    let ip = pods
        .get("spoof")
        .await
        .unwrap()
        .status
        .unwrap()
        .pod_ip
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let slices = Api::<EndpointSlice>::namespaced(host.clone(), &ns.name)
        .list(&ListParams::default().labels("kubernetes.io/service-name=payments"))
        .await
        .unwrap();
    for s in &slices.items {
        for e in s.endpoints.iter().flatten() {
            assert!(
                !e.addresses.contains(&ip),
                "a tenant pod joined payments: {:?}",
                s.endpoints
            );
        }
    }
    // The tenant's own Service still finds its pods through the translated selector.
    let services: Api<Service> = Api::namespaced(tenant.clone(), "default");
    let own: Service = serde_json::from_value(json!({
        "metadata": {"name": "pay", "namespace": "default"},
        "spec": {"selector": {"app": "payments"}, "ports": [{"port": 80}]}
    }))
    .unwrap();
    create(&services, &own).await;
    let found = eventually(WAIT, || async {
        let slices = Api::<EndpointSlice>::namespaced(host.clone(), &ns.name)
            .list(&ListParams::default().labels("kubernetes.io/service-name=pay-x-default-x-dev"))
            .await
            .ok()?;
        slices
            .items
            .iter()
            .any(|s| {
                s.endpoints
                    .iter()
                    .flatten()
                    .any(|e| e.addresses.contains(&ip))
            })
            .then_some(())
    })
    .await;
    assert!(
        found.is_some(),
        "the tenant's own Service never selected its pod"
    );
}

#[tokio::test]
async fn a_tenant_runtime_class_runs_under_the_listed_host_class_of_its_handler() {
    let world = TestHost::start("iso-rc").await;
    let (ns, host) = (&world.ns, &world.host);
    // RuntimeClasses are cluster-wide: the host's is named after the test namespace.
    let host_class = format!("{}-sandboxed", ns.name);
    let runtime_class = |name: &str, handler: &str| -> RuntimeClass {
        serde_json::from_value(json!({"metadata": {"name": name}, "handler": handler})).unwrap()
    };
    let host_classes: Api<RuntimeClass> = Api::all(host.clone());
    create(&host_classes, &runtime_class(&host_class, "runsc")).await;
    let tenant = TenantSetup::seed()
        .allow(json!({"runtimeClasses": [host_class]}))
        .ready_in(ns)
        .await;
    let tenant_classes: Api<RuntimeClass> = Api::all(tenant.clone());
    create(&tenant_classes, &runtime_class("gvisor", "runsc")).await;
    create(&tenant_classes, &runtime_class("kata", "kata")).await;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    for (name, class) in [("sandboxed", "gvisor"), ("vm", "kata")] {
        create(
            &pods,
            &pod(name, json!({}), json!({"runtimeClassName": class})),
        )
        .await;
    }
    // Same handler: the copy runs under the host's class, and the tenant pod is scheduled.
    let copy = host_copy::<Pod>(host, &ns.name, "sandboxed").await;
    assert_eq!(
        copy.spec.unwrap().runtime_class_name.as_deref(),
        Some(host_class.as_str())
    );
    let bound = eventually(WAIT, || async {
        pods.get("sandboxed").await.ok()?.spec?.node_name
    })
    .await;
    assert!(
        bound.is_some(),
        "the pod of the mapped class was never scheduled"
    );
    // No listed class runs `kata`: refused, and the tenant is told which field to change.
    let message = told(&tenant, "vm", "NotAllowed").await;
    assert!(
        message.contains("runtimeClassName \"kata\"") && message.contains("allow.runtimeClasses"),
        "{message}"
    );
    assert!(!has_copy::<Pod>(host, &ns.name, "vm").await);
    host_classes
        .delete(&host_class, &Default::default())
        .await
        .unwrap();
}
