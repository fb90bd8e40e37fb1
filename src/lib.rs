//! A lock-free token-bucket admission engine: every bucket is one atomic 64-bit word.
//!
//! A token bucket separates two limits: the capacity `B` (the largest burst) and the
//! refill rate `r` (the sustained rate). tokengate packs a bucket's fixed-point balance and
//! its last-update tick into one `AtomicU64` updated by compare-and-swap, timed by a
//! TSC-based monotonic clock, with refill computed lazily and exactly on an integer tick
//! grid: no timer, no lock, no floating point or division on the hot path, and a rejection
//! writes nothing.
//!
//! # Quick start
//!
//! ```
//! use std::time::Duration;
//! use tokengate::{Bucket, ManualClock, Policy};
//!
//! // 100 tokens of burst, refilled at 20 per second.
//! let policy = Policy::new(100, 20.0)?;
//! let clock = ManualClock::new(); // `Bucket::new(policy)` uses the real TSC clock
//! let bucket = Bucket::with_clock(policy, clock.clone());
//!
//! let decision = bucket.try_acquire(3)?; // a request costing 3 tokens
//! assert!(decision.is_admitted());
//! assert_eq!(decision.tokens_remaining(), 97.0);
//!
//! assert!(bucket.try_acquire(97)?.is_admitted());
//! let rejected = bucket.try_acquire(1)?;
//! assert!(rejected.is_rejected());
//! // One token takes 50 ms; refill arrives at tick edges (about 1 ms apart).
//! let wait = rejected.retry_after().unwrap();
//! assert!(wait >= Duration::from_millis(50) && wait <= Duration::from_millis(52));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Layers
//!
//! Bottom to top, one direction of dependency:
//!
//! - [`clock`]: [`QuantaClock`] (default, TSC), [`CoarseClock`] (upkeep thread),
//!   [`ManualClock`] (tests and simulations).
//! - [`policy`]: [`Policy`], validated configuration, and the fixed-point
//!   [`Layout`](state::Layout) derived from it.
//! - [`state`]: the packed word and its pure transition functions.
//! - [`Bucket`]: one atomic word and the CAS loop around `state`;
//!   [`Bucket::reserve`] / [`Bucket::acquire`] delay instead of reject ([`reservation`]).
//! - [`multi`]: [`acquire_all`], all-or-nothing acquisition across several buckets.
//! - [`leased`]: [`LeasedBucket`], a bucket for hot paths shared by many cores, leasing
//!   batches of tokens from a pool to core-local slots.
//! - [`keyed`]: [`KeyedLimiter`], one bucket per key in a sharded map with a maximum
//!   number of keys, eviction of refilled buckets and an overflow policy.
//! - [`scope`]: [`ScopedLimiter`], the scopes of a request (global, tenant, user, API
//!   key, route, tenant route) paid all-or-nothing, with work classes.
//! - [`telemetry`]: per-scope counters (original vs retry) and decision records.
//! - [`retry`]: client retries with bounded attempts, full-jitter backoff, `Retry-After`
//!   floors and a deadline. [`http`]: 429, `Retry-After` and the IETF `RateLimit` fields.
//!
//! The packed word, its precision bounds, the invariants and their proofs are in the
//! [`guide`] module.

#![warn(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    rust_2018_idioms
)]
#![doc(test(attr(deny(warnings))))]

/// Whether the loom models' deliberate bug `$flag` (a [`mutants`] flag) is switched on:
/// a plain `false` outside `cfg(loom)`, so each hook is one line and costs nothing.
macro_rules! mutant {
    ($flag:ident) => {{
        #[cfg(loom)]
        let on = crate::mutants::on(&crate::mutants::$flag);
        #[cfg(not(loom))]
        let on = false;
        on
    }};
}

mod attempt;
mod bucket;
pub mod clock;
mod decision;
mod epoch;
mod error;
pub mod guide;
mod hint;
pub mod http;
pub mod inherit;
pub mod keyed;
pub mod leased;
mod live;
pub mod multi;
#[cfg(loom)]
#[doc(hidden)]
pub use epoch::model as epoch_model;
#[cfg(loom)]
#[doc(hidden)]
pub mod mutants;
pub mod owned;
mod pass;
pub mod policy;
pub mod reservation;
pub mod retry;
pub mod scope;
#[cfg(feature = "serde")]
pub mod serde_policy;
mod sleep;
pub mod state;
mod sync;
pub mod telemetry;

/// The guide's examples (`docs/guide.md`), compiled and run as doc tests. The README's
/// run in `tokengate-tower`, whose doc tests can also build its axum example.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide.md")]
pub struct GuideDoctests;

pub use bucket::Bucket;
pub use clock::{Clock, CoarseClock, ManualClock, QuantaClock};
pub use decision::Decision;
pub use error::AcquireError;
pub use inherit::Inherit;
pub use keyed::KeyedLimiter;
pub use leased::LeasedBucket;
pub use live::{EPOCH_BYTES, LiveBucket, Reconfigured};
pub use multi::acquire_all;
pub use policy::{Policy, PolicyBuilder, PolicyError, PolicyRate, Start};
pub use reservation::Reservation;
pub use scope::ScopedLimiter;
