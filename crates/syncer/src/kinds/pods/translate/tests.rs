//! The pod translation's tests: what a tenant pod's copy looks like.

use super::*;
use crate::translate::tests::{host_name_of, translator};

/// The host copy of `p`, named as its converge names it.
fn copy_of(tr: &Translator, p: &Pod, dns: Option<&str>) -> Pod {
    super::pod(tr, p, &host_name_of(tr, &p.metadata), &[], dns)
}
use serde_json::json;

fn pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "web-0", "namespace": "default", "uid": "u1",
                     "labels": {"app": "web", "tenantplane.io/synced-from": "other"}},
        "spec": {
            "serviceAccountName": "builder",
            "nodeName": "node-a",
            "imagePullSecrets": [{"name": "regcred"}],
            "containers": [{
                "name": "web", "image": "nginx",
                "env": [
                    {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "conf", "key": "a"}}},
                    {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                    {"name": "KUBERNETES_SERVICE_PORT", "value": "1"}
                ],
                "envFrom": [{"secretRef": {"name": "creds"}}]
            }],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                {"name": "conf", "configMap": {"name": "conf"}},
                {"name": "kube-api-access-abc", "projected": {"sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}
                ]}}
            ]
        }
    }))
    .unwrap()
}

#[test]
fn a_pod_is_confined_to_its_tenant_on_the_host() {
    let t = translator();
    let host = copy_of(&t, &pod(), None);
    let meta = &host.metadata;
    assert_eq!(meta.name.as_deref(), Some("web-0-x-default-x-dev"));
    assert_eq!(meta.namespace.as_deref(), Some("team-dev"));
    let labels = meta.labels.as_ref().unwrap();
    assert_eq!(labels["dev.tenant.tenantplane.io/app"], "web");
    assert!(
        !labels.contains_key("app"),
        "host selectors never match a tenant key"
    );
    assert_eq!(
        labels[naming::LABEL_SYNCED_FROM],
        "dev",
        "the tenant cannot spoof it"
    );
    let spec = host.spec.unwrap();
    assert_eq!(spec.node_name, None);
    assert_eq!(spec.service_account_name.as_deref(), Some("dev-workloads"));
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.enable_service_links, Some(false));
    assert_eq!(spec.node_selector.unwrap()["pool"], "tenants");
    assert_eq!(
        spec.image_pull_secrets.unwrap()[0].name,
        "regcred-x-default-x-dev"
    );
    let c = &spec.containers[0];
    let env: BTreeMap<_, _> = c
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e))
        .collect();
    assert_eq!(
        env["KUBERNETES_SERVICE_HOST"].value.as_deref(),
        Some("10.96.0.10")
    );
    assert_eq!(
        env["KUBERNETES_SERVICE_PORT"].value.as_deref(),
        Some("1"),
        "the container's own value wins"
    );
    let from = env["A"].value_from.as_ref().unwrap();
    assert_eq!(
        from.config_map_key_ref.as_ref().unwrap().name,
        "conf-x-default-x-dev"
    );
    let host_ip = env["HOST_IP"]
        .value_from
        .as_ref()
        .unwrap()
        .field_ref
        .as_ref();
    assert_eq!(
        host_ip.unwrap().field_path,
        "metadata.annotations['tenantplane.io/host-ip']",
        "the host node's address is not the tenant's"
    );
    let ns_field = env["NS"].value_from.as_ref().unwrap().field_ref.as_ref();
    assert_eq!(
        ns_field.unwrap().field_path,
        "metadata.annotations['tenantplane.io/virtual-namespace']"
    );
    assert_eq!(
        c.env_from.as_ref().unwrap()[0]
            .secret_ref
            .as_ref()
            .unwrap()
            .name,
        "creds-x-default-x-dev"
    );
    let volumes = spec.volumes.unwrap();
    assert_eq!(
        volumes[0]
            .persistent_volume_claim
            .as_ref()
            .unwrap()
            .claim_name,
        "data-x-default-x-dev"
    );
    let projected = volumes[2]
        .projected
        .as_ref()
        .unwrap()
        .sources
        .as_ref()
        .unwrap();
    assert!(projected.iter().all(|s| s.service_account_token.is_none()));
    let token = projected[0].secret.as_ref().unwrap();
    assert_eq!(token.name, "web-0-x-default-x-dev.token");
    assert_eq!(token.items.as_ref().unwrap()[0].key, "token-0");
    assert_eq!(
        projected[1].config_map.as_ref().unwrap().name,
        "kube-root-ca.crt-x-default-x-dev"
    );
    let annotations = host.metadata.annotations.unwrap();
    assert_eq!(annotations[naming::ANNOTATION_VIRTUAL_UID], "u1");
    assert_eq!(annotations[naming::ANNOTATION_SERVICE_ACCOUNT], "builder");
}

#[test]
fn affinity_terms_only_match_copies_of_the_same_tenant_namespace() {
    let mut p = pod();
    p.spec.as_mut().unwrap().affinity = Some(
        serde_json::from_value(json!({
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 1,
                "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                    "labelSelector": {"matchLabels": {"app": "web"}}}
            }]},
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "topologyKey": "topology.kubernetes.io/zone", "namespaces": ["other"],
                "labelSelector": {"matchLabels": {"app": "db"}}
            }]}
        }))
        .unwrap(),
    );
    let host = copy_of(&translator(), &p, None);
    let affinity = host.spec.unwrap().affinity.unwrap();
    let anti = &affinity
        .pod_anti_affinity
        .unwrap()
        .preferred_during_scheduling_ignored_during_execution
        .unwrap()[0]
        .pod_affinity_term;
    let labels = anti
        .label_selector
        .as_ref()
        .unwrap()
        .match_labels
        .as_ref()
        .unwrap();
    assert_eq!(labels[naming::LABEL_SYNCED_FROM], "dev");
    assert_eq!(labels[naming::LABEL_VIRTUAL_NAMESPACE], "default");
    let with = &affinity
        .pod_affinity
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .unwrap()[0];
    assert_eq!(
        with.namespaces, None,
        "host namespaces are not the tenant's"
    );
    let selector = with.label_selector.as_ref().unwrap();
    assert_eq!(
        selector.match_labels.as_ref().unwrap()[naming::LABEL_SYNCED_FROM],
        "dev"
    );
    let by_namespace = &selector.match_expressions.as_ref().unwrap()[0];
    assert_eq!(by_namespace.key, naming::LABEL_VIRTUAL_NAMESPACE);
    assert_eq!(
        by_namespace.values.as_deref(),
        Some(&["other".to_string()][..])
    );
}

#[test]
fn pods_resolve_names_with_the_tenant_dns_when_it_has_one() {
    let host = copy_of(&translator(), &pod(), Some("10.96.0.53"));
    let spec = host.spec.unwrap();
    assert_eq!(spec.dns_policy.as_deref(), Some("None"));
    let dns = spec.dns_config.unwrap();
    assert_eq!(dns.nameservers.unwrap(), ["10.96.0.53"]);
    assert_eq!(dns.searches.unwrap()[0], "default.svc.cluster.local");
    let without = copy_of(&translator(), &pod(), None).spec.unwrap();
    assert_eq!(
        without.dns_policy, None,
        "the host's DNS when the tenant runs none"
    );
}

#[test]
fn a_copy_records_the_tenant_generation_it_was_made_from() {
    let mut p = pod();
    p.metadata.generation = Some(4);
    let meta = pod_meta(&translator(), &p, "web-0-x-default-x-dev");
    assert_eq!(
        meta.annotations.unwrap()[naming::ANNOTATION_TENANT_GENERATION],
        "4"
    );
    let meta = pod_meta(&translator(), &pod(), "web-0-x-default-x-dev");
    assert!(
        !meta
            .annotations
            .unwrap()
            .contains_key(naming::ANNOTATION_TENANT_GENERATION)
    );
}

#[test]
fn a_label_the_pod_reads_is_read_under_its_host_key() {
    let tr = translator();
    let index = "batch.kubernetes.io/job-completion-index";
    let host = field_path(&tr, &format!("metadata.labels['{index}']"));
    assert_eq!(host, format!("metadata.labels['{}']", tr.label_key(index)));
    assert_ne!(tr.label_key(index), index);
    assert_eq!(field_path(&tr, "metadata.labels"), "metadata.labels");
    assert_eq!(
        field_path(&tr, "metadata.annotations['a']"),
        "metadata.annotations['a']"
    );
}

#[test]
fn a_profile_that_shows_node_addresses_leaves_the_host_ip_to_the_host() {
    let mut tr = translator();
    tr.allow.node_addresses = true;
    let copy = copy_of(&tr, &pod(), None);
    let c = &copy.spec.unwrap().containers[0];
    let host_ip = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "HOST_IP")
        .and_then(|e| e.value_from.as_ref()?.field_ref.clone())
        .unwrap();
    assert_eq!(host_ip.field_path, "status.hostIP");
}
