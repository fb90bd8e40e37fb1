//! A fleet-wide scope in Redis (feature `redis`, `RemoteScope`) behind the layer, on a
//! real axum server and the real Redis (`TOKENGATE_REDIS_URL`, else 127.0.0.1:6379): a
//! remote refusal is a 429 with `Retry-After` that gives the local tokens back, and a
//! stalled Redis answers its requests by the fail mode while the runtime's one thread keeps
//! serving requests that do not pay the remote scope.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use tokengate::scope::{Rule, RuleSet, Scope, ScopeKind, TenantId, WorkClass};
use tokengate::{ManualClock, Policy, ScopedLimiter};
use tokengate_redis::{AsyncRedisScopes, FailMode, PoolConfig, RemotePolicy};
use tokengate_testkit::net::{BlackHole, redis_url};
use tokengate_tower::{Key, LayerError, RateLimitLayer, RemoteScope};

use crate::support::{client, get as fetch, serve};

fn namespace(test: &str) -> String {
    tokengate_testkit::net::namespace(&format!("t-tower-{test}"))
}

fn limiter() -> Arc<ScopedLimiter<ManualClock>> {
    Arc::new(
        RuleSet::new()
            .rule(
                ScopeKind::Global,
                Rule::new(Policy::new(1000, 1.0).unwrap()),
            )
            .rule(ScopeKind::Tenant, Rule::new(Policy::new(100, 1.0).unwrap()))
            .class(WorkClass::new("metadata", 1))
            .build_with_clock(ManualClock::new())
            .unwrap(),
    )
}

fn layer(
    limiter: &Arc<ScopedLimiter<ManualClock>>,
    remote: RemoteScope,
) -> RateLimitLayer<ManualClock> {
    RateLimitLayer::builder(Arc::clone(limiter))
        .key(ScopeKind::Tenant, Key::header("x-tenant"))
        .key_secret(*b"one-fleet-secret")
        .remote(remote)
        .build()
        .unwrap()
}

fn app(layer: RateLimitLayer<ManualClock>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

#[tokio::test]
async fn a_remote_refusal_is_a_429_with_retry_after_and_gives_the_local_tokens_back() {
    let config = PoolConfig::new(redis_url(), namespace("refuse"));
    let redis = Arc::new(AsyncRedisScopes::connect(config).await.unwrap());
    // Three requests per tenant across the fleet, refilled at a milli-token per second.
    let remote = RemoteScope::new(
        redis,
        ScopeKind::Tenant,
        RemotePolicy::new(3, 0.001).unwrap(),
    )
    .unwrap();
    let limiter = limiter();
    let layer = layer(&limiter, remote);
    let acme = Scope::Tenant(TenantId(layer.key_id("acme")));
    let addr = serve(app(layer)).await;
    let http = client();
    for _ in 0..3 {
        let r = fetch(&http, addr, "/", &[("x-tenant", "acme")]).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
    }
    let r = fetch(&http, addr, "/", &[("x-tenant", "acme")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    let retry_after: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(retry_after >= 1, "{r:?}");
    assert!(r.body.contains("rate limited by scope"), "{}", r.body);
    // The refused request's local tokens came back: three spent, not four.
    assert_eq!(limiter.available(&Scope::Global), Some(997.0));
    assert_eq!(limiter.available(&acme), Some(97.0));
    // Another tenant has its own fleet-wide bucket.
    let r = fetch(&http, addr, "/", &[("x-tenant", "globex")]).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
}

// The default test runtime: one thread serves, the client and the test all at once.
#[tokio::test]
async fn a_stalled_redis_answers_by_the_fail_mode_while_local_requests_are_served() {
    let proxy = BlackHole::to_url(&redis_url());
    let config = PoolConfig::new(proxy.url(), namespace("stall"))
        .exchange_timeout(Duration::from_millis(400))
        .connect_timeout(Duration::from_millis(400))
        .fail_mode(FailMode::FailClosed);
    let redis = Arc::new(AsyncRedisScopes::connect(config).await.unwrap());
    let remote = RemoteScope::new(
        Arc::clone(&redis),
        ScopeKind::Tenant,
        RemotePolicy::new(100, 1.0).unwrap(),
    )
    .unwrap();
    let limiter = limiter();
    let addr = serve(app(layer(&limiter, remote))).await;
    let http = client();
    assert_eq!(
        fetch(&http, addr, "/", &[("x-tenant", "acme")])
            .await
            .status,
        StatusCode::OK
    );

    proxy.cut();
    let order = Arc::new(AtomicU64::new(0));
    let remote_request = {
        let (http, order) = (http.clone(), Arc::clone(&order));
        tokio::spawn(async move {
            let r = fetch(&http, addr, "/", &[("x-tenant", "acme")]).await;
            (r, order.fetch_add(1, Ordering::SeqCst))
        })
    };
    // Requests without a tenant pay only the local scopes.
    let mut local_served = 0;
    for _ in 0..5 {
        let r = fetch(&http, addr, "/", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        local_served += 1;
    }
    let local_done_at = order.fetch_add(1, Ordering::SeqCst);
    let (r, remote_done_at) = remote_request.await.unwrap();
    assert_eq!(local_served, 5);
    assert!(
        local_done_at < remote_done_at,
        "local requests must be served while the remote call waits"
    );
    // Fail closed: the store cannot decide, 503 with Retry-After, local tokens back.
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{r:?}");
    assert!(r.header("retry-after").is_some(), "{r:?}");
    assert_eq!(limiter.available(&Scope::Global), Some(1000.0 - 1.0 - 5.0));
    assert!(redis.last_failure().is_some());
}

#[tokio::test]
async fn a_remote_scope_that_does_not_fit_the_layer_is_a_typed_error() {
    let config = PoolConfig::new(redis_url(), namespace("fit"));
    let redis = Arc::new(AsyncRedisScopes::connect(config).await.unwrap());
    let remote = |cap| {
        RemoteScope::new(
            Arc::clone(&redis),
            ScopeKind::Tenant,
            RemotePolicy::new(cap, 1.0).unwrap(),
        )
        .unwrap()
    };
    let limiter = limiter();
    // No fleet-wide key secret: instances would name a tenant's bucket differently.
    let e = RateLimitLayer::builder(Arc::clone(&limiter))
        .key(ScopeKind::Tenant, Key::header("x-tenant"))
        .remote(remote(10))
        .build()
        .unwrap_err();
    assert!(
        matches!(&e, LayerError::Remote(m) if m.contains("key_secret")),
        "{e}"
    );
    // No key for the kind.
    let e = RateLimitLayer::builder(Arc::clone(&limiter))
        .key_secret([7; 16])
        .remote(remote(10))
        .build()
        .unwrap_err();
    assert!(
        matches!(&e, LayerError::Remote(m) if m.contains("needs a key")),
        "{e}"
    );
    // A route that delays would serve its delayed requests without the remote scope.
    let e = RateLimitLayer::builder(Arc::clone(&limiter))
        .key(ScopeKind::Tenant, Key::header("x-tenant"))
        .key_secret([7; 16])
        .max_wait(std::time::Duration::from_secs(1))
        .remote(remote(10))
        .build()
        .unwrap_err();
    assert!(
        matches!(&e, LayerError::Remote(m) if m.contains("max_wait")),
        "{e}"
    );
    // A route scope names no key.
    assert!(RemoteScope::new(redis, ScopeKind::Route, RemotePolicy::new(1, 1.0).unwrap()).is_err());
}
