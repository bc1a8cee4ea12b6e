//! What a snapshot, a store check or a restore fails with, by where it failed: the store, the
//! encryption, the database copy, or a step of the controllers (reading the tenant, its pod, its
//! PKI). The message is what the resource's status shows; the label names the kind of failure
//! for metrics and logs.

use super::agent_client::AgentError;
use super::copy::DatabaseError;
use super::crypt::CryptError;
use super::store::BucketError;
use crate::connector::ConnectError;
use crate::error_text::api_message;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Bucket(#[from] BucketError),
    #[error(transparent)]
    Crypt(#[from] CryptError),
    #[error(transparent)]
    Database(#[from] DatabaseError),
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error(transparent)]
    Kubeconfig(#[from] crate::build::kubeconfig::NoOperatorKubeconfig),
    /// The tenant's control plane cannot be reached: no address yet, or no client.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// A store's spec or credentials do not make a client.
    #[error("SnapshotStore {store}: {source}")]
    InStore {
        store: String,
        #[source]
        source: BucketError,
    },
    /// A store's encryption key is not a key.
    #[error("SnapshotStore {store}'s key in Secret {secret}: {source}")]
    Key {
        store: String,
        secret: String,
        #[source]
        source: CryptError,
    },
    #[error("Secret {namespace}/{name} does not exist: create it")]
    SecretMissing { namespace: String, name: String },
    /// The store's credentials Secret cannot be read: why, and what it should hold.
    #[error(
        "{0} (a store's credentials Secret holds {ACCESS_KEY_ID} and {SECRET_ACCESS_KEY})",
        ACCESS_KEY_ID = super::store::ACCESS_KEY_ID,
        SECRET_ACCESS_KEY = super::store::SECRET_ACCESS_KEY
    )]
    Credentials(Box<Error>),
    /// A call to the host's API server failed: what it was for, and what the server said.
    #[error("{action}: {}", api_message(.source))]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Schedule(#[from] super::schedule::ScheduleError),
    /// A step of the controllers that is not one of the above: what it was and what it met.
    #[error("{0}")]
    Step(String),
}

/// The error of an API call made `action`-ing (for `map_err`).
pub(crate) fn api(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Api { action, source }
}

impl From<String> for Error {
    fn from(s: String) -> Self {
        Error::Step(s)
    }
}

impl Error {
    /// A Secret the operator looks for in its namespace is not there.
    pub fn is_secret_missing(&self) -> bool {
        match self {
            Error::SecretMissing { .. } => true,
            Error::Credentials(inner) => inner.is_secret_missing(),
            _ => false,
        }
    }

    /// A stable name for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Bucket(e) => e.label(),
            Error::Crypt(e) => e.label(),
            Error::Database(e) => e.label(),
            Error::Agent(e) => e.label(),
            Error::Connect(e) => e.label(),
            Error::Kubeconfig(_) => "KubeconfigMissing",
            Error::InStore { source, .. } => source.label(),
            Error::Key { source, .. } => source.label(),
            Error::SecretMissing { .. } => "SecretMissing",
            Error::Credentials(inner) => inner.label(),
            Error::Api { .. } => "KubernetesApiError",
            Error::Schedule(_) => "ScheduleInvalid",
            Error::Step(_) => "SnapshotStepFailed",
        }
    }
}
