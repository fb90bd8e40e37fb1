//! Errors of bucket operations.

use std::fmt;
use std::time::Duration;

use crate::state::{Layout, Snapshot};

/// Why a bucket refused to decide. A rate-limit rejection is not an error: it is a
/// [`Decision`](crate::Decision) that says rejected.
///
/// No error changes anything in the bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireError {
    /// The cost is above the bucket's capacity, so no amount of waiting could pay it
    /// (invariant I8).
    CostExceedsCapacity {
        /// The cost asked for, in tokens.
        cost: u64,
        /// The bucket's capacity, in tokens.
        capacity: u64,
    },
    /// The clock read earlier than the bucket's last update by more than a lost race
    /// explains (about 1 ms), and the bucket is not full, so its balance at the clock's
    /// time is unknown. No credit is added; the bucket decides again once the clock has
    /// caught up, or after [`Bucket::reset`](crate::Bucket::reset).
    ClockWentBackwards {
        /// How far behind the bucket's last update the clock read.
        by: Duration,
    },
    /// A [`LeasedBucket`](crate::LeasedBucket)'s pool could not decide: its store cannot be
    /// reached and its failure mode says to refuse
    /// ([`LeaseOutcome::Unavailable`](crate::leased::LeaseOutcome::Unavailable)). Not a
    /// rate-limit rejection: nothing is known of the budget.
    PoolUnavailable {
        /// When to ask again.
        retry_after: Duration,
    },
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireError::CostExceedsCapacity { cost, capacity } => write!(
                f,
                "cost {cost} tokens exceeds the bucket capacity of {capacity} tokens: \
                 it can never be admitted"
            ),
            AcquireError::ClockWentBackwards { by } => write!(
                f,
                "the clock stepped back {by:?} behind the bucket's last update; \
                 no credit was added and nothing changed"
            ),
            AcquireError::PoolUnavailable { retry_after } => write!(
                f,
                "the token pool cannot be reached; nothing changed; retry after {retry_after:?}"
            ),
        }
    }
}

impl std::error::Error for AcquireError {}

/// The error for a cost above `layout`'s capacity (invariant I8).
#[cold]
pub(crate) fn cost_exceeds_capacity(layout: &Layout, cost: u64) -> AcquireError {
    AcquireError::CostExceedsCapacity {
        cost,
        capacity: layout.capacity(),
    }
}

/// The error for a reading `now` found `snapshot.behind()` ticks behind the stored tick,
/// measured from `now` itself (not from its tick's start).
#[cold]
pub(crate) fn clock_went_backwards(layout: &Layout, snapshot: &Snapshot, now: u64) -> AcquireError {
    let shift = layout.tick_shift();
    let into_tick = now & ((1u64 << shift) - 1);
    let nanos = (u128::from(snapshot.behind()) << shift).saturating_sub(u128::from(into_tick));
    AcquireError::ClockWentBackwards {
        by: crate::decision::duration_from_nanos(nanos),
    }
}
