//! What each test binary took in the last run, kept in `$TENANTPLANE_CACHE/test-times.tsv` (one
//! line per binary: seconds, the share of the machine's CPUs its processes used, the most inotify
//! instances they held at once, and its label), so the next run starts the longest first and
//! knows which fit beside each other.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

/// One binary's figures: how long it ran and how much of the machine it used meanwhile.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Figures {
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Its processes' CPU time over (seconds × CPUs): 1.0 is the whole machine.
    pub cpu: f64,
    /// The most inotify instances its processes held at once.
    pub inotify: u32,
}

/// The inotify instances a binary is taken to need when a file has none for it (written before
/// they were counted): what a real node with its tenants holds, so an unknown binary never
/// crowds out the others' nodes.
pub const UNKNOWN_INOTIFY: u32 = 48;

/// The figures of the last run by label; empty when there is no file yet or it cannot be read.
pub fn read(path: &Path) -> HashMap<String, Figures> {
    std::fs::read_to_string(path)
        .map(|text| parse(&text))
        .unwrap_or_default()
}

/// The lines of a times file; a line that does not read is skipped (the file is only a hint).
pub fn parse(text: &str) -> HashMap<String, Figures> {
    text.lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.splitn(4, '\t').collect();
            let seconds = cols.first()?.trim().parse().ok()?;
            let cpu: f64 = cols.get(1)?.trim().trim_end_matches('%').parse().ok()?;
            // Three columns: a file from before inotify instances were counted.
            let (inotify, label) = match cols[..] {
                [_, _, inotify, label] => (inotify.trim().parse().ok()?, label),
                [_, _, label] => (UNKNOWN_INOTIFY, label),
                _ => return None,
            };
            Some((
                label.trim().to_string(),
                Figures {
                    seconds,
                    cpu: cpu / 100.0,
                    inotify,
                },
            ))
        })
        .collect()
}

/// The lines of a times file for `rows`, slowest first.
pub fn render(rows: &[(String, Figures)]) -> String {
    let mut sorted: Vec<&(String, Figures)> = rows.iter().collect();
    sorted.sort_by(|a, b| b.1.seconds.total_cmp(&a.1.seconds));
    let mut out = String::new();
    for (label, f) in sorted {
        let _ = writeln!(
            out,
            "{:.1}\t{:.0}%\t{}\t{label}",
            f.seconds,
            f.cpu * 100.0,
            f.inotify
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rendered_file_reads_back_and_bad_lines_are_skipped() {
        let rows = vec![
            (
                "lifecycle (tests/lifecycle.rs)".to_string(),
                Figures {
                    seconds: 66.2,
                    cpu: 0.42,
                    inotify: 3,
                },
            ),
            (
                "sync (tests/sync/main.rs)".to_string(),
                Figures {
                    seconds: 459.4,
                    cpu: 0.36,
                    inotify: 51,
                },
            ),
        ];
        let text = render(&rows);
        assert!(text.starts_with("459.4\t36%\t51\tsync (tests/sync/main.rs)\n"));
        let read = parse(&format!(
            "{text}not a line\n12\tx%\tbroken\n1\t2%\tmany\tbad count\n"
        ));
        assert_eq!(read.len(), 2);
        assert_eq!(read["lifecycle (tests/lifecycle.rs)"].seconds, 66.2);
        assert_eq!(read["lifecycle (tests/lifecycle.rs)"].inotify, 3);
        assert!((read["sync (tests/sync/main.rs)"].cpu - 0.36).abs() < 1e-9);
        // A line of the older three columns is read with the count a real node needs.
        let old = parse("24.1\t17%\tfoundation (tests/foundation.rs)\n");
        assert_eq!(
            old["foundation (tests/foundation.rs)"],
            Figures {
                seconds: 24.1,
                cpu: 0.17,
                inotify: UNKNOWN_INOTIFY
            }
        );
    }
}
