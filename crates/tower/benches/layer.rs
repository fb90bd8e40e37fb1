//! The layer's own cost per request: a tower `Service` called in a loop around a trivial
//! handler, with no network and no runtime (the future is polled once with a no-op
//! waker: the handler is ready at once), the way tower_governor is measured; tokengate's
//! layer and tower_governor's in the same run, on one thread and on two (each thread
//! with its own clone of the service, all clones paying the same buckets).
//!
//! - `bare`: the handler alone (the request is built, with its peer address, in every
//!   case): subtract it to get a layer's own cost.
//! - `global` / `per_ip` (one client address): admitting everything. tokengate with the
//!   admitted fields off (`quiet`, as tower_governor writes none) and on (`fields`).
//! - `refuse_global` / `refuse_per_ip`: refusing everything after the first request.
//!
//! ```text
//! cargo bench -p tokengate-tower --bench layer
//! cargo bench -p tokengate-tower --bench layer -- '1_thread'   # one thread only
//! # instructions per call, whatever the machine's load (n calls minus 0 calls, over n):
//! LAYER_CALLS=tokengate_per_ip_quiet:20000 valgrind --tool=callgrind target/release/deps/layer-*
//! ```

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
use tokengate::scope::{Rule, RuleSet, ScopeKind, WorkClass};
use tokengate::{Policy, ScopedLimiter};
use tokengate_tower::{Key, RateLimitLayer};
use tower::{Layer, Service};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::{GlobalKeyExtractor, PeerIpKeyExtractor};

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

fn tokengate(per_ip: bool, capacity: u64, rate: f64, fields: bool) -> RateLimitLayer {
    let policy = Policy::new(capacity, rate).expect("a valid policy");
    let mut rules = RuleSet::new().rule(ScopeKind::Global, Rule::new(policy));
    if per_ip {
        rules = rules.rule(ScopeKind::User, Rule::new(policy));
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
        b = b.key(ScopeKind::User, Key::client_ip());
    }
    b.build().expect("a valid layer")
}

/// Runs `svc`'s clones on `threads` threads, `iters` calls each: the wall time, so that
/// the figure is the time per call per thread.
fn run<S>(svc: &S, threads: usize, iters: u64, peer: SocketAddr) -> Duration
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send,
    S::Error: std::fmt::Debug,
{
    if threads == 1 {
        let mut s = svc.clone();
        let start = Instant::now();
        for _ in 0..iters {
            black_box(call(&mut s, peer));
        }
        return start.elapsed();
    }
    let barrier = Barrier::new(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let mut s = svc.clone();
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        black_box(call(&mut s, peer));
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

/// Every case: its name and its service, handed to `$each!(name, service)`.
macro_rules! cases {
    ($each:ident) => {{
        let admit = (1_000_000_000, 1_000_000_000.0);
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
            tokengate(false, admit.0, admit.1, false).layer(handler())
        );
        $each!(
            "tokengate_global_fields",
            tokengate(false, admit.0, admit.1, true).layer(handler())
        );
        $each!("governor_global", gov_global(true).layer(handler()));
        $each!(
            "tokengate_per_ip_quiet",
            tokengate(true, admit.0, admit.1, false).layer(handler())
        );
        $each!(
            "tokengate_per_ip_fields",
            tokengate(true, admit.0, admit.1, true).layer(handler())
        );
        $each!("governor_per_ip", gov_ip(true).layer(handler()));
        $each!(
            "tokengate_refuse_global",
            tokengate(false, refuse.0, refuse.1, true).layer(handler())
        );
        $each!("governor_refuse_global", gov_global(false).layer(handler()));
        $each!(
            "tokengate_refuse_per_ip",
            tokengate(true, refuse.0, refuse.1, true).layer(handler())
        );
        $each!("governor_refuse_per_ip", gov_ip(false).layer(handler()));
    }};
}

const PEER: &str = "192.0.2.7:40000";

fn layer(c: &mut Criterion) {
    let peer: SocketAddr = PEER.parse().unwrap();
    for threads in [1, 2] {
        let mut g = c.benchmark_group(format!("layer_{threads}_thread"));
        g.warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_millis(1200))
            .sample_size(20);
        macro_rules! case {
            ($name:expr, $svc:expr) => {{
                let svc = $svc;
                // The first call pays the new key (and leaves a refusing bucket empty).
                black_box(call(&mut svc.clone(), peer));
                g.bench_function($name, |b| {
                    b.iter_custom(|iters| run(&svc, threads, iters, peer))
                });
            }};
        }
        cases!(case);
        g.finish();
    }
}

/// `LAYER_CALLS=case:n`: calls case `case` `n` times after one first call, and exits;
/// for an instruction count that the machine's load does not move
/// (`valgrind --tool=callgrind`, `n` and 0 calls: the difference over `n`).
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
                for _ in 0..n {
                    black_box(call(&mut svc, peer));
                }
            }
        }};
    }
    cases!(one);
    assert!(found, "no case {name}");
}

criterion_group!(benches, layer);

fn main() {
    if let Ok(spec) = std::env::var("LAYER_CALLS") {
        count(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
