//! Threads racing `try_acquire` on one bucket, with a frozen clock.
//!
//! At the end of every explored execution: no admission overdrew the balance, the
//! admitted cost never exceeds the starting balance, the final balance plus the admitted
//! cost equals the starting balance exactly, and the decisions the threads saw are those
//! of some sequential order of their requests (the CAS loop is linearizable).
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use loom_tests::{Forward, Model, Op, Tally, has_sequential_witness, stored_balance};
use tokengate::{Bucket, Policy};

/// Runs one thread per plan, each requesting its costs in order from a full bucket of
/// `capacity`; returns the model's figures and how many executions admitted everything
/// the bucket could hold.
fn race(model: Model, capacity: u64, plans: &'static [&'static [u64]]) -> usize {
    let policy = Policy::new(capacity, 1.0).unwrap();
    let frac_bits = policy.layout().frac_bits();
    let initial = (capacity << frac_bits) as i64;
    let drained = Tally::new();
    let drained_in = drained.clone();
    model.check(move || {
        // Created inside the model: the clock's atomic is a loom atomic. Never advanced.
        let bucket = Arc::new(Bucket::with_clock(policy, Forward::new()));
        let handles: Vec<_> = plans
            .iter()
            .map(|&plan| {
                let bucket = bucket.clone();
                thread::spawn(move || {
                    plan.iter()
                        .map(|&cost| Op::take(&bucket.try_acquire(cost).unwrap(), frac_bits))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let seen: Vec<Vec<Op>> = handles.into_iter().map(|h| h.join().unwrap()).collect();

        let mut admitted = 0i64;
        for op in seen.iter().flatten() {
            if let Op::Take {
                cost_units,
                admitted: true,
                balance_after,
            } = *op
            {
                assert!(
                    balance_after >= 0,
                    "I4: an admission overdrew the balance: {op:?} in {seen:?}"
                );
                admitted += cost_units as i64;
            }
        }
        assert!(
            admitted <= initial,
            "I4: admitted {admitted} units from a balance of {initial}: {seen:?}"
        );
        let balance = stored_balance(&bucket);
        assert_eq!(
            balance + admitted,
            initial,
            "conservation: final balance {balance} + admitted {admitted} != initial {initial}: {seen:?}"
        );
        assert!(
            has_sequential_witness(initial, initial, &seen, balance),
            "linearizability: no sequential order explains {seen:?} ending at {balance}"
        );
        drained_in.hit_if(balance < 1 << frac_bits);
    });
    drained.get()
}

#[test]
fn two_threads_racing_try_acquire_conserve_tokens() {
    loom_tests::in_own_process!();
    // 3 tokens, each thread asks 2 then 1: whichever wins the 2 leaves the other thread
    // only the last token.
    let drained = race(
        Model::exhaustive("try_acquire, frozen clock", 2),
        3,
        &[&[2, 1], &[2, 1]],
    );
    assert!(drained > 0, "no execution drained the bucket");
}

/// Exhaustive, three threads take 665,048 executions (about 45 s on a quiet core); four
/// preemptions per execution (41,025) cover every order of their three CAS loops with
/// up to four interruptions. The two-thread model above stays exhaustive.
#[test]
fn three_threads_racing_try_acquire_conserve_tokens() {
    loom_tests::in_own_process!();
    let drained = race(
        Model {
            name: "try_acquire, frozen clock",
            threads: 3,
            preemption_bound: Some(4),
        },
        3,
        &[&[2, 1], &[1], &[2]],
    );
    assert!(drained > 0, "no execution drained the bucket");
}
