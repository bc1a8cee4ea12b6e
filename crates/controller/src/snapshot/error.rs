//! What a snapshot, a store check or a restore fails with, by where it failed: the store, the
//! encryption, the database copy, or a step of the controllers (reading the tenant, its pod, its
//! PKI). The message is what the resource's status shows; the label names the kind of failure
//! for metrics and logs.

use super::agent_client::AgentError;
use super::copy::DatabaseError;
use super::crypt::CryptError;
use super::store::BucketError;
use crate::api_message;
use crate::connector::ConnectError;

/// Why a snapshot, a store check or a restore failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store: reaching it, or moving objects in and out.
    #[error(transparent)]
    Bucket(#[from] BucketError),
    /// The snapshot's encryption or decryption.
    #[error(transparent)]
    Crypt(#[from] CryptError),
    /// Copying, checking or putting back the database.
    #[error(transparent)]
    Database(#[from] DatabaseError),
    /// Talking to the snapshot agent in the tenant's pod.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// The tenant has no operator kubeconfig yet.
    #[error(transparent)]
    Kubeconfig(#[from] crate::build::kubeconfig::NoOperatorKubeconfig),
    /// The tenant's control plane cannot be reached: no address yet, or no client.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// A store's spec or credentials do not make a client.
    #[error("SnapshotStore {store}: {source}")]
    InStore {
        /// The SnapshotStore's name.
        store: String,
        /// What was wrong.
        #[source]
        source: BucketError,
    },
    /// A store's encryption key is not a key.
    #[error("SnapshotStore {store}'s key in Secret {secret}: {source}")]
    Key {
        /// The SnapshotStore's name.
        store: String,
        /// The Secret that holds the key.
        secret: String,
        /// What is wrong with the key.
        #[source]
        source: CryptError,
    },
    /// A Secret the store names does not exist.
    #[error("Secret {namespace}/{name} does not exist: create it")]
    SecretMissing {
        /// The Secret's namespace.
        namespace: String,
        /// The Secret's name.
        name: String,
    },
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
        /// What the call was for.
        action: String,
        /// What the server said.
        #[source]
        source: kube::Error,
    },
    /// A schedule that does not parse.
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
