//! The packed word's layout and pure transitions against a `u128` reference.
//!
//! [`check_packing`] builds a [`Layout`] from arbitrary parameters (which must be refused
//! with an error when invalid, never with a panic), then runs every transition of
//! [`state`](tokengate::state) on arbitrary words, ticks and amounts and compares each result
//! with the same arithmetic done in `u128` from the documented formulas. The fuzz target
//! `packing` and the corpus replay in `cargo test` both run it.

use std::time::Duration;

use crate::check::{Violation, violation};
use tokengate::state::{
    BACK_WINDOW_NANOS, Layout, LayoutError, MAX_REFILL_PER_TICK, MAX_TICK_SHIFT, MAX_UNITS,
    TOLERANCE_NANOS,
};

/// The free parameters of [`Layout::new`], as a fuzzer proposes them; they may be invalid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutParams {
    /// Capacity in tokens.
    pub capacity: u64,
    /// `S`: a tick is `2^S` nanoseconds.
    pub tick_shift: u32,
    /// `F`: a token is `2^F` units.
    pub frac_bits: u32,
    /// `R`: units added per tick.
    pub refill_per_tick: u64,
    /// Units of reservation debt below a zero balance.
    pub base_units: u64,
}

impl LayoutParams {
    /// `Layout::new` with these parameters.
    ///
    /// # Errors
    ///
    /// As [`Layout::new`].
    pub fn build(&self) -> Result<Layout, LayoutError> {
        Layout::new(
            self.capacity,
            self.tick_shift,
            self.frac_bits,
            self.refill_per_tick,
            self.base_units,
        )
    }
}

/// The word a probe starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WordSpec {
    /// `encode(tick, units % (max_units + 1))`: a word a bucket could hold.
    Packed {
        /// The tick (taken modulo `2^T` by `encode`).
        tick: u64,
        /// Units, reduced modulo `max_units + 1`.
        units: u64,
    },
    /// Any 64 bits: `decode` must refuse those whose units are above `max_units`.
    Raw(u64),
}

/// A tick, relative to the tick stored in the probe's word (wrapping in `u64`; the layout
/// takes it modulo `2^T`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TickSpec {
    /// This many ticks after the stored one.
    Forward(u64),
    /// This many ticks before the stored one.
    Back(u64),
    /// The last forward reading (`2^T - 1 - back_window_ticks` ahead) plus this offset:
    /// the edge between forward and behind.
    WindowEdge(i8),
    /// The first tick at which the word's balance is full, plus this offset.
    FillEdge(i8),
    /// This tick, absolute.
    Raw(u64),
}

/// An amount of units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnitsSpec {
    /// `tokens % (capacity + 1)` whole tokens, as units.
    Tokens(u64),
    /// Units reduced modulo `max_units + 1`.
    InRange(u64),
    /// Any number of units, however large.
    Raw(u64),
}

/// One word and the arguments every transition is called with on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    /// The stored word.
    pub word: WordSpec,
    /// The reading `refill` brings the word to.
    pub now: TickSpec,
    /// A second reading, relative to `now`'s tick, for refill in two steps (I3).
    pub later: TickSpec,
    /// Cost for `take`, `reserve` and `ticks_until`.
    pub cost: UnitsSpec,
    /// `min_units` of `take_up_to`.
    pub min: UnitsSpec,
    /// `max_units_wanted` of `take_up_to`.
    pub max_wanted: UnitsSpec,
    /// Units given back with `refund`.
    pub refund: UnitsSpec,
    /// `max_wait_ticks` of `reserve`.
    pub max_wait_ticks: u64,
}

/// Layout parameters and the probes to run on the layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackingCase {
    /// The parameters.
    pub params: LayoutParams,
    /// The probes, run in order.
    pub probes: Vec<Probe>,
}

/// What a packing case exercised, for coverage statistics of sweeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PackingReport {
    /// The parameters were refused (with the right error).
    pub invalid_layout: bool,
    /// Probes whose word decoded.
    pub valid_words: u64,
    /// Probes whose word was refused by `decode`.
    pub invalid_words: u64,
    /// Readings behind the stored tick.
    pub behind: u64,
    /// Refills that reached `max_units`.
    pub full: u64,
    /// Two-step refills compared with one step (I3).
    pub two_steps: u64,
    /// `take` calls that admitted.
    pub taken: u64,
    /// `ticks_until` results checked against `refill`.
    pub waits_checked: u64,
}

/// The layout's arithmetic, redone in `u128` from the documented formulas.
struct Reference {
    capacity: u128,
    frac_bits: u32,
    refill: u128,
    base: u128,
    max: u128,
    token_bits: u32,
    /// `2^T`.
    wrap: u128,
    tolerance: u128,
    window: u128,
}

impl Reference {
    /// The reference layout, or the reasons `Layout::new` may give for refusing it.
    fn new(p: &LayoutParams) -> Result<Reference, Vec<LayoutError>> {
        let mut reasons = Vec::new();
        if p.capacity == 0 {
            reasons.push(LayoutError::ZeroCapacity);
        }
        if p.refill_per_tick == 0 || p.refill_per_tick > MAX_REFILL_PER_TICK {
            reasons.push(LayoutError::RefillOutOfRange(p.refill_per_tick));
        }
        if p.tick_shift > MAX_TICK_SHIFT {
            reasons.push(LayoutError::TickShiftOutOfRange(p.tick_shift));
        }
        let max = if p.frac_bits >= 64 {
            // capacity * 2^F >= 2^64 for any capacity >= 1.
            None
        } else {
            Some((u128::from(p.capacity) << p.frac_bits) + u128::from(p.base_units))
        };
        let max = max.filter(|&m| m <= u128::from(MAX_UNITS));
        if max.is_none() && p.capacity != 0 {
            reasons.push(LayoutError::TokensDoNotFit);
        }
        if !reasons.is_empty() {
            return Err(reasons);
        }
        let max = max.expect("checked above");
        let token_bits = 128 - (max + 1).leading_zeros();
        let wrap = 1u128 << (64 - token_bits);
        let half = wrap / 2;
        // At least two ticks (a write near full anchors one tick ahead), when the field
        // has room for it.
        let tolerance = u128::from(TOLERANCE_NANOS >> p.tick_shift)
            .max(2)
            .min(half - 1);
        let window = u128::from(BACK_WINDOW_NANOS >> p.tick_shift).clamp(tolerance + 1, half);
        // A reading far behind is an idle past the wrap: the wrap must exceed the back
        // window plus the fill time.
        let fill = max.div_ceil(u128::from(p.refill_per_tick));
        if tolerance < 2 || wrap < window + fill {
            return Err(vec![LayoutError::WrapTooShort]);
        }
        Ok(Reference {
            capacity: u128::from(p.capacity),
            frac_bits: p.frac_bits,
            refill: u128::from(p.refill_per_tick),
            base: u128::from(p.base_units),
            max,
            token_bits,
            wrap,
            tolerance,
            window,
        })
    }

    /// The tick a write from a snapshot at `tick`, read `behind`, stores when the balance
    /// goes from `before` to `after`: the next tick edge when either is within one
    /// tick's refill of full (above `max - R - 1`) and the reading is not behind.
    fn write_tick(&self, tick: u64, behind: u64, before: u128, after: u128) -> u64 {
        let near_full = self.max.saturating_sub(self.refill + 1);
        if behind == 0 && before.max(after) > near_full {
            ((u128::from(tick) + 1) % self.wrap) as u64
        } else {
            tick
        }
    }

    /// The largest tick difference read as forward.
    fn forward_max(&self) -> u128 {
        self.wrap - 1 - self.window
    }

    fn tick(&self, t: u64) -> u128 {
        u128::from(t) % self.wrap
    }

    /// `(units, tick, behind)` of `units` stored at `stored` brought to `now`.
    fn refill(&self, units: u128, stored: u128, now: u64) -> (u128, u128, u128) {
        let now = self.tick(now);
        let d = (now + self.wrap - stored) % self.wrap;
        if d <= self.forward_max() {
            ((units + d * self.refill).min(self.max), now, 0)
        } else {
            (units, stored, self.wrap - d)
        }
    }

    fn units(&self, spec: UnitsSpec) -> u64 {
        let u = match spec {
            UnitsSpec::Tokens(t) => (u128::from(t) % (self.capacity + 1)) << self.frac_bits,
            UnitsSpec::InRange(x) => u128::from(x) % (self.max + 1),
            UnitsSpec::Raw(x) => u128::from(x),
        };
        u as u64
    }

    /// Ticks until `units` can pay `cost`: `ceil((base + cost - units) / R)`, at least 0.
    fn ticks_until(&self, units: u128, cost: u128) -> u128 {
        (self.base + cost)
            .saturating_sub(units)
            .div_ceil(self.refill)
    }

    fn resolve(&self, spec: TickSpec, from: u64, units: u128) -> u64 {
        match spec {
            TickSpec::Forward(d) => from.wrapping_add(d),
            TickSpec::Back(d) => from.wrapping_sub(d),
            TickSpec::WindowEdge(k) => from
                .wrapping_add(self.forward_max() as u64)
                .wrapping_add(k as u64),
            TickSpec::FillEdge(k) => {
                let fill = (self.max - units.min(self.max)).div_ceil(self.refill);
                from.wrapping_add(fill as u64).wrapping_add(k as u64)
            }
            TickSpec::Raw(t) => t,
        }
    }
}

macro_rules! ensure {
    ($cond:expr, $step:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(violation($step, format!($($msg)+)));
        }
    };
}

/// Runs `case` and checks, against the `u128` reference:
///
/// - `Layout::new` refuses exactly the invalid parameters, with one of the errors that
///   apply, and never panics; a valid layout reports its parameters, `max_units`, bit
///   widths, tolerance, back window, tick and wrap period as documented;
/// - `encode`/`decode` round trip exactly, `encode` refuses units above `max_units`, and
///   `decode` refuses exactly the words whose units are above it (never misread);
/// - `refill` equals `min(max, units + elapsed * R)` for forward readings and the stored
///   state for behind ones, never exceeds `max_units`, never overflows, and refilling in
///   two steps equals one step when no wrap lies between (I3);
/// - `take`, `take_up_to`, `refund`, `reserve` give exactly the reference results, whose
///   words decode in range; a refund never exceeds `max_units`;
/// - `ticks_until` is exact and consistent with `refill`: after that many ticks the cost
///   is there, one tick earlier it is not;
/// - `start_word`, `units_of`, `balance_units`, `is_full` as documented.
///
/// # Errors
///
/// The first [`Violation`] found; its step is the probe's index. A panic (an overflow in
/// a debug or fuzz build) propagates.
pub fn check_packing(case: &PackingCase) -> Result<PackingReport, Violation> {
    let mut report = PackingReport::default();
    let expected = Reference::new(&case.params);
    let layout = match (case.params.build(), expected) {
        (Err(e), Err(reasons)) => {
            ensure!(
                reasons.contains(&e),
                0,
                "Layout::new refused with {e:?}, expected one of {reasons:?}"
            );
            ensure!(
                !e.to_string().is_empty(),
                0,
                "layout error with an empty message"
            );
            report.invalid_layout = true;
            return Ok(report);
        }
        (Err(e), Ok(_)) => return Err(violation(0, format!("valid parameters refused: {e:?}"))),
        (Ok(l), Err(reasons)) => {
            return Err(violation(
                0,
                format!("invalid parameters accepted ({reasons:?}): {l:?}"),
            ));
        }
        (Ok(l), Ok(r)) => (l, r),
    };
    let (layout, r) = layout;
    check_layout(&layout, &r, &case.params)?;
    for (step, probe) in case.probes.iter().enumerate() {
        check_probe(&layout, &r, probe, step, &mut report)?;
    }
    Ok(report)
}

fn check_layout(l: &Layout, r: &Reference, p: &LayoutParams) -> Result<(), Violation> {
    let got = (
        l.capacity(),
        l.tick_shift(),
        l.frac_bits(),
        l.refill_per_tick(),
        l.base_units(),
    );
    let want = (
        p.capacity,
        p.tick_shift,
        p.frac_bits,
        p.refill_per_tick,
        p.base_units,
    );
    ensure!(got == want, 0, "layout parameters {got:?}, given {want:?}");
    ensure!(
        u128::from(l.max_units()) == r.max,
        0,
        "max_units {}, expected {}",
        l.max_units(),
        r.max
    );
    ensure!(
        l.token_bits() == r.token_bits,
        0,
        "token_bits {}, expected {}",
        l.token_bits(),
        r.token_bits
    );
    ensure!(
        l.tick_bits() + l.token_bits() == 64 && l.tick_bits() >= 2,
        0,
        "tick_bits {}",
        l.tick_bits()
    );
    ensure!(
        u128::from(l.tolerance_ticks()) == r.tolerance,
        0,
        "tolerance {}, expected {}",
        l.tolerance_ticks(),
        r.tolerance
    );
    ensure!(
        u128::from(l.back_window_ticks()) == r.window,
        0,
        "back window {}, expected {}",
        l.back_window_ticks(),
        r.window
    );
    ensure!(
        l.tick() == Duration::from_nanos(1 << p.tick_shift),
        0,
        "tick {:?}",
        l.tick()
    );
    let wrap_nanos = (r.wrap << p.tick_shift).min(u128::from(u64::MAX));
    ensure!(
        l.wrap_period().as_nanos() == wrap_nanos,
        0,
        "wrap period {:?}, expected {wrap_nanos} ns",
        l.wrap_period()
    );
    let rate = l.effective_refill_per_second();
    ensure!(rate.is_finite() && rate > 0.0, 0, "effective rate {rate}");
    ensure!(
        l.units_of(p.capacity) == Some(p.capacity << p.frac_bits),
        0,
        "units_of(capacity)"
    );
    if let Some(above) = p.capacity.checked_add(1) {
        ensure!(
            l.units_of(above).is_none(),
            0,
            "units_of(capacity + 1) accepted"
        );
    }
    Ok(())
}

fn check_probe(
    l: &Layout,
    r: &Reference,
    probe: &Probe,
    step: usize,
    report: &mut PackingReport,
) -> Result<(), Violation> {
    let max = l.max_units();
    // The stored word, and its (tick, units) as the reference reads them.
    let (word, tick, units) = match probe.word {
        WordSpec::Packed { tick, units } => {
            let units = (u128::from(units) % (r.max + 1)) as u64;
            let Some(word) = l.encode(tick, units) else {
                return Err(violation(step, format!("encode({tick}, {units}) refused")));
            };
            ensure!(
                l.encode(tick, max + 1).is_none(),
                step,
                "encode accepted max_units + 1"
            );
            (word, r.tick(tick) as u64, units)
        }
        WordSpec::Raw(word) => {
            let units = word & ((1u64 << r.token_bits) - 1);
            let tick = word >> r.token_bits;
            if u128::from(units) > r.max {
                ensure!(
                    l.decode(word).is_none(),
                    step,
                    "decode accepted units {units} above max {max}"
                );
                report.invalid_words += 1;
                // Never stored by a bucket; the transitions must still not panic.
                let _ = l.refill(word, tick.wrapping_add(1));
                return Ok(());
            }
            (word, tick, units)
        }
    };
    report.valid_words += 1;
    ensure!(
        l.decode(word) == Some((tick, units)),
        step,
        "decode({word:#x}) = {:?}, expected {:?}",
        l.decode(word),
        (tick, units)
    );
    ensure!(
        l.encode(tick, units) == Some(word),
        step,
        "encode(decode(word)) != word"
    );

    // Refill to `now`.
    let now = r.resolve(probe.now, tick, u128::from(units));
    let s = l.refill(word, now);
    let (eu, et, eb) = r.refill(u128::from(units), u128::from(tick), now);
    let got = (
        u128::from(s.units()),
        u128::from(s.tick(l)),
        u128::from(s.behind()),
    );
    ensure!(
        got == (eu, et, eb),
        step,
        "refill(word, {now}) = (units, tick, behind) {got:?}, expected {:?}",
        (eu, et, eb)
    );
    ensure!(s.units() <= max, step, "refill above max_units");
    ensure!(
        u128::from(s.behind()) <= r.window,
        step,
        "behind {} beyond the back window",
        s.behind()
    );
    if s.behind() > 0 {
        report.behind += 1;
    }
    if l.is_full(&s) {
        report.full += 1;
    }
    ensure!(l.is_full(&s) == (s.units() >= max), step, "is_full");
    let balance = i128::from(s.units()) - i128::from(l.base_units());
    ensure!(
        i128::from(l.balance_units(&s)) == balance,
        step,
        "balance_units"
    );
    let tokens = l.units_to_tokens(l.balance_units(&s));
    ensure!(
        tokens == balance as f64 / 2f64.powi(r.frac_bits as i32),
        step,
        "units_to_tokens"
    );
    let snapshot_word = l.encode(s.tick(l), s.units()).expect("units checked above");

    // I3: two steps equal one when the whole span reads forward.
    let later = r.resolve(probe.later, s.tick(l), u128::from(s.units()));
    let d1 = (r.tick(now) + r.wrap - u128::from(tick)) % r.wrap;
    let d2 = (r.tick(later) + r.wrap - r.tick(now)) % r.wrap;
    if s.behind() == 0 && d1 + d2 <= r.forward_max() {
        report.two_steps += 1;
        let two = l.refill(snapshot_word, later);
        let one = l.refill(word, later);
        ensure!(
            two == one,
            step,
            "refill in two steps {two:?} != one step {one:?} (I3)"
        );
        ensure!(two.units() >= s.units(), step, "refill went down");
    }

    // take
    let cost = r.units(probe.cost);
    let taken = l.take(&s, cost);
    let can = u128::from(s.units()) >= r.base + u128::from(cost);
    ensure!(
        taken.is_some() == can,
        step,
        "take({cost}) = {taken:?} at units {}, base {}",
        s.units(),
        l.base_units()
    );
    if let Some(w) = taken {
        report.taken += 1;
        let tick = r.write_tick(
            s.tick(l),
            s.behind(),
            s.units().into(),
            (s.units() - cost).into(),
        );
        ensure!(
            l.decode(w) == Some((tick, s.units() - cost)),
            step,
            "take({cost}) word decodes to {:?}",
            l.decode(w)
        );
    }

    // take_up_to
    let (min, wanted) = (r.units(probe.min), r.units(probe.max_wanted));
    let got = l.take_up_to(&s, min, wanted);
    let available = s.units().checked_sub(l.base_units());
    let expected = available
        .filter(|&a| a >= min)
        .map(|a| a.min(wanted.max(min)));
    ensure!(
        got.map(|g| g.1) == expected,
        step,
        "take_up_to({min}, {wanted}) = {got:?}, expected {expected:?} taken"
    );
    if let Some((w, t)) = got {
        let tick = r.write_tick(
            s.tick(l),
            s.behind(),
            s.units().into(),
            (s.units() - t).into(),
        );
        ensure!(
            l.decode(w) == Some((tick, s.units() - t)),
            step,
            "take_up_to word decodes to {:?}",
            l.decode(w)
        );
    }

    // refund
    let back = r.units(probe.refund);
    let w = l.refund(&s, back);
    // While reservations are owed (balance below zero) a refund gives nothing back.
    let expected = if u128::from(s.units()) < r.base {
        s.units()
    } else {
        (u128::from(s.units()) + u128::from(back)).min(r.max) as u64
    };
    let tick = r.write_tick(s.tick(l), s.behind(), s.units().into(), expected.into());
    ensure!(
        l.decode(w) == Some((tick, expected)),
        step,
        "refund({back}) decodes to {:?}, expected units {expected}",
        l.decode(w)
    );

    // reserve
    let got = l.reserve(&s, cost, probe.max_wait_ticks);
    let expected = u128::from(s.units())
        .checked_sub(u128::from(cost))
        .and_then(|left| {
            let tick = r.write_tick(s.tick(l), s.behind(), s.units().into(), left);
            let anchored = u128::from(tick != s.tick(l));
            let owed = r.ticks_until(left, 0);
            let wait = match owed {
                0 => 0,
                ticks => ticks + anchored,
            };
            // Refill at the ready edge exceeds the debt by less than R; a holder whose
            // cost plus that excess is more than a full bucket is charged the excess too.
            let paid = owed * r.refill;
            let charged = if owed > 0
                && paid <= r.base
                && u128::from(cost) + (paid - (r.base - left)) > r.max - r.base
            {
                r.base - paid
            } else {
                left
            };
            (wait <= u128::from(probe.max_wait_ticks)).then_some((left, charged, wait))
        });
    match (got, expected) {
        (None, None) => {}
        (Some((w, wait)), Some((left, charged, want))) => {
            ensure!(
                u128::from(wait) == want,
                step,
                "reserve wait {wait}, expected {want}"
            );
            let tick = r.write_tick(s.tick(l), s.behind(), s.units().into(), left);
            ensure!(
                l.decode(w) == Some((tick, charged as u64)),
                step,
                "reserve word decodes to {:?}",
                l.decode(w)
            );
            // After `wait` ticks the balance is back at zero, one tick earlier it is not.
            if u128::from(wait) <= r.forward_max() {
                let at = l.refill(w, s.tick(l).wrapping_add(wait));
                ensure!(
                    at.units() >= l.base_units(),
                    step,
                    "reserve: balance below zero after the wait"
                );
                if wait > 0 {
                    let before = l.refill(w, s.tick(l).wrapping_add(wait - 1));
                    ensure!(
                        before.units() < l.base_units(),
                        step,
                        "reserve: wait {wait} one tick too long"
                    );
                }
            }
        }
        (got, expected) => {
            return Err(violation(
                step,
                format!(
                    "reserve({cost}, {}) = {got:?}, expected {expected:?}",
                    probe.max_wait_ticks
                ),
            ));
        }
    }

    // ticks_until, and its consistency with refill.
    let got = l.ticks_until(s.units(), cost);
    let want = r.ticks_until(u128::from(s.units()), u128::from(cost));
    ensure!(
        u128::from(got) == want.min(u128::from(u64::MAX)),
        step,
        "ticks_until({}, {cost}) = {got}, expected {want}",
        s.units()
    );
    if r.base + u128::from(cost) <= r.max && u128::from(got) <= r.forward_max() {
        report.waits_checked += 1;
        let needed = l.base_units() + cost;
        let at = l.refill(snapshot_word, s.tick(l).wrapping_add(got));
        ensure!(
            at.units() >= needed,
            step,
            "after ticks_until = {got} ticks the cost {cost} is not there"
        );
        if got > 0 {
            let before = l.refill(snapshot_word, s.tick(l).wrapping_add(got - 1));
            ensure!(
                before.units() < needed,
                step,
                "the cost {cost} was there one tick before ticks_until = {got}"
            );
        }
    }

    // start_word: anchored at the next tick edge after the reading.
    for full in [false, true] {
        let w = l.start_word(now, full);
        let units = if full { max } else { l.base_units() };
        ensure!(
            l.decode(w) == Some((((r.tick(now) + 1) % r.wrap) as u64, units)),
            step,
            "start_word({now}, {full}) decodes to {:?}",
            l.decode(w)
        );
    }
    Ok(())
}
