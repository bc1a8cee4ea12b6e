//! PersistentVolumeClaims go down; the host binds them, and their phase and capacity come back.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, TypedLocalObjectReference};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::allow;
use crate::copy::CopyDown;
use crate::copy_down_kind;
use crate::error::Result;
use crate::kind_trait::Kind;
use crate::tell::Review;
use crate::tenant::Tenant;
use crate::translate::Translator;

/// PersistentVolumeClaims, copied down when the policy or a synced pod asks for them.
pub struct Claims;

copy_down_kind!(
    Claims,
    PersistentVolumeClaim,
    "PersistentVolumeClaim",
    to_host.persistent_volume_claims as "persistentVolumeClaims",
    then = status_up
);

impl CopyDown for Claims {
    fn review(tr: &Translator, pvc: &PersistentVolumeClaim) -> Review {
        review(tr, pvc)
    }

    fn review_in(
        cx: &Tenant,
        pvc: &PersistentVolumeClaim,
        live: Option<&PersistentVolumeClaim>,
    ) -> Review {
        review_against(&cx.tr, pvc, live)
    }

    fn translate_in(
        cx: &Tenant,
        pvc: &PersistentVolumeClaim,
        host_name: &str,
        live: Option<&PersistentVolumeClaim>,
    ) -> PersistentVolumeClaim {
        let mut copy = Self::translate(&cx.tr, pvc, host_name);
        if let Some(live) = live
            && !size_refusals(&cx.tr, pvc).is_empty()
        {
            // Over the cap, an existing claim keeps its size: refusing it would delete the
            // copy and its volume's data with it.
            if let (Some(spec), Some(live)) = (copy.spec.as_mut(), live.spec.as_ref()) {
                spec.resources = live.resources.clone();
            }
        }
        copy
    }

    fn wanted(cx: &Tenant, c: &PersistentVolumeClaim) -> bool {
        Self::synced(cx, &c.metadata)
    }

    fn translate(
        tr: &Translator,
        pvc: &PersistentVolumeClaim,
        host_name: &str,
    ) -> PersistentVolumeClaim {
        let ns = pvc.namespace().unwrap_or_default();
        let mut spec = pvc.spec.clone().unwrap_or_default();
        // The host binds the copy; a tenant cannot name a host volume, pick host volumes by
        // their labels or clone a host claim: only a clone of its own claim's copy is asked for.
        spec.volume_name = None;
        spec.selector = None;
        spec.volume_attributes_class_name = None;
        spec.data_source = spec.data_source.filter(own_claim).map(|mut d| {
            d.name = tr.host_name(&ns, &d.name);
            d
        });
        spec.data_source_ref = spec
            .data_source_ref
            .filter(|r| {
                r.namespace.is_none()
                    && own_claim(&TypedLocalObjectReference {
                        api_group: r.api_group.clone(),
                        kind: r.kind.clone(),
                        name: r.name.clone(),
                    })
            })
            .map(|mut r| {
                r.name = tr.host_name(&ns, &r.name);
                r
            });
        PersistentVolumeClaim {
            metadata: tr.host_meta(Self::NAME, &pvc.metadata, host_name),
            spec: Some(spec),
            status: None,
        }
    }
}

/// Is a claim's data source another claim of the tenant's (its copy can be cloned)?
fn own_claim(d: &TypedLocalObjectReference) -> bool {
    d.kind == "PersistentVolumeClaim" && d.api_group.as_deref().unwrap_or_default().is_empty()
}

/// Why the claim asks for more storage than one claim may have.
fn size_refusals(tr: &Translator, pvc: &PersistentVolumeClaim) -> Vec<String> {
    let resources = pvc.spec.as_ref().and_then(|s| s.resources.as_ref());
    allow::claim_size_refusals(
        &tr.allow,
        resources.and_then(|r| r.requests.as_ref()),
        resources.and_then(|r| r.limits.as_ref()),
    )
}

/// What a claim's copy leaves out, and why it may have none (its storage class, its size).
pub fn review(tr: &Translator, pvc: &PersistentVolumeClaim) -> Review {
    review_against(tr, pvc, None)
}

/// [`review`] of a claim whose host copy is `live`: a claim grown past the cap keeps the size
/// its copy has (the growth is left out), rather than losing the copy.
fn review_against(
    tr: &Translator,
    pvc: &PersistentVolumeClaim,
    live: Option<&PersistentVolumeClaim>,
) -> Review {
    let spec = pvc.spec.clone().unwrap_or_default();
    let mut dropped = tr.annotations(Claims::NAME, &pvc.metadata).1;
    if spec.volume_name.is_some() {
        dropped.push(
            "spec.volumeName is left out: the host binds the claim to a volume of its choosing"
                .into(),
        );
    }
    if spec.volume_attributes_class_name.is_some() {
        dropped.push("spec.volumeAttributesClassName is left out: host volume classes are the host's to give".into());
    }
    if spec.selector.is_some() {
        dropped
            .push("spec.selector is left out: host volumes are not picked by their labels".into());
    }
    let foreign = spec.data_source.as_ref().is_some_and(|d| !own_claim(d))
        || spec.data_source_ref.as_ref().is_some_and(|r| {
            r.namespace.is_some()
                || r.kind != "PersistentVolumeClaim"
                || r.api_group.as_deref().is_some_and(|g| !g.is_empty())
        });
    if foreign {
        dropped.push(
            "the data source is left out: only another claim of the same namespace can be cloned"
                .into(),
        );
    }
    let mut refused = allow::claim_refusals(&tr.allow, spec.storage_class_name.as_deref());
    let size = size_refusals(tr, pvc);
    match live.and_then(|l| {
        l.spec
            .as_ref()?
            .resources
            .as_ref()?
            .requests
            .as_ref()?
            .get("storage")
    }) {
        Some(kept) => dropped.extend(
            size.into_iter()
                .map(|s| format!("{s}; the host claim stays at {}", kept.0)),
        ),
        None => refused.extend(size),
    }
    Review { refused, dropped }
}

/// Phase, capacity and access modes come back; the spec is the host's once bound.
async fn status_up(
    cx: &Tenant,
    t: &Arc<PersistentVolumeClaim>,
    h: &Arc<PersistentVolumeClaim>,
) -> Result<()> {
    let hs = h.status.clone().unwrap_or_default();
    let ts = t.status.clone().unwrap_or_default();
    if hs.phase != ts.phase || hs.capacity != ts.capacity || hs.access_modes != ts.access_modes {
        cx.tenant_api::<PersistentVolumeClaim>(&t.namespace().unwrap_or_default())
            .patch_status(
                &t.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "phase": hs.phase, "capacity": hs.capacity, "accessModes": hs.access_modes,
                }})),
            )
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::tests::{host_name_of, translator};

    #[test]
    fn a_claim_copy_names_no_host_volume_or_source() {
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "default"},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-of-someone",
                     "dataSource": {"kind": "VolumeSnapshot", "apiGroup": "snapshot.storage.k8s.io", "name": "dev-data"},
                     "selector": {"matchLabels": {"owner": "payments"}},
                     "resources": {"requests": {"storage": "1Gi"}}}
        }))
        .unwrap();
        let tr = translator();
        let spec = Claims::translate(&tr, &pvc, &host_name_of(&tr, &pvc.metadata))
            .spec
            .unwrap();
        assert_eq!(spec.volume_name, None);
        assert!(spec.data_source.is_none() && spec.data_source_ref.is_none());
        assert_eq!(spec.access_modes.unwrap(), ["ReadWriteOnce"]);
        assert!(spec.selector.is_none());
        assert_eq!(review(&translator(), &pvc).dropped.len(), 3);
        let mut clone = pvc;
        clone.spec.as_mut().unwrap().data_source = Some(TypedLocalObjectReference {
            api_group: None,
            kind: "PersistentVolumeClaim".into(),
            name: "old".into(),
        });
        let spec = Claims::translate(&tr, &clone, &host_name_of(&tr, &clone.metadata))
            .spec
            .unwrap();
        assert_eq!(
            spec.data_source.unwrap().name,
            "old-x-default-x-dev",
            "its own claim's copy"
        );
    }

    #[test]
    fn a_claim_larger_than_the_profile_allows_is_refused() {
        let claim = |size: &str| -> PersistentVolumeClaim {
            serde_json::from_value(json!({
                "metadata": {"name": "data", "namespace": "default"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": size}}}
            }))
            .unwrap()
        };
        let mut tr = translator();
        tr.allow.max_claim_size = Some("100Gi".into());
        let refused = review(&tr, &claim("1Pi")).refused;
        assert_eq!(refused.len(), 1);
        assert!(
            refused[0].contains("1Pi") && refused[0].contains("allow.maxClaimSize of 100Gi"),
            "{refused:?}"
        );
        assert!(review(&tr, &claim("100Gi")).refused.is_empty());
        // A claim grown past the cap keeps its copy, at the size the copy has.
        let asked = claim("50Gi");
        let live = Claims::translate(&tr, &asked, &host_name_of(&tr, &asked.metadata));
        let grown = review_against(&tr, &claim("200Gi"), Some(&live));
        assert!(grown.refused.is_empty(), "{grown:?}");
        assert!(
            grown.dropped[0].contains("200Gi") && grown.dropped[0].ends_with("stays at 50Gi"),
            "{grown:?}"
        );
    }
}
