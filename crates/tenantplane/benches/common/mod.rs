//! What both benchmarks measure with: this process's memory and CPU time, and percentiles.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

/// Linux reports CPU times in /proc in USER_HZ, which is 100 on every architecture we run on.
const USER_HZ: f64 = 100.0;

/// A `/proc/self/status` field in KiB (`VmRSS:`, `VmHWM:`); 0 when unreadable.
pub fn memory_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// A `/proc/<pid>/stat` line's command name and its user plus system CPU seconds.
fn stat_cpu(stat: &str) -> Option<(&str, f64)> {
    // The command name is in parentheses (and may hold spaces); after it, state is field 3,
    // utime 14, stime 15.
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((&stat[open + 1..close], (utime + stime) as f64 / USER_HZ))
}

/// User plus system CPU time of this process so far (all threads; not its child processes).
pub fn cpu_time() -> Duration {
    let seconds = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| stat_cpu(&s).map(|(_, seconds)| seconds))
        .unwrap_or(0.0);
    Duration::from_secs_f64(seconds)
}

/// The `p` quantile (0 to 1) of sorted durations.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

/// CPU time (user plus system, seconds) of every process on the machine at one moment, and the
/// machine's busy and total time over all its cores (`/proc/stat`).
pub struct CpuSnapshot {
    by_pid: HashMap<u32, (String, f64)>,
    busy: f64,
    total: f64,
}

/// What the machine's processes spent between two snapshots.
pub struct CpuUse {
    /// Seconds by process name, largest first.
    pub by_name: Vec<(String, f64)>,
    /// Busy seconds of the whole machine, over all cores.
    pub busy: f64,
    /// Busy plus idle seconds over all cores (wall time × cores).
    pub total: f64,
}

impl CpuSnapshot {
    /// Every process now, named by its command (`comm`); those in `tenant` are prefixed
    /// `tenant `, this process is `this process`.
    pub fn take(tenant: &HashSet<u32>) -> Self {
        let me = std::process::id();
        let mut by_pid = HashMap::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let Some((comm, seconds)) = stat_cpu(&stat) else {
                continue;
            };
            let name = if pid == me {
                "this process".to_string()
            } else if tenant.contains(&pid) {
                format!("tenant {comm}")
            } else {
                comm.to_string()
            };
            by_pid.insert(pid, (name, seconds));
        }
        let (busy, total) = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                let line = s.lines().next()?;
                let v: Vec<f64> = line
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|f| f.parse().ok())
                    .collect();
                // user nice system idle iowait irq softirq steal
                let idle = v.get(3)? + v.get(4).unwrap_or(&0.0);
                let all: f64 = v.iter().take(8).sum();
                Some(((all - idle) / USER_HZ, all / USER_HZ))
            })
            .unwrap_or_default();
        Self {
            by_pid,
            busy,
            total,
        }
    }

    /// What was spent since `before`: a process that started since counts from 0; one that
    /// ended since is not counted.
    pub fn since(&self, before: &CpuSnapshot) -> CpuUse {
        let mut by_name: BTreeMap<String, f64> = BTreeMap::new();
        for (pid, (name, now)) in &self.by_pid {
            let then = before.by_pid.get(pid).map_or(0.0, |(_, s)| *s);
            *by_name.entry(name.clone()).or_default() += (now - then).max(0.0);
        }
        let mut by_name: Vec<(String, f64)> =
            by_name.into_iter().filter(|(_, s)| *s > 0.0).collect();
        by_name.sort_by(|a, b| b.1.total_cmp(&a.1));
        CpuUse {
            by_name,
            busy: self.busy - before.busy,
            total: self.total - before.total,
        }
    }
}

impl CpuUse {
    /// The processes that spent at least 1% of the machine's busy time, in seconds.
    fn processes(&self) -> String {
        let shown: Vec<String> = self
            .by_name
            .iter()
            .filter(|(_, s)| *s >= self.busy / 100.0)
            .map(|(name, s)| format!("{name} {s:.1}"))
            .collect();
        shown.join(", ")
    }

    /// One line for a run of `pods` pods: the machine's use, per pod, and by process.
    pub fn line(&self, what: &str, pods: usize) -> String {
        format!(
            "CPU during the {what}: the machine {:.0}% busy ({:.1} of {:.1} core-seconds; {:.1} ms per pod); by process (s): {}",
            self.busy_percent(),
            self.busy,
            self.total,
            1000.0 * self.busy / pods.max(1) as f64,
            self.processes()
        )
    }

    /// What one of `tenants` tenant control planes spent over `seconds`, in millicores.
    pub fn tenant_millicores(&self, seconds: f64, tenants: usize) -> f64 {
        let tenant: f64 = self
            .by_name
            .iter()
            .filter(|(name, _)| name.starts_with("tenant "))
            .map(|(_, s)| s)
            .sum();
        (1000.0 * tenant / seconds.max(f64::EPSILON) / tenants.max(1) as f64).max(0.0)
    }

    /// The machine's busy share, in percent.
    pub fn busy_percent(&self) -> f64 {
        100.0 * self.busy / self.total.max(f64::EPSILON)
    }

    /// One line for `seconds` of idleness with `tenants` control planes: the machine's use, what
    /// one idle tenant control plane costs (millicores), and by process.
    pub fn idle_line(&self, seconds: f64, tenants: usize) -> String {
        format!(
            "CPU while idle ({seconds:.0}s, {tenants} tenants, no pods): the machine {:.0}% busy ({:.1} of {:.1} core-seconds); a tenant control plane {:.0} millicores on average; by process (s): {}",
            self.busy_percent(),
            self.busy,
            self.total,
            self.tenant_millicores(seconds, tenants),
            self.processes()
        )
    }
}
