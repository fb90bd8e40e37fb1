//! Where a [`LeasedBucket`](crate::LeasedBucket)'s tokens come from: a lease source, and
//! its first implementation, one packed word in this process.
//!
//! The source is the single source of truth for the balance. Holders (the bucket's
//! core-local slots) take batches of tokens from it and give back what they did not
//! spend. The interface is the one a remote pool (a budget held by a shared store and
//! leased to many instances) would offer: lease at a time, give back, add credit, reset,
//! peek. What the source asks of the holders, through [`Holders`], is what exactness
//! needs: before it adds credit that could meet the capacity while tokens are out on
//! lease, the holders stop spending them and hand them in (see
//! [`crate::leased`] for the argument).

use std::fmt;

use crossbeam_utils::CachePadded;

use crate::bucket::clock_went_backwards;
use crate::clock::Clock;
use crate::error::AcquireError;
use crate::state::{Layout, Snapshot};
use crate::sync::{AtomicU64, Ordering};

/// What a lessee asks of the source in one exchange.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeaseRequest {
    /// The lessee's clock reading.
    pub(crate) now: u64,
    /// Units to pay for the request being decided.
    pub(crate) cost_units: u64,
    /// Units the lessee gives back in the same exchange (its slot's leftover).
    pub(crate) returned_units: u64,
    /// Whether to lease a batch beyond the cost (the lessee holds a slot marker).
    pub(crate) lease: bool,
}

/// The outcome of a lease exchange.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Grant {
    /// The cost is paid; `leased_units` more were handed out.
    Admitted {
        /// Units handed to the lessee beyond the cost (whole tokens).
        leased_units: u64,
        /// The source's tick after the exchange: the lease is spendable within it.
        tick: u64,
        /// The source's balance after the exchange, in units.
        balance: i64,
    },
    /// The source, with everything handed back, cannot pay the cost; nothing was taken.
    Rejected {
        /// The source's state the rejection was decided on.
        snapshot: Snapshot,
        /// The clock reading it was decided at.
        now: u64,
    },
}

/// The holders of leased tokens, as a source sees them during one exchange.
pub(crate) trait Holders {
    /// An upper bound on the units outside the source: held by holders, or in a hand on
    /// the way between a holder and the source.
    fn max_outstanding_units(&self) -> u64;
    /// Stops every holder from spending or receiving leased tokens until the caller
    /// releases them. Returns the units taken back, and a bound on the units still in
    /// other threads' hands (leases in flight): a credit must leave room for those.
    fn quiesce(&mut self) -> (u64, u64);
    /// The batch to lease, in units, when `spare` units remain after paying the cost.
    fn lease_units(&self, spare: u64) -> u64;
}

/// A source of leased tokens.
///
/// Every method is one linearizable exchange. Units are the policy layout's fixed-point
/// units. Giving back is never new credit: it cannot make the source hold more than it
/// would have held had the tokens never left.
pub(crate) trait LeaseSource {
    /// Takes back `returned_units`, pays `cost_units` and leases a batch, all at once. When
    /// the source cannot pay, it takes back the holders' idle tokens and tries again; it
    /// rejects only when its balance and everything handed back cannot pay.
    ///
    /// On error nothing is taken and everything handed in has been given back.
    fn lease<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
        request: LeaseRequest,
        holders: &mut impl Holders,
    ) -> Result<Grant, AcquireError>;

    /// Gives back `units` leased earlier and not spent.
    fn give_back(&self, layout: &Layout, units: u64);

    /// Adds `units` of new credit at `now` (a refund), capped at the capacity.
    fn credit(&self, layout: &Layout, now: u64, units: u64, holders: &mut impl Holders);

    /// Back to the start state at `now`; tokens out on lease are taken back and dropped.
    fn reset(&self, layout: &Layout, now: u64, full: bool, holders: &mut impl Holders);

    /// The state at `now`, writing nothing.
    fn peek(&self, layout: &Layout, now: u64) -> Snapshot;

    /// For a reading found well behind the source: loads the state, then reads the clock
    /// again. Returns the state an exchange would decide on at the new reading (a full
    /// state found still behind re-anchored to it) and the reading. Writes nothing.
    ///
    /// # Errors
    ///
    /// [`AcquireError::ClockWentBackwards`] when the new reading is still well behind a
    /// state that is not full: the clock stepped back.
    fn reread<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
    ) -> Result<(Snapshot, u64), AcquireError>;

    /// A stable identity (for the global order of multi-bucket acquisition).
    fn id(&self) -> usize;
}

/// The in-process source: one packed word on its own cache line, the same word a
/// [`Bucket`](crate::Bucket) is.
///
/// Writes are `AcqRel` read-modify-writes and loads `Acquire`, unlike a plain bucket's
/// `Relaxed`: the exactness argument orders slot operations against this word (see
/// [`crate::slots`]).
///
/// # Readings behind the word
///
/// A reading more than the race tolerance behind the stored tick is a lost race (the
/// caller read the clock, then was delayed while others stored later ticks) or a clock
/// that stepped back. As on a plain bucket (`RawBucket::transition_after_reread`), the
/// exchange then reads the clock again *after* the acquiring load of the word it compares
/// the reading with, and again after every CAS it loses (a failed CAS returns the word
/// with `Acquire` too). Every tick in that word was read by its writer before its
/// releasing CAS, so such a reading is not earlier than any of them unless the clock
/// stepped back. A reading still well behind is refused with
/// [`AcquireError::ClockWentBackwards`], everything handed in given back; unless the word
/// is full.
///
/// A full word is re-anchored instead ([`reanchored`]): it becomes full at the new
/// reading's tick, and the exchange proceeds. A full bucket holds the same at any time,
/// so no credit is made, and a full bucket passes clock steps back and tick wraps, as a
/// plain one does. "Full" is the word's own units; the tokens out on lease need not
/// enter the decision, because a full word has none that can be spent. Every exchange
/// keeps `g + O <= B` (`g` the word's balance, `O` every token outside it, in OPEN slots
/// or in a hand): leasing moves tokens out, spending removes them, giving back is capped
/// at `B`, and a credit that could meet the capacity while tokens are outside is added
/// only after quiescing has taken the OPEN slots' tokens into the adder's hand, and is
/// capped at `B - reserve` for those still in flight ([`settle`]). So when `g = B`,
/// `O = 0`: no slot holds a token (in particular none stamped with the later tick, which
/// would turn spendable again when the clock comes back to it), and no lessee holds one
/// it could publish (a lease cancelled by a reset is only given back, capped). The
/// re-anchor keeps the stored units, so the exchange sees no credit and quiesces nothing;
/// whatever is credited later, from the new tick on, meets the quiescing and the cap
/// like any other credit.
pub(crate) struct GlobalWord {
    word: CachePadded<AtomicU64>,
}

impl fmt::Debug for GlobalWord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("GlobalWord")
            .field(&self.word.load(Ordering::Relaxed))
            .finish()
    }
}

/// Whether new credit on top of `units` (refilled, capped) could meet the capacity while
/// `outstanding` more units are outside, so the holders must be quiesced first.
#[inline]
fn must_quiesce(layout: &Layout, units: u64, hand: u64, outstanding: u64) -> bool {
    #[cfg(loom)]
    if crate::mutants::on(&crate::mutants::CREDIT_IGNORES_LEASES) {
        return false;
    }
    units.saturating_add(hand).saturating_add(outstanding) > layout.max_units()
}

/// The units after an exchange that gives back `hand` and adds the credit that took
/// `stored` to `credited` (refill, refund), leaving room for `reserve` units still in
/// flight: `max(min(B, stored + hand), min(B - reserve, credited + hand))`.
///
/// Giving back is never capped below what was given (while nothing over-spends, the sum
/// is at most `B`); credit is capped at `B - reserve`, so that tokens in flight, given back
/// later, still fit under the capacity. With nothing in flight (`reserve = 0`) this is the
/// plain bucket's `min(B, credited + hand)`.
#[inline]
fn settle(layout: &Layout, stored: u64, credited: u64, hand: u64, reserve: u64) -> u64 {
    let max = layout.max_units();
    let given_back = stored.saturating_add(hand).min(max);
    let with_credit = credited
        .saturating_add(hand)
        .min(max.saturating_sub(reserve));
    given_back.max(with_credit)
}

impl GlobalWord {
    /// A source in the policy's start state at `now_nanos`.
    pub(crate) fn new(layout: &Layout, now_nanos: u64, full: bool) -> GlobalWord {
        GlobalWord {
            word: CachePadded::new(AtomicU64::new(
                layout.start_word(layout.tick_of(now_nanos), full),
            )),
        }
    }

    /// The packed word, for tests and diagnostics.
    pub(crate) fn load(&self) -> u64 {
        self.word.load(Ordering::Acquire)
    }

    #[inline]
    fn cas(&self, current: u64, next: u64) -> Result<u64, u64> {
        self.word
            .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
    }
}

/// A full `snapshot` found well behind the word, re-anchored: full at `now_tick`, not
/// behind. `None` when it is not full (then a reading well behind is refused). See
/// "Readings behind the word" on [`GlobalWord`].
#[inline]
fn reanchored(layout: &Layout, snapshot: &Snapshot, now_tick: u64) -> Option<Snapshot> {
    layout
        .is_full(snapshot)
        .then(|| layout.refill(layout.start_word(now_tick, true), now_tick))
}

/// Whether the mutant that refuses a reading behind the word without reading the clock
/// again is on (never, outside the loom models).
#[inline(always)]
fn reread_skipped() -> bool {
    #[cfg(loom)]
    {
        crate::mutants::on(&crate::mutants::LEASE_SKIPS_REREAD)
    }
    #[cfg(not(loom))]
    {
        false
    }
}

/// Units stored in `word`, before any refill.
#[inline]
fn stored_units(layout: &Layout, word: u64) -> u64 {
    layout.decode(word).map_or(u64::MAX, |(_, units)| units)
}

impl LeaseSource for GlobalWord {
    fn lease<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
        request: LeaseRequest,
        holders: &mut impl Holders,
    ) -> Result<Grant, AcquireError> {
        let needed = layout.base_units() + request.cost_units;
        let mut hand = request.returned_units;
        // `after_load`: the slow path of a reading found well behind the word (see
        // "Readings behind the word" on `GlobalWord`): from then on, every reading is
        // taken after the (acquiring) load of the word it is compared with.
        let (mut quiesced, mut after_load) = (false, false);
        let mut reserve = 0;
        let mut now = request.now;
        let mut now_tick = layout.tick_of(now);
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            let mut snapshot = layout.refill(cur, now_tick);
            if snapshot.behind() > layout.tolerance_ticks() {
                if !after_load && !reread_skipped() {
                    // `cur` was loaded (or returned by a failed CAS) with `Acquire`: a
                    // reading taken now is later than every reading stored in it.
                    after_load = true;
                    now = clock.now_nanos();
                    now_tick = layout.tick_of(now);
                    continue;
                }
                match reanchored(layout, &snapshot, now_tick) {
                    Some(full) => snapshot = full,
                    None => {
                        if hand > 0 {
                            self.give_back(layout, hand);
                        }
                        return Err(clock_went_backwards(layout, &snapshot, now));
                    }
                }
            }
            let stored = stored_units(layout, cur);
            let credit = snapshot.units() > stored
                && must_quiesce(
                    layout,
                    snapshot.units(),
                    hand,
                    holders.max_outstanding_units(),
                );
            if credit && !quiesced {
                let (taken, in_flight) = holders.quiesce();
                hand = hand.saturating_add(taken);
                reserve = in_flight;
                quiesced = true;
            }
            let units = settle(
                layout,
                stored,
                snapshot.units(),
                hand,
                if credit { reserve } else { 0 },
            );
            if units >= needed {
                let leased = if request.lease {
                    holders.lease_units(units - needed)
                } else {
                    0
                };
                #[allow(unused_mut)]
                let mut left = units - request.cost_units - leased;
                #[cfg(loom)]
                if crate::mutants::on(&crate::mutants::LEASE_KEEPS_GLOBAL) {
                    left += leased;
                }
                match self.cas(cur, snapshot.with_units(left)) {
                    Ok(_) => {
                        return Ok(Grant::Admitted {
                            leased_units: leased,
                            tick: snapshot.tick(layout),
                            balance: left as i64 - layout.base_units() as i64,
                        });
                    }
                    Err(actual) => {
                        cur = actual;
                        if after_load {
                            now = clock.now_nanos();
                            now_tick = layout.tick_of(now);
                        }
                        continue;
                    }
                }
            }
            if !quiesced {
                // Reclaim before rejecting: take back every idle slot and try again.
                let (taken, in_flight) = holders.quiesce();
                hand = hand.saturating_add(taken);
                reserve = in_flight;
                quiesced = true;
                continue;
            }
            if hand == 0 {
                // Read-only, like a plain bucket's rejection.
                return Ok(Grant::Rejected { snapshot, now });
            }
            let next = snapshot.with_units(units);
            match self.cas(cur, next) {
                Ok(_) => {
                    return Ok(Grant::Rejected {
                        snapshot: layout.refill(next, now_tick),
                        now,
                    });
                }
                Err(actual) => {
                    cur = actual;
                    if after_load {
                        now = clock.now_nanos();
                        now_tick = layout.tick_of(now);
                    }
                }
            }
        }
    }

    fn give_back(&self, layout: &Layout, units: u64) {
        if units == 0 {
            return;
        }
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            // At the stored tick: giving back never advances time, so it never carries
            // refill credit and needs no quiescing.
            let tick = layout.decode(cur).map_or(0, |(tick, _)| tick);
            let snapshot = layout.refill(cur, tick);
            match self.cas(cur, layout.refund(&snapshot, units)) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    fn credit(&self, layout: &Layout, now: u64, units: u64, holders: &mut impl Holders) {
        let now_tick = layout.tick_of(now);
        let (mut hand, mut reserve) = (0u64, 0u64);
        let mut quiesced = false;
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            let snapshot = layout.refill(cur, now_tick);
            let credited = snapshot.units().saturating_add(units);
            let bound = must_quiesce(layout, credited, hand, holders.max_outstanding_units());
            if bound && !quiesced {
                let (taken, in_flight) = holders.quiesce();
                hand = hand.saturating_add(taken);
                reserve = in_flight;
                quiesced = true;
            }
            let stored = stored_units(layout, cur);
            let next = settle(
                layout,
                stored,
                credited,
                hand,
                if bound { reserve } else { 0 },
            );
            match self.cas(cur, snapshot.with_units(next)) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    fn reset(&self, layout: &Layout, now: u64, full: bool, holders: &mut impl Holders) {
        // What the holders had is dropped with the rest of the old state. Leases in
        // flight are given back after the reset (capped at full).
        holders.quiesce();
        let now_tick = layout.tick_of(now);
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            let snapshot = layout.refill(cur, now_tick);
            match self.cas(cur, layout.start_word(snapshot.tick(layout), full)) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    #[inline]
    fn peek(&self, layout: &Layout, now: u64) -> Snapshot {
        layout.refill(self.word.load(Ordering::Acquire), layout.tick_of(now))
    }

    #[cold]
    #[inline(never)]
    fn reread<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
    ) -> Result<(Snapshot, u64), AcquireError> {
        // Load first (acquiring the writers' readings), then read.
        let cur = self.word.load(Ordering::Acquire);
        let now = clock.now_nanos();
        let now_tick = layout.tick_of(now);
        let snapshot = layout.refill(cur, now_tick);
        if snapshot.behind() <= layout.tolerance_ticks() {
            return Ok((snapshot, now));
        }
        match reanchored(layout, &snapshot, now_tick) {
            Some(full) => Ok((full, now)),
            None => Err(clock_went_backwards(layout, &snapshot, now)),
        }
    }

    #[inline]
    fn id(&self) -> usize {
        &*self.word as *const AtomicU64 as usize
    }
}
