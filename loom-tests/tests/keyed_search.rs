//! New keys racing for room in a keyed map at its maximum.
//!
//! Frozen clock. The map holds one key, its bucket full (evictable), in shard 0 of two;
//! two threads ask for new keys that both belong to shard 1. Neither finds anything to
//! evict in its own shard, so each searches the other shard. In every explored execution
//! exactly one of them evicts the full bucket and gets its room, the other is refused
//! with `KeyLimit` (no bucket is left to evict), and the map never holds more than its
//! maximum.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use loom_tests::{ByParity, Forward, Model, Tally};
use tokengate::keyed::KeyedError;
use tokengate::{Decision, KeyedLimiter, Policy};

type Map = KeyedLimiter<u64, Forward, ByParity>;

const MAX_KEYS: usize = 1;

/// A new key's request, checking the maximum as the thread sees it afterwards.
fn insert(map: &Map, key: u64) -> Result<Decision, KeyedError> {
    let out = map.try_acquire(&key, 1);
    assert!(
        map.len() <= MAX_KEYS,
        "{} keys, above the maximum",
        map.len()
    );
    out
}

fn two_new_keys_one_evictable_bucket(won: [Tally; 2]) -> impl Fn() + Sync + Send + 'static {
    let policy = Policy::new(1, 1.0).unwrap();
    move || {
        let map: Arc<Map> = Arc::new(
            KeyedLimiter::builder(policy, MAX_KEYS)
                .clock(Forward::new()) // frozen
                .hasher(ByParity)
                .shards(2)
                .build()
                .unwrap(),
        );
        // Key 0 in shard 0, left full: the one bucket that can be evicted.
        assert!(map.try_acquire(&0, 0).unwrap().is_admitted());
        let threads = [1, 3].map(|key| {
            let map = map.clone();
            thread::spawn(move || insert(&map, key))
        });
        let [a, b] = threads.map(|t| t.join().unwrap());
        let admitted = [&a, &b].map(|r| matches!(r, Ok(d) if d.is_admitted()));
        let refused = [&a, &b].map(|r| matches!(r, Err(KeyedError::KeyLimit { .. })));
        assert!(
            admitted[0] != admitted[1] && refused[0] != refused[1] && admitted[0] == refused[1],
            "exactly one new key must win the evicted bucket's room: {a:?} {b:?}"
        );
        assert_eq!(map.len(), MAX_KEYS, "the count of keys: {a:?} {b:?}");
        assert!(!map.contains(&0), "the full bucket was evicted");
        assert_eq!(map.contains(&1), admitted[0]);
        assert_eq!(map.contains(&3), admitted[1]);
        for (tally, ok) in won.iter().zip(admitted) {
            tally.hit_if(ok);
        }
    }
}

/// Each write lock also waits out the shard's reader sections (a fence and a load per
/// reader record), which multiplies the orders: at seven preemptions the model takes
/// 1,714,018 executions (246 s; 623,772 exhaustive before the sections), at five
/// 212,174. Four preemptions (54,112 executions, about 10 s) still cover every order of
/// the two searches' lock acquisitions, sweeps and claims many times over; the
/// deliberate bug below is caught with none.
const SEARCH: Model = Model {
    name: "two new keys, one evictable bucket elsewhere",
    threads: 3,
    preemption_bound: Some(4),
};

#[test]
fn exactly_one_new_key_gets_the_room_of_a_bucket_evicted_in_another_shard() {
    loom_tests::in_own_process!();
    let won = [Tally::new(), Tally::new()];
    SEARCH.check(two_new_keys_one_evictable_bucket(won.clone()));
    assert!(won[0].get() > 0, "the first thread never won");
    assert!(won[1].get() > 0, "the second thread never won");
}

#[test]
fn a_search_that_skips_other_shards_is_caught() {
    loom_tests::in_own_process!();
    let message = SEARCH.expect_violation(
        &tokengate::mutants::KEYED_SEARCH_SKIPS_OTHER_SHARDS,
        two_new_keys_one_evictable_bucket([Tally::new(), Tally::new()]),
    );
    assert!(message.contains("exactly one"), "{message}");
}
