//! The clock advancing while threads acquire: a thread advances the `Forward` inside
//! the model, racing two acquirers.
//!
//! At the end of every explored execution the bucket holds exactly the refill up to the
//! final time less what was admitted (no credit created or lost, I3 and I4), whichever
//! reading each acquirer made and in whichever order their CASes landed.
#![cfg(loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use loom_tests::{
    Forward, Model, Tally, acquirers_racing_an_advance, balance_now, ticks_per_token,
};
use tokengate::{AcquireError, Bucket, Clock, Policy};

#[test]
fn a_reading_racing_an_advance_sees_either_time() {
    loom_tests::in_own_process!();
    let (before, after) = (Tally::new(), Tally::new());
    let (b, a) = (before.clone(), after.clone());
    Model::exhaustive("clock read racing an advance", 2).check(move || {
        let clock = Forward::new();
        let reader = {
            let clock = clock.clone();
            thread::spawn(move || clock.now_nanos())
        };
        let advancer = {
            let clock = clock.clone();
            thread::spawn(move || clock.advance(Duration::from_nanos(5)))
        };
        let seen = reader.join().unwrap();
        advancer.join().unwrap();
        b.hit_if(seen == 0);
        a.hit_if(seen == 5);
    });
    assert!(before.get() > 0 && after.get() > 0, "{before:?} {after:?}");
}

/// Outcomes counted across executions.
#[derive(Clone, Default)]
struct Seen {
    both: Tally,
    one: Tally,
    clock_went_backwards: Tally,
}

/// A bucket starting empty at time 0; the clock is at `start` (a token's worth of refill
/// or more) when two threads ask `cost` each while a third advances the clock by `step`.
fn advancing_clock(
    policy: Policy,
    start: u64,
    step: u64,
    cost: u64,
    seen: &Seen,
) -> impl Fn() + Sync + Send + 'static {
    let layout = *policy.layout();
    let end = start + step;
    // Created at time 0, the bucket is anchored at the next tick edge (tick 1): refill
    // counts the whole ticks after it.
    let refilled = ((layout.tick_of(end) - 1) * layout.refill_per_tick()) as i64;
    assert!(
        refilled < layout.max_units() as i64,
        "the model must not reach the cap"
    );
    let cost_units = (cost << layout.frac_bits()) as i64;
    let seen = seen.clone();
    move || {
        let clock = Forward::new();
        let bucket = Arc::new(Bucket::with_clock(policy, clock.clone()));
        clock.advance(Duration::from_nanos(start));
        let acquirer = || {
            let bucket = bucket.clone();
            move || bucket.try_acquire(cost)
        };
        let outcomes = acquirers_racing_an_advance(&clock, step, acquirer(), acquirer());

        let mut admitted = 0;
        for outcome in &outcomes {
            match outcome {
                Ok(d) if d.is_admitted() => {
                    assert!(d.balance_units() >= 0, "I4: overdrawn: {outcomes:?}");
                    admitted += cost_units;
                }
                Ok(d) => assert!(d.balance_units() < cost_units, "refused with enough: {d:?}"),
                Err(AcquireError::ClockWentBackwards { by }) => {
                    assert!(by.as_nanos() <= u128::from(step), "{outcomes:?}");
                    seen.clock_went_backwards.hit();
                }
                Err(e) => panic!("unexpected error {e}"),
            }
        }
        let balance = balance_now(&bucket);
        assert_eq!(
            balance,
            refilled - admitted,
            "conservation: balance {balance} at the end, refill {refilled}, admitted \
             {admitted}: {outcomes:?}"
        );
        let (stored_tick, _) = layout.decode(bucket.stored_word()).unwrap();
        assert!(
            stored_tick <= layout.tick_of(end),
            "I2: tick beyond the clock"
        );
        seen.both.hit_if(admitted == 2 * cost_units);
        seen.one.hit_if(admitted == cost_units);
    }
}

#[test]
fn clock_advancing_between_two_acquirers_within_the_race_tolerance() {
    loom_tests::in_own_process!();
    // 1e6 tokens/s: one token of refill is far inside the race tolerance, so an acquirer
    // whose reading predates the other's CAS decides on the stored state.
    let policy = Policy::new(4, 1e6).unwrap().start_empty();
    let layout = *policy.layout();
    let token = ticks_per_token(&layout) << layout.tick_shift();
    assert!(ticks_per_token(&layout) <= layout.tolerance_ticks());
    let seen = Seen::default();
    Model::exhaustive("clock advancing between two acquirers", 3)
        // A token's refill after the tick edge the bucket is anchored at.
        .check(advancing_clock(
            policy,
            token + (1 << layout.tick_shift()),
            token,
            1,
            &seen,
        ));
    println!(
        "  executions admitting both / one: {} / {}",
        seen.both.get(),
        seen.one.get()
    );
    assert!(
        seen.both.get() > 0,
        "the advance never let the second acquirer in"
    );
    assert!(seen.one.get() > 0, "the second acquirer was never refused");
    assert_eq!(seen.clock_went_backwards.get(), 0);
}

/// 1000 tokens/s on 65.5 us ticks: two tokens of refill are 32 ticks, twice the race
/// tolerance, so an acquirer whose reading predates the other's CAS takes the slow path
/// (`RawBucket::transition_after_reread`): it loads the word (`Acquire`, paired with the
/// writer's `Release` CAS) and only then reads the clock again, so the writer's reading
/// happens-before its new one and it can never mistake the lost race for an idle past
/// the wrap (which re-anchors the bucket full): every execution conserves tokens, and none
/// returns `ClockWentBackwards`. With a `Relaxed` load there, the C++ memory model lets
/// the re-read return the old time, and loom finds such executions.
#[test]
fn clock_advancing_beyond_the_race_tolerance_between_two_acquirers() {
    loom_tests::in_own_process!();
    let policy = Policy::new(8, 1000.0).unwrap().start_empty();
    let layout = *policy.layout();
    let two_tokens = 2 * ticks_per_token(&layout);
    assert!(two_tokens > layout.tolerance_ticks());
    let step = two_tokens << layout.tick_shift();
    let seen = Seen::default();
    Model::exhaustive(
        "clock advancing beyond the tolerance between two acquirers",
        3,
    )
    .check(advancing_clock(policy, step, step, 2, &seen));
    println!(
        "  executions admitting both / one: {} / {}; refusing with ClockWentBackwards: {}",
        seen.both.get(),
        seen.one.get(),
        seen.clock_went_backwards.get()
    );
    assert!(
        seen.both.get() > 0,
        "the advance never let the second acquirer in"
    );
    assert!(seen.one.get() > 0, "the second acquirer was never refused");
    assert_eq!(
        seen.clock_went_backwards.get(),
        0,
        "a lost race was refused as a clock stepping back"
    );
}
