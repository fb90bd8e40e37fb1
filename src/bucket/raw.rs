//! One atomic word and the CAS loop around [`state`](crate::state): [`RawBucket`].
//!
//! # Orderings
//!
//! Every operation is a read-modify-write of one `AtomicU64` that publishes no other
//! memory: a decision depends only on the word's own modification order, which every
//! atomic access observes coherently whatever its ordering. So the hot path's load is
//! `Relaxed`. A rejection is that load alone and writes nothing (invariant I5), so an
//! overloaded bucket is a cache line every core can hold shared.
//!
//! One ordering is not about the word: a successful CAS is `Release`, and the slow path
//! that tells a lost race from a clock stepping back loads the word with `Acquire`
//! before reading the clock again. A writer read the clock before its CAS, so the
//! acquire makes that reading happen-before the reader's new one, and a clock built on
//! atomics (the manual clock) cannot then read earlier than the writer did. On x86 both
//! orderings compile to the same instructions as `Relaxed`.

use std::fmt;
use std::marker::PhantomData;
use std::mem::MaybeUninit;

use super::seal::{Fixed, SEALED_ERROR, Seal};
use crate::clock::{Clock, Monotonic};
use crate::decision::Decision;
use crate::error::{AcquireError, cost_exceeds_capacity};
use crate::multi::{Planned, Prepared};
use crate::state::{FirstTake, Layout, SEALED, Snapshot};
use crate::sync::{AtomicU64, Ordering};

/// What a transition step decided: the word to write (if any) and the result.
pub(crate) type Step<T> = (Option<u64>, T);

/// The bare atomic word of a bucket, without padding, policy or clock: what keyed maps
/// store per key and what [`Bucket`] pads. `S` says whether it may be sealed (see
/// [`Seal`]).
pub(crate) struct RawBucket<S: Seal = Fixed> {
    word: AtomicU64,
    seal: PhantomData<S>,
}

impl<S: Seal> fmt::Debug for RawBucket<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RawBucket")
            .field(&self.word.load(Ordering::Relaxed))
            .finish()
    }
}

impl<S: Seal> RawBucket<S> {
    /// A bucket in the policy's start state at `now_nanos`.
    pub(crate) fn new(layout: &Layout, now_nanos: u64, full: bool) -> RawBucket<S> {
        RawBucket::from_word(layout.start_word(layout.tick_of(now_nanos), full))
    }

    /// A bucket holding `word` (of the layout of whoever reads it).
    pub(crate) fn from_word(word: u64) -> RawBucket<S> {
        RawBucket {
            word: AtomicU64::new(word),
            seal: PhantomData,
        }
    }

    /// Stores the start word of a full bucket read at `now` (full at the next tick edge):
    /// the state of a bucket idle for longer than its fill time, whatever it held. Only
    /// a re-anchoring pass that found every write older than that calls it (see
    /// [`crate::pass`]). A CAS that leaves a sealed word as it is.
    pub(crate) fn fill(&self, layout: &Layout, now: u64) -> S::Out<()> {
        let full = layout.start_word(layout.tick_of(now), true);
        let mut cur = self.word.load(Ordering::Relaxed);
        S::out(loop {
            if let Err(stop) = S::check(cur) {
                break Err(stop);
            }
            match self
                .word
                .compare_exchange(cur, full, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => break Ok(()),
                Err(actual) => cur = actual,
            }
        })
    }

    /// Seals the word (see [`SEALED`]) and returns what it held: every later operation
    /// on it stops with [`Sealed`].
    pub(crate) fn seal(&self) -> u64 {
        self.word.swap(SEALED, Ordering::AcqRel)
    }

    /// A stable identity while the bucket is borrowed: its address.
    #[inline]
    pub(crate) fn id(&self) -> usize {
        &self.word as *const AtomicU64 as usize
    }

    /// Stores `word`: only where no other thread can reach the bucket (a keyed shard's
    /// words under its write lock).
    pub(crate) fn set(&self, word: u64) {
        self.word.store(word, Ordering::Relaxed);
    }

    /// The packed word, for tests and diagnostics.
    #[inline]
    pub(crate) fn load(&self) -> u64 {
        self.word.load(Ordering::Relaxed)
    }

    /// The CAS loop every operation shares: one load, then `step` on the refilled
    /// snapshot; a lost CAS retries with the value it returned (no reload).
    ///
    /// A `now` behind the stored tick goes to a slow path that loads the word before
    /// reading the clock again ([`transition_after_reread`](Self::transition_after_reread)):
    /// with `strict` (admissions) only when it is behind by more than the race tolerance,
    /// otherwise (refunds, resets) whenever it is behind at all, so that credit is never
    /// added at a reading older than the write it lands on.
    ///
    /// Only the first attempt is inlined into the caller; the retries after a lost CAS
    /// ([`transition_contended`](Self::transition_contended)) and the re-read are out of
    /// line, so the uncontended path keeps its registers (measured: BENCHMARKS.md).
    ///
    /// On a sealed word it stops, deciding and writing nothing (see [`Seal`]).
    #[inline(always)]
    pub(crate) fn transition<C: Clock + ?Sized, T>(
        &self,
        layout: &Layout,
        clock: &Monotonic<C>,
        now: u64,
        strict: bool,
        mut step: impl FnMut(&Snapshot, u64) -> Step<T>,
    ) -> S::Out<T> {
        S::out(self.transition_or::<C, Result<T, S::Stop>>(
            layout,
            clock,
            now,
            strict,
            |snapshot, now| {
                let (next, out) = step(snapshot, now);
                (next, Ok(out))
            },
            Err,
        ))
    }

    /// The CAS loop itself: `step`'s result, or `sealed`'s on a sealed word. The hot
    /// path's caller builds its whole result in `step`, so that nothing is unwrapped
    /// and moved after the loop (an unwrapped `Result` measured 12 more instructions per
    /// decision: a copy of the decision).
    #[inline(always)]
    pub(crate) fn transition_or<C: Clock + ?Sized, T>(
        &self,
        layout: &Layout,
        clock: &Monotonic<C>,
        now: u64,
        strict: bool,
        mut step: impl FnMut(&Snapshot, u64) -> Step<T>,
        sealed: impl FnOnce(S::Stop) -> T,
    ) -> T {
        // A reading from another guard (an all-or-nothing acquisition's one reading) is
        // brought up to this bucket's own: a no-op for a monotonic clock.
        let now = clock.observe(now);
        let cur = self.word.load(Ordering::Relaxed);
        if let Err(stop) = S::check(cur) {
            return sealed(stop);
        }
        let snapshot = layout.refill(cur, layout.tick_of(now));
        if snapshot.behind() > slack(layout, strict) {
            return self.transition_after_reread::<C, T>(layout, clock, step, sealed);
        }
        let (next, out) = step(&snapshot, now);
        let Some(next) = next else {
            return out;
        };
        match self
            .word
            .compare_exchange_weak(cur, next, Ordering::Release, Ordering::Relaxed)
        {
            Ok(_) => out,
            Err(actual) => {
                self.transition_contended::<C, T>(layout, clock, now, strict, actual, step, sealed)
            }
        }
    }

    /// The rest of [`transition`](Self::transition) after its first CAS was lost to
    /// `cur`: retry at once on the value the CAS returned.
    ///
    /// No backoff between attempts: measured on 16 cores with every thread admitting on
    /// one bucket, exponential or capped backoff helped at 2-4 threads and fell below
    /// governor from 8 threads up, while retrying at once kept a steady lead at every
    /// count (figures in BENCHMARKS.md, "Sixteen cores"). Predictable scaling wins; a
    /// bucket that hot wants [`LeasedBucket`](crate::LeasedBucket).
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn transition_contended<C: Clock + ?Sized, T>(
        &self,
        layout: &Layout,
        clock: &Monotonic<C>,
        now: u64,
        strict: bool,
        mut cur: u64,
        mut step: impl FnMut(&Snapshot, u64) -> Step<T>,
        sealed: impl FnOnce(S::Stop) -> T,
    ) -> T {
        let now_tick = layout.tick_of(now);
        loop {
            if let Err(stop) = S::check(cur) {
                return sealed(stop);
            }
            let snapshot = layout.refill(cur, now_tick);
            if snapshot.behind() > slack(layout, strict) {
                return self.transition_after_reread::<C, T>(layout, clock, step, sealed);
            }
            let (next, out) = step(&snapshot, now);
            let Some(next) = next else {
                return out;
            };
            match self
                .word
                .compare_exchange_weak(cur, next, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return out,
                Err(actual) => cur = actual,
            }
        }
    }

    /// The transition once `now` was found behind the stored tick.
    ///
    /// A thread descheduled between its clock reading and its CAS (for milliseconds, on
    /// a loaded machine) sees words stored by threads that read the clock later: a lost
    /// race, however long. So this path loads the word *first* and reads the clock
    /// *after*: every reading stored in the loaded word was then taken before this one,
    /// and the clock is monotonic (limiters read it through a [`Monotonic`] guard), so
    /// this reading is behind the stored tick only by the anchor of a write near full
    /// (one tick) and what cores disagree by: the step runs on the stored state, adding
    /// nothing. A reading still *far* behind means the tick field wrapped: the bucket
    /// idled for longer than the wrap period less the back window, longer than it takes
    /// to fill (every layout guarantees it), so it is full, re-anchored at the reading.
    /// A lost CAS here reloads and reads again: it is the cold path, and each loss means
    /// another thread made progress. Out of line, so that the hot loop stays small.
    #[cold]
    #[inline(never)]
    fn transition_after_reread<C: Clock + ?Sized, T>(
        &self,
        layout: &Layout,
        clock: &Monotonic<C>,
        mut step: impl FnMut(&Snapshot, u64) -> Step<T>,
        sealed: impl FnOnce(S::Stop) -> T,
    ) -> T {
        loop {
            let cur = self.word.load(Ordering::Acquire);
            if let Err(stop) = S::check(cur) {
                return sealed(stop);
            }
            let now = clock.now_nanos();
            let snapshot = reread_snapshot(layout, cur, now);
            let (next, out) = step(&snapshot, now);
            let Some(next) = next else {
                return out;
            };
            if self
                .word
                .compare_exchange(cur, next, Ordering::Release, Ordering::Relaxed)
                .is_ok()
            {
                return out;
            }
        }
    }

    /// Takes `cost` tokens if the balance covers them; a rejection writes nothing. On a
    /// sealed word, [`SEALED_ERROR`].
    #[inline(always)]
    pub(crate) fn try_acquire<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &Monotonic<C>,
        now: u64,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        self.try_acquire_with::<C, false>(layout, clock, now, cost)
    }

    /// [`try_acquire`](Self::try_acquire), the slow paths' result written where
    /// `APART` says.
    ///
    /// Without `APART` a slow path (a lost CAS, a reading behind the stored tick) writes
    /// the caller's result in place, with no local of its own and no copy: the better
    /// shape for a caller that returns the result as it is
    /// ([`Bucket::try_acquire`](crate::Bucket::try_acquire), 0.2-0.3 ns slower with its
    /// takes apart). Where the caller moves the result into another type, that shared
    /// result stays in memory: the first attempt's decision was stored in it word by
    /// word, then moved on in 16-byte loads that store-to-load forwarding cannot serve,
    /// a stall of several nanoseconds on every decision. With `APART` a slow path
    /// writes into a place of its own, read back once it returns, and the first
    /// attempt's decision stays in registers (measured: BENCHMARKS.md, "Keyed lookups:
    /// the slow paths' result apart"). A keyed map's take passes `APART`.
    #[inline(always)]
    pub(crate) fn try_acquire_with<C: Clock + ?Sized, const APART: bool>(
        &self,
        layout: &Layout,
        clock: &Monotonic<C>,
        now: u64,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        let Some(cost_units) = layout.units_of(cost) else {
            return Err(cost_over_capacity(layout, cost));
        };
        if cost_units == 0 {
            return self.acquire_nothing(layout, now, cost);
        }
        let now = clock.observe(now);
        let cur = self.word.load(Ordering::Relaxed);
        if S::check(cur).is_err() {
            return Err(SEALED_ERROR);
        }
        // The first attempt of the CAS loop, decided on the loaded word without forming a
        // snapshot: a refusal returns at once, writing nothing (I5). Everything else (a
        // lost CAS, a reading behind the stored tick) is out of line with its arguments
        // in registers, so that the hot path keeps few values alive (measured:
        // BENCHMARKS.md, "Rejection path").
        match layout.first_take(cur, layout.tick_of(now), cost_units) {
            FirstTake::Short { balance } => {
                Ok(Decision::with_balance(layout, balance, 0, now, cost, false))
            }
            FirstTake::Take {
                next,
                balance,
                behind,
            } => match self.word.compare_exchange_weak(
                cur,
                next,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => Ok(Decision::with_balance(
                    layout, balance, behind, now, cost, true,
                )),
                Err(actual) if APART => {
                    apart(move || self.acquire_contended::<C>(layout, clock, now, cost, actual))
                }
                Err(actual) => self.acquire_contended::<C>(layout, clock, now, cost, actual),
            },
            FirstTake::Elsewhere if APART => {
                apart(move || self.acquire_behind::<C>(layout, clock, now, cost, cur))
            }
            FirstTake::Elsewhere => self.acquire_behind::<C>(layout, clock, now, cost, cur),
        }
    }

    /// The decision of [`try_acquire`](Self::try_acquire) where its first attempt makes
    /// it (a refusal on the loaded word, a take whose CAS succeeds, a cost above the
    /// capacity); `None`, having written nothing, where it does not (a cost of zero, a
    /// sealed word, a reading behind the stored tick, a lost CAS): the caller then decides
    /// on a path of its own, out of line. For a limiter that starts again elsewhere on a
    /// sealed word: the hot path returns its decision as it is made, with no result to
    /// look at again.
    #[inline(always)]
    pub(crate) fn try_first<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &Monotonic<C>,
        now: u64,
        cost: u64,
    ) -> Option<Result<Decision, AcquireError>> {
        let Some(cost_units) = layout.units_of(cost) else {
            return Some(Err(cost_over_capacity(layout, cost)));
        };
        if cost_units == 0 {
            return None;
        }
        let now = clock.observe(now);
        let cur = self.word.load(Ordering::Relaxed);
        S::check(cur).ok()?;
        match layout.first_take(cur, layout.tick_of(now), cost_units) {
            FirstTake::Short { balance } => Some(Ok(Decision::with_balance(
                layout, balance, 0, now, cost, false,
            ))),
            FirstTake::Take {
                next,
                balance,
                behind,
            } => self
                .word
                .compare_exchange_weak(cur, next, Ordering::Release, Ordering::Relaxed)
                .ok()
                .map(|_| {
                    Ok(Decision::with_balance(
                        layout, balance, behind, now, cost, true,
                    ))
                }),
            FirstTake::Elsewhere => None,
        }
    }

    /// The first pass of an all-or-nothing acquisition and its take's work at once (see
    /// [`Prepared`]): on the word loaded now, the refusal [`refusal`](Self::refusal)
    /// gives, or the take [`try_acquire`](Self::try_acquire) would make, or neither (a
    /// cost of zero or above the capacity, a reading the word is ahead of but for a take
    /// at its edge: the take decides; a sealed word: the take finds the seal). Writes
    /// nothing.
    #[inline(always)]
    pub(crate) fn prepare(&self, layout: &Layout, now: u64, cost: u64) -> Prepared {
        let Some(cost_units) = layout.units_of(cost).filter(|&u| u > 0) else {
            return Prepared::Open;
        };
        let cur = self.word.load(Ordering::Relaxed);
        if S::check(cur).is_err() {
            return Prepared::Open;
        }
        let now_tick = layout.tick_of(now);
        // The same decision as the take's first attempt on `cur`; where that attempt
        // does not decide, the refusal's own test.
        match layout.first_take(cur, now_tick, cost_units) {
            FirstTake::Short { balance } => {
                Prepared::Refused(Decision::with_balance(layout, balance, 0, now, cost, false))
            }
            FirstTake::Take {
                next,
                balance,
                behind,
            } => {
                let (balance, lead_nanos) =
                    Decision::with_balance(layout, balance, behind, now, cost, true).parts();
                Prepared::Take(Planned {
                    cur,
                    next,
                    balance,
                    lead_nanos,
                    aux: 0,
                })
            }
            FirstTake::Elsewhere => {
                let snapshot = layout.refill(cur, now_tick);
                if snapshot.behind() > layout.tolerance_ticks()
                    || layout.can_take(&snapshot, cost_units)
                {
                    return Prepared::Open;
                }
                Prepared::Refused(Decision::new(
                    layout, &snapshot, now, cost, cost_units, false,
                ))
            }
        }
    }

    /// Lands `plan`, which [`prepare`](Self::prepare) made at `now` for `cost`: one
    /// compare-and-swap from the word it read, else the take's loop from the word found
    /// ([`SEALED_ERROR`] when it was sealed since it was read).
    #[inline(always)]
    pub(crate) fn commit<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &Monotonic<C>,
        now: u64,
        cost: u64,
        plan: &Planned,
    ) -> Result<Decision, AcquireError> {
        let landed = if mutant!(PLANNED_TAKE_STORES_BLIND) {
            self.word.store(plan.next, Ordering::Release);
            Ok(plan.cur)
        } else {
            self.word.compare_exchange_weak(
                plan.cur,
                plan.next,
                Ordering::Release,
                Ordering::Relaxed,
            )
        };
        match landed {
            Ok(_) => Ok(Decision::from_parts(
                layout,
                plan.balance,
                plan.lead_nanos,
                cost,
                true,
            )),
            Err(actual) => {
                let now = clock.observe(now);
                self.acquire_contended::<C>(layout, clock, now, cost, actual)
            }
        }
    }

    /// [`try_acquire`](Self::try_acquire) on the loaded word `cur` where
    /// [`Layout::first_take`] does not decide (a reading behind the stored tick, but for
    /// a take at the next edge): the first attempt of the CAS loop on the refilled
    /// snapshot, from `cur`, then the loop's slow paths. Out of line, and not cold: a
    /// reading a tick or two behind is a lost race, not rare under contention.
    #[inline(never)]
    fn acquire_behind<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &Monotonic<C>,
        now: u64,
        cost: u64,
        cur: u64,
    ) -> Result<Decision, AcquireError> {
        let cost_units = cost << layout.frac_bits();
        let snapshot = layout.refill(cur, layout.tick_of(now));
        if snapshot.behind() > layout.tolerance_ticks() {
            return self.acquire_after_reread::<C>(layout, clock, cost);
        }
        let Some(next) = layout.take(&snapshot, cost_units) else {
            // A rejection writes nothing (I5).
            return Ok(Decision::new(
                layout, &snapshot, now, cost, cost_units, false,
            ));
        };
        match self
            .word
            .compare_exchange_weak(cur, next, Ordering::Release, Ordering::Relaxed)
        {
            Ok(_) => Ok(Decision::new(
                layout, &snapshot, now, cost, cost_units, true,
            )),
            Err(actual) => self.acquire_contended::<C>(layout, clock, now, cost, actual),
        }
    }

    /// The step of [`try_acquire`](Self::try_acquire) for `cost` (`cost_units`):
    /// the whole result, so that the decision is built where it is returned.
    #[inline(always)]
    fn acquire_step<'a>(
        layout: &'a Layout,
        cost: u64,
        cost_units: u64,
    ) -> impl FnMut(&Snapshot, u64) -> Step<Result<Decision, AcquireError>> + 'a {
        move |snapshot, now| match layout.take(snapshot, cost_units) {
            Some(next) => (
                Some(next),
                Ok(Decision::new(layout, snapshot, now, cost, cost_units, true)),
            ),
            None => (
                None,
                Ok(Decision::new(
                    layout, snapshot, now, cost, cost_units, false,
                )),
            ),
        }
    }

    /// [`try_acquire`](Self::try_acquire) after its first CAS was lost to `actual`.
    #[cold]
    #[inline(never)]
    fn acquire_contended<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &Monotonic<C>,
        now: u64,
        cost: u64,
        actual: u64,
    ) -> Result<Decision, AcquireError> {
        let step = Self::acquire_step(layout, cost, cost << layout.frac_bits());
        self.transition_contended::<C, _>(layout, clock, now, true, actual, step, |_| {
            Err(SEALED_ERROR)
        })
    }

    /// [`try_acquire`](Self::try_acquire) once its reading was found well behind
    /// the stored tick.
    #[cold]
    #[inline(never)]
    fn acquire_after_reread<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &Monotonic<C>,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        let step = Self::acquire_step(layout, cost, cost << layout.frac_bits());
        self.transition_after_reread::<C, _>(layout, clock, step, |_| Err(SEALED_ERROR))
    }

    /// [`try_acquire`](Self::try_acquire) for a cost of zero: admitted whatever
    /// the balance or the clock, nothing written.
    #[cold]
    #[inline(never)]
    fn acquire_nothing(
        &self,
        layout: &Layout,
        now: u64,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        let word = self.word.load(Ordering::Relaxed);
        if S::check(word).is_err() {
            return Err(SEALED_ERROR);
        }
        let snapshot = layout.refill(word, layout.tick_of(now));
        Ok(Decision::new(layout, &snapshot, now, cost, 0, true))
    }

    /// Gives back `units` (already validated): never fails (but on a sealed word), never
    /// creates credit.
    #[inline]
    pub(crate) fn refund_units<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &Monotonic<C>,
        now: u64,
        units: u64,
    ) -> S::Out<()> {
        self.transition(layout, clock, now, false, |snapshot, _| {
            (Some(layout.refund(snapshot, units)), ())
        })
    }

    /// Cancels a reservation ready at `ready_tick`: see [`Layout::cancel`]. Never fails
    /// (but on a sealed word), never creates credit.
    pub(crate) fn cancel_units<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &Monotonic<C>,
        now: u64,
        reserved: &crate::state::Reserved,
        ready_tick: u64,
    ) -> S::Out<()> {
        self.transition(layout, clock, now, false, |snapshot, _| {
            (Some(layout.cancel(snapshot, reserved, ready_tick)), ())
        })
    }

    /// Back to the start state, at `now` or at the stored tick if `now` is behind it.
    pub(crate) fn reset<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &Monotonic<C>,
        now: u64,
        full: bool,
    ) -> S::Out<()> {
        self.transition(layout, clock, now, false, |snapshot, _| {
            (Some(layout.restart(snapshot, full)), ())
        })
    }

    /// Rewrites the word refilled to `now` (exact on the tick grid, so nothing changes
    /// but the anchor): a re-anchoring pass's write. A reading behind the stored tick
    /// leaves it as it is.
    pub(crate) fn reanchor<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &Monotonic<C>,
        now: u64,
    ) -> S::Out<()> {
        self.transition(layout, clock, now, false, |s, _| (s.reanchored(), ()))
    }

    /// Time from `now` until `cost` tokens are there (zero if they are), writing nothing.
    pub(crate) fn wait(&self, layout: &Layout, now: u64, cost: u64) -> S::Out<std::time::Duration> {
        let word = self.word.load(Ordering::Relaxed);
        S::out(S::check(word).map(|()| {
            let snapshot = layout.refill(word, layout.tick_of(now));
            Decision::new(layout, &snapshot, now, cost, 0, false).wait_for(cost)
        }))
    }

    /// The refusal [`try_acquire`](Self::try_acquire) would give for `cost` at `now`
    /// (already checked against the capacity) if the balance seen now cannot pay it;
    /// `None` if it can, or if `now` reads well behind the stored tick (only the CAS loop
    /// can tell a lost race from a clock stepping back). Writes nothing.
    #[inline]
    pub(crate) fn refusal(&self, layout: &Layout, now: u64, cost: u64) -> S::Out<Option<Decision>> {
        let word = self.word.load(Ordering::Relaxed);
        S::out(S::check(word).map(|()| {
            let snapshot = layout.refill(word, layout.tick_of(now));
            let cost_units = layout.units_of(cost)?;
            if snapshot.behind() > layout.tolerance_ticks()
                || layout.can_take(&snapshot, cost_units)
            {
                return None;
            }
            Some(Decision::new(
                layout, &snapshot, now, cost, cost_units, false,
            ))
        }))
    }

    /// The refilled snapshot at `now`, writing nothing.
    #[inline]
    pub(crate) fn snapshot(&self, layout: &Layout, now: u64) -> S::Out<Snapshot> {
        let word = self.word.load(Ordering::Relaxed);
        S::out(S::check(word).map(|()| layout.refill(word, layout.tick_of(now))))
    }
}

/// Runs the slow path `slow` out of line, its result written into a place of its own,
/// and reads it back (see [`RawBucket::try_acquire_with`]): the caller's result is then
/// never written through a pointer, and the compiler keeps a first attempt's result in
/// registers.
#[inline(always)]
fn apart<T>(slow: impl FnOnce() -> T) -> T {
    #[inline(never)]
    fn run<T>(slow: impl FnOnce() -> T, out: &mut MaybeUninit<T>) {
        out.write(slow());
    }
    let mut out = MaybeUninit::uninit();
    run(slow, &mut out);
    // SAFETY: `run` wrote `out` (a panic in `slow` unwinds past this read).
    unsafe { out.assume_init() }
}

/// [`cost_exceeds_capacity`], out of line: the hot path only branches to it.
#[cold]
#[inline(never)]
fn cost_over_capacity(layout: &Layout, cost: u64) -> AcquireError {
    cost_exceeds_capacity(layout, cost)
}

/// How far behind the stored tick a reading may be before the transition reads the clock
/// again after loading the word: the race tolerance for admissions; nothing for credit.
#[inline(always)]
fn slack(layout: &Layout, strict: bool) -> u64 {
    if strict { layout.tolerance_ticks() } else { 0 }
}

/// The snapshot of `cur` at a reading `now` taken after loading it, from a monotonic
/// clock: still far behind, the bucket idled past the wrap and is re-anchored full. See
/// [`RawBucket::transition_after_reread`].
#[inline]
pub(crate) fn reread_snapshot(layout: &Layout, cur: u64, now: u64) -> Snapshot {
    let now_tick = layout.tick_of(now);
    let snapshot = layout.refill(cur, now_tick);
    if snapshot.behind() > layout.tolerance_ticks() {
        layout.reanchor_full(now_tick)
    } else {
        snapshot
    }
}
