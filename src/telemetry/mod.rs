//! Telemetry at the scope of enforcement: per-key counters and decision records.
//!
//! Two things, both off the decision itself:
//!
//! - **Counters** ([`CounterSnapshot`]): per scope key, admitted and rejected requests and
//!   tokens, split into original attempts and retries ([`Attempt`]), so a
//!   wave of retries never looks like organic growth and one tenant draining its bucket is
//!   visible as that tenant's rejections, not hidden in an aggregate. Keyed limiters keep
//!   them per key when built with counters on
//!   ([`KeyedBuilder::counters`](crate::keyed::KeyedBuilder::counters)); the global scope keeps
//!   them striped across cache lines (see below).
//! - **Records** ([`Record`]): one decision as the flat line a log pipeline expects,
//!   `limiter=tenant:42 result=rejected bucket_capacity=100 refill_per_second=20
//!   token_cost=3 tokens_remaining=1.4 attempt=original`, with a structured form.
//!
//!
//! The cost of counting is described on [`CounterSnapshot`].

mod counters;
#[cfg(feature = "metrics")]
pub mod metrics;
mod record;
#[cfg(feature = "tracing")]
pub mod trace;

pub use crate::attempt::Attempt;
pub(crate) use counters::{CounterCells, CounterRef, StripedCounters};
pub use counters::{CounterSnapshot, Tally};
pub use record::{Outcome, Record};
