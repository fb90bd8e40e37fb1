//! The layout search: the tick length and fraction bits that represent a policy best
//! within the word, and the diagnosis of a policy no layout represents.

use std::time::Duration;

use super::rate::Rate;
use super::{MAX_RATE_ERROR, MIN_WRAP_BITS, PolicyError, TARGET_RATE_ERROR};
use crate::state::{Layout, MAX_TICK_SHIFT};

/// log2 of the wrap period, in nanoseconds, the layout search aims for (2^58 ns, about
/// 9.1 years). Longer wraps cost refill precision and buy nothing.
const TARGET_WRAP_BITS: u32 = 58;

/// log2 of the wrap period every policy gets when the word allows it, before precision
/// and tick length are considered (2^56 ns, about 2.3 years).
const LONG_WRAP_BITS: u32 = 56;

/// Ticks need not be shorter than this (2^20 ns, about 1 ms) unless the bucket is small
/// compared with its rate.
const COARSE_TICK_SHIFT: u32 = 20;

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
fn tick_shifts(capacity: u64, rate: &Rate) -> (u32, u32) {
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
pub(super) fn search(capacity: u64, rate: &Rate, horizon_ns: u128) -> Option<Layout> {
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
pub(super) fn diagnose(capacity: u64, rate: &Rate, horizon: Duration) -> PolicyError {
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
