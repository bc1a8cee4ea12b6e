//! `version`: this client's version, the operator's (the image of its Deployment), and, for a
//! named tenant, the version it asks for and the one its API server reports. They can differ:
//! the dev cluster's local runtime serves its own build whatever a k3s tenant asks for, and the
//! command says so rather than let an upgrade seem to change nothing.

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::host::explain;

/// The label every object of the operator's install carries (deploy/ and the chart).
const OPERATOR_SELECTOR: &str = "app.kubernetes.io/name=tenantplane";

/// The operator's Deployments, each as `namespace/name: image`; an error saying what went wrong
/// when they cannot be listed (a tenant user may list Deployments in no namespace but their own).
async fn operators(client: &Client) -> anyhow::Result<Vec<String>> {
    let deployments: Api<Deployment> = Api::all(client.clone());
    let list = deployments
        .list(&ListParams::default().labels(OPERATOR_SELECTOR))
        .await
        .map_err(|e| explain(e, "the operator's Deployments"))?;
    Ok(list
        .items
        .iter()
        .map(|d| {
            let image = d
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|p| p.containers.first())
                .and_then(|c| c.image.clone())
                .unwrap_or_else(|| "no image".into());
            format!(
                "{}/{}: {image}",
                d.namespace().unwrap_or_default(),
                d.name_any()
            )
        })
        .collect())
}

/// How the version a tenant asks for and the one its API server reports compare: `None` when
/// they are the same release (`v1.30.4` and `v1.30.4+k3s1`), else why they differ.
fn mismatch(asked: &str, reported: &str) -> Option<String> {
    let release = reported.split(['+', '-']).next().unwrap_or(reported);
    (release != asked).then(|| {
        format!(
            "the tenant API server reports {reported}, not the {asked} spec.kubernetesVersion asks for (on the local dev cluster every k3s tenant runs the local runtime's build)"
        )
    })
}

/// Print the versions: this client's, the operator's, and tenant `tenant`'s when named.
pub async fn run(client: &Client, tenant: Option<(&str, &str)>) -> anyhow::Result<()> {
    println!("Client:   tenantplane {}", env!("CARGO_PKG_VERSION"));
    match operators(client).await {
        Ok(found) if found.is_empty() => println!(
            "Operator: no Deployment labelled {OPERATOR_SELECTOR} (the dev cluster runs the operator in its own process)"
        ),
        Ok(found) => println!("Operator: {}", found.join(", ")),
        Err(why) => println!("Operator: unknown ({why:#})"),
    }
    let Some((namespace, name)) = tenant else {
        return Ok(());
    };
    let tc = crate::tenants::get(client, namespace, name).await?;
    let asked = tc.spec.kubernetes_version.clone();
    let reported = match crate::connect::tenant_client(client, namespace, name).await {
        Ok((tenant, _forward)) => tenant
            .apiserver_version()
            .await
            .map(|v| v.git_version)
            .map_err(|e| tenantplane_controller::error_chain(&e)),
        Err(e) => Err(format!("{e:#}")),
    };
    match reported {
        Ok(reported) => {
            println!(
                "Tenant:   {namespace}/{name} asks for {asked} ({}); its API server reports {reported}",
                tc.spec.control_plane.distribution
            );
            if let Some(why) = mismatch(&asked, &reported) {
                println!("Note:     {why}");
            }
        }
        Err(why) => println!(
            "Tenant:   {namespace}/{name} asks for {asked}; its API server cannot be asked ({why})"
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_running_another_release_than_it_asks_for_is_said() {
        assert_eq!(mismatch("v1.30.4", "v1.30.4+k3s1"), None);
        assert_eq!(mismatch("v1.36.3", "v1.36.3"), None);
        let why = mismatch("v1.30.4", "v1.36.3").unwrap();
        assert!(
            why.starts_with("the tenant API server reports v1.36.3, not the v1.30.4"),
            "{why}"
        );
    }
}
