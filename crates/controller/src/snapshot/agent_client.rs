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

/// What goes wrong talking to the snapshot agent in a tenant's pod: reaching it, being trusted,
/// or what it answered. The messages are what a snapshot's or restore's status shows.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The operator's TLS setup for the agent (the tenant's CAs, the operator's certificate).
    #[error("{what}: {detail}")]
    Credentials {
        /// Which part: "the tenant's server CA", "the operator's certificate", …
        what: &'static str,
        /// What was wrong with it.
        detail: String,
    },
    /// The agent did not take the connection in time.
    #[error("the snapshot agent at {address} did not answer within {seconds}s")]
    ConnectTimeout {
        /// Where the agent was dialled.
        address: String,
        /// How long the operator waited.
        seconds: u64,
    },
    /// The connection to the agent failed.
    #[error("connecting to the snapshot agent at {address}: {source}")]
    Connect {
        /// Where the agent was dialled.
        address: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake with the agent failed: it is not the tenant's agent, or does not trust the
    /// operator.
    #[error("TLS with the snapshot agent at {address}: {source}")]
    Tls {
        /// Where the agent was dialled.
        address: String,
        /// What the TLS layer said.
        #[source]
        source: std::io::Error,
    },
    /// An HTTP exchange with the agent failed: what was being done.
    #[error("{what}: {source}")]
    Http {
        /// What was being done.
        what: String,
        /// What hyper said.
        #[source]
        source: hyper::Error,
    },
    /// The agent took the connection but did not answer in time.
    #[error("the snapshot agent did not answer within {seconds}s")]
    AnswerTimeout {
        /// How long the operator waited.
        seconds: u64,
    },
    /// The agent refused: its status and its body, which says why.
    #[error("the snapshot agent answered {status}: {text}")]
    Refused {
        /// The HTTP status.
        status: StatusCode,
        /// The body.
        text: String,
    },
    /// The agent's answer is not what the operator understands.
    #[error("{0}")]
    Answer(String),
}

impl AgentError {
    /// A stable name for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            AgentError::Credentials { .. } => "AgentCredentials",
            AgentError::ConnectTimeout { .. }
            | AgentError::Connect { .. }
            | AgentError::Tls { .. }
            | AgentError::AnswerTimeout { .. }
            | AgentError::Http { .. } => "AgentUnreachable",
            AgentError::Refused { .. } => "AgentRefused",
            AgentError::Answer(_) => "AgentAnswerInvalid",
        }
    }
}

fn credentials(what: &'static str) -> impl FnOnce(String) -> AgentError {
    move |detail| AgentError::Credentials { what, detail }
}

/// A snapshot as the agent sends it.
pub struct Download {
    /// The copy's size in bytes, as the agent announced it.
    pub size: u64,
    /// The SHA-256 (hex) the agent computed of its copy.
    pub sha256: String,
    /// The copy's bytes, as they arrive.
    pub bytes: BoxStream<'static, Result<Bytes, AgentError>>,
}

fn tls(pki: &TenantPki) -> Result<tokio_rustls::TlsConnector, AgentError> {
    let provider = crate::kubelet::tls::provider();
    let mut roots = rustls::RootCertStore::empty();
    let ca = tenantplane_pki::cert_der(pki.server_ca.cert_pem())
        .map_err(|e| credentials("the tenant's server CA")(e.to_string()))?;
    roots
        .add(CertificateDer::from(ca))
        .map_err(|e| credentials("the tenant's server CA")(e.to_string()))?;
    let pair = pki
        .client_ca
        .issue(&Leaf::client(OPERATOR_USER, &[ADMIN_GROUP]).valid_for(CERT_VALIDITY))
        .map_err(|e| credentials("issuing the operator's certificate")(e.to_string()))?;
    let chain = vec![CertificateDer::from(
        tenantplane_pki::cert_der(&pair.cert_pem)
            .map_err(|e| credentials("the operator's certificate")(e.to_string()))?,
    )];
    let key = PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes())
        .map_err(|e| credentials("the operator's key")(e.to_string()))?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| credentials("TLS versions")(e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| credentials("the operator's certificate")(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// An HTTP/1 connection to the agent at `address` (`host:port`).
async fn connect(
    address: &str,
    pki: &TenantPki,
) -> Result<hyper::client::conn::http1::SendRequest<super::agent::Body>, AgentError> {
    let connector = tls(pki)?;
    let tcp = tokio::time::timeout(CONNECT_WITHIN, tokio::net::TcpStream::connect(address))
        .await
        .map_err(|_| AgentError::ConnectTimeout {
            address: address.to_string(),
            seconds: CONNECT_WITHIN.as_secs(),
        })?
        .map_err(|source| AgentError::Connect {
            address: address.to_string(),
            source,
        })?;
    let name = ServerName::try_from(SERVER_NAME)
        .map_err(|e| credentials("the agent's server name")(e.to_string()))?;
    let stream = connector
        .connect(name, tcp)
        .await
        .map_err(|source| AgentError::Tls {
            address: address.to_string(),
            source,
        })?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|source| AgentError::Http {
                what: format!("HTTP with the snapshot agent at {address}"),
                source,
            })?;
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
) -> Result<http::Response<hyper::body::Incoming>, AgentError> {
    tokio::time::timeout(within, sender.send_request(request))
        .await
        .map_err(|_| AgentError::AnswerTimeout {
            seconds: within.as_secs(),
        })?
        .map_err(|source| AgentError::Http {
            what: what.to_string(),
            source,
        })
}

/// What the agent said when it refused: its body, which says why.
async fn refusal(status: StatusCode, body: hyper::body::Incoming) -> AgentError {
    let text = body
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_string())
        .unwrap_or_default();
    AgentError::Refused { status, text }
}

/// A request to the agent; its parts are constant, so building it cannot fail but for a bug.
fn request<B>(builder: http::request::Builder, body: B) -> Result<Request<B>, AgentError> {
    builder
        .body(body)
        .map_err(|e| AgentError::Answer(format!("building the request: {e}")))
}

/// Ask the agent at `address` for a consistent copy of the datastore.
pub async fn download(address: &str, pki: &TenantPki) -> Result<Download, AgentError> {
    let mut sender = connect(address, pki).await?;
    let request = request(
        Request::builder()
            .method(Method::GET)
            .uri("/snapshot")
            .header(http::header::HOST, SERVER_NAME),
        Empty::new().map_err(|never| match never {}).boxed_unsync(),
    )?;
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
            .ok_or_else(|| AgentError::Answer(format!("the snapshot agent sent no {name} header")))
    };
    let size = header(http::header::CONTENT_LENGTH.as_str())?
        .parse()
        .map_err(|e| AgentError::Answer(format!("the snapshot agent's content-length: {e}")))?;
    let sha256 = header(SHA256_HEADER)?;
    let bytes = body
        .into_data_stream()
        .map_err(|source| AgentError::Http {
            what: "receiving the copy from the snapshot agent".into(),
            source,
        })
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
    bytes: BoxStream<'static, std::io::Result<Bytes>>,
) -> Result<(), AgentError> {
    let mut sender = connect(address, pki).await?;
    let body = StreamBody::new(bytes.map_ok(Frame::data)).boxed_unsync();
    let request = request(
        Request::builder()
            .method(Method::PUT)
            .uri("/restore")
            .header(http::header::HOST, SERVER_NAME)
            .header(http::header::CONTENT_LENGTH, size)
            .header(SHA256_HEADER, sha256),
        body,
    )?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|source| AgentError::Http {
            what: "sending the snapshot to the snapshot agent".into(),
            source,
        })?;
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
) -> Result<(StatusCode, String), AgentError> {
    let mut sender = connect(address, pki).await?;
    let request = request(
        Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, SERVER_NAME),
        http_body_util::Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed_unsync(),
    )?;
    let what = format!("asking the snapshot agent at {address}");
    let response = send_within(&mut sender, request, CONNECT_WITHIN, &what).await?;
    let (parts, body) = response.into_parts();
    let text = body
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_string())
        .map_err(|source| AgentError::Http {
            what: "reading the snapshot agent's answer".into(),
            source,
        })?;
    Ok((parts.status, text))
}

/// Where restore `id` stands in the pod whose agent is at `address`.
pub async fn restore_state(
    address: &str,
    pki: &TenantPki,
    id: &str,
) -> Result<super::agent::RestoreState, AgentError> {
    let (status, text) = ask(
        address,
        pki,
        Method::GET,
        &format!("/restores/{id}"),
        String::new(),
    )
    .await?;
    if status != StatusCode::OK {
        return Err(AgentError::Refused { status, text });
    }
    let answer: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        AgentError::Answer(format!(
            "the snapshot agent's restore state is not JSON ({e}): {text}"
        ))
    })?;
    let field = |name: &str| {
        answer
            .get(name)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
    };
    super::agent::RestoreState::parse(field("state"), field("detail")).ok_or_else(|| {
        AgentError::Answer(format!(
            "the snapshot agent reported restore state {:?}",
            field("state")
        ))
    })
}

/// Give the pending restore up: the pod goes on with the data it had; `why` is kept beside it.
pub async fn abandon(address: &str, pki: &TenantPki, why: &str) -> Result<(), AgentError> {
    let (status, text) = ask(address, pki, Method::DELETE, "/restore", why.to_string()).await?;
    if status != StatusCode::OK {
        return Err(AgentError::Refused { status, text });
    }
    Ok(())
}
