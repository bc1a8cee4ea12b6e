//! The test harness's one error type.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the test control plane is not built ({0}); run `make testenv`")]
    NotBuilt(String),
    #[error("{name} failed: {detail}\n{log}")]
    Component {
        name: String,
        detail: String,
        log: String,
    },
    #[error("kubectl failed: {0}")]
    Kubectl(String),
    #[error("cannot build a client: {0}")]
    Client(String),
    #[error("{0}")]
    Io(String),
    #[error(transparent)]
    Pki(#[from] tenantplane_pki::Error),
    /// Said as the API server said it, not as kube's debug dump.
    #[error("{}", tenantplane_controller::api_message(.0))]
    Kube(#[from] kube::Error),
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e.to_string())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
