//! Kubeconfig documents, typed: every kubeconfig the project writes or reads (the tenant's admin
//! kubeconfig, the CLI's merges into the user's file, the test harness's files) goes through
//! kube's own [`Kubeconfig`] type here, so a misspelled key cannot slip into one of them and
//! fields this project does not know are kept as they were.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use kube::config::{AuthInfo, Cluster, Context, NamedAuthInfo, NamedCluster, NamedContext};
use secrecy::{ExposeSecret, SecretString};
use tenantplane_pki::KeyAndCert;

pub use kube::config::Kubeconfig;

/// Why a text is not a kubeconfig this project can use, as a sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KubeconfigError(pub String);

type Result<T> = std::result::Result<T, KubeconfigError>;

/// A kubeconfig with one cluster, one user and one context, all named `name`, and that context
/// current.
pub fn single(name: &str, cluster: Cluster, user: AuthInfo) -> Kubeconfig {
    Kubeconfig {
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        clusters: vec![NamedCluster {
            name: name.into(),
            cluster: Some(cluster),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: name.into(),
            auth_info: Some(user),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: name.into(),
            context: Some(Context {
                cluster: name.into(),
                user: Some(name.into()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some(name.into()),
        ..Default::default()
    }
}

/// The API server at `server`, whose serving certificate `ca_pem` signed.
pub fn cluster(server: &str, ca_pem: &str) -> Cluster {
    Cluster {
        server: Some(server.into()),
        certificate_authority_data: Some(STANDARD.encode(ca_pem)),
        ..Default::default()
    }
}

/// A user that authenticates with a client certificate and its key.
pub fn certificate_user(client: &KeyAndCert) -> AuthInfo {
    AuthInfo {
        client_certificate_data: Some(STANDARD.encode(&client.cert_pem)),
        client_key_data: Some(SecretString::from(STANDARD.encode(&client.key_pem))),
        ..Default::default()
    }
}

/// A user that authenticates with a bearer token (a ServiceAccount's, say).
pub fn token_user(token: &str) -> AuthInfo {
    AuthInfo {
        token: Some(SecretString::from(token.to_string())),
        ..Default::default()
    }
}

/// A kubeconfig named `name` for `server`, trusting `ca_pem`, authenticated by `client`.
pub fn for_certificate(name: &str, server: &str, ca_pem: &str, client: &KeyAndCert) -> Kubeconfig {
    single(name, cluster(server, ca_pem), certificate_user(client))
}

/// A kubeconfig named `name` for `server`, trusting `ca_pem`, authenticated by `token`.
pub fn for_token(name: &str, server: &str, ca_pem: &str, token: &str) -> Kubeconfig {
    single(name, cluster(server, ca_pem), token_user(token))
}

/// Read a kubeconfig's text; an empty text is an empty kubeconfig.
pub fn from_text(text: &str) -> Result<Kubeconfig> {
    Kubeconfig::from_yaml(text).map_err(|e| KubeconfigError(format!("not a kubeconfig: {e}")))
}

/// The YAML text of `kubeconfig`, `apiVersion` and `kind` first as kubectl writes them.
pub fn to_text(kubeconfig: &Kubeconfig) -> Result<String> {
    let encode = |e: serde_yaml::Error| KubeconfigError(format!("writing a kubeconfig: {e}"));
    let serde_yaml::Value::Mapping(mut fields) =
        serde_yaml::to_value(kubeconfig).map_err(encode)?
    else {
        return Err(KubeconfigError("a kubeconfig is not a mapping".into()));
    };
    let mut ordered = serde_yaml::Mapping::new();
    for key in ["apiVersion", "kind"] {
        if let Some(value) = fields.remove(key) {
            ordered.insert(key.into(), value);
        }
    }
    ordered.extend(fields);
    serde_yaml::to_string(&ordered).map_err(encode)
}

/// Nothing in it at all, as an empty file reads.
pub fn is_empty(k: &Kubeconfig) -> bool {
    k.preferences.is_none()
        && k.clusters.is_empty()
        && k.auth_infos.is_empty()
        && k.contexts.is_empty()
        && k.current_context.is_none()
        && k.extensions.is_none()
        && k.kind.is_none()
        && k.api_version.is_none()
        && k.other.is_empty()
}

/// The parts of a single-cluster kubeconfig with a client certificate that the operator relies
/// on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    /// The API server's URL.
    pub server: String,
    /// The CA the server's certificate chains to, PEM.
    pub ca_pem: String,
    /// The client certificate and its key.
    pub client: KeyAndCert,
}

/// The server, CA and client certificate of the first cluster and user of `text`.
pub fn credentials(text: &str) -> Result<Credentials> {
    let kubeconfig = from_text(text)?;
    let cluster = kubeconfig
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| missing("clusters.0.cluster"))?;
    let user = kubeconfig
        .auth_infos
        .first()
        .and_then(|u| u.auth_info.as_ref())
        .ok_or_else(|| missing("users.0.user"))?;
    let key = user.client_key_data.as_ref().map(|k| k.expose_secret());
    Ok(Credentials {
        server: cluster
            .server
            .clone()
            .ok_or_else(|| missing("clusters.0.cluster.server"))?,
        ca_pem: decode(
            cluster.certificate_authority_data.as_deref(),
            "clusters.0.cluster.certificate-authority-data",
        )?,
        client: KeyAndCert {
            cert_pem: decode(
                user.client_certificate_data.as_deref(),
                "users.0.user.client-certificate-data",
            )?,
            key_pem: decode(key, "users.0.user.client-key-data")?,
        },
    })
}

fn missing(path: &str) -> KubeconfigError {
    KubeconfigError(format!("{path} is missing"))
}

fn decode(b64: Option<&str>, path: &str) -> Result<String> {
    let b64 = b64.ok_or_else(|| missing(path))?;
    let bytes = STANDARD
        .decode(b64.trim())
        .map_err(|_| KubeconfigError(format!("{path} is not base64")))?;
    String::from_utf8(bytes).map_err(|_| KubeconfigError(format!("{path} is not PEM text")))
}

/// The first cluster, user and context of `kubeconfig`, all renamed to `name` (a tenant's
/// kubeconfig has exactly one of each), with the context pointing at the renamed two.
pub fn first_entries_named(
    kubeconfig: &Kubeconfig,
    name: &str,
) -> Result<(NamedCluster, NamedAuthInfo, NamedContext)> {
    let none = |what: &str| KubeconfigError(format!("the tenant's kubeconfig has no {what}"));
    let mut cluster = kubeconfig
        .clusters
        .first()
        .cloned()
        .ok_or_else(|| none("clusters"))?;
    let mut user = kubeconfig
        .auth_infos
        .first()
        .cloned()
        .ok_or_else(|| none("users"))?;
    let mut context = kubeconfig
        .contexts
        .first()
        .cloned()
        .ok_or_else(|| none("contexts"))?;
    let Some(inner) = context.context.as_mut() else {
        return Err(KubeconfigError(
            "the tenant's kubeconfig has a context without `context`".into(),
        ));
    };
    inner.cluster = name.into();
    inner.user = Some(name.into());
    cluster.name = name.into();
    user.name = name.into();
    context.name = name.into();
    Ok((cluster, user, context))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_kubeconfig_reads_back_and_starts_with_its_kind() {
        let client = KeyAndCert {
            cert_pem: "CERT\n".into(),
            key_pem: "KEY\n".into(),
        };
        let text = to_text(&for_certificate("dev", "https://dev:6443", "CA\n", &client)).unwrap();
        assert!(text.starts_with("apiVersion: v1\nkind: Config\n"), "{text}");
        assert_eq!(
            credentials(&text).unwrap(),
            Credentials {
                server: "https://dev:6443".into(),
                ca_pem: "CA\n".into(),
                client,
            }
        );
        let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(doc["current-context"], "dev");
        assert_eq!(doc["contexts"][0]["context"]["user"], "dev");
    }

    #[test]
    fn a_token_kubeconfig_carries_the_token_and_unknown_fields_survive() {
        let text = to_text(&for_token("sa", "https://h:6443", "CA", "secret-token")).unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(doc["users"][0]["user"]["token"], "secret-token");
        assert_eq!(
            credentials(&text).unwrap_err().to_string(),
            "users.0.user.client-certificate-data is missing"
        );

        let mine = "kind: Config\npreferences:\n  colors: true\nmine: kept\n";
        let doc: serde_yaml::Value =
            serde_yaml::from_str(&to_text(&from_text(mine).unwrap()).unwrap()).unwrap();
        assert_eq!(doc["mine"], "kept");
        assert_eq!(doc["preferences"]["colors"], true);
        assert!(is_empty(&from_text("").unwrap()));
        assert!(from_text("- a\n").is_err());
    }

    #[test]
    fn first_entries_are_renamed_together() {
        let k = for_token("a", "https://h:6443", "CA", "t");
        let (cluster, user, context) = first_entries_named(&k, "b").unwrap();
        assert_eq!((cluster.name, user.name), ("b".into(), "b".into()));
        let inner = context.context.unwrap();
        assert_eq!(
            (inner.cluster.as_str(), inner.user.as_deref()),
            ("b", Some("b"))
        );
        assert!(first_entries_named(&Kubeconfig::default(), "b").is_err());
    }
}
