//! Reservations on a manual clock: exact ready times on the tick grid, exact refunds,
//! refusals that write nothing, and first-come-first-served waiting at the refill rate.

use std::time::Duration;

use proptest::prelude::*;
use tokengate::{Bucket, Clock, ManualClock, Policy, Start, reservation::ReserveError};

/// The balance at the clock's time, in units (negative while reservations are owed).
fn balance(bucket: &Bucket<ManualClock>) -> i128 {
    let layout = bucket.policy().layout();
    let now = bucket.clock().now_nanos();
    let snapshot = layout.refill(bucket.stored_word(), layout.tick_of(now));
    i128::from(snapshot.units()) - i128::from(layout.base_units())
}

fn policy(capacity: u64, rate: f64, horizon: Duration, start: Start) -> Policy {
    Policy::builder(capacity, rate)
        .max_reservation(horizon)
        .start(start)
        .build()
        .unwrap()
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

#[test]
fn reservation_is_ready_exactly_at_the_promised_tick_edge_and_not_a_nanosecond_earlier() {
    let p = policy(10, 10.0, Duration::from_secs(2), Start::Empty);
    let l = *p.layout();
    let clock = ManualClock::new();
    // Start between two tick edges, so the wait is not a whole number of ticks.
    let t0 = 1_234_567_891;
    clock.set(Duration::from_nanos(t0));
    let bucket = Bucket::with_clock(p, clock.clone());

    let r = bucket.reserve(5, Duration::from_secs(2)).unwrap();
    let wait_ticks = (5u64 << l.frac_bits()).div_ceil(l.refill_per_tick());
    // Created empty at t0, anchored at the next tick edge: refill counts from there.
    let ready = (l.tick_of(t0) + 1 + wait_ticks) << l.tick_shift();
    assert_eq!(r.ready_at(), Duration::from_nanos(ready));
    assert_eq!(r.wait(), Duration::from_nanos(ready - t0));
    assert_eq!(r.reserved_at(), Duration::from_nanos(t0));
    assert_eq!(balance(&bucket), -(5i128 << l.frac_bits()));

    clock.set(Duration::from_nanos(ready - 1));
    assert!(!r.is_ready());
    assert_eq!(r.remaining(), Duration::from_nanos(1));
    assert!(balance(&bucket) < 0, "still owed one nanosecond before");
    assert!(bucket.available() < 0.0);
    assert!(bucket.try_acquire(1).unwrap().is_rejected());

    clock.set(Duration::from_nanos(ready));
    assert!(r.is_ready());
    assert_eq!(r.remaining(), Duration::ZERO);
    let b = balance(&bucket);
    // Paid back within the last tick: 0 <= balance < R.
    assert!(b >= 0 && b < i128::from(l.refill_per_tick()), "{b}");
    assert!(bucket.available() >= 0.0);
    r.consume();
}

#[test]
fn reservation_made_at_a_clock_stepped_back_is_ready_on_the_stored_tick_grid() {
    let p = policy(4, 4.0, Duration::from_secs(2), Start::Full);
    let l = *p.layout();
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(p, clock.clone());
    // A reading at tick 10 drains the bucket from full (anchored at the edge of tick
    // 11); the clock then steps back a few ticks, which the bucket sees as time standing
    // still at its highest reading.
    let later = 10u64 << l.tick_shift();
    clock.set(Duration::from_nanos(later));
    assert!(bucket.try_acquire(4).unwrap().is_admitted());
    let now = ((10 - l.tolerance_ticks()) << l.tick_shift()) + 5;
    clock.set(Duration::from_nanos(now));

    let r = bucket.reserve(1, Duration::from_secs(2)).unwrap();
    let ready = (11 + (1u64 << l.frac_bits()).div_ceil(l.refill_per_tick())) << l.tick_shift();
    assert_eq!(r.ready_at(), Duration::from_nanos(ready));
    assert_eq!(r.wait(), Duration::from_nanos(ready - later));
    clock.set(Duration::from_nanos(ready - 1));
    assert!(balance(&bucket) < 0);
    clock.set(Duration::from_nanos(ready));
    assert!(balance(&bucket) >= 0);
    r.consume();
}

#[test]
fn tokens_there_at_once_make_a_reservation_ready_at_once_that_behaves_as_an_admission() {
    let clock = ManualClock::new();
    clock.set(Duration::from_nanos(777));
    let bucket = Bucket::with_clock(
        policy(10, 1.0, Duration::from_secs(5), Start::Full),
        clock.clone(),
    );
    let r = bucket.reserve(4, Duration::ZERO).unwrap();
    assert_eq!(r.wait(), Duration::ZERO);
    assert_eq!(r.ready_at(), Duration::from_nanos(777));
    assert!(r.is_ready());
    drop(r); // ready: dropping keeps the tokens
    assert_eq!(bucket.available(), 6.0);
}

#[test]
fn cancelling_before_the_time_restores_exactly_a_bucket_that_never_reserved() {
    let p = policy(20, 7.0, Duration::from_secs(4), Start::Full);
    let clock = ManualClock::new();
    let reserving = Bucket::with_clock(p, clock.clone());
    let twin = Bucket::with_clock(p, clock.clone());
    for b in [&reserving, &twin] {
        assert!(b.try_acquire(15).unwrap().is_admitted());
    }
    clock.advance(Duration::from_millis(333));

    let r = reserving.reserve(12, Duration::from_secs(4)).unwrap();
    assert!(r.wait() > Duration::from_millis(500));
    clock.advance(r.wait() / 2);
    assert!(reserving.available() < twin.available());
    assert!(r.cancel(), "cancelled before its time: tokens given back");
    assert_eq!(balance(&reserving), balance(&twin));
    assert_eq!(reserving.available(), twin.available());

    // From here on both buckets decide identically.
    for step in 0..40 {
        clock.advance(Duration::from_millis(37 * step % 101));
        let cost = step % 7;
        assert_eq!(
            reserving.try_acquire(cost).unwrap(),
            twin.try_acquire(cost).unwrap()
        );
        assert_eq!(balance(&reserving), balance(&twin));
    }
}

#[test]
fn dropping_before_the_time_gives_back_and_after_the_time_keeps() {
    let p = policy(10, 10.0, Duration::from_secs(2), Start::Empty);
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(p, clock.clone());
    let twin = Bucket::with_clock(p, clock.clone());

    let r = bucket.reserve(3, Duration::from_secs(1)).unwrap();
    clock.advance(Duration::from_millis(100));
    drop(r);
    assert_eq!(balance(&bucket), balance(&twin));

    let r = bucket.reserve(3, Duration::from_secs(1)).unwrap();
    let wait = r.wait();
    clock.advance(wait);
    drop(r);
    assert!(
        balance(&bucket) < balance(&twin),
        "used: nothing given back"
    );
    assert_eq!(
        balance(&twin) - balance(&bucket),
        3i128 << bucket.policy().layout().frac_bits()
    );

    let r = bucket.reserve(3, Duration::from_secs(1)).unwrap();
    let before = balance(&bucket);
    r.consume(); // before its time, but the caller proceeds: kept
    assert_eq!(balance(&bucket), before);

    let r = bucket.reserve(1, Duration::from_secs(1)).unwrap();
    clock.advance(r.wait());
    assert!(!r.cancel(), "at its time it counts as used");
}

#[test]
fn a_wait_beyond_the_maximum_or_the_horizon_changes_nothing() {
    let p = policy(10, 10.0, Duration::from_secs(2), Start::Empty);
    let l = *p.layout();
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(p, clock.clone());
    let first = bucket.reserve(10, Duration::from_secs(2)).unwrap(); // ~1 s
    let word = bucket.stored_word();

    // 10 more tokens would wait ~2 s (a tick over, since the rate rounds down), from the
    // edge the bucket was created at (the next one after its reading at 0).
    let wait_ticks = 1 + (20u64 << l.frac_bits()).div_ceil(l.refill_per_tick());
    let wait = Duration::from_nanos(wait_ticks << l.tick_shift());
    let err = bucket.reserve(10, Duration::from_secs(1)).unwrap_err();
    assert_eq!(
        err,
        ReserveError::ExceedsMaxWait {
            wait,
            max_wait: Duration::from_secs(1)
        }
    );
    assert_eq!(err.excess(), Some(wait - Duration::from_secs(1)));
    assert_eq!(bucket.stored_word(), word);

    let err = bucket.reserve(10, Duration::from_secs(60)).unwrap_err();
    assert_eq!(
        err,
        ReserveError::ExceedsHorizon {
            wait,
            horizon: Duration::from_secs(2)
        }
    );
    assert_eq!(bucket.stored_word(), word);

    // Just inside the caller's limit succeeds; one nanosecond less fails.
    let mid = bucket.reserve(5, Duration::from_secs(2)).unwrap();
    let exact = mid.wait();
    assert!(mid.cancel());
    assert_eq!(bucket.stored_word(), word);
    assert!(bucket.reserve(5, exact - Duration::from_nanos(1)).is_err());
    assert_eq!(bucket.stored_word(), word);
    bucket.reserve(5, exact).unwrap().consume();

    assert_eq!(
        bucket.reserve(11, Duration::from_secs(60)).unwrap_err(),
        ReserveError::CostExceedsCapacity {
            cost: 11,
            capacity: 10
        }
    );
    first.consume();
}

#[test]
fn a_policy_without_horizon_refuses_any_wait_and_names_the_horizon() {
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(Policy::new(5, 1.0).unwrap(), clock.clone());
    bucket
        .reserve(5, Duration::from_secs(10))
        .unwrap()
        .consume();
    let word = bucket.stored_word();
    let err = bucket.reserve(1, Duration::from_secs(10)).unwrap_err();
    assert!(
        matches!(err, ReserveError::ExceedsHorizon { horizon, .. } if horizon.is_zero()),
        "{err:?}"
    );
    assert!(err.to_string().contains("max_reservation"), "{err}");
    assert_eq!(bucket.stored_word(), word);
}

#[test]
fn a_reservation_at_a_clock_stepped_back_is_made_at_the_highest_reading() {
    let clock = ManualClock::new();
    let p = policy(5, 1.0, Duration::from_secs(10), Start::Full);
    let l = *p.layout();
    let bucket = Bucket::with_clock(p, clock.clone());
    clock.set(Duration::from_secs(100));
    bucket.try_acquire(5).unwrap();
    clock.set(Duration::from_secs(50));
    let r = bucket.reserve(1, Duration::from_secs(10)).unwrap();
    // Reserved at the highest reading, ready one token's refill after the edge the drain
    // anchored at: nothing credited for the fifty seconds walked back.
    assert_eq!(r.reserved_at(), Duration::from_secs(100));
    let edge = l.tick_of(100_000_000_000) + 1;
    let ready = (edge + (1u64 << l.frac_bits()).div_ceil(l.refill_per_tick())) << l.tick_shift();
    assert_eq!(r.ready_at(), Duration::from_nanos(ready));
    r.consume();
}

#[test]
fn hundred_waiters_at_ten_per_second_proceed_in_order_ten_per_second() {
    let p = policy(10, 10.0, Duration::from_secs(11), Start::Empty);
    let l = *p.layout();
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(p, clock.clone());
    let waiters: Vec<_> = (0..100)
        .map(|_| bucket.reserve(1, Duration::from_secs(11)).unwrap())
        .collect();

    // Waiter k (1-based) is ready when refill has paid k tokens: tick ceil(k * 2^F / R).
    let token = 1u64 << l.frac_bits();
    let ready: Vec<u64> = waiters.iter().map(|w| nanos(w.ready_at())).collect();
    for (k, &at) in (1u64..).zip(&ready) {
        // Created empty at 0, anchored at the edge of tick 1.
        assert_eq!(
            at,
            (1 + (k * token).div_ceil(l.refill_per_tick())) << l.tick_shift()
        );
        // Within the rate's rounding of the ideal k * 100 ms: two ticks (the anchor and
        // the edge) plus the rate error.
        let ideal = k as f64 * 1e8;
        let slack = ideal * p.rate_error() + (2u64 << l.tick_shift()) as f64;
        assert!(
            (at as f64 - ideal).abs() <= slack,
            "waiter {k}: {at} vs {ideal}"
        );
    }
    assert!(ready.windows(2).all(|w| w[0] < w[1]), "strictly in order");
    // Ready times sit within ~1 ms after each 100 ms mark, so every second-long window
    // offset by 50 ms holds exactly 10 of them.
    for second in 0..10u64 {
        let start = second * 1_000_000_000 + 50_000_000;
        let n = ready
            .iter()
            .filter(|&&t| (start..start + 1_000_000_000).contains(&t))
            .count();
        assert_eq!(n, 10, "second {second}");
    }

    // Proceeding in order: at each ready time exactly the waiters up to it are paid for,
    // and a newcomer cannot jump the queue.
    for (k, &at) in (1i128..).zip(&ready) {
        let owed_after_k = (100 - k) * i128::from(token);
        clock.set(Duration::from_nanos(at - 1));
        assert!(balance(&bucket) < -owed_after_k, "waiter {k} early");
        clock.set(Duration::from_nanos(at));
        assert!(balance(&bucket) >= -owed_after_k, "waiter {k} late");
        assert!(waiters[k as usize - 1].is_ready());
        if k < 100 {
            assert!(!waiters[k as usize].is_ready());
            let refused = bucket.try_acquire(1).unwrap();
            assert!(refused.is_rejected(), "newcomer jumped the queue at {k}");
            // The newcomer's wait counts the whole queue ahead of it.
            assert!(refused.retry_after().unwrap() > waiters[99].remaining());
        }
    }
    for w in waiters {
        w.consume();
    }
    clock.advance(Duration::from_millis(101));
    assert!(bucket.try_acquire(1).unwrap().is_admitted());
}

#[test]
fn acquire_with_the_manual_clock_sleeps_exactly_the_promised_wait() {
    let p = policy(3, 2.0, Duration::from_secs(5), Start::Full);
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(p, clock.clone());
    let mut total = Duration::ZERO;
    for i in 0..9 {
        let before = clock.now();
        let waited = bucket
            .acquire_with(1, Duration::from_secs(5), &clock)
            .unwrap();
        assert_eq!(clock.now() - before, waited, "acquire {i}");
        assert!(balance(&bucket) >= 0, "proceeds only once paid for");
        total += waited;
    }
    // 3 at once, then 6 more at 2/s: 3 s, up to the rate's rounding and a tick.
    assert!(
        total >= Duration::from_secs(3) && total < Duration::from_millis(3005),
        "{total:?}"
    );

    let word = bucket.stored_word();
    let before = clock.now();
    assert!(
        bucket
            .acquire_with(3, Duration::from_millis(100), &clock)
            .is_err()
    );
    assert_eq!(
        (bucket.stored_word(), clock.now()),
        (word, before),
        "refused: no sleep, no write"
    );
}

#[test]
fn blocking_acquire_on_a_manual_clock_returns_after_one_real_sleep() {
    // ThreadSleep cannot move a manual clock: acquire sleeps the promised wait once and
    // returns, instead of waiting forever for the clock.
    let p = policy(1, 1000.0, Duration::from_millis(10), Start::Full);
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(p, clock.clone());
    assert_eq!(bucket.acquire(1, Duration::ZERO).unwrap(), Duration::ZERO);
    let waited = bucket.acquire(1, Duration::from_millis(10)).unwrap();
    assert!(waited > Duration::ZERO);
    assert_eq!(clock.now(), Duration::ZERO);
    assert!(balance(&bucket) < 0, "the tokens stay taken");
}

proptest! {
    // About a quarter of the cases reach the cancel path.
    #![proptest_config(ProptestConfig {
        cases: 10_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// I6 for reservations: on any policy and history, reserving then cancelling before
    /// the promised time leaves the bucket exactly as a twin that never reserved; a
    /// refused reservation writes nothing.
    #[test]
    fn reserve_then_cancel_is_invisible(
        capacity in 1u64..=1000,
        rate_exp in -20i32..=40,
        horizon_ms in 1u64..20_000,
        prefix in proptest::collection::vec((0u64..2_000_000_000, 0u64..=1000), 0..8),
        cost in 0u64..=1000,
        max_wait_ms in 0u64..30_000,
        cancel_fraction in 0.0f64..1.0,
    ) {
        let rate = 10f64.powf(f64::from(rate_exp) / 10.0);
        let Ok(p) = Policy::builder(capacity, rate)
            .max_reservation(Duration::from_millis(horizon_ms))
            .build() else { return Ok(()); };
        let clock = ManualClock::new();
        let reserving = Bucket::with_clock(p, clock.clone());
        let twin = Bucket::with_clock(p, clock.clone());
        for &(dt, c) in &prefix {
            clock.advance(Duration::from_nanos(dt));
            let c = c % (capacity + 1);
            prop_assert_eq!(reserving.try_acquire(c).unwrap(), twin.try_acquire(c).unwrap());
        }
        let cost = cost % (capacity + 1);
        let word = reserving.stored_word();
        match reserving.reserve(cost, Duration::from_millis(max_wait_ms)) {
            Ok(r) => {
                prop_assert!(r.wait() <= Duration::from_millis(max_wait_ms.min(horizon_ms)));
                if r.wait().is_zero() {
                    r.consume();
                    return Ok(());
                }
                clock.advance(r.wait().mul_f64(cancel_fraction));
                prop_assume!(!r.is_ready());
                prop_assert!(cost == 0 || r.cancel());
                prop_assert_eq!(balance(&reserving), balance(&twin));
                clock.advance(Duration::from_millis(horizon_ms));
                prop_assert_eq!(reserving.try_acquire(cost).unwrap(), twin.try_acquire(cost).unwrap());
                prop_assert_eq!(balance(&reserving), balance(&twin));
            }
            Err(_) => prop_assert_eq!(reserving.stored_word(), word),
        }
    }
}
