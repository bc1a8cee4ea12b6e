//! The ConfigMaps and Secrets a pod uses, judged for their size: a pod could not run on the host
//! without the copies of the data it mounts or reads, so one that is not copied refuses the pod.

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::ResourceExt;

use super::references;
use crate::copy::CopyDown;
use crate::kind_trait::Kind;
use crate::kinds::configmaps::ConfigMaps;
use crate::kinds::secrets::{self, Secrets};
use crate::tell;
use crate::tenant::Tenant;

/// Why tenant pod `p` may not run on the host for the data it uses: each ConfigMap and Secret
/// it uses that is not copied for its size (more data than `allow.maxDataBytes`, a copy past
/// its byte bounds). Each is told so too, as its own converge would (it has no copy to converge
/// while no pod of it runs).
pub(super) async fn too_large_for(cx: &Tenant, p: &Pod) -> Vec<String> {
    let cap = crate::allow::DataCap::of(&cx.tr.allow);
    let ns = p.namespace().unwrap_or_default();
    let r = references(p);
    let mut out = Vec::new();
    if ConfigMaps::enabled(&cx.policy) {
        for cm in r
            .config_maps
            .iter()
            .filter_map(|n| cx.tenant_get::<ConfigMap>(&ns, n))
            .filter(|cm| cx.selected(ConfigMaps::NAME, &cm.metadata))
        {
            let bytes = crate::allow::data_bytes(cm.data.as_ref(), cm.binary_data.as_ref());
            let copy = ConfigMaps::translate(&cx.tr, &cm, &cx.tr.host_name(&ns, &cm.name_any()));
            let review = ConfigMaps::review(&cx.tr, &cm);
            out.extend(not_copied(cx, &*cm, cap.as_ref(), bytes, &copy, review).await);
        }
    }
    if Secrets::enabled(&cx.policy) {
        for s in r
            .secrets
            .iter()
            .filter_map(|n| cx.tenant_get::<Secret>(&ns, n))
            .filter(|s| cx.selected(Secrets::NAME, &s.metadata))
            .filter(|s| s.type_.as_deref() != Some(secrets::TOKEN_TYPE))
        {
            let bytes = crate::allow::data_bytes(s.string_data.as_ref(), s.data.as_ref());
            let copy = Secrets::translate(&cx.tr, &s, &cx.tr.host_name(&ns, &s.name_any()));
            let review = Secrets::review(&cx.tr, &s);
            out.extend(not_copied(cx, &*s, cap.as_ref(), bytes, &copy, review).await);
        }
    }
    out
}

/// Why data object `obj` (holding `bytes` of data, copied as `copy`) is not copied, as a pod
/// using it is told; the object is told too, with its own `review` and the size refusals.
async fn not_copied<K>(
    cx: &Tenant,
    obj: &K,
    cap: Option<&crate::allow::DataCap>,
    bytes: usize,
    copy: &K,
    mut review: tell::Review,
) -> Vec<String>
where
    K: kube::Resource<DynamicType = ()> + serde::Serialize,
{
    let kind = K::kind(&());
    let name = obj.meta().name.clone().unwrap_or_default();
    let mut why: Vec<String> = cap
        .and_then(|c| c.pod_refusal(&kind, &name, bytes))
        .into_iter()
        .collect();
    let sized = crate::allow::byte_refusals(&cx.tr.allow, &kind, copy.meta(), copy);
    if !sized.is_empty() {
        why.push(format!(
            "{kind} {name} is not copied to the host, so the pod could not run there: {}",
            sized.join("; ")
        ));
        review.refused.extend(sized);
    }
    if !why.is_empty() {
        secrets::tell_refused(cx, obj, &review).await;
    }
    why
}
