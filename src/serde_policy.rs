//! Policies in configuration files (feature `serde`): the forms a [`Policy`] is read
//! from, the one form it is written in, and the `"100/s burst 200"` string syntax.
//!
//! # Reading
//!
//! A policy is read from any of these (shown in TOML):
//!
//! ```toml
//! a = { capacity = 200, refill_per_second = 100 }      # tokens per second, any positive number
//! b = { capacity = 100, tokens = 100, per = "1m" }     # whole tokens per period, exact
//! c = "100/s burst 200"                                # the string form
//! d = "60/m"                                           # burst defaults to the tokens per period
//! e = "20r/m"                                          # `r` (requests) is allowed, as in nginx
//! f = { capacity = 60, refill_per_second = 10, start = "empty", max_reservation = "2s" }
//! ```
//!
//! The string form is `RATE [burst B] [start full|empty]`, where `RATE` is
//! `N[r]/[K]UNIT`: `N` tokens every `K` (default 1) `UNIT`s. Per second (`100/s`,
//! `0.5/s`) `N` may be any positive number and the policy is
//! [`Policy::builder`]`(B, N)`; per any other period (`60/m`, `100/30s`, `1000/h`) `N` is
//! a whole number and the policy is [`Policy::per`]`(B, N, period)`, exact in integers.
//! Without `burst`, `B` is `N` rounded up (as governor's quotas do: `60/m` may spend 60
//! at once). Units: `ns`, `us`, `ms`, `s`, `m` (or `min`), `h`, `d`, and the words
//! `second`, `minute`, `hour`, `day`.
//!
//! Every value is checked as the [`PolicyBuilder`](crate::PolicyBuilder) checks it: a
//! rate or capacity the packed word cannot represent is refused with the
//! [`PolicyError`]'s message, which names the nearest representable values. Unknown
//! fields, a field given twice and a rate given both ways are refused. Reading never
//! panics, whatever the input (a property test feeds it random strings). Reading needs a
//! self-describing format (TOML, JSON, YAML): the forms are told apart by their shape.
//!
//! A per-period policy has no `max_reservation` (the engine builds reservations only
//! from tokens per second): asking for one there is refused rather than approximated.
//!
//! # Writing
//!
//! A policy is written as one canonical table: `{ capacity, refill_per_second }` for a
//! policy built from tokens per second, `{ capacity, tokens, per }` for one built from a
//! period, with the smallest of `1s`, `1m`, `1h`, `1d` that makes `tokens` whole (else
//! the exact period in reduced form), then `start = "empty"` and `max_reservation` only
//! when they are not the defaults. Reading what was written gives back the same
//! capacity, start, reservation horizon, exact rate and layout.
//!
//! ```
//! use tokengate::Policy;
//!
//! let p: Policy = "60/m burst 10".parse()?;
//! assert_eq!(p.capacity(), 10);
//! assert_eq!(p.exact_rate_per_nanosecond(), Some((1, 1_000_000_000)));
//!
//! let q: Policy = "20r/m".parse()?;
//! assert_eq!(q.capacity(), 20);
//!
//! let err = "100/s burst 0".parse::<Policy>().unwrap_err();
//! assert_eq!(err.to_string(), "capacity must be at least 1 token, got 0");
//! # Ok::<(), tokengate::serde_policy::PolicyParseError>(())
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::policy::{Policy, PolicyError, Start};

/// Why a policy string could not be read.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum PolicyParseError {
    /// The text does not follow the syntax; the message says what was expected where.
    Syntax(String),
    /// The text is well formed but the policy is invalid (the [`PolicyError`] names the
    /// nearest representable values).
    Policy(PolicyError),
}

impl fmt::Display for PolicyParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyParseError::Syntax(message) => f.write_str(message),
            PolicyParseError::Policy(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for PolicyParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PolicyParseError::Policy(e) => Some(e),
            PolicyParseError::Syntax(_) => None,
        }
    }
}

impl From<PolicyError> for PolicyParseError {
    fn from(e: PolicyError) -> Self {
        PolicyParseError::Policy(e)
    }
}

fn syntax(message: impl Into<String>) -> PolicyParseError {
    PolicyParseError::Syntax(message.into())
}

const NANOS_PER_SECOND: u128 = 1_000_000_000;

/// The units a duration is written in, largest first.
const WRITE_UNITS: &[(&str, u128)] = &[
    ("d", 86_400 * NANOS_PER_SECOND),
    ("h", 3600 * NANOS_PER_SECOND),
    ("m", 60 * NANOS_PER_SECOND),
    ("s", NANOS_PER_SECOND),
    ("ms", 1_000_000),
    ("us", 1_000),
    ("ns", 1),
];

/// A duration in nanoseconds, from `[K]UNIT` (`K` a whole number, 1 when absent), read
/// by humantime: `500ms`, `1m`, `1.5s`, `2h 30m`, or `s` alone (in `100/s`).
fn parse_nanos(text: &str) -> Result<u128, PolicyParseError> {
    let counted;
    let text = if text.starts_with(|c: char| c.is_ascii_digit()) {
        text
    } else {
        counted = format!("1{text}");
        &counted
    };
    humantime::parse_duration(text)
        .map(|d| d.as_nanos())
        .map_err(|e| {
            syntax(format!(
                "duration {text:?}: {e}; expected a whole number and a unit (ns, us, ms, s, \
                 m, h, d), such as \"1m\" or \"500ms\""
            ))
        })
}

/// A duration from `[K]UNIT` in humantime's syntax, such as `1m`, `500ms`, `1.5s`, `2h 30m`, or
/// `s` alone (one second).
///
/// # Errors
///
/// [`PolicyParseError::Syntax`] for anything else, or a duration beyond
/// [`Duration::MAX`].
///
/// ```
/// use std::time::Duration;
/// use tokengate::serde_policy::parse_duration;
/// assert_eq!(parse_duration("1m")?, Duration::from_secs(60));
/// assert_eq!(parse_duration("250ms")?, Duration::from_millis(250));
/// assert_eq!(parse_duration("1.5s")?, Duration::from_millis(1500));
/// assert_eq!(parse_duration("2h 30m")?, Duration::from_secs(9000));
/// assert!(parse_duration("1.5").is_err());
/// # Ok::<(), tokengate::serde_policy::PolicyParseError>(())
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, PolicyParseError> {
    nanos_to_duration(parse_nanos(text.trim())?)
        .ok_or_else(|| syntax(format!("duration {text:?} is too long")))
}

fn nanos_to_duration(nanos: u128) -> Option<Duration> {
    let secs = u64::try_from(nanos / NANOS_PER_SECOND).ok()?;
    // The remainder is below 1e9: it fits.
    Some(Duration::new(secs, (nanos % NANOS_PER_SECOND) as u32))
}

/// `d` in the largest unit that divides it exactly: `1m`, `1500ms`, `0s`.
///
/// ```
/// use std::time::Duration;
/// use tokengate::serde_policy::format_duration;
/// assert_eq!(format_duration(Duration::from_secs(3600)), "1h");
/// assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
/// ```
pub fn format_duration(d: Duration) -> String {
    format_nanos(d.as_nanos())
}

fn format_nanos(nanos: u128) -> String {
    if nanos == 0 {
        return "0s".to_owned();
    }
    let (name, unit) = WRITE_UNITS
        .iter()
        .find(|(_, unit)| nanos.is_multiple_of(*unit))
        .copied()
        .unwrap_or(("ns", 1));
    format!("{}{name}", nanos / unit)
}

/// The rate part of the string form: tokens per second, or whole tokens per period.
enum RateText {
    PerSecond(f64),
    PerPeriod { tokens: u64, nanos: u128 },
}

impl RateText {
    /// The default burst: the tokens of one period, rounded up, at least 1.
    fn default_burst(&self) -> u64 {
        match *self {
            RateText::PerSecond(r) if r.is_finite() && r >= 1.0 => {
                // `as` saturates at u64::MAX; the policy check refuses what does not fit.
                r.ceil() as u64
            }
            RateText::PerSecond(_) => 1,
            RateText::PerPeriod { tokens, .. } => tokens.max(1),
        }
    }
}

fn parse_rate(text: &str) -> Result<RateText, PolicyParseError> {
    let expected = || {
        syntax(format!(
            "rate {text:?}: expected tokens per period, such as \"100/s\", \"60/m\", \
             \"20r/m\" or \"1000/1h\""
        ))
    };
    let (count, period) = text.split_once('/').ok_or_else(expected)?;
    let count = count.strip_suffix('r').unwrap_or(count);
    if count.is_empty() || period.is_empty() {
        return Err(expected());
    }
    let nanos = parse_nanos(period)?;
    if nanos == 0 {
        return Err(PolicyError::ZeroPeriod.into());
    }
    if nanos == NANOS_PER_SECOND {
        let r: f64 = count.parse().map_err(|_| {
            syntax(format!(
                "rate {text:?}: {count:?} is not a number of tokens per second"
            ))
        })?;
        return Ok(RateText::PerSecond(r));
    }
    let tokens: u64 = count.parse().map_err(|_| {
        syntax(format!(
            "rate {text:?}: tokens per period other than a second must be a whole number from \
             1 to 2^64-1, got {count:?} (write a fraction as a longer period: \"1/2m\", not \
             \"0.5/m\")"
        ))
    })?;
    Ok(RateText::PerPeriod { tokens, nanos })
}

fn parse_whole(what: &str, text: Option<&str>) -> Result<u64, PolicyParseError> {
    let text = text.ok_or_else(|| syntax(format!("{what} needs a value")))?;
    text.parse().map_err(|_| {
        syntax(format!(
            "{what} must be a whole number of tokens from 0 to 2^64-1, got {text:?}"
        ))
    })
}

fn parse_start(text: Option<&str>) -> Result<Start, PolicyParseError> {
    match text {
        Some("full") => Ok(Start::Full),
        Some("empty") => Ok(Start::Empty),
        other => Err(syntax(format!(
            "start must be \"full\" or \"empty\", got {:?}",
            other.unwrap_or("nothing")
        ))),
    }
}

/// Builds the policy of a rate, a capacity, a start and a reservation horizon, through
/// the public constructors only.
fn build(
    rate: RateText,
    capacity: u64,
    start: Start,
    max_reservation: Duration,
) -> Result<Policy, PolicyParseError> {
    match rate {
        RateText::PerSecond(r) => Ok(Policy::builder(capacity, r)
            .start(start)
            .max_reservation(max_reservation)
            .build()?),
        RateText::PerPeriod { tokens, nanos } => {
            if !max_reservation.is_zero() {
                return Err(syntax(
                    "max_reservation needs the rate in tokens per second (refill_per_second), \
                     not tokens per period",
                ));
            }
            let period =
                nanos_to_duration(nanos).ok_or_else(|| syntax("the refill period is too long"))?;
            let policy = Policy::per(capacity, tokens, period)?;
            Ok(match start {
                Start::Full => policy,
                Start::Empty => policy.start_empty(),
            })
        }
    }
}

impl FromStr for Policy {
    type Err = PolicyParseError;

    /// Reads the string form `RATE [burst B] [start full|empty]`: see the
    /// [module docs](crate::serde_policy).
    fn from_str(text: &str) -> Result<Policy, PolicyParseError> {
        let mut words = text.split_whitespace();
        let rate =
            parse_rate(words.next().ok_or_else(|| {
                syntax("empty policy: expected a rate such as \"100/s burst 200\"")
            })?)?;
        let mut capacity = None;
        let mut start = None;
        while let Some(word) = words.next() {
            match word {
                "burst" if capacity.is_none() => {
                    capacity = Some(parse_whole("burst", words.next())?)
                }
                "start" if start.is_none() => start = Some(parse_start(words.next())?),
                "burst" | "start" => return Err(syntax(format!("{word} is given twice"))),
                other => {
                    return Err(syntax(format!(
                        "unexpected {other:?} in policy {text:?}: expected \"burst N\" or \
                         \"start full|empty\" after the rate"
                    )));
                }
            }
        }
        let capacity = capacity.unwrap_or_else(|| rate.default_burst());
        build(rate, capacity, start.unwrap_or_default(), Duration::ZERO)
    }
}

/// The reduced fraction `num / den` of tokens per nanosecond as whole tokens per period:
/// the first of 1 s, 1 min, 1 h, 1 day that makes the tokens whole, else the fraction
/// itself.
fn tokens_per_period(num: u128, den: u128) -> (u128, u128) {
    if den == 0 {
        return (num, den);
    }
    for period in [1, 60, 3600, 86_400].map(|s| s * NANOS_PER_SECOND) {
        if let Some(scaled) = num.checked_mul(period) {
            if scaled.is_multiple_of(den) {
                return (scaled / den, period);
            }
        }
    }
    (num, den)
}

impl Serialize for Policy {
    /// The canonical table: see the [module docs](crate::serde_policy#writing).
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let start_empty = self.start() == Start::Empty;
        let reservation = !self.max_reservation().is_zero();
        // A policy built from tokens per second is rebuilt exactly from its rate; one
        // built from a period is not (its rate is not an `f64`), and is written as one.
        let per_second = Policy::builder(self.capacity(), self.refill_per_second())
            .start(self.start())
            .max_reservation(self.max_reservation())
            .build()
            .is_ok_and(|p| p == *self);
        let period = match (per_second, self.exact_rate_per_nanosecond()) {
            (false, Some((num, den))) => {
                let (tokens, nanos) = tokens_per_period(num, den);
                u64::try_from(tokens).ok().map(|t| (t, nanos))
            }
            _ => None,
        };
        let len =
            1 + if period.is_some() { 2 } else { 1 } + start_empty as usize + reservation as usize;
        let mut s = serializer.serialize_struct("Policy", len)?;
        s.serialize_field("capacity", &self.capacity())?;
        match period {
            Some((tokens, nanos)) => {
                s.serialize_field("tokens", &tokens)?;
                s.serialize_field("per", &format_nanos(nanos))?;
            }
            None => s.serialize_field("refill_per_second", &self.refill_per_second())?,
        }
        if start_empty {
            s.serialize_field("start", &Start::Empty)?;
        }
        if reservation {
            s.serialize_field("max_reservation", &format_duration(self.max_reservation()))?;
        }
        s.end()
    }
}

impl<'de> Deserialize<'de> for Policy {
    /// Any of the forms in the [module docs](crate::serde_policy#reading).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Policy, D::Error> {
        deserializer.deserialize_any(PolicyVisitor)
    }
}

impl Serialize for Start {
    /// `"full"` or `"empty"`.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(match self {
            Start::Full => "full",
            Start::Empty => "empty",
        })
    }
}

impl<'de> Deserialize<'de> for Start {
    /// `"full"` or `"empty"`.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Start, D::Error> {
        struct StartVisitor;
        impl Visitor<'_> for StartVisitor {
            type Value = Start;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"full\" or \"empty\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Start, E> {
                parse_start(Some(v)).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(StartVisitor)
    }
}

const FIELDS: &[&str] = &[
    "capacity",
    "refill_per_second",
    "tokens",
    "per",
    "start",
    "max_reservation",
];

#[derive(Clone, Copy)]
enum Field {
    Capacity,
    RefillPerSecond,
    Tokens,
    Per,
    Start,
    MaxReservation,
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Field, D::Error> {
        struct FieldVisitor;
        impl Visitor<'_> for FieldVisitor {
            type Value = Field;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a policy field")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Field, E> {
                Ok(match v {
                    "capacity" => Field::Capacity,
                    "refill_per_second" => Field::RefillPerSecond,
                    "tokens" => Field::Tokens,
                    "per" => Field::Per,
                    "start" => Field::Start,
                    "max_reservation" => Field::MaxReservation,
                    other => return Err(E::unknown_field(other, FIELDS)),
                })
            }
        }
        deserializer.deserialize_identifier(FieldVisitor)
    }
}

/// A number as the format gives it: TOML writes `20` and `20.0` differently.
#[derive(Clone, Copy)]
enum Number {
    Int(i128),
    Float(f64),
}

impl<'de> Deserialize<'de> for Number {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Number, D::Error> {
        struct NumberVisitor;
        impl Visitor<'_> for NumberVisitor {
            type Value = Number;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Number, E> {
                Ok(Number::Int(v.into()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Number, E> {
                Ok(Number::Int(v.into()))
            }
            fn visit_i128<E: de::Error>(self, v: i128) -> Result<Number, E> {
                Ok(Number::Int(v))
            }
            fn visit_u128<E: de::Error>(self, v: u128) -> Result<Number, E> {
                Ok(Number::Int(i128::try_from(v).unwrap_or(i128::MAX)))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Number, E> {
                Ok(Number::Float(v))
            }
        }
        deserializer.deserialize_any(NumberVisitor)
    }
}

impl Number {
    /// A whole number of tokens, `what` naming the field in the error.
    fn whole<E: de::Error>(self, what: &str) -> Result<u64, E> {
        match self {
            Number::Int(n) => u64::try_from(n).map_err(|_| {
                E::custom(format!(
                    "{what} must be a whole number of tokens from 0 to 2^64-1, got {n}"
                ))
            }),
            Number::Float(x) => Err(E::custom(format!(
                "{what} must be a whole number of tokens, got {x}"
            ))),
        }
    }

    fn float(self) -> f64 {
        match self {
            Number::Int(n) => n as f64,
            Number::Float(x) => x,
        }
    }
}

struct PolicyVisitor;

/// Stores a field's value, refusing a second one.
fn once<T, E: de::Error>(slot: &mut Option<T>, value: T, name: &'static str) -> Result<(), E> {
    if slot.is_some() {
        return Err(E::duplicate_field(name));
    }
    *slot = Some(value);
    Ok(())
}

impl<'de> Visitor<'de> for PolicyVisitor {
    type Value = Policy;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a policy: a string such as \"100/s burst 200\", or a table of capacity and \
             refill_per_second, or of capacity, tokens and per",
        )
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Policy, E> {
        v.parse().map_err(E::custom)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Policy, A::Error> {
        let mut capacity = None;
        let mut refill = None;
        let mut tokens = None;
        let mut per = None;
        let mut start = None;
        let mut reservation = None;
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::Capacity => {
                    let n = map.next_value::<Number>()?.whole("capacity")?;
                    once(&mut capacity, n, "capacity")?;
                }
                Field::RefillPerSecond => {
                    let r = map.next_value::<Number>()?.float();
                    once(&mut refill, r, "refill_per_second")?;
                }
                Field::Tokens => {
                    let n = map.next_value::<Number>()?.whole("tokens")?;
                    once(&mut tokens, n, "tokens")?;
                }
                Field::Per => {
                    let text = map.next_value::<String>()?;
                    let nanos = parse_nanos(text.trim()).map_err(de::Error::custom)?;
                    once(&mut per, nanos, "per")?;
                }
                Field::Start => once(&mut start, map.next_value::<Start>()?, "start")?,
                Field::MaxReservation => {
                    let text = map.next_value::<String>()?;
                    let d = parse_duration(&text).map_err(de::Error::custom)?;
                    once(&mut reservation, d, "max_reservation")?;
                }
            }
        }
        let capacity = capacity.ok_or_else(|| de::Error::missing_field("capacity"))?;
        let rate = match (refill, tokens, per) {
            (Some(r), None, None) => RateText::PerSecond(r),
            (None, Some(tokens), Some(nanos)) => {
                if nanos == 0 {
                    return Err(de::Error::custom(PolicyError::ZeroPeriod));
                }
                RateText::PerPeriod { tokens, nanos }
            }
            (None, None, None) => {
                return Err(de::Error::custom(
                    "missing the rate: give refill_per_second, or tokens and per",
                ));
            }
            (None, Some(_), None) => return Err(de::Error::missing_field("per")),
            (None, None, Some(_)) => return Err(de::Error::missing_field("tokens")),
            (Some(_), _, _) => {
                return Err(de::Error::custom(
                    "give the rate once: refill_per_second, or tokens and per, not both",
                ));
            }
        };
        build(
            rate,
            capacity,
            start.unwrap_or_default(),
            reservation.unwrap_or_default(),
        )
        .map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_forms_build_the_policies_they_name() {
        let p: Policy = "100/s burst 200".parse().unwrap();
        assert_eq!(p, Policy::new(200, 100.0).unwrap());
        let p: Policy = "60/m".parse().unwrap();
        assert_eq!(p, Policy::per(60, 60, Duration::from_secs(60)).unwrap());
        let p: Policy = "20r/m".parse().unwrap();
        assert_eq!(p, Policy::per(20, 20, Duration::from_secs(60)).unwrap());
        let p: Policy = "1000/1h burst 50 start empty".parse().unwrap();
        let q = Policy::per(50, 1000, Duration::from_secs(3600)).unwrap();
        assert_eq!(p, q.start_empty());
        let p: Policy = "0.5/s".parse().unwrap();
        assert_eq!(p, Policy::new(1, 0.5).unwrap());
    }

    #[test]
    fn bad_strings_are_refused_with_the_reason() {
        for (text, needle) in [
            ("", "empty policy"),
            ("100", "expected tokens per period"),
            ("100/", "expected tokens per period"),
            ("100/fortnight", "unit"),
            ("0.5/m", "whole number"),
            ("100/s burst", "burst needs a value"),
            ("100/s burst -1", "whole number"),
            ("100/s burst 2 burst 3", "given twice"),
            ("100/s start sideways", "start must be"),
            ("100/s and more", "unexpected"),
            ("-5/s", "above 0"),
            ("nan/s", "finite"),
            ("100/0s", "longer than zero"),
            ("100/s burst 0", "at least 1 token"),
        ] {
            let e = text.parse::<Policy>().unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }

    #[test]
    fn unrepresentable_rates_name_the_nearest_values() {
        let e = "1e30/s burst 10".parse::<Policy>().unwrap_err();
        assert!(matches!(e, PolicyParseError::Policy(_)), "{e:?}");
        assert!(e.to_string().contains("largest"), "{e}");
    }

    #[test]
    fn durations_are_written_in_the_largest_exact_unit() {
        for (nanos, text) in [
            (0, "0s"),
            (1, "1ns"),
            (60 * NANOS_PER_SECOND, "1m"),
            (90 * NANOS_PER_SECOND, "90s"),
            (86_400 * NANOS_PER_SECOND, "1d"),
            (1_500_000, "1500us"),
        ] {
            assert_eq!(format_nanos(nanos), text);
            assert_eq!(parse_nanos(text).unwrap(), nanos);
        }
    }

    #[test]
    fn periods_are_written_in_whole_tokens_of_the_smallest_round_period() {
        assert_eq!(
            tokens_per_period(1, 600_000_000),
            (100, 60 * NANOS_PER_SECOND)
        );
        assert_eq!(tokens_per_period(1, 1_000_000_000), (1, NANOS_PER_SECOND));
        assert_eq!(tokens_per_period(1, 7), (1, 7));
    }
}
