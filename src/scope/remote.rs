//! Keyed scope kinds kept in a remote store ([`Rule::remote`](crate::scope::Rule::remote)):
//! the seam a network client implements ([`RemoteScopes`]), and the step of the request
//! path that pays them after the local scopes.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::scope::decision::{KindSet, bit};
use crate::scope::kind::PerKind;
use crate::scope::{Scope, ScopeDecision, ScopeError, ScopeKind, ScopedLimiter};

/// A store that keeps some keyed scopes' buckets away from the limiter (in Redis, say),
/// so that several limiters share them.
///
/// A [`ScopedLimiter`] whose [`RuleSet`](crate::scope::RuleSet) marks kinds
/// [`remote`](crate::scope::Rule::remote) pays a request's local scopes first (all or
/// none, at one clock reading), then calls [`take`](RemoteScopes::take) with the request's
/// remote scopes, once, outside every lock; a request that names no remote scope never
/// calls it. When `take` refuses, the limiter gives every local scope its cost back
/// before it answers. The engine holds no network client and no runtime: `take` blocks
/// the calling thread for as long as the store takes to answer, so an implementation
/// should bound its round trip (a timeout, a circuit breaker).
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use std::time::Duration;
/// use tokengate::{ManualClock, Policy, scope::*};
///
/// /// A store holding 2 tokens per tenant, never refilled.
/// #[derive(Default)]
/// struct Fixed(Mutex<std::collections::HashMap<Scope, u64>>);
///
/// impl RemoteScopes for Fixed {
///     fn take(&self, items: &[(Scope, u64)]) -> Result<(), RemoteRefusal> {
///         let mut spent = self.0.lock().unwrap();
///         if let Some(&(scope, _)) = items.iter().find(|(s, c)| spent.get(s).unwrap_or(&0) + c > 2) {
///             return Err(RemoteRefusal::Refused { scope, retry_after: Duration::MAX });
///         }
///         for (s, c) in items {
///             *spent.entry(*s).or_default() += c;
///         }
///         Ok(())
///     }
///     fn give_back(&self, items: &[(Scope, u64)]) {
///         let mut spent = self.0.lock().unwrap();
///         for (s, c) in items {
///             spent.entry(*s).and_modify(|v| *v = v.saturating_sub(*c));
///         }
///     }
/// }
///
/// let limiter = RuleSet::new()
///     .rule(ScopeKind::Global, Rule::new(Policy::new(10, 1.0)?))
///     .rule(ScopeKind::Tenant, Rule::new(Policy::new(2, 1.0)?).remote())
///     .class(WorkClass::new("one", 1))
///     .remote_scopes(Arc::new(Fixed::default()))
///     .build_with_clock(ManualClock::new())?;
/// let one = limiter.class("one").unwrap();
/// let acme = Request::new().tenant(TenantId(1));
/// assert!(limiter.try_acquire(&acme, one)?.is_admitted());
/// assert!(limiter.try_acquire(&acme, one)?.is_admitted());
/// let d = limiter.try_acquire(&acme, one)?;
/// assert_eq!(d.refused_scope(), Some(Scope::Tenant(TenantId(1))));
/// // The global scope paid for the two admissions only: the third was given back.
/// assert_eq!(limiter.available(&Scope::Global), Some(8.0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait RemoteScopes: Send + Sync {
    /// Takes each item's cost (tokens) from its scope's bucket, all or none.
    ///
    /// The items are the request's scopes of remote kinds, in [`ScopeKind`] order, each
    /// at most once, with a cost of at least 1 and at most the capacity of its rule's
    /// policies.
    ///
    /// # Errors
    ///
    /// [`RemoteRefusal::Refused`] naming a scope that cannot pay (the one with the
    /// longest wait, when several cannot), [`RemoteRefusal::Unavailable`] when the store
    /// cannot decide. Either way nothing may stay taken.
    fn take(&self, items: &[(Scope, u64)]) -> Result<(), RemoteRefusal>;

    /// Gives back costs taken by an earlier [`take`](RemoteScopes::take) and not used
    /// ([`ScopedLimiter::refund`]): best effort, capped at each bucket's capacity. A give
    /// back that is lost makes the store admit less, never more.
    fn give_back(&self, items: &[(Scope, u64)]);
}

/// Why [`RemoteScopes::take`] took nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteRefusal {
    /// `scope`'s bucket cannot pay its cost.
    Refused {
        /// The scope that refused: one of the items asked.
        scope: Scope,
        /// When it could pay ([`Duration::MAX`]: never, for a cost above its capacity).
        retry_after: Duration,
    },
    /// The store cannot decide now (unreachable, failing closed).
    Unavailable {
        /// When to ask again.
        retry_after: Duration,
    },
}

impl fmt::Display for RemoteRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RemoteRefusal::Refused { scope, retry_after } => write!(
                f,
                "remote scope {scope} is rate limited; retry after {retry_after:?}"
            ),
            RemoteRefusal::Unavailable { retry_after } => write!(
                f,
                "the remote scopes are unavailable; retry after {retry_after:?}"
            ),
        }
    }
}

impl std::error::Error for RemoteRefusal {}

/// A limiter's remote store as a [`RuleSet`](crate::scope::RuleSet) holds it (printed
/// without its contents, which need not be `Debug`).
#[derive(Clone)]
pub(crate) struct RemoteStore(pub(crate) Arc<dyn RemoteScopes>);

impl fmt::Debug for RemoteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RemoteScopes")
    }
}

/// A built limiter's remote store and the kinds it keeps.
pub(crate) struct Remote {
    pub(crate) store: Arc<dyn RemoteScopes>,
    pub(crate) kinds: KindSet,
}

impl Remote {
    /// The scopes of remote kinds `request` pays at `costs`, in kind order, and their
    /// number (the rest of the array is filler).
    fn items(
        &self,
        request: &crate::scope::Request,
        costs: &PerKind<u64>,
    ) -> ([(Scope, u64); ScopeKind::COUNT], usize) {
        let mut items = [(Scope::Global, 0u64); ScopeKind::COUNT];
        let mut n = 0;
        for kind in ScopeKind::ALL {
            let k = kind.index();
            if self.kinds & bit(k) == 0 || costs[k] == 0 {
                continue;
            }
            if let Some(scope) = Scope::of(request, kind) {
                items[n] = (scope, costs[k]);
                n += 1;
            }
        }
        (items, n)
    }
}

impl<C: Clock, S: BuildHasher> ScopedLimiter<C, S> {
    /// The kinds kept in the remote store ([`Rule::remote`](crate::scope::Rule::remote)).
    pub fn remote_kinds(&self) -> impl Iterator<Item = ScopeKind> + '_ {
        let kinds = self.remote.as_ref().map_or(0, |r| r.kinds);
        ScopeKind::ALL
            .into_iter()
            .filter(move |k| kinds & bit(k.index()) != 0)
    }

    /// Pays the request's remote scopes after its local ones admitted `decision`: the
    /// decision unchanged when it names none; when the store refuses, every local
    /// scope's cost given back and the refusal.
    #[inline(never)]
    pub(super) fn pay_remote<'s>(
        &'s self,
        remote: &Remote,
        mut decision: ScopeDecision<'s>,
        costs: &PerKind<u64>,
    ) -> Result<ScopeDecision<'s>, ScopeError> {
        let (items, n) = remote.items(&decision.request, costs);
        let items = &items[..n];
        let Some(&(first, _)) = items.first() else {
            return Ok(decision);
        };
        // What the local scopes took, before the remote kinds join the paid ones.
        let local = decision.charge();
        for (scope, _) in items {
            decision.pays(scope.kind().index(), false);
        }
        let refusal = match remote.store.take(items) {
            Ok(()) => return Ok(decision),
            Err(r) => r,
        };
        if let Some(local) = local {
            self.refund(&local);
        }
        match refusal {
            RemoteRefusal::Refused { scope, retry_after } => {
                // A scope the request did not ask about is read as the first asked.
                let scope = items
                    .iter()
                    .find(|(s, _)| *s == scope)
                    .map_or(first, |&(s, _)| s);
                Ok(decision.remote_refusal(scope.kind().index(), retry_after))
            }
            RemoteRefusal::Unavailable { retry_after } => {
                Err(ScopeError::RemoteUnavailable { retry_after })
            }
        }
    }

    /// Gives the remote scopes of `request` their `costs` back (nothing without a remote
    /// store or remote scopes in the request).
    pub(super) fn give_back_remote(&self, request: &crate::scope::Request, costs: &PerKind<u64>) {
        if let Some(remote) = &self.remote {
            let (items, n) = remote.items(request, costs);
            if n > 0 {
                remote.store.give_back(&items[..n]);
            }
        }
    }

    /// Whether `request` pays a remote scope at `costs`.
    pub(super) fn pays_remote(
        &self,
        request: &crate::scope::Request,
        costs: &PerKind<u64>,
    ) -> Option<Scope> {
        let remote = self.remote.as_ref()?;
        let (items, n) = remote.items(request, costs);
        (n > 0).then_some(items[0].0)
    }
}
