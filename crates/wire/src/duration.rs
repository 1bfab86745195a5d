//! Durations as the contract writes them: `250ms`, `30s`, `5m`, `1h`, `2d`, or a sum such as `1h30m`.

use std::{fmt, str::FromStr, time::Duration};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration that serialises as the human form the REST API accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Dur(pub Duration);

/// Why a duration string was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {input:?}: {reason} (examples: 250ms, 30s, 5m, 1h, 1h30m)")]
pub struct DurationError {
    pub input: String,
    pub reason: &'static str,
}

impl Dur {
    pub fn as_millis(&self) -> i64 {
        i64::try_from(self.0.as_millis()).unwrap_or(i64::MAX)
    }
}

impl FromStr for Dur {
    type Err = DurationError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason| DurationError {
            input: input.to_string(),
            reason,
        };
        let s = input.trim();
        if s.is_empty() {
            return Err(err("empty"));
        }
        let mut total: u128 = 0;
        let mut rest = s;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            if digits == 0 {
                return Err(err("expected a number"));
            }
            let n: u128 = rest[..digits]
                .parse()
                .map_err(|_| err("number too large"))?;
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let unit_ms: u128 = match &rest[..unit_len] {
                "ms" => 1,
                "s" => 1_000,
                "m" => 60_000,
                "h" => 3_600_000,
                "d" => 86_400_000,
                "" => return Err(err("missing unit")),
                _ => return Err(err("unknown unit")),
            };
            rest = &rest[unit_len..];
            total = n
                .checked_mul(unit_ms)
                .and_then(|v| total.checked_add(v))
                .filter(|v| *v <= i64::MAX as u128)
                .ok_or_else(|| err("too large"))?;
        }
        Ok(Dur(Duration::from_millis(total as u64)))
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ms = self.0.as_millis();
        if ms == 0 {
            return f.write_str("0s");
        }
        for (unit, len) in [
            ("d", 86_400_000u128),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1_000),
        ] {
            if ms >= len {
                write!(f, "{}{unit}", ms / len)?;
                ms %= len;
            }
        }
        if ms > 0 {
            write!(f, "{ms}ms")?;
        }
        Ok(())
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl utoipa::PartialSchema for Dur {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .pattern(Some("^([0-9]+(ms|s|m|h|d))+$"))
            .examples([serde_json::json!("30s")])
            .into()
    }
}

impl utoipa::ToSchema for Dur {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_contract_forms() {
        for (s, ms) in [
            ("250ms", 250),
            ("30s", 30_000),
            ("5m", 300_000),
            ("1h", 3_600_000),
            ("1h30m", 5_400_000),
            ("2d", 172_800_000),
        ] {
            let d: Dur = s.parse().unwrap();
            assert_eq!(d.as_millis(), ms, "{s}");
            assert_eq!(d.to_string(), s);
        }
    }

    #[test]
    fn refuses_garbage_with_a_reason() {
        for s in ["", "10", "ms", "5x", "1.5s", "-3s", "99999999999999999999d"] {
            let e = s.parse::<Dur>().unwrap_err();
            assert_eq!(e.input, s);
        }
    }
}
