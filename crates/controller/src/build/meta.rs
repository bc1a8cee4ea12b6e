//! Metadata every object the tenant owns carries: its name in the tenant's namespace, the
//! tenant's labels, and the owner reference that lets the garbage collector remove it with the
//! tenant.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::Resource;
use tenantplane_api::TenantCluster;

use crate::{Error, names};

/// The TenantCluster's name and namespace, which the API server always sets.
pub(crate) fn identity(tc: &TenantCluster) -> Result<(String, String), Error> {
    match (tc.metadata.name.clone(), tc.metadata.namespace.clone()) {
        (Some(name), Some(ns)) => Ok((name, ns)),
        _ => Err(Error::Build(
            "the TenantCluster has no name or namespace".into(),
        )),
    }
}

/// The owner reference that lets the garbage collector remove an object with its tenant.
pub fn owner_reference(tc: &TenantCluster) -> Result<OwnerReference, Error> {
    tc.controller_owner_ref(&())
        .ok_or_else(|| Error::Build("the TenantCluster has no name or uid yet".into()))
}

/// Metadata of an object the tenant owns, named `name`.
pub(crate) fn owned_metadata(tc: &TenantCluster, name: String) -> Result<ObjectMeta, Error> {
    let (tenant, ns) = identity(tc)?;
    Ok(ObjectMeta {
        name: Some(name),
        namespace: Some(ns),
        labels: Some(names::labels(&tenant)),
        owner_references: Some(vec![owner_reference(tc)?]),
        ..Default::default()
    })
}

/// A selector of objects carrying every one of `labels`.
pub(crate) fn match_labels<K, V>(labels: impl IntoIterator<Item = (K, V)>) -> LabelSelector
where
    K: Into<String>,
    V: Into<String>,
{
    LabelSelector {
        match_labels: Some(
            labels
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        ),
        ..Default::default()
    }
}

/// A short digest (16 hex digits of SHA-256) of `parts`, each ended by a NUL so that moving text
/// from one part to the next changes it: for annotations that change when what they stand for
/// does.
pub(crate) fn digest<'a>(parts: impl IntoIterator<Item = &'a str>) -> String {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for part in parts {
        context.update(part.as_bytes());
        context.update(&[0]);
    }
    context
        .finish()
        .as_ref()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::fixtures::tenant;

    #[test]
    fn owned_objects_carry_the_tenants_labels_and_its_controller_reference() {
        let meta = owned_metadata(&tenant(), "dev-x".into()).unwrap();
        assert_eq!(meta.name.as_deref(), Some("dev-x"));
        assert_eq!(meta.namespace.as_deref(), Some("team-dev"));
        assert_eq!(meta.labels.unwrap(), names::labels("dev"));
        let owner = &meta.owner_references.unwrap()[0];
        assert_eq!(owner.kind, "TenantCluster");
        assert_eq!(owner.name, "dev");
        assert_eq!(owner.controller, Some(true));
    }

    #[test]
    fn an_unnamed_tenant_owns_nothing() {
        let mut tc = tenant();
        tc.metadata.uid = None;
        assert!(owned_metadata(&tc, "dev-x".into()).is_err());
        let mut tc = tenant();
        tc.metadata.namespace = None;
        assert!(owned_metadata(&tc, "dev-x".into()).is_err());
    }
}
