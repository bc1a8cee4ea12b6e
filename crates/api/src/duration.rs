//! Durations as people write them (`90s`, `5m`, `1h30m`): the CLI's `--timeout` and the
//! operator's flags, and `spec.sleep.afterIdle` once admission (which holds it to Go's format)
//! let it in. Written here rather than taken from a crate: `humantime` also takes forms such as
//! `1hour` that the API server's CEL `duration()` refuses, and this is a dozen lines.

use std::time::Duration;

/// Text that is not a duration, and how to write one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {0:?}: use a number with a unit (ms, s, m, h, d), such as 90s, 5m, 1h30m or 30d"
)]
pub struct InvalidDuration(pub String);

/// A duration as kubectl's `--timeout` takes it: `90s`, `5m`, `1h30m`, `1.5m`; a bare `0` is
/// zero.
pub fn parse(text: &str) -> Result<Duration, InvalidDuration> {
    let bad = || InvalidDuration(text.to_string());
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
