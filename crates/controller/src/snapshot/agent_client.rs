//! The operator's side of the snapshot agent: one HTTPS connection to the agent in a tenant's
//! control-plane pod, trusting only the tenant's server CA for the agent's name and presenting a
//! short-lived `tenantplane:operator` certificate from the tenant's client CA.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::Frame;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tenantplane_pki::Leaf;

use super::agent::{SERVER_NAME, SHA256_HEADER};
use crate::tenant_pki::{ADMIN_GROUP, OPERATOR_USER, TenantPki};

/// How long the operator's certificate for one transfer lives.
const CERT_VALIDITY: Duration = Duration::from_secs(6 * 3600);
const CONNECT_WITHIN: Duration = Duration::from_secs(10);
/// How long the agent may take to answer (a copy of a large database comes first).
const ANSWER_WITHIN: Duration = Duration::from_secs(600);

/// A snapshot as the agent sends it.
pub struct Download {
    pub size: u64,
    /// The SHA-256 (hex) the agent computed of its copy.
    pub sha256: String,
    pub bytes: BoxStream<'static, Result<Bytes, String>>,
}

fn tls(pki: &TenantPki) -> Result<tokio_rustls::TlsConnector, String> {
    let provider = crate::kubelet::tls::provider();
    let mut roots = rustls::RootCertStore::empty();
    let ca = tenantplane_pki::cert_der(pki.server_ca.cert_pem()).map_err(|e| e.to_string())?;
    roots
        .add(CertificateDer::from(ca))
        .map_err(|e| format!("the tenant's server CA: {e}"))?;
    let pair = pki
        .client_ca
        .issue(&Leaf::client(OPERATOR_USER, &[ADMIN_GROUP]).valid_for(CERT_VALIDITY))
        .map_err(|e| format!("issuing the operator's certificate: {e}"))?;
    let chain = vec![CertificateDer::from(
        tenantplane_pki::cert_der(&pair.cert_pem).map_err(|e| e.to_string())?,
    )];
    let key = PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes())
        .map_err(|e| format!("the operator's key: {e}"))?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| format!("the operator's certificate: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// An HTTP/1 connection to the agent at `address` (`host:port`).
async fn connect(
    address: &str,
    pki: &TenantPki,
) -> Result<hyper::client::conn::http1::SendRequest<super::agent::Body>, String> {
    let connector = tls(pki)?;
    let tcp = tokio::time::timeout(CONNECT_WITHIN, tokio::net::TcpStream::connect(address))
        .await
        .map_err(|_| {
            format!(
                "the snapshot agent at {address} did not answer within {}s",
                CONNECT_WITHIN.as_secs()
            )
        })?
        .map_err(|e| format!("connecting to the snapshot agent at {address}: {e}"))?;
    let name = ServerName::try_from(SERVER_NAME).map_err(|e| e.to_string())?;
    let stream = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS with the snapshot agent at {address}: {e}"))?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP with the snapshot agent at {address}: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("snapshot agent connection ended: {e}");
        }
    });
    Ok(sender)
}

/// Send `request` and wait at most `within` for the answer's head.
async fn send_within(
    sender: &mut hyper::client::conn::http1::SendRequest<super::agent::Body>,
    request: Request<super::agent::Body>,
    within: Duration,
    what: &str,
) -> Result<http::Response<hyper::body::Incoming>, String> {
    tokio::time::timeout(within, sender.send_request(request))
        .await
        .map_err(|_| {
            format!(
                "the snapshot agent did not answer within {}s",
                within.as_secs()
            )
        })?
        .map_err(|e| format!("{what}: {e}"))
}

/// What the agent said when it refused: its body, which says why.
async fn refusal(status: StatusCode, body: hyper::body::Incoming) -> String {
    let text = body
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_string())
        .unwrap_or_default();
    format!("the snapshot agent answered {status}: {text}")
}

/// Ask the agent at `address` for a consistent copy of the datastore.
pub async fn download(address: &str, pki: &TenantPki) -> Result<Download, String> {
    let mut sender = connect(address, pki).await?;
    let request = Request::builder()
        .method(Method::GET)
        .uri("/snapshot")
        .header(http::header::HOST, SERVER_NAME)
        .body(Empty::new().map_err(|never| match never {}).boxed_unsync())
        .map_err(|e| e.to_string())?;
    let response = send_within(
        &mut sender,
        request,
        ANSWER_WITHIN,
        "asking the snapshot agent for a copy",
    )
    .await?;
    let (parts, body) = response.into_parts();
    if parts.status != StatusCode::OK {
        return Err(refusal(parts.status, body).await);
    }
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| format!("the snapshot agent sent no {name} header"))
    };
    let size = header(http::header::CONTENT_LENGTH.as_str())?
        .parse()
        .map_err(|e| format!("the snapshot agent's content-length: {e}"))?;
    let sha256 = header(SHA256_HEADER)?;
    let bytes = body
        .into_data_stream()
        .map_err(|e| format!("receiving the copy from the snapshot agent: {e}"))
        .boxed();
    Ok(Download {
        size,
        sha256,
        bytes,
    })
}

/// Send a snapshot's bytes to the agent waiting for a restore at `address`; it checks them
/// against `sha256` (hex) and puts them in place only when they match.
pub async fn upload(
    address: &str,
    pki: &TenantPki,
    sha256: &str,
    size: u64,
    bytes: BoxStream<'static, Result<Bytes, String>>,
) -> Result<(), String> {
    let mut sender = connect(address, pki).await?;
    let body =
        StreamBody::new(bytes.map_ok(Frame::data).map_err(std::io::Error::other)).boxed_unsync();
    let request = Request::builder()
        .method(Method::PUT)
        .uri("/restore")
        .header(http::header::HOST, SERVER_NAME)
        .header(http::header::CONTENT_LENGTH, size)
        .header(SHA256_HEADER, sha256)
        .body(body)
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("sending the snapshot to the snapshot agent: {e}"))?;
    let (parts, body) = response.into_parts();
    if parts.status != StatusCode::OK {
        return Err(refusal(parts.status, body).await);
    }
    Ok(())
}

/// A small request to the agent and its whole answer (status and body).
async fn ask(
    address: &str,
    pki: &TenantPki,
    method: Method,
    path: &str,
    body: String,
) -> Result<(StatusCode, String), String> {
    let mut sender = connect(address, pki).await?;
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, SERVER_NAME)
        .body(
            http_body_util::Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
        .map_err(|e| e.to_string())?;
    let what = format!("asking the snapshot agent at {address}");
    let response = send_within(&mut sender, request, CONNECT_WITHIN, &what).await?;
    let (parts, body) = response.into_parts();
    let text = body
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_string())
        .map_err(|e| format!("reading the snapshot agent's answer: {e}"))?;
    Ok((parts.status, text))
}

/// Where restore `id` stands in the pod whose agent is at `address`.
pub async fn restore_state(
    address: &str,
    pki: &TenantPki,
    id: &str,
) -> Result<super::agent::RestoreState, String> {
    let (status, text) = ask(
        address,
        pki,
        Method::GET,
        &format!("/restores/{id}"),
        String::new(),
    )
    .await?;
    if status != StatusCode::OK {
        return Err(format!("the snapshot agent answered {status}: {text}"));
    }
    let answer: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("the snapshot agent's restore state is not JSON ({e}): {text}"))?;
    let field = |name: &str| {
        answer
            .get(name)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
    };
    super::agent::RestoreState::parse(field("state"), field("detail"))
}

/// Give the pending restore up: the pod goes on with the data it had; `why` is kept beside it.
pub async fn abandon(address: &str, pki: &TenantPki, why: &str) -> Result<(), String> {
    let (status, text) = ask(address, pki, Method::DELETE, "/restore", why.to_string()).await?;
    if status != StatusCode::OK {
        return Err(format!("the snapshot agent answered {status}: {text}"));
    }
    Ok(())
}
