//! A `LeasedBucket` reconfigured while other threads admit from a slot and through the
//! pool.
//!
//! Time stands still, so every token is accounted for: whatever the interleaving, the
//! net taken before the switch is what the switch found missing from the old policy's
//! start (the pool and the slots together), the net taken after it is what the new
//! policy's balance lost since the switch, and each admission lands wholly on one side.
//! A switch that reads the pool's word instead of sealing it lets an exchange on the old
//! policy land after the switch read it; a switch that seals before the hands holding
//! the old pool's tokens have stored them carries those tokens over outside the
//! strategy. The models catch both.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --
//! leased_reconfigure::`.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use loom_tests::{Forward, Model, Tally};
use tokengate::leased::LeaseConfig;
use tokengate::{Inherit, LeasedBucket, Policy};

/// The capacity the bucket starts with (and, full, its balance).
const FROM: u64 = 16;

/// Admits `cost` on `slot`, returning the tokens taken.
fn take(b: &LeasedBucket<Forward>, slot: usize, cost: u64) -> i64 {
    if b.try_acquire_on(slot, cost).unwrap().is_admitted() {
        cost as i64
    } else {
        0
    }
}

/// Setup: slot 0 holds a lease (one token spent from the pool, two leased). Thread A:
/// spend one token on slot 0 (from its lease, or through the pool once the switch has
/// closed it). The model's thread: one token on slot 1, a trip to the pool that leases.
/// Thread S: switch from capacity 16 to `to` with `how`. `after_switch` counts
/// executions where some admission came after the switch.
fn switch_racing_a_slot_and_the_pool(
    to: u64,
    how: Inherit,
    after_switch: &Tally,
) -> impl Fn() + Sync + Send + 'static {
    let after_switch = after_switch.clone();
    move || {
        let from = Policy::new(FROM, 1.0).unwrap();
        let to = Policy::new(to, 1.0).unwrap();
        let config = LeaseConfig::new().slots(2).max_lease(2);
        let bucket = Arc::new(LeasedBucket::with_config(from, Forward::new(), config).unwrap());
        let setup = take(&bucket, 0, 1);
        assert_eq!((setup, bucket.leased_tokens()), (1, 2));
        let a = {
            let bucket = bucket.clone();
            thread::spawn(move || take(&bucket, 0, 1))
        };
        let s = {
            let bucket = bucket.clone();
            thread::spawn(move || bucket.reconfigure(to, how).unwrap())
        };
        let mine = take(&bucket, 1, 1);
        let net = a.join().unwrap() + mine;
        let switch = s.join().unwrap();
        let left = bucket.available();
        assert_eq!(bucket.policy().capacity(), to.capacity());
        assert_eq!(switch.before.fract(), 0.0, "{switch:?}");
        let taken_before = (FROM - 1) as f64 - switch.before;
        let taken_after = switch.after - left;
        assert!(
            taken_before >= 0.0 && taken_after >= 0.0,
            "tokens lost or minted: the switch found {switch:?}, {left} left after it"
        );
        assert_eq!(
            net as f64,
            taken_before + taken_after,
            "tokens lost or minted at the switch: net taken {net}, switch {switch:?}, {left} left"
        );
        let promised = match how {
            Inherit::Proportional => switch.before * to.capacity() as f64 / FROM as f64,
            _ => switch.before.min(to.capacity() as f64),
        };
        assert_eq!(switch.after, promised, "{how:?}: {switch:?}");
        after_switch.hit_if(taken_after > 0.0);
    }
}

/// Three threads, bounded at two preemptions per execution: threads meeting a switch
/// wait for it (and the switch for the hands in flight), and unbounded waits make loom's
/// paths too long.
const SWITCH: Model = Model {
    name: "LeasedBucket reconfigure: slot spend and pool trip vs switch",
    threads: 3,
    preemption_bound: Some(2),
};

#[test]
fn a_switch_racing_a_slot_admission_and_a_pool_trip_loses_and_mints_nothing() {
    loom_tests::in_own_process!();
    // One preemption: every operation also pins its epoch (a store and a fence more to
    // interleave), and two took 326,353 executions (110 s) per strategy. The planted
    // bugs below are still run at two.
    let model = Model {
        preemption_bound: Some(1),
        ..SWITCH
    };
    for (to, how) in [(32, Inherit::Proportional), (20, Inherit::AsIs)] {
        let after = Tally::new();
        assert!(
            model
                .check(switch_racing_a_slot_and_the_pool(to, how, &after))
                .executions
                > 1
        );
        assert!(after.get() > 0, "no admission ever came after the switch");
    }
}

#[test]
fn a_switch_that_does_not_seal_the_pool_is_caught() {
    loom_tests::in_own_process!();
    let message = SWITCH.expect_violation(
        &tokengate::mutants::LEASED_SWITCH_SKIPS_SEAL,
        switch_racing_a_slot_and_the_pool(20, Inherit::AsIs, &Tally::new()),
    );
    assert!(message.contains("lost or minted"), "{message}");
}

#[test]
fn a_switch_that_does_not_wait_for_hands_in_flight_is_caught() {
    loom_tests::in_own_process!();
    let message = SWITCH.expect_violation(
        &tokengate::mutants::LEASED_SWITCH_SKIPS_WAIT,
        switch_racing_a_slot_and_the_pool(32, Inherit::Proportional, &Tally::new()),
    );
    assert!(message.contains("lost or minted"), "{message}");
}
