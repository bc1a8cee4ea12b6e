//! A kube-apiserver's flags and audit policy: the host cluster and the local runtime's tenant API
//! servers start theirs the same way.

use std::path::PathBuf;

/// The host cluster's service CIDR, which every API server here serves. Tenants must use the
/// same one (DESIGN.md).
pub const SERVICE_CIDR: &str = "10.96.0.0/16";

/// Where the host API server writes its audit log, under its folder.
pub(crate) const AUDIT_LOG: &str = "logs/audit.log";

/// Metadata of every write, once its response is sent; reads are not recorded.
pub const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
"#;

/// What a kube-apiserver needs; the local runtime starts tenant API servers with the same flags.
#[derive(Clone, Debug)]
pub struct ApiServerConfig {
    /// etcd's URL (`--etcd-servers`).
    pub etcd: String,
    /// The key prefix in etcd, one per API server sharing it.
    pub etcd_prefix: String,
    /// The port to serve HTTPS on.
    pub port: u16,
    /// Where the API server writes what it generates.
    pub cert_dir: PathBuf,
    /// The client CA: clients' certificates must chain to it.
    pub ca_crt: PathBuf,
    /// The serving certificate.
    pub serving_crt: PathBuf,
    /// The serving certificate's key.
    pub serving_key: PathBuf,
    /// The key that signs service-account tokens.
    pub sa_key: PathBuf,
    /// The public key that verifies them.
    pub sa_pub: PathBuf,
    /// The aggregation layer's CA and client certificate, if aggregated API servers are served.
    pub front_proxy: Option<FrontProxy>,
    /// Serve on every address of the namespace and advertise this one (the real node's, which
    /// pods reach) in the `kubernetes` Endpoints; `None`: loopback only, no Endpoints.
    pub advertise: Option<String>,
    /// The client certificate and key the API server shows a real kubelet.
    pub kubelet_client: Option<(PathBuf, PathBuf)>,
}

/// The request-header (aggregation) CA and the API server's client certificate under it.
#[derive(Clone, Debug)]
pub struct FrontProxy {
    /// The request-header CA.
    pub ca: PathBuf,
    /// The API server's client certificate under it.
    pub client_crt: PathBuf,
    /// That certificate's key.
    pub client_key: PathBuf,
}

/// Flags for a kube-apiserver on loopback, authenticating clients by certificate and signing
/// service-account tokens.
pub fn apiserver_args(c: &ApiServerConfig) -> Vec<String> {
    let (bind, advertise) = match &c.advertise {
        Some(address) => ("0.0.0.0".to_string(), address.clone()),
        None => ("127.0.0.1".to_string(), "127.0.0.1".to_string()),
    };
    let mut list = flags(&[
        ("etcd-servers", c.etcd.clone()),
        ("etcd-prefix", c.etcd_prefix.clone()),
        ("bind-address", bind),
        ("advertise-address", advertise),
        ("secure-port", c.port.to_string()),
        ("cert-dir", c.cert_dir.display().to_string()),
        ("tls-cert-file", c.serving_crt.display().to_string()),
        ("tls-private-key-file", c.serving_key.display().to_string()),
        ("client-ca-file", c.ca_crt.display().to_string()),
        (
            "service-account-issuer",
            "https://kubernetes.default.svc.cluster.local".into(),
        ),
        ("service-account-key-file", c.sa_pub.display().to_string()),
        (
            "service-account-signing-key-file",
            c.sa_key.display().to_string(),
        ),
        ("service-cluster-ip-range", SERVICE_CIDR.into()),
        ("authorization-mode", "Node,RBAC".into()),
        ("allow-privileged", "true".into()),
        ("profiling", "false".into()),
    ]);
    if c.advertise.is_none() {
        // Endpoints may not hold loopback addresses, and ours is 127.0.0.1.
        list.push("--endpoint-reconciler-type=none".into());
    }
    if let Some((crt, key)) = &c.kubelet_client {
        list.extend(flags(&[
            ("kubelet-client-certificate", crt.display().to_string()),
            ("kubelet-client-key", key.display().to_string()),
        ]));
    }
    if let Some(fp) = &c.front_proxy {
        list.extend(flags(&[
            ("requestheader-client-ca-file", fp.ca.display().to_string()),
            ("requestheader-allowed-names", "front-proxy-client".into()),
            ("requestheader-username-headers", "X-Remote-User".into()),
            ("requestheader-group-headers", "X-Remote-Group".into()),
            (
                "requestheader-extra-headers-prefix",
                "X-Remote-Extra-".into(),
            ),
            (
                "proxy-client-cert-file",
                fp.client_crt.display().to_string(),
            ),
            ("proxy-client-key-file", fp.client_key.display().to_string()),
        ]));
    }
    list
}

/// `--key=value` flags.
pub(crate) fn flags(list: &[(&str, String)]) -> Vec<String> {
    list.iter().map(|(k, v)| format!("--{k}={v}")).collect()
}
