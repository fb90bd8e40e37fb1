//! A bucket whose policy changes while it runs, carrying its tokens over exactly.
//!
//! # How a switch stays consistent without a lock
//!
//! A [`LiveBucket`] holds a pointer to its current *epoch*: one policy and its own
//! word, exactly a [`Bucket`](crate::Bucket)'s state. Every operation loads the pointer
//! and works on that epoch's word as a plain bucket does. A reconfiguration:
//!
//! 1. allocates the new epoch (nothing else allocates or waits afterwards);
//! 2. *seals* the old word: swaps in [`SEALED`], a word no layout ever stores, and gets
//!    the state it held;
//! 3. reads the clock (after the seal, so not earlier than any reading stored in the
//!    word), converts the state to the new layout ([`inherit::convert`]) and publishes
//!    the new epoch.
//!
//! An operation that loads a sealed word, or loses its CAS to the seal, decides and
//! writes nothing, and starts again on the new epoch (waiting, if it came between steps
//! 2 and 3, for the few instructions of the conversion). A sealed word never changes
//! again, so no operation holding the old policy can write it: no admission against the
//! old state lands after the switch, and none is lost or counted twice at it (the loom
//! model `live_reconfigure` checks both, and catches a switch that skips the seal).
//! Every decision is made on one epoch's word alone, with that epoch's policy.
//!
//! The epochs form a chain (`src/epoch.rs`) that frees a replaced epoch once no
//! operation can still hold it: each operation pins the current epoch for its few
//! instructions, and a reconfiguration retires the one it replaced. A bucket holds one
//! epoch ([`EPOCH_BYTES`], 512 bytes), and briefly the few replaced ones a pin still
//! held, however often it is reconfigured.
//!
//! # Cost
//!
//! One pointer load more than a [`Bucket`](crate::Bucket) per operation, the pin (a
//! thread-local load, a test that the thread has a pin record, and one add to the
//! record's word in memory; to end it a load, a conditional move and a store), and one
//! comparison with the sealed word. The word's first attempt (a refusal, a take whose
//! CAS succeeds) is decided inline and returned as it is made; everything else (a lost
//! race, a sealed word, a pass due, a clock read out of line) is decided out of line,
//! the pin handed over with it (`BENCHMARKS.md`, "Reconfiguration").

use std::fmt;
use std::ptr;
use std::time::Duration;

use crate::bucket::reread_snapshot;
use crate::bucket::{Core, RawBucket, SEALED_ERROR, Sealable, Sealed};
use crate::clock::{Clock, Monotonic, QuantaClock};
use crate::decision::Decision;
use crate::epoch::{Chain, Freed, Next, Pinned};
use crate::error::AcquireError;
use crate::inherit::{self, Inherit};
use crate::multi::member::{self, Member};
use crate::policy::Policy;
use crate::state::SEALED;

/// Bytes one epoch (a policy and its word) holds: what a [`LiveBucket`] holds, a
/// replaced epoch being freed once no operation holds it.
pub const EPOCH_BYTES: usize = std::mem::size_of::<Epoch>();

/// One policy of a [`LiveBucket`] and its word.
type Epoch = Core<Sealable>;

/// What a [`LiveBucket::reconfigure`] (or a
/// [`LeasedBucket::reconfigure`](crate::LeasedBucket::reconfigure)) did to the balance.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reconfigured {
    /// Tokens the bucket held under the old policy at the switch (negative while
    /// reservations were owed): what it would have decided on then.
    pub before: f64,
    /// Tokens it holds under the new policy.
    pub after: f64,
    /// Debt beyond what the new policy may owe, forgiven, in tokens (zero unless
    /// reservations were owed).
    pub forgiven: f64,
    /// The strategy applied.
    pub inherit: Inherit,
}

/// A token bucket whose policy can be replaced while it runs
/// ([`reconfigure`](LiveBucket::reconfigure)), carrying its tokens over with a chosen
/// [`Inherit`] strategy. Otherwise a [`Bucket`](crate::Bucket): the same decisions, the
/// same exact-time bound for each policy, no lock on any operation.
///
/// ```
/// use tokengate::{Inherit, LiveBucket, ManualClock, Policy};
///
/// let bucket = LiveBucket::with_clock(Policy::new(100, 10.0)?, ManualClock::new());
/// assert!(bucket.try_acquire(60)?.is_admitted()); // 40 left of 100
///
/// // Ten times the capacity, the same fraction of it: 400 of 1000.
/// let switch = bucket.reconfigure(Policy::new(1000, 100.0)?, Inherit::Proportional);
/// assert_eq!((switch.before, switch.after), (40.0, 400.0));
/// assert_eq!(bucket.policy().capacity(), 1000);
/// assert!(bucket.try_acquire(400)?.is_admitted());
/// assert!(bucket.try_acquire(1)?.is_rejected());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LiveBucket<C: Clock = QuantaClock> {
    epochs: Chain<Epoch, Freed>,
    clock: Monotonic<C>,
}

impl<C: Clock> fmt::Debug for LiveBucket<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveBucket")
            .field("policy", &self.policy())
            .field("available", &self.available())
            .finish()
    }
}

impl LiveBucket<QuantaClock> {
    /// A bucket on the default clock ([`QuantaClock`]), in the policy's start state.
    pub fn new(policy: Policy) -> LiveBucket<QuantaClock> {
        LiveBucket::with_clock(policy, QuantaClock::new())
    }
}

impl<C: Clock> LiveBucket<C> {
    /// A bucket on `clock`, in the policy's start state at the clock's current time.
    pub fn with_clock(policy: Policy, clock: C) -> LiveBucket<C> {
        let clock = Monotonic::new(clock);
        let created = clock.now_nanos();
        LiveBucket {
            epochs: Chain::freeing(Core::new(policy, created, None)),
            clock,
        }
    }

    /// The current epoch, held until the guard is dropped.
    #[inline(always)]
    fn epoch(&self) -> Pinned<'_, Epoch> {
        self.epochs.pin()
    }

    /// Waits until `sealed`, whose word an operation found sealed, is replaced: the
    /// reconfiguration that sealed it publishes its successor a few instructions later
    /// (or, should it unwind, unseals the word: the operation then retries on it).
    #[cold]
    #[inline(never)]
    fn await_successor(&self, sealed: &Epoch) {
        self.epochs
            .await_successor(sealed, |e| e.raw().load() == SEALED);
    }

    /// Runs `op` on the current epoch until it finds its word unsealed.
    #[inline(always)]
    fn on_epoch<T>(&self, mut op: impl FnMut(&Core<Sealable>) -> Result<T, Sealed>) -> T {
        loop {
            let epoch = self.epoch();
            match op(&epoch) {
                Ok(out) => return out,
                Err(Sealed) => self.await_successor(&epoch),
            }
        }
    }

    /// Takes `cost` tokens if the balance covers them, as
    /// [`Bucket::try_acquire`](crate::Bucket::try_acquire) does, under the current
    /// policy.
    ///
    /// # Errors
    ///
    /// [`AcquireError::CostExceedsCapacity`] for a cost above the current capacity.
    // Always inlined: see `Bucket::try_acquire`.
    #[inline(always)]
    pub fn try_acquire(&self, cost: u64) -> Result<Decision, AcquireError> {
        self.acquire(cost, || self.clock.now_inline(), || self.clock.now_nanos())
    }

    /// Decides `cost` on the current epoch at `now()`'s reading, again on the successor
    /// when the word was sealed. Inline, only the word's first attempt
    /// ([`Core::try_first`]): its decision is returned as it is made, and everything
    /// else (a thread's first pin, a pass due, a lost race, a sealed word) is decided out
    /// of line ([`acquire_general`](Self::acquire_general)), the pin handed over with it,
    /// so that the decision makes no call it returns from.
    ///
    /// `now_inline` is the reading where it is taken without a call (else `None`: the
    /// general path then takes `now()`).
    #[inline(always)]
    fn acquire(
        &self,
        cost: u64,
        now_inline: impl Fn() -> Option<u64>,
        now: impl Fn() -> u64,
    ) -> Result<Decision, AcquireError> {
        let Some(epoch) = self.epochs.try_pin() else {
            return self.acquire_general(cost, now);
        };
        let Some(at) = now_inline() else {
            return self.acquire_pinned(epoch, cost, now);
        };
        match epoch.try_first(&self.clock, at, cost) {
            Some(out) => out,
            None => self.acquire_general_at(epoch, at, cost, now),
        }
    }

    /// [`acquire`](Self::acquire) for a thread's first pin.
    #[cold]
    #[inline(never)]
    fn acquire_general(&self, cost: u64, now: impl Fn() -> u64) -> Result<Decision, AcquireError> {
        self.acquire_pinned(self.epoch(), cost, now)
    }

    /// [`acquire`](Self::acquire) on `epoch`, pinned, at `now()`'s reading.
    #[cold]
    #[inline(never)]
    fn acquire_pinned(
        &self,
        epoch: Pinned<'_, Epoch>,
        cost: u64,
        now: impl Fn() -> u64,
    ) -> Result<Decision, AcquireError> {
        let at = now();
        self.acquire_general_at(epoch, at, cost, now)
    }

    /// [`acquire`](Self::acquire) on `epoch`, pinned, at the reading `at` (`now()` on a
    /// successor). With no pool here, a `PoolUnavailable` is only ever [`SEALED_ERROR`].
    #[cold]
    #[inline(never)]
    fn acquire_general_at<'a>(
        &'a self,
        mut epoch: Pinned<'a, Epoch>,
        mut at: u64,
        cost: u64,
        now: impl Fn() -> u64,
    ) -> Result<Decision, AcquireError> {
        loop {
            let out = epoch.try_acquire(&self.clock, at, cost);
            if !matches!(out, Err(AcquireError::PoolUnavailable { .. })) {
                return out;
            }
            debug_assert_eq!(out, Err(SEALED_ERROR));
            self.await_successor(&epoch);
            drop(epoch);
            epoch = self.epoch();
            at = now();
        }
    }

    /// Gives back `cost` tokens, as [`Bucket::refund`](crate::Bucket::refund) does, to
    /// the current policy: capped at its capacity. A refund after a switch gives the
    /// tokens to the new policy as they are, whatever strategy the switch used: after a
    /// `Proportional` shrink or a `Reset`, a refund of tokens taken before the switch
    /// leaves more than the switch alone would have (at most the refund, never above
    /// the capacity). Refund before reconfiguring where that matters.
    ///
    /// # Errors
    ///
    /// [`AcquireError::CostExceedsCapacity`] for a cost above the current capacity.
    pub fn refund(&self, cost: u64) -> Result<(), AcquireError> {
        self.on_epoch(|core| core.refund(&self.clock, cost))
    }

    /// Puts the bucket back in the current policy's start state.
    pub fn reset(&self) {
        self.on_epoch(|core| core.reset(&self.clock));
    }

    /// Tokens available now under the current policy (fractional; negative while
    /// reservations are owed). Writes nothing.
    pub fn available(&self) -> f64 {
        self.on_epoch(|core| core.available(&self.clock))
    }

    /// The policy enforced now.
    pub fn policy(&self) -> Policy {
        *self.epoch().policy()
    }

    /// The clock this bucket reads.
    pub fn clock(&self) -> &C {
        self.clock.get_ref()
    }

    /// Replaces the policy, carrying the tokens over with `inherit` (module
    /// [`inherit`](crate::inherit) states each strategy's exact guarantee). Operations
    /// racing the switch decide either wholly before it, on the old policy and state, or
    /// wholly after it, on the new; none is lost or counted twice.
    ///
    /// Concurrent reconfigurations are applied one after the other, each converting
    /// what the previous one left.
    pub fn reconfigure(&self, policy: Policy, inherit: Inherit) -> Reconfigured {
        // Allocated before the seal: between the seal and the publication, only
        // arithmetic, so that operations waiting on the switch wait for nothing else.
        let mut next = Next::new(Core::new(policy, 0, Some(0)));
        loop {
            let epoch = self.epoch();
            let word = if mutant!(RECONFIGURE_SKIPS_SEAL) {
                epoch.raw().load()
            } else {
                epoch.raw().seal()
            };
            if word == SEALED {
                // Another reconfiguration sealed it first: convert what it leaves.
                self.await_successor(&epoch);
                continue;
            }
            // Should anything below unwind (a clock that panics), the word is unsealed
            // again: the old policy stays current and no operation waits forever.
            let unseal = Unseal {
                raw: epoch.raw(),
                word,
            };
            // Read after the seal: not earlier than any reading stored in `word`.
            let now = self.clock.now_nanos();
            let (word, report) = convert_sealed(
                epoch.policy().layout(),
                epoch.passes(),
                word,
                now,
                &policy,
                inherit,
            );
            *next = Core::new(policy, now, Some(word));
            std::mem::forget(unseal);
            self.epochs.replace(&epoch, next);
            return report;
        }
    }

    /// How many policies this bucket has enforced, the current one included (one more
    /// per reconfiguration). Only the current one is held: each replaced epoch is freed
    /// once no operation holds it.
    pub fn epochs(&self) -> usize {
        usize::try_from(self.epochs.count()).unwrap_or(usize::MAX)
    }

    /// Replaced epochs not yet freed (an operation may have held them when they were
    /// replaced; the next reconfiguration or the drop frees them): a handful at most.
    pub fn retired_epochs(&self) -> usize {
        self.epochs.retired()
    }

    /// The packed word of the current policy as stored, for diagnostics.
    pub fn stored_word(&self) -> u64 {
        self.epoch().raw().load()
    }
}

/// A live bucket takes part in [`acquire_all`](crate::acquire_all) like a plain one: each
/// take, refund, wait or refusal runs on one policy's word, starting again on the new
/// policy when it meets a switch. Its identity (the global order of acquisition) is the
/// live bucket's own address, the same across switches.
impl<C: Clock> Member for LiveBucket<C> {
    fn member_id(&self) -> usize {
        ptr::from_ref(&self.epochs) as usize
    }

    fn capacity(&self) -> u64 {
        self.policy().capacity()
    }
}

impl<C: Clock> member::sealed::Sealed for LiveBucket<C> {
    fn now_nanos(&self) -> u64 {
        self.clock.now_nanos()
    }

    fn take_at(&self, cost: u64, now: u64) -> Result<Decision, AcquireError> {
        let now = self.clock.observe(now);
        self.acquire(cost, || Some(now), || now)
    }

    fn refund_at(&self, cost: u64, now: u64) {
        let now = self.clock.observe(now);
        self.on_epoch(|core| {
            let layout = core.policy().layout();
            // A switch between the take and this refund may have lowered the capacity:
            // the refund is capped there, as any refund is.
            let units = layout.units_of(cost.min(layout.capacity())).unwrap_or(0);
            if units == 0 {
                return Ok(());
            }
            let now = core.at(&self.clock, now);
            core.raw().refund_units(layout, &self.clock, now, units)
        });
    }

    fn wait_at(&self, cost: u64, now: u64) -> Duration {
        let now = self.clock.observe(now);
        self.on_epoch(|core| {
            let layout = core.policy().layout();
            let snapshot = core.view(now)?;
            Ok(Decision::new(layout, &snapshot, now, cost, 0, false).wait_for(cost))
        })
    }

    fn refusal_at(&self, cost: u64, now: u64) -> Option<Decision> {
        let now = self.clock.observe(now);
        let core = self.epoch();
        let passes = core.passes();
        if passes.is_due(now) && passes.idle_at(now) {
            return None;
        }
        // A sealed word: no refusal known; the take decides on the new policy.
        core.raw()
            .refusal(core.policy().layout(), now, cost)
            .unwrap_or(None)
    }
}

/// Unseals a word whose switch did not complete.
pub(crate) struct Unseal<'a> {
    pub(crate) raw: &'a RawBucket<Sealable>,
    pub(crate) word: u64,
}

/// A switch's conversion of `word`, sealed under a policy of layout `from` whose
/// re-anchoring passes are `passes`, to `policy` with `inherit` at the switch reading
/// `now` (read after the seal): the new word and what it did. A word a due pass would
/// find idle past its fill time is read full, as the pass would leave it. The one
/// conversion every switch makes (a live bucket's, a leased bucket's pool, a scoped
/// limiter's global words).
pub(crate) fn convert_sealed(
    from: &crate::state::Layout,
    passes: &crate::pass::Passes,
    word: u64,
    now: u64,
    policy: &Policy,
    inherit: Inherit,
) -> (u64, Reconfigured) {
    let snapshot = if passes.is_due(now) && passes.idle_at(now) {
        from.reanchor_full(from.tick_of(now))
    } else {
        reread_snapshot(from, word, now)
    };
    let to = policy.layout();
    let converted = inherit::convert(from, &snapshot, now, to, inherit, policy.starts_full());
    let tokens = |units: i128, frac: u32| units as f64 / (1u128 << frac) as f64;
    let report = Reconfigured {
        before: tokens(converted.from_units, from.frac_bits()),
        after: tokens(converted.to_units, to.frac_bits()),
        forgiven: converted.forgiven_units as f64 / (1u128 << to.frac_bits()) as f64,
        inherit,
    };
    (converted.word, report)
}

impl Drop for Unseal<'_> {
    fn drop(&mut self) {
        // Nothing writes a sealed word, and no successor was published: restoring it is
        // the state as if the switch had not begun.
        self.raw.set(self.word);
    }
}
