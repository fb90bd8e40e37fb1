//! Telemetry at the scope of enforcement: per-key counters and decision records.
//!
//! Two things, both off the decision itself:
//!
//! - **Counters** ([`CounterSnapshot`]): per scope key, admitted and rejected requests and
//!   tokens, split into original attempts and retries ([`Attempt`](crate::Attempt)), so a
//!   wave of retries never looks like organic growth and one tenant draining its bucket is
//!   visible as that tenant's rejections, not hidden in an aggregate. Keyed limiters keep
//!   them per key when built with counters on
//!   ([`KeyedBuilder::counters`](crate::KeyedBuilder::counters)); the global scope keeps
//!   them striped across cache lines (see below).
//! - **Records** ([`Record`]): one decision as the flat line a log pipeline expects,
//!   `limiter=tenant:42 result=rejected bucket_capacity=100 refill_per_second=20
//!   token_cost=3 tokens_remaining=1.4 attempt=original`, with a structured form.
//!
//! # Cost on the hot path
//!
//! Counting is two relaxed `fetch_add`s per scope paid, and never a write that every core
//! contends on:
//!
//! - A keyed scope's counters live in the key's own map entry, next to its bucket word:
//!   only the requests of that key write them.
//! - The global scope is paid by every request, so one counter block would be a line every
//!   core writes. Its counters are *striped*: one cache-padded block per stripe, a thread
//!   always writing the stripe it was given on first use (round robin), and a snapshot
//!   sums the stripes. Threads contend only when there are more of them than stripes
//!   (the stripe count is the machine's parallelism rounded up to a power of two).
//!
//! Each counter is exact. A snapshot reads the counters one by one while requests may be
//! counting, so it is not an atomic cut across all of them: a request in flight may show
//! in its request count and not yet in its token count.

mod counters;
mod record;

pub(crate) use counters::{CounterCells, CounterRef, StripedCounters};
pub use counters::{CounterSnapshot, Tally};
pub use record::{Record, Verdict};
