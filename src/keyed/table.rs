//! The sharded hash table under a keyed limiter: hashbrown tables behind `ShardedLock`s,
//! a global key count with a hard maximum, and the sweep that evicts and re-anchors.
//!
//! # One hash, two uses
//!
//! A key is hashed once. hashbrown takes its probe start from the low bits of the hash
//! (`hash & bucket_mask`) and the 7-bit control tag from the top 7 bits (bits 57..=63,
//! bits 25..=31 on 32-bit targets). The shard is taken from the bits just below the tag:
//! `(hash >> (57 - shard_bits)) & (shards - 1)`, at most [`MAX_SHARD_BITS`] bits (bits
//! 47..=56). Within one shard these bits are all equal, so they must be bits the table
//! does not use: were they index bits, a shard's keys would crowd a fraction of its slots;
//! were they tag bits, its keys would share part of their tag and compare keys more often.
//! Index bits reach bit 47 only for a shard of 2^47 slots, far beyond any memory.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::PoisonError;

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};
use hashbrown::HashTable;

use crate::bucket::RawBucket;
use crate::clock::{Clock, Monotonic};
use crate::state::Layout;
use crate::sync::{AtomicU64, AtomicUsize, Ordering};
use crate::telemetry::{CounterCells, CounterRef, CounterSnapshot};

/// At most 2^10 shards.
pub(crate) const MAX_SHARD_BITS: u32 = 10;

/// The lowest bit of hashbrown's 7-bit control tag on 64-bit targets.
const TAG_SHIFT: u32 = 57;

/// What a map stores per key besides its bucket: nothing, or the key's counters.
pub(crate) trait Extra: Default + Send + Sync {
    fn counter_ref(&self) -> CounterRef<'_>;
    fn counts(&self) -> Option<CounterSnapshot>;
}

impl Extra for () {
    #[inline]
    fn counter_ref(&self) -> CounterRef<'_> {
        CounterRef::Off
    }

    fn counts(&self) -> Option<CounterSnapshot> {
        None
    }
}

impl Extra for CounterCells {
    #[inline]
    fn counter_ref(&self) -> CounterRef<'_> {
        CounterRef::Cells(self)
    }

    fn counts(&self) -> Option<CounterSnapshot> {
        Some(CounterCells::snapshot(self))
    }
}

/// One key's entry: the key, its bare 8-byte bucket word (no padding: entries are packed
/// in the table), and its extra (zero-sized without counters). The policy lives once per
/// map, not here.
pub(crate) struct Entry<K, V> {
    pub(crate) key: K,
    pub(crate) bucket: RawBucket,
    pub(crate) extra: V,
}

/// One shard: a hashbrown table, and the earliest time a sweep of it can evict anything.
pub(crate) struct Shard<K, V> {
    pub(crate) table: HashTable<Entry<K, V>>,
    /// Clock nanoseconds before which no kept entry can have refilled to full; sweeps on
    /// insertion wait for it, so a map at its maximum with nothing evictable does not
    /// scan a shard per new key. Atomic so that a refund, under the read lock, can bring
    /// it forward when it fills a bucket (a bucket refilled to full is evictable at once).
    next_sweep: AtomicU64,
}

impl<K, V> Shard<K, V> {
    /// A bucket of this shard became full outside a sweep (a refund): the next insertion
    /// at the maximum may sweep at once.
    pub(crate) fn evictable_now(&self) {
        self.next_sweep.store(0, Ordering::Relaxed);
    }
}

/// What a sweep needs to know about the map.
pub(crate) struct SweepCtx<'a> {
    pub(crate) layout: &'a Layout,
    pub(crate) clock: &'a Monotonic<dyn Clock + 'a>,
    pub(crate) now: u64,
    /// Whether full buckets may be evicted.
    pub(crate) evict: bool,
    /// Whether new buckets start full.
    pub(crate) start_full: bool,
    /// Where evicted keys' counts are folded.
    pub(crate) evicted_counts: &'a CounterCells,
}

/// What one sweep did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Keys looked at.
    pub examined: usize,
    /// Keys removed: their buckets had refilled to full (identical to a fresh bucket).
    pub evicted: usize,
    /// Keys kept and re-anchored: their words rewritten refilled to the sweep's time.
    pub reanchored: usize,
}

impl std::ops::AddAssign for SweepReport {
    fn add_assign(&mut self, o: SweepReport) {
        self.examined += o.examined;
        self.evicted += o.evicted;
        self.reanchored += o.reanchored;
    }
}

pub(crate) struct Table<K, V, S> {
    shards: Box<[ShardedLock<Shard<K, V>>]>,
    hasher: S,
    shard_shift: u32,
    shard_mask: u64,
    /// Keys in the map, counting claims about to be inserted: never above `max_keys`.
    len: AtomicUsize,
    max_keys: usize,
}

impl<K, V, S> fmt::Debug for Table<K, V, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table")
            .field("shards", &self.shards.len())
            .field("len", &self.len())
            .field("max_keys", &self.max_keys)
            .finish()
    }
}

impl<K, V, S> Table<K, V, S> {
    /// `shard_bits <= MAX_SHARD_BITS` is checked by the builder.
    pub(crate) fn new(shard_bits: u32, max_keys: usize, hasher: S) -> Table<K, V, S> {
        debug_assert!(shard_bits <= MAX_SHARD_BITS);
        Table {
            shards: (0..1usize << shard_bits)
                .map(|_| {
                    ShardedLock::new(Shard {
                        table: HashTable::new(),
                        next_sweep: AtomicU64::new(0),
                    })
                })
                .collect(),
            hasher,
            shard_shift: TAG_SHIFT - shard_bits,
            shard_mask: (1u64 << shard_bits) - 1,
            len: AtomicUsize::new(0),
            max_keys,
        }
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    pub(crate) fn max_keys(&self) -> usize {
        self.max_keys
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The shard holding keys of this hash.
    #[inline]
    pub(crate) fn shard_index(&self, hash: u64) -> usize {
        ((hash >> self.shard_shift) & self.shard_mask) as usize
    }

    /// Read lock on shard `i`. Poisoning is ignored: hashbrown's tables stay consistent
    /// when a key's `Hash` or `Eq` panics, and buckets are single atomic words.
    #[inline]
    pub(crate) fn read(&self, i: usize) -> ShardedLockReadGuard<'_, Shard<K, V>> {
        self.shards[i]
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Write lock on shard `i` (see [`read`](Table::read) on poisoning).
    pub(crate) fn write(&self, i: usize) -> ShardedLockWriteGuard<'_, Shard<K, V>> {
        self.shards[i]
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims room for one key; `false` at the maximum.
    fn claim(&self) -> bool {
        let mut n = self.len.load(Ordering::Relaxed);
        loop {
            if n >= self.max_keys {
                return false;
            }
            match self
                .len
                .compare_exchange_weak(n, n + 1, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => n = actual,
            }
        }
    }
}

impl<K: Hash + Eq, V: Extra, S: BuildHasher> Table<K, V, S> {
    /// The key's hash, computed once per operation.
    #[inline]
    pub(crate) fn hash_of<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Under shard `shard`'s write lock: the index of `key`'s entry, inserting a fresh
    /// bucket if the key is missing. At the maximum it first sweeps this shard (when a
    /// sweep can find anything); `None` when there is still no room.
    pub(crate) fn find_or_insert<Q>(
        &self,
        shard: &mut Shard<K, V>,
        hash: u64,
        key: &Q,
        ctx: &SweepCtx<'_>,
    ) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(i) = shard
            .table
            .find_bucket_index(hash, |e| e.key.borrow() == key)
        {
            return Some(i);
        }
        if !self.claim() {
            if !(ctx.evict && ctx.now >= shard.next_sweep.load(Ordering::Relaxed)) {
                return None;
            }
            self.sweep_shard(shard, ctx);
            if !self.claim() {
                return None;
            }
        }
        let entry = Entry {
            key: key.to_owned(),
            bucket: RawBucket::new(ctx.layout, ctx.now, ctx.start_full),
            extra: V::default(),
        };
        // A fresh bucket may be evictable at once (start full): let the next sweep run.
        shard.evictable_now();
        let hasher = &self.hasher;
        let occupied = shard
            .table
            .insert_unique(hash, entry, |e| hasher.hash_one(&e.key));
        Some(occupied.bucket_index())
    }

    /// Under the write lock: evicts the entries whose buckets have refilled to full (when
    /// `ctx.evict`), re-anchors the others at `ctx.now`, and notes when the next sweep
    /// can evict anything.
    pub(crate) fn sweep_shard(&self, shard: &mut Shard<K, V>, ctx: &SweepCtx<'_>) -> SweepReport {
        let layout = ctx.layout;
        let full_units = layout.max_units() - layout.base_units();
        let mut report = SweepReport::default();
        let mut soonest_full = u64::MAX;
        shard.table.retain(|e| {
            report.examined += 1;
            let s = e.bucket.snapshot(layout, ctx.now);
            if s.behind() > 0 {
                // The clock reads behind this bucket: leave it exactly as it is.
                return true;
            }
            if ctx.evict && layout.is_full(&s) {
                if let Some(counts) = e.extra.counts() {
                    ctx.evicted_counts.add(&counts);
                }
                report.evicted += 1;
                return false;
            }
            reanchor(&e.bucket, layout, ctx.clock, ctx.now);
            report.reanchored += 1;
            if ctx.evict {
                soonest_full = soonest_full.min(layout.ticks_until(s.units(), full_units));
            }
            true
        });
        self.len.fetch_sub(report.evicted, Ordering::Relaxed);
        let next_sweep = if soonest_full == u64::MAX {
            0
        } else {
            let wait = soonest_full.saturating_mul(1 << layout.tick_shift());
            ctx.now.saturating_add(wait)
        };
        shard.next_sweep.store(next_sweep, Ordering::Relaxed);
        report
    }

    /// Gives back memory a flood left behind, once a shard holds under a quarter of what
    /// its table has room for.
    pub(crate) fn shrink_shard(&self, shard: &mut Shard<K, V>) {
        let table = &mut shard.table;
        if table.len() < table.capacity() / 4 {
            let hasher = &self.hasher;
            table.shrink_to(table.len() * 2, |e| hasher.hash_one(&e.key));
        }
    }

    /// Bytes held by the shard tables (control bytes and entries) and the shard locks.
    pub(crate) fn allocated_bytes(&self) -> usize {
        let locks = self.shards.len() * std::mem::size_of::<ShardedLock<Shard<K, V>>>();
        // Each `ShardedLock` also holds 8 cache-padded inner locks on the heap.
        let inner = self.shards.len() * 8 * 128;
        (0..self.shards.len())
            .map(|i| self.read(i).table.allocation_size())
            .sum::<usize>()
            + locks
            + inner
    }
}

/// Rewrites a bucket refilled to `now` (exact on the tick grid, so nothing changes but
/// the anchor): afterwards it is at most one sweep interval away from its last write.
pub(crate) fn reanchor<C: Clock + ?Sized>(
    bucket: &RawBucket,
    layout: &Layout,
    clock: &Monotonic<C>,
    now: u64,
) {
    let done = bucket.transition(layout, clock, now, false, |s, _| {
        if s.behind() > 0 {
            (None, ())
        } else {
            (Some(layout.store(s, s.units())), ())
        }
    });
    debug_assert!(done.is_ok(), "a non-strict transition cannot fail");
}
