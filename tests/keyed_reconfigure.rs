//! A keyed map reconfigured while it runs: constant-time switches, each shard converted
//! lazily as of the switch, the same result as a live bucket switched at that moment,
//! and nothing lost or minted under racing admissions.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tokengate::{Inherit, KeyedLimiter, LiveBucket, ManualClock, Policy};
use tokengate_testkit::reconfigure::{STRATEGIES, switch_policies};

fn map(policy: Policy, clock: &ManualClock, max_keys: usize) -> KeyedLimiter<u64, ManualClock> {
    KeyedLimiter::builder(policy, max_keys)
        .clock(clock.clone())
        .shards(16)
        .build()
        .unwrap()
}

#[test]
fn every_key_gets_the_strategy_as_of_the_switch_however_late_it_is_touched() {
    let clock = ManualClock::new();
    let old = Policy::new(100, 10.0).unwrap();
    let new = Policy::new(40, 4.0).unwrap();
    let m = map(old, &clock, 1000);
    for key in 0..50u64 {
        assert!(m.try_acquire(&key, key).unwrap().is_admitted());
    }
    clock.advance(Duration::from_secs(2)); // +20 each under the old policy
    m.reconfigure(new, Inherit::Proportional);
    assert_eq!(m.reconfigurations(), 1);
    // An hour later: the old policy refilled each key for 2 s, the new one for the hour.
    clock.advance(Duration::from_secs(3600));
    for key in 0..50u64 {
        assert_eq!(
            m.available(&key),
            40.0,
            "full again under the new policy: {key}"
        );
    }
    // Touched right after the switch instead: the same as a live bucket switched then.
    let m = map(old, &clock, 1000);
    let live: Vec<_> = (0..50u64)
        .map(|key| {
            let b = LiveBucket::with_clock(old, clock.clone());
            assert!(b.try_acquire(key + 30).unwrap().is_admitted());
            assert!(m.try_acquire(&key, key + 30).unwrap().is_admitted());
            b
        })
        .collect();
    clock.advance(Duration::from_millis(700));
    m.reconfigure(new, Inherit::Proportional);
    for b in &live {
        b.reconfigure(new, Inherit::Proportional);
    }
    clock.advance(Duration::from_millis(300));
    for (key, b) in live.iter().enumerate() {
        assert_eq!(m.available(&(key as u64)), b.available(), "key {key}");
    }
}

#[test]
fn each_strategy_on_a_map_matches_a_live_bucket() {
    for how in STRATEGIES {
        let clock = ManualClock::new();
        let old = Policy::new(100, 10.0).unwrap();
        let new = Policy::new(300, 30.0).unwrap().start_empty();
        let m = map(old, &clock, 100);
        let b = LiveBucket::with_clock(old, clock.clone());
        m.try_acquire(&1, 70).unwrap();
        b.try_acquire(70).unwrap();
        clock.advance(Duration::from_millis(1500));
        m.reconfigure(new, how);
        b.reconfigure(new, how);
        clock.advance(Duration::from_millis(1500));
        assert_eq!(m.available(&1), b.available(), "{how:?}");
        // A key created after the switch starts in the new policy's start state.
        assert_eq!(m.available(&2), 0.0, "{how:?}");
        assert!(m.try_acquire(&2, 1).unwrap().is_rejected(), "{how:?}");
    }
}

#[test]
fn several_switches_convert_a_shard_one_switch_at_a_time() {
    let clock = ManualClock::new();
    let p = [
        Policy::new(10, 1.0).unwrap(),
        Policy::new(20, 2.0).unwrap(),
        Policy::new(5, 100.0).unwrap(),
        Policy::new(1000, 1.0).unwrap(),
    ];
    let m = map(p[0], &clock, 100);
    let b = LiveBucket::with_clock(p[0], clock.clone());
    m.try_acquire(&9, 10).unwrap();
    b.try_acquire(10).unwrap();
    for (i, (next, how)) in [
        (p[1], Inherit::Additive),
        (p[2], Inherit::AsIs),
        (p[3], Inherit::Proportional),
    ]
    .into_iter()
    .enumerate()
    {
        clock.advance(Duration::from_millis(300 + 100 * i as u64));
        m.reconfigure(next, how);
        b.reconfigure(next, how);
    }
    // Key 9's shard is converted three times over, each as of its switch.
    clock.advance(Duration::from_millis(10));
    assert_eq!(m.reconfigurations(), 3);
    assert_eq!(m.available(&9), b.available());
    assert_eq!(m.policy().capacity(), 1000);
}

#[test]
fn a_million_keys_switch_without_touching_them() {
    // The switch publishes a policy: its cost does not depend on the map's size (the
    // figures, switch time and admissions per second around it, are in BENCHMARKS.md).
    let clock = ManualClock::new();
    let m = KeyedLimiter::<u64>::builder(Policy::new(10, 1.0).unwrap(), 1 << 20)
        .clock(clock.clone())
        .build()
        .unwrap();
    for key in 0..1_000_000u64 {
        m.try_acquire(&key, 1 + key % 10).unwrap();
    }
    m.reconfigure(Policy::new(20, 1.0).unwrap(), Inherit::Additive);
    // Each key as the strategy says, converted on first touch.
    for key in (0..1_000_000u64).step_by(9973) {
        let left = 10 - (1 + key % 10) as i64;
        assert_eq!(m.available(&key), (left + 10) as f64, "key {key}");
    }
    assert_eq!(m.len(), 1_000_000);
}

#[test]
fn racing_admissions_refunds_and_switches_neither_lose_nor_mint_tokens() {
    // Time stands still; capacities alternate between 1,000 and 2,000 under `AsIs`
    // (never capped, never added to): admitted less refunded plus what is left equals
    // the start, key by key summed.
    let clock = ManualClock::new();
    let m = map(Policy::new(1_000, 1.0).unwrap(), &clock, 64);
    let keys = 32u64;
    for key in 0..keys {
        m.try_acquire(&key, 0).unwrap(); // created full
    }
    let net = AtomicI64::new(0);
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let (m, net) = (&m, &net);
            s.spawn(move || {
                for i in 0..4_000u64 {
                    let key = (i * 7 + t) % keys;
                    let cost = 1 + (i + t) % 3;
                    if m.try_acquire(&key, cost).unwrap().is_admitted() {
                        net.fetch_add(cost as i64, Ordering::Relaxed);
                        if i % 5 == 0 {
                            m.refund(&key, cost).unwrap();
                            net.fetch_sub(cost as i64, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
        let m = &m;
        s.spawn(move || {
            for i in 0..300 {
                let c = if i % 2 == 0 { 2_000 } else { 1_000 };
                m.reconfigure(Policy::new(c, 1.0 + i as f64).unwrap(), Inherit::AsIs);
                std::thread::yield_now();
            }
        });
    });
    let left: f64 = (0..keys).map(|k| m.available(&k)).sum();
    assert_eq!(left.fract(), 0.0);
    assert_eq!(
        net.load(Ordering::Relaxed) + left as i64,
        1_000 * keys as i64
    );
    assert_eq!(m.reconfigurations(), 300);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    /// Random histories on real nanoseconds over a few keys, with switches: each key's
    /// decisions are a live bucket's, switched at the same readings (the keyed map
    /// converts lazily, as of the switch).
    #[test]
    fn a_keyed_map_decides_as_live_buckets_switched_at_the_same_readings(
        start in 0u64..(1 << 40),
        steps in prop::collection::vec(
            prop_oneof![
                3 => (0u64..2_000_000_000).prop_map(|d| (0u8, d)),
                6 => (0u64..40).prop_map(|c| (1u8, c)),
                1 => (0u64..16).prop_map(|s| (2u8, s)),
            ],
            1..80,
        ),
    ) {
        let policies = switch_policies();
        let clock = ManualClock::new();
        clock.set(Duration::from_nanos(start));
        let m = map(policies[0], &clock, 16);
        // Keys created with the live buckets: a key created after a switch starts in the
        // new policy's start state, a live bucket carries its old state over.
        for key in 0..4u64 {
            m.try_acquire(&key, 0).unwrap();
        }
        let keys: Vec<LiveBucket<ManualClock>> =
            (0..4).map(|_| LiveBucket::with_clock(policies[0], clock.clone())).collect();
        let mut policy = policies[0];
        for (i, (kind, v)) in steps.into_iter().enumerate() {
            match kind {
                0 => clock.advance(Duration::from_nanos(v)),
                1 => {
                    let key = (i % 4) as u64;
                    let cost = v.min(policy.capacity());
                    let live = keys[key as usize].try_acquire(cost).unwrap();
                    let keyed = m.try_acquire(&key, cost).unwrap();
                    prop_assert_eq!(keyed.is_admitted(), live.is_admitted(), "step {} key {} cost {}", i, key, cost);
                }
                _ => {
                    policy = policies[(v % 4) as usize];
                    let how = STRATEGIES[(v / 4) as usize];
                    m.reconfigure(policy, how);
                    for b in &keys {
                        b.reconfigure(policy, how);
                    }
                }
            }
        }
        for (key, b) in keys.iter().enumerate() {
            prop_assert_eq!(m.available(&(key as u64)), b.available());
        }
    }
}

#[test]
fn a_key_idle_for_a_whole_wrap_of_the_new_policy_reads_full() {
    // The old policy fills in about 115 days, the new one in about a second and wraps in
    // about 13 days: the passes after the switch must follow the new policy's idle time,
    // or a key drained after the switch and left a whole wrap reads a wrapped balance.
    let new = Policy::builder(1 << 20, 1e9)
        .max_reservation(Duration::from_secs(1))
        .build()
        .unwrap();
    let wrap = new.layout().wrap_period();
    let clock = ManualClock::new();
    let m = map(Policy::new(10, 1e-6).unwrap(), &clock, 100);
    m.reconfigure(new, Inherit::AsIs);
    assert!(m.try_acquire(&2, (1 << 20) - 5).unwrap().is_admitted());
    clock.advance(wrap + Duration::from_micros(500));
    assert_eq!(m.available(&2), (1u64 << 20) as f64);
    assert!(m.try_acquire(&2, 1 << 20).unwrap().is_admitted());
}

/// Map `Policy::new(10, 1.0)`, keys 1 and 2 full, `sweep()` evicts both, key 2 comes
/// back (full), then `reconfigure(Policy::new(100, 10.0), inherit)`. The strategy applies
/// to held keys; a key not held starts as a new key (full). Every strategy but `AsIs`
/// carries a full key over as full, so eviction stays invisible; under `AsIs` to a
/// larger capacity the kept key holds 10 and the evicted one 100: the documented
/// exception (`KeyedLimiter::reconfigure`).
#[test]
fn an_evicted_full_key_comes_back_as_a_new_key_and_only_as_is_tells_it_from_a_kept_one() {
    for inherit in [
        Inherit::AsIs,
        Inherit::Proportional,
        Inherit::Additive,
        Inherit::Reset,
    ] {
        let clock = ManualClock::new();
        let m = map(Policy::new(10, 1.0).unwrap(), &clock, 100);
        assert!(m.try_acquire(&1, 0).unwrap().is_admitted());
        assert!(m.try_acquire(&2, 0).unwrap().is_admitted());
        assert_eq!(m.sweep().evicted, 2);
        assert!(m.try_acquire(&2, 0).unwrap().is_admitted()); // back, full
        assert!(!m.contains(&1));
        m.reconfigure(Policy::new(100, 10.0).unwrap(), inherit);
        let (evicted, kept) = (m.available(&1), m.available(&2));
        assert_eq!(evicted, 100.0, "{inherit:?}");
        if inherit == Inherit::AsIs {
            assert_eq!(kept, 10.0, "{inherit:?}: min(b, B')");
        } else {
            assert_eq!(kept, evicted, "{inherit:?}: eviction is invisible");
        }
    }
}
