//! Kubernetes quantities (`500m`, `2Gi`, `1e3`, `1.5Ti`) read exactly, for caps: a claim of
//! `100Gi` and one byte more must never compare equal to a cap of `100Gi`, as a float would let
//! it on large values. The one quantity reader of the controller and the syncer.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A non-negative quantity, in billionths (the API server's finest scale; less is rounded up, as
/// the API server rounds). Values past about 3.4e29 are [`Quantity::MORE_THAN_COUNTED`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity(u128);

/// Significant digits a u128 always holds.
const DIGITS: usize = 38;

impl Quantity {
    /// Larger than anything counted: above every cap that can be read.
    pub const MORE_THAN_COUNTED: Quantity = Quantity(u128::MAX);

    /// Read `text` as the API server would; `None` for what is not a quantity, for negative
    /// ones, and for the rare value that cannot be held exactly.
    pub fn parse(text: &str) -> Option<Quantity> {
        let text = text.trim();
        let text = text.strip_prefix('+').unwrap_or(text);
        let number_len = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, suffix) = text.split_at(number_len);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return None;
        }
        let (binary_shift, mut exponent) = suffix_scale(suffix)?;
        // The value is digits × 10^exponent × 2^binary_shift, counted in billionths.
        let mut digits: String = format!("{whole}{fraction}");
        exponent = exponent
            .checked_sub(i32::try_from(fraction.len()).ok()?)?
            .checked_add(9)?;
        let trimmed_end = digits.trim_end_matches('0').len();
        exponent = exponent.checked_add(i32::try_from(digits.len() - trimmed_end).ok()?)?;
        digits.truncate(trimmed_end);
        let digits = digits.trim_start_matches('0');
        if digits.is_empty() {
            return Some(Quantity(0));
        }
        if digits.len() > DIGITS {
            // A number this long is beyond what caps are about; never guess at its value.
            return None;
        }
        let mantissa: u128 = digits.parse().ok()?;
        let scaled = match mantissa.checked_mul(1u128 << binary_shift) {
            Some(m) => m,
            None if exponent >= 0 => return Some(Self::MORE_THAN_COUNTED),
            None => return None,
        };
        if exponent >= 0 {
            let factor = 10u128.checked_pow(u32::try_from(exponent).ok()?);
            return Some(
                factor
                    .and_then(|f| scaled.checked_mul(f))
                    .map_or(Self::MORE_THAN_COUNTED, Quantity),
            );
        }
        // Less than a billionth is rounded up, as the API server does.
        let divisor = u32::try_from(-i64::from(exponent))
            .ok()
            .and_then(|e| 10u128.checked_pow(e));
        Some(Quantity(match divisor {
            Some(d) => scaled.div_ceil(d),
            None => 1,
        }))
    }

    /// The value in billionths, as counted ([`Quantity::MORE_THAN_COUNTED`] is `u128::MAX`).
    pub fn billionths(self) -> u128 {
        self.0
    }

    /// Is this more than `cap`?
    pub fn exceeds(self, cap: Quantity) -> bool {
        self.cmp(&cap) == Ordering::Greater
    }
}

/// Do two texts name the same quantity (`500m` and `0.5`, `1Gi` and `1024Mi`)? Texts that are not
/// quantities are never equal by value.
pub fn same_quantity(a: &str, b: &str) -> bool {
    matches!((Quantity::parse(a), Quantity::parse(b)), (Some(x), Some(y)) if x == y)
}

/// A quantity of a spec, read once when the object is read: its text goes out unchanged (into a
/// limit or a quota), its exact value decides comparisons. A text that is not a quantity (which
/// admission refuses, but an object stored before a rule may hold) has no value, and reading the
/// object still succeeds, so the tenant gets a condition rather than a stuck watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedQuantity {
    text: String,
    value: Option<Quantity>,
}

impl ParsedQuantity {
    /// Read `text` once; a text that is not a quantity keeps no value.
    pub fn new(text: impl Into<String>) -> Self {
        let text = text.into();
        let value = Quantity::parse(&text);
        Self { text, value }
    }

    /// The text as the spec wrote it.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The exact value; `None` when the text is not a quantity.
    pub fn value(&self) -> Option<Quantity> {
        self.value
    }
}

impl From<&str> for ParsedQuantity {
    fn from(text: &str) -> Self {
        Self::new(text)
    }
}

impl From<String> for ParsedQuantity {
    fn from(text: String) -> Self {
        Self::new(text)
    }
}

impl fmt::Display for ParsedQuantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for ParsedQuantity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for ParsedQuantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self::new)
    }
}

/// On the wire a quantity is a string; the field's own rules say which strings are admitted.
impl schemars::JsonSchema for ParsedQuantity {
    fn schema_name() -> Cow<'static, str> {
        "ParsedQuantity".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string"})
    }
}

/// The binary shift and decimal exponent of a suffix: `Ki` is 2^10, `k` 10^3, `e3` 10^3.
fn suffix_scale(suffix: &str) -> Option<(u32, i32)> {
    let binary = |power: u32| Some((10 * power, 0));
    let decimal = |exponent: i32| Some((0, exponent));
    match suffix {
        "" => decimal(0),
        "Ki" => binary(1),
        "Mi" => binary(2),
        "Gi" => binary(3),
        "Ti" => binary(4),
        "Pi" => binary(5),
        "Ei" => binary(6),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        _ => {
            // `1e3`, `1E-2`: an exponent (a lone `E` is exa, above).
            let exponent = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))?;
            let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
                return None;
            }
            decimal(exponent.parse().ok()?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap_or_else(|| panic!("{s} does not parse"))
    }

    #[test]
    fn suffixes_scale_exactly() {
        assert_eq!(q("1"), Quantity(1_000_000_000));
        assert_eq!(q("500m"), Quantity(500_000_000));
        assert_eq!(q("0.5"), q("500m"));
        assert_eq!(q("1Ki"), q("1024"));
        assert_eq!(q("1Mi"), q("1024Ki"));
        assert_eq!(q("1Gi"), q("1073741824"));
        assert_eq!(q("100Gi"), q("107374182400"));
        assert_eq!(q("1Pi"), q("1125899906842624"));
        assert_eq!(q("1Ei"), q("1152921504606846976"));
        assert_eq!(q("1k"), q("1000"));
        assert_eq!(q("1M"), q("1e6"));
        assert_eq!(q("1G"), q("1E9"));
        assert_eq!(q("2T"), q("2e12"));
        assert_eq!(q("1P"), q("1e15"));
        assert_eq!(q("1E"), q("1e18"), "a lone E is exa");
        assert_eq!(q("1n"), Quantity(1));
        assert_eq!(q("3u"), Quantity(3000));
        assert_eq!(q("1.5Gi"), q("1536Mi"));
        assert_eq!(q("+2Gi"), q("2Gi"));
        assert_eq!(q("1e-3"), q("1m"));
        assert_eq!(q("1E+3"), q("1k"));
        assert_eq!(q(".5"), q("500m"));
        assert_eq!(q("5."), q("5"));
        assert_eq!(q("0"), Quantity(0));
        assert_eq!(q("0.000Gi"), Quantity(0));
        assert_eq!(q("  2Gi "), q("2Gi"));
    }

    #[test]
    fn one_byte_over_a_cap_is_over_it() {
        let cap = q("100Gi");
        assert!(q("107374182401").exceeds(cap));
        assert!(!q("107374182400").exceeds(cap));
        assert!(!q("100Gi").exceeds(cap));
        assert!(q("1Pi").exceeds(cap));
        // f64 cannot tell these apart: 2^53 + 1 bytes above a cap of 2^53.
        assert!(q("9007199254740993").exceeds(q("9007199254740992")));
        assert!(q("8Ei").exceeds(q("9223372036854775807")));
        assert!(!q("99.99999999Gi").exceeds(cap));
        assert!(q("100.000000001Gi").exceeds(cap));
    }

    #[test]
    fn less_than_a_billionth_rounds_up() {
        assert_eq!(q("0.1n"), Quantity(1));
        assert_eq!(q("1e-12"), Quantity(1));
        assert_eq!(q("1.0000000001"), Quantity(1_000_000_001));
        assert_eq!(q("1e-100"), Quantity(1));
    }

    #[test]
    fn equal_values_are_the_same_quantity_whatever_the_text() {
        assert!(same_quantity("500m", "0.5"));
        assert!(same_quantity("1Gi", "1024Mi"));
        assert!(same_quantity("1k", "1e3"));
        assert!(!same_quantity("2", "1"));
        assert!(!same_quantity("9007199254740993", "9007199254740992"));
        assert!(
            !same_quantity("dev", "dev"),
            "text that is no quantity has no value"
        );
    }

    #[test]
    fn a_spec_quantity_keeps_its_text_and_is_read_once() {
        let cap: ParsedQuantity = serde_json::from_str("\"2Gi\"").unwrap();
        assert_eq!(cap.as_str(), "2Gi");
        assert_eq!(cap.value(), Some(q("2048Mi")));
        assert_eq!(serde_json::to_string(&cap).unwrap(), "\"2Gi\"");
        let odd: ParsedQuantity = serde_json::from_str("\"lots\"").unwrap();
        assert_eq!((odd.as_str(), odd.value()), ("lots", None));
        assert!(serde_json::from_str::<ParsedQuantity>("2").is_err());
    }

    #[test]
    fn huge_values_are_above_every_cap_and_nonsense_is_not_a_quantity() {
        assert_eq!(q("1e40"), Quantity::MORE_THAN_COUNTED);
        assert_eq!(q("999999999999Ei"), Quantity::MORE_THAN_COUNTED);
        assert!(q("1e40").exceeds(q("1Ei")));
        for bad in [
            "", "Gi", "-1Gi", "1GiB", "1.2.3", "1e", "1e+", "1ee3", "abc", "1 Gi", "1x", ".",
            "1e3.5",
        ] {
            assert_eq!(Quantity::parse(bad), None, "{bad:?}");
        }
        let long = format!("1{}", "1".repeat(40));
        assert_eq!(Quantity::parse(&long), None, "too long to hold exactly");
        let zeros = format!("1{}", "0".repeat(40));
        assert_eq!(
            q(&zeros),
            Quantity::MORE_THAN_COUNTED,
            "trailing zeros are exact"
        );
    }
}
