//! Refunds racing acquisitions.
//!
//! With a frozen clock a refund restores exactly the state of a run without the refunded
//! reservation: the final balance is the start less what the other threads were admitted
//! (invariant I6). With the clock advancing, a refund is capped at the capacity (I1).
#![cfg(loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use loom_tests::{
    Forward, Model, Op, Tally, balance_now, has_sequential_witness, stored_balance, ticks_per_token,
};
use tokengate::{Bucket, Policy};

/// Thread A reserves 2 of 3 tokens and gives them back; thread B asks 1 then 2. `refused`
/// counts the executions where B was refused while A held its reservation.
fn refund_racing_acquire(refused: &Tally) -> impl Fn() + Sync + Send + 'static {
    let policy = Policy::new(3, 1.0).unwrap();
    let frac_bits = policy.layout().frac_bits();
    let initial = 3i64 << frac_bits;
    let refused = refused.clone();
    move || {
        let bucket = Arc::new(Bucket::with_clock(policy, Forward::new())); // frozen
        let a = {
            let bucket = bucket.clone();
            thread::spawn(move || {
                let reserved = bucket.try_acquire(2).unwrap();
                let mut ops = vec![Op::take(&reserved, frac_bits)];
                if reserved.is_admitted() {
                    bucket.refund(2).unwrap();
                    ops.push(Op::Refund {
                        units: 2 << frac_bits,
                    });
                }
                ops
            })
        };
        let b = {
            let bucket = bucket.clone();
            thread::spawn(move || {
                [1, 2]
                    .map(|cost| Op::take(&bucket.try_acquire(cost).unwrap(), frac_bits))
                    .to_vec()
            })
        };
        let seen = vec![a.join().unwrap(), b.join().unwrap()];

        let b_admitted: i64 = seen[1]
            .iter()
            .map(|op| match *op {
                Op::Take {
                    cost_units,
                    admitted: true,
                    ..
                } => cost_units as i64,
                _ => 0,
            })
            .sum();
        let balance = stored_balance(&bucket);
        assert_eq!(
            balance,
            initial - b_admitted,
            "I6: the refund did not restore the state without the reservation: {seen:?}"
        );
        assert!(
            has_sequential_witness(initial, initial, &seen, balance),
            "linearizability: no sequential order explains {seen:?} ending at {balance}"
        );
        let b_saw_less = seen[1].iter().any(|op| {
            matches!(
                op,
                Op::Take {
                    admitted: false,
                    ..
                }
            )
        });
        refused.hit_if(b_saw_less && matches!(seen[0][0], Op::Take { admitted: true, .. }));
    }
}

#[test]
fn refund_racing_acquire_restores_the_state_without_the_reservation() {
    loom_tests::in_own_process!();
    let refused = Tally::new();
    Model::exhaustive("refund racing acquire, frozen clock", 2)
        .check(refund_racing_acquire(&refused));
    println!(
        "  executions where B was refused during A's reservation: {}",
        refused.get()
    );
    assert!(refused.get() > 0, "the reservation never stood in B's way");
}

/// A bucket of 2 full tokens; the main thread reserves 1 before the threads start. Then
/// thread R refunds it, thread V advances the clock by a token's worth of refill, and
/// thread Q asks 1. Whatever the order, the bucket never holds more than its capacity,
/// and the admitted tokens never exceed the start plus the refill.
///
/// Exact equality with a run without the reservation does not hold here, and cannot: in
/// the order V, Q, R the bucket absorbs V's refill into the room the reservation made,
/// Q takes a token, and R's refund brings it back to full (2), while without the
/// reservation the refill is lost to the cap and Q leaves 1. A refund is
/// `min(B, balance now + cost)`: exact when nothing happened in between (I6), never above
/// the capacity and never above the token-bucket bound (I4) otherwise.
fn refund_racing_refill(overfull_without_cap: &Tally) -> impl Fn() + Sync + Send + 'static {
    let policy = Policy::new(2, 1e6).unwrap();
    let layout = *policy.layout();
    // A token's refill after the tick edge the bucket is anchored at (tick 1: created at
    // time 0, and a write near full anchors at the next edge).
    let advance = (ticks_per_token(&layout) + 1) << layout.tick_shift();
    let refill = ((layout.tick_of(advance) - 1) * layout.refill_per_tick()) as i64;
    let full = layout.max_units() as i64;
    let one = 1i64 << layout.frac_bits();
    let overfull = overfull_without_cap.clone();
    move || {
        let clock = Forward::new();
        let bucket = Arc::new(Bucket::with_clock(policy, clock.clone()));
        assert!(bucket.try_acquire(1).unwrap().is_admitted());
        let r = {
            let bucket = bucket.clone();
            thread::spawn(move || bucket.refund(1).unwrap())
        };
        let v = {
            let clock = clock.clone();
            thread::spawn(move || clock.advance(Duration::from_nanos(advance)))
        };
        let q = {
            let bucket = bucket.clone();
            thread::spawn(move || bucket.try_acquire(1).unwrap())
        };
        r.join().unwrap();
        v.join().unwrap();
        let q = q.join().unwrap();

        assert!(
            (0..=full).contains(&q.balance_units()),
            "I1: Q saw a balance of {} units, capacity {full}",
            q.balance_units()
        );
        let balance = balance_now(&bucket);
        assert!(
            balance <= full,
            "I1: final balance {balance} above capacity {full}"
        );
        let admitted = if q.is_admitted() { one } else { 0 };
        assert!(
            balance + admitted <= full + refill,
            "I4: final {balance} + admitted {admitted} above start {full} + refill {refill}"
        );
        // Orders in which an uncapped refund would have overfilled the bucket.
        overfull.hit_if(balance == full);
    }
}

const CAPPED: Model = Model::exhaustive("refund racing refill and acquire", 3);

#[test]
fn refund_racing_refill_never_overfills_the_bucket() {
    loom_tests::in_own_process!();
    let full = Tally::new();
    CAPPED.check(refund_racing_refill(&full));
    assert!(full.get() > 0, "no execution ended full");
}

#[test]
fn refund_skipping_the_cap_is_caught() {
    loom_tests::in_own_process!();
    let message = CAPPED.expect_violation(
        &tokengate::mutants::REFUND_SKIPS_CAP,
        refund_racing_refill(&Tally::new()),
    );
    assert!(message.contains("I1"), "{message}");
}
