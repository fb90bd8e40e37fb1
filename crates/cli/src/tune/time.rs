//! Timestamps of log lines: Common Log Format dates, RFC 3339, and Unix epoch numbers,
//! converted to nanoseconds since the Unix epoch (UTC).

use std::borrow::Cow;

use jiff::Timestamp;
use jiff::fmt::strtime;
use jiff::fmt::temporal::Pieces;
use jiff::tz::Offset;

/// A timestamp read from a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp {
    /// Nanoseconds since 1970-01-01T00:00:00Z.
    pub(crate) nanos: u64,
    /// Whether the text had whole seconds only (no fraction): such a request happened
    /// somewhere inside that second, and the replay spreads it (`--spread`).
    pub(crate) whole_second: bool,
}

const NANOS: u64 = 1_000_000_000;

/// The latest second accepted: nanoseconds since the epoch must fit in a `u64` (until
/// 2554-07-21).
const MAX_SECONDS: i64 = (u64::MAX / NANOS - 1) as i64;

/// A fraction written with more than nine digits, cut to its first nine (nanosecond
/// precision; the digits past the ninth are dropped, as [`fraction_nanos`] does). The
/// parsers of `jiff` refuse a longer fraction; the common case borrows the text as is.
fn cut_fraction(text: &str) -> Cow<'_, str> {
    let Some(dot) = text.find('.') else {
        return Cow::Borrowed(text);
    };
    let after = &text[dot + 1..];
    let run = after
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(after.len());
    if run <= 9 {
        return Cow::Borrowed(text);
    }
    Cow::Owned(format!("{}{}", &text[..dot + 10], &after[run..]))
}

/// A numeric zone offset `+hhmm`, `-hh:mm`, or `Z`, read by `jiff`; offsets of a day or
/// more (which `jiff` allows up to 25:59:59) are refused, as are minutes past 59.
fn zone_offset(z: &str) -> Option<Offset> {
    let offset = match z {
        "Z" | "z" => Offset::UTC,
        _ if z.contains(':') => strtime::parse("%:z", z).ok()?.offset()?,
        _ => strtime::parse("%z", z).ok()?.offset()?,
    };
    (offset.seconds().abs() < 86_400).then_some(offset)
}

fn to_stamp(time: Timestamp, whole_second: bool) -> Option<Stamp> {
    let utc_seconds = time.as_second();
    if !(0..=MAX_SECONDS).contains(&utc_seconds) {
        return None;
    }
    let seconds = u64::try_from(utc_seconds).ok()?;
    // A timestamp at or after the epoch has a fraction in 0..1e9.
    let nanos = u64::try_from(time.subsec_nanosecond()).ok()?;
    Some(Stamp {
        nanos: seconds * NANOS + nanos,
        whole_second,
    })
}

/// A fraction of a second written after the decimal point (`"5"` is 0.5 s), to whole
/// nanoseconds (digits past the ninth are dropped).
fn fraction_nanos(f: &str) -> Option<u32> {
    if f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut n: u32 = 0;
    for b in f.bytes().chain(std::iter::repeat(b'0')).take(9) {
        n = n * 10 + u32::from(b - b'0');
    }
    Some(n)
}

/// A Common Log Format date, as between the brackets: `10/Oct/2000:13:55:36 -0700`.
///
/// `jiff`'s `strptime` reads the fields and refuses an impossible date or time (31 Feb,
/// hour 24); a leap second (`:60`) counts as the last instant of its minute (`:59`).
pub(crate) fn parse_clf(text: &str) -> Option<Stamp> {
    let (datetime, zone) = text.split_once(' ')?;
    let datetime = cut_fraction(datetime);
    // Apache's `%{msec_frac}t` style is rare; a fraction on the seconds is accepted.
    let fields = strtime::parse("%d/%b/%Y:%H:%M:%S%.f", datetime.as_ref()).ok()?;
    let local = fields.to_datetime().ok()?;
    let offset = zone_offset(zone.trim())?;
    let utc = offset.to_timestamp(local).ok()?;
    to_stamp(utc, fields.subsec_nanosecond().is_none())
}

/// An RFC 3339 / ISO 8601 timestamp: `2026-11-30T20:30:06Z`,
/// `2026-11-30 20:30:06.250+01:00`, read by `jiff`'s RFC 3339 / Temporal parser, which
/// refuses impossible dates and reads a leap second `:60` as `:59`. The time of day and
/// the offset are required; an offset of a day or more is refused.
pub(crate) fn parse_rfc3339(text: &str) -> Option<Stamp> {
    let text = cut_fraction(text.trim());
    let pieces = Pieces::parse(text.as_ref()).ok()?;
    let offset = pieces.offset()?.to_numeric_offset();
    if offset.seconds().abs() >= 86_400 {
        return None;
    }
    let utc = offset
        .to_timestamp(pieces.date().to_datetime(pieces.time()?))
        .ok()?;
    // The fraction, if any, follows a `.` or `,` before any bracketed annotation.
    let stamp_part = text.split('[').next().unwrap_or_default();
    to_stamp(utc, !stamp_part.contains(['.', ',']))
}

/// Unix epoch seconds, whole (`1700000000`) or with a fraction (`1700000000.25`).
pub(crate) fn parse_epoch(text: &str) -> Option<Stamp> {
    let text = text.trim();
    let (whole, frac) = match text.split_once('.') {
        Some((w, f)) => (w, Some(fraction_nanos(f)?)),
        None => (text, None),
    };
    if whole.is_empty() || whole.len() > 12 || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let seconds: i64 = whole.parse().ok()?;
    let time = Timestamp::new(seconds, i32::try_from(frac.unwrap_or(0)).ok()?).ok()?;
    to_stamp(time, frac.is_none())
}

/// Any of the textual forms: RFC 3339, a Common Log Format date, or epoch seconds.
pub(crate) fn parse_any(text: &str) -> Option<Stamp> {
    let text = text.trim();
    parse_rfc3339(text)
        .or_else(|| parse_epoch(text))
        .or_else(|| parse_clf(text.trim_start_matches('[').trim_end_matches(']')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: &str) -> u64 {
        parse_any(s).unwrap().nanos / NANOS
    }

    #[test]
    fn clf_dates_convert_their_zone_to_utc() {
        // Apache's documentation example: 10/Oct/2000:13:55:36 -0700 is 20:55:36 UTC.
        let s = parse_clf("10/Oct/2000:13:55:36 -0700").unwrap();
        assert_eq!(s.nanos / NANOS, 971_211_336);
        assert!(s.whole_second);
        assert_eq!(secs("10/Oct/2000:20:55:36 +0000"), 971_211_336);
        assert_eq!(secs("10/Oct/2000:22:25:36 +0130"), 971_211_336);
        assert_eq!(secs("[10/Oct/2000:20:55:36 +0000]"), 971_211_336);
    }

    #[test]
    fn rfc3339_reads_fractions_and_offsets() {
        let s = parse_rfc3339("2000-10-10T20:55:36.25Z").unwrap();
        assert_eq!(s.nanos, 971_211_336 * NANOS + 250_000_000);
        assert!(!s.whole_second);
        assert_eq!(secs("2000-10-10 21:55:36+01:00"), 971_211_336);
        assert_eq!(secs("2000-10-10T13:55:36-0700"), 971_211_336);
        assert_eq!(secs("2024-02-29T00:00:00Z"), 1_709_164_800);
    }

    #[test]
    fn epoch_seconds_keep_their_fraction() {
        let s = parse_epoch("1700000000.000000001").unwrap();
        assert_eq!(s.nanos, 1_700_000_000 * NANOS + 1);
        assert!(!s.whole_second);
        assert!(parse_epoch("1700000000").unwrap().whole_second);
        let last = parse_epoch("18446744072.999999999").unwrap();
        assert_eq!(last.nanos, 18_446_744_072_999_999_999);
    }

    #[test]
    fn leap_seconds_count_as_the_last_instant_of_their_minute() {
        // Neither jiff nor the replay models leap seconds: `:60` reads as `:59`.
        assert_eq!(secs("31/Dec/2016:23:59:60 +0000"), 1_483_228_799);
        assert_eq!(secs("2016-12-31T23:59:60Z"), 1_483_228_799);
        let s = parse_rfc3339("2016-12-31T23:59:60.5Z").unwrap();
        assert_eq!(s.nanos, 1_483_228_799 * NANOS + 500_000_000);
    }

    #[test]
    fn zones_and_long_fractions_are_read_in_every_accepted_spelling() {
        assert_eq!(secs("10/Oct/2000:13:55:36 -07:00"), 971_211_336);
        assert_eq!(secs("10/Oct/2000:20:55:36 Z"), 971_211_336);
        let s = parse_clf("10/Oct/2000:20:55:36.125 +0000").unwrap();
        assert_eq!(s.nanos, 971_211_336 * NANOS + 125_000_000);
        assert!(!s.whole_second);
        // Digits past the ninth are dropped, not rounded.
        let s = parse_rfc3339("2000-10-10T20:55:36.1234567899Z").unwrap();
        assert_eq!(s.nanos, 971_211_336 * NANOS + 123_456_789);
        let s = parse_clf("10/Oct/2000:20:55:36.0000000019 +0000").unwrap();
        assert_eq!(s.nanos, 971_211_336 * NANOS + 1);
        assert!(
            !parse_rfc3339("2000-10-10T20:55:36.000Z")
                .unwrap()
                .whole_second
        );
    }

    #[test]
    fn impossible_dates_and_garbage_are_refused() {
        for bad in [
            "",
            "-",
            "31/Feb/2000:00:00:00 +0000",
            "10/Foo/2000:13:55:36 -0700",
            "10/Oct/2000:24:00:00 +0000",
            "10/Oct/2000:13:55:36 -0799",
            "10/Oct/2000:13:55:36 +2400",
            "10/Oct/2000:13:55:36 +07",
            "10/Oct/2000:13:55:61 +0000",
            "2000-10-10T20:55:36+24:00",
            "10/Oct/2000:13:55:36",
            "2023-02-29T00:00:00Z",
            "2000-10-10T20:55:36",
            "2000-10-10T20:55:36.Z",
            "1e9",
            "-5",
            "99999999999999999999",
            "1969-12-31T23:59:59Z",
            "2600-01-01T00:00:00Z",
            "01/Jan/9999:00:00:00 +0000",
            "99999999999",
            "ünïcödé-10-10T20:55:36Z",
        ] {
            assert_eq!(parse_any(bad), None, "{bad:?}");
        }
    }
}
