//! Kubeconfig files with the credentials embedded, and clients made from them.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use tenantplane_client::error_chain;
use tenantplane_client::kubeconfig as typed;

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
    typed::to_text(&typed::for_certificate(name, server, ca_pem, &client))
        .map_err(|e| Error::Client(error_chain(&e)))
}

/// A kubeconfig named `name` for `server`, trusting `ca_pem`, authenticated by `token`.
pub fn render_token(name: &str, server: &str, ca_pem: &str, token: &str) -> Result<String> {
    typed::to_text(&typed::for_token(name, server, ca_pem, token))
        .map_err(|e| Error::Client(error_chain(&e)))
}

/// A client for the kubeconfig at `path`, bound to the calling tokio runtime.
pub async fn client(path: &Path) -> Result<kube::Client> {
    kube::Client::try_from(config(path).await?).map_err(|e| Error::Client(error_chain(&e)))
}

/// The client configuration of the kubeconfig at `path`.
pub async fn config(path: &Path) -> Result<kube::Config> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| Error::Client(error_chain(&e)))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Client(error_chain(&e)))
}

/// Requests a client sent, split into reads (GET, including lists and watches) and writes.
#[derive(Debug, Default)]
pub struct RequestCounter {
    /// GET requests so far, including lists and watches.
    pub reads: std::sync::atomic::AtomicUsize,
    /// Every other request so far.
    pub writes: std::sync::atomic::AtomicUsize,
}

impl RequestCounter {
    /// (reads, writes) so far.
    pub fn get(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::SeqCst;
        (self.reads.load(SeqCst), self.writes.load(SeqCst))
    }

    /// Start counting again from zero.
    pub fn reset(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.reads.store(0, SeqCst);
        self.writes.store(0, SeqCst);
    }
}

/// A client for the kubeconfig at `path` that counts every request it sends.
pub async fn counting_client(
    path: &Path,
    counter: std::sync::Arc<RequestCounter>,
) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| Error::Client(error_chain(&e)))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Client(error_chain(&e)))?;
    counting(config, counter)
}

/// A client for `config` that counts every request it sends. Must be called inside a tokio
/// runtime, which the client is bound to.
pub fn counting(
    config: kube::Config,
    counter: std::sync::Arc<RequestCounter>,
) -> Result<kube::Client> {
    use std::sync::atomic::Ordering::SeqCst;
    let count = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        if req.method() == http::Method::GET {
            counter.reads.fetch_add(1, SeqCst);
        } else {
            counter.writes.fetch_add(1, SeqCst);
        }
        req
    });
    Ok(kube::client::ClientBuilder::try_from(config)
        .map_err(|e| Error::Client(error_chain(&e)))?
        .with_layer(&count)
        .build())
}

/// A client configuration that authenticates with a bearer `token` (a ServiceAccount's, say) to
/// the API server at `server`, whose serving certificate `ca_pem` signed.
pub fn token_config(server: &str, ca_pem: &str, token: &str) -> Result<kube::Config> {
    let url = server
        .parse()
        .map_err(|e| Error::Client(format!("{server} is not a URL: {e}")))?;
    let mut config = kube::Config::new(url);
    config.root_cert = Some(pem_to_der(ca_pem)?);
    config.auth_info = serde_json::from_value(serde_json::json!({ "token": token }))
        .map_err(|e| Error::Client(format!("a token credential: {e}")))?;
    Ok(config)
}

/// A client for [`token_config`]. Must be called inside a tokio runtime, which the client is
/// bound to.
pub fn token_client(server: &str, ca_pem: &str, token: &str) -> Result<kube::Client> {
    kube::Client::try_from(token_config(server, ca_pem, token)?)
        .map_err(|e| Error::Client(error_chain(&e)))
}

/// The DER bytes of every certificate in a PEM bundle.
fn pem_to_der(pem: &str) -> Result<Vec<Vec<u8>>> {
    use base64::Engine;
    let mut certs = Vec::new();
    let mut body: Option<String> = None;
    for line in pem.lines().map(str::trim) {
        if line == "-----BEGIN CERTIFICATE-----" {
            body = Some(String::new());
        } else if line == "-----END CERTIFICATE-----" {
            let text = body.take().unwrap_or_default();
            let der = base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| Error::Client(format!("a CA certificate is not base64: {e}")))?;
            certs.push(der);
        } else if let Some(text) = body.as_mut() {
            text.push_str(line);
        }
    }
    if certs.is_empty() {
        return Err(Error::Client("no certificate in the CA bundle".into()));
    }
    Ok(certs)
}
