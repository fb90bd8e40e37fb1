//! Carrying a bucket's tokens over to a new policy: the token-inheritance strategies and
//! the conversion of a word from one layout to another.
//!
//! A policy's fixed-point layout (tick, fraction bits, refill per tick) is its own, so a
//! reconfiguration converts the state, never reinterprets it. [`convert`] is pure (no
//! atomics, no clock): [`LiveBucket::reconfigure`](crate::LiveBucket::reconfigure) calls
//! it on the word it sealed, [`LeasedBucket::reconfigure`](crate::LeasedBucket::reconfigure)
//! on its sealed pool (the slots' tokens given back into it first), and the tests check
//! it against exact rational arithmetic.
//!
//! # What each strategy promises
//!
//! With `b` the balance in tokens under the old policy at the switch (capacity `B`) and
//! `B'` the new capacity, the new balance `b'` is at most:
//!
//! | strategy | `b'` for `b >= 0` |
//! |---|---|
//! | [`Inherit::Proportional`] | `b * B' / B` (the same fraction of the new capacity) |
//! | [`Inherit::AsIs`] | `min(b, B')` |
//! | [`Inherit::Additive`] | `min(b + (B' - B), B')`, at least zero when `b` was (the capacity's change added or removed) |
//! | [`Inherit::Reset`] | the new policy's start state (full, or empty with `start_empty`) |
//!
//! and at least that less one unit (`2^-F'` tokens): each is rounded down to the new
//! layout's units, never up. A balance below zero (reservations owed) is carried as
//! the same debt in tokens, rounded up, by every strategy but `Reset` (`Additive` adds
//! a grown capacity's `B' - B` to it, and keeps it under a shrunk one): granted
//! reservations keep their place in the queue. Debt
//! beyond what the new policy may owe (its reservation allowance) is forgiven, and
//! reported ([`Converted::forgiven_units`]).
//!
//! A keyed map converts the buckets it holds at the switch. A key it does not hold (never
//! seen, or evicted full) starts as a new key of the new policy, full under a start-full
//! policy: what every strategy but `AsIs` makes of a full bucket too. Under `AsIs` to a
//! larger capacity a kept full key holds the old capacity and an evicted one the new
//! (see [`KeyedLimiter::reconfigure`](crate::KeyedLimiter::reconfigure)).
//!
//! # Time
//!
//! The old balance `b` is the one the old bucket decides on at the switch reading `t`
//! (its refill counted in whole old ticks, lagging the ideal bucket, never leading it).
//! The new word is anchored at the new layout's first tick edge after `t`: refill under
//! the new policy starts there. So decisions before `t` stay within the old policy's
//! bound, and for every `e >= t` the decisions in `[t, e]` admit at most
//! `b' + r' * (e - t)`, with `b'` at most what the strategy promises from `b`.

use crate::state::{Layout, Snapshot};

/// How a reconfigured bucket's tokens carry over to the new policy (see the module
/// docs for each strategy's exact guarantee).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Inherit {
    /// The same fraction of the new capacity: `b * B' / B`.
    Proportional,
    /// The same tokens, capped at the new capacity: `min(b, B')`.
    AsIs,
    /// The new policy's start state, whatever the bucket held.
    Reset,
    /// The same tokens changed by what the capacity changed by: `b + (B' - B)`, capped at
    /// `B'`, and down to zero at most (a debt is kept) when the capacity shrinks.
    Additive,
}

/// The result of [`convert`]: the new word and the balances on both sides, in each
/// layout's units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Converted {
    /// The word to store under the new layout.
    pub word: u64,
    /// The balance under the old layout at the switch, in its units (negative while
    /// reservations are owed): what the old bucket would decide on at the reading.
    pub from_units: i128,
    /// The balance the new word holds, in the new layout's units.
    pub to_units: i128,
    /// Debt beyond the new layout's reservation allowance, forgiven, in new units.
    pub forgiven_units: u128,
}

/// Converts a bucket's state `snapshot` under `from`, read at `now` (nanoseconds, a
/// reading taken after the word was loaded, so at most one tick behind its stored tick
/// for a write near full), to a word of `to` with strategy `how`. `start_full` is the
/// new policy's start state, for [`Inherit::Reset`].
///
/// Rounds every balance down (debt up) to the new units and anchors the word at the new
/// layout's next tick edge: never more credit than the strategy promises (module docs).
pub fn convert(
    from: &Layout,
    snapshot: &Snapshot,
    now: u64,
    to: &Layout,
    how: Inherit,
    start_full: bool,
) -> Converted {
    // The balance the old bucket decides on at the reading. A stored tick ahead of it
    // (a write near full anchors at the next edge) is a lag of the old word, not a
    // balance the old bucket lacks: it admits from these units now.
    let from_units = i128::from(snapshot.units()) - i128::from(from.base_units());
    let to_cap = i128::from(to.capacity()) << to.frac_bits();
    let from_cap = i128::from(from.capacity()) << from.frac_bits();
    let target = match how {
        Inherit::Reset => {
            if start_full {
                to_cap
            } else {
                0
            }
        }
        Inherit::Proportional if from_units > 0 => {
            // floor(b * B'/B) in new units; both products stay below 2^125.
            (from_units * to_cap) / from_cap
        }
        Inherit::Proportional | Inherit::AsIs => rescale_down(from_units, from, to),
        Inherit::Additive => {
            let d = (i128::from(to.capacity()) - i128::from(from.capacity())) << to.frac_bits();
            let b = rescale_down(from_units, from, to);
            // Grown by `d`: `d` more. Shrunk: `|d|` fewer, down to zero (a debt is kept).
            if d >= 0 { b + d } else { (b + d).max(b.min(0)) }
        }
    };
    let target = target.min(to_cap);
    let now_tick = to.tick_of(now);
    let floor = -i128::from(to.base_units());
    let forgiven_units = u128::try_from(floor - target).unwrap_or(0);
    let to_units = target.max(floor);
    // `floor <= to_units <= to_cap`, so the units lie in `0..=max_units`.
    let units = u64::try_from(to_units + i128::from(to.base_units())).unwrap_or(0);
    let next_edge = now_tick.wrapping_add(1);
    let word = to
        .encode(next_edge, units)
        .unwrap_or_else(|| to.start_word(now_tick, false));
    Converted {
        word,
        from_units,
        to_units,
        forgiven_units,
    }
}

/// `units` of `from` in units of `to`, rounded towards negative infinity (a balance
/// down, a debt up).
fn rescale_down(units: i128, from: &Layout, to: &Layout) -> i128 {
    let (f, t) = (from.frac_bits(), to.frac_bits());
    if t >= f {
        units << (t - f)
    } else {
        units >> (f - t) // arithmetic shift: floor for negatives too
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(capacity: u64, frac: u32, refill: u64, base: u64) -> Layout {
        Layout::new(capacity, 10, frac, refill, base).unwrap()
    }

    fn at(layout: &Layout, tokens: u64, now: u64) -> Snapshot {
        let units = layout.base_units() + (tokens << layout.frac_bits());
        layout.refill(
            layout.encode(layout.tick_of(now), units).unwrap(),
            layout.tick_of(now),
        )
    }

    #[test]
    fn each_strategy_gives_what_it_promises_on_whole_tokens() {
        let from = layout(100, 8, 3, 0);
        let to = layout(40, 12, 5, 0);
        let now = 1 << 30;
        let s = at(&from, 50, now);
        let tokens = |c: Converted| c.to_units as f64 / 4096.0;
        assert_eq!(
            tokens(convert(&from, &s, now, &to, Inherit::Proportional, true)),
            20.0
        );
        assert_eq!(
            tokens(convert(&from, &s, now, &to, Inherit::AsIs, true)),
            40.0
        );
        assert_eq!(
            tokens(convert(&from, &s, now, &to, Inherit::Reset, true)),
            40.0
        );
        assert_eq!(
            tokens(convert(&from, &s, now, &to, Inherit::Reset, false)),
            0.0
        );
        // Shrunk from 100 to 40: 60 fewer, down to zero.
        assert_eq!(
            tokens(convert(&from, &s, now, &to, Inherit::Additive, true)),
            0.0
        );
        let grown = layout(130, 12, 5, 0);
        let c = convert(&from, &s, now, &grown, Inherit::Additive, true);
        assert_eq!(tokens(c), 80.0);
        // Shrunk from 100 to 80: 20 fewer.
        let shrunk = layout(80, 12, 5, 0);
        assert_eq!(
            tokens(convert(&from, &s, now, &shrunk, Inherit::Additive, true)),
            30.0
        );
        let (tick, units) = grown.decode(c.word).unwrap();
        assert_eq!(units, 80 << 12);
        assert_eq!(tick, grown.tick_of(now) + 1, "anchored at the next edge");
    }

    #[test]
    fn debt_is_carried_rounded_up_and_forgiven_beyond_the_allowance() {
        // Owes 3 tokens and a half (base 8 tokens of 2^4 units).
        let from = layout(10, 4, 1, 8 << 4);
        let now = 1 << 30;
        let units = (8 << 4) - (3 << 4) - 8;
        let s = from.refill(
            from.encode(from.tick_of(now), units).unwrap(),
            from.tick_of(now),
        );
        // To F = 2: -3.5 tokens is -14 units exactly; F = 0: -4 (rounded up).
        let to = layout(10, 2, 1, 100);
        assert_eq!(
            convert(&from, &s, now, &to, Inherit::AsIs, true).to_units,
            -14
        );
        let coarse = layout(10, 0, 1, 100);
        assert_eq!(
            convert(&from, &s, now, &coarse, Inherit::AsIs, true).to_units,
            -4
        );
        // Allowance of 2 tokens: 1.5 forgiven.
        let small = layout(10, 2, 1, 8);
        let c = convert(&from, &s, now, &small, Inherit::Proportional, true);
        assert_eq!((c.to_units, c.forgiven_units), (-8, 6));
    }
}
