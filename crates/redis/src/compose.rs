//! [`GlobalThenScopes`]: a hot global scope decided locally (a [`tokengate::Bucket`], the
//! engine's [`LeasedBucket`], or a [`RemoteBucket`] leased from Redis) composed with a
//! request's keyed scopes decided strictly in Redis ([`RedisScopes`]): the global cost is
//! taken first, without the network, and refunded when the keyed scopes refuse, so a
//! request is admitted by every scope or charged to none.

use std::time::Duration;

use tokengate::clock::Clock;
use tokengate::leased::Pool;
use tokengate::{AcquireError, Bucket, Decision, LeasedBucket};

use crate::pool::RemoteBucket;
use crate::strict::{RedisScopes, StrictAdmitted, StrictRefused, StrictScope};

/// A global scope paid before the keyed scopes: takes a cost, or gives one back.
pub trait GlobalScope {
    /// Takes `cost` tokens.
    ///
    /// # Errors
    ///
    /// When to retry, when the scope refuses (or cannot take the cost at all: then
    /// [`Duration::MAX`]).
    fn take(&self, cost: u64) -> Result<(), Duration>;

    /// Gives back `cost` tokens taken by [`take`](GlobalScope::take) and not used.
    fn give_back(&self, cost: u64);
}

/// An engine decision as a [`GlobalScope::take`] result: admitted, or when to ask again
/// (`Duration::MAX` for an error, which no wait cures).
fn paid(decision: Result<Decision, AcquireError>) -> Result<(), Duration> {
    match decision {
        Ok(d) if d.is_admitted() => Ok(()),
        Ok(d) => Err(d.retry_after().unwrap_or(Duration::MAX)),
        Err(_) => Err(Duration::MAX),
    }
}

impl<C: Clock> GlobalScope for Bucket<C> {
    fn take(&self, cost: u64) -> Result<(), Duration> {
        paid(self.try_acquire(cost))
    }

    fn give_back(&self, cost: u64) {
        let _ = self.refund(cost);
    }
}

impl<C: Clock, P: Pool> GlobalScope for LeasedBucket<C, P> {
    fn take(&self, cost: u64) -> Result<(), Duration> {
        paid(self.try_acquire(cost))
    }

    fn give_back(&self, cost: u64) {
        let _ = self.refund(cost);
    }
}

impl GlobalScope for RemoteBucket {
    fn take(&self, cost: u64) -> Result<(), Duration> {
        match self.try_acquire(cost) {
            Ok(_) => Ok(()),
            Err(
                crate::Refused::Rejected { retry_after }
                | crate::Refused::Unavailable { retry_after },
            ) => Err(retry_after),
            Err(crate::Refused::Cost { .. }) => Err(Duration::MAX),
        }
    }

    fn give_back(&self, cost: u64) {
        self.refund(cost);
    }
}

/// Why [`GlobalThenScopes::try_acquire`] refused. Nothing is charged in either case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ComposedRefused {
    /// The global scope refused; the keyed scopes were not asked.
    Global {
        /// When it could pay ([`Duration::MAX`]: never, the cost is above its capacity).
        retry_after: Duration,
    },
    /// The keyed scopes refused (or the request was malformed); the global cost was
    /// given back.
    Scopes(StrictRefused),
}

impl std::fmt::Display for ComposedRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Global { retry_after } => {
                write!(
                    f,
                    "the global scope is rate limited; retry after {retry_after:?}"
                )
            }
            Self::Scopes(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ComposedRefused {}

/// A global scope decided locally, then a request's keyed scopes decided in Redis.
///
/// ```no_run
/// use tokengate::{Bucket, Policy};
/// use tokengate_redis::{GlobalThenScopes, PoolConfig, RedisScopes, RemotePolicy};
/// let scopes = RedisScopes::connect(PoolConfig::new("redis://127.0.0.1:6379/", "api"))?;
/// let tenant = scopes.scope("tenant", RemotePolicy::new(1000, 100.0)?)?;
/// let user = scopes.scope("user", RemotePolicy::new(20, 2.0)?)?;
/// let limiter = GlobalThenScopes::new(Bucket::new(Policy::new(10_000, 5_000.0)?), scopes);
/// let decision = limiter.try_acquire(1, "acme", &[(&tenant, "acme", 1), (&user, "alice", 1)]);
/// println!("{decision:?}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct GlobalThenScopes<G> {
    global: G,
    scopes: RedisScopes,
}

impl<G: GlobalScope> GlobalThenScopes<G> {
    /// `global` paid first, then `scopes`.
    pub fn new(global: G, scopes: RedisScopes) -> Self {
        Self { global, scopes }
    }

    /// The global scope.
    pub fn global(&self) -> &G {
        &self.global
    }

    /// The keyed scopes.
    pub fn scopes(&self) -> &RedisScopes {
        &self.scopes
    }

    /// Takes `global_cost` from the global scope, then each item's cost from its keyed
    /// scope in Redis (all or nothing, one script call tagged `tag`); gives the global cost
    /// back when the keyed scopes refuse. A malformed request is refused before anything
    /// is taken.
    ///
    /// # Errors
    ///
    /// [`ComposedRefused::Global`] when the global scope refuses (Redis not asked),
    /// [`ComposedRefused::Scopes`] when the keyed scopes refuse or the request is
    /// malformed (the global cost given back, or never taken).
    pub fn try_acquire(
        &self,
        global_cost: u64,
        tag: &str,
        items: &[(&StrictScope, &str, u64)],
    ) -> Result<StrictAdmitted, ComposedRefused> {
        self.scopes
            .check(tag, items)
            .map_err(|e| ComposedRefused::Scopes(StrictRefused::Invalid(e)))?;
        self.global
            .take(global_cost)
            .map_err(|retry_after| ComposedRefused::Global { retry_after })?;
        self.scopes.try_acquire(tag, items).map_err(|e| {
            self.global.give_back(global_cost);
            ComposedRefused::Scopes(e)
        })
    }
}
