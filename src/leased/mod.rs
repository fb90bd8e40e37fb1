//! A bucket that scales with cores: tokens leased in batches from a pool to core-local
//! slots, with the same exact bound as a plain [`Bucket`](crate::Bucket).
//!
//! A [`LeasedBucket`] is a [`Pool`] (the single source of truth for the balance; by
//! default a [`LocalPool`], one packed word exactly like a plain bucket's) plus a
//! power-of-two array of cache-padded slots. Most admissions are paid from the calling
//! thread's slot (a clock read and one CAS on a line no other core writes) while it
//! holds more than the cost; the rest make one exchange with the pool that gives back the
//! slot's leftover, pays the cost and leases a new batch. A spend never empties a slot
//! (its last token is paid by that exchange), so the bucket knows, from one count the
//! exchanges keep, when no slot holds a token: a rejection then reads the pool word and
//! that count, and no slot. The argument for exactness is in the guide:
//! [`crate::guide::leasing`].
//!
//! - `mod.rs`: [`LeasedBucket`], [`LeaseConfig`].
//! - `epoch.rs`: one policy's pool, slots and figures (a bucket reconfigured holds one
//!   per policy).
//! - `slots.rs`: the core-local slots (OPEN, LEASING, CLOSED words).
//! - `exchange.rs`: the pure arithmetic of one exchange.
//! - `pool.rs`: the [`Pool`] trait and [`LocalPool`].
//!
//! # Bounds
//!
//! With the [`LocalPool`] (a pool on a remote store states its own):
//!
//! * **Never more than a plain bucket.** Over any interval, admissions are at most what
//!   a plain [`Bucket`](crate::Bucket) with the same policy and the same requests admits.
//! * **Stranded tokens**: at most `slots * max_lease` tokens sit in slots. They are not
//!   lost: a request the pool cannot pay reclaims them, a credit that could meet
//!   the cap takes them back, and [`LeasedBucket::reclaim`] returns them on demand.
//! * **Early rejections**: when requests are decided one at a time (no overlap), a leased
//!   bucket rejects exactly when the plain bucket does, with the same balance and
//!   `retry_after` (but for a rejection decided on the pool alone, see below),
//!   and `available()` is equal after every step. Under overlap a
//!   rejection can come early only by tokens in flight: a request that finds other
//!   threads mid-exchange cannot count their hands (at most one lease per slot), and a
//!   credit (a refund, or refill) made while other threads hold leases in flight or
//!   slots closed with their tokens in hand is capped at the capacity less one lease
//!   (`max_lease`) per such slot, for the tokens their hands may still give back (a
//!   slot shut empty reserves nothing). That cap withholds credit only when the
//!   balance plus the credit comes within `slots * max_lease` of the capacity, and what
//!   it withholds is not restored later (on a frozen clock it stays; refill reaching the
//!   capacity makes it up), but it leaves the bucket holding at least
//!   `capacity - slots * max_lease`: however many credits are withheld, the shortfall
//!   against a plain bucket never exceeds `slots * max_lease`. Below that, refunds
//!   racing admissions and each other lose nothing (`tests/leased_refund.rs`). So a
//!   rejection is never early by more than `2 * slots * max_lease` tokens, and never
//!   late: the bucket never admits what the plain bucket would reject.
//! * **Across a reconfiguration** (see below), nothing is lost or minted. Admissions
//!   before the switch stay under the old policy's bound; at the switch reading `t`, the
//!   balance `b` the switch converts is the pool's balance plus every token that was in
//!   a slot (the slots' tokens join the converted balance; none is left behind in a
//!   slot), exactly what a plain bucket of the old policy holds at `t`; the admissions
//!   after it stay under the new policy's bound started from `b'`, the balance the
//!   [`Inherit`] strategy promises from `b` (rounded down), as for a
//!   [`LiveBucket`](crate::LiveBucket): at most `b' + r' * (e - t)` over `[t, e]`.
//!   During the switch the slots are closed, so admissions pay through the pool, which
//!   holds the slots' tokens again: a rejection then is early only by the tokens in
//!   flight, as above; an operation that meets the sealed pool waits (spinning) for the
//!   few instructions of the conversion and decides on the new policy.
//!
//! # Reconfiguration
//!
//! [`LeasedBucket::reconfigure`] replaces the policy of a bucket on a [`LocalPool`]
//! while it runs, with no lock on any operation. The bucket holds a pointer to its
//! current *epoch*: one policy, its pool word and its slots. A reconfiguration:
//!
//! 1. allocates the new epoch (policy, pool word, slots sized for the new layout's tick
//!    bits, the largest lease recomputed unless the [`LeaseConfig`] fixed it);
//! 2. closes every slot of the old epoch for good, as a closer does: OPEN tokens are
//!    taken (and given back to the old pool at once), leases in flight cancelled;
//! 3. waits until every hand that took tokens from the old pool has stored them: the
//!    lessees it cancelled have given their leases back, the closers before it have
//!    stored what they took (each holds a close count on a slot until then; a close made
//!    later takes nothing). The old pool's word then holds the whole balance;
//! 4. *seals* the old pool's word: swaps in [`SEALED`](crate::state::SEALED), a word no
//!    layout stores, and gets the state it held;
//! 5. reads the clock (after the seal), converts the state to the new layout
//!    ([`inherit::convert`](crate::inherit::convert)) and publishes the new epoch.
//!
//! An operation that meets a closed slot goes to the pool; one that meets the sealed
//! word decides and writes nothing and starts again on the new epoch, so no operation
//! holding the old policy lands after the switch, and none is lost or counted twice. A
//! lessee whose lease the switch cancelled gives it back to the old pool before the seal
//! (step 3), so it is converted with the rest, never written to the sealed word. The
//! switch waits for those hands (step 3) and for nothing else; a thread descheduled
//! mid-exchange delays the switch, not the admissions, which meanwhile pay through the
//! old pool. The loom model `leased_reconfigure` checks a switch racing a slot admission
//! and a trip to the pool, and catches a switch that skips the seal or the wait; the
//! tests in `tests/leased_reconfigure.rs` compare a leased bucket with a
//! [`LiveBucket`](crate::LiveBucket) on random histories with switches.
//!
//! The epochs form a chain (`src/epoch.rs`) that frees a replaced epoch once no
//! operation can still hold it (each operation pins the current one): the bucket holds
//! one epoch, [`LeasedBucket::epoch_bytes`] (the pool, the slot array and the count of
//! stocked slots: 640 bytes plus 128 per slot on x86-64), however often it is
//! reconfigured. A bucket on another [`Pool`] cannot be reconfigured in place (a remote
//! store keeps its own policy): build a new one.
//!
//! The slot spend pays one pointer load and the pin more than before (the current epoch);
//! every call off its inline path takes the pin with it and ends it there
//! (`BENCHMARKS.md`, "Reconfiguration", has the instruction counts).
//!
//! # What is approximate
//!
//! * An admission paid from a slot reports as [`Decision::tokens_remaining`] the tokens
//!   left in that slot: a lower bound of the balance (the pool and other slots are
//!   not read). Admissions through the pool report the pool's balance plus the new
//!   lease. A rejection reports exactly what a plain bucket reports, except one decided
//!   on the pool alone (the pool's balance plus `slots * max_lease` cannot pay
//!   the cost): it reports the pool's balance, below the plain bucket's by the tokens
//!   idle in slots, and so a [`Decision::retry_after`] no shorter, longer by at most the
//!   time those tokens take to refill. Reading every slot to make it exact would cost a
//!   cache line per slot on every such rejection.
//! * Spending from a slot only checks that the clock is in the lease's tick. The bucket
//!   reads its clock through a [`Monotonic`] guard, as every
//!   limiter does, so a clock that steps back is time standing still; a trip to the
//!   pool that finds its reading well behind the word reads the clock again after
//!   loading it, and a reading still far behind can only be an idle past the wrap: the
//!   pool is full and is re-anchored (see [`LocalPool`] for the argument).
//! * A slot stamp is a tick modulo `2^T`, as the pool's is: a slot left untouched
//!   for an exact multiple of the wrap period ([`Policy::wrap_period`], years for
//!   ordinary policies) would read as current. The bucket's re-anchoring passes
//!   (see [`crate::state`]: a fraction of the wrap apart, run by the first operation
//!   due) take every slot's lease back and re-anchor the pool, or reset it full after
//!   an idle longer than the fill time; any trip to the pool that adds credit near the
//!   cap, and [`LeasedBucket::reclaim`], empty idle slots too.
//! * A [`reset`](LeasedBucket::reset) concurrent with admissions: a lease taken before it
//!   and published after it is given back after the reset (at most `max_lease` per slot;
//!   a reset to full is still exact, since giving back is capped).

use std::fmt;
use std::mem::MaybeUninit;
use std::ptr;
use std::time::Duration;

use crate::bucket::{SEALED_ERROR, Sealed};
use crate::clock::{Clock, ClockError, CoarseClock, Monotonic, QuantaClock};
use crate::decision::Decision;
use crate::epoch::{Chain, Freed, Next, Pinned};
use crate::error::AcquireError;
use crate::error::cost_exceeds_capacity;
use crate::inherit::Inherit;
use crate::live::{Reconfigured, convert_sealed};
use crate::multi::{Member, Planned, Prepared, sealed};
use crate::pass::Passes;
use crate::policy::Policy;

mod epoch;
mod exchange;
mod pool;
pub(crate) mod slots;

pub(crate) use crate::sync::thread_index;
use epoch::Epoch;
use pool::Replaced;
pub use pool::{LeaseOutcome, LeaseRequest, Lessees, LocalPool, Pool, PoolState, Quiesced};
use slots::{Slots, Spend};

/// The most slots a leased bucket may have.
pub const MAX_SLOTS: usize = 1 << 16;

/// How a [`LeasedBucket`] spreads its tokens: the number of slots and the largest lease.
///
/// Both default from the machine and the policy: one slot per available core (rounded up
/// to a power of two) and a largest lease of `capacity / (2 * slots)` tokens (at least
/// one, and at most what a slot holds: `2^(62 - T) - 1` tokens for a policy with `T` tick
/// bits, at least about a quarter of the capacity), so full slots hold at most half the
/// capacity.
///
/// ```
/// use tokengate::{leased::LeaseConfig, LeasedBucket, ManualClock, Policy};
/// let config = LeaseConfig::new().slots(8).max_lease(100);
/// let bucket = LeasedBucket::with_config(Policy::new(10_000, 1000.0)?, ManualClock::new(), config)?;
/// assert_eq!(bucket.slots(), 8);
/// assert_eq!(bucket.max_lease(), 100);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseConfig {
    slots: Option<usize>,
    max_lease: Option<u64>,
}

impl LeaseConfig {
    /// The default configuration (see the type's docs).
    pub fn new() -> LeaseConfig {
        LeaseConfig::default()
    }

    /// Number of slots: a power of two from 1 to [`MAX_SLOTS`]. Threads beyond this
    /// share slots (correct, with more contention per slot).
    pub fn slots(mut self, slots: usize) -> LeaseConfig {
        self.slots = Some(slots);
        self
    }

    /// Largest lease, in tokens: from 1 to the capacity, and at most `2^(62 - T) - 1`
    /// (what a slot word holds beside its `T`-bit stamp). Larger leases mean fewer trips
    /// to the pool and more tokens stranded in idle slots (at most
    /// `slots * max_lease`).
    pub fn max_lease(mut self, tokens: u64) -> LeaseConfig {
        self.max_lease = Some(tokens);
        self
    }
}

/// Why a [`LeaseConfig`] does not fit a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseConfigError {
    /// The slot count is not a power of two between 1 and [`MAX_SLOTS`].
    SlotsOutOfRange {
        /// The slot count asked for.
        slots: usize,
    },
    /// The largest lease is zero or above the capacity or what a slot holds.
    LeaseOutOfRange {
        /// The largest lease asked for, in tokens.
        max_lease: u64,
        /// The largest lease this policy allows, in tokens.
        max: u64,
    },
}

impl fmt::Display for LeaseConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LeaseConfigError::SlotsOutOfRange { slots } => write!(
                f,
                "slot count must be a power of two from 1 to {MAX_SLOTS}, got {slots}"
            ),
            LeaseConfigError::LeaseOutOfRange { max_lease, max } => write!(
                f,
                "largest lease must be from 1 to {max} tokens (the capacity, or what a slot \
                 holds for this policy), got {max_lease}"
            ),
        }
    }
}

impl std::error::Error for LeaseConfigError {}

/// A token bucket for hot paths shared by many cores: the same policy, decisions and
/// exact bound as a [`Bucket`](crate::Bucket), with most admissions paid from a
/// core-local lease (a clock read and one CAS on a cache line no other core writes).
///
/// See the [module docs](crate::leased) and [the leasing guide](crate::guide::leasing) for the
/// algorithm, the exactness argument and the
/// bounds on stranded tokens and early rejections.
///
/// ```
/// use std::time::Duration;
/// use tokengate::{LeasedBucket, ManualClock, Policy};
///
/// let clock = ManualClock::new();
/// let bucket = LeasedBucket::with_clock(Policy::new(100, 20.0)?, clock.clone());
/// // The same burst as a plain bucket: 100 admitted, then rejections.
/// let burst = (0..150).filter(|_| bucket.try_acquire(1).unwrap().is_admitted()).count();
/// assert_eq!(burst, 100);
/// let rejected = bucket.try_acquire(1)?;
/// assert!(rejected.retry_after().unwrap() >= Duration::from_millis(50));
///
/// clock.advance(Duration::from_secs(1));
/// let next = (0..150).filter(|_| bucket.try_acquire(1).unwrap().is_admitted()).count();
/// assert_eq!(next, 19); // as a plain bucket: 20/s rounded down
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LeasedBucket<C: Clock = QuantaClock, P: Pool = LocalPool> {
    /// The current policy's epoch (see `leased/epoch.rs`), and those replaced that an
    /// operation may still hold.
    epochs: Chain<Epoch<P>, Freed>,
    clock: Monotonic<C>,
    /// The largest lease the configuration fixed, if it did: kept across
    /// reconfigurations (otherwise each policy's default).
    fixed_lease: Option<u64>,
    /// A cache line the bucket owns for its whole life: its address is the bucket's
    /// identity (an epoch's would be reused once it is freed).
    anchor: Box<Anchor>,
}

/// See `LeasedBucket::anchor`: allocated like the other small parts of limiters (a cache
/// line), so that buckets' identities interleave in memory as their parts do.
#[repr(align(64))]
struct Anchor(#[allow(dead_code)] u8);

impl<C: Clock, P: Pool> fmt::Debug for LeasedBucket<C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedBucket")
            .field("policy", &self.policy())
            .field("slots", &self.slots())
            .field("max_lease", &self.max_lease())
            .field("available", &self.available())
            .finish()
    }
}

impl LeasedBucket<CoarseClock> {
    /// A leased bucket on the coarse clock with the default [`LeaseConfig`]: the cheapest
    /// local path (see [the clock read on the local path](crate::guide::leasing#the-clock-read-on-the-local-path)).
    ///
    /// # Errors
    ///
    /// [`ClockError`] when the coarse clock's upkeep thread cannot be started.
    ///
    /// ```
    /// use tokengate::{LeasedBucket, Policy};
    /// let bucket = LeasedBucket::coarse(Policy::new(1_000_000, 1e9)?)?;
    /// assert!(bucket.try_acquire(1)?.is_admitted());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn coarse(policy: Policy) -> Result<LeasedBucket<CoarseClock>, ClockError> {
        Ok(LeasedBucket::with_clock(policy, CoarseClock::new()?))
    }
}

impl LeasedBucket<QuantaClock> {
    /// A leased bucket on the default clock with the default [`LeaseConfig`], in the
    /// policy's start state.
    ///
    /// ```
    /// use tokengate::{LeasedBucket, Policy};
    /// let bucket = LeasedBucket::new(Policy::new(10, 1.0)?);
    /// assert!(bucket.try_acquire(10)?.is_admitted());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(policy: Policy) -> LeasedBucket<QuantaClock> {
        LeasedBucket::with_clock(policy, QuantaClock::new())
    }
}

/// The slot count for the default configuration: one per core, rounded up to a power of
/// two.
fn default_slots() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .next_power_of_two()
        .min(MAX_SLOTS)
}

/// The largest lease a policy allows: its capacity, and what a slot word holds.
fn lease_limit(policy: &Policy) -> u64 {
    policy
        .capacity()
        .min(Slots::max_tokens(policy.layout().tick_bits()))
}

/// `capacity / (2 * slots)`, at least 1, at most [`lease_limit`].
fn default_lease(policy: &Policy, slots: usize) -> u64 {
    (policy.capacity() >> (slots.trailing_zeros() + 1))
        .max(1)
        .min(lease_limit(policy))
}

impl<C: Clock> LeasedBucket<C, LocalPool> {
    /// A leased bucket on `clock` with the default [`LeaseConfig`], in the policy's start
    /// state at the clock's current time.
    pub fn with_clock(policy: Policy, clock: C) -> LeasedBucket<C> {
        let slots = default_slots();
        let max_lease = default_lease(&policy, slots);
        let clock = Monotonic::new(clock);
        let pool = LocalPool::new(&policy, clock.now_nanos());
        LeasedBucket::build(policy, clock, slots, max_lease, None, pool)
    }

    /// A leased bucket on `clock` with `config`.
    ///
    /// # Errors
    ///
    /// [`LeaseConfigError`] when the slot count is not a power of two from 1 to
    /// [`MAX_SLOTS`], or the largest lease is not from 1 to the capacity (and what a
    /// slot holds, see [`LeaseConfig::max_lease`]).
    ///
    /// ```
    /// use tokengate::{leased::LeaseConfig, leased::LeaseConfigError, LeasedBucket, ManualClock, Policy};
    /// let policy = Policy::new(10, 1.0)?;
    /// let err = LeasedBucket::with_config(policy, ManualClock::new(), LeaseConfig::new().slots(3));
    /// assert_eq!(err.unwrap_err(), LeaseConfigError::SlotsOutOfRange { slots: 3 });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_config(
        policy: Policy,
        clock: C,
        config: LeaseConfig,
    ) -> Result<LeasedBucket<C>, LeaseConfigError> {
        let clock = Monotonic::new(clock);
        let pool = LocalPool::new(&policy, clock.now_nanos());
        LeasedBucket::with_guarded_pool(policy, clock, config, pool)
    }

    /// The pool's packed word as stored, before any refill: decode it with the policy's
    /// [`Layout`](crate::state::Layout). For diagnostics, and to check that an operation
    /// wrote nothing.
    pub fn stored_word(&self) -> u64 {
        self.epoch().pool.stored_word()
    }

    /// Replaces the policy, carrying the tokens over with `inherit` (module
    /// [`inherit`](crate::inherit) states each strategy's exact guarantee): the pool's
    /// balance and every token idle in a slot are converted together, as the one balance
    /// a plain bucket would hold. Operations racing the switch decide either wholly
    /// before it, on the old policy and state, or wholly after it, on the new; none is
    /// lost or counted twice (see [the module docs](crate::leased#reconfiguration)).
    ///
    /// The slot count stays; the largest lease is the new policy's default, or the one
    /// the [`LeaseConfig`] fixed. Concurrent reconfigurations are applied one after the
    /// other, each converting what the previous one left. The replaced policy's
    /// [`epoch_bytes`](LeasedBucket::epoch_bytes) are freed once no operation holds it.
    ///
    /// Only a bucket on a [`LocalPool`] can be reconfigured in place: a pool on a remote
    /// store keeps its own policy.
    ///
    /// # Errors
    ///
    /// [`LeaseConfigError::LeaseOutOfRange`] when the configuration fixed a largest lease
    /// that the new policy does not allow (above its capacity, or above what its slots
    /// hold). Nothing changes.
    ///
    /// ```
    /// use tokengate::{leased::LeaseConfig, Inherit, LeasedBucket, ManualClock, Policy};
    /// let config = LeaseConfig::new().slots(2);
    /// let bucket = LeasedBucket::with_config(Policy::new(100, 10.0)?, ManualClock::new(), config)?;
    /// assert!(bucket.try_acquire_on(0, 60)?.is_admitted()); // 40 left, some in slot 0
    ///
    /// // Ten times the capacity, the same fraction of it: 400 of 1000.
    /// let switch = bucket.reconfigure(Policy::new(1000, 100.0)?, Inherit::Proportional)?;
    /// assert_eq!((switch.before, switch.after), (40.0, 400.0));
    /// assert_eq!(bucket.leased_tokens(), 0); // the slot's tokens joined the balance
    /// assert!(bucket.try_acquire(400)?.is_admitted());
    /// assert!(bucket.try_acquire(1)?.is_rejected());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reconfigure(
        &self,
        policy: Policy,
        inherit: Inherit,
    ) -> Result<Reconfigured, LeaseConfigError> {
        let slots = self.slots();
        let max_lease = match self.fixed_lease {
            Some(tokens) => {
                let max = lease_limit(&policy);
                if tokens > max {
                    return Err(LeaseConfigError::LeaseOutOfRange {
                        max_lease: tokens,
                        max,
                    });
                }
                tokens
            }
            None => default_lease(&policy, slots),
        };
        // Allocated before anything is closed: from the seal to the publication, only
        // arithmetic, so that operations waiting on the switch wait for nothing else.
        let mut next = Next::new(Epoch::new(
            policy,
            slots,
            max_lease,
            LocalPool::from_word(0),
            Passes::new(policy.layout(), 0),
        ));
        loop {
            let pinned = self.epoch();
            let epoch = &*pinned;
            if !epoch.claim_replacement() {
                // Another reconfiguration replaces it: convert what that one leaves.
                self.await_successor(epoch);
                continue;
            }
            let from = epoch.policy.layout();
            // Should anything below unwind (a clock that panics), the switch is undone:
            // the word unsealed, the slots reopened, the old policy current.
            let mut undo = Undo { epoch, word: None };
            // Every slot closed for good: idle tokens taken (and given back at once, so
            // that admissions during the switch still count them), leases in flight
            // cancelled. No slot can be spent from or leased to again.
            let found = epoch.slots.close(None);
            let _unsealed = epoch
                .pool
                .give_back_in(from, found.taken << from.frac_bits());
            // Every hand that took tokens from the pool before the close stores them and
            // lets its slot go: then the pool's word holds the whole balance.
            if !mutant!(LEASED_SWITCH_SKIPS_WAIT) {
                epoch.slots.await_settled();
            }
            let word = epoch.pool.seal();
            undo.word = Some(word);
            // Read after the seal: not earlier than any reading stored in `word`.
            let now = self.clock.now_nanos();
            let (word, report) = convert_sealed(from, &epoch.passes, word, now, &policy, inherit);
            next.pool.store_word(word);
            next.passes = Passes::new(policy.layout(), now);
            std::mem::forget(undo);
            self.epochs.replace(&pinned, next);
            return Ok(report);
        }
    }
}

/// Undoes a switch that did not complete.
struct Undo<'a> {
    epoch: &'a Epoch<LocalPool>,
    /// The word the switch sealed, once it did.
    word: Option<u64>,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        // Nothing writes a sealed word, and no successor was published: restoring it is
        // the state as if the switch had not begun (the slots' tokens are in it).
        if let Some(word) = self.word {
            self.epoch.pool.store_word(word);
        }
        self.epoch.slots.reopen(None);
        self.epoch.drop_replacement();
    }
}

impl<C: Clock, P: Pool> LeasedBucket<C, P> {
    /// A leased bucket on `clock` with `config`, leasing from `pool`, which must have
    /// been built for `policy` (and read `clock`'s time, for a pool that keeps ticks).
    ///
    /// # Errors
    ///
    /// [`LeaseConfigError`] as for [`with_config`](LeasedBucket::with_config).
    ///
    /// ```
    /// use tokengate::{Clock, LeasedBucket, ManualClock, Policy};
    /// use tokengate::leased::{LeaseConfig, LocalPool};
    /// let (policy, clock) = (Policy::new(10, 1.0)?, ManualClock::new());
    /// let pool = LocalPool::new(&policy, clock.now_nanos());
    /// let bucket = LeasedBucket::with_pool(policy, clock, LeaseConfig::new().slots(2), pool)?;
    /// assert!(bucket.try_acquire(10)?.is_admitted());
    /// assert!(bucket.try_acquire(1)?.is_rejected());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_pool(
        policy: Policy,
        clock: C,
        config: LeaseConfig,
        pool: P,
    ) -> Result<LeasedBucket<C, P>, LeaseConfigError> {
        let clock = Monotonic::new(clock);
        // The guard's first mark: the pool read the clock before this.
        clock.now_nanos();
        LeasedBucket::with_guarded_pool(policy, clock, config, pool)
    }

    fn with_guarded_pool(
        policy: Policy,
        clock: Monotonic<C>,
        config: LeaseConfig,
        pool: P,
    ) -> Result<LeasedBucket<C, P>, LeaseConfigError> {
        let slots = config.slots.unwrap_or_else(default_slots);
        if !slots.is_power_of_two() || slots > MAX_SLOTS {
            return Err(LeaseConfigError::SlotsOutOfRange { slots });
        }
        let max = lease_limit(&policy);
        let max_lease = match config.max_lease {
            Some(tokens) if tokens == 0 || tokens > max => {
                return Err(LeaseConfigError::LeaseOutOfRange {
                    max_lease: tokens,
                    max,
                });
            }
            Some(tokens) => tokens,
            None => default_lease(&policy, slots),
        };
        Ok(LeasedBucket::build(
            policy,
            clock,
            slots,
            max_lease,
            config.max_lease,
            pool,
        ))
    }

    fn build(
        policy: Policy,
        clock: Monotonic<C>,
        slots: usize,
        max_lease: u64,
        fixed_lease: Option<u64>,
        pool: P,
    ) -> LeasedBucket<C, P> {
        debug_assert!(max_lease <= lease_limit(&policy));
        let passes = Passes::new(policy.layout(), clock.now_nanos());
        LeasedBucket {
            epochs: Chain::freeing(Epoch::new(policy, slots, max_lease, pool, passes)),
            clock,
            fixed_lease,
            anchor: Box::new(Anchor(0)),
        }
    }

    /// The current epoch's identity (one more than its number: never 0, and no two
    /// epochs of the bucket share it), for a caller that decides on one epoch.
    pub(crate) fn epoch_id(&self) -> usize {
        Self::id_of(&self.epoch())
    }

    /// The identity of the pinned epoch `epoch` ([`epoch_id`](Self::epoch_id)).
    #[inline(always)]
    fn id_of(epoch: &Pinned<'_, Epoch<P>>) -> usize {
        usize::try_from(epoch.number() + 1).unwrap_or(usize::MAX)
    }

    /// [`take_at`](sealed::Sealed::take_at) on epoch `id` only: [`SEALED_ERROR`],
    /// deciding and writing nothing, when it is not current or is being replaced. A
    /// scoped limiter whose configuration names the epoch decides with that epoch alone.
    pub(crate) fn take_exactly(
        &self,
        id: usize,
        cost: u64,
        now: u64,
    ) -> Result<Decision, AcquireError> {
        let pinned = self.epoch();
        let epoch = &*pinned;
        if Self::id_of(&pinned) != id {
            return Err(SEALED_ERROR);
        }
        let now = self.at(epoch, self.clock.observe(now));
        let slot = thread_index();
        match Self::from_slot(epoch, slot, cost, now) {
            Some(out) => out,
            None => match self.trip(epoch, slot, cost, now) {
                Ok(out) => out,
                Err(Sealed) => Err(SEALED_ERROR),
            },
        }
    }

    /// The first pass and the take's work at once (see
    /// [`Prepared`](crate::multi::Prepared)), on epoch `id` when given (a scoped
    /// limiter's generation's; neither when it is not current): the take from this
    /// thread's slot as loaded now, or the refusal
    /// [`refusal_at`](sealed::Sealed::refusal_at) gives, or neither (a slot that cannot
    /// pay alone, a pass due: the take decides, leasing or running the pass). Writes
    /// nothing.
    #[inline(always)]
    pub(crate) fn prepare_on(&self, id: Option<usize>, cost: u64, now: u64) -> Prepared {
        let pinned = self.epoch();
        let epoch = &*pinned;
        let at = Self::id_of(&pinned);
        if id.is_some_and(|id| id != at) {
            return Prepared::Open;
        }
        let now = self.clock.observe(now);
        let layout = epoch.policy.layout();
        let slot = thread_index();
        let now_tick = layout.tick_of(now);
        if cost > 0 && cost <= layout.capacity() && !epoch.passes.is_due(now) {
            if let Some((cur, left)) = epoch.slots.plan(slot, cost, now_tick) {
                let balance = (left << layout.frac_bits()) as i64;
                let (balance, lead_nanos) =
                    Decision::with_balance(layout, balance, 0, now, cost, true).parts();
                return Prepared::Take(Planned {
                    cur,
                    next: cur - cost,
                    balance,
                    lead_nanos,
                    aux: at,
                });
            }
        }
        // As `refusal_at`.
        if cost == 0 || epoch.slots.can_pay(slot, cost, now_tick) {
            return Prepared::Open;
        }
        match Self::refusal_on_global(epoch, cost, now) {
            Some(d) => Prepared::Refused(d),
            None => Prepared::Open,
        }
    }

    /// Lands `plan`, made by [`prepare_on`](LeasedBucket::prepare_on) with the same `id`
    /// at `now` for `cost`: the slot's word taken from as read, when its epoch is still
    /// current and the word unchanged; else the take on the bucket as it is then (on
    /// epoch `id` only, when given, as [`take_exactly`](LeasedBucket::take_exactly)).
    #[inline(always)]
    pub(crate) fn commit_on(
        &self,
        id: Option<usize>,
        plan: &Planned,
        cost: u64,
        now: u64,
    ) -> Result<Decision, AcquireError> {
        let pinned = self.epoch();
        let epoch = &*pinned;
        if Self::id_of(&pinned) == plan.aux && epoch.slots.land(thread_index(), plan.cur, cost) {
            return Ok(Decision::from_parts(
                epoch.policy.layout(),
                plan.balance,
                plan.lead_nanos,
                cost,
                true,
            ));
        }
        match id {
            Some(id) => self.take_exactly(id, cost, now),
            None => sealed::Sealed::take_at(self, cost, now),
        }
    }

    /// [`refund_at`](sealed::Sealed::refund_at) on epoch `id` only: `false`, giving
    /// nothing, when it is not current or is being replaced.
    pub(crate) fn refund_exactly(&self, id: usize, cost: u64, now: u64) -> bool {
        let pinned = self.epoch();
        let epoch = &*pinned;
        if Self::id_of(&pinned) != id {
            return false;
        }
        let layout = epoch.policy.layout();
        let units = layout.units_of(cost.min(layout.capacity())).unwrap_or(0);
        let now = self.at(epoch, self.clock.observe(now));
        self.refund_on(epoch, units, now)
    }

    /// [`refusal_at`](sealed::Sealed::refusal_at) on epoch `id` only: `None` when it
    /// is not current (the take then finds it replaced).
    pub(crate) fn refusal_exactly(&self, id: usize, cost: u64, now: u64) -> Option<Decision> {
        if self.epoch_id() != id {
            return None;
        }
        sealed::Sealed::refusal_at(self, cost, now)
    }

    /// Whether [`reconfigure`](LeasedBucket::reconfigure) would take `policy`: a fixed
    /// [`LeaseConfig::max_lease`] must fit it.
    pub(crate) fn check_policy(&self, policy: &Policy) -> Result<(), LeaseConfigError> {
        match self.fixed_lease {
            Some(tokens) if tokens > lease_limit(policy) => {
                Err(LeaseConfigError::LeaseOutOfRange {
                    max_lease: tokens,
                    max: lease_limit(policy),
                })
            }
            _ => Ok(()),
        }
    }

    /// The current epoch, held until the guard is dropped.
    #[inline(always)]
    fn epoch(&self) -> Pinned<'_, Epoch<P>> {
        self.epochs.pin()
    }

    /// Waits until `replaced`, whose pool an operation found sealed, has its successor:
    /// the reconfiguration that sealed it publishes it a few instructions later (or, if
    /// it unwinds, unseals the word).
    #[cold]
    #[inline(never)]
    fn await_successor(&self, replaced: &Epoch<P>) {
        self.epochs.await_successor(replaced, |e| e.is_replacing());
    }

    /// Gives what an operation held when it found `from`'s pool sealed (whole tokens
    /// of `from`'s layout) to the current epoch's pool, as they are (capped there).
    ///
    /// Never reached with a hand in practice: a reconfiguration seals the pool only once
    /// every hand that took tokens from it has stored them (see
    /// [`Slots::await_settled`](slots::Slots::await_settled)), and every operation on a
    /// replaced epoch finds its slots closed and holds nothing. Kept so that no token is
    /// dropped even so.
    #[cold]
    #[inline(never)]
    fn forward(&self, from: &Epoch<P>, replaced: Replaced) {
        let tokens = replaced.hand_units >> from.policy.layout().frac_bits();
        if tokens == 0 {
            return;
        }
        let mut epoch = from;
        loop {
            self.await_successor(epoch);
            epoch = self.epochs.current_while(from);
            let layout = epoch.policy.layout();
            let units = tokens.min(layout.capacity()) << layout.frac_bits();
            if epoch.give_back(layout, units).is_ok() {
                return;
            }
        }
    }

    /// The clock's reading (through the monotonic guard), after `epoch`'s re-anchoring
    /// pass if one is due.
    #[inline(always)]
    fn now_on(&self, epoch: &Epoch<P>) -> u64 {
        self.at(epoch, self.clock.now_nanos())
    }

    /// `now` (a guarded reading), after `epoch`'s re-anchoring pass if one is due: one
    /// relaxed load and a predicted branch otherwise. See [`crate::pass`].
    #[inline(always)]
    fn at(&self, epoch: &Epoch<P>, now: u64) -> u64 {
        epoch
            .passes
            .check(now, &self.clock, |now, idle| self.pass(epoch, now, idle))
    }

    /// The re-anchoring pass. Slot stamps are ticks modulo the wrap too, so every pass
    /// takes the slots' leases back; a pool that [`wraps`](Pool::wraps) is then
    /// re-anchored at `now` (its refilled state at its own tick, as a plain bucket's
    /// pass stores), or, after an idle longer than the fill time (`idle`), reset full.
    /// A pass on a replaced epoch writes nothing: its successor has passes of its own.
    #[cold]
    #[inline(never)]
    fn pass(&self, epoch: &Epoch<P>, now: u64, idle: bool) {
        let layout = epoch.policy.layout();
        if idle && epoch.pool.wraps() {
            let mut others = epoch.other_slots(None);
            // A fill drops what the lessees held, sealed or not.
            let _sealed = epoch.fill_pool(layout, now, &mut others);
            others.release();
            return;
        }
        self.reclaim_on(epoch);
        if let Err(replaced) = epoch.reanchor_pool(layout, &self.clock, now) {
            self.forward(epoch, replaced);
        }
    }

    /// Takes `cost` tokens if the bucket (its pool's balance plus every slot) covers
    /// them, from this thread's slot when it can.
    ///
    /// Returns a [`Decision`] as [`Bucket::try_acquire`](crate::Bucket::try_acquire) does;
    /// for an admission paid from the slot, [`Decision::tokens_remaining`] is the tokens
    /// left in the slot (a lower bound of the balance), and for a rejection the global
    /// balance plus `slots * max_lease` could not pay, it is the pool's balance (also a
    /// lower bound; see [what is approximate](crate::leased#what-is-approximate)). A cost
    /// of zero is always admitted and writes nothing.
    ///
    /// # Errors
    ///
    /// - [`AcquireError::CostExceedsCapacity`] at once for a cost above the capacity.
    /// - [`AcquireError::PoolUnavailable`] or [`AcquireError::ClockWentBackwards`] only
    ///   from a [`Pool`] implementation that can fail or keeps its own time (the default
    ///   [`LocalPool`] never returns either). Nothing is written.
    ///
    /// ```
    /// use tokengate::{AcquireError, LeasedBucket, ManualClock, Policy};
    /// let bucket = LeasedBucket::with_clock(Policy::new(10, 1.0)?, ManualClock::new());
    /// assert!(bucket.try_acquire(3)?.is_admitted());
    /// assert_eq!(
    ///     bucket.try_acquire(11),
    ///     Err(AcquireError::CostExceedsCapacity { cost: 11, capacity: 10 })
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    // Always inlined: see `Bucket::try_acquire`.
    #[inline(always)]
    pub fn try_acquire(&self, cost: u64) -> Result<Decision, AcquireError> {
        self.try_acquire_on(thread_index(), cost)
    }

    /// [`try_acquire`](LeasedBucket::try_acquire) from slot `slot` (taken modulo the slot
    /// count) instead of this thread's: for callers with their own worker index, and for
    /// tests that simulate many cores on one thread.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](LeasedBucket::try_acquire).
    ///
    /// ```
    /// use tokengate::{leased::LeaseConfig, LeasedBucket, ManualClock, Policy};
    /// let config = LeaseConfig::new().slots(2).max_lease(10);
    /// let bucket = LeasedBucket::with_config(Policy::new(40, 1.0)?, ManualClock::new(), config)?;
    /// assert!(bucket.try_acquire_on(0, 1)?.is_admitted()); // leases 9 more to slot 0
    /// assert!(bucket.try_acquire_on(1, 1)?.is_admitted()); // leases to slot 1
    /// assert_eq!(bucket.leased_tokens(), 9 + 7);
    /// assert_eq!(bucket.available(), 38.0); // leased tokens still count
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn try_acquire_on(&self, slot: usize, cost: u64) -> Result<Decision, AcquireError> {
        // Every call off this path is a tail call (a clock read out of line, a pass due,
        // the trip), so that no value lives across a call and the decision saves few
        // registers (measured: BENCHMARKS.md, "The leased rejection without calls").
        // The pin is handed to the call that ends it (none is made on the way back).
        let Some(pinned) = self.epochs.try_pin() else {
            return self.acquire_called(slot, cost);
        };
        let Some(now) = self.clock.now_inline() else {
            return self.acquire_called_on(pinned, slot, cost);
        };
        if pinned.passes.is_due(now) {
            return self.acquire_called_on(pinned, slot, cost);
        }
        self.acquire_at(pinned, slot, cost, now)
    }

    /// [`try_acquire_on`](Self::try_acquire_on) for a thread's first pin.
    #[cold]
    #[inline(never)]
    fn acquire_called(&self, slot: usize, cost: u64) -> Result<Decision, AcquireError> {
        self.acquire(slot, cost, |epoch| self.now_on(epoch))
    }

    /// [`try_acquire_on`](Self::try_acquire_on) on `pinned` where its inline path would
    /// make a call: the clock read out of line, or the re-anchoring pass due.
    #[cold]
    #[inline(never)]
    fn acquire_called_on(
        &self,
        pinned: Pinned<'_, Epoch<P>>,
        slot: usize,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        let now = self.now_on(&pinned);
        self.acquire_at(pinned, slot, cost, now)
    }

    /// Decides `cost` on the current epoch at `now(epoch)`. The decision is returned as
    /// it is (no wrapper to unwrap on the hot path): a trip to the pool that finds the
    /// epoch replaced starts again on the successor itself ([`acquire_replaced`]).
    ///
    /// [`acquire_replaced`]: Self::acquire_replaced
    #[inline(always)]
    fn acquire(
        &self,
        slot: usize,
        cost: u64,
        now: impl Fn(&Epoch<P>) -> u64,
    ) -> Result<Decision, AcquireError> {
        let pinned = self.epoch();
        let now = now(&pinned);
        self.acquire_at(pinned, slot, cost, now)
    }

    /// The capacity check and the slot spend on `epoch`, then, when the slot cannot pay,
    /// the read-only rejection on the pool word ([`Self::refusal_on_word`]), inline so
    /// that a rejection makes no call; [`Self::acquire_slow`] when neither decides.
    #[inline(always)]
    fn acquire_at(
        &self,
        pinned: Pinned<'_, Epoch<P>>,
        slot: usize,
        cost: u64,
        now: u64,
    ) -> Result<Decision, AcquireError> {
        let epoch = &*pinned;
        // Formed once, for the slot and the pool word both.
        let now_tick = epoch.policy.layout().tick_of(now);
        match Self::from_slot_at(epoch, slot, cost, now, now_tick) {
            Ok(out) => out,
            Err(Spend::Raced) => self.acquire_slow(pinned, slot, cost, now),
            Err(_) => match Self::refusal_on_word(epoch, cost, now, now_tick) {
                Some(refused) => Ok(refused),
                None => self.acquire_slow(pinned, slot, cost, now),
            },
        }
    }

    /// A cost above the capacity refused, or paid from the slot: `None` when the slot
    /// did not pay (nothing written).
    #[inline(always)]
    fn from_slot(
        epoch: &Epoch<P>,
        slot: usize,
        cost: u64,
        now: u64,
    ) -> Option<Result<Decision, AcquireError>> {
        Self::from_slot_at(epoch, slot, cost, now, epoch.policy.layout().tick_of(now)).ok()
    }

    /// [`from_slot`](Self::from_slot) with `now`'s tick, `now_tick`, already formed, and
    /// why the slot did not pay: [`Spend::Unpayable`] (a cost of zero included) or
    /// [`Spend::Raced`] (the trip decides it then).
    #[inline(always)]
    fn from_slot_at(
        epoch: &Epoch<P>,
        slot: usize,
        cost: u64,
        now: u64,
        now_tick: u64,
    ) -> Result<Result<Decision, AcquireError>, Spend> {
        let layout = epoch.policy.layout();
        if cost > layout.capacity() {
            return Ok(Err(cost_exceeds_capacity(layout, cost)));
        }
        if cost == 0 {
            return Err(Spend::Unpayable);
        }
        match epoch.slots.consume(slot, cost, now_tick) {
            Spend::Paid(left) => {
                let balance = (left << layout.frac_bits()) as i64;
                Ok(Ok(Decision::with_balance(
                    layout, balance, 0, now, cost, true,
                )))
            }
            other => Err(other),
        }
    }

    /// [`read_only_refusal`](Self::read_only_refusal) decided on the [`LocalPool`]'s
    /// word as loaded, without forming a snapshot, where that is simple: a cost of at
    /// least one, a reading at or forward of the word's tick (so `behind` is zero and no
    /// reread is due), and no slot to read (the pool cannot pay with the most the slots
    /// can hold, or no slot is stocked). The same refusal, balance and loads as the
    /// trip's; `None` leaves the decision to the trip (a sealed word included, and a
    /// rejection that must count the slots: the loop would keep a dozen values alive, and
    /// every decision would save registers for it).
    #[inline(always)]
    fn refusal_on_word(epoch: &Epoch<P>, cost: u64, now: u64, now_tick: u64) -> Option<Decision> {
        let local = epoch.local()?;
        if cost == 0 {
            return None;
        }
        let layout = epoch.policy.layout();
        let word = local.load();
        // Uncapped: below `needed` (at most `max_units`) it is the refilled balance, and
        // at or above it the capped balance is too, so the refusal is the same. A sealed
        // word needs no test of its own: its token field, all ones, is above
        // `max_units`, so it is never short and goes to the trip.
        let pool = layout.forward_units(word, now_tick)?;
        let units = Self::short_with_slots(epoch, pool, cost, |_, _| None)?;
        let balance = units as i64 - layout.base_units() as i64;
        Some(Decision::with_balance(layout, balance, 0, now, cost, false))
    }

    /// The units the pool (`pool`, refilled) and the slots hold together when they are
    /// short of `cost`; `None` when they could pay it. The slots are read only when
    /// they might make up the difference, in order, and only until they could, by
    /// `count` ([`Slots::held_at_most`] on the trip; inline, a count that answers `None`,
    /// leaving such a rejection to the trip).
    #[inline(always)]
    fn short_with_slots(
        epoch: &Epoch<P>,
        pool: u64,
        cost: u64,
        count: impl FnOnce(&Slots, u64) -> Option<u64>,
    ) -> Option<u64> {
        let layout = epoch.policy.layout();
        let needed = layout.base_units() + (cost << layout.frac_bits());
        if pool >= needed {
            return None;
        }
        // `pool + max_held < needed`, formed without overflow since `needed > pool`.
        let missing = needed - pool;
        if epoch.max_held_units < missing {
            return Some(pool);
        }
        // No slot stocked: no OPEN slot holds a token, and no slot is read.
        if epoch.slots.stocked() == 0 {
            return Some(pool);
        }
        // `pool + held * 2^F < needed` exactly when `held * 2^F <= missing - 1`, that is
        // `held <= (missing - 1) >> F`; then `held * 2^F` cannot overflow.
        let frac_bits = layout.frac_bits();
        let most = (missing - 1) >> frac_bits;
        Some(pool + (count(&epoch.slots, most)? << frac_bits))
    }

    /// The trip to the pool: lease, reclaim, or reject; on a replaced epoch, again on the
    /// successor.
    #[cold]
    #[inline(never)]
    fn acquire_slow(
        &self,
        pinned: Pinned<'_, Epoch<P>>,
        slot: usize,
        cost: u64,
        now: u64,
    ) -> Result<Decision, AcquireError> {
        match self.trip(&pinned, slot, cost, now) {
            Ok(out) => out,
            Err(Sealed) => self.acquire_replaced(&pinned, slot, cost),
        }
    }

    /// Decides `cost` on the epochs after `replaced` (whose pool a trip found sealed,
    /// having decided and written nothing), at a new reading of the clock, until one is
    /// not replaced under it.
    #[cold]
    #[inline(never)]
    fn acquire_replaced(
        &self,
        replaced: &Epoch<P>,
        slot: usize,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        let mut replaced = replaced;
        loop {
            self.await_successor(replaced);
            // The caller's pin holds `replaced`, and whatever is current now.
            let epoch = self.epochs.current_while(replaced);
            let now = self.now_on(epoch);
            if let Some(out) = Self::from_slot(epoch, slot, cost, now) {
                return out;
            }
            match self.trip(epoch, slot, cost, now) {
                Ok(out) => return out,
                Err(Sealed) => replaced = epoch,
            }
        }
    }

    /// One trip to `epoch`'s pool: lease, reclaim, or reject; [`Sealed`] (having decided
    /// and written nothing) when the epoch was replaced.
    #[inline(always)]
    fn trip(
        &self,
        epoch: &Epoch<P>,
        slot: usize,
        cost: u64,
        now: u64,
    ) -> Result<Result<Decision, AcquireError>, Sealed> {
        let layout = epoch.policy.layout();
        if cost == 0 {
            let Ok((units, behind)) = Self::balance_on(epoch, now) else {
                return Err(Sealed);
            };
            return Ok(Ok(Decision::with_balance(
                layout, units, behind, now, 0, true,
            )));
        }
        let cost_units = cost << layout.frac_bits();
        let mut now = now;
        let Ok(mut state) = epoch.peek(layout, now) else {
            return Err(Sealed);
        };
        if state.behind_ticks > layout.tolerance_ticks() {
            // A lost race or a clock stepped back: read again after loading the word. A
            // refusal here comes before the slot is claimed, so it writes nothing.
            match epoch.reread(layout, &self.clock) {
                Ok(Ok(reread)) => (state, now) = reread,
                Ok(Err(e)) => return Ok(Err(e)),
                Err(_) => return Err(Sealed),
            }
        }
        if let Some(refused) = Self::read_only_refusal(epoch, &state, now, cost) {
            return Ok(Ok(refused));
        }
        let claim = epoch.slots.claim(slot);
        let marker = claim.map(|(index, _)| index);
        // The claim took tokens: the slot stays stocked for this trip until it publishes.
        let claimed = claim.is_some_and(|(_, tokens)| tokens > 0);
        let returned_units = claim.map_or(0, |(_, tokens)| tokens << layout.frac_bits());
        let mut others = epoch.other_slots(marker);
        let request = LeaseRequest {
            now,
            cost_units,
            returned_units,
            lease: marker.is_some(),
        };
        let outcome = epoch.lease(layout, &self.clock, request, &mut others);
        others.release();
        let (leased_units, tick) = match outcome {
            Ok(Ok(LeaseOutcome::Admitted {
                leased_units, tick, ..
            })) => (leased_units, tick),
            _ => (0, 0),
        };
        let mut not_given_back = None;
        if let Some(index) = marker {
            let tokens = leased_units >> layout.frac_bits();
            if !epoch.slots.publish(index, tick, tokens, claimed) {
                // A closer cancelled the lease: it is given back, never spent, and only
                // then is the slot let go (until then closers count it as in flight).
                not_given_back = epoch.give_back(layout, leased_units).err();
                epoch.slots.abandon(index);
            }
        }
        if let Some(replaced) = not_given_back {
            self.forward(epoch, replaced);
        }
        let outcome = match outcome {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(e)) => return Ok(Err(e)),
            Err(replaced) => {
                self.forward(epoch, replaced);
                return Err(Sealed);
            }
        };
        Ok(match outcome {
            LeaseOutcome::Admitted {
                leased_units,
                balance_units,
                ..
            } => Ok(Decision::with_balance(
                layout,
                balance_units.saturating_add(leased_units as i64),
                0,
                now,
                cost,
                true,
            )),
            LeaseOutcome::Rejected {
                balance_units,
                behind_ticks,
                now_nanos,
            } => Ok(Decision::with_balance(
                layout,
                balance_units,
                behind_ticks,
                now_nanos,
                cost,
                false,
            )),
            LeaseOutcome::Unavailable { retry_after } => {
                Err(AcquireError::PoolUnavailable { retry_after })
            }
        })
    }

    /// The read-only rejection (I5): when the pool's balance (`state`, at `now`) and
    /// every slot together cannot pay `cost`, the refusal, having written nothing.
    /// `min(B, g + Δ) + O < needed` implies `min(B, g + Δ + O) < needed`: what a plain
    /// bucket holds cannot pay either. First on the pool alone, against the most
    /// the slots can hold, so that a rejection even full slots could not turn loads no
    /// slot's line; then, only if the slots might pay, on what they hold.
    #[inline]
    fn read_only_refusal(
        epoch: &Epoch<P>,
        state: &PoolState,
        now: u64,
        cost: u64,
    ) -> Option<Decision> {
        let layout = epoch.policy.layout();
        let units = Self::short_with_slots(epoch, state.units, cost, Slots::held_at_most)?;
        let balance = units as i64 - layout.base_units() as i64;
        Some(Decision::with_balance(
            layout,
            balance,
            state.behind_ticks,
            now,
            cost,
            false,
        ))
    }

    /// [`read_only_refusal`](Self::read_only_refusal) on the pool as it is now,
    /// for `acquire_all`'s first pass once this thread's slot could not pay. A reading
    /// well behind the pool, or a replaced epoch, is left to the take.
    #[cold]
    #[inline(never)]
    fn refusal_on_global(epoch: &Epoch<P>, cost: u64, now: u64) -> Option<Decision> {
        let layout = epoch.policy.layout();
        let state = epoch.peek(layout, now).ok()?;
        if state.behind_ticks > layout.tolerance_ticks() {
            return None;
        }
        Self::read_only_refusal(epoch, &state, now, cost)
    }

    /// Balance at `now` in units (global, refilled, plus every slot, capped) and how
    /// many ticks `now` is behind the pool. Read-only.
    fn balance_on(epoch: &Epoch<P>, now: u64) -> Result<(i64, u64), Replaced> {
        let layout = epoch.policy.layout();
        let state = epoch.peek(layout, now)?;
        let held = epoch.slots.held().saturating_mul(1 << layout.frac_bits());
        // min(B, min(B, g + Δ) + O) = min(B, g + Δ + O): what a plain bucket holds.
        let units = state.units.saturating_add(held).min(layout.max_units());
        Ok((
            units as i64 - layout.base_units() as i64,
            state.behind_ticks,
        ))
    }

    /// Gives back `cost` tokens of an earlier admission, exactly as if it had never been
    /// taken: `min(B, balance now + cost)`, as [`Bucket::refund`](crate::Bucket::refund).
    ///
    /// When the refund could meet the capacity while tokens are out on lease, the slots
    /// are taken back first (see the [module docs](crate::leased)). A refund after a
    /// [reconfiguration](LeasedBucket::reconfigure) gives the tokens to the new policy as
    /// they are (capped at its capacity), as [`LiveBucket::refund`](crate::LiveBucket::refund)
    /// does.
    ///
    /// # Errors
    ///
    /// [`AcquireError::CostExceedsCapacity`] for a cost above the capacity (nothing
    /// changes).
    ///
    /// ```
    /// use tokengate::{LeasedBucket, ManualClock, Policy};
    /// let bucket = LeasedBucket::with_clock(Policy::new(10, 1.0)?, ManualClock::new());
    /// bucket.try_acquire(4)?;
    /// bucket.refund(4)?;
    /// assert_eq!(bucket.available(), 10.0);
    /// bucket.refund(4)?; // capped
    /// assert_eq!(bucket.available(), 10.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund(&self, cost: u64) -> Result<(), AcquireError> {
        loop {
            let pinned = self.epoch();
            let epoch = &*pinned;
            let layout = epoch.policy.layout();
            let Some(units) = layout.units_of(cost) else {
                return Err(cost_exceeds_capacity(layout, cost));
            };
            if self.refund_on(epoch, units, self.now_on(epoch)) {
                return Ok(());
            }
            self.await_successor(epoch);
        }
    }

    /// Credits `units` to `epoch` at `now`; `false` (having written nothing) when it was
    /// replaced.
    fn refund_on(&self, epoch: &Epoch<P>, units: u64, now: u64) -> bool {
        if units == 0 {
            return true;
        }
        let mut others = epoch.other_slots(None);
        let out = epoch.credit(epoch.policy.layout(), now, units, &mut others);
        others.release();
        match out {
            Ok(()) => true,
            Err(replaced) => {
                self.forward(epoch, replaced);
                false
            }
        }
    }

    /// Puts the bucket back in the policy's start state (full or empty), dropping the
    /// tokens held in slots.
    ///
    /// ```
    /// use tokengate::{LeasedBucket, ManualClock, Policy};
    /// let bucket = LeasedBucket::with_clock(Policy::new(10, 1.0)?, ManualClock::new());
    /// bucket.try_acquire(10)?;
    /// bucket.reset();
    /// assert_eq!(bucket.available(), 10.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset(&self) {
        loop {
            let pinned = self.epoch();
            let epoch = &*pinned;
            let now = self.now_on(epoch);
            let mut others = epoch.other_slots(None);
            let out = epoch.reset_pool(
                epoch.policy.layout(),
                &self.clock,
                now,
                epoch.policy.starts_full(),
                &mut others,
            );
            others.release();
            if out.is_ok() {
                return;
            }
            self.await_successor(epoch);
        }
    }

    /// Returns every slot's idle tokens to the pool (for example before a quiet
    /// period, so that [`leased_tokens`](LeasedBucket::leased_tokens) reads zero). Never
    /// needed for correctness: requests the pool cannot pay reclaim on their own.
    ///
    /// ```
    /// use tokengate::{LeasedBucket, ManualClock, Policy};
    /// let bucket = LeasedBucket::with_clock(Policy::new(1000, 1.0)?, ManualClock::new());
    /// bucket.try_acquire(1)?;
    /// bucket.reclaim();
    /// assert_eq!(bucket.leased_tokens(), 0);
    /// assert_eq!(bucket.available(), 999.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reclaim(&self) {
        loop {
            let pinned = self.epoch();
            let epoch = &*pinned;
            self.reclaim_on(epoch);
            if self.epochs.is_current(epoch) {
                return;
            }
        }
    }

    fn reclaim_on(&self, epoch: &Epoch<P>) {
        let layout = epoch.policy.layout();
        let found = epoch.slots.close(None);
        let out = epoch.give_back(layout, found.taken << layout.frac_bits());
        epoch.slots.reopen(None);
        if let Err(replaced) = out {
            self.forward(epoch, replaced);
        }
    }

    /// Stores the pool refilled to now at its own tick ([`LocalPool::reanchor_in`]), so
    /// that its stored tick is recent: the re-anchor a
    /// [`ScopedLimiter::sweep`](crate::ScopedLimiter::sweep) does for the tick wrap, as
    /// it does a plain global bucket's.
    pub(crate) fn reanchor(&self) {
        loop {
            let pinned = self.epoch();
            let epoch = &*pinned;
            let out =
                epoch.reanchor_pool(epoch.policy.layout(), &self.clock, self.clock.now_nanos());
            match out {
                Ok(()) => return,
                Err(replaced) => {
                    self.forward(epoch, replaced);
                    self.await_successor(epoch);
                }
            }
        }
    }

    /// Tokens available now: the pool's balance (refilled) plus every slot's, capped at
    /// the capacity, as a plain bucket would hold. A read-only peek; racy under
    /// concurrent admissions, exact otherwise.
    ///
    /// ```
    /// use tokengate::{LeasedBucket, ManualClock, Policy};
    /// let bucket = LeasedBucket::with_clock(Policy::new(100, 1.0)?, ManualClock::new());
    /// bucket.try_acquire(30)?;
    /// assert_eq!(bucket.available(), 70.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn available(&self) -> f64 {
        loop {
            let pinned = self.epoch();
            let epoch = &*pinned;
            if let Ok((units, _)) = Self::balance_on(epoch, self.now_on(epoch)) {
                return epoch.policy.layout().units_to_tokens(units);
            }
            self.await_successor(epoch);
        }
    }

    /// Tokens held in slots now (leased and not yet spent or reclaimed): the stranded
    /// capacity, at most `slots * max_lease`.
    pub fn leased_tokens(&self) -> u64 {
        self.epoch().slots.held()
    }

    /// How many slots hold tokens now (counting a slot whose lessee claimed tokens from
    /// it and has not yet published): the slots a rejection must read. Zero when every
    /// slot is empty, and a rejection then reads none. Racy under concurrent trips;
    /// exact, and at most [`slots`](LeasedBucket::slots), when nothing runs
    /// concurrently.
    ///
    /// ```
    /// use tokengate::{leased::LeaseConfig, LeasedBucket, ManualClock, Policy};
    /// let config = LeaseConfig::new().slots(2).max_lease(10);
    /// let bucket = LeasedBucket::with_config(Policy::new(40, 1.0)?, ManualClock::new(), config)?;
    /// assert!(bucket.try_acquire_on(0, 1)?.is_admitted()); // leases 9 to slot 0
    /// assert_eq!(bucket.stocked_slots(), 1);
    /// bucket.reclaim();
    /// assert_eq!(bucket.stocked_slots(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stocked_slots(&self) -> u64 {
        self.epoch().slots.stocked()
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.epoch().slots.len()
    }

    /// Largest lease, in tokens.
    pub fn max_lease(&self) -> u64 {
        self.epoch().max_lease
    }

    /// The policy this bucket enforces.
    pub fn policy(&self) -> Policy {
        self.epoch().policy
    }

    /// The clock this bucket reads.
    pub fn clock(&self) -> &C {
        self.clock.get_ref()
    }

    /// A stable identity for ordering buckets (the address of a cache line the bucket owns,
    /// which stays put while the bucket lives, even when the bucket itself is moved or
    /// reconfigured).
    pub fn id(&self) -> usize {
        ptr::from_ref::<Anchor>(&self.anchor) as usize
    }

    /// The pool this bucket leases from (the current policy's). The guard holds the
    /// current epoch while it lives (a replaced one is freed only after): drop it soon.
    pub fn pool(&self) -> impl std::ops::Deref<Target = P> + '_ {
        self.epochs.project(|e| &e.pool)
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

    /// Bytes one policy of this bucket holds: its pool, its slots (a cache line pair
    /// each) and their bookkeeping. A replaced policy's are freed once no operation
    /// holds it.
    pub fn epoch_bytes(&self) -> usize {
        std::mem::size_of::<Epoch<P>>() + self.epoch().slots.heap_bytes()
    }

    /// Every core-local slot's word as stored, in slot order. The slot words' layout is
    /// private; compare them before and after an operation to see that it wrote nothing.
    pub fn slot_words(&self) -> Vec<u64> {
        let slots = &self.epoch().slots;
        (0..slots.len()).map(|slot| slots.word(slot)).collect()
    }

    fn wait(&self, cost: u64, now: u64) -> Duration {
        loop {
            let pinned = self.epoch();
            let epoch = &*pinned;
            if let Ok((balance, behind)) = Self::balance_on(epoch, now) {
                let layout = epoch.policy.layout();
                return Decision::with_balance(layout, balance, behind, now, cost, false)
                    .wait_for(cost);
            }
            self.await_successor(epoch);
        }
    }
}

/// A leased bucket takes part in [`acquire_all`](crate::acquire_all) like a plain one:
/// each take, refund, wait or refusal runs on one policy's epoch, starting again on the
/// new policy when it meets a switch. Its identity is the same across switches.
impl<C: Clock, P: Pool> Member for LeasedBucket<C, P> {
    #[inline]
    fn member_id(&self) -> usize {
        self.id()
    }
    fn capacity(&self) -> u64 {
        self.policy().capacity()
    }
}

impl<C: Clock, P: Pool> sealed::Sealed for LeasedBucket<C, P> {
    #[inline]
    fn now_nanos(&self) -> u64 {
        self.now_on(&self.epoch())
    }
    fn take_at(&self, cost: u64, now: u64) -> Result<Decision, AcquireError> {
        let now = self.clock.observe(now);
        self.acquire(thread_index(), cost, |epoch| self.at(epoch, now))
    }
    fn refund_at(&self, cost: u64, now: u64) {
        let now = self.clock.observe(now);
        loop {
            let pinned = self.epoch();
            let epoch = &*pinned;
            let layout = epoch.policy.layout();
            // A switch between the take and this refund may have lowered the capacity:
            // the refund is capped there, as any refund is.
            let units = layout.units_of(cost.min(layout.capacity())).unwrap_or(0);
            if self.refund_on(epoch, units, self.at(epoch, now)) {
                return;
            }
            self.await_successor(epoch);
        }
    }
    fn wait_at(&self, cost: u64, now: u64) -> Duration {
        self.wait(cost, now)
    }
    /// The read-only rejection of [`try_acquire`](LeasedBucket::try_acquire): the global
    /// balance plus every slot cannot pay. When this thread's slot can pay, only its own
    /// line is read (the common case: the pool's line stays off the path).
    #[inline]
    fn refusal_at(&self, cost: u64, now: u64) -> Option<Decision> {
        let pinned = self.epoch();
        let epoch = &*pinned;
        let layout = epoch.policy.layout();
        if cost == 0
            || epoch
                .slots
                .can_pay(thread_index(), cost, layout.tick_of(now))
        {
            return None;
        }
        Self::refusal_on_global(epoch, cost, now)
    }
    #[inline]
    fn prepare(&self, cost: u64, now: u64, plan: &mut MaybeUninit<Prepared>) {
        plan.write(self.prepare_on(None, cost, now));
    }
    #[inline]
    fn commit(&self, plan: &Planned, cost: u64, now: u64) -> Result<Decision, AcquireError> {
        self.commit_on(None, plan, cost, now)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::slots::scans;
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn a_rejection_full_slots_could_not_turn_reads_no_slot() {
        let config = LeaseConfig::new().slots(4).max_lease(5);
        let policy = Policy::new(100, 1.0).unwrap();
        let bucket = LeasedBucket::with_config(policy, ManualClock::new(), config).unwrap();
        assert!(bucket.try_acquire_on(0, 80).unwrap().is_admitted()); // leases 20 / 8
        assert!(bucket.try_acquire_on(1, 14).unwrap().is_admitted()); // leases 4 / 8 = 0
        assert_eq!(bucket.leased_tokens(), 2);
        // Global balance 4, slots hold at most 4 * 5: a cost of 25 is refused unread.
        let before = scans();
        let d = bucket.try_acquire_on(2, 25).unwrap();
        assert!(d.is_rejected());
        assert_eq!(scans(), before, "the rejection read the slots");
        assert_eq!(d.tokens_remaining(), 4.0, "the pool's balance");
        // A cost of 24 might be paid with full slots: the slots are read, and the 6 tokens
        // in all cannot pay it either.
        let d = bucket.try_acquire_on(2, 24).unwrap();
        assert!(d.is_rejected());
        assert_eq!(scans(), before + 1);
        assert_eq!(d.tokens_remaining(), 6.0);
    }

    /// Under overload every slot ends empty, emptied by the trips that spent their last
    /// tokens or reclaimed them, and the stocked count with them: a rejection then loads
    /// the pool word and the count, and no slot, however many slots there are.
    #[test]
    fn a_steady_rejection_reads_no_slot_once_trips_have_emptied_them() {
        let config = LeaseConfig::new().slots(4).max_lease(5);
        let policy = Policy::new(40, 1.0).unwrap();
        let bucket = LeasedBucket::with_config(policy, ManualClock::new(), config).unwrap();
        let mut admitted = 0;
        for _ in 0..20 {
            for slot in 0..4 {
                admitted += u64::from(bucket.try_acquire_on(slot, 1).unwrap().is_admitted());
            }
        }
        assert_eq!(admitted, 40, "a frozen clock admits the balance exactly");
        assert_eq!(bucket.leased_tokens(), 0);
        let epoch = bucket.epoch();
        assert_eq!(epoch.slots.stocked(), 0);
        let words = bucket.slot_words();
        let before = scans();
        for slot in 0..4 {
            let d = bucket.try_acquire_on(slot, 1).unwrap();
            assert!(d.is_rejected());
            assert_eq!(d.tokens_remaining(), 0.0);
        }
        assert_eq!(scans(), before, "a steady rejection read the slots");
        assert_eq!(bucket.slot_words(), words, "and wrote nothing");
        // Credit arriving again is spent through trips that lease nothing (too little
        // spare): the slots stay empty and uncounted.
        bucket.refund(2).unwrap();
        assert!(bucket.try_acquire_on(1, 1).unwrap().is_admitted()); // leases 0: refund spent
        assert!(bucket.try_acquire_on(0, 1).unwrap().is_admitted());
        assert_eq!(epoch.slots.stocked(), 0, "leases of nothing stock no slot");
    }

    /// A slot's last token is spent through a trip, which claims it: the slot never
    /// holds tokens uncounted, and no token is lost to the rule.
    #[test]
    fn a_slot_s_last_token_is_spent_by_a_trip() {
        let config = LeaseConfig::new().slots(2).max_lease(3);
        let policy = Policy::new(100, 1.0).unwrap();
        let bucket = LeasedBucket::with_config(policy, ManualClock::new(), config).unwrap();
        assert!(bucket.try_acquire_on(0, 1).unwrap().is_admitted()); // leases 3
        assert_eq!(bucket.leased_tokens(), 3);
        let d = bucket.try_acquire_on(0, 2).unwrap();
        assert_eq!(d.tokens_remaining(), 1.0, "paid from the slot, one left");
        let pool = bucket.epoch().local().unwrap().load();
        let d = bucket.try_acquire_on(0, 1).unwrap();
        assert!(d.is_admitted());
        assert_ne!(
            bucket.epoch().local().unwrap().load(),
            pool,
            "the last token went through the pool"
        );
        assert_eq!(bucket.leased_tokens(), 3, "and a new lease was taken");
        assert_eq!(bucket.epoch().slots.stocked(), 1);
        assert_eq!(bucket.available(), 96.0);
    }

    #[test]
    fn a_rejection_that_must_count_the_slots_is_decided_by_the_trip_and_writes_nothing() {
        let config = LeaseConfig::new().slots(4).max_lease(5);
        let policy = Policy::new(100, 1.0).unwrap();
        let clock = ManualClock::new();
        let bucket = LeasedBucket::with_config(policy, clock.clone(), config).unwrap();
        assert!(bucket.try_acquire_on(0, 80).unwrap().is_admitted()); // leases 20 / 8
        assert!(bucket.try_acquire_on(1, 14).unwrap().is_admitted()); // leases 4 / 8 = 0
        assert_eq!(bucket.leased_tokens(), 2);
        // A reading past the pool word's tick, where the inline refusal decides when no
        // slot need be read.
        clock.advance(Duration::from_millis(10));
        let epoch = bucket.epoch();
        // Slot 2 mid-lease (it held nothing): the trip counts it as empty.
        let (two, taken) = epoch.slots.claim(2).unwrap();
        assert_eq!(taken, 0);
        let words = |epoch: &Epoch<LocalPool>| {
            let mut words = vec![epoch.local().unwrap().load()];
            words.extend((0..4).map(|i| epoch.slots.word(i)));
            words
        };
        let before_words = words(&epoch);
        let before = scans();
        let d = bucket.try_acquire_on(3, 7).unwrap();
        assert!(d.is_rejected());
        let remaining = d.tokens_remaining();
        assert!(
            (6.0..6.02).contains(&remaining),
            "the pool's 4 and slot 0's 2: {remaining}"
        );
        assert_eq!(scans(), before + 1, "the trip's count, and no other");
        assert_eq!(words(&epoch), before_words, "the rejection wrote nothing");
        // The same rejection with every slot OPEN: the slots might pay, so the trip
        // counts them, on the same counts.
        assert!(epoch.slots.publish(two, 0, 0, false));
        let before = scans();
        let d = bucket.try_acquire_on(3, 7).unwrap();
        assert!(d.is_rejected());
        assert_eq!(d.tokens_remaining(), remaining);
        assert_eq!(scans(), before + 1);
    }
}
