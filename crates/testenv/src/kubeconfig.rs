//! Kubeconfig files with the credentials embedded, and clients made from them.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::{Error, Result};

/// A kubeconfig with one cluster, one user and one context, all named `name`.
pub fn render(
    name: &str,
    server: &str,
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<String> {
    let client = tenantplane_pki::KeyAndCert {
        cert_pem: cert_pem.to_string(),
        key_pem: key_pem.to_string(),
    };
    Ok(tenantplane_controller::build::kubeconfig::render(
        name, server, ca_pem, &client,
    ))
}

/// A client for the kubeconfig at `path`, bound to the calling tokio runtime.
pub async fn client(path: &Path) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| Error::Client(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Client(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| Error::Client(e.to_string()))
}
