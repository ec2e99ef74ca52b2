//! A Kubernetes resource quantity (`64Gi`, `7500m`, `8`) kept as its text.
//!
//! The API server validates the format (int-or-string with the quantity pattern); this type
//! only parses it to bytes or cores where tidegate needs a number (KV offload budgets).

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// Pattern accepted for quantities (a subset of Kubernetes' own: decimal SI and binary suffixes).
pub const QUANTITY_PATTERN: &str = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?$";

/// A resource quantity such as `64Gi`.
/// Serialized as a string; numbers (`cpu: 8`) are accepted on input, as Kubernetes does.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Quantity(pub String);

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Float(f64),
            Text(String),
        }
        Ok(Quantity(match Raw::deserialize(d)? {
            Raw::Int(i) => i.to_string(),
            Raw::Float(f) => f.to_string(),
            Raw::Text(s) => s,
        }))
    }
}

impl Quantity {
    /// The value as a plain number (bytes for memory, cores for CPU); None if malformed.
    pub fn to_f64(&self) -> Option<f64> {
        let s = self.0.trim();
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (num, suffix) = s.split_at(split);
        let value: f64 = num.parse().ok()?;
        let scale = match suffix {
            "" => 1.0,
            "m" => 1e-3,
            "k" => 1e3,
            "M" => 1e6,
            "G" => 1e9,
            "T" => 1e12,
            "P" => 1e15,
            "Ki" => 1024.0,
            "Mi" => 1024.0 * 1024.0,
            "Gi" => 1024.0 * 1024.0 * 1024.0,
            "Ti" => 1024.0_f64.powi(4),
            "Pi" => 1024.0_f64.powi(5),
            _ => return None,
        };
        Some(value * scale)
    }
}

impl Quantity {
    /// The value as whole bytes (rounded down); None if malformed, negative or not finite.
    /// `0.5Ki` is 512; `100m` (a CPU-style milli value) is 0 bytes.
    pub fn to_bytes(&self) -> Option<u64> {
        self.to_f64()
            .filter(|b| b.is_finite() && *b >= 0.0 && *b < u64::MAX as f64)
            .map(|b| b.floor() as u64)
    }
}

/// Why a text is not a quantity.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "{0:?} is not a quantity: expected a number with an optional suffix (k, M, G, T, Ki, Mi, Gi, Ti), e.g. 32Gi"
)]
pub struct BadQuantity(pub String);

impl std::str::FromStr for Quantity {
    type Err = BadQuantity;

    /// Parses a byte quantity as the engine's flags take it (the pool spec's own text).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let q = Quantity(s.trim().to_string());
        match q.to_bytes() {
            Some(_) => Ok(q),
            None => Err(BadQuantity(s.to_string())),
        }
    }
}

impl JsonSchema for Quantity {
    fn schema_name() -> Cow<'static, str> {
        "Quantity".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "x-kubernetes-int-or-string": true,
            "anyOf": [{ "type": "integer" }, { "type": "string" }],
            "pattern": QUANTITY_PATTERN,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_from_str() {
        assert_eq!(
            "32Gi".parse::<Quantity>().map(|q| q.to_bytes()),
            Ok(Some(32 << 30))
        );
        assert_eq!(Quantity("0".into()).to_bytes(), Some(0));
        assert_eq!(Quantity("0.5Ki".into()).to_bytes(), Some(512));
        assert!("32GB".parse::<Quantity>().is_err());
        assert!("-1".parse::<Quantity>().is_err());
        assert!("".parse::<Quantity>().is_err());
    }

    #[test]
    fn parses_suffixes() {
        assert_eq!(
            Quantity("64Gi".into()).to_f64(),
            Some(64.0 * 1024.0 * 1024.0 * 1024.0)
        );
        assert_eq!(Quantity("7500m".into()).to_f64(), Some(7.5));
        assert_eq!(Quantity("8".into()).to_f64(), Some(8.0));
        assert_eq!(Quantity("1.5G".into()).to_f64(), Some(1.5e9));
        assert_eq!(Quantity("1Zi".into()).to_f64(), None);
    }
}
