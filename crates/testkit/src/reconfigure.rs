//! Reconfiguration against exact arithmetic: [`inherit::convert`] on any two layouts and
//! balances (debt included) against the strategy's promise as a rational, and a
//! [`LiveBucket`] history with switches against an [`Ideal`] bucket per policy.

use std::time::Duration;

use tokengate::inherit::{self, Converted, Inherit};
use tokengate::state::Layout;
use tokengate::{Clock, LiveBucket, ManualClock, Policy};

use crate::check::{PolicySpec, Violation, scale_cost, violation};
use crate::model::Ideal;

/// The strategies, indexed by [`LiveOp::Switch`] and [`ConvertProbe::how`].
pub const STRATEGIES: [Inherit; 4] = [
    Inherit::Proportional,
    Inherit::AsIs,
    Inherit::Reset,
    Inherit::Additive,
];

/// The policies random switch histories move between (`Step::Switch(i, _)` picks
/// `[i]`): a small slow one, a fast one, a start-empty one that refills in seconds, and
/// one refilled in a microsecond.
pub fn switch_policies() -> [Policy; 4] {
    [
        Policy::new(10, 7.0).expect("a valid policy"),
        Policy::new(100, 333.0).expect("a valid policy"),
        Policy::new(3, 0.5).expect("a valid policy").start_empty(),
        Policy::new(1_000, 1e6).expect("a valid policy"),
    ]
}

/// One step of a live bucket's history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LiveOp {
    /// Moves the clock forward by this many nanoseconds.
    Advance(u64),
    /// `try_acquire(cost)` (the cost scaled into the current capacity).
    Acquire(u64),
    /// `refund(cost)` (scaled likewise).
    Refund(u64),
    /// Switches to the case's other policy with strategy `STRATEGIES[n % 4]`.
    Switch(u8),
}

/// A pure conversion between the case's two layouts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvertProbe {
    /// The balance: `units % (max_units + 1)` of the old layout (below its base is debt).
    pub units: u64,
    /// The reading.
    pub now: u64,
    /// `STRATEGIES[how % 4]`.
    pub how: u8,
    /// Convert from the second policy to the first instead.
    pub backwards: bool,
}

/// Two policies, conversions between them, and a history switching between them.
#[derive(Clone, Debug, PartialEq)]
pub struct ReconfigureCase {
    /// The policy the bucket starts with.
    pub first: PolicySpec,
    /// The policy each switch alternates with.
    pub second: PolicySpec,
    /// The clock's start.
    pub start_nanos: u64,
    /// Pure conversions, checked first.
    pub probes: Vec<ConvertProbe>,
    /// The history.
    pub ops: Vec<LiveOp>,
}

/// What a case exercised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReconfigureReport {
    /// A policy was refused (nothing else ran).
    pub invalid_policy: bool,
    /// Conversions checked.
    pub conversions: u64,
    /// Conversions of a debt.
    pub debts: u64,
    /// Conversions that forgave debt.
    pub forgiven: u64,
    /// Conversions capped at the new capacity.
    pub capped: u64,
    /// Switches of the live bucket.
    pub switches: u64,
    /// Admissions and rejections of the live bucket.
    pub admitted: u64,
    /// Rejections.
    pub rejected: u64,
}

/// `a / 2^fa <= b / 2^fb`, exactly.
fn le_scaled(a: i128, fa: u32, b: i128, fb: u32) -> bool {
    if fa >= fb {
        a <= b << (fa - fb)
    } else {
        a << (fb - fa) <= b
    }
}

/// Checks one conversion's result against its promise: `to_units` is the largest value
/// of the new layout's units at most the promise (capped at the new capacity, and at
/// least the most the new layout may owe, the rest reported forgiven), and the word
/// holds it at the new layout's next tick edge.
///
/// # Errors
///
/// What is wrong, as text.
pub fn check_conversion(
    from: &Layout,
    to: &Layout,
    to_starts_full: bool,
    from_units: u64,
    now: u64,
    how: Inherit,
    c: &Converted,
) -> Result<(), String> {
    let b = i128::from(from_units) - i128::from(from.base_units());
    if c.from_units != b {
        return Err(format!("from_units {} for a balance of {b}", c.from_units));
    }
    let (f1, f2) = (from.frac_bits(), to.frac_bits());
    let (cap1, cap2) = (i128::from(from.capacity()), i128::from(to.capacity()));
    // The promise as the rational `num / (den * 2^f1)` tokens.
    let (num, den): (i128, i128) = match how {
        Inherit::Reset => ((if to_starts_full { cap2 } else { 0 }) << f1, 1),
        Inherit::Proportional if b > 0 => (b * cap2, cap1),
        Inherit::Additive => {
            let d = (cap2 - cap1) << f1;
            (if d >= 0 { b + d } else { (b + d).max(b.min(0)) }, 1)
        }
        _ => (b, 1),
    };
    // units / 2^f2 <= num / (den * 2^f1)
    let within = |units: i128| le_scaled(units * den, f2, num, f1);
    let cap = cap2 << f2;
    let floor = -i128::from(to.base_units());
    let forgiven = i128::try_from(c.forgiven_units).map_err(|e| e.to_string())?;
    if c.to_units > cap || c.to_units < floor {
        return Err(format!("{c:?} outside [{floor}, {cap}]"));
    }
    // What the strategy gives before the floor: the promise rounded down, capped.
    let target = c.to_units - forgiven;
    if forgiven > 0 && c.to_units != floor {
        return Err(format!("{c:?}: debt forgiven above the floor {floor}"));
    }
    if !within(target) && target != cap {
        return Err(format!("{c:?} above the promise {num}/({den}*2^{f1})"));
    }
    if target < cap && within(target + 1) {
        return Err(format!("{c:?} rounded down by a unit or more"));
    }
    if target == cap && !within(cap) {
        // Capped: the promise must be at least the capacity.
        return Err(format!("{c:?} capped below a promise under the capacity"));
    }
    let Some((tick, units)) = to.decode(c.word) else {
        return Err(format!("{c:?}: the word does not decode"));
    };
    if i128::from(units) - i128::from(to.base_units()) != c.to_units {
        return Err(format!("{c:?}: the word holds {units} units"));
    }
    let next = to.tick_of(now).wrapping_add(1) & (u64::MAX >> to.token_bits());
    if tick != next {
        return Err(format!("{c:?}: anchored at tick {tick}, not {next}"));
    }
    Ok(())
}

fn layouts_of(spec: &PolicySpec) -> Option<Policy> {
    spec.build().ok()
}

/// Runs a case.
///
/// # Errors
///
/// The first violation: a conversion off its promise, a live bucket's switch that is not
/// the pure conversion of its stored word, or an admission above an ideal bucket of the
/// policy in force (started at each switch with the balance the switch reported).
pub fn check_reconfigure(case: &ReconfigureCase) -> Result<ReconfigureReport, Violation> {
    let mut report = ReconfigureReport::default();
    let (Some(first), Some(second)) = (layouts_of(&case.first), layouts_of(&case.second)) else {
        report.invalid_policy = true;
        return Ok(report);
    };
    for (i, p) in case.probes.iter().enumerate() {
        let (from_p, to_p) = if p.backwards {
            (&second, &first)
        } else {
            (&first, &second)
        };
        let (from, to) = (from_p.layout(), to_p.layout());
        let how = STRATEGIES[usize::from(p.how % 4)];
        let units = p.units % from.max_units().saturating_add(1);
        let word = from
            .encode(from.tick_of(p.now), units)
            .ok_or_else(|| violation(i, "unencodable probe"))?;
        let snapshot = from.refill(word, from.tick_of(p.now));
        let c = inherit::convert(from, &snapshot, p.now, to, how, to_p.starts_full());
        check_conversion(from, to, to_p.starts_full(), units, p.now, how, &c)
            .map_err(|e| violation(i, format!("{how:?}: {e}")))?;
        report.conversions += 1;
        report.debts += u64::from(units < from.base_units());
        report.forgiven += u64::from(c.forgiven_units > 0);
        report.capped += u64::from(c.to_units == i128::from(to.capacity()) << to.frac_bits());
    }
    history(case, first, second, &mut report)?;
    Ok(report)
}

fn history(
    case: &ReconfigureCase,
    first: Policy,
    second: Policy,
    report: &mut ReconfigureReport,
) -> Result<(), Violation> {
    let clock = ManualClock::new();
    clock.set(Duration::from_nanos(case.start_nanos));
    let bucket = LiveBucket::with_clock(first, clock.clone());
    let (mut policy, mut other) = (first, second);
    let Some(mut ideal) = Ideal::new(&policy, case.start_nanos) else {
        return Ok(());
    };
    for (step, op) in case.ops.iter().enumerate() {
        let now = clock.now_nanos();
        match *op {
            LiveOp::Advance(d) => clock.advance(Duration::from_nanos(d)),
            LiveOp::Acquire(c) => {
                let cost = scale_cost(c, policy.capacity());
                match bucket.try_acquire(cost) {
                    Ok(d) if d.is_admitted() => {
                        report.admitted += 1;
                        if !ideal.take(cost, now) {
                            return Err(violation(
                                step,
                                format!("{cost} tokens at {now} ns above the curve of {policy:?}"),
                            ));
                        }
                    }
                    Ok(_) => report.rejected += 1,
                    Err(e) if cost > policy.capacity() => {
                        let _ = e;
                    }
                    Err(e) => return Err(violation(step, format!("error {e:?} for {cost}"))),
                }
            }
            LiveOp::Refund(c) => {
                let cost = scale_cost(c, policy.capacity());
                if bucket.refund(cost).is_ok() {
                    ideal.refund(cost, now);
                }
            }
            LiveOp::Switch(n) => {
                let how = STRATEGIES[usize::from(n % 4)];
                let (from, to) = (policy.layout(), other.layout());
                let word = bucket.stored_word();
                let switch = bucket.reconfigure(other, how);
                report.switches += 1;
                // The switch is the pure conversion of the word it sealed, read at the
                // same time (the clock is manual: nothing moved in between), as the
                // engine reads it: far behind after the load is an idle past the wrap,
                // full; so is a word whose re-anchoring pass found it idle.
                let tick = from.tick_of(now);
                let mut snapshot = from.refill(word, tick);
                if snapshot.behind() > from.tolerance_ticks() {
                    snapshot = from.reanchor_full(tick);
                }
                let mut expected =
                    inherit::convert(from, &snapshot, now, to, how, other.starts_full());
                if bucket.stored_word() != expected.word
                    && switch.before == policy.capacity() as f64
                {
                    snapshot = from.reanchor_full(tick);
                    expected = inherit::convert(from, &snapshot, now, to, how, other.starts_full());
                }
                if bucket.stored_word() != expected.word {
                    return Err(violation(
                        step,
                        format!(
                            "switch stored {:#x}, the conversion gives {expected:?}",
                            bucket.stored_word()
                        ),
                    ));
                }
                let units = snapshot.units();
                check_conversion(from, to, other.starts_full(), units, now, how, &expected)
                    .map_err(|e| violation(step, format!("{how:?}: {e}")))?;
                let frac = to.frac_bits();
                let after = expected.to_units as f64 / (1u128 << frac) as f64;
                if switch.after != after {
                    return Err(violation(
                        step,
                        format!("{switch:?} reports, {expected:?} converted"),
                    ));
                }
                std::mem::swap(&mut policy, &mut other);
                let Some(next) = Ideal::with_balance(&policy, now, expected.to_units, frac) else {
                    return Ok(());
                };
                ideal = next;
            }
        }
    }
    Ok(())
}
