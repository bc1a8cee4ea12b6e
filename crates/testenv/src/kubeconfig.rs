//! Kubeconfig files with the credentials embedded, and clients made from them.

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
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
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {
            "server": server,
            "certificate-authority-data": STANDARD.encode(ca_pem),
        }}],
        "users": [{"name": name, "user": {
            "client-certificate-data": STANDARD.encode(cert_pem),
            "client-key-data": STANDARD.encode(key_pem),
        }}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    });
    serde_yaml::to_string(&doc).map_err(|e| Error::Io(format!("rendering a kubeconfig: {e}")))
}

/// A client for the kubeconfig at `path`, bound to the calling tokio runtime.
pub async fn client(path: &Path) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| Error::Client(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Client(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| Error::Client(e.to_string()))
}
