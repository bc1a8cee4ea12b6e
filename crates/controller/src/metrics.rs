//! The operator's Prometheus metrics: reconciles, tenants by phase, the syncers' lag and errors,
//! certificate expiry, and whether this replica leads.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The `Content-Type` of what [`Metrics::encode`] returns.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    /// `success` or `error`.
    result: &'static str,
    /// The error's category (empty on success).
    category: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SyncLabels {
    namespace: String,
    tenant: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabels {
    stage: &'static str,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SyncErrorLabels {
    namespace: String,
    tenant: String,
    kind: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertificateLabels {
    namespace: String,
    tenant: String,
    certificate: &'static str,
}

/// Counts tenants by phase when scraped (from the controller's cache).
type PhaseSource = Box<dyn Fn() -> BTreeMap<String, i64> + Send + Sync>;

/// Every metric the operator exports; cheap to share.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ReconcileLabels, Counter>,
    reconcile_duration: Family<ResultLabel, Histogram>,
    tenants: Family<PhaseLabel, Gauge>,
    phase_source: Mutex<Option<PhaseSource>>,
    sync_lag: Family<SyncLabels, Histogram>,
    sync_errors: Family<SyncErrorLabels, Counter>,
    sync_stage: Family<StageLabels, Histogram>,
    certificate_expiry: Family<CertificateLabels, Gauge>,
    leader: Gauge,
}

/// The kinds a syncer converges, as the `kind` label has them.
pub const SYNC_KINDS: [&str; 12] = [
    "Pod",
    "Service",
    "Endpoints",
    "ConfigMap",
    "Secret",
    "PersistentVolumeClaim",
    "ServiceAccount",
    "Ingress",
    "Node",
    "Event",
    "StorageClass",
    "IngressClass",
];

/// The certificates whose expiry is exported, as the `certificate` label has them.
pub const CERTIFICATES: [&str; 4] = ["admin", "server-ca", "client-ca", "request-header-ca"];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric registered, at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tenantplane");
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        registry.register(
            "reconciles",
            "TenantCluster reconciles by result, and the error's category when it failed",
            reconciles.clone(),
        );
        let reconcile_duration =
            Family::<ResultLabel, Histogram>::new_with_constructor(duration_histogram as fn() -> _);
        registry.register(
            "reconcile_duration_seconds",
            "How long a TenantCluster reconcile took",
            reconcile_duration.clone(),
        );
        let tenants = Family::<PhaseLabel, Gauge>::default();
        registry.register(
            "tenants",
            "TenantClusters by phase (Pending until first reconciled)",
            tenants.clone(),
        );
        let sync_lag =
            Family::<SyncLabels, Histogram>::new_with_constructor(duration_histogram as fn() -> _);
        registry.register(
            "sync_lag_seconds",
            "Time from a change seen by a tenant's syncer to that object converged, by tenant and kind",
            sync_lag.clone(),
        );
        let sync_errors = Family::<SyncErrorLabels, Counter>::default();
        registry.register(
            "sync_errors",
            "Objects a tenant's syncer failed to converge (each is retried), by tenant, kind and reason",
            sync_errors.clone(),
        );
        let sync_stage =
            Family::<StageLabels, Histogram>::new_with_constructor(stage_histogram as fn() -> _);
        registry.register(
            "sync_stage_seconds",
            "Where the syncers' time goes, every tenant together: queue (a key waiting for a worker), converge (a worker on one key), host_read, host_write, host_watch (a host write's answer to its watch event) and tenant_write, by kind",
            sync_stage.clone(),
        );
        let certificate_expiry = Family::<CertificateLabels, Gauge>::default();
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "When a tenant's certificate expires (Unix time): the admin client certificate the operator renews, and the CAs it never replaces",
            certificate_expiry.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease (or runs without leader election)",
            leader.clone(),
        );
        Self {
            registry,
            reconciles,
            reconcile_duration,
            tenants,
            phase_source: Mutex::new(None),
            sync_lag,
            sync_errors,
            sync_stage,
            certificate_expiry,
            leader,
        }
    }

    /// Count one reconcile; `error` is the failure's category.
    pub fn reconciled(&self, error: Option<&'static str>, took: Duration) {
        let result = if error.is_some() { "error" } else { "success" };
        self.reconciles
            .get_or_create(&ReconcileLabels {
                result,
                category: error.unwrap_or(""),
            })
            .inc();
        self.reconcile_duration
            .get_or_create(&ResultLabel { result })
            .observe(took.as_secs_f64());
    }

    /// Where the tenants-by-phase gauge is counted from at each scrape.
    pub fn count_phases_with(
        &self,
        source: impl Fn() -> BTreeMap<String, i64> + Send + Sync + 'static,
    ) {
        *self.phase_source.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(source));
    }

    /// One object converged by a tenant's syncer, `lag` after it was queued.
    pub fn synced(&self, namespace: &str, tenant: &str, kind: &'static str, lag: Duration) {
        self.sync_lag
            .get_or_create(&SyncLabels {
                namespace: namespace.into(),
                tenant: tenant.into(),
                kind,
            })
            .observe(lag.as_secs_f64());
    }

    /// One object a tenant's syncer failed to converge.
    pub fn sync_failed(
        &self,
        namespace: &str,
        tenant: &str,
        kind: &'static str,
        reason: &'static str,
    ) {
        self.sync_errors
            .get_or_create(&SyncErrorLabels {
                namespace: namespace.into(),
                tenant: tenant.into(),
                kind,
                reason,
            })
            .inc();
    }

    /// `kind` spent `took` in one stage of a syncer's path (see `tenantplane_syncer::stages`).
    pub fn sync_stage(&self, stage: &'static str, kind: &'static str, took: Duration) {
        self.sync_stage
            .get_or_create(&StageLabels { stage, kind })
            .observe(took.as_secs_f64());
    }

    /// When one of a tenant's certificates expires.
    pub fn certificate_expires(
        &self,
        namespace: &str,
        tenant: &str,
        certificate: &'static str,
        at: i64,
    ) {
        self.certificate_expiry
            .get_or_create(&CertificateLabels {
                namespace: namespace.into(),
                tenant: tenant.into(),
                certificate,
            })
            .set(at);
    }

    /// Drop a deleted tenant's series.
    pub fn forget_tenant(&self, namespace: &str, tenant: &str) {
        for kind in SYNC_KINDS {
            self.sync_lag.remove(&SyncLabels {
                namespace: namespace.into(),
                tenant: tenant.into(),
                kind,
            });
        }
        for certificate in CERTIFICATES {
            self.certificate_expiry.remove(&CertificateLabels {
                namespace: namespace.into(),
                tenant: tenant.into(),
                certificate,
            });
        }
        // Error counters stay: a counter that vanishes reads as a reset, and their count is small.
    }

    /// Record whether this replica leads.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        if let Some(source) = &*self.phase_source.lock().unwrap_or_else(|e| e.into_inner()) {
            let counts = source();
            self.tenants.clear();
            for (phase, n) in counts {
                self.tenants.get_or_create(&PhaseLabel { phase }).set(n);
            }
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

/// 5 ms to about 80 s.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

/// From 0.5 ms: a host write on loopback takes a few milliseconds, and the stages are what
/// tells where a sub-second lag goes.
fn stage_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 18))
}

/// Shared by the controller, the syncers and the HTTP endpoint.
pub type SharedMetrics = Arc<Metrics>;

impl tenantplane_syncer::Observer for Metrics {
    fn synced(&self, namespace: &str, tenant: &str, kind: &'static str, lag: Duration) {
        Metrics::synced(self, namespace, tenant, kind, lag);
    }

    fn sync_failed(&self, namespace: &str, tenant: &str, kind: &'static str, reason: &'static str) {
        Metrics::sync_failed(self, namespace, tenant, kind, reason);
    }

    fn stage(&self, stage: &'static str, kind: &'static str, took: Duration) {
        Metrics::sync_stage(self, stage, kind, took);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_every_family_with_its_labels() {
        let m = Metrics::new();
        m.reconciled(None, Duration::from_millis(20));
        m.reconciled(Some("KubernetesApiError"), Duration::from_millis(3));
        m.count_phases_with(|| {
            BTreeMap::from([("Ready".to_string(), 2), ("Degraded".to_string(), 1)])
        });
        m.synced("team-a", "dev", "Pod", Duration::from_millis(40));
        m.sync_failed("team-a", "dev", "Pod", "HostRejected");
        m.certificate_expires("team-a", "dev", "admin", 1_900_000_000);
        m.set_leader(true);
        let text = m.encode();
        for line in [
            "tenantplane_reconciles_total{result=\"success\",category=\"\"} 1",
            "tenantplane_reconciles_total{result=\"error\",category=\"KubernetesApiError\"} 1",
            "tenantplane_reconcile_duration_seconds_count{result=\"success\"} 1",
            "tenantplane_tenants{phase=\"Ready\"} 2",
            "tenantplane_tenants{phase=\"Degraded\"} 1",
            "tenantplane_sync_lag_seconds_bucket{namespace=\"team-a\",tenant=\"dev\",kind=\"Pod\",le=\"0.04\"} 1",
            "tenantplane_sync_errors_total{namespace=\"team-a\",tenant=\"dev\",kind=\"Pod\",reason=\"HostRejected\"} 1",
            "tenantplane_certificate_expiry_timestamp_seconds{namespace=\"team-a\",tenant=\"dev\",certificate=\"admin\"} 1900000000",
            "tenantplane_leader 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
        m.forget_tenant("team-a", "dev");
        let text = m.encode();
        assert!(
            !text.contains("tenantplane_sync_lag_seconds_bucket{namespace=\"team-a\""),
            "{text}"
        );
        assert!(!text.contains("certificate=\"admin\""), "{text}");
    }

    #[test]
    fn a_phase_that_empties_leaves_the_gauge() {
        let m = Metrics::new();
        let counts = Arc::new(Mutex::new(BTreeMap::from([("Ready".to_string(), 1)])));
        let source = counts.clone();
        m.count_phases_with(move || source.lock().unwrap().clone());
        assert!(
            m.encode()
                .contains("tenantplane_tenants{phase=\"Ready\"} 1")
        );
        *counts.lock().unwrap() = BTreeMap::from([("Degraded".to_string(), 1)]);
        let text = m.encode();
        assert!(!text.contains("phase=\"Ready\""), "{text}");
        assert!(text.contains("tenantplane_tenants{phase=\"Degraded\"} 1"));
    }
}
