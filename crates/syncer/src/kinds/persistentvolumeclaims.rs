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
use crate::kind::Kind;
use crate::tell::Review;
use crate::tenant::Tenant;
use crate::translate::Translator;

pub struct Claims;

copy_down_kind!(
    Claims,
    PersistentVolumeClaim,
    "PersistentVolumeClaim",
    then = status_up
);

impl CopyDown for Claims {
    fn review(tr: &Translator, pvc: &PersistentVolumeClaim) -> Review {
        review(tr, pvc)
    }

    fn wanted(cx: &Tenant, c: &PersistentVolumeClaim) -> bool {
        cx.policy.to_host.persistent_volume_claims.enabled && cx.selected(Self::NAME, &c.metadata)
    }

    fn translate(tr: &Translator, pvc: &PersistentVolumeClaim) -> PersistentVolumeClaim {
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
            metadata: tr.host_meta(Self::NAME, &pvc.metadata),
            spec: Some(spec),
            status: None,
        }
    }
}

/// Is a claim's data source another claim of the tenant's (its copy can be cloned)?
fn own_claim(d: &TypedLocalObjectReference) -> bool {
    d.kind == "PersistentVolumeClaim" && d.api_group.as_deref().unwrap_or_default().is_empty()
}

/// What a claim's copy leaves out, and why it may have none (its storage class).
pub fn review(tr: &Translator, pvc: &PersistentVolumeClaim) -> Review {
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
    Review {
        refused: allow::claim_refusals(&tr.allow, spec.storage_class_name.as_deref()),
        dropped,
    }
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
    use crate::translate::tests::translator;

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
        let spec = Claims::translate(&translator(), &pvc).spec.unwrap();
        assert_eq!(spec.volume_name, None);
        assert!(spec.data_source.is_none() && spec.data_source_ref.is_none());
        assert_eq!(spec.access_modes.unwrap(), ["ReadWriteOnce"]);
        assert!(spec.selector.is_none());
        assert_eq!(review(&translator(), &pvc).dropped.len(), 3);
        let mut clone = pvc.clone();
        clone.spec.as_mut().unwrap().data_source = Some(TypedLocalObjectReference {
            api_group: None,
            kind: "PersistentVolumeClaim".into(),
            name: "old".into(),
        });
        let spec = Claims::translate(&translator(), &clone).spec.unwrap();
        assert_eq!(
            spec.data_source.unwrap().name,
            "old-x-default-x-dev",
            "its own claim's copy"
        );
    }
}
