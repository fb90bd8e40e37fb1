//! [`RedisScopes`]: a request's keyed scopes (tenant, user, API key, ...) decided strictly
//! in Redis, all or nothing, one script call per request; no lease, so nothing is stranded
//! and the fleet admits at most `B + r*T` per key (plus the clock term), at one round trip
//! per decision. For low-rate keyed scopes; keep the hot global scope local or leased
//! ([`GlobalThenScopes`](crate::GlobalThenScopes)).
//!
//! Every key of one call is `tg:{namespace:tag}:s:scope:key`: one hash tag per request, so
//! Redis Cluster keeps them in one slot and never refuses the script (`CROSSSLOT`).
//!
//! A `RedisScopes` is a member of its namespace's fleet like a [`RedisPool`](crate::RedisPool):
//! it sends the fleet heartbeat (`lua/fleet.lua`, on Redis `TIME`) when it connects and then
//! after a take at most every half lease lifetime, and keeps the count Redis replies for
//! [`FailMode::Local`]'s shares.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use tokengate::KeyedLimiter;

#[allow(unused_imports)] // named by the docs
use crate::config::FailMode;
use crate::config::PoolConfig;
use crate::connect::{self, Link};
use crate::error::PoolError;
use crate::policy::RemotePolicy;
use crate::script::{Reply, bad_reply, is_noscript, parse_take};
use crate::strict_core::{StrictCore, now_us};

/// The most scopes one call decides.
pub const MAX_STRICT_SCOPES: usize = 16;
/// The longest key, bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// Connections a [`RedisScopes`] spreads its calls over.
const CONNECTIONS: usize = 4;
/// Keys per scope in [`FailMode::Local`]'s local buckets.
const LOCAL_KEYS: usize = 100_000;

/// One keyed scope decided in Redis: its name and the policy of each of its keys.
#[derive(Clone, Debug)]
pub struct StrictScope {
    pub(crate) name: String,
    pub(crate) policy: RemotePolicy,
    /// [`FailMode::Local`]'s buckets, built during an outage for the fleet size of the
    /// time (and built again when a later outage sees another).
    pub(crate) local: Arc<RwLock<Option<LocalShares>>>,
}

/// A scope's local buckets for a fleet of `instances`: `None` when a share rounds down to
/// nothing ([`RemotePolicy::share`]).
#[derive(Debug)]
pub(crate) struct LocalShares {
    instances: u64,
    limiter: Option<KeyedLimiter<String>>,
}

impl StrictScope {
    /// The scope's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The policy of each of its keys.
    pub fn policy(&self) -> &RemotePolicy {
        &self.policy
    }

    /// Runs `f` on the local buckets for a fleet of `k` instances, built (again) when the
    /// ones held were built for another `k`.
    pub(crate) fn on_local<R>(
        &self,
        k: u64,
        f: impl FnOnce(Option<&KeyedLimiter<String>>) -> R,
    ) -> R {
        {
            let held = self.local.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(l) = held.as_ref().filter(|l| l.instances == k) {
                return f(l.limiter.as_ref());
            }
        }
        let mut held = self.local.write().unwrap_or_else(PoisonError::into_inner);
        if held.as_ref().is_none_or(|l| l.instances != k) {
            let limiter = self
                .policy
                .share(k)
                .and_then(|p| KeyedLimiter::new(p, LOCAL_KEYS).ok());
            *held = Some(LocalShares {
                instances: k,
                limiter,
            });
        }
        f(held.as_ref().and_then(|l| l.limiter.as_ref()))
    }
}

/// How a strict decision was admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrictAdmitted {
    /// Redis took the cost from every scope.
    Taken,
    /// Redis unreachable: admitted by [`FailMode::FailOpen`].
    FailOpen,
    /// Redis unreachable: paid by [`FailMode::Local`]'s local buckets.
    Local,
}

/// A request a strict decision refuses to look at: nothing is taken, nothing written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InvalidRequest {
    /// No scope named.
    NoScopes,
    /// More scopes than [`MAX_STRICT_SCOPES`].
    TooManyScopes {
        /// How many were named.
        count: usize,
    },
    /// The tag is empty or holds `{` or `}` (it would break the hash tag).
    Tag(String),
    /// The key at `index` is empty or longer than [`MAX_KEY_BYTES`].
    Key {
        /// Which item.
        index: usize,
    },
    /// The cost at `index` is zero or above its scope's capacity.
    Cost {
        /// Which item.
        index: usize,
        /// The cost asked.
        cost: u64,
        /// The scope's capacity.
        max: u64,
    },
}

impl std::fmt::Display for InvalidRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoScopes => write!(f, "no scope named"),
            Self::TooManyScopes { count } => {
                write!(
                    f,
                    "at most {MAX_STRICT_SCOPES} scopes per call, got {count}"
                )
            }
            Self::Tag(t) => write!(
                f,
                "tag {t:?} must be non-empty and hold neither '{{' nor '}}'"
            ),
            Self::Key { index } => {
                write!(f, "key {index} must be 1 ..= {MAX_KEY_BYTES} bytes")
            }
            Self::Cost { index, cost, max } => {
                write!(f, "cost {index} must be 1 ..= {max} tokens, got {cost}")
            }
        }
    }
}

/// Why a strict decision refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StrictRefused {
    /// The scope at `index` (the first in order that cannot pay) refused; nothing was
    /// taken from any scope.
    Rejected {
        /// Which item.
        index: usize,
        /// When it could pay.
        retry_after: Duration,
    },
    /// Redis cannot be reached and the fail mode is [`FailMode::FailClosed`].
    Unavailable {
        /// Until the breaker's next probe.
        retry_after: Duration,
    },
    /// The request was malformed.
    Invalid(InvalidRequest),
}

impl std::fmt::Display for StrictRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Rejected { index, retry_after } => {
                write!(
                    f,
                    "scope {index} is rate limited; retry after {retry_after:?}"
                )
            }
            Self::Unavailable { retry_after } => {
                write!(
                    f,
                    "the keyed scopes are unreachable; retry after {retry_after:?}"
                )
            }
            Self::Invalid(e) => write!(f, "invalid request: {e}"),
        }
    }
}

impl std::error::Error for StrictRefused {}

/// A request's keyed scopes decided in Redis, all or nothing, in one `EVALSHA` of the
/// strict take script (`lua/take.lua`) per request.
///
/// Calls share a few connections (each call holds one for its round trip, within the
/// exchange timeout). A failed call counts against a circuit breaker (three in a row open
/// it; probes after a full-jitter backoff); while it is open, decisions follow the fail
/// mode at once, without touching the network: [`FailMode::FailClosed`] refuses,
/// [`FailMode::FailOpen`] admits (counted), [`FailMode::Local`] decides on a local bucket
/// per key of `B/K` tokens refilled at `r/K`, both rounded down
/// ([`RemotePolicy::share`]), `K` the fleet size Redis last reported
/// ([`instances_seen`](RedisScopes::instances_seen)); a scope whose share rounds down to
/// nothing (`B < K`, or `r` below `K` milli-tokens per second) refuses with
/// [`StrictRefused::Unavailable`]. A call is not retried: a take whose reply was lost may
/// have been charged, so the fleet admits less, never more.
///
/// The count comes from the fleet heartbeat on `tg:{namespace}:fleet`, shared with every
/// [`RedisPool`](crate::RedisPool) of the namespace: sent at connect and then after a take
/// once half a lease lifetime has passed since the last (one more round trip, on that
/// call's connection). An instance counts for two lease lifetimes after its last beat, so
/// a `RedisScopes` silent for longer drops out of the others' count: the fleet's local
/// shares then hold its part of `B` as well, which it may spend in an outage.
///
/// ```no_run
/// use tokengate_redis::{PoolConfig, RedisScopes, RemotePolicy, StrictRefused};
/// let scopes = RedisScopes::connect(PoolConfig::new("redis://127.0.0.1:6379/", "api"))?;
/// let tenant = scopes.scope("tenant", RemotePolicy::new(1000, 100.0)?)?;
/// let user = scopes.scope("user", RemotePolicy::new(20, 2.0)?)?;
/// // One hash tag per request: the tenant.
/// match scopes.try_acquire("acme", &[(&tenant, "acme", 1), (&user, "alice", 1)]) {
///     Ok(_) => { /* serve */ }
///     Err(StrictRefused::Rejected { index, retry_after }) => {
///         println!("scope {index} refused; retry after {retry_after:?}");
///     }
///     Err(e) => println!("{e}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RedisScopes {
    core: StrictCore,
    connections: Vec<Mutex<Option<Link>>>,
    next: AtomicUsize,
}

impl std::fmt::Debug for RedisScopes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisScopes")
            .field("config", &self.core.config)
            .field("connections", &self.connections.len())
            .finish_non_exhaustive()
    }
}

impl RedisScopes {
    /// Connects (one connection now, the others on first use) and loads the scripts.
    ///
    /// # Errors
    ///
    /// As [`RedisPool::connect`](crate::RedisPool::connect): a typed [`PoolError`] within
    /// the connect and exchange timeouts, never a panic or a hang.
    pub fn connect(config: PoolConfig) -> Result<Self, PoolError> {
        let core = StrictCore::new(config, "strict")?;
        let first = connect::open(&core.config, &core.scripts)?;
        let mut connections: Vec<_> = (0..CONNECTIONS).map(|_| Mutex::new(None)).collect();
        connections[0] = Mutex::new(Some(first));
        let scopes = Self {
            core,
            connections,
            next: AtomicUsize::new(0),
        };
        // Counted from the start; a beat that fails here is sent again with the next take.
        let mut slot = scopes.connections[0]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(con) = slot.as_mut() {
            if !scopes.beat_if_due(con, now_us()) {
                *slot = None;
            }
        }
        drop(slot);
        Ok(scopes)
    }

    /// A keyed scope named `name` whose every key has `policy`.
    ///
    /// # Errors
    ///
    /// [`PoolError::Scope`] when `name` is empty or holds `:`, `{` or `}`.
    pub fn scope(&self, name: &str, policy: RemotePolicy) -> Result<StrictScope, PoolError> {
        StrictCore::scope(name, policy)
    }

    /// The Redis key of `scope`'s bucket for `key` in calls tagged `tag`:
    /// `tg:{namespace:tag}:s:scope:key`.
    pub fn key(&self, tag: &str, scope: &StrictScope, key: &str) -> String {
        self.core.key(tag, scope, key)
    }

    /// Checks a request without deciding it.
    ///
    /// # Errors
    ///
    /// The first thing wrong with it.
    pub fn check(
        &self,
        tag: &str,
        items: &[(&StrictScope, &str, u64)],
    ) -> Result<(), InvalidRequest> {
        StrictCore::check(tag, items)
    }

    /// Takes each item's cost from its scope's bucket for its key, all or nothing, in one
    /// script call whose keys share the hash tag `{namespace:tag}` (use the request's
    /// partition key, such as the tenant). Items are checked in order; the first that
    /// cannot pay is named.
    ///
    /// While the breaker is open, one caller at a time sends the probe once it is due;
    /// the others follow the fail mode at once instead of queueing behind it.
    ///
    /// # Errors
    ///
    /// [`StrictRefused::Rejected`] naming the first scope that cannot pay (nothing taken);
    /// [`StrictRefused::Unavailable`] when Redis is unreachable under
    /// [`FailMode::FailClosed`] (or, under [`FailMode::Local`], a key the local buckets
    /// cannot hold); [`StrictRefused::Invalid`] for a malformed request (nothing taken,
    /// nothing written).
    pub fn try_acquire(
        &self,
        tag: &str,
        items: &[(&StrictScope, &str, u64)],
    ) -> Result<StrictAdmitted, StrictRefused> {
        StrictCore::check(tag, items).map_err(StrictRefused::Invalid)?;
        let Some(claim) = self.core.enter() else {
            return self.core.fail(items);
        };
        let started = self.core.now_ns();
        let taken = self.on_connection(|con, now_us| {
            let raw: Vec<i64> = match self.core.take_cmd(tag, items, now_us).query(con) {
                Err(e) if is_noscript(&e) => {
                    self.core.scripts.load(con)?;
                    self.core.take_cmd(tag, items, now_us).query(con)?
                }
                r => r?,
            };
            let taken = parse_take(&raw, items.len())?;
            // With `WAIT`, a take counts only once the replicas hold it.
            if let Some(wait) = self.core.wait_after(tag, items, &taken) {
                let acked = con.wait(&[wait.key.as_str()], wait.replicas, wait.timeout)?;
                wait.acknowledged(acked)?;
            }
            Ok(taken)
        });
        self.core.finish(claim, started, taken, items)
    }

    /// Decisions admitted by [`FailMode::FailOpen`] so far.
    pub fn fail_open_admitted(&self) -> u64 {
        self.core.fail_open_admitted()
    }

    /// Decisions admitted by [`FailMode::Local`]'s local buckets so far.
    pub fn local_admitted(&self) -> u64 {
        self.core.local_admitted()
    }

    /// The fleet size Redis last reported (the instances of the namespace, pools and
    /// scopes, that sent a heartbeat within two lease lifetimes, this one included), or
    /// the configured [`instances`](PoolConfig::instances) until it has reported one.
    pub fn instances_seen(&self) -> u64 {
        self.core.instances_seen()
    }

    /// Whether the breaker is open (Redis unreachable).
    pub fn is_unavailable(&self) -> bool {
        self.core.is_unavailable()
    }

    /// Gives back each item's cost, taken by an earlier
    /// [`try_acquire`](RedisScopes::try_acquire) tagged `tag` and not used: credited to
    /// its key's bucket (capped at the capacity), one exchange per item on one
    /// connection. Best effort: nothing is sent for a malformed request or while the
    /// breaker is open, and a failed call is not retried; a give back that is lost makes
    /// the fleet admit less, never more. A cost admitted by a fail mode (open, or local
    /// buckets) is given to Redis all the same.
    pub fn give_back(&self, tag: &str, items: &[(&StrictScope, &str, u64)]) {
        if StrictCore::check(tag, items).is_err() || self.is_unavailable() {
            return;
        }
        let sent = self.on_connection(|con, now_us| {
            for cmd in self.core.give_back_cmds(tag, items, now_us) {
                let raw: Vec<i64> = match cmd.query(con) {
                    Err(e) if is_noscript(&e) => {
                        self.core.scripts.load(con)?;
                        cmd.query(con)?
                    }
                    r => r?,
                };
                Reply::parse(&raw).ok_or_else(|| bad_reply(&raw))?;
            }
            Ok(())
        });
        if sent.is_err() {
            self.core.failure();
        }
    }

    /// Runs `f` on one of the connections (opened again when it failed before) at the
    /// wall-clock time of the call, µs, then beats if due; the connection is kept unless
    /// `f` or the beat failed.
    fn on_connection<R>(
        &self,
        f: impl FnOnce(&mut Link, u64) -> redis::RedisResult<R>,
    ) -> redis::RedisResult<R> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.connections.len();
        let mut slot = self.connections[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut con = match slot.take() {
            Some(con) => con,
            None => connect::open(&self.core.config, &self.core.scripts).map_err(|e| {
                redis::RedisError::from((redis::ErrorKind::Io, "connect failed", e.to_string()))
            })?,
        };
        let now_us = now_us();
        let done = f(&mut con, now_us)?;
        if self.beat_if_due(&mut con, now_us) {
            *slot = Some(con);
        }
        Ok(done)
    }

    /// Sends the fleet heartbeat on `con` when it is due (one caller at a time) and keeps
    /// the count Redis replies. False when the beat failed: the connection is dropped and
    /// the next take beats again.
    fn beat_if_due(&self, con: &mut Link, now_us: u64) -> bool {
        let Some(cmd) = self.core.beat_cmd(now_us) else {
            return true;
        };
        let beat = match cmd.query(con) {
            Err(e) if is_noscript(&e) => self.core.scripts.load(con).and_then(|()| cmd.query(con)),
            r => r,
        };
        self.core.beat_done(beat)
    }
}
