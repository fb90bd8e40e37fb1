//! Errors of bucket operations.

use std::fmt;
use std::time::Duration;

use crate::state::Layout;

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
    /// A time source read earlier than a state's last update by more than a lost race
    /// explains, so the balance at that time is unknown; nothing changed.
    ///
    /// The limiters of this crate never return it: they read their clock through a
    /// [`Monotonic`](crate::clock::Monotonic) guard, so a clock that steps back is seen
    /// as time standing still. It remains for [`Pool`](crate::leased::Pool)
    /// implementations whose store keeps its own time.
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
