//! Output as kubectl shapes it: aligned tables, ages such as `5m12s`, and durations such as `5m`
//! for `--timeout`.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Columns padded to their widest cell plus three spaces (kubectl's tabwriter), the last column
/// unpadded. Empty cells are left to the caller (`<none>`, as kubectl prints them).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(cell);
                let pad = widths[i] - cell.chars().count() + 3;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `<none>` for a missing or empty value, as kubectl prints it.
pub fn or_none(value: Option<&str>) -> String {
    match value {
        Some(v) if !v.is_empty() => v.to_string(),
        _ => "<none>".to_string(),
    }
}

/// The age of something stamped `time`, as kubectl prints it (`45s`, `5m12s`, `3h`, `2d4h`).
pub fn age(time: Option<&Time>) -> String {
    let Some(time) = time else {
        return "<unknown>".to_string();
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    let seconds = now.as_second() - time.0.as_second();
    human_duration(seconds)
}

/// kubectl's `duration.HumanDuration`; one for the operator's messages and the CLI.
pub use tenantplane_controller::names::human_duration;

/// A duration as kubectl's `--timeout` takes it (one parser with `spec.sleep.afterIdle`).
pub use tenantplane_api::duration::parse as parse_duration;

/// A `--timeout` as people write it back: `5m`, `90s`, `1h30m`.
pub fn show_duration(duration: Duration) -> String {
    let secs = duration.as_secs();
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_like_kubectl() {
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "5", "m", "5x", "-1s", "1m30"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be refused");
        }
        assert_eq!(show_duration(Duration::from_secs(300)), "5m");
        assert_eq!(show_duration(Duration::from_secs(5430)), "1h30m30s");
        assert_eq!(show_duration(Duration::ZERO), "0s");
    }

    #[test]
    fn tables_align_like_kubectl() {
        let out = table(
            &["NAME", "PHASE", "AGE"],
            &[
                vec!["dev".into(), "Ready".into(), "5m".into()],
                vec!["staging-eu".into(), "<none>".into(), "12s".into()],
            ],
        );
        assert_eq!(
            out,
            "NAME         PHASE    AGE\ndev          Ready    5m\nstaging-eu   <none>   12s\n"
        );
    }
}
