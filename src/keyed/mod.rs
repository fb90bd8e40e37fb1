//! Keyed limiters: one bucket per key, in a sharded hash map with a hard maximum number of
//! keys. The design is documented on [`KeyedLimiter`].

mod epoch;
mod handle;
mod options;
mod readers;
mod reserve;
mod table;

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};

/// The default hasher of keyed maps: aHash, keyed with random seeds from the operating
/// system per process and per map (see [the hasher](KeyedLimiter#the-hasher)).
pub type KeyHasher = ahash::RandomState;
use std::marker::PhantomData;
use std::time::Duration;

use crate::attempt::Attempt;
use crate::bucket::{Core, RawBucket};
use crate::clock::{Clock, Monotonic, QuantaClock};
use crate::decision::Decision;
use crate::error::AcquireError;
use crate::hint::cold_path;
use crate::inherit::Inherit;
use crate::policy::Policy;
use crate::telemetry::{CounterCells, CounterRef, CounterSnapshot, StripedCounters};

use crate::epoch::Pinned;
pub(crate) use epoch::convert_between;
use epoch::{Epochs, MapEpoch};
pub(crate) use handle::{Handle, Held};
pub use options::{DEFAULT_MAX_KEYS, KeyedOptions};
pub use reserve::{KeyedCharge, KeyedReserveError};
pub use table::SweepReport;

use table::{Extra, Found, MAX_SHARD_BITS, SweepCtx, Table, full_at};
pub(crate) use table::{Fenced, Sections};

/// The most shards a keyed map may have (2^10).
pub const MAX_SHARDS: usize = 1 << MAX_SHARD_BITS;

/// What a new key gets when the map is at its maximum and nothing can be evicted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Overflow {
    /// Refuse the request with [`KeyedError::KeyLimit`] (or a
    /// [`Refusal::KeyLimit`](crate::scope::Refusal::KeyLimit) in a scoped limiter). The default.
    Reject,
    /// Charge the request to one bucket shared by every key that found the map full, with
    /// this policy: a flood of new keys then shares one budget instead of getting a fresh
    /// burst each.
    Share(Policy),
}

/// Which buckets a sweep may remove. Either way, only buckets that have refilled to full.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Eviction {
    /// Only when a fresh bucket would be identical: full buckets of start-full policies.
    /// Evicts nothing under a start-empty policy. The default.
    #[default]
    Lossless,
    /// Full buckets under any policy: under a start-empty policy a key that comes back
    /// starts empty, losing the credit it had accumulated (never gaining any).
    Full,
}

/// Why a keyed operation refused to decide. Nothing changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyedError {
    /// The bucket refused with an error: a cost above the capacity. A clock that steps
    /// back is never an error: the map reads its clock through a
    /// [`Monotonic`] guard, so it is time standing still, and
    /// [`AcquireError::ClockWentBackwards`] is never returned.
    Acquire(AcquireError),
    /// The key is new, the overflow policy is [`Overflow::Reject`], and no bucket in
    /// the map could be evicted to make room: the map held its maximum of `max_keys`
    /// keys when the request last looked, and no bucket in any shard had refilled to
    /// full at the request's clock reading (or the [`Eviction`] mode evicts nothing:
    /// a start-empty policy under [`Eviction::Lossless`]). Each shard is examined once,
    /// as it is at that moment; a bucket that fills later (or that a concurrent refund
    /// fills) is found by a later request. Retry later: keys are evicted as their
    /// buckets refill, and a rejection's wait is at most the fill time.
    KeyLimit {
        /// The map's maximum number of keys.
        max_keys: usize,
    },
}

impl From<AcquireError> for KeyedError {
    fn from(e: AcquireError) -> Self {
        KeyedError::Acquire(e)
    }
}

impl fmt::Display for KeyedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyedError::Acquire(e) => e.fmt(f),
            KeyedError::KeyLimit { max_keys } => write!(
                f,
                "the key is new and the map already holds its maximum of {max_keys} keys, \
                 none of them evictable"
            ),
        }
    }
}

impl std::error::Error for KeyedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KeyedError::Acquire(e) => Some(e),
            KeyedError::KeyLimit { .. } => None,
        }
    }
}

/// Why a keyed limiter's configuration is invalid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyedConfigError {
    /// `max_keys` is zero.
    ZeroMaxKeys,
    /// The shard count is not a power of two between 1 and [`MAX_SHARDS`].
    Shards(usize),
}

impl fmt::Display for KeyedConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyedConfigError::ZeroMaxKeys => f.write_str("max_keys must be at least 1, got 0"),
            KeyedConfigError::Shards(n) => write!(
                f,
                "shard count must be a power of two between 1 and {MAX_SHARDS}, got {n}"
            ),
        }
    }
}

impl std::error::Error for KeyedConfigError {}

/// Builds a [`KeyedLimiter`]; see [`KeyedLimiter::builder`].
pub struct KeyedBuilder<K, C = QuantaClock, S = KeyHasher> {
    policy: Policy,
    options: KeyedOptions,
    clock: C,
    hasher: S,
    key: PhantomData<fn() -> K>,
}

impl<K, C: fmt::Debug, S> fmt::Debug for KeyedBuilder<K, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBuilder")
            .field("policy", &self.policy)
            .field("options", &self.options)
            .field("clock", &self.clock)
            .finish()
    }
}

impl<K, C, S> KeyedBuilder<K, C, S> {
    /// Uses `clock` (the default is [`QuantaClock`]).
    pub fn clock<C2: Clock>(self, clock: C2) -> KeyedBuilder<K, C2, S> {
        KeyedBuilder {
            policy: self.policy,
            options: self.options,
            clock,
            hasher: self.hasher,
            key: PhantomData,
        }
    }

    /// Uses `hasher` (the default is [`KeyHasher`]; see
    /// [the hasher](KeyedLimiter#the-hasher) before choosing another).
    pub fn hasher<S2: BuildHasher>(self, hasher: S2) -> KeyedBuilder<K, C, S2> {
        KeyedBuilder {
            policy: self.policy,
            options: self.options,
            clock: self.clock,
            hasher,
            key: PhantomData,
        }
    }

    /// Replaces every map option with `options` (its `max_keys` included).
    pub fn options(mut self, options: KeyedOptions) -> Self {
        self.options = options;
        self
    }

    /// See [`KeyedOptions::shards`].
    pub fn shards(mut self, shards: usize) -> Self {
        self.options = self.options.shards(shards);
        self
    }

    /// See [`KeyedOptions::overflow`].
    pub fn overflow(mut self, overflow: Overflow) -> Self {
        self.options = self.options.overflow(overflow);
        self
    }

    /// See [`KeyedOptions::eviction`].
    pub fn eviction(mut self, eviction: Eviction) -> Self {
        self.options = self.options.eviction(eviction);
        self
    }

    /// See [`KeyedOptions::counters`] (off by default).
    pub fn counters(mut self, on: bool) -> Self {
        self.options = self.options.counters(on);
        self
    }

    /// Builds the limiter.
    ///
    /// # Errors
    ///
    /// [`KeyedConfigError`] for a zero `max_keys` or an invalid shard count.
    pub fn build(self) -> Result<KeyedLimiter<K, C, S>, KeyedConfigError>
    where
        C: Clock,
    {
        let KeyedOptions {
            max_keys,
            shards,
            overflow,
            eviction,
            counters,
        } = self.options;
        if max_keys == 0 {
            return Err(KeyedConfigError::ZeroMaxKeys);
        }
        let shards = shards.unwrap_or_else(default_shards);
        if !shards.is_power_of_two() || shards > MAX_SHARDS {
            return Err(KeyedConfigError::Shards(shards));
        }
        let bits = shards.trailing_zeros();
        let store = if counters {
            Store::Counted(Table::new(bits, max_keys, self.hasher))
        } else {
            Store::Bare(Table::new(bits, max_keys, self.hasher))
        };
        let clock = Monotonic::new(self.clock);
        // The guard's first mark: the map counts time from its creation.
        clock.now_nanos();
        let overflow_bucket = match overflow {
            Overflow::Reject => None,
            Overflow::Share(p) => Some(Core::new(p, clock.now_nanos(), None)),
        };
        let evict = self.policy.starts_full() || eviction == Eviction::Full;
        Ok(KeyedLimiter {
            store,
            epochs: Epochs::new(MapEpoch::first(self.policy, clock.now_nanos(), evict)),
            switching: std::sync::Mutex::new(()),
            eviction,
            clock,
            overflow,
            overflow_bucket,
            overflow_counts: StripedCounters::new(),
            evicted_counts: CounterCells::default(),
        })
    }
}

fn default_shards() -> usize {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    (threads * 4).next_power_of_two().clamp(4, 256)
}

enum Store<K, S> {
    Bare(Table<K, (), S>),
    Counted(Table<K, CounterCells, S>),
}

/// A reader section announced for a key ([`KeyedLimiter::announce`]): the key's hash
/// and shard, for [`KeyedLimiter::hold`] once the sections' fence is made.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Announced {
    hash: u64,
    shard: usize,
}

/// Runs `$body` with `$t` bound to the map's table, whichever extra it stores.
macro_rules! with_table {
    ($store:expr, $t:ident => $body:expr) => {
        match $store {
            Store::Bare($t) => $body,
            Store::Counted($t) => $body,
        }
    };
}

/// A map's shard write guards while its barrier is held, whichever extra its table
/// stores (none under the loom mutant that skips the barrier).
enum Guards<'a, K> {
    Skipped,
    Bare(Vec<table::ShardWrite<'a, K, ()>>),
    Counted(Vec<table::ShardWrite<'a, K, CounterCells>>),
}

/// A map's reconfiguration barrier while it is held ([`KeyedLimiter::begin_switch`]):
/// no operation runs on the map until it is dropped. Meanwhile the switch may move keys
/// in and out ([`take`](Switch::take), [`put`](Switch::put)).
pub(crate) struct Switch<'a, K, C: Clock, S> {
    map: &'a KeyedLimiter<K, C, S>,
    // Dropped in order: the shards first, then the pin, then the map's reconfiguration
    // lock.
    shards: Guards<'a, K>,
    /// Holds the epochs the switch reads (the one it replaces, and the one it publishes)
    /// while it lasts.
    pin: Pinned<'a, MapEpoch>,
    _one: std::sync::MutexGuard<'a, ()>,
}

/// Runs `$body` with `$t` bound to the switched map's table and `$g` to its guards,
/// whichever extra it stores; `$none` under the mutant that skips the barrier.
macro_rules! with_guards {
    ($switch:expr, $t:ident, $g:ident => $body:expr, $none:expr) => {
        match (&$switch.map.store, &mut $switch.shards) {
            (Store::Bare($t), Guards::Bare($g)) => $body,
            (Store::Counted($t), Guards::Counted($g)) => $body,
            _ => $none,
        }
    };
}

impl<K: Hash + Eq + Send + Sync, C: Clock, S: BuildHasher> Switch<'_, K, C, S> {
    /// The map's current policy (the one its words are converted to while the barrier
    /// is held, until [`publish`](Switch::publish)).
    pub(crate) fn policy(&self) -> &Policy {
        &self.map.epochs.current_while(&self.pin).policy
    }

    /// The map's key bound less its keys: how many keys [`put`](Switch::put) can add.
    pub(crate) fn room(&self) -> usize {
        self.map.max_keys().saturating_sub(self.map.len())
    }

    /// Whether `key` has a bucket in the map.
    pub(crate) fn contains(&mut self, key: &K) -> bool {
        with_guards!(self, t, g => {
            let hash = t.hash_of(key);
            t.contains_in(&g[t.shard_index(hash)], hash, key)
        }, false)
    }

    /// Removes `key`'s bucket from the map: its word in the map's current policy (its
    /// shard converted to it first) and its counters, if the map keeps them.
    // One body for both tables: the bare one's extra is `()`.
    #[allow(clippy::unit_arg)]
    pub(crate) fn take(&mut self, key: &K) -> Option<(u64, Option<CounterCells>)> {
        let epoch = self.map.epochs.current_while(&self.pin);
        with_guards!(self, t, g => {
            let hash = t.hash_of(key);
            let i = t.shard_index(hash);
            t.bring_up_to(i, &mut g[i], epoch);
            t.remove(&mut g[i], hash, key)
                .map(|e| (e.bucket.load(), e.extra.into_cells()))
        }, None)
    }

    /// Gives `key` the bucket `word` (of the map's current policy; its shard converted
    /// to it first), with `counts` as its counters if it gets a new entry and the map
    /// keeps them. `false`, with nothing changed, when the key is new and the map full.
    // One body for both tables: the bare one's extra is `()`.
    #[allow(clippy::unit_arg)]
    pub(crate) fn put(&mut self, key: K, word: u64, counts: Option<CounterCells>) -> bool {
        let epoch = self.map.epochs.current_while(&self.pin);
        with_guards!(self, t, g => {
            let hash = t.hash_of(&key);
            let i = t.shard_index(hash);
            t.bring_up_to(i, &mut g[i], epoch);
            t.put(i, &mut g[i], hash, key, word, Extra::from_cells(counts))
        }, false)
    }

    /// Adds a moved key's counters to the map's evicted counts (as an evicted key's).
    pub(crate) fn fold_counts(&self, cells: &CounterCells) {
        self.fold_snapshot(&cells.snapshot());
    }

    /// Adds `counts` to the map's evicted counts.
    pub(crate) fn fold_snapshot(&self, counts: &CounterSnapshot) {
        self.map.evicted_counts.add(counts);
    }

    /// Removes every key (a tier's map whose keys all moved to other maps), their
    /// counts added to the map's evicted ones.
    pub(crate) fn clear(&mut self) {
        let evicted = &self.map.evicted_counts;
        with_guards!(self, t, g => {
            for shard in g.iter_mut() {
                t.clear(shard, evicted);
            }
        }, ())
    }

    /// The map's evicted keys' counts (see [`KeyedLimiter::evicted_counters`]).
    pub(crate) fn evicted(&self) -> CounterSnapshot {
        self.map.evicted_counts.snapshot()
    }

    /// Publishes the epoch of `policy` from the switch reading `at`, as
    /// [`finish_switch`](KeyedLimiter::finish_switch), keeping the barrier held: words
    /// [`put`](Switch::put) afterwards are of `policy`.
    pub(crate) fn publish(&self, policy: Policy, inherit: Inherit, at: u64) {
        let map = self.map;
        let evict = policy.starts_full() || map.eviction == Eviction::Full;
        let at = map.clock.observe(at);
        map.epochs.push(policy, at, inherit, evict);
    }
}

/// Where a key's request goes: its own bucket (or the shared overflow bucket), or
/// nowhere because the map is full.
pub(crate) enum Slot<'a, C> {
    Bucket(Handle<'a, C>),
    Full {
        max_keys: usize,
    },
    /// The caller's check failed before a new key was inserted
    /// ([`KeyedLimiter::with_slot_if`]; never from [`KeyedLimiter::with_slot`]).
    Stale,
}

/// One token bucket per key, for any `K: Hash + Eq`, with at most `max_keys` keys.
///
/// Every key gets a bucket of the same [`Policy`] on first use. See the
/// sections below for the hot path, memory per key, eviction, overflow and the hasher.
///
/// ```
/// use std::time::Duration;
/// use tokengate::{KeyedLimiter, ManualClock, Policy};
///
/// let clock = ManualClock::new();
/// let limiter = KeyedLimiter::<u64, _>::builder(Policy::new(10, 1.0)?, 100_000)
///     .clock(clock.clone())
///     .build()?;
/// assert!(limiter.try_acquire(&1, 10)?.is_admitted());
/// assert!(limiter.try_acquire(&1, 1)?.is_rejected()); // key 1 is drained...
/// assert!(limiter.try_acquire(&2, 10)?.is_admitted()); // ...key 2 is not
/// assert_eq!(limiter.len(), 2);
///
/// // Once refilled to full, a bucket is identical to a fresh one: the sweep evicts it.
/// clock.advance(Duration::from_secs(11));
/// assert_eq!(limiter.sweep().evicted, 2);
/// assert_eq!(limiter.len(), 0);
/// assert!(limiter.try_acquire(&1, 10)?.is_admitted());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Hot path
///
/// A decision on an existing key ([`try_acquire`](KeyedLimiter::try_acquire)) hashes it
/// once (the same hash picks the shard and drives the probe, see below), enters a
/// *reader section* of the shard instead of locking it (the thread's own record in the
/// map stores the shard, a `SeqCst` fence, the shard's writing flag is read: no atomic
/// read-modify-write; a writer sets the flag and waits until no record names its shard,
/// so it never changes a shard a section reads), finds the entry, reads the clock (after
/// the lookup, so that the reading overlaps the lookup's cache misses) and runs the
/// bucket's CAS, the path's one read-modify-write. A thread without a record (more live
/// threads than the map has records: four per core, 16 to 256) or finding a writer
/// there takes the read side of the shard's
/// [`ShardedLock`](crossbeam_utils::sync::ShardedLock) instead, as every other read does
/// (each thread locks its own cache-padded inner lock, so readers on different cores do
/// not bounce one line). Nothing is allocated. A new key is the slow path: the shard's
/// write lock, a second look, and an insertion.
///
/// # Memory
///
/// An entry is the key and the bare 8-byte bucket word (plus 64 bytes of counters when
/// they are on); the policy, its layout and the clock live once per map. With `u64` keys
/// an entry is 16 bytes in a hashbrown table: one control byte per slot, at most 7/8 of
/// the slots full, a power-of-two slot count per shard, so the bytes per key move between
/// about 19.4 (tables just full) and 38.9 (just grown) as keys are added.
///
/// governor's keyed limiter (DashMap, also hashbrown) stores the same 16 bytes per key
/// at the same load factor; 16 bytes is the floor for a 64-bit key and a 64-bit state.
/// The measured bytes per key, side by side with governor, are in
/// BENCHMARKS.md in the repository
/// (`cargo run --release --example bytes_per_key`).
///
/// # Bounded memory and eviction
///
/// A map never holds more than its `max_keys`. A bucket that has refilled to full is
/// identical to a fresh bucket of a start-full policy, so removing it loses nothing: when
/// the key comes back it gets a full bucket, which is what it would have had. A sweep of
/// a shard removes such buckets and rewrites every bucket it keeps refilled to the sweep's
/// time ("re-anchoring"; exact, since refill is exact on the tick grid).
///
/// A new key at the maximum first sweeps its own shard, then, if that freed nothing, the
/// other shards in turn, until one evicts a bucket; room for the new key is claimed in
/// the same step, so no other new key can take it. Each shard keeps a hint, the earliest
/// time any of its buckets can be full (exact on the tick grid, brought forward by new
/// keys and refunds), so the search skips a shard that has nothing to evict with one
/// atomic load, and sweeps only shards that hold a full bucket or whose hint has come
/// due; a sweep that evicts nothing moves its shard's hint past the request's time. A
/// new key is refused only when no shard has a bucket to evict (see
/// [`KeyedError::KeyLimit`]).
///
/// Below the maximum, idle keys are released as new keys come: a new key whose shard
/// holds twice the entries its last sweep left (and at least 32) sweeps that shard first
/// when the shard's hint has come due. A sweep of `n` entries thus follows at least
/// `n / 2` new keys of its shard (amortised constant work per new key, none for a key
/// already present), and a shard holds about twice its active keys, or 32, once its
/// idle ones have refilled: memory follows the active keys, not every key ever seen.
///
/// Re-anchoring also keeps a keyed bucket from idling past the tick wrap (see
/// [`state`](crate::state)), and the map does it by itself: every operation compares its
/// clock reading with the time the next re-anchoring pass is due (one atomic load, no
/// lock), and the first operation at or after that time runs the pass over every shard
/// before it goes on (operations arriving meanwhile wait for it). Passes are about half
/// the [`max_sweep_interval`](KeyedLimiter::max_sweep_interval) apart (days for the
/// shortest wraps, years for ordinary policies), so a pass costs one scan of the map per
/// period, paid by one request. A map left untouched for so long that the pass comes
/// due later than the fill time after its due time holds only buckets idle for longer
/// than the fill time, full however their words read after the wrap: that pass evicts
/// them (or rewrites them full when the [`Eviction`] mode keeps them). Calling
/// [`sweep`](KeyedLimiter::sweep) is never needed for correctness; it frees memory
/// sooner.
///
/// For a start-empty policy no eviction is lossless: a key that comes back starts empty,
/// while its kept bucket would have refilled. [`Eviction::Lossless`] (the default) then
/// evicts nothing; [`Eviction::Full`] evicts full buckets anyway, so a returning key
/// starts empty again: it loses its accumulated credit and never gains any.
///
/// When the map is at its maximum and nothing can be evicted, a new key meets the map's
/// [`Overflow`] policy: rejected with [`KeyedError::KeyLimit`] (the default), or charged
/// to one shared overflow bucket. Keys already in the map keep their buckets throughout.
///
/// # The hasher
///
/// Keys are often chosen by clients (user ids, API keys), so the default hasher,
/// [`KeyHasher`] (aHash's `RandomState`), is keyed with random seeds the operating system
/// provides, per process and per map, so an attacker cannot precompute keys that collide
/// in the table or crowd one shard, at a fraction of the cost of std's SipHash-1-3
/// (which governor's keyed limiter uses; see BENCHMARKS.md). The hasher is a
/// type parameter: pass `std::hash::RandomState` for SipHash's stronger, proven keyed
/// PRF; foldhash's `RandomState` (hashbrown's default) seeds itself from address-space
/// layout and the time, and its authors state it does not resist an interactive attacker,
/// so keep it for keys you trust.
pub struct KeyedLimiter<K, C: Clock = QuantaClock, S = KeyHasher> {
    store: Store<K, S>,
    /// The map's policies over time ([`reconfigure`](KeyedLimiter::reconfigure)); the
    /// current one holds the re-anchoring passes every operation checks (one relaxed
    /// load) before it locks a shard (see [`crate::pass`]).
    epochs: Epochs,
    /// Serializes reconfigurations; no operation takes it.
    switching: std::sync::Mutex<()>,
    clock: Monotonic<C>,
    overflow: Overflow,
    /// The shared overflow bucket ([`Overflow::Share`]): a bucket of its own policy,
    /// with its own re-anchoring passes (its wrap and fill time are its policy's), run
    /// by the first request that reaches it once one is due.
    overflow_bucket: Option<Core>,
    overflow_counts: StripedCounters,
    evicted_counts: CounterCells,
    eviction: Eviction,
}

impl<K, C: Clock + fmt::Debug, S> fmt::Debug for KeyedLimiter<K, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("policy", &self.policy())
            .field("len", &self.len())
            .field("max_keys", &self.max_keys())
            .field("overflow", &self.overflow)
            .field("clock", &self.clock)
            .finish()
    }
}

impl<K> KeyedLimiter<K> {
    /// A limiter of at most `max_keys` keys, each with a bucket of `policy`, on the
    /// default clock and hasher, rejecting new keys when full.
    ///
    /// ```
    /// use tokengate::{KeyedLimiter, Policy};
    /// let limiter = KeyedLimiter::new(Policy::new(100, 1000.0)?, 1 << 20)?;
    /// assert!(limiter.try_acquire("alice", 1)?.is_admitted());
    /// assert!(limiter.contains("alice"));
    /// # let _: &KeyedLimiter<String> = &limiter;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`KeyedConfigError::ZeroMaxKeys`] for a zero `max_keys`.
    pub fn new(policy: Policy, max_keys: usize) -> Result<KeyedLimiter<K>, KeyedConfigError> {
        KeyedLimiter::builder(policy, max_keys).build()
    }

    /// A builder for a limiter with options: clock, hasher, shards, overflow, eviction,
    /// counters.
    pub fn builder(policy: Policy, max_keys: usize) -> KeyedBuilder<K> {
        KeyedBuilder {
            policy,
            options: KeyedOptions::new(max_keys),
            clock: QuantaClock::new(),
            hasher: KeyHasher::new(),
            key: PhantomData,
        }
    }
}

impl<K: Hash + Eq + Send + Sync, C: Clock, S: BuildHasher> KeyedLimiter<K, C, S> {
    /// Takes `cost` tokens from `key`'s bucket, creating the bucket on first use.
    ///
    /// Counted as an original attempt; see [`try_acquire_as`](KeyedLimiter::try_acquire_as).
    ///
    /// # Errors
    ///
    /// - [`KeyedError::Acquire`] with [`AcquireError::CostExceedsCapacity`] for a cost
    ///   above the capacity (no key is created).
    /// - [`KeyedError::KeyLimit`] for a new key when the map is full and the overflow
    ///   policy is [`Overflow::Reject`].
    #[inline(always)]
    pub fn try_acquire<Q>(&self, key: &Q, cost: u64) -> Result<Decision, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.try_acquire_as(key, cost, Attempt::Original)
    }

    /// [`try_acquire`](KeyedLimiter::try_acquire), counting the request as `attempt`
    /// (original or retry) in the key's counters when they are on.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](KeyedLimiter::try_acquire).
    #[inline(always)]
    pub fn try_acquire_as<Q>(
        &self,
        key: &Q,
        cost: u64,
        attempt: Attempt,
    ) -> Result<Decision, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // A cost above the capacity is refused by the bucket's own take for a key in
        // the map, and before any key is made for one that is not.
        if let Some(out) =
            with_table!(&self.store, t => self.acquire_present(t, key, cost, attempt))
        {
            return out;
        }
        self.acquire_slow(key, cost, attempt)
    }

    /// [`try_acquire_as`](KeyedLimiter::try_acquire_as) for a key not found in the
    /// current epoch, or with a pass due: out of line, so that the found key's path
    /// inlines into its caller.
    #[inline(never)]
    fn acquire_slow<Q>(&self, key: &Q, cost: u64, attempt: Attempt) -> Result<Decision, KeyedError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let policy = self.policy();
        if cost > policy.capacity() {
            return Err(crate::error::cost_exceeds_capacity(policy.layout(), cost).into());
        }
        let now = self.clock.now_nanos();
        self.with_slot(key, now, |slot| self.decide(slot, cost, now, attempt))
    }

    /// A key in the map, in the current epoch, with no pass due: decided in a reader
    /// section of its shard (no lock: the bucket's CAS is the path's one atomic
    /// read-modify-write), or under its shard's read lock when the section cannot be
    /// entered (a writer holds the shard), the clock read after the lookup. `None`, with
    /// nothing done, in every other case ([`with_slot`](KeyedLimiter::with_slot) decides
    /// those), the section left first.
    ///
    /// The clock is read once the key's entry is found: the reading then overlaps the
    /// lookup's cache misses instead of delaying the lock and the probe (measured:
    /// BENCHMARKS.md, "Keyed lookups").
    #[inline(always)]
    fn acquire_present<V: Extra, Q>(
        &self,
        t: &Table<K, V, S>,
        key: &Q,
        cost: u64,
        attempt: Attempt,
    ) -> Option<Result<Decision, KeyedError>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = t.hash_of(key);
        let i = t.shard_index(hash);
        if let Some(section) = t.enter(i, hash) {
            // Dropped before the section.
            let ptr = section.shard();
            // SAFETY: in a reader section of shard `i` no writer holds the shard (one
            // that arrives waits for the section to end) and so no `&mut` to it exists;
            // the reference does not outlive `ptr`, dropped before `section`.
            let shard = unsafe { ptr.deref() };
            return self.acquire_in(shard, hash, key, cost, attempt);
        }
        let guard = t.read(i);
        self.acquire_in(&guard, hash, key, cost, attempt)
    }

    /// [`acquire_present`](KeyedLimiter::acquire_present) on its shard, read in a
    /// section or under the lock.
    #[inline(always)]
    fn acquire_in<V: Extra, Q>(
        &self,
        shard: &table::Shard<K, V>,
        hash: u64,
        key: &Q,
        cost: u64,
        attempt: Attempt,
    ) -> Option<Result<Decision, KeyedError>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // Read in the section or under the lock: a switch publishes with every shard
        // write-locked, each waiting out its sections.
        // SAFETY: `shard` is read in a section or under the lock until this returns.
        let epoch = unsafe { self.epochs.locked() };
        if shard.epoch != epoch.number {
            cold_path();
            return None;
        }
        let Some(e) = shard.table.find(hash, |e| e.key.borrow() == key) else {
            cold_path();
            return None;
        };
        // A clock read out of line reads on the path below, as a pass due does: no
        // call here (see `Clock::now_inline`).
        let now = self.clock.now_inline()?;
        // The pass locks every shard: it runs (on the path below) once the section is
        // left or the lock dropped.
        if epoch.passes.is_due(now) {
            cold_path();
            return None;
        }
        let h = self.handle(epoch, &e.bucket, e.extra.counter_ref());
        Some(self.decide(Slot::Bucket(h), cost, now, attempt))
    }

    /// The first half of holding `key`'s bucket in a reader section of its shard, kept
    /// by `sections`, for an acquisition that pays it with other maps' buckets: this
    /// thread's record names the key's shard ([`Table::announce`]), with no fence yet.
    /// Once every map's section is announced, [`Sections::fence`] makes the one fence
    /// they need, and [`hold`](KeyedLimiter::hold) finishes each. `None`, with nothing
    /// kept, for a thread without a record in the map's table or in a section of it
    /// already, or `sections` full.
    #[inline(always)]
    pub(crate) fn announce<'h, Q, const N: usize>(
        &'h self,
        key: &Q,
        sections: &Sections<'h, N>,
    ) -> Option<Announced>
    where
        Q: Hash + ?Sized,
    {
        with_table!(&self.store, t => {
            let hash = t.hash_of(key);
            let shard = t.shard_index(hash);
            t.announce(shard, hash, sections).then_some(Announced { hash, shard })
        })
    }

    /// `key`'s bucket held in the reader section `at` announced ([`announce`](KeyedLimiter::announce),
    /// then `sections`' fence), for an acquisition that pays it with other maps'
    /// buckets (the caller decides at its own clock reading, once it has checked the
    /// map's [`Held::passes`]). `None` where
    /// [`acquire_present`](KeyedLimiter::acquire_present) would not decide in a
    /// section: a writer on the shard, or a key not in the map (or not in its current
    /// epoch); the caller then drops `sections` and takes
    /// [`with_slot`](KeyedLimiter::with_slot)'s path. See [`Sections`] on holding the
    /// sections of several maps at once.
    #[inline(always)]
    pub(crate) fn hold<'h, Q, const N: usize>(
        &'h self,
        key: &Q,
        at: Announced,
        fenced: &Fenced<'_, 'h, N>,
        sections: &'h Sections<'h, N>,
    ) -> Option<Held<'h, C>>
    where
        K: Borrow<Q> + 'static,
        Q: Hash + Eq + ?Sized,
    {
        with_table!(&self.store, t => self.hold_in(t, key, at, fenced, sections))
    }

    #[inline(always)]
    fn hold_in<'h, V: Extra + 'static, Q, const N: usize>(
        &'h self,
        t: &'h Table<K, V, S>,
        key: &Q,
        at: Announced,
        fenced: &Fenced<'_, 'h, N>,
        sections: &'h Sections<'h, N>,
    ) -> Option<Held<'h, C>>
    where
        K: Borrow<Q> + 'static,
        Q: Hash + Eq + ?Sized,
    {
        let Some(ptr) = t.confirm(at.shard, fenced) else {
            cold_path();
            return None;
        };
        // SAFETY: in a reader section of the shard no writer holds it (one that arrives
        // waits for the section to end) and so no `&mut` to it exists. The reference is
        // extended past `ptr`'s borrow to `'h`, but what is read through it is returned
        // only once `sections` keeps (under loom) `ptr`, and is lent for borrows of
        // `sections`, which end the section when dropped.
        let shard: &'h table::Shard<K, V> = unsafe { &*std::ptr::from_ref(ptr.deref()) };
        // Read in the section: a switch publishes with every shard write-locked, each
        // waiting out its sections.
        // SAFETY: in the section, held while `sections` is borrowed (`'h`), which the
        // epoch's borrows (the handle's, the passes') cannot outlive.
        let epoch = unsafe { self.epochs.locked() };
        if shard.epoch != epoch.number {
            cold_path();
            return None;
        }
        let Some(e) = shard.table.find(at.hash, |e| e.key.borrow() == key) else {
            cold_path();
            return None;
        };
        let handle = self.handle(epoch, &e.bucket, e.extra.counter_ref());
        #[cfg(loom)]
        sections.keep_access(Box::new(ptr));
        #[cfg(not(loom))]
        let _ = sections;
        Some(Held::new(handle, &epoch.passes))
    }

    /// The decision of [`try_acquire_as`](KeyedLimiter::try_acquire_as) on `slot`.
    #[inline(always)]
    fn decide(
        &self,
        slot: Slot<'_, C>,
        cost: u64,
        now: u64,
        attempt: Attempt,
    ) -> Result<Decision, KeyedError> {
        match slot {
            Slot::Bucket(h) => {
                let d = h.take(cost, now)?;
                h.counters.record(d.is_admitted(), cost, attempt);
                Ok(d)
            }
            Slot::Full { max_keys } => {
                self.count_key_limit(cost, attempt);
                Err(KeyedError::KeyLimit { max_keys })
            }
            // Not made by `with_slot`; were it, nothing was taken.
            Slot::Stale => Err(KeyedError::KeyLimit {
                max_keys: self.max_keys(),
            }),
        }
    }

    /// Gives back `cost` tokens of an earlier admission of `key` (`min(B, balance +
    /// cost)`, I6) to the bucket `key` has in the map now. The map does not remember
    /// which bucket paid a past request, so:
    ///
    /// - A key in the map: its bucket gets the refund, capped at the capacity. Exact when
    ///   the admission was paid by that bucket.
    /// - A key not in the map: the refund is dropped. Either its bucket refilled to full
    ///   and was evicted (the refund would have been capped away: nothing is lost), or
    ///   its admission was charged to the shared [`Overflow::Share`] bucket, which keeps
    ///   the cost (conservative: no credit is created, the shared budget just does not get
    ///   it back), or it was never charged.
    /// - A key charged to the shared bucket that has since been given its own bucket: the
    ///   refund goes to its own bucket (capped), which did not pay. To refund exactly under
    ///   [`Overflow::Share`], refund only admissions after which
    ///   [`contains`](KeyedLimiter::contains) was true.
    ///
    /// ```
    /// use tokengate::{KeyedLimiter, ManualClock, Policy};
    /// let limiter = KeyedLimiter::<u64, _>::builder(Policy::new(10, 1.0)?, 10)
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// limiter.try_acquire(&3, 4)?;
    /// limiter.refund(&3, 4)?;
    /// assert_eq!(limiter.available(&3), 10.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`AcquireError::CostExceedsCapacity`] for a cost above the capacity.
    pub fn refund<Q>(&self, key: &Q, cost: u64) -> Result<(), AcquireError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let policy = self.policy();
        if policy.layout().units_of(cost).is_none() {
            return Err(crate::error::cost_exceeds_capacity(policy.layout(), cost));
        }
        self.refund_if(key, cost, || true);
        Ok(())
    }

    /// [`refund`](KeyedLimiter::refund) of `cost` (capped at the capacity), given only
    /// if `valid()` holds under the key's shard lock: `false`, with nothing given back,
    /// when it does not (a scoped limiter's switch moved the key to another map since
    /// the caller chose this one).
    pub(crate) fn refund_if<Q>(&self, key: &Q, cost: u64, valid: impl FnOnce() -> bool) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let now = self.clock.now_nanos();
        self.reanchor_if_due(now);
        with_table!(&self.store, t => self.refund_in(t, key, valid, |epoch, bucket, hint| {
            let layout = epoch.policy.layout();
            // Capped at the capacity of the policy the bucket is in now.
            let units = layout.units_of(cost.min(layout.capacity())).unwrap_or(0);
            bucket.refund_units(layout, &self.clock, now, units);
            // A refund brings the time the bucket is full forward: the shard's hint must
            // follow, or a new key at the maximum would be refused until the old time.
            if !epoch.evict || hint <= now {
                return None;
            }
            Some(full_at(layout, &bucket.snapshot(layout, now), now))
        }))
    }

    /// Cancels a reservation on `key`'s bucket that stands at `place`, reserved under
    /// `reserved_under` ([`Layout::cancel`](crate::state::Layout::cancel): its charge
    /// back when no reservation was made after it, else nothing), only if `valid()`
    /// holds under the key's shard lock (`false` when it does not, as
    /// [`refund_if`](KeyedLimiter::refund_if)). Nothing for a key not in the map (evicted:
    /// it had refilled to full) or a map reconfigured since (its words no longer count in
    /// the units the place was charged in).
    pub(crate) fn cancel_if<Q>(
        &self,
        key: &Q,
        place: &crate::owned::Place,
        reserved_under: &crate::state::Layout,
        valid: impl FnOnce() -> bool,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let now = self.clock.now_nanos();
        self.reanchor_if_due(now);
        with_table!(&self.store, t => self.refund_in(t, key, valid, |epoch, bucket, hint| {
            let layout = epoch.policy.layout();
            if layout != reserved_under {
                return None;
            }
            place.cancel(bucket, layout, &self.clock, now);
            // A cancel brings the time the bucket is full forward, as a refund does.
            if !epoch.evict || hint <= now {
                return None;
            }
            Some(full_at(layout, &bucket.snapshot(layout, now), now))
        }))
    }

    /// Tokens `key` has now (fractional): its bucket's balance, or a fresh bucket's for a
    /// key not in the map (the capacity, or zero under a start-empty policy). Writes
    /// nothing and creates no key.
    pub fn available<Q>(&self, key: &Q) -> f64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let found = self.find(key, |epoch, bucket, _| {
            let layout = epoch.policy.layout();
            let units = layout.balance_units(&bucket.snapshot(layout, self.clock.now_nanos()));
            layout.units_to_tokens(units)
        });
        found.unwrap_or_else(|| {
            let policy = self.policy();
            if policy.starts_full() {
                policy.capacity() as f64
            } else {
                0.0
            }
        })
    }

    /// Whether `key` has a bucket in the map.
    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find(key, |_, _, _| ()).is_some()
    }

    /// `key`'s counters, when the map keeps counters and the key is in the map. Counts of
    /// evicted keys are in [`evicted_counters`](KeyedLimiter::evicted_counters).
    pub fn counters<Q>(&self, key: &Q) -> Option<CounterSnapshot>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find(key, |_, _, counters| counters.snapshot())
            .flatten()
    }

    /// Calls `f` with every key in the map and its counters (when counters are on), one
    /// shard at a time under its read lock. For export to a metrics system; not for the
    /// hot path. `f` must not call into this map: with a
    /// [`reconfigure`](KeyedLimiter::reconfigure) waiting for the shard held, that would
    /// deadlock.
    pub fn for_each_counters(&self, mut f: impl FnMut(&K, CounterSnapshot)) {
        with_table!(&self.store, t => each_entry(t, &mut |key, counters| {
            if let Some(c) = counters.snapshot() {
                f(key, c);
            }
        }))
    }

    /// The counts of keys evicted so far, summed: eviction loses no count.
    pub fn evicted_counters(&self) -> CounterSnapshot {
        self.evicted_counts.snapshot()
    }

    /// Requests of new keys that found the map full: rejected with
    /// [`KeyedError::KeyLimit`], or decided by the shared overflow bucket.
    pub fn overflow_counters(&self) -> CounterSnapshot {
        self.overflow_counts.snapshot()
    }

    /// Replaces the policy of every key, carrying each key's tokens over with `inherit`
    /// (see [`crate::inherit`] for each strategy's exact guarantee), in constant time
    /// in the number of keys: with every shard's write lock held for a moment (one lock
    /// per shard; operations wait that long), the map reads the switch reading and
    /// publishes the new policy; each shard's words are converted by the first operation
    /// that meets the shard afterwards (or the next re-anchoring pass), under the
    /// shard's write lock, as of the switch reading. A key untouched for an hour after the switch holds what
    /// it would have held had it been converted at the switch: the old policy's refill
    /// up to it, the new one's after. Operations racing the switch decide wholly on the
    /// old policy or wholly on the new.
    ///
    /// A re-anchoring pass due at the call runs first (a pass over every key, once per
    /// period, as any operation would run it). A refund after the switch of tokens taken
    /// before it goes to the new policy as it is (see
    /// [`LiveBucket::refund`](crate::LiveBucket::refund)).
    ///
    /// Before its barrier, a switch converts the shards no operation met since the
    /// previous switch (one at a time, under each one's write lock: the work the first
    /// operation on each would have done), so that no shard is ever more than one policy
    /// behind; the policy a switch replaces is freed once no operation can still read it
    /// (memory stays flat however often the map is reconfigured).
    ///
    /// Keys created from now on get the new policy; [`Eviction::Lossless`] evicts only
    /// under start-full policies, so a switch to a start-empty policy stops it.
    ///
    /// The strategy applies to the keys the map holds at the switch. A key not in the
    /// map then, never seen or evicted (evicted keys were full), is a new key: it starts
    /// in the new policy's start state. Every strategy but [`Inherit::AsIs`] carries a
    /// full bucket over as that same start state under a start-full policy, so there
    /// eviction stays invisible. Under `AsIs` to a larger capacity a key kept full holds
    /// `min(B, B')`, the old capacity, while an evicted one comes back with `B'`: the
    /// exception, and so `AsIs` bounds what a *held* key carries over, not what a key
    /// the map does not hold starts with.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokengate::{Inherit, KeyedLimiter, ManualClock, Policy};
    ///
    /// let clock = ManualClock::new();
    /// let map = KeyedLimiter::<u64, _>::builder(Policy::new(10, 1.0)?, 1000)
    ///     .clock(clock.clone())
    ///     .build()?;
    /// map.try_acquire(&7, 10)?; // key 7 drained
    /// map.reconfigure(Policy::new(100, 50.0)?, Inherit::Additive);
    /// assert_eq!(map.policy().capacity(), 100);
    /// assert_eq!(map.available(&7), 90.0); // 0 + what the capacity grew by
    /// assert_eq!(map.available(&8), 100.0); // a new key: the new policy's start
    /// clock.advance(Duration::from_millis(100)); // 5 tokens at 50/s, less the lag
    /// let seven = map.available(&7);
    /// assert!(seven > 94.9 && seven <= 95.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reconfigure(&self, policy: Policy, inherit: Inherit) {
        let switch = self.begin_switch();
        let at = self.clock.now_nanos();
        self.finish_switch(switch, policy, inherit, at);
    }

    /// The first half of [`reconfigure`](KeyedLimiter::reconfigure): runs a due pass,
    /// then holds the map's barrier (every shard's write lock, and the map's
    /// reconfiguration lock) until [`finish_switch`](KeyedLimiter::finish_switch). A
    /// scoped limiter holds the barriers of all its maps at once, so that no request
    /// decides on some of them before its switch and on others after it.
    pub(crate) fn begin_switch(&self) -> Switch<'_, K, C, S> {
        let one = self
            .switching
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // A pass due now runs first, on the old policy (it may find the map idle).
        self.reanchor_if_due(self.clock.now_nanos());
        // No shard left behind the current epoch: after the switch each is in the new
        // epoch or in the one it replaces (all the new one converts from), so the epoch
        // retired by the previous switch is needed no more (see `epoch`).
        with_table!(&self.store, t => self.bring_all_up(t));
        let pin = self.epochs.pin();
        // The barrier: with every shard locked, no operation is between reading the
        // epoch and writing a word, so each word of the old epoch was written before
        // the switch reading (see `epoch`).
        let shards = match &self.store {
            _ if mutant!(KEYED_SWITCH_SKIPS_BARRIER) => Guards::Skipped,
            Store::Bare(t) => Guards::Bare(t.write_all()),
            Store::Counted(t) => Guards::Counted(t.write_all()),
        };
        Switch {
            map: self,
            shards,
            pin,
            _one: one,
        }
    }

    /// Converts every shard in an older epoch than the current one, each under its write
    /// lock in turn (what an operation meeting it would do).
    #[cold]
    #[inline(never)]
    fn bring_all_up<V: Extra>(&self, t: &Table<K, V, S>) {
        if mutant!(KEYED_SWITCH_LEAVES_SHARDS_BEHIND) {
            return;
        }
        for i in 0..t.shard_count() {
            let behind = {
                let guard = t.read(i);
                // SAFETY: compared under the shard's lock.
                guard.epoch != unsafe { self.epochs.locked() }.number
            };
            if behind {
                self.convert_shard(t, i);
            }
        }
    }

    /// The second half of [`reconfigure`](KeyedLimiter::reconfigure): publishes the
    /// epoch of `policy` from the switch reading `at` (read while `switch`, this map's
    /// barrier, is held; a reading of another guard of the same clock is brought up to
    /// the map's), then lets the barrier go. Reads no clock: nothing here can unwind
    /// half-way through a scoped switch.
    pub(crate) fn finish_switch(
        &self,
        switch: Switch<'_, K, C, S>,
        policy: Policy,
        inherit: Inherit,
        at: u64,
    ) {
        switch.publish(policy, inherit, at);
        drop(switch);
    }

    /// How many times the map was reconfigured.
    pub fn reconfigurations(&self) -> u64 {
        self.epochs.pin().number
    }

    /// Replaced epochs not yet freed (an operation may have held one when it was
    /// replaced; the next reconfiguration or the drop frees it): a handful at most.
    pub fn retired_epochs(&self) -> usize {
        self.epochs.retired()
    }

    /// Evicts every bucket that has refilled to full (when the [`Eviction`] mode allows),
    /// re-anchors every bucket it keeps, and gives back table memory a flood left behind:
    /// the map's re-anchoring pass, run now (the next automatic one is then a period
    /// later). One shard at a time, each under its write lock (readers of that shard
    /// wait; the others do not).
    ///
    /// Never needed for correctness: the map re-anchors its buckets by itself (see
    /// [eviction](KeyedLimiter#bounded-memory-and-eviction)), and a new key at the
    /// maximum evicts what it needs. Calling it frees memory sooner.
    pub fn sweep(&self) -> SweepReport {
        self.epochs
            .pin()
            .passes
            .run_now(&self.clock, |now, idle| self.pass(now, idle))
    }

    /// The longest time a bucket may go unwritten and still read its idle time exactly:
    /// the policy's [`wrap_period`](Policy::wrap_period) less the tick field's back
    /// window (at most about 19.5 hours); years for ordinary policies. The map's own
    /// re-anchoring passes run about every half of it (see
    /// [eviction](KeyedLimiter#bounded-memory-and-eviction)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokengate::{KeyedLimiter, Policy};
    /// let limiter = KeyedLimiter::<u64>::new(Policy::new(100, 20.0)?, 1000)?;
    /// assert!(limiter.max_sweep_interval() > Duration::from_secs(365 * 86400));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_sweep_interval(&self) -> Duration {
        sweep_interval(&self.policy())
    }

    /// Runs the re-anchoring pass first if it is due at `now`: one relaxed load and a
    /// comparison on every operation, before it locks a shard.
    #[inline]
    fn reanchor_if_due(&self, now: u64) {
        self.epochs
            .pin()
            .passes
            .check(now, &self.clock, |now, idle| {
                self.pass(now, idle);
            });
    }

    /// The re-anchoring pass at `now`: every shard swept in turn (evicting what its
    /// [`Eviction`] mode allows, re-anchoring the rest), or, when the pass runs after an
    /// idle longer than the fill time (`idle`; see [`crate::pass`]), every bucket full:
    /// each was last written before the due time, more than the fill time ago, however
    /// its word reads after an idle that may exceed the wrap, so the pass evicts it or
    /// rewrites it full.
    fn pass(&self, now: u64, idle: bool) -> SweepReport {
        let mut report = SweepReport::default();
        with_table!(&self.store, t => {
            for i in 0..t.shard_count() {
                let mut guard = t.write(i);
                // Each shard in the epoch current when it is locked: converted first
                // (an idle pass rewrites every word anyway).
                // SAFETY: `ctx` is used under the shard's write lock only.
                let ctx = self.sweep_ctx(unsafe { self.epochs.locked() }, now);
                report += if idle {
                    t.fill_shard(i, &mut guard, &ctx)
                } else {
                    t.bring_up(i, &mut guard, &ctx);
                    t.sweep_shard(i, &mut guard, &ctx, false)
                };
                t.shrink_shard(&mut guard);
            }
        });
        report
    }

    /// Counts a request refused because the map is full.
    pub(crate) fn count_key_limit(&self, cost: u64, attempt: Attempt) {
        self.overflow_counts.record(false, cost, attempt);
    }

    /// The identity of the shared overflow bucket, if there is one.
    pub(crate) fn overflow_id(&self) -> Option<usize> {
        self.overflow_bucket.as_ref().map(|b| b.raw().id())
    }

    fn sweep_ctx<'a>(&'a self, epoch: &'a MapEpoch, now: u64) -> SweepCtx<'a> {
        SweepCtx {
            epochs: &self.epochs,
            epoch,
            layout: epoch.policy.layout(),
            clock: &self.clock,
            now,
            evict: epoch.evict,
            start_full: epoch.policy.starts_full(),
            evicted_counts: &self.evicted_counts,
        }
    }

    /// Converts shard `i`'s words to the current epoch (under its write lock), if they
    /// are in an older one.
    #[cold]
    #[inline(never)]
    fn convert_shard<V: Extra>(&self, t: &Table<K, V, S>, i: usize) {
        let mut guard = t.write(i);
        // SAFETY: `ctx` is used under the shard's write lock only.
        let ctx = self.sweep_ctx(unsafe { self.epochs.locked() }, self.clock.now_nanos());
        t.bring_up(i, &mut guard, &ctx);
    }

    /// Runs `f` with shard `i` read-locked and its words in the current epoch (given to
    /// `f`), converting the shard first if it is in an older one.
    #[inline(always)]
    fn read_current<V: Extra, R>(
        &self,
        t: &Table<K, V, S>,
        i: usize,
        f: impl FnOnce(&MapEpoch, &table::Shard<K, V>) -> R,
    ) -> R {
        let mut f = Some(f);
        loop {
            {
                let guard = t.read(i);
                // Read under the lock: a switch publishes with every shard locked.
                // SAFETY: used by `f`, under the lock.
                let epoch = unsafe { self.epochs.locked() };
                if guard.epoch == epoch.number {
                    let f = f.take().expect("called once: the loop returns after");
                    return f(epoch, &guard);
                }
            }
            self.convert_shard(t, i);
        }
    }

    /// Runs `f` on `key`'s bucket and counters under its shard's read lock, if the key is
    /// in the map.
    fn find<Q, R>(
        &self,
        key: &Q,
        f: impl FnOnce(&MapEpoch, &RawBucket, CounterRef<'_>) -> R,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.reanchor_if_due(self.clock.now_nanos());
        with_table!(&self.store, t => self.find_in(t, key, f))
    }

    /// [`find`](Self::find) in the map's table.
    fn find_in<V: Extra, Q, R>(
        &self,
        t: &Table<K, V, S>,
        key: &Q,
        f: impl FnOnce(&MapEpoch, &RawBucket, CounterRef<'_>) -> R,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = t.hash_of(key);
        self.read_current(t, t.shard_index(hash), |epoch, shard| {
            shard
                .table
                .find(hash, |e| e.key.borrow() == key)
                .map(|entry| f(epoch, &entry.bucket, entry.extra.counter_ref()))
        })
    }

    /// Refunds `key`'s bucket, if it is in the map and `valid()` holds under its shard
    /// lock (else `false`), with `refund`, which is given the shard's epoch and hint and
    /// returns the time the bucket is now full when that may be earlier.
    fn refund_in<V: Extra, Q>(
        &self,
        t: &Table<K, V, S>,
        key: &Q,
        valid: impl FnOnce() -> bool,
        refund: impl FnOnce(&MapEpoch, &RawBucket, u64) -> Option<u64>,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = t.hash_of(key);
        let i = t.shard_index(hash);
        self.read_current(t, i, |epoch, shard| {
            if !valid() {
                return false;
            }
            if let Some(entry) = shard.table.find(hash, |e| e.key.borrow() == key) {
                if let Some(at) = refund(epoch, &entry.bucket, t.hint(i)) {
                    t.lower_hint(i, at);
                }
            }
            true
        })
    }

    /// Runs `f` on `key`'s slot with the slot's shard locked (read side for an existing
    /// key, write side after inserting a new one) for the duration of `f`.
    ///
    /// Holding the lock while `f` runs is what lets `f` hold the bucket across an
    /// all-or-nothing acquisition. Callers nesting several maps must nest them in one
    /// fixed order (the scoped limiter nests by scope kind), and never the same map twice:
    /// a second read lock on a shard, with a writer queued in between, would deadlock.
    #[inline]
    pub(crate) fn with_slot<Q, R>(&self, key: &Q, now: u64, f: impl FnOnce(Slot<'_, C>) -> R) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.with_slot_if(key, now, &|| true, f)
    }

    /// [`with_slot`](KeyedLimiter::with_slot), but a key not in the map is inserted only
    /// if `valid()` holds under the shard's write lock; else `f` gets [`Slot::Stale`]
    /// and nothing is inserted (a scoped request whose configuration a switch replaced
    /// while it waited: the switch may have moved the key to another map).
    #[inline]
    pub(crate) fn with_slot_if<Q, R>(
        &self,
        key: &Q,
        now: u64,
        valid: &dyn Fn() -> bool,
        f: impl FnOnce(Slot<'_, C>) -> R,
    ) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.reanchor_if_due(now);
        with_table!(&self.store, t => self.slot_in(t, key, now, valid, f))
    }

    #[inline]
    fn slot_in<V: Extra, Q, R>(
        &self,
        t: &Table<K, V, S>,
        key: &Q,
        now: u64,
        valid: &dyn Fn() -> bool,
        f: impl FnOnce(Slot<'_, C>) -> R,
    ) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = t.hash_of(key);
        let shard = t.shard_index(hash);
        loop {
            {
                let guard = t.read(shard);
                // Read under the lock: a switch publishes with every shard locked.
                // SAFETY: used by `f`, under the lock.
                let epoch = unsafe { self.epochs.locked() };
                if guard.epoch == epoch.number {
                    if let Some(e) = guard.table.find(hash, |e| e.key.borrow() == key) {
                        return f(Slot::Bucket(self.handle(
                            epoch,
                            &e.bucket,
                            e.extra.counter_ref(),
                        )));
                    }
                    break;
                }
            }
            self.convert_shard(t, shard);
        }
        self.slot_slow(t, (shard, hash), key, now, valid, f)
    }

    /// A key not found under the read lock: under the write lock, found or inserted (at
    /// the maximum after sweeping this shard, then the others, for room); else the
    /// overflow. Never holds two shard locks at once; runs the loop at most twice (the
    /// second time with room already claimed).
    #[cold]
    #[inline(never)]
    fn slot_slow<V: Extra, Q, R>(
        &self,
        t: &Table<K, V, S>,
        (shard, hash): (usize, u64),
        key: &Q,
        now: u64,
        valid: &dyn Fn() -> bool,
        f: impl FnOnce(Slot<'_, C>) -> R,
    ) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut claimed = false;
        // The search for room sweeps other shards with the lock of this one let go.
        let pin = self.epochs.pin();
        loop {
            let mut guard = t.write(shard);
            if !valid() {
                if claimed {
                    t.release_claim();
                }
                return f(Slot::Stale);
            }
            // The epoch current under the lock, the shard converted to it.
            let epoch = self.epochs.current_while(&pin);
            let ctx = self.sweep_ctx(epoch, now);
            t.bring_up(shard, &mut guard, &ctx);
            match t.find_or_insert(shard, &mut guard, hash, key, &ctx, claimed) {
                Found::Present(i) => {
                    let e = guard
                        .table
                        .get_bucket(i)
                        .expect("find_or_insert returns the index of an entry");
                    return f(Slot::Bucket(self.handle(
                        epoch,
                        &e.bucket,
                        e.extra.counter_ref(),
                    )));
                }
                Found::Inserted(i) => {
                    let e = guard
                        .table
                        .get_bucket(i)
                        .expect("find_or_insert returns the index of an entry");
                    let out = f(Slot::Bucket(self.handle(
                        epoch,
                        &e.bucket,
                        e.extra.counter_ref(),
                    )));
                    t.note_inserted(shard, &guard, i, &ctx);
                    return out;
                }
                Found::Full => {}
            }
            drop(guard);
            debug_assert!(!claimed, "find_or_insert uses a claim it is given");
            if !t.claim_by_evicting(shard, &ctx) {
                break;
            }
            claimed = true;
        }
        match &self.overflow_bucket {
            Some(b) => f(Slot::Bucket(Handle {
                // Its re-anchoring pass first, if one is due: every operation on the
                // handle reads the clock after this reading.
                raw: {
                    b.at(&self.clock, self.clock.now_nanos());
                    b.raw()
                },
                layout: b.policy().layout(),
                clock: &self.clock,
                counters: CounterRef::Striped(&self.overflow_counts),
            })),
            None => f(Slot::Full {
                max_keys: t.max_keys(),
            }),
        }
    }

    #[inline]
    fn handle<'a>(
        &'a self,
        epoch: &'a MapEpoch,
        raw: &'a RawBucket,
        counters: CounterRef<'a>,
    ) -> Handle<'a, C> {
        Handle {
            raw,
            layout: epoch.policy.layout(),
            clock: &self.clock,
            counters,
        }
    }
}

impl<K, C: Clock, S> KeyedLimiter<K, C, S> {
    /// Keys in the map (never above [`max_keys`](KeyedLimiter::max_keys)).
    pub fn len(&self) -> usize {
        with_table!(&self.store, t => t.len())
    }

    /// Whether the map holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most keys the map holds.
    pub fn max_keys(&self) -> usize {
        with_table!(&self.store, t => t.max_keys())
    }

    /// The number of shards.
    pub fn shards(&self) -> usize {
        with_table!(&self.store, t => t.shard_count())
    }

    /// The policy of every key's bucket (the current one, after a
    /// [`reconfigure`](KeyedLimiter::reconfigure)).
    pub fn policy(&self) -> Policy {
        self.epochs.pin().policy
    }

    /// The clock the map reads.
    pub fn clock(&self) -> &C {
        self.clock.get_ref()
    }

    /// What a new key gets when the map is full.
    pub fn overflow(&self) -> Overflow {
        self.overflow
    }
}

impl<K: Hash + Eq + Send + Sync, C: Clock, S: BuildHasher> KeyedLimiter<K, C, S> {
    /// Bytes the map's tables and locks hold (control bytes, entries, shard locks), as
    /// the tables report them. For diagnostics; the README's per-key figures are measured
    /// with a counting allocator.
    pub fn allocated_bytes(&self) -> usize {
        with_table!(&self.store, t => t.allocated_bytes())
    }

    /// The packed word of `key`'s bucket as stored, before any refill (`None` when the
    /// key has no bucket): decode it with the policy's [`Layout`](crate::state::Layout).
    /// For diagnostics, and to check that an operation wrote nothing.
    pub fn stored_word<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find(key, |_, bucket, _| bucket.load())
    }
}

/// The longest time a bucket of `policy` may go unwritten before its tick reading could
/// land in the back window: the wrap period less the back window.
pub(crate) fn sweep_interval(policy: &Policy) -> Duration {
    Duration::from_nanos(crate::pass::exact_for_nanos(policy.layout()))
}

/// Calls `f` on every entry of `t`, one shard at a time under its read lock.
fn each_entry<K, V: Extra, S>(t: &Table<K, V, S>, f: &mut dyn FnMut(&K, CounterRef<'_>)) {
    for i in 0..t.shard_count() {
        let guard = t.read(i);
        for e in guard.table.iter() {
            f(&e.key, e.extra.counter_ref());
        }
    }
}
