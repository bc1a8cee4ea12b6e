//! What an annotation value, or an annotation key, points a host component at. Opening
//! annotations in a profile opens what they configure, never other namespaces, other providers,
//! URLs, or the fields another setting decides: those are judged here, whatever the key.

use tenantplane_api::cidr::Cidr;

/// `, which allows a, b` or `, which is empty`.
pub(crate) fn listed(allowed: &[String]) -> String {
    if allowed.is_empty() {
        ", which is empty".into()
    } else {
        format!(", which allows {}", allowed.join(", "))
    }
}

/// IANA top-level media types: `text/html` in a value is a media type, not `namespace/name`.
const MEDIA_TYPES: &[&str] = &[
    "application",
    "audio",
    "font",
    "image",
    "message",
    "model",
    "multipart",
    "text",
    "video",
];

/// Domains of keys that Kubernetes' own components read as the object's fields (a claim's class,
/// provisioner and node; a pod's AppArmor and seccomp profile; a volume's binding; the host's
/// scheduler and autoscaler). A pattern (`*`, `prefix*`) never opens them: only the key listed
/// whole does. Add-ons that merely live under `kubernetes.io` (`nginx.ingress.kubernetes.io`,
/// `service.beta.kubernetes.io` for cloud balancers) are the profile's to open.
const COMPONENT_DOMAINS: &[&str] = &["kubernetes.io", "k8s.io"];
/// The same, with their subdomains.
const COMPONENT_DOMAIN_SUFFIXES: &[&str] = &[
    "volume.kubernetes.io",
    "volume.beta.kubernetes.io",
    "pv.kubernetes.io",
    "storage.kubernetes.io",
    "node.kubernetes.io",
    "node.alpha.kubernetes.io",
    "security.alpha.kubernetes.io",
    "security.beta.kubernetes.io",
    "scheduler.alpha.kubernetes.io",
    "control-plane.alpha.kubernetes.io",
    "cluster-autoscaler.kubernetes.io",
    "endpoints.kubernetes.io",
    "storage.k8s.io",
];

/// Keys that give the object a cloud identity of the host (kube2iam, kiam, EKS, GKE and Azure
/// workload identity). A pattern never opens them either.
const IDENTITY_KEYS: &[&str] = &[
    "iam.amazonaws.com/*",
    "eks.amazonaws.com/*",
    "iam.gke.io/*",
    "azure.workload.identity/*",
];

/// The runs of a value that can name something.
pub(crate) fn tokens(value: &str) -> impl Iterator<Item = &str> {
    value
        .split(|c: char| !(c.is_ascii_alphanumeric() || "-._/@:*%~".contains(c)))
        .filter(|t| !t.is_empty())
}

/// An RFC 1123 label, as namespaces and providers are named.
pub(crate) fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Why `value` points a host controller beyond the object itself: it holds a URL, or names an
/// object of a namespace (`kube-system/creds`), or of another provider (`name@provider`,
/// `<ns>-<name>@kubernetescrd`). `None` when it names nothing of the kind; paths and address
/// ranges name nothing.
pub fn points_elsewhere(value: &str) -> Option<String> {
    if value.contains("://") {
        return Some("the value holds a URL".into());
    }
    for token in tokens(value) {
        if token.starts_with("//") {
            return Some(format!("{token:?} is a URL"));
        }
        if token.starts_with('/') || (token.contains('/') && Cidr::parse(token).is_some()) {
            continue;
        }
        if let Some((name, provider)) = token.rsplit_once('@')
            && !name.is_empty()
            && is_label(provider)
        {
            return Some(format!(
                "{token:?} names an object of another provider or namespace"
            ));
        }
        let head = token.split('/').next().unwrap_or_default();
        if head != token && is_label(head) && !MEDIA_TYPES.contains(&head) {
            return Some(format!("{token:?} names an object of namespace {head:?}"));
        }
    }
    None
}

/// May pattern `pattern` of `allow.annotations` open key `key`? Equal always; a pattern
/// (`prefix*`) never opens the keys of Kubernetes' own components or of cloud identities.
pub fn pattern_opens(pattern: &str, key: &str) -> bool {
    if pattern == key {
        return true;
    }
    let Some(prefix) = pattern.strip_suffix('*') else {
        return false;
    };
    if !key.starts_with(prefix) {
        return false;
    }
    let domain = key.split_once('/').map(|(d, _)| d).unwrap_or_default();
    let component = COMPONENT_DOMAINS.contains(&domain)
        || COMPONENT_DOMAIN_SUFFIXES
            .iter()
            .any(|d| domain == *d || domain.ends_with(&format!(".{d}")));
    let identity = IDENTITY_KEYS.iter().any(|p| {
        p.strip_suffix('*')
            .is_some_and(|prefix| key.starts_with(prefix))
    });
    !component && !identity
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_that_name_other_namespaces_providers_or_urls_are_found() {
        for (value, needle) in [
            ("https://evil.example/auth", "URL"),
            ("//evil.example/x", "URL"),
            ("kube-system/host-macvlan", "namespace \"kube-system\""),
            ("kube-system/creds", "namespace \"kube-system\""),
            ("team-b-auth@kubernetescrd", "another provider"),
            ("a, kube-system/creds", "namespace \"kube-system\""),
        ] {
            let why = points_elsewhere(value).unwrap_or_default();
            assert!(why.contains(needle), "{value}: {why:?}");
        }
        for value in [
            "text/plain",
            "/healthz",
            "10.0.0.0/8",
            "true",
            "arn:aws:iam::1:role/x",
            "host-macvlan",
        ] {
            assert_eq!(points_elsewhere(value), None, "{value}");
        }
    }

    #[test]
    fn patterns_never_open_component_or_identity_keys() {
        assert!(pattern_opens("*", "prometheus.io/scrape"));
        assert!(pattern_opens("prometheus.io/*", "prometheus.io/scrape"));
        assert!(!pattern_opens(
            "*",
            "volume.beta.kubernetes.io/storage-class"
        ));
        assert!(!pattern_opens("*", "volume.kubernetes.io/selected-node"));
        assert!(!pattern_opens("*", "pv.kubernetes.io/bind-completed"));
        assert!(!pattern_opens(
            "*",
            "container.apparmor.security.beta.kubernetes.io/c"
        ));
        assert!(!pattern_opens("*", "iam.amazonaws.com/role"));
        assert!(!pattern_opens("*", "eks.amazonaws.com/role-arn"));
        assert!(!pattern_opens(
            "volume.*",
            "volume.kubernetes.io/selected-node"
        ));
        assert!(
            pattern_opens("iam.amazonaws.com/role", "iam.amazonaws.com/role"),
            "a key listed whole is the platform's own choice"
        );
        assert!(!pattern_opens("a/b", "a/bc"));
    }
}
