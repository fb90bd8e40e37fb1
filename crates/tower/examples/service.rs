//! An axum service behind tokengate's layer: global, tenant, API-key and route scopes,
//! work classes (metadata 1, search 3, export 20), and a Prometheus endpoint.
//!
//! ```text
//! cargo run -p tokengate-tower --example service        # listens on 127.0.0.1:3000
//! curl -i -H 'x-tenant: 42' -H 'x-api-key: k1' localhost:3000/search
//! curl localhost:3000/metrics
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use http::StatusCode;
use metrics_exporter_prometheus::PrometheusBuilder;
use tokengate::scope::{Rule, RuleSet, ScopeKind, WorkClass};
use tokengate::{Policy, PolicyError};
use tokengate_tower::{Key, RateLimitLayer, Route};

/// `capacity` tokens, `rate` per second, reservations up to 2 s ahead (for delay mode).
fn policy(capacity: u64, rate: f64) -> Result<Policy, PolicyError> {
    Policy::builder(capacity, rate)
        .max_reservation(Duration::from_secs(2))
        .build()
}

fn counted(policy: Policy) -> Rule {
    Rule::new(policy).counters(true)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    let limiter = Arc::new(
        RuleSet::new()
            .rule(ScopeKind::Global, counted(policy(1000, 500.0)?))
            .rule(ScopeKind::Tenant, counted(policy(100, 20.0)?))
            .rule(ScopeKind::ApiKey, counted(policy(60, 10.0)?))
            .rule(ScopeKind::Route, counted(policy(500, 100.0)?))
            .class(WorkClass::new("metadata", 1))
            .class(WorkClass::new("search", 3))
            .class(WorkClass::new("export", 20))
            .build()?,
    );
    let layer = RateLimitLayer::builder(limiter)
        .key(ScopeKind::Tenant, Key::header("x-tenant").required())
        .key(ScopeKind::ApiKey, Key::header("x-api-key"))
        .route(Route::get("/items/{id}").id(1).class("metadata"))
        .route(Route::get("/search").id(2).class("search"))
        .route(
            Route::post("/export")
                .id(3)
                .class("export")
                .max_wait(Duration::from_secs(2)) // wait up to 2 s rather than refuse
                .refund_on(|s| s.is_server_error()), // a failed export costs nothing
        )
        .default_class("metadata")
        .build()?;
    let scrape = layer.clone();
    let app = Router::new()
        .route("/items/{id}", get(|| async { "item\n" }))
        .route("/search", get(|| async { "results\n" }))
        .route(
            "/export",
            post(|| async { (StatusCode::ACCEPTED, "export queued\n") }),
        )
        .layer(layer)
        .merge(Router::new().route(
            "/metrics",
            get(move || {
                let (layer, prometheus) = (scrape.clone(), prometheus.clone());
                async move {
                    layer.export_metrics("api");
                    prometheus.render()
                }
            }),
        ));
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
