//! The TenantCluster controller: dereference → validate → build → apply → observe → status.
//!
//! `build` holds the pure functions that decide what should exist; `reconcile` is the I/O around
//! them; `status` turns what was observed into a phase and conditions.

pub mod apply;
pub mod build;
pub mod cache;
pub mod connector;
mod control_plane;
mod credentials;
pub mod kubelet;
pub mod leader;
pub mod metrics;
pub mod names;
pub mod namespace;
pub mod observe;
pub mod reconcile;
pub mod service_range;
pub mod status;
pub mod telemetry;
pub mod tenant_pki;

pub use build::BuildOptions;
pub use connector::Connector;
pub use reconcile::{CertificateOptions, ControllerOptions, run};
pub use telemetry::Telemetry;
/// The syncer, its own crate; re-exported for the binary and the tests.
pub use tenantplane_syncer as sync;

/// Everything that can go wrong in a reconcile. Each variant carries what a person needs to act.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {}", api_message(.0))]
    Kube(#[from] kube::Error),
    /// Writing one of the tenant's objects failed: which, and what the API server said.
    #[error("{object}: {}", api_message(.error))]
    Write { object: String, error: kube::Error },
    #[error("{0}")]
    Build(String),
    #[error("finalizer: {0}")]
    Finalizer(String),
    #[error("the tenant PKI: {0}")]
    Pki(#[from] tenant_pki::PkiError),
    #[error("applying an object: {0}")]
    Apply(tenantplane_syncer::converge::Error),
}

impl Error {
    /// A short CamelCase category for Events and logs.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => "KubernetesApiError",
            Error::Write { .. } => "WriteError",
            Error::Build(_) => "BuildError",
            Error::Finalizer(_) => "FinalizerError",
            Error::Pki(_) => "PkiError",
            Error::Apply(_) => "ApplyError",
        }
    }
}

/// What the API server said, without the debug dump: `message (Reason, code)`.
pub fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(e) => format!("{} ({}, {})", e.message, e.reason, e.code),
        other => other.to_string(),
    }
}
