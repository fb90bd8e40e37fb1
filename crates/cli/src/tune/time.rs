//! Timestamps of log lines: Common Log Format dates, RFC 3339, and Unix epoch numbers,
//! converted to nanoseconds since the Unix epoch (UTC).

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

/// Days from 1970-01-01 to the given civil date (proleptic Gregorian), after Howard
/// Hinnant's `days_from_civil`.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

fn digits(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Seconds since the epoch of a civil UTC date and time, checked field by field.
fn civil_seconds(date: (i64, u32, u32), time: (u32, u32, u32)) -> Option<i64> {
    let (year, month, day) = date;
    let (h, m, s) = time;
    if !(1970..=9999).contains(&year)
        || !(1..=12).contains(&month)
        || day == 0
        || day > days_in_month(year, month)
        || h > 23
        || m > 59
        || s > 60
    {
        return None;
    }
    // A leap second (":60") counts as the last instant of its minute.
    let s = s.min(59);
    Some(days_from_civil(year, month, day) * 86_400 + i64::from(h * 3600 + m * 60 + s))
}

/// A numeric zone offset `+hhmm`, `-hh:mm`, or `Z`, in seconds east of UTC.
fn zone_offset(z: &str) -> Option<i64> {
    if z == "Z" || z == "z" {
        return Some(0);
    }
    let (sign, rest) = match z.as_bytes().first()? {
        b'+' => (1, &z[1..]),
        b'-' => (-1, &z[1..]),
        _ => return None,
    };
    let rest = rest.replacen(':', "", 1);
    if rest.len() != 4 {
        return None;
    }
    let h = digits(&rest[..2])?;
    let m = digits(&rest[2..])?;
    if h > 23 || m > 59 {
        return None;
    }
    Some(sign * i64::from(h * 3600 + m * 60))
}

fn to_stamp(utc_seconds: i64, nanos: u32, whole_second: bool) -> Option<Stamp> {
    if !(0..=MAX_SECONDS).contains(&utc_seconds) {
        return None;
    }
    let seconds = u64::try_from(utc_seconds).ok()?;
    Some(Stamp {
        nanos: seconds * NANOS + u64::from(nanos),
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
pub(crate) fn parse_clf(text: &str) -> Option<Stamp> {
    let (datetime, zone) = text.split_once(' ')?;
    let mut parts = datetime.splitn(4, ':');
    let date = parts.next()?;
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    let mut d = date.splitn(3, '/');
    let day = digits(d.next()?)?;
    let month = match d.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year = i64::from(digits(d.next()?)?);
    // Apache's `%{msec_frac}t` style is rare; a fraction on the seconds is accepted.
    let (s, frac) = match s.split_once('.') {
        Some((s, f)) => (s, Some(fraction_nanos(f)?)),
        None => (s, None),
    };
    let local = civil_seconds((year, month, day), (digits(h)?, digits(m)?, digits(s)?))?;
    let offset = zone_offset(zone.trim())?;
    to_stamp(local - offset, frac.unwrap_or(0), frac.is_none())
}

/// An RFC 3339 / ISO 8601 timestamp: `2026-11-30T20:30:06Z`,
/// `2026-11-30 20:30:06.250+01:00`.
pub(crate) fn parse_rfc3339(text: &str) -> Option<Stamp> {
    let text = text.trim();
    if text.len() < 19 || !text.is_char_boundary(10) || !text.is_char_boundary(19) {
        return None;
    }
    let (date, rest) = text.split_at(10);
    let sep = rest.as_bytes()[0];
    if !matches!(sep, b'T' | b't' | b' ') {
        return None;
    }
    let mut d = date.splitn(3, '-');
    let year = i64::from(digits(d.next()?)?);
    let month = digits(d.next()?)?;
    let day = digits(d.next()?)?;
    let time = &rest[1..9];
    let mut t = time.splitn(3, ':');
    let (h, m, s) = (digits(t.next()?)?, digits(t.next()?)?, digits(t.next()?)?);
    let mut tail = &rest[9..];
    let mut frac = None;
    if let Some(f) = tail.strip_prefix('.') {
        let end = f.find(|c: char| !c.is_ascii_digit()).unwrap_or(f.len());
        frac = Some(fraction_nanos(&f[..end])?);
        tail = &f[end..];
    }
    let offset = zone_offset(tail)?;
    let local = civil_seconds((year, month, day), (h, m, s))?;
    to_stamp(local - offset, frac.unwrap_or(0), frac.is_none())
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
    to_stamp(seconds, frac.unwrap_or(0), frac.is_none())
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
    fn impossible_dates_and_garbage_are_refused() {
        for bad in [
            "",
            "-",
            "31/Feb/2000:00:00:00 +0000",
            "10/Foo/2000:13:55:36 -0700",
            "10/Oct/2000:24:00:00 +0000",
            "10/Oct/2000:13:55:36 -0799",
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
