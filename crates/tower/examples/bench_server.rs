//! A hello-world axum server for the loopback benchmark (`crates/tower/bench.sh`): no
//! limiter, tokengate's layer (global + per-IP scopes), or tower_governor's (per-IP), each
//! either admitting every request or refusing (nearly) every one.
//!
//! `cargo run --release -p tokengate-tower --example bench_server -- MODE PORT`, MODE one
//! of `none`, `tokengate`, `tokengate-quiet`, `governor`, `tokengate-refuse`,
//! `governor-refuse`; or `inproc MODE...` to call the app in process (no sockets).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use tokengate::scope::{Rule, RuleSet, ScopeKind, WorkClass};
use tokengate::{Policy, ScopedLimiter};
use tokengate_tower::{Key, RateLimitLayer};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

fn tokengate(capacity: u64, rate: f64, admitted_fields: bool) -> RateLimitLayer {
    let policy = Policy::new(capacity, rate).expect("a valid policy");
    let limiter: Arc<ScopedLimiter> = Arc::new(
        RuleSet::new()
            .rule(ScopeKind::Global, Rule::new(policy))
            .rule(ScopeKind::User, Rule::new(policy)) // per client IP
            .class(WorkClass::new("hello", 1))
            .build()
            .expect("valid rules"),
    );
    RateLimitLayer::builder(limiter)
        .key(ScopeKind::User, Key::client_ip().ipv6_prefix(64))
        .default_class("hello")
        .admitted_headers(admitted_fields)
        .build()
        .expect("a valid layer")
}

fn app(mode: &str) -> Router {
    let app = Router::new().route("/", get(|| async { "Hello, World!" }));
    match mode {
        "none" => app,
        // Far more than loopback can ask for: every request is admitted.
        "tokengate" => app.layer(tokengate(1_000_000_000, 1_000_000_000.0, true)),
        // The same without the RateLimit fields on admitted responses (tower_governor
        // writes none by default).
        "tokengate-quiet" => app.layer(tokengate(1_000_000_000, 1_000_000_000.0, false)),
        // One token, then one per 1000 s: every request after the first is refused.
        "tokengate-refuse" => app.layer(tokengate(1, 0.001, true)),
        "governor" => {
            let config = GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(u32::MAX)
                .finish()
                .expect("a valid governor config");
            app.layer(GovernorLayer::new(config))
        }
        "governor-refuse" => {
            let config = GovernorConfigBuilder::default()
                .per_second(1000)
                .burst_size(1)
                .finish()
                .expect("a valid governor config");
            app.layer(GovernorLayer::new(config))
        }
        other => panic!("unknown mode {other:?}"),
    }
}

/// `inproc MODE`: the app called in process (no sockets), to isolate the layer's own
/// cost per request from the network stack's.
async fn in_process(mode: &str) {
    use tower::ServiceExt;
    let app = app(mode);
    let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
    let n = 200_000;
    let start = std::time::Instant::now();
    for _ in 0..n {
        let mut req = http::Request::new(axum::body::Body::empty());
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        let res = app.clone().oneshot(req).await.unwrap();
        std::hint::black_box(res);
    }
    let per = start.elapsed() / n;
    println!("{mode}: {per:?} per request, in process");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "none".to_owned());
    if mode == "inproc" {
        for m in args {
            in_process(&m).await;
        }
        return;
    }
    let port: u16 = args.next().and_then(|p| p.parse().ok()).unwrap_or(3001);
    let app = app(&mode);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the port is free");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
    .expect("the server runs");
}
