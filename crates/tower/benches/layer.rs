//! The layer's own cost per request: a tower `Service` called in a loop around a trivial
//! handler, with no network and no runtime (the future is polled once with a no-op
//! waker: the handler is ready at once), the way tower_governor is measured; tokengate's
//! layer and tower_governor's in the same run, on one thread and on two (each thread
//! with its own clone of the service, all clones paying the same buckets).
//!
//! - `bare`: the handler alone (the request is built, with its peer address, in every
//!   case): subtract it to get a layer's own cost.
//! - `global`, `per_ip` (one client address; the client-address scope alone, as
//!   `RateLimitLayer::per_ip` builds it and as tower_governor's `PeerIpKeyExtractor`
//!   limits), `global_ip` (a global scope and a per-address one, both paid): admitting
//!   everything. tokengate with the admitted fields off (`quiet`, as tower_governor
//!   writes none) and on (`fields`).
//! - `refuse_global` / `refuse_per_ip`: refusing everything after the first request.
//! - `engine_scoped_2` (the verdict the layer takes), `engine_scoped_2_decision` (the
//!   whole decision) and `engine_acquire_all_2`: a global + tenant scoped request, no
//!   layer, beside `acquire_all` over two bare buckets (the engine's `scoped` group's
//!   pair, here so that one run gives every ratio of the HTTP goals).
//!
//! ```text
//! cargo bench -p tokengate-tower --bench layer
//! cargo bench -p tokengate-tower --bench layer -- '1_thread'   # one thread only
//! # instructions per call, whatever the machine's load (the n calls alone, over n):
//! LAYER_CALLS=tokengate_per_ip_quiet:20000 valgrind --tool=callgrind \
//!     --toggle-collect='layer::repeat*' target/release/deps/layer-*
//! # every case that way, then the goals' ratios (and criterion's, from its last run):
//! crates/tower/benches/ratios.sh
//! # time robust to a busy machine (cases interleaved batch by batch; the 5th percentile
//! # and median of 2,000-call batch means, and each case minus bare), 1 or 2 threads:
//! LAYER_PERCENTILE=bare,tokengate_per_ip_quiet,governor_per_ip target/release/deps/layer-*
//! LAYER_THREADS=2 LAYER_PERCENTILE=bare,tokengate_per_ip_quiet,governor_per_ip target/release/deps/layer-*
//! ```
//!
//! The goals' ratios (`ratios.sh` prints them): (a) the layer's own cost per admitted
//! request (the case minus `bare`) over tower_governor's, global and per IP, at most
//! 1.0; (b) tower_governor's refusal over tokengate's (whole calls), at least 10;
//! (c) `engine_scoped_2` over `engine_acquire_all_2`, at most 1.25.

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use criterion::{Criterion, criterion_group};
use http::{Request, Response};
use tokengate::scope::{Request as ScopedRequest, Rule, RuleSet, ScopeKind, TenantId, WorkClass};
use tokengate::{Bucket, Policy, ScopedLimiter, acquire_all};
use tokengate_tower::{Key, RateLimitLayer};
use tower::{Layer, Service};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::{GlobalKeyExtractor, PeerIpKeyExtractor};

// The benches' shared helpers (counts from the environment, the interleaved order and
// its statistics), with the engine's benches.
#[path = "../../../benches/common/mod.rs"]
mod common;

type Handler = tower::util::ServiceFn<
    fn(Request<Body>) -> std::future::Ready<Result<Response<Body>, Infallible>>,
>;

fn handler() -> Handler {
    fn answer(_: Request<Body>) -> std::future::Ready<Result<Response<Body>, Infallible>> {
        std::future::ready(Ok(Response::new(Body::empty())))
    }
    tower::service_fn(answer as fn(_) -> _)
}

fn request(peer: SocketAddr) -> Request<Body> {
    let mut req = Request::new(Body::empty());
    req.extensions_mut().insert(ConnectInfo(peer));
    req
}

/// Calls `svc` once and polls its future to the end (the handler is ready at once).
#[inline(always)]
fn call<S>(svc: &mut S, peer: SocketAddr) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>>,
    S::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    let Poll::Ready(Ok(())) = svc.poll_ready(&mut cx) else {
        panic!("the service is ready");
    };
    let fut = pin!(svc.call(request(peer)));
    match fut.poll(&mut cx) {
        Poll::Ready(r) => r.expect("the call succeeds"),
        Poll::Pending => panic!("the trivial handler answers at once"),
    }
}

/// Which scopes a tokengate layer of the benchmark pays.
#[derive(Clone, Copy)]
enum Scopes {
    Global,
    PerIp,
    GlobalAndIp,
}

fn tokengate(scopes: Scopes, capacity: u64, rate: f64, fields: bool) -> RateLimitLayer {
    let policy = Policy::new(capacity, rate).expect("a valid policy");
    let mut rules = RuleSet::new();
    if matches!(scopes, Scopes::Global | Scopes::GlobalAndIp) {
        rules = rules.rule(ScopeKind::Global, Rule::new(policy));
    }
    let per_ip = matches!(scopes, Scopes::PerIp | Scopes::GlobalAndIp);
    if per_ip {
        rules = rules.rule(ScopeKind::Client, Rule::new(policy));
    }
    let limiter: Arc<ScopedLimiter> = Arc::new(
        rules
            .class(WorkClass::new("hello", 1))
            .build()
            .expect("valid rules"),
    );
    let mut b = RateLimitLayer::builder(limiter)
        .default_class("hello")
        .admitted_headers(fields);
    if per_ip {
        b = b.key(ScopeKind::Client, Key::client_ip().ipv6_prefix(64));
    }
    b.build().expect("a valid layer")
}

/// Runs `$body` (with `$state`, made per thread by `$make`) `$iters` times on each of
/// `$threads` threads (the calling thread alone for one): the wall time, so that the
/// figure is the time per call per thread.
macro_rules! timed {
    ($threads:expr, $iters:expr, $make:expr, |$state:ident| $body:expr) => {{
        let (threads, iters): (usize, u64) = ($threads, $iters);
        if threads == 1 {
            #[allow(unused_mut)]
            let mut $state = $make;
            let start = Instant::now();
            for _ in 0..iters {
                let _ = black_box($body);
            }
            start.elapsed()
        } else {
            let barrier = Barrier::new(threads);
            std::thread::scope(|scope| {
                let handles: Vec<_> = (0..threads)
                    .map(|_| {
                        #[allow(unused_mut)]
                        let mut $state = $make;
                        let barrier = &barrier;
                        scope.spawn(move || {
                            barrier.wait();
                            let start = Instant::now();
                            for _ in 0..iters {
                                let _ = black_box($body);
                            }
                            start.elapsed()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap())
                    .max()
                    .unwrap()
            })
        }
    }};
}

/// The engine's pair: a global + tenant limiter, its class and request (the tenant's key
/// in its map), and two bare buckets; every policy admitting everything.
fn engine() -> (
    ScopedLimiter,
    tokengate::scope::ClassId,
    ScopedRequest,
    [Bucket; 2],
) {
    let policy = Policy::new(ADMIT.0, ADMIT.1).expect("a valid policy");
    let limiter = RuleSet::new()
        .rule(ScopeKind::Global, Rule::new(policy))
        .rule(ScopeKind::Tenant, Rule::new(policy))
        .class(WorkClass::new("one", 1))
        .build()
        .expect("valid rules");
    let one = limiter.class("one").expect("the class");
    let request = ScopedRequest::new().tenant(TenantId(1));
    assert!(
        limiter
            .try_acquire(&request, one)
            .expect("decided")
            .is_admitted()
    );
    (
        limiter,
        one,
        request,
        [Bucket::new(policy), Bucket::new(policy)],
    )
}

/// Every engine case: `$each!(name, |state| one call)`.
macro_rules! engine_cases {
    ($each:ident, $e:expr) => {{
        let (limiter, one, request, [g, t]) = $e;
        let (limiter, request, g, t) = (&limiter, &request, &g, &t);
        $each!("engine_scoped_2", |_s| limiter
            .try_acquire_verdict(black_box(&request), one)
            .map(|v| v.is_admitted()));
        $each!("engine_scoped_2_decision", |_s| limiter
            .try_acquire(black_box(&request), one)
            .map(|d| d.is_admitted()));
        $each!("engine_acquire_all_2", |_s| acquire_all(black_box(&[
            (g, 1),
            (t, 1)
        ]))
        .map(|d| d.is_admitted()));
    }};
}

/// Every case: its name and its service, handed to `$each!(name, service)`.
macro_rules! cases {
    ($each:ident) => {{
        let admit = ADMIT;
        let refuse = (1, 0.000_001);
        let gov = |per_ns: bool| {
            let mut b = GovernorConfigBuilder::default();
            if per_ns {
                b.per_nanosecond(1).burst_size(u32::MAX);
            } else {
                b.per_second(1_000_000).burst_size(1);
            }
            b
        };
        let gov_global = |per_ns| {
            GovernorLayer::new(
                gov(per_ns)
                    .key_extractor(GlobalKeyExtractor)
                    .finish()
                    .expect("a valid governor config"),
            )
        };
        let gov_ip = |per_ns| {
            GovernorLayer::new(
                gov(per_ns)
                    .key_extractor(PeerIpKeyExtractor)
                    .finish()
                    .expect("a valid governor config"),
            )
        };
        $each!("bare", handler());
        $each!(
            "tokengate_global_quiet",
            tokengate(Scopes::Global, admit.0, admit.1, false).layer(handler())
        );
        $each!(
            "tokengate_global_fields",
            tokengate(Scopes::Global, admit.0, admit.1, true).layer(handler())
        );
        $each!("governor_global", gov_global(true).layer(handler()));
        $each!(
            "tokengate_per_ip_quiet",
            tokengate(Scopes::PerIp, admit.0, admit.1, false).layer(handler())
        );
        $each!(
            "tokengate_per_ip_fields",
            tokengate(Scopes::PerIp, admit.0, admit.1, true).layer(handler())
        );
        $each!(
            "tokengate_global_ip_quiet",
            tokengate(Scopes::GlobalAndIp, admit.0, admit.1, false).layer(handler())
        );
        $each!(
            "tokengate_global_ip_fields",
            tokengate(Scopes::GlobalAndIp, admit.0, admit.1, true).layer(handler())
        );
        $each!("governor_per_ip", gov_ip(true).layer(handler()));
        $each!(
            "tokengate_refuse_global",
            tokengate(Scopes::Global, refuse.0, refuse.1, true).layer(handler())
        );
        $each!("governor_refuse_global", gov_global(false).layer(handler()));
        $each!(
            "tokengate_refuse_per_ip",
            tokengate(Scopes::PerIp, refuse.0, refuse.1, true).layer(handler())
        );
        $each!("governor_refuse_per_ip", gov_ip(false).layer(handler()));
    }};
}

const PEER: &str = "192.0.2.7:40000";

/// The policy of the cases that admit everything: a billion tokens refilled at a
/// thousand a second, which no run spends (criterion's longest makes a few million
/// calls). The refill is slow so that every call takes the same path through the
/// bucket whatever the time between calls (a bucket refilled to full between two calls
/// takes a shorter one): the instruction counts then do not move with the machine's
/// load, which sets that time under callgrind.
const ADMIT: (u64, f64) = (1_000_000_000, 1_000.0);

fn layer(c: &mut Criterion) {
    let peer: SocketAddr = PEER.parse().unwrap();
    for threads in [1, 2] {
        let mut group = c.benchmark_group(format!("layer_{threads}_thread"));
        group
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_millis(1200))
            .sample_size(20);
        macro_rules! case {
            ($name:expr, $svc:expr) => {{
                let svc = $svc;
                // The first call pays the new key (and leaves a refusing bucket empty).
                black_box(call(&mut svc.clone(), peer));
                group.bench_function($name, |b| {
                    b.iter_custom(|iters| {
                        timed!(threads, iters, svc.clone(), |s| call(&mut s, peer))
                    })
                });
            }};
        }
        cases!(case);
        macro_rules! engine_case {
            ($name:expr, |$s:ident| $body:expr) => {{
                group.bench_function($name, |b| {
                    b.iter_custom(|iters| timed!(threads, iters, (), |$s| $body))
                });
            }};
        }
        engine_cases!(engine_case, engine());
        group.finish();
    }
}

/// `LAYER_CALLS=case:n`: calls case `case` `n` times after one first call, and exits;
/// for an instruction count that the machine's load does not move
/// (`valgrind --tool=callgrind --toggle-collect='layer::repeat*'`: over `n`).
fn count(spec: &str) {
    let (name, n) = spec.split_once(':').expect("LAYER_CALLS=case:n");
    let n: u64 = n.parse().expect("a number of calls");
    let peer: SocketAddr = PEER.parse().unwrap();
    let mut found = false;
    macro_rules! one {
        ($name:expr, $svc:expr) => {{
            if $name == name {
                found = true;
                let mut svc = $svc;
                black_box(call(&mut svc, peer));
                repeat(n, || {
                    black_box(call(&mut svc, peer));
                });
            }
        }};
    }
    cases!(one);
    macro_rules! engine_one {
        ($name:expr, |$s:ident| $body:expr) => {{
            if $name == name {
                found = true;
                let $s = ();
                let _ = black_box($body);
                repeat(n, || {
                    let _ = black_box($body);
                });
            }
        }};
    }
    engine_cases!(engine_one, engine());
    assert!(found, "no case {name}");
}

/// `LAYER_PERCENTILE=case,case,...` (the service cases, not the `engine_*` ones): time
/// robust to a busy machine, on `LAYER_THREADS` threads (default 1; each thread with its
/// own clone of every case's service, all clones paying the same buckets, as in the
/// criterion groups). Each case runs `LAYER_BATCHES` (default 400) rounds of one
/// 2,000-call batch per case, the cases in turn from a start that moves by one each round,
/// so that they meet the same machine and none always follows the same other; on several
/// threads every thread runs the same batch at once (a barrier before each), and the
/// batch's time is the slowest thread's. Printed per case: the 5th percentile and the
/// median of the batch means (ns per call per thread); with `bare` listed, also the case's
/// own cost, each figure minus bare's. Preempted or disturbed batches drop out of the 5th
/// percentile (a difference taken round by round would not: its low tail is the rounds
/// where bare's batch was disturbed); compare ratios of one run.
fn percentile(spec: &str) {
    const BATCH: u32 = 2000;
    let rounds = common::env_count("LAYER_BATCHES", 1_000_000, || 400);
    let threads = common::env_count("LAYER_THREADS", 64, || 1);
    let names: Vec<&str> = spec.split(',').map(str::trim).collect();
    let peer: SocketAddr = PEER.parse().unwrap();
    // One batch of a case on one thread: its calls, timed, in a loop compiled for its
    // service.
    type Batch = Box<dyn FnMut(u32) -> Duration + Send>;
    let mut listed: Vec<&str> = Vec::new();
    let mut per_thread: Vec<Vec<Batch>> = (0..threads).map(|_| Vec::new()).collect();
    macro_rules! one {
        ($name:expr, $svc:expr) => {{
            if let Some(&name) = names.iter().find(|n| **n == $name) {
                let svc = $svc;
                // The first call pays the new key.
                black_box(call(&mut svc.clone(), peer));
                listed.push(name);
                for batches in per_thread.iter_mut() {
                    let mut svc = svc.clone();
                    batches.push(Box::new(move |n| {
                        let start = Instant::now();
                        for _ in 0..n {
                            black_box(call(&mut svc, peer));
                        }
                        start.elapsed()
                    }));
                }
            }
        }};
    }
    cases!(one);
    for name in &names {
        assert!(listed.contains(name), "no case {name}");
    }
    let count = listed.len();
    // Every thread walks the same schedule: a few rounds of warm-up, not kept, then the
    // rounds, each batch started together.
    let barrier = Barrier::new(threads);
    let times: Vec<Vec<Vec<Duration>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = per_thread
            .into_iter()
            .map(|mut batches| {
                let barrier = &barrier;
                scope.spawn(move || {
                    for _ in 0..20 {
                        for batch in batches.iter_mut() {
                            barrier.wait();
                            black_box(batch(BATCH));
                        }
                    }
                    // times[i][r]: case i's batch in round r on this thread.
                    let mut times = vec![Vec::with_capacity(rounds); count];
                    for round in 0..rounds {
                        for j in 0..count {
                            let i = common::in_turn(round, j, count);
                            barrier.wait();
                            times[i].push(batches[i](BATCH));
                        }
                    }
                    times
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // A batch's mean per call: its slowest thread's time over the batch's calls.
    let means: Vec<Vec<f64>> = (0..count)
        .map(|i| {
            (0..rounds)
                .map(|r| {
                    let slowest = times.iter().map(|t| t[i][r]).max().unwrap();
                    slowest.as_nanos() as f64 / f64::from(BATCH)
                })
                .collect()
        })
        .collect();
    let stats: Vec<(f64, f64)> = means.into_iter().map(common::p5_median).collect();
    let bare = listed.iter().position(|n| *n == "bare").map(|b| stats[b]);
    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>9}   ns per call per thread, {threads} thread(s), \
         {rounds} rounds of {BATCH}",
        "case", "p5", "median", "own p5", "own med"
    );
    for (name, (p5, med)) in listed.iter().zip(&stats) {
        let own = |v: f64, b: f64| format!("{:.1}", v - b);
        let (op5, omed) = match bare {
            Some((b5, bm)) if *name != "bare" => (own(*p5, b5), own(*med, bm)),
            _ => (String::new(), String::new()),
        };
        println!("{name:<28} {p5:>9.1} {med:>9.1} {op5:>9} {omed:>9}");
    }
}

/// Runs `f` `n` times: the one function whose instructions `ratios.sh` counts
/// (`--toggle-collect`), so that building the service, the clock's calibration and the
/// first call (a new key, the thread's first pin) are left out.
#[inline(never)]
fn repeat(n: u64, mut f: impl FnMut()) {
    for _ in 0..n {
        f();
    }
}

criterion_group!(benches, layer);

fn main() {
    if let Ok(spec) = std::env::var("LAYER_CALLS") {
        count(&spec);
        return;
    }
    if let Ok(spec) = std::env::var("LAYER_PERCENTILE") {
        percentile(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
