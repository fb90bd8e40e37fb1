//! One bucket driven by a sequence of operations on a manual clock, checked against the
//! reference models after every step.
//!
//! The same [`check`] runs from the property tests (`tests/bucket_model.rs`), the fuzz
//! target `rounding`, and the corpus replay in `cargo test`.

use std::fmt;
use std::time::Duration;

use crate::{Ideal, Model, Outcome};
use std::sync::Arc;
use tokengate::policy::MIN_WRAP_BITS;
use tokengate::state::Layout;

use tokengate::clock::Monotonic;
use tokengate::{AcquireError, Bucket, Clock, ManualClock, Policy, Start, policy::MAX_RATE_ERROR};

/// A policy as a fuzzer or property test proposes it; it may be invalid.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicySpec {
    /// Capacity in tokens.
    pub capacity: u64,
    /// Refill rate in tokens per second.
    pub refill_per_second: f64,
    /// Start empty instead of full.
    pub start_empty: bool,
    /// Reservation horizon in nanoseconds.
    pub max_reservation_nanos: u64,
}

impl PolicySpec {
    /// Builds the policy, or says why not.
    pub fn build(&self) -> Result<Policy, tokengate::PolicyError> {
        let start = if self.start_empty {
            Start::Empty
        } else {
            Start::Full
        };
        Policy::builder(self.capacity, self.refill_per_second)
            .start(start)
            .max_reservation(Duration::from_nanos(self.max_reservation_nanos))
            .build()
    }
}

/// One operation on the bucket or its clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Moves the clock forward by this many nanoseconds (saturating).
    Advance(u64),
    /// Moves the clock back by this many nanoseconds (saturating at zero): any size, the
    /// bucket reads its clock through a high-water mark and sees time stand still until
    /// the clock passes its highest reading again. Ignored once a step has gone past the
    /// wrap window.
    StepBack(u64),
    /// `try_acquire(cost)`; costs up to one above the capacity are used as given, larger
    /// ones modulo `capacity + 2`, so both admissions and I8 errors occur.
    Acquire(u64),
    /// `refund(cost)`, costs as for `Acquire`.
    Refund(u64),
    /// `reset()`.
    Reset,
    /// `available()`.
    Peek,
}

/// A whole scenario: the clock's start, the policy, the operations.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// The manual clock's time when the bucket is created, in nanoseconds.
    pub start_nanos: u64,
    /// The policy.
    pub policy: PolicySpec,
    /// The operations, in order.
    pub ops: Vec<Op>,
}

/// A broken promise, with the step it broke at.
#[derive(Clone, Debug, PartialEq)]
pub struct Violation {
    /// Index of the operation in [`Scenario::ops`].
    pub step: usize,
    /// What went wrong.
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step {}: {}", self.step, self.what)
    }
}

impl std::error::Error for Violation {}

/// What a scenario exercised, for coverage statistics of sweeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The policy was invalid (and refused with an error, as it must be).
    pub invalid_policy: bool,
    /// Admissions, rejections and errors seen.
    pub admitted: u64,
    /// Rate-limit rejections.
    pub rejected: u64,
    /// Errors (cost above capacity, clock behind).
    pub errors: u64,
    /// Steps at a time the engine's wrapping tick may read differently from the model
    /// (only bounds are checked there).
    pub ambiguous_steps: u64,
}

pub(crate) fn violation(step: usize, what: impl Into<String>) -> Violation {
    Violation {
        step,
        what: what.into(),
    }
}

pub(crate) fn scale_cost(cost: u64, capacity: u64) -> u64 {
    if cost <= capacity.saturating_add(1) {
        cost
    } else {
        cost % capacity.saturating_add(2).max(1)
    }
}

/// Some layout meeting every documented bound of a policy (rate error at most
/// [`MAX_RATE_ERROR`], wrap period at least 2^50 ns, tick no longer than the policy's
/// tick limit, the reservation debt in the word), found by trying every tick shift and
/// fraction width; `None` when none exists, or the rate is not finite and positive.
///
/// The layout search may pick a better one; it may refuse a policy only when this finds
/// none.
pub fn acceptable_layout(spec: &PolicySpec) -> Option<Layout> {
    let r = spec.refill_per_second;
    if spec.capacity == 0 || !r.is_finite() || r <= 0.0 {
        return None;
    }
    let rate = SpecRate(r);
    let horizon = u128::from(spec.max_reservation_nanos);
    for s in 0..=tick_shifts(spec.capacity, &rate).1 {
        for f in 0..=62 {
            let Some(refill) = rate.units_per_tick(s + f) else {
                break;
            };
            if refill == 0 {
                continue;
            }
            let Ok(base) = u64::try_from(horizon.div_ceil(1 << s) * u128::from(refill)) else {
                continue;
            };
            let Ok(layout) = Layout::new(spec.capacity, s, f, refill, base) else {
                continue;
            };
            let error = 1.0 - refill as f64 / rate.units_per_tick_f64(s + f);
            if error <= MAX_RATE_ERROR
                && layout.tick_bits() + s >= MIN_WRAP_BITS
                && wraps_after_fill(&layout)
            {
                return Some(layout);
            }
        }
    }
    None
}

/// The tick field wraps after at least twice the fill time plus the back window, written
/// out from the documented quantities: `2^T >= 2 * ceil(max_units / R) + window`.
fn wraps_after_fill(l: &Layout) -> bool {
    let fill = u128::from(l.max_units()).div_ceil(u128::from(l.refill_per_tick()));
    (1u128 << l.tick_bits()) >= 2 * fill + u128::from(l.back_window_ticks())
}

/// The bounds the policy docs promise for a valid policy.
fn check_policy_bounds(spec: &PolicySpec, policy: &Policy) -> Result<(), Violation> {
    let l = policy.layout();
    let rate = SpecRate(spec.refill_per_second);
    let bounds = [
        (
            policy.rate_error() <= MAX_RATE_ERROR,
            "rate error above MAX_RATE_ERROR",
        ),
        (
            policy.effective_refill_per_second() <= spec.refill_per_second,
            "effective rate above the configured one",
        ),
        (
            l.tick_bits() + l.tick_shift() >= MIN_WRAP_BITS,
            "wrap period shorter than 2^50 ns",
        ),
        (
            wraps_after_fill(l),
            "wrap period shorter than twice the fill time plus the back window",
        ),
        (
            l.tick_shift() <= tick_shifts(spec.capacity, &rate).1,
            "tick longer than the policy's tick limit",
        ),
        (
            u128::from(l.base_units())
                >= u128::from(spec.max_reservation_nanos).div_ceil(1 << l.tick_shift())
                    * u128::from(l.refill_per_tick()),
            "reservation debt below max_reservation's",
        ),
    ];
    match bounds.iter().find(|(ok, _)| !ok) {
        Some((_, what)) => Err(violation(0, format!("{what}: {policy:?}"))),
        None => Ok(()),
    }
}

/// Runs `scenario` on a real [`Bucket`] with a [`ManualClock`] and checks:
///
/// - an invalid policy is refused with a non-empty error, and only when no
///   [`acceptable_layout`] exists; a valid one meets the documented bounds (rate error,
///   effective rate not above the configured one, wrap period, tick limit, reservation);
///
/// and after every operation:
///
/// - until a step goes past the wrap window ([`Model::is_ambiguous`]): every
///   decision, balance, retry-after and error equals the grid-exact [`Model`] at the
///   effective rate;
/// - always: every admission could have been paid by the [`Ideal`] bucket at the
///   configured rate, the balance never exceeds the capacity (I1) nor the ideal's, and a
///   rejection or error wrote nothing (I5);
///
/// # Errors
///
/// The first [`Violation`] found. A panic inside the engine propagates (fuzzers treat it
/// as a crash).
pub fn check(scenario: &Scenario) -> Result<Report, Violation> {
    let mut report = Report::default();
    let policy = match scenario.policy.build() {
        Ok(policy) => policy,
        Err(e) => {
            if e.to_string().is_empty() {
                return Err(violation(0, "policy error with an empty message"));
            }
            if let Some(layout) = acceptable_layout(&scenario.policy) {
                return Err(violation(
                    0,
                    format!("policy refused ({e}) although {layout:?} meets every bound"),
                ));
            }
            report.invalid_policy = true;
            return Ok(report);
        }
    };
    check_policy_bounds(&scenario.policy, &policy)?;
    let layout = *policy.layout();
    let capacity = policy.capacity();
    let manual = ManualClock::new();
    manual.set(Duration::from_nanos(scenario.start_nanos));
    // The harness reads the time as the bucket does: through one shared high-water mark
    // (the bucket's own guard is then a no-op), so the references see the same time.
    let clock = Arc::new(Monotonic::new(manual.clone()));
    let bucket = Bucket::with_clock(policy, Arc::clone(&clock));
    let mut model = Model::new(&policy, scenario.start_nanos);
    let mut ideal = Ideal::new(&policy, scenario.start_nanos);
    let max_units = i128::from(layout.max_units() - layout.base_units());
    let mut exact = true;

    for (step, op) in scenario.ops.iter().enumerate() {
        let now = clock.now_nanos();
        let before = bucket.stored_word();
        // From the first step whose time the engine's wrapping tick may read differently
        // from the model's absolute one, only the bounds (ideal bucket, I1, I5) are checked.
        let is_bucket_op = !matches!(op, Op::Advance(_) | Op::StepBack(_));
        exact &= !(is_bucket_op && model.is_ambiguous(now));
        let ambiguous = !exact;
        match *op {
            Op::Advance(d) => manual.advance(Duration::from_nanos(d)),
            // After the engine has misread a wrapped idle time, its stored tick may stand
            // for a time long past: the exact comparison stops there.
            Op::StepBack(_) if !exact => {}
            Op::StepBack(d) => {
                let raw = manual.now_nanos();
                manual.set(Duration::from_nanos(raw.saturating_sub(d)));
            }
            Op::Acquire(c) => {
                let cost = scale_cost(c, capacity);
                if exact && cost > 0 && cost <= capacity && model.reanchors(now) {
                    if let Some(ideal) = ideal.as_mut() {
                        ideal.reanchor_full(now);
                    }
                }
                let got = bucket.try_acquire(cost);
                let admitted = got.is_ok_and(|d| d.is_admitted());
                match &got {
                    Ok(d) if d.is_admitted() => report.admitted += 1,
                    Ok(_) => report.rejected += 1,
                    Err(_) => report.errors += 1,
                }
                if admitted && cost > 0 {
                    if let Some(ideal) = ideal.as_mut() {
                        if !ideal.take(cost, now) {
                            return Err(violation(
                                step,
                                format!(
                                    "admitted cost {cost} beyond the ideal bucket at the \
                                     configured rate ({got:?})"
                                ),
                            ));
                        }
                    }
                }
                if !(admitted && cost > 0) && bucket.stored_word() != before {
                    return Err(violation(step, "a rejection or error wrote the word (I5)"));
                }
                if exact {
                    let expected = model.try_acquire(cost, now);
                    let actual = match got {
                        Ok(d) if d.is_admitted() => Outcome::Admitted {
                            balance: i128::from(d.balance_units()),
                        },
                        Ok(d) => Outcome::Rejected {
                            balance: i128::from(d.balance_units()),
                            retry_after: d.retry_after().unwrap_or(Duration::MAX),
                        },
                        Err(AcquireError::CostExceedsCapacity { .. }) => {
                            Outcome::CostExceedsCapacity
                        }
                        Err(AcquireError::ClockWentBackwards { .. }) => Outcome::ClockWentBackwards,
                        Err(_) => Outcome::OtherError,
                    };
                    if actual != expected {
                        return Err(violation(
                            step,
                            format!("acquire({cost}): engine {actual:?}, model {expected:?}"),
                        ));
                    }
                }
            }
            Op::Refund(c) => {
                let cost = scale_cost(c, capacity);
                let got = bucket.refund(cost);
                if cost > capacity {
                    if got.is_ok() || bucket.stored_word() != before {
                        return Err(violation(step, "refund above capacity not refused cleanly"));
                    }
                } else {
                    if got.is_err() {
                        return Err(violation(step, format!("refund({cost}) failed: {got:?}")));
                    }
                    if !ambiguous {
                        model.refund(cost, now);
                    }
                    // The ideal updates exactly when the engine writes.
                    if let Some(ideal) = ideal.as_mut().filter(|_| cost > 0) {
                        ideal.refund(cost, now);
                    }
                }
            }
            Op::Reset => {
                bucket.reset();
                if !ambiguous {
                    model.reset(now);
                }
                if let Some(ideal) = ideal.as_mut() {
                    ideal.reset(now);
                }
            }
            Op::Peek => {
                let available = bucket.available();
                if bucket.stored_word() != before {
                    return Err(violation(step, "available() wrote the word"));
                }
                if !ambiguous && available != model.available(now) {
                    return Err(violation(
                        step,
                        format!(
                            "available(): engine {available}, model {}",
                            model.available(now)
                        ),
                    ));
                }
            }
        }

        // Bounds that hold whatever happened before.
        let word = bucket.stored_word();
        let Some((_, units)) = layout.decode(word) else {
            return Err(violation(step, "the word decodes to more than max_units"));
        };
        let balance = i128::from(units) - i128::from(layout.base_units());
        if balance > max_units {
            return Err(violation(step, "balance above capacity (I1)"));
        }
        if ambiguous && is_bucket_op {
            report.ambiguous_steps += 1;
        }
        // The ideal bucket sees the clock only when the engine does, at bucket operations.
        if let Some(ideal) = ideal.as_ref().filter(|_| is_bucket_op) {
            if !ideal.covers_units(balance, layout.frac_bits(), now) {
                return Err(violation(
                    step,
                    format!("stored balance {balance} units above the ideal bucket's"),
                ));
            }
        }
    }
    Ok(report)
}

/// A rate in tokens per second, with the layout search's rounding written out
/// independently of the engine: `floor(r * 2^shift / 1e9)` units per tick, exactly.
#[derive(Clone, Copy, Debug)]
struct SpecRate(f64);

impl SpecRate {
    /// `floor(r * 2^shift / 1e9)`, exact (from the bits of `r`); `None` above `u64`.
    fn units_per_tick(&self, shift: u32) -> Option<u64> {
        let bits = self.0.to_bits();
        let exp = ((bits >> 52) & 0x7ff) as i32;
        let frac = bits & ((1 << 52) - 1);
        let (m, e) = if exp == 0 {
            (frac, -1074)
        } else {
            (frac | (1 << 52), exp - 1075)
        };
        let k = e + shift as i32;
        let exact = if k >= 0 {
            if k > 127 - 53 {
                return None;
            }
            (u128::from(m) << k) / 1_000_000_000
        } else if k <= -128 {
            0
        } else {
            (u128::from(m) / 1_000_000_000) >> (-k)
        };
        u64::try_from(exact).ok()
    }

    /// `r * 2^shift / 1e9` in floating point.
    fn units_per_tick_f64(&self, shift: u32) -> f64 {
        self.0 * 2f64.powi(shift as i32) / 1e9
    }
}

/// The policy's tick limits `(preferred, max)` as the policy docs state them: a tick is
/// never longer than 1/16 of the time the bucket takes to fill; preferably no longer
/// than ~1 ms, or 1/16 of a token's time when that is longer. Shifts are capped at
/// [`MAX_TICK_SHIFT`](tokengate::state::MAX_TICK_SHIFT).
fn tick_shifts(capacity: u64, rate: &SpecRate) -> (u32, u32) {
    fn shift_at_most(nanos: f64) -> u32 {
        if nanos < 2.0 {
            0
        } else {
            (nanos.log2().floor() as u32).min(tokengate::state::MAX_TICK_SHIFT)
        }
    }
    let r = rate.0;
    let max = shift_at_most(capacity as f64 / r * 1e9 / 16.0);
    let preferred = shift_at_most((1e9 / r / 16.0).max((1u64 << 20) as f64));
    (preferred.min(max), max)
}
