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

/// kubectl's `duration.HumanDuration`, from whole seconds.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_string();
    }
    if seconds < 0 {
        return "0s".to_string();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{days}d")
        } else {
            format!("{days}d{h}h")
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        let d = days % 365;
        return if d == 0 {
            format!("{years}y")
        } else {
            format!("{years}y{d}d")
        };
    }
    format!("{years}y")
}

/// A duration as kubectl's `--timeout` takes it: `90s`, `5m`, `1h30m`, `1.5m`; a bare `0` is
/// zero.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "invalid duration {text:?}: use a number with a unit (ms, s, m, h, d), such as 90s, 5m, 1h30m or 30d"
        )
    };
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(bad());
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if number_len == 0 {
            return Err(bad());
        }
        let number: f64 = rest[..number_len].parse().map_err(|_| bad())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            _ => return Err(bad()),
        };
        total += number * scale;
        rest = &rest[unit_len..];
    }
    Ok(Duration::from_secs_f64(total))
}

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
    fn ages_read_like_kubectl() {
        let cases = [
            (0, "0s"),
            (59, "59s"),
            (119, "119s"),
            (120, "2m"),
            (312, "5m12s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 25 * 60, "3h25m"),
            (30 * 3600, "30h"),
            (52 * 3600, "2d4h"),
            (10 * 86400, "10d"),
            (3 * 365 * 86400 + 86400, "3y1d"),
            (9 * 365 * 86400, "9y"),
        ];
        for (seconds, want) in cases {
            assert_eq!(human_duration(seconds), want, "{seconds}s");
        }
    }

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
