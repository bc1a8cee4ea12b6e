//! Host text said in the tenant's terms. What the host writes about a tenant's copies (Events,
//! pod conditions, container states) names the host namespace, the copies' host names and host
//! nodes; the tenant reads its own names instead, and never a host node it is not shown. Text
//! that would still name the host after translation is replaced by a sentence that says so.

use k8s_openapi::api::core::v1::{
    ConfigMap, Node, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};

use crate::kinds::nodes;
use crate::naming::{self, Virtual};
use crate::tenant::Tenant;

/// What the tenant reads while its pod's copy waits for the host scheduler: the scheduler's own
/// message counts and describes host nodes the tenant may not even use.
pub const WAITING_FOR_ROOM: &str =
    "Waiting for room on the nodes this cluster may use: none of them can take the pod now.";

/// What the tenant reads instead of a host scheduler's preemption message (it names the
/// preemptor by UID and the host node).
pub const PREEMPTED: &str = "Preempted on the host to make room for a pod of higher priority.";

/// What a host message that cannot be said in tenant terms becomes.
pub const NOT_SHOWN: &str = "The host's message names host objects, so it is not shown.";

/// A lookup from a host name to what it means for the tenant.
pub type Lookup<'a, T> = Box<dyn Fn(&str) -> T + Send + Sync + 'a>;

/// How host names read in the tenant, for text about one tenant object.
pub struct Terms<'a> {
    /// The tenant's host namespace.
    pub host_namespace: &'a str,
    /// The tenant namespace and name of the object the text is about.
    pub namespace: &'a str,
    /// The name of the object the text is about.
    pub name: &'a str,
    /// The tenant object a host name stands for, when it is a copy of this tenant's.
    pub copy: Lookup<'a, Option<Virtual>>,
    /// Is this the name of a host node the tenant is not shown?
    pub hidden_node: Lookup<'a, bool>,
    /// May the tenant read this address (one of its own pods or Services, loopback)? Any other
    /// (a node's, its resolver's, another team's pod) becomes [`HOST_ADDRESS`].
    pub address: Lookup<'a, bool>,
}

/// What an address of the host reads as in the tenant.
pub const HOST_ADDRESS: &str = "<host address>";

/// Characters of the names the host writes (DNS labels and subdomains, label values).
fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// Does `word` read as some tenant's copy (`<name>-x-<namespace>-x-<tenant>`)?
fn copy_shaped(word: &str) -> bool {
    word.matches("-x-").count() >= 2
}

/// `text` with host names replaced by the tenant's; `None` when it names what the tenant may not
/// see (a hidden host node, a copy that is not this tenant's).
pub fn in_tenant_terms(text: &str, terms: &Terms) -> Option<String> {
    let text = without_host_addresses(text, &terms.address);
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(start) = rest.find(name_char) {
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        let end = rest.find(|c| !name_char(c)).unwrap_or(rest.len());
        let token = &rest[..end];
        // A sentence's full stop is not part of the name before it.
        let word = token.trim_end_matches('.');
        out.push_str(&word_in_tenant_terms(word, &rest[word.len()..], terms)?);
        out.push_str(&token[word.len()..]);
        rest = &rest[end..];
    }
    out.push_str(rest);
    Some(out)
}

/// Characters of a written address: IPv4 dotted, IPv6 with colons (and a port after either).
fn address_char(c: char) -> bool {
    c.is_ascii_hexdigit() || matches!(c, '.' | ':')
}

/// `text` with every address the tenant may not read (`shown` says no) replaced by
/// [`HOST_ADDRESS`]: an image pull's error names the node's resolver, a probe's a node's port.
pub fn without_host_addresses(text: &str, shown: &dyn Fn(&str) -> bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(address_char) {
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        let end = rest.find(|c| !address_char(c)).unwrap_or(rest.len());
        // The colon or dot that ends a word (`host:10.0.0.2`) is not the address's.
        let lead = rest[..end].len() - rest[..end].trim_start_matches([':', '.']).len();
        out.push_str(&rest[..lead]);
        let run = &rest[lead..end];
        // Part of a longer word (`v1.2.3`, `sha256:ab…`) is no address.
        let in_word = lead == 0
            && out
                .chars()
                .last()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        match address_in(run).filter(|_| !in_word) {
            Some(ip) if !shown(ip) => {
                let at = run.find(ip).unwrap_or(0);
                out.push_str(&run[..at]);
                out.push_str(HOST_ADDRESS);
                out.push_str(&run[at + ip.len()..]);
            }
            _ => out.push_str(run),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The address a run of address characters holds: all of it (`10.0.0.2`, `fd00::1`), or before
/// a port (`10.0.0.2:53`); a sentence's full stop after it is not part of it.
fn address_in(run: &str) -> Option<&str> {
    let run = run.trim_end_matches(['.', ':']);
    if run.parse::<std::net::IpAddr>().is_ok() {
        return Some(run);
    }
    let (head, port) = run.rsplit_once(':')?;
    (port.chars().all(|c| c.is_ascii_digit()) && head.parse::<std::net::Ipv4Addr>().is_ok())
        .then_some(head)
}

/// How host names read in text about tenant object `namespace/name` of `cx`'s tenant (not a
/// pod: no node of its own to name).
pub fn about<'a>(cx: &'a Tenant, namespace: &'a str, name: &'a str) -> Terms<'a> {
    Terms {
        host_namespace: &cx.tr.host_namespace,
        namespace,
        name,
        copy: Box::new(|w| copy_named(cx, w)),
        hidden_node: Box::new(|w| hidden_node(cx, w, &[])),
        address: Box::new(|ip| shown_address(cx, ip)),
    }
}

/// Is `ip` an address the tenant of `cx` may read: loopback, the operator's kubelet endpoint
/// (its virtual Nodes' address), one of its own pods' or Services', or a host node's where the
/// profile shows node addresses?
pub fn shown_address(cx: &Tenant, ip: &str) -> bool {
    let Ok(parsed) = ip.parse::<std::net::IpAddr>() else {
        return true;
    };
    if parsed.is_loopback() || parsed.is_unspecified() {
        return true;
    }
    if cx.tr.kubelet.as_ref().is_some_and(|k| k.address == ip) {
        return true;
    }
    let service = |s: &Service| {
        s.spec
            .as_ref()
            .and_then(|s| s.cluster_ips.as_ref())
            .is_some_and(|ips| ips.iter().any(|a| a == ip))
    };
    if cx.own_pod_ips().contains(ip) || cx.tenant_list::<Service>().iter().any(|s| service(s)) {
        return true;
    }
    cx.tr.allow.node_addresses
        && cx.host_slice::<Node>().iter().any(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .is_some_and(|a| a.iter().any(|a| a.address == ip))
        })
}

/// One name, followed in the text by `after`.
fn word_in_tenant_terms(word: &str, after: &str, terms: &Terms) -> Option<String> {
    if word.is_empty() {
        return Some(String::new());
    }
    if (terms.hidden_node)(word) {
        return None;
    }
    if let Some(v) = (terms.copy)(word) {
        return Some(v.name);
    }
    if word == terms.host_namespace {
        // `<host namespace>/<copy>`: the copy's own tenant namespace.
        let next = after.strip_prefix('/').map(|a| {
            let end = a.find(|c| !name_char(c)).unwrap_or(a.len());
            a[..end].trim_end_matches('.')
        });
        let namespace = next
            .and_then(|n| (terms.copy)(n))
            .map(|v| v.namespace)
            .unwrap_or_else(|| terms.namespace.to_string());
        return Some(namespace);
    }
    if word.contains('.') {
        // A dotted name (`<copy>.<host namespace>.svc`): each part on its own.
        let parts: Option<Vec<String>> = word
            .split('.')
            .map(|p| word_in_tenant_terms(p, "", terms))
            .collect();
        return parts.map(|p| p.join("."));
    }
    (!copy_shaped(word)).then(|| word.to_string())
}

/// The tenant object `word` names when it is the plain host name of a copy of `tenant`'s
/// (`<name>-x-<namespace>-x-<tenant>`); hashed names are looked up instead (see [`copy_named`]).
pub fn plain_copy_name(word: &str, tenant: &str) -> Option<Virtual> {
    let mut parts = word.split("-x-");
    let (name, namespace, of) = (parts.next()?, parts.next()?, parts.next()?);
    (parts.next().is_none()
        && of == tenant
        && naming::host_name_for(tenant, namespace, name) == word)
        .then(|| Virtual {
            namespace: namespace.into(),
            name: name.into(),
            uid: String::new(),
        })
}

/// The tenant object host name `word` stands for, if it is a copy of this tenant's: by its
/// plain form, or as a copy the host watches hold.
pub fn copy_named(cx: &Tenant, word: &str) -> Option<Virtual> {
    if let Some(v) = plain_copy_name(word, cx.tr.name()) {
        return Some(v);
    }
    let metas = [
        cx.host_get::<Pod>(true, word).map(|o| o.metadata.clone()),
        cx.host_get::<Service>(true, word)
            .map(|o| o.metadata.clone()),
        cx.host_get::<PersistentVolumeClaim>(true, word)
            .map(|o| o.metadata.clone()),
        cx.host_get::<ConfigMap>(true, word)
            .map(|o| o.metadata.clone()),
        cx.host_get::<Secret>(true, word)
            .map(|o| o.metadata.clone()),
        cx.host_get::<ServiceAccount>(true, word)
            .map(|o| o.metadata.clone()),
    ];
    metas.into_iter().flatten().find_map(|m| cx.tr.copy_of(&m))
}

/// Is `word` a host node this tenant is not shown? A node is known as one from the host's node
/// watch, or from `known` (the nodes the text's object and source name, for when virtual nodes
/// are off and nothing watches host nodes).
pub fn hidden_node(cx: &Tenant, word: &str, known: &[String]) -> bool {
    (known.iter().any(|k| k == word) || cx.host_get::<Node>(false, word).is_some())
        && !nodes::shown(cx, word)
}

/// The message a host Event with `reason` shows in the tenant.
pub fn event_message(reason: &str, message: &str, terms: &Terms) -> String {
    match reason {
        "FailedScheduling" => WAITING_FOR_ROOM.to_string(),
        "Preempted" => PREEMPTED.to_string(),
        _ => in_tenant_terms(message, terms).unwrap_or_else(|| {
            if reason == "Scheduled" {
                format!(
                    "Successfully assigned {}/{} to a node of the host that this cluster does not show.",
                    terms.namespace, terms.name
                )
            } else {
                NOT_SHOWN.to_string()
            }
        }),
    }
}

/// A host status message (of a pod, a condition, a container state) as the tenant reads it.
pub fn status_message(message: &str, terms: &Terms) -> String {
    in_tenant_terms(message, terms).unwrap_or_else(|| NOT_SHOWN.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(word: &str) -> Option<Virtual> {
        let v = |namespace: &str, name: &str| Virtual {
            namespace: namespace.into(),
            name: name.into(),
            uid: String::new(),
        };
        match word {
            "web-x-default-x-dev" => Some(v("default", "web")),
            "conf-x-default-x-dev" => Some(v("default", "conf")),
            "db-x-data-x-dev" => Some(v("data", "db")),
            "long-name-0123456789abcdef" => Some(v("default", "long-name-that-was-cut")),
            _ => None,
        }
    }

    fn hidden(word: &str) -> bool {
        matches!(word, "pool-b-7" | "ip-10-0-0-5.ec2.internal")
    }

    fn terms() -> Terms<'static> {
        Terms {
            host_namespace: "team-dev",
            namespace: "default",
            name: "web",
            copy: Box::new(copy),
            hidden_node: Box::new(hidden),
            address: Box::new(|ip| ip == "10.244.0.7"),
        }
    }

    fn said(text: &str) -> Option<String> {
        in_tenant_terms(text, &terms())
    }

    /// Addresses of the host (a node's resolver in an image pull's error, another pod's) read
    /// as such; the tenant's own pod's stays, and so do versions and digests.
    #[test]
    fn host_addresses_are_not_shown() {
        let pull = "failed to pull image \"registry.example/app:v1.2.3\": dial tcp: lookup registry.example on 10.0.0.2:53: no such host";
        assert_eq!(
            said(pull).as_deref(),
            Some(
                "failed to pull image \"registry.example/app:v1.2.3\": dial tcp: lookup registry.example on <host address>:53: no such host"
            )
        );
        assert_eq!(
            said("Readiness probe failed: Get \"http://10.244.0.7:8080/\": dial tcp 10.244.0.7:8080: connect: connection refused").as_deref(),
            Some("Readiness probe failed: Get \"http://10.244.0.7:8080/\": dial tcp 10.244.0.7:8080: connect: connection refused")
        );
        assert_eq!(
            said("dial tcp [fd00:10::5]:443 and 192.168.1.10.").as_deref(),
            Some("dial tcp [<host address>]:443 and <host address>.")
        );
        assert_eq!(
            said("host:10.0.0.2 and 10.0.0.1-10.0.0.9, addr:fd00::1").as_deref(),
            Some("host:<host address> and <host address>-<host address>, addr:<host address>")
        );
        assert_eq!(
            said("image sha256:1234abcd ok, at 12:30:45, counted 10.5 s").as_deref(),
            Some("image sha256:1234abcd ok, at 12:30:45, counted 10.5 s")
        );
    }

    #[test]
    fn the_scheduler_assigns_the_tenants_pod_to_a_node_it_sees() {
        assert_eq!(
            said("Successfully assigned team-dev/web-x-default-x-dev to kwok-node-0").as_deref(),
            Some("Successfully assigned default/web to kwok-node-0")
        );
        let e = |m| event_message("Scheduled", m, &terms());
        assert_eq!(
            e("Successfully assigned team-dev/web-x-default-x-dev to kwok-node-0"),
            "Successfully assigned default/web to kwok-node-0"
        );
        assert_eq!(
            e("Successfully assigned team-dev/web-x-default-x-dev to pool-b-7"),
            "Successfully assigned default/web to a node of the host that this cluster does not show."
        );
    }

    #[test]
    fn a_hidden_node_is_never_named() {
        assert_eq!(said("Node pool-b-7 is not ready"), None);
        assert_eq!(said("on ip-10-0-0-5.ec2.internal."), None);
        assert_eq!(
            event_message("NodeNotReady", "Node pool-b-7 is not ready", &terms()),
            NOT_SHOWN
        );
        // A word that only contains a hidden node's name is another word.
        assert_eq!(said("pool-b-70 ok").as_deref(), Some("pool-b-70 ok"));
    }

    #[test]
    fn copies_read_as_the_tenants_objects() {
        assert_eq!(
            said(r#"Error: configmap "conf-x-default-x-dev" not found"#).as_deref(),
            Some(r#"Error: configmap "conf" not found"#)
        );
        assert_eq!(
            said("pod team-dev/db-x-data-x-dev uses it").as_deref(),
            Some("pod data/db uses it"),
            "the namespace of the copy, not of the object the text is about"
        );
        assert_eq!(
            said("dial web-x-default-x-dev.team-dev.svc.cluster.local:80").as_deref(),
            Some("dial web.default.svc.cluster.local:80")
        );
        assert_eq!(
            said("claim long-name-0123456789abcdef is pending.").as_deref(),
            Some("claim long-name-that-was-cut is pending.")
        );
        assert_eq!(
            said("in namespace team-dev").as_deref(),
            Some("in namespace default")
        );
    }

    #[test]
    fn plain_copy_names_are_read_back() {
        let v = plain_copy_name("web-0-x-default-x-dev", "dev").unwrap();
        assert_eq!(
            (v.namespace.as_str(), v.name.as_str()),
            ("default", "web-0")
        );
        assert_eq!(plain_copy_name("web-0-x-default-x-prod", "dev"), None);
        assert_eq!(plain_copy_name("a-x-b-x-c-x-dev", "dev"), None);
        assert_eq!(plain_copy_name("web", "dev"), None);
        let hashed = naming::host_name_for("dev", "default", &"a".repeat(80));
        assert_eq!(
            plain_copy_name(&hashed, "dev"),
            None,
            "looked up, not parsed"
        );
    }

    #[test]
    fn another_tenants_copy_is_not_shown() {
        assert_eq!(said("used by api-x-default-x-payments"), None);
        assert_eq!(said("team-dev/api-x-prod-x-other.svc"), None);
    }

    #[test]
    fn text_without_host_names_is_kept_as_is() {
        for text in [
            "",
            "Pulling image \"docker.io/library/nginx:1.27\"",
            "Back-off restarting failed container c in pod web_default(1234)",
            "containers with unready status: [c sidecar]",
            "The node was low on resource: memory. Threshold quantity: 100Mi.",
            "héllo wörld: ümlaut",
        ] {
            assert_eq!(said(text).as_deref(), Some(text));
        }
    }

    #[test]
    fn scheduling_messages_never_describe_host_nodes() {
        let inventory = "0/3 nodes are available: 1 node(s) had untolerated taint(s), \
                         2 node(s) didn't match Pod's node affinity/selector.";
        assert_eq!(
            event_message("FailedScheduling", inventory, &terms()),
            WAITING_FOR_ROOM
        );
        assert_eq!(
            event_message(
                "Preempted",
                "Preempted by pod 0b4c-11 on node pool-b-7",
                &terms()
            ),
            PREEMPTED
        );
        assert_eq!(
            WAITING_FOR_ROOM,
            "Waiting for room on the nodes this cluster may use: none of them can take the pod now."
        );
        assert!(!WAITING_FOR_ROOM.chars().any(|c| c.is_ascii_digit()));
    }

    #[test]
    fn status_messages_fall_back_to_a_sentence() {
        assert_eq!(
            status_message(
                "Node pool-b-7 which was running pod x is unresponsive",
                &terms()
            ),
            NOT_SHOWN
        );
        assert_eq!(
            status_message("secret \"conf-x-default-x-dev\" not found", &terms()),
            "secret \"conf\" not found"
        );
    }
}
