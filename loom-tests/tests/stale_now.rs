//! A thread whose clock reading is older than the stored tick loses a CAS race: it adds
//! no credit and the stored tick never moves backwards (invariant I2).
//!
//! Thread A reads the clock at `t` and then takes at that reading; the main thread
//! advances the clock by `d` (two tokens' worth of ticks, inside the race tolerance of
//! `Layout::tolerance_ticks`); thread B reads the clock and takes. In the executions where
//! A reads `t`, B reads `t + d` and B's CAS lands first, A's CAS fails and A retries with
//! the returned word, whose tick is `t + d`: `RawBucket::transition` refills that word to
//! `t`, finds it behind by `d <= tolerance` (a lost race, not a clock step) and decides on
//! the stored state. A must not add the refill of `t..t+d` again, and must not write `t`
//! back as the stored tick (the next reader would then be credited `t..t+d` twice).
//!
//! Both threads read the clock themselves and take at that reading (`MemberOps::take_at`,
//! what `try_acquire` does and what `acquire_all` does for a whole set after one
//! reading), so the model knows each reading and can check the stored tick against them.
#![cfg(loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use loom_tests::{Forward, Model, Tally, balance_now, ticks_per_token};
use tokengate::state::Layout;
use tokengate::{Bucket, Clock, Policy, multi::MemberOps};

struct Setup {
    policy: Policy,
    layout: Layout,
    /// The clock when the threads start: the bucket has refilled one token since 0.
    t: u64,
    /// The main thread's advance: two tokens of refill, within the race tolerance.
    d: u64,
}

fn setup() -> Setup {
    // 1e6 tokens/s on 64 ns ticks: a token takes about 16 ticks, the tolerance is 2^14.
    let policy = Policy::new(4, 1e6).unwrap().start_empty();
    let layout = *policy.layout();
    let tpt = ticks_per_token(&layout);
    let d_ticks = 2 * tpt;
    assert!(d_ticks <= layout.tolerance_ticks(), "{layout:?}");
    // Three tokens of refill at the end stay below the capacity: no capping, so the
    // balance is exactly refill - admitted.
    assert!(3 * tpt * layout.refill_per_tick() < layout.max_units());
    Setup {
        policy,
        layout,
        // A token's refill after the tick edge a new bucket is anchored at (tick 1).
        t: (tpt + 1) << layout.tick_shift(),
        d: d_ticks << layout.tick_shift(),
    }
}

/// The model's body; `stale` counts the executions that took the stale path (A read
/// `t`, lost its CAS to B at `t + d`, and decided on B's word).
fn stale_reader(stale: &Tally) -> impl Fn() + Sync + Send + 'static {
    let Setup {
        policy,
        layout,
        t,
        d,
    } = setup();
    let one = 1i64 << layout.frac_bits();
    let stale = stale.clone();
    move || {
        let clock = Forward::new();
        let bucket = Arc::new(Bucket::with_clock(policy, clock.clone())); // empty, tick 1
        clock.advance(Duration::from_nanos(t));

        let spawn_taker = || {
            let bucket = bucket.clone();
            thread::spawn(move || {
                let now = bucket.clock().now_nanos();
                (now, bucket.take_at(1, now).unwrap())
            })
        };
        let a = spawn_taker();
        let b = spawn_taker();
        clock.advance(Duration::from_nanos(d));
        let (now_a, dec_a) = a.join().unwrap();
        let (now_b, dec_b) = b.join().unwrap();

        let end = t + d;
        let refilled = ((layout.tick_of(end) - 1) * layout.refill_per_tick()) as i64;
        let admitted = one * (i64::from(dec_a.is_admitted()) + i64::from(dec_b.is_admitted()));
        let balance = balance_now(&bucket);
        assert_eq!(
            balance,
            refilled - admitted,
            "I2: credit created: balance {balance} at t+d, expected refill {refilled} - admitted \
             {admitted} (A read {now_a}: {dec_a:?}, B read {now_b}: {dec_b:?})"
        );
        let (stored_tick, _) = layout.decode(bucket.stored_word()).unwrap();
        let newest = [(now_a, dec_a), (now_b, dec_b)]
            .iter()
            .filter(|(_, dec)| dec.is_admitted())
            .map(|&(now, _)| layout.tick_of(now))
            .max();
        if let Some(newest) = newest {
            assert_eq!(
                stored_tick, newest,
                "I2: the stored tick is not the newest admitted reading (A read {now_a}, B \
                 read {now_b})"
            );
        }
        // The stale path: A's decision is B's word (refilled to t+d, less B's token)
        // less A's token, although A read t.
        stale.hit_if(
            now_a == t
                && now_b == end
                && dec_a.is_admitted()
                && dec_a.balance_units() == refilled - 2 * one,
        );
    }
}

const MODEL: Model = Model::exhaustive("stale reading loses a CAS race", 3);

#[test]
fn stale_reader_losing_a_cas_race_adds_no_credit() {
    loom_tests::in_own_process!();
    let stale = Tally::new();
    MODEL.check(stale_reader(&stale));
    println!("  executions on the stale path: {}", stale.get());
    assert!(stale.get() > 0, "no execution took the stale-reading path");
}

#[test]
fn stale_reading_writing_its_tick_back_is_caught() {
    loom_tests::in_own_process!();
    let message = MODEL.expect_violation(
        &tokengate::mutants::STALE_NOW_MOVES_TICK_BACK,
        stale_reader(&Tally::new()),
    );
    assert!(message.contains("I2"), "{message}");
}
