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
use std::mem::MaybeUninit;
use std::sync::PoisonError;

use hashbrown::HashTable;

use super::epoch::{Epochs, MapEpoch};
use crate::bucket::RawBucket;
use crate::clock::{Clock, Monotonic};
use crate::hint::cold_path;
use crate::state::{Layout, Snapshot};
use crossbeam_utils::CachePadded;

use super::readers;
use crate::sync::{
    AtomicU64, AtomicUsize, ConstPtr, MutPtr, Ordering, RawCell, ShardLock, ShardReadGuard,
    ShardWriteGuard, fence,
};
use crate::telemetry::{CounterCells, CounterRef, CounterSnapshot};

/// At most 2^10 shards.
pub(crate) const MAX_SHARD_BITS: u32 = 10;

/// The lowest bit of hashbrown's 7-bit control tag on 64-bit targets.
const TAG_SHIFT: u32 = 57;

/// What a map stores per key besides its bucket: nothing, or the key's counters.
pub(crate) trait Extra: Default + Send + Sync {
    fn counter_ref(&self) -> CounterRef<'_>;
    fn counts(&self) -> Option<CounterSnapshot>;
    /// The counters, moving with a key to another map.
    fn into_cells(self) -> Option<CounterCells>;
    /// The extra of a key that moved in with `cells` (fresh counters when it came
    /// without any).
    fn from_cells(cells: Option<CounterCells>) -> Self;
    /// Adds the counts of `other` (a moved key's) to these.
    fn absorb(&self, other: Self);
}

impl Extra for () {
    #[inline]
    fn counter_ref(&self) -> CounterRef<'_> {
        CounterRef::Off
    }

    fn counts(&self) -> Option<CounterSnapshot> {
        None
    }

    fn into_cells(self) -> Option<CounterCells> {
        None
    }

    fn from_cells(_: Option<CounterCells>) {}

    fn absorb(&self, _: ()) {}
}

impl Extra for CounterCells {
    #[inline]
    fn counter_ref(&self) -> CounterRef<'_> {
        CounterRef::Cells(self)
    }

    fn counts(&self) -> Option<CounterSnapshot> {
        Some(CounterCells::snapshot(self))
    }

    fn into_cells(self) -> Option<CounterCells> {
        Some(self)
    }

    fn from_cells(cells: Option<CounterCells>) -> CounterCells {
        cells.unwrap_or_default()
    }

    fn absorb(&self, other: CounterCells) {
        self.add(&other.snapshot());
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

/// One shard: a hashbrown table. Its eviction hint lives in the table's `hints`, outside
/// the lock, so that a search for room can skip the shard without locking it.
pub(crate) struct Shard<K, V> {
    pub(crate) table: HashTable<Entry<K, V>>,
    /// The number of the map's epoch (policy) its words are in (see [`super::epoch`]).
    pub(crate) epoch: u64,
    /// The entry count at which an insert sweeps the shard for idle keys (when its hint
    /// says one may be full): twice the count the last sweep left, at least
    /// [`IDLE_SWEEP_MIN`]. See [`Table::find_or_insert`].
    pub(crate) sweep_at: usize,
}

/// The least entry count of a shard at which an insert sweeps it for idle keys: a map
/// keeps at most about this many keys per shard beyond twice its active ones.
pub(crate) const IDLE_SWEEP_MIN: usize = 32;

/// What [`Table::find_or_insert`] found.
pub(crate) enum Found {
    /// The key's entry, at this index.
    Present(usize),
    /// A fresh entry for the key, at this index.
    Inserted(usize),
    /// No entry, and no room for one.
    Full,
}

/// What a sweep needs to know about the map.
pub(crate) struct SweepCtx<'a> {
    /// The map's epochs, and the one this sweep works in: pinned, or read under the
    /// lock of the one shard the sweep works on.
    pub(crate) epochs: &'a Epochs,
    pub(crate) epoch: &'a MapEpoch,
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

/// One shard: its lock and, beside it, its data, reached under the lock or in a reader
/// section (see [`Table::enter`]).
struct ShardCell<K, V> {
    lock: ShardLock<()>,
    data: RawCell<Shard<K, V>>,
    prefetch: Prefetch,
}

/// Where a shard's hash table keeps its control bytes, and its bucket mask, as last
/// written under the shard's write lock: enough to compute, from a hash alone, the
/// addresses a lookup will read first (its first control group and the entry at its
/// first probe position), so that both loads can start before the reader section's
/// fence and before each other. Only prefetched: a stale or wrong address costs time,
/// never correctness (a prefetch reads nothing the program sees and never faults).
/// Not the loom facade's atomics: nothing is ordered by them.
#[derive(Default)]
struct Prefetch {
    ctrl: std::sync::atomic::AtomicUsize,
    mask: std::sync::atomic::AtomicUsize,
}

impl Prefetch {
    /// Prefetches the first control group and the first probe position's entry of a
    /// lookup of `hash` in a table of `T`.
    #[inline(always)]
    // No prefetch but on x86_64 outside loom: `T` is unused elsewhere.
    #[cfg_attr(
        not(all(target_arch = "x86_64", not(loom))),
        allow(clippy::extra_unused_type_parameters)
    )]
    fn issue<T>(&self, hash: u64) {
        #[cfg(all(target_arch = "x86_64", not(loom)))]
        {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            use std::sync::atomic::Ordering::Relaxed;
            let ctrl = self.ctrl.load(Relaxed);
            let pos = hash as usize & self.mask.load(Relaxed);
            let entry = ctrl.wrapping_sub((pos + 1).wrapping_mul(std::mem::size_of::<T>()));
            // SAFETY: a prefetch only hints the cache; it reads nothing the program
            // sees and does not fault, whatever the address.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(ctrl.wrapping_add(pos) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(entry as *const i8);
            }
        }
        #[cfg(not(all(target_arch = "x86_64", not(loom))))]
        let _ = hash;
    }

    /// Notes where `table` keeps its control bytes (hashbrown's layout: bucket `j`'s
    /// entry ends `j` entries below them), from its first full bucket among the first
    /// 64; 0 when none is found.
    #[cfg_attr(loom, allow(dead_code))]
    fn note<T>(&self, table: &HashTable<T>) {
        use std::sync::atomic::Ordering::Relaxed;
        let buckets = table.num_buckets();
        let ctrl = (0..buckets.min(64))
            .find_map(|j| table.get_bucket(j).map(|e| (j, e)))
            .map_or(0, |(j, e)| {
                (e as *const T as usize).wrapping_add((j + 1) * std::mem::size_of::<T>())
            });
        self.ctrl.store(ctrl, Relaxed);
        self.mask.store(buckets.wrapping_sub(1), Relaxed);
    }
}

// SAFETY: the shard's data is shared between threads only as `ShardLock` would share a
// `Shard` (`&Shard` to readers, `&mut Shard` to one writer at a time), so the bounds are
// `ShardLock<Shard>`'s: `K` and `V` sent between threads and shared. Readers are those
// holding the read lock and those in a reader section; a writer holds the write lock and
// has waited out every reader section of the shard, which none enters meanwhile (the
// protocol on [`Table::enter`] and [`Table::write`]).
unsafe impl<K: Send + Sync, V: Send + Sync> Sync for ShardCell<K, V> {}

/// How many threads can hold reader records in one table: four per core, at least 16,
/// at most 256 (a thread with a higher reader index takes the read lock instead).
#[cfg(not(loom))]
fn record_count() -> usize {
    let cores = std::thread::available_parallelism().map_or(4, usize::from);
    (4 * cores).next_power_of_two().clamp(16, 256)
}

/// Under loom: two records, for the models' threads (the main thread and one more take
/// indices 0 and 1; a third takes the read lock), each record a fence and a load more in
/// every write lock's wait.
#[cfg(loom)]
fn record_count() -> usize {
    2
}

pub(crate) struct Table<K, V, S> {
    shards: Box<[ShardCell<K, V>]>,
    /// Reader records, one per reader index ([`readers::index`]): `i + 1` while that
    /// thread is in a reader section of shard `i`, else 0. Each is written by its own
    /// thread only (plain stores, no read-modify-write), read by writers.
    records: Box<[CachePadded<AtomicUsize>]>,
    /// Per shard, 1 while a writer holds its write lock and may be changing its data
    /// (set before the writer waits out the shard's reader sections), else 0. Written
    /// under the write lock only; read by each reader section.
    /// Padded: a writer of one shard does not disturb the sections of the others.
    writing: Box<[CachePadded<AtomicUsize>]>,
    /// Per shard, clock nanoseconds before which no bucket of the shard can be evicted: a
    /// lower bound of the time its first bucket refills to full (`u64::MAX` when the
    /// shard holds no bucket). Lowered by whatever may bring that time forward (a new
    /// key, a refund) and set by each sweep of the shard, so a search for room skips a
    /// shard with one load, and sweeps only a shard that can evict something. Not
    /// padded: the hints are read together by a search and written on slow paths only.
    hints: Box<[AtomicU64]>,
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
                .map(|_| ShardCell {
                    prefetch: Prefetch::default(),
                    lock: ShardLock::new(()),
                    data: RawCell::new(Shard {
                        epoch: 0,
                        table: HashTable::new(),
                        sweep_at: IDLE_SWEEP_MIN,
                    }),
                })
                .collect(),
            records: (0..record_count())
                .map(|_| CachePadded::new(AtomicUsize::new(0)))
                .collect(),
            writing: (0..1usize << shard_bits)
                .map(|_| CachePadded::new(AtomicUsize::new(0)))
                .collect(),
            hints: (0..1usize << shard_bits)
                .map(|_| AtomicU64::new(u64::MAX))
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
    pub(crate) fn read(&self, i: usize) -> ShardRead<'_, K, V> {
        let cell = &self.shards[i];
        let lock = cell.lock.read().unwrap_or_else(PoisonError::into_inner);
        ShardRead {
            shard: cell.data.get(),
            _lock: lock,
        }
    }

    /// Enters a reader section of shard `i`: its data may then be read
    /// ([`Section::shard`]) without its lock, and no writer changes it until the section
    /// is dropped. `None`, with nothing held, when a writer holds the shard, when this
    /// thread has no record in this table (a reader index beyond the records) or is in a
    /// section of this table already (a key's `Eq` deciding on the same map): the caller
    /// takes the read lock instead. (Such a nested decision is no safer than under the
    /// read lock: with a writer waiting on the shard, or for a key the nested call must
    /// insert, it waits for its own outer section, as it waited for its own read lock.)
    ///
    /// No read-modify-write: the record is this thread's alone. The record's store and
    /// the writer's flag store are each followed by a `SeqCst` fence before the other's
    /// load (Dekker's pattern): of a reader entering and a writer arriving, at least one
    /// sees the other's store. A reader that sees the flag leaves; a writer that sees the
    /// record waits until it is 0 again (its `Acquire` load of the section's `Release`
    /// exit orders the section's reads before the writer's changes). A reader that sees
    /// the flag clear either read the clearing store (`Release`, after the writer's last
    /// change) or entered before the writer's fence, and the writer waits for it.
    #[inline(always)]
    pub(crate) fn enter(&self, i: usize, hash: u64) -> Option<Section<'_, K, V>> {
        let section = Section {
            _exit: self.claim_record(i)?,
            cell: &self.shards[i],
        };
        fence(Ordering::SeqCst);
        // After the fence: issued before it, the one lookup's prefetch cost more than
        // it saved (measured: BENCHMARKS.md, "Keyed lookups: the prefetch after the
        // fence").
        self.prefetch(i, hash);
        if self.writer_on(i) {
            cold_path();
            // Dropping the section clears the record.
            return None;
        }
        Some(section)
    }

    /// Prefetches the first control group and entry a lookup of `hash` in shard `i`
    /// reads (a hint: nothing is read that the program sees).
    #[inline(always)]
    fn prefetch(&self, i: usize, hash: u64) {
        if let Some(cell) = self.shards.get(i) {
            cell.prefetch.issue::<Entry<K, V>>(hash);
        }
    }

    /// What [`enter`](Table::enter) and [`announce`](Table::announce) do before the
    /// fence: store this thread's record naming shard `i`; `None`, storing nothing, for
    /// a thread without a record in this table or in a section of it already.
    #[inline(always)]
    fn claim_record(&self, i: usize) -> Option<SectionExit<'_>> {
        let record = self.records.get(readers::index())?;
        if record.load(Ordering::Relaxed) != 0 {
            return None;
        }
        // `Release`: a writer that reads this store (the section's exit store of 0 on an
        // earlier shard overwritten unseen) must still be ordered after that section.
        let entry = if mutant!(SECTION_ENTRY_RELAXED) {
            Ordering::Relaxed
        } else {
            Ordering::Release
        };
        record.store(i + 1, entry);
        Some(SectionExit { record })
    }

    /// What a section checks after the fence: whether a writer holds or awaits shard
    /// `i` (the section then leaves).
    #[inline(always)]
    fn writer_on(&self, i: usize) -> bool {
        self.writing[i].load(Ordering::Acquire) != 0 && !mutant!(READER_SKIPS_FLAG)
    }

    /// The first half of [`enter`](Table::enter) for a section kept by `sections`
    /// with others: shard `i`'s first probe for `hash` is prefetched and this thread's
    /// record names the shard, without the fence. Once every section of a request is
    /// announced, [`Sections::fence`] makes the one fence they all need, and
    /// [`confirm`](Table::confirm) finishes each. `false`, with nothing kept, where
    /// `enter` gives `None` before its fence (no record, a section of this table held
    /// already) and when `sections` is full.
    ///
    /// One fence serves every record stored before it: it orders each of them before
    /// each flag loaded after it, which is all that Dekker's pattern asks of each
    /// record and its shard's flag (see `enter`).
    #[inline(always)]
    pub(crate) fn announce<'a, const N: usize>(
        &'a self,
        i: usize,
        hash: u64,
        sections: &Sections<'a, N>,
    ) -> bool {
        if sections.is_full() {
            cold_path();
            return false;
        }
        // Before the fence here (unlike `enter`): the prefetches of a request's maps
        // then overlap the other maps' announcements (measured: BENCHMARKS.md, "Keyed
        // lookups: the prefetch after the fence").
        self.prefetch(i, hash);
        let Some(exit) = self.claim_record(i) else {
            cold_path();
            return false;
        };
        sections.keep(exit);
        true
    }

    /// The second half of [`enter`](Table::enter) for shard `i`, announced
    /// ([`announce`](Table::announce)) before `sections`' fence: a pointer to the
    /// shard's data, to be dropped before `sections`; `None` when a writer holds or
    /// awaits the shard (the caller then drops `sections` and takes the read locks).
    #[inline(always)]
    pub(crate) fn confirm<const N: usize>(
        &self,
        i: usize,
        _fenced: &Fenced<'_, '_, N>,
    ) -> Option<ConstPtr<Shard<K, V>>> {
        let cell = self.shards.get(i)?;
        if self.writer_on(i) {
            cold_path();
            return None;
        }
        Some(cell.data.get())
    }

    /// Every shard's write lock, in shard order: no operation runs on the map while they
    /// are held (a reconfiguration's barrier).
    pub(crate) fn write_all(&self) -> Vec<ShardWrite<'_, K, V>> {
        (0..self.shards.len()).map(|i| self.write(i)).collect()
    }

    /// Write lock on shard `i` (see [`read`](Table::read) on poisoning), held once the
    /// shard's reader sections are over: sets the shard's writing flag, then waits until
    /// no record shows a section of the shard (see [`enter`](Table::enter)). Sections
    /// entered afterwards see the flag and take the read lock, which waits for this one.
    pub(crate) fn write(&self, i: usize) -> ShardWrite<'_, K, V> {
        let cell = &self.shards[i];
        let lock = cell.lock.write().unwrap_or_else(PoisonError::into_inner);
        let writing = &self.writing[i];
        writing.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if !mutant!(WRITER_SKIPS_READERS) {
            for record in self.records.iter() {
                let mut spins = 0;
                while record.load(Ordering::Acquire) == i + 1 {
                    crate::sync::spin(&mut spins);
                }
            }
        }
        ShardWrite {
            shard: Some(cell.data.get_mut()),
            prefetch: &cell.prefetch,
            writing,
            _lock: lock,
        }
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

    /// Gives back a claim that was not used (its key turned out to be in the map).
    pub(crate) fn release_claim(&self) {
        self.len.fetch_sub(1, Ordering::Relaxed);
    }

    /// A bucket of shard `i` may be full from `at` (clock nanoseconds) on: brings the
    /// shard's hint forward to `at` if it was later.
    pub(crate) fn lower_hint(&self, i: usize, at: u64) {
        let hint = &self.hints[i];
        if at < hint.load(Ordering::Relaxed) {
            hint.fetch_min(at, Ordering::Relaxed);
        }
    }

    /// Shard `i`'s hint: no bucket of the shard is full before this time.
    pub(crate) fn hint(&self, i: usize) -> u64 {
        self.hints[i].load(Ordering::Relaxed)
    }

    /// Whether shard `i` may hold a bucket that is full at `now`.
    fn may_evict(&self, i: usize, now: u64) -> bool {
        now >= self.hint(i)
    }

    /// Under shard `i`'s write lock: converts its words to `ctx`'s epoch if they are in
    /// an older one (see [`super::epoch`]); `false` when the shard is in a newer epoch
    /// than `ctx`'s (another operation converted it after `ctx` was made), which `ctx`
    /// cannot read.
    pub(crate) fn bring_up(&self, i: usize, shard: &mut Shard<K, V>, ctx: &SweepCtx<'_>) -> bool {
        self.bring_up_to(i, shard, ctx.epoch)
    }

    /// [`bring_up`](Table::bring_up) to `epoch`, the map's current one. A shard is at
    /// most one epoch behind it (a switch brings every shard to the epoch it replaces
    /// before it publishes), so `epoch` holds all its words are converted from.
    pub(crate) fn bring_up_to(&self, i: usize, shard: &mut Shard<K, V>, epoch: &MapEpoch) -> bool {
        if shard.epoch == epoch.number {
            return true;
        }
        if shard.epoch > epoch.number {
            return false;
        }
        debug_assert_eq!(
            shard.epoch + 1,
            epoch.number,
            "a shard more than one epoch behind"
        );
        for e in shard.table.iter_mut() {
            if mutant!(KEYED_SHARD_NOT_CONVERTED) {
                break;
            }
            e.bucket.set(super::epoch::convert(epoch, e.bucket.load()));
        }
        shard.epoch = epoch.number;
        // Any bucket may now be full: the next search for room sweeps this shard.
        self.hints[i].store(0, Ordering::Relaxed);
        true
    }

    /// Under a shard's write lock (`shard`): removes every entry (a map whose keys all
    /// moved elsewhere), giving its memory back; each entry's counts are added to
    /// `evicted`.
    pub(crate) fn clear(&self, shard: &mut Shard<K, V>, evicted: &CounterCells)
    where
        V: Extra,
    {
        let n = shard.table.len();
        for e in std::mem::take(&mut shard.table) {
            if let Some(counts) = e.extra.counts() {
                evicted.add(&counts);
            }
        }
        self.len.fetch_sub(n, Ordering::Relaxed);
    }
}

impl<K: Hash + Eq, V: Extra, S: BuildHasher> Table<K, V, S> {
    /// The key's hash, computed once per operation.
    #[inline]
    pub(crate) fn hash_of<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Under a shard's write lock (`shard`): removes `key`'s entry and returns it.
    pub(crate) fn remove(
        &self,
        shard: &mut Shard<K, V>,
        hash: u64,
        key: &K,
    ) -> Option<Entry<K, V>> {
        let entry = shard.table.find_entry(hash, |e| e.key == *key).ok()?;
        self.len.fetch_sub(1, Ordering::Relaxed);
        Some(entry.remove().0)
    }

    /// Under a shard's write lock (`shard`): whether `key` has an entry.
    pub(crate) fn contains_in(&self, shard: &Shard<K, V>, hash: u64, key: &K) -> bool {
        shard.table.find(hash, |e| e.key == *key).is_some()
    }

    /// Under shard `i`'s write lock (`shard`), its words in the map's current epoch:
    /// stores `word` (of that epoch's layout) as `key`'s, inserting its entry with
    /// `extra` when it has none (an entry it has keeps its extra). `false`, with nothing
    /// changed, when the key is new and the map is at its maximum.
    pub(crate) fn put(
        &self,
        i: usize,
        shard: &mut Shard<K, V>,
        hash: u64,
        key: K,
        word: u64,
        extra: V,
    ) -> bool {
        if let Some(e) = shard.table.find(hash, |e| e.key == key) {
            // An entry a request made meanwhile (one that then found its configuration
            // replaced): the moved word replaces its fresh one, the counts add up.
            e.bucket.set(word);
            e.extra.absorb(extra);
        } else {
            if !self.claim() {
                return false;
            }
            let bucket = RawBucket::from_word(word);
            let hasher = &self.hasher;
            shard
                .table
                .insert_unique(hash, Entry { key, bucket, extra }, |e| {
                    hasher.hash_one(&e.key)
                });
        }
        // The word may be full at any time: the next search for room sweeps this shard.
        self.hints[i].store(0, Ordering::Relaxed);
        true
    }

    /// Under shard `i`'s write lock (`shard`): `key`'s entry, inserting a fresh bucket if
    /// the key is missing and there is room. `claimed`: room for one key was claimed
    /// already (by [`claim_by_evicting`](Table::claim_by_evicting)); it is used, or given
    /// back when the key turns out to be in the map. At the maximum it sweeps this shard
    /// first when its hint says a bucket may be full; [`Found::Full`] when there is still
    /// no room.
    ///
    /// Below the maximum, idle keys are released as new ones come (no caller's `sweep`
    /// needed): an insert into a shard holding `sweep_at` entries sweeps it first when its
    /// hint says a bucket may be full, evicting the full ones (identical to fresh
    /// buckets), and sets `sweep_at` to twice what is left. A sweep of `n` entries thus
    /// follows at least `n / 2` inserts into the shard (amortised O(1) per insert), and a
    /// shard holds at most about `max(2 * active, IDLE_SWEEP_MIN)` keys once its idle
    /// ones have refilled. Lookups of present keys do none of this.
    pub(crate) fn find_or_insert<Q>(
        &self,
        i: usize,
        shard: &mut Shard<K, V>,
        hash: u64,
        key: &Q,
        ctx: &SweepCtx<'_>,
        claimed: bool,
    ) -> Found
    where
        K: Borrow<Q>,
        Q: Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(index) = shard
            .table
            .find_bucket_index(hash, |e| e.key.borrow() == key)
        {
            if claimed {
                self.release_claim();
            }
            return Found::Present(index);
        }
        let room = claimed
            || self.claim()
            || (ctx.evict
                && self.may_evict(i, ctx.now)
                && self.sweep_shard(i, shard, ctx, true).evicted > 0)
            // Room another thread freed while this one swept.
            || self.claim();
        if !room {
            return Found::Full;
        }
        if ctx.evict && shard.table.len() >= shard.sweep_at && self.may_evict(i, ctx.now) {
            // Room is claimed already: the sweep only gives idle keys' room back.
            self.sweep_shard(i, shard, ctx, false);
        }
        let entry = Entry {
            key: key.to_owned(),
            bucket: RawBucket::new(ctx.layout, ctx.now, ctx.start_full),
            extra: V::default(),
        };
        let hasher = &self.hasher;
        let occupied = shard
            .table
            .insert_unique(hash, entry, |e| hasher.hash_one(&e.key));
        Found::Inserted(occupied.bucket_index())
    }

    /// Under shard `i`'s write lock, once the caller is done with the entry it inserted
    /// at `index`: brings the shard's hint forward to the time that bucket is full.
    pub(crate) fn note_inserted(
        &self,
        i: usize,
        shard: &Shard<K, V>,
        index: usize,
        ctx: &SweepCtx<'_>,
    ) {
        if !ctx.evict {
            return;
        }
        if let Some(e) = shard.table.get_bucket(index) {
            let s = e.bucket.snapshot(ctx.layout, ctx.now);
            self.lower_hint(i, full_at(ctx.layout, &s, ctx.now));
        }
    }

    /// At the maximum, with nothing evicted in the caller's own shard `own`: sweeps, in
    /// turn from the shard after `own`, each shard whose hint says a bucket may be full at
    /// `ctx.now` (one load skips any other), until a sweep evicts; room for one key is
    /// then claimed for the caller. `false` when no shard, as it was examined, held a
    /// bucket that could be evicted, and the map was still at its maximum afterwards.
    ///
    /// Takes one write lock at a time; the caller holds none of this table's locks.
    pub(crate) fn claim_by_evicting(&self, own: usize, ctx: &SweepCtx<'_>) -> bool {
        if ctx.evict && !mutant!(KEYED_SEARCH_SKIPS_OTHER_SHARDS) {
            let mask = self.shards.len() - 1;
            // Ends with `own`: a refund may have filled one of its buckets meanwhile.
            for k in 1..=self.shards.len() {
                let i = (own + k) & mask;
                if !self.may_evict(i, ctx.now) {
                    continue;
                }
                let mut guard = self.write(i);
                if !ctx.epochs.is_current(ctx.epoch) {
                    // A switch since `ctx` was made (its eviction rule may have changed):
                    // no more sweeping on the old one.
                    break;
                }
                if !self.bring_up(i, &mut guard, ctx) {
                    continue;
                }
                if self.sweep_shard(i, &mut guard, ctx, true).evicted > 0 {
                    return true;
                }
            }
        }
        self.claim()
    }

    /// Under shard `i`'s write lock: evicts the entries whose buckets have refilled to
    /// full (when `ctx.evict`), re-anchors the others at `ctx.now`, and sets the shard's
    /// hint to the earliest time a kept bucket can be full. With `keep_claim`, room for
    /// one of the evicted keys stays claimed for the caller (when anything was evicted),
    /// so that no other thread can take it first.
    pub(crate) fn sweep_shard(
        &self,
        i: usize,
        shard: &mut Shard<K, V>,
        ctx: &SweepCtx<'_>,
        keep_claim: bool,
    ) -> SweepReport {
        let layout = ctx.layout;
        let mut report = SweepReport::default();
        let mut hint = u64::MAX;
        shard.table.retain(|e| {
            report.examined += 1;
            let s = e.bucket.snapshot(layout, ctx.now);
            // A full bucket is identical to a fresh one, even one read behind its stored
            // tick (a fresh bucket is stored at the next tick edge).
            if ctx.evict && layout.is_full(&s) {
                if let Some(counts) = e.extra.counts() {
                    ctx.evicted_counts.add(&counts);
                }
                report.evicted += 1;
                return false;
            }
            if s.behind() == 0 {
                reanchor(&e.bucket, layout, ctx.clock, ctx.now);
                report.reanchored += 1;
            }
            // A bucket read behind (written at a later reading than this sweep's) is
            // left exactly as it is; its hint counts from its stored tick.
            if ctx.evict {
                hint = hint.min(full_at(layout, &s, ctx.now));
            }
            true
        });
        let kept = usize::from(keep_claim && report.evicted > 0);
        self.len.fetch_sub(report.evicted - kept, Ordering::Relaxed);
        self.hints[i].store(hint, Ordering::Relaxed);
        shard.sweep_at = shard.table.len().saturating_mul(2).max(IDLE_SWEEP_MIN);
        report
    }

    /// Under shard `i`'s write lock, in a re-anchoring pass that found every bucket of
    /// the map idle for longer than the fill time (so full, whatever its word reads after
    /// such an idle): evicts every entry (when `ctx.evict`), or rewrites each bucket full
    /// at `ctx.now`.
    pub(crate) fn fill_shard(
        &self,
        i: usize,
        shard: &mut Shard<K, V>,
        ctx: &SweepCtx<'_>,
    ) -> SweepReport {
        let mut report = SweepReport {
            examined: shard.table.len(),
            ..SweepReport::default()
        };
        if ctx.evict {
            for e in shard.table.drain() {
                if let Some(counts) = e.extra.counts() {
                    ctx.evicted_counts.add(&counts);
                }
            }
            report.evicted = report.examined;
            self.len.fetch_sub(report.evicted, Ordering::Relaxed);
            self.hints[i].store(u64::MAX, Ordering::Relaxed);
        } else {
            for e in shard.table.iter_mut() {
                e.bucket = RawBucket::new(ctx.layout, ctx.now, true);
            }
            report.reanchored = report.examined;
        }
        shard.epoch = ctx.epoch.number;
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
        let locks = self.shards.len()
            * (std::mem::size_of::<ShardCell<K, V>>()
                + std::mem::size_of::<AtomicU64>()
                + std::mem::size_of::<CachePadded<AtomicUsize>>())
            + self.records.len() * std::mem::size_of::<CachePadded<AtomicUsize>>();
        // Each `ShardedLock` also holds 8 cache-padded inner locks on the heap.
        let inner = self.shards.len() * 8 * 128;
        (0..self.shards.len())
            .map(|i| self.read(i).table.allocation_size())
            .sum::<usize>()
            + locks
            + inner
    }
}

/// A shard read-locked ([`Table::read`]): derefs to its data.
pub(crate) struct ShardRead<'a, K, V> {
    // Dropped first: the access ends before the lock is released.
    shard: ConstPtr<Shard<K, V>>,
    _lock: ShardReadGuard<'a, ()>,
}

impl<K, V> std::ops::Deref for ShardRead<'_, K, V> {
    type Target = Shard<K, V>;

    #[inline(always)]
    fn deref(&self) -> &Shard<K, V> {
        // SAFETY: the read lock is held, so no writer holds the write lock, the only way
        // to a `&mut Shard` (`ShardWrite`).
        unsafe { self.shard.deref() }
    }
}

/// A shard write-locked with its reader sections waited out ([`Table::write`]): derefs
/// (mutably) to its data. Dropping it clears the shard's writing flag, then unlocks.
pub(crate) struct ShardWrite<'a, K, V> {
    /// `None` only while being dropped.
    shard: Option<MutPtr<Shard<K, V>>>,
    // Noted on drop, outside loom (whose tables are not prefetched).
    #[cfg_attr(loom, allow(dead_code))]
    prefetch: &'a Prefetch,
    writing: &'a AtomicUsize,
    _lock: ShardWriteGuard<'a, ()>,
}

impl<K, V> ShardWrite<'_, K, V> {
    #[inline(always)]
    fn ptr(&self) -> &MutPtr<Shard<K, V>> {
        self.shard.as_ref().expect("set until the guard is dropped")
    }
}

impl<K, V> std::ops::Deref for ShardWrite<'_, K, V> {
    type Target = Shard<K, V>;

    #[inline(always)]
    fn deref(&self) -> &Shard<K, V> {
        // SAFETY: this guard holds the write lock (no read guard exists) and the
        // shard's writing flag, set before it waited until no reader section of the
        // shard remained (none is entered while the flag is set): no other reference to
        // the shard exists; `&self` shares it only for as long as this borrow.
        unsafe { crate::sync::shared(self.ptr()) }
    }
}

impl<K, V> std::ops::DerefMut for ShardWrite<'_, K, V> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut Shard<K, V> {
        // SAFETY: as `deref`, and `&mut self` makes this the only borrow of the guard.
        unsafe { self.ptr().deref() }
    }
}

impl<K, V> Drop for ShardWrite<'_, K, V> {
    fn drop(&mut self) {
        // The access ends, then sections may enter again (the `Release` store orders this
        // writer's changes before any section that reads it clear), then the lock goes.
        #[cfg(not(loom))]
        self.prefetch.note(&self.table);
        self.shard = None;
        // Under loom, a panic is a failed model, unwinding outside loom's execution:
        // nothing is left to model, and a loom operation would abort the process.
        #[cfg(loom)]
        if std::thread::panicking() {
            return;
        }
        self.writing.store(0, Ordering::Release);
    }
}

/// A thread's reader section of one shard ([`Table::enter`]): the shard's data may be
/// read while it lives. Dropping it (also when a key's `Hash` or `Eq` panics) clears the
/// thread's record.
pub(crate) struct Section<'a, K, V> {
    /// Ends the section when dropped.
    _exit: SectionExit<'a>,
    cell: &'a ShardCell<K, V>,
}

impl<'a, K, V> Section<'a, K, V> {
    /// A pointer to the shard's data, to be dropped before the section.
    #[inline(always)]
    pub(crate) fn shard(&self) -> ConstPtr<Shard<K, V>> {
        self.cell.data.get()
    }
}

/// What ends a reader section: dropping it clears the thread's record (see
/// [`Table::enter`]).
struct SectionExit<'a> {
    record: &'a AtomicUsize,
}

/// Reader sections of several maps held at once (at most `N`, each of another table),
/// ended together when this is dropped: what a request paying several keyed maps at
/// once holds while it pays them, whatever the maps' key and extra types. What is read
/// in a section is lent for borrows of this alone ([`KeyedLimiter::hold`]).
///
/// Entered in one fixed order of the maps (the order their locks are taken in), any
/// number can be held at once: a section never waits, and a writer waits only for the
/// sections of the one shard it holds (a barrier's writer, holding every shard of every
/// map in that order, waits for each in turn, none of which waits for it).
///
/// Each section is entered in two halves around one fence they all share: every
/// record is stored first ([`Table::announce`]), then [`fence`](Sections::fence), then
/// each shard's flag is loaded ([`Table::confirm`]). A request paying two maps makes
/// one fence, not two (a fence is a locked instruction on x86-64, about as dear as
/// the bucket's own compare-and-swap).
///
/// [`KeyedLimiter::hold`]: super::KeyedLimiter::hold
pub(crate) struct Sections<'a, const N: usize> {
    /// The records of the sections held, the first `len` of them (the others never
    /// written: zeroing them would be stores on every request, ahead of the fence).
    records: [std::cell::Cell<MaybeUninit<*const AtomicUsize>>; N],
    len: std::cell::Cell<usize>,
    /// Under loom, each shard's tracked read access, ended before the sections.
    #[cfg(loom)]
    accesses: std::cell::RefCell<Vec<Box<dyn std::any::Any>>>,
    /// The tables' records are borrowed for `'a`.
    _records: std::marker::PhantomData<&'a AtomicUsize>,
}

impl<'a, const N: usize> Sections<'a, N> {
    /// No section held.
    #[inline(always)]
    pub(crate) fn new() -> Sections<'a, N> {
        Sections {
            records: [const { std::cell::Cell::new(MaybeUninit::uninit()) }; N],
            len: std::cell::Cell::new(0),
            #[cfg(loom)]
            accesses: std::cell::RefCell::new(Vec::new()),
            _records: std::marker::PhantomData,
        }
    }

    /// Whether `N` sections are held: no more can be.
    #[inline(always)]
    pub(crate) fn is_full(&self) -> bool {
        self.len.get() >= N
    }

    /// Keeps `exit`'s section (one held at once with `N` others ends at once).
    #[inline(always)]
    fn keep(&self, exit: SectionExit<'a>) {
        let len = self.len.get();
        if let Some(slot) = self.records.get(len) {
            slot.set(MaybeUninit::new(std::ptr::from_ref(exit.record)));
            std::mem::forget(exit);
            self.len.set(len + 1);
        }
    }

    /// Under loom, keeps a shard's tracked read access until the sections end.
    #[cfg(loom)]
    pub(crate) fn keep_access(&self, access: Box<dyn std::any::Any>) {
        self.accesses.borrow_mut().push(access);
    }
}

/// The fence of [`Sections::fence`] made: each section announced before it may be
/// confirmed ([`Table::confirm`]).
pub(crate) struct Fenced<'s, 'a, const N: usize> {
    _sections: &'s Sections<'a, N>,
}

impl<'a, const N: usize> Sections<'a, N> {
    /// The one `SeqCst` fence between the records of every section announced so far
    /// ([`Table::announce`]) and the loads of their shards' flags ([`Table::confirm`]).
    #[inline(always)]
    pub(crate) fn fence(&self) -> Fenced<'_, 'a, N> {
        if !mutant!(SECTIONS_SKIP_FENCE) {
            fence(Ordering::SeqCst);
        }
        Fenced { _sections: self }
    }
}

impl<const N: usize> Drop for Sections<'_, N> {
    #[inline(always)]
    fn drop(&mut self) {
        #[cfg(loom)]
        {
            self.accesses.borrow_mut().clear();
            if std::thread::panicking() {
                return;
            }
        }
        for record in &self.records[..self.len.get()] {
            // SAFETY: one of the first `len`, each written by `keep`: a record of a table
            // borrowed for `'a`, which this outlives.
            let record = unsafe { &*record.get().assume_init() };
            record.store(0, Ordering::Release);
        }
    }
}

impl Drop for SectionExit<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        // As in `ShardWrite`'s drop: under loom, a panic is a failed model.
        #[cfg(loom)]
        if std::thread::panicking() {
            return;
        }
        self.record.store(0, Ordering::Release);
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
    bucket.reanchor(layout, clock, now);
}

/// Clock nanoseconds from which a bucket in state `s`, read at `now`, is full if nothing
/// is taken from it: `now`'s tick edge plus the ticks `s` is behind plus the ticks its
/// refill takes, or 0 for a full bucket. Exact on the tick grid (refill arrives at tick
/// edges), so a bucket is never full before this time. Uses a division: slow paths only.
pub(crate) fn full_at(layout: &Layout, s: &Snapshot, now: u64) -> u64 {
    if layout.is_full(s) {
        return 0;
    }
    let full_units = layout.max_units() - layout.base_units();
    let tick = layout
        .tick_of(now)
        .saturating_add(s.behind())
        .saturating_add(layout.ticks_until(s.units(), full_units));
    if tick > u64::MAX >> layout.tick_shift() {
        u64::MAX
    } else {
        tick << layout.tick_shift()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::Prefetch;
    use hashbrown::HashTable;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    /// The addresses [`Prefetch`] computes from a hash are those a lookup reads: every
    /// entry sits where hashbrown's layout puts it below the control bytes, and most
    /// entries at their probe's first position or within the prefetched line's reach.
    #[test]
    fn the_prefetched_addresses_are_those_a_lookup_reads() {
        let hasher = ahash::RandomState::with_seeds(1, 2, 3, 4);
        let mut table = HashTable::new();
        let prefetch = Prefetch::default();
        let size = std::mem::size_of::<(u64, u64)>();
        for n in [1u64, 100, 10_000, 30_000] {
            for k in table.len() as u64..n {
                table.insert_unique(hasher.hash_one(k), (k, 0u64), |e: &(u64, u64)| {
                    hasher.hash_one(e.0)
                });
            }
            prefetch.note(&table);
            let (ctrl, mask) = (prefetch.ctrl.load(Relaxed), prefetch.mask.load(Relaxed));
            assert_eq!(mask + 1, table.num_buckets());
            let mut first_line = 0;
            for k in 0..n {
                let hash = hasher.hash_one(k);
                let j = table
                    .find_bucket_index(hash, |e| e.0 == k)
                    .expect("inserted");
                let at = table.get_bucket(j).expect("full") as *const (u64, u64) as usize;
                assert_eq!(at, ctrl - (j + 1) * size, "key {k} of {n}");
                let home = ctrl - ((hash as usize & mask) + 1) * size;
                if at / 64 == home / 64 {
                    first_line += 1;
                }
            }
            // At hashbrown's load factors (at most 7/8) most keys sit in their first
            // position's line: 74% to 100% here (deterministic: fixed seeds).
            assert!(
                first_line * 10 >= n * 7,
                "{first_line} of {n} in the first line"
            );
        }
    }

    #[test]
    fn an_empty_table_notes_no_address() {
        let table = HashTable::<(u64, u64)>::new();
        let prefetch = Prefetch {
            ctrl: AtomicUsize::new(7),
            mask: AtomicUsize::new(7),
        };
        prefetch.note(&table);
        assert_eq!(prefetch.ctrl.load(Relaxed), 0);
        // Issuing on no address does nothing the program sees.
        prefetch.issue::<(u64, u64)>(u64::MAX);
    }

    /// Keys seen once and then idle past their fill time are released as new keys come,
    /// without a caller's `sweep`: the key count follows the active clients. Keys that are
    /// not full (the active ones, and a drained one) keep their state.
    #[test]
    fn idle_keys_are_released_by_new_inserts_without_a_sweep() {
        use crate::{KeyedLimiter, ManualClock, Policy};
        use std::time::Duration;

        let clock = ManualClock::new();
        // 10 tokens, 10 per second: full again 1 s after any debit.
        let map = |shards| {
            KeyedLimiter::<u64, _>::builder(Policy::new(10, 10.0).unwrap(), 1 << 20)
                .shards(shards)
                .clock(clock.clone())
                .build()
                .unwrap()
        };
        let limiter = map(4);
        // The same requests of the drained and active keys alone, never swept.
        let control = map(1);
        let once = 10_000u64;
        for k in 0..once {
            assert!(limiter.try_acquire(&k, 1).unwrap().is_admitted());
        }
        // Nothing was full yet: every key is kept.
        assert_eq!(limiter.len(), once as usize);
        // A key drained just before the new clients arrive, not full then.
        clock.advance(Duration::from_secs(5));
        let drained = u64::MAX;
        assert!(limiter.try_acquire(&drained, 10).unwrap().is_admitted());
        assert!(control.try_acquire(&drained, 10).unwrap().is_admitted());

        // 100 active clients, each asking every 50 ms for 0.8 s (each then holds 1.5 to
        // 9.5 tokens: never full, never drained).
        let active = 100u64;
        for round in 0..16u64 {
            clock.advance(Duration::from_millis(50));
            for k in 0..active {
                let key = 1_000_000 + k;
                assert!(
                    limiter.try_acquire(&key, 1).unwrap().is_admitted(),
                    "{round}"
                );
                assert!(control.try_acquire(&key, 1).unwrap().is_admitted());
            }
            // Bounded by the active set (twice it, plus the per-shard floor), not by
            // every key ever seen.
            let bound = 2 * (active as usize + 1) + 4 * (super::IDLE_SWEEP_MIN + 1);
            assert!(
                limiter.len() <= bound,
                "{} keys at round {round}",
                limiter.len()
            );
        }
        assert!(!limiter.contains(&0), "an idle key was released");
        // A released key is a fresh key: its whole capacity, and the same answers.
        let fresh = 2_000_000u64;
        for key in [7u64, fresh] {
            assert_eq!(limiter.available(&key), 10.0);
            assert!(limiter.try_acquire(&key, 10).unwrap().is_admitted());
            assert!(limiter.try_acquire(&key, 1).unwrap().is_rejected());
        }
        // The drained key (refilled for 0.8 s only) and the active keys are kept with
        // the balances they have in a map that never swept.
        assert!(limiter.contains(&drained));
        assert_eq!(limiter.available(&drained), control.available(&drained));
        assert!(limiter.available(&drained) < 10.0);
        for k in 0..active {
            let key = 1_000_000 + k;
            assert!(limiter.contains(&key));
            assert_eq!(limiter.available(&key), control.available(&key));
        }
    }

    /// A key that is not full survives the insert-time sweeps with its balance.
    #[test]
    fn an_insert_time_sweep_keeps_a_bucket_that_is_not_full() {
        use crate::{KeyedLimiter, ManualClock, Policy};
        use std::time::Duration;

        let clock = ManualClock::new();
        // 10 tokens, 1 per second.
        let map = || {
            KeyedLimiter::<u64, _>::builder(Policy::new(10, 1.0).unwrap(), 1 << 20)
                .shards(1)
                .clock(clock.clone())
                .build()
                .unwrap()
        };
        let (limiter, control) = (map(), map());
        assert!(limiter.try_acquire(&0, 10).unwrap().is_admitted());
        assert!(control.try_acquire(&0, 10).unwrap().is_admitted());
        for k in 1..=1_000u64 {
            assert!(limiter.try_acquire(&k, 1).unwrap().is_admitted());
        }
        clock.advance(Duration::from_secs(2));
        for k in 1_001..=2_000u64 {
            assert!(limiter.try_acquire(&k, 1).unwrap().is_admitted());
        }
        assert!(limiter.contains(&0));
        assert_eq!(limiter.available(&0), control.available(&0));
        assert!(limiter.available(&0) < 10.0);
        assert!(limiter.len() <= 2 * 1_001 + super::IDLE_SWEEP_MIN);
    }
}
