//! A per-client-address scope on a server that records no peer address: every request
//! is answered 500 and the cause logged, never served unlimited.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use tokengate::scope::{Rule, RuleSet, ScopeKind, WorkClass};
use tokengate::{ManualClock, Policy};
use tokengate_tower::{Key, RateLimitLayer};

use tracing::Level;

use crate::observability::Capture;
use crate::support::{client, get as fetch, serve_without_peer};

#[tokio::test] // current-thread: the server's tasks see this thread's subscriber
async fn a_client_ip_scope_without_connect_info_answers_500_and_never_serves_unlimited() {
    // See `tracing_records`: a second dispatcher makes every callsite ask this test's.
    let _anchor = tracing::Dispatch::new(Capture::default());
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    tracing::callsite::rebuild_interest_cache();
    let limiter = Arc::new(
        RuleSet::new()
            .rule(ScopeKind::User, Rule::new(Policy::new(3, 1.0).unwrap()))
            .class(WorkClass::new("metadata", 1))
            .build_with_clock(ManualClock::new())
            .unwrap(),
    );
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .key(ScopeKind::User, Key::client_ip())
        .default_class("metadata")
        .build()
        .unwrap();
    let stats = layer.clone();
    // `into_make_service`, not `into_make_service_with_connect_info`.
    let addr = serve_without_peer(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    let c = client();
    for i in 0..7 {
        let r = fetch(&c, addr, "/", &[]).await;
        assert_eq!(
            r.status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "request {i}: {r:?}"
        );
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
    }
    assert_eq!(stats.stats().no_peer_address[ScopeKind::User as usize], 7);
    // Nothing was served, nothing paid.
    assert_eq!(limiter.len(ScopeKind::User), 0);
    // One ERROR event naming the fix, not one per request.
    let events = capture.0.lock().unwrap().clone();
    let errors: Vec<_> = events.iter().filter(|e| e.0 == Level::ERROR).collect();
    assert_eq!(errors.len(), 1, "{events:?}");
    let message = &errors[0].2.iter().find(|(k, _)| k == "message").unwrap().1;
    assert!(
        message.contains("into_make_service_with_connect_info"),
        "{message}"
    );
}

#[tokio::test]
async fn per_ip_served_without_connect_info_answers_500_and_serves_nothing() {
    let served = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&served);
    let layer = RateLimitLayer::per_ip(Policy::new(2, 0.001).unwrap()).unwrap();
    let stats = layer.clone();
    let addr = serve_without_peer(
        Router::new()
            .route(
                "/",
                get(move || {
                    seen.fetch_add(1, Ordering::Relaxed);
                    async { "ok" }
                }),
            )
            .layer(layer),
    )
    .await;
    let c = client();
    let statuses: Vec<u16> = {
        let mut v = Vec::new();
        for _ in 0..7 {
            v.push(fetch(&c, addr, "/", &[]).await.status.as_u16());
        }
        v
    };
    assert_eq!(statuses, [500; 7]);
    assert_eq!(served.load(Ordering::Relaxed), 0);
    assert_eq!(stats.stats().no_peer_address[ScopeKind::Client], 7);
    assert_eq!(stats.stats().missing_key[ScopeKind::Client], 0);
}
