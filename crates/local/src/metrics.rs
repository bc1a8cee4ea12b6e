//! Figures read from the operator's `/metrics`, as the benchmarks read them. Beside the local
//! runtime as the one crate of the test world that knows the operator: its tests read back what
//! the operator's own metrics write.

/// One stage of the operator's `tenantplane_sync_stage_seconds` histogram, as a benchmark reads it
/// from the exposition.
#[derive(Clone, Debug, PartialEq)]
pub struct StageSummary {
    /// How many observations the stage has.
    pub count: u64,
    /// Their sum, in seconds.
    pub sum: f64,
    /// (upper bound in seconds, cumulative count), ascending, `+Inf` last.
    pub buckets: Vec<(f64, u64)>,
}

impl StageSummary {
    /// The series of `stage` and `kind` in Prometheus text `text`; `None` when nothing was
    /// observed.
    pub fn parse(text: &str, stage: &str, kind: &str) -> Option<Self> {
        const FAMILY: &str = "tenantplane_sync_stage_seconds";
        let labels = format!("stage=\"{stage}\",kind=\"{kind}\"");
        let mut summary = StageSummary {
            count: 0,
            sum: 0.0,
            buckets: Vec::new(),
        };
        for line in text.lines().filter(|l| l.contains(&labels)) {
            let Some(series) = line.strip_prefix(FAMILY) else {
                continue;
            };
            let (series, value) = series.rsplit_once(' ')?;
            if series.starts_with("_count") {
                summary.count = value.parse().ok()?;
            } else if series.starts_with("_sum") {
                summary.sum = value.parse().ok()?;
            } else if let Some(le) = series
                .split("le=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
            {
                let bound = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                summary.buckets.push((bound, value.parse().ok()?));
            }
        }
        (summary.count > 0).then_some(summary)
    }

    /// The upper bound of the bucket that holds quantile `q` (0..=1): the quantile is at most it.
    pub fn quantile_bound(&self, q: f64) -> f64 {
        let rank = (q * self.count as f64).ceil().max(1.0) as u64;
        self.buckets
            .iter()
            .find(|(_, n)| *n >= rank)
            .map_or(f64::INFINITY, |(b, _)| *b)
    }

    /// The mean, in seconds.
    pub fn mean(&self) -> f64 {
        self.sum / self.count.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tenantplane_controller::metrics::Metrics;

    #[test]
    fn a_stage_reads_back_with_its_count_mean_and_quantile_bounds() {
        let m = Metrics::new();
        assert_eq!(StageSummary::parse(&m.encode(), "host_write", "Pod"), None);
        for ms in [1, 1, 1, 3, 200] {
            m.sync_stage("host_write", "Pod", Duration::from_millis(ms));
        }
        m.sync_stage("queue", "Pod", Duration::from_secs(100));
        let text = m.encode();
        let h = StageSummary::parse(&text, "host_write", "Pod").unwrap();
        assert_eq!(h.count, 5);
        assert!((h.mean() - 0.0412).abs() < 1e-9, "{}", h.mean());
        // 1 ms is in the bucket up to 1 ms (0.5 ms doubled), 200 ms in the one up to 256 ms.
        assert_eq!(h.quantile_bound(0.5), 0.001);
        assert_eq!(h.quantile_bound(0.99), 0.256);
        let queue = StageSummary::parse(&text, "queue", "Pod").unwrap();
        assert_eq!(queue.quantile_bound(0.5), f64::INFINITY);
        assert!(
            text.contains(
                "tenantplane_sync_stage_seconds_count{stage=\"host_write\",kind=\"Pod\"} 5"
            )
        );
    }
}
