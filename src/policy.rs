//! Validated configuration: capacity, refill rate, start state, and the fixed-point
//! layout derived from them once.

use std::fmt;
use std::time::Duration;

use crate::state::{Layout, MAX_TICK_SHIFT};

/// Rate error the layout search aims for: the effective rate is within 0.01% of the
/// configured one whenever the word allows it.
pub const TARGET_RATE_ERROR: f64 = 1e-4;

/// The largest rate error a policy accepts (0.1%); beyond it the rate is reported as not
/// representable for this capacity.
pub const MAX_RATE_ERROR: f64 = 1e-3;

/// log2 of the wrap period, in nanoseconds, the layout search aims for (2^58 ns, about
/// 9.1 years). Longer wraps cost refill precision and buy nothing.
const TARGET_WRAP_BITS: u32 = 58;

/// log2 of the wrap period every policy gets when the word allows it, before precision
/// and tick length are considered (2^56 ns, about 2.3 years).
const LONG_WRAP_BITS: u32 = 56;

/// log2 of the shortest wrap period a policy accepts (2^50 ns, about 13 days).
pub const MIN_WRAP_BITS: u32 = 50;

/// Ticks need not be shorter than this (2^20 ns, about 1 ms) unless the bucket is small
/// compared with its rate.
const COARSE_TICK_SHIFT: u32 = 20;

/// How a new or reset bucket starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Start {
    /// Full: an immediate burst of `capacity` tokens is allowed (the default).
    #[default]
    Full,
    /// Empty: nothing is admitted until tokens have refilled.
    Empty,
}

/// The refill rate as given: tokens per second, or whole tokens per period.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Rate {
    PerSecond(f64),
    PerPeriod { tokens: u64, nanos: u128 },
}

impl Rate {
    fn per_second(&self) -> f64 {
        match *self {
            Rate::PerSecond(r) => r,
            Rate::PerPeriod { tokens, nanos } => tokens as f64 * 1e9 / nanos as f64,
        }
    }

    /// `floor(rate * 2^shift ns)` in units of `2^-0`: the exact integer refill per tick
    /// for `shift = S + F`, rounded down. `None` when it does not fit a `u64`.
    pub(crate) fn units_per_tick(&self, shift: u32) -> Option<u64> {
        let exact = match *self {
            Rate::PerSecond(r) => {
                // r = m * 2^e exactly; R = floor(m * 2^(e + shift) / 1e9).
                let (m, e) = decompose(r);
                let k = e + shift as i32;
                if k >= 0 {
                    let k = k as u32;
                    if k > 127 - 53 {
                        return None;
                    }
                    (u128::from(m) << k) / 1_000_000_000
                } else {
                    let q = u128::from(m) / 1_000_000_000;
                    q.checked_shr(k.unsigned_abs()).unwrap_or(0)
                }
            }
            Rate::PerPeriod { tokens, nanos } => {
                let n = u128::from(tokens).checked_shl(shift)?;
                if n >> shift != u128::from(tokens) {
                    return None;
                }
                n / nanos
            }
        };
        u64::try_from(exact).ok()
    }

    /// The rate as an exact fraction `(numerator, denominator)` of tokens per nanosecond;
    /// `None` when it does not fit in `u128`s.
    fn per_nanosecond(&self) -> Option<(u128, u128)> {
        match *self {
            Rate::PerSecond(r) => {
                let (m, e) = decompose(r);
                if e >= 0 {
                    let num = u128::from(m).checked_shl(e as u32)?;
                    (num >> e == u128::from(m)).then_some((num, 1_000_000_000))
                } else {
                    let den = 1_000_000_000u128.checked_shl(e.unsigned_abs())?;
                    (den >> e.unsigned_abs() == 1_000_000_000).then_some((u128::from(m), den))
                }
            }
            Rate::PerPeriod { tokens, nanos } => Some((u128::from(tokens), nanos)),
        }
    }

    /// The exact refill per tick as a float, for the rate error.
    pub(crate) fn units_per_tick_f64(&self, shift: u32) -> f64 {
        match *self {
            Rate::PerSecond(r) => r * 2f64.powi(shift as i32) / 1e9,
            Rate::PerPeriod { tokens, nanos } => {
                tokens as f64 * 2f64.powi(shift as i32) / nanos as f64
            }
        }
    }
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
}

/// Splits a positive finite `f64` into `m * 2^e` exactly, `m < 2^53`.
fn decompose(x: f64) -> (u64, i32) {
    let bits = x.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    let frac = bits & ((1 << 52) - 1);
    if exp == 0 {
        (frac, -1074)
    } else {
        (frac | (1 << 52), exp - 1075)
    }
}

/// Why a policy is invalid. Each variant names the field, the value and the valid range.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum PolicyError {
    /// `capacity` is zero.
    ZeroCapacity,
    /// `capacity` is above what the packed word holds at this rate.
    CapacityTooLarge {
        /// The capacity asked for.
        capacity: u64,
        /// The refill rate asked for, in tokens per second.
        refill_per_second: f64,
        /// The largest capacity below the one asked for that is representable at this
        /// rate.
        max: u64,
    },
    /// `refill_per_second` is NaN or infinite.
    RateNotFinite(f64),
    /// `refill_per_second` is zero or negative.
    RateNotPositive(f64),
    /// `refill_per_second` is below what the packed word represents within 0.1%.
    RateTooSmall {
        /// The refill rate asked for, in tokens per second.
        refill_per_second: f64,
        /// The capacity asked for.
        capacity: u64,
        /// The smallest representable rate above it for this capacity, in tokens per
        /// second (none is representable below).
        min: f64,
    },
    /// `refill_per_second` is above what the packed word represents.
    RateTooLarge {
        /// The refill rate asked for, in tokens per second.
        refill_per_second: f64,
        /// The capacity asked for.
        capacity: u64,
        /// The largest representable rate below it for this capacity, in tokens per
        /// second (none is representable above).
        max: f64,
    },
    /// `refill_per_second` falls in a gap: the packed word represents rates below and
    /// above it for this capacity, but not this one within 0.1% (an exact rate such as
    /// 1e9 tokens/s can fit where slightly lower ones do not).
    RateNotRepresentable {
        /// The refill rate asked for, in tokens per second.
        refill_per_second: f64,
        /// The capacity asked for.
        capacity: u64,
        /// A representable rate just below, in tokens per second.
        below: f64,
        /// A representable rate just above, in tokens per second.
        above: f64,
    },
    /// Neither the capacity nor the rate fits the packed word with the other: no rate
    /// fits this capacity and no capacity up to it fits this rate.
    NotRepresentable {
        /// The capacity asked for.
        capacity: u64,
        /// The refill rate asked for, in tokens per second.
        refill_per_second: f64,
    },
    /// The refill period of [`Policy::per`] is zero.
    ZeroPeriod,
    /// `max_reservation` is longer than the packed word can owe at this rate.
    ReservationTooLong {
        /// The reservation horizon asked for.
        max_reservation: Duration,
        /// The longest horizon representable for this capacity and rate.
        max: Duration,
    },
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PolicyError::ZeroCapacity => f.write_str("capacity must be at least 1 token, got 0"),
            PolicyError::CapacityTooLarge {
                capacity,
                refill_per_second,
                max,
            } => write!(
                f,
                "capacity {capacity} tokens is above what the packed word holds at \
                 {refill_per_second:e} tokens/s; the largest capacity below it that fits is {max}"
            ),
            PolicyError::RateNotFinite(r) => write!(
                f,
                "refill rate must be a finite number of tokens per second, got {r}"
            ),
            PolicyError::RateNotPositive(r) => {
                write!(f, "refill rate must be above 0 tokens per second, got {r}")
            }
            PolicyError::RateTooSmall {
                refill_per_second,
                capacity,
                min,
            } => write!(
                f,
                "refill rate {refill_per_second:e} tokens/s is below the smallest this layout \
                 represents for capacity {capacity}, {min:.3e}"
            ),
            PolicyError::RateTooLarge {
                refill_per_second,
                capacity,
                max,
            } => write!(
                f,
                "refill rate {refill_per_second:e} tokens/s is above the largest this layout \
                 represents for capacity {capacity}, {max:.3e}"
            ),
            PolicyError::RateNotRepresentable {
                refill_per_second,
                capacity,
                below,
                above,
            } => write!(
                f,
                "refill rate {refill_per_second:e} tokens/s cannot be represented within 0.1% \
                 for capacity {capacity}; the nearest representable rates are {below:.4e} \
                 and {above:.4e}"
            ),
            PolicyError::NotRepresentable {
                capacity,
                refill_per_second,
            } => write!(
                f,
                "capacity {capacity} tokens at {refill_per_second:e} tokens/s cannot be \
                 represented: no rate fits this capacity and no smaller capacity fits this \
                 rate (capacities up to about 2^54 tokens and rates from about 1e-15 to 1e27 \
                 tokens/s fit, not in every combination)"
            ),
            PolicyError::ZeroPeriod => f.write_str("refill period must be longer than zero"),
            PolicyError::ReservationTooLong {
                max_reservation,
                max,
            } => write!(
                f,
                "max reservation {max_reservation:?} is longer than the packed word can owe \
                 at this rate: at most {max:?}"
            ),
        }
    }
}

impl std::error::Error for PolicyError {}

/// A validated token-bucket policy: capacity `B`, refill rate `r`, the start state, and
/// the fixed-point layout derived from them.
///
/// The layout search picks, once, a power-of-two tick and the fraction bits so that:
///
/// 1. the refill per tick `R = r * tick * 2^F` is an integer, rounded **down**, so the
///    effective rate never exceeds the configured one, within 0.01% where the word allows
///    it and always within 0.1% ([`rate_error`](Policy::rate_error));
/// 2. the tick is at most 1/16 of the time the bucket takes to fill, and preferably at
///    most about 1 ms, or 1/16 of a token's refill time when that is longer, so refill
///    arrives in small steps ([`tick`](Policy::tick));
/// 3. the tick field wraps as late as possible, aiming for 2^58 ns (about 9 years), never
///    earlier than 2^50 ns (about 13 days) ([`wrap_period`](Policy::wrap_period)).
///
/// ```
/// use std::time::Duration;
/// use tokengate::Policy;
///
/// let policy = Policy::new(100, 20.0)?;
/// assert_eq!(policy.capacity(), 100);
/// assert!(policy.rate_error() < 1e-4);
/// assert!(policy.tick() <= Duration::from_micros(1049));
/// assert!(policy.wrap_period() > Duration::from_secs(9 * 365 * 86400));
///
/// assert!(Policy::new(0, 1.0).is_err());
/// assert!(Policy::new(10, f64::NAN).is_err());
/// # Ok::<(), tokengate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    rate: Rate,
    start: Start,
    max_reservation: Duration,
    layout: Layout,
}

/// Builds a [`Policy`] with non-default options.
///
/// ```
/// use std::time::Duration;
/// use tokengate::{Policy, Start};
///
/// let policy = Policy::builder(60, 10.0)
///     .start(Start::Empty)
///     .max_reservation(Duration::from_secs(2))
///     .build()?;
/// assert_eq!(policy.start(), Start::Empty);
/// assert_eq!(policy.max_reservation(), Duration::from_secs(2));
/// # Ok::<(), tokengate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct PolicyBuilder {
    capacity: u64,
    rate: Rate,
    start: Start,
    max_reservation: Duration,
}

impl PolicyBuilder {
    /// Sets how a new or reset bucket starts (full by default).
    pub fn start(mut self, start: Start) -> Self {
        self.start = start;
        self
    }

    /// Sets how far into the future the bucket may be reserved (zero by default): the
    /// balance may go down to `-max_reservation * r`, and a reservation waits at most
    /// this long. See [`Bucket::reserve`](crate::Bucket::reserve).
    pub fn max_reservation(mut self, horizon: Duration) -> Self {
        self.max_reservation = horizon;
        self
    }

    /// Validates the policy and derives its layout.
    ///
    /// # Errors
    ///
    /// A [`PolicyError`] naming the field, the value and the valid range.
    pub fn build(self) -> Result<Policy, PolicyError> {
        if self.capacity == 0 {
            return Err(PolicyError::ZeroCapacity);
        }
        match self.rate {
            Rate::PerSecond(r) if !r.is_finite() => return Err(PolicyError::RateNotFinite(r)),
            Rate::PerSecond(r) if r <= 0.0 => return Err(PolicyError::RateNotPositive(r)),
            Rate::PerPeriod { nanos: 0, .. } => return Err(PolicyError::ZeroPeriod),
            Rate::PerPeriod { tokens: 0, .. } => return Err(PolicyError::RateNotPositive(0.0)),
            _ => {}
        }
        let horizon = self.max_reservation.as_nanos();
        match search(self.capacity, &self.rate, horizon) {
            Some(layout) => Ok(Policy {
                rate: self.rate,
                start: self.start,
                max_reservation: self.max_reservation,
                layout,
            }),
            None => Err(diagnose(self.capacity, &self.rate, self.max_reservation)),
        }
    }
}

/// A refill rate waiting for its burst: [`Policy::per_second`], [`Policy::per_minute`]
/// or [`Policy::per`]'s named form, completed by [`burst`](PolicyRate::burst). Naming both
/// numbers means a rate cannot be passed where the capacity goes.
///
/// ```
/// use std::time::Duration;
/// use tokengate::Policy;
///
/// // 20 tokens a second, bursts of up to 100.
/// let policy = Policy::per_second(20.0).burst(100)?;
/// assert_eq!(policy, Policy::new(100, 20.0)?);
///
/// // Exactly 600 tokens a minute (integer arithmetic, no float rounding), bursts of 50.
/// let policy = Policy::per_minute(600).burst(50)?;
/// assert_eq!(policy, Policy::per(50, 600, Duration::from_secs(60))?);
///
/// // Options go through the builder.
/// let policy = Policy::per_second(10.0)
///     .burst_builder(60)
///     .max_reservation(Duration::from_secs(2))
///     .build()?;
/// assert_eq!(policy.max_reservation(), Duration::from_secs(2));
///
/// assert!(Policy::per_second(0.0).burst(10).is_err());
/// assert!(Policy::per_second(10.0).burst(0).is_err());
/// # Ok::<(), tokengate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[must_use = "a rate is a policy once its burst is given: `.burst(capacity)`"]
pub struct PolicyRate {
    rate: Rate,
}

impl PolicyRate {
    /// The policy of this rate with a capacity (largest burst) of `capacity` tokens,
    /// starting full.
    ///
    /// # Errors
    ///
    /// As [`Policy::new`] (and [`PolicyError::ZeroPeriod`] for a rate per zero period).
    pub fn burst(self, capacity: u64) -> Result<Policy, PolicyError> {
        self.burst_builder(capacity).build()
    }

    /// A builder for the policy of this rate and `capacity`, for options (start empty,
    /// reservations).
    pub fn burst_builder(self, capacity: u64) -> PolicyBuilder {
        PolicyBuilder {
            capacity,
            rate: self.rate,
            start: Start::Full,
            max_reservation: Duration::ZERO,
        }
    }
}

impl Policy {
    /// A refill rate of `tokens` per second; give its burst with
    /// [`burst`](PolicyRate::burst): `Policy::per_second(20.0).burst(100)`.
    pub fn per_second(tokens: f64) -> PolicyRate {
        PolicyRate {
            rate: Rate::PerSecond(tokens),
        }
    }

    /// A refill rate of exactly `tokens` per minute, computed in integers; give its burst
    /// with [`burst`](PolicyRate::burst): `Policy::per_minute(600).burst(50)`.
    pub fn per_minute(tokens: u64) -> PolicyRate {
        Policy::every(tokens, Duration::from_secs(60))
    }

    /// A refill rate of exactly `tokens` every `period`, computed in integers; give its
    /// burst with [`burst`](PolicyRate::burst).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokengate::Policy;
    /// let policy = Policy::every(1000, Duration::from_secs(3600)).burst(50)?;
    /// assert_eq!(policy.capacity(), 50);
    /// assert!(Policy::every(10, Duration::ZERO).burst(5).is_err());
    /// # Ok::<(), tokengate::PolicyError>(())
    /// ```
    pub fn every(tokens: u64, period: Duration) -> PolicyRate {
        PolicyRate {
            rate: Rate::PerPeriod {
                tokens,
                nanos: period.as_nanos(),
            },
        }
    }

    /// A policy of `capacity` tokens refilled at `refill_per_second` tokens per second,
    /// starting full. [`Policy::per_second`]`(r).burst(capacity)` says the same with
    /// each number named.
    ///
    /// # Errors
    ///
    /// [`PolicyError`] for a zero capacity, a rate that is zero, negative, NaN or
    /// infinite, or a combination the packed word cannot represent (the error gives the
    /// valid range).
    pub fn new(capacity: u64, refill_per_second: f64) -> Result<Policy, PolicyError> {
        Policy::builder(capacity, refill_per_second).build()
    }

    /// A policy of `capacity` tokens refilled by exactly `tokens` every `period` (for
    /// example 100 per minute), computed in integers with no float rounding.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokengate::Policy;
    ///
    /// let policy = Policy::per(100, 100, Duration::from_secs(60))?;
    /// assert!(policy.effective_refill_per_second() <= 100.0 / 60.0);
    /// # Ok::<(), tokengate::PolicyError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Policy::new`], and [`PolicyError::ZeroPeriod`].
    pub fn per(capacity: u64, tokens: u64, period: Duration) -> Result<Policy, PolicyError> {
        if period.is_zero() {
            return Err(PolicyError::ZeroPeriod);
        }
        if tokens == 0 {
            return Err(PolicyError::RateNotPositive(0.0));
        }
        PolicyBuilder {
            capacity,
            rate: Rate::PerPeriod {
                tokens,
                nanos: period.as_nanos(),
            },
            start: Start::Full,
            max_reservation: Duration::ZERO,
        }
        .build()
    }

    /// A builder for a policy with options (start empty, reservations).
    pub fn builder(capacity: u64, refill_per_second: f64) -> PolicyBuilder {
        PolicyBuilder {
            capacity,
            rate: Rate::PerSecond(refill_per_second),
            start: Start::Full,
            max_reservation: Duration::ZERO,
        }
    }

    /// The same policy, starting empty: nothing is admitted at creation or after a reset
    /// until tokens have refilled.
    ///
    /// ```
    /// use tokengate::{Policy, Start};
    /// let policy = Policy::new(10, 1.0)?.start_empty();
    /// assert_eq!(policy.start(), Start::Empty);
    /// # Ok::<(), tokengate::PolicyError>(())
    /// ```
    pub fn start_empty(mut self) -> Policy {
        self.start = Start::Empty;
        self
    }

    /// Capacity `B` in whole tokens: the largest burst.
    pub fn capacity(&self) -> u64 {
        self.layout.capacity()
    }

    /// The refill rate as configured, in tokens per second.
    pub fn refill_per_second(&self) -> f64 {
        self.rate.per_second()
    }

    /// The rate the layout implements exactly, in tokens per second; never above the
    /// configured rate.
    pub fn effective_refill_per_second(&self) -> f64 {
        self.layout.effective_refill_per_second()
    }

    /// `1 - effective / configured`: the relative amount by which the effective rate is
    /// below the configured one (at most 0.1%, usually below 0.01%).
    pub fn rate_error(&self) -> f64 {
        let shift = self.layout.tick_shift() + self.layout.frac_bits();
        let exact = self.rate.units_per_tick_f64(shift);
        (1.0 - self.layout.refill_per_tick() as f64 / exact).max(0.0)
    }

    /// The configured rate as an exact fraction `(numerator, denominator)` of tokens per
    /// nanosecond (the `f64` given to [`Policy::new`] is exactly `m * 2^e`), or `None` for
    /// rates so extreme that the fraction does not fit in `u128`s. Reference models use it
    /// to check that the engine never admits more than an ideal bucket at this rate.
    ///
    /// ```
    /// use tokengate::Policy;
    /// let policy = Policy::new(10, 0.5)?;
    /// assert_eq!(policy.exact_rate_per_nanosecond(), Some((1, 2_000_000_000)));
    /// # Ok::<(), tokengate::PolicyError>(())
    /// ```
    pub fn exact_rate_per_nanosecond(&self) -> Option<(u128, u128)> {
        let (num, den) = self.rate.per_nanosecond()?;
        let g = gcd(num, den);
        Some((num / g, den / g))
    }

    /// How a new or reset bucket starts.
    pub fn start(&self) -> Start {
        self.start
    }

    /// Whether a new or reset bucket starts full.
    pub fn starts_full(&self) -> bool {
        self.start == Start::Full
    }

    /// How far ahead the bucket may be reserved (zero: no reservations into the future).
    pub fn max_reservation(&self) -> Duration {
        self.max_reservation
    }

    /// The tick length: refill arrives at tick edges of the clock.
    pub fn tick(&self) -> Duration {
        self.layout.tick()
    }

    /// When the tick field wraps; see [`Layout::wrap_period`].
    pub fn wrap_period(&self) -> Duration {
        self.layout.wrap_period()
    }

    /// The fixed-point layout: bit widths, tick shift, refill per tick.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
}

impl fmt::Display for Policy {
    /// `capacity=100 refill_per_second=20 start=full`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let start = match self.start {
            Start::Full => "full",
            Start::Empty => "empty",
        };
        write!(
            f,
            "capacity={} refill_per_second={} start={start}",
            self.capacity(),
            self.refill_per_second()
        )
    }
}

/// A candidate layout and how good it is.
struct Candidate {
    layout: Layout,
    error: f64,
    wrap_bits: u32,
}

impl Candidate {
    /// Lexicographic score: an acceptable wrap; the wrap up to about 2.3 years (a bucket
    /// must not misread its idle time for anything shorter); a rate within the target
    /// error; a tick no longer than preferred; among preferred ticks the longest wrap up
    /// to the target; then the shortest tick; then the smallest error.
    fn better_than(&self, other: &Candidate, preferred_shift: u32) -> bool {
        let key = |c: &Candidate| {
            let preferred = c.layout.tick_shift() <= preferred_shift;
            (
                c.wrap_bits >= MIN_WRAP_BITS,
                c.wrap_bits.min(LONG_WRAP_BITS),
                c.error <= TARGET_RATE_ERROR,
                preferred,
                if preferred {
                    c.wrap_bits.min(TARGET_WRAP_BITS)
                } else {
                    0
                },
                std::cmp::Reverse(c.layout.tick_shift()),
            )
        };
        match key(self).cmp(&key(other)) {
            std::cmp::Ordering::Equal => self.error < other.error,
            ordering => ordering.is_gt(),
        }
    }
}

/// `floor(log2(nanos))`, clamped to the tick shifts a layout may use.
fn shift_at_most(nanos: f64) -> u32 {
    if nanos < 2.0 {
        0
    } else {
        (nanos.log2().floor() as u32).min(MAX_TICK_SHIFT)
    }
}

/// The tick shifts to consider: `(preferred, max)`. A tick is never longer than 1/16 of
/// the time the bucket takes to fill; it is preferably no longer than ~1 ms, or 1/16 of
/// a token's time when that is longer.
pub(crate) fn tick_shifts(capacity: u64, rate: &Rate) -> (u32, u32) {
    let r = rate.per_second();
    let max = shift_at_most(capacity as f64 / r * 1e9 / 16.0);
    let coarse = (1u64 << COARSE_TICK_SHIFT) as f64;
    let preferred = shift_at_most((1e9 / r / 16.0).max(coarse));
    (preferred.min(max), max)
}

/// The layout at tick shift `s` and fraction bits `f`, if the word holds it and the rate
/// error is acceptable.
fn candidate(capacity: u64, rate: &Rate, horizon_ns: u128, s: u32, f: u32) -> Option<Candidate> {
    let r = rate.units_per_tick(s + f).filter(|&r| r > 0)?;
    let ticks = horizon_ns.div_ceil(1u128 << s);
    let base = u64::try_from(ticks.checked_mul(u128::from(r))?).ok()?;
    let layout = Layout::new(capacity, s, f, r, base).ok()?;
    let error = 1.0 - r as f64 / rate.units_per_tick_f64(s + f);
    (error <= MAX_RATE_ERROR && layout.wraps_comfortably()).then(|| Candidate {
        layout,
        error,
        wrap_bits: (layout.tick_bits() + s).min(64),
    })
}

/// Searches every tick shift and fraction width for the best layout; `None` when no
/// layout is acceptable.
fn search(capacity: u64, rate: &Rate, horizon_ns: u128) -> Option<Layout> {
    let mut best: Option<Candidate> = None;
    let (preferred, max) = tick_shifts(capacity, rate);
    // Only layouts that wrap after at least 2^MIN_WRAP_BITS ns can win: the token field
    // (at least the capacity's bits plus F) leaves the tick field T bits with T + S >= MIN.
    let capacity_bits = u64::BITS - capacity.leading_zeros();
    for s in 0..=max {
        let Some(f_max) = (64 + s).checked_sub(MIN_WRAP_BITS + capacity_bits) else {
            continue;
        };
        for f in 0..=f_max.min(62) {
            let Some(c) = candidate(capacity, rate, horizon_ns, s, f) else {
                continue;
            };
            if best.as_ref().is_none_or(|b| c.better_than(b, preferred)) {
                best = Some(c);
            }
        }
    }
    let best = best.filter(|b| b.wrap_bits >= MIN_WRAP_BITS)?;
    // Spend wrap bits beyond the target on precision.
    let floor = best.wrap_bits.min(TARGET_WRAP_BITS);
    let s = best.layout.tick_shift();
    let mut layout = best.layout;
    for f in best.layout.frac_bits() + 1..=62 {
        match candidate(capacity, rate, horizon_ns, s, f) {
            Some(c) if c.wrap_bits >= floor && c.error <= best.error => layout = c.layout,
            _ => break,
        }
    }
    Some(layout)
}

/// Explains why no layout exists, with representable values to use instead.
///
/// The values the word represents need not form one interval (an exact rate such as
/// 1e9/s can fit where slightly lower ones do not), so the diagnosis searches outward
/// from the value given: representable rates below and above it, and the largest
/// representable capacity below it, each a value [`search`] accepts.
fn diagnose(capacity: u64, rate: &Rate, horizon: Duration) -> PolicyError {
    let horizon_ns = horizon.as_nanos();
    let r = rate.per_second();
    if !horizon.is_zero() && search(capacity, rate, 0).is_some() {
        // Largest representable horizon, by bisection on nanoseconds.
        let (mut lo, mut hi) = (0u128, horizon_ns);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if search(capacity, rate, mid).is_some() {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        return PolicyError::ReservationTooLong {
            max_reservation: horizon,
            max: Duration::from_nanos(u64::try_from(lo).unwrap_or(u64::MAX)),
        };
    }
    let fits_rate = |x: f64| search(capacity, &Rate::PerSecond(x), horizon_ns).is_some();
    let below = nearest_rate(r, 0.5, &fits_rate);
    let above = nearest_rate(r, 2.0, &fits_rate);
    let near = |x: Option<f64>| x.is_some_and(|x| (x / r).max(r / x) <= 4.0);
    if !near(below) && !near(above) {
        // No rate close to the one asked for fits this capacity: the capacity is what
        // does not fit, if a smaller one does at this rate.
        if let Some(max) = largest_capacity(capacity, |b| search(b, rate, horizon_ns).is_some()) {
            return PolicyError::CapacityTooLarge {
                capacity,
                refill_per_second: r,
                max,
            };
        }
    }
    match (below, above) {
        (Some(max), None) => PolicyError::RateTooLarge {
            refill_per_second: r,
            capacity,
            max,
        },
        (None, Some(min)) => PolicyError::RateTooSmall {
            refill_per_second: r,
            capacity,
            min,
        },
        (Some(below), Some(above)) => PolicyError::RateNotRepresentable {
            refill_per_second: r,
            capacity,
            below,
            above,
        },
        (None, None) => PolicyError::NotRepresentable {
            capacity,
            refill_per_second: r,
        },
    }
}

/// The representable rate nearest to `r` in the direction of `step` (0.5: below, 2: above):
/// the first power-of-two step that fits, then a bisection in log space towards `r`.
fn nearest_rate(r: f64, step: f64, fits: &impl Fn(f64) -> bool) -> Option<f64> {
    // No layout represents rates outside 1e-20..1e20 tokens/s: start the walk there.
    let (low, high) = (1e-20, 1e20);
    let mut far = match (step < 1.0, r) {
        (true, r) if r > high => high / step,
        (false, r) if r < low => low / step,
        (true, r) if r <= low => return None,
        (false, r) if r >= high => return None,
        _ => r,
    };
    for _ in 0..80 {
        far *= step;
        if !far.is_finite() || far <= 0.0 {
            return None;
        }
        if fits(far) {
            let (mut good, mut bad) = (far.ln(), r.ln());
            // Within 0.002% of the boundary: enough for a message, and cheap.
            for _ in 0..16 {
                let mid = (good + bad) / 2.0;
                if fits(mid.exp()) {
                    good = mid;
                } else {
                    bad = mid;
                }
            }
            return Some(good.exp());
        }
    }
    None
}

/// A capacity below `capacity` that fits, within 0.1% of the largest: the first halving
/// that fits, then a bisection towards `capacity`.
fn largest_capacity(capacity: u64, fits: impl Fn(u64) -> bool) -> Option<u64> {
    let mut good = capacity;
    loop {
        good /= 2;
        if good == 0 {
            return None;
        }
        if fits(good) {
            break;
        }
    }
    let mut bad = good.saturating_mul(2).min(capacity);
    // To three significant digits: enough for a message, and cheap.
    while bad - good > (good >> 10).max(1) {
        let mid = good + (bad - good) / 2;
        if fits(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Some(good)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decompose_is_exact() {
        for x in [0.5, 1.0, 20.0, 1e9, 1e-9, 0.1, 1234.5678, f64::MIN_POSITIVE] {
            let (m, e) = decompose(x);
            // Scale in two steps: 2^-1074 alone underflows in `powi`.
            assert_eq!(m as f64 * 2f64.powi(e / 2) * 2f64.powi(e - e / 2), x);
        }
    }

    #[test]
    fn refill_per_tick_rounds_down_exactly() {
        // 0.1 is slightly above 1/10 in binary; floor must follow the f64 exactly.
        let rate = Rate::PerSecond(0.1);
        for shift in 0..80 {
            if let Some(r) = rate.units_per_tick(shift) {
                let exact = rate.units_per_tick_f64(shift);
                assert!(r as f64 <= exact, "shift {shift}: {r} > {exact}");
                assert!(r as f64 > exact - 1.0 - exact * 1e-15, "shift {shift}");
            }
        }
    }

    #[test]
    fn large_bursts_get_a_layout_that_wraps_late_enough() {
        // Each has a layout meeting every bound (10 000 at 1/s: 1 ms ticks, F = 20, 0.05%
        // error, wrap 2^50 ns); a search that kept only the most precise layout per tick
        // shift refused them ("at most 8191", "at most 15").
        for (capacity, rate) in [(10_000, 1.0), (166, 3.173e9)] {
            let p = Policy::new(capacity, rate).unwrap();
            assert!(p.rate_error() <= MAX_RATE_ERROR, "{p:?}");
            assert!(p.wrap_period().as_nanos() >= 1 << MIN_WRAP_BITS, "{p:?}");
            assert!(p.effective_refill_per_second() <= rate);
        }
    }

    #[test]
    fn effective_rate_is_never_rounded_above_the_configured_one() {
        // R = 154357064805831985 per 1 ns tick is below the rate exactly, but rounding R
        // to f64 first and then multiplying gave a value one ulp above it.
        let r = 1.5435706480583199e26;
        let p = Policy::builder(1844, r)
            .start(Start::Empty)
            .build()
            .unwrap();
        assert_eq!(p.layout().refill_per_tick(), 154_357_064_805_831_985);
        assert!(p.effective_refill_per_second() <= r);
    }

    #[test]
    fn typical_policies_meet_the_targets() {
        for (b, r) in [
            (100, 20.0),
            (60, 10.0),
            (1, 1.0),
            (10, 0.5),
            (1_000_000, 1e9),
            (100, 1000.0),
            (1, 1e-6),
            (1_000_000_000, 1e9),
        ] {
            let p = Policy::new(b, r).unwrap();
            assert!(p.rate_error() <= TARGET_RATE_ERROR, "{b} {r}: {p:?}");
            assert!(p.effective_refill_per_second() <= r);
            let wrap = p.wrap_period().as_nanos();
            assert!(wrap >= 1 << MIN_WRAP_BITS, "{b} {r}: {p:?}");
            let fill = Duration::from_secs_f64(b as f64 / r);
            assert!(p.tick() <= fill / 16 || p.tick() == Duration::from_nanos(1));
        }
    }
}
