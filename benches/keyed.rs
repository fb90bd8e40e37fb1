//! Keyed lookups and per-scope counters, with governor's keyed limiter in the same run.
//!
//! ```text
//! cargo bench --bench keyed
//! ```
//!
//! - `keyed_100k/*`: one `try_acquire(key, 1)` on a map of 100,000 `u64` keys (policy:
//!   burst 100, 1000/s), keys picked uniformly at random from a precomputed sequence.
//!   tokengate with its default hasher (aHash), with std's SipHash, with foldhash, with
//!   counters on, governor's `check_key` (DashMap, SipHash), and the keyed floor (2^18
//!   atomic words indexed by the key's aHash, one TSC read, one load, one CAS).
//! - `global_counters/*`: a scoped limiter with only the global scope, counters on or off,
//!   on one thread and on N threads at once (N from `TOKENGATE_THREADS`, 1 to 1024,
//!   default: all cores), admitting and rejecting (a rejection writes nothing to the
//!   bucket, so there the counter is the only write); and admitting with the global
//!   scope leased to per-core slots (`Rule::leased`), in the same run.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use tokengate::{
    Clock, KeyedLimiter, Policy, QuantaClock, ScopedLimiter, leased::LeaseConfig, scope::Request,
    scope::Rule, scope::RuleSet, scope::ScopeKind, scope::WorkClass,
};

mod common;

const KEYS: u64 = 100_000;
/// Random key indexes, precomputed so the generator is not measured.
const PICKS: usize = 1 << 16;

fn picks() -> Vec<u64> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..PICKS)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d) % KEYS
        })
        .collect()
}

fn keyed_100k(c: &mut Criterion) {
    let policy = Policy::new(100, 1000.0).unwrap();
    let picks = picks();
    let mut g = c.benchmark_group("keyed_100k");

    let default = KeyedLimiter::<u64>::new(policy, 1 << 20).unwrap();
    let sip = KeyedLimiter::<u64>::builder(policy, 1 << 20)
        .hasher(std::hash::RandomState::new())
        .build()
        .unwrap();
    let fold = KeyedLimiter::<u64>::builder(policy, 1 << 20)
        .hasher(foldhash::fast::RandomState::default())
        .build()
        .unwrap();
    let counted = KeyedLimiter::<u64>::builder(policy, 1 << 20)
        .counters(true)
        .build()
        .unwrap();
    let quota = governor::Quota::per_second(NonZeroU32::new(1000).unwrap())
        .allow_burst(NonZeroU32::new(100).unwrap());
    let gov = governor::RateLimiter::keyed(quota);
    for k in 0..KEYS {
        default.try_acquire(&k, 1).unwrap();
        sip.try_acquire(&k, 1).unwrap();
        fold.try_acquire(&k, 1).unwrap();
        counted.try_acquire(&k, 1).unwrap();
        let _ = gov.check_key(&k);
    }

    let mut i = 0usize;
    let mut next = move || {
        i = (i + 1) & (PICKS - 1);
        picks[i]
    };
    g.bench_function("tokengate_ahash_default", |b| {
        b.iter(|| default.try_acquire(black_box(&next()), 1).unwrap())
    });
    g.bench_function("tokengate_siphash", |b| {
        b.iter(|| sip.try_acquire(black_box(&next()), 1).unwrap())
    });
    g.bench_function("tokengate_foldhash", |b| {
        b.iter(|| fold.try_acquire(black_box(&next()), 1).unwrap())
    });
    g.bench_function("tokengate_siphash_counters", |b| {
        b.iter(|| counted.try_acquire(black_box(&next()), 1).unwrap())
    });
    g.bench_function("governor_keyed", |b| {
        b.iter(|| gov.check_key(black_box(&next())).is_ok())
    });
    // The keyed floor: a word picked by the key's hash (no key stored or compared), one
    // TSC read, one load, one CAS.
    let words: Vec<AtomicU64> = (0..1 << 18).map(|_| AtomicU64::new(0)).collect();
    let hasher = tokengate::keyed::KeyHasher::default();
    let clock = QuantaClock::new();
    g.bench_function("floor_hashed_words", |b| {
        b.iter(|| {
            let word = &words[(hasher.hash_one(black_box(next())) >> 46) as usize];
            let now = clock.now_nanos();
            let cur = word.load(Ordering::Relaxed);
            word.compare_exchange(cur, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        })
    });
    g.finish();
}

fn global_only(counters: bool, capacity: u64, rate: f64, leased: bool) -> ScopedLimiter {
    let mut rule = Rule::new(Policy::new(capacity, rate).unwrap()).counters(counters);
    if leased {
        rule = rule.leased(LeaseConfig::new());
    }
    RuleSet::new()
        .rule(ScopeKind::Global, rule)
        .class(WorkClass::new("metadata", 1))
        .build()
        .unwrap()
}

/// `iters` acquisitions split across `threads` threads started together; the wall time.
fn run_threads(l: &ScopedLimiter, threads: u64, iters: u64) -> Duration {
    let class = l.class("metadata").unwrap();
    let r = Request::new();
    let barrier = std::sync::Barrier::new(threads as usize + 1);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                barrier.wait();
                for _ in 0..iters / threads {
                    // A thread preempted twice between its clock reading and its CAS can
                    // see `ClockWentBackwards` on a loaded machine; count it as refused.
                    black_box(l.try_acquire(&r, class).is_ok_and(|d| d.is_admitted()));
                }
            });
        }
        barrier.wait();
        let start = Instant::now();
        // Scoped threads are joined when the scope ends; time until then.
        start
    })
    .elapsed()
}

fn global_counters(c: &mut Criterion) {
    let threads = common::max_threads() as u64;
    let mut g = c.benchmark_group("global_counters");
    for (name, capacity, rate) in [("admit", 1_000_000, 1e9), ("reject", 1, 1e-3)] {
        for counters in [false, true] {
            let l = global_only(counters, capacity, rate, false);
            if name == "reject" {
                run_threads(&l, 1, 1); // drain the single token
            }
            let on = if counters { "on" } else { "off" };
            g.bench_function(format!("{name}_counters_{on}_1_thread"), |b| {
                b.iter_custom(|iters| run_threads(&l, 1, iters))
            });
            g.bench_function(format!("{name}_counters_{on}_{threads}_threads"), |b| {
                b.iter_custom(|iters| run_threads(&l, threads, iters))
            });
        }
    }
    for counters in [false, true] {
        let l = global_only(counters, 1_000_000, 1e9, true);
        let on = if counters { "on" } else { "off" };
        g.bench_function(format!("admit_leased_counters_{on}_1_thread"), |b| {
            b.iter_custom(|iters| run_threads(&l, 1, iters))
        });
        g.bench_function(
            format!("admit_leased_counters_{on}_{threads}_threads"),
            |b| b.iter_custom(|iters| run_threads(&l, threads, iters)),
        );
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = keyed_100k, global_counters
}
// `criterion_main!` with one step first: a bad TOKENGATE_THREADS is refused before
// anything is measured, not after the keyed group.
fn main() {
    common::max_threads();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
