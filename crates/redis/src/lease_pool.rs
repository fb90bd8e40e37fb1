//! [`RemoteBucket`] as a [`Pool`] of the engine's [`LeasedBucket`]: the per-core slots
//! and the local hot path stay as they are, and every exchange with the pool is served
//! from the bucket's local reservoir (never the network).
//!
//! # What the contract asks, and how it is kept
//!
//! - **Units.** The engine speaks its layout's fixed-point units, every amount a whole
//!   number of tokens; the reservoir and Redis speak whole tokens (Redis keeps
//!   micro-tokens): amounts convert by the layout's `frac_bits` shift, costs rounded up,
//!   returns rounded down.
//! - **A grant is spendable only in the tick it names.** A batch is handed to a slot only
//!   from a reservoir word whose local expiry is after the end of that tick, so slot
//!   tokens die before their lease does, and the lease's local expiry precedes Redis's
//!   reclaim. This assumes the bucket's clock is real time (the default
//!   [`QuantaClock`]): a manual clock can hold a tick past the lease.
//! - **Giving back is never new credit.** Units handed back are not put back into a
//!   reservoir word (their lease may be retired already, and a word must never pay out
//!   more than its grant). They are credited to Redis on the next exchange instead: the
//!   lease they came from is settled without them (counted spent), so the credit only
//!   returns tokens Redis charged as spent, capped there at `B - outstanding`.
//! - **The cap.** Redis counts every granted token in `outstanding` until it is settled
//!   or reclaimed and keeps `balance + outstanding <= B`, so the slots need no quiescing.
//! - **Never waits on the network.** An empty reservoir answers `Rejected`, or per the
//!   fail mode once Redis is unreachable: `Unavailable` ([`FailMode::FailClosed`]), an
//!   admission without a batch ([`FailMode::FailOpen`], [`FailMode::Local`]).
//!
//! [`FailMode::FailClosed`]: crate::FailMode::FailClosed
//! [`FailMode::FailOpen`]: crate::FailMode::FailOpen
//! [`FailMode::Local`]: crate::FailMode::Local

use std::sync::atomic::Ordering;

use tokengate::clock::Clock;
use tokengate::leased::{
    LeaseConfig, LeaseConfigError, LeaseOutcome, LeaseRequest, Lessees, Pool, PoolState,
};
use tokengate::state::Layout;
use tokengate::{AcquireError, LeasedBucket, Policy, QuantaClock};

use crate::pool::RemoteBucket;
use crate::reservoir::TIME_SHIFT;

impl RemoteBucket {
    /// A [`LeasedBucket`] over this shared budget: decisions spend from per-core slots
    /// (the engine's local hot path); slots lease batches from this bucket's reservoir.
    ///
    /// # Errors
    ///
    /// [`LeasedError::Policy`] when the engine cannot represent the remote policy,
    /// [`LeasedError::Config`] for a lease configuration out of range.
    pub fn leased(
        &self,
        config: LeaseConfig,
    ) -> Result<LeasedBucket<QuantaClock, RemoteBucket>, LeasedError> {
        let p = self.policy();
        let policy =
            Policy::new(p.capacity(), p.tokens_per_second()).map_err(LeasedError::Policy)?;
        LeasedBucket::with_pool(policy, QuantaClock::new(), config, self.clone())
            .map_err(LeasedError::Config)
    }

    fn return_units(&self, layout: &Layout, units: u64) {
        let tokens = (units >> layout.frac_bits()).min(self.policy().capacity());
        if tokens > 0 {
            self.shared().returned.fetch_add(tokens, Ordering::Relaxed);
        }
    }
}

/// Why [`RemoteBucket::leased`] failed.
#[derive(Debug)]
pub enum LeasedError {
    /// The engine refused the policy.
    Policy(tokengate::PolicyError),
    /// The lease configuration was out of range.
    Config(LeaseConfigError),
}

impl std::fmt::Display for LeasedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Policy(e) => write!(f, "the engine cannot run this policy: {e}"),
            Self::Config(e) => write!(f, "invalid lease configuration: {e}"),
        }
    }
}

impl std::error::Error for LeasedError {}

impl Pool for RemoteBucket {
    fn lease<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        _clock: &C,
        request: LeaseRequest,
        lessees: &mut impl Lessees,
    ) -> Result<LeaseOutcome, AcquireError> {
        self.return_units(layout, request.returned_units);
        let f = layout.frac_bits();
        let cost = request.cost_units.div_ceil(1 << f);
        let b = self.shared();
        let now_ns = self.pool_now_ns();
        // The batch's tick ends within one tick length: the word must outlive it.
        let tick_ns = layout.tick().as_nanos() as u64;
        let must_outlive = (now_ns + tick_ns) >> TIME_SHIFT;
        let lease = request.lease;
        let paid = b.reservoir.spend_batch(cost, must_outlive, |spare| {
            if lease {
                lessees.lease_units(spare << f) >> f
            } else {
                0
            }
        });
        let tick = layout.tick_of(request.now);
        if let Some((batch, left)) = paid {
            b.stats.leased.fetch_add(1, Ordering::Relaxed);
            if left < b.low_water.load(Ordering::Relaxed)
                && (left == 0 || !b.demand.load(Ordering::Relaxed))
            {
                b.demand.store(true, Ordering::Relaxed);
                self.wake();
            }
            return Ok(LeaseOutcome::Admitted {
                leased_units: batch << f,
                tick,
                balance_units: i64::try_from(left << f).unwrap_or(i64::MAX),
            });
        }
        match self.try_acquire(cost) {
            Ok(_) => Ok(LeaseOutcome::Admitted {
                leased_units: 0,
                tick,
                balance_units: 0,
            }),
            Err(crate::Refused::Unavailable { retry_after }) => {
                Ok(LeaseOutcome::Unavailable { retry_after })
            }
            Err(_) => Ok(LeaseOutcome::Rejected {
                balance_units: 0,
                behind_ticks: 0,
                now_nanos: request.now,
            }),
        }
    }

    fn give_back(&self, layout: &Layout, units: u64) {
        self.return_units(layout, units);
    }

    fn credit(&self, layout: &Layout, _now: u64, units: u64, _lessees: &mut impl Lessees) {
        self.return_units(layout, units);
    }

    fn reset(&self, _layout: &Layout, _now: u64, _full: bool, _lessees: &mut impl Lessees) {
        self.request_reset();
    }

    fn peek(&self, layout: &Layout, _now: u64) -> PoolState {
        let tokens = self.leased_tokens() + self.stats().redis_balance;
        let units = tokens
            .checked_shl(layout.frac_bits())
            .unwrap_or(u64::MAX)
            .min(layout.max_units() - layout.base_units());
        PoolState {
            units: layout.base_units() + units,
            behind_ticks: 0,
        }
    }
}
