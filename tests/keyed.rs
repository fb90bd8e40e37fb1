//! Keyed limiters: isolation, bounded memory, eviction, overflow and counters, on a
//! manual clock.

use std::collections::HashMap;
use std::time::Duration;

use tokengate::{
    AcquireError, Bucket, KeyedLimiter, ManualClock, Policy, keyed::Eviction,
    keyed::KeyedConfigError, keyed::KeyedError, keyed::Overflow, telemetry::Attempt,
};

fn limiter(policy: Policy, max_keys: usize, clock: &ManualClock) -> KeyedLimiter<u64, ManualClock> {
    KeyedLimiter::builder(policy, max_keys)
        .clock(clock.clone())
        .shards(8)
        .build()
        .unwrap()
}

/// A small deterministic generator (xorshift64*), so failures replay.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn one_key_draining_leaves_other_keys_untouched() {
    let clock = ManualClock::new();
    let l = limiter(Policy::new(10, 1.0).unwrap(), 100, &clock);
    l.try_acquire(&2, 1).unwrap();
    let before = l.stored_word(&2).unwrap();
    for _ in 0..20 {
        l.try_acquire(&1, 1).unwrap();
    }
    assert_eq!(l.available(&1), 0.0);
    assert_eq!(l.stored_word(&2), Some(before));
    assert_eq!(l.available(&2), 9.0);
}

#[test]
fn new_key_at_the_maximum_is_refused_with_a_distinct_reason_and_existing_keys_keep_state() {
    let clock = ManualClock::new();
    let l = limiter(Policy::new(10, 1.0).unwrap(), 50, &clock);
    for k in 0..50u64 {
        assert!(l.try_acquire(&k, 1 + k % 5).unwrap().is_admitted());
    }
    let words: Vec<u64> = (0..50u64).map(|k| l.stored_word(&k).unwrap()).collect();
    // Nothing is full (time is frozen), so nothing can be evicted.
    assert_eq!(
        l.try_acquire(&1000, 1),
        Err(KeyedError::KeyLimit { max_keys: 50 })
    );
    assert_eq!(l.len(), 50);
    assert!(!l.contains(&1000));
    let after: Vec<u64> = (0..50u64).map(|k| l.stored_word(&k).unwrap()).collect();
    assert_eq!(words, after);
    // Existing keys keep working from their state.
    assert!(l.try_acquire(&0, 9).unwrap().is_admitted());
    assert!(l.try_acquire(&0, 1).unwrap().is_rejected());
    assert_eq!(l.overflow_counters().original.rejected_requests, 1);
}

#[test]
fn at_the_maximum_a_full_bucket_is_evicted_to_make_room() {
    let clock = ManualClock::new();
    let l = limiter(Policy::new(10, 10.0).unwrap(), 2, &clock);
    l.try_acquire(&1, 10).unwrap();
    l.try_acquire(&2, 10).unwrap();
    clock.advance(Duration::from_secs(2)); // both refill to full
    l.try_acquire(&1, 1).unwrap(); // key 1 is no longer full
    // Key 3 finds the map full; key 2's full bucket (its shard permitting) is evicted.
    // Try keys until one lands in key 2's shard: only that shard is swept on insertion.
    let mut admitted = None;
    for k in 3..10_000u64 {
        match l.try_acquire(&k, 1) {
            Ok(d) => {
                admitted = Some((k, d));
                break;
            }
            Err(KeyedError::KeyLimit { .. }) => continue,
            Err(e) => panic!("{e}"),
        }
    }
    let (k, d) = admitted.expect("some key lands in key 2's shard");
    assert!(d.is_admitted());
    assert!(l.contains(&k));
    assert!(!l.contains(&2));
    assert!(l.contains(&1));
    assert_eq!(l.len(), 2);
    assert_eq!(l.available(&2), 10.0); // what the evicted key gets back: identical
}

/// Random operations on a keyed limiter with random sweeps, against one plain bucket
/// per key that is never evicted: every decision must be the same.
#[test]
fn eviction_loses_nothing_compared_with_never_evicting() {
    let clock = ManualClock::new();
    let policy = Policy::new(20, 50.0).unwrap();
    let l = limiter(policy, 64, &clock);
    let mut reference: HashMap<u64, Bucket<ManualClock>> = HashMap::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut evicted = 0;
    for step in 0..20_000 {
        match rng.below(10) {
            0 => clock.advance(Duration::from_micros(rng.below(400_000))),
            1 => evicted += l.sweep().evicted,
            _ => {
                let key = rng.below(48);
                let cost = 1 + rng.below(20);
                let got = l.try_acquire(&key, cost).unwrap();
                let want = reference
                    .entry(key)
                    .or_insert_with(|| Bucket::with_clock(policy, clock.clone()))
                    .try_acquire(cost)
                    .unwrap();
                // The same decision; a recreated key's fresh word may sit one tick
                // ahead (created at the next edge) where the reference was refilled to
                // the reading, which only the decision's internal lead shows.
                assert_eq!(
                    (got.is_admitted(), got.tokens_remaining(), got.retry_after()),
                    (
                        want.is_admitted(),
                        want.tokens_remaining(),
                        want.retry_after()
                    ),
                    "step {step}, key {key}, cost {cost}"
                );
            }
        }
    }
    assert!(evicted > 1000, "the test must evict: {evicted}");
    for (key, b) in &reference {
        assert_eq!(l.available(key), b.available(), "key {key}");
    }
}

#[test]
fn sweeps_reanchor_buckets_so_idling_past_the_tick_wrap_reads_correctly() {
    // Start-empty: lossless eviction never evicts, so the bucket stays and idles.
    let policy = Policy::new(100, 20.0).unwrap().start_empty();
    let clock = ManualClock::new();
    let l = limiter(policy, 10, &clock);
    let lone = Bucket::with_clock(policy, clock.clone());
    assert!(l.try_acquire(&1, 0).unwrap().is_admitted()); // creates the key
    let wrap = policy.wrap_period();
    let interval = l.max_sweep_interval();
    assert!(interval < wrap);
    // Idle into the middle of the back window (readings between `interval` and `wrap`
    // after the last write read as behind), sweeping every half interval as documented.
    let target = interval + (wrap - interval) / 2;
    let mut elapsed = Duration::ZERO;
    while elapsed + interval / 2 <= target {
        clock.advance(interval / 2);
        elapsed += interval / 2;
        l.sweep();
    }
    clock.advance(target - elapsed);
    // The unswept bucket reads the clock far behind its stored tick: from a monotonic
    // reading that is an idle past the wrap, so it is full, as the truth is...
    assert!(lone.try_acquire(100).unwrap().is_admitted());
    // ...and so is the swept one.
    assert!(l.try_acquire(&1, 100).unwrap().is_admitted());
    // An idle of exactly one more wrap period: the swept key reads the truth, and so
    // does the bucket left alone, which re-anchors itself (its first operation after the
    // idle finds its re-anchoring pass long due, and the bucket full).
    let mut elapsed = Duration::ZERO;
    while elapsed + interval / 2 <= wrap {
        clock.advance(interval / 2);
        elapsed += interval / 2;
        l.sweep();
    }
    clock.advance(wrap - elapsed);
    assert!(lone.try_acquire(100).unwrap().is_admitted());
    assert!(l.try_acquire(&1, 100).unwrap().is_admitted());
}

#[test]
fn start_empty_keys_are_evicted_only_when_asked_and_then_start_empty_again() {
    let policy = Policy::new(10, 10.0).unwrap().start_empty();
    let clock = ManualClock::new();
    let lossless = limiter(policy, 10, &clock);
    let full = KeyedLimiter::<u64, _>::builder(policy, 10)
        .clock(clock.clone())
        .eviction(Eviction::Full)
        .build()
        .unwrap();
    for l in [&lossless, &full] {
        assert!(l.try_acquire(&1, 1).unwrap().is_rejected()); // empty at first
    }
    clock.advance(Duration::from_secs(5));
    assert_eq!(lossless.sweep().evicted, 0);
    assert_eq!(lossless.available(&1), 10.0);
    assert_eq!(full.sweep().evicted, 1);
    assert_eq!(full.available(&1), 0.0); // the returning key starts empty
}

#[test]
fn shared_overflow_bucket_takes_new_keys_when_the_map_is_full() {
    let clock = ManualClock::new();
    let l = KeyedLimiter::<u64, _>::builder(Policy::new(10, 1.0).unwrap(), 4)
        .clock(clock.clone())
        .overflow(Overflow::Share(Policy::new(5, 1.0).unwrap()))
        .build()
        .unwrap();
    for k in 0..4u64 {
        l.try_acquire(&k, 1).unwrap();
    }
    // Twenty new keys share five tokens.
    let admitted = (100..120u64)
        .filter(|k| l.try_acquire(k, 1).unwrap().is_admitted())
        .count();
    assert_eq!(admitted, 5);
    assert_eq!(l.len(), 4);
    let o = l.overflow_counters();
    assert_eq!(
        (o.original.admitted_requests, o.original.rejected_requests),
        (5, 15)
    );
}

#[test]
fn a_cost_above_capacity_is_an_error_and_creates_no_key() {
    let clock = ManualClock::new();
    let l = limiter(Policy::new(10, 1.0).unwrap(), 10, &clock);
    assert_eq!(
        l.try_acquire(&1, 11),
        Err(KeyedError::Acquire(AcquireError::CostExceedsCapacity {
            cost: 11,
            capacity: 10
        }))
    );
    assert!(l.is_empty());
}

#[test]
fn flood_of_distinct_keys_keeps_the_map_at_or_under_its_maximum() {
    // The full 10 million key flood runs in `examples/key_flood.rs` (release mode).
    let clock = ManualClock::new();
    let max = 2_000;
    let l = limiter(Policy::new(100, 1000.0).unwrap(), max, &clock);
    let residents: Vec<u64> = (0..100).map(|k| k * 7919 + 1).collect();
    for &k in &residents {
        l.try_acquire(&k, 50).unwrap();
    }
    let mut rejected = 0u64;
    let mut key = 1u64 << 40;
    for round in 0..20 {
        for _ in 0..10_000 {
            key += 1;
            match l.try_acquire(&key, 1) {
                Ok(_) => {}
                Err(KeyedError::KeyLimit { max_keys }) => {
                    assert_eq!(max_keys, max);
                    rejected += 1;
                }
                Err(e) => panic!("{e}"),
            }
            assert!(l.len() <= max);
        }
        // Residents keep their state and keep working: every other round they spend, and
        // time moves so flood buckets refill and become evictable.
        for &k in &residents {
            assert!(l.contains(&k) || round % 2 == 1);
        }
        clock.advance(Duration::from_millis(if round % 2 == 0 { 0 } else { 200 }));
        for &k in &residents {
            assert!(l.try_acquire(&k, 1).unwrap().is_admitted(), "round {round}");
        }
    }
    assert!(rejected > 0, "the flood must hit the maximum");
    assert!(l.len() <= max);
    assert_eq!(l.overflow_counters().original.rejected_requests, rejected);
}

#[test]
fn concurrent_inserts_never_exceed_the_maximum() {
    let clock = ManualClock::new();
    let l = limiter(Policy::new(10, 1.0).unwrap(), 1000, &clock);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let l = &l;
            s.spawn(move || {
                for i in 0..5_000u64 {
                    let _ = l.try_acquire(&(t << 32 | i), 1);
                    assert!(l.len() <= 1000);
                }
            });
        }
    });
    assert_eq!(l.len(), 1000);
    let mut n = 0;
    l.for_each_counters(|_, _| n += 1);
    assert_eq!(n, 0, "counters are off by default");
}

#[test]
fn counters_split_original_and_retry_and_survive_eviction() {
    let clock = ManualClock::new();
    let l = KeyedLimiter::<u64, _>::builder(Policy::new(10, 1.0).unwrap(), 10)
        .clock(clock.clone())
        .counters(true)
        .build()
        .unwrap();
    l.try_acquire_as(&1, 6, Attempt::Original).unwrap();
    l.try_acquire_as(&1, 6, Attempt::Original).unwrap();
    l.try_acquire_as(&1, 4, Attempt::Retry(1)).unwrap();
    let c = l.counters(&1).unwrap();
    assert_eq!(c.original.admitted_tokens, 6);
    assert_eq!(c.original.rejected_tokens, 6);
    assert_eq!(c.retry.admitted_tokens, 4);
    clock.advance(Duration::from_secs(11)); // 10 s at 1/s less the rounding down
    assert_eq!(l.sweep().evicted, 1);
    assert_eq!(l.counters(&1), None);
    assert_eq!(l.evicted_counters(), c);
}

#[test]
fn string_keys_are_looked_up_by_str_without_allocating_a_key() {
    let l: KeyedLimiter<String, ManualClock> =
        KeyedLimiter::builder(Policy::new(3, 1.0).unwrap(), 8)
            .clock(ManualClock::new())
            .build()
            .unwrap();
    assert!(l.try_acquire("alice", 3).unwrap().is_admitted());
    assert!(l.try_acquire("alice", 1).unwrap().is_rejected());
    assert!(l.try_acquire(&"bob".to_string(), 1).unwrap().is_admitted());
    assert_eq!(l.len(), 2);
}

#[test]
fn invalid_configurations_are_typed_errors() {
    let p = Policy::new(1, 1.0).unwrap();
    assert_eq!(
        KeyedLimiter::<u64>::new(p, 0).err(),
        Some(KeyedConfigError::ZeroMaxKeys)
    );
    assert_eq!(
        KeyedLimiter::<u64>::builder(p, 1).shards(12).build().err(),
        Some(KeyedConfigError::Shards(12))
    );
    assert_eq!(
        KeyedLimiter::<u64>::builder(p, 1)
            .shards(4096)
            .build()
            .err(),
        Some(KeyedConfigError::Shards(4096))
    );
}

/// A refund for a key whose admission was charged to the shared overflow bucket finds no
/// bucket of its own and is dropped: the shared bucket keeps the cost (no credit made).
#[test]
fn a_refund_for_a_key_charged_to_the_shared_bucket_is_dropped() {
    let clock = ManualClock::new();
    let l = KeyedLimiter::<u64, _>::builder(Policy::new(10, 1.0).unwrap(), 1)
        .clock(clock.clone())
        .overflow(Overflow::Share(Policy::new(5, 1.0).unwrap()))
        .build()
        .unwrap();
    assert!(l.try_acquire(&1, 1).unwrap().is_admitted()); // key 1 fills the map
    assert!(l.try_acquire(&2, 5).unwrap().is_admitted()); // charged to the shared bucket
    assert!(!l.contains(&2));
    assert_eq!(l.refund(&2, 5), Ok(()));
    assert!(!l.contains(&2), "a refund creates no key");
    assert!(
        l.try_acquire(&3, 1).unwrap().is_rejected(),
        "the shared bucket got nothing back"
    );
    assert_eq!(l.available(&1), 9.0, "nor did any other key");
}

/// A refund that fills a bucket makes it evictable at once: the shard's "earliest time
/// anything can be evicted", noted by the sweep when the bucket was empty, no longer
/// holds, and a new key at the maximum must not be refused until then (it was, for up to
/// the fill time: 10 s here).
#[test]
fn a_refund_that_fills_a_bucket_lets_a_new_key_evict_it_at_once() {
    let clock = ManualClock::new();
    // One shard, so that the new key's insertion sweeps the shard key 1 is in.
    let limiter = KeyedLimiter::<u64, _>::builder(Policy::new(10, 1.0).unwrap(), 1)
        .clock(clock.clone())
        .shards(1)
        .build()
        .unwrap();
    assert!(limiter.try_acquire(&1, 10).unwrap().is_admitted());
    clock.advance(Duration::from_millis(1));
    // At the maximum: the sweep finds key 1 empty, due full in about 10 s.
    assert!(matches!(
        limiter.try_acquire(&2, 1),
        Err(KeyedError::KeyLimit { .. })
    ));
    limiter.refund(&1, 10).unwrap();
    assert_eq!(limiter.available(&1), 10.0);
    clock.advance(Duration::from_millis(1));
    let d = limiter.try_acquire(&2, 1).unwrap();
    assert!(d.is_admitted());
    assert!(
        !limiter.contains(&1),
        "the full bucket of key 1 was evicted"
    );
}

/// A clock whose readings are never inline ([`Clock::now_inline`] is `None`).
#[derive(Clone, Default)]
struct OutOfLine(ManualClock);

impl tokengate::Clock for OutOfLine {
    fn now_nanos(&self) -> u64 {
        tokengate::Clock::now_nanos(&self.0)
    }

    fn now_inline(&self) -> Option<u64> {
        None
    }
}

/// The same requests on a limiter whose clock is read out of line (every found key
/// then decided off the reader section's path) get the same decisions, sweeps and
/// evictions included.
#[test]
fn a_clock_read_out_of_line_decides_as_one_read_inline() {
    let clock = ManualClock::new();
    let policy = Policy::new(20, 50.0).unwrap();
    let inline = limiter(policy, 64, &clock);
    let called = KeyedLimiter::builder(policy, 64)
        .clock(OutOfLine(clock.clone()))
        .shards(8)
        .build()
        .unwrap();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for step in 0..20_000 {
        match rng.below(10) {
            0 => clock.advance(Duration::from_micros(rng.below(400_000))),
            1 => assert_eq!(called.sweep().evicted, inline.sweep().evicted),
            _ => {
                let key = rng.below(96);
                let cost = 1 + rng.below(20);
                assert_eq!(
                    called.try_acquire(&key, cost),
                    inline.try_acquire(&key, cost),
                    "step {step}, key {key}, cost {cost}"
                );
            }
        }
    }
    for key in 0..96 {
        assert_eq!(called.available(&key), inline.available(&key), "key {key}");
    }
}

/// A one-key map (start-empty, so the key stays) with `Overflow::Share(Policy::new(100,
/// 20.0))`: take 60 from the shared bucket, idle. Its word was never re-anchored: after
/// one wrap it read 40 (the truth is 100) and refused 100; one wrap and a second later
/// it read 59.96. The shared bucket has passes of its own, on its own policy's timing.
#[test]
fn the_shared_overflow_bucket_reads_its_true_balance_after_idles_of_any_length() {
    let shared = Policy::new(100, 20.0).unwrap();
    let wrap = shared.wrap_period();
    let tick = shared.tick();
    let hour = Duration::from_secs(3600);
    for idle in [
        Duration::from_secs(1),
        wrap - hour,
        wrap - tick * 3,
        wrap,
        wrap + tick,
        wrap + Duration::from_secs(1),
        wrap * 2 - tick * 5,
        wrap * 3 + hour,
    ] {
        let clock = ManualClock::new();
        clock.set(Duration::from_secs(1));
        let m: KeyedLimiter<u64, ManualClock> =
            KeyedLimiter::builder(Policy::new(100, 1.0).unwrap().start_empty(), 1)
                .clock(clock.clone())
                .overflow(Overflow::Share(shared))
                .build()
                .unwrap();
        assert!(m.try_acquire(&1, 0).unwrap().is_admitted()); // the one key
        assert!(m.try_acquire(&2, 60).unwrap().is_admitted()); // from the shared bucket
        clock.advance(idle);
        // The truth: 40 + 20/s for the idle, capped at 100.
        let truth = (40.0 + 20.0 * idle.as_secs_f64()).min(100.0);
        // Less a tenth of a token for the grid's lag, unless the bucket is full.
        let want = if truth >= 100.0 {
            100
        } else {
            (truth - 0.1).floor() as u64
        };
        let d = m.try_acquire(&3, want).unwrap();
        assert!(
            d.is_admitted(),
            "idle {idle:?}: the shared bucket refused {want} tokens (the truth is {truth}), \
             reading {}",
            d.tokens_remaining()
        );
        assert!(
            m.try_acquire(&4, 2).unwrap().is_rejected(),
            "idle {idle:?}: more than the truth"
        );
    }
}
