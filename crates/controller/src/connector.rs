//! How the operator reaches a tenant API server: through the in-cluster Service address in a
//! real cluster, or through the address the local runtime announces (tests, `tenantplane dev`).
//! Nothing else in the operator knows the difference.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::names;

/// Why the operator cannot reach a tenant (yet): no address to dial, or a kubeconfig or address
/// it cannot make a client of.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The control-plane pod does not say where it is yet: its IP, or the local runtime's
    /// announcement.
    #[error("pod {pod} has no {what} yet")]
    NoAddress {
        /// The pod's name.
        pod: String,
        /// What it lacks: an IP, or the local runtime's announcement.
        what: String,
    },
    /// A pod the local runtime stands in for that announces no snapshot agent.
    #[error(
        "pod {pod} has no {annotation} annotation: the local runtime runs no snapshot agent for it"
    )]
    NoAgent {
        /// The pod's name.
        pod: String,
        /// The annotation that would give the agent's address.
        annotation: &'static str,
    },
    /// The tenant's kubeconfig is not YAML of a kubeconfig.
    #[error("the kubeconfig does not parse: {0}")]
    KubeconfigText(#[source] kube::config::KubeconfigError),
    /// The tenant's kubeconfig parses but does not make a client configuration.
    #[error("the kubeconfig is not usable: {0}")]
    KubeconfigUnusable(#[source] kube::config::KubeconfigError),
    /// The server the kubeconfig or the pod names is not a URL.
    #[error("{server} is not a URL: {source}")]
    NotUrl {
        /// The server as written.
        server: String,
        /// What the URI parser said.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// A client could not be built from a sound configuration.
    #[error("cannot build a client: {0}")]
    Client(#[source] kube::Error),
}

impl ConnectError {
    /// A stable name for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            ConnectError::NoAddress { .. } | ConnectError::NoAgent { .. } => "NoAddress",
            ConnectError::KubeconfigText(_) | ConnectError::KubeconfigUnusable(_) => {
                "KubeconfigInvalid"
            }
            ConnectError::NotUrl { .. } | ConnectError::Client(_) => "ClientInvalid",
        }
    }
}

/// Does the local runtime stand in for this pod (its label), rather than a kubelet running it?
fn stood_in_for(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(names::LABEL_RUNTIME))
        .is_some_and(|v| v == names::RUNTIME_LOCAL)
}

/// A pod a real node runs (a `kubernetes` tenant's, in the dev cluster and the tests, whose
/// operator shares the node's network): its own address.
fn pod_address(tenant: &str, pod: &Pod) -> Result<String, ConnectError> {
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .filter(|ip| !ip.is_empty())
        .ok_or_else(|| ConnectError::NoAddress {
            pod: names::control_plane_pod(tenant),
            what: "IP".into(),
        })?;
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    Ok(format!("https://{host}:{}", names::API_PORT))
}

/// How the operator reaches a tenant's API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Connector {
    /// `https://<name>.<namespace>.svc:6443`, as written in the kubeconfig Secret.
    #[default]
    InCluster,
    /// The address in the control-plane pod's `tenantplane.io/local-endpoint` annotation, for a pod
    /// the local runtime stands in for; a pod a real node runs, its own address.
    Local,
}

impl Connector {
    /// Is this the local runtime's connector?
    pub fn is_local(&self) -> bool {
        matches!(self, Connector::Local)
    }

    /// The address to dial, or why there is none yet.
    pub fn server(&self, tenant: &str, namespace: &str, pod: &Pod) -> Result<String, ConnectError> {
        match self {
            Connector::InCluster => Ok(names::endpoint(tenant, namespace)),
            Connector::Local if !stood_in_for(pod) => pod_address(tenant, pod),
            Connector::Local => pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(names::ANNOTATION_LOCAL_ENDPOINT))
                .cloned()
                .ok_or_else(|| ConnectError::NoAddress {
                    pod: names::control_plane_pod(tenant),
                    what: format!("{} annotation", names::ANNOTATION_LOCAL_ENDPOINT),
                }),
        }
    }

    /// Where the control-plane pod's snapshot agent listens (`host:port`), or why there is no
    /// address yet: its pod address, or the local runtime's announcement.
    pub fn agent_address(&self, tenant: &str, pod: &Pod) -> Result<String, ConnectError> {
        if self.is_local() && stood_in_for(pod) {
            return pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(names::ANNOTATION_LOCAL_AGENT))
                .cloned()
                .ok_or_else(|| ConnectError::NoAgent {
                    pod: names::control_plane_pod(tenant),
                    annotation: names::ANNOTATION_LOCAL_AGENT,
                });
        }
        let server = pod_address(tenant, pod)?;
        let host = server
            .trim_start_matches("https://")
            .rsplit_once(':')
            .map_or(server.as_str(), |(h, _)| h);
        Ok(format!("{host}:{}", names::AGENT_PORT))
    }

    /// A client for the tenant from its kubeconfig, dialling `server`. The serving certificate
    /// carries the in-cluster names, so TLS checks the Service's name whatever address we dial.
    /// A request that hears nothing for 15 s fails: for reconciles, not for watches.
    pub async fn client(
        &self,
        kubeconfig: &str,
        tenant: &str,
        namespace: &str,
        server: &str,
    ) -> Result<kube::Client, ConnectError> {
        self.client_with(
            kubeconfig,
            tenant,
            namespace,
            server,
            Some(Duration::from_secs(15)),
        )
        .await
    }

    /// Like [`client`](Self::client), for watches: a request that hears nothing for 60 s fails.
    /// Watches on it must be ended by the API server sooner (the syncer's run 50 s).
    pub async fn watch_client(
        &self,
        kubeconfig: &str,
        tenant: &str,
        namespace: &str,
        server: &str,
    ) -> Result<kube::Client, ConnectError> {
        self.client_with(
            kubeconfig,
            tenant,
            namespace,
            server,
            Some(Duration::from_secs(60)),
        )
        .await
    }

    async fn client_with(
        &self,
        kubeconfig: &str,
        tenant: &str,
        namespace: &str,
        server: &str,
        read_timeout: Option<Duration>,
    ) -> Result<kube::Client, ConnectError> {
        let kc = Kubeconfig::from_yaml(kubeconfig).map_err(ConnectError::KubeconfigText)?;
        let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(ConnectError::KubeconfigUnusable)?;
        config.cluster_url = server.parse().map_err(|source| ConnectError::NotUrl {
            server: server.to_string(),
            source,
        })?;
        config.tls_server_name = Some(format!("{}.{namespace}.svc", names::service(tenant)));
        config.connect_timeout = Some(Duration::from_secs(5));
        config.read_timeout = read_timeout;
        kube::Client::try_from(config).map_err(ConnectError::Client)
    }
}
