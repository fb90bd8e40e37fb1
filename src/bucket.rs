//! One atomic word and the CAS loop around [`state`](crate::state).
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

use std::convert::Infallible;
use std::fmt;
use std::marker::PhantomData;
use std::mem::MaybeUninit;

use crossbeam_utils::CachePadded;

use crate::clock::{Clock, Monotonic, QuantaClock};
use crate::decision::Decision;
use crate::error::{AcquireError, cost_exceeds_capacity};
use crate::multi::{Planned, Prepared};
use crate::pass::Passes;
use crate::policy::Policy;
use crate::state::{FirstTake, Layout, SEALED, Snapshot};
use crate::sync::{AtomicU64, Ordering};

/// What a transition step decided: the word to write (if any) and the result.
pub(crate) type Step<T> = (Option<u64>, T);

/// Whether a word may be [`SEALED`], as part of its type ([`RawBucket<S>`], [`Core<S>`]),
/// and what an operation on it returns.
///
/// A word of a policy that is never replaced ([`Fixed`]: [`Bucket`], keyed maps) is
/// never sealed: its check compiles away, and its operations return their result as it
/// is. A word of a policy a reconfiguration replaces ([`Sealable`]) is sealed by the
/// switch: every operation on it checks, and one that finds it sealed decides and writes
/// nothing and returns [`Sealed`] (wrapped in [`Seal::Out`]) so that its caller starts
/// again on the new policy.
pub(crate) trait Seal {
    /// What an operation stops with on a sealed word.
    type Stop;
    /// What an operation returns that may stop: `T` itself where no word is ever sealed,
    /// `Result<T, Sealed>` where it may be.
    type Out<T>;
    /// `Err` when `word` is sealed.
    fn check(word: u64) -> Result<(), Self::Stop>;
    /// An operation's result as [`Out`](Seal::Out).
    fn out<T>(result: Result<T, Self::Stop>) -> Self::Out<T>;
    /// An [`Out`](Seal::Out) as a `Result`, for an operation built on another.
    fn result<T>(out: Self::Out<T>) -> Result<T, Self::Stop>;
}

/// The words of a bucket that is never reconfigured ([`Bucket`], keyed maps): never
/// sealed, and the check compiles away.
pub(crate) enum Fixed {}

impl Seal for Fixed {
    type Stop = Infallible;
    type Out<T> = T;
    #[inline(always)]
    fn check(_: u64) -> Result<(), Infallible> {
        Ok(())
    }
    #[inline(always)]
    fn out<T>(result: Result<T, Infallible>) -> T {
        let Ok(out) = result;
        out
    }
    #[inline(always)]
    fn result<T>(out: T) -> Result<T, Infallible> {
        Ok(out)
    }
}

/// The words of a [`LiveBucket`](crate::LiveBucket)'s policies: sealed when a
/// reconfiguration replaces the policy, after which every operation on it stops and
/// starts again on the new one.
pub(crate) enum Sealable {}

/// An operation found its word sealed: nothing was decided or written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sealed;

/// What [`RawBucket::try_acquire`] returns on a sealed word, in place of a decision
/// (the hot path builds its result in place: no wrapper to unwrap). A live bucket has no
/// pool, so no decision of its own is ever this error; it retries on the new policy.
pub(crate) const SEALED_ERROR: AcquireError = AcquireError::PoolUnavailable {
    retry_after: std::time::Duration::MAX,
};

impl Seal for Sealable {
    type Stop = Sealed;
    type Out<T> = Result<T, Sealed>;
    #[inline(always)]
    fn check(word: u64) -> Result<(), Sealed> {
        if word == SEALED { Err(Sealed) } else { Ok(()) }
    }
    #[inline(always)]
    fn out<T>(result: Result<T, Sealed>) -> Result<T, Sealed> {
        result
    }
    #[inline(always)]
    fn result<T>(out: Result<T, Sealed>) -> Result<T, Sealed> {
        out
    }
}

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

/// One policy and its word: a [`Bucket`]'s state (`Core<Fixed>`), and one policy epoch
/// of a [`LiveBucket`](crate::LiveBucket) or a scoped limiter's global word
/// (`Core<Sealable>`). Its operations take the limiter's clock; `S` says whether the word
/// may be sealed (see [`Seal`]).
// `repr(C)`: the due time of the next pass sits right after the word's padded line, on
// the line that holds the layout every operation reads.
#[repr(C)]
pub(crate) struct Core<S: Seal = Fixed> {
    raw: CachePadded<RawBucket<S>>,
    /// When the word is next re-anchored against the tick wrap (see [`crate::pass`]).
    passes: Passes,
    policy: Policy,
}

impl<S: Seal> Core<S> {
    /// A policy's state at `created`: `word`, or the policy's start state.
    pub(crate) fn new(policy: Policy, created: u64, word: Option<u64>) -> Core<S> {
        let layout = policy.layout();
        let raw = match word {
            Some(word) => RawBucket::from_word(word),
            None => RawBucket::new(layout, created, policy.starts_full()),
        };
        Core {
            raw: CachePadded::new(raw),
            passes: Passes::new(layout, created),
            policy,
        }
    }

    /// `from`'s policy holding `word` (a state of `from`, read at its seal) from the
    /// switch reading `at`, its passes due no later than `from`'s: a word whose policy a
    /// switch does not change, carried over untouched.
    pub(crate) fn carried(from: &Core<S>, word: u64, at: u64) -> Core<S> {
        let timing = crate::pass::Timing::of(from.policy.layout());
        Core {
            raw: CachePadded::new(RawBucket::from_word(word)),
            passes: Passes::continuing(&from.passes, timing, at),
            policy: from.policy,
        }
    }

    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    pub(crate) fn raw(&self) -> &RawBucket<S> {
        &self.raw
    }

    pub(crate) fn passes(&self) -> &Passes {
        &self.passes
    }

    /// `now` (a guarded reading), after the re-anchoring pass if one is due: one relaxed
    /// load and a predicted branch otherwise. See [`crate::pass`]. A pass on a sealed
    /// word writes nothing: the operation then finds it sealed.
    #[inline(always)]
    pub(crate) fn at<C: Clock + ?Sized>(&self, clock: &Monotonic<C>, now: u64) -> u64 {
        self.passes
            .check(now, clock, |now, idle| self.pass::<C>(clock, now, idle))
    }

    /// The re-anchoring pass: the word refilled to `now` at its own tick, or, after an
    /// idle longer than the fill time (`idle`), full.
    #[cold]
    #[inline(never)]
    fn pass<C: Clock + ?Sized>(&self, clock: &Monotonic<C>, now: u64, idle: bool) {
        let layout = self.policy.layout();
        // A sealed word is left as it is: its policy has been replaced.
        let _sealed = if idle {
            self.raw.fill(layout, now)
        } else {
            self.raw.reanchor(layout, clock, now)
        };
    }

    /// [`Bucket::try_acquire`] at the guarded reading `now`; [`SEALED_ERROR`] on a sealed
    /// word.
    #[inline(always)]
    pub(crate) fn try_acquire<C: Clock + ?Sized>(
        &self,
        clock: &Monotonic<C>,
        now: u64,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        if self.passes.is_due(now) {
            return self.acquire_due::<C>(clock, now, cost);
        }
        self.raw.try_acquire(self.policy.layout(), clock, now, cost)
    }

    /// [`try_acquire`](Core::try_acquire) at a reading at or after the re-anchoring
    /// pass's due time: a decision that writes nothing (a rejection, a zero cost) is
    /// made read-only on the pass's view (see [`crate::pass`]), so it still writes
    /// nothing; an admission runs the pass first.
    #[cold]
    #[inline(never)]
    pub(crate) fn acquire_due<C: Clock + ?Sized>(
        &self,
        clock: &Monotonic<C>,
        now: u64,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        let layout = self.policy.layout();
        let Some(cost_units) = layout.units_of(cost) else {
            return Err(cost_exceeds_capacity(layout, cost));
        };
        if !self.passes.idle_at(now) {
            // The word reads exactly.
            if cost_units == 0 {
                return self.raw.try_acquire(layout, clock, now, cost);
            }
            match S::result(self.raw.refusal(layout, now, cost)) {
                Ok(Some(refusal)) => return Ok(refusal),
                Ok(None) => {}
                Err(_) => return Err(SEALED_ERROR),
            }
        } else if cost_units == 0 {
            if S::check(self.raw.load()).is_err() {
                return Err(SEALED_ERROR);
            }
            let full = layout.reanchor_full(layout.tick_of(now));
            return Ok(Decision::new(layout, &full, now, cost, 0, true));
        }
        let now = self.at::<C>(clock, now);
        self.raw.try_acquire(layout, clock, now, cost)
    }

    /// [`Bucket::refund`].
    pub(crate) fn refund<C: Clock + ?Sized>(
        &self,
        clock: &Monotonic<C>,
        cost: u64,
    ) -> S::Out<Result<(), AcquireError>> {
        let layout = self.policy.layout();
        let Some(units) = layout.units_of(cost) else {
            return S::out(Ok(Err(cost_exceeds_capacity(layout, cost))));
        };
        if units == 0 {
            return S::out(Ok(Ok(())));
        }
        let now = self.at::<C>(clock, clock.now_nanos());
        S::out(S::result(self.raw.refund_units(layout, clock, now, units)).map(Ok))
    }

    /// [`Bucket::reset`].
    pub(crate) fn reset<C: Clock + ?Sized>(&self, clock: &Monotonic<C>) -> S::Out<()> {
        let now = self.at::<C>(clock, clock.now_nanos());
        self.raw
            .reset(self.policy.layout(), clock, now, self.policy.starts_full())
    }

    /// The snapshot a decision at the guarded reading `now` sees, writing nothing: the
    /// pass's view once one is due (full after an idle longer than the fill time).
    pub(crate) fn view(&self, now: u64) -> S::Out<Snapshot> {
        let layout = self.policy.layout();
        let word = self.raw.load();
        S::out(S::check(word).map(|()| {
            if self.passes.is_due(now) && self.passes.idle_at(now) {
                layout.reanchor_full(layout.tick_of(now))
            } else {
                layout.refill(word, layout.tick_of(now))
            }
        }))
    }

    /// [`Bucket::available`].
    pub(crate) fn available<C: Clock + ?Sized>(&self, clock: &Monotonic<C>) -> S::Out<f64> {
        let layout = self.policy.layout();
        S::out(
            S::result(self.view(clock.now_nanos()))
                .map(|snapshot| layout.units_to_tokens(layout.balance_units(&snapshot))),
        )
    }
}

/// A token bucket: capacity `B`, refill rate `r`, its whole state in one atomic 64-bit
/// word.
///
/// Every operation takes `&self`; share a bucket across threads with `Arc` or a
/// `static`. The word sits alone on its cache line ([`CachePadded`]), so a bucket never
/// shares a line with its neighbours.
///
/// The hot path of [`try_acquire`](Bucket::try_acquire) is one clock read, one atomic
/// load, integer shifts and one multiply (no division, no floating point, no allocation),
/// and one CAS only when admitting; a lost CAS retries with the value it returned.
///
/// ```
/// use std::time::Duration;
/// use tokengate::{Bucket, ManualClock, Policy};
///
/// // B = 100, r = 20/s: a burst of 100, then 20 per second.
/// let clock = ManualClock::new();
/// let bucket = Bucket::with_clock(Policy::new(100, 20.0)?, clock.clone());
/// let burst = (0..150).filter(|_| bucket.try_acquire(1).unwrap().is_admitted()).count();
/// assert_eq!(burst, 100);
///
/// clock.advance(Duration::from_secs(1));
/// let next = (0..150).filter(|_| bucket.try_acquire(1).unwrap().is_admitted()).count();
/// assert_eq!(next, 19); // 20/s less the 0.01% rounding down, which never adds credit
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[repr(C)]
pub struct Bucket<C: Clock = QuantaClock> {
    core: Core<Fixed>,
    clock: Monotonic<C>,
}

impl<C: Clock> fmt::Debug for Bucket<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bucket")
            .field("policy", self.policy())
            .field("available", &self.available())
            .finish()
    }
}

impl Bucket<QuantaClock> {
    /// A bucket on the default clock ([`QuantaClock`]), in the policy's start state.
    ///
    /// ```
    /// use tokengate::{Bucket, Policy};
    /// let bucket = Bucket::new(Policy::new(10, 1.0)?);
    /// assert!(bucket.try_acquire(10)?.is_admitted());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(policy: Policy) -> Bucket<QuantaClock> {
        Bucket::with_clock(policy, QuantaClock::new())
    }
}

impl<C: Clock> Bucket<C> {
    /// A bucket on `clock`, in the policy's start state at the clock's current time.
    pub fn with_clock(policy: Policy, clock: C) -> Bucket<C> {
        let clock = Monotonic::new(clock);
        let created = clock.now_nanos();
        Bucket {
            core: Core::new(policy, created, None),
            clock,
        }
    }

    /// The clock's reading (through the monotonic guard), after the re-anchoring pass if
    /// one is due: every operation reads time here.
    #[inline(always)]
    pub(crate) fn now(&self) -> u64 {
        self.at(self.clock.now_nanos())
    }

    /// `now` (a guarded reading), after the re-anchoring pass if one is due: one relaxed
    /// load and a predicted branch otherwise. See [`crate::pass`].
    #[inline(always)]
    pub(crate) fn at(&self, now: u64) -> u64 {
        self.core.at(&self.clock, now)
    }

    /// Takes `cost` tokens if the balance covers them.
    ///
    /// Returns a [`Decision`]: admitted (the cost is taken) or rejected (nothing changed,
    /// nothing written; [`Decision::retry_after`] says when the cost will be there). A
    /// cost of zero is always admitted, whatever the balance (even while reservations are
    /// owed) or the clock, and writes nothing.
    ///
    /// # Errors
    ///
    /// - [`AcquireError::CostExceedsCapacity`] at once for a cost above the capacity,
    ///   which could never be admitted (I8).
    ///
    /// A clock that steps back is read through a high-water mark ([`Monotonic`]): time
    /// stands still for the bucket until the clock passes its highest reading again.
    ///
    /// ```
    /// use tokengate::{AcquireError, Bucket, ManualClock, Policy};
    /// let bucket = Bucket::with_clock(Policy::new(10, 1.0)?, ManualClock::new());
    /// assert!(bucket.try_acquire(3)?.is_admitted());
    /// assert_eq!(
    ///     bucket.try_acquire(11),
    ///     Err(AcquireError::CostExceedsCapacity { cost: 11, capacity: 10 })
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    // Always inlined, as every single-bucket entry point is: out of line, the 48-byte
    // result is stored field by field into the caller's memory, and a caller that moves
    // it on at once (criterion's `iter` does) reads it back in 16-byte loads that
    // store-to-load forwarding cannot serve, a stall on every decision (measured:
    // BENCHMARKS.md, "The goals on the Zen 2 EPYC").
    #[inline(always)]
    pub fn try_acquire(&self, cost: u64) -> Result<Decision, AcquireError> {
        let now = self.clock.now_nanos();
        self.core.try_acquire(&self.clock, now, cost)
    }

    /// [`try_acquire`](Bucket::try_acquire) at a guarded reading at or after the
    /// re-anchoring pass's due time (see [`Core::acquire_due`]).
    pub(crate) fn acquire_due(&self, now: u64, cost: u64) -> Result<Decision, AcquireError> {
        self.core.acquire_due(&self.clock, now, cost)
    }

    pub(crate) fn passes(&self) -> &Passes {
        self.core.passes()
    }

    /// Gives back `cost` tokens of an earlier admission, exactly as if it had never been
    /// taken: `min(B, balance now + cost)` (I6). Use it when admitted work did not run.
    ///
    /// Refunding more than was taken cannot overfill the bucket: the result is capped at
    /// the capacity.
    ///
    /// ```
    /// use tokengate::{Bucket, ManualClock, Policy};
    /// let bucket = Bucket::with_clock(Policy::new(10, 1.0)?, ManualClock::new());
    /// bucket.try_acquire(4)?;
    /// bucket.refund(4)?;
    /// assert_eq!(bucket.available(), 10.0);
    /// bucket.refund(4)?; // capped
    /// assert_eq!(bucket.available(), 10.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`AcquireError::CostExceedsCapacity`] for a cost above the capacity (nothing
    /// changes).
    pub fn refund(&self, cost: u64) -> Result<(), AcquireError> {
        self.core.refund(&self.clock, cost)
    }

    /// Puts the bucket back in the policy's start state (full or empty).
    ///
    /// ```
    /// use tokengate::{Bucket, ManualClock, Policy};
    /// let bucket = Bucket::with_clock(Policy::new(10, 1.0)?, ManualClock::new());
    /// bucket.try_acquire(10)?;
    /// bucket.reset();
    /// assert_eq!(bucket.available(), 10.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset(&self) {
        self.core.reset(&self.clock);
    }

    /// Tokens available now (fractional; negative while reservations are owed). A
    /// read-only peek: it writes nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokengate::{Bucket, ManualClock, Policy};
    /// let clock = ManualClock::new();
    /// let bucket = Bucket::with_clock(Policy::new(10, 4.0)?.start_empty(), clock.clone());
    /// clock.advance(Duration::from_millis(500));
    /// // 2 tokens, less under two ticks' refill (ticks are 0.5 ms here): refill counts
    /// // whole ticks from the tick edge after the bucket's creation.
    /// let available = bucket.available();
    /// assert!(available > 1.996 && available <= 2.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn available(&self) -> f64 {
        self.core.available(&self.clock)
    }

    /// The policy this bucket enforces.
    pub fn policy(&self) -> &Policy {
        self.core.policy()
    }

    /// The clock this bucket reads.
    pub fn clock(&self) -> &C {
        self.clock.get_ref()
    }

    /// The clock as the bucket reads it: through its monotonic guard.
    #[inline]
    pub(crate) fn guarded_clock(&self) -> &Monotonic<C> {
        &self.clock
    }

    /// A stable identity for ordering buckets (its address); used by multi-bucket
    /// acquisition to take buckets in one global order.
    #[inline]
    pub fn id(&self) -> usize {
        self.core.raw().id()
    }

    pub(crate) fn raw(&self) -> &RawBucket {
        self.core.raw()
    }

    /// The packed word as stored, before any refill: decode it with the policy's
    /// [`Layout`](crate::state::Layout). For diagnostics, and to check that an operation
    /// wrote nothing (a rejection leaves it unchanged).
    ///
    /// ```
    /// use tokengate::{Bucket, ManualClock, Policy};
    ///
    /// let bucket = Bucket::with_clock(Policy::new(2, 1.0)?, ManualClock::new());
    /// assert!(bucket.try_acquire(2)?.is_admitted());
    /// let word = bucket.stored_word();
    /// assert!(bucket.try_acquire(1)?.is_rejected());
    /// assert_eq!(bucket.stored_word(), word); // a rejection writes nothing
    /// let (_, units) = bucket.policy().layout().decode(word).unwrap();
    /// assert_eq!(units, bucket.policy().layout().base_units()); // empty
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stored_word(&self) -> u64 {
        self.core.raw().load()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn racing_threads_admit_exactly_the_capacity_through_lost_cases() {
        // Time stands still: 4 threads race for 10,000 tokens one at a time; every lost
        // CAS goes through the contended path, and exactly the capacity is admitted.
        let bucket = Bucket::with_clock(Policy::new(10_000, 100.0).unwrap(), ManualClock::new());
        let admitted: usize = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..5_000)
                            .filter(|_| bucket.try_acquire(1).unwrap().is_admitted())
                            .count()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert_eq!(admitted, 10_000);
        assert_eq!(bucket.available(), 0.0);
    }

    #[test]
    fn a_clock_step_back_is_time_standing_still() {
        use std::time::Duration;
        let clock = ManualClock::new();
        let bucket = Bucket::with_clock(Policy::new(10, 1.0).unwrap(), clock.clone());
        clock.set(Duration::from_secs(10));
        bucket.try_acquire(10).unwrap();
        // Back five seconds, then forward four: still behind the highest reading, so no
        // time has passed for the bucket.
        clock.set(Duration::from_secs(5));
        assert!(!bucket.try_acquire(1).unwrap().is_admitted());
        clock.set(Duration::from_secs(9));
        assert!(!bucket.try_acquire(1).unwrap().is_admitted());
        assert_eq!(bucket.available(), 0.0);
        // Past the highest reading by two seconds: two seconds of refill, less the tick
        // the drain's anchor holds back.
        clock.set(Duration::from_secs(12));
        let available = bucket.available();
        assert!(available < 2.0 && available > 1.99, "{available}");
    }
}
