//! Where a keyed decision's time goes: the keyed floor (with and without a token bucket's
//! exact take on its words), a bare sharded hash table with and without its read lock or
//! a reader section's fence (and with the exact take), the clock read before or after the
//! lookup, a one-line table (each key beside its word in one slot, no control bytes)
//! with and without the fence, tokengate's `KeyedLimiter` (reading only whether it
//! admitted, as the others do, and with its whole result through `black_box`, as the
//! `bench` subcommand reads every engine's) and governor's keyed limiter, each over the
//! same 100,000 `u64` keys picked uniformly at random, one thread, in one process (ns per
//! decision, best of five runs of 20 million, the cases' runs interleaved). Figures:
//! BENCHMARKS.md, "Keyed lookups", "The clocks read inline", "The goals on the Zen 2
//! EPYC" and "The keyed floor with a token bucket's arithmetic".
//!
//! `cargo run --release --example keyed_parts [FILTER]`; with `KEYED_PARTS_CALLS=N`, one run
//! of N calls per case (for instruction counts: run under callgrind with two values of N).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crossbeam_utils::sync::ShardedLock;
use hashbrown::HashTable;
use tokengate::keyed::KeyHasher;
use tokengate::state::Layout;
use tokengate::{Clock, KeyedLimiter, Policy, QuantaClock};

const KEYS: u64 = 100_000;
const CALLS: u64 = 20_000_000;
const SHARD_BITS: u32 = 3;

/// A key in `0..KEYS` from a xorshift64 state (the `bench` subcommand's generator).
fn random_key(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    ((u128::from(x) * u128::from(KEYS)) >> 64) as u64
}

/// One measured case: its name, and a run of a given number of calls giving ns per call.
type Case<'a> = (&'static str, Box<dyn FnMut(u64) -> f64 + 'a>);

/// `calls` decisions on keys from the generator, in ns per call. A function of its own
/// for each case (never inlined into `main`), so that each case's loop is allocated
/// registers alone: inlined into one large `main`, every case spilled its table and
/// limiter pointers to the stack and reloaded them per call, and how much depended on
/// the other cases.
#[inline(never)]
fn run(decide: &mut impl FnMut(u64) -> bool, calls: u64) -> f64 {
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let start = Instant::now();
    for _ in 0..calls {
        black_box(decide(random_key(&mut state)));
    }
    start.elapsed().as_nanos() as f64 / calls as f64
}

/// The case `name`, when `filter` selects it.
fn case<'a>(
    cases: &mut Vec<Case<'a>>,
    filter: &str,
    name: &'static str,
    mut decide: impl FnMut(u64) -> bool + 'a,
) {
    if name.contains(filter) {
        cases.push((name, Box::new(move |calls| run(&mut decide, calls))));
    }
}

/// Runs every case five times (runs of 20 million calls; one run of `KEYED_PARTS_CALLS`
/// calls when set), the cases' runs interleaved (one run of each in turn, so that every
/// case meets the same machine: on a shared virtual machine the same code's speed moves
/// by a third from one second to the next), and prints each case's best run.
fn report(cases: &mut [Case<'_>]) {
    let (runs, calls) = match std::env::var("KEYED_PARTS_CALLS").map(|n| n.parse::<u64>()) {
        Ok(Ok(n)) if n > 0 => (1, n),
        _ => (5, CALLS),
    };
    let mut best = vec![f64::MAX; cases.len()];
    for _ in 0..runs {
        for ((_, run), best) in cases.iter_mut().zip(&mut best) {
            *best = best.min(run(calls));
        }
    }
    for ((name, _), best) in cases.iter().zip(best) {
        println!("{name:58} {best:6.1} ns");
    }
}

/// A key and its word, as a keyed map stores them (16 bytes).
struct Entry {
    key: u64,
    word: AtomicU64,
}

/// A key and its word side by side in one 16-byte slot of an open-addressed table (no
/// control bytes: the probe compares keys): a lookup's one cache line. `EMPTY` keys mark
/// free slots.
#[repr(align(16))]
struct Slot {
    key: AtomicU64,
    word: AtomicU64,
}

const EMPTY: u64 = u64::MAX;

/// 2^18 slots (4 MiB, 38% full): twice the bytes of the hashbrown tables' entries for
/// the same keys (8 tables of 16,384 entries of 16 bytes). At 2^17 slots, their size,
/// the probes at 76% full measured slower than hashbrown's (BENCHMARKS.md, "The goals
/// on the Zen 2 EPYC").
const SLOT_BITS: u32 = 18;

/// The slot of `key` in `slots` (linear probing from the hash's low bits), inserting
/// it at the first free slot when absent.
fn slot_of(slots: &[Slot], hash: u64, key: u64, insert: bool) -> Option<&Slot> {
    let mask = slots.len() - 1;
    let mut i = hash as usize & mask;
    loop {
        let slot = &slots[i];
        match slot.key.load(Ordering::Relaxed) {
            k if k == key => return Some(slot),
            EMPTY if insert => {
                slot.key.store(key, Ordering::Relaxed);
                return Some(slot);
            }
            EMPTY => return None,
            _ => i = (i + 1) & mask,
        }
    }
}

/// `write` on the word of key `k` (of hash `hash`), found in its shard of `tables` in a
/// reader section's shape ([`in_section`]).
#[inline(always)]
fn in_table_section(
    record: &AtomicU64,
    tables: &[HashTable<Entry>],
    shard: usize,
    hash: u64,
    k: u64,
    write: impl FnOnce(&AtomicU64) -> bool,
) -> bool {
    in_section(record, hash, || {
        let e = tables[shard]
            .find(hash, |e| e.key == k)
            .expect("every key is in");
        write(&e.word)
    })
}

/// `decide` in a reader section's shape: this thread's record stored (naming `hash`),
/// a full fence, the decision, the record cleared.
#[inline(always)]
fn in_section(record: &AtomicU64, hash: u64, decide: impl FnOnce() -> bool) -> bool {
    record.store(hash, Ordering::Relaxed);
    std::sync::atomic::fence(Ordering::SeqCst);
    let admitted = decide();
    record.store(0, Ordering::Release);
    admitted
}

/// One load and one CAS writing `now`: the floor's write.
fn cas(word: &AtomicU64, now: u64) -> bool {
    let cur = word.load(Ordering::Relaxed);
    word.compare_exchange(cur, now, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
}

/// One load, the exact token-bucket take of `cost_units` on it through the crate's public
/// pure functions (`Layout::refill`, then `Layout::take`), and a CAS storing the word the
/// take gives (none when refused): the floor's write with a token bucket's arithmetic.
/// No decision is built, no epoch or pass is checked, a lost CAS is not retried.
#[inline(always)]
fn take(layout: &Layout, cost_units: u64, word: &AtomicU64, now: u64) -> bool {
    let cur = word.load(Ordering::Relaxed);
    let snapshot = layout.refill(cur, layout.tick_of(now));
    layout.take(&snapshot, cost_units).is_some_and(|next| {
        word.compare_exchange(cur, next, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    })
}

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let filter = filter.as_str();
    let clock = QuantaClock::new();
    let hasher = KeyHasher::default();
    let shard = |hash: u64| ((hash >> (57 - SHARD_BITS)) & ((1 << SHARD_BITS) - 1)) as usize;

    // Every contender is built before any is measured; their runs are interleaved.
    let words: Vec<AtomicU64> = (0..1 << 18).map(|_| AtomicU64::new(0)).collect();
    // The same words holding token buckets of the limiter's policy (below), full at the
    // start, for the cases that take from them with the exact arithmetic.
    let policy = Policy::per_second(1000.0)
        .burst(100)
        .expect("a valid policy");
    let layout = *policy.layout();
    let one = layout
        .units_of(1)
        .expect("one token is within the capacity");
    let full = layout.start_word(layout.tick_of(clock.now_nanos()), true);
    let bucket_words: Vec<AtomicU64> = (0..1 << 18).map(|_| AtomicU64::new(full)).collect();
    let mut bucket_tables: Vec<HashTable<Entry>> =
        (0..1 << SHARD_BITS).map(|_| HashTable::new()).collect();
    let mut tables: Vec<HashTable<Entry>> =
        (0..1 << SHARD_BITS).map(|_| HashTable::new()).collect();
    let locked: Vec<ShardedLock<HashTable<Entry>>> = (0..1 << SHARD_BITS)
        .map(|_| ShardedLock::new(HashTable::new()))
        .collect();
    for key in 0..KEYS {
        let hash = hasher.hash_one(key);
        let rehash = |e: &Entry| hasher.hash_one(e.key);
        let entry = |word| Entry {
            key,
            word: AtomicU64::new(word),
        };
        tables[shard(hash)].insert_unique(hash, entry(0), rehash);
        bucket_tables[shard(hash)].insert_unique(hash, entry(full), rehash);
        locked[shard(hash)]
            .write()
            .expect("not poisoned")
            .insert_unique(hash, entry(0), rehash);
    }
    let slots: Vec<Slot> = (0..1 << SLOT_BITS)
        .map(|_| Slot {
            key: AtomicU64::new(EMPTY),
            word: AtomicU64::new(0),
        })
        .collect();
    for key in 0..KEYS {
        slot_of(&slots, hasher.hash_one(key), key, true);
    }
    // What a reader section adds to the bare lookup: a store of the thread's own record
    // and a full fence before the lookup (a writer's flag is then read: one more load).
    let record = crossbeam_utils::CachePadded::new(AtomicU64::new(0));
    let limiter = KeyedLimiter::<u64>::builder(policy, 1 << 20)
        .shards(1 << SHARD_BITS)
        .build()
        .expect("a valid map");
    for key in 0..KEYS {
        let _ = limiter.try_acquire(&key, 1);
    }
    // New keys: each call inserts one (the shard's write lock, the table growing), 2^20
    // keys into a map of 2^21, a fresh map per 2^20 calls.
    let fresh = std::cell::RefCell::new(None::<(KeyedLimiter<u64>, u64)>);
    let quota = governor::Quota::per_second(NonZeroU32::new(1000).expect("not zero"))
        .allow_burst(NonZeroU32::new(100).expect("not zero"));
    let governor = governor::RateLimiter::keyed(quota);
    for key in 0..KEYS {
        let _ = governor.check_key(&key);
    }

    let mut cases: Vec<Case<'_>> = Vec::new();
    case(
        &mut cases,
        filter,
        "floor: 2^18 hashed words, clock after the hash",
        |k| {
            let word = &words[(hasher.hash_one(k) >> 46) as usize];
            cas(word, clock.now_nanos())
        },
    );
    case(
        &mut cases,
        filter,
        "floor: 2^18 hashed words, clock first",
        |k| {
            let now = clock.now_nanos();
            cas(&words[(hasher.hash_one(k) >> 46) as usize], now)
        },
    );
    case(
        &mut cases,
        filter,
        "floor with the exact take (Layout::refill, take)",
        |k| {
            let word = &bucket_words[(hasher.hash_one(k) >> 46) as usize];
            take(&layout, one, word, clock.now_nanos())
        },
    );
    case(
        &mut cases,
        filter,
        "8 hashbrown shards, no lock, clock after the lookup",
        |k| {
            let hash = hasher.hash_one(k);
            let e = tables[shard(hash)]
                .find(hash, |e| e.key == k)
                .expect("every key is in");
            cas(&e.word, clock.now_nanos())
        },
    );
    case(
        &mut cases,
        filter,
        "8 hashbrown shards, no lock, clock first",
        |k| {
            let now = clock.now_nanos();
            let hash = hasher.hash_one(k);
            let e = tables[shard(hash)]
                .find(hash, |e| e.key == k)
                .expect("every key is in");
            cas(&e.word, now)
        },
    );
    case(
        &mut cases,
        filter,
        "8 hashbrown shards, store + SeqCst fence, clock after",
        |k| {
            let hash = hasher.hash_one(k);
            in_table_section(&record, &tables, shard(hash), hash, k, |w| {
                cas(w, clock.now_nanos())
            })
        },
    );
    case(
        &mut cases,
        filter,
        "8 hashbrown shards, store + fence, the exact take",
        |k| {
            let hash = hasher.hash_one(k);
            in_table_section(&record, &bucket_tables, shard(hash), hash, k, |w| {
                take(&layout, one, w, clock.now_nanos())
            })
        },
    );
    case(
        &mut cases,
        filter,
        "one-line table (key and word in a slot), no lock, clock after",
        |k| {
            let slot = slot_of(&slots, hasher.hash_one(k), k, false).expect("every key is in");
            cas(&slot.word, clock.now_nanos())
        },
    );
    case(
        &mut cases,
        filter,
        "one-line table, store + SeqCst fence, clock after",
        |k| {
            let hash = hasher.hash_one(k);
            in_section(&record, hash, || {
                let slot = slot_of(&slots, hash, k, false).expect("every key is in");
                cas(&slot.word, clock.now_nanos())
            })
        },
    );
    case(
        &mut cases,
        filter,
        "8 hashbrown shards, ShardedLock read, clock after the lookup",
        |k| {
            let hash = hasher.hash_one(k);
            let t = locked[shard(hash)].read().expect("not poisoned");
            let e = t.find(hash, |e| e.key == k).expect("every key is in");
            cas(&e.word, clock.now_nanos())
        },
    );
    case(
        &mut cases,
        filter,
        "8 hashbrown shards, ShardedLock read, clock first",
        |k| {
            let now = clock.now_nanos();
            let hash = hasher.hash_one(k);
            let t = locked[shard(hash)].read().expect("not poisoned");
            let e = t.find(hash, |e| e.key == k).expect("every key is in");
            cas(&e.word, now)
        },
    );
    case(
        &mut cases,
        filter,
        "tokengate KeyedLimiter::try_acquire",
        |k| matches!(limiter.try_acquire(&k, 1), Ok(d) if d.is_admitted()),
    );
    case(
        &mut cases,
        filter,
        "tokengate KeyedLimiter::try_acquire, result in black_box",
        |k| matches!(black_box(limiter.try_acquire(&k, 1)), Ok(d) if d.is_admitted()),
    );
    case(
        &mut cases,
        filter,
        "tokengate new keys (one insert per call, 2^20 keys)",
        |_| {
            let mut slot = fresh.borrow_mut();
            let (map, next) = slot.get_or_insert_with(|| {
                let map = KeyedLimiter::<u64>::builder(policy, 1 << 21)
                    .shards(1 << SHARD_BITS)
                    .build()
                    .expect("a valid map");
                (map, 0)
            });
            *next += 1;
            let admitted = matches!(map.try_acquire(next, 1), Ok(d) if d.is_admitted());
            if *next == 1 << 20 {
                *slot = None;
            }
            admitted
        },
    );
    case(&mut cases, filter, "governor keyed check_key", |k| {
        governor.check_key(&k).is_ok()
    });
    report(&mut cases);
}
