//! The lines `make bench-sync` prints of what it read from the operator and the control planes:
//! where a pod's time went in the syncers, and what each tenant control plane holds.

use tenantplane_local::metrics::StageSummary;
use tenantplane_local::runtime::ControlPlaneMemory;
use tenantplane_testenv::process::ProcessMemory;

/// The tenant control planes' memory: per tenant, all its processes (`rss` is the goal's
/// figure), then each process's.
pub(crate) fn memory_lines(when: &str, planes: &[ControlPlaneMemory]) -> Vec<String> {
    let summary = |field: fn(&ProcessMemory) -> u64, all: &[ProcessMemory]| {
        let mut kib: Vec<u64> = all.iter().map(field).collect();
        kib.sort_unstable();
        let p50 = kib
            .get(kib.len().saturating_sub(1) / 2)
            .copied()
            .unwrap_or(0);
        let max = kib.last().copied().unwrap_or(0);
        format!("p50 {} MiB, max {} MiB", p50 / 1024, max / 1024)
    };
    let all = |m: &[ProcessMemory]| {
        format!(
            "RSS {}; own {}; PSS {}",
            summary(|m| m.rss, m),
            summary(|m| m.private, m),
            summary(|m| m.pss, m)
        )
    };
    let totals: Vec<ProcessMemory> = planes.iter().map(ControlPlaneMemory::total).collect();
    let mut lines = vec![
        format!(
            "  tenant control plane memory per tenant: {} ({when}; RSS of its processes, {} tenants)",
            summary(|m| m.rss, &totals),
            planes.len(),
        ),
        format!(
            "    all processes of a tenant: {} (own: pages no other process shares; PSS: shared pages split among their sharers, such as the binaries' text, shared by every tenant and the host's own components)",
            all(&totals)
        ),
    ];
    let mut names: Vec<&str> = planes
        .iter()
        .flat_map(|p| p.processes.iter().map(|(n, _)| n.as_str()))
        .collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let of: Vec<ProcessMemory> = planes
            .iter()
            .flat_map(|p| p.processes.iter().filter(|(n, _)| n == name))
            .map(|(_, m)| *m)
            .collect();
        lines.push(format!("    {name:<30} {}", all(&of)));
    }
    lines
}

/// One line per stage of the pod's path through the syncers: count, mean, p50 and p99 bounds.
pub(crate) fn stage_lines(metrics: &tenantplane_controller::metrics::Metrics) -> Vec<String> {
    let text = metrics.encode();
    tenantplane_syncer::stages::Stage::ALL
        .iter()
        .map(|stage| {
            let name = stage.name();
            match StageSummary::parse(&text, name, "Pod") {
                Some(h) => format!(
                    "stage {name:<12} {:>6} times: mean {:>8.1} ms  p50 <= {:>8.1} ms  p99 <= {:>8.1} ms  total {:>7.2} s",
                    h.count,
                    h.mean() * 1e3,
                    h.quantile_bound(0.5) * 1e3,
                    h.quantile_bound(0.99) * 1e3,
                    h.sum
                ),
                None => format!("stage {name:<12} never"),
            }
        })
        .collect()
}
