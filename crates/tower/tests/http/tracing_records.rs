//! Decision records reach `tracing` with the seed's field names.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::get;
use tokengate::scope::{Rule, RuleSet, ScopeKind, WorkClass};
use tokengate::{ManualClock, Policy};
use tokengate_tower::{Key, RateLimitLayer};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

use crate::support::{client, get as fetch, serve};

/// Records every event of target `tokengate` as `name=value` pairs.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<EventFields>>>);

/// One event's fields as `(name, value)`.
type EventFields = Vec<(String, String)>;

struct Fields(Vec<(String, String)>);

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
        self.0.lock().unwrap().push(f.0);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[tokio::test] // current-thread: the server's tasks see this thread's subscriber
async fn a_refusal_is_a_tracing_event_with_the_seeds_fields() {
    // `tracing` keeps each callsite's interest process-wide, computed when the callsite
    // is first hit. With at most one dispatcher registered it asks only the hitting
    // thread's default, so another test of this binary reaching the refusal's callsite
    // first, with no subscriber, would switch it off for every thread. A second
    // dispatcher, alive for the test, makes every registration ask all of them (this
    // test's capture too), and the rebuild recomputes the callsites already hit.
    let _anchor = tracing::Dispatch::new(Capture::default());
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    tracing::callsite::rebuild_interest_cache();
    let limiter = Arc::new(
        RuleSet::new()
            .rule(ScopeKind::Tenant, Rule::new(Policy::new(3, 1.0).unwrap()))
            .class(WorkClass::new("search", 3))
            .build_with_clock(ManualClock::new())
            .unwrap(),
    );
    let layer = RateLimitLayer::builder(limiter)
        .key(ScopeKind::Tenant, Key::header("x-tenant"))
        .default_class("search")
        .build()
        .unwrap();
    let tenant_42 = layer.key_id("42");
    let addr = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    let c = client();
    assert_eq!(
        fetch(&c, addr, "/", &[("x-tenant", "42")]).await.status,
        200
    );
    assert_eq!(
        fetch(&c, addr, "/", &[("x-tenant", "42")]).await.status,
        429
    );
    let events = capture.0.lock().unwrap().clone();
    let rejected: Vec<_> = events
        .iter()
        .filter(|e| e.iter().any(|(k, v)| k == "result" && v == "rejected"))
        .collect();
    assert_eq!(rejected.len(), 1, "{events:?}");
    let names: Vec<&str> = rejected[0].iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "limiter",
            "result",
            "bucket_capacity",
            "refill_per_second",
            "token_cost",
            "tokens_remaining",
            "attempt"
        ]
    );
    let value = |k: &str| rejected[0].iter().find(|(n, _)| n == k).unwrap().1.clone();
    assert_eq!(value("limiter"), format!("tenant:{tenant_42}"));
    assert_eq!(value("bucket_capacity"), "3");
    assert_eq!(value("token_cost"), "3");
    assert_eq!(value("attempt"), "original");
    // The admission is an event too (at DEBUG).
    assert!(
        events
            .iter()
            .any(|e| e.iter().any(|(k, v)| k == "result" && v == "admitted"))
    );
}
