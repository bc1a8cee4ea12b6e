//! The TenantCluster controller: dereference → validate → build → apply → observe → status.
//!
//! `build` holds the pure functions that decide what should exist; `phases` are the I/O around
//! them, one module per step of a tenant's lifecycle; `status` turns what was observed into a
//! phase and conditions.
//!
//! The modules form layers, each importing only those below it: `run` (the wiring) on top, then
//! `reconcile` (the pipeline), then `phases`, then `context` (what every reconcile shares), and
//! under it the pure and the plain I/O modules (`build`, `status`, `observe`, `apply`, `cache`…).

pub mod apply;
pub mod build;
pub mod cache;
pub mod connector;
pub mod context;
pub mod kubelet;
pub mod leader;
pub mod metrics;
pub mod names;
pub mod namespace;
pub mod observe;
pub mod options;
mod phases;
pub mod reconcile;
mod run;
pub mod service_range;
pub mod sleep;
pub mod snapshot;
pub mod status;
pub mod telemetry;
pub mod tenant_pki;
pub mod upgrade;
pub mod wake;

pub use build::BuildOptions;
pub use connector::Connector;
pub use options::{CertificateOptions, ControllerOptions};
pub use run::run;
pub use telemetry::Telemetry;
/// Errors as a person reads them, and kubeconfigs, typed: the client crate's, under the paths the
/// workspace has always used.
pub use tenantplane_client::{api_message, error_chain, kubeconfig};
/// The syncer, its own crate; re-exported for the binary and the tests.
pub use tenantplane_syncer as sync;

/// Everything that can go wrong in a reconcile. Each variant carries what a person needs to act.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the host's API server failed.
    #[error("Kubernetes API: {}", api_message(.0))]
    Kube(#[from] kube::Error),
    /// Writing one of the tenant's objects failed: which, and what the API server said.
    #[error("{object}: {}", api_message(.error))]
    Write {
        /// What was being written, such as "applying Secret ns/name".
        object: String,
        /// What the API server said.
        error: kube::Error,
    },
    /// A desired object could not be built, or a step around it failed: what.
    #[error("{0}")]
    Build(String),
    /// The finalizer's cleanup failed.
    #[error("finalizer: {0}")]
    Finalizer(String),
    /// The tenant's PKI Secret cannot be used, or new CAs could not be made.
    #[error("the tenant PKI: {0}")]
    Pki(#[from] tenant_pki::PkiError),
    /// A server-side apply of one of the tenant's objects failed.
    #[error("applying an object: {0}")]
    Apply(tenantplane_syncer::converge::Error),
}

impl Error {
    /// Likely to pass by itself: a write conflict, throttling, an API server that is briefly
    /// unavailable, or a dropped connection. The first such failure in a row is retried before
    /// it is reported, so a blip does not turn a Ready tenant Degraded.
    pub fn is_passing(&self) -> bool {
        match self {
            Error::Kube(e) | Error::Write { error: e, .. } => match e {
                kube::Error::Api(s) => matches!(s.code, 409 | 429 | 500 | 502 | 503 | 504),
                kube::Error::HyperError(_) | kube::Error::Service(_) => true,
                _ => false,
            },
            _ => false,
        }
    }

    /// Does this reconcile failure, after `before` failures in a row, go into status? Each
    /// does, but the first of a passing kind.
    pub fn reaches_status(&self, before: u32) -> bool {
        before > 0 || !self.is_passing()
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("said", "Reason").with_code(code),
        ))
    }

    #[test]
    fn a_blip_is_retried_once_before_status_says_so_and_a_refusal_is_said_at_once() {
        let conflict = Error::Write {
            object: "StatefulSet dev".into(),
            error: api(409),
        };
        assert!(!conflict.reaches_status(0));
        assert!(conflict.reaches_status(1));
        assert!(!Error::Kube(api(503)).reaches_status(0));
        for refusal in [api(422), api(403), api(404)] {
            assert!(Error::Kube(refusal).reaches_status(0));
        }
        assert!(Error::Build("bad".into()).reaches_status(0));
    }

    #[test]
    fn a_kube_error_is_said_once_in_the_chain() {
        let e = Error::Kube(kube::Error::Api(Box::new(
            kube::core::Status::failure(r#"configmaps "coredns" not found"#, "NotFound")
                .with_code(404),
        )));
        assert_eq!(
            error_chain(&e),
            r#"Kubernetes API: configmaps "coredns" not found (NotFound, 404)"#
        );
    }
}
