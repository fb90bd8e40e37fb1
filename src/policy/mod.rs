//! Validated configuration: capacity, refill rate, start state, and the fixed-point
//! layout derived from them once.
//!
//! [`Policy`] and its builder here; the rate as given in `rate.rs`, the layout search in
//! `search.rs`, [`PolicyError`] in `error.rs`.

mod error;
mod rate;
mod search;

use std::fmt;
use std::time::Duration;

pub use error::PolicyError;
use rate::{Rate, gcd};
use search::{diagnose, search};

use crate::state::Layout;

/// Rate error the layout search aims for: the effective rate is within 0.01% of the
/// configured one whenever the word allows it.
pub const TARGET_RATE_ERROR: f64 = 1e-4;

/// The largest rate error a policy accepts (0.1%); beyond it the rate is reported as not
/// representable for this capacity.
pub const MAX_RATE_ERROR: f64 = 1e-3;

/// log2 of the shortest wrap period a policy accepts (2^50 ns, about 13 days).
pub const MIN_WRAP_BITS: u32 = 50;

/// How a new or reset bucket starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Start {
    /// Full: an immediate burst of `capacity` tokens is allowed (the default).
    #[default]
    Full,
    /// Empty: nothing is admitted until tokens have refilled.
    Empty,
}

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

#[cfg(test)]
mod tests {
    use super::rate::decompose;
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
