//! The outcome of a scoped acquisition: admitted by every scope, or refused by one.

use std::fmt;
use std::mem::MaybeUninit;
use std::time::Duration;

use crate::decision::Decision;
use crate::error::AcquireError;
use crate::multi::MultiError;
use crate::policy::Policy;
use crate::scope::kind::{PerKind, Scope, ScopeKind};
use crate::scope::rules::{MAX_POLICIES_PER_RULE, Request};
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
    /// The scope is kept in the limiter's remote store
    /// ([`Rule::remote`](crate::scope::Rule::remote)), which refused it; the local scopes
    /// were given their costs back. No local bucket decided.
    Remote {
        /// When the store says the scope could pay ([`Duration::MAX`]: never).
        retry_after: Duration,
    },
}

/// What one scope's bucket decided, less what its policy and the cost give back
/// ([`Decision::parts`]): 16 bytes where a whole [`Decision`] takes 40.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Parts {
    balance: i64,
    lead_nanos: i64,
}

impl From<&Decision> for Parts {
    #[inline]
    fn from(d: &Decision) -> Parts {
        let (balance, lead_nanos) = d.parts();
        Parts {
            balance,
            lead_nanos,
        }
    }
}

/// What a decision's scopes are read back with: each kind's policies, and for a keyed
/// kind the most keys its map holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct KindPolicies {
    /// The rule's policies (its [`Rule::policies`](crate::scope::Rule::policies), padded
    /// with copies of the first).
    pub(crate) policies: [Policy; MAX_POLICIES_PER_RULE],
    /// How many of `policies` are the rule's (at least one).
    pub(crate) len: usize,
    pub(crate) overflow: Option<Policy>,
    pub(crate) max_keys: usize,
}

/// Every policy a decision's scopes may be held to: each kind's rule's, and the tiers
/// its overridden keys use (a kind's local tier `t`, from 1, at `tiers[kind][t - 1]`).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct PolicySet {
    pub(crate) rules: PerKind<Option<KindPolicies>>,
    pub(crate) tiers: PerKind<Box<[KindPolicies]>>,
}

impl PolicySet {
    /// The policies of kind `k`'s local tier `tier` (0: the rule's).
    #[inline]
    pub(crate) fn get(&self, k: usize, tier: u8) -> Option<&KindPolicies> {
        match tier {
            0 => self.rules.get(k)?.as_ref(),
            t => self.tiers.get(k)?.get(usize::from(t) - 1),
        }
    }
}

/// A decision's policies: its generation's [`PolicySet`] (in the limiter's store of
/// configurations, which keeps each distinct one for the limiter's life) and the
/// generation's [`Tag`] (a decision's charge says which configuration it paid under).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Policies<'a> {
    /// The tag of the generation these are.
    pub(crate) generation: Tag,
    set: &'a PolicySet,
}

/// A generation's number modulo 2^32: what a decision and its charge keep of it (four
/// bytes a decision had as padding). A give-back looks its generation up among the
/// few kept behind the current one, which no two generations 2^32 switches apart ever
/// are together.
pub(crate) type Tag = u32;

/// The [`Tag`] of generation `number`.
#[inline(always)]
pub(crate) const fn tag(number: u64) -> Tag {
    number as Tag
}

impl<'a> Policies<'a> {
    #[inline(always)]
    pub(crate) fn new(generation: u64, set: &'a PolicySet) -> Policies<'a> {
        Policies {
            generation: tag(generation),
            set,
        }
    }

    /// The set, for as long as the limiter is borrowed.
    #[inline(always)]
    pub(crate) fn set(self) -> &'a PolicySet {
        self.set
    }
}

impl std::ops::Deref for Policies<'_> {
    type Target = PolicySet;

    #[inline(always)]
    fn deref(&self) -> &PolicySet {
        self.set
    }
}

/// Scope kinds as the bits of a byte, by [`ScopeKind::index`].
pub(crate) type KindSet = u8;

const _: () = assert!(ScopeKind::COUNT <= KindSet::BITS as usize);

/// The bit of `k` in a [`KindSet`].
#[inline]
pub(crate) const fn bit(k: usize) -> KindSet {
    1 << k
}

impl KindPolicies {
    /// The first policy: the one an admission reports.
    #[inline]
    pub(crate) fn policy(&self) -> &Policy {
        &self.policies[0]
    }

    /// The rule's policies.
    pub(crate) fn as_slice(&self) -> &[Policy] {
        &self.policies[..self.len.clamp(1, MAX_POLICIES_PER_RULE)]
    }
}

/// The scope that refused, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The bucket of its limit (the policy's index in the rule) did not hold the cost:
    /// its parts are the decision's.
    RateLimited(ScopeKind, u8),
    /// Its map was full ([`Refusal::KeyLimit`]).
    KeyLimit(ScopeKind),
    /// The remote store refused it ([`Refusal::Remote`]).
    Remote(ScopeKind),
}

/// The outcome of [`ScopedLimiter::try_acquire`](crate::ScopedLimiter::try_acquire):
/// every scope's cost taken, or none.
///
/// A small `Copy` value (240 bytes on 64-bit targets, 88 of them the [`Request`], none
/// written for a kind the request does not pay): each scope's
/// own [`Decision`] is kept as its balance and tick lead (and its tier, for an
/// overridden key), and rebuilt from the scope's policy when [`decision`](ScopeDecision::decision) or
/// [`records`](ScopeDecision::records) asks for it.
///
/// A scope whose rule holds several policies ([`Rule::with_policies`](crate::scope::Rule::with_policies))
/// reports, for an admission, the decision of its first policy's bucket; for a
/// rate-limit refusal, that of the limit that refused
/// ([`refused_limit`](ScopeDecision::refused_limit)): when several of its limits
/// refuse, the one with the longest wait.
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
    /// Each decided kind's parts, written only for the kinds in `decided` (the others
    /// are never read): a request writes what it pays, not the whole array.
    parts: PerKind<MaybeUninit<Parts>>,
    /// For a rate-limit refusal, the time until every scope holds its cost, in
    /// nanoseconds (`u64::MAX` for longer: [`Duration::MAX`]).
    retry_after_nanos: u64,
    /// The class's cost per kind (a kind outside `paid` paid nothing, whatever it says).
    costs: &'a PerKind<u64>,
    pub(super) policies: &'a PolicySet,
    /// The tag of the generation it was decided on.
    pub(super) generation: Tag,
    /// Each kind's local tier (0: its rule's policies).
    tiers: PerKind<u8>,
    /// The kinds the request paid (or was refused in).
    paid: KindSet,
    /// The paid kinds charged to their kind's shared overflow bucket.
    overflow: KindSet,
    /// The kinds whose bucket decided: every paid one for an admission, the refusing one
    /// for a rate-limit refusal.
    decided: KindSet,
    refused: Option<Refused>,
}

impl<'a> ScopeDecision<'a> {
    /// An admission paying nothing yet: [`pays`](ScopeDecision::pays),
    /// [`decides`](ScopeDecision::decides) and the refusals fill it in.
    #[inline]
    pub(crate) fn new(
        request: &Request,
        costs: &'a PerKind<u64>,
        policies: Policies<'a>,
    ) -> ScopeDecision<'a> {
        ScopeDecision {
            request: *request,
            parts: [const { MaybeUninit::uninit() }; ScopeKind::COUNT],
            retry_after_nanos: 0,
            costs,
            policies: policies.set(),
            generation: policies.generation,
            tiers: [0; ScopeKind::COUNT],
            paid: 0,
            overflow: 0,
            decided: 0,
            refused: None,
        }
    }

    /// The decision of a request that paid kind `k`'s bucket alone (its first limit,
    /// no overflow bucket), which decided `d`: an admission, or with `retry_after` a
    /// rate-limit refusal. Built whole in one expression, so that a caller returning it
    /// writes it once, in place.
    #[inline(always)]
    pub(crate) fn alone(
        request: &Request,
        costs: &'a PerKind<u64>,
        policies: Policies<'a>,
        k: usize,
        d: &Decision,
        retry_after: Option<Duration>,
    ) -> ScopeDecision<'a> {
        let mut parts = [const { MaybeUninit::uninit() }; ScopeKind::COUNT];
        parts[k] = MaybeUninit::new(Parts::from(d));
        ScopeDecision {
            request: *request,
            parts,
            retry_after_nanos: retry_after
                .map_or(0, |r| u64::try_from(r.as_nanos()).unwrap_or(u64::MAX)),
            costs,
            policies: policies.set(),
            generation: policies.generation,
            tiers: [0; ScopeKind::COUNT],
            paid: bit(k),
            overflow: 0,
            decided: bit(k),
            refused: retry_after.map(|_| Refused::RateLimited(ScopeKind::ALL[k], 0)),
        }
    }

    /// The admission of a request that pays the kinds of `paid`, each on its own key's
    /// bucket (no overflow bucket), its keys in the local `tiers`: each kind's
    /// [`part`](ScopeDecision::part) is to be written before it is read.
    #[inline(always)]
    pub(crate) fn paid_in(
        request: &Request,
        costs: &'a PerKind<u64>,
        policies: Policies<'a>,
        tiers: PerKind<u8>,
        paid: KindSet,
    ) -> ScopeDecision<'a> {
        ScopeDecision {
            tiers,
            paid,
            decided: paid,
            ..ScopeDecision::new(request, costs, policies)
        }
    }

    /// Writes kind `k`'s bucket decision, of a kind already counted as decided.
    #[inline(always)]
    pub(crate) fn part(&mut self, k: usize, d: &Decision) {
        self.parts[k] = MaybeUninit::new(Parts::from(d));
    }

    /// Records that kind `k` paid (into its overflow bucket if `overflow`).
    #[inline]
    pub(crate) fn pays(&mut self, k: usize, overflow: bool) {
        self.paid |= bit(k);
        if overflow {
            self.overflow |= bit(k);
        }
    }

    /// Records that kind `k`'s key holds the policies of its local tier `tier` (0: the
    /// rule's).
    #[inline]
    pub(crate) fn in_tier(&mut self, k: usize, tier: u8) {
        self.tiers[k] = tier;
    }

    /// Records kind `k`'s bucket decision (its first limit's: the one an admission
    /// reports).
    #[inline]
    pub(crate) fn decides(&mut self, k: usize, d: &Decision) {
        self.parts[k] = MaybeUninit::new(Parts::from(d));
        self.decided |= bit(k);
    }

    /// Makes this a refusal: kind `k`'s map was full.
    pub(crate) fn key_limit(mut self, k: usize) -> ScopeDecision<'a> {
        self.decided = 0;
        self.refused = Some(Refused::KeyLimit(ScopeKind::ALL[k]));
        self
    }

    /// Makes this a refusal by the remote store of kind `k`'s scope, which could pay
    /// after `retry_after`; the local decisions (given back) are dropped.
    pub(crate) fn remote_refusal(mut self, k: usize, retry_after: Duration) -> ScopeDecision<'a> {
        self.decided = 0;
        self.refused = Some(Refused::Remote(ScopeKind::ALL[k]));
        self.retry_after_nanos = u64::try_from(retry_after.as_nanos()).unwrap_or(u64::MAX);
        self
    }

    /// Makes this a rate-limit refusal by limit `limit` of kind `k`, whose bucket
    /// decided `d`; the other decisions (rolled back) are dropped.
    pub(crate) fn refuse(
        mut self,
        k: usize,
        limit: usize,
        d: &Decision,
        retry_after: Duration,
    ) -> ScopeDecision<'a> {
        self.refused_by(k, limit, d, retry_after);
        self
    }

    /// [`refuse`](ScopeDecision::refuse) in place.
    #[inline]
    pub(crate) fn refused_by(
        &mut self,
        k: usize,
        limit: usize,
        d: &Decision,
        retry_after: Duration,
    ) {
        self.decided = 0;
        self.decides(k, d);
        // At most MAX_POLICIES_PER_RULE limits: the index fits a byte.
        self.refused = Some(Refused::RateLimited(ScopeKind::ALL[k], limit as u8));
        self.retry_after_nanos = u64::try_from(retry_after.as_nanos()).unwrap_or(u64::MAX);
    }

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
        let k = match self.refused? {
            Refused::RateLimited(k, _) | Refused::KeyLimit(k) | Refused::Remote(k) => k,
        };
        Scope::of(&self.request, k)
    }

    /// For a rate-limit rejection, which limit of the refusing scope refused: the index
    /// of its policy in the rule's [`policies`](crate::scope::Rule::policies) (0 for a
    /// single-policy rule). When several of the scope's limits could not pay, the one
    /// with the longest wait. `None` for an admission, a [`Refusal::KeyLimit`] and a
    /// [`Refusal::Remote`].
    pub fn refused_limit(&self) -> Option<usize> {
        match self.refused? {
            Refused::RateLimited(_, l) => Some(usize::from(l)),
            Refused::KeyLimit(_) | Refused::Remote(_) => None,
        }
    }

    /// For a rate-limit rejection, the policy of the limit that refused
    /// ([`refused_limit`](ScopeDecision::refused_limit)); the overflow bucket's for a
    /// scope charged there.
    pub fn refused_policy(&self) -> Option<&'a Policy> {
        match self.refused? {
            Refused::RateLimited(k, _) => self.policy_of(k.index()),
            Refused::KeyLimit(_) | Refused::Remote(_) => None,
        }
    }

    /// Why the refusing scope refused, for a rejection.
    pub fn refusal(&self) -> Option<Refusal> {
        Some(match self.refused? {
            Refused::RateLimited(k, _) => Refusal::RateLimited(self.decision_of(k.index())?),
            Refused::KeyLimit(k) => Refusal::KeyLimit {
                max_keys: self.kind_policies(k.index())?.max_keys,
            },
            Refused::Remote(_) => Refusal::Remote {
                retry_after: self.retry_after_nanos(),
            },
        })
    }

    /// For a rate-limit rejection, the time until every scope of the request holds its
    /// cost (the basis of a `Retry-After`); for a [`Refusal::Remote`], the store's time
    /// for its scope (the local scopes were given their costs back); `None` for an
    /// admission and for a [`Refusal::KeyLimit`], which has no estimate.
    /// Waits beyond `u64::MAX` nanoseconds (about 584 years) read as [`Duration::MAX`].
    pub fn retry_after(&self) -> Option<Duration> {
        match self.refused {
            Some(Refused::RateLimited(..) | Refused::Remote(_)) => Some(self.retry_after_nanos()),
            _ => None,
        }
    }

    fn retry_after_nanos(&self) -> Duration {
        match self.retry_after_nanos {
            u64::MAX => Duration::MAX,
            n => Duration::from_nanos(n),
        }
    }

    /// The scopes the request pays (in lock order: global, tenant, user, API key, client,
    /// route, tenant route).
    pub fn scopes(&self) -> impl Iterator<Item = Scope> + '_ {
        ScopeKind::ALL
            .into_iter()
            .filter(|k| self.paid & bit(k.index()) != 0)
            .filter_map(|k| Scope::of(&self.request, k))
    }

    /// The cost `scope` was asked for, if the request pays it.
    pub fn cost(&self, scope: Scope) -> Option<u64> {
        self.paid_kind(scope).map(|k| self.costs[k])
    }

    /// `scope`'s own decision: every local scope's for an admission, the refusing scope's
    /// for a rate-limit rejection (none for a scope of a remote kind, which no local
    /// bucket decides). Rebuilt from the scope's policy on each call (no division).
    pub fn decision(&self, scope: Scope) -> Option<Decision> {
        self.decision_of(self.paid_kind(scope)?)
    }

    /// Whether `scope`'s key found its map full and was charged to the kind's shared
    /// overflow bucket ([`Overflow::Share`](crate::keyed::Overflow::Share)).
    pub fn overflowed(&self, scope: Scope) -> bool {
        self.paid_kind(scope)
            .is_some_and(|k| self.overflow & bit(k) != 0)
    }

    /// The request this decision is about.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// The decision as telemetry records: one per local scope for an admission, the
    /// refusing scope's for a rate-limit rejection, none for a key-limit or remote
    /// refusal (no local bucket decided). A scope charged to the overflow bucket reports that bucket's policy.
    pub fn records(&self) -> impl Iterator<Item = Record<Scope>> + 'a {
        let this = *self;
        ScopeKind::ALL.into_iter().filter_map(move |k| {
            let d = this.decision_of(k.index())?;
            Some(Record::new(
                Scope::of(&this.request, k)?,
                this.policy_of(k.index())?,
                &d,
                this.request.attempt,
            ))
        })
    }

    /// The cost paid in kind `k`, for the paid ones not charged to an overflow bucket
    /// (what a refund reaches).
    pub(crate) fn own_cost(&self, k: usize) -> u64 {
        if (self.paid & !self.overflow) & bit(k) != 0 {
            self.costs[k]
        } else {
            0
        }
    }

    /// The policy of the bucket whose decision kind `k` reports: the overflow bucket's
    /// when charged there, the refusing limit's for the refusing kind, else the first.
    fn policy_of(&self, k: usize) -> Option<&'a Policy> {
        policy_in(
            self.policies,
            k,
            *self.tiers.get(k)?,
            self.overflow & bit(k) != 0,
            self.refused,
        )
    }

    /// The fraction bits of the policy kind `k`'s decision reports
    /// ([`policy_of`](ScopeDecision::policy_of)'s), read directly for the common case:
    /// a key in its rule's policies, on its own bucket, not refusing.
    #[inline(always)]
    fn frac_bits_of(&self, k: usize) -> Option<u32> {
        let common = self.tiers.get(k) == Some(&0)
            && self.overflow & bit(k) == 0
            && !matches!(self.refused, Some(Refused::RateLimited(r, _)) if r.index() == k);
        if common {
            if let Some(Some(kp)) = self.policies.rules.get(k) {
                return Some(kp.policy().layout().frac_bits());
            }
        }
        self.policy_of(k).map(|p| p.layout().frac_bits())
    }

    /// The policies kind `k`'s key is held to: its tier's or its rule's.
    fn kind_policies(&self, k: usize) -> Option<&'a KindPolicies> {
        self.policies.get(k, *self.tiers.get(k)?)
    }

    /// Kind `k`'s bucket decision, if it decided.
    fn decision_of(&self, k: usize) -> Option<Decision> {
        if self.decided & bit(k) == 0 {
            return None;
        }
        // SAFETY: a kind's bit enters `decided` only in `decides`, which writes its parts
        // first; every other write of `decided` clears bits. So kind `k`'s parts are
        // initialized.
        let Parts {
            balance,
            lead_nanos,
        } = unsafe { self.parts[k].assume_init() };
        Some(Decision::from_parts(
            self.policy_of(k)?.layout(),
            balance,
            lead_nanos,
            self.costs[k],
            self.refused.is_none(),
        ))
    }

    /// The kind of `scope`, if the request names it and pays it.
    fn paid_kind(&self, scope: Scope) -> Option<usize> {
        let k = scope.kind();
        (Scope::of(&self.request, k) == Some(scope) && self.paid & bit(k.index()) != 0)
            .then_some(k.index())
    }
}

/// A scoped decision as a caller answering the request needs it, and no more: admitted
/// or refused, the refusing scope kind, its wait, and the tightest scope's balance (the
/// paid scope with the fewest whole tokens left; the refusing scope's for a rate-limit
/// refusal). What a `429` and its `Retry-After`, and the admitted `RateLimit` fields of
/// the tightest scope, are written from (48 bytes on 64-bit targets, against a
/// [`ScopeDecision`]'s 208).
///
/// From [`ScopedLimiter::try_acquire_verdict`](crate::ScopedLimiter::try_acquire_verdict),
/// which decides exactly as [`try_acquire`](crate::ScopedLimiter::try_acquire) does, or
/// from a decision's [`verdict`](ScopeDecision::verdict). Per-scope details (every
/// scope's decision, the records) stay with [`ScopeDecision`], for the callers that ask.
///
/// ```
/// use tokengate::{ManualClock, Policy, scope::*};
/// let limiter = RuleSet::new()
///     .rule(ScopeKind::Global, Rule::new(Policy::new(100, 1.0)?))
///     .rule(ScopeKind::Tenant, Rule::new(Policy::new(5, 1.0)?))
///     .class(WorkClass::new("search", 3))
///     .build_with_clock(ManualClock::new())?;
/// let search = limiter.class("search").unwrap();
/// let request = Request::new().tenant(TenantId(1));
/// let v = limiter.try_acquire_verdict(&request, search)?;
/// assert!(v.is_admitted());
/// assert_eq!(v.tightest(), Some(ScopeKind::Tenant)); // 2 tokens left, the global 97
/// assert_eq!(v.decision().map(|d| d.tokens_remaining()), Some(2.0));
/// let v = limiter.try_acquire_verdict(&request, search)?;
/// assert_eq!(v.refused(), Some(ScopeKind::Tenant));
/// assert_eq!(v.refused_scope(&request), Some(Scope::Tenant(TenantId(1))));
/// // 1 token missing at 1/s: a second, and up to a tick of the bucket's grid.
/// assert_eq!(v.retry_after().map(|w| w.as_secs()), Some(1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScopeVerdict<'a> {
    refused: Option<Refused>,
    /// The kind `balance` and `lead_nanos` are of (`None`: no local bucket decided).
    tightest: Option<ScopeKind>,
    /// Its local tier, and whether it was charged to its kind's overflow bucket: with
    /// `refused`, which of `policies` its bucket has (looked up when asked).
    tier: u8,
    overflow: bool,
    /// Its policy's fraction bits (one token is `2^F` units).
    frac_bits: u8,
    /// Nanoseconds until the request could be admitted (a refusal with a wait).
    wait_nanos: u64,
    balance: i64,
    lead_nanos: i64,
    /// The tightest scope's cost (the refusing scope's for a refusal).
    cost: u64,
    policies: &'a PolicySet,
}

impl<'a> ScopeVerdict<'a> {
    /// The verdict of a request that paid kind `k`'s bucket alone (its first limit, its
    /// key in local tier `tier`, no overflow bucket) at `cost`, which decided `d`: an
    /// admission, or with `retry_after` a rate-limit refusal. The verdict
    /// [`ScopeDecision::alone`] (or a one-kind [`ScopeDecision::paid_in`]) gives, built
    /// without the decision.
    #[inline(always)]
    pub(crate) fn alone(
        policies: Policies<'a>,
        k: usize,
        tier: u8,
        cost: u64,
        d: &Decision,
        retry_after: Option<Duration>,
    ) -> ScopeVerdict<'a> {
        let refused = retry_after.map(|_| Refused::RateLimited(ScopeKind::ALL[k], 0));
        let wait_nanos = retry_after.map_or(0, |r| u64::try_from(r.as_nanos()).unwrap_or(u64::MAX));
        let Some(kp) = policies.get(k, tier) else {
            // No policy to read the balance with: no tightest scope (as `verdict`).
            return ScopeVerdict {
                refused,
                wait_nanos,
                ..ScopeVerdict::nothing(policies)
            };
        };
        let (balance, lead_nanos) = d.parts();
        ScopeVerdict {
            refused,
            tightest: Some(ScopeKind::ALL[k]),
            tier,
            overflow: false,
            // At most 63 fraction bits: fits a byte.
            frac_bits: kp.policy().layout().frac_bits() as u8,
            wait_nanos,
            balance,
            lead_nanos,
            cost,
            policies: policies.set(),
        }
    }

    /// The verdict of an admission that paid the global scope's bucket (its first
    /// limit, at `global.0`, deciding `global.1`) and kind `k`'s (its key's own bucket,
    /// in local tier `tier`, at `cost`, deciding `d`), built in one expression: the
    /// tightest of the two as [`ScopeDecision::verdict`] chooses (the global scope among
    /// equals, first in [`ScopeKind`] order).
    #[inline(always)]
    pub(crate) fn admitted_two(
        policies: Policies<'a>,
        global: (u64, &Decision),
        (k, tier, cost, d): (usize, u8, u64, &Decision),
    ) -> ScopeVerdict<'a> {
        let g = ScopeKind::Global.index();
        // The whole tokens left of a bucket whose policy has `frac_bits`.
        let whole = |balance: i64, frac_bits: u32| {
            if balance > 0 {
                (balance as u64) >> frac_bits
            } else {
                0
            }
        };
        let (Some(gp), Some(kp)) = (policies.get(g, 0), policies.get(k, tier)) else {
            // A kind with no policy to read its balance with (never, for a bucket
            // paid): as `verdict`, one part at a time.
            let mut v = ScopeVerdict::nothing(policies);
            v.admitted_part(g, 0, global.0, global.1);
            v.admitted_part(k, tier, cost, d);
            return v;
        };
        let (gf, kf) = (
            gp.policy().layout().frac_bits(),
            kp.policy().layout().frac_bits(),
        );
        let (gb, gl) = global.1.parts();
        let (kb, kl) = d.parts();
        let keyed = whole(kb, kf) < whole(gb, gf);
        // At most 63 fraction bits: fits a byte.
        let (tightest, tier, frac_bits, balance, lead_nanos, cost) = if keyed {
            (k, tier, kf as u8, kb, kl, cost)
        } else {
            (g, 0, gf as u8, gb, gl, global.0)
        };
        ScopeVerdict {
            refused: None,
            tightest: Some(ScopeKind::ALL[tightest]),
            tier,
            overflow: false,
            frac_bits,
            wait_nanos: 0,
            balance,
            lead_nanos,
            cost,
            policies: policies.set(),
        }
    }

    /// Offers kind `k`'s bucket decision `d` of an admission (the bucket its key's own,
    /// in local tier `tier`, paying `cost`), the kinds offered in [`ScopeKind`] order to
    /// a verdict begun as [`nothing`](ScopeVerdict::nothing): it becomes the tightest
    /// scope when it has fewer whole tokens left than the tightest so far, so that the
    /// first among equals stays, as [`ScopeDecision::verdict`] chooses. A kind with no
    /// policy to read its balance with is passed over (as there).
    #[inline(always)]
    pub(crate) fn admitted_part(&mut self, k: usize, tier: u8, cost: u64, d: &Decision) {
        let Some(kp) = self.policies.get(k, tier) else {
            return;
        };
        let frac_bits = kp.policy().layout().frac_bits();
        let (balance, lead_nanos) = d.parts();
        let whole = if balance > 0 {
            (balance as u64) >> frac_bits
        } else {
            0
        };
        if self.tightest.is_some() && whole >= self.remaining() {
            return;
        }
        self.tightest = Some(ScopeKind::ALL[k]);
        self.tier = tier;
        self.overflow = false;
        // At most 63 fraction bits: fits a byte.
        self.frac_bits = frac_bits as u8;
        self.balance = balance;
        self.lead_nanos = lead_nanos;
        self.cost = cost;
    }

    /// The verdict of a request that paid nothing (no scope charged).
    #[inline]
    pub(crate) fn nothing(policies: Policies<'a>) -> ScopeVerdict<'a> {
        ScopeVerdict {
            refused: None,
            tightest: None,
            tier: 0,
            overflow: false,
            frac_bits: 0,
            wait_nanos: 0,
            balance: 0,
            lead_nanos: 0,
            cost: 0,
            policies: policies.set(),
        }
    }

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

    /// The kind of the scope that refused, for a rejection.
    #[inline]
    pub fn refused(&self) -> Option<ScopeKind> {
        match self.refused? {
            Refused::RateLimited(k, _) | Refused::KeyLimit(k) | Refused::Remote(k) => Some(k),
        }
    }

    /// The scope that refused, for a rejection of `request` (the request this verdict
    /// decided: its key of the refusing kind), as [`ScopeDecision::refused_scope`].
    #[inline]
    pub fn refused_scope(&self, request: &Request) -> Option<Scope> {
        Scope::of(request, self.refused()?)
    }

    /// Whether the refusing scope's key map was full ([`Refusal::KeyLimit`]).
    #[inline]
    pub fn is_key_limit(&self) -> bool {
        matches!(self.refused, Some(Refused::KeyLimit(_)))
    }

    /// As [`ScopeDecision::retry_after`].
    #[inline]
    pub fn retry_after(&self) -> Option<Duration> {
        match self.refused {
            Some(Refused::RateLimited(..) | Refused::Remote(_)) => Some(match self.wait_nanos {
                u64::MAX => Duration::MAX,
                n => Duration::from_nanos(n),
            }),
            _ => None,
        }
    }

    /// The kind of the tightest scope: for an admission, the paid scope with the fewest
    /// whole tokens left (the first in [`ScopeKind`] order among equals); for a
    /// rate-limit refusal, the refusing one; `None` when no local bucket decided.
    #[inline]
    pub fn tightest(&self) -> Option<ScopeKind> {
        self.tightest
    }

    /// The tightest scope's own decision (as [`ScopeDecision::decision`] gives it).
    /// Rebuilt on each call (no division).
    #[inline]
    pub fn decision(&self) -> Option<Decision> {
        Some(Decision::from_parts(
            self.policy()?.layout(),
            self.balance,
            self.lead_nanos,
            self.cost,
            self.refused.is_none(),
        ))
    }

    /// The cost the request asked of the tightest scope; for a refusal, of the refusing
    /// scope (0 when the request does not pay it).
    #[inline]
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// The policy of the tightest scope's bucket.
    #[inline]
    pub fn policy(&self) -> Option<&'a Policy> {
        let k = self.tightest?.index();
        policy_in(self.policies, k, self.tier, self.overflow, self.refused)
    }

    /// The tightest scope's balance after the decision, in whole tokens (0 while below
    /// one token or owed).
    #[inline]
    pub fn remaining(&self) -> u64 {
        if self.tightest.is_some() && self.balance > 0 {
            (self.balance as u64) >> self.frac_bits
        } else {
            0
        }
    }
}

/// The policy of the bucket whose decision kind `k` (in local tier `tier`) reports: the
/// overflow bucket's when charged there, the refusing limit's for the refusing kind,
/// else the first.
#[inline]
fn policy_in(
    policies: &PolicySet,
    k: usize,
    tier: u8,
    overflow: bool,
    refused: Option<Refused>,
) -> Option<&Policy> {
    let kp = policies.get(k, tier)?;
    if overflow {
        return kp.overflow.as_ref();
    }
    match refused {
        Some(Refused::RateLimited(r, l)) if r.index() == k => kp.as_slice().get(usize::from(l)),
        _ => Some(kp.policy()),
    }
}

impl<'a> ScopeDecision<'a> {
    /// The decision's [`ScopeVerdict`]: what a caller answering the request needs.
    #[inline]
    pub fn verdict(&self) -> ScopeVerdict<'a> {
        let mut v = ScopeVerdict {
            refused: self.refused,
            tightest: None,
            tier: 0,
            overflow: false,
            frac_bits: 0,
            wait_nanos: self.retry_after_nanos,
            balance: 0,
            lead_nanos: 0,
            cost: 0,
            policies: self.policies,
        };
        let mut decided = self.decided;
        let mut fewest = u64::MAX;
        while decided != 0 {
            let k = decided.trailing_zeros() as usize;
            decided &= decided - 1;
            let Some(frac_bits) = self.frac_bits_of(k) else {
                continue;
            };
            // SAFETY: as in `decision_of`: a kind in `decided` has its parts written.
            let Parts {
                balance,
                lead_nanos,
            } = unsafe { self.parts[k].assume_init() };
            let whole = if balance > 0 {
                (balance as u64) >> frac_bits
            } else {
                0
            };
            if whole >= fewest {
                continue;
            }
            fewest = whole;
            v.tightest = Some(ScopeKind::ALL[k]);
            v.tier = self.tiers[k];
            v.overflow = self.overflow & bit(k) != 0;
            // At most 63 fraction bits: fits a byte.
            v.frac_bits = frac_bits as u8;
            v.balance = balance;
            v.lead_nanos = lead_nanos;
            v.cost = self.costs[k];
        }
        if let Some(Refused::KeyLimit(k) | Refused::Remote(k)) = self.refused {
            let k = k.index();
            v.cost = if self.paid & bit(k) != 0 {
                self.costs[k]
            } else {
                0
            };
        }
        v
    }
}

impl fmt::Debug for ScopeDecision<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopeDecision")
            .field("admitted", &self.is_admitted())
            .field("refused_scope", &self.refused_scope())
            .field("refused_limit", &self.refused_limit())
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
    /// A scope's bucket refused with an [`AcquireError`]. Never a clock that went
    /// backwards: the limiter reads its clock through a
    /// [`Monotonic`](crate::clock::Monotonic) guard, so a clock stepping back is time
    /// standing still, and no scope returns [`AcquireError::ClockWentBackwards`].
    Acquire {
        /// The scope.
        scope: Scope,
        /// Its bucket's error.
        error: AcquireError,
    },
    /// The multi-bucket acquisition refused for another reason.
    Multi(MultiError),
    /// The remote store of the request's remote scopes
    /// ([`Rule::remote`](crate::scope::Rule::remote)) cannot decide now; the local scopes
    /// were given their costs back. The caller chooses whether to serve anyway.
    RemoteUnavailable {
        /// When the store says to ask again.
        retry_after: Duration,
    },
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
            ScopeError::RemoteUnavailable { retry_after } => write!(
                f,
                "the remote scopes are unavailable; nothing was taken; retry after \
                 {retry_after:?}"
            ),
        }
    }
}

impl std::error::Error for ScopeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ScopeError::Acquire { error, .. } => Some(error),
            ScopeError::Multi(e) => Some(e),
            ScopeError::UnknownClass(_) | ScopeError::RemoteUnavailable { .. } => None,
        }
    }
}

#[cfg(all(test, not(loom), target_pointer_width = "64"))]
mod tests {
    use super::{Request, ScopeDecision};

    /// The verdict says what the whole decision says: admitted or refused, the refusing
    /// kind and scope, the wait, the cost, and for the tightest scope (the paid one with
    /// the fewest whole tokens left) its decision, over admissions, refusals by either
    /// scope, and a full key map.
    #[test]
    fn a_verdict_agrees_with_its_decision() {
        use crate::scope::{Rule, RuleSet, ScopeKind, TenantId, UserId, WorkClass};
        use crate::{ManualClock, Policy};
        let clock = ManualClock::new();
        let limiter = RuleSet::new()
            .rule(ScopeKind::Global, Rule::new(Policy::new(40, 4.0).unwrap()))
            .rule(ScopeKind::Tenant, Rule::new(Policy::new(9, 1.0).unwrap()))
            .rule(
                ScopeKind::User,
                Rule::new(Policy::new(50, 0.01).unwrap())
                    .max_keys(3)
                    .shards(1),
            )
            .class(WorkClass::new("one", 1))
            .class(WorkClass::new("three", 3))
            .build_with_clock(clock.clone())
            .unwrap();
        let classes = [
            limiter.class("one").unwrap(),
            limiter.class("three").unwrap(),
        ];
        let (mut admitted, mut refused, mut key_limits) = (0, 0, 0);
        for i in 0u64..300 {
            let mut request = Request::new().tenant(TenantId(i % 2));
            if i % 3 != 0 {
                request = request.user(UserId(i % 5));
            }
            let d = limiter
                .try_acquire(&request, classes[(i % 2) as usize])
                .unwrap();
            let v = d.verdict();
            assert_eq!(v.is_admitted(), d.is_admitted(), "{i}");
            assert_eq!(v.refused_scope(&request), d.refused_scope(), "{i}");
            assert_eq!(v.retry_after(), d.retry_after(), "{i}");
            let fewest = d
                .scopes()
                .filter_map(|sc| Some((sc, d.decision(sc)?)))
                .map(|(sc, dec)| {
                    let whole = (dec.balance_units().max(0) as u64)
                        >> d.policies
                            .get(sc.kind().index(), 0)
                            .unwrap()
                            .policy()
                            .layout()
                            .frac_bits();
                    (whole, sc)
                })
                .min_by_key(|&(whole, sc)| (whole, sc.kind().index()));
            match fewest {
                Some((whole, sc)) => {
                    assert_eq!(v.tightest(), Some(sc.kind()), "{i}");
                    assert_eq!(v.remaining(), whole, "{i}");
                    assert_eq!(v.decision(), d.decision(sc), "{i}");
                    assert_eq!(Some(v.cost()), d.cost(sc), "{i}");
                }
                None => assert_eq!(v.tightest(), None, "{i}"),
            }
            if v.is_key_limit() {
                key_limits += 1;
                assert_eq!(Some(v.cost()), d.cost(d.refused_scope().unwrap()), "{i}");
            } else if v.is_admitted() {
                admitted += 1;
            } else {
                refused += 1;
            }
            clock.advance(std::time::Duration::from_millis((i * 7919) % 600));
        }
        assert!(
            admitted > 20 && refused > 20 && key_limits > 5,
            "{admitted} {refused} {key_limits}"
        );
    }

    /// `try_acquire_verdict` answers what `try_acquire(..).verdict()` answers, on its
    /// own paths too (the global scope alone, one keyed scope alone, held or new, a
    /// full map), over admissions and refusals: two limiters built alike on one clock,
    /// given the same requests, one asked for decisions, the other for verdicts.
    #[test]
    fn a_verdict_asked_for_is_the_decisions_verdict() {
        use crate::scope::{Rule, RuleSet, ScopeKind, TenantId, UserId, WorkClass};
        use crate::{ManualClock, Policy};
        let clock = ManualClock::new();
        let sets: [fn() -> RuleSet; 6] = [
            || RuleSet::new().rule(ScopeKind::Global, Rule::new(Policy::new(7, 2.0).unwrap())),
            || {
                RuleSet::new().rule(
                    ScopeKind::User,
                    Rule::new(Policy::new(5, 0.2).unwrap())
                        .max_keys(3)
                        .shards(1),
                )
            },
            || {
                RuleSet::new()
                    .rule(ScopeKind::Global, Rule::new(Policy::new(30, 3.0).unwrap()))
                    .rule(ScopeKind::Tenant, Rule::new(Policy::new(6, 1.0).unwrap()))
            },
            // Equal policies, counted: asked by one tenant alone (below), the global
            // scope and the tenant are tied on what is left.
            || {
                RuleSet::new()
                    .rule(
                        ScopeKind::Global,
                        Rule::new(Policy::new(8, 2.0).unwrap()).counters(true),
                    )
                    .rule(
                        ScopeKind::Tenant,
                        Rule::new(Policy::new(8, 2.0).unwrap()).counters(true),
                    )
            },
            // A tenant in a tier of other fraction bits.
            || {
                RuleSet::new()
                    .rule(
                        ScopeKind::Global,
                        Rule::new(Policy::new(100_000, 500.0).unwrap()),
                    )
                    .rule(ScopeKind::Tenant, Rule::new(Policy::new(3, 0.5).unwrap()))
                    .tier("gold", vec![Policy::new(4000, 100.0).unwrap()])
                    .override_key(crate::scope::Scope::Tenant(TenantId(1)), "gold")
            },
            || {
                RuleSet::new()
                    .rule(ScopeKind::Tenant, Rule::new(Policy::new(6, 1.0).unwrap()))
                    .rule(
                        ScopeKind::User,
                        Rule::new(Policy::new(4, 0.5).unwrap())
                            .max_keys(2)
                            .shards(1),
                    )
            },
        ];
        for (n, set) in sets.iter().enumerate() {
            let build = || {
                set()
                    .class(WorkClass::new("one", 1))
                    .class(WorkClass::new("two", 2))
                    .build_with_clock(clock.clone())
                    .unwrap()
            };
            let (decided, verdicts) = (build(), build());
            let (mut admitted, mut refused) = (0, 0);
            for i in 0u64..400 {
                let request = if n == 3 {
                    Request::new().tenant(TenantId(7))
                } else {
                    Request::new().tenant(TenantId(i % 3)).user(UserId(i % 4))
                };
                let name = if i % 5 == 0 { "two" } else { "one" };
                if i % 50 == 0 {
                    // Another limiter's class: refused, nothing taken (the two limiters
                    // stay in step below).
                    let foreign = decided.class(name).unwrap();
                    assert_eq!(
                        verdicts.try_acquire_verdict(&request, foreign),
                        Err(crate::scope::ScopeError::UnknownClass(foreign)),
                        "rule set {n}"
                    );
                }
                let d = decided.try_acquire(&request, decided.class(name).unwrap());
                let v = verdicts.try_acquire_verdict(&request, verdicts.class(name).unwrap());
                let (d, v) = (d.unwrap().verdict(), v.unwrap());
                assert_eq!(v, d, "rule set {n}, request {i}");
                if v.is_admitted() {
                    admitted += 1;
                } else {
                    refused += 1;
                }
                clock.advance(std::time::Duration::from_millis((i * 7919) % 700));
            }
            assert!(admitted > 20 && refused > 20, "{n}: {admitted} {refused}");
        }
        let one_held = crate::scope::held::ONE_HELD.with(std::cell::Cell::get);
        assert!(
            one_held > 100,
            "the one-bucket held path took {one_held} requests"
        );
        let two_held = crate::scope::held::TWO_HELD.with(std::cell::Cell::get);
        assert!(
            two_held > 100,
            "the global + one keyed bucket held path took {two_held} requests"
        );
        let global = crate::scope::held::GLOBAL_VERDICT.with(std::cell::Cell::get);
        assert!(
            global > 100,
            "the global-only verdict's path took {global} requests"
        );
    }

    #[test]
    fn a_verdict_is_48_bytes() {
        assert_eq!(std::mem::size_of::<super::ScopeVerdict<'_>>(), 48);
    }

    #[test]
    fn a_decision_is_240_bytes_and_its_request_88() {
        assert_eq!(std::mem::size_of::<Request>(), 88);
        assert_eq!(std::mem::size_of::<ScopeDecision<'_>>(), 240);
    }
}
