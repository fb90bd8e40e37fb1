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

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokengate::KeyedLimiter;

use crate::breaker::Breaker;
use crate::config::{FailMode, PoolConfig};
use crate::connect::{self, Link};
use crate::error::PoolError;
use crate::policy::{RemotePolicy, UNITS_PER_TOKEN};
use crate::script::{BucketKeys, Exchange, Scripts, Take, Target};
use crate::series::Metrics;
use crate::worker;

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
    name: String,
    policy: RemotePolicy,
    /// [`FailMode::Local`]'s buckets, built during an outage for the fleet size of the
    /// time (and built again when a later outage sees another).
    local: Arc<RwLock<Option<LocalShares>>>,
}

/// A scope's local buckets for a fleet of `instances`: `None` when a share rounds down to
/// nothing ([`RemotePolicy::share`]).
#[derive(Debug)]
struct LocalShares {
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
    fn on_local<R>(&self, k: u64, f: impl FnOnce(Option<&KeyedLimiter<String>>) -> R) -> R {
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
    config: PoolConfig,
    scripts: Scripts,
    connections: Vec<Mutex<Option<Link>>>,
    next: AtomicUsize,
    breaker: Mutex<Breaker>,
    clock: quanta::Clock,
    start: quanta::Instant,
    fail_open: AtomicU64,
    local: AtomicU64,
    /// This instance's id in the fleet heartbeat's set.
    instance: String,
    /// The fleet size Redis last reported, the configured `instances` until then.
    instances_seen: AtomicU64,
    /// Time (ns, since `start`) from which the next take sends the heartbeat.
    beat_due_ns: AtomicU64,
    metrics: Metrics,
}

impl std::fmt::Debug for RedisScopes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisScopes")
            .field("config", &self.config)
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
        config.validate()?;
        let scripts = Scripts::new(config.time);
        let first = connect::open(&config, &scripts)?;
        let mut connections: Vec<_> = (0..CONNECTIONS).map(|_| Mutex::new(None)).collect();
        connections[0] = Mutex::new(Some(first));
        let clock = quanta::Clock::new();
        let start = clock.now();
        let (instance, seed) = worker::instance_id();
        let scopes = Self {
            breaker: Mutex::new(Breaker::new(config.probe_min, config.probe_max, seed)),
            scripts,
            connections,
            next: AtomicUsize::new(0),
            clock,
            start,
            fail_open: AtomicU64::new(0),
            local: AtomicU64::new(0),
            instance,
            instances_seen: AtomicU64::new(config.instances),
            beat_due_ns: AtomicU64::new(0),
            metrics: Metrics::new("strict"),
            config,
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
        if name.is_empty() || name.contains([':', '{', '}']) {
            return Err(PoolError::Scope(format!(
                "strict scope {name:?} must be non-empty and hold none of ':', '{{', '}}'"
            )));
        }
        Ok(StrictScope {
            name: name.to_owned(),
            policy,
            local: Arc::new(RwLock::new(None)),
        })
    }

    /// The Redis key of `scope`'s bucket for `key` in calls tagged `tag`:
    /// `tg:{namespace:tag}:s:scope:key`.
    pub fn key(&self, tag: &str, scope: &StrictScope, key: &str) -> String {
        format!(
            "tg:{{{}:{tag}}}:s:{}:{key}",
            self.config.namespace, scope.name
        )
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
        if items.is_empty() {
            return Err(InvalidRequest::NoScopes);
        }
        if items.len() > MAX_STRICT_SCOPES {
            return Err(InvalidRequest::TooManyScopes { count: items.len() });
        }
        if tag.is_empty() || tag.contains(['{', '}']) {
            return Err(InvalidRequest::Tag(tag.to_owned()));
        }
        for (index, (scope, key, cost)) in items.iter().enumerate() {
            if key.is_empty() || key.len() > MAX_KEY_BYTES {
                return Err(InvalidRequest::Key { index });
            }
            let max = scope.policy.capacity();
            if *cost == 0 || *cost > max {
                return Err(InvalidRequest::Cost {
                    index,
                    cost: *cost,
                    max,
                });
            }
        }
        Ok(())
    }

    /// Takes each item's cost from its scope's bucket for its key, all or nothing, in one
    /// script call whose keys share the hash tag `{namespace:tag}` (use the request's
    /// partition key, such as the tenant). Items are checked in order; the first that
    /// cannot pay is named.
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
        self.check(tag, items).map_err(StrictRefused::Invalid)?;
        let now = self.now_ns();
        let may_try = self
            .breaker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .may_try(now);
        if may_try {
            let started = self.now_ns();
            let taken = self.take(tag, items);
            if taken.is_ok() {
                // The take, and WAIT's after it.
                self.metrics
                    .round_trips(1 + u64::from(self.config.wait.is_some()));
                self.metrics
                    .latency_ns(self.now_ns().saturating_sub(started));
            }
            match taken {
                Ok(Take::Taken(_)) => {
                    self.breaker_success();
                    return Ok(StrictAdmitted::Taken);
                }
                Ok(Take::Refused {
                    index,
                    retry_after_us,
                }) => {
                    self.breaker_success();
                    // Checked above: a cost never exceeds the capacity, so a retry time
                    // is always given; a missing one is a key whose state has leases out.
                    let retry_after =
                        retry_after_us.map_or(self.config.lease_ttl, Duration::from_micros);
                    return Err(StrictRefused::Rejected { index, retry_after });
                }
                Err(_) => self.breaker_failure(),
            }
        }
        self.fail(items)
    }

    /// Decisions admitted by [`FailMode::FailOpen`] so far.
    pub fn fail_open_admitted(&self) -> u64 {
        self.fail_open.load(Ordering::Relaxed)
    }

    /// Decisions admitted by [`FailMode::Local`]'s local buckets so far.
    pub fn local_admitted(&self) -> u64 {
        self.local.load(Ordering::Relaxed)
    }

    /// The fleet size Redis last reported (the instances of the namespace, pools and
    /// scopes, that sent a heartbeat within two lease lifetimes, this one included), or
    /// the configured [`instances`](PoolConfig::instances) until it has reported one.
    pub fn instances_seen(&self) -> u64 {
        self.instances_seen.load(Ordering::Relaxed)
    }

    /// Whether the breaker is open (Redis unreachable).
    pub fn is_unavailable(&self) -> bool {
        self.breaker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_open()
    }

    fn now_ns(&self) -> u64 {
        self.clock.now().duration_since(self.start).as_nanos() as u64
    }

    /// Gives back each item's cost, taken by an earlier
    /// [`try_acquire`](RedisScopes::try_acquire) tagged `tag` and not used: credited to
    /// its key's bucket (capped at the capacity), one exchange per item on one
    /// connection. Best effort: nothing is sent for a malformed request or while the
    /// breaker is open, and a failed call is not retried; a give back that is lost makes
    /// the fleet admit less, never more. A cost admitted by a fail mode (open, or local
    /// buckets) is given to Redis all the same.
    pub fn give_back(&self, tag: &str, items: &[(&StrictScope, &str, u64)]) {
        if self.check(tag, items).is_err() || self.is_unavailable() {
            return;
        }
        let lease_us = (self.config.lease_ttl + self.config.grace).as_micros() as u64;
        let keep_ms = self.config.key_keep.as_millis() as u64;
        let sent = self.on_connection(|con, now_us| {
            for (scope, key, cost) in items {
                let keys = self.bucket_keys(tag, scope, key);
                let target = Target {
                    keys: &keys,
                    policy: &scope.policy,
                    lease_us,
                    keep_ms,
                };
                let credit = Exchange {
                    credit_units: cost.saturating_mul(UNITS_PER_TOKEN),
                    ..Exchange::default()
                };
                self.scripts.exchange(con, &target, &credit, now_us)?;
            }
            Ok(())
        });
        if sent.is_err() {
            self.breaker_failure();
        }
    }

    /// Records a successful round: the breaker counts it, and a close is exported.
    fn breaker_success(&self) {
        let mut breaker = self.breaker.lock().unwrap_or_else(PoisonError::into_inner);
        let was_open = breaker.is_open();
        if breaker.success() && was_open {
            self.metrics.breaker(false);
        }
    }

    /// Records a failed round: the breaker counts it, and an opening is exported.
    fn breaker_failure(&self) {
        self.metrics.failed_round();
        let now = self.now_ns();
        let mut breaker = self.breaker.lock().unwrap_or_else(PoisonError::into_inner);
        let was_open = breaker.is_open();
        if breaker.failure(now) && !was_open {
            self.metrics.breaker(true);
        }
    }

    /// The keys of `scope`'s bucket for `key` in calls tagged `tag`.
    fn bucket_keys(&self, tag: &str, scope: &StrictScope, key: &str) -> BucketKeys {
        BucketKeys::under(self.key(tag, scope, key))
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
            None => connect::open(&self.config, &self.scripts).map_err(|e| {
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

    /// One script call on one of the connections (opened again when it failed before).
    fn take(&self, tag: &str, items: &[(&StrictScope, &str, u64)]) -> redis::RedisResult<Take> {
        let keys: Vec<BucketKeys> = items
            .iter()
            .map(|(scope, key, _)| self.bucket_keys(tag, scope, key))
            .collect();
        let args: Vec<(&BucketKeys, &RemotePolicy, u64)> = keys
            .iter()
            .zip(items)
            .map(|(k, (scope, _, cost))| (k, &scope.policy, *cost))
            .collect();
        let keep_ms = self.config.key_keep.as_millis() as u64;
        let wait = self.config.wait;
        self.on_connection(|con, now_us| {
            let taken = self.scripts.take(con, &args, keep_ms, now_us)?;
            // With `WAIT`, a take counts only once the replicas hold it: otherwise the
            // call fails (and the fail mode decides), whatever the take wrote.
            if let (Take::Taken(_), Some((replicas, timeout))) = (&taken, wait) {
                let acked = con.wait(&[keys[0].state.as_str()], replicas, timeout)?;
                if acked < replicas {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "too few replicas acknowledged the take",
                    )));
                }
            }
            Ok(taken)
        })
    }

    /// Sends the fleet heartbeat on `con` when it is due (one caller at a time) and keeps
    /// the count Redis replies. False when the beat failed: the connection is dropped and
    /// the next take beats again.
    fn beat_if_due(&self, con: &mut Link, now_us: u64) -> bool {
        let now = self.now_ns();
        let due = self.beat_due_ns.load(Ordering::Relaxed);
        let next = now + self.config.heartbeat_every().as_nanos() as u64;
        if now < due
            || self
                .beat_due_ns
                .compare_exchange(due, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return true;
        }
        let beat = self.scripts.heartbeat(
            con,
            &self.config.fleet_key(),
            &self.instance,
            self.config.fleet_window_us(),
            now_us,
        );
        match beat {
            Ok((k, _)) => {
                self.instances_seen.store(k.max(1), Ordering::Relaxed);
                true
            }
            Err(_) => {
                self.beat_due_ns.store(0, Ordering::Relaxed);
                false
            }
        }
    }

    /// The fail mode's decision while Redis is unreachable.
    fn fail(&self, items: &[(&StrictScope, &str, u64)]) -> Result<StrictAdmitted, StrictRefused> {
        let probe = self
            .breaker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .probe_at()
            .unwrap_or(0);
        let retry_after = Duration::from_nanos(probe.saturating_sub(self.now_ns()))
            .max(self.config.exchange_timeout);
        match self.config.fail_mode {
            FailMode::FailClosed => Err(StrictRefused::Unavailable { retry_after }),
            FailMode::FailOpen => {
                self.fail_open.fetch_add(1, Ordering::Relaxed);
                self.metrics.fail_open(1);
                Ok(StrictAdmitted::FailOpen)
            }
            FailMode::Local => self.local(items, retry_after),
        }
    }

    /// All or nothing on the local buckets: each item taken in order, the taken ones
    /// refunded when one refuses.
    fn local(
        &self,
        items: &[(&StrictScope, &str, u64)],
        retry_after: Duration,
    ) -> Result<StrictAdmitted, StrictRefused> {
        let k = self.instances_seen();
        for (index, (scope, key, cost)) in items.iter().enumerate() {
            let decided = scope.on_local(k, |l| l.map(|l| l.try_acquire(*key, *cost)));
            let refused = match decided {
                Some(Ok(d)) if d.is_admitted() => None,
                Some(Ok(d)) => Some(StrictRefused::Rejected {
                    index,
                    retry_after: d.retry_after().unwrap_or(retry_after),
                }),
                // No local bucket for it (a share of nothing, a cost above B/K, a full
                // map): unavailable.
                _ => Some(StrictRefused::Unavailable { retry_after }),
            };
            if let Some(refused) = refused {
                for (scope, key, cost) in &items[..index] {
                    scope.on_local(k, |l| l.map(|l| l.refund(*key, *cost)));
                }
                return Err(refused);
            }
        }
        self.local.fetch_add(1, Ordering::Relaxed);
        self.metrics.local(1);
        Ok(StrictAdmitted::Local)
    }
}

/// Wall-clock µs since the epoch: the time the scripts read under
/// [`TimeSource::Argument`](crate::script::TimeSource::Argument).
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
