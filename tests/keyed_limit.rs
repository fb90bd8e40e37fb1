//! A keyed map at its maximum: a new key is refused exactly when no bucket in any shard
//! can be evicted, and buckets re-anchor by themselves, with no call to `sweep`.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::time::Duration;

use proptest::prelude::*;
use tokengate::keyed::{Eviction, KeyedError};
use tokengate::{KeyedLimiter, ManualClock, Policy};
use tokengate_testkit::{Model, Outcome};

/// SipHash with fixed keys: the same shard for a key in every run.
type Fixed = BuildHasherDefault<DefaultHasher>;

fn map(
    policy: Policy,
    max_keys: usize,
    shards: usize,
    clock: &ManualClock,
) -> KeyedLimiter<u64, ManualClock, Fixed> {
    KeyedLimiter::builder(policy, max_keys)
        .clock(clock.clone())
        .hasher(Fixed::default())
        .shards(shards)
        .build()
        .unwrap()
}

fn is_key_limit<T: std::fmt::Debug>(r: &Result<T, KeyedError>) -> bool {
    matches!(r, Err(KeyedError::KeyLimit { .. }))
}

/// 8 keys spread over 64 shards, every bucket full again: each of 40 new keys lands, most
/// likely, in a shard holding none of them, and must still be admitted by evicting a
/// full bucket elsewhere (36 to 38 of the 40 were refused when an insertion swept only
/// its own shard).
#[test]
fn key_limit_is_refused_only_when_no_bucket_in_any_shard_can_be_evicted() {
    let clock = ManualClock::new();
    let l = map(Policy::new(10, 1.0).unwrap(), 8, 64, &clock);
    for key in 0..8 {
        assert!(l.try_acquire(&key, 5).unwrap().is_admitted());
    }
    assert_eq!(l.len(), 8);
    let mut refused = 0;
    for key in 100..140 {
        // Every bucket in the map has refilled to full: the 8 first keys took 5 tokens
        // 5 s ago or more, each new key 1 token 1.5 s ago or more.
        clock.advance(Duration::from_millis(if key == 100 {
            6_000
        } else {
            1_500
        }));
        match l.try_acquire(&key, 1) {
            Ok(d) => assert!(d.is_admitted()),
            Err(KeyedError::KeyLimit { .. }) => refused += 1,
            Err(e) => panic!("{e}"),
        }
        assert_eq!(l.len(), 8, "never above the maximum, and full again");
    }
    assert_eq!(
        refused, 0,
        "{refused} of 40 new keys refused with evictable buckets"
    );
    assert!(
        !(0..8).any(|k| l.contains(&k)),
        "the first keys were evicted"
    );
}

/// When no bucket is full, nothing can be evicted: a new key is refused until the first
/// bucket has refilled, and admitted from then on.
#[test]
fn a_new_key_is_refused_while_every_bucket_is_below_full() {
    let clock = ManualClock::new();
    clock.set(Duration::from_nanos(1_000_012_345)); // not on a tick edge
    let l = map(Policy::new(10, 1.0).unwrap(), 8, 64, &clock);
    for key in 0..8 {
        assert!(l.try_acquire(&key, 1 + key).unwrap().is_admitted());
        clock.advance(Duration::from_millis(1));
    }
    // Key 0 took 1 token, 8 ms ago: it is full within about a second, the others later.
    let r = l.try_acquire(&100, 1);
    assert!(is_key_limit(&r), "{r:?}");
    assert_eq!(l.len(), 8);
    assert!(l.available(&0) < 10.0);
    // Step to the first reading at which key 0 is full: a new key is refused one
    // microsecond before it and admitted at it, evicting key 0 only.
    while l.available(&0) < 10.0 {
        clock.advance(Duration::from_nanos(997));
        if l.available(&0) < 10.0 {
            let r = l.try_acquire(&100, 1);
            assert!(is_key_limit(&r), "{r:?}");
        }
    }
    assert!(l.try_acquire(&100, 1).unwrap().is_admitted());
    assert!(!l.contains(&0));
    assert!((1..8).all(|k| l.contains(&k)));
    assert_eq!(l.len(), 8);
}

/// One operation of the property test.
#[derive(Clone, Debug)]
enum Op {
    Acquire { key: u64, cost: u64 },
    Refund { key: u64, cost: u64 },
    Advance { nanos: u64 },
}

/// Operations on a map of `Policy::new(2, 1000.0)`: 32.768 us ticks, a fill time of 62
/// ticks (about 2 ms). Most advances are within a few ticks, nanosecond-grained, so that
/// readings fall just before and after the tick edge at which a bucket is full.
fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..10u64, 0..=2u64).prop_map(|(key, cost)| Op::Acquire { key, cost }),
        1 => (0..10u64, 1..=2u64).prop_map(|(key, cost)| Op::Refund { key, cost }),
        3 => (0..100_000u64).prop_map(|nanos| Op::Advance { nanos }),
        1 => (0..3_000_000u64).prop_map(|nanos| Op::Advance { nanos }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random acquisitions, refunds and clock advances on a small map, against one exact
    /// model bucket per key (`tokengate_testkit::Model`): every decision matches, a key
    /// leaves the map only when its bucket is full, the map never exceeds its maximum,
    /// and a new key is refused with `KeyLimit` exactly when the map is at its maximum
    /// and no model bucket is full.
    #[test]
    fn key_limit_exactly_when_no_bucket_is_full(
        max_keys in 1usize..=4,
        shard_bits in 0u32..=3,
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let policy = Policy::new(2, 1000.0).unwrap();
        let layout = policy.layout();
        let full = (layout.max_units() - layout.base_units()) as i128;
        let clock = ManualClock::new();
        clock.set(Duration::from_nanos(1_000_012_345));
        let l = map(policy, max_keys, 1 << shard_bits, &clock);
        let mut models: HashMap<u64, Model> = HashMap::new();
        for (step, op) in ops.into_iter().enumerate() {
            let now = nanos(&clock);
            match op {
                Op::Advance { nanos } => clock.advance(Duration::from_nanos(nanos)),
                Op::Refund { key, cost } => {
                    l.refund(&key, cost).unwrap();
                    if let Some(m) = models.get_mut(&key) {
                        m.refund(cost, now);
                    }
                }
                Op::Acquire { key, cost } => {
                    let new = !models.contains_key(&key);
                    let evictable = models.values().any(|m| m.balance_units(now) == full);
                    let got = l.try_acquire(&key, cost);
                    if new && models.len() == max_keys && !evictable {
                        prop_assert!(is_key_limit(&got), "step {step}: {got:?}, want KeyLimit");
                    } else {
                        let d = match got {
                            Ok(d) => d,
                            Err(e) => return Err(TestCaseError::fail(format!(
                                "step {step}: key {key} refused ({e}) with {} of {max_keys} \
                                 keys, evictable: {evictable}", models.len()))),
                        };
                        let m = models.entry(key).or_insert_with(|| Model::new(&policy, now));
                        let want = m.try_acquire(cost, now);
                        let (admitted, balance) = match want {
                            Outcome::Admitted { balance } => (true, balance),
                            Outcome::Rejected { balance, .. } => (false, balance),
                            other => panic!("{other:?}"),
                        };
                        prop_assert_eq!(
                            (d.is_admitted(), i128::from(d.balance_units())),
                            (admitted, balance),
                            "step {}: key {} cost {}", step, key, cost
                        );
                    }
                }
            }
            // Keys the map evicted during this step: only full ones.
            let gone: Vec<u64> = models.keys().copied().filter(|k| !l.contains(k)).collect();
            for k in gone {
                let m = models.remove(&k).unwrap();
                prop_assert_eq!(m.balance_units(now), full, "step {}: evicted key {} was not full", step, k);
            }
            prop_assert_eq!(l.len(), models.len(), "step {}", step);
            prop_assert!(l.len() <= max_keys);
        }
    }
}

/// A manual clock's reading in nanoseconds.
fn nanos(clock: &ManualClock) -> u64 {
    u64::try_from(clock.now().as_nanos()).unwrap()
}

/// A drained bucket left idle for several wrap periods reads full (the truth) with no
/// call to `sweep`, both while other keys keep the map busy and when the whole map idles:
/// the map re-anchors its buckets by itself. A bucket alone (not in a map) idle for
/// exactly one wrap period reads as if no time had passed, which is what the map's passes
/// prevent.
#[test]
fn idle_buckets_read_their_balance_past_the_wrap_with_no_manual_sweep() {
    // A small capacity at a high rate: 2 ns ticks, a fill time of 27 ticks, and a wrap of
    // 2^52 ns (about 52 days), among the shortest a policy gets.
    let starts_full = Policy::new(166, 3.173e9).unwrap();
    let policy = starts_full.start_empty();
    let wrap = policy.wrap_period();
    assert!(wrap < Duration::from_secs(60 * 86_400), "{wrap:?}");
    let capacity = policy.capacity() as f64;
    let third = policy.capacity() / 3;
    let fill = Duration::from_micros(1);
    for eviction in [Eviction::Lossless, Eviction::Full] {
        let clock = ManualClock::new();
        let l = KeyedLimiter::<u64, _>::builder(policy, 16)
            .clock(clock.clone())
            .eviction(eviction)
            .build()
            .unwrap();
        // Key `key` created (start-empty), filled, and a third taken.
        let use_key = |key: u64| {
            let _ = l.try_acquire(&key, 0).unwrap();
            clock.advance(fill);
            assert!(l.try_acquire(&key, third).unwrap().is_admitted());
        };
        // Lossless keeps the idle bucket (it must read full); Full evicts it (a
        // returning key starts empty again).
        let want = if eviction == Eviction::Full {
            0.0
        } else {
            capacity
        };

        // Busy map, idle key: key 2 is used every tenth of a wrap, key 1 never again, for
        // three wraps (less the rounding of a tenth): alone, key 1 would read no refill.
        use_key(1);
        for _ in 0..30 {
            clock.advance(wrap / 10);
            let _ = l.try_acquire(&2, 0).unwrap();
        }
        assert_eq!(l.available(&1), want, "{eviction:?}: busy map");
        assert_eq!(l.contains(&1), eviction == Eviction::Lossless);

        // The whole map idle for exactly one wrap, then for several.
        for idle in [wrap, wrap * 3 + wrap / 7] {
            use_key(1);
            let lone = tokengate::Bucket::with_clock(starts_full, clock.clone());
            assert!(lone.try_acquire(third).unwrap().is_admitted());
            clock.advance(idle);
            assert_eq!(l.available(&1), want, "{eviction:?}: map idle for {idle:?}");
            assert_eq!(l.contains(&1), eviction == Eviction::Lossless);
            // Alone, a bucket re-anchors itself too.
            assert_eq!(lone.available(), capacity, "lone bucket idle for {idle:?}");
        }
    }
}

/// A map whose only operations are admissions of keys it holds (the path that decides a
/// found key under its shard's read lock, the clock read after the lookup) still runs its
/// re-anchoring passes: a drained key idle for three wraps while another key is taken
/// from every tenth of a wrap is then full for an admission of the whole capacity.
#[test]
fn a_map_that_only_admits_its_keys_still_runs_its_passes() {
    let policy = Policy::new(166, 3.173e9).unwrap().start_empty();
    let wrap = policy.wrap_period();
    let clock = ManualClock::new();
    let l = KeyedLimiter::<u64, _>::builder(policy, 16)
        .clock(clock.clone())
        .eviction(Eviction::Lossless)
        .build()
        .unwrap();
    // Both keys made (start-empty), refilled, key 1 drained to a third.
    let _ = l.try_acquire(&1, 0).unwrap();
    let _ = l.try_acquire(&2, 0).unwrap();
    clock.advance(Duration::from_micros(1));
    assert!(
        l.try_acquire(&1, 2 * policy.capacity() / 3)
            .unwrap()
            .is_admitted()
    );
    for _ in 0..30 {
        clock.advance(wrap / 10);
        assert!(l.try_acquire(&2, 1).unwrap().is_admitted());
    }
    let d = l.try_acquire(&1, policy.capacity()).unwrap();
    assert!(d.is_admitted(), "key 1 idle for three wraps: {d:?}");
}
