//! One-thread cost per call, robust to a busy machine: each case runs many short batches
//! (2000 calls, tens of microseconds) and reports the 5th percentile (and the median) of
//! the batch means, so batches hit by preemption or a neighbour's burst drop out. The
//! cases chosen run interleaved, one batch of each per round from a start that moves each
//! round (`common::in_turn`), so that the ones compared meet the same machine: compare
//! ratios of one run. A complement to `benches/engine.rs` (criterion reports the median
//! of much longer samples).
//!
//! ```text
//! cargo bench --bench percentile                   # every case, about 2 s
//! cargo bench --bench percentile -- tg_reject gov_reject
//! PERCENTILE_BATCHES=20 valgrind --tool=callgrind target/release/deps/percentile-* tg_admit
//! ```
//!
//! Same regimes as `benches/engine.rs`: admit = 1e9 tokens/s, burst 1e6; reject = 1
//! token/s, burst 1 (drained first); `leased_*` are the same regimes on a
//! `LeasedBucket` (default slots and lease size; `leased_slot_admit` is a bucket of 2^36
//! tokens on a frozen `ManualClock`, so that every call but a few lease trips is paid
//! from the slot: the local path alone, the same count under valgrind whatever the
//! timing; `leased_reject_16` is `leased_reject` on 16 slots, as on a 16-core machine);
//! `keyed_admit` and `keyed_reject` decide on existing keys of a `KeyedLimiter` (1,024
//! keys taken in turn, the map reconfigured once; admit: burst 1e6 refilling at 1
//! token/s, so that no key is full and evicted; reject: the reject regime);
//! `scoped_global` is a `ScopedLimiter` with
//! only a global rule of the admit policy, paid by a request with no identity;
//! `scoped_tenant` adds a tenant rule of the same policy and a request naming one tenant;
//! `scoped_3` is a leased global rule (default lease) with tenant and user rules, all of
//! the admit policy, paid by a request naming one tenant and one user, and
//! `scoped_3_users` is `scoped_3` paid by one of 100 tenants and one of 100,000 users
//! picked at random (the map's keys out of the cache, as with many clients);
//! `multi3_scoped_peer` is `acquire_all` over the same three buckets bare (a
//! `LeasedBucket` of the default lease and two `Bucket`s, as `&dyn Member`).
//! Every result passes through `black_box` whole. Each contender is called through a
//! function of its own that is never inlined (`tg_decide`, `gov_decide`, ...);
//! `gov_admit_inline` and `gov_reject_inline` call governor straight from the case, as
//! before, since which shape LLVM compiles better for governor varies.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use governor::{DefaultDirectRateLimiter, NotUntil, RateLimiter};
use tokengate::keyed::KeyedError;
use tokengate::multi::Member;
use tokengate::scope::{Request, TenantId, UserId};
use tokengate::{
    AcquireError, Bucket, Clock, CoarseClock, Decision, Inherit, KeyedLimiter, LeasedBucket,
    LiveBucket, ManualClock, Policy, QuantaClock, acquire_all,
};

mod common;
#[path = "../crates/cli/src/mutex_bucket.rs"]
mod mutex_bucket;

const BATCH: u32 = 2000;

/// A named case: one call of the operation measured.
type Case<'a> = (&'static str, Box<dyn FnMut() + 'a>);

/// One decision of each contender in a function of its own, never inlined into a case:
/// each library's code is inlined into its wrapper alone (one call site), so that what
/// is measured does not depend on how LLVM happens to inline into the many cases of
/// `main` (it inlined governor's `check` into one binary's cases and not into the next
/// one's, 63 against 107 instructions for the same source). Every contender pays the
/// same one call.
#[inline(never)]
fn tg_decide(bucket: &Bucket, cost: u64) -> Result<Decision, AcquireError> {
    bucket.try_acquire(cost)
}

/// [`tg_decide`] on the coarse clock.
#[inline(never)]
fn tg_coarse_decide(bucket: &Bucket<CoarseClock>, cost: u64) -> Result<Decision, AcquireError> {
    bucket.try_acquire(cost)
}

/// [`tg_decide`] on a `LeasedBucket`.
#[inline(never)]
fn leased_decide(bucket: &LeasedBucket, cost: u64) -> Result<Decision, AcquireError> {
    bucket.try_acquire(cost)
}

/// [`tg_decide`] on a `LeasedBucket` on the coarse clock.
#[inline(never)]
fn leased_coarse_decide(
    bucket: &LeasedBucket<CoarseClock>,
    cost: u64,
) -> Result<Decision, AcquireError> {
    bucket.try_acquire(cost)
}

/// [`tg_decide`] on a `LiveBucket`.
#[inline(never)]
fn live_decide(bucket: &LiveBucket, cost: u64) -> Result<Decision, AcquireError> {
    bucket.try_acquire(cost)
}

/// [`tg_decide`] on an existing key of a `KeyedLimiter`.
#[inline(never)]
fn keyed_decide(map: &KeyedLimiter<u64>, key: u64, cost: u64) -> Result<Decision, KeyedError> {
    map.try_acquire(&key, cost)
}

/// governor's decision, as [`tg_decide`] is tokengate's.
#[inline(never)]
fn gov_decide(
    limiter: &DefaultDirectRateLimiter,
) -> Result<(), NotUntil<governor::clock::QuantaInstant>> {
    limiter.check()
}

/// The mean nanoseconds per call of one batch of `call`.
fn batch_nanos(call: &mut dyn FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..BATCH {
        call();
    }
    start.elapsed().as_nanos() as f64 / f64::from(BATCH)
}

/// The 5th percentile and the median of each case's `batches` batch means, the cases'
/// batches interleaved (one batch of each per round, `batches` rounds, in the order of
/// [`common::in_turn`]), so that every case meets the same machine: on a shared virtual
/// machine the speed of the same code moves by 30% from one second to the next, and
/// cases timed one after the other would compare different machines.
fn interleaved(batches: usize, calls: &mut [&mut dyn FnMut()]) -> Vec<(f64, f64)> {
    let count = calls.len();
    let mut means: Vec<Vec<f64>> = calls.iter().map(|_| Vec::with_capacity(batches)).collect();
    for round in 0..batches {
        for j in 0..count {
            let i = common::in_turn(round, j, count);
            means[i].push(batch_nanos(&mut *calls[i]));
        }
    }
    means.into_iter().map(common::p5_median).collect()
}

/// Keys of `keyed_admit` and `keyed_reject`.
const KEYED_KEYS: u64 = 1024;

/// Users of `scoped_3_users`.
const USERS: u64 = 100_000;

/// The request of user `u`, of tenant `u % 100`.
fn user_request(u: u64) -> Request {
    Request::new().tenant(TenantId(u % 100)).user(UserId(u))
}

/// A number below `n` from a xorshift64 state (the `bench` subcommand's key generator).
fn random_below(state: &mut u64, n: u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    ((u128::from(x) * u128::from(n)) >> 64) as u64
}

/// `PERCENTILE_BATCHES` (1 to 1,000,000), or 3000.
fn batches() -> usize {
    common::env_count("PERCENTILE_BATCHES", 1_000_000, || 3000)
}

fn main() {
    let batches = batches();
    // `cargo bench` passes `--bench`; any other argument selects cases by exact name.
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let admit = || Policy::new(1_000_000, 1e9).expect("valid policy");
    let reject = || Policy::new(1, 1.0).expect("valid policy");
    let quota = |r: u32, b: u32| {
        governor::Quota::per_second(r.try_into().unwrap()).allow_burst(b.try_into().unwrap())
    };

    let clock = QuantaClock::new();
    let coarse = CoarseClock::new().expect("coarse clock");
    let word = AtomicU64::new(0);
    let tg_admit = Bucket::new(admit());
    let (scoped_global, one, _) = common::scoped::global(admit());
    let (scoped_tenant, tenant_one, tenant_request) = common::scoped::tenant(admit());
    let (scoped_3, three_one, three_request) = common::scoped::three(admit());
    // `scoped_3` with its keys spread: one of 100 tenants and one of 100,000 users (each
    // user of one tenant) picked at random per request, every user in its map first.
    // (Filled only when the case runs: 100,000 insertions.)
    let (scoped_3_users, users_one, _) = common::scoped::three(admit());
    if only.is_empty() || only.iter().any(|o| o == "scoped_3_users") {
        for u in 0..USERS {
            let _ = scoped_3_users.try_acquire(&user_request(u), users_one);
        }
    }
    let mut users_rng = 0x9e37_79b9_7f4a_7c15_u64;
    let peer_global = LeasedBucket::new(admit());
    let peer_tenant = Bucket::new(admit());
    let peer_user = Bucket::new(admit());
    let tg_reject = Bucket::new(reject());
    let _ = tg_reject.try_acquire(1);
    // Reconfigured once, so that every decision goes through a replaced epoch's successor.
    let live_admit = LiveBucket::new(admit());
    live_admit.reconfigure(admit(), Inherit::AsIs);
    let live_reject = LiveBucket::new(reject());
    live_reject.reconfigure(reject(), Inherit::AsIs);
    let _ = live_reject.try_acquire(1);
    let coarse_admit = Bucket::with_clock(admit(), coarse.clone());
    let coarse_reject = Bucket::with_clock(reject(), coarse.clone());
    let _ = coarse_reject.try_acquire(1);
    let gov_admit = RateLimiter::direct(quota(1_000_000_000, 1_000_000));
    let gov_reject = RateLimiter::direct(quota(1, 1));
    let _ = gov_reject.check();
    let mutex_admit = mutex_bucket::MutexBucket::new(1e6, 1e9);
    let scopes = [(); 3].map(|_| Bucket::new(admit()));
    let leased_admit = LeasedBucket::new(admit());
    let leased_coarse_admit = LeasedBucket::with_clock(admit(), coarse.clone());
    let leased_reject = LeasedBucket::new(reject());
    let _ = leased_reject.try_acquire(1);
    let leased_coarse_reject = LeasedBucket::with_clock(reject(), coarse.clone());
    let _ = leased_coarse_reject.try_acquire(1);
    let sixteen = tokengate::leased::LeaseConfig::new().slots(16);
    let leased_reject_16 = LeasedBucket::with_config(reject(), QuantaClock::new(), sixteen)
        .expect("valid lease config");
    let _ = leased_reject_16.try_acquire(1);
    // 1,024 keys, each in the map (the reject map's drained), reconfigured once; the
    // cases cycle over them. The admitting map refills at 1 token/s from a burst of
    // 1e6, so that no key is ever full (a full one is evicted when others come).
    let keyed_policy = || Policy::new(1_000_000, 1.0).expect("valid policy");
    let keyed_admit = KeyedLimiter::<u64>::new(keyed_policy(), 1 << 12).expect("valid map");
    let keyed_reject = KeyedLimiter::<u64>::new(reject(), 1 << 12).expect("valid map");
    keyed_admit.reconfigure(keyed_policy(), Inherit::AsIs);
    keyed_reject.reconfigure(reject(), Inherit::AsIs);
    for k in 0..KEYED_KEYS {
        let _ = keyed_admit.try_acquire(&k, 1);
        let _ = keyed_reject.try_acquire(&k, 1);
    }
    let keyed_next = std::cell::Cell::new(0u64);
    let keyed_key = || {
        let k = keyed_next.get();
        keyed_next.set((k + 1) % KEYED_KEYS);
        k
    };
    let leased_slot_admit = LeasedBucket::with_clock(
        Policy::new(1 << 36, 1.0).expect("valid policy"),
        ManualClock::new(),
    );

    let mut cases: Vec<Case<'_>> = vec![
        (
            "floor_admit",
            Box::new(|| {
                let now = clock.now_nanos();
                let cur = word.load(Ordering::Relaxed);
                let _ = black_box(word.compare_exchange(
                    cur,
                    now,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ));
            }),
        ),
        (
            "floor_reject",
            Box::new(|| {
                let now = clock.now_nanos();
                black_box(word.load(Ordering::Relaxed) > now);
            }),
        ),
        (
            "quanta_read",
            Box::new(|| {
                black_box(black_box(&clock).now_nanos());
            }),
        ),
        (
            "coarse_read",
            Box::new(|| {
                black_box(black_box(&coarse).now_nanos());
            }),
        ),
        (
            "tg_admit",
            Box::new(|| {
                let _ = black_box(tg_decide(black_box(&tg_admit), 1));
            }),
        ),
        (
            "keyed_admit",
            Box::new(|| {
                let _ = black_box(keyed_decide(black_box(&keyed_admit), keyed_key(), 1));
            }),
        ),
        (
            "keyed_reject",
            Box::new(|| {
                let _ = black_box(keyed_decide(black_box(&keyed_reject), keyed_key(), 1));
            }),
        ),
        (
            "live_admit",
            Box::new(|| {
                let _ = black_box(live_decide(black_box(&live_admit), 1));
            }),
        ),
        (
            "live_reject",
            Box::new(|| {
                let _ = black_box(live_decide(black_box(&live_reject), 1));
            }),
        ),
        (
            "scoped_global",
            Box::new(|| {
                let _ = black_box(black_box(&scoped_global).try_acquire(&Request::new(), one));
            }),
        ),
        (
            "scoped_tenant",
            Box::new(|| {
                let _ =
                    black_box(black_box(&scoped_tenant).try_acquire(&tenant_request, tenant_one));
            }),
        ),
        (
            "gov_admit",
            Box::new(|| {
                let _ = black_box(gov_decide(black_box(&gov_admit)));
            }),
        ),
        (
            "coarse_admit",
            Box::new(|| {
                let _ = black_box(tg_coarse_decide(black_box(&coarse_admit), 1));
            }),
        ),
        (
            "mutex_admit",
            Box::new(|| {
                black_box(black_box(&mutex_admit).try_acquire(1.0));
            }),
        ),
        (
            "tg_reject",
            Box::new(|| {
                let _ = black_box(tg_decide(black_box(&tg_reject), 1));
            }),
        ),
        (
            "gov_reject_inline",
            Box::new(|| {
                let _ = black_box(black_box(&gov_reject).check());
            }),
        ),
        (
            "gov_admit_inline",
            Box::new(|| {
                let _ = black_box(black_box(&gov_admit).check());
            }),
        ),
        (
            "gov_reject",
            Box::new(|| {
                let _ = black_box(gov_decide(black_box(&gov_reject)));
            }),
        ),
        (
            "coarse_reject",
            Box::new(|| {
                let _ = black_box(tg_coarse_decide(black_box(&coarse_reject), 1));
            }),
        ),
        (
            "leased_admit",
            Box::new(|| {
                let _ = black_box(leased_decide(black_box(&leased_admit), 1));
            }),
        ),
        (
            "leased_coarse_admit",
            Box::new(|| {
                let _ = black_box(leased_coarse_decide(black_box(&leased_coarse_admit), 1));
            }),
        ),
        (
            "leased_reject",
            Box::new(|| {
                let _ = black_box(leased_decide(black_box(&leased_reject), 1));
            }),
        ),
        (
            "leased_coarse_reject",
            Box::new(|| {
                let _ = black_box(leased_coarse_decide(black_box(&leased_coarse_reject), 1));
            }),
        ),
        (
            "leased_reject_16",
            Box::new(|| {
                let _ = black_box(leased_decide(black_box(&leased_reject_16), 1));
            }),
        ),
        (
            "leased_slot_admit",
            Box::new(|| {
                let _ = black_box(black_box(&leased_slot_admit).try_acquire(1));
            }),
        ),
        (
            "multi3",
            Box::new(|| {
                let set = [(&scopes[0], 1), (&scopes[1], 1), (&scopes[2], 1)];
                let _ = black_box(acquire_all(black_box(&set)));
            }),
        ),
        (
            "scoped_3",
            Box::new(|| {
                let _ = black_box(black_box(&scoped_3).try_acquire(&three_request, three_one));
            }),
        ),
        (
            "scoped_3_users",
            Box::new(|| {
                let request = user_request(random_below(&mut users_rng, USERS));
                let _ = black_box(black_box(&scoped_3_users).try_acquire(&request, users_one));
            }),
        ),
        (
            "multi3_scoped_peer",
            Box::new(|| {
                let set: [(&dyn Member, u64); 3] =
                    [(&peer_global, 1), (&peer_tenant, 1), (&peer_user, 1)];
                let _ = black_box(acquire_all(black_box(&set)));
            }),
        ),
    ];
    let mut chosen: Vec<(&'static str, &mut dyn FnMut())> = cases
        .iter_mut()
        .filter(|(name, _)| only.is_empty() || only.iter().any(|o| o == name))
        .map(|(name, call)| (*name, &mut **call as &mut dyn FnMut()))
        .collect();
    let names: Vec<&str> = chosen.iter().map(|(n, _)| *n).collect();
    let mut calls: Vec<&mut dyn FnMut()> = chosen.iter_mut().map(|(_, c)| &mut **c).collect();
    println!("{:<20} {:>10} {:>10}", "case", "p5 ns", "median ns");
    for (name, (p5, median)) in names.iter().zip(interleaved(batches, &mut calls)) {
        println!("{name:<20} {p5:10.2} {median:10.2}");
    }
}
