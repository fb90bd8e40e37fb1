//! Scopes: who shares a budget, and one call that pays every scope of a request.
//!
//! A [`RuleSet`] gives each scope kind (global, tenant, user, API key, client address,
//! route, tenant route) its own [`Rule`] (policy, key bound, overflow) and names the work classes with
//! their costs. A [`ScopedLimiter`] built from it maps a [`Request`] to the scopes it must
//! pay and pays them all or none, as [`acquire_all_with`](crate::multi::acquire_all_with) does
//! (at the one clock reading of the request); the [`ScopeDecision`] names the scope that
//! refused. The global scope's bucket may be a [`LeasedBucket`] ([`Rule::leased`]).
//!
//! A rule may hold several policies ([`Rule::with_policies`]): each scope of its kind
//! then has one bucket per policy, all paid in the same acquisition, and a refusal
//! names the limit that refused ([`ScopeDecision::refused_limit`]).
//!
//! Tiers give some keys other policies than their rule's: [`RuleSet::tier`] names a set
//! of policies and [`RuleSet::override_key`] gives a key one (tenant 42 gets ten times
//! the rule). An overridden key pays its tier's buckets, in maps of its own bounded by
//! the number of overrides, all or none with the request's other scopes; a kind without
//! overrides pays what it paid without them. See [`ScopedLimiter::policies_for`].
//!
//! A running limiter takes new policies (of its rules and tiers), new tiers and
//! overrides, and new class costs in place ([`ScopedLimiter::reconfigure`]), every
//! bucket carrying its tokens over with its rule's [`Inherit`] strategy
//! ([`Rule::inherit`]), a key whose tier changes moving its buckets to its new tier's
//! maps the same way, each request decided wholly on the old configuration or wholly
//! on the new.
//!
//! Chosen keyed kinds may live in a remote store shared by several limiters
//! ([`Rule::remote`], [`RemoteScopes`]), while the global scope and the other kinds stay
//! local: a request pays its local scopes first, then its remote ones in one call to the
//! store, and a refusal there gives every local scope its cost back. The engine holds no
//! network client: `tokengate-redis` implements the store on Redis.
//!

mod decision;
mod generation;
mod held;
mod inline;
mod kind;
mod maps;
mod reconfigure;
mod remote;
mod reserve;
mod rules;
#[cfg(test)]
mod tests;
mod tiers;

use std::fmt;
use std::hash::BuildHasher;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::time::Duration;

use crate::bucket::{Core, Sealable};
use crate::clock::{Clock, Monotonic, QuantaClock};
use crate::decision::Decision;
use crate::epoch::Pinned;
use crate::error::AcquireError;
use crate::inherit::Inherit;
use crate::keyed::{Handle, KeyHasher, Overflow, Slot, SweepReport, sweep_interval};
use crate::leased::LeasedBucket;
use crate::multi::{Member, MultiError, Planned, Prepared, acquire_listed_at, sealed};
use crate::policy::Policy;
use crate::telemetry::{CounterRef, CounterSnapshot, StripedCounters};

use decision::{KindPolicies, Policies, PolicySet};
pub use decision::{Refusal, ScopeDecision, ScopeError, ScopeVerdict};
use generation::{Generation, Generations, GlobalWord, is_sealed};
use inline::Inline;
pub use kind::{ApiKeyId, ClientId, PerKind, RouteId, Scope, ScopeKind, TenantId, UserId};
use maps::{KeyedMaps, KindMapOps, KindSlots};
pub use reconfigure::ScopeReconfigured;
use remote::Remote;
pub use remote::{RemoteRefusal, RemoteScopes};
pub use reserve::{Charge, ScopeReserveError};
pub use rules::{
    ClassId, MAX_POLICIES_PER_RULE, Request, Reshape, Rule, RuleError, RuleSet, WorkClass,
};
pub use tiers::{MAX_OVERRIDES, MAX_TIERS};

/// Buckets one request may pay: every limit of every kind.
const MAX_PAYERS: usize = ScopeKind::COUNT * MAX_POLICIES_PER_RULE;

/// What the global scope keeps across reconfigurations: its counters, and its bucket
/// when leased (a plain global scope's words belong to each [`Generation`]).
struct GlobalScope<C: Clock> {
    /// The leased bucket ([`Rule::leased`]); `None` for plain words.
    leased: Option<LeasedBucket<C>>,
    counters: Option<StripedCounters>,
}

/// One bucket a request pays: a keyed map's word while its lock is held, a plain global
/// word of the request's generation, or a leased global bucket, with where its counts
/// go.
enum Payer<'a, C: Clock> {
    Word(Handle<'a, C>),
    Global(GlobalWord<'a, C>),
    /// The leased global bucket, decided on the epoch of the request's generation.
    Leased(&'a LeasedBucket<C>, &'a Generation, CounterRef<'a>),
}

impl<C: Clock> Clone for Payer<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C: Clock> Copy for Payer<'_, C> {}

impl<'a, C: Clock> Payer<'a, C> {
    fn counters(&self) -> CounterRef<'a> {
        match self {
            Payer::Word(h) => h.counters,
            Payer::Global(g) => g.counters,
            Payer::Leased(_, _, c) => *c,
        }
    }
}

impl<C: Clock> Member for Payer<'_, C> {
    #[inline]
    fn member_id(&self) -> usize {
        match self {
            Payer::Word(h) => h.member_id(),
            Payer::Global(g) => g.member_id(),
            Payer::Leased(b, _, _) => b.member_id(),
        }
    }
    fn capacity(&self) -> u64 {
        match self {
            Payer::Word(h) => Member::capacity(h),
            Payer::Global(g) => Member::capacity(g),
            Payer::Leased(b, g, _) => g
                .policies()
                .get(ScopeKind::Global.index(), 0)
                .map_or_else(|| Member::capacity(*b), |p| p.policy().capacity()),
        }
    }
}

impl<C: Clock> sealed::Sealed for Payer<'_, C> {
    #[inline]
    fn now_nanos(&self) -> u64 {
        match self {
            Payer::Word(h) => h.now_nanos(),
            Payer::Global(g) => sealed::Sealed::now_nanos(g),
            Payer::Leased(b, _, _) => sealed::Sealed::now_nanos(*b),
        }
    }
    #[inline]
    fn take_at(&self, cost: u64, now: u64) -> Result<Decision, AcquireError> {
        match self {
            Payer::Word(h) => h.take_at(cost, now),
            Payer::Global(g) => g.take_at(cost, now),
            Payer::Leased(b, g, _) => b.take_exactly(g.leased_epoch, cost, now),
        }
    }
    #[inline]
    fn refund_at(&self, cost: u64, now: u64) {
        match self {
            Payer::Word(h) => h.refund_at(cost, now),
            Payer::Global(g) => g.refund_at(cost, now),
            Payer::Leased(b, g, _) => generation::refund_leased(b, g, cost, now),
        }
    }
    fn wait_at(&self, cost: u64, now: u64) -> Duration {
        match self {
            Payer::Word(h) => h.wait_at(cost, now),
            Payer::Global(g) => g.wait_at(cost, now),
            Payer::Leased(b, _, _) => b.wait_at(cost, now),
        }
    }
    #[inline]
    fn refusal_at(&self, cost: u64, now: u64) -> Option<Decision> {
        match self {
            Payer::Word(h) => h.refusal_at(cost, now),
            Payer::Global(g) => g.refusal_at(cost, now),
            Payer::Leased(b, g, _) => b.refusal_exactly(g.leased_epoch, cost, now),
        }
    }
    #[inline(always)]
    fn prepare(&self, cost: u64, now: u64, plan: &mut MaybeUninit<Prepared>) {
        match self {
            Payer::Word(h) => h.prepare(cost, now, plan),
            Payer::Global(g) => g.prepare(cost, now, plan),
            Payer::Leased(b, g, _) => {
                plan.write(b.prepare_on(Some(g.leased_epoch), cost, now));
            }
        }
    }
    #[inline(always)]
    fn commit(&self, plan: &Planned, cost: u64, now: u64) -> Result<Decision, AcquireError> {
        match self {
            Payer::Word(h) => h.commit(plan, cost, now),
            Payer::Global(g) => g.commit(plan, cost, now),
            Payer::Leased(b, g, _) => b.commit_on(Some(g.leased_epoch), plan, cost, now),
        }
    }
}

/// Pays every scope of a request all-or-nothing, with per-scope telemetry.
///
/// Built from a [`RuleSet`]. One [`try_acquire`](ScopedLimiter::try_acquire) call takes
/// the class's cost from every scope the request names (and the global scope), or from
/// none; see "Locking" below for the lock order.
///
/// ```
/// use tokengate::{ManualClock, Policy};
/// use tokengate::scope::*;
///
/// let limiter = RuleSet::new()
///     .rule(ScopeKind::Global, Rule::new(Policy::new(1000, 500.0)?))
///     .rule(ScopeKind::Tenant, Rule::new(Policy::new(100, 20.0)?).counters(true))
///     .rule(ScopeKind::TenantRoute, Rule::new(Policy::new(30, 5.0)?))
///     .class(WorkClass::new("metadata", 1))
///     .class(WorkClass::new("search", 3))
///     .class(WorkClass::new("export", 20))
///     .build_with_clock(ManualClock::new())?;
/// let export = limiter.class("export").unwrap();
/// let request = Request::new().tenant(TenantId(42)).route(RouteId(7));
///
/// assert!(limiter.try_acquire(&request, export)?.is_admitted());
/// let d = limiter.try_acquire(&request, export)?; // the tenant route holds 10
/// assert_eq!(d.refused_scope(), Some(Scope::TenantRoute(TenantId(42), RouteId(7))));
/// // Nothing was taken from the global or tenant scope by the refused request.
/// assert_eq!(limiter.available(&Scope::Tenant(TenantId(42))), Some(80.0));
/// let c = limiter.counters(&Scope::Tenant(TenantId(42))).unwrap();
/// assert_eq!(c.original.admitted_tokens, 20);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # A hot global scope
///
/// Every request pays the global scope, so its bucket is the one cache line all cores
/// meet on. [`Rule::leased`] makes it a [`LeasedBucket`]: admissions take from a
/// core-local slot, leased in batches from the global word, with the same exact bound
/// (a leased global scope admits and refuses as a plain one would, names the same scope
/// and the same [`retry_after`](ScopeDecision::retry_after) when it refuses, and counts
/// the same). The global scope's own [`Decision`] may report less: for an admission paid
/// from a slot, the tokens left in the slot; for a refusal that even full slots could not
/// turn, the global word's balance alone (see
/// [what is approximate](crate::leased#what-is-approximate)).
///
/// # Remote scopes
///
/// A keyed kind whose rule is [`remote`](Rule::remote) keeps no local map: its scopes
/// live in the [`RemoteScopes`] given at build ([`RuleSet::build_with_remote`],
/// [`RuleSet::remote_scopes`]), which several limiters (several processes) share. A
/// request pays its local scopes first, all or none at one clock reading, and only then,
/// outside every lock, its remote scopes in one call to the store; a refusal there gives
/// every local scope its cost back. The global scope (plain or leased) and the other
/// kinds stay local, and a request that names no remote scope never reaches the store.
/// See the `RemoteScopes` example; `tokengate-redis` implements the store on Redis.
///
/// # Locking
///
/// Each keyed kind has its own [`KeyedLimiter`](crate::KeyedLimiter) (its own shards and locks), and a request
/// has at most one key per kind. A request whose keys are all in their maps takes no
/// lock: each key's bucket is found in a reader section of its shard (which, like a read
/// lock, keeps writers out until it ends, but never waits and writes only the thread's
/// own record), the sections entered in the order of [`ScopeKind`] (tenant, user, API
/// key, route, tenant route) and held until every bucket has been paid or rolled back.
/// Any other request (a new key, a writer on a shard, a rule with several policies)
/// takes the shard locks instead, nested in that same order, each at most once, and
/// held as long; a new key takes its shard's write lock in that same position. Writers (insertions, sweeps) hold one shard
/// lock at a time; a [`reconfigure`](ScopedLimiter::reconfigure) holds every shard of
/// every map, taken in that same order (kind, then policy, then tier). Every thread
/// thus acquires locks in one global order, which rules out the deadlock that reader-writer locks preferring waiting writers (std's, and so
/// crossbeam's `ShardedLock`) would otherwise allow: a reader holding shard A and waiting
/// for B behind a queued writer, while another holds B and waits for A.
pub struct ScopedLimiter<C: Clock = QuantaClock, S = KeyHasher> {
    /// Unique in the process: the [`ClassId`]s this limiter gives carry it.
    id: u64,
    clock: Monotonic<C>,
    /// Present when the global scope has a rule.
    global: Option<GlobalScope<C>>,
    /// The classes, policies and plain global words requests are decided with.
    generations: Generations,
    maps: KeyedMaps<C, S>,
    /// The store of the remote kinds ([`Rule::remote`]); `None` when no kind is remote.
    remote: Option<Remote>,
    /// What a reconfiguration may not change.
    shape: reconfigure::Shape,
    /// Serializes reconfigurations.
    switching: std::sync::Mutex<()>,
}

impl<C: Clock + fmt::Debug, S> fmt::Debug for ScopedLimiter<C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = self.generation();
        f.debug_struct("ScopedLimiter")
            .field("clock", &self.clock)
            .field("policies", g.policies())
            .field("global_leased", &self.global_is_leased())
            .field("remote_kinds", &self.remote.as_ref().map_or(0, |r| r.kinds))
            .field("classes", &g.classes())
            .field("reconfigurations", &g.number)
            .finish()
    }
}

impl RuleSet {
    /// Builds the limiter on the default clock and hasher.
    ///
    /// # Errors
    ///
    /// [`RuleError`] for an invalid map configuration, a class that could never be
    /// admitted in some scope, a duplicate class name, leasing asked for a keyed kind
    /// or with a configuration that does not fit the global policy, leasing or a
    /// shared overflow bucket on a rule with several policies, or invalid tiers and
    /// overrides (an unknown tier, a key of the global kind or of a kind without a
    /// rule, too many tiers, overrides or policies in a tier, a class above a used
    /// tier's capacity: see [`RuleSet::tier`] and [`RuleSet::override_key`]), or remote
    /// kinds that cannot be kept remote (see [`Rule::remote`]).
    pub fn build(self) -> Result<ScopedLimiter, RuleError> {
        self.build_with(QuantaClock::new(), KeyHasher::new())
    }

    /// Builds the limiter on the default clock and hasher, with `store` keeping the
    /// kinds whose rule is [`remote`](Rule::remote): as
    /// [`remote_scopes`](RuleSet::remote_scopes) then [`build`](RuleSet::build).
    ///
    /// # Errors
    ///
    /// As [`build`](RuleSet::build).
    pub fn build_with_remote(
        self,
        store: Arc<dyn RemoteScopes>,
    ) -> Result<ScopedLimiter, RuleError> {
        self.remote_scopes(store).build()
    }

    /// Builds the limiter on `clock` (shared by every scope: an all-or-nothing
    /// acquisition reads one time for all its buckets).
    ///
    /// # Errors
    ///
    /// As [`build`](RuleSet::build).
    pub fn build_with_clock<C: Clock + Clone>(
        self,
        clock: C,
    ) -> Result<ScopedLimiter<C>, RuleError> {
        self.build_with(clock, KeyHasher::new())
    }

    /// Builds the limiter on `clock` with `hasher` for every keyed scope.
    ///
    /// # Errors
    ///
    /// As [`build`](RuleSet::build).
    pub fn build_with<C: Clock + Clone, S: BuildHasher + Clone>(
        self,
        clock: C,
        hasher: S,
    ) -> Result<ScopedLimiter<C, S>, RuleError> {
        let (tiers, policies) = self.check()?;
        // A std atomic in a `static` (loom's cannot be one); 2^64 limiters never wrap it.
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let guard = Monotonic::new(clock.clone());
        // The guard's first mark: the limiter counts time from its creation.
        guard.now_nanos();
        let global_rule = self.rules[ScopeKind::Global.index()];
        let global = match global_rule {
            None => None,
            Some(r) => Some(GlobalScope {
                leased: match r.lease {
                    None => None,
                    Some(config) => Some(
                        LeasedBucket::with_config(*r.policy(), clock.clone(), config)
                            .map_err(RuleError::Lease)?,
                    ),
                },
                counters: r.options.counters.then(StripedCounters::new),
            }),
        };
        let words: Box<[Core<Sealable>]> = match global_rule {
            Some(r) if r.lease.is_none() => r
                .policies()
                .iter()
                .map(|&p| Core::new(p, guard.now_nanos(), None))
                .collect(),
            _ => Box::new([]),
        };
        let remote_kinds = ScopeKind::ALL
            .into_iter()
            .filter(|k| self.rules[k.index()].is_some_and(|r| r.remote))
            .fold(0, |set, k| set | decision::bit(k.index()));
        let remote = match (&self.remote, remote_kinds) {
            (Some(store), kinds) if kinds != 0 => Some(Remote {
                store: Arc::clone(&store.0),
                kinds,
            }),
            _ => None,
        };
        let shape = reconfigure::Shape::of(&self);
        let global_single = global_rule.is_none_or(|r| r.policies().len() == 1);
        let maps = KeyedMaps::build(&self.rules, &tiers, &clock, &hasher)?;
        let tables = ScopeKind::ALL.map(|k| {
            maps.get(k)
                .map_or_else(Default::default, |m| m.first_table())
        });
        let leased_epoch = global
            .as_ref()
            .and_then(|g| g.leased.as_ref())
            .map_or(0, LeasedBucket::epoch_id);
        let generations = Generations::new(policies, self.classes, |config| {
            let mut first = Generation::new(
                0,
                words,
                config,
                global_single,
                [Inherit::AsIs; ScopeKind::COUNT],
                tables,
            );
            first.leased_epoch = leased_epoch;
            first
        });
        Ok(ScopedLimiter {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            remote,
            global,
            maps,
            generations,
            clock: guard,
            shape,
            switching: std::sync::Mutex::new(()),
        })
    }

    /// Checks the rule set whole (everything [`build`](RuleSet::build) refuses) and
    /// lays out its tiers and the policies decisions are read back with.
    fn check(&self) -> Result<(PerKind<tiers::KindTiers>, PolicySet), RuleError> {
        for kind in ScopeKind::ALL {
            let Some(r) = &self.rules[kind.index()] else {
                continue;
            };
            let keyed = kind != ScopeKind::Global;
            if r.remote {
                if !keyed {
                    return Err(RuleError::RemoteGlobal);
                }
                if self.remote.is_none() {
                    return Err(RuleError::RemoteWithoutStore { kind });
                }
                if let Some(scope) = self.overrides.keys().find(|s| s.kind() == kind) {
                    return Err(RuleError::RemoteOverride { scope: *scope });
                }
            }
            if keyed && r.lease.is_some() {
                return Err(RuleError::LeasedNotGlobal { kind });
            }
            if r.policies().len() > 1 {
                if r.lease.is_some() {
                    return Err(RuleError::MultiPolicyLease);
                }
                if keyed && matches!(r.options.overflow, Overflow::Share(_)) {
                    return Err(RuleError::MultiPolicyOverflow { kind });
                }
            }
        }
        if u32::try_from(self.classes.len()).is_err() {
            return Err(RuleError::TooManyClasses);
        }
        for (i, c) in self.classes.iter().enumerate() {
            if self.classes[..i].iter().any(|o| o.name() == c.name()) {
                return Err(RuleError::DuplicateClass(c.name().to_owned()));
            }
            for kind in ScopeKind::ALL {
                let Some(rule) = &self.rules[kind.index()] else {
                    continue;
                };
                let cost = c.cost_in(kind);
                let mut capacity = rule
                    .policies()
                    .iter()
                    .map(Policy::capacity)
                    .min()
                    .unwrap_or(0);
                if let (Overflow::Share(p), true) =
                    (rule.options.overflow, kind != ScopeKind::Global)
                {
                    capacity = capacity.min(p.capacity());
                }
                if cost > capacity {
                    return Err(RuleError::CostExceedsCapacity {
                        class: c.name().to_owned(),
                        kind,
                        cost,
                        capacity,
                    });
                }
            }
        }
        let tiers = tiers::lay_out(self)?;
        let mut policies = PolicySet::default();
        for kind in ScopeKind::ALL {
            policies.tiers[kind.index()] =
                tiers[kind.index()].tiers.iter().map(|(_, p)| *p).collect();
            policies.rules[kind.index()] = self.rules[kind.index()].map(|r| KindPolicies {
                policies: r.policies,
                len: r.policies().len(),
                overflow: match r.options.overflow {
                    Overflow::Share(p) if kind != ScopeKind::Global => Some(p),
                    _ => None,
                },
                max_keys: r.options.max_keys,
            });
        }
        Ok((tiers, policies))
    }
}

impl<C: Clock, S> ScopedLimiter<C, S> {
    /// Whether the global scope's bucket is leased to per-core slots ([`Rule::leased`]).
    pub fn global_is_leased(&self) -> bool {
        self.leased().is_some()
    }

    /// Tokens the global scope's slots hold now, leased and not yet spent (zero for a
    /// global scope that is not leased): see [`LeasedBucket::leased_tokens`].
    pub fn global_leased_tokens(&self) -> u64 {
        self.leased().map_or(0, LeasedBucket::leased_tokens)
    }

    /// The leased global bucket, if the global scope is leased.
    fn leased(&self) -> Option<&LeasedBucket<C>> {
        self.global.as_ref()?.leased.as_ref()
    }

    /// The current generation: what requests are decided with now, held (pinned)
    /// until the guard is dropped.
    #[inline(always)]
    fn generation(&self) -> Pinned<'_, Generation> {
        self.generations.pin()
    }

    /// The global scope's counters, when it has a rule that keeps them.
    fn global_counters(&self) -> CounterRef<'_> {
        self.global
            .as_ref()
            .and_then(|g| g.counters.as_ref())
            .map_or(CounterRef::Off, CounterRef::Striped)
    }
}

/// The slots of each keyed kind's limits while their locks are held: `None` when the
/// request does not pay that kind.
type Held<'a, 'b, C> = PerKind<&'a KindSlots<'b, C>>;

/// A request met a global word a reconfiguration sealed: it decided and kept nothing,
/// and starts again on the new generation.
pub(super) struct Retry;

/// One of this limiter's classes, by its index in the limiter's list: what the
/// verdict's paths of one or two buckets are handed after
/// [`ScopedLimiter::try_acquire_verdict`]'s class check (one register, where a
/// [`ClassId`] takes two).
#[derive(Clone, Copy, Debug)]
pub(super) struct OwnClass(u32);

/// [`Retry`] where a request's outcome is built (no wrapper around the decision on the
/// hot path: moving a (then) 208-byte decision through a nested `Result` measured 80
/// instructions per request): the error a sealed global word gives, which no bucket of
/// a scoped limiter gives otherwise (its leased global bucket has a local pool).
const RETRY: ScopeError = ScopeError::Acquire {
    scope: Scope::Global,
    error: crate::bucket::SEALED_ERROR,
};

impl<C: Clock, S: BuildHasher> ScopedLimiter<C, S> {
    /// The class named `name`, to pass to [`try_acquire`](ScopedLimiter::try_acquire) of
    /// this limiter. A reconfiguration keeps the classes' names and order, so a class
    /// stays valid across it (with the cost the current configuration gives it).
    pub fn class(&self, name: &str) -> Option<ClassId> {
        self.generations
            .config(&self.generation())
            .classes
            .iter()
            .position(|c| c.name() == name)
            .map(|i| ClassId {
                limiter: self.id,
                index: i as u32,
            })
    }

    /// The work class behind `id` in the current configuration; `None` for a class of
    /// another limiter.
    pub fn work_class(&self, id: ClassId) -> Option<&WorkClass> {
        if id.limiter != self.id {
            return None;
        }
        self.generations
            .config(&self.generation())
            .classes
            .get(id.index as usize)
    }

    /// Takes `class`'s cost from every scope `request` pays, or from none.
    ///
    /// The scopes are the global scope (when it has a rule) and the scope of each
    /// identity the request carries whose kind has a rule; a class costing zero in a kind
    /// skips it. Each scope's counters (when on) count the request as admitted, or as
    /// rejected in the scope that refused, under the request's [`Attempt`](crate::telemetry::Attempt).
    ///
    /// Allocates nothing for keys already in their maps. A new key is inserted (the slow
    /// path); at its map's maximum it may evict full buckets of its shard, then meets the
    /// kind's [`Overflow`] policy.
    ///
    /// A request is decided wholly on one configuration: racing a
    /// [`reconfigure`](ScopedLimiter::reconfigure), it is decided with the old classes,
    /// policies and buckets, or wholly with the new.
    ///
    /// Scopes of remote kinds ([`Rule::remote`]) are paid after the local ones admitted
    /// the request, in one call to the limiter's [`RemoteScopes`] outside every lock; a
    /// request naming none never calls it. When the store refuses, every local scope is
    /// given its cost back (as [`refund`](ScopedLimiter::refund) does: a key charged to
    /// its kind's shared overflow bucket is not reached, and the local counters keep the
    /// admission they counted) and the decision is a [`Refusal::Remote`] naming the
    /// store's scope and its [`retry_after`](ScopeDecision::retry_after).
    ///
    /// # Errors
    ///
    /// [`ScopeError::UnknownClass`] for a class this limiter did not give (from another
    /// limiter, even one built from the same rules); [`ScopeError::Acquire`] for an
    /// error a scope's bucket returns (never a clock stepping back, which is time
    /// standing still); [`ScopeError::RemoteUnavailable`] when the remote
    /// store cannot decide (the local scopes given their costs back). Nothing is taken.
    pub fn try_acquire(
        &self,
        request: &Request,
        class: ClassId,
    ) -> Result<ScopeDecision<'_>, ScopeError> {
        // On a limiter with no remote store and a global scope of one bucket, a request
        // that pays the global scope alone, or keys already in their maps, is decided
        // here: without the keyed kinds' nest (whose set-up a compiler hoists above its
        // branches), its locks, and the retry loop, which a sealed word sends the
        // request to (it took nothing here). See `held` for the second. A thread's
        // first pin (which registers it) is taken on `pay_scopes`' path.
        if class.limiter == self.id && self.remote.is_none() {
            let Some(g) = self.generations.try_pin() else {
                return self.pay_scopes(request, class);
            };
            let config = self.generations.config(&g);
            if let Some(work) = config.classes.get(class.index as usize) {
                let costs = work.costs();
                if g.global_single {
                    let paid = self.maps.paid_in(request, work.charged());
                    if paid == 0 {
                        let policies = Policies::new(g.number, &config.policies);
                        let now = self.now_on(&g);
                        // A sealed global word took nothing: the request starts again
                        // on `pay_scopes`' loop.
                        return self.decide_global(
                            &g,
                            costs,
                            request,
                            now,
                            |d| global_decision(request, costs, policies, d),
                            || self.pay_scopes(request, class),
                        );
                    }
                    // Keys already in their maps, held in reader sections.
                    return self.pay_held(g, costs, request, class, paid);
                }
            }
        }
        self.pay_scopes(request, class)
    }

    /// [`try_acquire`](ScopedLimiter::try_acquire), answered as a [`ScopeVerdict`]: the same
    /// decision (the same buckets paid, the same counters), of which the caller keeps
    /// what answering the request needs: admitted or refused, the refusing kind and its
    /// wait, the tightest scope's balance. The way for a caller that reads no per-scope
    /// detail (an HTTP layer without tracing): the small value is what it moves.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](ScopedLimiter::try_acquire).
    ///
    /// A request that pays one bucket (the global scope alone, or one keyed scope and
    /// no global one, its key already in its map) is answered without building the
    /// decision: the verdict is made from that bucket's own decision where it was taken.
    ///
    /// The pin, the class's look-up and the choice of path are made where this is called
    /// (inlined into the caller): each path is one call that decides the request whole,
    /// with no frame of this function's between the caller and it.
    #[inline(always)]
    pub fn try_acquire_verdict(
        &self,
        request: &Request,
        class: ClassId,
    ) -> Result<ScopeVerdict<'_>, ScopeError> {
        // The paths of `try_acquire`, the verdict made where the decision would be.
        if class.limiter == self.id && self.remote.is_none() {
            let Some(g) = self.generations.try_pin() else {
                return self.verdict_of_scopes(request, class);
            };
            let config = self.generations.config(&g);
            if let Some(work) = config.classes.get(class.index as usize) {
                let costs = work.costs();
                if g.global_single {
                    let paid = self.maps.paid_in(request, work.charged());
                    if paid == 0 {
                        return self.verdict_global(g, costs, request, OwnClass(class.index));
                    }
                    if paid.is_power_of_two() {
                        match &self.global {
                            Some(global) if costs[ScopeKind::Global.index()] != 0 => {
                                if global.leased.is_none() {
                                    return self.pay_two_held(
                                        g,
                                        costs,
                                        request,
                                        OwnClass(class.index),
                                        paid,
                                    );
                                }
                            }
                            _ => {
                                return self.pay_one_held(
                                    g,
                                    costs,
                                    request,
                                    OwnClass(class.index),
                                    paid,
                                );
                            }
                        }
                    }
                    return self.pay_held(g, costs, request, class, paid);
                }
            }
        }
        self.verdict_of_scopes(request, class)
    }

    /// [`try_acquire_verdict`](ScopedLimiter::try_acquire_verdict) of a request that pays
    /// no keyed scope (the global scope's plain word or leased bucket, or nothing where
    /// the global scope charges nothing) on generation `g`, whose pin it ends.
    #[inline(never)]
    fn verdict_global<'s>(
        &'s self,
        g: Pinned<'_, Generation>,
        costs: &'s PerKind<u64>,
        request: &Request,
        class: OwnClass,
    ) -> Result<ScopeVerdict<'s>, ScopeError> {
        let pinned = g;
        let g: &Generation = &pinned;
        let policies = self.generations.policies(g);
        let now = self.now_on(g);
        let k = ScopeKind::Global.index();
        #[cfg(test)]
        held::GLOBAL_VERDICT.with(|c| c.set(c.get() + 1));
        self.decide_global(
            g,
            costs,
            request,
            now,
            |d| match d {
                None => ScopeVerdict::nothing(policies),
                Some((d, wait)) => ScopeVerdict::alone(policies, k, 0, costs[k], d, wait),
            },
            || self.verdict_of_scopes(request, self.class_id(class)),
        )
    }

    /// The id of `class`, one of this limiter's.
    #[inline(always)]
    fn class_id(&self, class: OwnClass) -> ClassId {
        ClassId {
            limiter: self.id,
            index: class.0,
        }
    }

    /// [`pay_scopes`](ScopedLimiter::pay_scopes), reduced to its verdict.
    #[inline(never)]
    fn verdict_of_scopes(
        &self,
        request: &Request,
        class: ClassId,
    ) -> Result<ScopeVerdict<'_>, ScopeError> {
        self.pay(request, class, &[], true).map(|d| d.verdict())
    }

    /// [`pay`](ScopedLimiter::pay) of every scope, out of line: the path of a request
    /// that pays a keyed or remote scope, or met a sealed global word.
    #[inline(never)]
    fn pay_scopes(
        &self,
        request: &Request,
        class: ClassId,
    ) -> Result<ScopeDecision<'_>, ScopeError> {
        self.pay(request, class, &[], true)
    }

    /// Pays `class`'s costs (but in the kinds of `skip`) for `request` at one reading of
    /// the clock, on one generation. With `alone_tried` (the caller found the request
    /// pays keyed scopes, or met a sealed word on the global scope alone), every
    /// request goes through the keyed kinds' nest, which decides a global-only request
    /// as [`decide_global`](ScopedLimiter::decide_global) would.
    #[inline]
    fn pay(
        &self,
        request: &Request,
        class: ClassId,
        skip: &[ScopeKind],
        alone_tried: bool,
    ) -> Result<ScopeDecision<'_>, ScopeError> {
        if class.limiter != self.id {
            return Err(ScopeError::UnknownClass(class));
        }
        let mut spins = 0u32;
        loop {
            let g = self.generation();
            let config = self.generations.config(&g);
            let Some(work) = config.classes.get(class.index as usize) else {
                return Err(ScopeError::UnknownClass(class));
            };
            let policies = Policies::new(g.number, &config.policies);
            let class_costs = work.costs();
            let skipped;
            let costs = if skip.is_empty() {
                class_costs
            } else {
                let mut c = *class_costs;
                for k in skip {
                    c[k.index()] = 0;
                }
                skipped = c;
                &skipped
            };
            let now = self.now_on(&g);
            let decision =
                if !alone_tried && g.global_single && !self.maps.pays_keyed(request, costs) {
                    self.decide_global(
                        &g,
                        costs,
                        request,
                        now,
                        |d| global_decision(request, class_costs, policies, d),
                        || Err(RETRY),
                    )
                } else {
                    // Nested in ScopeKind order: the lock order of the `ScopedLimiter` docs.
                    self.maps.with_slots(
                        &g,
                        &|| self.generations.is_current(&g),
                        request,
                        costs,
                        now,
                        |slots| {
                            // With a map's lock held the generation cannot change (a switch holds
                            // every map's barrier); with none held it may have.
                            if !self.generations.is_current(&g) {
                                return Err(RETRY);
                            }
                            self.decide(&g, slots, class_costs, costs, request, now)
                        },
                    )
                };
            if let Err(ScopeError::Acquire { error, .. }) = &decision {
                if is_sealed(error) {
                    self.generations.await_successor(&g);
                    // A leased global bucket switched before its generation is
                    // published: the request starts again until it is.
                    crate::sync::spin(&mut spins);
                    continue;
                }
            }
            // The remote kinds after the local ones, outside every lock. The result is
            // returned as it is (not unwrapped and wrapped again: a decision is a few
            // hundred bytes, each move a copy).
            if let (Some(remote), Ok(d)) = (&self.remote, &decision) {
                if d.is_admitted() {
                    return self.pay_remote(remote, *d, costs);
                }
            }
            return decision;
        }
    }

    /// The global bucket (its first limit's) of generation `g` as a payer, when it has a
    /// rule and `costs` charge it.
    #[inline]
    fn global_payer<'a>(&'a self, g: &'a Generation, costs: &PerKind<u64>) -> Option<Payer<'a, C>> {
        let global = self.global.as_ref()?;
        if costs[ScopeKind::Global.index()] == 0 {
            return None;
        }
        let counters = global
            .counters
            .as_ref()
            .map_or(CounterRef::Off, CounterRef::Striped);
        match &global.leased {
            None => GlobalWord::new(g, 0, &self.clock, counters).map(Payer::Global),
            Some(b) => Some(Payer::Leased(b, g, counters)),
        }
    }

    /// [`decide`](ScopedLimiter::decide) for a request that pays no keyed scope: one
    /// bucket is all-or-nothing by itself, so it is paid directly, without the member
    /// list, ordering and read-only first pass of a multi-bucket acquisition. The
    /// outcome is the one that acquisition gives for a set of one; a sealed global word
    /// (nothing taken) gives `on_sealed`'s.
    ///
    /// Each outcome is built in one expression where it is returned
    /// ([`ScopeDecision::alone`]), so that a caller returning it in turn writes the
    /// 240-byte decision once, in its own caller's place, and the global bucket is
    /// taken from by its kind (the payer's `match` behind a call passes the payer
    /// through memory).
    ///
    /// The outcome is given as `out` makes it (a [`ScopeDecision`], or a
    /// [`ScopeVerdict`] for [`try_acquire_verdict`](ScopedLimiter::try_acquire_verdict)):
    /// `out(None)` when the global scope charges nothing, else `out(Some((decision,
    /// retry_after)))`, `retry_after` present for a refusal.
    #[inline(always)]
    fn decide_global<R>(
        &self,
        g: &Generation,
        costs: &PerKind<u64>,
        request: &Request,
        now: u64,
        out: impl FnOnce(Option<(&Decision, Option<Duration>)>) -> R,
        on_sealed: impl FnOnce() -> Result<R, ScopeError>,
    ) -> Result<R, ScopeError> {
        let Some(payer) = self.global_payer(g, costs) else {
            return Ok(out(None));
        };
        let k = ScopeKind::Global.index();
        let cost = costs[k];
        let taken = match payer {
            Payer::Global(w) => sealed::Sealed::take_at(&w, cost, now),
            Payer::Leased(b, g, _) => b.take_exactly(g.leased_epoch, cost, now),
            Payer::Word(h) => sealed::Sealed::take_at(&h, cost, now),
        };
        match taken {
            Ok(d) if d.is_admitted() => {
                payer.counters().record(true, cost, request.attempt);
                Ok(out(Some((&d, None))))
            }
            Ok(d) => {
                payer.counters().record(false, cost, request.attempt);
                let retry_after = sealed::Sealed::wait_at(&payer, cost, now);
                Ok(out(Some((&d, Some(retry_after)))))
            }
            Err(error) if is_sealed(&error) => on_sealed(),
            Err(error) => Err(ScopeError::Acquire {
                scope: Scope::Global,
                error,
            }),
        }
    }

    /// Pays the held slots (and the global scope of generation `g`) all-or-nothing at
    /// `now` (the one reading of the request, taken before its locks: a bucket that
    /// finds it well behind reads the clock again), counts, and builds the decision.
    fn decide<'s>(
        &'s self,
        g: &Generation,
        slots: Held<'_, '_, C>,
        class_costs: &'s PerKind<u64>,
        costs: &PerKind<u64>,
        request: &Request,
        now: u64,
    ) -> Result<ScopeDecision<'s>, ScopeError> {
        let mut decision = ScopeDecision::new(request, class_costs, self.generations.policies(g));
        // The buckets paid, in kind then limit order (the order a refusal is named in),
        // each with its kind and limit at the same position of `at`: only what the
        // request pays is written.
        let mut payers = Inline::<Payer<'_, C>, MAX_PAYERS>::new();
        let mut at = Inline::<(usize, usize), MAX_PAYERS>::new();
        if let Some(p) = self.global_payer(g, costs) {
            payers.push(p);
            at.push((ScopeKind::Global.index(), 0));
            for l in 1..MAX_POLICIES_PER_RULE {
                let Some(w) = GlobalWord::new(g, l, &self.clock, CounterRef::Off) else {
                    break;
                };
                payers.push(Payer::Global(w));
                at.push((ScopeKind::Global.index(), l));
            }
        }
        for (k, &&(tier, ref limits)) in slots.iter().enumerate() {
            decision.in_tier(k, tier);
            // A kind's limits are held from the first: a `None` ends them.
            for (l, slot) in limits.iter().enumerate() {
                match *slot {
                    None => break,
                    Some(Slot::Bucket(h)) => {
                        payers.push(Payer::Word(h));
                        at.push((k, l));
                    }
                    // Only when `g` was replaced (which the caller checked): start again.
                    Some(Slot::Stale) => return Err(RETRY),
                    Some(Slot::Full { max_keys }) => {
                        // Refused before any bucket is touched.
                        debug_assert_eq!(
                            g.policies().get(k, tier).map(|p| p.max_keys),
                            Some(max_keys)
                        );
                        self.key_limit_counts(g, ScopeKind::ALL[k], costs[k], request);
                        decision.pays(k, false);
                        return Ok(decision.key_limit(k));
                    }
                }
            }
        }
        let at = at.as_slice();
        if at.is_empty() {
            return Ok(decision);
        }
        let mut members = Inline::<(&Payer<'_, C>, u64), MAX_PAYERS>::new();
        for (p, &(k, l)) in payers.as_slice().iter().zip(at) {
            members.push((p, costs[k]));
            if l == 0 {
                decision.pays(k, self.is_overflow(g, k, p));
            }
        }
        let members = members.as_slice();
        // Taken in the order listed (kind, then limit): every request of the limiter
        // lists its buckets in that one order.
        let outcome = acquire_listed_at(members, now, |i, d| {
            // A scope reports its first limit's decision when admitted.
            if at[i].1 == 0 {
                decision.decides(at[i].0, d)
            }
        });
        let attempt = request.attempt;
        match outcome {
            Ok(m) if m.is_admitted() => {
                for (&(h, cost), &(_, l)) in members.iter().zip(at) {
                    if l == 0 {
                        h.counters().record(true, cost, attempt);
                    }
                }
                Ok(decision)
            }
            Ok(m) => {
                let i = m.refused_index().unwrap_or(0);
                let refused = *m
                    .refused_decision()
                    .expect("a rejection names its decision");
                let k = at[i].0;
                let (l, refused) = self.longest_refusal(members, at, i, refused, now);
                // The kind's counters are its first limit's (listed first of its kind).
                if let Some(&(h, _)) = members
                    .iter()
                    .zip(at)
                    .find(|(_, a)| a.0 == k)
                    .map(|(m, _)| m)
                {
                    h.counters().record(false, costs[k], attempt);
                }
                // Rolled-back decisions are not the outcome: keep the refuser's.
                Ok(decision.refuse(k, l, &refused, m.retry_after().unwrap_or(Duration::ZERO)))
            }
            // A sealed global word (the members taken before it given back) gives
            // `RETRY`: the global kind's scope and the sealed error.
            Err(MultiError::Bucket { index, error }) => {
                let kind = ScopeKind::ALL[at.get(index).map_or(0, |a| a.0)];
                Err(ScopeError::Acquire {
                    scope: Scope::of(request, kind).unwrap_or(Scope::Global),
                    error,
                })
            }
            Err(e) => Err(ScopeError::Multi(e)),
        }
    }

    /// The limit of the refusing member `i`'s kind to name, and its decision: of the
    /// kind's limits that cannot pay at `now`, the one with the longest wait (the first
    /// listed among equals), so that the limit named is the one that keeps the request
    /// out longest. Reads only.
    fn longest_refusal(
        &self,
        members: &[(&Payer<'_, C>, u64)],
        at: &[(usize, usize)],
        i: usize,
        refused: Decision,
        now: u64,
    ) -> (usize, Decision) {
        let k = at[i].0;
        let mut best = (at[i].1, refused);
        if at.iter().filter(|a| a.0 == k).count() <= 1 {
            return best;
        }
        let (m, c) = members[i];
        let mut wait = sealed::Sealed::wait_at(m, c, now);
        for (&(m, c), &(kind, l)) in members.iter().zip(at) {
            if kind != k || l == best.0 {
                continue;
            }
            let w = sealed::Sealed::wait_at(m, c, now);
            if w > wait {
                if let Some(d) = sealed::Sealed::refusal_at(m, c, now) {
                    best = (l, d);
                    wait = w;
                }
            }
        }
        best
    }

    /// Whether a bucket of kind `k` is that kind's overflow bucket rather than a key's.
    /// A kind whose rule has no shared overflow bucket (its map options, which a
    /// reconfiguration keeps, say so in every generation) is not looked up.
    fn is_overflow(&self, g: &Generation, k: usize, h: &Payer<'_, C>) -> bool {
        g.policies().rules[k]
            .as_ref()
            .is_some_and(|p| p.overflow.is_some())
            && self
                .map(ScopeKind::ALL[k])
                .and_then(|m| m.overflow_id())
                .is_some_and(|id| id == h.member_id())
    }

    fn key_limit_counts(&self, g: &Generation, kind: ScopeKind, cost: u64, request: &Request) {
        if let (Some(m), Some(scope)) = (self.map(kind), Scope::of(request, kind)) {
            m.count_key_limit(g, &scope, cost, request.attempt);
        }
    }

    /// `read` of `kind`'s map on the current generation, read again when a switch
    /// replaced the generation meanwhile (its maps may have been emptied by a tier
    /// move); `None` when the kind has no map.
    fn read_keyed<R>(
        &self,
        read: impl Fn(&dyn KindMapOps, &Generation) -> R,
        kind: ScopeKind,
    ) -> Option<R> {
        let m = self.map(kind)?;
        loop {
            let g = self.generation();
            let r = read(m, &g);
            if self.generations.is_current(&g) {
                return Some(r);
            }
        }
    }

    /// The map of a keyed kind, type-erased over its key.
    fn map(&self, kind: ScopeKind) -> Option<&dyn KindMapOps> {
        self.maps.get(kind)
    }

    /// `scope`'s counters: `None` when its kind has no rule or no counters, or the key is
    /// not in its map (never used, or evicted: see
    /// [`evicted_counters`](ScopedLimiter::evicted_counters)).
    pub fn counters(&self, scope: &Scope) -> Option<CounterSnapshot> {
        match scope {
            Scope::Global => self
                .global
                .as_ref()?
                .counters
                .as_ref()
                .map(StripedCounters::snapshot),
            _ => self.read_keyed(|m, g| m.counters(g, scope), scope.kind())?,
        }
    }

    /// Calls `f` with every scope key that has counters, kind by kind (for export to a
    /// metrics system; each map is read one shard at a time).
    pub fn for_each_counters(&self, mut f: impl FnMut(Scope, CounterSnapshot)) {
        if let Some(c) = self.global.as_ref().and_then(|g| g.counters.as_ref()) {
            f(Scope::Global, c.snapshot());
        }
        for kind in ScopeKind::ALL {
            if let Some(m) = self.map(kind) {
                m.for_each_counters(&self.generation(), &mut f);
            }
        }
    }

    /// The summed counters of the keys of `kind` evicted so far (zero for the global
    /// scope, which is never evicted).
    pub fn evicted_counters(&self, kind: ScopeKind) -> CounterSnapshot {
        self.map(kind)
            .map(|m| m.evicted(&self.generation()))
            .unwrap_or_default()
    }

    /// Requests whose key of `kind` found its map full: refused with
    /// [`Refusal::KeyLimit`], or charged to the kind's overflow bucket.
    pub fn overflow_counters(&self, kind: ScopeKind) -> CounterSnapshot {
        self.map(kind)
            .map(|m| m.overflowed(&self.generation()))
            .unwrap_or_default()
    }

    /// Keys in the map of `kind` (1 for a global scope with a rule).
    pub fn len(&self, kind: ScopeKind) -> usize {
        if kind == ScopeKind::Global {
            return usize::from(self.global.is_some());
        }
        self.map(kind).map_or(0, |m| m.len(&self.generation()))
    }

    /// Tokens `scope`'s bucket of limit `limit` (the index of its policy in the rule's
    /// [`policies`](Rule::policies)) has now; `None` when its kind has no rule or the
    /// rule no such limit. Writes nothing.
    ///
    /// ```
    /// use tokengate::{ManualClock, Policy, scope::*};
    /// let limiter = RuleSet::new()
    ///     .rule(ScopeKind::Global, Rule::with_policies(vec![Policy::new(10, 1.0)?, Policy::new(4, 1.0)?])?)
    ///     .class(WorkClass::new("one", 1))
    ///     .build_with_clock(ManualClock::new())?;
    /// limiter.try_acquire(&Request::new(), limiter.class("one").unwrap())?;
    /// assert_eq!(limiter.available_in(&Scope::Global, 0), Some(9.0));
    /// assert_eq!(limiter.available_in(&Scope::Global, 1), Some(3.0));
    /// assert_eq!(limiter.available_in(&Scope::Global, 2), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn available_in(&self, scope: &Scope, limit: usize) -> Option<f64> {
        match (scope, limit) {
            (_, 0) => self.available(scope),
            (Scope::Global, l) => self.global_available(l),
            (_, l) => self.read_keyed(|m, g| m.available_in(g, scope, l), scope.kind())?,
        }
    }

    /// Tokens `scope` has now (a fresh bucket's balance for a key not in its map; its
    /// first limit's for a rule with several policies, see
    /// [`available_in`](ScopedLimiter::available_in)); `None` when its kind has no rule.
    /// Writes nothing.
    pub fn available(&self, scope: &Scope) -> Option<f64> {
        Some(match scope {
            Scope::Global => match self.leased() {
                Some(b) => b.available(),
                None => self.global_available(0)?,
            },
            _ => self.read_keyed(|m, g| m.available(g, scope), scope.kind())??,
        })
    }

    /// Tokens the plain global word of limit `limit` has now, on the current generation.
    fn global_available(&self, limit: usize) -> Option<f64> {
        loop {
            let g = self.generation();
            let core = g.words.get(limit)?;
            match core.available(&self.clock) {
                Ok(tokens) => return Some(tokens),
                Err(_) => self.generations.await_successor(&g),
            }
        }
    }

    /// The clock's reading (through the monotonic guard), after the current
    /// generation's plain global words' re-anchoring passes if one is due: one relaxed
    /// load and a predicted branch per word otherwise. See [`crate::pass`]; keyed maps
    /// and a leased global bucket run their own.
    #[inline(always)]
    pub(crate) fn now(&self) -> u64 {
        self.now_on(&self.generation())
    }

    /// [`now`](ScopedLimiter::now) running `g`'s passes (a pass on a sealed word writes
    /// nothing).
    #[inline(always)]
    fn now_on(&self, g: &Generation) -> u64 {
        let mut now = self.clock.now_nanos();
        for core in g.words.iter() {
            now = core.at(&self.clock, now);
        }
        now
    }

    /// Sweeps every keyed map ([`KeyedLimiter::sweep`](crate::KeyedLimiter::sweep)) and re-anchors the global bucket
    /// (a leased one also gets its slots' idle tokens back, as
    /// [`LeasedBucket::reclaim`] does). Never needed for correctness: the maps and the
    /// global bucket re-anchor themselves in passes about half
    /// [`max_sweep_interval`](ScopedLimiter::max_sweep_interval) apart; sweeping frees
    /// memory sooner.
    pub fn sweep(&self) -> SweepReport {
        let mut report = SweepReport::default();
        if let Some(b) = self.leased() {
            b.reclaim();
            b.reanchor();
        }
        let g = self.generation();
        for core in g.words.iter() {
            let now = self.clock.now_nanos();
            // A word sealed meanwhile is left to its switch.
            let _sealed = core
                .raw()
                .reanchor(core.policy().layout(), &self.clock, now);
        }
        for kind in ScopeKind::ALL {
            if let Some(m) = self.map(kind) {
                report += m.sweep(&g);
            }
        }
        report
    }

    /// The shortest of the maps' [`KeyedLimiter::max_sweep_interval`](crate::KeyedLimiter::max_sweep_interval)s (and the global
    /// bucket's).
    pub fn max_sweep_interval(&self) -> Duration {
        let global = self
            .global
            .is_some()
            .then(|| {
                self.generation()
                    .policies()
                    .get(ScopeKind::Global.index(), 0)
                    .map(|p| {
                        p.as_slice()
                            .iter()
                            .map(sweep_interval)
                            .fold(Duration::MAX, Duration::min)
                    })
            })
            .flatten();
        ScopeKind::ALL
            .into_iter()
            .filter_map(|k| {
                self.map(k)
                    .map(|m| m.max_sweep_interval(&self.generation()))
            })
            .chain(global)
            .min()
            .unwrap_or(Duration::MAX)
    }

    /// Whether `kind`'s rule keeps counters ([`Rule::counters`]): what
    /// [`counters`](ScopedLimiter::counters) and the exported metrics can report for it.
    pub fn counts(&self, kind: ScopeKind) -> bool {
        self.shape.counts(kind.index())
    }

    /// The clock every scope reads.
    pub fn clock(&self) -> &C {
        self.clock.get_ref()
    }

    /// The packed word of `scope`'s bucket as stored, before any refill (`None` when the
    /// scope has no rule or no bucket yet; for a leased global scope, its global word;
    /// for a rule with several policies, its first policy's word):
    /// decode it with the rule's [`Layout`](crate::state::Layout). For diagnostics, and
    /// to check that an operation wrote nothing.
    pub fn stored_word(&self, scope: &Scope) -> Option<u64> {
        match scope {
            Scope::Global => match self.leased() {
                Some(b) => Some(b.stored_word()),
                None => loop {
                    let g = self.generation();
                    let word = g.words.first()?.raw().load();
                    if word != crate::state::SEALED {
                        return Some(word);
                    }
                    self.generations.await_successor(&g);
                },
            },
            _ => self.read_keyed(|m, g| m.stored_word(g, scope), scope.kind())?,
        }
    }
}

/// The decision of a request that paid the global scope alone (`Some`: its bucket's
/// decision, and the wait of a refusal) or nothing (`None`), as
/// [`decide_global`](ScopedLimiter::decide_global) reports it.
#[inline(always)]
fn global_decision<'s>(
    request: &Request,
    costs: &'s PerKind<u64>,
    policies: Policies<'s>,
    d: Option<(&Decision, Option<Duration>)>,
) -> ScopeDecision<'s> {
    match d {
        None => ScopeDecision::new(request, costs, policies),
        Some((d, retry_after)) => ScopeDecision::alone(
            request,
            costs,
            policies,
            ScopeKind::Global.index(),
            d,
            retry_after,
        ),
    }
}
