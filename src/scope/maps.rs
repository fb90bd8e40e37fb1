//! The keyed maps of a scoped limiter, one per keyed kind, generated from the one list of
//! kinds ([`with_keyed_kinds`]), and the type-erased view the limiter reads them through.

use std::hash::{BuildHasher, Hash};
use std::time::Duration;

use crate::clock::Clock;
use crate::keyed::{KeyedLimiter, Slot, SweepReport};
use crate::scope::kind::{
    ApiKeyId, PerKind, RouteId, Scope, ScopeKind, TenantId, UserId, with_keyed_kinds,
};
use crate::scope::rules::{MAX_POLICIES_PER_RULE, Request, Rule, RuleError};
use crate::telemetry::{Attempt, CounterSnapshot};

/// The slot of each limit (policy) of one keyed kind while its locks are held: `None`
/// past the rule's policies, and for every limit when the request does not pay the kind.
pub(super) type LimitSlots<'a, C> = [Option<Slot<'a, C>>; MAX_POLICIES_PER_RULE];

// `with` nests one lock per limit, written out for each count up to this maximum.
const _: () = assert!(MAX_POLICIES_PER_RULE == 4);

/// One keyed kind's maps, one per policy of its rule, with the conversions between its
/// keys and [`Scope`]s.
pub(super) struct KindMap<K, C: Clock, S> {
    /// The first policy's map: it alone keeps counters, and names the kind's keys.
    pub(super) map: KeyedLimiter<K, C, S>,
    /// The other policies' maps, in the rule's order (empty for a single policy).
    extra: Vec<KeyedLimiter<K, C, S>>,
    key_of: fn(&Scope) -> Option<K>,
    scope_of: fn(&K) -> Scope,
}

/// What the scoped limiter reads from a keyed kind's map, whatever its key type.
pub(super) trait KindMapOps {
    fn len(&self) -> usize;
    fn evicted(&self) -> CounterSnapshot;
    fn overflowed(&self) -> CounterSnapshot;
    fn count_key_limit(&self, cost: u64, attempt: Attempt);
    fn overflow_id(&self) -> Option<usize>;
    fn sweep(&self) -> SweepReport;
    fn max_sweep_interval(&self) -> Duration;
    /// `None` when `scope` is not of this kind or has no counters.
    fn counters(&self, scope: &Scope) -> Option<CounterSnapshot>;
    /// `None` when `scope` is not of this kind.
    fn available(&self, scope: &Scope) -> Option<f64>;
    /// The tokens of `scope`'s bucket of limit `limit`; `None` when `scope` is not of
    /// this kind or the rule has no such limit.
    fn available_in(&self, scope: &Scope, limit: usize) -> Option<f64>;
    /// `None` when `scope` is not of this kind or has no bucket.
    fn stored_word(&self, scope: &Scope) -> Option<u64>;
    fn for_each_counters(&self, f: &mut dyn FnMut(Scope, CounterSnapshot));
    /// Gives `scope`'s bucket `cost` back (nothing when `scope` is not of this kind or
    /// its key is not in the map).
    fn refund(&self, scope: &Scope, cost: u64);
}

impl<K, C, S> KindMapOps for KindMap<K, C, S>
where
    K: Hash + Eq + Send + Sync,
    C: Clock,
    S: BuildHasher,
{
    fn len(&self) -> usize {
        self.map.len()
    }

    fn evicted(&self) -> CounterSnapshot {
        self.map.evicted_counters()
    }

    fn overflowed(&self) -> CounterSnapshot {
        self.map.overflow_counters()
    }

    fn count_key_limit(&self, cost: u64, attempt: Attempt) {
        self.map.count_key_limit(cost, attempt);
    }

    fn overflow_id(&self) -> Option<usize> {
        self.map.overflow_id()
    }

    fn sweep(&self) -> SweepReport {
        let mut report = self.map.sweep();
        for m in &self.extra {
            report += m.sweep();
        }
        report
    }

    fn max_sweep_interval(&self) -> Duration {
        self.extra
            .iter()
            .map(|m| m.max_sweep_interval())
            .fold(self.map.max_sweep_interval(), Duration::min)
    }

    fn counters(&self, scope: &Scope) -> Option<CounterSnapshot> {
        self.map.counters(&(self.key_of)(scope)?)
    }

    fn available(&self, scope: &Scope) -> Option<f64> {
        Some(self.map.available(&(self.key_of)(scope)?))
    }

    fn available_in(&self, scope: &Scope, limit: usize) -> Option<f64> {
        let key = (self.key_of)(scope)?;
        let map = match limit {
            0 => &self.map,
            l => self.extra.get(l - 1)?,
        };
        Some(map.available(&key))
    }

    fn stored_word(&self, scope: &Scope) -> Option<u64> {
        self.map.stored_word(&(self.key_of)(scope)?)
    }

    fn for_each_counters(&self, f: &mut dyn FnMut(Scope, CounterSnapshot)) {
        self.map.for_each_counters(|k, c| f((self.scope_of)(k), c));
    }

    fn refund(&self, scope: &Scope, cost: u64) {
        if let Some(k) = (self.key_of)(scope) {
            // A cost within the capacity (it was paid); an evicted key gets nothing.
            let _ = self.map.refund(&k, cost);
            for m in &self.extra {
                let _ = m.refund(&k, cost);
            }
        }
    }
}

/// The map of `kind` under its rule, if it has one.
fn kind_map<K, C, S>(
    rules: &PerKind<Option<Rule>>,
    kind: ScopeKind,
    clock: &C,
    hasher: &S,
    key_of: fn(&Scope) -> Option<K>,
    scope_of: fn(&K) -> Scope,
) -> Result<Option<KindMap<K, C, S>>, RuleError>
where
    C: Clock + Clone,
    S: BuildHasher + Clone,
{
    let Some(r) = rules[kind.index()] else {
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
    let map = build(*r.policy(), r.options)?;
    // The first map alone counts: the other limits' maps hold a word per key.
    let extra = r.policies()[1..]
        .iter()
        .map(|&p| build(p, r.options.counters(false)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(KindMap {
        map,
        extra,
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
    f: impl FnOnce(LimitSlots<'_, C>) -> R,
) -> R
where
    K: Hash + Eq + Clone + Send + Sync,
    C: Clock,
    S: BuildHasher,
{
    match (map, key) {
        (Some(m), Some(k)) if cost > 0 => {
            let k = &k;
            match m.extra.as_slice() {
                [] => m.map.with_slot(k, now, |a| f([Some(a), None, None, None])),
                [b] => m.map.with_slot(k, now, |a| {
                    b.with_slot(k, now, |b| f([Some(a), Some(b), None, None]))
                }),
                [b, c] => m.map.with_slot(k, now, |a| {
                    b.with_slot(k, now, |b| {
                        c.with_slot(k, now, |c| f([Some(a), Some(b), Some(c), None]))
                    })
                }),
                [b, c, d, ..] => m.map.with_slot(k, now, |a| {
                    b.with_slot(k, now, |b| {
                        c.with_slot(k, now, |c| {
                            d.with_slot(k, now, |d| f([Some(a), Some(b), Some(c), Some(d)]))
                        })
                    })
                }),
            }
        }
        _ => f([None, None, None, None]),
    }
}

/// Nests one `with` per keyed kind, in list order (the lock order), then calls `$f` with
/// every kind's slot.
macro_rules! nest {
    ($maps:ident, $request:ident, $costs:ident, $now:ident, $f:ident, [$($held:ident)*], []) => {
        $f([[None, None, None, None] $(, $held)*])
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
                clock: &C,
                hasher: &S,
            ) -> Result<KeyedMaps<C, S>, RuleError> {
                Ok(KeyedMaps {
                    $($kind: kind_map(
                        rules,
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
                f: impl FnOnce(PerKind<LimitSlots<'_, C>>) -> R,
            ) -> R {
                nest!(self, request, costs, now, f, [], [$($kind ($($field),+)),*])
            }
        }
    };
}

with_keyed_kinds!(define_maps);
