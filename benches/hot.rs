//! Hot buckets under contention: `LeasedBucket` against `Bucket` and governor, in the
//! same run and the same admit regime (1e9 tokens/s, burst 1e6: every request is
//! admitted, so this measures the admission path).
//!
//! `cargo bench --bench hot`. Thread sweep 1..=N, N from `TOKENGATE_THREADS` (1 to 1024,
//! default: all cores; another value stops the run). Multi-threaded figures are aggregate decisions per second (criterion's
//! `thrpt`, in elements/s) of N threads hammering one shared limiter.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::{Barrier, LazyLock};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group};
use governor::clock::QuantaUpkeepClock;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use tokengate::{Bucket, Clock, CoarseClock, LeasedBucket, Policy, QuantaClock};

mod common;

use common::max_threads;

const CAPACITY: u64 = 1_000_000;
const RATE: f64 = 1e9;

fn policy() -> Policy {
    Policy::new(CAPACITY, RATE).expect("valid policy")
}

fn quota() -> Quota {
    Quota::per_second(NonZeroU32::new(RATE as u32).unwrap())
        .allow_burst(NonZeroU32::new(CAPACITY as u32).unwrap())
}

fn governor() -> governor::DefaultDirectRateLimiter {
    RateLimiter::direct(quota())
}

/// governor on its coarse clock (quanta's upkeep time, 1 ms), the peer of
/// `LeasedBucket<CoarseClock>` (which keeps an upkeep thread of its own, at the same
/// interval).
static UPKEEP: LazyLock<QuantaUpkeepClock> = LazyLock::new(|| {
    QuantaUpkeepClock::from_interval(tokengate::clock::COARSE_INTERVAL).expect("upkeep thread")
});

type CoarseGovernor = RateLimiter<NotKeyed, InMemoryState, QuantaUpkeepClock>;

fn coarse_governor() -> CoarseGovernor {
    RateLimiter::direct_with_clock(quota(), UPKEEP.clone())
}

fn coarse() -> CoarseClock {
    CoarseClock::new().expect("upkeep thread")
}

/// A shared limiter as the benchmark drives it: one admission attempt.
trait Admit: Sync {
    fn admit(&self) -> bool;
}

impl<C: Clock> Admit for LeasedBucket<C> {
    #[inline]
    fn admit(&self) -> bool {
        self.try_acquire(1).is_ok_and(|d| d.is_admitted())
    }
}

impl<C: Clock> Admit for Bucket<C> {
    #[inline]
    fn admit(&self) -> bool {
        self.try_acquire(1).is_ok_and(|d| d.is_admitted())
    }
}

impl Admit for governor::DefaultDirectRateLimiter {
    #[inline]
    fn admit(&self) -> bool {
        self.check().is_ok()
    }
}

impl Admit for CoarseGovernor {
    #[inline]
    fn admit(&self) -> bool {
        self.check().is_ok()
    }
}

fn single(c: &mut Criterion) {
    let mut g = c.benchmark_group("single_thread_admit");
    g.throughput(Throughput::Elements(1));
    let leased = LeasedBucket::new(policy());
    let coarse = LeasedBucket::with_clock(policy(), coarse());
    let bucket = Bucket::new(policy());
    let gov = governor();
    let coarse_gov = coarse_governor();
    g.bench_function("LeasedBucket<QuantaClock>", |b| {
        b.iter(|| black_box(leased.admit()))
    });
    g.bench_function("LeasedBucket<CoarseClock>", |b| {
        b.iter(|| black_box(coarse.admit()))
    });
    g.bench_function("Bucket<QuantaClock>", |b| {
        b.iter(|| black_box(bucket.admit()))
    });
    g.bench_function("governor_check", |b| b.iter(|| black_box(gov.admit())));
    g.bench_function("governor_check<QuantaUpkeepClock>", |b| {
        b.iter(|| black_box(coarse_gov.admit()))
    });
    g.finish();
}

/// `n` threads, each making `iters` attempts on `limiter`; the wall time of the slowest.
fn hammer(limiter: &dyn Admit, n: usize, iters: u64) -> Duration {
    let start_line = Barrier::new(n + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let start_line = &start_line;
                s.spawn(move || {
                    start_line.wait();
                    let start = Instant::now();
                    let mut admitted = 0u64;
                    for _ in 0..iters {
                        admitted += u64::from(limiter.admit());
                    }
                    black_box(admitted);
                    start.elapsed()
                })
            })
            .collect();
        start_line.wait();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .max()
            .unwrap_or_default()
    })
}

fn contended(c: &mut Criterion) {
    let limiters: Vec<(&str, Box<dyn Admit>)> = vec![
        (
            "LeasedBucket<QuantaClock>",
            Box::new(LeasedBucket::new(policy())),
        ),
        (
            "LeasedBucket<CoarseClock>",
            Box::new(LeasedBucket::with_clock(policy(), coarse())),
        ),
        (
            "Bucket<QuantaClock>",
            Box::new(Bucket::with_clock(policy(), QuantaClock::new())),
        ),
        ("governor_check", Box::new(governor())),
        (
            "governor_check<QuantaUpkeepClock>",
            Box::new(coarse_governor()),
        ),
    ];
    for n in 1..=max_threads() {
        let mut g = c.benchmark_group(format!("threads_{n}"));
        g.throughput(Throughput::Elements(n as u64));
        for (name, limiter) in &limiters {
            g.bench_function(*name, |b| {
                b.iter_custom(|iters| hammer(limiter.as_ref(), n, iters))
            });
        }
        g.finish();
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = config();
    targets = single, contended
}
// `criterion_main!` with one step first: a bad TOKENGATE_THREADS is refused before
// anything is measured, not after the one-thread groups.
fn main() {
    max_threads();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
