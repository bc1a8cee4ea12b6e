//! What the operator tells the outside: `/metrics` (Prometheus text), `/healthz` (the process
//! answers) and `/readyz` (the leader has its caches; a standby can reach the API server).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tracing::{info, warn};

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
    /// Starting, caches not ready; a standby stays ready for `contact_grace` after the API server
    /// last answered.
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

    /// Record this replica's part; one that does not lead has no caches ready.
    pub fn set_role(&self, role: Role) {
        let mut s = self.lock();
        if role != Role::Leader {
            s.caches_ready = false;
        }
        s.role = role;
    }

    /// This replica's part now.
    pub fn role(&self) -> Role {
        self.lock().role.clone()
    }

    /// Record whether the leader's caches hold their first lists.
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
    /// What `/metrics` reports.
    pub metrics: Arc<Metrics>,
    /// What `/readyz` answers from.
    pub readiness: Arc<Readiness>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("readiness", &self.readiness)
            .finish_non_exhaustive()
    }
}

const GET_ONLY: &str = "GET only\n";

/// The endpoint's routes. GET only (HEAD too, as axum answers it from GET); anything else is
/// 405, whatever the path.
pub fn router(telemetry: Telemetry) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(alive))
        .route("/livez", get(alive))
        .route("/readyz", get(ready))
        .fallback(not_found)
        .method_not_allowed_fallback(|| async { (StatusCode::METHOD_NOT_ALLOWED, GET_ONLY) })
        .with_state(telemetry)
}

async fn metrics_text(State(telemetry): State<Telemetry>) -> Response {
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        telemetry.metrics.encode(),
    )
        .into_response()
}

async fn alive() -> &'static str {
    "ok\n"
}

async fn ready(State(telemetry): State<Telemetry>) -> Response {
    let (ready, why) = telemetry.readiness.check();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, format!("{why}\n")).into_response()
}

async fn not_found(method: Method) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return (StatusCode::METHOD_NOT_ALLOWED, GET_ONLY).into_response();
    }
    (
        StatusCode::NOT_FOUND,
        "not found: try /metrics, /healthz or /readyz\n",
    )
        .into_response()
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
        if let Err(e) = axum::serve(listener, router(telemetry)).await {
            warn!(error = %e, "the metrics endpoint stopped");
        }
    })
}

/// The log target kube-client's HTTP layer logs every failed request under, at ERROR (`failed
/// with error client error (Connect)`, `failed with status 503 …`; see `on_failure` in
/// kube-client's `client/builder.rs`): it names neither the tenant nor the call, and each of
/// those failures comes back to the operator as an error that it reports itself, with the
/// tenant, in status and in its own log lines.
pub const KUBE_CLIENT_HTTP_TARGET: &str = "kube_client::client::builder";

/// What the operator's filter quiets of kube-client's own lines by default: the HTTP failure
/// lines above (off), and its client module's warnings (`eof in poll: Custom { kind: … }`, a
/// watch stream ending, which its watcher resumes and the operator reports when it does not),
/// which print Rust debug structures; errors still pass.
pub const KUBE_CLIENT_QUIET: &str = "kube_client::client::builder=off,kube_client::client=error";

/// A log filter (`EnvFilter` syntax) with kube-client's HTTP failure lines turned off: `off`,
/// not `warn`, as they are logged at ERROR, which `warn` still lets through. That target logs
/// nothing else above DEBUG. A filter that names the target itself, or a prefix of it (`kube`,
/// `kube_client=debug`, `kube_client::client::builder=error`), is explicit and used as given;
/// any other (`info`, `debug`, `tenantplane_controller=trace`) gets the directive first, where
/// it wins over a bare level as the more specific directive.
pub fn log_filter(filter: &str) -> String {
    let names_it = filter.split(',').map(str::trim).any(|directive| {
        let target = directive.split(['[', '=']).next().unwrap_or_default();
        let bare_level = !directive.contains(['[', '='])
            && target
                .parse::<tracing::level_filters::LevelFilter>()
                .is_ok();
        !target.is_empty() && !bare_level && KUBE_CLIENT_HTTP_TARGET.starts_with(target)
    });
    if names_it {
        filter.to_string()
    } else {
        format!("{KUBE_CLIENT_QUIET},{filter}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_clients_http_failure_lines_are_off_unless_the_filter_names_them() {
        let quiet = "kube_client::client::builder=off,kube_client::client=error";
        for filter in [
            "info",
            "warn",
            "debug",
            "info,tenantplane_controller=debug",
            "",
        ] {
            assert_eq!(log_filter(filter), format!("{quiet},{filter}"), "{filter}");
        }
        for filter in [
            "kube_client::client::builder=error",
            "info,kube_client=debug",
            "kube=trace",
            "warn, kube_client::client[HTTP]=debug",
            "kube_client",
        ] {
            assert_eq!(log_filter(filter), filter, "{filter}");
        }
        // Another of kube's targets is not this one.
        assert_eq!(
            log_filter("kube_runtime=debug"),
            format!("{quiet},kube_runtime=debug")
        );
    }

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

    /// What the endpoint answers `method path`: the status and the body.
    async fn ask(t: &Telemetry, method: Method, path: &str) -> (StatusCode, String) {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let request = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .body(axum::body::Body::empty())
            .unwrap();
        let response = router(t.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn the_paths_answer() {
        let t = Telemetry::default();
        assert_eq!(
            ask(&t, Method::GET, "/healthz").await,
            (StatusCode::OK, "ok\n".into())
        );
        assert_eq!(ask(&t, Method::GET, "/livez").await.0, StatusCode::OK);
        assert_eq!(
            ask(&t, Method::GET, "/readyz").await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "starting: reading the leader Lease\n".into()
            )
        );
        assert_eq!(ask(&t, Method::GET, "/metrics").await.0, StatusCode::OK);
        assert_eq!(ask(&t, Method::HEAD, "/metrics").await.0, StatusCode::OK);
        assert_eq!(
            ask(&t, Method::GET, "/nope").await,
            (
                StatusCode::NOT_FOUND,
                "not found: try /metrics, /healthz or /readyz\n".into()
            )
        );
        for path in ["/metrics", "/nope"] {
            assert_eq!(
                ask(&t, Method::POST, path).await,
                (StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into()),
                "{path}"
            );
        }
    }
}
