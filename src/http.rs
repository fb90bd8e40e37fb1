//! HTTP semantics of a decision, independent of any web framework: the 429 status, the
//! `Retry-After` value, and the IETF `RateLimit-Policy` and `RateLimit` field values.
//!
//! Every value is returned as a number or as a [`Display`](fmt::Display) value that writes
//! the field value without allocating; put them in whatever header map the server uses,
//! under the names [`RETRY_AFTER`], [`RATELIMIT_POLICY`] and [`RATELIMIT`].
//!
//! # The fields
//!
//! | field              | when              | value                              | from the bucket                              |
//! |--------------------|-------------------|------------------------------------|----------------------------------------------|
//! | status             | rejection         | `429` ([`TOO_MANY_REQUESTS`])      | [`status`]                                   |
//! | `Retry-After`      | rejection         | `delay-seconds`, e.g. `2`          | the wait for the cost, **rounded up**, ≥ 1   |
//! | `RateLimit-Policy` | any response      | `"name";q=100;w=5`                 | `q` = capacity, `w` = time to fill, seconds  |
//! | `RateLimit`        | any response      | `"name";r=97;t=1`                  | `r` = whole tokens left, `t` = see below     |
//!
//! The two `RateLimit` fields follow **draft-ietf-httpapi-ratelimit-headers-11** (23 May
//! 2026, the latest revision; the format has been stable since revision 08): both are
//! Structured Field Lists (RFC 9651) of Items whose value is the policy name as an
//! sf-string, with Integer parameters. `RateLimit-Policy` items carry the quota `q` and the
//! window `w` in seconds; `RateLimit` items carry the available quota `r` and the
//! effective window `t` in seconds. The optional `qu` (quota unit; the default,
//! `"requests"`, is what a cost of 1 per request means) and `pk` (partition key) parameters
//! are not written: append `;pk=:...:` yourself if clients need it. Several policies go in
//! one field as a list, items joined by `", "`.
//!
//! # How a token bucket maps onto them
//!
//! The draft describes quotas per time window; a token bucket has a capacity `B` and a
//! refill rate `r`. The mapping, and why:
//!
//! - **`q` = `B`**, the largest number of tokens a client can spend at once.
//! - **`w` = `ceil(B / r)` seconds**, the time an empty bucket takes to fill, computed
//!   exactly from the configured rate (rational arithmetic) and rounded up, at least 1.
//!   So `q / w`, the average rate a client may read from the policy, never exceeds `r`.
//!   It uses the configured rate rather than the effective one, which is at most 0.1%
//!   (usually 0.01%) lower: for `B = 100, r = 20/s` the effective fill time is about
//!   5.0015 s, and rounding it up to `w=6` would understate the rate by 17%, far more than
//!   the error it corrects.
//! - **`r` = whole tokens left**, `floor(balance)` after the decision, 0 while the balance
//!   is below one token or negative (reservations owed).
//! - **`t`** (the draft's *effective window*, "the time within which the client can use no
//!   more than the available quota"):
//!   - for a **rejection**, the wait until the cost is available, in seconds rounded up:
//!     the same value as `Retry-After`. The draft says a `Retry-After` should not point
//!     earlier than the end of the effective window; equal values satisfy it, and a
//!     client that believes either field comes back at the same moment.
//!   - for an **admission**, the time until the bucket is full again, rounded up (0 when
//!     it is full): the moment the available quota is back to `q`, the classic *reset*.
//!     A client that spends no more than `r` within `t` seconds is never refused, since
//!     refill only adds to `r`. This is conservative (tokens come back continuously, so
//!     after a burst `r=0;t=5` reads stricter than the truth); clients that want to
//!     pace use `q / w`, and a rejection's `Retry-After` gives the exact wait.
//!
//! # Rounding
//!
//! Durations become whole seconds by rounding **up**, so a client never comes back early:
//! 0.001 s is `1`, 2.0 s is `2`, 2.000000001 s is `3`. A rejection's `Retry-After` is
//! never `0` (a zero would invite an immediate retry that is refused again).
//!
//! # One cap for every count of seconds
//!
//! `Retry-After` is `delay-seconds`, a non-negative decimal integer of any length
//! (RFC 9110, section 10.2.3); `t` and `w` are structured-field Integers, at most 15
//! digits (RFC 9651). Every count of seconds this module writes or reads is capped at
//! [`MAX_INTEGER`] (999,999,999,999,999 s, about 31.7 million years): a longer wait
//! (`Duration::MAX`, a rate too slow to refill within it) is written as [`MAX_INTEGER`]
//! rather than refused or wrapped, so `Retry-After` and a rejection's `t` are always the
//! same number and every value is valid in both grammars. Reading, a `Retry-After`
//! above it, however many digits, reads as [`MAX_INTEGER`] seconds: RFC 9110 asks
//! recipients to handle large values, and RFC 9111 (section 1.2.2) has them take a
//! delta-seconds they cannot represent as the greatest they can, not as absent. A `q` or
//! `w` above the cap cannot be written truthfully and is a [`QuotaError`].
//!
//! ```
//! use tokengate::http::{self, Quota};
//! use tokengate::{Bucket, ManualClock, Policy};
//!
//! let policy = Policy::new(100, 20.0)?;
//! let quota = Quota::new("tenant", &policy)?;
//! let bucket = Bucket::with_clock(policy, ManualClock::new());
//!
//! let admitted = bucket.try_acquire(3)?;
//! assert_eq!(http::status(&admitted), None); // the application's own status
//! assert_eq!(http::retry_after(&admitted), None);
//! assert_eq!(quota.policy_item().to_string(), r#""tenant";q=100;w=5"#);
//! // 97 left; 3 tokens at 20/s refill in 150 ms: full again within 1 s.
//! assert_eq!(quota.service_limit(&admitted).to_string(), r#""tenant";r=97;t=1"#);
//!
//! bucket.try_acquire(97)?;
//! let rejected = bucket.try_acquire(30)?; // 30 tokens take 1.5 s
//! assert_eq!(http::status(&rejected), Some(429));
//! assert_eq!(http::retry_after(&rejected), Some(2));
//! assert_eq!(quota.service_limit(&rejected).to_string(), r#""tenant";r=0;t=2"#);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::time::Duration;

use crate::decision::Decision;
use crate::multi::MultiDecision;
use crate::policy::Policy;

/// The status code of a rejection: 429 Too Many Requests (RFC 6585).
pub const TOO_MANY_REQUESTS: u16 = 429;

/// The `Retry-After` field name (lower case, as HTTP/2 and HTTP/3 write it).
pub const RETRY_AFTER: &str = "retry-after";

/// The `RateLimit-Policy` field name (lower case).
pub const RATELIMIT_POLICY: &str = "ratelimit-policy";

/// The `RateLimit` field name (lower case).
pub const RATELIMIT: &str = "ratelimit";

/// The draft the `RateLimit` field values follow.
pub const DRAFT: &str = "draft-ietf-httpapi-ratelimit-headers-11";

/// The legacy `X-RateLimit-Limit` field name (lower case): the quota of the reported
/// scope, for clients that predate the IETF fields.
pub const X_RATELIMIT_LIMIT: &str = "x-ratelimit-limit";

/// The legacy `X-RateLimit-Remaining` field name (lower case): whole tokens left.
pub const X_RATELIMIT_REMAINING: &str = "x-ratelimit-remaining";

/// The legacy `X-RateLimit-Reset` field name (lower case): seconds until the scope is
/// full again (or, refused, until the retry).
pub const X_RATELIMIT_RESET: &str = "x-ratelimit-reset";

/// The largest Integer a structured field carries (RFC 9651: at most 15 digits), and the
/// cap of every count of seconds written or read (see [the module docs](self#one-cap-for-every-count-of-seconds)).
pub const MAX_INTEGER: u64 = 999_999_999_999_999;

/// A decision an HTTP response can report: admitted, or rejected with a wait.
///
/// Implemented by [`Decision`], [`MultiDecision`],
/// [`ScopeDecision`](crate::scope::ScopeDecision) and
/// [`ScopeVerdict`](crate::scope::ScopeVerdict).
pub trait Verdict {
    /// Whether the request was admitted.
    fn is_admitted(&self) -> bool;

    /// For a rejection, the time until it could be admitted.
    fn retry_after(&self) -> Option<Duration>;
}

impl Verdict for Decision {
    fn is_admitted(&self) -> bool {
        Decision::is_admitted(self)
    }

    fn retry_after(&self) -> Option<Duration> {
        Decision::retry_after(self)
    }
}

impl Verdict for crate::scope::ScopeVerdict<'_> {
    fn is_admitted(&self) -> bool {
        crate::scope::ScopeVerdict::is_admitted(self)
    }

    fn retry_after(&self) -> Option<Duration> {
        crate::scope::ScopeVerdict::retry_after(self)
    }
}

impl Verdict for crate::scope::ScopeDecision<'_> {
    fn is_admitted(&self) -> bool {
        crate::scope::ScopeDecision::is_admitted(self)
    }

    fn retry_after(&self) -> Option<Duration> {
        crate::scope::ScopeDecision::retry_after(self)
    }
}

impl Verdict for MultiDecision {
    fn is_admitted(&self) -> bool {
        MultiDecision::is_admitted(self)
    }

    fn retry_after(&self) -> Option<Duration> {
        MultiDecision::retry_after(self)
    }
}

/// The status to answer: `Some(429)` for a rejection, `None` for an admission (the
/// response's status is then the application's).
///
/// ```
/// use tokengate::{acquire_all, http, Bucket, ManualClock, Policy};
/// let clock = ManualClock::new();
/// let a = Bucket::with_clock(Policy::new(10, 1.0)?, clock.clone());
/// let b = Bucket::with_clock(Policy::new(2, 1.0)?, clock.clone());
/// assert_eq!(http::status(&acquire_all(&[(&a, 2), (&b, 2)])?), None);
/// assert_eq!(http::status(&acquire_all(&[(&a, 2), (&b, 2)])?), Some(429));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn status(verdict: &impl Verdict) -> Option<u16> {
    (!verdict.is_admitted()).then_some(TOO_MANY_REQUESTS)
}

/// The `Retry-After` value in whole seconds for a rejection (see [`retry_after_seconds`]),
/// `None` for an admission.
///
/// ```
/// use tokengate::{http, Bucket, ManualClock, Policy};
/// let bucket = Bucket::with_clock(Policy::new(10, 2.0)?, ManualClock::new());
/// assert_eq!(http::retry_after(&bucket.try_acquire(10)?), None);
/// // 3 tokens at 2/s: 1.5 s (and a tick), rounded up.
/// assert_eq!(http::retry_after(&bucket.try_acquire(3)?), Some(2));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn retry_after(verdict: &impl Verdict) -> Option<u64> {
    if verdict.is_admitted() {
        return None;
    }
    Some(retry_after_seconds(
        verdict.retry_after().unwrap_or(Duration::ZERO),
    ))
}

/// A wait as `Retry-After` delay-seconds: rounded up to whole seconds, at least 1, so
/// that a refused client never comes back before the wait is over and never retries at
/// once, and at most [`MAX_INTEGER`] (the one cap, see [the module
/// docs](self#one-cap-for-every-count-of-seconds)), so it equals a rejection's `t`.
///
/// ```
/// use std::time::Duration;
/// use tokengate::http::{retry_after_seconds, MAX_INTEGER};
/// assert_eq!(retry_after_seconds(Duration::from_millis(1)), 1);
/// assert_eq!(retry_after_seconds(Duration::from_secs(2)), 2);
/// assert_eq!(retry_after_seconds(Duration::new(2, 1)), 3);
/// assert_eq!(retry_after_seconds(Duration::ZERO), 1);
/// // A wait that never ends (`Decision::wait_for`'s saturation value) is the cap.
/// assert_eq!(retry_after_seconds(Duration::MAX), MAX_INTEGER);
/// ```
pub fn retry_after_seconds(wait: Duration) -> u64 {
    ceil_seconds(wait).clamp(1, MAX_INTEGER)
}

/// Reads a `Retry-After` value in delay-seconds form (`"120"`, surrounding spaces and tabs
/// allowed) as a duration, capped at [`MAX_INTEGER`] seconds however many digits it has
/// (see [the module docs](self#one-cap-for-every-count-of-seconds)). `None` for anything
/// else: an HTTP-date (convert it with the HTTP library, which knows the current date),
/// or an empty or signed value.
///
/// ```
/// use std::time::Duration;
/// use tokengate::http::{parse_retry_after, MAX_INTEGER};
/// assert_eq!(parse_retry_after(" 3 "), Some(Duration::from_secs(3)));
/// assert_eq!(parse_retry_after("Fri, 31 Dec 1999 23:59:59 GMT"), None);
/// assert_eq!(parse_retry_after("-1"), None);
/// assert_eq!(parse_retry_after("99999999999999999999"), Some(Duration::from_secs(MAX_INTEGER)));
/// ```
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let digits = value.trim_matches([' ', '\t']);
    if digits.is_empty() {
        return None;
    }
    let mut secs: u64 = 0;
    for b in digits.bytes() {
        if !b.is_ascii_digit() {
            return None;
        }
        // Below the cap, `secs * 10 + 9` fits a u64; at the cap it stays there.
        secs = (secs * 10 + u64::from(b - b'0')).min(MAX_INTEGER);
    }
    Some(Duration::from_secs(secs))
}

/// Whole seconds in `d`, rounded up, saturating at `u64::MAX` (for `Duration::MAX`).
fn ceil_seconds(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// Why a [`Quota`] cannot describe a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuotaError {
    /// The policy name has a byte outside printable ASCII (`0x20..=0x7E`), which an
    /// sf-string cannot carry.
    InvalidName {
        /// Byte position of the first invalid byte.
        position: usize,
        /// The byte.
        byte: u8,
    },
    /// The capacity is above the largest structured-field Integer, [`MAX_INTEGER`].
    QuotaTooLarge {
        /// The policy's capacity.
        capacity: u64,
    },
    /// The time to fill the bucket, in seconds, is above [`MAX_INTEGER`].
    WindowTooLong {
        /// The fill time in whole seconds, rounded up.
        seconds: u128,
    },
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaError::InvalidName { position, byte } => write!(
                f,
                "policy names must be printable ASCII (0x20..=0x7E); byte 0x{byte:02x} at \
                 position {position} is not"
            ),
            QuotaError::QuotaTooLarge { capacity } => write!(
                f,
                "capacity {capacity} is above the largest structured-field integer, {MAX_INTEGER}"
            ),
            QuotaError::WindowTooLong { seconds } => write!(
                f,
                "the bucket takes {seconds} s to fill, above the largest structured-field \
                 integer, {MAX_INTEGER}"
            ),
        }
    }
}

impl std::error::Error for QuotaError {}

/// A policy as the `RateLimit` fields name and describe it: its name, quota `q` and
/// window `w`. Built once per policy; see the [module docs](self) for the mapping.
///
/// ```
/// use tokengate::http::Quota;
/// use tokengate::Policy;
///
/// let quota = Quota::new("per-minute", &Policy::per(100, 100, std::time::Duration::from_secs(60))?)?;
/// assert_eq!((quota.quota(), quota.window_seconds()), (100, 60));
/// assert_eq!(quota.policy_item().to_string(), r#""per-minute";q=100;w=60"#);
/// // Quotes and backslashes are escaped; control characters are refused.
/// assert_eq!(Quota::new(r#"a"b"#, &Policy::new(1, 1.0)?)?.policy_item().to_string(), r#""a\"b";q=1;w=1"#);
/// assert!(Quota::new("a\nb", &Policy::new(1, 1.0)?).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quota {
    /// The name, escaped for an sf-string (without the quotes).
    escaped: Box<str>,
    capacity: u64,
    window_seconds: u64,
    frac_bits: u32,
}

impl Quota {
    /// The quota of `policy`, named `name` in the fields.
    ///
    /// # Errors
    ///
    /// [`QuotaError`] for a name that is not printable ASCII, or a capacity or fill time
    /// above [`MAX_INTEGER`].
    pub fn new(name: &str, policy: &Policy) -> Result<Quota, QuotaError> {
        let mut escaped = String::with_capacity(name.len());
        for (position, byte) in name.bytes().enumerate() {
            if !(0x20..=0x7e).contains(&byte) {
                return Err(QuotaError::InvalidName { position, byte });
            }
            if byte == b'"' || byte == b'\\' {
                escaped.push('\\');
            }
            escaped.push(char::from(byte));
        }
        let capacity = policy.capacity();
        if capacity > MAX_INTEGER {
            return Err(QuotaError::QuotaTooLarge { capacity });
        }
        let seconds = fill_seconds(policy).max(1);
        let window_seconds = u64::try_from(seconds)
            .ok()
            .filter(|&w| w <= MAX_INTEGER)
            .ok_or(QuotaError::WindowTooLong { seconds })?;
        Ok(Quota {
            escaped: escaped.into_boxed_str(),
            capacity,
            window_seconds,
            frac_bits: policy.layout().frac_bits(),
        })
    }

    /// `q`: the capacity, in tokens.
    pub fn quota(&self) -> u64 {
        self.capacity
    }

    /// `w`: the time an empty bucket takes to fill at the configured rate, in seconds
    /// rounded up, at least 1.
    pub fn window_seconds(&self) -> u64 {
        self.window_seconds
    }

    /// The `RateLimit-Policy` item: `"name";q=<capacity>;w=<window seconds>`.
    pub fn policy_item(&self) -> PolicyItem<'_> {
        PolicyItem { quota: self }
    }

    /// The `RateLimit` item for a decision of a bucket with this policy:
    /// `"name";r=<whole tokens left>;t=<seconds>` (see the [module docs](self) for `t`).
    ///
    /// For several buckets ([`acquire_all_with`](crate::multi::acquire_all_with)), write one item
    /// per bucket from the decisions it reports, joined by `", "`.
    ///
    /// ```
    /// use tokengate::http::Quota;
    /// use tokengate::{Bucket, ManualClock, Policy};
    ///
    /// let policy = Policy::new(10, 1.0)?;
    /// let quota = Quota::new("user", &policy)?;
    /// let clock = ManualClock::new();
    /// let bucket = Bucket::with_clock(policy, clock.clone());
    /// assert_eq!(quota.service_limit(&bucket.try_acquire(0)?).to_string(), r#""user";r=10;t=0"#);
    /// let limit = quota.service_limit(&bucket.try_acquire(4)?);
    /// // 6 left; 4 tokens at 1/s: full again in a little over 4 s (the rate rounds down).
    /// assert_eq!((limit.remaining(), limit.reset_seconds()), (6, 5));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn service_limit(&self, decision: &Decision) -> ServiceLimit<'_> {
        let balance = decision.balance_units();
        let remaining = if balance <= 0 {
            0
        } else {
            (balance as u64) >> self.frac_bits
        };
        let reset = if decision.is_admitted() {
            ceil_seconds(decision.wait_for(self.capacity))
        } else {
            retry_after_seconds(decision.retry_after().unwrap_or(Duration::ZERO))
        };
        ServiceLimit {
            quota: self,
            remaining,
            reset_seconds: reset.min(MAX_INTEGER),
        }
    }
}

/// The time an empty bucket takes to fill, in seconds rounded up: exact from the
/// configured rate, or from the layout's grid when the exact fraction does not fit.
fn fill_seconds(policy: &Policy) -> u128 {
    let capacity = u128::from(policy.capacity());
    if let Some((num, den)) = policy.exact_rate_per_nanosecond() {
        // capacity / (num / den) ns = capacity * den / num ns.
        if let (Some(n), Some(d)) = (capacity.checked_mul(den), num.checked_mul(1_000_000_000)) {
            return n.div_ceil(d);
        }
    }
    let layout = policy.layout();
    let ticks = layout.ticks_until(
        layout.base_units(),
        layout.max_units() - layout.base_units(),
    );
    (u128::from(ticks) << layout.tick_shift()).div_ceil(1_000_000_000)
}

/// A `RateLimit-Policy` item, written by [`Display`](fmt::Display):
/// `"name";q=100;w=5`.
#[derive(Clone, Copy, Debug)]
pub struct PolicyItem<'a> {
    quota: &'a Quota,
}

impl fmt::Display for PolicyItem<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let q = self.quota;
        write!(
            f,
            "\"{}\";q={};w={}",
            q.escaped, q.capacity, q.window_seconds
        )
    }
}

/// A `RateLimit` item, written by [`Display`](fmt::Display): `"name";r=97;t=1`.
#[derive(Clone, Copy, Debug)]
pub struct ServiceLimit<'a> {
    quota: &'a Quota,
    remaining: u64,
    reset_seconds: u64,
}

impl ServiceLimit<'_> {
    /// `r`: whole tokens left after the decision (0 while below one token or owed).
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// `t`: for a rejection, the `Retry-After` seconds; for an admission, the seconds
    /// until the bucket is full again (0 when full); rounded up.
    pub fn reset_seconds(&self) -> u64 {
        self.reset_seconds
    }
}

impl fmt::Display for ServiceLimit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "\"{}\";r={};t={}",
            self.quota.escaped, self.remaining, self.reset_seconds
        )
    }
}
