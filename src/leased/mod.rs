//! A bucket that scales with cores: tokens leased in batches from a pool to core-local
//! slots, with the same exact bound as a plain [`Bucket`](crate::Bucket).
//!
//! A [`LeasedBucket`] is a [`Pool`] (the single source of truth for the balance; by
//! default a [`LocalPool`], one packed word exactly like a plain bucket's) plus a
//! power-of-two array of cache-padded slots. Most admissions are paid from the calling
//! thread's slot (a clock read and one CAS on a line no other core writes); the rest make
//! one exchange with the pool that gives back the slot's leftover, pays the cost and
//! leases a new batch. The argument for exactness is in the guide:
//! [`crate::guide::leasing`].
//!
//! - `mod.rs`: [`LeasedBucket`], [`LeaseConfig`].
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
//!   credit made while leases are in flight withholds up to one lease per in-flight slot
//!   (`max_lease`, twice for a slot already closed by another closer). So a rejection is
//!   never early by more than `2 * slots * max_lease` tokens, and never late: the bucket
//!   never admits what the plain bucket would reject.
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
use std::time::Duration;

use crate::clock::{Clock, ClockError, CoarseClock, Monotonic, QuantaClock};
use crate::decision::Decision;
use crate::error::AcquireError;
use crate::error::cost_exceeds_capacity;
use crate::multi::{Member, sealed};
use crate::pass::Passes;
use crate::policy::Policy;
use crate::state::Layout;

mod exchange;
mod pool;
pub(crate) mod slots;

pub(crate) use crate::sync::thread_index;
pub use pool::{LeaseOutcome, LeaseRequest, Lessees, LocalPool, Pool, PoolState, Quiesced};
use slots::Slots;

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
    pool: P,
    slots: Slots,
    policy: Policy,
    clock: Monotonic<C>,
    max_lease: u64,
    /// `log2(slots) + 1`: a lease is at most `spare >> lease_shift`.
    lease_shift: u32,
    /// `2 * slots * max_lease` in units, saturated: a bound on tokens outside the global
    /// word.
    max_outstanding_units: u64,
    /// `slots * max_lease` in units, saturated: a bound on tokens held in OPEN slots.
    max_held_units: u64,
    /// When the pool and the slots are next re-anchored against the tick wrap.
    passes: Passes,
}

impl<C: Clock, P: Pool> fmt::Debug for LeasedBucket<C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedBucket")
            .field("policy", &self.policy)
            .field("slots", &self.slots.len())
            .field("max_lease", &self.max_lease)
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

/// The lessees as one exchange with the pool sees them: every slot but the caller's own
/// marked one.
struct OtherSlots<'a> {
    slots: &'a Slots,
    keep: Option<usize>,
    frac_bits: u32,
    lease_shift: u32,
    max_lease: u64,
    max_outstanding_units: u64,
    closed: bool,
}

impl OtherSlots<'_> {
    /// Reopens what this exchange closed.
    fn release(self) {
        if self.closed {
            self.slots.reopen(self.keep);
        }
    }
}

impl Lessees for OtherSlots<'_> {
    #[inline]
    fn max_outstanding_units(&self) -> u64 {
        self.max_outstanding_units
    }

    fn quiesce(&mut self) -> Quiesced {
        if self.closed {
            return Quiesced::default();
        }
        self.closed = true;
        let found = self.slots.close(self.keep);
        // A cancelled lessee holds at most one lease; a slot already closed may have one
        // in an earlier closer's hand and one in a cancelled lessee's.
        let in_flight = found
            .leasing
            .saturating_add(found.closed.saturating_mul(2))
            .saturating_mul(self.max_lease);
        Quiesced {
            taken_units: found.taken << self.frac_bits,
            in_flight_units: in_flight.saturating_mul(1 << self.frac_bits),
        }
    }

    #[inline]
    fn lease_units(&self, spare: u64) -> u64 {
        exchange::lease_units(spare, self.frac_bits, self.lease_shift, self.max_lease)
    }
}

impl<C: Clock> LeasedBucket<C, LocalPool> {
    /// A leased bucket on `clock` with the default [`LeaseConfig`], in the policy's start
    /// state at the clock's current time.
    pub fn with_clock(policy: Policy, clock: C) -> LeasedBucket<C> {
        let slots = default_slots();
        let max_lease = default_lease(&policy, slots);
        let clock = Monotonic::new(clock);
        let pool = LocalPool::new(&policy, clock.now_nanos());
        LeasedBucket::build(policy, clock, slots, max_lease, pool)
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
    /// [`Layout`]. For diagnostics, and to check that an operation
    /// wrote nothing.
    pub fn stored_word(&self) -> u64 {
        self.pool.stored_word()
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
        Ok(LeasedBucket::build(policy, clock, slots, max_lease, pool))
    }

    fn build(
        policy: Policy,
        clock: Monotonic<C>,
        slots: usize,
        max_lease: u64,
        pool: P,
    ) -> LeasedBucket<C, P> {
        let layout = policy.layout();
        debug_assert!(max_lease <= lease_limit(&policy));
        // Per slot: its OPEN tokens, or one lease in a lessee's hand, or (closed) one in a
        // closer's hand and one in a cancelled lessee's.
        let held = (max_lease as u128 * slots as u128) << layout.frac_bits();
        let outstanding = 2 * held;
        LeasedBucket {
            pool,
            slots: Slots::new(slots, layout.tick_bits()),
            lease_shift: slots.trailing_zeros() + 1,
            max_outstanding_units: u64::try_from(outstanding).unwrap_or(u64::MAX),
            max_held_units: u64::try_from(held).unwrap_or(u64::MAX),
            max_lease,
            passes: Passes::new(layout, clock.now_nanos()),
            policy,
            clock,
        }
    }

    /// The clock's reading (through the monotonic guard), after the re-anchoring pass if
    /// one is due.
    #[inline(always)]
    fn now(&self) -> u64 {
        self.at(self.clock.now_nanos())
    }

    /// `now` (a guarded reading), after the re-anchoring pass if one is due: one relaxed
    /// load and a predicted branch otherwise. See [`crate::pass`].
    #[inline(always)]
    fn at(&self, now: u64) -> u64 {
        self.passes
            .check(now, &self.clock, |now, idle| self.pass(now, idle))
    }

    /// The re-anchoring pass. Slot stamps are ticks modulo the wrap too, so every pass
    /// takes the slots' leases back; a pool that [`wraps`](Pool::wraps) is then credited
    /// nothing at `now` (re-anchored), or, after an idle longer than the fill time
    /// (`idle`), reset full.
    #[cold]
    #[inline(never)]
    fn pass(&self, now: u64, idle: bool) {
        let layout = self.policy.layout();
        if idle && self.pool.wraps() {
            let mut others = self.other_slots(None);
            self.pool.reset(layout, now, true, &mut others);
            others.release();
            return;
        }
        self.reclaim();
        if self.pool.wraps() {
            let mut others = self.other_slots(None);
            self.pool.credit(layout, now, 0, &mut others);
            others.release();
        }
    }

    fn other_slots(&self, keep: Option<usize>) -> OtherSlots<'_> {
        OtherSlots {
            slots: &self.slots,
            keep,
            frac_bits: self.policy.layout().frac_bits(),
            lease_shift: self.lease_shift,
            max_lease: self.max_lease,
            max_outstanding_units: self.max_outstanding_units,
            closed: false,
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
    #[inline]
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
    #[inline]
    pub fn try_acquire_on(&self, slot: usize, cost: u64) -> Result<Decision, AcquireError> {
        self.acquire_at(slot, cost, self.now())
    }

    #[inline(always)]
    fn acquire_at(&self, slot: usize, cost: u64, now: u64) -> Result<Decision, AcquireError> {
        let layout = self.policy.layout();
        if cost > layout.capacity() {
            return Err(cost_exceeds_capacity(layout, cost));
        }
        if cost > 0 {
            if let Some(left) = self.slots.consume(slot, cost, layout.tick_of(now)) {
                let balance = (left << layout.frac_bits()) as i64;
                return Ok(Decision::with_balance(layout, balance, 0, now, cost, true));
            }
        }
        self.acquire_slow(slot, cost, now)
    }

    /// The trip to the pool: lease, reclaim, or reject.
    #[cold]
    #[inline(never)]
    fn acquire_slow(&self, slot: usize, cost: u64, now: u64) -> Result<Decision, AcquireError> {
        let layout = self.policy.layout();
        if cost == 0 {
            let (units, behind) = self.balance_at(now);
            return Ok(Decision::with_balance(layout, units, behind, now, 0, true));
        }
        let cost_units = cost << layout.frac_bits();
        let mut now = now;
        let mut state = self.pool.peek(layout, now);
        if state.behind_ticks > layout.tolerance_ticks() {
            // A lost race or a clock stepped back: read again after loading the word. A
            // refusal here comes before the slot is claimed, so it writes nothing.
            (state, now) = self.pool.reread(layout, &self.clock)?;
        }
        if let Some(refused) = self.read_only_refusal(&state, now, cost) {
            return Ok(refused);
        }
        let claim = self.slots.claim(slot);
        let marker = claim.map(|(index, _)| index);
        let returned_units = claim.map_or(0, |(_, tokens)| tokens << layout.frac_bits());
        let mut others = self.other_slots(marker);
        let request = LeaseRequest {
            now,
            cost_units,
            returned_units,
            lease: marker.is_some(),
        };
        let outcome = self.pool.lease(layout, &self.clock, request, &mut others);
        others.release();
        let (leased_units, tick) = match outcome {
            Ok(LeaseOutcome::Admitted {
                leased_units, tick, ..
            }) => (leased_units, tick),
            _ => (0, 0),
        };
        if let Some(index) = marker {
            if !self
                .slots
                .publish(index, tick, leased_units >> layout.frac_bits())
            {
                // A closer cancelled the lease: it is given back, never spent, and only
                // then is the slot let go (until then closers count it as in flight).
                self.pool.give_back(layout, leased_units);
                self.slots.abandon(index);
            }
        }
        match outcome? {
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
        }
    }

    /// The read-only rejection (I5): when the pool's balance (`state`, at `now`) and
    /// every slot together cannot pay `cost`, the refusal, having written nothing.
    /// `min(B, g + Δ) + O < needed` implies `min(B, g + Δ + O) < needed`: what a plain
    /// bucket holds cannot pay either. First on the pool alone, against the most
    /// the slots can hold, so that a rejection even full slots could not turn loads no
    /// slot's line; then, only if the slots might pay, on what they hold.
    #[inline]
    fn read_only_refusal(&self, state: &PoolState, now: u64, cost: u64) -> Option<Decision> {
        let layout = self.policy.layout();
        let needed = layout.base_units() + (cost << layout.frac_bits());
        let mut units = state.units;
        if units.saturating_add(self.max_held_units) >= needed {
            let held = self.slots.held().saturating_mul(1 << layout.frac_bits());
            units = units.saturating_add(held);
        }
        (units < needed).then(|| {
            let balance = units as i64 - layout.base_units() as i64;
            Decision::with_balance(layout, balance, state.behind_ticks, now, cost, false)
        })
    }

    /// [`read_only_refusal`](Self::read_only_refusal) on the pool as it is now,
    /// for `acquire_all`'s first pass once this thread's slot could not pay. A reading
    /// well behind the pool is left to the take, which reads the clock again.
    #[cold]
    #[inline(never)]
    fn refusal_on_global(&self, cost: u64, now: u64) -> Option<Decision> {
        let layout = self.policy.layout();
        let state = self.pool.peek(layout, now);
        if state.behind_ticks > layout.tolerance_ticks() {
            return None;
        }
        self.read_only_refusal(&state, now, cost)
    }

    /// Balance at `now` in units (global, refilled, plus every slot, capped) and how
    /// many ticks `now` is behind the pool. Read-only.
    fn balance_at(&self, now: u64) -> (i64, u64) {
        let layout = self.policy.layout();
        let state = self.pool.peek(layout, now);
        let held = self.slots.held().saturating_mul(1 << layout.frac_bits());
        // min(B, min(B, g + Δ) + O) = min(B, g + Δ + O): what a plain bucket holds.
        let units = state.units.saturating_add(held).min(layout.max_units());
        (
            units as i64 - layout.base_units() as i64,
            state.behind_ticks,
        )
    }

    /// Gives back `cost` tokens of an earlier admission, exactly as if it had never been
    /// taken: `min(B, balance now + cost)`, as [`Bucket::refund`](crate::Bucket::refund).
    ///
    /// When the refund could meet the capacity while tokens are out on lease, the slots
    /// are taken back first (see the [module docs](crate::leased)).
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
        let layout = self.policy.layout();
        let Some(units) = layout.units_of(cost) else {
            return Err(cost_exceeds_capacity(layout, cost));
        };
        self.refund_units(units, self.now());
        Ok(())
    }

    fn refund_units(&self, units: u64, now: u64) {
        if units == 0 {
            return;
        }
        let mut others = self.other_slots(None);
        self.pool
            .credit(self.policy.layout(), now, units, &mut others);
        others.release();
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
        let mut others = self.other_slots(None);
        self.pool.reset(
            self.policy.layout(),
            self.now(),
            self.policy.starts_full(),
            &mut others,
        );
        others.release();
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
        let layout = self.policy.layout();
        let found = self.slots.close(None);
        self.pool
            .give_back(layout, found.taken << layout.frac_bits());
        self.slots.reopen(None);
    }

    /// Stores the pool refilled to now (a credit of nothing, quiescing as any
    /// credit near the cap does), so that its stored tick is recent: the re-anchor a
    /// [`ScopedLimiter::sweep`](crate::ScopedLimiter::sweep) does for the tick wrap.
    pub(crate) fn reanchor(&self) {
        let mut others = self.other_slots(None);
        self.pool
            .credit(self.policy.layout(), self.clock.now_nanos(), 0, &mut others);
        others.release();
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
        let (units, _) = self.balance_at(self.now());
        self.policy.layout().units_to_tokens(units)
    }

    /// Tokens held in slots now (leased and not yet spent or reclaimed): the stranded
    /// capacity, at most `slots * max_lease`.
    pub fn leased_tokens(&self) -> u64 {
        self.slots.held()
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Largest lease, in tokens.
    pub fn max_lease(&self) -> u64 {
        self.max_lease
    }

    /// The policy this bucket enforces.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The clock this bucket reads.
    pub fn clock(&self) -> &C {
        self.clock.get_ref()
    }

    /// A stable identity for ordering buckets (the address of its slots, which stay put
    /// while the bucket lives, even when the bucket itself is moved).
    pub fn id(&self) -> usize {
        self.slots.id()
    }

    /// The pool this bucket leases from.
    pub fn pool(&self) -> &P {
        &self.pool
    }

    /// Every core-local slot's word as stored, in slot order. The slot words' layout is
    /// private; compare them before and after an operation to see that it wrote nothing.
    pub fn slot_words(&self) -> Vec<u64> {
        (0..self.slots.len())
            .map(|slot| self.slots.word(slot))
            .collect()
    }

    fn wait(&self, layout: &Layout, cost: u64, now: u64) -> Duration {
        let (balance, behind) = self.balance_at(now);
        Decision::with_balance(layout, balance, behind, now, cost, false).wait_for(cost)
    }
}

impl<C: Clock, P: Pool> Member for LeasedBucket<C, P> {
    #[inline]
    fn member_id(&self) -> usize {
        self.id()
    }
    fn capacity(&self) -> u64 {
        self.policy.capacity()
    }
}

impl<C: Clock, P: Pool> sealed::Sealed for LeasedBucket<C, P> {
    #[inline]
    fn now_nanos(&self) -> u64 {
        self.now()
    }
    fn take_at(&self, cost: u64, now: u64) -> Result<Decision, AcquireError> {
        self.acquire_at(thread_index(), cost, self.at(self.clock.observe(now)))
    }
    fn refund_at(&self, cost: u64, now: u64) {
        let layout = self.policy.layout();
        let now = self.at(self.clock.observe(now));
        self.refund_units(layout.units_of(cost).unwrap_or(layout.max_units()), now);
    }
    fn wait_at(&self, cost: u64, now: u64) -> Duration {
        self.wait(self.policy.layout(), cost, now)
    }
    /// The read-only rejection of [`try_acquire`](LeasedBucket::try_acquire): the global
    /// balance plus every slot cannot pay. When this thread's slot can pay, only its own
    /// line is read (the common case: the pool's line stays off the path).
    #[inline]
    fn refusal_at(&self, cost: u64, now: u64) -> Option<Decision> {
        let layout = self.policy.layout();
        if cost == 0
            || self
                .slots
                .can_pay(thread_index(), cost, layout.tick_of(now))
        {
            return None;
        }
        self.refusal_on_global(cost, now)
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
}
