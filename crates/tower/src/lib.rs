//! A tower layer for [tokengate]: scoped token-bucket rate limits at the HTTP edge, for
//! axum and hyper.
//!
//! The common cases take one line: [`RateLimitLayer::per_ip`],
//! [`RateLimitLayer::global`], [`RateLimitLayer::per_header`].
//!
//! ```
//! use axum::{Router, routing::get};
//! use tokengate::Policy;
//! use tokengate_tower::RateLimitLayer;
//!
//! // 10 requests per second per client IP, bursts of 20.
//! let layer = RateLimitLayer::per_ip(Policy::new(20, 10.0)?)?;
//! let app: Router = Router::new().route("/", get(|| async { "ok" })).layer(layer);
//! // Serve with app.into_make_service_with_connect_info::<std::net::SocketAddr>().
//! # let _ = app;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Every key taken from a request becomes its scope id through one keyed hash under a
//! per-process secret ([`Key`]): an id seen in a response or a log is no way to another
//! client's bucket. A `GET` route matches `HEAD`; requests no route matches go through
//! the [fallback route](RateLimitLayerBuilder::fallback): limited by the global and
//! per-key scopes, with no route budget shared by every client unless given an id. Behind
//! [trusted proxies](RateLimitLayerBuilder::trusted_proxies), only `X-Forwarded-For` is
//! read unless [`Forwarding`] names another field.
//!
//! The full builder:
//!
//! One [`RateLimitLayer`] wraps a [`ScopedLimiter`](tokengate::ScopedLimiter) behind an
//! `Arc`: every clone of the layer and of its services pays the same buckets. Per request
//! it extracts the keys ([`Key`]: client IP with an IPv6 prefix and trusted proxies, a
//! header, a path segment, a closure), matches a [`Route`] (the route scope and the work
//! class, i.e. the cost), decides all scopes at once, and then:
//!
//! - **admits**: calls the inner service and adds `RateLimit-Policy` / `RateLimit` (and
//!   optionally the legacy `x-ratelimit-*`) fields; gives the tokens back when the
//!   response status matches the route's [`refund_on`](Route::refund_on);
//! - **refuses**: answers `429` with `Retry-After` (whole seconds, rounded up, never 0)
//!   and the refusing scope's fields, and a body from a hook (problem details by default);
//! - **delays** (routes with [`max_wait`](Route::max_wait)): takes an owned reservation
//!   and sleeps on tokio's timer; a client that hangs up cancels it (its tokens come
//!   back on each scope where no request reserved after it);
//! - **shadow** ([`shadow`](RateLimitLayerBuilder::shadow),
//!   [`shadow_scope`](RateLimitLayerBuilder::shadow_scope), [`Route::shadow`]): counts
//!   and logs the refusal, and admits;
//! - **store down** (a limiter with remote scopes whose store cannot decide): answers
//!   `503` with the store's `Retry-After`, or, with
//!   [`store_unavailable_admits`](RateLimitLayerBuilder::store_unavailable_admits),
//!   serves the request on its local scopes alone; counted either way.
//!
//! ```
//! use std::sync::Arc;
//! use tokengate::Policy;
//! use tokengate::scope::{Rule, RuleSet, ScopeKind, WorkClass};
//! use tokengate_tower::{Key, RateLimitLayer, Route};
//!
//! let limiter = Arc::new(RuleSet::new()
//!     .rule(ScopeKind::Global, Rule::new(Policy::new(2000, 1000.0)?))
//!     .rule(ScopeKind::Tenant, Rule::new(Policy::new(100, 20.0)?))
//!     .rule(ScopeKind::Client, Rule::new(Policy::new(30, 10.0)?)) // per client IP
//!     .class(WorkClass::new("metadata", 1))
//!     .class(WorkClass::new("export", 20))
//!     .build()?);
//! let layer = RateLimitLayer::builder(limiter)
//!     .key(ScopeKind::Tenant, Key::header("x-tenant").required())
//!     .key(ScopeKind::Client, Key::client_ip().ipv6_prefix(64))
//!     .trusted_proxies(["10.0.0.0/8".parse()?])
//!     .route(Route::post("/export").class("export").refund_on(|s| s.is_server_error()))
//!     .default_class("metadata")
//!     .legacy_headers(true)
//!     .build()?;
//! // let app = axum::Router::new().route("/export", post(export)).layer(layer);
//! # let _ = layer;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The peer address comes from axum's `ConnectInfo<SocketAddr>` (serve with
//! `into_make_service_with_connect_info::<SocketAddr>()`), or a `SocketAddr` / `IpAddr`
//! the server put in the request extensions.

#![warn(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    rust_2018_idioms
)]
#![doc(test(attr(deny(warnings))))]

mod ip;
mod key;
mod layer;
mod remote;
mod response;
mod route;
mod service;
mod stats;

pub use ip::{Forwarding, IpNet, IpNetError};
pub use ipnet;
pub use key::{Head, Key, KeyError};
pub use layer::{LayerError, RateLimitLayer, RateLimitLayerBuilder};
#[cfg(feature = "redis")]
pub use remote::RemoteScope;
pub use response::{
    Body, MissingKey, Refused, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
    problem_missing, problem_refused, retry_after_seconds,
};
pub use route::Route;
pub use service::{RateLimit, ResponseFuture};
pub use stats::EdgeStats;

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The workspace README's examples (the engine's quick start and this crate's one-line
/// axum setup), compiled and run as doc tests here, where both crates and axum are in
/// reach.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct WorkspaceReadmeDoctests;
