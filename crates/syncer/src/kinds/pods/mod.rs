//! Pods: the host runs a copy of each tenant pod, confined to its tenant (see `translate`);
//! the tenant pod is bound to the virtual node of the copy and shows the copy's status; deletes
//! flow both ways, as between a kubelet and its API server. The ConfigMaps, Secrets and claims a
//! pod uses follow it down.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tenantplane_api::SyncPolicySpec;
use tracing::warn;

use crate::converge::{self, Target, delete_if_present, hash_of};
use crate::error::{Error, Result};
use crate::host::Scope;
use crate::key::Key;
use crate::kind_trait::{Kind, scoped_api};
use crate::kinds::configmaps::ConfigMaps;
use crate::kinds::nodes::node_key;
use crate::kinds::persistentvolumeclaims::Claims;
use crate::kinds::secrets::Secrets;
use crate::naming::is_tenant_api;
use crate::naming::{self, ANNOTATION_APPLIED_HASH, SYNCER_MANAGER};
use crate::stages::Stage;
use crate::tell;
use crate::tenant::Tenant;
use crate::tenant_terms::{self, Terms};

pub mod binding;
pub mod carry;
mod data;
pub mod ended;
pub mod ephemeral;
pub mod hosts;
pub mod meta;
mod plan;
pub mod references;
pub mod review;
pub mod runtime_classes;
pub mod status;
pub mod tokens;
pub mod translate;

use plan::Step;
use translate::{images, pod_meta, references};

/// Pods: the host runs a copy of each, and the tenant pod shows its status.
pub struct Pods;

impl Kind for Pods {
    const NAME: &'static str = "Pod";
    type Object = Pod;
    const SETTING: &'static str = "toHost.pods";

    fn enabled(policy: &SyncPolicySpec) -> bool {
        policy.to_host.pods.enabled
    }

    fn selector(policy: &SyncPolicySpec) -> Option<&LabelSelector> {
        policy.to_host.pods.selector.as_ref()
    }

    fn tenant_keys(p: &Pod) -> Vec<Key> {
        let ns = p.namespace().unwrap_or_default();
        let r = references(p);
        let mut keys = vec![Key::for_object::<Self>(p)];
        keys.extend(
            r.config_maps
                .into_iter()
                .map(|c| Key::of::<ConfigMaps>(ns.clone(), c)),
        );
        keys.extend(
            r.secrets
                .into_iter()
                .map(|s| Key::of::<Secrets>(ns.clone(), s)),
        );
        keys.extend(
            r.claims
                .into_iter()
                .map(|c| Key::of::<Claims>(ns.clone(), c)),
        );
        keys.extend(node_key(p));
        keys
    }

    fn host_scope(_: &SyncPolicySpec) -> Option<Scope> {
        Some(Scope::Copies)
    }

    fn host_api(client: Client, namespace: Option<&str>) -> kube::Api<Pod> {
        scoped_api(client, namespace)
    }

    fn host_keys(p: &Pod, tenant: &str) -> Vec<Key> {
        let mut keys: Vec<Key> = crate::naming::virtual_of(&p.metadata, tenant)
            .map(|v| vec![Key::of::<Self>(v.namespace, v.name)])
            .unwrap_or_default();
        keys.extend(node_key(p));
        keys
    }

    fn converge<'a>(cx: &'a Tenant, key: &'a Key) -> futures::future::BoxFuture<'a, Result<()>> {
        Box::pin(converge_pod(cx, &key.namespace, &key.name))
    }
}

/// Once the host admitted a pod, what it uses follows: its ConfigMaps and Secrets that have no
/// copy yet are looked at (see [`references::referenced`]).
fn wake_references(cx: &Tenant, t: &Pod) {
    let ns = t.namespace().unwrap_or_default();
    let r = references(t);
    let config_maps = r
        .config_maps
        .iter()
        .filter(|n| !cx.is_copied::<ConfigMap>(&ns, n))
        .map(|n| Key::of::<ConfigMaps>(ns.clone(), n.clone()));
    let secrets = r
        .secrets
        .iter()
        .filter(|n| !cx.is_copied::<Secret>(&ns, n))
        .map(|n| Key::of::<Secrets>(ns.clone(), n.clone()));
    for key in config_maps.chain(secrets) {
        cx.queue.add(key);
    }
}

async fn converge_pod(cx: &Tenant, ns: &str, name: &str) -> Result<()> {
    // Whatever changed of this pod (it went, is going, finished, got its address), Endpoints
    // written by hand hold only the addresses of pods that still have them.
    crate::kinds::endpoints::wake_stale(cx);
    let t = cx
        .tenant_get::<Pod>(ns, name)
        .filter(|t| Pods::synced(cx, &t.metadata));
    // The one translation of the name in this converge: the lookup and the copy share it.
    let host_name = cx.tr.host_name(ns, name);
    let h = cx.host_copy::<Pod>(&host_name, ns, name);
    // A copy whose uid mark was removed by hand is not taken for another pod's: its marks are
    // put back.
    let marked = h
        .as_ref()
        .and_then(|h| cx.tr.copy_of(&h.metadata))
        .map(|v| v.uid)
        .filter(|uid| !uid.is_empty());
    let copy = h.as_deref().map(|pod| plan::Copy {
        pod,
        of_uid: marked.as_deref(),
    });
    let host_pods = cx.host_api::<Pod>();
    match (plan::step(t.as_deref(), copy), t, h) {
        (Step::RemoveCopy, _, Some(h)) => {
            forget(cx, &h);
            delete_if_present(&host_pods, &h, None).await?;
            Ok(())
        }
        (
            Step::ReplaceStaleCopy {
                already_going: false,
            },
            _,
            Some(h),
        ) => {
            delete_if_present(&host_pods, &h, None).await?;
            Ok(())
        }
        (Step::DeleteCopy { grace }, _, Some(h)) => {
            let grace = crate::allow::bound_grace(&cx.tr.allow.durations, grace);
            delete_if_present(&host_pods, &h, grace).await?;
            Ok(())
        }
        (Step::FinishTenantPod, Some(t), _) => finish_tenant_pod(cx, &t).await,
        (Step::LoseTenantPod, Some(t), _) => {
            delete_if_present(&cx.tenant_api::<Pod>(ns), &*t, Some(0)).await?;
            Ok(())
        }
        (Step::Create, Some(t), _) => create(cx, t, &host_name).await,
        (Step::Keep, Some(t), Some(h)) => keep(cx, t, h, &host_name).await,
        _ => Ok(()),
    }
}

/// The host copy of tenant pod `t` is gone while `t` is being deleted: `t` can go, as a kubelet
/// would confirm, in a terminal phase first (a Job's pod failure policy waits for one before its
/// controller lets the pod go).
async fn finish_tenant_pod(cx: &Tenant, t: &Pod) -> Result<()> {
    let t_uid = t.uid().unwrap_or_default();
    let tenant_pods = cx.tenant_api::<Pod>(&t.namespace().unwrap_or_default());
    tell::forget(cx, &t_uid);
    if let Some(status) = status::terminal_status(t) {
        tenant_pods
            .patch_status(
                &t.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"uid": t_uid}, "status": status})),
            )
            .await?;
    }
    delete_if_present(&tenant_pods, t, Some(0)).await?;
    Ok(())
}

/// What the profile makes of tenant pod `t` (under the host's RuntimeClass of its handler, when
/// it maps one): the review, with the data it uses that is too large to copy.
async fn reviewed(cx: &Tenant, t: Arc<Pod>, h: Option<&Pod>) -> Result<(Arc<Pod>, tell::Review)> {
    let t = runtime_classes::for_host(cx, t, h).await?;
    let mut review = review::review(&cx.tr, &t);
    // A copy could not run without the data it uses, which is not copied when too large.
    review.refused.extend(data::too_large_for(cx, &t).await);
    Ok((t, review))
}

/// Tenant pod `t` has no copy yet: make one, as the review allows, and tell the tenant what it
/// left out or why it refused.
async fn create(cx: &Tenant, t: Arc<Pod>, host_name: &str) -> Result<()> {
    let (t, review) = reviewed(cx, t, None).await?;
    if let Some(refused) = review.refusal() {
        mark_unschedulable(cx, &t, tell::NOT_ALLOWED, &refused.to_string()).await;
    }
    tell::enforce(cx, &*t, None, &review).await?;
    create_host_pod(cx, &t, host_name).await
}

/// Tenant pod `t` has its copy `h`: keep the copy in step (its marks, the tokens it mounts, its
/// binding) and bring its status up.
async fn keep(cx: &Tenant, t: Arc<Pod>, h: Arc<Pod>, host_name: &str) -> Result<()> {
    let (t, review) = reviewed(cx, t, Some(&h)).await?;
    if review.refusal().is_some() {
        // Refused now (the profile changed, which restarts the syncer): no copy runs on.
        forget(cx, &h);
    }
    tell::enforce(cx, &*t, Some(&*h), &review).await?;
    restore(cx, &t, &h, host_name).await?;
    wake_references(cx, &t);
    let (ns, name) = (t.namespace().unwrap_or_default(), t.name_any());
    tokens::ensure_tokens(cx, &Key::of::<Pods>(&ns, &name), &t, &h).await?;
    if h.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    if binding::reject_unplaceable(cx, &t, &h).await? {
        return Ok(());
    }
    binding::bind(cx, &t, &h).await?;
    status_up(cx, &t, &h).await?;
    if review.dropped.is_empty() {
        tell::forget(cx, &t.uid().unwrap_or_default());
    }
    if ended::ended(&h) {
        // Its final status is the tenant pod's now: past the bound, the oldest ended copies go.
        ended::trim(cx).await?;
    }
    Ok(())
}

/// Write copy `h`'s status, in the tenant's terms, to tenant pod `t` when it differs.
async fn status_up(cx: &Tenant, t: &Pod, h: &Pod) -> Result<()> {
    let node = h.spec.as_ref().and_then(|s| s.node_name.clone());
    let observed = t.status.as_ref().and_then(|s| s.observed_generation);
    let mut wanted = status::pod_status_up(
        h,
        &terms_for(cx, t, node),
        cx.tr.kubelet.as_ref(),
        cx.tr.allow.node_addresses,
        observed,
    );
    status::keep_tenant_conditions(&mut wanted, t);
    status::disk_as_asked(&mut wanted, t);
    if h.status.is_none() || !status::pod_status_differs(t.status.as_ref(), &wanted) {
        return Ok(());
    }
    let ns = t.namespace().unwrap_or_default();
    let t_ip = t.status.as_ref().and_then(|s| s.pod_ip.as_ref());
    if t_ip != wanted.pod_ip.as_ref() {
        // A new address of our own: endpoints written by hand may name it now.
        crate::kinds::endpoints::wake_namespace(cx, &ns);
    }
    let (params, patch) = (
        PatchParams::default(),
        Patch::Merge(json!({"metadata": {"uid": t.uid().unwrap_or_default()}, "status": wanted})),
    );
    let (tenant_pods, name) = (cx.tenant_api::<Pod>(&ns), t.name_any());
    let write = tenant_pods.patch_status(&name, &params, &patch);
    cx.reporter
        .stages
        .time(Stage::TenantWrite, Pods::NAME, write)
        .await?;
    Ok(())
}

/// How host text about the copy of tenant pod `t`, on host node `node`, reads in the tenant
/// (see [`tenant_terms`]).
fn terms_for<'a>(cx: &'a Tenant, t: &'a Pod, node: Option<String>) -> Terms<'a> {
    let known: Vec<String> = node.into_iter().collect();
    Terms {
        host_namespace: &cx.tr.host_namespace,
        namespace: t.metadata.namespace.as_deref().unwrap_or_default(),
        name: t.metadata.name.as_deref().unwrap_or_default(),
        copy: Box::new(|w| tenant_terms::copy_named(cx, w)),
        hidden_node: Box::new(move |w| tenant_terms::hidden_node(cx, w, &known)),
        address: Box::new(|ip| tenant_terms::shown_address(cx, ip)),
    }
}

/// Drop what the syncer remembers about a pod whose copy goes.
fn forget(cx: &Tenant, h: &Pod) {
    if let Some(uid) = h.uid() {
        tokens::forget(cx, &uid);
    }
    if let Some(v) = cx.tr.copy_of(&h.metadata) {
        tell::forget(cx, &v.uid);
    }
}

/// The address of the tenant's DNS Service on the host, if it runs one: its host copy's (the
/// tenant Service takes it over, but may not have yet).
fn tenant_dns(cx: &Tenant) -> Option<String> {
    let (ns, name) = ("kube-system", "kube-dns");
    cx.host_copy::<Service>(&cx.tr.host_name(ns, name), ns, name)
        .and_then(|s| s.spec.as_ref()?.cluster_ip.clone())
        .filter(|ip| ip != "None" && !ip.is_empty())
}

/// What of a pod copy can change once it runs: its metadata, its images, tolerations and
/// active deadline (see [`carry`]). Its hash decides whether a copy is up to date.
fn changeable(desired: &Pod) -> Value {
    let spec = desired.spec.as_ref();
    let init_images: Vec<_> = spec
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
        .map(|c| (&c.name, &c.image))
        .collect();
    json!({
        "metadata": {
            "labels": desired.metadata.labels,
            "annotations": desired.metadata.annotations,
            "ownerReferences": desired.metadata.owner_references,
        },
        "images": images(desired),
        "initImages": init_images,
        "tolerations": spec.map(|s| &s.tolerations),
        "activeDeadlineSeconds": spec.map(|s| s.active_deadline_seconds),
    })
}

/// Make the host copy, `host_name`, of tenant pod `t`, which [`tell::enforce`] let through.
async fn create_host_pod(cx: &Tenant, t: &Pod, host_name: &str) -> Result<()> {
    let ns = t.namespace().unwrap_or_default();
    let services: Vec<Arc<Service>> = cx
        .tenant_list::<Service>()
        .into_iter()
        .filter(|s| s.namespace().as_deref() == Some(ns.as_str()))
        // The tenant API server's own Service: pods get the variables that reach it.
        .filter(|s| !is_tenant_api(&ns, &s.name_any()))
        // Only at an address the host gave: one the tenant Service has not taken over yet may
        // be someone else's on the host.
        .filter(|s| {
            let ip = |s: &Service| s.spec.as_ref().and_then(|s| s.cluster_ip.clone());
            let name = s.name_any();
            cx.host_copy::<Service>(&cx.tr.host_name(&ns, &name), &ns, &name)
                .is_some_and(|h| ip(&h) == ip(s))
        })
        .collect();
    let service_refs: Vec<&Service> = services.iter().map(|s| &**s).collect();
    let dns = tenant_dns(cx);
    let mut desired = translate::pod(&cx.tr, t, host_name, &service_refs, dns.as_deref());
    if let Some(node) = binding::bound_by_name(cx, t, &desired)
        && let Some(spec) = desired.spec.as_mut()
    {
        binding::pin_to_node(spec, &node);
    }
    // The copy as it would be written, but for the Services' variables the syncer adds (the
    // tenant's kubelet would add as many): its size is the host's to bear.
    let measured = translate::pod(&cx.tr, t, host_name, &[], dns.as_deref());
    let too_large = tell::Review {
        refused: crate::allow::byte_refusals(
            &cx.tr.allow,
            Pods::NAME,
            &measured.metadata,
            &measured,
        ),
        dropped: vec![],
    };

    if let Some(refused) = too_large.refusal() {
        mark_unschedulable(cx, t, tell::NOT_ALLOWED, &refused.to_string()).await;
        tell::enforce(cx, t, None, &too_large).await?;
    }
    let hash = hash_of(&changeable(&desired));
    let (mut body, _) = converge::stamped(&desired)?;
    body["metadata"]["annotations"][ANNOTATION_APPLIED_HASH] = json!(hash);
    let created = converge::converge_body(
        &cx.host_api::<Pod>(),
        SYNCER_MANAGER,
        None,
        body,
        &hash,
        Target::Copy {
            live_uid: None,
            ours: &cx.is_copy_of(&ns, &t.name_any()),
            stages: &cx.reporter.stages,
            kind: Pods::NAME,
        },
    )
    .await
    .map_err(Error::on_host);
    if let Err(e @ Error::HostRejected(_)) = &created {
        // The host's refusal names the copy (`pods "web-x-default-x-dev" is forbidden…`).
        let message = tenant_terms::status_message(&e.to_string(), &terms_for(cx, t, None));
        let _ = tell::tell(cx, t, e.reason(), &message).await;
        mark_unschedulable(cx, t, e.reason(), &message).await;
    }
    created.map(|_| ())
}

/// Put back what a hand edit on the host changed, and carry the tenant's edits down: labels,
/// annotations, images, a resize ([`carry::resize`]) and ephemeral containers
/// ([`ephemeral::carry`]). The rest of a pod's spec cannot change;
/// the apply sends it as the host has it, so only these fields move (and a label the tenant
/// removed is removed).
async fn restore(cx: &Tenant, t: &Pod, h: &Pod, host_name: &str) -> Result<()> {
    if h.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let mut meta = pod_meta(&cx.tr, t, host_name);
    // The copy as it would be made now (its environment and DNS aside, which cannot change).
    let mut want = translate::pod(&cx.tr, t, host_name, &[], None)
        .spec
        .unwrap_or_default();
    // Of the ephemeral containers, only which run counts here ([`ephemeral::carry`] starts them).
    want.ephemeral_containers = t.spec.as_ref().and_then(|s| s.ephemeral_containers.clone());
    let spec = carry::carried_spec(&h.spec.clone().unwrap_or_default(), &want);
    if !carry::carries_all(&spec, &want) {
        // Part of the tenant's spec does not reach the host: the copy keeps the generation it
        // last carried whole.
        let last = h
            .annotations()
            .get(naming::ANNOTATION_TENANT_GENERATION)
            .cloned();
        if let Some(a) = meta.annotations.as_mut() {
            match last {
                Some(g) => a.insert(naming::ANNOTATION_TENANT_GENERATION.into(), g),
                None => a.remove(naming::ANNOTATION_TENANT_GENERATION),
            };
        }
    }
    let desired = Pod {
        metadata: meta.clone(),
        spec: Some(spec.clone()),
        status: None,
    };
    let hash = hash_of(&changeable(&desired));
    let mut body = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": h.name_any(),
            "namespace": cx.tr.host_namespace,
            "labels": meta.labels,
            "annotations": meta.annotations,
            "ownerReferences": meta.owner_references,
        },
        "spec": spec,
    });
    body["metadata"]["annotations"][ANNOTATION_APPLIED_HASH] = json!(hash);
    converge::converge_body(
        &cx.host_api::<Pod>(),
        SYNCER_MANAGER,
        Some(h),
        body,
        &hash,
        Target::Copy {
            live_uid: h.uid().as_deref(),
            ours: &|_| false,
            stages: &cx.reporter.stages,
            kind: Pods::NAME,
        },
    )
    .await
    .map_err(Error::on_host)?;
    carry::resize(cx, t, &h.name_any(), &spec, &want, terms_for(cx, t, None)).await?;
    ephemeral::carry(cx, t, h, host_name, terms_for(cx, t, None)).await
}

/// Show why a tenant pod does not run in its `PodScheduled` condition (the Event is
/// [`tell::tell`]'s), as a scheduler would.
async fn mark_unschedulable(cx: &Tenant, t: &Pod, reason: &str, message: &str) {
    let message = tenantplane_api::text::bounded(message);
    let message = message.as_str();
    let already = t
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| {
            c.type_ == "PodScheduled"
                && c.reason.as_deref() == Some(reason)
                && c.message.as_deref() == Some(message)
        });
    if already {
        return;
    }
    let patch = json!({
        "metadata": {"uid": t.uid()},
        "status": {"conditions": [{
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": message,
            "lastTransitionTime": Timestamp::now().to_string(),
        }]}
    });
    if let Err(e) = cx
        .tenant_api::<Pod>(&t.namespace().unwrap_or_default())
        .patch_status(
            &t.name_any(),
            &PatchParams::default(),
            &Patch::Strategic(patch),
        )
        .await
    {
        warn!(tenant = %cx.tr.name(), namespace = %cx.tr.host_namespace, pod = %format!("{}/{}", t.namespace().unwrap_or_default(), t.name_any()), reason, error = %crate::error::log_text(&e), "marking a rejected tenant pod unschedulable failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_wakes_what_it_uses_and_its_node() {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c",
                "envFrom": [{"secretRef": {"name": "creds"}}]}],
                "volumes": [{"name": "v", "configMap": {"name": "conf"}},
                            {"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}
        }))
        .unwrap();
        let keys: Vec<String> = Pods::tenant_keys(&p).iter().map(Key::describe).collect();
        assert_eq!(
            keys,
            [
                "Pod default/web",
                "ConfigMap default/conf",
                "Secret default/creds",
                "PersistentVolumeClaim default/data",
                "Node n1"
            ]
        );
    }

    #[test]
    fn only_metadata_and_images_decide_whether_a_copy_is_current() {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "a:1", "env": [{"name": "X", "value": "1"}]}]}
        }))
        .unwrap();
        let mut env_changed = p.clone();
        env_changed.spec.as_mut().unwrap().containers[0].env = None;
        assert_eq!(hash_of(&changeable(&p)), hash_of(&changeable(&env_changed)));
        let mut relabelled = p.clone();
        relabelled.metadata.labels = None;
        assert_ne!(hash_of(&changeable(&p)), hash_of(&changeable(&relabelled)));
        let mut new_image = p;
        new_image.spec.as_mut().unwrap().containers[0].image = Some("a:2".into());
        assert_ne!(
            hash_of(&changeable(&relabelled)),
            hash_of(&changeable(&new_image))
        );
    }
}
