//! The tenant user's verbs on TenantClusters: `create` (and `--wait` until Ready), `list`,
//! `status`, `sleep`, `wake`, `restore`, `rollback` and `delete`. Output follows kubectl: aligned tables, `-o yaml|json`, exit code 1 on
//! any error.
//!
//! One module per concern: `create` (and its wait), `show` (`list` and `status`), `sleep` (and
//! `wake`), `restore` (and `rollback`), `delete`, and
//! `progress`, how a tenant's phase and conditions read and the watch that follows one.

mod create;
mod delete;
mod progress;
mod restore;
mod settled;
mod show;
mod sleep;

use kube::Client;
use kube::api::Api;
use tenantplane_api::TenantCluster;

use crate::host::{explain, tenant_not_found};

pub use create::{CreateOptions, create};
pub use delete::delete;
pub use restore::{RestoreOptions, restore, rollback};
pub use show::{list, status};
pub use sleep::{sleep, wake, wake_if_asleep};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ListOutput {
    Yaml,
    Json,
    /// The table with ENDPOINT and the Ready condition's reason.
    Wide,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ObjectOutput {
    Yaml,
    Json,
}

/// TenantCluster `name`, or an error that says it is not there and how to list the tenants.
pub async fn get(client: &Client, namespace: &str, name: &str) -> anyhow::Result<TenantCluster> {
    let api: Api<TenantCluster> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(tc)) => Ok(tc),
        Ok(None) => Err(tenant_not_found(name, namespace)),
        Err(e) => Err(explain(
            e,
            &format!("TenantCluster {name} in namespace {namespace}"),
        )),
    }
}

/// The namespace from `-n`, else the kubeconfig context's (else `default`).
pub fn namespace_or_default(client: &Client, namespace: Option<String>) -> String {
    namespace.unwrap_or_else(|| client.default_namespace().to_string())
}
