//! tokengate side by side with its peers, in one process and the same groups, so every
//! figure has a ratio beside it:
//!
//! - `single_admit`, `single_reject`: one thread, one bucket; tokengate on the TSC and
//!   the coarse clock, its `LeasedBucket` (TSC, and the coarse clock for the
//!   rejection), governor `check()`/`check_n()` on its default quanta clock, a
//!   `Mutex`-protected `f64` bucket, and the floor: one clock read through the same path
//!   `QuantaClock` uses plus one load and one uncontended CAS (admit), or one clock read
//!   plus one load (reject).
//! - `multi_3_scopes`: `acquire_all` over 3 buckets (one clock read for the set) beside a
//!   single admit.
//! - `scoped`: a `ScopedLimiter` request paying the global scope alone beside one
//!   `Bucket::try_acquire`, one paying the global scope and a tenant (the whole decision,
//!   `scoped_2`, and its verdict, `scoped_2_verdict`) beside `acquire_all` over two
//!   buckets, and one paying a leased global scope, a tenant and a user beside
//!   `acquire_all` over the same kinds of buckets, bare.
//! - `contention_admit`, `contention_reject`: ONE shared bucket; `contention_keyed`: one
//!   keyed limiter over 100,000 `u64` keys picked uniformly at random (tokengate's and
//!   governor's); every thread count from 1 to N (`TOKENGATE_THREADS`, 1 to 1024, default
//!   all cores; another value stops the run);
//!   aggregate throughput (`Throughput::Elements`, one element per decision). One-thread
//!   keyed lookups with more variants (hashers, counters) are in `benches/keyed.rs`.
//!
//! Regimes (the same as the figures measured before tokengate existed): admit = 1e9
//! tokens/s, burst 1e6; reject = 1 token/s, burst 1; keyed = 1000/s, burst 100 per key.
//!
//! ```text
//! cargo bench --bench engine                       # everything: 134 s on 2 cores
//! cargo bench --bench engine -- 'single_|multi_|scoped'   # one-thread figures only
//! TOKENGATE_THREADS=4 cargo bench --bench engine -- contention_
//! ```
//!
//! The whole run is 25 one-thread benchmarks plus 14 per thread count, about 3 s each
//! (0.5 s warm-up, 2 s of samples, analysis): 134 s measured on 2 cores before the
//! `scoped` group's four and the three `LeasedBucket` rows (build not counted), so about
//! 12 minutes on 16 cores;
//! `TOKENGATE_THREADS` bounds it.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group};
use governor::RateLimiter;
use tokengate::multi::Member;
use tokengate::{Bucket, Clock, CoarseClock, LeasedBucket, Policy, QuantaClock, acquire_all};

#[path = "../crates/cli/src/mutex_bucket.rs"]
mod mutex_bucket;

#[path = "../crates/cli/src/engines.rs"]
#[allow(dead_code)]
mod engines;

mod common;

use common::max_threads;
use engines::{Engine, Limiter, Regime, Visit};
use mutex_bucket::MutexBucket;

fn policy(regime: Regime) -> Policy {
    regime.policy().expect("the regimes are valid policies")
}

/// One quanta TSC read through the path `QuantaClock` uses, then one load and one
/// uncontended CAS: the least any admission on one atomic word can cost.
fn floor_admit(clock: &QuantaClock, word: &AtomicU64) -> bool {
    let now = clock.now_nanos();
    let cur = word.load(Ordering::Relaxed);
    word.compare_exchange(cur, now, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
}

/// One clock read and one load: the least a read-only rejection can cost.
fn floor_reject(clock: &QuantaClock, word: &AtomicU64) -> bool {
    let now = clock.now_nanos();
    word.load(Ordering::Relaxed) > now
}

fn single_admit(c: &mut Criterion) {
    let mut g = c.benchmark_group("single_admit");
    g.throughput(Throughput::Elements(1));
    let clock = QuantaClock::new();
    let word = AtomicU64::new(0);
    g.bench_function("floor", |b| {
        b.iter(|| floor_admit(black_box(&clock), &word))
    });

    let bucket = Bucket::new(policy(Regime::Admit));
    g.bench_function("tokengate", |b| {
        b.iter(|| black_box(&bucket).try_acquire(1))
    });

    let coarse = Bucket::with_clock(policy(Regime::Admit), CoarseClock::new().unwrap());
    g.bench_function("tokengate_coarse", |b| {
        b.iter(|| black_box(&coarse).try_acquire(1))
    });

    let leased = LeasedBucket::new(policy(Regime::Admit));
    g.bench_function("leased", |b| b.iter(|| black_box(&leased).try_acquire(1)));

    let gov = RateLimiter::direct(Regime::Admit.quota());
    g.bench_function("governor_check", |b| b.iter(|| black_box(&gov).check()));
    let one = NonZeroU32::MIN;
    g.bench_function("governor_check_n", |b| {
        b.iter(|| black_box(&gov).check_n(one))
    });

    let mutex = MutexBucket::new(1e6, 1e9);
    g.bench_function("mutex", |b| b.iter(|| black_box(&mutex).try_acquire(1.0)));
    g.finish();

    // The floor's parts, for reading the figures above.
    let mut g = c.benchmark_group("floor_parts");
    g.bench_function("quanta_read", |b| b.iter(|| black_box(&clock).now_nanos()));
    g.bench_function("load_cas", |b| {
        b.iter(|| {
            let cur = word.load(Ordering::Relaxed);
            word.compare_exchange(cur, cur + 1, Ordering::Relaxed, Ordering::Relaxed)
        })
    });
    let coarse_clock = CoarseClock::new().unwrap();
    g.bench_function("coarse_read", |b| {
        b.iter(|| black_box(&coarse_clock).now_nanos())
    });
    g.finish();
}

fn single_reject(c: &mut Criterion) {
    let mut g = c.benchmark_group("single_reject");
    g.throughput(Throughput::Elements(1));
    let clock = QuantaClock::new();
    let word = AtomicU64::new(u64::MAX);
    g.bench_function("floor", |b| {
        b.iter(|| floor_reject(black_box(&clock), &word))
    });

    let bucket = Bucket::new(policy(Regime::Reject));
    let _ = bucket.try_acquire(1);
    g.bench_function("tokengate", |b| {
        b.iter(|| black_box(&bucket).try_acquire(1))
    });

    let coarse = Bucket::with_clock(policy(Regime::Reject), CoarseClock::new().unwrap());
    let _ = coarse.try_acquire(1);
    g.bench_function("tokengate_coarse", |b| {
        b.iter(|| black_box(&coarse).try_acquire(1))
    });

    let leased = LeasedBucket::new(policy(Regime::Reject));
    let _ = leased.try_acquire(1);
    g.bench_function("leased", |b| b.iter(|| black_box(&leased).try_acquire(1)));
    let leased_coarse =
        LeasedBucket::with_clock(policy(Regime::Reject), CoarseClock::new().unwrap());
    let _ = leased_coarse.try_acquire(1);
    g.bench_function("leased_coarse", |b| {
        b.iter(|| black_box(&leased_coarse).try_acquire(1))
    });

    let gov = RateLimiter::direct(Regime::Reject.quota());
    let _ = gov.check();
    g.bench_function("governor_check", |b| b.iter(|| black_box(&gov).check()));
    let one = NonZeroU32::MIN;
    g.bench_function("governor_check_n", |b| {
        b.iter(|| black_box(&gov).check_n(one))
    });

    let mutex = MutexBucket::new(1.0, 1.0);
    let _ = mutex.try_acquire(1.0);
    g.bench_function("mutex", |b| b.iter(|| black_box(&mutex).try_acquire(1.0)));
    g.finish();
}

fn multi_3_scopes(c: &mut Criterion) {
    let mut g = c.benchmark_group("multi_3_scopes");
    let [global, tenant, route] = [(); 3].map(|_| Bucket::new(policy(Regime::Admit)));
    g.bench_function("single_admit", |b| {
        b.iter(|| black_box(&global).try_acquire(1))
    });
    g.bench_function("acquire_all", |b| {
        b.iter(|| acquire_all(black_box(&[(&global, 1), (&tenant, 1), (&route, 1)])))
    });
    // Three independent checks: not all-or-nothing, for scale only.
    let govs = [(); 3].map(|_| RateLimiter::direct(Regime::Admit.quota()));
    g.bench_function("governor_3_checks", |b| {
        b.iter(|| {
            let g = black_box(&govs);
            (g[0].check(), g[1].check(), g[2].check())
        })
    });
    g.finish();
}

/// The scoped request path against the buckets it pays, bare: a global-only request
/// beside one `Bucket::try_acquire`, and a request paying a leased global scope, a
/// tenant and a user (keys in their maps) beside `acquire_all` over a `LeasedBucket`
/// and two `Bucket`s as `&dyn Member` (the same three buckets, no lookup).
fn scoped(c: &mut Criterion) {
    let mut g = c.benchmark_group("scoped");
    let admit = || policy(Regime::Admit);
    let one = Bucket::new(admit());
    g.bench_function("single_admit", |b| {
        b.iter(|| black_box(&one).try_acquire(1))
    });
    let (global, global_one, anonymous) = common::scoped::global(admit());
    g.bench_function("scoped_global", |b| {
        b.iter(|| black_box(&global).try_acquire(black_box(&anonymous), global_one))
    });
    // A global + tenant decision (a tenant key in its map), whole and as a verdict,
    // beside `acquire_all` over two buckets.
    let (two, two_one, tenant_request) = common::scoped::tenant(admit());
    g.bench_function("scoped_2", |b| {
        b.iter(|| black_box(&two).try_acquire(black_box(&tenant_request), two_one))
    });
    g.bench_function("scoped_2_verdict", |b| {
        b.iter(|| black_box(&two).try_acquire_verdict(black_box(&tenant_request), two_one))
    });
    let (global_b, tenant_b) = (Bucket::new(admit()), Bucket::new(admit()));
    g.bench_function("acquire_all_2", |b| {
        b.iter(|| acquire_all(black_box(&[(&global_b, 1), (&tenant_b, 1)])))
    });
    let (three, three_one, request) = common::scoped::three(admit());
    g.bench_function("scoped_3", |b| {
        b.iter(|| black_box(&three).try_acquire(black_box(&request), three_one))
    });
    let (leased, tenant, user) = (
        LeasedBucket::new(admit()),
        Bucket::new(admit()),
        Bucket::new(admit()),
    );
    g.bench_function("acquire_all_3", |b| {
        b.iter(|| {
            let set: [(&dyn Member, u64); 3] = [(&leased, 1), (&tenant, 1), (&user, 1)];
            acquire_all(black_box(&set))
        })
    });
    g.finish();
}

/// Registers one contention benchmark for a built engine.
struct Contend<'a, 'b> {
    group: &'a mut BenchmarkGroup<'b, WallTime>,
    id: BenchmarkId,
    threads: usize,
}

impl Visit for Contend<'_, '_> {
    type Out = ();
    fn visit<L: Limiter>(self, limiter: &L) {
        let threads = self.threads;
        self.group.bench_function(self.id, |b| {
            b.iter_custom(|ops| engines::run_ops(limiter, threads, ops))
        });
    }
}

/// Every engine that runs in `regime`, on ONE shared limiter, at every thread count.
fn contention(c: &mut Criterion, regime: Regime) {
    let mut g = c.benchmark_group(format!("contention_{}", regime.name()));
    g.throughput(Throughput::Elements(1));
    for threads in 1..=max_threads() {
        for engine in Engine::ALL
            .into_iter()
            .filter(|e| e.regimes().contains(&regime))
        {
            let contend = Contend {
                group: &mut g,
                id: BenchmarkId::new(engine.name(), threads),
                threads,
            };
            engine
                .visit(regime, contend)
                .expect("every listed engine builds");
        }
    }
    g.finish();
}

fn contention_all(c: &mut Criterion) {
    engines::warm_clocks();
    for regime in Regime::ALL {
        contention(c, regime);
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = single_admit, single_reject, multi_3_scopes, scoped, contention_all
}
// `criterion_main!` with one step first: a bad TOKENGATE_THREADS is refused before
// anything is measured, not after the one-thread groups.
fn main() {
    max_threads();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
