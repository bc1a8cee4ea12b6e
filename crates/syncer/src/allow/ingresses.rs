//! Default deny for Ingresses. An ingress controller on the host acts on what an Ingress says
//! with its own rights: its hosts, its paths (which controllers write into their configuration),
//! and its annotations. Annotations are judged by what their value does, whatever the key: a
//! value that names an object of another namespace (or of the host namespace, where tenant names
//! mean nothing), a URL, or a host beyond the Ingress's own refuses the Ingress. Refused rather
//! than left out: without its auth or allow-list annotation, an Ingress would fail open.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::networking::v1::IngressSpec;
use tenantplane_api::Allowances;
use tenantplane_api::allowances::name_matches;
use tenantplane_api::cidr::Cidr;

use super::values::listed;
use super::values::tokens;

/// cert-manager's annotations that pick the issuer of an Ingress's certificate.
const ISSUER_KEYS: &[&str] = &["cert-manager.io/cluster-issuer", "cert-manager.io/issuer"];

/// The legacy class annotation, which controllers still honour over `ingressClassName`.
pub(crate) const CLASS_KEY: &str = "kubernetes.io/ingress.class";

/// How much of a value a sentence quotes.
const QUOTED: usize = 100;

/// Why an Ingress may not reach the host under `allow`; empty when it may.
pub fn ingress_refusals(allow: &Allowances, spec: &IngressSpec) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(class) = &spec.ingress_class_name
        && !allow.ingress_classes.contains(class)
    {
        out.push(format!(
            "ingressClassName {class:?} is not in the IsolationProfile's allow.ingressClasses{}",
            listed(&allow.ingress_classes)
        ));
    }
    let host_ok = |h: &str| {
        allow
            .ingress_hosts
            .iter()
            .any(|p| p == "*" || name_matches(p, h))
    };
    for rule in spec.rules.iter().flatten() {
        match rule.host.as_deref() {
            Some(h) if host_ok(h) => {}
            Some(h) => out.push(format!(
                "host {h:?} is not in the IsolationProfile's allow.ingressHosts{}",
                listed(&allow.ingress_hosts)
            )),
            None if host_ok("*") => {}
            None => out.push(
                "a rule without a host would take every host of the ingress controller; name a host the IsolationProfile's allow.ingressHosts lists".into(),
            ),
        }
        for p in rule.http.iter().flat_map(|h| h.paths.iter()) {
            if let Some(why) = p.path.as_deref().and_then(path_refusal) {
                out.push(format!(
                    "path {:?} ({}) is not a plain path: {why}; ingress controllers write paths into their configuration, so only the characters of a URL path are allowed (letters, digits, - . _ ~ / ! $ & ( ) * + , = : @ and %XX), whatever the IsolationProfile allows",
                    quoted(p.path.as_deref().unwrap_or_default()),
                    p.path_type
                ));
            }
        }
    }
    if spec.default_backend.is_some() && !host_ok("*") {
        out.push(
            "defaultBackend would take every host of the ingress controller; use rules with hosts"
                .into(),
        );
    }
    for tls in spec.tls.iter().flatten() {
        for h in tls.hosts.iter().flatten() {
            if !host_ok(h) {
                out.push(format!(
                    "TLS host {h:?} is not in the IsolationProfile's allow.ingressHosts{}",
                    listed(&allow.ingress_hosts)
                ));
            }
        }
    }
    out
}

/// Why `path` is not a plain URL path (`None`: it is).
pub fn path_refusal(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return Some("it does not start with /".into());
    }
    let bytes = path.as_bytes();
    for (i, c) in path.char_indices() {
        let plain = c.is_ascii_alphanumeric() || "-._~/!$&()*+,=:@".contains(c);
        if c == '%' {
            let hex = |j: usize| bytes.get(j).is_some_and(u8::is_ascii_hexdigit);
            if !(hex(i + 1) && hex(i + 2)) {
                return Some("% is not followed by two hex digits".into());
            }
        } else if !plain {
            return Some(format!("it holds {c:?}"));
        }
    }
    None
}

/// Why the annotations a host copy of an Ingress would carry (`kept`: those the profile admits
/// by key) keep it off the host; empty when they may go down.
pub fn annotation_refusals(
    allow: &Allowances,
    spec: &IngressSpec,
    kept: &BTreeMap<String, String>,
) -> Vec<String> {
    let own_hosts: Vec<&str> = spec
        .rules
        .iter()
        .flatten()
        .filter_map(|r| r.host.as_deref())
        .chain(
            spec.tls
                .iter()
                .flatten()
                .flat_map(|t| t.hosts.iter().flatten().map(String::as_str)),
        )
        .collect();
    kept.iter()
        .filter_map(|(k, v)| {
            annotation_refusal(allow, &own_hosts, k, v)
                .map(|why| format!("annotation {k}={:?} is refused: {why}", quoted(v)))
        })
        .collect()
}

/// Why annotation `key` with `value` may not reach the host copy of an Ingress serving
/// `own_hosts`.
fn annotation_refusal(
    allow: &Allowances,
    own_hosts: &[&str],
    key: &str,
    value: &str,
) -> Option<String> {
    const NO_SETTING: &str = "no IsolationProfile setting opens it; leave the annotation out";
    if ISSUER_KEYS.contains(&key) {
        return (!allow.cert_issuers.iter().any(|i| i == value.trim())).then(|| {
            format!(
                "the issuer is not in the IsolationProfile's allow.certIssuers{}",
                listed(&allow.cert_issuers)
            )
        });
    }
    match (key, value.trim()) {
        ("cert-manager.io/issuer-kind", "Issuer" | "ClusterIssuer") => return None,
        ("cert-manager.io/issuer-kind", _) => {
            return Some(format!(
                "only cert-manager's own Issuer and ClusterIssuer kinds may issue; {NO_SETTING}"
            ));
        }
        ("cert-manager.io/issuer-group", "cert-manager.io") => return None,
        ("cert-manager.io/issuer-group", _) => {
            return Some(format!(
                "only cert-manager's own issuers (group cert-manager.io) may issue; {NO_SETTING}"
            ));
        }
        (CLASS_KEY, class) if allow.ingress_classes.iter().any(|c| c == class) => return None,
        (CLASS_KEY, _) => {
            return Some(format!(
                "the class is not in the IsolationProfile's allow.ingressClasses{}",
                listed(&allow.ingress_classes)
            ));
        }
        _ => {}
    }
    if let Some(why) = value_refusal(own_hosts, value) {
        return Some(format!("{why}; {NO_SETTING}"));
    }
    if never_copied(key) {
        Some(format!(
            "its key makes the controller run configuration, or read an object by a name that means nothing on the host; {NO_SETTING}"
        ))
    } else {
        None
    }
}

/// What an annotation value does that no Ingress of a tenant may ask for, whatever the key:
/// call a URL, name an object of a namespace (`ns/name`, `<ns>-<name>@kubernetescrd`), or send
/// traffic to an address or a host beyond the Ingress's own.
pub fn value_refusal(own_hosts: &[&str], value: &str) -> Option<String> {
    if let Some(why) = super::values::points_elsewhere(value) {
        return Some(why);
    }
    for token in tokens(value) {
        if token.starts_with('/') || (token.contains('/') && Cidr::parse(token).is_some()) {
            // A path, or an address range (which only narrows who may connect).
            continue;
        }
        let head = token.split('/').next().unwrap_or_default();
        let host = match head.split_once(':') {
            Some((h, port)) if !port.contains(':') => h,
            _ => head,
        };
        if token.parse::<IpAddr>().is_ok() || host.parse::<IpAddr>().is_ok() {
            return Some(format!(
                "{token:?} is an address (write an allowed range as a CIDR, such as 203.0.113.7/32)"
            ));
        }
        if is_hostname(host) && !own_hosts.iter().any(|own| covers(own, host)) {
            return Some(format!(
                "{host:?} is a host this Ingress does not serve (it serves {})",
                if own_hosts.is_empty() {
                    "none by name".to_string()
                } else {
                    own_hosts.join(", ")
                }
            ));
        }
    }
    None
}

/// Ingress annotation keys whose values are read as configuration (snippets) or as names of
/// objects looked up in the host namespace (Secrets, ConfigMaps, certificates, CAs, backends,
/// middlewares), where a tenant's name means nothing or someone else's object: never copied.
pub fn never_copied(key: &str) -> bool {
    const NAMING_OTHERS: &[&str] = &[
        "auth-url",
        "auth-signin",
        "auth-tls-match-cn",
        "mirror-target",
        "mirror-host",
        "server-alias",
    ];
    const OBJECT_WORDS: &[&str] = &[
        "secret",
        "secrets",
        "configmap",
        "certificate",
        "crt",
        "ca",
        "headers",
        "backend",
        "middlewares",
        "serverstransport",
    ];
    let key = key.to_ascii_lowercase();
    let name = key.rsplit('/').next().unwrap_or_default();
    let last_word = name.rsplit(['-', '.']).next().unwrap_or_default();
    key.contains("snippet") || NAMING_OTHERS.contains(&name) || OBJECT_WORDS.contains(&last_word)
}

/// Does Ingress host `own` (exact, or `*.example.com`) cover `host`?
fn covers(own: &str, host: &str) -> bool {
    own.eq_ignore_ascii_case(host)
        || name_matches(&own.to_ascii_lowercase(), &host.to_ascii_lowercase())
}

/// Does `s` read as a DNS name (two labels or more, the last starting with a letter)?
fn is_hostname(s: &str) -> bool {
    let labels: Vec<&str> = s.split('.').collect();
    let label_ok = |(i, l): (usize, &&str)| {
        (i == 0 && *l == "*")
            || (!l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    };
    labels.len() >= 2
        && labels.iter().enumerate().all(label_ok)
        && labels
            .last()
            .is_some_and(|l| l.starts_with(|c: char| c.is_ascii_alphabetic()))
}

/// The start of `value`, for a sentence.
fn quoted(value: &str) -> String {
    let mut q: String = value.chars().take(QUOTED).collect();
    if q.len() < value.len() {
        q.push('…');
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn spec(v: Value) -> IngressSpec {
        serde_json::from_value(v).unwrap()
    }

    fn open() -> Allowances {
        Allowances {
            ingress_hosts: vec!["*".into()],
            ingress_classes: vec!["nginx".into()],
            cert_issuers: vec!["letsencrypt".into()],
            ..Default::default()
        }
    }

    fn refused(key: &str, value: &str) -> Option<String> {
        let s = spec(
            json!({"rules": [{"host": "web.dev.example.com"}, {"host": "*.apps.example.com"}]}),
        );
        let kept = BTreeMap::from([(key.to_string(), value.to_string())]);
        annotation_refusals(&open(), &s, &kept).pop()
    }

    #[test]
    fn values_that_name_other_namespaces_urls_or_other_hosts_are_refused_for_any_key() {
        for (key, value) in [
            ("haproxy.org/ssl-certificate", "kube-system/wildcard-tls"),
            ("haproxy.org/cors-allow-origin", "https://evil.example.org"),
            ("example.com/anything", "team-b/db-password"),
            (
                "traefik.ingress.kubernetes.io/router.middlewares",
                "ops-basic-auth@kubernetescrd",
            ),
            (
                "traefik.ingress.kubernetes.io/router.tls.options",
                "team-b-mtls@kubernetescrd",
            ),
            (
                "nginx.ingress.kubernetes.io/permanent-redirect",
                "https://bank.example.org/login",
            ),
            (
                "nginx.ingress.kubernetes.io/temporal-redirect",
                "//bank.example.org/login",
            ),
            (
                "nginx.ingress.kubernetes.io/permanent-redirect",
                "bank.example.org/login",
            ),
            (
                "nginx.ingress.kubernetes.io/upstream-vhost",
                "kubernetes.default.svc.cluster.local",
            ),
            (
                "nginx.ingress.kubernetes.io/upstream-vhost",
                "internal.example.com:8443",
            ),
            ("example.com/target", "10.96.0.1"),
            ("example.com/target", "[fd00:ec2::254]"),
            (
                "example.com/json",
                r#"{"Type": "redirect", "Host": "evil.example.org"}"#,
            ),
            (
                "nginx.ingress.kubernetes.io/configuration-snippet",
                "return 200;",
            ),
            ("nginx.ingress.kubernetes.io/auth-secret", "basic-auth"),
            ("nginx.ingress.kubernetes.io/proxy-ssl-secret", "dev-pki"),
            ("haproxy.org/server-ca", "ca"),
            ("nginx.ingress.kubernetes.io/default-backend", "payments"),
            ("nginx.ingress.kubernetes.io/custom-headers", "headers"),
            ("traefik.ingress.kubernetes.io/router.middlewares", "strip"),
        ] {
            let why = refused(key, value).unwrap_or_else(|| panic!("{key}={value} went down"));
            assert!(
                why.contains(key) && why.contains("leave the annotation out"),
                "{why}"
            );
        }
    }

    #[test]
    fn ordinary_values_go_down() {
        for (key, value) in [
            ("nginx.ingress.kubernetes.io/rewrite-target", "/$2"),
            ("nginx.ingress.kubernetes.io/use-regex", "true"),
            ("nginx.ingress.kubernetes.io/ssl-redirect", "true"),
            ("nginx.ingress.kubernetes.io/backend-protocol", "HTTPS"),
            ("nginx.ingress.kubernetes.io/auth-secret-type", "auth-file"),
            (
                "nginx.ingress.kubernetes.io/whitelist-source-range",
                "10.0.0.0/8, 203.0.113.7/32, fd00::/8",
            ),
            ("nginx.ingress.kubernetes.io/proxy-body-size", "8m"),
            ("nginx.ingress.kubernetes.io/proxy-http-version", "1.1"),
            (
                "nginx.ingress.kubernetes.io/ssl-ciphers",
                "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384",
            ),
            (
                "nginx.ingress.kubernetes.io/ssl-protocols",
                "TLSv1.2 TLSv1.3",
            ),
            ("nginx.ingress.kubernetes.io/app-root", "/index.html"),
            ("example.com/gzip-types", "text/html application/json"),
            ("example.com/canonical", "web.dev.example.com"),
            ("example.com/alias", "shop.apps.example.com:443"),
            (
                "nginx.ingress.kubernetes.io/hsts",
                "max-age=31536000; includeSubDomains",
            ),
            (
                "nginx.ingress.kubernetes.io/cors-allow-methods",
                "GET, PUT, POST",
            ),
            ("cert-manager.io/cluster-issuer", "letsencrypt"),
            ("cert-manager.io/issuer-kind", "ClusterIssuer"),
            ("kubernetes.io/ingress.class", "nginx"),
        ] {
            assert_eq!(refused(key, value), None, "{key}={value}");
        }
    }

    #[test]
    fn issuers_and_classes_are_allow_lists() {
        let why = refused("cert-manager.io/cluster-issuer", "platform-internal-ca").unwrap();
        assert!(
            why.contains("allow.certIssuers, which allows letsencrypt"),
            "{why}"
        );
        assert!(refused("cert-manager.io/issuer", "letsencrypt-staging").is_some());
        assert!(refused("cert-manager.io/issuer-kind", "AWSPCAClusterIssuer").is_some());
        assert!(refused("cert-manager.io/issuer-group", "awspca.cert-manager.io").is_some());
        let why = refused("kubernetes.io/ingress.class", "internal").unwrap();
        assert!(why.contains("allow.ingressClasses"), "{why}");
        let none = Allowances::default();
        let kept = BTreeMap::from([(
            "cert-manager.io/cluster-issuer".to_string(),
            "letsencrypt".to_string(),
        )]);
        let out = annotation_refusals(&none, &spec(json!({})), &kept);
        assert!(out[0].contains("which is empty"), "{out:?}");
    }

    #[test]
    fn a_host_value_must_be_one_the_ingress_serves() {
        assert_eq!(
            value_refusal(&["*.apps.example.com"], "a.apps.example.com"),
            None
        );
        assert!(value_refusal(&["*.apps.example.com"], "apps.example.com").is_some());
        assert!(
            value_refusal(&[], "web.example.com")
                .unwrap()
                .contains("none by name")
        );
        assert!(value_refusal(&["web.example.com"], "WEB.example.com").is_none());
    }

    #[test]
    fn paths_must_be_plain() {
        for good in [
            "/",
            "/api",
            "/api/(.*)",
            "/a%20b",
            "/v1/users/@me",
            "/a,b=c+d!",
        ] {
            assert_eq!(path_refusal(good), None, "{good}");
        }
        // Regex alternation is no URL path character either: `/api(/|$)` is refused.
        for bad in [
            "/x;}", "/{", "/a\"b", "/a'b", "/a b", "/a\\b", "/a\nb", "/a|b", "x", "/%zz", "/é",
            "/a#b", "/a?b",
        ] {
            assert!(path_refusal(bad).is_some(), "{bad}");
        }
        let s = spec(
            json!({"rules": [{"host": "web.example.com", "http": {"paths": [
                {"path": "/ok", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 80}}}},
                {"path": "/x { return 200; }", "pathType": "ImplementationSpecific", "backend": {"service": {"name": "web", "port": {"number": 80}}}}
            ]}}]}),
        );
        let out = ingress_refusals(&open(), &s);
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(
            out[0].contains("ImplementationSpecific") && out[0].contains("not a plain path"),
            "{out:?}"
        );
    }

    #[test]
    fn key_words_mark_annotations_that_name_host_objects() {
        assert!(never_copied("nginx.ingress.kubernetes.io/server-snippet"));
        assert!(never_copied("haproxy.org/ssl-certificate"));
        assert!(never_copied("haproxy.org/client-ca"));
        assert!(never_copied(
            "traefik.ingress.kubernetes.io/router.middlewares"
        ));
        assert!(!never_copied(
            "nginx.ingress.kubernetes.io/auth-secret-type"
        ));
        assert!(!never_copied(
            "nginx.ingress.kubernetes.io/backend-protocol"
        ));
        assert!(!never_copied("nginx.ingress.kubernetes.io/cache"));
    }
}
