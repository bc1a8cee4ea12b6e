//! The pure translation of a pod down (the host copy of a tenant pod, confined to its tenant),
//! and what it needs of the host. What a pod uses is in `references`, what comes up (its
//! status) in `status`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    EnvVar, KeyToPath, PersistentVolumeClaimVolumeSource, Pod, PodDNSConfigOption, PodSpec,
    Service, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::ResourceExt;

use crate::allow;
use crate::kinds::services::{service_env, tenant_api_env};
use crate::naming;
use crate::translate::Translator;

pub use super::meta::pod_meta;
pub use super::references::{References, ephemeral_claim, references};
use super::review::placement;
pub use super::review::review;

/// The images of a pod's containers, by container name: all of a pod's spec that can change.
pub fn images(pod: &Pod) -> Vec<(String, Option<String>)> {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| (c.name.clone(), c.image.clone()))
        .collect()
}

/// The host copy of a tenant pod. `services` are the tenant Services of the pod's namespace
/// (for the service environment variables); `dns` the tenant's DNS service address, if any.
/// `host_name` names the copy (see [`Translator::host_name`]).
pub fn pod(
    tr: &Translator,
    pod: &Pod,
    host_name: &str,
    services: &[&Service],
    dns: Option<&str>,
) -> Pod {
    let ns = pod.namespace().unwrap_or_default();
    let meta = pod_meta(tr, pod, host_name);
    let mut spec = pod.spec.clone().unwrap_or_default();
    // Host Services in this namespace are other names for tenant objects; the tenant's are
    // given explicitly below.
    let links = spec.enable_service_links.unwrap_or(true);
    host_identity(tr, pod, &mut spec);
    let tenant_subdomain = spec.subdomain.take();
    if let Some(sub) = &tenant_subdomain {
        spec.subdomain = Some(tr.host_name(&ns, sub));
    }
    // Placement: the tenant's, as far as the profile allows it; the profile's own wins.
    placement(tr, &mut spec);
    allow::topology(&tr.allow, &mut spec);
    allow::bound_durations(&tr.allow.durations, &mut spec);
    allow::bound_disk(&tr.allow.ephemeral_storage, &mut spec);
    // A gated pod gets no copy (see `pods`): a copy's gate would wait for a host controller.
    spec.scheduling_gates = None;
    if let Some(secrets) = spec.image_pull_secrets.as_mut() {
        for s in secrets.iter_mut() {
            s.name = tr.host_name(&ns, &s.name);
        }
    }
    tenant_dns(&ns, dns, &mut spec);
    host_volumes(tr, pod, &ns, host_name, &mut spec);
    let mut extra_env = tenant_api_env(&tr.api_ip);
    if links {
        for svc in services {
            extra_env.extend(service_env(svc));
        }
    }
    host_env(tr, &ns, extra_env, &mut spec);
    spec.ephemeral_containers = None;
    pull_always(&mut spec);
    confine_affinity(tr, &ns, &mut spec);
    confine_spread(tr, &ns, &mut spec);
    super::hosts::rewrite(&mut spec, &ns, &pod.name_any(), tenant_subdomain.as_deref());
    Pod {
        metadata: meta,
        spec: Some(spec),
        status: None,
    }
}

/// Who the copy is and where it runs: scheduling is the host's, the ServiceAccount the tenant's
/// own on the host, with no host token, and the pod keeps its short hostname.
fn host_identity(tr: &Translator, pod: &Pod, spec: &mut PodSpec) {
    // Scheduling is the host's; the tenant's binding follows the host's. Only a priority class
    // the profile allows is asked for; the host's admission computes the rest.
    spec.node_name = None;
    spec.scheduler_name = None;
    spec.priority_class_name =
        allow::priority_class(&tr.allow, spec.priority_class_name.as_deref()).0;
    spec.priority = None;
    spec.preemption_policy = None;
    spec.overhead = None;
    // The copy runs as the tenant's own host ServiceAccount (see `identity`), and no host
    // token is ever mounted.
    spec.service_account_name = Some(crate::identity::workload_service_account_name(
        &tr.tenant.name,
    ));
    spec.service_account = None;
    spec.automount_service_account_token = Some(false);
    spec.enable_service_links = Some(false);
    let name = pod.name_any();
    if spec.hostname.is_none() && name.len() <= 63 && !name.contains('.') {
        spec.hostname = Some(name);
    }
    // The host's kubelet would make the hostname the copy's full name, which names the host
    // namespace and the copy (`review` tells the tenant): the pod keeps its short hostname, and
    // its full name is in its hosts file (`hosts`).
    spec.set_hostname_as_fqdn = None;
}

/// Without the host's network, ClusterFirstWithHostNet is ClusterFirst: the tenant's DNS.
fn tenant_dns(ns: &str, dns: Option<&str>, spec: &mut PodSpec) {
    let cluster_first = matches!(
        spec.dns_policy.as_deref(),
        None | Some("ClusterFirst" | "ClusterFirstWithHostNet")
    ) && spec.host_network != Some(true);
    let (Some(dns), true) = (dns, cluster_first) else {
        return;
    };
    spec.dns_policy = Some("None".into());
    let mut config = spec.dns_config.take().unwrap_or_default();
    config.nameservers = Some(vec![dns.to_string()]);
    config.searches = Some(vec![
        format!("{ns}.svc.cluster.local"),
        "svc.cluster.local".into(),
        "cluster.local".into(),
    ]);
    config
        .options
        .get_or_insert_with(Vec::new)
        .push(PodDNSConfigOption {
            name: Some("ndots".into()),
            value: Some("5".into()),
        });
    spec.dns_config = Some(config);
}

/// Volumes: tenant names become host names; projected service-account tokens come from the host
/// token Secret, which the syncer fills through TokenRequest.
fn host_volumes(tr: &Translator, pod: &Pod, ns: &str, host_pod: &str, spec: &mut PodSpec) {
    let mut token_index = 0;
    for volume in spec.volumes.iter_mut().flatten() {
        if let Some(cm) = volume.config_map.as_mut() {
            cm.name = tr.host_name(ns, &cm.name);
        }
        if let Some(s) = volume.secret.as_mut()
            && let Some(name) = s.secret_name.as_mut()
        {
            *name = tr.host_name(ns, name);
        }
        if let Some(pvc) = volume.persistent_volume_claim.as_mut() {
            pvc.claim_name = tr.host_name(ns, &pvc.claim_name);
        }
        // The tenant's own controller makes the claim of an ephemeral volume; the copy mounts
        // that claim's copy, so the host never expands a template the tenant wrote.
        if volume.ephemeral.take().is_some() {
            volume.persistent_volume_claim = Some(PersistentVolumeClaimVolumeSource {
                claim_name: tr.host_name(ns, &ephemeral_claim(&pod.name_any(), &volume.name)),
                read_only: None,
            });
        }
        if let Some(r) = volume
            .csi
            .as_mut()
            .and_then(|c| c.node_publish_secret_ref.as_mut())
        {
            r.name = tr.host_name(ns, &r.name);
        }
        if let Some(d) = volume.downward_api.as_mut() {
            for item in d.items.iter_mut().flatten() {
                if let Some(f) = item.field_ref.as_mut() {
                    f.field_path = field_path(tr, &f.field_path);
                }
            }
        }
        if let Some(projected) = volume.projected.as_mut() {
            for source in projected.sources.iter_mut().flatten() {
                rewrite_projection(tr, source, ns, host_pod, &mut token_index);
            }
        }
    }
}

/// Every container's environment in host form, after `extra_env` (the tenant API's address and
/// the tenant Services' variables).
fn host_env(tr: &Translator, ns: &str, mut extra_env: Vec<EnvVar>, spec: &mut PodSpec) {
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
                    r.name = tr.host_name(ns, &r.name);
                }
                if let Some(r) = from.secret_key_ref.as_mut() {
                    r.name = tr.host_name(ns, &r.name);
                }
                if let Some(f) = from.field_ref.as_mut() {
                    f.field_path = field_path(tr, &f.field_path);
                }
            }
        }
        for e in c.env_from.iter_mut().flatten() {
            if let Some(r) = e.config_map_ref.as_mut() {
                r.name = tr.host_name(ns, &r.name);
            }
            if let Some(r) = e.secret_ref.as_mut() {
                r.name = tr.host_name(ns, &r.name);
            }
        }
        vars.extend(c.env.take().unwrap_or_default());
        c.env = Some(vars);
    }
}

/// Every image is pulled with the pod's own credentials: an image cached on the node for someone
/// else never runs without them.
fn pull_always(spec: &mut PodSpec) {
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        c.image_pull_policy = Some("Always".into());
    }
    for v in spec.volumes.iter_mut().flatten() {
        if let Some(image) = v.image.as_mut() {
            image.pull_policy = Some("Always".into());
        }
    }
}

/// Pod (anti-)affinity terms select tenant labels; on the host they must only match copies from
/// the same tenant namespace.
fn confine_affinity(tr: &Translator, ns: &str, spec: &mut PodSpec) {
    let Some(affinity) = spec.affinity.as_mut() else {
        return;
    };
    for term in affinity_terms(affinity) {
        // Tenant namespaces are labels on the host; a tenant namespace selector cannot be read
        // there, so it widens to every namespace of the tenant.
        let namespaces = term.namespaces.take().unwrap_or_default();
        let own_namespace = namespaces.is_empty() && term.namespace_selector.is_none();
        term.namespace_selector = None;
        for keys in [
            term.match_label_keys.as_mut(),
            term.mismatch_label_keys.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            for k in keys.iter_mut() {
                *k = tr.label_key(k);
            }
        }
        let selector = term.label_selector.get_or_insert_with(Default::default);
        host_label_selector(tr, selector);
        let labels = selector.match_labels.get_or_insert_with(BTreeMap::new);
        labels.insert(naming::LABEL_SYNCED_FROM.into(), tr.tenant.name.clone());
        if own_namespace {
            labels.insert(
                naming::LABEL_VIRTUAL_NAMESPACE.into(),
                naming::label_value(ns),
            );
        } else if !namespaces.is_empty() {
            selector
                .match_expressions
                .get_or_insert_with(Vec::new)
                .push(LabelSelectorRequirement {
                    key: naming::LABEL_VIRTUAL_NAMESPACE.into(),
                    operator: "In".into(),
                    values: Some(namespaces.iter().map(|n| naming::label_value(n)).collect()),
                });
        }
    }
}

/// Spread constraints count the copies of the same tenant namespace, by their host labels.
fn confine_spread(tr: &Translator, ns: &str, spec: &mut PodSpec) {
    for c in spec.topology_spread_constraints.iter_mut().flatten() {
        let selector = c.label_selector.get_or_insert_with(Default::default);
        host_label_selector(tr, selector);
        let labels = selector.match_labels.get_or_insert_with(BTreeMap::new);
        labels.insert(naming::LABEL_SYNCED_FROM.into(), tr.tenant.name.clone());
        labels.insert(
            naming::LABEL_VIRTUAL_NAMESPACE.into(),
            naming::label_value(ns),
        );
        for k in c.match_label_keys.iter_mut().flatten() {
            *k = tr.label_key(k);
        }
    }
}

/// A tenant label selector in host form: its keys as the host copies carry them.
pub(crate) fn host_label_selector(tr: &Translator, selector: &mut LabelSelector) {
    if let Some(labels) = selector.match_labels.take() {
        selector.match_labels = Some(naming::host_labels(&tr.tenant.name, Some(&labels)));
    }
    for e in selector.match_expressions.iter_mut().flatten() {
        e.key = tr.label_key(&e.key);
    }
}

fn rewrite_projection(
    tr: &Translator,
    source: &mut VolumeProjection,
    ns: &str,
    host_pod: &str,
    token_index: &mut usize,
) {
    if let Some(cm) = source.config_map.as_mut() {
        cm.name = tr.host_name(ns, &cm.name);
    }
    if let Some(s) = source.secret.as_mut() {
        s.name = tr.host_name(ns, &s.name);
    }
    if let Some(d) = source.downward_api.as_mut() {
        for item in d.items.iter_mut().flatten() {
            if let Some(f) = item.field_ref.as_mut() {
                f.field_path = field_path(tr, &f.field_path);
            }
        }
    }
    if let Some(token) = source.service_account_token.take() {
        let key = format!("token-{token_index}");
        *token_index += 1;
        source.secret = Some(k8s_openapi::api::core::v1::SecretProjection {
            name: naming::token_secret_name(host_pod),
            items: Some(vec![KeyToPath {
                key,
                path: token.path,
                mode: None,
            }]),
            optional: Some(false),
        });
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

/// Downward API fields that name the pod point at the tenant's values, kept in annotations; one
/// label points at its host form (a Job's pods read their completion index so).
fn field_path(tr: &Translator, path: &str) -> String {
    if let Some(key) = path
        .strip_prefix("metadata.labels['")
        .and_then(|k| k.strip_suffix("']"))
    {
        return format!("metadata.labels['{}']", tr.label_key(key));
    }
    let annotation = match path {
        "metadata.name" => naming::ANNOTATION_VIRTUAL_NAME,
        "metadata.namespace" => naming::ANNOTATION_VIRTUAL_NAMESPACE,
        "metadata.uid" => naming::ANNOTATION_VIRTUAL_UID,
        "spec.serviceAccountName" => naming::ANNOTATION_SERVICE_ACCOUNT,
        // The tenant pod's host address is its virtual Node's: the host node's only where the
        // profile shows node addresses.
        "status.hostIP" | "status.hostIPs" if !tr.allow.node_addresses => {
            naming::ANNOTATION_HOST_IP
        }
        other => return other.to_string(),
    };
    format!("metadata.annotations['{annotation}']")
}

#[cfg(test)]
mod tests;
