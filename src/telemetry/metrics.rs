//! The scoped limiter's counters through the [`metrics`] facade (feature `metrics`).
//!
//! Counters are kept per scope kind only when its rule turns them on
//! ([`Rule::counters`](crate::scope::Rule::counters), off by default); a kind without
//! them exports no request or token series (a zero would read as "nothing happened"),
//! only its key gauges. Nothing is recorded on the decision path: the counters the limiter keeps anyway (per
//! key, original vs retry) are summed by scope kind when
//! [`export_metrics`](crate::ScopedLimiter::export_metrics) runs, typically right before a
//! Prometheus scrape is rendered. Labels are bounded: the limiter's name, the scope kind
//! (one value per [`ScopeKind`]), the result and the attempt, never a key (per-key figures stay in
//! [`ScopedLimiter::counters`](crate::ScopedLimiter::counters) and
//! [`for_each_counters`](crate::ScopedLimiter::for_each_counters)).
//!
//! | metric                              | kind    | labels                                   |
//! |-------------------------------------|---------|------------------------------------------|
//! | `tokengate_requests_total`          | counter | limiter, scope_kind, result, attempt     |
//! | `tokengate_tokens_total`            | counter | limiter, scope_kind, result, attempt     |
//! | `tokengate_live_keys`               | gauge   | limiter, scope_kind                      |
//! | `tokengate_evicted_requests`        | gauge   | limiter, scope_kind                      |
//! | `tokengate_overflow_requests`       | gauge   | limiter, scope_kind                      |
//!
//! `result` is `admitted`, `rejected`, or `shadow_rejected` (refused, but served by a
//! caller in shadow mode: [`export_metrics_served`](crate::ScopedLimiter::export_metrics_served);
//! attempt `original` only), `attempt` is `original` or `retry`. Every series has a
//! `# HELP` description. Evicted
//! keys' counts stay in the totals (they are added from
//! [`evicted_counters`](crate::ScopedLimiter::evicted_counters)); `tokengate_evicted_requests`
//! says how many of the requests were counted by keys since evicted.

use std::hash::BuildHasher;

use crate::clock::Clock;
use crate::scope::{PerKind, ScopeKind, ScopedLimiter};
use crate::telemetry::{CounterSnapshot, Tally};

/// The counter names, as exported.
pub const REQUESTS_TOTAL: &str = "tokengate_requests_total";
/// Tokens asked for, by result.
pub const TOKENS_TOTAL: &str = "tokengate_tokens_total";
/// Keys in each kind's map.
pub const LIVE_KEYS: &str = "tokengate_live_keys";
/// Requests counted by keys since evicted.
pub const EVICTED_REQUESTS: &str = "tokengate_evicted_requests";
/// Requests whose key found its map full.
pub const OVERFLOW_REQUESTS: &str = "tokengate_overflow_requests";

/// What a caller served although the limiter refused it (shadow mode), for one scope
/// kind: exported as `result="shadow_rejected"` and taken out of `result="rejected"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Served {
    /// Requests refused by the kind's scope and served anyway.
    pub requests: u64,
    /// The tokens they asked of it.
    pub tokens: u64,
}

impl<C: Clock, S: BuildHasher> ScopedLimiter<C, S> {
    /// Writes the limiter's counters, summed by scope kind, to the installed `metrics`
    /// recorder under the name `limiter` (see [the table](crate::telemetry::metrics)).
    /// Reads every key's counters once: call it when metrics are scraped, not per request.
    pub fn export_metrics(&self, limiter: &str) {
        self.export_metrics_served(limiter, &PerKind::default());
    }

    /// [`export_metrics`](ScopedLimiter::export_metrics), with the refusals of each kind
    /// (a [`PerKind`], indexed by kind) that the caller served anyway (shadow mode): they
    /// are exported as `result="shadow_rejected"` (attempt `original`) and not as
    /// `rejected`. Read `served` before calling: the limiter counts a refusal before
    /// its caller can, so the limiter's `rejected` then holds every refusal in `served`.
    pub fn export_metrics_served(&self, limiter: &str, served: &PerKind<Served>) {
        describe();
        let mut sums = PerKind::<CounterSnapshot>::default();
        self.for_each_counters(|scope, c| sums[scope.kind()] += c);
        for kind in ScopeKind::ALL {
            if self.policy(kind).is_none() {
                continue;
            }
            let k = kind.name();
            let labels = [
                ("limiter", limiter.to_owned()),
                ("scope_kind", k.to_owned()),
            ];
            metrics::gauge!(LIVE_KEYS, &labels).set(self.len(kind) as f64);
            let overflow = self.overflow_counters(kind).total().requests();
            metrics::gauge!(OVERFLOW_REQUESTS, &labels).set(overflow as f64);
            // A kind without counters counted nothing: no series, rather than zeros
            // that read as "nothing happened".
            if !self.counts(kind) {
                continue;
            }
            let evicted = self.evicted_counters(kind);
            let total = sums[kind] + evicted;
            let shadow = served[kind];
            export_tally(limiter, k, "original", &total.original, Some(shadow));
            export_tally(limiter, k, "retry", &total.retry, None);
            metrics::gauge!(EVICTED_REQUESTS, &labels).set(evicted.total().requests() as f64);
        }
    }
}

/// The `# HELP` text of each series (set again on each export: a recorder installed
/// after the first export has it too).
fn describe() {
    metrics::describe_counter!(
        REQUESTS_TOTAL,
        "Requests decided by a scope, by result (admitted, rejected, shadow_rejected: \
         refused but served in shadow mode) and attempt (original, retry)"
    );
    metrics::describe_counter!(
        TOKENS_TOTAL,
        "Tokens asked of a scope by the requests it decided (a request costs its work \
         class's tokens), by result and attempt"
    );
    metrics::describe_gauge!(LIVE_KEYS, "Keys held in the scope kind's map");
    metrics::describe_gauge!(
        EVICTED_REQUESTS,
        "Requests counted by keys since evicted from the scope kind's map (still in the \
         totals)"
    );
    metrics::describe_gauge!(
        OVERFLOW_REQUESTS,
        "Requests whose key found the scope kind's map full"
    );
}

fn export_tally(
    limiter: &str,
    kind: &'static str,
    attempt: &'static str,
    t: &Tally,
    served: Option<Served>,
) {
    let s = served.unwrap_or_default();
    let mut results = vec![
        ("admitted", t.admitted_requests, t.admitted_tokens),
        (
            "rejected",
            t.rejected_requests.saturating_sub(s.requests),
            t.rejected_tokens.saturating_sub(s.tokens),
        ),
    ];
    if served.is_some() {
        results.push(("shadow_rejected", s.requests, s.tokens));
    }
    for (result, requests, tokens) in results {
        let labels = [
            ("limiter", limiter.to_owned()),
            ("scope_kind", kind.to_owned()),
            ("result", result.to_owned()),
            ("attempt", attempt.to_owned()),
        ];
        metrics::counter!(REQUESTS_TOTAL, &labels).absolute(requests);
        metrics::counter!(TOKENS_TOTAL, &labels).absolute(tokens);
    }
}
