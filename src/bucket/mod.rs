//! [`Bucket`]: one policy's word, cache-padded, and its clock. The word and its CAS loop
//! are [`RawBucket`] (`raw.rs`; its orderings are documented there), one policy with its
//! word is [`Core`] (`core.rs`), and whether a word may be sealed by a reconfiguration is
//! its type's [`Seal`] (`seal.rs`).

mod core;
mod raw;
mod seal;

use std::fmt;

pub(crate) use self::core::Core;
pub(crate) use raw::{RawBucket, reread_snapshot};
pub(crate) use seal::{Fixed, SEALED_ERROR, Seal, Sealable, Sealed};

use crate::clock::{Clock, Monotonic, QuantaClock};
use crate::decision::Decision;
use crate::error::AcquireError;
use crate::pass::Passes;
use crate::policy::Policy;

/// A token bucket: capacity `B`, refill rate `r`, its whole state in one atomic 64-bit
/// word.
///
/// Every operation takes `&self`; share a bucket across threads with `Arc` or a
/// `static`. The word sits alone on its cache line ([`CachePadded`](crossbeam_utils::CachePadded)), so a bucket never
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
