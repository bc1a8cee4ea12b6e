//! What a tenant API server asks "a kubelet" for, and the host API request that answers it. Pure
//! functions: the paths and parameters are the kubelet's (as the API server calls them) on one
//! side and the `pods/log`, `pods/exec`, `pods/attach` and `pods/portforward` subresources on the
//! other.
//!
//! Routed here rather than by axum (which routes `/metrics`): one pure function decides the
//! action, which of the kubelet's path shapes it is and whether every name is a Kubernetes
//! name, and is tested as one; a router would split that across path templates and handlers,
//! and the proxy hands upgraded streams over at the hyper level anyway. The decoding is the
//! `percent-encoding` and `form_urlencoded` crates'.

use std::fmt;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

/// The subresource a request maps to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Container logs (`/containerLogs`).
    Logs,
    /// A command run in a container (`/exec`).
    Exec,
    /// Attaching to a running container (`/attach`).
    Attach,
    /// Forwarding ports of the pod (`/portForward`).
    PortForward,
}

impl Action {
    fn subresource(self) -> &'static str {
        match self {
            Action::Logs => "log",
            Action::Exec => "exec",
            Action::Attach => "attach",
            Action::PortForward => "portforward",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.subresource())
    }
}

/// A kubelet request of a tenant pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// Which subresource.
    pub action: Action,
    /// The pod's tenant namespace.
    pub namespace: String,
    /// The pod's tenant name.
    pub pod: String,
    /// The pod UID, when the path names it.
    pub uid: Option<String>,
    /// Empty for port-forward.
    pub container: String,
    /// The host API's query parameters, in order (repeated `command`s and `port`s included).
    pub params: Vec<(String, String)>,
}

/// Why a request cannot be served; each says what the endpoint does serve.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// A path that is not one of the endpoint's.
    #[error(
        "{0} is not served here: this kubelet endpoint serves /containerLogs, /exec, /attach and /portForward of the tenant's pods"
    )]
    NotServed(String),
    /// A path of the endpoint's that does not parse.
    #[error("{path}: {reason}")]
    Malformed {
        /// The path.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Log parameters the API server passes through to the kubelet, under the same names.
const LOG_PARAMS: &[&str] = &[
    "follow",
    "previous",
    "timestamps",
    "sinceSeconds",
    "sinceTime",
    "tailLines",
    "limitBytes",
    "stream",
];

/// The kubelet's stream flags (as the API server sets them) and the host API's names for them.
const STREAM_FLAGS: &[(&str, &str)] = &[
    ("input", "stdin"),
    ("output", "stdout"),
    ("error", "stderr"),
    ("tty", "tty"),
];

fn is_true(value: &str) -> bool {
    matches!(value, "1" | "true" | "True" | "TRUE")
}

/// A path segment, percent-decoded; one that is not UTF-8 once decoded is refused.
fn decode(part: &str, path: &str) -> Result<String, RouteError> {
    percent_decode_str(part)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| RouteError::Malformed {
            path: path.to_string(),
            reason: format!("{part:?} is not a valid path segment"),
        })
}

/// Parse a kubelet request (`path` without the query, `query` without the `?`).
pub fn parse(path: &str, query: Option<&str>) -> Result<Route, RouteError> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (action, rest) = match segments.split_first() {
        Some((&"containerLogs", rest)) => (Action::Logs, rest),
        Some((&"exec", rest)) => (Action::Exec, rest),
        Some((&"attach", rest)) => (Action::Attach, rest),
        Some((&"portForward", rest)) => (Action::PortForward, rest),
        _ => return Err(RouteError::NotServed(path.to_string())),
    };
    let malformed = |reason: &str| RouteError::Malformed {
        path: path.to_string(),
        reason: reason.to_string(),
    };
    // containerLogs/{ns}/{pod}/{container}; exec|attach/{ns}/{pod}[/{uid}]/{container};
    // portForward/{ns}/{pod}[/{uid}].
    let (namespace, pod, uid, container) = match (action, rest) {
        (Action::Logs, [ns, pod, container]) => (ns, pod, None, Some(container)),
        (Action::Exec | Action::Attach, [ns, pod, container]) => (ns, pod, None, Some(container)),
        (Action::Exec | Action::Attach, [ns, pod, uid, container]) => {
            (ns, pod, Some(uid), Some(container))
        }
        (Action::PortForward, [ns, pod]) => (ns, pod, None, None),
        (Action::PortForward, [ns, pod, uid]) => (ns, pod, Some(uid), None),
        _ => return Err(malformed("expected /<namespace>/<pod>[/<uid>]/<container>")),
    };
    if namespace.is_empty() || pod.is_empty() || container.is_some_and(|c| c.is_empty()) {
        return Err(malformed(
            "the namespace, pod and container must not be empty",
        ));
    }
    // The API server sends the kubelet's parameters form-encoded.
    let query: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .into_owned()
        .collect();
    let container = container.map(|c| decode(c, path)).transpose()?;
    let (namespace, pod) = (decode(namespace, path)?, decode(pod, path)?);
    let uid = uid.map(|u| decode(u, path)).transpose()?;
    // Names as the API validates them, so none can reach past the pod on the host.
    if !is_name(&namespace, 63, false)
        || !is_name(&pod, 253, true)
        || container.as_deref().is_some_and(|c| !is_name(c, 63, false))
        || uid.as_deref().is_some_and(|u| !is_name(u, 63, false))
    {
        return Err(malformed(
            "the namespace, pod, UID and container must be Kubernetes names",
        ));
    }
    let mut params = Vec::new();
    if let Some(c) = &container {
        params.push(("container".to_string(), c.clone()));
    }
    match action {
        Action::Logs => params.extend(
            query
                .into_iter()
                .filter(|(k, _)| LOG_PARAMS.contains(&k.as_str())),
        ),
        Action::Exec | Action::Attach => {
            for (kubelet, host) in STREAM_FLAGS {
                let on = query.iter().any(|(k, v)| k == kubelet && is_true(v));
                params.push((host.to_string(), on.to_string()));
            }
            if action == Action::Exec {
                params.extend(query.into_iter().filter(|(k, _)| k == "command"));
            }
        }
        Action::PortForward => params.extend(query.into_iter().filter(|(k, _)| k == "port")),
    }
    Ok(Route {
        action,
        namespace,
        pod,
        uid,
        container: container.unwrap_or_default(),
        params,
    })
}

/// A DNS label (or, with `dots`, subdomain) of at most `max` characters.
fn is_name(name: &str, max: usize, dots: bool) -> bool {
    let ok =
        |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || (dots && c == '.');
    !name.is_empty()
        && name.len() <= max
        && name.chars().all(ok)
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// The host API path and query of `route` for host pod `host_pod` in `host_namespace`.
pub fn host_path(route: &Route, host_namespace: &str, host_pod: &str) -> String {
    let query: Vec<String> = route
        .params
        .iter()
        .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
        .collect();
    let mut path = format!(
        "/api/v1/namespaces/{}/pods/{}/{}",
        percent_encode(host_namespace),
        percent_encode(host_pod),
        route.action.subresource()
    );
    if !query.is_empty() {
        path.push('?');
        path.push_str(&query.join("&"));
    }
    path
}

/// What a path segment or query component keeps as it is: RFC 3986's unreserved characters.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

fn percent_encode(text: &str) -> String {
    utf8_percent_encode(text, COMPONENT).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_keep_their_options_and_name_the_container() {
        let r = parse(
            "/containerLogs/default/web-1/nginx",
            Some("follow=true&tailLines=10&timestamps=true&bogus=1"),
        )
        .unwrap();
        assert_eq!(r.action, Action::Logs);
        assert_eq!((r.namespace.as_str(), r.pod.as_str()), ("default", "web-1"));
        assert_eq!(
            host_path(&r, "team-a", "web-1-x-default-x-dev"),
            "/api/v1/namespaces/team-a/pods/web-1-x-default-x-dev/log?container=nginx&follow=true&tailLines=10&timestamps=true"
        );
    }

    #[test]
    fn exec_flags_and_commands_are_renamed_for_the_host_api() {
        let r = parse(
            "/exec/default/web-1/nginx",
            Some("command=sh&command=-c&command=echo%20hi%20%26%20ls&input=1&output=1&tty=1"),
        )
        .unwrap();
        assert_eq!(
            host_path(&r, "team-a", "p"),
            "/api/v1/namespaces/team-a/pods/p/exec?container=nginx&stdin=true&stdout=true&stderr=false&tty=true&command=sh&command=-c&command=echo%20hi%20%26%20ls"
        );
        let plus = parse("/exec/default/web-1/nginx", Some("command=echo+hi")).unwrap();
        assert_eq!(plus.params.last().unwrap().1, "echo hi", "form-encoded");
        assert!(matches!(
            parse("/exec/default/web-1/%ff", None),
            Err(RouteError::Malformed { .. })
        ));
        let with_uid = parse("/exec/default/web-1/0f3c/nginx", Some("output=1")).unwrap();
        assert_eq!(with_uid.uid.as_deref(), Some("0f3c"));
        assert_eq!(with_uid.container, "nginx");
    }

    #[test]
    fn attach_takes_no_command() {
        let r = parse(
            "/attach/ns/p/c",
            Some("command=rm&input=1&output=1&error=1"),
        )
        .unwrap();
        assert_eq!(
            host_path(&r, "h", "p2"),
            "/api/v1/namespaces/h/pods/p2/attach?container=c&stdin=true&stdout=true&stderr=true&tty=false"
        );
    }

    #[test]
    fn port_forward_passes_its_ports() {
        let r = parse("/portForward/ns/p", Some("port=8080&port=9090")).unwrap();
        assert_eq!(r.container, "");
        assert_eq!(
            host_path(&r, "h", "p2"),
            "/api/v1/namespaces/h/pods/p2/portforward?port=8080&port=9090"
        );
        assert_eq!(
            parse("/portForward/ns/p/uid-1", None)
                .unwrap()
                .uid
                .as_deref(),
            Some("uid-1")
        );
    }

    #[test]
    fn anything_else_is_refused_with_what_is_served() {
        for path in ["/pods", "/metrics", "/run/ns/p/c", "/stats/summary", "/"] {
            let e = parse(path, None).unwrap_err();
            assert!(matches!(e, RouteError::NotServed(_)), "{path}: {e}");
            assert!(e.to_string().contains("/containerLogs"), "{e}");
        }
        for path in [
            "/containerLogs/ns/p",
            "/exec/ns",
            "/portForward/ns/p/u/extra",
            "/exec//p/c",
            "/exec/ns/p/%zz",
            "/exec/ns/..%2F..%2Fsecrets%2Fx/c",
            "/containerLogs/kube-system%2Fpods/p/c",
            "/exec/NS/p/c",
            "/portForward/ns/p/..",
        ] {
            assert!(
                matches!(parse(path, None), Err(RouteError::Malformed { .. })),
                "{path}"
            );
        }
    }
}
