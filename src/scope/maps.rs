//! The keyed maps of a scoped limiter, one per keyed kind, generated from the one list of
//! kinds ([`with_keyed_kinds`]), and the type-erased view the limiter reads them through.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

use crate::clock::Clock;
use crate::inherit::Inherit;
use crate::keyed::{KeyedLimiter, KeyedOptions, Overflow, Slot, SweepReport, Switch};
use crate::policy::Policy;
use crate::scope::decision::KindPolicies;
use crate::scope::kind::{
    ApiKeyId, PerKind, RouteId, Scope, ScopeKind, TenantId, UserId, with_keyed_kinds,
};
use crate::scope::rules::{MAX_POLICIES_PER_RULE, Request, Rule, RuleError};
use crate::scope::tiers::KindTiers;
use crate::telemetry::{Attempt, CounterSnapshot};

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

/// One keyed kind's maps: its rule's, one per policy, and those of each tier its
/// overridden keys use, with the table from overridden key to tier and the conversions
/// between its keys and [`Scope`]s.
pub(super) struct KindMap<K, C: Clock, S> {
    rule: Limits<K, C, S>,
    /// Each used tier's maps, by local tier from 1 (`tiers[t - 1]`), each holding at
    /// most the keys overridden to it.
    tiers: Vec<Limits<K, C, S>>,
    /// Overridden keys and their local tier (from 1); fixed at build, often empty.
    overrides: HashMap<K, u8, S>,
    key_of: fn(&Scope) -> Option<K>,
    scope_of: fn(&K) -> Scope,
}

impl<K: Hash + Eq + Send + Sync, C: Clock, S: BuildHasher> KindMap<K, C, S> {
    /// The local tier of `key` (0: the rule's) and the maps it pays. A kind without
    /// overrides costs one predicted branch.
    #[inline]
    fn limits_of(&self, key: &K) -> (u8, &Limits<K, C, S>) {
        if self.overrides.is_empty() {
            return (0, &self.rule);
        }
        self.tier_limits(key)
    }

    #[inline(never)]
    fn tier_limits(&self, key: &K) -> (u8, &Limits<K, C, S>) {
        match self.overrides.get(key) {
            Some(&t) => match self.tiers.get(usize::from(t).wrapping_sub(1)) {
                Some(limits) => (t, limits),
                None => (0, &self.rule),
            },
            None => (0, &self.rule),
        }
    }

    /// The key of `scope` and the maps it pays, when `scope` is of this kind.
    fn scope_limits(&self, scope: &Scope) -> Option<(K, &Limits<K, C, S>)> {
        let key = (self.key_of)(scope)?;
        let limits = self.limits_of(&key).1;
        Some((key, limits))
    }

    /// Every set of maps: the rule's, then the tiers'.
    fn all(&self) -> impl Iterator<Item = &Limits<K, C, S>> {
        std::iter::once(&self.rule).chain(&self.tiers)
    }
}

/// What the scoped limiter reads from a keyed kind's map, whatever its key type.
pub(super) trait KindMapOps {
    fn len(&self) -> usize;
    fn evicted(&self) -> CounterSnapshot;
    fn overflowed(&self) -> CounterSnapshot;
    /// Counts a request refused because the map `scope`'s key goes to was full.
    fn count_key_limit(&self, scope: &Scope, cost: u64, attempt: Attempt);
    fn overflow_id(&self) -> Option<usize>;
    fn sweep(&self) -> SweepReport;
    fn max_sweep_interval(&self) -> Duration;
    /// `None` when `scope` is not of this kind or has no counters.
    fn counters(&self, scope: &Scope) -> Option<CounterSnapshot>;
    /// `None` when `scope` is not of this kind.
    fn available(&self, scope: &Scope) -> Option<f64>;
    /// The tokens of `scope`'s bucket of limit `limit`; `None` when `scope` is not of
    /// this kind or its policies have no such limit.
    fn available_in(&self, scope: &Scope, limit: usize) -> Option<f64>;
    /// `None` when `scope` is not of this kind or has no bucket.
    fn stored_word(&self, scope: &Scope) -> Option<u64>;
    fn for_each_counters(&self, f: &mut dyn FnMut(Scope, CounterSnapshot));
    /// Gives each of `scope`'s buckets `cost(tier, limit)` back (nothing when `scope` is
    /// not of this kind or its key is not in the map).
    fn refund(&self, scope: &Scope, cost: &dyn Fn(u8, usize) -> u64);
    /// The local tier of `scope`'s key (0: the rule's); `None` when `scope` is not of
    /// this kind.
    fn tier_of(&self, scope: &Scope) -> Option<u8>;
    /// Holds the reconfiguration barrier of every map of the kind, in the lock order
    /// (the rule's limits in policy order, then each tier's): see
    /// [`KeyedLimiter::begin_switch`].
    fn begin_switch(&self) -> Vec<Switch<'_>>;
    /// Publishes each map's policy from `rule` and `tiers` (the kind's new policies, of
    /// the same shape) with `inherit` from the switch reading `at`, as
    /// [`KeyedLimiter::finish_switch`], in the order of `switches` (from
    /// [`begin_switch`](KindMapOps::begin_switch)); a map whose policy does not change
    /// is left as it is. The number of maps switched.
    fn finish_switch(
        &self,
        switches: Vec<Switch<'_>>,
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
    fn len(&self) -> usize {
        self.all().map(|l| l.map.len()).sum()
    }

    fn evicted(&self) -> CounterSnapshot {
        self.all()
            .map(|l| l.map.evicted_counters())
            .fold(CounterSnapshot::default(), |a, b| a + b)
    }

    fn overflowed(&self) -> CounterSnapshot {
        self.all()
            .map(|l| l.map.overflow_counters())
            .fold(CounterSnapshot::default(), |a, b| a + b)
    }

    fn count_key_limit(&self, scope: &Scope, cost: u64, attempt: Attempt) {
        if let Some((_, l)) = self.scope_limits(scope) {
            l.map.count_key_limit(cost, attempt);
        }
    }

    fn overflow_id(&self) -> Option<usize> {
        self.rule.map.overflow_id()
    }

    fn sweep(&self) -> SweepReport {
        let mut report = SweepReport::default();
        for m in self.all().flat_map(Limits::maps) {
            report += m.sweep();
        }
        report
    }

    fn max_sweep_interval(&self) -> Duration {
        self.all()
            .flat_map(Limits::maps)
            .map(|m| m.max_sweep_interval())
            .fold(Duration::MAX, Duration::min)
    }

    fn counters(&self, scope: &Scope) -> Option<CounterSnapshot> {
        let (key, l) = self.scope_limits(scope)?;
        l.map.counters(&key)
    }

    fn available(&self, scope: &Scope) -> Option<f64> {
        let (key, l) = self.scope_limits(scope)?;
        Some(l.map.available(&key))
    }

    fn available_in(&self, scope: &Scope, limit: usize) -> Option<f64> {
        let (key, l) = self.scope_limits(scope)?;
        Some(l.limit(limit)?.available(&key))
    }

    fn stored_word(&self, scope: &Scope) -> Option<u64> {
        let (key, l) = self.scope_limits(scope)?;
        l.map.stored_word(&key)
    }

    fn for_each_counters(&self, f: &mut dyn FnMut(Scope, CounterSnapshot)) {
        for l in self.all() {
            l.map.for_each_counters(|k, c| f((self.scope_of)(k), c));
        }
    }

    fn refund(&self, scope: &Scope, cost: &dyn Fn(u8, usize) -> u64) {
        let Some(key) = (self.key_of)(scope) else {
            return;
        };
        let (tier, l) = self.limits_of(&key);
        for (limit, m) in l.maps().enumerate() {
            // Capped at the capacity, as any refund; an evicted key gets nothing.
            let c = cost(tier, limit).min(m.policy().capacity());
            let _ = m.refund(&key, c);
        }
    }

    fn tier_of(&self, scope: &Scope) -> Option<u8> {
        Some(self.limits_of(&(self.key_of)(scope)?).0)
    }

    fn begin_switch(&self) -> Vec<Switch<'_>> {
        self.all()
            .flat_map(Limits::maps)
            .map(KeyedLimiter::begin_switch)
            .collect()
    }

    fn finish_switch(
        &self,
        switches: Vec<Switch<'_>>,
        rule: &KindPolicies,
        tiers: &[KindPolicies],
        inherit: Inherit,
        at: u64,
    ) -> usize {
        let policies = std::iter::once(rule)
            .chain(tiers)
            .flat_map(|p| p.as_slice().iter().copied());
        let maps = self.all().flat_map(Limits::maps);
        let mut switched = 0;
        for ((map, switch), policy) in maps.zip(switches).zip(policies) {
            if *map.policy() == policy {
                // Unchanged: its keys keep their words (a reload that changed only
                // another rule, or a comment, refills nothing).
                continue;
            }
            map.finish_switch(switch, policy, inherit, at);
            switched += 1;
        }
        switched
    }
}

/// The map of `kind` under its rule, if it has one and is not remote, with the maps of the tiers its
/// overridden keys use (`tiers`, laid out by [`lay_out`](crate::scope::tiers::lay_out)).
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
    K: Hash + Eq,
    C: Clock + Clone,
    S: BuildHasher + Clone,
{
    // A remote kind's scopes are kept in the limiter's remote store: no local map.
    let Some(r) = rules[kind.index()].filter(|r| !r.remote) else {
        return Ok(None);
    };
    let build = |policy, options| {
        KeyedLimiter::builder(policy, r.options.max_keys)
            .options(options)
            .clock(clock.clone())
            .hasher(hasher.clone())
            .build()
            .map_err(|error| RuleError::Keyed { kind, error })
    };
    let limits = |policies: &[Policy], options: KeyedOptions| {
        Ok::<_, RuleError>(Limits {
            map: build(policies[0], options)?,
            // The first map alone counts: the other limits' maps hold a word per key.
            extra: policies[1..]
                .iter()
                .map(|&p| build(p, options.counters(false)))
                .collect::<Result<Vec<_>, _>>()?,
        })
    };
    let rule = limits(r.policies(), r.options)?;
    // A tier's maps hold exactly its overridden keys: they never need an overflow, nor
    // more shards than keys (a tier of a few keys costs a few shards, not the rule's).
    let tier_maps = tiers
        .tiers
        .iter()
        .map(|(_, p)| {
            let shards = rule.map.shards().min(p.max_keys.max(1).next_power_of_two());
            limits(
                p.as_slice(),
                r.options
                    .max_keys(p.max_keys)
                    .overflow(Overflow::Reject)
                    .shards(shards),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut overrides = HashMap::with_capacity_and_hasher(tiers.keys.len(), hasher.clone());
    for (scope, t) in &tiers.keys {
        if let Some(key) = key_of(scope) {
            overrides.insert(key, *t);
        }
    }
    Ok(Some(KindMap {
        rule,
        tiers: tier_maps,
        overrides,
        key_of,
        scope_of,
    }))
}

/// Runs `f` with the slot of `key` in each of the kind's maps held (taken in the rule's
/// policy order), or with none when the request does not pay this kind (no rule, no
/// key, or a zero cost).
#[inline]
fn with<K, C, S, R>(
    map: &Option<KindMap<K, C, S>>,
    key: Option<K>,
    cost: u64,
    now: u64,
    f: impl FnOnce(KindSlots<'_, C>) -> R,
) -> R
where
    K: Hash + Eq + Clone + Send + Sync,
    C: Clock,
    S: BuildHasher,
{
    match (map, key) {
        (Some(m), Some(k)) if cost > 0 => {
            let k = &k;
            let (t, l) = m.limits_of(k);
            match l.extra.as_slice() {
                [] => l
                    .map
                    .with_slot(k, now, |a| f((t, [Some(a), None, None, None]))),
                [b] => l.map.with_slot(k, now, |a| {
                    b.with_slot(k, now, |b| f((t, [Some(a), Some(b), None, None])))
                }),
                [b, c] => l.map.with_slot(k, now, |a| {
                    b.with_slot(k, now, |b| {
                        c.with_slot(k, now, |c| f((t, [Some(a), Some(b), Some(c), None])))
                    })
                }),
                [b, c, d, ..] => l.map.with_slot(k, now, |a| {
                    b.with_slot(k, now, |b| {
                        c.with_slot(k, now, |c| {
                            d.with_slot(k, now, |d| f((t, [Some(a), Some(b), Some(c), Some(d)])))
                        })
                    })
                }),
            }
        }
        _ => f((0, [None, None, None, None])),
    }
}

/// Nests one `with` per keyed kind, in list order (the lock order), then calls `$f` with
/// every kind's slot.
macro_rules! nest {
    ($maps:ident, $request:ident, $costs:ident, $now:ident, $f:ident, [$($held:ident)*], []) => {
        $f([(0, [None, None, None, None]) $(, $held)*])
    };
    (
        $maps:ident, $request:ident, $costs:ident, $now:ident, $f:ident, [$($held:ident)*],
        [$kind:ident ($($field:ident),+) $(, $rest:ident ($($rest_field:ident),+))*]
    ) => {
        with(
            &$maps.$kind,
            match ($($request.$field,)+) {
                ($(Some($field),)+) => Some(($($field,)+)),
                #[allow(unreachable_patterns)]
                _ => None,
            },
            $costs[ScopeKind::$kind.index()],
            $now,
            |$kind| nest!($maps, $request, $costs, $now, $f, [$($held)* $kind], [$($rest ($($rest_field),+)),*]),
        )
    };
}

macro_rules! define_maps {
    ([$($(#[$doc:meta])* $kind:ident $name:literal ($($field:ident: $ty:ty),+)),* $(,)?]) => {
        /// Every keyed kind's map (`None` for a kind without a rule), keyed by the tuple of
        /// its request fields.
        #[allow(non_snake_case)]
        pub(super) struct KeyedMaps<C: Clock, S> {
            $($kind: Option<KindMap<($($ty,)+), C, S>>,)*
        }

        impl<C: Clock + Clone, S: BuildHasher + Clone> KeyedMaps<C, S> {
            /// A map for every keyed kind that has a rule.
            pub(super) fn build(
                rules: &PerKind<Option<Rule>>,
                tiers: &PerKind<KindTiers>,
                clock: &C,
                hasher: &S,
            ) -> Result<KeyedMaps<C, S>, RuleError> {
                Ok(KeyedMaps {
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
                })
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
                false $(|| (self.$kind.is_some()
                    && costs[ScopeKind::$kind.index()] > 0
                    $(&& request.$field.is_some())+))*
            }

            /// Runs `f` with the slots of every keyed kind `request` pays (at `costs`)
            /// held, taking the maps' shard locks nested in kind order, and within a
            /// kind in policy order; `None`s for the global kind and for kinds the
            /// request does not pay.
            #[inline]
            #[allow(non_snake_case)]
            pub(super) fn with_slots<R>(
                &self,
                request: &Request,
                costs: &PerKind<u64>,
                now: u64,
                f: impl FnOnce(PerKind<KindSlots<'_, C>>) -> R,
            ) -> R {
                nest!(self, request, costs, now, f, [], [$($kind ($($field),+)),*])
            }
        }
    };
}

with_keyed_kinds!(define_maps);
