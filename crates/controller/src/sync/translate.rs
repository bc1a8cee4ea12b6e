//! Translation between a tenant object and its host copy. Pure: every rewrite that keeps a tenant
//! pod from reaching beyond its tenant is decided here and unit-tested.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    ConfigMap, EnvVar, Event, Node, NodeStatus, ObjectReference, PersistentVolumeClaim, Pod,
    PodCondition, PodStatus, SecretVolumeSource, Service, ServiceAccount, ServicePort, ServiceSpec,
    VolumeProjection,
};
use k8s_openapi::api::core::v1::{KeyToPath, Secret};
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::ObjectMeta;

use super::naming::{self, Virtual};

/// What translation needs to know about the tenant and the host.
#[derive(Clone, Debug)]
pub struct Translator {
    pub tenant: String,
    pub host_namespace: String,
    /// The TenantCluster, so the garbage collector removes every copy with it.
    pub owner: Option<OwnerReference>,
    /// The cluster IP of the tenant API server's host Service; pods reach it on port 443, as
    /// they would reach `kubernetes.default` (`KUBERNETES_SERVICE_HOST`/`_PORT`).
    pub api_ip: String,
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<k8s_openapi::api::core::v1::Toleration>,
}

/// A service-account token a tenant pod mounts, and the key of the host Secret that holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenSource {
    pub key: String,
    pub audience: Option<String>,
    pub expiration_seconds: i64,
}

/// The ConfigMaps, Secrets and claims a pod uses, by tenant name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct References {
    pub config_maps: BTreeSet<String>,
    pub secrets: BTreeSet<String>,
    pub claims: BTreeSet<String>,
    pub service_account: Option<String>,
}

/// The default lifetime kube-apiserver gives the tokens it projects (`kube-api-access-*`).
const DEFAULT_TOKEN_SECONDS: i64 = 3607;

/// The host Secret holding a pod's tenant service-account tokens. A translated name never ends in
/// `.token` (it ends with the tenant's name, which has no dot, or a hash), so this is no other
/// object's name.
pub fn token_secret_name(host_pod: &str) -> String {
    format!("{host_pod}.token")
}

pub fn virtual_ref(meta: &ObjectMeta) -> Virtual {
    Virtual {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
    }
}

impl Translator {
    pub fn host_name(&self, namespace: &str, name: &str) -> String {
        naming::host_name(name, namespace, &self.tenant)
    }

    /// Host metadata for the copy of a tenant object: translated name, the tenant's labels and
    /// annotations (without reserved keys) plus the ownership marks.
    pub fn host_meta(&self, meta: &ObjectMeta) -> ObjectMeta {
        let of = virtual_ref(meta);
        let mut labels = naming::copyable(meta.labels.as_ref());
        labels.extend(naming::owner_labels(&self.tenant, &of.namespace, &of.name));
        let mut annotations = naming::copyable(meta.annotations.as_ref());
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
        annotations.extend(naming::owner_annotations(&self.tenant, &of));
        ObjectMeta {
            name: Some(self.host_name(&of.namespace, &of.name)),
            namespace: Some(self.host_namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: self.owner.clone().map(|o| vec![o]),
            ..Default::default()
        }
    }

    /// The host labels that select the copies of tenant pods in `namespace` labelled `selector`.
    pub fn host_selector(
        &self,
        namespace: &str,
        selector: &BTreeMap<String, String>,
    ) -> BTreeMap<String, String> {
        let mut s = naming::copyable(Some(selector));
        s.insert(naming::LABEL_SYNCED_FROM.into(), self.tenant.clone());
        s.insert(
            naming::LABEL_VIRTUAL_NAMESPACE.into(),
            naming::label_value(namespace),
        );
        s
    }

    /// The host copy of a tenant pod. `services` are the tenant Services of the pod's namespace
    /// (for the service environment variables); `dns` the tenant's DNS service address, if any.
    pub fn pod(&self, pod: &Pod, services: &[&Service], dns: Option<&str>) -> Pod {
        let ns = pod.namespace().unwrap_or_default();
        let host_name = self.host_name(&ns, &pod.name_any());
        let mut meta = self.host_meta(&pod.metadata);
        let mut spec = pod.spec.clone().unwrap_or_default();
        let sa = spec
            .service_account_name
            .clone()
            .or(spec.service_account.clone())
            .unwrap_or_else(|| "default".into());
        if let Some(a) = meta.annotations.as_mut() {
            a.insert(naming::ANNOTATION_SERVICE_ACCOUNT.into(), sa);
        }
        // Scheduling is the host's; the tenant's binding follows the host's.
        spec.node_name = None;
        spec.scheduler_name = None;
        spec.priority_class_name = None;
        spec.priority = None;
        spec.preemption_policy = None;
        // The host's own service-account token is never mounted.
        spec.service_account_name = None;
        spec.service_account = None;
        spec.automount_service_account_token = Some(false);
        // Host Services in this namespace are other names for tenant objects; the tenant's are
        // given explicitly below.
        let links = spec.enable_service_links.unwrap_or(true);
        spec.enable_service_links = Some(false);
        if spec.hostname.is_none() && pod.name_any().len() <= 63 && !pod.name_any().contains('.') {
            spec.hostname = Some(pod.name_any());
        }
        if let Some(sub) = spec.subdomain.take() {
            spec.subdomain = Some(self.host_name(&ns, &sub));
        }
        // The isolation profile's placement wins over the tenant's.
        if !self.node_selector.is_empty() {
            let mut selector = spec.node_selector.take().unwrap_or_default();
            selector.extend(self.node_selector.clone());
            spec.node_selector = Some(selector);
        }
        if !self.tolerations.is_empty() {
            let mut tolerations = spec.tolerations.take().unwrap_or_default();
            for t in &self.tolerations {
                if !tolerations.contains(t) {
                    tolerations.push(t.clone());
                }
            }
            spec.tolerations = Some(tolerations);
        }
        if let Some(secrets) = spec.image_pull_secrets.as_mut() {
            for s in secrets.iter_mut() {
                s.name = self.host_name(&ns, &s.name);
            }
        }
        if let (Some(dns), Some("ClusterFirst") | None) = (dns, spec.dns_policy.as_deref()) {
            spec.dns_policy = Some("None".into());
            let mut config = spec.dns_config.take().unwrap_or_default();
            config.nameservers = Some(vec![dns.to_string()]);
            config.searches = Some(vec![
                format!("{ns}.svc.cluster.local"),
                "svc.cluster.local".into(),
                "cluster.local".into(),
            ]);
            config.options.get_or_insert_with(Vec::new).push(
                k8s_openapi::api::core::v1::PodDNSConfigOption {
                    name: Some("ndots".into()),
                    value: Some("5".into()),
                },
            );
            spec.dns_config = Some(config);
        }
        // Volumes: tenant names become host names; projected service-account tokens come from
        // the host token Secret, which the syncer fills through TokenRequest.
        let mut token_index = 0;
        for volume in spec.volumes.iter_mut().flatten() {
            if let Some(cm) = volume.config_map.as_mut() {
                cm.name = self.host_name(&ns, &cm.name);
            }
            if let Some(s) = volume.secret.as_mut()
                && let Some(name) = s.secret_name.as_mut()
            {
                *name = self.host_name(&ns, name);
            }
            if let Some(pvc) = volume.persistent_volume_claim.as_mut() {
                pvc.claim_name = self.host_name(&ns, &pvc.claim_name);
            }
            if let Some(d) = volume.downward_api.as_mut() {
                for item in d.items.iter_mut().flatten() {
                    if let Some(f) = item.field_ref.as_mut() {
                        f.field_path = field_path(&f.field_path);
                    }
                }
            }
            if let Some(projected) = volume.projected.as_mut() {
                for source in projected.sources.iter_mut().flatten() {
                    self.rewrite_projection(source, &ns, &host_name, &mut token_index);
                }
            }
        }
        let ip = &self.api_ip;
        let address = format!("tcp://{ip}:443");
        let mut extra_env = vec![
            env("KUBERNETES_SERVICE_HOST", ip),
            env("KUBERNETES_SERVICE_PORT", "443"),
            env("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
            env("KUBERNETES_PORT", &address),
            env("KUBERNETES_PORT_443_TCP", &address),
            env("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
            env("KUBERNETES_PORT_443_TCP_PORT", "443"),
            env("KUBERNETES_PORT_443_TCP_ADDR", ip),
        ];
        if links {
            for svc in services {
                extra_env.extend(service_env(svc));
            }
        }
        // One value per name, the first: a tenant Service cannot override the API address.
        let mut seen = BTreeSet::new();
        extra_env.retain(|e| seen.insert(e.name.clone()));
        let containers = spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten());
        for c in containers {
            let mut vars = extra_env.clone();
            // The container's own variables win, as the kubelet does.
            let own: BTreeSet<String> = c.env.iter().flatten().map(|e| e.name.clone()).collect();
            vars.retain(|v| !own.contains(&v.name));
            for e in c.env.iter_mut().flatten() {
                if let Some(from) = e.value_from.as_mut() {
                    if let Some(r) = from.config_map_key_ref.as_mut() {
                        r.name = self.host_name(&ns, &r.name);
                    }
                    if let Some(r) = from.secret_key_ref.as_mut() {
                        r.name = self.host_name(&ns, &r.name);
                    }
                    if let Some(f) = from.field_ref.as_mut() {
                        f.field_path = field_path(&f.field_path);
                    }
                }
            }
            for e in c.env_from.iter_mut().flatten() {
                if let Some(r) = e.config_map_ref.as_mut() {
                    r.name = self.host_name(&ns, &r.name);
                }
                if let Some(r) = e.secret_ref.as_mut() {
                    r.name = self.host_name(&ns, &r.name);
                }
            }
            let mut env_list = vars;
            env_list.extend(c.env.take().unwrap_or_default());
            c.env = Some(env_list);
        }
        spec.ephemeral_containers = None;
        // Pod (anti-)affinity terms select tenant labels; on the host they must only match copies
        // from the same tenant namespace.
        if let Some(affinity) = spec.affinity.as_mut() {
            let terms = affinity_terms(affinity);
            for term in terms {
                // Tenant namespaces are labels on the host; a tenant namespace selector cannot be
                // read there, so it widens to every namespace of the tenant.
                let namespaces = term.namespaces.take().unwrap_or_default();
                let own_namespace = namespaces.is_empty() && term.namespace_selector.is_none();
                term.namespace_selector = None;
                let selector = term.label_selector.get_or_insert_with(Default::default);
                let labels = selector.match_labels.get_or_insert_with(BTreeMap::new);
                labels.insert(naming::LABEL_SYNCED_FROM.into(), self.tenant.clone());
                if own_namespace {
                    labels.insert(
                        naming::LABEL_VIRTUAL_NAMESPACE.into(),
                        naming::label_value(&ns),
                    );
                } else if !namespaces.is_empty() {
                    selector
                        .match_expressions
                        .get_or_insert_with(Vec::new)
                        .push(
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                            key: naming::LABEL_VIRTUAL_NAMESPACE.into(),
                            operator: "In".into(),
                            values: Some(
                                namespaces.iter().map(|n| naming::label_value(n)).collect(),
                            ),
                        },
                    );
                }
            }
        }
        meta.name = Some(host_name);
        Pod {
            metadata: meta,
            spec: Some(spec),
            status: None,
        }
    }

    fn rewrite_projection(
        &self,
        source: &mut VolumeProjection,
        ns: &str,
        host_pod: &str,
        token_index: &mut usize,
    ) {
        if let Some(cm) = source.config_map.as_mut() {
            cm.name = self.host_name(ns, &cm.name);
        }
        if let Some(s) = source.secret.as_mut() {
            s.name = self.host_name(ns, &s.name);
        }
        if let Some(d) = source.downward_api.as_mut() {
            for item in d.items.iter_mut().flatten() {
                if let Some(f) = item.field_ref.as_mut() {
                    f.field_path = field_path(&f.field_path);
                }
            }
        }
        if let Some(token) = source.service_account_token.take() {
            let key = format!("token-{token_index}");
            *token_index += 1;
            source.secret = Some(k8s_openapi::api::core::v1::SecretProjection {
                name: token_secret_name(host_pod),
                items: Some(vec![KeyToPath {
                    key,
                    path: token.path,
                    mode: None,
                }]),
                optional: Some(false),
            });
        }
    }

    /// The host copy of a tenant Service: same ports and type, the selector confined to this
    /// tenant's pods of the same namespace, and no cluster IP of its own choosing (the host
    /// allocates it and the tenant copy takes it over).
    pub fn service(&self, svc: &Service) -> Service {
        let ns = svc.namespace().unwrap_or_default();
        let spec = svc.spec.clone().unwrap_or_default();
        let headless = spec.cluster_ip.as_deref() == Some("None");
        let ports = spec.ports.map(|ports| {
            ports
                .into_iter()
                .map(|p| ServicePort {
                    node_port: None,
                    ..p
                })
                .collect()
        });
        Service {
            metadata: self.host_meta(&svc.metadata),
            spec: Some(ServiceSpec {
                type_: spec.type_.clone(),
                ports,
                selector: spec.selector.as_ref().map(|s| self.host_selector(&ns, s)),
                cluster_ip: headless.then(|| "None".to_string()),
                external_name: spec.external_name.clone(),
                session_affinity: spec.session_affinity.clone(),
                publish_not_ready_addresses: spec.publish_not_ready_addresses,
                ip_families: spec.ip_families.clone(),
                ip_family_policy: spec.ip_family_policy.clone(),
                internal_traffic_policy: spec.internal_traffic_policy.clone(),
                external_traffic_policy: spec.external_traffic_policy.clone(),
                ..Default::default()
            }),
            status: None,
        }
    }

    pub fn config_map(&self, cm: &ConfigMap) -> ConfigMap {
        ConfigMap {
            metadata: self.host_meta(&cm.metadata),
            data: cm.data.clone(),
            binary_data: cm.binary_data.clone(),
            immutable: None,
        }
    }

    pub fn secret(&self, secret: &Secret) -> Secret {
        // A copied token Secret type would make the host's token controller act on it.
        let type_ = match secret.type_.as_deref() {
            Some("kubernetes.io/service-account-token") | None => Some("Opaque".to_string()),
            other => other.map(String::from),
        };
        Secret {
            metadata: self.host_meta(&secret.metadata),
            data: secret.data.clone(),
            string_data: None,
            type_,
            immutable: None,
        }
    }

    pub fn persistent_volume_claim(&self, pvc: &PersistentVolumeClaim) -> PersistentVolumeClaim {
        let mut spec = pvc.spec.clone().unwrap_or_default();
        spec.volume_name = None;
        spec.data_source = None;
        spec.data_source_ref = None;
        PersistentVolumeClaim {
            metadata: self.host_meta(&pvc.metadata),
            spec: Some(spec),
            status: None,
        }
    }

    pub fn service_account(&self, sa: &ServiceAccount) -> ServiceAccount {
        ServiceAccount {
            metadata: self.host_meta(&sa.metadata),
            automount_service_account_token: Some(false),
            image_pull_secrets: None,
            secrets: None,
        }
    }

    pub fn ingress(&self, ingress: &Ingress) -> Ingress {
        let ns = ingress.namespace().unwrap_or_default();
        let mut spec = ingress.spec.clone().unwrap_or_default();
        let backend = |b: &mut IngressBackend| {
            if let Some(s) = b.service.as_mut() {
                s.name = self.host_name(&ns, &s.name);
            }
            b.resource = None;
        };
        if let Some(b) = spec.default_backend.as_mut() {
            backend(b);
        }
        for rule in spec.rules.iter_mut().flatten() {
            for path in rule.http.iter_mut().flat_map(|h| h.paths.iter_mut()) {
                backend(&mut path.backend);
            }
        }
        for tls in spec.tls.iter_mut().flatten() {
            if let Some(name) = tls.secret_name.as_mut() {
                *name = self.host_name(&ns, name);
            }
        }
        let mut metadata = self.host_meta(&ingress.metadata);
        // Snippet annotations make an ingress controller run configuration the tenant wrote, with
        // the controller's rights on the host (ingress-nginx reads Secrets that way): never copied.
        if let Some(a) = metadata.annotations.as_mut() {
            a.retain(|k, _| !k.to_ascii_lowercase().contains("snippet"));
        }
        Ingress {
            metadata,
            spec: Some(spec),
            status: None,
        }
    }

    /// The host copy of the Endpoints of a selector-less tenant Service.
    pub fn endpoints(
        &self,
        ep: &k8s_openapi::api::core::v1::Endpoints,
    ) -> k8s_openapi::api::core::v1::Endpoints {
        let mut subsets = ep.subsets.clone();
        for s in subsets.iter_mut().flatten() {
            for a in s
                .addresses
                .iter_mut()
                .flatten()
                .chain(s.not_ready_addresses.iter_mut().flatten())
            {
                // Tenant object references mean nothing on the host.
                a.target_ref = None;
                a.node_name = None;
            }
        }
        k8s_openapi::api::core::v1::Endpoints {
            metadata: self.host_meta(&ep.metadata),
            subsets,
        }
    }
}

/// Every pod (anti-)affinity term of `affinity`, required and preferred.
fn affinity_terms(
    affinity: &mut k8s_openapi::api::core::v1::Affinity,
) -> Vec<&mut k8s_openapi::api::core::v1::PodAffinityTerm> {
    let mut terms = Vec::new();
    let (affinity_required, affinity_preferred) = match affinity.pod_affinity.as_mut() {
        Some(a) => (
            a.required_during_scheduling_ignored_during_execution
                .as_mut(),
            a.preferred_during_scheduling_ignored_during_execution
                .as_mut(),
        ),
        None => (None, None),
    };
    let (anti_required, anti_preferred) = match affinity.pod_anti_affinity.as_mut() {
        Some(a) => (
            a.required_during_scheduling_ignored_during_execution
                .as_mut(),
            a.preferred_during_scheduling_ignored_during_execution
                .as_mut(),
        ),
        None => (None, None),
    };
    for required in [affinity_required, anti_required].into_iter().flatten() {
        terms.extend(required.iter_mut());
    }
    for preferred in [affinity_preferred, anti_preferred].into_iter().flatten() {
        terms.extend(preferred.iter_mut().map(|w| &mut w.pod_affinity_term));
    }
    terms
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

/// Downward API fields that name the pod point at the tenant's values, kept in annotations.
fn field_path(path: &str) -> String {
    let annotation = match path {
        "metadata.name" => naming::ANNOTATION_VIRTUAL_NAME,
        "metadata.namespace" => naming::ANNOTATION_VIRTUAL_NAMESPACE,
        "metadata.uid" => naming::ANNOTATION_VIRTUAL_UID,
        "spec.serviceAccountName" => naming::ANNOTATION_SERVICE_ACCOUNT,
        other => return other.to_string(),
    };
    format!("metadata.annotations['{annotation}']")
}

/// The Docker-links variables the kubelet gives for a Service, computed for the tenant's Service
/// (whose cluster IP is its host copy's).
pub fn service_env(svc: &Service) -> Vec<EnvVar> {
    let Some(spec) = svc.spec.as_ref() else {
        return vec![];
    };
    let Some(ip) = spec.cluster_ip.as_deref().filter(|ip| *ip != "None") else {
        return vec![];
    };
    let Some(first) = spec.ports.as_ref().and_then(|p| p.first()) else {
        return vec![];
    };
    let prefix = svc.name_any().to_uppercase().replace('-', "_");
    let proto = |p: &ServicePort| p.protocol.clone().unwrap_or_else(|| "TCP".into());
    let mut out = vec![
        env(&format!("{prefix}_SERVICE_HOST"), ip),
        env(&format!("{prefix}_SERVICE_PORT"), &first.port.to_string()),
        env(
            &format!("{prefix}_PORT"),
            &format!("{}://{ip}:{}", proto(first).to_lowercase(), first.port),
        ),
    ];
    for p in spec.ports.iter().flatten() {
        if let Some(name) = &p.name {
            out.push(env(
                &format!(
                    "{prefix}_SERVICE_PORT_{}",
                    name.to_uppercase().replace('-', "_")
                ),
                &p.port.to_string(),
            ));
        }
        let base = format!("{prefix}_PORT_{}_{}", p.port, proto(p).to_uppercase());
        out.push(env(
            &base,
            &format!("{}://{ip}:{}", proto(p).to_lowercase(), p.port),
        ));
        out.push(env(&format!("{base}_PROTO"), &proto(p).to_lowercase()));
        out.push(env(&format!("{base}_PORT"), &p.port.to_string()));
        out.push(env(&format!("{base}_ADDR"), ip));
    }
    out
}

/// The service-account tokens a tenant pod mounts, in the order [`Translator::pod`] numbers them.
pub fn token_sources(pod: &Pod) -> Vec<TokenSource> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten())
        .filter_map(|s| s.service_account_token.as_ref())
        .enumerate()
        .map(|(i, t)| TokenSource {
            key: format!("token-{i}"),
            audience: t.audience.clone().filter(|a| !a.is_empty()),
            expiration_seconds: t.expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS),
        })
        .collect()
}

/// What a pod uses, so that only those ConfigMaps, Secrets and claims are synced.
pub fn references(pod: &Pod) -> References {
    let mut r = References::default();
    let Some(spec) = pod.spec.as_ref() else {
        return r;
    };
    r.service_account = spec.service_account_name.clone();
    for v in spec.volumes.iter().flatten() {
        if let Some(cm) = &v.config_map {
            r.config_maps.insert(cm.name.clone());
        }
        if let Some(SecretVolumeSource {
            secret_name: Some(name),
            ..
        }) = &v.secret
        {
            r.secrets.insert(name.clone());
        }
        if let Some(pvc) = &v.persistent_volume_claim {
            r.claims.insert(pvc.claim_name.clone());
        }
        for s in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(cm) = &s.config_map {
                r.config_maps.insert(cm.name.clone());
            }
            if let Some(secret) = &s.secret {
                r.secrets.insert(secret.name.clone());
            }
        }
    }
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        for e in c.env.iter().flatten() {
            if let Some(from) = &e.value_from {
                if let Some(k) = &from.config_map_key_ref {
                    r.config_maps.insert(k.name.clone());
                }
                if let Some(k) = &from.secret_key_ref {
                    r.secrets.insert(k.name.clone());
                }
            }
        }
        for e in c.env_from.iter().flatten() {
            if let Some(k) = &e.config_map_ref {
                r.config_maps.insert(k.name.clone());
            }
            if let Some(k) = &e.secret_ref {
                r.secrets.insert(k.name.clone());
            }
        }
    }
    for s in spec.image_pull_secrets.iter().flatten() {
        r.secrets.insert(s.name.clone());
    }
    r
}

/// The status the tenant pod should show for its host copy: the host's, with the host's
/// scheduling condition kept as is.
pub fn pod_status_up(host: &Pod) -> PodStatus {
    let mut status = host.status.clone().unwrap_or_default();
    // Host-only details.
    status.nominated_node_name = None;
    status.qos_class = host.status.as_ref().and_then(|s| s.qos_class.clone());
    status
}

/// Does the tenant pod already show `wanted`? Compared field by field the syncer writes, so the
/// tenant's own additions (readiness gates from elsewhere) do not cause writes.
pub fn pod_status_differs(current: Option<&PodStatus>, wanted: &PodStatus) -> bool {
    let Some(current) = current else {
        return true;
    };
    let conds = |s: &PodStatus| -> Vec<(String, String, Option<String>)> {
        let mut v: Vec<_> = s
            .conditions
            .iter()
            .flatten()
            .map(|c: &PodCondition| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect();
        v.sort();
        v
    };
    current.phase != wanted.phase
        || current.pod_ip != wanted.pod_ip
        || current.pod_ips != wanted.pod_ips
        || current.host_ip != wanted.host_ip
        || current.container_statuses != wanted.container_statuses
        || current.init_container_statuses != wanted.init_container_statuses
        || current.reason != wanted.reason
        || current.message != wanted.message
        || conds(current) != conds(wanted)
}

/// The virtual Node the tenant sees for host node `node`: its name, labels, capacity, addresses
/// and conditions; no taints, pod CIDRs or provider details of the host.
pub fn virtual_node(host: &Node, tenant: &str) -> Node {
    let mut labels = naming::copyable(host.metadata.labels.as_ref());
    labels.insert(naming::LABEL_SYNCED_FROM.into(), tenant.into());
    let status = host.status.clone().unwrap_or_default();
    Node {
        metadata: ObjectMeta {
            name: host.metadata.name.clone(),
            labels: Some(labels),
            ..Default::default()
        },
        spec: None,
        status: Some(NodeStatus {
            capacity: status.capacity,
            allocatable: status.allocatable,
            conditions: status.conditions,
            addresses: status.addresses,
            node_info: status.node_info,
            daemon_endpoints: status.daemon_endpoints,
            ..Default::default()
        }),
    }
}

/// Does the tenant Node show the host node's state as [`virtual_node`] would put it?
pub fn node_differs(tenant: &Node, wanted: &Node) -> bool {
    let status = |n: &Node| {
        let s = n.status.clone().unwrap_or_default();
        let conds: Vec<_> = s
            .conditions
            .iter()
            .flatten()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect();
        (s.capacity, s.allocatable, s.addresses, conds)
    };
    let labels_missing = wanted
        .metadata
        .labels
        .iter()
        .flatten()
        .any(|(k, v)| tenant.metadata.labels.as_ref().and_then(|l| l.get(k)) != Some(v));
    labels_missing || status(tenant) != status(wanted)
}

/// The tenant copy of a host Event about a synced object.
pub fn event_up(host: &Event, about: &ObjectReference, name: &str) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: about.namespace.clone(),
            ..Default::default()
        },
        involved_object: about.clone(),
        reason: host.reason.clone(),
        message: host.message.clone(),
        type_: host.type_.clone(),
        count: host.count,
        first_timestamp: host.first_timestamp.clone(),
        last_timestamp: host.last_timestamp.clone(),
        event_time: host.event_time.clone(),
        source: host.source.clone(),
        reporting_component: host.reporting_component.clone(),
        reporting_instance: host.reporting_instance.clone(),
        action: host.action.clone(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn translator() -> Translator {
        Translator {
            tenant: "dev".into(),
            host_namespace: "team-dev".into(),
            owner: None,
            api_ip: "10.96.0.10".into(),
            node_selector: BTreeMap::from([("pool".to_string(), "tenants".to_string())]),
            tolerations: vec![],
        }
    }

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
        let host = t.pod(&pod(), &[], None);
        let meta = &host.metadata;
        assert_eq!(meta.name.as_deref(), Some("web-0-x-default-x-dev"));
        assert_eq!(meta.namespace.as_deref(), Some("team-dev"));
        let labels = meta.labels.as_ref().unwrap();
        assert_eq!(labels["app"], "web");
        assert_eq!(
            labels[naming::LABEL_SYNCED_FROM],
            "dev",
            "the tenant cannot spoof it"
        );
        let spec = host.spec.unwrap();
        assert_eq!(spec.node_name, None);
        assert_eq!(spec.service_account_name, None);
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
                    "topologyKey": "zone", "namespaces": ["other"],
                    "labelSelector": {"matchLabels": {"app": "db"}}
                }]}
            }))
            .unwrap(),
        );
        let host = translator().pod(&p, &[], None);
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
        let host = translator().pod(&pod(), &[], Some("10.96.0.53"));
        let spec = host.spec.unwrap();
        assert_eq!(spec.dns_policy.as_deref(), Some("None"));
        let dns = spec.dns_config.unwrap();
        assert_eq!(dns.nameservers.unwrap(), ["10.96.0.53"]);
        assert_eq!(dns.searches.unwrap()[0], "default.svc.cluster.local");
        let without = translator().pod(&pod(), &[], None).spec.unwrap();
        assert_eq!(
            without.dns_policy, None,
            "the host's DNS when the tenant runs none"
        );
    }

    #[test]
    fn references_and_tokens_are_found() {
        let r = references(&pod());
        assert_eq!(
            r.config_maps,
            BTreeSet::from(["conf".to_string(), "kube-root-ca.crt".to_string()])
        );
        assert_eq!(
            r.secrets,
            BTreeSet::from(["creds".to_string(), "regcred".to_string()])
        );
        assert_eq!(r.claims, BTreeSet::from(["data".to_string()]));
        let tokens = token_sources(&pod());
        assert_eq!(tokens.len(), 1);
        assert_eq!(tokens[0].expiration_seconds, 3607);
    }

    #[test]
    fn a_service_selects_only_its_namespace_copies() {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "s1"},
            "spec": {"selector": {"app": "web"}, "clusterIP": "10.0.0.9",
                     "type": "NodePort",
                     "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}
        }))
        .unwrap();
        let host = translator().service(&svc);
        let spec = host.spec.unwrap();
        assert_eq!(spec.cluster_ip, None, "the host allocates it");
        assert_eq!(spec.ports.unwrap()[0].node_port, None);
        let selector = spec.selector.unwrap();
        assert_eq!(selector["app"], "web");
        assert_eq!(selector[naming::LABEL_SYNCED_FROM], "dev");
        assert_eq!(selector[naming::LABEL_VIRTUAL_NAMESPACE], "default");
        let env = service_env(&svc);
        let find = |n: &str| env.iter().find(|e| e.name == n).unwrap().value.clone();
        assert_eq!(find("WEB_SERVICE_HOST").as_deref(), Some("10.0.0.9"));
        assert_eq!(
            find("WEB_PORT_80_TCP").as_deref(),
            Some("tcp://10.0.0.9:80")
        );
    }

    #[test]
    fn ingress_backends_are_translated_and_snippets_dropped() {
        let ingress: Ingress = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "annotations": {
                "nginx.ingress.kubernetes.io/configuration-snippet": "more_set_headers x",
                "nginx.ingress.kubernetes.io/rewrite-target": "/"
            }},
            "spec": {
                "tls": [{"secretName": "web-tls"}],
                "rules": [{"http": {"paths": [{"path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]
            }
        }))
        .unwrap();
        let host = translator().ingress(&ingress);
        let annotations = host.metadata.annotations.unwrap();
        assert!(annotations.contains_key("nginx.ingress.kubernetes.io/rewrite-target"));
        assert!(!annotations.keys().any(|k| k.contains("snippet")));
        let spec = host.spec.unwrap();
        assert_eq!(
            spec.tls.unwrap()[0].secret_name.as_deref(),
            Some("web-tls-x-default-x-dev")
        );
        let rules = spec.rules.unwrap();
        let backend = &rules[0].http.as_ref().unwrap().paths[0].backend;
        assert_eq!(
            backend.service.as_ref().unwrap().name,
            "web-x-default-x-dev"
        );
    }

    #[test]
    fn token_secrets_are_never_copied_as_token_secrets() {
        let s: Secret = serde_json::from_value(json!({
            "metadata": {"name": "t", "namespace": "default"},
            "type": "kubernetes.io/service-account-token"
        }))
        .unwrap();
        assert_eq!(translator().secret(&s).type_.as_deref(), Some("Opaque"));
    }
}
