//! What reaching a tenant through the local runtime fails with: the test world's errors, and the
//! operator's kubelet endpoint's and connector's, which the test world does not know.

/// What the local runtime's callers fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The test world failed: a component, a process, a file, a client or the API server.
    #[error(transparent)]
    Testenv(#[from] tenantplane_testenv::Error),
    /// Reading an object failed: which, and what the API server said.
    #[error("reading {what}: {}", tenantplane_client::api_message(.error))]
    Read {
        /// The object, as `Secret ns/name`.
        what: String,
        /// What the API server said.
        error: kube::Error,
    },
    /// A tenant's kubeconfig Secret has no kubeconfig under its key.
    #[error("Secret {secret} has no `{key}`")]
    NoKubeconfig {
        /// The Secret, as `ns/name`.
        secret: String,
        /// The key it lacks.
        key: &'static str,
    },
    /// The operator's kubelet endpoint could not start.
    #[error(transparent)]
    Kubelet(#[from] tenantplane_controller::kubelet::KubeletError),
    /// A tenant API server could not be dialled.
    #[error(transparent)]
    Connect(#[from] tenantplane_controller::connector::ConnectError),
}

/// Results of the local runtime's callers, failing with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
