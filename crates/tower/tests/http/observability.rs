//! What the operator sees: a kind without counters exports no series, every series has
//! its `# HELP`, refusals are DEBUG events (a flood of refusals is no flood of INFO
//! lines), a shadow refusal is its own result.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use tokengate::scope::{Rule, RuleSet, ScopeKind, WorkClass};
use tokengate::{ManualClock, Policy};
use tokengate_tower::{Key, RateLimitLayer};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

use crate::support::{client, get as fetch, prometheus, serve};

#[tokio::test]
async fn a_kind_without_counters_exports_no_series_and_every_series_is_described() {
    let handle = prometheus();
    let limiter = Arc::new(
        RuleSet::new()
            // No counters on the global scope.
            .rule(ScopeKind::Global, Rule::new(Policy::new(100, 1.0).unwrap()))
            .rule(
                ScopeKind::Tenant,
                Rule::new(Policy::new(1, 1.0).unwrap()).counters(true),
            )
            .class(WorkClass::new("metadata", 1))
            .build_with_clock(ManualClock::new())
            .unwrap(),
    );
    let layer = RateLimitLayer::builder(limiter)
        .key(ScopeKind::Tenant, Key::header("x-tenant"))
        .default_class("metadata")
        .build()
        .unwrap();
    let scrape = layer.clone();
    let addr = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    let c = client();
    for t in ["a", "b", "c"] {
        assert_eq!(fetch(&c, addr, "/", &[("x-tenant", t)]).await.status, 200);
    }
    assert_eq!(
        fetch(&c, addr, "/", &[("x-tenant", "a")]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    scrape.export_metrics("uncounted");
    let text = handle.render();
    let ours: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(r#"limiter="uncounted""#))
        .collect();
    // The global scope admitted 3 requests but counts nothing: no series says 0.
    assert!(
        !ours
            .iter()
            .any(|l| l.starts_with("tokengate_requests_total")
                && l.contains(r#"scope_kind="global""#)),
        "{text}"
    );
    assert!(
        !ours.iter().any(
            |l| l.starts_with("tokengate_tokens_total") && l.contains(r#"scope_kind="global""#)
        ),
        "{text}"
    );
    assert!(ours.contains(
        &r#"tokengate_requests_total{limiter="uncounted",scope_kind="tenant",result="admitted",attempt="original"} 3"#
    ), "{text}");
    assert!(ours.contains(
        &r#"tokengate_requests_total{limiter="uncounted",scope_kind="tenant",result="rejected",attempt="original"} 1"#
    ), "{text}");
    // The key gauge is kept: the map holds keys whether or not it counts.
    assert!(
        ours.contains(&r#"tokengate_live_keys{limiter="uncounted",scope_kind="tenant"} 3"#),
        "{text}"
    );
    // Every tokengate metric has its description.
    let names: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| l.starts_with("tokengate_"))
        .map(|l| l.split(['{', ' ']).next().unwrap())
        .collect();
    assert!(names.len() >= 10, "{text}");
    for name in names {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("# HELP {name} "))),
            "no # HELP for {name}: {text}"
        );
    }
}

/// Every event of a `tokengate` target: its level, target and fields.
#[derive(Clone, Default)]
pub(crate) struct Capture(pub(crate) Arc<Mutex<Vec<Captured>>>);

/// One event: its level, its target, its fields as `(name, value)`.
pub(crate) type Captured = (Level, String, Vec<(String, String)>);

pub(crate) struct Fields(Vec<(String, String)>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
}

impl Subscriber for Capture {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.target().starts_with("tokengate")
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, e: &Event<'_>) {
        let mut f = Fields(Vec::new());
        e.record(&mut f);
        let m = e.metadata();
        self.0
            .lock()
            .unwrap()
            .push((*m.level(), m.target().to_owned(), f.0));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[tokio::test] // current-thread: the server's tasks see this thread's subscriber
async fn refusals_and_shadow_refusals_are_debug_events() {
    // See `tracing_records`: a second dispatcher makes every callsite ask this test's.
    let _anchor = tracing::Dispatch::new(Capture::default());
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    tracing::callsite::rebuild_interest_cache();
    let limiter = Arc::new(
        RuleSet::new()
            .rule(ScopeKind::Global, Rule::new(Policy::new(2, 1.0).unwrap()))
            .rule(ScopeKind::Tenant, Rule::new(Policy::new(1, 1.0).unwrap()))
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
    let addr = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    let c = client();
    // Admitted; shadow-refused by the tenant (served); refused by the global scope.
    assert_eq!(fetch(&c, addr, "/", &[("x-tenant", "t")]).await.status, 200);
    assert_eq!(fetch(&c, addr, "/", &[("x-tenant", "t")]).await.status, 200);
    assert_eq!(
        fetch(&c, addr, "/", &[("x-tenant", "u")]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let events = capture.0.lock().unwrap().clone();
    let result = |e: &Captured, r: &str| {
        // A `&str` field reads quoted, a `Display` one bare.
        e.2.iter()
            .any(|(k, v)| k == "result" && v.trim_matches('"') == r)
    };
    let rejected: Vec<_> = events.iter().filter(|e| result(e, "rejected")).collect();
    let shadow: Vec<_> = events
        .iter()
        .filter(|e| result(e, "shadow_rejected"))
        .collect();
    // The tenant's refusal (later served) and the global scope's.
    assert_eq!(rejected.len(), 2, "{events:?}");
    assert_eq!(shadow.len(), 1, "{events:?}");
    for e in rejected.iter().chain(&shadow) {
        assert_eq!(e.0, Level::DEBUG, "{e:?}");
    }
    // Nothing above DEBUG: three requests, no INFO line.
    assert!(
        events
            .iter()
            .all(|e| e.0 == Level::DEBUG || e.0 == Level::TRACE),
        "{events:?}"
    );
}
