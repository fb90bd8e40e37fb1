//! The arithmetic of one exchange with a pool, as pure functions of plain values.
//!
//! An exchange (a lease, a credit) reads the pool's stored units and its units refilled to
//! now, holds some units in hand (given back by the caller, taken back from quiesced
//! slots), and settles them into the units to store. Everything here is integer
//! arithmetic on units (the policy layout's fixed point, `2^F` per token, offset by the
//! layout's base): no atomics, no clock, no layout. [`LocalPool`](super::LocalPool) runs
//! it inside its CAS loop; a pool on a remote store can run the same functions, and the
//! tests below check them against an exact model.
//!
//! The argument for why these rules keep a leased bucket exact is in
//! [the leasing guide](crate::guide::leasing).

/// Whether new credit on top of `units` (refilled or refunded, capped at `max_units`)
/// could meet the capacity while `hand` units are in the exchange's hand and up to
/// `outstanding` more are outside the pool: then the holders must be quiesced before the
/// credit is added.
///
/// When `units + hand + outstanding <= max_units`, the cap cannot bind whatever the
/// holders do with their tokens, so the credit is exact without quiescing.
#[inline]
pub(crate) fn must_quiesce(max_units: u64, units: u64, hand: u64, outstanding: u64) -> bool {
    units.saturating_add(hand).saturating_add(outstanding) > max_units
}

/// The units to store after an exchange that gives back `hand` and adds the credit that
/// took `stored` to `credited` (refill, refund), leaving room for `reserve` units still in
/// flight: `max(min(B, stored + hand), min(B - reserve, credited + hand))`, `B` being
/// `max_units`.
///
/// Giving back is never capped below what was given (while nothing over-spends, the sum
/// is at most `B`); credit is capped at `B - reserve`, so that tokens in flight, given
/// back later, still fit under the capacity. With nothing in flight (`reserve = 0`) this
/// is the plain bucket's `min(B, credited + hand)`. Giving back is never new credit: the
/// result is at most `max(stored, credited) + hand`.
#[inline]
pub(crate) fn settle(max_units: u64, stored: u64, credited: u64, hand: u64, reserve: u64) -> u64 {
    let given_back = stored.saturating_add(hand).min(max_units);
    let with_credit = credited
        .saturating_add(hand)
        .min(max_units.saturating_sub(reserve));
    given_back.max(with_credit)
}

/// The lease to hand out, in units, when `spare` units remain after paying the cost:
/// `min(max_lease, floor(spare / 2^lease_shift))` whole tokens (a token being
/// `2^frac_bits` units), so a full pool leases big batches and a nearly empty one leases
/// little or nothing. With `lease_shift = log2(slots) + 1`, leasing to every slot at once
/// leaves at least half the spare in the pool.
#[inline]
pub(crate) fn lease_units(spare: u64, frac_bits: u32, lease_shift: u32, max_lease: u64) -> u64 {
    let tokens = (spare >> frac_bits)
        .checked_shr(lease_shift)
        .unwrap_or(0)
        .min(max_lease);
    // At most `max_lease` tokens, and `max_lease << frac_bits` fits: a lease never
    // exceeds the capacity, whose units fit the token field.
    tokens.checked_shl(frac_bits).unwrap_or(0)
}

/// What one attempt of a lease exchange does, decided on plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Take the holders' idle tokens into hand (and learn how many are in flight), then
    /// decide again.
    Quiesce,
    /// Pay: `units` (the settled units) cover the cost; store them less the cost and the
    /// lease.
    Pay {
        /// The settled units before paying the cost.
        units: u64,
    },
    /// Refuse, writing nothing: nothing is in hand.
    Refuse,
    /// Refuse, but store `units`: the hand (given back or quiesced) goes back to the pool.
    GiveBackAndRefuse {
        /// The settled units to store.
        units: u64,
    },
}

/// The plain values one attempt of a lease exchange is decided on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Attempt {
    /// The capacity in units (plus the layout's base).
    pub(crate) max_units: u64,
    /// The units stored, before any refill.
    pub(crate) stored: u64,
    /// The units refilled to the exchange's reading.
    pub(crate) refilled: u64,
    /// Units in hand: given back by the caller, taken back from quiesced holders.
    pub(crate) hand: u64,
    /// Whether the refill could meet the capacity with the tokens outside the pool
    /// ([`must_quiesce`], as the pool decided it).
    pub(crate) credit_bound: bool,
    /// Whether the write may anchor at the next tick edge depending on the lessees'
    /// tokens (the pool is not behind its stored tick and its balance with every token
    /// outside could be within one tick's refill of full): then the holders are quiesced
    /// first, so the anchor is decided on the whole balance, as a plain bucket's is.
    pub(crate) anchor_undecided: bool,
    /// `Some(units in flight)` once the holders were quiesced in this exchange.
    pub(crate) quiesced: Option<u64>,
    /// Units the stored balance must reach to pay: the cost plus the layout's base.
    pub(crate) needed: u64,
}

/// The step an [`Attempt`] takes.
///
/// Credit that could meet the capacity is added only once the holders are quiesced, and
/// then capped for the tokens still in flight; a rejection first takes back the holders'
/// idle tokens (they might pay), and rejects only when the pool and everything in hand
/// cannot pay; a rejection with nothing in hand writes nothing.
#[inline]
pub(crate) fn step(a: Attempt) -> Step {
    let credit = a.refilled > a.stored && a.credit_bound;
    if (credit || a.anchor_undecided) && a.quiesced.is_none() {
        return Step::Quiesce;
    }
    let reserve = match a.quiesced {
        Some(in_flight) if credit => in_flight,
        _ => 0,
    };
    let units = settle(a.max_units, a.stored, a.refilled, a.hand, reserve);
    if units >= a.needed {
        Step::Pay { units }
    } else if a.quiesced.is_none() {
        Step::Quiesce
    } else if a.hand == 0 {
        Step::Refuse
    } else {
        Step::GiveBackAndRefuse { units }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const B: u64 = 1000;

    #[test]
    fn settle_without_reserve_is_the_plain_capped_sum() {
        assert_eq!(settle(B, 100, 300, 50, 0), 350);
        assert_eq!(settle(B, 100, 990, 50, 0), B);
        // Giving back at the stored tick (no credit) is never capped below the sum.
        assert_eq!(settle(B, 900, 900, 100, 0), B);
    }

    #[test]
    fn settle_caps_credit_for_tokens_in_flight_but_not_what_is_given_back() {
        // Credit capped at B - reserve.
        assert_eq!(settle(B, 100, 990, 0, 40), 960);
        // What is given back is kept even above B - reserve.
        assert_eq!(settle(B, 980, 990, 10, 40), 990);
        // A reserve above the capacity withholds all credit, never the hand.
        assert_eq!(settle(B, 10, 900, 5, 2 * B), 15);
    }

    #[test]
    fn must_quiesce_only_when_the_cap_could_bind() {
        assert!(!must_quiesce(B, 600, 100, 300));
        assert!(must_quiesce(B, 600, 100, 301));
        assert!(must_quiesce(B, u64::MAX, 1, 1), "saturates, never wraps");
    }

    #[test]
    fn lease_units_are_whole_tokens_bounded_by_the_largest_lease() {
        // 8 fraction bits, 4 slots (shift 3): spare 100.5 tokens leases 12.
        assert_eq!(lease_units((100 << 8) + 128, 8, 3, 50), 12 << 8);
        assert_eq!(lease_units(1000 << 8, 8, 3, 50), 50 << 8);
        assert_eq!(lease_units(7 << 8, 8, 3, 50), 0);
        assert_eq!(lease_units(u64::MAX, 8, 64, 50), 0, "no shift overflow");
    }

    fn attempt(stored: u64, refilled: u64, hand: u64, quiesced: Option<u64>) -> Attempt {
        Attempt {
            max_units: B,
            stored,
            refilled,
            hand,
            credit_bound: must_quiesce(B, refilled, hand, 200),
            anchor_undecided: false,
            quiesced,
            needed: 100,
        }
    }

    #[test]
    fn credit_near_the_cap_quiesces_first() {
        assert_eq!(step(attempt(500, 900, 0, None)), Step::Quiesce);
        assert_eq!(
            step(attempt(500, 900, 50, Some(30))),
            Step::Pay { units: 950 }
        );
        // Far below the cap: no quiescing needed.
        assert_eq!(step(attempt(100, 200, 0, None)), Step::Pay { units: 200 });
    }

    #[test]
    fn a_rejection_reclaims_first_and_writes_only_a_hand() {
        assert_eq!(step(attempt(10, 10, 0, None)), Step::Quiesce);
        assert_eq!(step(attempt(10, 10, 0, Some(0))), Step::Refuse);
        assert_eq!(
            step(attempt(10, 10, 20, Some(0))),
            Step::GiveBackAndRefuse { units: 30 }
        );
    }

    proptest! {
        /// `settle` against the exact model in u128: never above the capacity plus
        /// nothing, never new credit beyond `max(stored, credited) + hand`, and equal to
        /// the plain bucket's capped sum when nothing is in flight.
        #[test]
        fn settle_matches_the_exact_model(
            max in 1u64..=u64::MAX >> 1,
            stored in any::<u64>(),
            extra in any::<u64>(),
            hand in any::<u64>(),
            reserve in any::<u64>(),
        ) {
            let stored = stored % (max + 1);
            let credited = stored.saturating_add(extra).min(max);
            let got = u128::from(settle(max, stored, credited, hand, reserve));
            let (m, s, c, h, r) = (
                u128::from(max), u128::from(stored), u128::from(credited),
                u128::from(hand), u128::from(reserve),
            );
            let cap = m.saturating_sub(r);
            let want = (s + h).min(m).max((c + h).min(cap));
            prop_assert_eq!(got, want);
            prop_assert!(got <= m);
            prop_assert!(got <= c.max(s) + h, "giving back made credit");
            if reserve == 0 {
                prop_assert_eq!(got, (c + h).min(m));
            }
        }

        /// `lease_units` against the model: whole tokens, at most `max_lease`, at most
        /// `spare >> lease_shift`.
        #[test]
        fn lease_units_match_the_exact_model(
            spare in any::<u64>(),
            frac in 0u32..40,
            shift in 0u32..20,
            max_lease in 1u64..1 << 20,
        ) {
            let got = lease_units(spare, frac, shift, max_lease);
            let tokens = (u128::from(spare) >> frac >> shift).min(u128::from(max_lease));
            prop_assert_eq!(u128::from(got), tokens << frac);
            prop_assert!(u128::from(got) <= u128::from(spare) >> shift);
        }

        /// `step`: a payment never pays with more than settling allows, a refusal is
        /// decided only after quiescing, credit near the cap is never added unquiesced,
        /// and a write-free refusal has nothing in hand.
        #[test]
        fn step_keeps_the_exchange_rules(
            stored in 0u64..=B,
            refill in 0u64..=B,
            hand in prop_oneof![Just(0u64), 0u64..=B],
            outstanding in 0u64..=2 * B,
            in_flight in proptest::option::of(0u64..=2 * B),
            needed in 1u64..=B,
        ) {
            let refilled = (stored + refill).min(B);
            let credit_bound = must_quiesce(B, refilled, hand, outstanding);
            let a = Attempt {
                max_units: B, stored, refilled, hand, credit_bound, anchor_undecided: false,
                quiesced: in_flight, needed,
            };
            let credit = refilled > stored && credit_bound;
            match step(a) {
                Step::Quiesce => prop_assert!(in_flight.is_none()),
                Step::Pay { units } => {
                    prop_assert!(units >= needed);
                    prop_assert!(!credit || in_flight.is_some());
                    let reserve = if credit { in_flight.unwrap_or(0) } else { 0 };
                    prop_assert_eq!(units, settle(B, stored, refilled, hand, reserve));
                }
                Step::Refuse => {
                    prop_assert!(in_flight.is_some());
                    prop_assert_eq!(hand, 0);
                }
                Step::GiveBackAndRefuse { units } => {
                    prop_assert!(in_flight.is_some());
                    prop_assert!(units < needed);
                    prop_assert!(units <= stored.max(refilled) + hand);
                }
            }
        }
    }
}
