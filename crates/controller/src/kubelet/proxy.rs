//! One kubelet request of a tenant API server, answered through the host API: the tenant pod is
//! mapped to its host copy, and the request goes to the copy's subresource. Streams (exec,
//! attach, port-forward) are upgraded on both sides and spliced byte for byte, so the
//! tenant API server and the host speak the stream protocol to each other through us.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::{Client, ResourceExt};
use tenantplane_syncer::naming::{self, TenantRef};
use tracing::{debug, warn};

use super::route::{self, Action};
use super::tls::Identity;

pub type Body = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// Headers of a stream upgrade, passed through in both directions.
const UPGRADE_HEADERS: &[&str] = &[
    "connection",
    "upgrade",
    "x-stream-protocol-version",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
    "sec-websocket-accept",
];

fn text(status: StatusCode, message: String) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(message + "\n"))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// A tenant API server shows the text of a 400 or a 500 to its user as it is (and only a
/// generic line for a 404 or a 502), so the endpoint answers with those.
const NOT_RUNNING: StatusCode = StatusCode::BAD_REQUEST;
const HOST_FAILED: StatusCode = StatusCode::INTERNAL_SERVER_ERROR;

fn is_upgrade(req: &Request<Incoming>) -> bool {
    req.headers().contains_key(header::UPGRADE)
}

/// Answer `req` for the tenant `who`, through `host`.
pub async fn handle(
    mut req: Request<Incoming>,
    host: Client,
    who: Identity,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    if path == "/healthz" {
        return Ok(text(StatusCode::OK, "ok".into()));
    }
    let route = match route::parse(&path, req.uri().query()) {
        Ok(r) => r,
        Err(e @ route::RouteError::NotServed(_)) => {
            return Ok(text(StatusCode::NOT_FOUND, e.to_string()));
        }
        Err(e) => return Ok(text(StatusCode::BAD_REQUEST, e.to_string())),
    };
    let tenant = TenantRef {
        name: who.owner.name.clone(),
        owner: who.owner.clone(),
    };
    let what = format!("pod {}/{}", route.namespace, route.pod);
    let host_name = naming::host_name_for(&tenant.name, &route.namespace, &route.pod);
    let pods: Api<Pod> = Api::namespaced(host.clone(), &who.namespace);
    let copy = match pods.get_opt(&host_name).await {
        Ok(Some(p)) => p,
        Ok(None) => {
            return Ok(text(
                NOT_RUNNING,
                format!("{what} does not run on the host (it has no host pod yet)"),
            ));
        }
        Err(e) => {
            return Ok(text(
                HOST_FAILED,
                format!("{what}: reading its host pod: {e}"),
            ));
        }
    };
    if let Some(why) = not_its_copy(&copy, &tenant, &route, &what) {
        return Ok(text(NOT_RUNNING, why));
    }
    let upgrade = is_upgrade(&req) && route.action != Action::Logs;
    let target = route::host_path(&route, &who.namespace, &host_name);
    let mut forward = Request::builder().method(req.method().clone()).uri(&target);
    if upgrade {
        for name in UPGRADE_HEADERS {
            for value in req.headers().get_all(*name) {
                forward = forward.header(*name, value.clone());
            }
        }
    }
    let forward = match forward.body(kube::client::Body::empty()) {
        Ok(f) => f,
        Err(e) => {
            return Ok(text(
                StatusCode::BAD_REQUEST,
                format!("{what}: cannot build the host request: {e}"),
            ));
        }
    };
    let tenant_side = upgrade.then(|| hyper::upgrade::on(&mut req));
    debug!(tenant = %tenant.name, namespace = %who.namespace, action = %route.action, %target, "kubelet request");
    let answer = match host.send(forward).await {
        Ok(a) => a,
        Err(e) => {
            return Ok(text(
                HOST_FAILED,
                format!("{what}: the host API did not answer {}: {e}", route.action),
            ));
        }
    };
    let status = answer.status();
    if let Some(tenant_side) = tenant_side
        && status == StatusCode::SWITCHING_PROTOCOLS
    {
        let label = format!(
            "{} of {what} (tenant {} in namespace {})",
            route.action, tenant.name, who.namespace
        );
        return Ok(spliced(tenant_side, answer, label));
    }
    // Logs, and refusals of streams: the host's answer as it is, streamed.
    let (parts, body) = answer.into_parts();
    let mut reply = Response::new(
        body.map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
            .boxed_unsync(),
    );
    *reply.status_mut() = parts.status;
    if let Some(kind) = parts.headers.get(header::CONTENT_TYPE) {
        reply
            .headers_mut()
            .insert(header::CONTENT_TYPE, kind.clone());
    }
    Ok(reply)
}

/// Why host pod `copy` is not the copy of the tenant pod `route` names (for `what`, as messages
/// say it): not a copy of this tenant's, of another pod, or of an earlier pod of that name.
fn not_its_copy(
    copy: &Pod,
    tenant: &TenantRef,
    route: &route::Route,
    what: &str,
) -> Option<String> {
    let Some(of) = naming::copy_of(&copy.metadata, tenant) else {
        return Some(format!(
            "{what} does not run on the host (the host pod of that name is not its copy)"
        ));
    };
    if of.namespace != route.namespace || of.name != route.pod {
        return Some(format!("{what} does not run on the host"));
    }
    let recorded = copy.annotations().get(naming::ANNOTATION_VIRTUAL_UID);
    match &route.uid {
        Some(uid) if recorded.is_some_and(|r| r != uid) => Some(format!(
            "{what} with UID {uid} does not run on the host (its copy is of another pod of that name)"
        )),
        _ => None,
    }
}

/// The tenant's answer to a stream the host opened: `101 Switching Protocols` with the host's
/// upgrade headers, and the two upgraded connections joined in a task (`label` names it in logs).
fn spliced(
    tenant_side: hyper::upgrade::OnUpgrade,
    answer: Response<kube::client::Body>,
    label: String,
) -> Response<Body> {
    let mut reply = Response::new(Body::default());
    *reply.status_mut() = answer.status();
    for name in UPGRADE_HEADERS {
        for value in answer.headers().get_all(*name) {
            reply
                .headers_mut()
                .append(HeaderName::from_static(name), value.clone());
        }
    }
    tokio::spawn(async move {
        let (tenant_io, host_io) = match tokio::join!(tenant_side, hyper::upgrade::on(answer)) {
            (Ok(t), Ok(h)) => (t, h),
            (Err(e), _) | (_, Err(e)) => {
                warn!(error = %e, "{label}: the stream did not open");
                return;
            }
        };
        let (mut t, mut h) = (TokioIo::new(tenant_io), TokioIo::new(host_io));
        match tokio::io::copy_bidirectional(&mut t, &mut h).await {
            Ok((up, down)) => debug!("{label}: closed after {up} bytes up, {down} down"),
            Err(e) => debug!("{label}: ended: {e}"),
        }
    });
    reply
}
