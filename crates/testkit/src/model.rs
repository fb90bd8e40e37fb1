//! Exact reference models of one bucket.

use std::time::Duration;

use tokengate::Policy;

/// What a reference model decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The cost was taken; the balance left, in units.
    Admitted {
        /// Balance after the admission, in units.
        balance: i128,
    },
    /// Nothing was taken.
    Rejected {
        /// Balance at the decision, in units.
        balance: i128,
        /// Time until the cost is there, exact on the tick grid.
        retry_after: Duration,
    },
    /// The cost is above the capacity.
    CostExceedsCapacity,
    /// The clock read behind the model's time by more than the race tolerance.
    ClockWentBackwards,
    /// An error the model never gives (the engine's error enum is non-exhaustive): always
    /// a mismatch.
    OtherError,
}

/// The engine's documented semantics at its effective rate, on an absolute (never
/// wrapping) tick grid, in `u128` arithmetic.
///
/// Where no operation looks at a time more than the back window away from the model's
/// last update (see [`Model::is_ambiguous`]), the engine must decide exactly as this
/// model does.
#[derive(Clone, Debug)]
pub struct Model {
    capacity: u64,
    frac_bits: u32,
    tick_shift: u32,
    refill: u128,
    base: u128,
    max: u128,
    tolerance: u128,
    window: u128,
    half_wrap: u128,
    full_start: bool,
    /// Units at or below which a write keeps its tick: `max - R - 1`.
    near_full: u128,
    units: u128,
    tick: u128,
    /// The highest reading seen: the engine reads clocks through a high-water mark.
    high: std::cell::Cell<u64>,
}

impl Model {
    /// A model of a bucket created with `policy` at `now_nanos`.
    pub fn new(policy: &Policy, now_nanos: u64) -> Model {
        let l = policy.layout();
        let mut model = Model {
            capacity: l.capacity(),
            frac_bits: l.frac_bits(),
            tick_shift: l.tick_shift(),
            refill: u128::from(l.refill_per_tick()),
            base: u128::from(l.base_units()),
            max: u128::from(l.max_units()),
            tolerance: u128::from(l.tolerance_ticks()),
            window: u128::from(l.back_window_ticks()),
            half_wrap: 1u128 << (l.tick_bits() - 1),
            full_start: policy.starts_full(),
            near_full: u128::from(l.max_units())
                .saturating_sub(u128::from(l.refill_per_tick()) + 1),
            units: 0,
            tick: 0,
            high: std::cell::Cell::new(0),
        };
        model.reset_at(now_nanos);
        model
    }

    fn tick_of(&self, now_nanos: u64) -> u128 {
        u128::from(now_nanos >> self.tick_shift)
    }

    /// A clock reading as the engine sees it: through its high-water mark.
    fn observe(&self, now_nanos: u64) -> u64 {
        let now = self.high.get().max(now_nanos);
        self.high.set(now);
        now
    }

    /// The tick a write from a state at `tick` (read `behind` the model's time) leaving
    /// `after` units stores: the next tick edge when the balance before or after is
    /// within one tick's refill of full and the reading is not behind.
    fn anchor(&self, before: u128, after: u128, tick: u128, behind: u128) -> u128 {
        if behind == 0 && before.max(after) > self.near_full {
            tick + 1
        } else {
            tick
        }
    }

    /// Whether the engine, whose tick field wraps, could read `now_nanos` differently
    /// from this model: the distance to the model's last update is at least the back
    /// window (forward) or beyond it (behind).
    pub fn is_ambiguous(&self, now_nanos: u64) -> bool {
        let now = self.tick_of(self.high.get().max(now_nanos));
        if now >= self.tick {
            now - self.tick >= self.half_wrap * 2 - self.window
        } else {
            self.tick - now > self.window
        }
    }

    /// The state at `now` (already observed): `(units, tick, behind)`. A reading behind
    /// by more than the race tolerance can only be an idle past the wrap (readings are
    /// monotonic): the bucket is full, re-anchored at the next edge.
    fn refilled(&self, now_nanos: u64) -> (u128, u128, u128) {
        let now = self.tick_of(now_nanos);
        if now >= self.tick {
            let units = (self.units + (now - self.tick) * self.refill).min(self.max);
            (units, now, 0)
        } else if self.tick - now > self.tolerance {
            (self.max, now + 1, 0)
        } else {
            (self.units, self.tick, self.tick - now)
        }
    }

    fn balance(&self, units: u128) -> i128 {
        units as i128 - self.base as i128
    }

    fn wait(&self, units: u128, cost_units: u128, behind: u128, now_nanos: u64) -> Duration {
        let needed = (self.base + cost_units).saturating_sub(units);
        let ticks = needed.div_ceil(self.refill);
        let into = u128::from(now_nanos) & ((1u128 << self.tick_shift) - 1);
        let nanos = ((ticks + behind) << self.tick_shift) - into;
        duration_from_nanos(nanos)
    }

    /// `try_acquire(cost)` at `now_nanos`.
    pub fn try_acquire(&mut self, cost: u64, now_nanos: u64) -> Outcome {
        if cost > self.capacity {
            return Outcome::CostExceedsCapacity;
        }
        let now_nanos = self.observe(now_nanos);
        let (units, tick, behind) = self.refilled(now_nanos);
        if cost == 0 {
            return Outcome::Admitted {
                balance: self.balance(units),
            };
        }
        let cost_units = u128::from(cost) << self.frac_bits;
        if units >= self.base + cost_units {
            self.tick = self.anchor(units, units - cost_units, tick, behind);
            self.units = units - cost_units;
            Outcome::Admitted {
                balance: self.balance(units - cost_units),
            }
        } else {
            Outcome::Rejected {
                balance: self.balance(units),
                retry_after: self.wait(units, cost_units, behind, now_nanos),
            }
        }
    }

    /// Whether a reading at `now_nanos` finds the model's time far behind it: the engine
    /// then reads an idle past its wrap and re-anchors the bucket full. Readings pass a
    /// high-water mark, so this never happens in a history without such an idle.
    pub fn reanchors(&self, now_nanos: u64) -> bool {
        let now = self.tick_of(self.high.get().max(now_nanos));
        now < self.tick && self.tick - now > self.tolerance
    }

    /// `refund(cost)` at `now_nanos`; `false` when the cost is above the capacity.
    pub fn refund(&mut self, cost: u64, now_nanos: u64) -> bool {
        if cost > self.capacity {
            return false;
        }
        if cost == 0 {
            return true;
        }
        let now_nanos = self.observe(now_nanos);
        let (units, tick, behind) = self.refilled(now_nanos);
        let after = (units + (u128::from(cost) << self.frac_bits)).min(self.max);
        self.tick = self.anchor(units, after, tick, behind);
        self.units = after;
        true
    }

    /// Brings the state forward to `now_nanos` without taking or giving anything, as a
    /// take that is then rolled back does: a `now` behind the model's time changes
    /// nothing, except that the take re-anchors a full bucket at a clock that stepped back
    /// (see [`reanchors`](Model::reanchors)).
    pub fn advance(&mut self, now_nanos: u64) {
        let now_nanos = self.observe(now_nanos);
        let (units, tick, behind) = self.refilled(now_nanos);
        self.tick = self.anchor(units, units, tick, behind);
        self.units = units;
    }

    /// `reset()` at `now_nanos`: the start state at `now`, or at the model's tick if
    /// `now` is behind it.
    pub fn reset(&mut self, now_nanos: u64) {
        let now_nanos = self.observe(now_nanos);
        let (_, tick, behind) = self.refilled(now_nanos);
        self.units = if self.full_start { self.max } else { self.base };
        self.tick = if behind == 0 { tick + 1 } else { tick };
    }

    fn reset_at(&mut self, now_nanos: u64) {
        let now_nanos = self.observe(now_nanos);
        self.units = if self.full_start { self.max } else { self.base };
        self.tick = self.tick_of(now_nanos) + 1;
    }

    /// The balance at `now_nanos` in units, as `available()` sees it.
    pub fn balance_units(&self, now_nanos: u64) -> i128 {
        let now_nanos = self.observe(now_nanos);
        self.balance(self.refilled(now_nanos).0)
    }

    /// Time from `now_nanos` until `cost` tokens (at most the capacity) are there, zero
    /// when they are: what a rejection's `retry_after` and the waits of
    /// `acquire_all` report.
    pub fn wait_for(&self, cost: u64, now_nanos: u64) -> Duration {
        let now_nanos = self.observe(now_nanos);
        let (units, _, behind) = self.refilled(now_nanos);
        let cost_units = u128::from(cost) << self.frac_bits;
        if units >= self.base + cost_units {
            Duration::ZERO
        } else {
            self.wait(units, cost_units, behind, now_nanos)
        }
    }

    /// Tokens available at `now_nanos`, as `available()` reports them.
    pub fn available(&self, now_nanos: u64) -> f64 {
        self.balance_units(now_nanos) as f64 / (1u128 << self.frac_bits) as f64
    }
}

/// An ideal token bucket at the *configured* rate, in exact rational arithmetic, on real
/// times (every nanosecond, not the tick grid): the bound the engine must never exceed.
///
/// It refills continuously: at any time `t` it holds `min(B, balance + r * (t - last))`,
/// and a time behind its last update gives it nothing (a clock that steps back is time
/// standing still, as the engine's high-water mark makes it). Admitting only what this
/// bucket could pay is exactly the curve `admitted in [s, e] <= B + r * (e - s)`; any
/// excess is credit the engine created, whether from the tick grid or the rounding.
/// Every admission of the engine is replayed on it with [`Ideal::take`], which fails if
/// the ideal bucket could not have paid.
#[derive(Clone, Debug)]
pub struct Ideal {
    /// Tokens per nanosecond as `num / den`.
    num: u128,
    den: u128,
    capacity: u128,
    full_start: bool,
    /// Balance in tokens times `den`.
    scaled: u128,
    /// Latest time seen, in nanoseconds.
    time: u128,
}

impl Ideal {
    /// An ideal bucket for `policy` created at `now_nanos`; `None` when the policy's rate
    /// does not fit the model's `u128` arithmetic.
    pub fn new(policy: &Policy, now_nanos: u64) -> Option<Ideal> {
        let (num, den) = policy.exact_rate_per_nanosecond()?;
        let capacity = u128::from(policy.capacity()).checked_mul(den)?;
        // Refill over the whole u64 time range must fit too.
        num.checked_mul(u128::from(u64::MAX))?;
        let mut ideal = Ideal {
            num,
            den,
            capacity,
            full_start: policy.starts_full(),
            scaled: 0,
            time: 0,
        };
        ideal.reset(now_nanos);
        Some(ideal)
    }

    /// An ideal bucket for `policy` holding `units / 2^frac_bits` tokens (at least zero,
    /// at most the capacity) at `now_nanos`: the state a reconfiguration leaves. Rounded
    /// up to the model's resolution (`1 / den` tokens), so it never holds less than the
    /// engine; `None` as for [`new`](Ideal::new).
    pub fn with_balance(
        policy: &Policy,
        now_nanos: u64,
        units: i128,
        frac_bits: u32,
    ) -> Option<Ideal> {
        let mut ideal = Ideal::new(policy, now_nanos)?;
        let units = u128::try_from(units.max(0)).ok()?;
        let scaled = units.checked_mul(ideal.den)?.div_ceil(1u128 << frac_bits);
        ideal.scaled = scaled.min(ideal.capacity);
        Some(ideal)
    }

    /// The balance at `now_nanos` and the time it is at, without updating.
    fn refilled(&self, now_nanos: u64) -> (u128, u128) {
        let now = u128::from(now_nanos);
        if now > self.time {
            let added = (now - self.time) * self.num;
            (self.scaled.saturating_add(added).min(self.capacity), now)
        } else {
            (self.scaled, self.time)
        }
    }

    /// Brings the state forward to `now_nanos`, refill only. Call it exactly when the
    /// engine writes the bucket's word at `now_nanos` without a net take or refund (a
    /// rolled back multi-bucket acquisition): the ideal must see time when the engine
    /// does, no earlier (after a clock step back it would miss refill the engine gets)
    /// and no later.
    pub fn advance(&mut self, now_nanos: u64) {
        (self.scaled, self.time) = self.refilled(now_nanos);
    }

    /// Tokens the ideal bucket holds at `now_nanos`, times the rate's denominator.
    pub fn scaled_balance(&self, now_nanos: u64) -> u128 {
        self.refilled(now_nanos).0
    }

    /// The rate's denominator: `scaled_balance / den` is the balance in tokens.
    pub fn den(&self) -> u128 {
        self.den
    }

    /// Takes `cost` at `now_nanos`; `false` (taking nothing) when the ideal bucket holds
    /// less than `cost`: an engine that admitted it created credit.
    pub fn take(&mut self, cost: u64, now_nanos: u64) -> bool {
        self.advance(now_nanos);
        let cost = u128::from(cost) * self.den;
        if self.scaled < cost {
            return false;
        }
        self.scaled -= cost;
        true
    }

    /// Follows the engine re-anchoring a bucket found idle past its wrap period: the
    /// ideal bucket, idle that long, is full at `now_nanos`.
    pub fn reanchor_full(&mut self, now_nanos: u64) {
        self.time = self.time.max(u128::from(now_nanos));
        self.scaled = self.capacity;
    }

    /// Gives `cost` back, capped at the capacity.
    pub fn refund(&mut self, cost: u64, now_nanos: u64) {
        self.advance(now_nanos);
        // `cost * den <= capacity * den` fits (checked in `new`); the sum may not.
        self.scaled = self
            .scaled
            .saturating_add(u128::from(cost) * self.den)
            .min(self.capacity);
    }

    /// Back to the start state; the clock restarts at the tick edge of `now` unless it
    /// has already seen a later time.
    pub fn reset(&mut self, now_nanos: u64) {
        self.time = self.time.max(u128::from(now_nanos));
        self.scaled = if self.full_start { self.capacity } else { 0 };
    }

    /// Whether the ideal bucket holds at least `units` at `frac_bits` fixed point.
    pub fn covers_units(&self, units: i128, frac_bits: u32, now_nanos: u64) -> bool {
        if units <= 0 {
            return true;
        }
        // balance_tokens >= units / 2^F, i.e. scaled / den >= units / 2^F.
        let scaled = self.scaled_balance(now_nanos);
        ratio_ge(scaled, self.den, units as u128, 1u128 << frac_bits)
    }
}

/// Exactly `a / b >= c / d` for positive `b` and `d`, without overflow: compare the
/// integer parts, then the reciprocals of the remainders (a continued-fraction walk).
fn ratio_ge(mut a: u128, mut b: u128, mut c: u128, mut d: u128) -> bool {
    let mut flipped = false;
    loop {
        let (qa, qc) = (a / b, c / d);
        if qa != qc {
            return (qa > qc) != flipped;
        }
        let (ra, rc) = (a % b, c % d);
        match (ra == 0, rc == 0) {
            (true, true) => return true,
            // a/b is the integer, c/d is above it.
            (true, false) => return flipped,
            (false, true) => return !flipped,
            (false, false) => {
                // a/b >= c/d  <=>  b/ra <= d/rc
                (a, b, c, d) = (b, ra, d, rc);
                flipped = !flipped;
            }
        }
    }
}

/// `nanos` as a `Duration`, saturating at `Duration::MAX`.
fn duration_from_nanos(nanos: u128) -> Duration {
    match u64::try_from(nanos / 1_000_000_000) {
        Ok(secs) => Duration::new(secs, (nanos % 1_000_000_000) as u32),
        Err(_) => Duration::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::ratio_ge;

    #[test]
    fn ratio_ge_matches_float_comparison_on_small_values() {
        for a in 0..20u128 {
            for b in 1..9u128 {
                for c in 0..20u128 {
                    for d in 1..9u128 {
                        assert_eq!(ratio_ge(a, b, c, d), a * d >= c * b, "{a}/{b} vs {c}/{d}");
                    }
                }
            }
        }
        assert!(ratio_ge(u128::MAX, 1, u128::MAX - 1, 1));
        assert!(!ratio_ge(u128::MAX - 1, u128::MAX, 1, 1));
    }
}
