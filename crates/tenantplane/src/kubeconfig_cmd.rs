//! `tenantplane kubeconfig NAME`: the tenant's admin kubeconfig from Secret `<name>-kubeconfig`.
//! On the local dev cluster the tenant answers on a loopback port, so the server is rewritten to
//! the address the local runtime announces.

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::Api;
use kube::{Client, ResourceExt};
use tenantplane_controller::names;

pub async fn run(client: &Client, namespace: &str, name: &str) -> anyhow::Result<String> {
    let secret_name = names::kubeconfig_secret(name);
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(&secret_name)
        .await
        .with_context(|| format!("reading Secret {secret_name} in namespace {namespace}"))?;
    let Some(secret) = secret else {
        bail!(
            "Secret {secret_name} not found in namespace {namespace}: TenantCluster {name} is not Ready yet (or does not exist); check `kubectl get tenantcluster {name} -n {namespace}`"
        );
    };
    let mut text = tenantplane_controller::build::kubeconfig::stored_text(&secret)
        .with_context(|| {
            format!(
                "Secret {secret_name} has no text under key {}",
                names::KUBECONFIG_KEY
            )
        })?
        .to_string();
    let pod = Api::<Pod>::namespaced(client.clone(), namespace)
        .get_opt(&names::control_plane_pod(name))
        .await?;
    if let Some(local) = pod
        .as_ref()
        .and_then(|p| p.annotations().get(names::ANNOTATION_LOCAL_ENDPOINT))
    {
        text = text.replace(&names::endpoint(name, namespace), local);
    }
    Ok(text)
}
