//! A `LiveBucket` reconfigured while other threads admit and refund.
//!
//! Time stands still, so every token is accounted for: whatever the interleaving, the
//! net taken before the switch is what the switch found missing from the old policy's
//! start, the net taken after it is what the new policy's balance lost since the switch,
//! and each operation lands wholly on one side. An operation that wrote the old word
//! after the switch read it (a switch that does not seal) breaks the sum.
#![cfg(loom)]

use loom::sync::Arc;
use loom_tests::{
    Forward, Model, Tally, assert_key_one_conserved, keyed_map_with_key_one, spawn_with,
};
use tokengate::{Inherit, LiveBucket, Policy};

/// Thread A: take 1, give it back if admitted, take 1 again. Thread B: take 1. Thread
/// S: switch from capacity 2 to `to` with `how`. `after_switch` counts executions where
/// some admission came after the switch.
fn reconfigure_racing(
    to: u64,
    how: Inherit,
    threads: usize,
    after_switch: &Tally,
) -> impl Fn() + Sync + Send + 'static {
    let from = Policy::new(2, 1.0).unwrap();
    let to = Policy::new(to, 1.0).unwrap();
    let after_switch = after_switch.clone();
    move || {
        let bucket = Arc::new(LiveBucket::with_clock(from, Forward::new())); // frozen
        let a = spawn_with(&bucket, |bucket| {
            let mut net = 0i64;
            if bucket.try_acquire(1).unwrap().is_admitted() {
                net += 1;
                bucket.refund(1).unwrap();
                net -= 1;
            }
            if bucket.try_acquire(1).unwrap().is_admitted() {
                net += 1;
            }
            net
        });
        let b = (threads > 3).then(|| {
            spawn_with(&bucket, |bucket| {
                i64::from(bucket.try_acquire(1).unwrap().is_admitted())
            })
        });
        let s = spawn_with(&bucket, move |bucket| bucket.reconfigure(to, how));
        let net = a.join().unwrap() + b.map_or(0, |b| b.join().unwrap());
        let switch = s.join().unwrap();
        let left = bucket.available();
        assert_eq!(bucket.policy().capacity(), to.capacity());
        assert_eq!(switch.before.fract(), 0.0, "{switch:?}");
        let taken_before = 2.0 - switch.before;
        let taken_after = switch.after - left;
        assert!(
            taken_before >= 0.0 && taken_after >= 0.0,
            "the switch found {switch:?}, {left} left after it"
        );
        assert_eq!(
            net as f64,
            taken_before + taken_after,
            "tokens lost or minted at the switch: net taken {net}, switch {switch:?}, {left} left"
        );
        let promised = match how {
            Inherit::Proportional => switch.before * to.capacity() as f64 / 2.0,
            Inherit::AsIs => switch.before.min(to.capacity() as f64),
            Inherit::Additive if to.capacity() >= 2 => {
                (switch.before + to.capacity() as f64 - 2.0).min(to.capacity() as f64)
            }
            Inherit::Additive => (switch.before + to.capacity() as f64 - 2.0).max(0.0),
            _ => to.capacity() as f64,
        };
        assert_eq!(switch.after, promised, "{how:?}: {switch:?}");
        after_switch.hit_if(taken_after > 0.0);
    }
}

#[test]
fn a_switch_racing_admissions_and_a_refund_loses_and_mints_nothing() {
    loom_tests::in_own_process!();
    for (to, how) in [(4, Inherit::Proportional), (3, Inherit::AsIs)] {
        let after = Tally::new();
        // Bounded: every operation pins its epoch (a store and a fence more for the
        // model to interleave); unbounded, this took 925,354 executions (two minutes).
        Model {
            preemption_bound: Some(2),
            ..Model::exhaustive("live reconfigure: admit/refund vs switch", 3)
        }
        .check(reconfigure_racing(to, how, 3, &after));
        assert!(after.get() > 0, "no admission ever came after the switch");
    }
}

/// Two switches racing each other and an admission: they apply one after the other,
/// each converting what the previous one left (`Additive` from 2 to 3, then from
/// whichever capacity is current to 5), and the admission lands wholly in one epoch.
#[test]
fn two_switches_racing_an_admission_apply_one_after_the_other() {
    loom_tests::in_own_process!();
    let model = || {
        let bucket = Arc::new(LiveBucket::with_clock(
            Policy::new(2, 1.0).unwrap(),
            Forward::new(),
        ));
        let switches: Vec<_> = [3, 5]
            .map(|c| {
                spawn_with(&bucket, move |bucket| {
                    bucket.reconfigure(Policy::new(c, 1.0).unwrap(), Inherit::Additive)
                })
            })
            .into_iter()
            .collect();
        let taken = i64::from(bucket.try_acquire(1).unwrap().is_admitted());
        let reports: Vec<_> = switches.into_iter().map(|s| s.join().unwrap()).collect();
        assert_eq!(bucket.epochs(), 3);
        // The switch to the final capacity came second.
        let (first, second, caps) = if bucket.policy().capacity() == 5 {
            (reports[0], reports[1], [2.0, 3.0, 5.0])
        } else {
            (reports[1], reports[0], [2.0, 5.0, 3.0])
        };
        // Grown: what it grew by added; shrunk: what it lost taken, down to zero.
        let additive = |b: f64, from: f64, to: f64| {
            if to >= from {
                (b + to - from).min(to)
            } else {
                (b + to - from).max(0.0)
            }
        };
        assert_eq!(
            first.after,
            additive(first.before, caps[0], caps[1]),
            "{reports:?}"
        );
        assert_eq!(
            second.after,
            additive(second.before, caps[1], caps[2]),
            "{reports:?}"
        );
        // Each epoch lost only what the admission took from it.
        let left = bucket.available();
        let per_epoch = [
            caps[0] - first.before,
            first.after - second.before,
            second.after - left,
        ];
        assert!(
            per_epoch.iter().all(|&t| t >= 0.0),
            "{reports:?}, {left} left"
        );
        assert_eq!(
            per_epoch.iter().sum::<f64>(),
            taken as f64,
            "tokens lost or minted: {reports:?}, taken {taken}, {left} left"
        );
    };
    Model {
        preemption_bound: Some(2),
        ..Model::exhaustive("live reconfigure: two switches vs admission", 3)
    }
    .check(model);
}

#[test]
fn a_switch_that_does_not_seal_is_caught() {
    loom_tests::in_own_process!();
    let after = Tally::new();
    let message = Model {
        preemption_bound: Some(2),
        ..Model::exhaustive("live reconfigure: admit/refund vs switch", 3)
    }
    .expect_violation(
        &tokengate::mutants::RECONFIGURE_SKIPS_SEAL,
        reconfigure_racing(4, Inherit::Proportional, 3, &after),
    );
    assert!(message.contains("lost or minted"), "{message}");
}

/// A keyed map switched while a thread admits and refunds on one key (frozen clock):
/// the switch is constant-time, the key's shard is converted once, by whichever
/// operation meets it first, and the key ends exactly where a sequence of the same
/// operations around the switch would leave it (`Additive` from capacity 2 to 3: one
/// token more, never capped).
fn keyed_switch_racing_admissions() -> impl Fn() + Sync + Send + 'static {
    || {
        let map = keyed_map_with_key_one(2); // the key exists, full
        let a = spawn_with(&map, |map| {
            let mut net = 0i64;
            if map.try_acquire(&1, 1).unwrap().is_admitted() {
                net += 1;
                map.refund(&1, 1).unwrap();
                net -= 1;
            }
            if map.try_acquire(&1, 1).unwrap().is_admitted() {
                net += 1;
            }
            net
        });
        let s = spawn_with(&map, |map| {
            map.reconfigure(Policy::new(3, 1.0).unwrap(), Inherit::Additive)
        });
        let net = a.join().unwrap();
        s.join().unwrap();
        assert_eq!(map.policy().capacity(), 3);
        assert_key_one_conserved(&map, net, 3.0, "at the switch");
    }
}

/// Bounded: since a switch pins the chain, converts the shards left behind and frees what
/// it retired, the exhaustive model runs past 25 minutes; four preemptions make 27,766
/// executions (three: 5,789), and the planted shard that is not converted is caught
/// within them.
const KEYED_SWITCH: Model = Model {
    name: "keyed reconfigure: admit/refund vs switch",
    threads: 3,
    preemption_bound: Some(4),
};

#[test]
fn a_keyed_switch_racing_admissions_loses_and_mints_nothing() {
    loom_tests::in_own_process!();
    KEYED_SWITCH.check(keyed_switch_racing_admissions());
}

#[test]
fn a_keyed_shard_not_converted_is_caught() {
    loom_tests::in_own_process!();
    let message = KEYED_SWITCH.expect_violation(
        &tokengate::mutants::KEYED_SHARD_NOT_CONVERTED,
        keyed_switch_racing_admissions(),
    );
    assert!(message.contains("lost or minted"), "{message}");
}

/// A keyed switch, an admission and a clock advance racing: a drained key of one token
/// refilled in 1 us, the clock moved 3 us. Whatever the order, the key's admission and
/// what it holds afterwards add up to at most the one token the time allows: the switch
/// reads its reading with every shard locked, so no admission on the old policy refills
/// past it, and the conversion never credits the same time twice.
fn keyed_switch_racing_a_clock_advance() -> impl Fn() + Sync + Send + 'static {
    use std::time::Duration;
    use tokengate::KeyedLimiter;
    || {
        let clock = Forward::new();
        let policy = Policy::new(1, 1e6).unwrap();
        let map = Arc::new(
            KeyedLimiter::<u64, _>::builder(policy, 4)
                .clock(clock.clone())
                .shards(1)
                .build()
                .unwrap(),
        );
        assert!(map.try_acquire(&1, 1).unwrap().is_admitted()); // drained
        let a = spawn_with(&map, |map| map.try_acquire(&1, 1).unwrap().is_admitted());
        let s = spawn_with(&map, move |map| map.reconfigure(policy, Inherit::AsIs));
        clock.advance(Duration::from_micros(3));
        let admitted = a.join().unwrap();
        s.join().unwrap();
        let held = map.available(&1);
        assert!(
            held + f64::from(u8::from(admitted)) <= 1.0,
            "refill credited twice across the switch: admitted {admitted}, {held} held"
        );
    }
}

#[test]
fn a_keyed_switch_racing_a_clock_advance_credits_nothing_twice() {
    loom_tests::in_own_process!();
    Model::exhaustive("keyed reconfigure: admit vs switch vs clock", 3)
        .check(keyed_switch_racing_a_clock_advance());
}

#[test]
fn a_keyed_switch_without_its_barrier_is_caught() {
    loom_tests::in_own_process!();
    let message = Model::exhaustive("keyed reconfigure: admit vs switch vs clock", 3)
        .expect_violation(
            &tokengate::mutants::KEYED_SWITCH_SKIPS_BARRIER,
            keyed_switch_racing_a_clock_advance(),
        );
    assert!(message.contains("credited twice"), "{message}");
}
