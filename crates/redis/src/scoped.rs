//! [`RedisScopeKinds`]: a [`ScopedLimiter`](tokengate::ScopedLimiter)'s remote keyed
//! kinds ([`Rule::remote`](tokengate::scope::Rule::remote)) kept in Redis by a
//! [`RedisScopes`], so that every instance's limiter shares them while its global scope
//! and its other kinds stay local.

use std::time::Duration;

use tokengate::scope::{RemoteRefusal, RemoteScopes, Scope, ScopeKind, TenantId};

use crate::error::PoolError;
use crate::policy::RemotePolicy;
use crate::strict::{InvalidRequest, RedisScopes, StrictAdmitted, StrictRefused, StrictScope};
use crate::strict_core::StrictCore;

/// The hash tag of a call that names no tenant, unless
/// [`with_tag`](RedisScopeKinds::with_tag) says otherwise.
const DEFAULT_TAG: &str = "scopes";

/// A [`RedisScopes`] as the [`RemoteScopes`] of a scoped limiter: each remote
/// [`ScopeKind`] is a [`StrictScope`] named after the kind (`tenant`, `user`, ...) and each
/// of its scopes a key of it named as the scope prints (`tenant:42`); a request's remote
/// scopes are taken in one strict script call, all or none.
///
/// One call's keys share one hash tag, so Redis Cluster keeps them in one slot and the
/// all-or-nothing script never answers `CROSSSLOT`. The tag is the request's partition:
/// its tenant (`tenant:42`, from a [`Scope::Tenant`] or [`Scope::TenantRoute`] among its
/// remote scopes: keep the tenant kind remote to partition),
/// so different tenants land in different slots and a cluster spreads them over its
/// primaries; a request that names no tenant uses the fixed tag
/// ([`with_tag`](RedisScopeKinds::with_tag), `scopes` by default). The scopes a request
/// names beside its tenant (a user, an API key, a route) are therefore budgets *within*
/// that tenant: a user seen with two tenants has one budget in each. Where that is not
/// wanted (users shared across tenants), [`unpartitioned`](RedisScopeKinds::unpartitioned)
/// puts every key under the fixed tag, in one slot.
///
/// Refusals map as follows: [`StrictRefused::Rejected`] names its scope;
/// [`StrictRefused::Unavailable`] (Redis unreachable under
/// [`FailMode::FailClosed`](crate::FailMode::FailClosed)) is
/// [`RemoteRefusal::Unavailable`]; a scope of a kind not declared here, or a cost above its
/// [`RemotePolicy`]'s capacity, is refused with [`Duration::MAX`] (no wait cures it).
/// Fail-open and local-bucket admissions are admissions.
///
/// ```no_run
/// use std::sync::Arc;
/// use tokengate::{Policy, leased::LeaseConfig, scope::*};
/// use tokengate_redis::{PoolConfig, RedisScopeKinds, RedisScopes, RemotePolicy};
/// let redis = RedisScopes::connect(PoolConfig::new("redis://127.0.0.1:6379/", "api"))?;
/// let store = RedisScopeKinds::new(redis).kind(ScopeKind::Tenant, RemotePolicy::new(1000, 100.0)?)?;
/// let limiter = RuleSet::new()
///     .rule(ScopeKind::Global, Rule::new(Policy::new(10_000, 5_000.0)?).leased(LeaseConfig::new()))
///     .rule(ScopeKind::Tenant, Rule::new(Policy::new(1000, 100.0)?).remote())
///     .rule(ScopeKind::User, Rule::new(Policy::new(20, 2.0)?))
///     .class(WorkClass::new("search", 1))
///     .build_with_remote(Arc::new(store))?;
/// let search = limiter.class("search").unwrap();
/// let d = limiter.try_acquire(&Request::new().tenant(TenantId(42)).user(UserId(7)), search)?;
/// println!("{d:?}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct RedisScopeKinds {
    scopes: RedisScopes,
    kinds: Kinds,
}

/// The kinds kept in Redis and the hash tag of each call (its tenant, or the fixed tag):
/// shared by [`RedisScopeKinds`] and [`AsyncRedisScopeKinds`](crate::AsyncRedisScopeKinds).
#[derive(Debug)]
pub(crate) struct Kinds {
    kinds: Vec<(ScopeKind, StrictScope)>,
    /// The tag of a call that names no tenant (of every call when not `by_tenant`).
    tag: String,
    by_tenant: bool,
}

impl Default for Kinds {
    fn default() -> Self {
        Self {
            kinds: Vec::new(),
            tag: DEFAULT_TAG.to_owned(),
            by_tenant: true,
        }
    }
}

impl Kinds {
    /// Keeps `kind` in Redis as `scope` (replacing an earlier one).
    pub(crate) fn keep(&mut self, kind: ScopeKind, policy: RemotePolicy) -> Result<(), PoolError> {
        if kind == ScopeKind::Global {
            return Err(PoolError::Scope(
                "the global scope stays local: only keyed kinds are kept in Redis".to_owned(),
            ));
        }
        let scope = StrictCore::scope(kind.name(), policy)?;
        self.kinds.retain(|(k, _)| *k != kind);
        self.kinds.push((kind, scope));
        Ok(())
    }

    /// Every call under the fixed tag, whatever tenant it names.
    pub(crate) fn unpartition(&mut self) {
        self.by_tenant = false;
    }

    /// The hash tag of a call naming `scopes`: `tenant:<id>` of the first tenant named,
    /// else the fixed tag.
    pub(crate) fn tag_of<'a>(&self, scopes: impl IntoIterator<Item = &'a Scope>) -> String {
        let tenant = |s: &Scope| match *s {
            Scope::Tenant(t) | Scope::TenantRoute(t, _) => Some(t),
            _ => None,
        };
        match scopes
            .into_iter()
            .find_map(tenant)
            .filter(|_| self.by_tenant)
        {
            Some(TenantId(t)) => format!("tenant:{t}"),
            None => self.tag.clone(),
        }
    }

    /// The hash tag of a call taking `items`.
    pub(crate) fn tag_of_items(&self, items: &[(Scope, u64)]) -> String {
        self.tag_of(items.iter().map(|(s, _)| s))
    }

    /// Sets the fixed hash tag.
    pub(crate) fn set_tag(&mut self, tag: &str) -> Result<(), PoolError> {
        if tag.is_empty() || tag.contains(['{', '}']) {
            return Err(PoolError::Scope(
                InvalidRequest::Tag(tag.to_owned()).to_string(),
            ));
        }
        self.tag = tag.to_owned();
        Ok(())
    }

    /// The strict scope keeping `kind`, if it is kept here.
    pub(crate) fn strict_scope(&self, kind: ScopeKind) -> Option<&StrictScope> {
        self.kinds.iter().find(|(k, _)| *k == kind).map(|(_, s)| s)
    }

    /// `items` as strict items (their keys are the scopes as they print), or the refusal
    /// of the first scope whose kind is not kept here.
    pub(crate) fn strict_items(
        &self,
        items: &[(Scope, u64)],
    ) -> Result<Vec<(&StrictScope, String, u64)>, RemoteRefusal> {
        items
            .iter()
            .map(|(scope, cost)| match self.strict_scope(scope.kind()) {
                Some(strict) => Ok((strict, scope.to_string(), *cost)),
                None => Err(never(*scope)),
            })
            .collect()
    }

    /// The items of kinds kept here (a give-back skips the others: never taken).
    pub(crate) fn kept_items(&self, items: &[(Scope, u64)]) -> Vec<(&StrictScope, String, u64)> {
        items
            .iter()
            .filter_map(|(scope, cost)| {
                Some((self.strict_scope(scope.kind())?, scope.to_string(), *cost))
            })
            .collect()
    }
}

/// Borrowed strict items.
pub(crate) fn borrowed<'a>(
    owned: &'a [(&'a StrictScope, String, u64)],
) -> Vec<(&'a StrictScope, &'a str, u64)> {
    owned.iter().map(|(s, k, c)| (*s, k.as_str(), *c)).collect()
}

/// A strict decision as the answer of [`RemoteScopes::take`] for `items` (not empty).
pub(crate) fn remote_answer(
    decided: Result<StrictAdmitted, StrictRefused>,
    items: &[(Scope, u64)],
) -> Result<(), RemoteRefusal> {
    let first = items.first().map_or(Scope::Global, |&(s, _)| s);
    let scope_at = |index: usize| items.get(index).map_or(first, |&(s, _)| s);
    match decided {
        Ok(_) => Ok(()),
        Err(StrictRefused::Rejected { index, retry_after }) => Err(RemoteRefusal::Refused {
            scope: scope_at(index),
            retry_after,
        }),
        Err(StrictRefused::Unavailable { retry_after }) => {
            Err(RemoteRefusal::Unavailable { retry_after })
        }
        Err(StrictRefused::Invalid(
            InvalidRequest::Key { index } | InvalidRequest::Cost { index, .. },
        )) => Err(never(scope_at(index))),
        Err(StrictRefused::Invalid(_)) => Err(never(first)),
    }
}

impl RedisScopeKinds {
    /// No kinds yet, on `scopes`, partitioned by tenant, with the fixed hash tag `scopes`
    /// for requests that name no tenant.
    pub fn new(scopes: RedisScopes) -> Self {
        Self {
            scopes,
            kinds: Kinds::default(),
        }
    }

    /// Every call under the fixed tag, whatever tenant it names: one budget per scope
    /// across tenants, all in one cluster slot.
    #[must_use]
    pub fn unpartitioned(mut self) -> Self {
        self.kinds.unpartition();
        self
    }

    /// Keeps the scopes of `kind` in Redis, each key under `policy` (replacing an earlier
    /// policy for it). Give it the policy of the kind's rule: the rule bounds the
    /// classes' costs at build, Redis enforces this one.
    ///
    /// # Errors
    ///
    /// [`PoolError::Scope`] for [`ScopeKind::Global`], which stays local.
    pub fn kind(mut self, kind: ScopeKind, policy: RemotePolicy) -> Result<Self, PoolError> {
        self.kinds.keep(kind, policy)?;
        Ok(self)
    }

    /// Uses `tag` as the hash tag (`tg:{namespace:tag}:s:...`) of every call that names no
    /// tenant (of every call, when [`unpartitioned`](Self::unpartitioned)).
    ///
    /// # Errors
    ///
    /// [`PoolError::Scope`] when `tag` is empty or holds `{` or `}`.
    pub fn with_tag(mut self, tag: &str) -> Result<Self, PoolError> {
        self.kinds.set_tag(tag)?;
        Ok(self)
    }

    /// The Redis client.
    pub fn scopes(&self) -> &RedisScopes {
        &self.scopes
    }

    /// The strict scope keeping `kind`, if it is kept here.
    pub fn strict_scope(&self, kind: ScopeKind) -> Option<&StrictScope> {
        self.kinds.strict_scope(kind)
    }

    /// The Redis key of `scope`'s bucket in a request naming it alone, if its kind is
    /// kept here ([`key_in`](Self::key_in) for a request naming more).
    pub fn key(&self, scope: &Scope) -> Option<String> {
        self.key_in(std::slice::from_ref(scope), scope)
    }

    /// The Redis key of `scope`'s bucket in a request naming `request` (its partition is
    /// the tenant `request` names), if its kind is kept here.
    pub fn key_in(&self, request: &[Scope], scope: &Scope) -> Option<String> {
        let strict = self.strict_scope(scope.kind())?;
        Some(
            self.scopes
                .key(&self.kinds.tag_of(request), strict, &scope.to_string()),
        )
    }
}

/// A refusal no wait cures.
pub(crate) fn never(scope: Scope) -> RemoteRefusal {
    RemoteRefusal::Refused {
        scope,
        retry_after: Duration::MAX,
    }
}

impl RemoteScopes for RedisScopeKinds {
    fn take(&self, items: &[(Scope, u64)]) -> Result<(), RemoteRefusal> {
        if items.is_empty() {
            return Ok(());
        }
        let owned = self.kinds.strict_items(items)?;
        let tag = self.kinds.tag_of_items(items);
        let decided = self.scopes.try_acquire(&tag, &borrowed(&owned));
        remote_answer(decided, items)
    }

    fn give_back(&self, items: &[(Scope, u64)]) {
        // Scopes of kinds not kept here were never taken.
        let owned = self.kinds.kept_items(items);
        let tag = self.kinds.tag_of_items(items);
        self.scopes.give_back(&tag, &borrowed(&owned));
    }
}
