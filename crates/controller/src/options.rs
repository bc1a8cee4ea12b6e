//! How the operator runs: what the binary's flags set, read by the controller and the elector.

use std::time::Duration;

use crate::build::BuildOptions;
use crate::connector::Connector;
use crate::telemetry::Telemetry;

/// How the operator runs.
#[derive(Clone, Debug, Default)]
pub struct ControllerOptions {
    /// How desired objects are built: images, the kubelet endpoint, certificates.
    pub build: BuildOptions,
    /// How the operator reaches the tenants' API servers.
    pub connector: Connector,
    /// Watch TenantClusters in this namespace only; all namespaces when `None`.
    pub namespace: Option<String>,
    /// How often a Ready tenant is checked for reachability.
    pub health_interval: Option<Duration>,
    /// How long the admin certificate lives and when it is renewed.
    pub certificates: CertificateOptions,
    /// Metrics and readiness.
    pub telemetry: Telemetry,
    /// Where sleeping tenants' wake doors listen: without it, a request to a sleeping
    /// tenant's API Service finds nothing (`connect` and `wake` still wake it).
    pub wake: Option<WakeOptions>,
    /// Where snapshot stores' credentials are.
    pub snapshots: crate::snapshot::SnapshotOptions,
    /// How tenants' syncers retry an object that failed.
    pub sync_retries: tenantplane_syncer::Retries,
}

/// The lifetime of the leaf certificates the operator issues, and how long before they expire
/// they are renewed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CertificateOptions {
    /// How long a leaf certificate is valid.
    pub validity: Duration,
    /// How long before it expires a leaf certificate is renewed.
    pub renew_before: Duration,
}

impl Default for CertificateOptions {
    fn default() -> Self {
        Self {
            validity: tenantplane_pki::LEAF_VALIDITY,
            renew_before: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// Certificate flags that do not fit together, and which to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertificateFlagsError {
    /// The renewal margin is not shorter than the validity.
    #[error(
        "--renew-certificates-before ({renew_before}s) must be shorter than --certificate-validity ({validity}s)"
    )]
    RenewAfterExpiry {
        /// `--renew-certificates-before`, in seconds.
        renew_before: u64,
        /// `--certificate-validity`, in seconds.
        validity: u64,
    },
    /// `--certificate-validity` is under 10 seconds: the value, in seconds.
    #[error("--certificate-validity ({0}s) must be at least 10s")]
    TooShort(u64),
}

impl CertificateOptions {
    /// A certificate renewed before it is even issued would be renewed at every reconcile.
    pub fn validate(&self) -> Result<(), CertificateFlagsError> {
        if self.renew_before >= self.validity {
            return Err(CertificateFlagsError::RenewAfterExpiry {
                renew_before: self.renew_before.as_secs(),
                validity: self.validity.as_secs(),
            });
        }
        if self.validity < Duration::from_secs(10) {
            return Err(CertificateFlagsError::TooShort(self.validity.as_secs()));
        }
        Ok(())
    }
}

/// Where the wake doors of sleeping tenants listen and what address their Services are given
/// (the operator's `wake` module opens them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WakeOptions {
    /// The address the doors listen on (all of the operator's, usually).
    pub listen: std::net::IpAddr,
    /// The operator's address that the EndpointSlices name: its pod IP in a cluster.
    pub advertise: std::net::IpAddr,
    /// The ports the doors take, one per sleeping tenant.
    pub ports: std::ops::RangeInclusive<u16>,
}
