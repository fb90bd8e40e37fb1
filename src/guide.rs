//! How tokengate works: the packed word, its precision, and the invariants it keeps.
//!
//! This module holds documentation only.
//! Why a [`LeasedBucket`](crate::LeasedBucket) is exact is in [`leasing`].
//!
//! # The packed word
//!
//! ```text
//! [ tick : T bits | units : 64 - T bits ]
//! ```
//!
//! - `tick` is the monotonic clock's nanoseconds shifted right by `S` (a tick is `2^S` ns),
//!   modulo `2^T`.
//! - `units` is the balance in fixed point with `F` fraction bits (`2^F` units per token),
//!   offset by the reservation allowance `base` (zero unless the policy allows reserving
//!   ahead).
//! - Refill adds `R` units per tick, an integer: `R = floor(r * 2^S * 2^F / 1e9)`. The one
//!   approximation of the whole engine is this rounding, done once per policy and always
//!   down, so the effective rate never exceeds the configured one.
//!
//! The layout is chosen per [`Policy`](crate::Policy): see the policy's documentation for
//! the search and [`Layout`](crate::state::Layout) for the numbers.
//!
//! # Delay instead of reject
//!
//! A policy with a reservation horizon
//! ([`max_reservation`](crate::PolicyBuilder::max_reservation)) lets the balance go
//! negative, down to minus the horizon's refill. The offset `base` in the token field is
//! that allowance: `units = base + balance`. [`Bucket::reserve`](crate::Bucket::reserve)
//! takes a cost into that debt and returns a [`Reservation`](crate::Reservation) ready at
//! the tick edge where refill has paid the debt back; `try_acquire` refuses while anything
//! is owed, so waiting callers are served in the order they reserved, at the refill rate,
//! with no queue structure: the queue is the debt. Cancelling (or dropping) a reservation
//! before its time refunds it exactly (I6); a wait beyond the caller's maximum or the
//! horizon fails at once and writes nothing. The details are in the
//! [`state`](crate::state#reservations-debt-below-zero) module.
//!
//! # Rejections on the wire
//!
//! [`http`](crate::http) turns a decision into the 429 status, a `Retry-After` in whole
//! seconds rounded up (never 0), and the `RateLimit-Policy` / `RateLimit` fields of
//! draft-ietf-httpapi-ratelimit-headers-11. On the client side, [`retry`](crate::retry)
//! retries with bounded attempts, full-jitter exponential backoff added on top of the
//! server's `Retry-After`, an overall deadline, and every attempt after the first marked
//! [`Attempt::Retry`](crate::telemetry::Attempt::Retry) for telemetry.
//!
//! # Invariants
//!
//! - **I1** the balance never exceeds the capacity `B`.
//! - **I2** the stored tick never moves backwards; a `now` older than the stored tick (a
//!   lost race) adds no credit and never panics, and a clock that steps back, by any
//!   amount, is time standing still (limiters read clocks through a
//!   [`Monotonic`](crate::clock::Monotonic) guard): nothing is credited until it passes
//!   its highest reading again, and nothing twice.
//! - **I3** refill is exact on the tick grid: nothing is created or lost per update.
//! - **I4** for all real times `s <= e` (not only tick edges), across all threads: tokens
//!   admitted in `[s, e]` ≤ `B + r × (e − s)` at the configured rate `r` (≤ `r × (e − s)`
//!   from a start-empty creation): never above the ideal token bucket. Refill lags the
//!   ideal by less than two ticks near full, less than one otherwise (see
//!   [`state`](crate::state#exact-times-never-above-the-curve-between-tick-edges-too)).
//!   Any idle, however long, reads its true balance.
//! - **I5** a rejection is read-only: no store, no CAS.
//! - **I6** a refund restores exactly the state the bucket would have had without the
//!   reservation, capped at `B`: `min(B, refill(now) + c)`, whenever it comes, as long as
//!   nothing else took tokens in between. When other admissions came in between and the
//!   bucket would have been full meanwhile, the reservation kept room for refill that a
//!   full bucket discards, so the refund can leave up to `c` more than a history without
//!   the reservation: the balance still never exceeds `B` (I1) and tokens are conserved
//!   (start + refill = admitted + balance), which the loom models check.
//! - **I7** multi-bucket acquisition is all-or-nothing: a read-only first pass refuses a
//!   set that cannot be paid, buckets are taken in one global order, and a take refused
//!   after all (a race) rolls back the ones already taken, in reverse order.
//! - **I8** a cost above `B` is an immediate, distinct error.

pub mod leasing;
