//! What can take part in an all-or-nothing acquisition: the sealed [`Member`] trait, and
//! the one borrowed bucket type every word-backed member goes through.

use std::fmt;
use std::mem::MaybeUninit;
use std::time::Duration;

use crate::bucket::{Bucket, RawBucket};
use crate::clock::{Clock, Monotonic};
use crate::decision::Decision;
use crate::error::AcquireError;
use crate::state::Layout;

pub(crate) mod sealed {
    use std::mem::MaybeUninit;
    use std::time::Duration;

    use crate::decision::Decision;
    use crate::error::AcquireError;

    /// A member's operations at a given clock reading, private to the crate: the
    /// all-or-nothing guarantee rests on every member's take and refund being exact.
    pub trait Sealed {
        /// Reads the member's clock (once per acquisition, on the first member).
        fn now_nanos(&self) -> u64;

        /// `try_acquire(cost)` at `now`.
        fn take_at(&self, cost: u64, now: u64) -> Result<Decision, AcquireError>;

        /// Refunds `cost` (at most the capacity) at `now`.
        fn refund_at(&self, cost: u64, now: u64);

        /// Time from `now` until `cost` tokens are there.
        fn wait_at(&self, cost: u64, now: u64) -> Duration;

        /// The read-only first pass: the refusal `take_at(cost, now)` would give if the
        /// balance seen now cannot pay, or `None` (it could pay, or only the take can
        /// tell). Writes nothing.
        fn refusal_at(&self, cost: u64, now: u64) -> Option<Decision> {
            let _ = (cost, now);
            None
        }

        /// The read-only first pass with the take's work done on what it read, written
        /// to `plan`: the refusal [`refusal_at`](Sealed::refusal_at) gives, or the take
        /// `take_at(cost, now)` would make on the word loaded now, to be landed by
        /// [`commit`](Sealed::commit), or neither. Writes nothing shared.
        ///
        /// Written in place, not returned: a member called through a reference (not
        /// inlined) returns it through memory, word by word, and a caller moving it on
        /// would read it back in wider loads than it was stored with, which stall
        /// (measured: BENCHMARKS.md).
        #[inline]
        fn prepare(&self, cost: u64, now: u64, plan: &mut MaybeUninit<Prepared>) {
            plan.write(match self.refusal_at(cost, now) {
                Some(d) => Prepared::Refused(d),
                None => Prepared::Open,
            });
        }

        /// Lands the take `plan` that [`prepare`](Sealed::prepare) made at `now` for
        /// `cost`: one compare-and-swap when the word is still the one it read, else
        /// `take_at(cost, now)` on the word as it is then.
        #[inline]
        fn commit(&self, plan: &Planned, cost: u64, now: u64) -> Result<Decision, AcquireError> {
            let _ = plan;
            self.take_at(cost, now)
        }
    }

    /// What a member's read-only first pass found ([`Sealed::prepare`]).
    #[derive(Clone, Copy, Debug)]
    pub enum Prepared {
        /// The balance seen cannot pay: the refusal, nothing written.
        Refused(Decision),
        /// The balance seen can pay: the take computed on the word read.
        Take(Planned),
        /// Only the take can tell (a word behind the reading, a pass due, a slot that
        /// cannot pay alone, a sealed word): [`Sealed::take_at`] decides.
        Open,
    }

    /// A take computed on a word as loaded: `cur` to `next`, and the decision the take
    /// gives if it lands, as its [`parts`](Decision::parts).
    #[derive(Clone, Copy, Debug)]
    pub struct Planned {
        pub(crate) cur: u64,
        pub(crate) next: u64,
        pub(crate) balance: i64,
        pub(crate) lead_nanos: i64,
        /// The member's own (a leased bucket's slot index).
        pub(crate) aux: usize,
    }
}

pub(crate) use sealed::{Planned, Prepared};

/// A bucket that can take part in [`acquire_all`](crate::acquire_all): a
/// [`Bucket`], a [`LeasedBucket`](crate::LeasedBucket), and the buckets of the crate's
/// other limiters.
///
/// Sealed: all-or-nothing depends on every member's take and refund being exact, so only
/// the crate's own buckets implement it, and its operations are private.
pub trait Member: sealed::Sealed + Sync {
    /// A stable identity while the member is borrowed (its atomic word's address): the
    /// global order buckets are taken in.
    fn member_id(&self) -> usize;

    /// Capacity in tokens.
    fn capacity(&self) -> u64;
}

/// One bucket word borrowed with its layout and its clock: the only word-backed member.
/// A [`Bucket`], a keyed map's entry and a scope's plain global bucket are all taken,
/// refunded and waited on through it.
pub(crate) struct BucketRef<'a, C> {
    pub(crate) raw: &'a RawBucket,
    pub(crate) layout: &'a Layout,
    pub(crate) clock: &'a Monotonic<C>,
}

impl<C> Clone for BucketRef<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C> Copy for BucketRef<'_, C> {}

impl<C> fmt::Debug for BucketRef<'_, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BucketRef")
            .field("raw", self.raw)
            .field("layout", self.layout)
            .finish()
    }
}

/// A member backed by one bucket word: it lends a [`BucketRef`], and the member's
/// operations are that reference's.
pub(crate) trait WordBacked: Sync {
    type Clock: Clock;

    fn bucket_ref(&self) -> BucketRef<'_, Self::Clock>;

    /// Whether the member's re-anchoring pass is due at `now` (see [`crate::pass`]):
    /// never for a word whose owner re-anchors it otherwise (a keyed map's, a scoped
    /// limiter's).
    #[inline(always)]
    fn is_due(&self, _now: u64) -> bool {
        false
    }

    /// Once due: whether the word reads full after an idle longer than its fill time
    /// (read-only decisions then decide on a full word).
    fn idle_at(&self, _now: u64) -> bool {
        false
    }

    /// `take_at` once due: a rejection decided read-only, or the pass run first.
    fn acquire_due(&self, cost: u64, now: u64) -> Result<Decision, AcquireError> {
        let b = self.bucket_ref();
        b.raw.try_acquire(b.layout, b.clock, now, cost)
    }

    /// `now`, after the pass if one is due: for operations that write.
    #[inline(always)]
    fn write_at(&self, now: u64) -> u64 {
        now
    }
}

impl<C: Clock + Sync> WordBacked for BucketRef<'_, C> {
    type Clock = C;

    #[inline]
    fn bucket_ref(&self) -> BucketRef<'_, C> {
        *self
    }
}

impl<C: Clock> WordBacked for Bucket<C> {
    type Clock = C;

    #[inline]
    fn bucket_ref(&self) -> BucketRef<'_, C> {
        BucketRef {
            raw: self.raw(),
            layout: self.policy().layout(),
            clock: self.guarded_clock(),
        }
    }

    #[inline(always)]
    fn is_due(&self, now: u64) -> bool {
        self.passes().is_due(now)
    }

    fn idle_at(&self, now: u64) -> bool {
        self.passes().idle_at(now)
    }

    fn acquire_due(&self, cost: u64, now: u64) -> Result<Decision, AcquireError> {
        Bucket::acquire_due(self, now, cost)
    }

    #[inline(always)]
    fn write_at(&self, now: u64) -> u64 {
        self.at(now)
    }
}

/// [`take_at`](sealed::Sealed::take_at) of a word-backed member (the same steps),
/// inlined where it is called: for a path that takes from one bucket and nothing else,
/// where the call's own frame would be most of what the path adds to the take. (Not
/// `take_at`'s body: a `take_at` that only calls this is inlined by the compiler where
/// it is better kept out of line, and measured 6 instructions dearer on the scoped
/// limiter's general held path.)
#[inline(always)]
pub(crate) fn take_inline<T: WordBacked>(
    member: &T,
    cost: u64,
    now: u64,
) -> Result<Decision, AcquireError> {
    let b = member.bucket_ref();
    let now = b.clock.observe(now);
    if member.is_due(now) {
        return member.acquire_due(cost, now);
    }
    b.raw.try_acquire(b.layout, b.clock, now, cost)
}

impl<T: WordBacked> sealed::Sealed for T {
    #[inline]
    fn now_nanos(&self) -> u64 {
        self.bucket_ref().clock.now_nanos()
    }

    #[inline]
    fn take_at(&self, cost: u64, now: u64) -> Result<Decision, AcquireError> {
        let b = self.bucket_ref();
        let now = b.clock.observe(now);
        if self.is_due(now) {
            return self.acquire_due(cost, now);
        }
        b.raw.try_acquire(b.layout, b.clock, now, cost)
    }

    #[inline]
    fn refund_at(&self, cost: u64, now: u64) {
        let b = self.bucket_ref();
        // `acquire_all` checks every cost against its capacity before taking any, so a
        // cost refunded here has units; a larger one could not have been taken. A zero
        // cost was never taken: nothing to write.
        if let Some(units) = b.layout.units_of(cost).filter(|&u| u > 0) {
            let now = self.write_at(b.clock.observe(now));
            b.raw.refund_units(b.layout, b.clock, now, units);
        }
    }

    fn wait_at(&self, cost: u64, now: u64) -> Duration {
        let b = self.bucket_ref();
        let now = b.clock.observe(now);
        if self.is_due(now) && self.idle_at(now) {
            return Duration::ZERO;
        }
        b.raw.wait(b.layout, now, cost)
    }

    #[inline]
    fn refusal_at(&self, cost: u64, now: u64) -> Option<Decision> {
        let b = self.bucket_ref();
        let now = b.clock.observe(now);
        if self.is_due(now) && self.idle_at(now) {
            return None;
        }
        b.raw.refusal(b.layout, now, cost)
    }

    #[inline(always)]
    fn prepare(&self, cost: u64, now: u64, plan: &mut MaybeUninit<Prepared>) {
        let b = self.bucket_ref();
        let now = b.clock.observe(now);
        plan.write(if self.is_due(now) {
            // The take runs the pass first: no take is planned on the word as it is.
            match b.raw.refusal(b.layout, now, cost) {
                Some(d) if !self.idle_at(now) => Prepared::Refused(d),
                _ => Prepared::Open,
            }
        } else {
            b.raw.prepare(b.layout, now, cost)
        });
    }

    #[inline(always)]
    fn commit(&self, plan: &Planned, cost: u64, now: u64) -> Result<Decision, AcquireError> {
        let b = self.bucket_ref();
        b.raw.commit(b.layout, b.clock, now, cost, plan)
    }
}

impl<T: WordBacked> Member for T {
    #[inline]
    fn member_id(&self) -> usize {
        self.bucket_ref().raw.id()
    }

    fn capacity(&self) -> u64 {
        self.bucket_ref().layout.capacity()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::sealed::Sealed;
    use super::{WordBacked, take_inline};
    use crate::{Bucket, ManualClock, Policy};

    /// `take_inline` is `take_at`'s steps, written apart (see its docs): on twin buckets
    /// driven alike (small steps, idles long enough that a re-anchoring pass falls due,
    /// costs the bucket cannot pay, a clock read behind the last), the two give the
    /// same decisions and leave the same balances.
    #[test]
    fn take_inline_decides_as_take_at() {
        let clock = ManualClock::new();
        let policy = Policy::new(50, 5.0).unwrap();
        let (a, b) = (
            Bucket::with_clock(policy, clock.clone()),
            Bucket::with_clock(policy, clock.clone()),
        );
        let mut due = 0;
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for i in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Idles of years now and then: this policy's passes are about 4.5 years
            // apart.
            let step = match x % 500 {
                0 => Duration::from_secs(86_400 * 365 * (1 + x % 4)),
                1..=200 => Duration::ZERO,
                _ => Duration::from_micros(x % 400_000),
            };
            clock.advance(step);
            let now = crate::Clock::now_nanos(&clock);
            // Now and then a reading from before the last one.
            let now = if i % 97 == 0 {
                now.saturating_sub(1_000_000)
            } else {
                now
            };
            // (Not through the clock's `observe`, which a reading behind would move.)
            due += u64::from(WordBacked::is_due(&a, now));
            let cost = (x >> 8) % 60;
            let inline = take_inline(&a, cost, now);
            let called = Sealed::take_at(&b, cost, now);
            assert_eq!(
                inline.map(|d| d.parts()),
                called.map(|d| d.parts()),
                "call {i}, cost {cost}"
            );
            assert_eq!(a.available(), b.available(), "call {i}");
        }
        assert!(due > 10, "a pass fell due {due} times");
    }
}
