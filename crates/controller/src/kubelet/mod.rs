//! The kubelet of every virtual Node. A tenant API server serves `kubectl logs`, `exec`,
//! `attach`, `port-forward` and `cp` by calling the kubelet at the Node's address and
//! `daemonEndpoints` port; virtual Nodes name this endpoint there. It accepts only tenant API
//! servers (a client certificate from a tenant's client CA), maps the tenant pod to its host
//! copy in that tenant's namespace, and answers through the host API's pod subresources.
//!
//! Its serving certificate comes from the operator's kubelet CA (Secret
//! `tenantplane-kubelet-ca` in the operator's namespace, made once and never regenerated); each
//! tenant API server is started trusting that CA for its kubelets. Every replica serves it.

mod proxy;
pub mod route;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tenantplane_pki::CertificateAuthority;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

pub use tenantplane_syncer::KubeletEndpoint;

/// The Secret holding the kubelet CA, in the operator's namespace.
pub const CA_SECRET: &str = "tenantplane-kubelet-ca";
const CA_CRT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
/// The port virtual Nodes name, as a kubelet's.
pub const DEFAULT_PORT: u16 = 10250;

/// Why the kubelet endpoint could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The endpoint's CA Secret could not be read or made.
    #[error("Secret {namespace}/{CA_SECRET}: {message}")]
    Ca {
        /// The operator's namespace, which holds the Secret.
        namespace: String,
        /// What went wrong.
        message: String,
    },
    /// The endpoint could not listen.
    #[error("serving the kubelet endpoint on {address}: {message}")]
    Listen {
        /// The address it tried.
        address: SocketAddr,
        /// What the system said.
        message: String,
    },
    /// The serving certificate could not be issued.
    #[error("the kubelet serving certificate: {0}")]
    Certificate(#[from] tls::CertError),
    /// The TLS configuration was refused.
    #[error("the kubelet endpoint's TLS: {0}")]
    Tls(#[from] rustls::Error),
}

/// What the tenants' control planes are given: the endpoint virtual Nodes name, and the CA
/// their API servers trust for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeletOptions {
    /// The endpoint virtual Nodes name as their kubelet.
    pub endpoint: KubeletEndpoint,
    /// The CA of the endpoint's serving certificate, PEM, which the tenants' API servers trust.
    pub ca_pem: String,
}

/// How the endpoint is served.
pub struct Settings {
    /// The address to listen on.
    pub listen: SocketAddr,
    /// The address and port virtual Nodes give, and DNS names the certificate also names.
    pub endpoint: KubeletEndpoint,
    /// DNS names the serving certificate carries besides the endpoint's address.
    pub dns_names: Vec<String>,
    /// The CA that signs the serving certificate.
    pub ca: CertificateAuthority,
    /// The namespace the operator is limited to, if it is.
    pub scope: Option<String>,
}

impl Settings {
    /// What the tenants' control planes are given.
    pub fn options(&self) -> KubeletOptions {
        KubeletOptions {
            endpoint: self.endpoint.clone(),
            ca_pem: self.ca.cert_pem().to_string(),
        }
    }
}

/// The kubelet CA from its Secret in `namespace`, made (once) when there is none. A Secret
/// that does not hold a usable CA is an error to fix, never replaced: tenant API servers trust
/// the CA in it.
pub async fn load_or_create_ca(
    client: &Client,
    namespace: &str,
) -> Result<CertificateAuthority, KubeletError> {
    let err = |message: String| KubeletError::Ca {
        namespace: namespace.to_string(),
        message,
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let from = |secret: Secret| {
        let data = secret.data.unwrap_or_default();
        let text = |key: &str| {
            data.get(key)
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
                .ok_or_else(|| {
                    err(format!(
                        "has no PEM `{key}`; restore it (tenant API servers trust the CA it held)"
                    ))
                })
        };
        CertificateAuthority::from_pem(&text(CA_CRT)?, &text(CA_KEY)?)
            .map_err(|e| err(format!("does not hold a usable CA ({e}); restore it")))
    };
    match secrets.get_opt(CA_SECRET).await {
        Ok(Some(s)) => return from(s),
        Ok(None) => {}
        Err(e) => return Err(err(format!("cannot be read: {e}"))),
    }
    let ca = CertificateAuthority::generate("tenantplane-kubelet-ca")
        .map_err(|e| err(format!("generating the CA: {e}")))?;
    let mut secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": CA_SECRET, "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "tenantplane"}},
        "type": "Opaque",
    }))
    .map_err(|e| err(e.to_string()))?;
    secret.data = Some(
        [(CA_CRT, ca.cert_pem()), (CA_KEY, ca.key_pem())]
            .into_iter()
            .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
            .collect(),
    );
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            info!(namespace, secret = CA_SECRET, "created the kubelet CA");
            Ok(ca)
        }
        // Another replica made it first: use that one.
        Err(kube::Error::Api(e)) if e.code == 409 => match secrets.get(CA_SECRET).await {
            Ok(s) => from(s),
            Err(e) => Err(err(format!("cannot be read: {e}"))),
        },
        Err(e) => Err(err(format!("cannot be created: {e}"))),
    }
}

/// Bind the endpoint (so a taken port is an error now) and return the future that serves it.
/// `host` must not time out idle reads: streams stay open as long as the user keeps them.
pub async fn bind(
    host: Client,
    settings: Settings,
) -> Result<impl std::future::Future<Output = ()> + Send, KubeletError> {
    let mut names = vec![settings.endpoint.address.clone()];
    names.extend(settings.dns_names.iter().cloned());
    let serving = Arc::new(tls::Serving::new(settings.ca, names)?);
    let api: Api<Secret> = match &settings.scope {
        Some(ns) => Api::namespaced(host.clone(), ns),
        None => Api::all(host.clone()),
    };
    let (store, writer) = reflector::store();
    let secrets = watcher(api, crate::cache::owned())
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    let tenants = Arc::new(tls::Tenants::new(store));
    let provider = serving.provider();
    let verifier = Arc::new(tls::CheckedClients {
        check: Box::new({
            let tenants = tenants.clone();
            move |cert, now| tenants.identify(cert, now).map(|_| ())
        }),
        provider: provider.clone(),
    });
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(KubeletError::Tls)?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(serving.clone());
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|e| KubeletError::Listen {
            address: settings.listen,
            message: e.to_string(),
        })?;
    info!(listen = %settings.listen, address = %settings.endpoint.address, port = settings.endpoint.port, "serving the kubelet endpoint of the virtual nodes");
    Ok(async move {
        tokio::spawn(secrets.for_each(|event| async move {
            if let Err(e) = event {
                warn!(error = %crate::error_chain(&e), "kubelet endpoint: watching the tenants' PKI Secrets failed");
            }
        }));
        let renewing = serving.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(tls::SERVING_RENEWAL).await;
                if let Err(e) = renewing.renew() {
                    warn!(error = %e, "kubelet endpoint: renewing the serving certificate failed; the current certificate keeps serving");
                }
            }
        });
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    warn!(error = %e, "kubelet endpoint: accepting a connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (acceptor, tenants, host) = (acceptor.clone(), tenants.clone(), host.clone());
            tokio::spawn(
                async move { serve_connection(tcp, peer, acceptor, &tenants, host).await },
            );
        }
    })
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    tenants: &tls::Tenants,
    host: Client,
) {
    let stream = match acceptor.accept(tcp).await {
        Ok(s) => s,
        Err(e) => {
            warn!(%peer, error = %e, "kubelet endpoint: refused a connection");
            return;
        }
    };
    let Some(cert) = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
    else {
        return;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    let who = match tenants.identify(&cert, now) {
        Ok(w) => w,
        Err(e) => {
            warn!(%peer, error = %e, "kubelet endpoint: refused a connection");
            return;
        }
    };
    let service =
        hyper::service::service_fn(move |req| proxy::handle(req, host.clone(), who.clone()));
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .with_upgrades()
        .await
    {
        tracing::debug!(%peer, "kubelet endpoint: connection ended: {e}");
    }
}
