//! The snapshot agent: our own binary (`tenantplane agent`) beside kine in the tenant's
//! control-plane pod, the only thing that touches the datastore's file for snapshots.
//!
//! - As a container it serves `GET /snapshot`: a consistent copy of the database ([`copy`]),
//!   checked and hashed in the pod, streamed to the operator with its size and SHA-256.
//! - As an init container, when a restore is pending, it waits for the operator's
//!   `PUT /restore` with the snapshot's bytes and checksum, puts them in place of the database
//!   before kine starts, leaves a mark that this restore is done, and exits.
//!
//! It speaks TLS with a certificate its tenant's server CA signs (from the PKI the pod mounts)
//! and admits only the operator: a client certificate of the tenant's client CA for
//! `tenantplane:operator`. It holds no store credentials: the operator moves the bytes between
//! it and the store, so nothing in the tenant's namespace can reach the store.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use tokio::sync::{Mutex, watch};
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

use super::copy;
use crate::kubelet::tls::{self, CheckedClients, Refusal, Serving};
use crate::tenant_pki::{CLIENT_CA_CRT, OPERATOR_USER, SERVER_CA_CRT, SERVER_CA_KEY};

/// The name the agent's serving certificate carries, which the operator checks (it dials the
/// pod's address, so the name is fixed rather than an address).
pub const SERVER_NAME: &str = "tenantplane-agent";
/// The header with the SHA-256 (hex) of a snapshot's bytes, both ways.
pub const SHA256_HEADER: &str = "x-tenantplane-sha256";

/// The body of every answer the agent gives.
pub type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// How the agent runs.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// The address to listen on.
    pub listen: SocketAddr,
    /// kine's sqlite database.
    pub database: PathBuf,
    /// Where copies are made before they are sent (not the data claim: a copy would halve it).
    pub scratch: PathBuf,
    /// The folder of the tenant's PKI (server CA and key, client CA).
    pub pki: PathBuf,
    /// Wait for this restore, put it in place, and exit (the init container).
    pub restore: Option<String>,
}

/// The mark a finished restore leaves beside the database, so the init container of a pod that
/// restarts with the same restore pending does not wait for it again.
pub fn restored_mark(database: &Path, restore: &str) -> PathBuf {
    database.with_file_name(format!("restored-{restore}"))
}

struct Agent {
    options: AgentOptions,
    /// One copy or restore at a time: each is a full read or write of the database. The guard
    /// goes with the blocking work, so a request whose client went away still holds it until
    /// that work ends, and the next waits for it.
    copying: Arc<Mutex<()>>,
    /// Set once a restore is in place (restore mode ends).
    restored: watch::Sender<bool>,
}

/// Why the agent could not start: its PKI files, its certificate, its port or its signals.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A file of the mounted PKI could not be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// A CA in the mounted PKI does not parse.
    #[error("the tenant's {which}: {detail}")]
    Ca {
        /// Which CA.
        which: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// The serving certificate could not be issued.
    #[error(transparent)]
    Certificate(#[from] tls::CertError),
    /// The TLS configuration was refused.
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// The agent could not listen.
    #[error("listening on {address}: {source}")]
    Listen {
        /// The address it tried.
        address: SocketAddr,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// SIGTERM could not be handled.
    #[error("handling SIGTERM: {0}")]
    Signal(#[source] std::io::Error),
}

/// Run the agent until it is killed (or, restoring, until the restore is in place).
pub async fn run(options: AgentOptions) -> Result<(), StartError> {
    if let Some(id) = &options.restore
        && restored_mark(&options.database, id).exists()
    {
        info!(restore = %id, "this restore is already in place");
        return Ok(());
    }
    let read = |name: &str| {
        let path = options.pki.join(name);
        std::fs::read_to_string(&path).map_err(|source| StartError::Read { path, source })
    };
    let server_ca = tenantplane_pki::CertificateAuthority::from_pem(
        &read(SERVER_CA_CRT)?,
        &read(SERVER_CA_KEY)?,
    )
    .map_err(|e| StartError::Ca {
        which: "server CA",
        detail: e.to_string(),
    })?;
    let client_ca =
        tenantplane_pki::cert_der(&read(CLIENT_CA_CRT)?).map_err(|e| StartError::Ca {
            which: "client CA",
            detail: e.to_string(),
        })?;
    let serving = Arc::new(Serving::named(
        SERVER_NAME,
        server_ca,
        vec![SERVER_NAME.to_string()],
    )?);
    let provider = serving.provider();
    let verifier = Arc::new(CheckedClients {
        check: Box::new(move |cert, now| operator_only(cert, &client_ca, now)),
        provider: provider.clone(),
    });
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(serving.clone());
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|source| StartError::Listen {
            address: options.listen,
            source,
        })?;
    // Copies a killed agent left behind.
    if let Ok(dir) = std::fs::read_dir(&options.scratch) {
        for entry in dir.flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    // As PID 1 of its container, the agent would never see SIGTERM without a handler: the pod's
    // every stop (an upgrade, a restore, sleep, delete) would wait out its grace period for it.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(StartError::Signal)?;
    let (restored, mut done) = watch::channel(false);
    let agent = Arc::new(Agent {
        options,
        copying: Arc::new(Mutex::new(())),
        restored,
    });
    info!(listen = %agent.options.listen, restore = %agent.options.restore.as_deref().unwrap_or("none"), "snapshot agent serving");
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(tls::SERVING_RENEWAL).await;
            if let Err(e) = serving.renew() {
                warn!(error = %e, "snapshot agent: renewing the serving certificate failed; the current certificate keeps serving");
            }
        }
    });
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(c) => c,
                    Err(e) => {
                        warn!(error = %e, "snapshot agent: accepting a connection failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, agent) = (acceptor.clone(), agent.clone());
                tokio::spawn(async move { serve_connection(tcp, peer, acceptor, agent).await });
            }
            _ = terminate.recv() => {
                // The copy or restore under way finishes its file work first (a restore's
                // rename is then whole), within the pod's grace period.
                let _quiet = agent.copying.clone().lock_owned().await;
                info!("SIGTERM: stopping");
                return Ok(());
            }
            _ = done.wait_for(|d| *d) => {
                // Let the answer reach the operator before the process ends.
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                return Ok(());
            }
        }
    }
}

/// The operator's own client certificate of this tenant, and nothing else.
fn operator_only(cert: &[u8], client_ca: &[u8], now: i64) -> Result<(), Refusal> {
    let info = tenantplane_pki::verify_der_signed_by(cert, client_ca)
        .map_err(|e| Refusal::NotSignedBy(e.to_string()))?;
    if now < info.not_before || now > info.not_after {
        return Err(Refusal::NotValidNow { owner: None });
    }
    if info.common_name != OPERATOR_USER {
        return Err(Refusal::NotUser {
            user: OPERATOR_USER,
            common_name: info.common_name,
        });
    }
    Ok(())
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    agent: Arc<Agent>,
) {
    let stream = match acceptor.accept(tcp).await {
        Ok(s) => s,
        Err(e) => {
            warn!(%peer, error = %e, "snapshot agent: refused a connection");
            return;
        }
    };
    let service = hyper::service::service_fn(move |req| {
        let agent = agent.clone();
        async move { Ok::<_, std::convert::Infallible>(handle(req, agent).await) }
    });
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await
    {
        tracing::debug!(%peer, "connection ended: {e}");
    }
}

fn text(status: StatusCode, message: impl std::fmt::Display) -> Response<Body> {
    let mut body = message.to_string();
    body.push('\n');
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(
            Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
        .unwrap_or_default()
}

async fn handle(req: Request<Incoming>, agent: Arc<Agent>) -> Response<Body> {
    let restoring = agent.options.restore.is_some();
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok"),
        (&Method::GET, "/snapshot") if restoring => text(
            StatusCode::CONFLICT,
            "a restore is pending: the datastore is not running, there is nothing to copy",
        ),
        (&Method::GET, "/snapshot") => snapshot(&agent).await,
        (&Method::PUT, "/restore") if restoring => restore(req, &agent).await,
        (&Method::PUT, "/restore") => text(
            StatusCode::CONFLICT,
            "no restore is pending in this pod: the operator restarts the pod for one",
        ),
        (&Method::DELETE, "/restore") if restoring => abandon(req, &agent).await,
        (&Method::GET, path) if path.starts_with("/restores/") => {
            let id = path.trim_start_matches("/restores/");
            let state = restore_state(&agent.options, id);
            let body = serde_json::json!({"state": state.as_str(), "detail": state.detail()});
            Response::builder()
                .status(StatusCode::OK)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(
                    Full::new(Bytes::from(body.to_string()))
                        .map_err(|never| match never {})
                        .boxed_unsync(),
                )
                .unwrap_or_default()
        }
        _ => text(StatusCode::NOT_FOUND, "no such endpoint"),
    }
}

async fn snapshot(agent: &Agent) -> Response<Body> {
    let one = agent.copying.clone().lock_owned().await;
    let (database, scratch) = (
        agent.options.database.clone(),
        agent.options.scratch.clone(),
    );
    let started = std::time::Instant::now();
    let made = tokio::task::spawn_blocking(move || {
        let _one = one;
        copy::backup(&database, &scratch)
    })
    .await;
    let copy = match made {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return text(StatusCode::INTERNAL_SERVER_ERROR, e),
        Err(e) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the copy died: {e}"),
            );
        }
    };
    let file = match tokio::fs::File::open(&copy.path).await {
        Ok(f) => f,
        Err(e) => {
            let _ = std::fs::remove_file(&copy.path);
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("reading the copy: {e}"),
            );
        }
    };
    // The open file keeps its bytes; the name goes now, so nothing is left if the stream stops.
    let _ = std::fs::remove_file(&copy.path);
    info!(
        size = copy.size,
        seconds = started.elapsed().as_secs_f64(),
        "copied the datastore; sending it"
    );
    let stream = tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024).map_ok(Frame::data);
    Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, "application/vnd.sqlite3")
        .header(http::header::CONTENT_LENGTH, copy.size)
        .header(SHA256_HEADER, copy.sha256)
        .body(StreamBody::new(stream).boxed_unsync())
        .unwrap_or_default()
}

/// Where a restore stands in this pod, as the agent sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestoreState {
    /// This pod waits for it (the init container runs with it).
    Waiting,
    /// It is in place: the mark holds its checksum.
    Restored(String),
    /// The operator gave it up; the pod went on with the data it had.
    Abandoned(String),
    /// This pod neither waits for it nor did it.
    Unknown,
}

const ABANDONED: &str = "abandoned: ";

impl RestoreState {
    /// The state as one word, as the agent's answer writes it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Restored(_) => "restored",
            Self::Abandoned(_) => "abandoned",
            Self::Unknown => "unknown",
        }
    }

    /// What goes with the state: the restored checksum, or why it was abandoned; empty otherwise.
    pub fn detail(&self) -> &str {
        match self {
            Self::Restored(d) | Self::Abandoned(d) => d,
            Self::Waiting | Self::Unknown => "",
        }
    }

    /// From the agent's answer (`state` and `detail`).
    pub fn parse(state: &str, detail: &str) -> Option<Self> {
        Some(match state {
            "waiting" => Self::Waiting,
            "restored" => Self::Restored(detail.into()),
            "abandoned" => Self::Abandoned(detail.into()),
            "unknown" => Self::Unknown,
            _ => return None,
        })
    }
}

/// Restore `id` as the mark beside the database (or the pending flag) says.
fn restore_state(options: &AgentOptions, id: &str) -> RestoreState {
    match std::fs::read_to_string(restored_mark(&options.database, id)) {
        Ok(text) => match text.strip_prefix(ABANDONED) {
            Some(why) => RestoreState::Abandoned(why.trim().to_string()),
            None => RestoreState::Restored(text.trim().to_string()),
        },
        Err(_) if options.restore.as_deref() == Some(id) => RestoreState::Waiting,
        Err(_) => RestoreState::Unknown,
    }
}

/// The operator gives the pending restore up (the snapshot could not be sent): the database
/// stays as it was, the mark says why, and the pod goes on.
async fn abandon(req: Request<Incoming>, agent: &Agent) -> Response<Body> {
    let why = req
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_string())
        .unwrap_or_default();
    let _one = agent.copying.clone().lock_owned().await;
    let id = agent.options.restore.clone().unwrap_or_default();
    let mark = restored_mark(&agent.options.database, &id);
    if mark.exists() {
        return text(StatusCode::CONFLICT, "the restore is in place already");
    }
    if let Some(dir) = mark.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = std::fs::write(&mark, format!("{ABANDONED}{why}")) {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("marking the restore abandoned: {e}"),
        );
    }
    warn!(restore = %id, %why, "restore abandoned; the datastore stays as it was");
    agent.restored.send_replace(true);
    text(StatusCode::OK, "abandoned; the datastore stays as it was")
}

async fn restore(req: Request<Incoming>, agent: &Agent) -> Response<Body> {
    let Some(sha) = req
        .headers()
        .get(SHA256_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return text(
            StatusCode::BAD_REQUEST,
            format!("a restore needs the {SHA256_HEADER} header"),
        );
    };
    // A sender that went away may leave its install running: this one waits for it.
    let one = agent.copying.clone().lock_owned().await;
    let database = agent.options.database.clone();
    let id = agent.options.restore.clone().unwrap_or_default();
    if restored_mark(&database, &id).exists() {
        return text(StatusCode::OK, "the restore is in place already");
    }
    let mut incoming = match copy::Incoming::create(&database) {
        Ok(i) => i,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e),
    };
    let mut body = req.into_body();
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                let _ = std::fs::remove_file(copy::incoming_path(&database));
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("receiving the snapshot: {e}"),
                );
            }
        };
        if let Some(data) = frame.data_ref()
            && let Err(e) = incoming.write(data)
        {
            let _ = std::fs::remove_file(copy::incoming_path(&database));
            return text(StatusCode::INTERNAL_SERVER_ERROR, e);
        }
    }
    let installed = tokio::task::spawn_blocking({
        let database = database.clone();
        move || {
            let _one = one;
            let size = incoming
                .install(&database, &sha)
                .map_err(|e| e.to_string())?;
            std::fs::write(restored_mark(&database, &id), sha.as_bytes())
                .map_err(|e| format!("marking the restore done: {e}"))?;
            Ok::<_, String>(size)
        }
    })
    .await;
    match installed {
        Ok(Ok(size)) => {
            info!(size, "restored the datastore");
            agent.restored.send_replace(true);
            text(StatusCode::OK, format!("restored {size} bytes"))
        }
        Ok(Err(e)) => text(StatusCode::UNPROCESSABLE_ENTITY, e),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the restore died: {e}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant_pki::TenantPki;
    use tenantplane_pki::Leaf;

    #[test]
    fn only_the_operators_certificate_of_this_tenant_is_admitted() {
        let pki = TenantPki::generate("dev").unwrap();
        let other = TenantPki::generate("other").unwrap();
        let ca = tenantplane_pki::cert_der(pki.client_ca.cert_pem()).unwrap();
        let der = |pem: &str| tenantplane_pki::cert_der(pem).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let operator = pki
            .client_ca
            .issue(&Leaf::client(OPERATOR_USER, &["system:masters"]))
            .unwrap();
        operator_only(&der(&operator.cert_pem), &ca, now).unwrap();
        let admin = pki
            .client_ca
            .issue(&Leaf::client("tenantplane-admin", &["system:masters"]))
            .unwrap();
        let e = operator_only(&der(&admin.cert_pem), &ca, now).unwrap_err();
        assert!(matches!(e, Refusal::NotUser { .. }), "{e}");
        assert!(e.to_string().contains("only tenantplane:operator"), "{e}");
        let foreign = other
            .client_ca
            .issue(&Leaf::client(OPERATOR_USER, &["system:masters"]))
            .unwrap();
        assert!(operator_only(&der(&foreign.cert_pem), &ca, now).is_err());
    }
}
