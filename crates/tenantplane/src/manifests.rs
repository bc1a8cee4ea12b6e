//! Applying YAML manifests (CRDs, policies, examples) through the API with server-side apply.

/// The policies the seed example refers to, as shipped in `deploy/policies/`.
#[cfg(feature = "dev")]
pub const DEFAULT_POLICIES: &[&str] = &[
    include_str!("../../../deploy/policies/isolationprofile-restricted.yaml"),
    include_str!("../../../deploy/policies/syncpolicy-default.yaml"),
];

/// The seed example, as shipped in `examples/`.
pub const EXAMPLE_TENANT: &str = include_str!("../../../examples/tenantcluster-dev.yaml");
/// The `kubernetes` distribution's example, which the dev cluster creates beside it on a real node.
#[cfg(feature = "dev")]
pub const EXAMPLE_KUBERNETES_TENANT: &str =
    include_str!("../../../examples/tenantcluster-kubernetes.yaml");

/// Apply every document of a YAML stream; returns `kind/name` of each (the dev cluster's
/// setup).
#[cfg(feature = "dev")]
pub async fn apply(client: &kube::Client, yaml: &str) -> anyhow::Result<Vec<String>> {
    use anyhow::{Context, bail};
    use kube::ResourceExt;
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    use kube::core::GroupVersionKind;
    use kube::discovery::{Scope, pinned_kind};
    use serde::Deserialize;
    let mut applied = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_yaml::Value::deserialize(doc)?;
        if value.is_null() {
            continue;
        }
        let object: DynamicObject =
            serde_yaml::from_value(value).context("a manifest is not a Kubernetes object")?;
        let Some(types) = object.types.clone() else {
            bail!("manifest {} has no apiVersion/kind", object.name_any());
        };
        let gvk = GroupVersionKind::try_from(&types).context("reading apiVersion/kind")?;
        let (resource, caps) = pinned_kind(client, &gvk)
            .await
            .with_context(|| format!("the API server does not serve {}", types.kind))?;
        let api: Api<DynamicObject> = match (caps.scope, object.namespace()) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), &ns, &resource),
            (Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), &resource),
            (Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
        };
        let name = object.name_any();
        api.patch(
            &name,
            &PatchParams::apply("tenantplane-cli").force(),
            &Patch::Apply(&object),
        )
        .await
        .with_context(|| format!("applying {}/{name}", types.kind))?;
        applied.push(format!("{}/{name}", types.kind.to_lowercase()));
    }
    Ok(applied)
}
