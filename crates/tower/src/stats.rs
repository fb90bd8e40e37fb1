//! The layer's own counts: what the engine's counters cannot see (shadow refusals,
//! missing keys, delays, refunds, admissions near the limit, an unavailable remote store). Each is a relaxed atomic
//! add on an event that is not the common path (an admission far from the limit adds
//! nothing); they are read at scrape time.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use tokengate::scope::{PerKind, ScopeKind};

/// A copy of the layer's counts at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EdgeStats {
    /// Refusals in shadow mode (the request was admitted), by the refusing scope kind
    /// (a [`PerKind`], indexed by [`ScopeKind`]).
    pub shadow_rejected: PerKind<u64>,
    /// The tokens those shadow refusals asked of the refusing scope, by kind.
    pub shadow_rejected_tokens: PerKind<u64>,
    /// Admissions that left their tightest scope (the one with the fewest whole tokens
    /// left) with less than a tenth of its quota, by that scope's kind.
    pub near_limit: PerKind<u64>,
    /// Requests answered with the missing-key response, by the kind whose key was
    /// missing.
    pub missing_key: PerKind<u64>,
    /// Requests answered `500` because a [`Key::client_ip`](crate::Key::client_ip) scope
    /// found no peer address in the request (the server does not record it: serve with
    /// `into_make_service_with_connect_info::<SocketAddr>()`), by kind.
    pub no_peer_address: PerKind<u64>,
    /// Requests answered `503` because the scope's key map was full of keys that could
    /// not be released ([`Refusal::KeyLimit`](tokengate::scope::Refusal::KeyLimit)), by
    /// kind.
    pub key_limit: PerKind<u64>,
    /// Requests that waited (delay mode) and were then served.
    pub delayed: u64,
    /// Delayed requests dropped before their time (client gone): their tokens were
    /// given back.
    pub delay_cancelled: u64,
    /// Admissions whose tokens were given back on the inner service's status.
    pub refunded: u64,
    /// Requests that found the limiter's remote store unable to decide: answered 503,
    /// or served on their local scopes alone
    /// ([`store_unavailable_admits`](crate::RateLimitLayerBuilder::store_unavailable_admits)).
    pub store_unavailable: u64,
}

impl EdgeStats {
    /// Shadow refusals by `kind`.
    pub fn shadow_rejected(&self, kind: ScopeKind) -> u64 {
        self.shadow_rejected[kind]
    }
}

#[derive(Default)]
pub(crate) struct Counts {
    shadow_rejected: PerKind<CachePadded<AtomicU64>>,
    shadow_rejected_tokens: PerKind<CachePadded<AtomicU64>>,
    near_limit: PerKind<CachePadded<AtomicU64>>,
    missing_key: PerKind<CachePadded<AtomicU64>>,
    no_peer_address: PerKind<CachePadded<AtomicU64>>,
    key_limit: PerKind<CachePadded<AtomicU64>>,
    /// Whether the missing peer address was logged (once per layer: the cause is the
    /// server's set-up, the same for every request).
    no_peer_logged: AtomicBool,
    delayed: CachePadded<AtomicU64>,
    delay_cancelled: CachePadded<AtomicU64>,
    refunded: CachePadded<AtomicU64>,
    store_unavailable: CachePadded<AtomicU64>,
}

impl Counts {
    pub(crate) fn shadow_rejected(&self, kind: ScopeKind, cost: u64) {
        self.shadow_rejected[kind].fetch_add(1, Ordering::Relaxed);
        self.shadow_rejected_tokens[kind].fetch_add(cost, Ordering::Relaxed);
    }

    /// Counts a request without a peer address; true the first time (to be logged).
    pub(crate) fn no_peer_address(&self, kind: ScopeKind) -> bool {
        self.no_peer_address[kind].fetch_add(1, Ordering::Relaxed);
        !self.no_peer_logged.swap(true, Ordering::Relaxed)
    }

    pub(crate) fn key_limit(&self, kind: ScopeKind) {
        self.key_limit[kind].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn near_limit(&self, kind: ScopeKind) {
        self.near_limit[kind].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn missing_key(&self, kind: ScopeKind) {
        self.missing_key[kind].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn delayed(&self) {
        self.delayed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn delay_cancelled(&self) {
        self.delay_cancelled.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn refunded(&self) {
        self.refunded.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn store_unavailable(&self) {
        self.store_unavailable.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> EdgeStats {
        let read =
            |a: &PerKind<CachePadded<AtomicU64>>| a.each_ref().map(|c| c.load(Ordering::Relaxed));
        EdgeStats {
            shadow_rejected: read(&self.shadow_rejected),
            shadow_rejected_tokens: read(&self.shadow_rejected_tokens),
            near_limit: read(&self.near_limit),
            missing_key: read(&self.missing_key),
            no_peer_address: read(&self.no_peer_address),
            key_limit: read(&self.key_limit),
            delayed: self.delayed.load(Ordering::Relaxed),
            delay_cancelled: self.delay_cancelled.load(Ordering::Relaxed),
            refunded: self.refunded.load(Ordering::Relaxed),
            store_unavailable: self.store_unavailable.load(Ordering::Relaxed),
        }
    }
}

#[cfg(feature = "metrics")]
impl<C: tokengate::Clock> crate::RateLimitLayer<C> {
    /// Writes the limiter's counters
    /// ([`ScopedLimiter::export_metrics_served`](tokengate::ScopedLimiter::export_metrics_served))
    /// and the layer's own to the installed `metrics` recorder, labelled by `limiter` and
    /// scope kind only, each with its `# HELP` text. Call it when metrics are scraped.
    ///
    /// A shadow refusal was served: the limiter's `tokengate_requests_total` and
    /// `tokengate_tokens_total` count it as `result="shadow_rejected"`, not `rejected`.
    /// A kind whose rule keeps no counters has no request or token series at all.
    ///
    /// The layer's own: `tokengate_shadow_rejected_total`, `tokengate_near_limit_total`,
    /// `tokengate_missing_key_total`, `tokengate_no_peer_address_total`,
    /// `tokengate_key_limit_total` (by scope kind), `tokengate_delayed_total`,
    /// `tokengate_delay_cancelled_total`, `tokengate_refunded_total`,
    /// `tokengate_store_unavailable_total`.
    pub fn export_metrics(&self, limiter: &str) {
        // The layer's counts first: the limiter counts a refusal before the layer does,
        // so its `rejected` then holds every shadow refusal read here.
        let s = self.stats();
        let served = ScopeKind::ALL.map(|kind| tokengate::telemetry::metrics::Served {
            requests: s.shadow_rejected[kind],
            tokens: s.shadow_rejected_tokens[kind],
        });
        let shared = &self.shared;
        shared.limiter.export_metrics_served(limiter, &served);
        describe();
        for kind in ScopeKind::ALL {
            if shared.limiter.policy(kind).is_none() {
                continue;
            }
            let labels = [
                ("limiter", limiter.to_owned()),
                ("scope_kind", kind.name().to_owned()),
            ];
            metrics::counter!("tokengate_shadow_rejected_total", &labels)
                .absolute(s.shadow_rejected[kind]);
            metrics::counter!("tokengate_near_limit_total", &labels).absolute(s.near_limit[kind]);
            metrics::counter!("tokengate_missing_key_total", &labels).absolute(s.missing_key[kind]);
            metrics::counter!("tokengate_no_peer_address_total", &labels)
                .absolute(s.no_peer_address[kind]);
            metrics::counter!("tokengate_key_limit_total", &labels).absolute(s.key_limit[kind]);
        }
        let labels = [("limiter", limiter.to_owned())];
        metrics::counter!("tokengate_delayed_total", &labels).absolute(s.delayed);
        metrics::counter!("tokengate_delay_cancelled_total", &labels).absolute(s.delay_cancelled);
        metrics::counter!("tokengate_refunded_total", &labels).absolute(s.refunded);
        metrics::counter!("tokengate_store_unavailable_total", &labels)
            .absolute(s.store_unavailable);
    }
}

#[cfg(feature = "metrics")]
fn describe() {
    use metrics::describe_counter;
    describe_counter!(
        "tokengate_shadow_rejected_total",
        "Requests a scope refused in shadow mode and the layer served anyway"
    );
    describe_counter!(
        "tokengate_near_limit_total",
        "Admissions that left the scope with less than a tenth of its quota"
    );
    describe_counter!(
        "tokengate_missing_key_total",
        "Requests answered with the missing-key response (no key, or a malformed one)"
    );
    describe_counter!(
        "tokengate_no_peer_address_total",
        "Requests answered 500: a client-address scope found no peer address (serve with \
         connect info)"
    );
    describe_counter!(
        "tokengate_key_limit_total",
        "Requests answered 503: the scope kind's key map was full"
    );
    describe_counter!(
        "tokengate_delayed_total",
        "Requests delayed (max_wait) and then served"
    );
    describe_counter!(
        "tokengate_delay_cancelled_total",
        "Delayed requests dropped before their time (their tokens given back)"
    );
    describe_counter!(
        "tokengate_refunded_total",
        "Admissions whose tokens were given back on the response status"
    );
    describe_counter!(
        "tokengate_store_unavailable_total",
        "Requests that found the remote store unable to decide"
    );
}
