//! The layer and its builder: which key each scope kind takes, the routes, the responses.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use tokengate::http::{Quota, QuotaError};
use tokengate::scope::{ClassId, PerKind, RouteId, Rule, RuleError, RuleSet, ScopeKind};
use tokengate::{Clock, Policy, QuantaClock, ScopedLimiter};
use tower_layer::Layer;

use crate::ip::{Forwarding, IpNet, Proxies};
use crate::key::{Key, KeyHasher, KeyPlan, takes_key};
use crate::remote::RemoteScope;
use crate::response::{Body, MissingKey, Quotas, Refused, problem_missing, problem_refused};
use crate::route::{Route, StatusPredicate};
use crate::service::RateLimit;
use crate::stats::{Counts, EdgeStats};

type RefusalBody = Arc<dyn Fn(&Refused) -> Body + Send + Sync>;
type MissingAnswer = Arc<dyn Fn(&MissingKey) -> (StatusCode, Body) + Send + Sync>;

/// Why [`RateLimitLayerBuilder::build`] refused the configuration.
#[derive(Debug)]
#[non_exhaustive]
pub enum LayerError {
    /// No default work class was given ([`RateLimitLayerBuilder::default_class`]) and
    /// the limiter has several classes.
    NoDefaultClass,
    /// A class name that is not one of the limiter's.
    UnknownClass(String),
    /// A key for a scope kind the limiter has no rule for (it would never be paid), or
    /// for the global or route scopes (which take no request key: the route comes from
    /// the route list).
    KeyWithoutScope(ScopeKind),
    /// A scope's policy cannot be written as a `RateLimit-Policy` quota.
    Quota(ScopeKind, QuotaError),
    /// The limiter of a one-line constructor ([`RateLimitLayer::per_ip`] and the like)
    /// could not be built from its policy.
    Rules(RuleError),
    /// A header name given to [`RateLimitLayer::per_header`] that is not a valid one.
    InvalidHeaderName(String),
    /// A remote scope that does not fit the layer (feature `redis`).
    Remote(String),
    /// [`RateLimitLayer::per_ip_behind`] was given no trusted proxy (use
    /// [`RateLimitLayer::per_ip`] for clients that connect directly).
    NoTrustedProxies,
    /// A trusted-proxy network of prefix 0 given to [`RateLimitLayer::per_ip_behind`]:
    /// every peer would be believed, so any client could pick its key by writing the
    /// forwarding field.
    TrustsEveryPeer(IpNet),
}

impl fmt::Display for LayerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayerError::NoDefaultClass => f.write_str(
                "no default work class: call default_class with one of the limiter's classes",
            ),
            LayerError::UnknownClass(n) => {
                write!(f, "work class {n:?} is not one of the limiter's classes")
            }
            LayerError::KeyWithoutScope(k) => write!(
                f,
                "a key is configured for scope kind {k}, which has no rule in the limiter or \
                 takes no request key (global, route)"
            ),
            LayerError::Quota(k, e) => write!(f, "scope kind {k}: {e}"),
            LayerError::Rules(e) => write!(f, "the limiter's rules: {e}"),
            LayerError::InvalidHeaderName(n) => write!(f, "{n:?} is not a valid header name"),
            LayerError::Remote(m) => write!(f, "remote scope: {m}"),
            LayerError::NoTrustedProxies => {
                f.write_str("no trusted proxy given: use per_ip for clients that connect directly")
            }
            LayerError::TrustsEveryPeer(n) => write!(
                f,
                "trusted proxy network {n} contains every address: any client could pick its key"
            ),
        }
    }
}

impl std::error::Error for LayerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LayerError::Quota(_, e) => Some(e),
            LayerError::Rules(e) => Some(e),
            _ => None,
        }
    }
}

impl From<RuleError> for LayerError {
    fn from(e: RuleError) -> LayerError {
        LayerError::Rules(e)
    }
}

/// What every clone of the layer and its services share.
pub(crate) struct Shared<C: Clock> {
    pub(crate) limiter: Arc<ScopedLimiter<C>>,
    pub(crate) keys: PerKind<Option<Key>>,
    /// The kinds given a key, with it, in kind order (`keys` without the empty ones).
    pub(crate) keyed: Box<[(ScopeKind, Key)]>,
    /// How a request's keys are taken (from `keyed` and `proxies`).
    pub(crate) key_plan: KeyPlan,
    /// The routes in the order added.
    pub(crate) routes: Vec<CompiledRoute>,
    /// The route of every request that matches none of `routes` (its `id` is `None`
    /// unless one was given: then no route scope is paid).
    pub(crate) fallback: CompiledRoute,
    pub(crate) proxies: Proxies,
    pub(crate) ietf: bool,
    pub(crate) admitted_fields: bool,
    pub(crate) legacy: bool,
    pub(crate) shadow_kinds: Vec<ScopeKind>,
    pub(crate) refusal_body: RefusalBody,
    pub(crate) missing: MissingAnswer,
    pub(crate) quotas: Quotas,
    pub(crate) hasher: KeyHasher,
    pub(crate) counts: Counts,
    pub(crate) store_down_admits: bool,
    /// The fleet-wide scope awaited after the local ones admit (feature `redis`).
    pub(crate) remote: Option<RemoteScope>,
}

/// A route's resolved options.
#[derive(Clone)]
pub(crate) struct Options {
    pub(crate) class: ClassId,
    pub(crate) max_wait: Duration,
    pub(crate) refund: Option<StatusPredicate>,
    pub(crate) shadow: bool,
}

pub(crate) struct CompiledRoute {
    pub(crate) route: Route,
    pub(crate) id: Option<RouteId>,
    pub(crate) options: Options,
    /// Whether its requests take the whole decision, decided at build: a shadowed kind,
    /// the admitted fields of several scopes, a remote scope (for every route), or a
    /// refund (its charge).
    pub(crate) whole: bool,
}

/// A tower [`Layer`] that rate-limits requests with a shared [`ScopedLimiter`].
///
/// Cheap to clone: every clone and every service it makes share the one limiter (behind
/// an `Arc`), so axum's per-connection clones all draw from the same buckets.
///
/// ```
/// use std::sync::Arc;
/// use tokengate::Policy;
/// use tokengate::scope::{Rule, RuleSet, ScopeKind, WorkClass};
/// use tokengate_tower::{Key, RateLimitLayer, Route};
///
/// let limiter = Arc::new(
///     RuleSet::new()
///         .rule(ScopeKind::Global, Rule::new(Policy::new(1000, 500.0)?))
///         .rule(ScopeKind::Client, Rule::new(Policy::new(20, 5.0)?)) // per client IP
///         .rule(ScopeKind::Route, Rule::new(Policy::new(100, 50.0)?))
///         .class(WorkClass::new("metadata", 1))
///         .class(WorkClass::new("search", 3))
///         .build()?,
/// );
/// let layer = RateLimitLayer::builder(limiter)
///     .key(ScopeKind::Client, Key::client_ip().ipv6_prefix(64))
///     .route(Route::get("/search").id(1).class("search"))
///     .default_class("metadata")
///     .build()?;
/// // axum: Router::new().route(...).layer(layer)
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RateLimitLayer<C: Clock = QuantaClock> {
    pub(crate) shared: Arc<Shared<C>>,
}

impl<C: Clock> Clone for RateLimitLayer<C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<C: Clock + fmt::Debug> fmt::Debug for RateLimitLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.shared;
        f.debug_struct("RateLimitLayer")
            .field("limiter", &s.limiter)
            .field("keys", &s.keys)
            .field(
                "routes",
                &s.routes.iter().map(|r| &r.route).collect::<Vec<_>>(),
            )
            .field("fallback", &s.fallback.route)
            .field("proxies", &s.proxies)
            .field("shadow_kinds", &s.shadow_kinds)
            .finish_non_exhaustive()
    }
}

impl<S, C: Clock> Layer<S> for RateLimitLayer<C> {
    type Service = RateLimit<S, C>;

    fn layer(&self, inner: S) -> RateLimit<S, C> {
        RateLimit {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<C: Clock> RateLimitLayer<C> {
    /// A builder for a layer over `limiter`.
    pub fn builder(limiter: Arc<ScopedLimiter<C>>) -> RateLimitLayerBuilder<C> {
        RateLimitLayerBuilder {
            limiter,
            keys: Default::default(),
            routes: Vec::new(),
            fallback: Route::fallback(),
            key_secret: None,
            default_class: None,
            default_max_wait: Duration::ZERO,
            default_refund: None,
            shadow: false,
            shadow_kinds: Vec::new(),
            proxies: Proxies::default(),
            ietf: true,
            admitted_fields: true,
            legacy: false,
            refusal_body: Arc::new(problem_refused),
            missing: Arc::new(problem_missing),
            store_down_admits: false,
            remote: None,
        }
    }

    /// The limiter every service of this layer pays.
    pub fn limiter(&self) -> &Arc<ScopedLimiter<C>> {
        &self.shared.limiter
    }

    /// The layer's own counts (shadow refusals, missing keys, delays, refunds).
    pub fn stats(&self) -> EdgeStats {
        self.shared.counts.snapshot()
    }

    /// The scope id a header value or path segment maps to in this layer (`acme` in
    /// `x-tenant: acme` is `tenant:{key_id("acme")}`): to find a client's bucket, e.g.
    /// `limiter.available(&Scope::Tenant(TenantId(layer.key_id("acme"))))`. The mapping
    /// is a keyed hash (see [`Key`]); an id is never its own key.
    pub fn key_id(&self, value: impl AsRef<[u8]>) -> u64 {
        self.shared.hasher.text(value.as_ref())
    }
}

/// The one-line constructors: one limit, one key, on the default clock.
impl RateLimitLayer {
    /// One budget per client address: `policy` for each client IP (an IPv6 /64 is one
    /// client, as one subscriber is usually given a /64). The peer address comes from
    /// axum's `ConnectInfo` (serve with
    /// `into_make_service_with_connect_info::<SocketAddr>()`). Served without it (plain
    /// `into_make_service()`), every request is answered `500 Internal Server Error`
    /// (problem details) and never served unlimited: a server misconfiguration, logged
    /// once at `ERROR` (target `tokengate::edge`, feature `tracing`) and counted in
    /// [`EdgeStats::no_peer_address`]. Behind a proxy, use
    /// [`per_ip_behind`](RateLimitLayer::per_ip_behind).
    ///
    /// Requests that match no route still pay: every request costs 1 token of its
    /// client's bucket. The client addresses are kept in the limiter's `client` scope kind.
    ///
    /// ```
    /// use tokengate::Policy;
    /// use tokengate_tower::RateLimitLayer;
    /// // 10 requests per second per client, bursts of 20.
    /// let layer = RateLimitLayer::per_ip(Policy::new(20, 10.0)?)?;
    /// // axum: Router::new().route(...).layer(layer), served with
    /// // .into_make_service_with_connect_info::<std::net::SocketAddr>()
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`LayerError`] when `policy` cannot be written as a `RateLimit-Policy` quota.
    pub fn per_ip(policy: Policy) -> Result<RateLimitLayer, LayerError> {
        RateLimitLayer::one(
            ScopeKind::Client,
            policy,
            Some(Key::client_ip().ipv6_prefix(64)),
            Vec::new(),
        )
    }

    /// As [`per_ip`](RateLimitLayer::per_ip), behind proxies: a request whose peer is in
    /// one of `proxies` is limited by the client its proxy names in `X-Forwarded-For`
    /// (the rightmost address that is not a listed proxy); any other peer by its own
    /// address, whatever it writes there (see
    /// [`trusted_proxies`](RateLimitLayerBuilder::trusted_proxies)). The
    /// [builder](RateLimitLayer::builder) reads `Forwarded` instead
    /// ([`forwarding`](RateLimitLayerBuilder::forwarding)).
    ///
    /// ```
    /// use tokengate::Policy;
    /// use tokengate_tower::{IpNet, LayerError, RateLimitLayer};
    /// let lb: IpNet = "10.0.0.0/8".parse()?;
    /// let layer = RateLimitLayer::per_ip_behind([lb], Policy::new(20, 10.0)?)?;
    /// # let _ = layer;
    /// assert!(matches!(
    ///     RateLimitLayer::per_ip_behind(Vec::<IpNet>::new(), Policy::new(1, 1.0)?),
    ///     Err(LayerError::NoTrustedProxies)
    /// ));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`LayerError::NoTrustedProxies`] for an empty list,
    /// [`LayerError::TrustsEveryPeer`] for a network of prefix 0 (`0.0.0.0/0`, `::/0`),
    /// and as [`per_ip`](RateLimitLayer::per_ip).
    pub fn per_ip_behind<N: Into<IpNet>>(
        proxies: impl IntoIterator<Item = N>,
        policy: Policy,
    ) -> Result<RateLimitLayer, LayerError> {
        let nets: Vec<IpNet> = proxies.into_iter().map(Into::into).collect();
        if nets.is_empty() {
            return Err(LayerError::NoTrustedProxies);
        }
        if let Some(all) = nets.iter().find(|n| n.as_ipnet().prefix_len() == 0) {
            return Err(LayerError::TrustsEveryPeer(*all));
        }
        RateLimitLayer::one(
            ScopeKind::Client,
            policy,
            Some(Key::client_ip().ipv6_prefix(64)),
            nets,
        )
    }

    /// One budget for the whole service: `policy` shared by every request.
    ///
    /// ```
    /// use tokengate::Policy;
    /// use tokengate_tower::RateLimitLayer;
    /// let layer = RateLimitLayer::global(Policy::new(1000, 500.0)?)?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`per_ip`](RateLimitLayer::per_ip).
    pub fn global(policy: Policy) -> Result<RateLimitLayer, LayerError> {
        RateLimitLayer::one(ScopeKind::Global, policy, None, Vec::new())
    }

    /// One budget per value of header `name` (an API key, say): `policy` for each value,
    /// each value hashed with the layer's secret (see [`Key`]). A request without the
    /// header gets the missing-key answer (400 by default), so leaving it out buys no
    /// fresh budget. The values are kept in the limiter's `api_key` scope kind.
    ///
    /// **A new value is a new, full budget.** A client that may send any value (a
    /// rotating `x-api-key`) gets a fresh bucket per value, so this is an abuse limit
    /// only when the value is authenticated before the layer (a middleware that rejects
    /// unknown keys runs first), or combined with a per-address or global scope (the
    /// [builder](RateLimitLayer::builder): `Key::client_ip()` on another kind, a
    /// `Global` rule).
    ///
    /// ```
    /// use tokengate::Policy;
    /// use tokengate_tower::{LayerError, RateLimitLayer};
    /// let layer = RateLimitLayer::per_header("x-api-key", Policy::new(100, 50.0)?)?;
    /// # let _ = layer;
    /// assert!(matches!(
    ///     RateLimitLayer::per_header("bad header", Policy::new(1, 1.0)?),
    ///     Err(LayerError::InvalidHeaderName(_))
    /// ));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`LayerError::InvalidHeaderName`] for a name that is not a valid header name, and
    /// as [`per_ip`](RateLimitLayer::per_ip).
    pub fn per_header(name: &str, policy: Policy) -> Result<RateLimitLayer, LayerError> {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| LayerError::InvalidHeaderName(name.to_owned()))?;
        RateLimitLayer::one(
            ScopeKind::ApiKey,
            policy,
            Some(Key::header_name(name).required()),
            Vec::new(),
        )
    }

    /// A limiter with one rule (`kind` at `policy`) and the implicit cost-1 class, and a
    /// layer keying `kind` by `key`, believing the forwarding field of `proxies`.
    fn one(
        kind: ScopeKind,
        policy: Policy,
        key: Option<Key>,
        proxies: Vec<IpNet>,
    ) -> Result<RateLimitLayer, LayerError> {
        let limiter = RuleSet::new().rule(kind, Rule::new(policy)).build()?;
        let mut builder = RateLimitLayer::builder(Arc::new(limiter)).trusted_proxies(proxies);
        if let Some(key) = key {
            builder = builder.key(kind, key);
        }
        builder.build()
    }
}

/// Configures a [`RateLimitLayer`].
pub struct RateLimitLayerBuilder<C: Clock = QuantaClock> {
    limiter: Arc<ScopedLimiter<C>>,
    keys: PerKind<Option<Key>>,
    routes: Vec<Route>,
    fallback: Route,
    key_secret: Option<[u8; 16]>,
    default_class: Option<String>,
    default_max_wait: Duration,
    default_refund: Option<StatusPredicate>,
    shadow: bool,
    shadow_kinds: Vec<ScopeKind>,
    proxies: Proxies,
    ietf: bool,
    admitted_fields: bool,
    legacy: bool,
    refusal_body: RefusalBody,
    missing: MissingAnswer,
    store_down_admits: bool,
    pub(crate) remote: Option<RemoteScope>,
}

impl<C: Clock> fmt::Debug for RateLimitLayerBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("keys", &self.keys)
            .field("routes", &self.routes)
            .field("default_class", &self.default_class)
            .finish_non_exhaustive()
    }
}

impl<C: Clock> RateLimitLayerBuilder<C> {
    /// Where the key of `kind` comes from (tenant, user, API key, client address; a
    /// tenant-route scope is paid when both a tenant and a route are known).
    pub fn key(mut self, kind: ScopeKind, key: Key) -> Self {
        self.keys[kind] = Some(key);
        self
    }

    /// Adds a route; routes are tried in the order added.
    pub fn route(mut self, route: Route) -> Self {
        self.routes.push(route);
        self
    }

    /// The route of requests that match no other (paths that exist but are not listed,
    /// and 404s): its class, delay, refund and shadow options apply to them; its method
    /// and pattern are not used. By default [`Route::fallback`]: **no route scope**, the
    /// default class. Unmatched requests still pay the global and per-key scopes (so a
    /// client's 404s spend that client's budget), but share no route budget: one route
    /// budget for every unlisted path would let one client's junk requests refuse every
    /// other client's. A fallback given an id pays that route scope
    /// (`.fallback(Route::fallback().id(9))` is `route:9`, one budget for all unmatched
    /// requests of all clients). To count them without refusing:
    /// `.fallback(Route::fallback().shadow(true))`. Listed routes number from 1 by
    /// default.
    pub fn fallback(mut self, route: Route) -> Self {
        self.fallback = route;
        self
    }

    /// The secret of the keyed hash that maps keys to scope ids (see [`Key`]): random per
    /// process by default. Give every process of a fleet that shares remote scopes the
    /// same secret, so that a client has one id, and one budget, everywhere. Keep it like
    /// a password: whoever knows it can compute the id of any key.
    pub fn key_secret(mut self, secret: [u8; 16]) -> Self {
        self.key_secret = Some(secret);
        self
    }

    /// The work class of routes that set none, and of the fallback route. Not needed
    /// when the limiter has one class (the implicit one of a rule set given none).
    pub fn default_class(mut self, name: &str) -> Self {
        self.default_class = Some(name.to_owned());
        self
    }

    /// Delay instead of refusing, up to `max_wait`, for requests whose route does not set
    /// its own ([`Route::max_wait`]). Zero (the default) refuses at once.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.default_max_wait = max_wait;
        self
    }

    /// Gives the tokens back when the inner service answers with a status for which
    /// `refund` is true, for routes that do not set their own ([`Route::refund_on`]).
    pub fn refund_on(
        mut self,
        refund: impl Fn(StatusCode) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.default_refund = Some(Arc::new(refund));
        self
    }

    /// Shadow mode for every request (routes may override with [`Route::shadow`]):
    /// decide, count in [`EdgeStats::shadow_rejected`], log, and admit.
    ///
    /// A shadow refusal debits nothing: the decision is all-or-nothing, so a refused
    /// request took no token from any scope.
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
    }

    /// Shadow mode for one scope kind: when it refuses, the refusal is counted and the
    /// request is decided again by the other scopes alone (which then enforce, and are
    /// debited if they admit). The shadowed scope is debited only when the whole request
    /// is admitted with it.
    pub fn shadow_scope(mut self, kind: ScopeKind) -> Self {
        if !self.shadow_kinds.contains(&kind) {
            self.shadow_kinds.push(kind);
        }
        self
    }

    /// Proxies whose forwarding field is believed: only a request whose peer is in one
    /// of these networks has its client taken from it (a client that connects directly
    /// gets its own address, whatever it writes there). The field is `X-Forwarded-For`
    /// unless [`forwarding`](RateLimitLayerBuilder::forwarding) names another.
    /// The [`ipnet`](crate::ipnet) crate's networks convert with `IpNet::from`.
    pub fn trusted_proxies(mut self, nets: impl IntoIterator<Item = IpNet>) -> Self {
        self.proxies.nets.extend(nets);
        self
    }

    /// Which field the trusted proxies write the client into
    /// ([`Forwarding::XForwardedFor`] by default, the field nginx, HAProxy and most load
    /// balancers write). Only that field is read: a proxy passes on the other one as the
    /// client wrote it. [`Forwarding::Either`] is unsafe unless every trusted proxy
    /// strips or rewrites both fields.
    pub fn forwarding(mut self, forwarding: Forwarding) -> Self {
        self.proxies.forwarding = forwarding;
        self
    }

    /// Whether to write the IETF `RateLimit-Policy` / `RateLimit` fields (on by default).
    pub fn ietf_headers(mut self, on: bool) -> Self {
        self.ietf = on;
        self
    }

    /// Whether admitted responses carry the rate-limit fields too (on by default;
    /// refusals always do).
    pub fn admitted_headers(mut self, on: bool) -> Self {
        self.admitted_fields = on;
        self
    }

    /// Also write the legacy `x-ratelimit-limit`, `x-ratelimit-remaining` and
    /// `x-ratelimit-reset` fields, for the scope with the fewest tokens left (off by
    /// default).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.legacy = on;
        self
    }

    /// Builds the body of a 429: a content type and the bytes (RFC 9457 problem details
    /// by default, see [`problem_refused`](crate::problem_refused)).
    pub fn refusal_body(mut self, f: impl Fn(&Refused) -> Body + Send + Sync + 'static) -> Self {
        self.refusal_body = Arc::new(f);
        self
    }

    /// The answer to a request missing a required key (or with a malformed forwarding
    /// chain): a status and a body (400 with problem details by default).
    pub fn missing_key(
        mut self,
        f: impl Fn(&MissingKey) -> (StatusCode, Body) + Send + Sync + 'static,
    ) -> Self {
        self.missing = Arc::new(f);
        self
    }

    /// The answer to a request missing a required key: `status` with a problem-details
    /// body.
    pub fn missing_key_status(self, status: StatusCode) -> Self {
        self.missing_key(move |m| {
            let body = format!(
                r#"{{"type":"about:blank","status":{},"detail":"no {} key: {}"}}"#,
                status.as_u16(),
                m.kind,
                m.error
            );
            (
                status,
                (
                    HeaderValue::from_static("application/problem+json"),
                    Bytes::from(body),
                ),
            )
        })
    }

    /// What a request gets while the limiter's remote store (its
    /// [`Rule::remote`](tokengate::scope::Rule::remote) kinds) cannot decide: `false`
    /// (the default) answers `503 Service Unavailable` with `Retry-After` (the store's
    /// wait in whole seconds, rounded up, at least 1) and a problem-details body; `true`
    /// serves the request on its local scopes alone, paid again without the remote
    /// kinds (a local refusal is still a 429). Either way the event is counted
    /// ([`EdgeStats::store_unavailable`](crate::EdgeStats::store_unavailable)). Other
    /// limiter errors (a clock that stepped back) answer `500`.
    pub fn store_unavailable_admits(mut self, on: bool) -> Self {
        self.store_down_admits = on;
        self
    }

    /// Checks the configuration against the limiter and builds the layer.
    ///
    /// # Errors
    ///
    /// [`LayerError`]: no default class (for a limiter of several classes), an unknown
    /// class name, a key for a kind without a rule, a policy that does not fit the
    /// `RateLimit` fields.
    pub fn build(self) -> Result<RateLimitLayer<C>, LayerError> {
        let limiter = self.limiter;
        let class = |name: &str| {
            limiter
                .class(name)
                .ok_or_else(|| LayerError::UnknownClass(name.to_owned()))
        };
        let default_class = match &self.default_class {
            Some(name) => class(name)?,
            None => limiter.sole_class().ok_or(LayerError::NoDefaultClass)?,
        };
        let default = Options {
            class: default_class,
            max_wait: self.default_max_wait,
            refund: self.default_refund,
            shadow: self.shadow,
        };
        for kind in ScopeKind::ALL {
            let keyed = self.keys[kind].is_some();
            if keyed && (!takes_key(kind) || limiter.policy(kind).is_none()) {
                return Err(LayerError::KeyWithoutScope(kind));
            }
        }
        let compile = |route: Route, id: Option<RouteId>| {
            let o = &route.options;
            let options = Options {
                class: match &o.class {
                    Some(n) => class(n)?,
                    None => default.class,
                },
                max_wait: o.max_wait.unwrap_or(default.max_wait),
                refund: o.refund.clone().or_else(|| default.refund.clone()),
                shadow: o.shadow.unwrap_or(default.shadow),
            };
            Ok::<_, LayerError>(CompiledRoute {
                id,
                route,
                options,
                whole: false,
            })
        };
        let mut routes = Vec::with_capacity(self.routes.len());
        for (i, route) in self.routes.into_iter().enumerate() {
            let id = RouteId(route.id.unwrap_or(i as u64 + 1));
            routes.push(compile(route, Some(id))?);
        }
        let fallback_id = self.fallback.id.map(RouteId);
        let mut fallback = compile(self.fallback, fallback_id)?;
        if let Some(remote) = &self.remote {
            let classes = routes.iter().chain([&fallback]).map(|r| r.options.class);
            let keyed = self.keys[remote.kind()].is_some();
            remote.check(&limiter, classes, keyed, self.key_secret.is_some())?;
            // A delayed request is served once its local reservation is ready, without a
            // remote decision: refused here rather than let it skip the fleet's scope.
            if routes
                .iter()
                .chain([&fallback])
                .any(|r| !r.options.max_wait.is_zero())
            {
                return Err(LayerError::Remote(
                    "a route that delays (max_wait) cannot pay a remote scope: delayed \
                     requests would skip it"
                        .to_owned(),
                ));
            }
        }
        let mut by_kind: PerKind<Option<Quota>> = Default::default();
        for kind in ScopeKind::ALL {
            if let Some(p) = limiter.policy(kind) {
                by_kind[kind] =
                    Some(Quota::new(kind.name(), p).map_err(|e| LayerError::Quota(kind, e))?);
            }
        }
        let one_quota = by_kind.iter().filter(|q| q.is_some()).count() == 1;
        let whole_decision = !self.shadow_kinds.is_empty()
            || (self.admitted_fields && !one_quota)
            || self.remote.is_some();
        for r in routes.iter_mut().chain([&mut fallback]) {
            r.whole = whole_decision || r.options.refund.is_some();
        }
        let keyed: Box<[(ScopeKind, Key)]> = ScopeKind::ALL
            .into_iter()
            .filter_map(|kind| self.keys[kind].clone().map(|key| (kind, key)))
            .collect();
        let key_plan = KeyPlan::new(&keyed, &self.proxies);
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                limiter,
                keys: self.keys,
                keyed,
                key_plan,
                routes,
                fallback,
                proxies: self.proxies,
                ietf: self.ietf,
                admitted_fields: self.admitted_fields,
                legacy: self.legacy,
                shadow_kinds: self.shadow_kinds,
                refusal_body: self.refusal_body,
                missing: self.missing,
                quotas: Quotas::new(by_kind),
                hasher: match self.key_secret {
                    Some(secret) => KeyHasher::with_secret(secret),
                    None => KeyHasher::process(),
                },
                counts: Counts::default(),
                store_down_admits: self.store_down_admits,
                remote: self.remote,
            }),
        })
    }
}
