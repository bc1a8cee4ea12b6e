//! PersistentVolumeClaims go down; the host binds them, and their phase and capacity come back.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::copy::CopyDown;
use crate::copy_down_kind;
use crate::error::Result;
use crate::kind::Kind;
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
    fn wanted(cx: &Tenant, c: &PersistentVolumeClaim) -> bool {
        cx.policy.to_host.persistent_volume_claims.enabled && cx.selected(Self::NAME, &c.metadata)
    }

    fn translate(tr: &Translator, pvc: &PersistentVolumeClaim) -> PersistentVolumeClaim {
        let mut spec = pvc.spec.clone().unwrap_or_default();
        // The host binds the copy; a tenant cannot name a host volume or clone a host claim.
        spec.volume_name = None;
        spec.data_source = None;
        spec.data_source_ref = None;
        PersistentVolumeClaim {
            metadata: tr.host_meta(&pvc.metadata),
            spec: Some(spec),
            status: None,
        }
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
                     "dataSource": {"kind": "PersistentVolumeClaim", "name": "dev-data"},
                     "resources": {"requests": {"storage": "1Gi"}}}
        }))
        .unwrap();
        let spec = Claims::translate(&translator(), &pvc).spec.unwrap();
        assert_eq!(spec.volume_name, None);
        assert!(spec.data_source.is_none() && spec.data_source_ref.is_none());
        assert_eq!(spec.access_modes.unwrap(), ["ReadWriteOnce"]);
    }
}
