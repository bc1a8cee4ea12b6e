//! What both benchmarks measure with: this process's memory and CPU time, and percentiles.

#![allow(dead_code)]

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

/// User plus system CPU time of this process so far (all threads; not its child processes).
pub fn cpu_time() -> Duration {
    let seconds = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // After the command name in parentheses: state is field 3, utime 14, stime 15.
            let rest = &s[s.rfind(')')? + 1..];
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: u64 = fields.get(11)?.parse().ok()?;
            let stime: u64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) as f64 / USER_HZ)
        })
        .unwrap_or(0.0);
    Duration::from_secs_f64(seconds)
}

/// The `p` quantile (0 to 1) of sorted durations.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}
