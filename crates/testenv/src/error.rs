//! The test harness's one error type.

/// What the test harness fails with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The test control plane's binaries are missing: which, or why.
    #[error("the test control plane is not built ({0}); run `make testenv`")]
    NotBuilt(String),
    /// A component of the test control plane, or one the local runtime (`tenantplane-local`) runs,
    /// failed.
    #[error("{name} failed: {detail}\n{log}")]
    Component {
        /// The component.
        name: String,
        /// What went wrong.
        detail: String,
        /// The end of its log.
        log: String,
    },
    /// kubectl exited with an error: its output.
    #[error("kubectl failed: {0}")]
    Kubectl(String),
    /// A client could not be built.
    #[error("cannot build a client: {0}")]
    Client(String),
    /// A file, a process or a socket failed, or an answer made no sense.
    #[error("{0}")]
    Io(String),
    /// Certificates or keys could not be made or read.
    #[error(transparent)]
    Pki(#[from] tenantplane_pki::Error),
    /// Said as the API server said it, not as kube's debug dump.
    #[error("{}", tenantplane_client::api_message(.0))]
    Kube(#[from] kube::Error),
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e.to_string())
    }
}

/// The test harness's results, failing with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
