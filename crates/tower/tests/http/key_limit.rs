//! A full key map: the client the limiter has no room for gets `503` with
//! `Retry-After`, never a bare 429.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use tokengate::scope::{Rule, RuleSet, ScopeKind, WorkClass};
use tokengate::{ManualClock, Policy};
use tokengate_tower::{Key, RateLimitLayer};

use crate::support::{client_from, get as fetch, serve};

#[tokio::test]
async fn the_51st_client_of_a_map_of_50_gets_503_with_retry_after() {
    // 5 tokens, 0.5 per second: an emptied bucket fills in 10 s. The clock stands
    // still, so the 50 clients' buckets (each one token short) never become evictable.
    let limiter = Arc::new(
        RuleSet::new()
            .rule(
                ScopeKind::User,
                Rule::new(Policy::new(5, 0.5).unwrap())
                    .max_keys(50)
                    .shards(1),
            )
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
    let addr = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    // 50 clients, each from its own loopback address: admitted, each with its fields.
    for i in 0..50u8 {
        let c = client_from(IpAddr::V4(Ipv4Addr::new(127, 0, 1, i + 1)));
        let ok = fetch(&c, addr, "/", &[]).await;
        assert_eq!(ok.status, StatusCode::OK, "client {i}");
    }
    assert_eq!(limiter.len(ScopeKind::User), 50);
    let c = client_from(IpAddr::V4(Ipv4Addr::new(127, 0, 1, 51)));
    let full = fetch(&c, addr, "/", &[]).await;
    assert_eq!(full.status, StatusCode::SERVICE_UNAVAILABLE, "{full:?}");
    assert_eq!(full.header("retry-after"), Some("10"), "{full:?}");
    assert_eq!(
        full.header("content-type"),
        Some("application/problem+json")
    );
    assert!(full.body.contains(r#""status":503"#), "{}", full.body);
    // No quota of this client was spent: no RateLimit fields to report.
    assert!(full.header("ratelimit").is_none(), "{full:?}");
    assert_eq!(stats.stats().key_limit[ScopeKind::User as usize], 1);
    // A known client is still served.
    let known = client_from(IpAddr::V4(Ipv4Addr::new(127, 0, 1, 1)));
    assert_eq!(fetch(&known, addr, "/", &[]).await.status, StatusCode::OK);
}
