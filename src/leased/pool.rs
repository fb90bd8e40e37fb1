//! Where a [`LeasedBucket`](super::LeasedBucket)'s tokens come from: the [`Pool`] trait,
//! and its first implementation, [`LocalPool`], one packed word in this process.
//!
//! A pool is the single source of truth for a leased bucket's balance. The bucket's
//! core-local slots (the lessees) take batches of tokens from it and give back what they
//! did not spend; the pool sees them only through [`Lessees`]. The trait is narrow so that
//! a pool on a remote store (a budget in Redis leased to many instances) can keep the
//! same contract: lease, give back, credit, reset, peek.

use std::fmt;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use super::exchange::{self, Attempt, Step};
use crate::bucket::reread_snapshot;
use crate::clock::Clock;
use crate::error::AcquireError;
use crate::policy::Policy;
use crate::state::{Layout, SEALED, Snapshot};
use crate::sync::{AtomicU64, Ordering};

/// The unnameable argument of [`Pool::as_local`]: only this crate can call or
/// implement it.
mod private {
    /// A token only this crate can name.
    #[derive(Clone, Copy, Debug)]
    pub struct Local;
}
pub(crate) use private::Local;

/// A [`LocalPool`] operation found its word sealed by a reconfiguration: it wrote
/// nothing, and hands back the units it held (given back by its caller, or taken back
/// from the lessees), to be given to the pool that replaced it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Replaced {
    /// Units in the operation's hand, in the sealed pool's layout.
    pub(crate) hand_units: u64,
}

/// What a leased bucket asks of its [`Pool`] in one [`lease`](Pool::lease) exchange.
///
/// Units are the policy layout's fixed-point units (`2^F` per token, see
/// [`Layout::frac_bits`]); every amount the bucket sends is a whole number of tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRequest {
    /// The bucket's clock reading, in nanoseconds.
    pub now: u64,
    /// Units to pay for the request being decided (at least one token).
    pub cost_units: u64,
    /// Units the caller gives back in the same exchange (its slot's leftover, leased
    /// earlier and not spent).
    pub returned_units: u64,
    /// Whether to lease a batch beyond the cost: the caller has a slot to put it in.
    pub lease: bool,
}

/// The answer to a [`Pool::lease`] exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// The cost is paid; `leased_units` more were handed out.
    Admitted {
        /// Units handed to the caller beyond the cost: a whole number of tokens, at most
        /// what [`Lessees::lease_units`] asked for.
        leased_units: u64,
        /// The tick (of the bucket's layout and clock, modulo `2^T`) the lease is
        /// spendable in, and only in: the slot refuses it once the clock reads another
        /// tick. [`LocalPool`] names its word's tick (the request's, or a later one stored
        /// by a thread that read the clock after it); a pool that keeps no ticks names
        /// `layout.tick_of(request.now)`.
        tick: u64,
        /// The pool's balance after the exchange, in units (negative only while
        /// reservations are owed).
        balance_units: i64,
    },
    /// The pool, with everything handed back and every idle lease taken back, cannot pay
    /// the cost. Nothing was taken; what was handed in is back in the pool.
    Rejected {
        /// The pool's balance the rejection was decided on, in units.
        balance_units: i64,
        /// How many ticks `now_nanos` is behind the pool's last update (zero for a pool
        /// that keeps no ticks): with `now_nanos`, it places the balance on the tick grid
        /// for the decision's `retry_after`.
        behind_ticks: u64,
        /// The clock reading the rejection was decided at (the request's, or a later
        /// one the pool read).
        now_nanos: u64,
    },
    /// The pool cannot decide now: its store cannot be reached and its failure mode says
    /// to refuse. Nothing was taken; what was handed in is kept (given back when the
    /// store is reached again), never dropped. The bucket answers
    /// [`AcquireError::PoolUnavailable`] with this `retry_after`.
    Unavailable {
        /// When to ask again.
        retry_after: Duration,
    },
}

/// A pool's state at a reading, as [`Pool::peek`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolState {
    /// The balance refilled to the reading, in units offset by the layout's base
    /// (`layout.base_units() + balance`, as a packed word stores them: never negative).
    /// Tokens out on lease are not in it.
    pub units: u64,
    /// How many ticks the reading is behind the pool's last update (zero for a pool that
    /// keeps no ticks). Above [`Layout::tolerance_ticks`] the balance is the stored one.
    pub behind_ticks: u64,
}

/// What [`Lessees::quiesce`] took and left.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quiesced {
    /// Units taken back from idle lessees, now in the exchange's hand.
    pub taken_units: u64,
    /// A bound on the units still in other threads' hands (leases in flight): a credit
    /// must leave room for them under the capacity.
    pub in_flight_units: u64,
}

/// The lessees (a leased bucket's slots) as a pool sees them during one exchange.
///
/// A pool calls it from inside an exchange; the bucket reopens what it quiesced once the
/// exchange is over.
pub trait Lessees {
    /// An upper bound on the units outside the pool: held by lessees, or in a hand on
    /// the way between a lessee and the pool.
    fn max_outstanding_units(&self) -> u64;

    /// Stops every other lessee from spending or receiving leased tokens until the
    /// exchange is over, and takes back their idle tokens into the exchange's hand: the
    /// pool must store them (given back) whether the exchange admits or rejects. Calling
    /// it again in the same exchange takes nothing more and reports zeros: the first
    /// call's [`Quiesced::in_flight_units`] stands for the whole exchange.
    fn quiesce(&mut self) -> Quiesced;

    /// The batch to lease, in units (whole tokens), when `spare` units remain after
    /// paying the cost.
    fn lease_units(&self, spare: u64) -> u64;
}

/// A source of tokens for a [`LeasedBucket`](super::LeasedBucket): one budget, leased in
/// batches to the bucket's core-local slots.
///
/// # Contract
///
/// A pool is built for one policy; the bucket passes that policy's [`Layout`] to every
/// call, and every amount is in its fixed-point units (`2^F` per token). Units rather
/// than whole tokens because the balance and the refill are fractional on the layout's
/// grid: a remote store that keeps coarser units (milli-tokens, say) converts at its
/// boundary, rounding what it grants and reports down, never up. Every amount the bucket
/// sends is a whole number of tokens.
///
/// - **Linearizable.** Each call is one atomic exchange with the pool's state: there is
///   an order of all calls on a pool, consistent with real time, in which each takes
///   effect at once.
/// - **The cap.** Write `g` for the pool's balance and `O` for every unit outside it
///   (leased and not yet spent or given back). The pool keeps `g + O <= B` (the
///   capacity). A pool that tracks `O` itself (a remote store counting its grants) keeps
///   it directly; a pool that cannot see the lessees calls [`Lessees::quiesce`] before
///   adding credit (refill, refund) that could meet the capacity, that is whenever
///   `credit + hand + max_outstanding_units > B`, and caps the credit at `B` minus the
///   units still in flight. The arithmetic is in `leased/exchange.rs`.
/// - **Giving back is never new credit.** Units given back (by [`give_back`],
///   [`LeaseRequest::returned_units`], or taken back by quiescing) never make the pool
///   hold more than it would have held had they never left.
/// - **A grant is spendable only in the tick it names.** The bucket's slots spend a lease
///   only while its clock reads [`LeaseOutcome::Admitted::tick`]; after that the tokens
///   are given back on the next exchange. This bounds what a lost or slow lessee can
///   strand, and it is what lets the in-process pool add refill at tick edges exactly.
/// - **A rejection writes nothing** unless it gives back what was handed in.
/// - **Never waits on the network.** `lease` answers from what the pool holds;
///   [`LeaseOutcome::Unavailable`] when it cannot decide. `give_back`, `credit` and `reset`
///   cannot fail: a remote pool that cannot reach its store keeps them and applies them,
///   in order, when it can.
///
/// [`give_back`]: Pool::give_back
pub trait Pool: Send + Sync {
    /// Takes back `request.returned_units`, pays `request.cost_units` and, when
    /// `request.lease`, leases a batch (at most [`Lessees::lease_units`] of what is left),
    /// all in one exchange. When the pool cannot pay, it quiesces the lessees, taking
    /// their idle tokens back, and decides again: it rejects only when its balance and
    /// everything handed back cannot pay.
    ///
    /// # Errors
    ///
    /// [`AcquireError::ClockWentBackwards`] when a pool keeping its own time finds the
    /// reading (read again through `clock` after loading the pool's state) well behind
    /// its last update and cannot read that as an idle past its wrap, or
    /// [`AcquireError::PoolUnavailable`] when its store cannot decide. Nothing is taken
    /// and everything handed in has been given back. [`LocalPool`] returns neither.
    fn lease<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
        request: LeaseRequest,
        lessees: &mut impl Lessees,
    ) -> Result<LeaseOutcome, AcquireError>;

    /// Gives back `units` leased earlier and not spent (capped at the capacity, never new
    /// credit).
    fn give_back(&self, layout: &Layout, units: u64);

    /// Adds `units` of new credit at `now` (a refund), capped at the capacity; quiesces
    /// the lessees first when the credit could meet the capacity (see the contract).
    fn credit(&self, layout: &Layout, now: u64, units: u64, lessees: &mut impl Lessees);

    /// Back to the policy's start state (`full` or empty) at `now`; tokens out on lease
    /// are taken back (the bucket quiesces its slots) and dropped.
    fn reset(&self, layout: &Layout, now: u64, full: bool, lessees: &mut impl Lessees);

    /// Whether the pool's state is a packed word whose tick field wraps, which the
    /// bucket must re-anchor (see [`crate::state`]: the bucket's re-anchoring passes then
    /// store its refilled state at their reading, or reset it full after an idle longer
    /// than the fill time). `false` by default: a pool on a remote store keeps its own
    /// time.
    fn wraps(&self) -> bool {
        false
    }

    /// The state at `now`, writing nothing. A remote pool answers from what it last
    /// heard (a lower bound, like a slot admission's `tokens_remaining`).
    fn peek(&self, layout: &Layout, now: u64) -> PoolState;

    /// For a reading found well behind the pool ([`PoolState::behind_ticks`] above
    /// [`Layout::tolerance_ticks`]): reads the clock again after loading the state and
    /// returns the state an exchange would decide on at the new reading, with that
    /// reading. Writes nothing. The default reads the clock and peeks (a pool that keeps
    /// no ticks is never behind).
    ///
    /// # Errors
    ///
    /// [`AcquireError::ClockWentBackwards`] when the new reading is still well behind a
    /// state the pool cannot read as idle past its wrap (a pool keeping its own time).
    /// [`LocalPool`] never returns it: with the limiter's monotonic reading, it is such
    /// an idle, and the state is full.
    fn reread<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
    ) -> Result<(PoolState, u64), AcquireError> {
        let now = clock.now_nanos();
        Ok((self.peek(layout, now), now))
    }

    /// The pool as a [`LocalPool`], which a leased bucket can reconfigure in place (see
    /// [`LeasedBucket::reconfigure`](super::LeasedBucket::reconfigure)); `None` for every
    /// other pool. Only this crate can call or implement it.
    #[doc(hidden)]
    fn as_local(&self, _: Local) -> Option<&LocalPool> {
        None
    }
}

/// The in-process pool: one packed word on its own cache line, the same word a
/// [`Bucket`](crate::Bucket) is. The default pool of a [`LeasedBucket`](super::LeasedBucket).
///
/// Writes are `AcqRel` read-modify-writes and loads `Acquire`, unlike a plain bucket's
/// `Relaxed`: the exactness argument orders slot operations against this word (see
/// `leased/slots.rs` and [the leasing guide](crate::guide::leasing)).
///
/// # Readings behind the word
///
/// A reading more than the race tolerance behind the stored tick is a lost race (the
/// caller read the clock, then was delayed while others stored later ticks); the clock
/// is read through a [`Monotonic`](crate::clock::Monotonic) guard, so a clock stepping
/// back is not. As on a plain bucket (`RawBucket::transition_after_reread`), the
/// exchange then reads the clock again *after* the acquiring load of the word it compares
/// the reading with, and again after every CAS it loses (a failed CAS returns the word
/// with `Acquire` too). Every tick in that word was read by its writer before its
/// releasing CAS, so the new reading is not earlier than any of them (less the one tick
/// a write near full anchors ahead). A reading still well behind can only be an idle past
/// the wrap, longer than the fill time (every layout wraps after more than its fill time
/// plus the back window): the word is full, re-anchored at the new reading's next tick
/// edge, and the exchange proceeds.
///
/// Re-anchoring full is a credit that can meet the capacity, so the exchange treats it
/// like any other: every exchange keeps `g + O <= B` (`g` the word's balance, `O` every
/// token outside it, in OPEN slots or in a hand): leasing moves tokens out, spending
/// removes them, giving back is capped at `B`, and a credit that could meet the capacity
/// while tokens are outside is added only after quiescing has taken the OPEN slots'
/// tokens into the adder's hand, and is capped at `B - reserve` for those still in flight
/// (`exchange::settle`). A slot lease is spendable only within the tick it was stamped
/// with, so none survives an idle past the wrap.
pub struct LocalPool {
    word: CachePadded<AtomicU64>,
}

impl fmt::Debug for LocalPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LocalPool")
            .field(&self.word.load(Ordering::Relaxed))
            .finish()
    }
}

impl LocalPool {
    /// A pool for `policy` in its start state (full or empty) at `now_nanos` (a reading of
    /// the clock the bucket will use).
    ///
    /// ```
    /// use tokengate::{Clock, LeasedBucket, ManualClock, Policy};
    /// use tokengate::leased::{LeaseConfig, LocalPool};
    /// let policy = Policy::new(100, 1.0)?;
    /// let clock = ManualClock::new();
    /// let pool = LocalPool::new(&policy, clock.now_nanos());
    /// let bucket = LeasedBucket::with_pool(policy, clock, LeaseConfig::new(), pool)?;
    /// assert_eq!(bucket.available(), 100.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(policy: &Policy, now_nanos: u64) -> LocalPool {
        let layout = policy.layout();
        LocalPool {
            word: CachePadded::new(AtomicU64::new(
                layout.start_word(layout.tick_of(now_nanos), policy.starts_full()),
            )),
        }
    }

    /// The packed word as stored, before any refill: decode it with the policy's
    /// [`Layout`]. For diagnostics, and to check that an operation wrote nothing.
    pub fn stored_word(&self) -> u64 {
        self.word.load(Ordering::Acquire)
    }

    #[inline]
    fn cas(&self, current: u64, next: u64) -> Result<u64, u64> {
        self.word
            .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
    }
}

/// [`exchange::must_quiesce`], with the loom mutant that adds credit without quiescing.
#[inline]
fn credit_bound(layout: &Layout, units: u64, hand: u64, outstanding: u64) -> bool {
    if mutant!(CREDIT_IGNORES_LEASES) {
        return false;
    }
    // Near full rather than full: a write whose balance, counting the lessees' tokens, is
    // within one tick's refill of full anchors at the next tick edge, as a plain
    // bucket's does, so the lessees' tokens must be in hand to decide it.
    exchange::must_quiesce(layout.near_full_units(), units, hand, outstanding)
}

/// Units stored in `word`, before any refill.
#[inline]
fn stored_units(layout: &Layout, word: u64) -> u64 {
    layout.decode(word).map_or(u64::MAX, |(_, units)| units)
}

/// The state a pool reports for a snapshot.
#[inline]
fn state_of(snapshot: &Snapshot) -> PoolState {
    PoolState {
        units: snapshot.units(),
        behind_ticks: snapshot.behind(),
    }
}

/// The clock reading an exchange decides at (see "Readings behind the word").
struct Reading {
    now: u64,
    tick: u64,
    /// Once a reading was found well behind the word: every later reading is taken after
    /// the (acquiring) load of the word it is compared with.
    after_load: bool,
}

impl Reading {
    fn new(layout: &Layout, now: u64) -> Reading {
        Reading {
            now,
            tick: layout.tick_of(now),
            after_load: false,
        }
    }

    fn read<C: Clock + ?Sized>(&mut self, layout: &Layout, clock: &C) {
        self.now = clock.now_nanos();
        self.tick = layout.tick_of(self.now);
    }

    /// After a lost CAS: the word returned was loaded with `Acquire`, so a reading taken
    /// now is later than every reading stored in it.
    fn after_cas<C: Clock + ?Sized>(&mut self, layout: &Layout, clock: &C) {
        if self.after_load {
            self.read(layout, clock);
        }
    }
}

impl LocalPool {
    /// `cur` refilled to the reading, or what to do about a reading well behind it:
    /// `Ok(None)` to decide again at a new reading (taken now, after `cur`'s load), an
    /// error for a clock that stepped back under a word that is not full.
    #[inline]
    fn refilled<C: Clock + ?Sized>(
        layout: &Layout,
        clock: &C,
        cur: u64,
        reading: &mut Reading,
    ) -> Result<Option<Snapshot>, AcquireError> {
        let snapshot = layout.refill(cur, reading.tick);
        if snapshot.behind() <= layout.tolerance_ticks() {
            return Ok(Some(snapshot));
        }
        if !reading.after_load && !mutant!(LEASE_SKIPS_REREAD) {
            // `cur` was loaded (or returned by a failed CAS) with `Acquire`.
            reading.after_load = true;
            reading.read(layout, clock);
            return Ok(None);
        }
        // Still far behind a reading taken after the load: the tick field wrapped, so the
        // pool idled past its fill time and is full (see `RawBucket`'s re-read). The
        // exchange quiesces the lessees before this credit, as before any credit that
        // could meet the cap.
        Ok(Some(layout.reanchor_full(reading.tick)))
    }
}

impl Pool for LocalPool {
    fn lease<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
        request: LeaseRequest,
        lessees: &mut impl Lessees,
    ) -> Result<LeaseOutcome, AcquireError> {
        // A sealed word (replaced by a reconfiguration) decides nothing; a leased bucket
        // calls `lease_in` and takes what was in hand to the new pool.
        self.lease_in(layout, clock, request, lessees)
            .unwrap_or(Err(crate::bucket::SEALED_ERROR))
    }

    fn give_back(&self, layout: &Layout, units: u64) {
        let _sealed = self.give_back_in(layout, units);
    }

    fn credit(&self, layout: &Layout, now: u64, units: u64, lessees: &mut impl Lessees) {
        let _sealed = self.credit_in(layout, now, units, lessees);
    }

    fn wraps(&self) -> bool {
        true
    }

    fn reset(&self, layout: &Layout, now: u64, full: bool, lessees: &mut impl Lessees) {
        // `now` is the caller's reading: the pool has no clock of its own to read again.
        lessees.quiesce();
        let _sealed = self.store_refilled(
            layout,
            || now,
            now,
            |snapshot| Some(layout.restart(snapshot, full)),
        );
    }

    #[inline]
    fn peek(&self, layout: &Layout, now: u64) -> PoolState {
        // A sealed word reads as empty.
        self.peek_in(layout, now).unwrap_or(PoolState {
            units: 0,
            behind_ticks: 0,
        })
    }

    fn reread<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
    ) -> Result<(PoolState, u64), AcquireError> {
        self.reread_in(layout, clock)
            .unwrap_or(Err(crate::bucket::SEALED_ERROR))
    }

    #[inline]
    fn as_local(&self, _: Local) -> Option<&LocalPool> {
        Some(self)
    }
}

/// The pool's operations on a word that a reconfiguration may seal (see
/// [`LeasedBucket::reconfigure`](super::LeasedBucket::reconfigure)): each decides and
/// writes nothing on a sealed word, and answers [`Replaced`] with what it held.
impl LocalPool {
    /// A pool holding `word` (a reconfiguration's converted word).
    pub(crate) fn from_word(word: u64) -> LocalPool {
        LocalPool {
            word: CachePadded::new(AtomicU64::new(word)),
        }
    }

    /// Seals the word and returns what it held: every later operation finds it sealed.
    pub(crate) fn seal(&self) -> u64 {
        if mutant!(LEASED_SWITCH_SKIPS_SEAL) {
            return self.word.load(Ordering::Acquire);
        }
        self.word.swap(SEALED, Ordering::AcqRel)
    }

    /// Stores `word`: into a new pool before it is shared, or back into a word this
    /// thread sealed, for a switch that unwinds.
    pub(crate) fn store_word(&self, word: u64) {
        self.word.store(word, Ordering::Release);
    }

    /// [`Pool::lease`] on a word that may be sealed.
    pub(crate) fn lease_in<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
        request: LeaseRequest,
        lessees: &mut impl Lessees,
    ) -> Result<Result<LeaseOutcome, AcquireError>, Replaced> {
        let needed = layout.base_units() + request.cost_units;
        let mut hand = request.returned_units;
        let mut quiesced: Option<u64> = None;
        let mut reading = Reading::new(layout, request.now);
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            if cur == SEALED {
                return Err(Replaced { hand_units: hand });
            }
            let snapshot = match LocalPool::refilled(layout, clock, cur, &mut reading) {
                Ok(Some(snapshot)) => snapshot,
                Ok(None) => continue,
                Err(e) => {
                    self.give_back_in(layout, hand)?;
                    return Ok(Err(e));
                }
            };
            let stored = stored_units(layout, cur);
            let outstanding = lessees.max_outstanding_units();
            // Decided on this snapshot; quiescing (once per exchange) only grows the hand.
            let (next, outcome) = loop {
                let attempt = Attempt {
                    max_units: layout.max_units(),
                    stored,
                    refilled: snapshot.units(),
                    hand,
                    credit_bound: credit_bound(layout, snapshot.units(), hand, outstanding),
                    anchor_undecided: snapshot.behind() == 0
                        && credit_bound(layout, snapshot.units(), hand, outstanding),
                    quiesced,
                    needed,
                };
                match exchange::step(attempt) {
                    Step::Quiesce => {
                        let found = lessees.quiesce();
                        hand = hand.saturating_add(found.taken_units);
                        quiesced = Some(found.in_flight_units);
                    }
                    Step::Refuse => {
                        // Read-only, like a plain bucket's rejection.
                        return Ok(Ok(rejected(layout, &snapshot, reading.now)));
                    }
                    Step::GiveBackAndRefuse { units } => {
                        let next =
                            layout.store_after(&snapshot, units.max(snapshot.units()), units);
                        let after = layout.refill(next, reading.tick);
                        break (next, rejected(layout, &after, reading.now));
                    }
                    Step::Pay { units } => {
                        let leased = if request.lease {
                            lessees.lease_units(units - needed)
                        } else {
                            0
                        };
                        let mut left = units - request.cost_units - leased;
                        if mutant!(LEASE_KEEPS_GLOBAL) {
                            left += leased;
                        }
                        let admitted = LeaseOutcome::Admitted {
                            leased_units: leased,
                            // The reading's tick, not the stored one: a pool anchored at the next
                            // edge must not stretch a lease into a tick that has not begun.
                            tick: reading.tick,
                            balance_units: left as i64 - layout.base_units() as i64,
                        };
                        break (layout.store_after(&snapshot, units, left), admitted);
                    }
                }
            };
            match self.cas(cur, next) {
                Ok(_) => return Ok(Ok(outcome)),
                Err(actual) => {
                    cur = actual;
                    reading.after_cas(layout, clock);
                }
            }
        }
    }

    /// [`Pool::give_back`] on a word that may be sealed.
    pub(crate) fn give_back_in(&self, layout: &Layout, units: u64) -> Result<(), Replaced> {
        if units == 0 {
            return Ok(());
        }
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            if cur == SEALED {
                return Err(Replaced { hand_units: units });
            }
            // At the stored tick: giving back never advances time, so it never carries
            // refill credit and needs no quiescing; the tokens were the pool's, so the
            // pool and its lessees together hold no more than before, and the tick stays
            // (no anchor at the next edge, which only new credit needs).
            let tick = layout.decode(cur).map_or(0, |(tick, _)| tick);
            let snapshot = layout.refill(cur, tick);
            let units = snapshot
                .units()
                .saturating_add(units)
                .min(layout.max_units());
            match self.cas(cur, snapshot.with_units(units)) {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    /// [`Pool::credit`] on a word that may be sealed: [`Replaced`] holds what quiescing
    /// took back, not the credit.
    pub(crate) fn credit_in(
        &self,
        layout: &Layout,
        now: u64,
        units: u64,
        lessees: &mut impl Lessees,
    ) -> Result<(), Replaced> {
        let now_tick = layout.tick_of(now);
        let mut hand = 0u64;
        let mut quiesced: Option<u64> = None;
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            if cur == SEALED {
                return Err(Replaced { hand_units: hand });
            }
            let snapshot = layout.refill(cur, now_tick);
            let credited = snapshot.units().saturating_add(units);
            let bound = credit_bound(layout, credited, hand, lessees.max_outstanding_units());
            if bound && quiesced.is_none() {
                let found = lessees.quiesce();
                hand = hand.saturating_add(found.taken_units);
                quiesced = Some(found.in_flight_units);
            }
            let reserve = if bound { quiesced.unwrap_or(0) } else { 0 };
            let stored = stored_units(layout, cur);
            let next = exchange::settle(layout.max_units(), stored, credited, hand, reserve);
            match self.cas(cur, layout.store_after(&snapshot, credited, next)) {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    /// The word re-anchored at `now` for the tick wrap ([`Snapshot::reanchored`], as a
    /// plain bucket's `RawBucket::reanchor_in` does), not anchored at the next tick edge
    /// as a credit near the cap is. It credits nothing, so the lessees need no
    /// quiescing; [`Replaced`] (holding nothing) on a sealed word.
    pub(crate) fn reanchor_in<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
        now: u64,
    ) -> Result<(), Replaced> {
        self.store_refilled(
            layout,
            || clock.now_nanos(),
            now,
            |snapshot| snapshot.reanchored(),
        )
    }

    /// [`Pool::reset`] on a word that may be sealed: the lessees' tokens are dropped
    /// either way, as a reset drops them.
    pub(crate) fn reset_in<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
        now: u64,
        full: bool,
        lessees: &mut impl Lessees,
    ) -> Result<(), Replaced> {
        // What the lessees had is dropped with the rest of the old state. Leases in
        // flight are given back after the reset (capped at full).
        lessees.quiesce();
        self.store_refilled(
            layout,
            || clock.now_nanos(),
            now,
            |snapshot| Some(layout.restart(snapshot, full)),
        )
    }

    /// Stores the start word of a full bucket read at `now` (full at the next tick
    /// edge), whatever the word held: what a re-anchoring pass after an idle longer than
    /// the fill time stores, as a plain bucket's `RawBucket::fill_in` does. The lessees'
    /// tokens are dropped, as a reset drops them.
    pub(crate) fn fill_in(
        &self,
        layout: &Layout,
        now: u64,
        lessees: &mut impl Lessees,
    ) -> Result<(), Replaced> {
        lessees.quiesce();
        let full = layout.start_word(layout.tick_of(now), true);
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            if cur == SEALED {
                return Err(Replaced { hand_units: 0 });
            }
            match self.cas(cur, full) {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Stores what `next` makes of the word refilled to `now` (nothing for `None`),
    /// again on a word changed meanwhile: a transition that neither credits the lessees
    /// nor hands anything back, so [`Replaced`] on a sealed word holds nothing.
    ///
    /// As a plain bucket's credit transitions do (`RawBucket::transition_after_reread`):
    /// a reading behind the stored tick reads the clock again after loading the word, and
    /// one still far behind is an idle past the wrap, the word full at that reading. So
    /// the pool stores exactly what a plain bucket's word would.
    fn store_refilled(
        &self,
        layout: &Layout,
        read_clock: impl Fn() -> u64,
        now: u64,
        next: impl Fn(&Snapshot) -> Option<u64>,
    ) -> Result<(), Replaced> {
        let mut reread = false;
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            if cur == SEALED {
                return Err(Replaced { hand_units: 0 });
            }
            let mut snapshot = layout.refill(cur, layout.tick_of(now));
            if snapshot.behind() != 0 && !reread {
                reread = true;
                cur = self.word.load(Ordering::Acquire);
                continue;
            }
            if reread {
                snapshot = reread_snapshot(layout, cur, read_clock().max(now));
            }
            let Some(word) = next(&snapshot) else {
                return Ok(());
            };
            match self.cas(cur, word) {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    /// The word as it is now (an acquiring load): [`SEALED`](crate::state::SEALED) once
    /// a reconfiguration replaced it.
    #[inline(always)]
    pub(crate) fn load(&self) -> u64 {
        self.word.load(Ordering::Acquire)
    }

    /// [`Pool::peek`] on a word that may be sealed.
    #[inline]
    pub(crate) fn peek_in(&self, layout: &Layout, now: u64) -> Result<PoolState, Replaced> {
        let cur = self.word.load(Ordering::Acquire);
        if cur == SEALED {
            return Err(Replaced { hand_units: 0 });
        }
        Ok(state_of(&layout.refill(cur, layout.tick_of(now))))
    }

    /// [`Pool::reread`] on a word that may be sealed.
    #[cold]
    #[inline(never)]
    pub(crate) fn reread_in<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
    ) -> Result<Result<(PoolState, u64), AcquireError>, Replaced> {
        // Load first (acquiring the writers' readings), then read.
        let cur = self.word.load(Ordering::Acquire);
        if cur == SEALED {
            return Err(Replaced { hand_units: 0 });
        }
        let now = clock.now_nanos();
        Ok(Ok((state_of(&reread_snapshot(layout, cur, now)), now)))
    }
}

/// The rejection an exchange reports, decided on `snapshot` at `now`.
#[inline]
fn rejected(layout: &Layout, snapshot: &Snapshot, now: u64) -> LeaseOutcome {
    LeaseOutcome::Rejected {
        balance_units: layout.balance_units(snapshot),
        behind_ticks: snapshot.behind(),
        now_nanos: now,
    }
}
