//! The clock stepping back between two acquirers: a thread sets the `ManualClock` far
//! back (30 days, beyond the tick field's back window) while two threads acquire from a
//! drained bucket, then the clock returns past its old reading.
//!
//! `ManualClock` does not declare itself monotonic, so the bucket reads it through its
//! high-water guard: a step back of any size is time standing still. At the end of every
//! explored execution: nothing was admitted while no time moved forward (a far step back
//! is not read as an idle past the wrap), the stored tick never moved back (I2), and
//! once the clock returns one token's time past the drain, exactly one token's refill is
//! there (the stepped-back interval is not credited twice).
#![cfg(loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use loom_tests::{Model, Tally, balance_now, ticks_per_token};
use tokengate::{Bucket, ManualClock, Policy};

/// 100 days, then a step back of 30 days: far beyond the back window (at most 2^46 ns,
/// about 19.5 hours) of any layout.
const START: Duration = Duration::from_secs(100 * 86_400);
const BACK: Duration = Duration::from_secs(30 * 86_400);

fn step_back_between_acquirers(refused: &Tally) -> impl Fn() + Sync + Send + 'static {
    let policy = Policy::new(2, 1.0).unwrap();
    let layout = *policy.layout();
    let token_nanos = ticks_per_token(&layout) << layout.tick_shift();
    let refused = refused.clone();
    move || {
        let clock = ManualClock::new();
        clock.set(START);
        let bucket = Arc::new(Bucket::with_clock(policy, clock.clone()));
        assert!(bucket.try_acquire(2).unwrap().is_admitted(), "drain");
        let (drained_tick, _) = layout.decode(bucket.stored_word()).unwrap();

        let acquirer = || {
            let bucket = bucket.clone();
            thread::spawn(move || bucket.try_acquire(1))
        };
        let (a, b) = (acquirer(), acquirer());
        let stepper = {
            let clock = clock.clone();
            thread::spawn(move || clock.set(START - BACK))
        };
        let outcomes = [a.join().unwrap(), b.join().unwrap()];
        stepper.join().unwrap();
        for outcome in &outcomes {
            let decision = outcome.as_ref().expect("a step back is never an error");
            assert!(
                !decision.is_admitted(),
                "admitted with no time moved forward (a step back read as an idle past \
                 the wrap): {outcomes:?}"
            );
        }
        refused.hit();
        let (tick, _) = layout.decode(bucket.stored_word()).unwrap();
        assert!(
            tick.wrapping_sub(drained_tick) <= 1,
            "I2: the stored tick moved from {drained_tick} to {tick}"
        );
        // The clock returns: a token's time (plus the anchor's tick) past the drain.
        clock.set(START + Duration::from_nanos(token_nanos + (1 << layout.tick_shift())));
        let balance = balance_now(&bucket);
        let token = 1i64 << layout.frac_bits();
        assert!(
            (token..2 * token).contains(&balance),
            "after the clock's return: {balance} units, one token is {token}"
        );
    }
}

#[test]
fn clock_stepping_back_between_two_acquirers_stands_still() {
    loom_tests::in_own_process!();
    let refused = Tally::new();
    let explored = Model::exhaustive("clock stepping back between two acquirers", 3)
        .check(step_back_between_acquirers(&refused));
    assert_eq!(refused.get(), explored.executions);
}

#[test]
fn the_model_catches_a_step_back_read_without_the_guard() {
    loom_tests::in_own_process!();
    let refused = Tally::new();
    let message = Model::exhaustive("clock stepping back between two acquirers", 3)
        .expect_violation(
            &tokengate::mutants::MONOTONIC_GUARD_SKIPPED,
            step_back_between_acquirers(&refused),
        );
    assert!(message.contains("admitted with no time"), "{message}");
}
