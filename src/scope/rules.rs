//! The configuration of a scoped limiter: a rule per scope kind, and work classes.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;

use crate::ScopedLimiter;
use crate::attempt::Attempt;
use crate::clock::Clock;
use crate::inherit::Inherit;
use crate::keyed::{DEFAULT_MAX_KEYS, Eviction, KeyedConfigError, KeyedOptions, Overflow};
use crate::leased::{LeaseConfig, LeaseConfigError};
use crate::policy::Policy;
use crate::scope::decision::KindSet;
use crate::scope::kind::{
    ApiKeyId, ClientId, PerKind, RouteId, Scope, ScopeKind, TenantId, UserId,
};
use crate::scope::remote::{RemoteScopes, RemoteStore};
use crate::scope::tiers::TierDef;

/// The most policies one [`Rule`] holds ([`Rule::with_policies`]): each costs every
/// request of the kind one more bucket to pay, and every key one more map entry.
pub const MAX_POLICIES_PER_RULE: usize = 4;

/// How one scope kind is limited: the policies of each of its scopes (one bucket per
/// policy, all paid or none), and for keyed kinds the bounds of their maps.
///
/// A rule usually holds one policy ([`Rule::new`]); [`Rule::with_policies`] gives it up
/// to [`MAX_POLICIES_PER_RULE`] (say "10/s burst 20" and "100/min"): every request of
/// the kind pays each of them, in the same all-or-nothing acquisition as its other
/// scopes and at the same clock reading, and a refusal names the limit that refused
/// ([`ScopeDecision::refused_limit`](crate::scope::ScopeDecision::refused_limit)).
///
/// A keyed kind with `n` policies keeps `n` maps, one per policy, all with the rule's
/// [`KeyedOptions`] (the first one alone keeps the counters): a key then costs about `n`
/// times a single-policy key's memory (`n` entries of its key and an 8-byte word, see
/// [`KeyedLimiter`](crate::KeyedLimiter)'s memory section), plus its counters once, and
/// at most `max_keys` keys are held in each map. Such a rule cannot use
/// [`Overflow::Share`] or [`Rule::leased`]: [`RuleSet::build`] refuses them with
/// [`RuleError::MultiPolicyOverflow`] and [`RuleError::MultiPolicyLease`].
///
/// ```
/// use tokengate::{keyed::Overflow, Policy, scope::Rule};
/// let rule = Rule::new(Policy::new(100, 20.0)?)
///     .max_keys(50_000)
///     .overflow(Overflow::Share(Policy::new(100, 20.0)?))
///     .counters(true);
/// assert_eq!(rule.policy().capacity(), 100);
/// # Ok::<(), tokengate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rule {
    /// The policies; the first `len` are the rule's, the others copies of the first.
    pub(crate) policies: [Policy; MAX_POLICIES_PER_RULE],
    pub(crate) len: u8,
    pub(crate) options: KeyedOptions,
    pub(crate) lease: Option<LeaseConfig>,
    /// Whether the kind's scopes are kept in the limiter's [`RemoteScopes`].
    pub(crate) remote: bool,
    /// How the kind's buckets carry their tokens over when a running limiter takes
    /// this rule ([`ScopedLimiter::reconfigure`](crate::scope::ScopedLimiter::reconfigure)).
    pub(crate) inherit: Inherit,
}

impl Rule {
    /// Buckets of `policy`; for keyed kinds a map with [`KeyedOptions`]' defaults and at
    /// most [`DEFAULT_MAX_KEYS`] keys.
    pub fn new(policy: Policy) -> Rule {
        Rule {
            policies: [policy; MAX_POLICIES_PER_RULE],
            len: 1,
            options: KeyedOptions::new(DEFAULT_MAX_KEYS),
            lease: None,
            remote: false,
            inherit: Inherit::Proportional,
        }
    }

    /// Buckets of every policy of `policies`, all paid by each request (all or none); for
    /// keyed kinds one map per policy, each with [`KeyedOptions`]' defaults.
    ///
    /// # Errors
    ///
    /// [`RuleError::NoPolicies`] for an empty list, [`RuleError::TooManyPolicies`] for
    /// more than [`MAX_POLICIES_PER_RULE`].
    ///
    /// ```
    /// use tokengate::{Policy, scope::Rule, scope::RuleError};
    /// let rule = Rule::with_policies(vec![Policy::new(20, 10.0)?, Policy::new(100, 100.0 / 60.0)?])?;
    /// assert_eq!(rule.policies().len(), 2);
    /// assert_eq!(rule.policy().capacity(), 20); // the first
    /// assert_eq!(Rule::with_policies(vec![]).unwrap_err(), RuleError::NoPolicies);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_policies(policies: Vec<Policy>) -> Result<Rule, RuleError> {
        let Some(&first) = policies.first() else {
            return Err(RuleError::NoPolicies);
        };
        if policies.len() > MAX_POLICIES_PER_RULE {
            return Err(RuleError::TooManyPolicies {
                count: policies.len(),
                max: MAX_POLICIES_PER_RULE,
            });
        }
        let mut rule = Rule::new(first);
        rule.policies[..policies.len()].copy_from_slice(&policies);
        rule.len = policies.len() as u8;
        Ok(rule)
    }

    /// How the kind's buckets carry their tokens over when a running limiter is
    /// reconfigured to this rule ([`ScopedLimiter::reconfigure`](crate::scope::ScopedLimiter::reconfigure)):
    /// the global scope's words at the switch, every key of the kind (and of the tiers
    /// its overridden keys use) on its first touch after it. [`Inherit::Proportional`]
    /// unless set; ignored when the limiter is built.
    pub fn inherit(mut self, inherit: Inherit) -> Rule {
        self.inherit = inherit;
        self
    }

    /// The strategy set by [`inherit`](Rule::inherit).
    pub fn inheritance(&self) -> Inherit {
        self.inherit
    }

    /// Replaces the keyed map's options (ignored for the global scope but for
    /// [`counters`](KeyedOptions::counters)).
    pub fn options(mut self, options: KeyedOptions) -> Rule {
        self.options = options;
        self
    }

    /// The most keys of this kind (ignored for the global scope): see
    /// [`KeyedOptions::max_keys`].
    pub fn max_keys(mut self, max_keys: usize) -> Rule {
        self.options = self.options.max_keys(max_keys);
        self
    }

    /// Shards of this kind's map: see [`KeyedOptions::shards`].
    pub fn shards(mut self, shards: usize) -> Rule {
        self.options = self.options.shards(shards);
        self
    }

    /// What a new key of this kind gets when its map is full: see
    /// [`KeyedOptions::overflow`].
    pub fn overflow(mut self, overflow: Overflow) -> Rule {
        self.options = self.options.overflow(overflow);
        self
    }

    /// Which buckets of this kind sweeps may evict: see [`KeyedOptions::eviction`].
    pub fn eviction(mut self, eviction: Eviction) -> Rule {
        self.options = self.options.eviction(eviction);
        self
    }

    /// Whether to keep counters per key of this kind, or for the global scope (striped
    /// across cache lines): see [`KeyedOptions::counters`]; off by default.
    pub fn counters(mut self, on: bool) -> Rule {
        self.options = self.options.counters(on);
        self
    }

    /// Makes the global scope's bucket a [`LeasedBucket`](crate::LeasedBucket) with
    /// `config`: tokens leased in batches to per-core slots, so that admissions on many
    /// cores stop meeting on one cache line, with the same exact bound as the plain
    /// bucket (see [`crate::leased`]). For the global scope only, the one bucket every
    /// request pays; [`RuleSet::build`] refuses it on a keyed kind with
    /// [`RuleError::LeasedNotGlobal`], and an invalid `config` with [`RuleError::Lease`].
    ///
    /// ```
    /// use tokengate::{leased::LeaseConfig, Policy, scope::Rule, scope::RuleError, scope::RuleSet, scope::ScopeKind, scope::WorkClass};
    /// let hot = Rule::new(Policy::new(10_000, 5_000.0)?).leased(LeaseConfig::new());
    /// let limiter = RuleSet::new()
    ///     .rule(ScopeKind::Global, hot)
    ///     .class(WorkClass::new("read", 1))
    ///     .build()?;
    /// assert!(limiter.global_is_leased());
    ///
    /// let refused = RuleSet::new().rule(ScopeKind::Tenant, hot).build();
    /// assert_eq!(
    ///     refused.unwrap_err(),
    ///     RuleError::LeasedNotGlobal { kind: ScopeKind::Tenant }
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn leased(mut self, config: LeaseConfig) -> Rule {
        self.lease = Some(config);
        self
    }

    /// Keeps this keyed kind's scopes in the limiter's remote store
    /// ([`RuleSet::remote_scopes`]) instead of a local map: every request naming such a
    /// scope pays it there, after its local scopes, all or none (see [`RemoteScopes`]).
    /// The rule's policies still bound the classes' costs at build, and
    /// [`ScopedLimiter::policies`](crate::ScopedLimiter::policies) reports them; the
    /// store enforces its own. Its map options are unused.
    ///
    /// [`RuleSet::build`] refuses it on the global scope ([`RuleError::RemoteGlobal`]),
    /// for a kind with overridden keys ([`RuleError::RemoteOverride`]), and without a
    /// store ([`RuleError::RemoteWithoutStore`]).
    ///
    /// ```
    /// use tokengate::{Policy, scope::*};
    /// let set = RuleSet::new()
    ///     .rule(ScopeKind::Global, Rule::new(Policy::new(1000, 500.0)?))
    ///     .rule(ScopeKind::Tenant, Rule::new(Policy::new(100, 20.0)?).remote());
    /// assert_eq!(
    ///     set.build().unwrap_err(),
    ///     RuleError::RemoteWithoutStore { kind: ScopeKind::Tenant }
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn remote(mut self) -> Rule {
        self.remote = true;
        self
    }

    /// Whether this kind's scopes are kept in the remote store ([`Rule::remote`]).
    pub fn is_remote(&self) -> bool {
        self.remote
    }

    /// The policy of this kind's buckets: the first, for a rule with several.
    pub fn policy(&self) -> &Policy {
        &self.policies[0]
    }

    /// Every policy of the rule, in the order given (at least one).
    pub fn policies(&self) -> &[Policy] {
        &self.policies[..usize::from(self.len).clamp(1, MAX_POLICIES_PER_RULE)]
    }
}

/// A named kind of work and what it costs, in tokens, in each scope.
///
/// The seed's example: a metadata lookup costs 1, a search 3, a batch export 20. A class
/// may cost a different amount in one scope (`with_cost`); a cost of zero exempts the
/// scope (it is not consulted, and no key is created in it).
///
/// ```
/// use tokengate::{scope::ScopeKind, scope::WorkClass};
/// let export = WorkClass::new("export", 20).with_cost(ScopeKind::Global, 5);
/// assert_eq!(export.cost_in(ScopeKind::Tenant), 20);
/// assert_eq!(export.cost_in(ScopeKind::Global), 5);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkClass {
    name: String,
    costs: PerKind<u64>,
    /// The kinds whose cost is not zero (kept with `costs`).
    charged: KindSet,
}

impl WorkClass {
    /// A class costing `cost` tokens in every scope.
    pub fn new(name: impl Into<String>, cost: u64) -> WorkClass {
        let costs = [cost; ScopeKind::COUNT];
        WorkClass {
            name: name.into(),
            costs,
            charged: charged(&costs),
        }
    }

    /// The same class costing `cost` in scopes of `kind`.
    pub fn with_cost(mut self, kind: ScopeKind, cost: u64) -> WorkClass {
        self.costs[kind.index()] = cost;
        self.charged = charged(&self.costs);
        self
    }

    /// The class's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its cost in scopes of `kind`, in tokens.
    pub fn cost_in(&self, kind: ScopeKind) -> u64 {
        self.costs[kind.index()]
    }

    pub(crate) fn costs(&self) -> &PerKind<u64> {
        &self.costs
    }

    /// The kinds the class costs something in.
    #[inline]
    pub(crate) fn charged(&self) -> KindSet {
        self.charged
    }
}

/// The kinds whose cost in `costs` is not zero.
#[inline]
pub(crate) fn charged(costs: &PerKind<u64>) -> KindSet {
    costs
        .iter()
        .enumerate()
        .fold(0, |set, (k, &c)| set | (KindSet::from(c > 0) << k))
}

/// A work class of one [`ScopedLimiter`](crate::ScopedLimiter), found by name once
/// ([`ScopedLimiter::class`](crate::ScopedLimiter::class)) and passed on every request.
///
/// It names the limiter that gave it: passed to any other limiter, even one built from
/// the same rules, it is refused with [`ScopeError::UnknownClass`](crate::scope::ScopeError)
/// rather than read as whichever class sits at the same position there.
///
/// ```
/// use tokengate::Policy;
/// use tokengate::scope::*;
/// let rules = || RuleSet::new()
///     .rule(ScopeKind::Global, Rule::new(Policy::new(10, 1.0).unwrap()))
///     .class(WorkClass::new("search", 3));
/// let (a, b) = (rules().build()?, rules().build()?);
/// let search = a.class("search").unwrap();
/// assert!(a.try_acquire(&Request::new(), search)?.is_admitted());
/// assert_eq!(
///     b.try_acquire(&Request::new(), search).unwrap_err(),
///     ScopeError::UnknownClass(search)
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClassId {
    /// The identity of the limiter that gave it (unique in the process).
    pub(crate) limiter: u64,
    /// The class's position in that limiter's list.
    pub(crate) index: u32,
}

/// Who is asking: each identity is optional, and the request pays the scope of every
/// identity it carries whose kind has a rule (the global scope always, when it has one;
/// `tenant_route` when both tenant and route are given).
///
/// ```
/// use tokengate::{telemetry::Attempt, scope::Request, scope::RouteId, scope::TenantId};
/// let request = Request::new().tenant(TenantId(42)).route(RouteId(3));
/// assert_eq!(request.tenant, Some(TenantId(42)));
/// assert!(request.user.is_none());
/// let retry = request.attempt(Attempt::Retry(1));
/// assert!(retry.attempt.is_retry());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Request {
    /// The tenant, if known.
    pub tenant: Option<TenantId>,
    /// The user, if known.
    pub user: Option<UserId>,
    /// The API key, if any.
    pub api_key: Option<ApiKeyId>,
    /// The client address (its keyed hash), if known.
    pub client: Option<ClientId>,
    /// The route, if known.
    pub route: Option<RouteId>,
    /// Original attempt or retry (counted apart in telemetry).
    pub attempt: Attempt,
}

impl Request {
    /// A request with no identity: it pays only the global scope.
    pub fn new() -> Request {
        Request::default()
    }

    /// With a tenant.
    pub fn tenant(mut self, id: TenantId) -> Request {
        self.tenant = Some(id);
        self
    }

    /// With a user.
    pub fn user(mut self, id: UserId) -> Request {
        self.user = Some(id);
        self
    }

    /// With an API key.
    pub fn api_key(mut self, id: ApiKeyId) -> Request {
        self.api_key = Some(id);
        self
    }

    /// With a client address (its keyed hash: see [`ClientId`]).
    pub fn client(mut self, id: ClientId) -> Request {
        self.client = Some(id);
        self
    }

    /// With a route.
    pub fn route(mut self, id: RouteId) -> Request {
        self.route = Some(id);
        self
    }

    /// Marked as `attempt` (original by default).
    pub fn attempt(mut self, attempt: Attempt) -> Request {
        self.attempt = attempt;
        self
    }
}

/// A rule per scope kind and the work classes: the configuration of a
/// [`ScopedLimiter`](crate::ScopedLimiter).
///
/// ```
/// use tokengate::{ManualClock, Policy, scope::Rule, scope::RuleSet, scope::ScopeKind, scope::WorkClass};
/// let limiter = RuleSet::new()
///     .rule(ScopeKind::Global, Rule::new(Policy::new(10_000, 5_000.0)?))
///     .rule(ScopeKind::Tenant, Rule::new(Policy::new(100, 20.0)?))
///     .class(WorkClass::new("metadata", 1))
///     .class(WorkClass::new("export", 20))
///     .build_with_clock(ManualClock::new())?;
/// assert!(limiter.class("export").is_some());
/// assert!(limiter.class("delete").is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A rule set given no class has one implicit class, [`RuleSet::IMPLICIT_CLASS`] (`"default"`),
/// costing 1 in every scope, so that a plain limit needs no class at all; the first
/// [`class`](RuleSet::class) added replaces it:
///
/// ```
/// use tokengate::{Policy, scope::Request, scope::Rule, scope::RuleSet, scope::ScopeKind};
/// let limiter = RuleSet::new()
///     .rule(ScopeKind::Global, Rule::new(Policy::new(2, 1.0)?))
///     .build()?;
/// let one = limiter.sole_class().expect("the implicit class");
/// assert_eq!(limiter.class("default"), Some(one));
/// assert!(limiter.try_acquire(&Request::new(), one)?.is_admitted());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct RuleSet {
    pub(crate) rules: PerKind<Option<Rule>>,
    pub(crate) classes: Vec<WorkClass>,
    /// `classes` holds the implicit class only (no class was added).
    implicit_class: bool,
    pub(crate) tiers: Vec<TierDef>,
    pub(crate) overrides: BTreeMap<Scope, String>,
    pub(crate) remote: Option<RemoteStore>,
}

impl Default for RuleSet {
    fn default() -> RuleSet {
        RuleSet {
            rules: Default::default(),
            classes: vec![WorkClass::new(RuleSet::IMPLICIT_CLASS, 1)],
            implicit_class: true,
            tiers: Vec::new(),
            overrides: BTreeMap::new(),
            remote: None,
        }
    }
}

impl<C: Clock, S: BuildHasher> ScopedLimiter<C, S> {
    /// The limiter's class when it has exactly one (the [implicit class](RuleSet::IMPLICIT_CLASS)
    /// of a rule set given none, or the one it was given), `None` when it has several:
    /// what a caller uses when nothing names a class.
    pub fn sole_class(&self) -> Option<ClassId> {
        let classes = self.generation().classes().len();
        (classes == 1).then_some(ClassId {
            limiter: self.id,
            index: 0,
        })
    }
}

impl RuleSet {
    /// The name of the class a rule set has when none is added: it costs 1 in every
    /// scope.
    pub const IMPLICIT_CLASS: &'static str = "default";

    /// No rules, and the [implicit class](RuleSet::IMPLICIT_CLASS) only.
    pub fn new() -> RuleSet {
        RuleSet::default()
    }

    /// Limits scopes of `kind` by `rule` (replacing an earlier rule for it).
    pub fn rule(mut self, kind: ScopeKind, rule: Rule) -> RuleSet {
        self.rules[kind.index()] = Some(rule);
        self
    }

    /// Adds a work class (the first one added replaces the
    /// [implicit class](RuleSet::IMPLICIT_CLASS)).
    pub fn class(mut self, class: WorkClass) -> RuleSet {
        if std::mem::take(&mut self.implicit_class) {
            self.classes.clear();
        }
        self.classes.push(class);
        self
    }

    /// Gives the limiter `store` for the kinds whose rule is [`remote`](Rule::remote)
    /// (replacing an earlier one). Unused when no rule is remote.
    pub fn remote_scopes(mut self, store: Arc<dyn RemoteScopes>) -> RuleSet {
        self.remote = Some(RemoteStore(store));
        self
    }

    /// Defines the tier `name`: `policies` (one to [`MAX_POLICIES_PER_RULE`], all paid
    /// or none, as a rule's) that the keys given it by
    /// [`override_key`](RuleSet::override_key) get instead of their rule's. Replaces an
    /// earlier tier of the same name.
    ///
    /// A tier holds policies only: its keys live in maps of their own, bounded by the
    /// number of keys overridden to it (they never overflow, and lease nothing), with
    /// the map options of their kind's rule otherwise (but no more shards than keys). [`build`](RuleSet::build) checks
    /// the policy count ([`RuleError::TierPolicies`]), at most [`MAX_TIERS`](crate::scope::MAX_TIERS) tiers, and
    /// that every class fits the buckets of each tier its kinds use
    /// ([`RuleError::TierCostExceedsCapacity`]).
    ///
    /// ```
    /// use tokengate::{ManualClock, Policy, scope::*};
    /// let limiter = RuleSet::new()
    ///     .rule(ScopeKind::Tenant, Rule::new(Policy::new(10, 1.0)?))
    ///     .tier("gold", vec![Policy::new(100, 10.0)?])
    ///     .override_key(Scope::Tenant(TenantId(42)), "gold")
    ///     .class(WorkClass::new("one", 1))
    ///     .build_with_clock(ManualClock::new())?;
    /// assert_eq!(limiter.policies_for(&Scope::Tenant(TenantId(42))).unwrap()[0].capacity(), 100);
    /// assert_eq!(limiter.policies_for(&Scope::Tenant(TenantId(7))).unwrap()[0].capacity(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tier(mut self, name: impl Into<String>, policies: Vec<Policy>) -> RuleSet {
        let name = name.into();
        match self.tiers.iter_mut().find(|t| t.name == name) {
            Some(t) => t.policies = policies,
            None => self.tiers.push(TierDef { name, policies }),
        }
        self
    }

    /// Gives the key `scope` the tier named `tier` ([`tier`](RuleSet::tier)): its
    /// requests pay the tier's buckets instead of its rule's, all or none with the
    /// request's other scopes, and a refusal names `scope` and the limit of the tier
    /// that refused. Replaces an earlier override of the same key.
    ///
    /// A running limiter takes a new table with
    /// [`ScopedLimiter::reconfigure`](crate::scope::ScopedLimiter::reconfigure): a key
    /// whose tier changes carries its tokens to its new tier's buckets with its kind's
    /// strategy. [`build`](RuleSet::build) refuses an
    /// unknown tier ([`RuleError::UnknownTier`]), a key of the global scope
    /// ([`RuleError::OverrideOnGlobal`]) or of a kind without a rule
    /// ([`RuleError::OverrideWithoutRule`]), and more than [`MAX_OVERRIDES`](crate::scope::MAX_OVERRIDES) keys
    /// ([`RuleError::TooManyOverrides`]).
    ///
    /// ```
    /// use tokengate::{Policy, scope::*};
    /// let set = RuleSet::new()
    ///     .rule(ScopeKind::Tenant, Rule::new(Policy::new(10, 1.0)?))
    ///     .override_key(Scope::Tenant(TenantId(42)), "gold");
    /// assert_eq!(
    ///     set.build().unwrap_err(),
    ///     RuleError::UnknownTier { scope: Scope::Tenant(TenantId(42)), tier: "gold".into() }
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn override_key(mut self, scope: Scope, tier: impl Into<String>) -> RuleSet {
        self.overrides.insert(scope, tier.into());
        self
    }
}

/// Why a rule set cannot be built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RuleError {
    /// A keyed kind's map configuration is invalid.
    Keyed {
        /// The kind whose rule is invalid.
        kind: ScopeKind,
        /// What is wrong with it.
        error: KeyedConfigError,
    },
    /// A class costs more in a scope than the scope's buckets (or its overflow bucket)
    /// can hold: it could never be admitted.
    CostExceedsCapacity {
        /// The class.
        class: String,
        /// The scope kind.
        kind: ScopeKind,
        /// The class's cost there, in tokens.
        cost: u64,
        /// The capacity of the kind's buckets, in tokens.
        capacity: u64,
    },
    /// Two classes have the same name.
    DuplicateClass(String),
    /// More than 2^32 classes.
    TooManyClasses,
    /// [`Rule::leased`] on a keyed kind: only the global scope's bucket can be leased.
    LeasedNotGlobal {
        /// The keyed kind whose rule asked for leasing.
        kind: ScopeKind,
    },
    /// The global rule's [`LeaseConfig`] is invalid for its policy.
    Lease(LeaseConfigError),
    /// [`Rule::with_policies`] with no policy.
    NoPolicies,
    /// [`Rule::with_policies`] with more than [`MAX_POLICIES_PER_RULE`] policies.
    TooManyPolicies {
        /// The number given.
        count: usize,
        /// The most a rule holds.
        max: usize,
    },
    /// [`Rule::leased`] on a rule with several policies: a leased bucket holds one
    /// policy, and leasing only one of them would let the others' buckets meet on one
    /// cache line anyway (or, leasing none, silently ignore the setting).
    MultiPolicyLease,
    /// [`Overflow::Share`] on a keyed rule with several policies: the overflow bucket
    /// holds one policy, and a key charged to it would skip the rule's other limits.
    MultiPolicyOverflow {
        /// The keyed kind whose rule asked for it.
        kind: ScopeKind,
    },
    /// More than [`MAX_TIERS`](crate::scope::MAX_TIERS) tiers ([`RuleSet::tier`]).
    TooManyTiers {
        /// The number given.
        count: usize,
        /// The most a rule set holds.
        max: usize,
    },
    /// A tier with no policy, or more than [`MAX_POLICIES_PER_RULE`].
    TierPolicies {
        /// The tier.
        tier: String,
        /// Its number of policies.
        count: usize,
        /// The most a tier holds.
        max: usize,
    },
    /// More than [`MAX_OVERRIDES`](crate::scope::MAX_OVERRIDES) overridden keys ([`RuleSet::override_key`]).
    TooManyOverrides {
        /// The number given.
        count: usize,
        /// The most a rule set holds.
        max: usize,
    },
    /// An override of the global scope, which has no keys: change its rule instead.
    OverrideOnGlobal,
    /// An override of a key whose kind has no rule.
    OverrideWithoutRule {
        /// The key.
        scope: Scope,
    },
    /// An override naming a tier that is not defined.
    UnknownTier {
        /// The key.
        scope: Scope,
        /// The tier it names.
        tier: String,
    },
    /// A class costs more in a scope kind than the buckets of a tier given to keys of
    /// that kind can hold: an overridden key could never be admitted.
    TierCostExceedsCapacity {
        /// The class.
        class: String,
        /// The tier.
        tier: String,
        /// The scope kind.
        kind: ScopeKind,
        /// The class's cost there, in tokens.
        cost: u64,
        /// The smallest capacity among the tier's policies, in tokens.
        capacity: u64,
    },
    /// [`Rule::remote`] on the global scope: it is paid by every request, and stays
    /// local (plain or [`leased`](Rule::leased)).
    RemoteGlobal,
    /// A kind's rule is [`remote`](Rule::remote) but the rule set has no store
    /// ([`RuleSet::remote_scopes`], [`RuleSet::build_with_remote`]).
    RemoteWithoutStore {
        /// The first remote kind.
        kind: ScopeKind,
    },
    /// An override of a key whose kind is [`remote`](Rule::remote): tiers are local
    /// buckets, and the store holds the kind's keys.
    RemoteOverride {
        /// The key.
        scope: Scope,
    },
    /// [`ScopedLimiter::reconfigure`](crate::scope::ScopedLimiter::reconfigure) with a
    /// rule set of another shape than the running limiter's: only policies (of rules
    /// and tiers) and class costs change in place; the rest takes a new limiter.
    Reshape(Reshape),
}

/// What a reconfiguration may not change in a running
/// [`ScopedLimiter`](crate::scope::ScopedLimiter): the limiter's structure (which maps
/// exist, how each is bounded, which keys are overridden), as opposed to the policies
/// and costs it enforces.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reshape {
    /// A kind gains or loses its rule.
    Kinds {
        /// The kind.
        kind: ScopeKind,
    },
    /// A rule's number of policies changes (each has its own buckets).
    PolicyCount {
        /// The kind.
        kind: ScopeKind,
        /// Its policies now.
        was: usize,
        /// In the new rule.
        now: usize,
    },
    /// A keyed rule's map options change (key bound, shards, overflow, eviction,
    /// counters).
    Options {
        /// The kind.
        kind: ScopeKind,
    },
    /// The global rule's leasing changes: on or off, or its lease configuration.
    Lease,
    /// A kind becomes remote or local.
    Remote {
        /// The kind.
        kind: ScopeKind,
    },
    /// The policies of a remote kind change: its buckets live in the remote store,
    /// which holds its own policies.
    RemotePolicies {
        /// The kind.
        kind: ScopeKind,
    },
    /// The work classes change other than in their costs: names, order or number.
    Classes,
    /// Keys leaving their tiers for their kind's rule do not fit the rule's map: it
    /// holds its `max_keys`, and the reconfiguration would move in more keys than it
    /// has room for (less the keys it moves out to tiers). Sweep the limiter, raise the
    /// rule's `max_keys` (a new limiter), or move fewer keys at once.
    TierRoom {
        /// The kind.
        kind: ScopeKind,
        /// Keys that would move into the rule's map (each counted once, in each of its
        /// policies' maps).
        keys: usize,
        /// Room the map has for them.
        room: usize,
    },
}

impl fmt::Display for Reshape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reshape::Kinds { kind } => write!(f, "the rule for {kind} scopes is added or removed"),
            Reshape::PolicyCount { kind, was, now } => write!(
                f,
                "the rule for {kind} scopes has {now} policies instead of {was}"
            ),
            Reshape::Options { kind } => write!(
                f,
                "the map options of {kind} scopes change (max keys, shards, overflow, eviction \
                 or counters)"
            ),
            Reshape::Lease => f.write_str("the global scope's leasing changes"),
            Reshape::Remote { kind } => {
                write!(
                    f,
                    "{kind} scopes move between the remote store and this process"
                )
            }
            Reshape::RemotePolicies { kind } => write!(
                f,
                "the policies of remote {kind} scopes change: change them in the remote store"
            ),
            Reshape::Classes => f.write_str(
                "the work classes change other than in their costs (names, order or number)",
            ),
            Reshape::TierRoom { kind, keys, room } => write!(
                f,
                "{keys} {kind} keys would leave their tiers for the rule's map, which has room \
                 for {room}"
            ),
        }
    }
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleError::Keyed { kind, error } => write!(f, "rule for {kind} scopes: {error}"),
            RuleError::CostExceedsCapacity {
                class,
                kind,
                cost,
                capacity,
            } => write!(
                f,
                "class {class:?} costs {cost} tokens in {kind} scopes, above their bucket \
                 capacity of {capacity}: it could never be admitted"
            ),
            RuleError::DuplicateClass(name) => write!(f, "class {name:?} is defined twice"),
            RuleError::TooManyClasses => f.write_str("at most 2^32 classes"),
            RuleError::LeasedNotGlobal { kind } => write!(
                f,
                "rule for {kind} scopes asks for leasing: only the global scope's bucket \
                 can be leased"
            ),
            RuleError::Lease(error) => write!(f, "rule for global scopes: {error}"),
            RuleError::NoPolicies => f.write_str("a rule needs at least one policy, got none"),
            RuleError::TooManyPolicies { count, max } => {
                write!(f, "a rule holds at most {max} policies, got {count}")
            }
            RuleError::MultiPolicyLease => f.write_str(
                "rule for global scopes asks for leasing with several policies: only a \
                 single-policy global rule can be leased",
            ),
            RuleError::MultiPolicyOverflow { kind } => write!(
                f,
                "rule for {kind} scopes has several policies and a shared overflow bucket: \
                 overflow must be Reject for a rule with several policies"
            ),
            RuleError::TooManyTiers { count, max } => {
                write!(f, "a rule set holds at most {max} tiers, got {count}")
            }
            RuleError::TierPolicies { tier, count, max } => write!(
                f,
                "tier {tier:?} holds {count} policies: a tier holds 1 to {max}"
            ),
            RuleError::TooManyOverrides { count, max } => {
                write!(f, "a rule set holds at most {max} overrides, got {count}")
            }
            RuleError::OverrideOnGlobal => {
                f.write_str("the global scope has no keys to override: change its rule instead")
            }
            RuleError::OverrideWithoutRule { scope } => write!(
                f,
                "override of {scope}, whose kind has no rule: add a rule for {} scopes first",
                scope.kind()
            ),
            RuleError::UnknownTier { scope, tier } => {
                write!(
                    f,
                    "override of {scope} names tier {tier:?}, which is not defined"
                )
            }
            RuleError::TierCostExceedsCapacity {
                class,
                tier,
                kind,
                cost,
                capacity,
            } => write!(
                f,
                "class {class:?} costs {cost} tokens in {kind} scopes, above the capacity \
                 of tier {tier:?}, {capacity}: an overridden key could never be admitted"
            ),
            RuleError::RemoteGlobal => f.write_str(
                "rule for global scopes asks to be remote: the global scope stays local \
                 (plain or leased); only keyed kinds can be remote",
            ),
            RuleError::RemoteWithoutStore { kind } => write!(
                f,
                "rule for {kind} scopes is remote but no remote store was given: pass one \
                 with RuleSet::remote_scopes or build_with_remote"
            ),
            RuleError::RemoteOverride { scope } => write!(
                f,
                "override of {scope}, whose kind is remote: tiers are local, so a remote \
                 kind's keys cannot be overridden"
            ),
            RuleError::Reshape(what) => write!(
                f,
                "cannot reconfigure the running limiter in place: {what}; build a new one"
            ),
        }
    }
}

impl std::error::Error for RuleError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RuleError::Keyed { error, .. } => Some(error),
            RuleError::Lease(error) => Some(error),
            _ => None,
        }
    }
}
