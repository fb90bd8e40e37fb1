//! The outcome of a scoped acquisition: admitted by every scope, or refused by one.

use std::fmt;
use std::time::Duration;

use crate::decision::Decision;
use crate::error::AcquireError;
use crate::multi::MultiError;
use crate::policy::Policy;
use crate::scope::kind::{PerKind, Scope, ScopeKind};
use crate::scope::rules::Request;
use crate::telemetry::Record;

/// Why a scope refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The scope's bucket did not hold the cost: its own decision (balance left, and
    /// [`Decision::retry_after`] for that bucket).
    RateLimited(Decision),
    /// The key is new and the scope kind's map is at its maximum with nothing
    /// evictable, under [`Overflow::Reject`](crate::keyed::Overflow::Reject). No time estimate:
    /// room appears as other keys' buckets refill and are evicted.
    KeyLimit {
        /// The map's maximum number of keys.
        max_keys: usize,
    },
}

/// What one scope of a request paid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Paid {
    pub(crate) cost: u64,
    /// Whether the cost went to the kind's shared overflow bucket.
    pub(crate) overflow: bool,
    /// The scope's own decision: for an admission every scope's, for a rate-limit
    /// refusal the refusing scope's only.
    pub(crate) decision: Option<Decision>,
}

/// The policies a decision's records are read from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KindPolicies {
    pub(crate) policy: Policy,
    pub(crate) overflow: Option<Policy>,
}

/// The outcome of [`ScopedLimiter::try_acquire`](crate::ScopedLimiter::try_acquire):
/// every scope's cost taken, or none.
///
/// ```
/// use tokengate::{ManualClock, Policy, scope::Request, scope::Rule, scope::RuleSet, scope::Scope, scope::ScopeKind, scope::TenantId, scope::WorkClass};
/// let limiter = RuleSet::new()
///     .rule(ScopeKind::Tenant, Rule::new(Policy::new(5, 1.0)?))
///     .class(WorkClass::new("search", 3))
///     .build_with_clock(ManualClock::new())?;
/// let search = limiter.class("search").unwrap();
/// let request = Request::new().tenant(TenantId(1));
/// assert!(limiter.try_acquire(&request, search)?.is_admitted());
/// let d = limiter.try_acquire(&request, search)?;
/// assert_eq!(d.refused_scope(), Some(Scope::Tenant(TenantId(1))));
/// assert_eq!(
///     d.records().next().unwrap().to_string(),
///     "limiter=tenant:1 result=rejected bucket_capacity=5 refill_per_second=1 token_cost=3 \
///      tokens_remaining=2 attempt=original"
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy)]
pub struct ScopeDecision<'a> {
    pub(crate) request: Request,
    pub(crate) paid: PerKind<Option<Paid>>,
    pub(crate) refused: Option<(ScopeKind, Refusal)>,
    pub(crate) retry_after: Duration,
    pub(crate) policies: &'a PerKind<Option<KindPolicies>>,
}

impl<'a> ScopeDecision<'a> {
    /// Whether every scope's cost was taken.
    #[inline]
    pub fn is_admitted(&self) -> bool {
        self.refused.is_none()
    }

    /// Whether nothing was taken.
    #[inline]
    pub fn is_rejected(&self) -> bool {
        self.refused.is_some()
    }

    /// The scope that refused, for a rejection.
    pub fn refused_scope(&self) -> Option<Scope> {
        self.refused.and_then(|(k, _)| Scope::of(&self.request, k))
    }

    /// Why the refusing scope refused, for a rejection.
    pub fn refusal(&self) -> Option<Refusal> {
        self.refused.map(|(_, r)| r)
    }

    /// For a rate-limit rejection, the time until every scope of the request holds its
    /// cost (the basis of a `Retry-After`); `None` for an admission and for a
    /// [`Refusal::KeyLimit`], which has no estimate.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.refused {
            Some((_, Refusal::RateLimited(_))) => Some(self.retry_after),
            _ => None,
        }
    }

    /// The scopes the request pays (in lock order: global, tenant, user, API key, route,
    /// tenant route).
    pub fn scopes(&self) -> impl Iterator<Item = Scope> + '_ {
        ScopeKind::ALL
            .into_iter()
            .filter(|k| self.paid[k.index()].is_some())
            .filter_map(|k| Scope::of(&self.request, k))
    }

    /// The cost `scope` was asked for, if the request pays it.
    pub fn cost(&self, scope: Scope) -> Option<u64> {
        self.paid_for(scope).map(|p| p.cost)
    }

    /// `scope`'s own decision: every scope's for an admission, the refusing scope's for a
    /// rate-limit rejection.
    pub fn decision(&self, scope: Scope) -> Option<&Decision> {
        self.paid_for(scope).and_then(|p| p.decision.as_ref())
    }

    /// Whether `scope`'s key found its map full and was charged to the kind's shared
    /// overflow bucket ([`Overflow::Share`](crate::keyed::Overflow::Share)).
    pub fn overflowed(&self, scope: Scope) -> bool {
        self.paid_for(scope).is_some_and(|p| p.overflow)
    }

    /// The request this decision is about.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// The decision as telemetry records: one per scope for an admission, the refusing
    /// scope's for a rate-limit rejection, none for a key-limit refusal (no bucket
    /// decided). A scope charged to the overflow bucket reports that bucket's policy.
    pub fn records(&self) -> impl Iterator<Item = Record<Scope>> + 'a {
        let request = self.request;
        let paid = self.paid;
        let policies = self.policies;
        ScopeKind::ALL.into_iter().filter_map(move |k| {
            let p = paid[k.index()]?;
            let d = p.decision?;
            let kp = policies[k.index()].as_ref()?;
            let policy = if p.overflow {
                kp.overflow.as_ref()?
            } else {
                &kp.policy
            };
            Some(Record::new(
                Scope::of(&request, k)?,
                policy,
                &d,
                request.attempt,
            ))
        })
    }

    fn paid_for(&self, scope: Scope) -> Option<&Paid> {
        let k = scope.kind();
        if Scope::of(&self.request, k) != Some(scope) {
            return None;
        }
        self.paid[k.index()].as_ref()
    }
}

impl fmt::Debug for ScopeDecision<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopeDecision")
            .field("admitted", &self.is_admitted())
            .field("refused_scope", &self.refused_scope())
            .field("refusal", &self.refusal())
            .field("retry_after", &self.retry_after())
            .finish()
    }
}

/// Why a scoped acquisition refused to decide. Nothing was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScopeError {
    /// The class was not given by this limiter's [`class`](crate::ScopedLimiter::class)
    /// (it came from another limiter).
    UnknownClass(crate::scope::rules::ClassId),
    /// A scope's bucket refused with an error (a clock that went backwards).
    Acquire {
        /// The scope.
        scope: Scope,
        /// Its bucket's error.
        error: AcquireError,
    },
    /// The multi-bucket acquisition refused for another reason.
    Multi(MultiError),
}

impl fmt::Display for ScopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScopeError::UnknownClass(c) => {
                write!(
                    f,
                    "work class {} is not one of this limiter's (it was given by another \
                     limiter)",
                    c.index
                )
            }
            ScopeError::Acquire { scope, error } => write!(f, "scope {scope}: {error}"),
            ScopeError::Multi(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ScopeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ScopeError::Acquire { error, .. } => Some(error),
            ScopeError::Multi(e) => Some(e),
            ScopeError::UnknownClass(_) => None,
        }
    }
}
