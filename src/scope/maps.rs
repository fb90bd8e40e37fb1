//! The keyed maps of a scoped limiter, one per keyed kind, generated from the one list of
//! kinds ([`with_keyed_kinds`]), and the type-erased view the limiter reads them through.

use std::hash::{BuildHasher, Hash};
use std::time::Duration;

use crate::clock::Clock;
use crate::keyed::{KeyedLimiter, Slot, SweepReport};
use crate::scope::kind::{
    ApiKeyId, PerKind, RouteId, Scope, ScopeKind, TenantId, UserId, with_keyed_kinds,
};
use crate::scope::rules::{Request, Rule, RuleError};
use crate::telemetry::{Attempt, CounterSnapshot};

/// One keyed kind's map, with the conversions between its keys and [`Scope`]s.
pub(super) struct KindMap<K, C: Clock, S> {
    pub(super) map: KeyedLimiter<K, C, S>,
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
        self.map.sweep()
    }

    fn max_sweep_interval(&self) -> Duration {
        self.map.max_sweep_interval()
    }

    fn counters(&self, scope: &Scope) -> Option<CounterSnapshot> {
        self.map.counters(&(self.key_of)(scope)?)
    }

    fn available(&self, scope: &Scope) -> Option<f64> {
        Some(self.map.available(&(self.key_of)(scope)?))
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
    KeyedLimiter::builder(r.policy, r.options.max_keys)
        .options(r.options)
        .clock(clock.clone())
        .hasher(hasher.clone())
        .build()
        .map(|map| {
            Some(KindMap {
                map,
                key_of,
                scope_of,
            })
        })
        .map_err(|error| RuleError::Keyed { kind, error })
}

/// Runs `f` with the slot of `key` in `map` held, or with `None` when the request does
/// not pay this kind (no rule, no key, or a zero cost).
#[inline]
fn with<K, C, S, R>(
    map: &Option<KindMap<K, C, S>>,
    key: Option<K>,
    cost: u64,
    now: u64,
    f: impl FnOnce(Option<Slot<'_, C>>) -> R,
) -> R
where
    K: Hash + Eq + Clone + Send + Sync,
    C: Clock,
    S: BuildHasher,
{
    match (map, key) {
        (Some(m), Some(k)) if cost > 0 => m.map.with_slot(&k, now, |s| f(Some(s))),
        _ => f(None),
    }
}

/// Nests one `with` per keyed kind, in list order (the lock order), then calls `$f` with
/// every kind's slot.
macro_rules! nest {
    ($maps:ident, $request:ident, $costs:ident, $now:ident, $f:ident, [$($held:ident)*], []) => {
        $f([None $(, $held)*])
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

            /// Runs `f` with the slot of every keyed kind `request` pays (at `costs`)
            /// held, taking the maps' shard locks nested in kind order; `None` for the
            /// global kind and for kinds the request does not pay.
            #[inline]
            #[allow(non_snake_case)]
            pub(super) fn with_slots<R>(
                &self,
                request: &Request,
                costs: &PerKind<u64>,
                now: u64,
                f: impl FnOnce(PerKind<Option<Slot<'_, C>>>) -> R,
            ) -> R {
                nest!(self, request, costs, now, f, [], [$($kind ($($field),+)),*])
            }
        }
    };
}

with_keyed_kinds!(define_maps);
