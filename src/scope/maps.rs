//! The keyed maps of a scoped limiter, one per keyed kind, generated from the one list of
//! kinds ([`with_keyed_kinds`]), and the type-erased view the limiter reads them through.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::ptr;
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::Clock;
use crate::hint::cold_path;
use crate::inherit::Inherit;
use crate::keyed::{
    Announced, KeyedLimiter, KeyedOptions, Overflow, Sections, Slot, SweepReport, Switch,
    convert_between,
};
use crate::owned::Place;
use crate::policy::Policy;
use crate::scope::decision::{KindPolicies, KindSet, bit};
use crate::scope::generation::{Generation, carried};
use crate::scope::held::{HeldKinds, Keyed};
use crate::scope::kind::{
    ApiKeyId, ClientId, PerKind, RouteId, Scope, ScopeKind, TenantId, UserId, with_keyed_kinds,
};
use crate::scope::rules::{MAX_POLICIES_PER_RULE, Request, Reshape, Rule, RuleError, charged};
use crate::scope::tiers::{KindTiers, TierShape};
use crate::telemetry::{Attempt, CounterCells, CounterSnapshot, Tally};

/// The slot of each limit (policy) of one keyed kind while its locks are held: `None`
/// past the rule's policies, and for every limit when the request does not pay the kind.
pub(super) type LimitSlots<'a, C> = [Option<Slot<'a, C>>; MAX_POLICIES_PER_RULE];

/// One keyed kind's local tier (0: its rule's policies) and the slot of each of its
/// limits while their locks are held.
pub(super) type KindSlots<'a, C> = (u8, LimitSlots<'a, C>);

// `with` nests one lock per limit, written out for each count up to this maximum.
const _: () = assert!(MAX_POLICIES_PER_RULE == 4);

/// The maps of one set of policies (a rule's or a tier's) of a keyed kind: one per
/// policy.
pub(super) struct Limits<K, C: Clock, S> {
    /// The first policy's map: it alone keeps counters, and names the kind's keys.
    map: KeyedLimiter<K, C, S>,
    /// The other policies' maps, in their order (empty for a single policy).
    extra: Vec<KeyedLimiter<K, C, S>>,
}

impl<K: Hash + Eq + Send + Sync, C: Clock, S: BuildHasher> Limits<K, C, S> {
    /// The map of limit `limit`, if the policies have one.
    fn limit(&self, limit: usize) -> Option<&KeyedLimiter<K, C, S>> {
        match limit {
            0 => Some(&self.map),
            l => self.extra.get(l - 1),
        }
    }

    fn maps(&self) -> impl Iterator<Item = &KeyedLimiter<K, C, S>> {
        std::iter::once(&self.map).chain(&self.extra)
    }
}

/// A keyed kind's tier table as a generation holds it: the address of one of its
/// [`KindMap`]'s tables, erased over the key type; null for a kind without overridden
/// keys (or without a map).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TableRef(*const ());

// SAFETY: an address, only dereferenced by the kind map that made it, which keeps the
// table it points to until it is dropped (see `KindMap::table`).
unsafe impl Send for TableRef {}
// SAFETY: as above.
unsafe impl Sync for TableRef {}

impl Default for TableRef {
    fn default() -> TableRef {
        TableRef(ptr::null())
    }
}

/// One keyed kind's tiers in one configuration: the maps of each tier its overridden
/// keys use, by local tier from 1 (`tiers[t - 1]`), each holding at most the keys
/// overridden to it, and the table from overridden key to tier.
pub(super) struct TierTable<K, C: Clock, S> {
    tiers: Vec<Limits<K, C, S>>,
    overrides: HashMap<K, u8, S>,
    /// What it was laid out from.
    shape: TierShape,
    /// Each map's evicted counts (by tier, then limit) already added to the rule's:
    /// when the table was replaced, its maps' keys went and their counts joined the
    /// rule's; a switch back to the table's layout fills its maps again, and what they
    /// evict is counted from there.
    folded: Mutex<Vec<Vec<CounterSnapshot>>>,
}

impl<K: Hash + Eq + Send + Sync, C: Clock, S: BuildHasher> TierTable<K, C, S> {
    /// The evicted counts of tier `t`'s (from 0) first map not yet added to the rule's.
    fn evicted_here(&self, t: usize) -> CounterSnapshot {
        let total = self.tiers[t].map.evicted_counters();
        let folded = self.folded.lock().unwrap_or_else(|e| e.into_inner());
        let base = folded
            .get(t)
            .and_then(|l| l.first())
            .copied()
            .unwrap_or_default();
        minus(total, base)
    }
}

/// `a - b`, field by field (wrapping, as the counters do).
fn minus(a: CounterSnapshot, b: CounterSnapshot) -> CounterSnapshot {
    let tally = |a: Tally, b: Tally| Tally {
        admitted_requests: a.admitted_requests.wrapping_sub(b.admitted_requests),
        admitted_tokens: a.admitted_tokens.wrapping_sub(b.admitted_tokens),
        rejected_requests: a.rejected_requests.wrapping_sub(b.rejected_requests),
        rejected_tokens: a.rejected_tokens.wrapping_sub(b.rejected_tokens),
    };
    CounterSnapshot {
        original: tally(a.original, b.original),
        retry: tally(a.retry, b.retry),
    }
}

/// One keyed kind's maps: its rule's, one per policy, and the tier tables it has had
/// (see [`TierTable`]), with the conversions between its keys and [`Scope`]s.
///
/// A generation names the kind's tier table it decides with ([`TableRef`]): a request
/// reads its generation, then the table through it, then locks the maps the table
/// gives its key, and starts again when the generation was replaced meanwhile. A switch
/// that moves keys between tiers lays out a new table with maps of its own, moves each
/// moved key's buckets (converted) while it holds every map's barrier, and publishes
/// the table with its generation: a request sees the old table with the old policies
/// or the new with the new.
pub(super) struct KindMap<K, C: Clock, S> {
    kind: ScopeKind,
    rule: Limits<K, C, S>,
    /// Every tier table the kind has had (at fixed addresses: generations hold them),
    /// one per distinct layout, kept until the limiter is dropped; a replaced table's
    /// maps are emptied, and filled again by a switch back to its layout.
    tables: Mutex<Vec<Kept<TierTable<K, C, S>>>>,
    /// The rule's map options, its clock and hasher: for the maps of the tiers a
    /// reconfiguration lays out.
    options: KeyedOptions,
    clock: C,
    hasher: S,
    key_of: fn(&Scope) -> Option<K>,
    scope_of: fn(&K) -> Scope,
}

impl<K: Hash + Eq + Send + Sync, C: Clock, S: BuildHasher> KindMap<K, C, S> {
    /// The tier table generation `g` decides this kind with; `None` when no key of the
    /// kind is overridden in it.
    #[inline(always)]
    fn table(&self, g: &Generation) -> Option<&TierTable<K, C, S>> {
        let p = g.tables[self.kind.index()].0;
        if p.is_null() {
            return None;
        }
        // SAFETY: a non-null `TableRef` of this kind in a generation was made by this
        // map (`keep`) from one of the tables in `tables`, which are never moved
        // out nor freed before the map is dropped; `&self` outlives the borrow.
        Some(unsafe { &*p.cast::<TierTable<K, C, S>>() })
    }

    /// The local tier of `key` (0: the rule's) and the maps it pays, in generation `g`.
    /// A kind without overrides costs one predicted branch.
    #[inline]
    fn limits_of(&self, g: &Generation, key: &K) -> (u8, &Limits<K, C, S>) {
        match self.table(g) {
            None => (0, &self.rule),
            Some(t) => self.tier_limits(t, key),
        }
    }

    /// The first step of holding `key`'s bucket in a reader section
    /// ([`KeyedMaps::hold`], [`KeyedMaps::hold_one`]): its local tier and maps in
    /// generation `g`, and the section of its shard announced in `sections`; `None`
    /// when its policies hold several limits, or a writer is on the shard.
    #[inline(always)]
    fn announce_held<'h, const N: usize>(
        &'h self,
        g: &Generation,
        key: &K,
        sections: &Sections<'h, N>,
    ) -> Option<(u8, &'h Limits<K, C, S>, Announced)> {
        let (tier, limits) = self.limits_of(g, key);
        if !limits.extra.is_empty() {
            cold_path();
            return None;
        }
        let Some(at) = limits.map.announce(key, sections) else {
            cold_path();
            return None;
        };
        Some((tier, limits, at))
    }

    #[inline(never)]
    fn tier_limits<'a>(&'a self, t: &'a TierTable<K, C, S>, key: &K) -> (u8, &'a Limits<K, C, S>) {
        match t.overrides.get(key) {
            Some(&tier) => match t.tiers.get(usize::from(tier).wrapping_sub(1)) {
                Some(limits) => (tier, limits),
                None => (0, &self.rule),
            },
            None => (0, &self.rule),
        }
    }

    /// The key of `scope` and the maps it pays in generation `g`, when `scope` is of
    /// this kind.
    fn scope_limits(&self, g: &Generation, scope: &Scope) -> Option<(K, &Limits<K, C, S>)> {
        let key = (self.key_of)(scope)?;
        let limits = self.limits_of(g, &key).1;
        Some((key, limits))
    }

    /// Every set of maps of generation `g`: the rule's, then its tiers'.
    fn all<'a>(&'a self, g: &'a Generation) -> impl Iterator<Item = &'a Limits<K, C, S>> {
        std::iter::once(&self.rule).chain(self.table(g).into_iter().flat_map(|t| &t.tiers))
    }

    /// Keeps `table` for the limiter's life and returns its reference.
    fn keep(&self, table: TierTable<K, C, S>) -> (TableRef, &TierTable<K, C, S>) {
        let kept = Kept::new(table);
        let p = kept.get();
        self.tables
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(kept);
        // SAFETY: `tables` keeps the table at this address (never moved nor freed) until
        // `self` is dropped.
        (TableRef(p.cast()), unsafe { &*p })
    }

    /// A table the kind had, other than `current`, laid out as `next`: replaced, its
    /// maps emptied, to be filled again.
    fn reusable(
        &self,
        current: Option<&TierTable<K, C, S>>,
        next: &KindTiers,
    ) -> Option<&TierTable<K, C, S>> {
        if next.keys.is_empty() {
            return None;
        }
        let shape = next.shape();
        let tables = self
            .tables
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let p = tables.iter().map(Kept::get).find(|&p| {
            // SAFETY: kept at this address until `self` is dropped (`keep`).
            let t = unsafe { &*p };
            !current.is_some_and(|c| ptr::eq(c, t)) && t.shape == shape
        })?;
        // SAFETY: as above; `&self` outlives the borrow.
        Some(unsafe { &*p })
    }
}

/// A value kept at a fixed address until it is dropped, shared through raw pointers
/// (a tier table, which generations point to).
struct Kept<T>(ptr::NonNull<T>);

// SAFETY: a `Kept<T>` owns its `T` as a `Box<T>` would.
unsafe impl<T: Send> Send for Kept<T> {}
// SAFETY: as above; shared access gives `&T` only.
unsafe impl<T: Sync> Sync for Kept<T> {}

impl<T> Kept<T> {
    fn new(value: T) -> Kept<T> {
        Kept(ptr::NonNull::from(Box::leak(Box::new(value))))
    }

    fn get(&self) -> *const T {
        self.0.as_ptr()
    }
}

impl<T> Drop for Kept<T> {
    fn drop(&mut self) {
        // SAFETY: from `Box::leak` in `new`, freed once, here; the raw pointers handed
        // out are not dereferenced after the kind map holding this is dropped.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

/// What the scoped limiter reads from a keyed kind's map, whatever its key type; each
/// read of generation `g`'s tiers.
pub(super) trait KindMapOps {
    fn len(&self, g: &Generation) -> usize;
    fn evicted(&self, g: &Generation) -> CounterSnapshot;
    fn overflowed(&self, g: &Generation) -> CounterSnapshot;
    /// Counts a request refused because the map `scope`'s key goes to was full.
    fn count_key_limit(&self, g: &Generation, scope: &Scope, cost: u64, attempt: Attempt);
    fn overflow_id(&self) -> Option<usize>;
    fn sweep(&self, g: &Generation) -> SweepReport;
    fn max_sweep_interval(&self, g: &Generation) -> Duration;
    /// `None` when `scope` is not of this kind or has no counters.
    fn counters(&self, g: &Generation, scope: &Scope) -> Option<CounterSnapshot>;
    /// `None` when `scope` is not of this kind.
    fn available(&self, g: &Generation, scope: &Scope) -> Option<f64>;
    /// The tokens of `scope`'s bucket of limit `limit`; `None` when `scope` is not of
    /// this kind or its policies have no such limit.
    fn available_in(&self, g: &Generation, scope: &Scope, limit: usize) -> Option<f64>;
    /// `None` when `scope` is not of this kind or has no bucket.
    fn stored_word(&self, g: &Generation, scope: &Scope) -> Option<u64>;
    fn for_each_counters(&self, g: &Generation, f: &mut dyn FnMut(Scope, CounterSnapshot));
    /// Gives each of `scope`'s buckets back what `cost` tokens taken from it under
    /// `paid` are in the `current()` generation ([`carried`]: through every switch
    /// since, each with the key's tier then), capped at the capacity, on that
    /// generation's maps (again on the next one's, when a switch replaced it before the
    /// bucket's lock was taken); nothing when `scope` is not of this kind or its key is
    /// not in the map.
    fn refund<'g>(
        &self,
        paid: &'g Generation,
        current: &dyn Fn() -> &'g Generation,
        scope: &Scope,
        cost: u64,
    );
    /// Cancels a reservation that took `cost` tokens from each of `scope`'s buckets
    /// under `paid`, standing at `places` (by limit): while `paid` is current, on each
    /// bucket as [`Layout::cancel`](crate::state::Layout::cancel) (the charge back when
    /// no reservation was made after it, else nothing); after a switch, as
    /// [`refund`](KindMapOps::refund).
    fn cancel<'g>(
        &self,
        paid: &'g Generation,
        current: &dyn Fn() -> &'g Generation,
        scope: &Scope,
        cost: u64,
        places: &[Option<Place>],
    );
    /// The local tier of `scope`'s key in `g` (0: the rule's); `None` when `scope` is not
    /// of this kind.
    fn tier_of(&self, g: &Generation, scope: &Scope) -> Option<u8>;
    /// The tier table to give the limiter's first generation.
    fn first_table(&self) -> TableRef;
}

/// A keyed kind's part of a scoped limiter's reconfiguration.
pub(super) trait KindReconfigure {
    /// Whether the kind's tiers in `g` were laid out as `next` lays them out (the same
    /// tier names and policy counts, the same keys in the same tiers): only their
    /// policies may then change, in place.
    fn same_tiers(&self, g: &Generation, next: &KindTiers) -> bool;

    /// Starts switching the kind from generation `g` to the tiers `next`: holds the
    /// barrier of every map (the rule's, in policy order, then each tier's), and, when
    /// its tiers change ([`same_tiers`](KindReconfigure::same_tiers)), checks that the
    /// rule's maps have room for the keys moving back to them. Nothing has changed when
    /// it fails.
    ///
    /// # Errors
    ///
    /// [`Reshape::TierRoom`](crate::scope::Reshape::TierRoom) when the keys leaving
    /// their tiers do not fit the rule's maps.
    fn begin_switch(
        &self,
        g: &Generation,
        next: &KindTiers,
    ) -> Result<Box<dyn KindSwitch + '_>, RuleError>;
}

/// A keyed kind's switch while its barriers are held ([`KindReconfigure::begin_switch`]).
pub(super) trait KindSwitch {
    /// Lays out the kind's new tier table, when its tiers change: new maps for each
    /// tier its keys use. Called once every kind's switch has begun (so that no
    /// table is laid out for a switch another kind refuses).
    ///
    /// # Errors
    ///
    /// [`RuleError::Keyed`] when a tier's map cannot be built (from options the
    /// limiter's rule was built with: not expected).
    fn lay_out(&mut self) -> Result<(), RuleError>;

    /// The tier table the new generation decides the kind with.
    fn table(&self) -> TableRef;

    /// Before the new generation is published: moves every key whose tier changes into
    /// its new tier's maps, each bucket converted from its policy (as of the switch
    /// reading `now`) to its new tier's with `inherit` (`rule`: the kind's new rule
    /// policies, for keys moving back to the rule, put in place by
    /// [`finish`](KindSwitch::finish)). Reads no clock.
    fn move_keys(&mut self, rule: &KindPolicies, inherit: Inherit, now: u64);

    /// After the new generation is published: switches each map whose policy changes
    /// (`rule`, `tiers`: the kind's new policies) from the switch reading `at` with
    /// `inherit`, as [`KeyedLimiter::finish_switch`], puts the keys moving back to the
    /// rule in its maps, empties a replaced table's maps, and lets the barriers go. The
    /// number of maps switched (new tiers' maps included). Reads no clock.
    fn finish(
        self: Box<Self>,
        rule: &KindPolicies,
        tiers: &[KindPolicies],
        inherit: Inherit,
        at: u64,
    ) -> usize;
}

impl<K, C, S> KindMapOps for KindMap<K, C, S>
where
    K: Hash + Eq + Send + Sync,
    C: Clock,
    S: BuildHasher,
{
    fn len(&self, g: &Generation) -> usize {
        self.all(g).map(|l| l.map.len()).sum()
    }

    fn evicted(&self, g: &Generation) -> CounterSnapshot {
        let rule = self.rule.map.evicted_counters();
        match self.table(g) {
            None => rule,
            Some(t) => (0..t.tiers.len()).fold(rule, |a, i| a + t.evicted_here(i)),
        }
    }

    fn overflowed(&self, g: &Generation) -> CounterSnapshot {
        self.all(g)
            .map(|l| l.map.overflow_counters())
            .fold(CounterSnapshot::default(), |a, b| a + b)
    }

    fn count_key_limit(&self, g: &Generation, scope: &Scope, cost: u64, attempt: Attempt) {
        if let Some((_, l)) = self.scope_limits(g, scope) {
            l.map.count_key_limit(cost, attempt);
        }
    }

    fn overflow_id(&self) -> Option<usize> {
        self.rule.map.overflow_id()
    }

    fn sweep(&self, g: &Generation) -> SweepReport {
        let mut report = SweepReport::default();
        for m in self.all(g).flat_map(Limits::maps) {
            report += m.sweep();
        }
        report
    }

    fn max_sweep_interval(&self, g: &Generation) -> Duration {
        self.all(g)
            .flat_map(Limits::maps)
            .map(|m| m.max_sweep_interval())
            .fold(Duration::MAX, Duration::min)
    }

    fn counters(&self, g: &Generation, scope: &Scope) -> Option<CounterSnapshot> {
        let (key, l) = self.scope_limits(g, scope)?;
        l.map.counters(&key)
    }

    fn available(&self, g: &Generation, scope: &Scope) -> Option<f64> {
        let (key, l) = self.scope_limits(g, scope)?;
        Some(l.map.available(&key))
    }

    fn available_in(&self, g: &Generation, scope: &Scope, limit: usize) -> Option<f64> {
        let (key, l) = self.scope_limits(g, scope)?;
        Some(l.limit(limit)?.available(&key))
    }

    fn stored_word(&self, g: &Generation, scope: &Scope) -> Option<u64> {
        let (key, l) = self.scope_limits(g, scope)?;
        l.map.stored_word(&key)
    }

    fn for_each_counters(&self, g: &Generation, f: &mut dyn FnMut(Scope, CounterSnapshot)) {
        for l in self.all(g) {
            l.map.for_each_counters(|k, c| f((self.scope_of)(k), c));
        }
    }

    fn refund<'g>(
        &self,
        paid: &'g Generation,
        current: &dyn Fn() -> &'g Generation,
        scope: &Scope,
        cost: u64,
    ) {
        self.give_back(paid, current, scope, cost, None);
    }

    fn cancel<'g>(
        &self,
        paid: &'g Generation,
        current: &dyn Fn() -> &'g Generation,
        scope: &Scope,
        cost: u64,
        places: &[Option<Place>],
    ) {
        self.give_back(paid, current, scope, cost, Some(places));
    }

    fn tier_of(&self, g: &Generation, scope: &Scope) -> Option<u8> {
        Some(self.limits_of(g, &(self.key_of)(scope)?).0)
    }

    fn first_table(&self) -> TableRef {
        let tables = self
            .tables
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tables
            .last()
            .map_or(TableRef::default(), |t| TableRef(t.get().cast()))
    }
}

impl<K, C, S> KindReconfigure for KindMap<K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync,
    C: Clock + Clone,
    S: BuildHasher + Clone,
{
    fn same_tiers(&self, g: &Generation, next: &KindTiers) -> bool {
        match self.table(g) {
            None => next.keys.is_empty(),
            Some(t) => t.shape == next.shape(),
        }
    }

    fn begin_switch(
        &self,
        g: &Generation,
        next: &KindTiers,
    ) -> Result<Box<dyn KindSwitch + '_>, RuleError> {
        let old = self.table(g);
        let retier = (!self.same_tiers(g, next)).then(|| {
            // Every key overridden before or after, with its old and new local tier.
            let mut moved: Vec<(K, u8, u8)> = Vec::new();
            let mut new: HashMap<K, u8, S> =
                HashMap::with_capacity_and_hasher(next.keys.len(), self.hasher.clone());
            for (scope, t) in &next.keys {
                if let Some(key) = (self.key_of)(scope) {
                    new.insert(key, *t);
                }
            }
            if let Some(old) = old {
                for (k, &o) in &old.overrides {
                    moved.push((k.clone(), o, new.get(k).copied().unwrap_or(0)));
                }
            }
            for (k, &n) in &new {
                if !old.is_some_and(|t| t.overrides.contains_key(k)) {
                    moved.push((k.clone(), 0, n));
                }
            }
            // A table the kind had with this layout (emptied when it was replaced) is
            // filled again rather than laid out anew: its barriers are taken here, in
            // the lock order (this kind's maps, before any later kind's), as a request
            // of an old generation may still reach its maps.
            let reused = self.reusable(old, next);
            Retier {
                next: next.clone(),
                moved,
                table_ref: reused
                    .map_or(TableRef::default(), |t| TableRef(ptr::from_ref(t).cast())),
                switches: reused.map_or_else(Vec::new, |t| {
                    t.tiers
                        .iter()
                        .map(|l| l.maps().map(KeyedLimiter::begin_switch).collect())
                        .collect()
                }),
                reused: reused.is_some(),
                demoted: Vec::new(),
            }
        });
        let mut switch = Box::new(Switching {
            map: self,
            rule: self.rule.maps().map(KeyedLimiter::begin_switch).collect(),
            old: old.map_or_else(Vec::new, |t| {
                t.tiers
                    .iter()
                    .map(|l| l.maps().map(KeyedLimiter::begin_switch).collect())
                    .collect()
            }),
            old_table: old,
            retier,
        });
        switch.check_room()?;
        Ok(switch)
    }
}

/// A keyed kind's switch under way ([`KindReconfigure::begin_switch`]).
struct Switching<'a, K, C: Clock, S> {
    map: &'a KindMap<K, C, S>,
    /// The barrier of each of the rule's maps, in policy order.
    rule: Vec<Switch<'a, K, C, S>>,
    /// The barriers of the current table's tier maps, by local tier, in policy order.
    old: Vec<Vec<Switch<'a, K, C, S>>>,
    old_table: Option<&'a TierTable<K, C, S>>,
    /// When the kind's tiers change (else its tiers' maps are switched in place).
    retier: Option<Retier<'a, K, C, S>>,
}

/// A kind's tiers laid out anew by a switch.
struct Retier<'a, K, C: Clock, S> {
    next: KindTiers,
    /// Every key overridden before or after the switch, with its local tier in the old
    /// table and in the new (0: the rule's).
    moved: Vec<(K, u8, u8)>,
    /// The new table (null when no key of the kind is overridden any more), set by
    /// [`KindSwitch::lay_out`].
    table_ref: TableRef,
    /// The barriers of the new table's maps (nothing can reach them before the new
    /// generation is published anyway), by local tier, in policy order.
    switches: Vec<Vec<Switch<'a, K, C, S>>>,
    /// Whether the new table is one the kind had before (its maps empty, their policies
    /// those it last had), not one laid out anew.
    reused: bool,
    /// Keys moving back to the rule: key, limit, the word of the rule's new policy
    /// (`None`: full, a new key's, no entry), and the counters that move with it.
    demoted: Vec<(K, usize, Option<u64>, Option<CounterCells>)>,
}

impl<K, C, S> Switching<'_, K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync,
    C: Clock,
    S: BuildHasher,
{
    /// Whether each of the rule's maps has room for the keys moving back to it: those
    /// not in it now, less the keys leaving it for a tier.
    fn check_room(&mut self) -> Result<(), RuleError> {
        let Some(retier) = &self.retier else {
            return Ok(());
        };
        for (l, sw) in self.rule.iter_mut().enumerate() {
            let mut needed = 0usize;
            let mut room = sw.room();
            for (k, o, n) in &retier.moved {
                match (*o, *n) {
                    // Back to the rule with a bucket of this limit in its old tier
                    // (a key without one gets no entry).
                    (o, 0) if o > 0 => {
                        let had = self
                            .old
                            .get_mut(usize::from(o) - 1)
                            .and_then(|maps| maps.get_mut(l))
                            .is_some_and(|m| m.contains(k));
                        if had && !sw.contains(k) {
                            needed += 1;
                        }
                    }
                    (0, _) if sw.contains(k) => room += 1,
                    _ => {}
                }
            }
            if needed > room {
                return Err(RuleError::Reshape(Reshape::TierRoom {
                    kind: self.map.kind,
                    keys: needed,
                    room,
                }));
            }
        }
        Ok(())
    }
}

impl<K, C, S> KindSwitch for Switching<'_, K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync,
    C: Clock + Clone,
    S: BuildHasher + Clone,
{
    fn lay_out(&mut self) -> Result<(), RuleError> {
        let map = self.map;
        let Some(retier) = self.retier.as_mut() else {
            return Ok(());
        };
        if retier.next.keys.is_empty() || retier.reused {
            return Ok(());
        }
        let table = tier_table(
            map.kind,
            &map.rule,
            &retier.next,
            map.options,
            &map.clock,
            &map.hasher,
            map.key_of,
        )?;
        let (r, table) = map.keep(table);
        retier.table_ref = r;
        retier.switches = table
            .tiers
            .iter()
            .map(|l| l.maps().map(KeyedLimiter::begin_switch).collect())
            .collect();
        Ok(())
    }

    fn table(&self) -> TableRef {
        match &self.retier {
            Some(r) => r.table_ref,
            None => self
                .old_table
                .map_or(TableRef::default(), |t| TableRef(ptr::from_ref(t).cast())),
        }
    }

    fn move_keys(&mut self, rule: &KindPolicies, inherit: Inherit, now: u64) {
        let Some(retier) = self.retier.as_mut() else {
            return;
        };
        if retier.reused {
            // The maps of a table filled again take their tiers' new policies (from the
            // switch reading) before any key moves in: they are empty, so nothing is
            // converted, and the words put are of the new policies.
            for (maps, (_, p)) in retier.switches.iter().zip(&retier.next.tiers) {
                for (sw, policy) in maps.iter().zip(p.as_slice()) {
                    if sw.policy() != policy {
                        sw.publish(*policy, inherit, now);
                    }
                }
            }
        }
        let mut folded: Vec<CounterCells> = Vec::new();
        for (key, o, n) in std::mem::take(&mut retier.moved) {
            let from = match o {
                0 => &mut self.rule,
                o => match self.old.get_mut(usize::from(o) - 1) {
                    Some(s) => s,
                    None => continue,
                },
            };
            let limits = match n {
                0 => rule.as_slice().len(),
                n => retier.switches.get(usize::from(n) - 1).map_or(0, Vec::len),
            };
            for l in 0..from.len().max(limits) {
                let source = from.get(l).map(|s| *s.policy());
                let (word, cells) = match from.get_mut(l).and_then(|s| s.take(&key)) {
                    Some((w, c)) => (Some(w), c),
                    None => (None, None),
                };
                if l >= limits {
                    // A limit the new tier does not have: its bucket goes.
                    continue;
                }
                let target = match n {
                    0 => rule.policies[l],
                    n => *retier.switches[usize::from(n) - 1][l].policy(),
                };
                // A key without a bucket in the old map (it never came, or its full
                // bucket was evicted), or of a limit the old tier did not have, gets
                // none: it starts in its new map as a new key does.
                let word = source
                    .zip(word)
                    .and_then(|(p, w)| moved_word(&p, w, &target, inherit, now));
                if n == 0 {
                    retier.demoted.push((key.clone(), l, word, cells));
                    continue;
                }
                let to = &mut retier.switches[usize::from(n) - 1][l];
                match word {
                    Some(w) => {
                        let put = to.put(key.clone(), w, cells);
                        // A tier's maps are bounded by the keys overridden to it.
                        debug_assert!(put, "a tier's map has room for each of its keys");
                    }
                    None => folded.extend(cells),
                }
            }
        }
        // The replaced table's maps are unreachable from the new generation: emptied,
        // and their keys' counts, with those of the keys that moved without a bucket,
        // kept with the rule's evicted ones (a replaced table's maps are read no more).
        let counted = self.rule.first().filter(|_| self.map.options.counters);
        let mut bases = self
            .old_table
            .map(|t| t.folded.lock().unwrap_or_else(|e| e.into_inner()));
        for (t, maps) in self.old.iter_mut().enumerate() {
            for (l, sw) in maps.iter_mut().enumerate() {
                sw.clear();
                // What its keys evicted since the table was last filled (this table may
                // have been replaced before, its earlier counts then added already).
                let total = sw.evicted();
                let base = bases
                    .as_mut()
                    .and_then(|f| f.get_mut(t))
                    .and_then(|f| f.get_mut(l));
                let new = match base {
                    Some(base) => minus(total, std::mem::replace(base, total)),
                    None => total,
                };
                if let Some(rule) = counted {
                    rule.fold_snapshot(&new);
                }
            }
        }
        drop(bases);
        if let Some(rule) = counted {
            for c in &folded {
                rule.fold_counts(c);
            }
        }
    }

    fn finish(
        mut self: Box<Self>,
        rule: &KindPolicies,
        tiers: &[KindPolicies],
        inherit: Inherit,
        at: u64,
    ) -> usize {
        let mut switched = 0;
        let changed = |sw: &Switch<'_, K, C, S>, policy: &Policy| {
            // Unchanged: its keys keep their words (a reload that changed only another
            // rule, or a comment, refills nothing).
            if sw.policy() == policy {
                return false;
            }
            sw.publish(*policy, inherit, at);
            true
        };
        for (sw, policy) in self.rule.iter().zip(rule.as_slice()) {
            switched += usize::from(changed(sw, policy));
        }
        match self.retier.take() {
            None => {
                for (maps, p) in self.old.iter().zip(tiers) {
                    for (sw, policy) in maps.iter().zip(p.as_slice()) {
                        switched += usize::from(changed(sw, policy));
                    }
                }
            }
            Some(retier) => {
                // After the rule's maps took their new policies: the words moving
                // back are of those.
                for (key, l, word, cells) in retier.demoted {
                    let Some(sw) = self.rule.get_mut(l) else {
                        continue;
                    };
                    match word {
                        Some(w) => {
                            let put = sw.put(key, w, cells);
                            debug_assert!(put, "room checked by begin_switch");
                        }
                        None => {
                            // Full, a new key's: no entry (one that a request of the old
                            // configuration made meanwhile goes); the counts are kept.
                            let stray = sw.take(&key).and_then(|(_, c)| c);
                            for c in stray.iter().chain(&cells) {
                                sw.fold_counts(c);
                            }
                        }
                    }
                }
                switched += retier.switches.iter().map(Vec::len).sum::<usize>();
            }
        }
        switched
    }
}

/// The word a key gets in a map of policy `to` when it moves there from a map of policy
/// `from` where its bucket's word is `word`, at the switch reading `now`: the same word
/// when the policies are equal, else converted with `inherit`. `None` when the result
/// is a full bucket of a start-full policy: identical to a new key's, so no entry is
/// kept (as eviction drops one).
fn moved_word(from: &Policy, word: u64, to: &Policy, inherit: Inherit, now: u64) -> Option<u64> {
    if from == to {
        return Some(word);
    }
    let c = convert_between(from, word, now, to, inherit);
    let full = i128::from(to.capacity()) << to.layout().frac_bits();
    (!(to.starts_full() && c.to_units == full)).then_some(c.word)
}

/// The maps of the tiers `tiers` lays out for `kind` (whose rule's maps are `rule`),
/// with its override table.
fn tier_table<K, C, S>(
    kind: ScopeKind,
    rule: &Limits<K, C, S>,
    tiers: &KindTiers,
    options: KeyedOptions,
    clock: &C,
    hasher: &S,
    key_of: fn(&Scope) -> Option<K>,
) -> Result<TierTable<K, C, S>, RuleError>
where
    K: Hash + Eq,
    C: Clock + Clone,
    S: BuildHasher + Clone,
{
    // A tier's maps hold exactly its overridden keys: they never need an overflow, nor
    // more shards than keys (a tier of a few keys costs a few shards, not the rule's).
    let maps = tiers
        .tiers
        .iter()
        .map(|(_, p)| {
            let shards = rule.map.shards().min(p.max_keys.max(1).next_power_of_two());
            limits(
                kind,
                p.as_slice(),
                options
                    .max_keys(p.max_keys)
                    .overflow(Overflow::Reject)
                    .shards(shards),
                clock,
                hasher,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut overrides = HashMap::with_capacity_and_hasher(tiers.keys.len(), hasher.clone());
    for (scope, t) in &tiers.keys {
        if let Some(key) = key_of(scope) {
            overrides.insert(key, *t);
        }
    }
    let folded = maps
        .iter()
        .map(|l| vec![CounterSnapshot::default(); 1 + l.extra.len()])
        .collect();
    Ok(TierTable {
        tiers: maps,
        overrides,
        shape: tiers.shape(),
        folded: Mutex::new(folded),
    })
}

/// The maps of one set of policies of `kind`, with `options` (only the first keeps
/// counters).
fn limits<K, C, S>(
    kind: ScopeKind,
    policies: &[Policy],
    options: KeyedOptions,
    clock: &C,
    hasher: &S,
) -> Result<Limits<K, C, S>, RuleError>
where
    K: Hash + Eq,
    C: Clock + Clone,
    S: BuildHasher + Clone,
{
    let build = |policy, options: KeyedOptions| {
        KeyedLimiter::builder(policy, options.max_keys)
            .options(options)
            .clock(clock.clone())
            .hasher(hasher.clone())
            .build()
            .map_err(|error| RuleError::Keyed { kind, error })
    };
    Ok(Limits {
        map: build(policies[0], options)?,
        // The first map alone counts: the other limits' maps hold a word per key.
        extra: policies[1..]
            .iter()
            .map(|&p| build(p, options.counters(false)))
            .collect::<Result<Vec<_>, _>>()?,
    })
}

/// The map of `kind` under its rule, if it has one and is not remote, with the maps of
/// the tiers its overridden keys use (`tiers`, laid out by
/// [`lay_out`](crate::scope::tiers::lay_out)).
fn kind_map<K, C, S>(
    rules: &PerKind<Option<Rule>>,
    tiers: &KindTiers,
    kind: ScopeKind,
    clock: &C,
    hasher: &S,
    key_of: fn(&Scope) -> Option<K>,
    scope_of: fn(&K) -> Scope,
) -> Result<Option<KindMap<K, C, S>>, RuleError>
where
    K: Hash + Eq + Send + Sync,
    C: Clock + Clone,
    S: BuildHasher + Clone,
{
    // A remote kind's scopes are kept in the limiter's remote store: no local map.
    let Some(r) = rules[kind.index()].filter(|r| !r.remote) else {
        return Ok(None);
    };
    let rule = limits(kind, r.policies(), r.options, clock, hasher)?;
    let table = if tiers.keys.is_empty() {
        None
    } else {
        Some(tier_table(
            kind, &rule, tiers, r.options, clock, hasher, key_of,
        )?)
    };
    let map = KindMap {
        kind,
        rule,
        tables: Mutex::new(Vec::new()),
        options: r.options,
        clock: clock.clone(),
        hasher: hasher.clone(),
        key_of,
        scope_of,
    };
    if let Some(t) = table {
        map.keep(t);
    }
    Ok(Some(map))
}

/// Runs `f` with the slot of `key` in each of the kind's maps held (taken in the rule's
/// policy order), or with none when the request does not pay this kind (no rule, no
/// key, or a zero cost).
#[inline]
fn with<K, C, S, R>(
    map: &Option<KindMap<K, C, S>>,
    g: &Generation,
    valid: &dyn Fn() -> bool,
    key: Option<K>,
    cost: u64,
    now: u64,
    f: impl FnOnce(&KindSlots<'_, C>) -> R,
) -> R
where
    K: Hash + Eq + Clone + Send + Sync,
    C: Clock,
    S: BuildHasher,
{
    match (map, key) {
        (Some(m), Some(k)) if cost > 0 => {
            let k = &k;
            let (t, l) = m.limits_of(g, k);
            match l.extra.as_slice() {
                [] => l
                    .map
                    .with_slot_if(k, now, valid, |a| f(&(t, [Some(a), None, None, None]))),
                [b] => l.map.with_slot_if(k, now, valid, |a| {
                    b.with_slot_if(k, now, valid, |b| f(&(t, [Some(a), Some(b), None, None])))
                }),
                [b, c] => l.map.with_slot_if(k, now, valid, |a| {
                    b.with_slot_if(k, now, valid, |b| {
                        c.with_slot_if(k, now, valid, |c| {
                            f(&(t, [Some(a), Some(b), Some(c), None]))
                        })
                    })
                }),
                [b, c, d, ..] => l.map.with_slot_if(k, now, valid, |a| {
                    b.with_slot_if(k, now, valid, |b| {
                        c.with_slot_if(k, now, valid, |c| {
                            d.with_slot_if(k, now, valid, |d| {
                                f(&(t, [Some(a), Some(b), Some(c), Some(d)]))
                            })
                        })
                    })
                }),
            }
        }
        _ => f(&(0, [None, None, None, None])),
    }
}

/// The keyed kinds: at most this many reader sections are held by one request.
pub(super) const KEYED_KINDS: usize = ScopeKind::COUNT - 1;

/// The slots of a kind the request does not pay (`$kind` only counts a place).
macro_rules! unpaid {
    ($kind:ident) => {
        &(0, [None, None, None, None])
    };
}

/// Nests one `with` per keyed kind, in list order (the lock order), then calls `$f` with
/// every kind's slot. Once no kind left (this one or a later one) is in `$paid`, calls `$f`
/// at once: the kinds left hold nothing, and nesting a closure for each costs.
macro_rules! nest {
    ($maps:ident, $g:ident, $valid:ident, $request:ident, $costs:ident, $now:ident, $paid:ident, $f:ident, [$($held:ident)*], []) => {
        $f([&(0, [None, None, None, None]) $(, $held)*])
    };
    (
        $maps:ident, $g:ident, $valid:ident, $request:ident, $costs:ident, $now:ident, $paid:ident, $f:ident, [$($held:ident)*],
        [$kind:ident ($($field:ident),+) $(, $rest:ident ($($rest_field:ident),+))*]
    ) => {
        if $paid >> ScopeKind::$kind.index() == 0 {
            $f([&(0, [None, None, None, None]) $(, $held)*, unpaid!($kind) $(, unpaid!($rest))*])
        } else {
        with(
            &$maps.$kind,
            $g,
            $valid,
            match ($($request.$field,)+) {
                ($(Some($field),)+) => Some(($($field,)+)),
                #[allow(unreachable_patterns)]
                _ => None,
            },
            $costs[ScopeKind::$kind.index()],
            $now,
            |$kind| nest!($maps, $g, $valid, $request, $costs, $now, $paid, $f, [$($held)* $kind], [$($rest ($($rest_field),+)),*]),
        )
        }
    };
}

macro_rules! define_maps {
    ([$($(#[$doc:meta])* $kind:ident $name:literal ($($field:ident: $ty:ty),+)),* $(,)?]) => {
        /// Every keyed kind's map (`None` for a kind without a rule), keyed by the tuple of
        /// its request fields.
        #[allow(non_snake_case)]
        pub(super) struct KeyedMaps<C: Clock, S> {
            $($kind: Option<KindMap<($($ty,)+), C, S>>,)*
            /// The keyed kinds that have a map (none: the limiter decides its requests
            /// on the global scope alone).
            kinds: KindSet,
        }

        impl<C: Clock + Clone, S: BuildHasher + Clone> KeyedMaps<C, S> {
            /// A map for every keyed kind that has a rule.
            pub(super) fn build(
                rules: &PerKind<Option<Rule>>,
                tiers: &PerKind<KindTiers>,
                clock: &C,
                hasher: &S,
            ) -> Result<KeyedMaps<C, S>, RuleError> {
                let mut maps = KeyedMaps {
                    $($kind: kind_map(
                        rules,
                        &tiers[ScopeKind::$kind.index()],
                        ScopeKind::$kind,
                        clock,
                        hasher,
                        |scope| match *scope {
                            Scope::$kind($($field),+) => Some(($($field,)+)),
                            _ => None,
                        },
                        |&($($field,)+)| Scope::$kind($($field),+),
                    )?,)*
                    kinds: 0,
                };
                maps.kinds = 0 $(| KindSet::from(maps.$kind.is_some()) << ScopeKind::$kind.index())*;
                Ok(maps)
            }
        }

        impl<C: Clock + Clone, S: BuildHasher + Clone> KeyedMaps<C, S> {
            /// The map of a keyed kind as a reconfiguration switches it; `None` for the
            /// global kind and for kinds without a local map.
            pub(super) fn switchable(&self, kind: ScopeKind) -> Option<&dyn KindReconfigure> {
                match kind {
                    ScopeKind::Global => None,
                    $(ScopeKind::$kind => self.$kind.as_ref().map(|m| m as &dyn KindReconfigure),)*
                }
            }
        }

        impl<C: Clock, S: BuildHasher> KeyedMaps<C, S> {
            /// The map of a keyed kind, type-erased over its key; `None` for the global
            /// kind and for kinds without a rule.
            pub(super) fn get(&self, kind: ScopeKind) -> Option<&dyn KindMapOps> {
                match kind {
                    ScopeKind::Global => None,
                    $(ScopeKind::$kind => self.$kind.as_ref().map(|m| m as &dyn KindMapOps),)*
                }
            }

            /// Whether `request` pays a keyed kind: one with a map, a key in the request
            /// and a cost (the kinds [`with_slots`](KeyedMaps::with_slots) holds a slot of).
            #[inline]
            pub(super) fn pays_keyed(&self, request: &Request, costs: &PerKind<u64>) -> bool {
                self.paid_kinds(request, costs) != 0
            }

            /// The keyed kinds `request` pays, as bits by [`ScopeKind::index`] (none, at
            /// once, on a limiter without keyed maps).
            #[inline]
            pub(super) fn paid_kinds(&self, request: &Request, costs: &PerKind<u64>) -> KindSet {
                self.paid_in(request, charged(costs))
            }

            /// The keyed kinds `request` pays in a class that costs something in the
            /// kinds of `charged` ([`WorkClass::charged`](super::rules::WorkClass)): those
            /// with a map, charged, and named by the request.
            #[inline]
            pub(super) fn paid_in(&self, request: &Request, charged: KindSet) -> KindSet {
                if self.kinds == 0 {
                    return 0;
                }
                self.kinds & charged & (0 $(| (KindSet::from(true $(&& request.$field.is_some())+)
                    << ScopeKind::$kind.index()))*)
            }

            /// The bucket of every keyed kind in `paid` (kinds `request` pays, from
            /// [`paid_kinds`](KeyedMaps::paid_kinds)) held in a reader section of its
            /// shard in generation `g`'s maps, kept by `sections`, each listed in `held`
            /// with its key's local tier. The sections are announced in kind order (the
            /// lock order), then one fence serves them all ([`Sections::fence`]), then
            /// each is confirmed and its key looked up, in kind order. `false` when a
            /// kind's bucket cannot be held so (see [`KeyedLimiter::hold`]: a new key, a
            /// writer on its shard), or its key's policies hold several limits: the
            /// request then takes [`with_slots`](KeyedMaps::with_slots) (what `sections`
            /// holds ends with it).
            #[inline(always)]
            #[allow(non_snake_case)]
            pub(super) fn hold<'h>(
                &'h self,
                g: &Generation,
                request: &Request,
                paid: KindSet,
                sections: &'h Sections<'h, KEYED_KINDS>,
                held: &mut HeldKinds<'h, C>,
            ) -> bool {
                // What each paid kind announced, carried over the fence: uninitialized
                // for the kinds not paid (an `Option` there would store its `None`s,
                // before the fence, on every request).
                $(
                let mut $kind = std::mem::MaybeUninit::uninit();
                if paid & bit(ScopeKind::$kind.index()) != 0 {
                    let key = match ($(request.$field,)+) {
                        ($(Some($field),)+) => ($($field,)+),
                        #[allow(unreachable_patterns)]
                        _ => {
                            cold_path();
                            return false;
                        }
                    };
                    let Some(m) = self.$kind.as_ref() else {
                        cold_path();
                        return false;
                    };
                    let Some((tier, limits, at)) = m.announce_held(g, &key, sections) else {
                        return false;
                    };
                    $kind.write((key, tier, limits, at));
                }
                )*
                let fenced = sections.fence();
                $(
                if paid & bit(ScopeKind::$kind.index()) != 0 {
                    // SAFETY: written above for every kind of `paid` (else the request
                    // left).
                    let (key, tier, limits, at) = unsafe { $kind.assume_init() };
                    let Some(h) = limits.map.hold(&key, at, &fenced, sections) else {
                        cold_path();
                        return false;
                    };
                    held.push(ScopeKind::$kind, tier, h);
                }
                )*
                true
            }

            /// [`hold`](KeyedMaps::hold) for a request that pays one keyed kind (`paid`
            /// has one bit): its bucket, held in a reader section that `sections`
            /// keeps, with its key's local tier; `None` where `hold` gives `false`, or
            /// when `valid()`, called once the section is held, is false. The
            /// one kind is found at once, not tested for in turn with the others, and
            /// nothing is listed.
            #[inline(always)]
            #[allow(non_snake_case)]
            pub(super) fn hold_one<'h, const N: usize>(
                &'h self,
                g: &Generation,
                request: &Request,
                paid: KindSet,
                sections: &'h Sections<'h, N>,
                valid: impl FnOnce() -> bool,
            ) -> Option<Keyed<'h, C>> {
                debug_assert!(paid.is_power_of_two(), "one kind paid");
                let kind = paid.trailing_zeros() as usize;
                $(
                if kind == ScopeKind::$kind.index() {
                    let key = match ($(request.$field,)+) {
                        ($(Some($field),)+) => ($($field,)+),
                        #[allow(unreachable_patterns)]
                        _ => {
                            cold_path();
                            return None;
                        }
                    };
                    let Some(m) = self.$kind.as_ref() else {
                        cold_path();
                        return None;
                    };
                    let (tier, limits, at) = m.announce_held(g, &key, sections)?;
                    let fenced = sections.fence();
                    let Some(h) = limits.map.hold(&key, at, &fenced, sections) else {
                        cold_path();
                        return None;
                    };
                    if !valid() {
                        cold_path();
                        return None;
                    }
                    return Some(Keyed::new(ScopeKind::$kind, tier, h));
                }
                )*
                None
            }

            /// Runs `f` with the slots of every keyed kind `request` pays (at `costs`)
            /// held, taking the maps' shard locks nested in kind order, and within a
            /// kind in policy order, each map's of generation `g`; `None`s for the global
            /// kind and for kinds the request does not pay. A key new to its map is
            /// inserted only while `valid()` (`g` is current) holds under the map's lock:
            /// else its slot is [`Slot::Stale`] (a switch may have moved the key).
            #[inline]
            #[allow(non_snake_case)]
            pub(super) fn with_slots<R>(
                &self,
                g: &Generation,
                valid: &dyn Fn() -> bool,
                request: &Request,
                costs: &PerKind<u64>,
                now: u64,
                f: impl FnOnce(PerKind<&KindSlots<'_, C>>) -> R,
            ) -> R {
                let paid = self.paid_kinds(request, costs);
                nest!(self, g, valid, request, costs, now, paid, f, [], [$($kind ($($field),+)),*])
            }
        }
    };
}

with_keyed_kinds!(define_maps);

impl<K, C, S> KindMap<K, C, S>
where
    K: Hash + Eq + Send + Sync,
    C: Clock,
    S: BuildHasher,
{
    /// [`KindMapOps::refund`] (`places` none) or [`KindMapOps::cancel`].
    fn give_back<'g>(
        &self,
        paid: &'g Generation,
        current: &dyn Fn() -> &'g Generation,
        scope: &Scope,
        cost: u64,
        places: Option<&[Option<Place>]>,
    ) {
        let Some(key) = (self.key_of)(scope) else {
            return;
        };
        let tier_in = |g: &Generation| self.limits_of(g, &key).0;
        for limit in 0..MAX_POLICIES_PER_RULE {
            let mut spins = 0u32;
            loop {
                let g = current();
                let Some(m) = self.limits_of(g, &key).1.limit(limit) else {
                    return;
                };
                // Given only while `g` is current (checked under the key's lock, which a
                // switch's barrier waits for): a switch may have moved the key to
                // another map since. Capped at the capacity, as any refund; an evicted
                // key gets nothing.
                let valid = || mutant!(SCOPED_REFUND_SKIPS_RECHECK) || ptr::eq(current(), g);
                let done = match places {
                    // Still the configuration it was reserved under: exact, on the word
                    // it was reserved on.
                    Some(places) if g.number == paid.number => {
                        let Some(place) = places.get(limit).copied().flatten() else {
                            break;
                        };
                        let policy = m.policy();
                        m.cancel_if(&key, &place, policy.layout(), valid)
                    }
                    _ => {
                        let c = carried(paid, g, self.kind.index(), &tier_in, limit, cost);
                        m.refund_if(&key, c, valid)
                    }
                };
                if done {
                    break;
                }
                crate::sync::spin(&mut spins);
            }
        }
    }
}
