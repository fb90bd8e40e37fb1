//! Safe defaults at the edge, against a real axum server and client: keys reach their
//! buckets only through the keyed hash, HEAD pays its GET route, unmatched paths pay the
//! fallback route, idle clients are released as new ones come, and the one-line layers.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use tokengate::scope::{ApiKeyId, Rule, RuleSet, Scope, ScopeKind, WorkClass};
use tokengate::{ManualClock, Policy, ScopedLimiter};
use tokengate_tower::{Key, RateLimitLayer, Route};

use crate::support::{client, client_from, get as fetch, send, serve};

fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/search", get(|| async { "ok" }))
}

fn limiter(rules: RuleSet) -> Arc<ScopedLimiter<ManualClock>> {
    Arc::new(rules.build_with_clock(ManualClock::new()).unwrap())
}

/// The id a 429 body names for the refusing scope of `kind` (`"scope":"api_key:123"`).
fn scope_id(body: &str, kind: &str) -> u64 {
    let tag = format!(r#""scope":"{kind}:"#);
    let start = body
        .find(&tag)
        .unwrap_or_else(|| panic!("no {tag} in {body}"))
        + tag.len();
    let digits: String = body[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap()
}

#[tokio::test]
async fn an_id_shown_in_a_429_body_does_not_reach_its_bucket() {
    let limiter =
        limiter(RuleSet::new().rule(ScopeKind::ApiKey, Rule::new(Policy::new(2, 1.0).unwrap())));
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .key(ScopeKind::ApiKey, Key::header("x-api-key").required())
        .build()
        .unwrap();
    let ids = layer.clone();
    let addr = serve(routes().layer(layer)).await;
    let c = client();
    let victim = [("x-api-key", "victim-secret-key")];
    for _ in 0..2 {
        assert_eq!(fetch(&c, addr, "/", &victim).await.status, 200);
    }
    let refused = fetch(&c, addr, "/", &victim).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let id = scope_id(&refused.body, "api_key");
    assert_eq!(id, ids.key_id("victim-secret-key"));
    // The victim's bucket refills; then someone who read the id sends it as the key.
    limiter.clock().advance(Duration::from_secs(5));
    let shown = id.to_string();
    let attacker = [("x-api-key", shown.as_str())];
    let mut attacker_ok = 0;
    for _ in 0..5 {
        let r = fetch(&c, addr, "/", &attacker).await;
        if r.status == 200 {
            attacker_ok += 1;
        } else {
            // Refused in a bucket of its own, under another id.
            assert_ne!(scope_id(&r.body, "api_key"), id, "{}", r.body);
        }
    }
    assert_eq!(attacker_ok, 2, "the attacker has a bucket of its own");
    assert_eq!(limiter.available(&Scope::ApiKey(ApiKeyId(id))), Some(2.0));
    for _ in 0..2 {
        assert_eq!(fetch(&c, addr, "/", &victim).await.status, 200);
    }
    // A decimal value is hashed like any other: `42` is not the scope `api_key:42`.
    assert_eq!(
        fetch(&c, addr, "/", &[("x-api-key", "42")]).await.status,
        200
    );
    assert_eq!(limiter.available(&Scope::ApiKey(ApiKeyId(42))), Some(2.0));
    assert_eq!(
        limiter.available(&Scope::ApiKey(ApiKeyId(ids.key_id("42")))),
        Some(1.0)
    );
}

#[tokio::test]
async fn a_custom_keys_number_is_hashed_too() {
    let limiter =
        limiter(RuleSet::new().rule(ScopeKind::Tenant, Rule::new(Policy::new(1, 1.0).unwrap())));
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .key(
            ScopeKind::Tenant,
            Key::custom(|h| h.headers.get("x-n")?.to_str().ok()?.parse().ok()),
        )
        .build()
        .unwrap();
    let addr = serve(routes().layer(layer)).await;
    let c = client();
    assert_eq!(fetch(&c, addr, "/", &[("x-n", "5")]).await.status, 200);
    let refused = fetch(&c, addr, "/", &[("x-n", "5")]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let id = scope_id(&refused.body, "tenant");
    assert_ne!(id, 5);
    let shown = id.to_string();
    assert_eq!(
        fetch(&c, addr, "/", &[("x-n", shown.as_str())])
            .await
            .status,
        200
    );
}

/// A route scope of 100 tokens, classes of 1 and 3; `/search` (GET) costs 3.
fn route_limiter(route_capacity: u64) -> Arc<ScopedLimiter<ManualClock>> {
    limiter(
        RuleSet::new()
            .rule(
                ScopeKind::Route,
                Rule::new(Policy::new(route_capacity, 0.001).unwrap()),
            )
            .class(WorkClass::new("metadata", 1))
            .class(WorkClass::new("search", 3)),
    )
}

fn route(limiter: &ScopedLimiter<ManualClock>, id: u64) -> Option<f64> {
    limiter.available(&Scope::Route(tokengate::scope::RouteId(id)))
}

#[tokio::test]
async fn head_on_a_get_route_pays_its_cost_in_its_scope() {
    let limiter = route_limiter(100);
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .route(Route::get("/search").id(8).class("search"))
        .default_class("metadata")
        .build()
        .unwrap();
    let addr = serve(routes().layer(layer)).await;
    let c = client();
    let head = send(&c, addr, "HEAD", "/search", &[]).await;
    assert_eq!(head.status, 200);
    assert_eq!(route(&limiter, 8), Some(97.0));
    assert_eq!(route(&limiter, 0), Some(100.0), "not the fallback route");
    assert_eq!(fetch(&c, addr, "/search", &[]).await.status, 200);
    assert_eq!(route(&limiter, 8), Some(94.0));
}

#[tokio::test]
async fn unmatched_paths_share_a_route_budget_only_when_the_fallback_has_an_id() {
    let limiter = route_limiter(3);
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .route(Route::get("/search").id(8))
        .fallback(Route::fallback().id(0))
        .default_class("metadata")
        .build()
        .unwrap();
    let addr = serve(routes().layer(layer)).await;
    let c = client();
    // Two 404s and a served path that no route lists: 1 token each of `route:0`.
    for (path, status) in [("/nope", 404), ("/", 200), ("/a/b/c", 404)] {
        assert_eq!(fetch(&c, addr, path, &[]).await.status, status, "{path}");
    }
    let refused = fetch(&c, addr, "/never-routed", &[]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.body.contains("route:0"), "{}", refused.body);
    assert_eq!(route(&limiter, 0), Some(0.0));
    // The listed route keeps its own budget.
    assert_eq!(fetch(&c, addr, "/search", &[]).await.status, 200);
}

#[tokio::test]
async fn one_clients_404s_do_not_refuse_another_client_on_an_unlisted_path() {
    // A route rule of capacity 3 and a per-client budget of 5.
    let limiter = limiter(
        RuleSet::new()
            .rule(ScopeKind::Route, Rule::new(Policy::new(3, 0.001).unwrap()))
            .rule(ScopeKind::User, Rule::new(Policy::new(5, 0.001).unwrap()))
            .class(WorkClass::new("metadata", 1)),
    );
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .key(ScopeKind::User, Key::client_ip())
        .route(Route::get("/search").id(8))
        .default_class("metadata")
        .build()
        .unwrap();
    let addr = serve(routes().layer(layer)).await;
    let a = client_from("127.0.0.2".parse().unwrap());
    let b = client_from("127.0.0.3".parse().unwrap());
    // Client A's junk: its own budget runs out (5), then it is refused by its own scope.
    let mut statuses = Vec::new();
    for i in 0..7 {
        statuses.push(
            fetch(&a, addr, &format!("/junk/{i}"), &[])
                .await
                .status
                .as_u16(),
        );
    }
    assert_eq!(statuses, [404, 404, 404, 404, 404, 429, 429]);
    let refused = fetch(&a, addr, "/junk", &[]).await;
    assert!(
        refused.body.contains("\"scope\":\"user:"),
        "{}",
        refused.body
    );
    // Client B, on an unlisted path that exists, has its own budget and no shared one.
    for _ in 0..5 {
        assert_eq!(fetch(&b, addr, "/", &[]).await.status, 200);
    }
    assert_eq!(route(&limiter, 0), Some(3.0), "no route scope was paid");
}

#[tokio::test]
async fn the_fallback_route_is_configurable() {
    let limiter = route_limiter(5);
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .fallback(Route::fallback().id(99).class("search"))
        .default_class("metadata")
        .build()
        .unwrap();
    let addr = serve(routes().layer(layer)).await;
    let c = client();
    assert_eq!(fetch(&c, addr, "/nope", &[]).await.status, 404);
    assert_eq!(route(&limiter, 99), Some(2.0));
    assert_eq!(
        fetch(&c, addr, "/nope", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Shadowed: counted, never refused.
    let limiter = route_limiter(3);
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .fallback(Route::fallback().id(0).shadow(true))
        .default_class("metadata")
        .build()
        .unwrap();
    let stats = layer.clone();
    let addr = serve(routes().layer(layer)).await;
    for _ in 0..5 {
        assert_eq!(fetch(&c, addr, "/nope", &[]).await.status, 404);
    }
    assert_eq!(stats.stats().shadow_rejected[ScopeKind::Route as usize], 2);
}

#[tokio::test]
async fn idle_clients_are_released_as_new_ones_come() {
    // 5 tokens, 5 per second: a client is full again 1 s after its last request.
    let limiter = limiter(RuleSet::new().rule(
        ScopeKind::User,
        Rule::new(Policy::new(5, 5.0).unwrap()).shards(2),
    ));
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .key(ScopeKind::User, Key::client_ip())
        .trusted_proxies(["127.0.0.0/8".parse().unwrap()])
        .build()
        .unwrap();
    let addr = serve(routes().layer(layer)).await;
    let c = client();
    let seen_once = 300;
    for i in 0..seen_once {
        let ip = format!("198.51.{}.{}", i / 200, i % 200);
        let r = fetch(&c, addr, "/", &[("x-forwarded-for", ip.as_str())]).await;
        assert_eq!(r.status, 200);
    }
    assert_eq!(limiter.len(ScopeKind::User), seen_once);
    limiter.clock().advance(Duration::from_secs(10));
    // 10 new clients, 3 requests each.
    for round in 0..3 {
        for i in 0..10 {
            let ip = format!("203.0.113.{i}");
            let r = fetch(&c, addr, "/", &[("x-forwarded-for", ip.as_str())]).await;
            assert_eq!(r.status, 200, "{ip} round {round}");
        }
    }
    // No sweep was called: the new clients' inserts released the idle ones.
    let len = limiter.len(ScopeKind::User);
    assert!(len <= 2 * 10 + 2 * 33, "{len} keys kept");
}

#[tokio::test]
async fn the_one_line_layers_limit_a_real_server() {
    let slow = || Policy::new(2, 0.001).unwrap();
    let c = client();

    let addr = serve(routes().layer(RateLimitLayer::per_ip(slow()).unwrap())).await;
    for _ in 0..2 {
        assert_eq!(fetch(&c, addr, "/", &[]).await.status, 200);
    }
    let r = fetch(&c, addr, "/nope", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(r.header("retry-after").is_some());
    // The client addresses have a scope kind of their own.
    assert!(r.body.contains("\"scope\":\"client:"), "{}", r.body);
    // A forged forwarding field from a direct client buys nothing.
    let r = fetch(&c, addr, "/", &[("x-forwarded-for", "1.2.3.4")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);

    let addr = serve(routes().layer(RateLimitLayer::global(slow()).unwrap())).await;
    assert_eq!(fetch(&c, addr, "/", &[]).await.status, 200);
    assert_eq!(send(&c, addr, "HEAD", "/search", &[]).await.status, 200);
    assert_eq!(
        fetch(&c, addr, "/", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );

    let layer = RateLimitLayer::per_header("x-api-key", slow()).unwrap();
    let addr = serve(routes().layer(layer)).await;
    let a = [("x-api-key", "a")];
    for _ in 0..2 {
        assert_eq!(fetch(&c, addr, "/", &a).await.status, 200);
    }
    assert_eq!(
        fetch(&c, addr, "/", &a).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        fetch(&c, addr, "/", &[("x-api-key", "b")]).await.status,
        200
    );
    // Without the header: the missing-key answer, never a free pass.
    assert_eq!(
        fetch(&c, addr, "/", &[]).await.status,
        StatusCode::BAD_REQUEST
    );
}

#[test]
fn layers_agree_on_ids_within_a_process_and_across_processes_given_one_secret() {
    let build = |secret: Option<[u8; 16]>| {
        let limiter = limiter(
            RuleSet::new().rule(ScopeKind::ApiKey, Rule::new(Policy::new(1, 1.0).unwrap())),
        );
        let mut b = RateLimitLayer::builder(limiter).key(ScopeKind::ApiKey, Key::header("x-k"));
        if let Some(s) = secret {
            b = b.key_secret(s);
        }
        b.build().unwrap()
    };
    // One secret per process: two layers over two limiters map a value alike.
    assert_eq!(build(None).key_id("a"), build(None).key_id("a"));
    assert_eq!(
        build(Some([1; 16])).key_id("a"),
        build(Some([1; 16])).key_id("a")
    );
    assert_ne!(
        build(Some([1; 16])).key_id("a"),
        build(Some([2; 16])).key_id("a")
    );
    assert_ne!(build(None).key_id("a"), build(Some([1; 16])).key_id("a"));
    assert_ne!(build(None).key_id("7"), 7);
}

#[tokio::test]
async fn per_ip_behind_believes_only_the_listed_proxies() {
    let slow = || Policy::new(2, 0.001).unwrap();
    // The proxy connects from 127.0.0.2; a client connecting directly from 127.0.0.1.
    let proxy_net: tokengate_tower::ipnet::IpNet = "127.0.0.2/32".parse().unwrap();
    let layer = RateLimitLayer::per_ip_behind([proxy_net], slow()).unwrap();
    let addr = serve(routes().layer(layer)).await;
    let direct = client_from("127.0.0.1".parse().unwrap());
    let proxy = client_from("127.0.0.2".parse().unwrap());
    let xff = |ip: &str| [("x-forwarded-for", ip.to_owned())];
    let fetch = |c, ip: Option<&str>| {
        let h: Vec<(&str, String)> = ip.map(|ip| xff(ip).to_vec()).unwrap_or_default();
        async move {
            let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
            fetch(c, addr, "/", &h).await.status.as_u16()
        }
    };

    // An untrusted peer rotating a spoofed X-Forwarded-For: one bucket, its own address.
    let mut statuses = Vec::new();
    for i in 0..5 {
        let spoof = format!("203.0.113.{i}");
        statuses.push(fetch(&direct, Some(&spoof)).await);
    }
    assert_eq!(statuses, [200, 200, 429, 429, 429]);

    // The listed proxy's clients are limited one by one, by the address it forwards.
    for client in ["198.51.100.1", "198.51.100.2"] {
        let mut statuses = Vec::new();
        for _ in 0..3 {
            statuses.push(fetch(&proxy, Some(client)).await);
        }
        assert_eq!(statuses, [200, 200, 429], "client {client}");
    }
    // A client behind the proxy named as one the direct peer spoofed was never charged.
    assert_eq!(fetch(&proxy, Some("203.0.113.0")).await, 200);
    // The proxy's own requests without the field are its own client.
    assert_eq!(fetch(&proxy, None).await, 200);
}

#[test]
fn per_ip_behind_refuses_no_proxy_and_a_network_of_every_address() {
    use tokengate_tower::{IpNet, LayerError};
    let p = || Policy::new(1, 1.0).unwrap();
    assert!(matches!(
        RateLimitLayer::per_ip_behind(Vec::<IpNet>::new(), p()),
        Err(LayerError::NoTrustedProxies)
    ));
    let all: IpNet = "0.0.0.0/0".parse().unwrap();
    let lb: IpNet = "10.0.0.0/8".parse().unwrap();
    assert!(matches!(
        RateLimitLayer::per_ip_behind([lb, all], p()),
        Err(LayerError::TrustsEveryPeer(n)) if n == all
    ));
    let all6: IpNet = "::/0".parse().unwrap();
    assert!(matches!(
        RateLimitLayer::per_ip_behind([all6], p()),
        Err(LayerError::TrustsEveryPeer(_))
    ));
    assert!(RateLimitLayer::per_ip_behind([lb], p()).is_ok());
}
