//! The scoped limiter's counters through the [`metrics`] facade (feature `metrics`).
//!
//! Counters are kept per scope kind only when its rule turns them on
//! ([`Rule::counters`](crate::scope::Rule::counters), off by default); kinds without
//! them export zeros. Nothing is recorded on the decision path: the counters the limiter keeps anyway (per
//! key, original vs retry) are summed by scope kind when
//! [`export_metrics`](crate::ScopedLimiter::export_metrics) runs, typically right before a
//! Prometheus scrape is rendered. Labels are bounded: the limiter's name, the scope kind
//! (six values), the result and the attempt, never a key (per-key figures stay in
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
//! `result` is `admitted` or `rejected`, `attempt` is `original` or `retry`. Evicted
//! keys' counts stay in the totals (they are added from
//! [`evicted_counters`](crate::ScopedLimiter::evicted_counters)); `tokengate_evicted_requests`
//! says how many of the requests were counted by keys since evicted.

use std::hash::BuildHasher;

use crate::clock::Clock;
use crate::scope::{ScopeKind, ScopedLimiter};
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

impl<C: Clock, S: BuildHasher> ScopedLimiter<C, S> {
    /// Writes the limiter's counters, summed by scope kind, to the installed `metrics`
    /// recorder under the name `limiter` (see [the table](crate::telemetry::metrics)).
    /// Reads every key's counters once: call it when metrics are scraped, not per request.
    pub fn export_metrics(&self, limiter: &str) {
        let mut sums = [CounterSnapshot::default(); 6];
        self.for_each_counters(|scope, c| sums[scope.kind() as usize] += c);
        for kind in ScopeKind::ALL {
            if self.policy(kind).is_none() {
                continue;
            }
            let evicted = self.evicted_counters(kind);
            let total = sums[kind as usize] + evicted;
            let k = kind.name();
            for (attempt, tally) in [("original", total.original), ("retry", total.retry)] {
                export_tally(limiter, k, attempt, &tally);
            }
            let labels = [
                ("limiter", limiter.to_owned()),
                ("scope_kind", k.to_owned()),
            ];
            metrics::gauge!(LIVE_KEYS, &labels).set(self.len(kind) as f64);
            metrics::gauge!(EVICTED_REQUESTS, &labels).set(evicted.total().requests() as f64);
            let overflow = self.overflow_counters(kind).total().requests();
            metrics::gauge!(OVERFLOW_REQUESTS, &labels).set(overflow as f64);
        }
    }
}

fn export_tally(limiter: &str, kind: &'static str, attempt: &'static str, t: &Tally) {
    for (result, requests, tokens) in [
        ("admitted", t.admitted_requests, t.admitted_tokens),
        ("rejected", t.rejected_requests, t.rejected_tokens),
    ] {
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
