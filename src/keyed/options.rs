//! The options of a keyed map, shared by [`KeyedBuilder`](crate::keyed::KeyedBuilder) and
//! the scope rules ([`Rule`](crate::scope::Rule)), with one set of defaults.

use crate::keyed::{Eviction, Overflow};

/// The default maximum number of keys of a map built from a [`Rule`](crate::scope::Rule)
/// (2^20).
pub const DEFAULT_MAX_KEYS: usize = 1 << 20;

/// How a keyed map is bounded and what it keeps: the most keys, the shard count, what a
/// new key gets when the map is full, which buckets may be evicted, and whether per-key
/// counters are kept.
///
/// The defaults: [`Overflow::Reject`], [`Eviction::Lossless`], the default shard count,
/// counters off (they cost an atomic add per decision and 64 bytes per key; switch them
/// on where per-key observability is wanted).
///
/// ```
/// use tokengate::keyed::{KeyedOptions, Overflow};
/// let options = KeyedOptions::new(10_000).counters(true);
/// assert_eq!(options.max_keys_value(), 10_000);
/// assert!(options.counters_on());
/// assert_eq!(options.overflow_value(), Overflow::Reject);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KeyedOptions {
    pub(crate) max_keys: usize,
    pub(crate) shards: Option<usize>,
    pub(crate) overflow: Overflow,
    pub(crate) eviction: Eviction,
    pub(crate) counters: bool,
}

impl KeyedOptions {
    /// At most `max_keys` keys, every other option at its default.
    pub fn new(max_keys: usize) -> KeyedOptions {
        KeyedOptions {
            max_keys,
            shards: None,
            overflow: Overflow::Reject,
            eviction: Eviction::Lossless,
            counters: false,
        }
    }

    /// The most keys (validated when the map is built: at least 1).
    pub fn max_keys(mut self, max_keys: usize) -> KeyedOptions {
        self.max_keys = max_keys;
        self
    }

    /// Number of shards, a power of two up to [`MAX_SHARDS`](crate::keyed::MAX_SHARDS)
    /// (validated when the map is built). The default is four per hardware thread, rounded
    /// up to a power of two, at least 4 and at most 256. A sweep blocks one shard at a
    /// time.
    pub fn shards(mut self, shards: usize) -> KeyedOptions {
        self.shards = Some(shards);
        self
    }

    /// What a new key gets when the map is full (default [`Overflow::Reject`]).
    pub fn overflow(mut self, overflow: Overflow) -> KeyedOptions {
        self.overflow = overflow;
        self
    }

    /// Which buckets sweeps may evict (default [`Eviction::Lossless`]).
    pub fn eviction(mut self, eviction: Eviction) -> KeyedOptions {
        self.eviction = eviction;
        self
    }

    /// Keeps per-key counters (admitted and rejected requests and tokens, original and
    /// retry; 64 bytes per key). Off by default.
    pub fn counters(mut self, on: bool) -> KeyedOptions {
        self.counters = on;
        self
    }

    /// The most keys.
    pub fn max_keys_value(&self) -> usize {
        self.max_keys
    }

    /// What a new key gets when the map is full.
    pub fn overflow_value(&self) -> Overflow {
        self.overflow
    }

    /// Which buckets sweeps may evict.
    pub fn eviction_value(&self) -> Eviction {
        self.eviction
    }

    /// Whether per-key counters are kept.
    pub fn counters_on(&self) -> bool {
        self.counters
    }
}
