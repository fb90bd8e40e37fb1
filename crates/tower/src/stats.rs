//! The layer's own counts: what the engine's counters cannot see (shadow refusals,
//! missing keys, delays, refunds, admissions near the limit, an unavailable remote store). Each is a relaxed atomic
//! add on an event that is not the common path (an admission far from the limit adds
//! nothing); they are read at scrape time.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use tokengate::scope::ScopeKind;

/// A copy of the layer's counts at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EdgeStats {
    /// Refusals in shadow mode (the request was admitted), by the refusing scope kind
    /// (indexed as [`ScopeKind::ALL`]).
    pub shadow_rejected: [u64; 6],
    /// Admissions that left the scope with less than a tenth of its capacity, by kind.
    pub near_limit: [u64; 6],
    /// Requests answered with the missing-key response, by the kind whose key was
    /// missing.
    pub missing_key: [u64; 6],
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
        self.shadow_rejected[kind as usize]
    }
}

#[derive(Default)]
pub(crate) struct Counts {
    shadow_rejected: [CachePadded<AtomicU64>; 6],
    near_limit: [CachePadded<AtomicU64>; 6],
    missing_key: [CachePadded<AtomicU64>; 6],
    delayed: CachePadded<AtomicU64>,
    delay_cancelled: CachePadded<AtomicU64>,
    refunded: CachePadded<AtomicU64>,
    store_unavailable: CachePadded<AtomicU64>,
}

impl Counts {
    pub(crate) fn shadow_rejected(&self, kind: ScopeKind) {
        self.shadow_rejected[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn near_limit(&self, kind: ScopeKind) {
        self.near_limit[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn missing_key(&self, kind: ScopeKind) {
        self.missing_key[kind as usize].fetch_add(1, Ordering::Relaxed);
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
            |a: &[CachePadded<AtomicU64>; 6]| std::array::from_fn(|i| a[i].load(Ordering::Relaxed));
        EdgeStats {
            shadow_rejected: read(&self.shadow_rejected),
            near_limit: read(&self.near_limit),
            missing_key: read(&self.missing_key),
            delayed: self.delayed.load(Ordering::Relaxed),
            delay_cancelled: self.delay_cancelled.load(Ordering::Relaxed),
            refunded: self.refunded.load(Ordering::Relaxed),
            store_unavailable: self.store_unavailable.load(Ordering::Relaxed),
        }
    }
}
