//! The layer in front of a real axum server on loopback, driven by a real HTTP client.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::{HeaderMap, StatusCode};
use tokengate::scope::{Rule, RuleSet, Scope, ScopeKind, TenantId, WorkClass};
use tokengate::{ManualClock, Policy, ScopedLimiter};
use tokengate_tower::{Forwarding, Key, RateLimitLayer, Route};

use crate::support::{client, eventually, get as fetch, list, serve};

fn app(layer: RateLimitLayer<ManualClock>) -> Router {
    routes().layer(layer)
}

fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/search", get(|| async { "ok" }))
        .route("/export", get(|| async { "ok" }).post(|| async { "ok" }))
        .route(
            "/fail",
            get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "down") }),
        )
}

fn classes(rules: RuleSet) -> RuleSet {
    rules.class(WorkClass::new("metadata", 1))
}

fn limiter(rules: RuleSet) -> Arc<ScopedLimiter<ManualClock>> {
    Arc::new(classes(rules).build_with_clock(ManualClock::new()).unwrap())
}

fn tenant_limiter(capacity: u64) -> Arc<ScopedLimiter<ManualClock>> {
    limiter(
        RuleSet::new()
            .rule(
                ScopeKind::Global,
                counted(Policy::new(1000, 100.0).unwrap()),
            )
            .rule(
                ScopeKind::Tenant,
                counted(Policy::new(capacity, 1.0).unwrap()),
            ),
    )
}

fn params(p: &[(String, i64)]) -> Vec<(&str, i64)> {
    p.iter().map(|(k, v)| (k.as_str(), *v)).collect()
}

#[tokio::test]
async fn a_refusal_is_429_with_retry_after_and_the_ietf_fields_of_the_refusing_scope() {
    // 2 tokens, 0.4 per second: one token takes 2.5 s, so Retry-After is 3.
    let limiter =
        limiter(RuleSet::new().rule(ScopeKind::Global, counted(Policy::new(2, 0.4).unwrap())));
    let layer = RateLimitLayer::builder(limiter)
        .default_class("metadata")
        .build()
        .unwrap();
    let addr = serve(app(layer)).await;
    let c = client();

    let first = fetch(&c, addr, "/", &[]).await;
    assert_eq!(first.status, StatusCode::OK);
    let policy = list(first.header("ratelimit-policy").unwrap());
    assert_eq!(policy.len(), 1);
    assert_eq!(policy[0].0, "global");
    assert_eq!(params(&policy[0].1), [("q", 2), ("w", 5)]);
    let limit = list(first.header("ratelimit").unwrap());
    assert_eq!(limit[0].0, "global");
    assert_eq!(params(&limit[0].1), [("r", 1), ("t", 3)]);

    assert_eq!(fetch(&c, addr, "/", &[]).await.status, StatusCode::OK);
    let refused = fetch(&c, addr, "/", &[]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("retry-after"), Some("3"));
    let limit = list(refused.header("ratelimit").unwrap());
    assert_eq!(limit.len(), 1);
    assert_eq!(limit[0].0, "global");
    assert_eq!(params(&limit[0].1), [("r", 0), ("t", 3)]);
    let policy = list(refused.header("ratelimit-policy").unwrap());
    assert_eq!(params(&policy[0].1), [("q", 2), ("w", 5)]);
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    assert!(refused.body.contains(r#""status":429"#), "{}", refused.body);
    assert!(
        refused.body.contains(r#""scope":"global""#),
        "{}",
        refused.body
    );
    assert!(refused.header("x-ratelimit-limit").is_none());
}

#[tokio::test]
async fn legacy_fields_and_a_custom_body_when_asked_for() {
    let limiter = tenant_limiter(1);
    let layer = RateLimitLayer::builder(limiter)
        .key(ScopeKind::Tenant, Key::header("x-tenant"))
        .default_class("metadata")
        .legacy_headers(true)
        .refusal_body(|r| {
            (
                http::HeaderValue::from_static("text/plain"),
                format!("slow down, {}", r.scope).into(),
            )
        })
        .build()
        .unwrap();
    let tenant_5 = layer.key_id("5");
    let addr = serve(app(layer)).await;
    let c = client();
    let ok = fetch(&c, addr, "/", &[("x-tenant", "5")]).await;
    assert_eq!(ok.header("x-ratelimit-limit"), Some("1")); // the tenant, the tightest
    assert_eq!(ok.header("x-ratelimit-remaining"), Some("0"));
    let refused = fetch(&c, addr, "/", &[("x-tenant", "5")]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(
        refused.header("x-ratelimit-reset"),
        refused.header("retry-after")
    );
    assert_eq!(refused.body, format!("slow down, tenant:{tenant_5}"));
}

#[tokio::test]
async fn two_tenants_are_isolated() {
    let limiter = tenant_limiter(2);
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .key(ScopeKind::Tenant, Key::header("x-tenant"))
        .default_class("metadata")
        .build()
        .unwrap();
    let tenant = |v| TenantId(layer.key_id(v));
    let (t1, t2) = (tenant("1"), tenant("2"));
    let addr = serve(app(layer)).await;
    let c = client();
    for _ in 0..2 {
        assert_eq!(fetch(&c, addr, "/", &[("x-tenant", "1")]).await.status, 200);
    }
    let refused = fetch(&c, addr, "/", &[("x-tenant", "1")]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(list(refused.header("ratelimit").unwrap())[0].0, "tenant");
    assert!(refused.body.contains(&format!("tenant:{}", t1.0)));
    // The other tenant has its whole budget.
    for _ in 0..2 {
        assert_eq!(fetch(&c, addr, "/", &[("x-tenant", "2")]).await.status, 200);
    }
    assert_eq!(limiter.available(&Scope::Tenant(t1)), Some(0.0));
    assert_eq!(limiter.available(&Scope::Tenant(t2)), Some(0.0));
    assert_eq!(limiter.available(&Scope::Global), Some(996.0));
}

#[tokio::test]
async fn a_routes_class_sets_its_cost_and_its_route_scope() {
    let limiter = limiter(
        RuleSet::new()
            .rule(ScopeKind::Tenant, counted(Policy::new(30, 1.0).unwrap()))
            .rule(ScopeKind::Route, counted(Policy::new(100, 1.0).unwrap()))
            .class(WorkClass::new("search", 3))
            .class(WorkClass::new("export", 20)),
    );
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .key(ScopeKind::Tenant, Key::header("x-tenant"))
        .route(Route::post("/export").id(7).class("export"))
        .route(Route::get("/search").id(8).class("search"))
        .default_class("metadata")
        .build()
        .unwrap();
    let t3 = TenantId(layer.key_id("3"));
    let addr = serve(app(layer)).await;
    let c = client();
    let t = [("x-tenant", "3")];
    assert_eq!(
        crate::support::send(&c, addr, "POST", "/export", &t)
            .await
            .status,
        200
    );
    assert_eq!(limiter.available(&Scope::Tenant(t3)), Some(10.0));
    let second = crate::support::send(&c, addr, "POST", "/export", &t).await;
    assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS);
    // GET /export matches no listed route (that one is POST only): the fallback route,
    // at the default class.
    assert_eq!(fetch(&c, addr, "/export", &t).await.status, 200);
    assert_eq!(fetch(&c, addr, "/search", &t).await.status, 200);
    assert_eq!(limiter.available(&Scope::Tenant(t3)), Some(6.0));
    let route = |id| limiter.available(&Scope::Route(tokengate::scope::RouteId(id)));
    assert_eq!(route(7), Some(80.0));
    assert_eq!(route(8), Some(97.0));
    // The default fallback pays no route scope.
    assert_eq!(route(0), Some(100.0));
}

fn per_client(trusted: &[&str]) -> (RateLimitLayer<ManualClock>, Arc<ScopedLimiter<ManualClock>>) {
    per_client_reading(trusted, Forwarding::default())
}

fn per_client_reading(
    trusted: &[&str],
    forwarding: Forwarding,
) -> (RateLimitLayer<ManualClock>, Arc<ScopedLimiter<ManualClock>>) {
    let limiter =
        limiter(RuleSet::new().rule(ScopeKind::User, counted(Policy::new(1, 1.0).unwrap())));
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .key(ScopeKind::User, Key::client_ip().ipv6_prefix(64))
        .trusted_proxies(trusted.iter().map(|n| n.parse().unwrap()))
        .forwarding(forwarding)
        .default_class("metadata")
        .build()
        .unwrap();
    (layer, limiter)
}

#[tokio::test]
async fn a_client_written_forwarded_behind_an_xff_proxy_picks_no_key() {
    // The proxy (127.0.0.1, trusted) appends X-Forwarded-For and passes the client's own
    // `Forwarded` through untouched, as nginx and most load balancers do.
    let (layer, limiter) = per_client(&["127.0.0.0/8"]);
    let addr = serve(app(layer)).await;
    let c = client();
    let mut statuses = Vec::new();
    for i in 0..6 {
        let spoof = format!("for=203.0.113.{i}");
        let r = fetch(
            &c,
            addr,
            "/",
            &[
                ("x-forwarded-for", "1.1.1.1"),
                ("forwarded", spoof.as_str()),
            ],
        )
        .await;
        statuses.push(r.status.as_u16());
    }
    // Burst 1: the client is limited by its X-Forwarded-For address, whatever it rotates.
    assert_eq!(statuses, [200, 429, 429, 429, 429, 429]);
    assert_eq!(limiter.len(ScopeKind::User), 1);
    // A victim named in `Forwarded` was never charged.
    let drain = [("x-forwarded-for", "1.1.1.1"), ("forwarded", "for=5.5.5.5")];
    for _ in 0..3 {
        assert_eq!(fetch(&c, addr, "/", &drain).await.status, 429);
    }
    let victim = fetch(&c, addr, "/", &[("x-forwarded-for", "5.5.5.5")]).await;
    assert_eq!(victim.status, 200);
}

#[tokio::test]
async fn a_forged_forwarded_for_from_an_untrusted_peer_is_ignored() {
    let (layer, limiter) = per_client(&["10.0.0.0/8"]);
    let addr = serve(app(layer)).await;
    let c = client();
    let xff = |ip| [("x-forwarded-for", ip)];
    assert_eq!(fetch(&c, addr, "/", &xff("1.1.1.1")).await.status, 200);
    // Another claimed client, same peer (127.0.0.1, not a trusted proxy): same bucket.
    let forged = fetch(&c, addr, "/", &xff("2.2.2.2")).await;
    assert_eq!(forged.status, StatusCode::TOO_MANY_REQUESTS);
    let forged = fetch(&c, addr, "/", &[("forwarded", "for=3.3.3.3")]).await;
    assert_eq!(forged.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limiter.len(ScopeKind::User), 1);
}

#[tokio::test]
async fn a_trusted_proxys_forwarded_for_names_the_client() {
    let (layer, limiter) = per_client(&["127.0.0.0/8"]);
    let addr = serve(app(layer)).await;
    let c = client();
    let xff = |ip| [("x-forwarded-for", ip)];
    assert_eq!(fetch(&c, addr, "/", &xff("1.1.1.1")).await.status, 200);
    assert_eq!(fetch(&c, addr, "/", &xff("2.2.2.2")).await.status, 200);
    // The client is the rightmost untrusted hop: a prefix it wrote itself is ignored.
    let again = fetch(&c, addr, "/", &xff("9.9.9.9, 1.1.1.1")).await;
    assert_eq!(again.status, StatusCode::TOO_MANY_REQUESTS);
    // One IPv6 /64 is one client; `Forwarded` is read where it is named.
    let (layer, _) = per_client_reading(&["127.0.0.0/8"], Forwarding::Forwarded);
    let fwd_addr = serve(app(layer)).await;
    let fwd = |v| [("forwarded", v)];
    let a = fetch(&c, fwd_addr, "/", &fwd(r#"for="[2001:db8:1:2::a]:443""#)).await;
    assert_eq!(a.status, 200);
    let b = fetch(&c, fwd_addr, "/", &fwd(r#"for="[2001:db8:1:2::b]""#)).await;
    assert_eq!(b.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limiter.len(ScopeKind::User), 2);
    // A chain that names no address gets the missing-key answer, not a guess.
    let bad = fetch(&c, addr, "/", &xff("1.1.1.1, not-an-ip")).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.body.contains("x-forwarded-for"), "{}", bad.body);
}

#[tokio::test]
async fn a_request_without_a_required_key_gets_the_configured_answer() {
    let limiter = tenant_limiter(5);
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .key(ScopeKind::Tenant, Key::header("x-tenant").required())
        .default_class("metadata")
        .missing_key_status(StatusCode::UNAUTHORIZED)
        .build()
        .unwrap();
    let stats = layer.clone();
    let addr = serve(app(layer)).await;
    let c = client();
    let r = fetch(&c, addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(r.body.contains("no tenant key"), "{}", r.body);
    assert_eq!(stats.stats().missing_key[ScopeKind::Tenant as usize], 1);
    // Nothing was taken from any scope.
    assert_eq!(limiter.available(&Scope::Global), Some(1000.0));
    assert_eq!(
        fetch(&c, addr, "/", &[("x-tenant", "acme")]).await.status,
        200
    );
}

#[tokio::test]
async fn shadow_mode_admits_counts_and_debits_nothing_for_a_refusal() {
    let limiter =
        limiter(RuleSet::new().rule(ScopeKind::Global, counted(Policy::new(1, 1.0).unwrap())));
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .default_class("metadata")
        .shadow(true)
        .build()
        .unwrap();
    let stats = layer.clone();
    let addr = serve(app(layer)).await;
    let c = client();
    for _ in 0..3 {
        assert_eq!(fetch(&c, addr, "/", &[]).await.status, 200);
    }
    assert_eq!(stats.stats().shadow_rejected(ScopeKind::Global), 2);
    // The refusals took nothing: the balance is 0, not -2.
    assert_eq!(limiter.available(&Scope::Global), Some(0.0));
    let c2 = limiter.counters(&Scope::Global).unwrap().original;
    assert_eq!((c2.admitted_requests, c2.rejected_requests), (1, 2));
}

#[tokio::test]
async fn a_shadowed_scope_refuses_without_blocking_the_enforced_ones() {
    let limiter = limiter(
        RuleSet::new()
            .rule(ScopeKind::Global, counted(Policy::new(2, 1.0).unwrap()))
            .rule(ScopeKind::Tenant, counted(Policy::new(1, 1.0).unwrap())),
    );
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .key(ScopeKind::Tenant, Key::header("x-tenant"))
        .shadow_scope(ScopeKind::Tenant)
        .default_class("metadata")
        .build()
        .unwrap();
    let stats = layer.clone();
    let t9 = TenantId(layer.key_id("9"));
    let addr = serve(app(layer)).await;
    let c = client();
    let t = [("x-tenant", "9")];
    assert_eq!(fetch(&c, addr, "/", &t).await.status, 200);
    assert_eq!(fetch(&c, addr, "/", &t).await.status, 200); // tenant refuses in shadow
    let third = fetch(&c, addr, "/", &t).await; // the global scope enforces
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(list(third.header("ratelimit").unwrap())[0].0, "global");
    // The third request was refused by the global scope, which is decided first: the
    // tenant's shadow refusal is counted once, for the second request.
    assert_eq!(stats.stats().shadow_rejected(ScopeKind::Tenant), 1);
    assert_eq!(limiter.available(&Scope::Tenant(t9)), Some(0.0));
    assert_eq!(limiter.available(&Scope::Global), Some(0.0));
}

#[tokio::test]
async fn tokens_come_back_when_the_inner_service_answers_a_refunded_status() {
    let limiter =
        limiter(RuleSet::new().rule(ScopeKind::Global, counted(Policy::new(1, 1.0).unwrap())));
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .route(Route::get("/fail").refund_on(|s| s.is_server_error()))
        .default_class("metadata")
        .build()
        .unwrap();
    let stats = layer.clone();
    let addr = serve(app(layer)).await;
    let c = client();
    for _ in 0..3 {
        let r = fetch(&c, addr, "/fail", &[]).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(stats.stats().refunded, 3);
    assert_eq!(limiter.available(&Scope::Global), Some(1.0));
    // A route without the option keeps the tokens.
    assert_eq!(fetch(&c, addr, "/", &[]).await.status, 200);
    assert_eq!(fetch(&c, addr, "/", &[]).await.status, 429);
}

/// A handler that records the order in which requests reach it.
fn ordered(seen: Arc<Mutex<Vec<u32>>>) -> Router<()> {
    Router::new().route(
        "/slow",
        get(move |headers: HeaderMap| {
            let seen = Arc::clone(&seen);
            async move {
                let n = headers["x-seq"].to_str().unwrap().parse().unwrap();
                seen.lock().unwrap().push(n);
                "ok"
            }
        }),
    )
}

#[tokio::test]
async fn delay_mode_waits_and_then_serves_in_order() {
    // The real clock: 1 token, 20 per second; each waiter waits ~50 ms behind the last.
    let policy = Policy::builder(1, 20.0)
        .max_reservation(Duration::from_secs(2))
        .build()
        .unwrap();
    let limiter = Arc::new(
        classes(RuleSet::new().rule(ScopeKind::Global, counted(policy)))
            .build()
            .unwrap(),
    );
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .route(Route::get("/slow").max_wait(Duration::from_secs(2)))
        .default_class("metadata")
        .build()
        .unwrap();
    let stats = layer.clone();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let addr = serve(ordered(Arc::clone(&seen)).layer(layer)).await;
    let c = client();
    let mut tasks = Vec::new();
    for n in 0..4u32 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let seq = n.to_string();
            fetch(&c, addr, "/slow", &[("x-seq", &seq)]).await.status
        }));
        // The next request is sent once this one holds its place in the queue.
        let admitted = || {
            limiter
                .counters(&Scope::Global)
                .unwrap()
                .original
                .admitted_requests
        };
        eventually(|| admitted() == u64::from(n) + 1).await;
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(*seen.lock().unwrap(), [0, 1, 2, 3]);
    assert!(stats.stats().delayed >= 3);
}

#[tokio::test]
async fn a_client_that_disconnects_while_waiting_leaves_the_bucket_as_if_it_never_asked() {
    // A manual clock that never moves: the waiters wait until they are dropped.
    let policy = Policy::builder(1, 1.0)
        .max_reservation(Duration::from_secs(60))
        .build()
        .unwrap();
    let limiter = limiter(RuleSet::new().rule(ScopeKind::Global, counted(policy)));
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .route(Route::get("/").max_wait(Duration::from_secs(60)))
        .default_class("metadata")
        .build()
        .unwrap();
    let stats = layer.clone();
    let addr = serve(app(layer)).await;
    let c = client();
    assert_eq!(fetch(&c, addr, "/", &[]).await.status, 200);
    let word = limiter.stored_word(&Scope::Global).unwrap();
    assert_eq!(limiter.available(&Scope::Global), Some(0.0));

    // One waiter, with nobody queued behind it: its cancel is exact. (A waiter with
    // later ones queued behind it gives nothing back: their ready times stand.)
    let c = client(); // a connection of its own, closed when the task is aborted
    let waiter = tokio::spawn(async move { fetch(&c, addr, "/", &[]).await });
    // Charged to its ready edge: its cost, and the refill excess there (a full bucket).
    eventually(|| limiter.available(&Scope::Global).is_some_and(|t| t <= -1.0)).await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    eventually(|| stats.stats().delay_cancelled == 1).await;
    assert_eq!(limiter.available(&Scope::Global), Some(0.0));
    assert_eq!(limiter.stored_word(&Scope::Global), Some(word));
    assert_eq!(stats.stats().delayed, 0);
}

/// A rule with per-scope counters (off by default).
fn counted(policy: Policy) -> Rule {
    Rule::new(policy).counters(true)
}

/// A remote store that is up (admits everything) or down (cannot decide).
struct Flaky {
    down: std::sync::atomic::AtomicBool,
    takes: std::sync::atomic::AtomicU64,
}

impl tokengate::scope::RemoteScopes for Flaky {
    fn take(&self, _: &[(Scope, u64)]) -> Result<(), tokengate::scope::RemoteRefusal> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.down.load(Relaxed) {
            return Err(tokengate::scope::RemoteRefusal::Unavailable {
                retry_after: Duration::from_millis(1500),
            });
        }
        self.takes.fetch_add(1, Relaxed);
        Ok(())
    }

    fn give_back(&self, _: &[(Scope, u64)]) {}
}

/// A local global scope of 3 tokens (no refill to speak of) and the tenant kind in
/// `store`.
fn remote_tenant_limiter(store: Arc<Flaky>) -> Arc<ScopedLimiter<ManualClock>> {
    limiter(
        RuleSet::new()
            .rule(ScopeKind::Global, counted(Policy::new(3, 0.001).unwrap()))
            .rule(
                ScopeKind::Tenant,
                Rule::new(Policy::new(10, 1.0).unwrap()).remote(),
            )
            .remote_scopes(store),
    )
}

/// A server whose layer keys the tenant on `x-tenant` over [`remote_tenant_limiter`] with
/// its store down, serving on the local scopes when the store is down if `admits`: the
/// store, the limiter, the layer (for its stats) and the address.
async fn serve_remote_tenant(
    admits: bool,
) -> (
    Arc<Flaky>,
    Arc<ScopedLimiter<ManualClock>>,
    RateLimitLayer<ManualClock>,
    std::net::SocketAddr,
) {
    let store = Arc::new(Flaky {
        down: std::sync::atomic::AtomicBool::new(true),
        takes: std::sync::atomic::AtomicU64::new(0),
    });
    let limiter = remote_tenant_limiter(store.clone());
    let layer = RateLimitLayer::builder(limiter.clone())
        .key(ScopeKind::Tenant, Key::header("x-tenant"))
        .default_class("metadata")
        .store_unavailable_admits(admits)
        .build()
        .unwrap();
    let addr = serve(app(layer.clone())).await;
    (store, limiter, layer, addr)
}

#[tokio::test]
async fn an_unavailable_store_is_503_with_retry_after_and_takes_nothing() {
    use std::sync::atomic::Ordering::Relaxed;
    let (store, limiter, stats, addr) = serve_remote_tenant(false).await;
    let c = client();
    for _ in 0..5 {
        let r = fetch(&c, addr, "/", &[("x-tenant", "7")]).await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.header("retry-after"), Some("2")); // 1.5 s, rounded up
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert!(r.body.contains("\"status\":503"), "{}", r.body);
    }
    assert_eq!(stats.stats().store_unavailable, 5);
    // The local global scope was given back every token.
    assert_eq!(limiter.available(&Scope::Global), Some(3.0));
    // A request naming no remote scope never asks the store.
    assert_eq!(fetch(&c, addr, "/", &[]).await.status, StatusCode::OK);
    store.down.store(false, Relaxed);
    let r = fetch(&c, addr, "/", &[("x-tenant", "7")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(store.takes.load(Relaxed), 1);
    assert_eq!(stats.stats().store_unavailable, 5);
}

#[tokio::test]
async fn an_unavailable_store_can_serve_on_the_local_scopes_alone() {
    use std::sync::atomic::Ordering::Relaxed;
    let (store, limiter, stats, addr) = serve_remote_tenant(true).await;
    let c = client();
    // The local global scope still limits: 3 tokens, then 429.
    for _ in 0..3 {
        let r = fetch(&c, addr, "/", &[("x-tenant", "7")]).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    let refused = fetch(&c, addr, "/", &[("x-tenant", "7")]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limiter.available(&Scope::Global), Some(0.0));
    // The refused request never reached the store: local scopes are paid first.
    assert_eq!(stats.stats().store_unavailable, 3);
    assert_eq!(store.takes.load(Relaxed), 0);
}
