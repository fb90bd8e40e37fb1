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

use std::fmt;

use crossbeam_utils::CachePadded;

use crate::clock::{Clock, QuantaClock};
use crate::decision::Decision;
use crate::error::{AcquireError, clock_went_backwards, cost_exceeds_capacity};
use crate::policy::Policy;
use crate::state::{Layout, Snapshot};
use crate::sync::{AtomicU64, Ordering};

/// What a transition step decided: the word to write (if any) and the result.
pub(crate) type Step<T> = (Option<u64>, T);

/// The bare atomic word of a bucket, without padding, policy or clock: what keyed maps
/// store per key and what [`Bucket`] pads.
pub(crate) struct RawBucket {
    word: AtomicU64,
}

impl fmt::Debug for RawBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RawBucket")
            .field(&self.word.load(Ordering::Relaxed))
            .finish()
    }
}

impl RawBucket {
    /// A bucket in the policy's start state at `now_nanos`.
    pub(crate) fn new(layout: &Layout, now_nanos: u64, full: bool) -> RawBucket {
        RawBucket {
            word: AtomicU64::new(layout.start_word(layout.tick_of(now_nanos), full)),
        }
    }

    /// A stable identity while the bucket is borrowed: its address.
    #[inline]
    pub(crate) fn id(&self) -> usize {
        &self.word as *const AtomicU64 as usize
    }

    /// The packed word, for tests and diagnostics.
    #[inline]
    pub(crate) fn load(&self) -> u64 {
        self.word.load(Ordering::Relaxed)
    }

    /// The CAS loop every operation shares: one load, then `step` on the refilled
    /// snapshot; a lost CAS retries with the value it returned (no reload).
    ///
    /// With `strict`, a `now` behind the stored tick by more than the race tolerance
    /// goes to a slow path that loads the word before reading the clock again (the thread
    /// may simply have been descheduled since its reading) and refuses with
    /// [`AcquireError::ClockWentBackwards`], writing nothing, only if a reading taken
    /// after the load is still behind. Without it (refunds, peeks,
    /// resets) the step runs on the stored state, which adds no credit either.
    ///
    /// Only the first attempt is inlined into the caller; the retries after a lost CAS
    /// ([`transition_contended`](Self::transition_contended)) and the re-read are out of
    /// line, so the uncontended path keeps its registers (measured: BENCHMARKS.md).
    #[inline(always)]
    pub(crate) fn transition<C: Clock + ?Sized, T>(
        &self,
        layout: &Layout,
        clock: &C,
        now: u64,
        strict: bool,
        mut step: impl FnMut(&Snapshot, u64) -> Step<T>,
    ) -> Result<T, AcquireError> {
        let cur = self.word.load(Ordering::Relaxed);
        let snapshot = layout.refill(cur, layout.tick_of(now));
        if strict && snapshot.behind() > layout.tolerance_ticks() {
            return self.transition_after_reread(layout, clock, step);
        }
        let (next, out) = step(&snapshot, now);
        let Some(next) = next else {
            return Ok(out);
        };
        match self
            .word
            .compare_exchange_weak(cur, next, Ordering::Release, Ordering::Relaxed)
        {
            Ok(_) => Ok(out),
            Err(actual) => self.transition_contended(layout, clock, now, strict, actual, step),
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
    fn transition_contended<C: Clock + ?Sized, T>(
        &self,
        layout: &Layout,
        clock: &C,
        now: u64,
        strict: bool,
        mut cur: u64,
        mut step: impl FnMut(&Snapshot, u64) -> Step<T>,
    ) -> Result<T, AcquireError> {
        let now_tick = layout.tick_of(now);
        loop {
            let snapshot = layout.refill(cur, now_tick);
            if strict && snapshot.behind() > layout.tolerance_ticks() {
                return self.transition_after_reread(layout, clock, step);
            }
            let (next, out) = step(&snapshot, now);
            let Some(next) = next else {
                return Ok(out);
            };
            match self
                .word
                .compare_exchange_weak(cur, next, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return Ok(out),
                Err(actual) => cur = actual,
            }
        }
    }

    /// The strict transition once `now` was found well behind the stored tick.
    ///
    /// A thread descheduled between its clock reading and its CAS (for milliseconds, on
    /// a loaded machine) sees words stored by threads that read the clock later: a lost
    /// race, however long, not a clock stepping back. So this path loads the word
    /// *first* and reads the clock *after*: every tick in the loaded word was then read
    /// from the clock before this reading, and a reading still well behind it is a clock
    /// that stepped back (or the time of a bucket idle past its wrap period): refused,
    /// unless the bucket is full, which holds the same at any time and is re-anchored at
    /// the new reading (no credit; this is what makes a full bucket immune to the wrap).
    /// A lost CAS here reloads and reads again: it is the cold path, and each loss means
    /// another thread made progress. Out of line, so that the hot loop stays small.
    #[cold]
    #[inline(never)]
    fn transition_after_reread<C: Clock + ?Sized, T>(
        &self,
        layout: &Layout,
        clock: &C,
        mut step: impl FnMut(&Snapshot, u64) -> Step<T>,
    ) -> Result<T, AcquireError> {
        loop {
            let cur = self.word.load(Ordering::Acquire);
            let now = clock.now_nanos();
            let mut snapshot = layout.refill(cur, layout.tick_of(now));
            if snapshot.behind() > layout.tolerance_ticks() {
                // The clock stepped back (or an idle bucket's time wrapped). A full
                // bucket holds the same at every time: re-anchor it at `now`, adding
                // nothing. Any other balance at `now` is unknown: refuse.
                match layout.reanchor_full(&snapshot, layout.tick_of(now)) {
                    Some(full) => snapshot = full,
                    None => return Err(clock_went_backwards(layout, &snapshot, now)),
                }
            }
            let (next, out) = step(&snapshot, now);
            let Some(next) = next else {
                return Ok(out);
            };
            if self
                .word
                .compare_exchange(cur, next, Ordering::Release, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(out);
            }
        }
    }

    /// Takes `cost` tokens if the balance covers them; a rejection writes nothing.
    #[inline(always)]
    pub(crate) fn try_acquire<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
        now: u64,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        let Some(cost_units) = layout.units_of(cost) else {
            return Err(cost_exceeds_capacity(layout, cost));
        };
        if cost_units == 0 {
            // Nothing to take: admitted whatever the balance or the clock, nothing written.
            let snapshot = self.snapshot(layout, now);
            return Ok(Decision::new(layout, &snapshot, now, cost, 0, true));
        }
        self.transition(layout, clock, now, true, |snapshot, now| {
            match layout.take(snapshot, cost_units) {
                Some(next) => (
                    Some(next),
                    Decision::new(layout, snapshot, now, cost, cost_units, true),
                ),
                None => (
                    None,
                    Decision::new(layout, snapshot, now, cost, cost_units, false),
                ),
            }
        })
    }

    /// Gives back `cost` tokens taken earlier: `min(B, refill(now) + cost)` (I6).
    #[inline]
    pub(crate) fn refund<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
        now: u64,
        cost: u64,
    ) -> Result<(), AcquireError> {
        let Some(cost_units) = layout.units_of(cost) else {
            return Err(cost_exceeds_capacity(layout, cost));
        };
        if cost_units == 0 {
            return Ok(());
        }
        self.refund_units(layout, clock, now, cost_units);
        Ok(())
    }

    /// Gives back `units` (already validated): never fails, never creates credit.
    #[inline]
    pub(crate) fn refund_units<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
        now: u64,
        units: u64,
    ) {
        let done = self.transition(layout, clock, now, false, |snapshot, _| {
            (Some(layout.refund(snapshot, units)), ())
        });
        debug_assert!(done.is_ok(), "a non-strict transition cannot fail");
    }

    /// Back to the start state, at `now` or at the stored tick if `now` is behind it.
    pub(crate) fn reset<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
        now: u64,
        full: bool,
    ) {
        let done = self.transition(layout, clock, now, false, |snapshot, _| {
            (Some(layout.start_word(snapshot.tick(layout), full)), ())
        });
        debug_assert!(done.is_ok(), "a non-strict transition cannot fail");
    }

    /// Time from `now` until `cost` tokens are there (zero if they are), writing nothing.
    pub(crate) fn wait(&self, layout: &Layout, now: u64, cost: u64) -> std::time::Duration {
        let snapshot = self.snapshot(layout, now);
        Decision::new(layout, &snapshot, now, cost, 0, false).wait_for(cost)
    }

    /// The refusal [`try_acquire`](Self::try_acquire) would give for `cost` at `now`
    /// (already checked against the capacity) if the balance seen now cannot pay it;
    /// `None` if it can, or if `now` reads well behind the stored tick (only the CAS loop
    /// can tell a lost race from a clock stepping back). Writes nothing.
    #[inline]
    pub(crate) fn refusal(&self, layout: &Layout, now: u64, cost: u64) -> Option<Decision> {
        let snapshot = self.snapshot(layout, now);
        let cost_units = layout.units_of(cost)?;
        if snapshot.behind() > layout.tolerance_ticks()
            || layout.take(&snapshot, cost_units).is_some()
        {
            return None;
        }
        Some(Decision::new(
            layout, &snapshot, now, cost, cost_units, false,
        ))
    }

    /// The refilled snapshot at `now`, writing nothing.
    #[inline]
    pub(crate) fn snapshot(&self, layout: &Layout, now: u64) -> Snapshot {
        layout.refill(self.word.load(Ordering::Relaxed), layout.tick_of(now))
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
pub struct Bucket<C: Clock = QuantaClock> {
    raw: CachePadded<RawBucket>,
    policy: Policy,
    clock: C,
}

impl<C: Clock> fmt::Debug for Bucket<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bucket")
            .field("policy", &self.policy)
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
        let raw = RawBucket::new(policy.layout(), clock.now_nanos(), policy.starts_full());
        Bucket {
            raw: CachePadded::new(raw),
            policy,
            clock,
        }
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
    /// - [`AcquireError::ClockWentBackwards`] when the clock reads well behind the
    ///   bucket's last update and the bucket is not full.
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
    #[inline]
    pub fn try_acquire(&self, cost: u64) -> Result<Decision, AcquireError> {
        let now = self.clock.now_nanos();
        self.raw
            .try_acquire(self.policy.layout(), &self.clock, now, cost)
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
        let now = self.clock.now_nanos();
        self.raw
            .refund(self.policy.layout(), &self.clock, now, cost)
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
        let now = self.clock.now_nanos();
        self.raw.reset(
            self.policy.layout(),
            &self.clock,
            now,
            self.policy.starts_full(),
        );
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
    /// // 2 tokens, less what has not reached a tick edge yet (ticks are 0.5 ms here).
    /// let available = bucket.available();
    /// assert!(available > 1.998 && available <= 2.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn available(&self) -> f64 {
        let layout = self.policy.layout();
        let snapshot = self.raw.snapshot(layout, self.clock.now_nanos());
        layout.units_to_tokens(layout.balance_units(&snapshot))
    }

    /// The policy this bucket enforces.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The clock this bucket reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// A stable identity for ordering buckets (its address); used by multi-bucket
    /// acquisition to take buckets in one global order.
    #[inline]
    pub fn id(&self) -> usize {
        self.raw.id()
    }

    pub(crate) fn raw(&self) -> &RawBucket {
        &self.raw
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
        self.raw.load()
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
    fn clock_step_back_is_refused_after_one_reread() {
        let clock = ManualClock::new();
        let bucket = Bucket::with_clock(Policy::new(10, 1.0).unwrap(), clock.clone());
        clock.set(std::time::Duration::from_secs(10));
        bucket.try_acquire(5).unwrap();
        clock.set(std::time::Duration::from_secs(5));
        assert!(matches!(
            bucket.try_acquire(1),
            Err(AcquireError::ClockWentBackwards { .. })
        ));
        assert_eq!(bucket.available(), 5.0);
    }
}
