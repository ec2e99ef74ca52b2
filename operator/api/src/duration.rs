//! Human durations as they appear in manifests: `"500ms"`, `"15s"`, `"5m"`, `"1h30m"`.
//!
//! Invariants:
//! - a `Duration` always round-trips through its string form;
//! - the schema accepts exactly what `FromStr` accepts: the pattern checks the form, a CEL
//!   rule the range (at most [`MAX_SECS`]), so the API server refuses what the operator
//!   could not parse. Fields where zero makes no sense use [`positive_schema`], which also
//!   refuses `0s`;
//! - every constructor is total: [`Duration::from_secs_f64`] saturates instead of panicking.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The regular expression the CRD schema uses for every duration field.
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$";

/// The longest duration the operator accepts, in seconds (about 31 years). `FromStr` refuses
/// longer ones; the CRD schema refuses them too, so no stored object carries one.
pub const MAX_SECS: u64 = 1_000_000_000;

/// Longest string the schema accepts: far more than any sensible duration needs, and a bound
/// the API server needs to estimate the cost of the CEL rules.
pub const MAX_LEN: u64 = 64;

/// A non-negative duration written with units (`ms`, `s`, `m`, `h`), e.g. `"1m30s"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(std::time::Duration);

/// Why a duration string was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {input:?}: {why} (expected e.g. \"500ms\", \"15s\", \"5m\", \"1h30m\")")]
pub struct ParseDurationError {
    input: String,
    why: &'static str,
}

impl Duration {
    pub const ZERO: Duration = Duration(std::time::Duration::ZERO);

    pub const fn from_secs(s: u64) -> Self {
        Duration(std::time::Duration::from_secs(s))
    }

    pub const fn from_millis(ms: u64) -> Self {
        Duration(std::time::Duration::from_millis(ms))
    }

    /// Seconds as a float, total: negative values and NaN give zero, values at or above
    /// `u64::MAX` seconds (+inf included) give the largest `std::time::Duration`. Metric values
    /// reach this unchecked, and a panic there would stop the whole operator.
    pub fn from_secs_f64(s: f64) -> Self {
        if s.is_nan() || s <= 0.0 {
            return Duration::ZERO;
        }
        Duration(std::time::Duration::try_from_secs_f64(s).unwrap_or(std::time::Duration::MAX))
    }

    /// The longest duration the schema and `FromStr` accept.
    pub const MAX: Duration = Duration::from_secs(MAX_SECS);

    pub fn as_secs_f64(&self) -> f64 {
        self.0.as_secs_f64()
    }

    pub fn as_std(&self) -> std::time::Duration {
        self.0
    }
}

impl From<std::time::Duration> for Duration {
    fn from(d: std::time::Duration) -> Self {
        Duration(d)
    }
}

impl From<Duration> for std::time::Duration {
    fn from(d: Duration) -> Self {
        d.0
    }
}

impl FromStr for Duration {
    type Err = ParseDurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| ParseDurationError {
            input: s.to_string(),
            why,
        };
        if s.is_empty() {
            return Err(err("empty"));
        }
        let mut total = 0f64;
        let mut rest = s;
        while !rest.is_empty() {
            let num_len = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(|| err("missing unit"))?;
            if num_len == 0 {
                return Err(err("expected a number"));
            }
            let (num, tail) = rest.split_at(num_len);
            if num.starts_with('.') || num.ends_with('.') || num.matches('.').count() > 1 {
                return Err(err("malformed number"));
            }
            let value: f64 = num.parse().map_err(|_| err("malformed number"))?;
            let (scale, unit_len) = if tail.starts_with("ms") {
                (0.001, 2)
            } else if tail.starts_with('s') {
                (1.0, 1)
            } else if tail.starts_with('m') {
                (60.0, 1)
            } else if tail.starts_with('h') {
                (3600.0, 1)
            } else {
                return Err(err("unknown unit"));
            };
            total += value * scale;
            rest = &tail[unit_len..];
        }
        if !total.is_finite() || total > MAX_SECS as f64 {
            return Err(err("out of range"));
        }
        Ok(Duration::from_secs_f64(total))
    }
}

impl fmt::Display for Duration {
    /// The shortest exact form: `0s`, `250ms`, `1.5s`, `2m`, `1h5m`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms == 0 {
            return f.write_str("0s");
        }
        if ms < 1000 {
            return write!(f, "{ms}ms");
        }
        if !ms.is_multiple_of(1000) {
            if ms < 60_000 {
                // Sub-second precision is worth showing only under a minute.
                let s = self.0.as_secs_f64();
                let text = format!("{s:.3}");
                let text = text.trim_end_matches('0').trim_end_matches('.');
                return write!(f, "{text}s");
            }
            // Above a minute, milliseconds are noise: round to the second.
            return Duration::from_secs(((ms + 500) / 1000) as u64).fmt(f);
        }
        let secs = (ms / 1000) as u64;
        let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
        if h > 0 {
            write!(f, "{h}h")?;
        }
        if m > 0 {
            write!(f, "{m}m")?;
        }
        if s > 0 {
            write!(f, "{s}s")?;
        }
        Ok(())
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = Cow::<'de, str>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schema(false)
    }
}

/// Schema of a duration that must be longer than zero (`#[schemars(schema_with = ...)]`), for
/// fields where `0s` would make the operator spin, refuse everything or flap.
pub fn positive_schema(_: &mut SchemaGenerator) -> Schema {
    schema(true)
}

fn schema(positive: bool) -> Schema {
    let max = Duration::MAX.to_string();
    let mut rules = vec![serde_json::json!({
        "rule": format!("duration(self) <= duration('{max}')"),
        "message": format!("must be at most {max}"),
    })];
    if positive {
        rules.push(serde_json::json!({
            "rule": "duration(self) > duration('0s')",
            "message": "must be longer than 0s",
        }));
    }
    json_schema!({
        "type": "string",
        "pattern": DURATION_PATTERN,
        "maxLength": MAX_LEN,
        "x-kubernetes-validations": rules,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        for (input, secs, printed) in [
            ("0s", 0.0, "0s"),
            ("500ms", 0.5, "500ms"),
            ("1.5s", 1.5, "1.5s"),
            ("15s", 15.0, "15s"),
            ("5m", 300.0, "5m"),
            ("1h30m", 5400.0, "1h30m"),
            ("90s", 90.0, "1m30s"),
            ("2h0m5s", 7205.0, "2h5s"),
        ] {
            let d: Duration = input.parse().unwrap();
            assert!((d.as_secs_f64() - secs).abs() < 1e-9, "{input}");
            assert_eq!(d.to_string(), printed);
            let again: Duration = printed.parse().unwrap();
            assert_eq!(again, d);
        }
    }

    #[test]
    fn refuses_garbage() {
        for bad in ["", "5", "s", "1x", "-1s", "1.s", ".5s", "1..2s", "5 m"] {
            assert!(bad.parse::<Duration>().is_err(), "{bad}");
        }
    }

    #[test]
    fn refuses_more_than_max() {
        let max: Duration = Duration::MAX.to_string().parse().unwrap();
        assert_eq!(max, Duration::MAX);
        for bad in ["1000000001s", "277778h", "99999999999999999999999h"] {
            let e = bad.parse::<Duration>().unwrap_err();
            assert!(e.to_string().contains("out of range"), "{bad}: {e}");
        }
    }

    #[test]
    fn from_secs_f64_is_total() {
        assert_eq!(Duration::from_secs_f64(f64::NAN), Duration::ZERO);
        assert_eq!(Duration::from_secs_f64(-1.0), Duration::ZERO);
        assert_eq!(Duration::from_secs_f64(f64::NEG_INFINITY), Duration::ZERO);
        let max = Duration::from(std::time::Duration::MAX);
        assert_eq!(Duration::from_secs_f64(f64::INFINITY), max);
        assert_eq!(Duration::from_secs_f64(1e300), max);
        assert_eq!(Duration::from_secs_f64(1.5).as_secs_f64(), 1.5);
    }

    #[test]
    fn schema_bounds_the_range() {
        let text =
            serde_json::to_string(&positive_schema(&mut SchemaGenerator::default())).unwrap();
        assert!(
            text.contains("duration(self) <= duration('277777h46m40s')"),
            "{text}"
        );
        assert!(text.contains("duration(self) > duration('0s')"), "{text}");
        let plain = serde_json::to_string(&schema(false)).unwrap();
        assert!(!plain.contains("> duration('0s')"), "{plain}");
    }

    #[test]
    fn serde_round_trip() {
        let d: Duration = serde_json::from_str("\"250ms\"").unwrap();
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"250ms\"");
        let e = serde_json::from_str::<Duration>("\"soon\"").unwrap_err();
        assert!(e.to_string().contains("invalid duration"));
    }
}
