//! What the operator tells the outside: `/metrics` (Prometheus text), `/healthz` (the process
//! answers) and `/readyz` (the leader has its caches; a standby can reach the API server).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use tracing::{debug, info, warn};

use crate::metrics::{self, Metrics};

/// This replica's part in leader election.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Looking at the Lease for the first time.
    Starting,
    /// Another replica leads (its identity, when known).
    Standby(String),
    /// This replica runs the controller.
    Leader,
}

#[derive(Debug)]
struct ReadyState {
    role: Role,
    caches_ready: bool,
    /// The last time the API server answered the elector.
    last_contact: Option<Instant>,
}

/// What `/readyz` answers from.
#[derive(Debug)]
pub struct Readiness {
    state: Mutex<ReadyState>,
    /// How long a standby stays ready without hearing from the API server.
    contact_grace: Duration,
}

impl Default for Readiness {
    fn default() -> Self {
        Self::new(Duration::from_secs(30))
    }
}

impl Readiness {
    pub fn new(contact_grace: Duration) -> Self {
        Self {
            state: Mutex::new(ReadyState {
                role: Role::Starting,
                caches_ready: false,
                last_contact: None,
            }),
            contact_grace,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReadyState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_role(&self, role: Role) {
        let mut s = self.lock();
        if role != Role::Leader {
            s.caches_ready = false;
        }
        s.role = role;
    }

    pub fn role(&self) -> Role {
        self.lock().role.clone()
    }

    pub fn set_caches_ready(&self, ready: bool) {
        self.lock().caches_ready = ready;
    }

    /// The API server answered.
    pub fn contact(&self) {
        self.lock().last_contact = Some(Instant::now());
    }

    /// Ready or not, and a line saying why.
    pub fn check(&self) -> (bool, String) {
        let s = self.lock();
        match &s.role {
            Role::Leader if s.caches_ready => (true, "leader: caches synced".into()),
            Role::Leader => (
                false,
                "leader: waiting for the first lists of the caches".into(),
            ),
            Role::Starting => (false, "starting: reading the leader Lease".into()),
            Role::Standby(holder) => match s.last_contact {
                Some(t) if t.elapsed() <= self.contact_grace => {
                    (true, format!("standby: the Lease is held by {holder:?}"))
                }
                Some(t) => (
                    false,
                    format!(
                        "standby: no answer from the API server for {}s",
                        t.elapsed().as_secs()
                    ),
                ),
                None => (false, "standby: the API server has not answered yet".into()),
            },
        }
    }
}

/// Metrics and readiness, shared by the controller, the elector and the HTTP endpoint.
#[derive(Clone, Default)]
pub struct Telemetry {
    pub metrics: Arc<Metrics>,
    pub readiness: Arc<Readiness>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("readiness", &self.readiness)
            .finish_non_exhaustive()
    }
}

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, v);
    }
    response
}

/// The answer to one request.
pub fn answer(telemetry: &Telemetry, method: &Method, path: &str) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    if method != Method::GET && method != Method::HEAD {
        return respond(StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n".into());
    }
    match path {
        "/metrics" => respond(
            StatusCode::OK,
            metrics::CONTENT_TYPE,
            telemetry.metrics.encode(),
        ),
        "/healthz" | "/livez" => respond(StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" => {
            let (ready, why) = telemetry.readiness.check();
            let status = if ready {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            respond(status, TEXT, format!("{why}\n"))
        }
        _ => respond(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: try /metrics, /healthz or /readyz\n".into(),
        ),
    }
}

/// Bind `addr` now (so a taken port is reported at start), then serve until the process ends.
pub async fn bind(
    addr: SocketAddr,
    telemetry: Telemetry,
) -> std::io::Result<impl std::future::Future<Output = ()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    info!(address = %local, "serving /metrics, /healthz and /readyz");
    Ok(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    warn!(error = %e, "accepting a metrics connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let telemetry = telemetry.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let response = answer(&telemetry, req.method(), req.uri().path());
                    async move { Ok::<_, Infallible>(response) }
                });
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await
                {
                    debug!(peer = %peer, error = %e, "a metrics connection ended with an error");
                }
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_follows_the_role() {
        let r = Readiness::new(Duration::from_secs(30));
        assert!(!r.check().0);
        r.set_role(Role::Standby("b".into()));
        assert_eq!(
            r.check(),
            (false, "standby: the API server has not answered yet".into())
        );
        r.contact();
        assert_eq!(
            r.check(),
            (true, "standby: the Lease is held by \"b\"".into())
        );
        r.set_role(Role::Leader);
        assert!(!r.check().0);
        r.set_caches_ready(true);
        assert_eq!(r.check(), (true, "leader: caches synced".into()));
    }

    #[test]
    fn the_paths_answer() {
        let t = Telemetry::default();
        assert_eq!(
            answer(&t, &Method::GET, "/healthz").status(),
            StatusCode::OK
        );
        assert_eq!(
            answer(&t, &Method::GET, "/readyz").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            answer(&t, &Method::GET, "/metrics").status(),
            StatusCode::OK
        );
        assert_eq!(
            answer(&t, &Method::GET, "/nope").status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            answer(&t, &Method::POST, "/metrics").status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
    }
}
