//! The Prometheus endpoint of a real server, scraped by a real client: the counters are
//! there, read at scrape time, with bounded labels (never a key).

use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use tokengate::scope::{Rule, RuleSet, ScopeKind, WorkClass};
use tokengate::{ManualClock, Policy};
use tokengate_tower::{Key, RateLimitLayer};

use crate::support::{client, get as fetch, prometheus, serve};

#[tokio::test]
async fn the_scraped_counters_are_labelled_by_scope_kind_never_by_key() {
    let handle = prometheus();
    let limiter = Arc::new(
        RuleSet::new()
            .rule(ScopeKind::Global, counted(Policy::new(100, 1.0).unwrap()))
            .rule(ScopeKind::Tenant, counted(Policy::new(2, 1.0).unwrap()))
            .class(WorkClass::new("metadata", 1))
            .build_with_clock(ManualClock::new())
            .unwrap(),
    );
    let layer = RateLimitLayer::builder(limiter)
        .key(ScopeKind::Tenant, Key::header("x-tenant"))
        .shadow_scope(ScopeKind::Tenant)
        .default_class("metadata")
        .build()
        .unwrap();
    let scrape_layer = layer.clone();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
        .merge(Router::new().route(
            "/metrics",
            get(move || {
                let layer = scrape_layer.clone();
                let handle = handle.clone();
                async move {
                    layer.export_metrics("edge");
                    handle.render()
                }
            }),
        ));
    let addr = serve(app).await;
    let c = client();
    // Tenant 1: 2 admitted, then 1 shadow refusal (admitted by the global scope alone).
    // Tenants 2..=50: one request each. 52 requests, 50 keys.
    for _ in 0..3 {
        assert_eq!(fetch(&c, addr, "/", &[("x-tenant", "1")]).await.status, 200);
    }
    for t in 2..=50 {
        let t = t.to_string();
        assert_eq!(fetch(&c, addr, "/", &[("x-tenant", &t)]).await.status, 200);
    }
    let scrape = fetch(&c, addr, "/metrics", &[]).await;
    assert_eq!(scrape.status, StatusCode::OK);
    let text = scrape.body;
    let has = |line: &str| text.lines().any(|l| l == line);
    assert!(
        has(
            r#"tokengate_requests_total{limiter="edge",scope_kind="global",result="admitted",attempt="original"} 52"#
        ),
        "{text}"
    );
    assert!(
        has(
            r#"tokengate_requests_total{limiter="edge",scope_kind="tenant",result="admitted",attempt="original"} 51"#
        ),
        "{text}"
    );
    assert!(
        has(
            r#"tokengate_requests_total{limiter="edge",scope_kind="tenant",result="shadow_rejected",attempt="original"} 1"#
        ),
        "{text}"
    );
    // The shadow refusal was served: not a `rejected` one.
    assert!(
        has(
            r#"tokengate_requests_total{limiter="edge",scope_kind="tenant",result="rejected",attempt="original"} 0"#
        ),
        "{text}"
    );
    assert!(
        has(r#"tokengate_shadow_rejected_total{limiter="edge",scope_kind="tenant"} 1"#),
        "{text}"
    );
    assert!(
        has(r#"tokengate_live_keys{limiter="edge",scope_kind="tenant"} 50"#),
        "{text}"
    );
    // Bounded labels: every tokengate series is labelled from a fixed set of names, and
    // no value is a tenant's.
    let allowed = ["limiter", "scope_kind", "result", "attempt"];
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("tokengate_"))
        .collect();
    assert!(series.len() >= 10, "{text}");
    for line in &series {
        let Some(labels) = line
            .split_once('{')
            .map(|(_, rest)| rest.split('}').next().unwrap())
        else {
            continue;
        };
        for pair in labels.split(',') {
            let (name, value) = pair.split_once('=').unwrap();
            assert!(allowed.contains(&name), "label {name} in {line}");
            assert!(
                !value.trim_matches('"').starts_with(char::is_numeric),
                "{line}"
            );
        }
    }
    let tenant_series = series
        .iter()
        .filter(|l| {
            l.starts_with("tokengate_requests_total")
                && l.contains(r#"limiter="edge""#)
                && l.contains("\"tenant\"")
        })
        .count();
    // admitted and rejected x 2 attempts, and shadow_rejected (original: the layer
    // decides originals), however many tenants.
    assert_eq!(tenant_series, 5);
}

/// A rule with per-scope counters (off by default).
fn counted(policy: Policy) -> Rule {
    Rule::new(policy).counters(true)
}
