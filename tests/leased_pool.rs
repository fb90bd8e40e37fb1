//! A `LeasedBucket` on a pool other than the in-process one: the `Pool` seam as a
//! pool on a remote store would use it.
//!
//! `FlakyPool` wraps a `LocalPool` and, while switched off, answers every lease with
//! `LeaseOutcome::Unavailable`, keeping what was handed in (as the contract asks). The
//! bucket must turn that into `AcquireError::PoolUnavailable`, lose no token, and decide
//! exactly again once the pool is back.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokengate::leased::{
    LeaseConfig, LeaseOutcome, LeaseRequest, Lessees, LocalPool, Pool, PoolState,
};
use tokengate::state::Layout;
use tokengate::{AcquireError, Clock, LeasedBucket, ManualClock, Policy};

const RETRY: Duration = Duration::from_millis(250);

/// A `LocalPool` that can be switched off: then every lease answers `Unavailable`.
#[derive(Debug)]
struct FlakyPool {
    inner: LocalPool,
    down: AtomicBool,
    /// Leases asked of the pool (answered or not).
    leases: AtomicU64,
}

impl FlakyPool {
    fn new(policy: &Policy, now: u64) -> FlakyPool {
        FlakyPool {
            inner: LocalPool::new(policy, now),
            down: AtomicBool::new(false),
            leases: AtomicU64::new(0),
        }
    }
}

impl Pool for FlakyPool {
    fn lease<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
        request: LeaseRequest,
        lessees: &mut impl Lessees,
    ) -> Result<LeaseOutcome, AcquireError> {
        self.leases.fetch_add(1, Ordering::Relaxed);
        if self.down.load(Ordering::Relaxed) {
            // What was handed in is kept, never dropped.
            self.inner.give_back(layout, request.returned_units);
            return Ok(LeaseOutcome::Unavailable { retry_after: RETRY });
        }
        self.inner.lease(layout, clock, request, lessees)
    }

    fn give_back(&self, layout: &Layout, units: u64) {
        self.inner.give_back(layout, units);
    }

    fn credit(&self, layout: &Layout, now: u64, units: u64, lessees: &mut impl Lessees) {
        self.inner.credit(layout, now, units, lessees);
    }

    fn reset(&self, layout: &Layout, now: u64, full: bool, lessees: &mut impl Lessees) {
        self.inner.reset(layout, now, full, lessees);
    }

    fn peek(&self, layout: &Layout, now: u64) -> PoolState {
        self.inner.peek(layout, now)
    }
}

fn flaky_bucket(capacity: u64) -> (LeasedBucket<ManualClock, FlakyPool>, ManualClock) {
    let policy = Policy::new(capacity, 1.0).unwrap();
    let clock = ManualClock::new();
    let pool = FlakyPool::new(&policy, clock.now_nanos());
    let config = LeaseConfig::new().slots(1).max_lease(10);
    let bucket = LeasedBucket::with_pool(policy, clock.clone(), config, pool).unwrap();
    (bucket, clock)
}

#[test]
fn an_unavailable_pool_is_a_typed_error_that_loses_no_token() {
    let (bucket, clock) = flaky_bucket(100);
    assert!(bucket.try_acquire_on(0, 5).unwrap().is_admitted());
    assert_eq!(bucket.leased_tokens(), 10, "a lease of 10 beside the cost");
    assert!(bucket.try_acquire_on(0, 5).unwrap().is_admitted()); // from the slot
    // Past the tick edge the slot's 5 tokens expire: the next admission goes to the pool
    // and hands them back.
    clock.advance(bucket.policy().layout().tick());
    let before = bucket.available();
    bucket.pool().down.store(true, Ordering::Relaxed);
    let asked = bucket.pool().leases.load(Ordering::Relaxed);
    assert_eq!(
        bucket.try_acquire_on(0, 1),
        Err(AcquireError::PoolUnavailable { retry_after: RETRY })
    );
    assert_eq!(bucket.pool().leases.load(Ordering::Relaxed), asked + 1);
    assert_eq!(bucket.available(), before, "a token was lost or made");
    assert_eq!(
        bucket.leased_tokens(),
        0,
        "the leftover went back to the pool"
    );
    // Back up: exactly what was there is admitted, one token at a time.
    bucket.pool().down.store(false, Ordering::Relaxed);
    let admitted = (0..200)
        .filter(|_| bucket.try_acquire_on(0, 1).unwrap().is_admitted())
        .count();
    assert_eq!(admitted as f64, before.floor());
}

#[test]
fn an_unavailable_pool_is_not_a_rejection_even_when_the_budget_is_spent() {
    let (bucket, clock) = flaky_bucket(10);
    assert!(bucket.try_acquire_on(0, 10).unwrap().is_admitted());
    bucket.pool().down.store(true, Ordering::Relaxed);
    clock.advance(Duration::from_millis(3500));
    let err = bucket.try_acquire_on(0, 1).unwrap_err();
    assert_eq!(err, AcquireError::PoolUnavailable { retry_after: RETRY });
    assert!(err.to_string().contains("cannot be reached"), "{err}");
    // The refill that arrived meanwhile is still there once the pool is back.
    bucket.pool().down.store(false, Ordering::Relaxed);
    let admitted = (0..20)
        .filter(|_| bucket.try_acquire_on(0, 1).unwrap().is_admitted())
        .count();
    assert_eq!(admitted, 3);
}

#[test]
fn a_read_only_rejection_does_not_ask_the_pool_to_lease() {
    let (bucket, _clock) = flaky_bucket(10);
    assert!(bucket.try_acquire_on(0, 10).unwrap().is_admitted());
    let asked = bucket.pool().leases.load(Ordering::Relaxed);
    let word = bucket.pool().inner.stored_word();
    let d = bucket.try_acquire_on(0, 1).unwrap();
    assert!(d.is_rejected());
    let wait = d.retry_after().unwrap();
    assert!(
        wait >= Duration::from_secs(1) && wait < Duration::from_millis(1010),
        "{wait:?}"
    );
    assert_eq!(bucket.pool().leases.load(Ordering::Relaxed), asked);
    assert_eq!(
        bucket.pool().inner.stored_word(),
        word,
        "the rejection wrote"
    );
}
