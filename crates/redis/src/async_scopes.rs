//! [`AsyncRedisScopes`]: the strict per-request decisions of [`RedisScopes`] for async
//! services (feature `tokio`): one multiplexed connection, no thread ever waits on the
//! network, each call bounded by the exchange timeout, one probe in flight while the
//! breaker is open. The decision logic is [`RedisScopes`]'s own (`strict_core`): the same
//! checks, keys, script, reply, breaker and fail modes.
//!
//! [`RedisScopes`]: crate::RedisScopes

use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::config::PoolConfig;
use crate::connect;
use crate::error::PoolError;
use crate::policy::RemotePolicy;
use crate::script::{Reply, Take, bad_reply, is_noscript, parse_take};
use crate::strict::{InvalidRequest, StrictAdmitted, StrictRefused, StrictScope};
use crate::strict_core::{StrictCore, now_us};

/// Why a call to Redis failed (the decision then followed the fail mode); the latest is
/// kept by [`AsyncRedisScopes::last_failure`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallError {
    /// No reply within the exchange timeout (a stalled or black-holed server).
    Timeout {
        /// The timeout that applied.
        after: Duration,
    },
    /// The connection could not be opened again.
    Connect(String),
    /// Redis answered with an error, or the connection broke.
    Redis(String),
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout { after } => write!(f, "no reply from Redis within {after:?}"),
            Self::Connect(e) => write!(f, "cannot connect to Redis: {e}"),
            Self::Redis(e) => write!(f, "Redis call failed: {e}"),
        }
    }
}

impl std::error::Error for CallError {}

/// The held connection and its generation (a failed call drops only the one it used).
#[derive(Default)]
struct Held {
    con: Option<MultiplexedConnection>,
    generation: u64,
}

/// A request's keyed scopes decided in Redis, all or nothing, on a tokio runtime: the
/// async form of [`RedisScopes`](crate::RedisScopes) (feature `tokio`).
///
/// Calls share one multiplexed connection: concurrent calls are pipelined on it, none
/// holds it. Each call is bounded by the [exchange
/// timeout](PoolConfig::exchange_timeout) (a connection opened again, by the connect
/// timeout before that); a call that fails counts against the circuit breaker and the
/// decision follows the fail mode, exactly as the blocking client's. While the breaker
/// is open, the one caller that claims the due probe calls Redis; every other caller
/// follows the fail mode at once, without touching the network. Dropping a call's
/// future (a client that hung up) cancels it; a dropped probe lets the next caller
/// probe.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tokengate_redis::{AsyncRedisScopes, PoolConfig, RemotePolicy, StrictRefused};
/// let scopes = AsyncRedisScopes::connect(PoolConfig::new("redis://127.0.0.1:6379/", "api")).await?;
/// let tenant = scopes.scope("tenant", RemotePolicy::new(1000, 100.0)?)?;
/// match scopes.try_acquire("acme", &[(&tenant, "acme", 1)]).await {
///     Ok(_) => { /* serve */ }
///     Err(StrictRefused::Rejected { retry_after, .. }) => println!("retry after {retry_after:?}"),
///     Err(e) => println!("{e}"),
/// }
/// # Ok(())
/// # }
/// # let _ = run();
/// ```
pub struct AsyncRedisScopes {
    core: StrictCore,
    /// Locked only to copy the handle out or to put one in, never across an `.await`.
    held: Mutex<Held>,
    /// One reconnection at a time: the others wait on it (asynchronously).
    connecting: tokio::sync::Mutex<()>,
    last_failure: Mutex<Option<CallError>>,
}

impl fmt::Debug for AsyncRedisScopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncRedisScopes")
            .field("config", &self.core.config)
            .finish_non_exhaustive()
    }
}

impl AsyncRedisScopes {
    /// Connects, loads the scripts and sends the fleet heartbeat.
    ///
    /// # Errors
    ///
    /// As [`RedisScopes::connect`](crate::RedisScopes::connect): a typed [`PoolError`]
    /// within the connect and exchange timeouts.
    pub async fn connect(config: PoolConfig) -> Result<Self, PoolError> {
        let core = StrictCore::new(config, "strict_async")?;
        let con = connect::open_async(&core.config, &core.scripts).await?;
        let scopes = Self {
            core,
            held: Mutex::new(Held {
                con: Some(con),
                generation: 1,
            }),
            connecting: tokio::sync::Mutex::new(()),
            last_failure: Mutex::new(None),
        };
        if let Some((mut con, generation)) = scopes.handle() {
            if !scopes.beat_if_due(&mut con, now_us()).await {
                scopes.drop_connection(generation);
            }
        }
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

    /// The Redis key of `scope`'s bucket for `key` in calls tagged `tag`, as
    /// [`RedisScopes::key`](crate::RedisScopes::key): both clients share the buckets.
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

    /// As [`RedisScopes::try_acquire`](crate::RedisScopes::try_acquire), awaited: one
    /// script call, all or nothing, bounded by the exchange timeout.
    ///
    /// # Errors
    ///
    /// As [`RedisScopes::try_acquire`](crate::RedisScopes::try_acquire).
    pub async fn try_acquire(
        &self,
        tag: &str,
        items: &[(&StrictScope, &str, u64)],
    ) -> Result<StrictAdmitted, StrictRefused> {
        StrictCore::check(tag, items).map_err(StrictRefused::Invalid)?;
        let Some(claim) = self.core.enter() else {
            return self.core.fail(items);
        };
        let started = self.core.now_ns();
        let taken = self.take(tag, items).await;
        if let Err(e) = &taken {
            self.note(e.clone());
        }
        self.core.finish(claim, started, taken, items)
    }

    /// As [`RedisScopes::give_back`](crate::RedisScopes::give_back), awaited (best
    /// effort, nothing sent while the breaker is open).
    pub async fn give_back(&self, tag: &str, items: &[(&StrictScope, &str, u64)]) {
        if StrictCore::check(tag, items).is_err() || self.core.is_unavailable() {
            return;
        }
        let sent = async {
            let (mut con, generation) = self.connection().await?;
            for cmd in self.core.give_back_cmds(tag, items, now_us()) {
                let raw: Vec<i64> = self.query(&mut con, generation, &cmd).await?;
                Reply::parse(&raw).ok_or_else(|| CallError::Redis(bad_reply(&raw).to_string()))?;
            }
            Ok::<(), CallError>(())
        };
        if let Err(e) = sent.await {
            self.note(e);
            self.core.failure();
        }
    }

    /// Decisions admitted by [`FailMode::FailOpen`](crate::FailMode::FailOpen) so far.
    pub fn fail_open_admitted(&self) -> u64 {
        self.core.fail_open_admitted()
    }

    /// Decisions admitted by [`FailMode::Local`](crate::FailMode::Local)'s local buckets
    /// so far.
    pub fn local_admitted(&self) -> u64 {
        self.core.local_admitted()
    }

    /// The fleet size Redis last reported, as
    /// [`RedisScopes::instances_seen`](crate::RedisScopes::instances_seen).
    pub fn instances_seen(&self) -> u64 {
        self.core.instances_seen()
    }

    /// Whether the breaker is open (Redis unreachable).
    pub fn is_unavailable(&self) -> bool {
        self.core.is_unavailable()
    }

    /// Why the latest failed call failed, if one did.
    pub fn last_failure(&self) -> Option<CallError> {
        self.last_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn note(&self, e: CallError) {
        *self
            .last_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(e);
    }

    /// The take script on the shared connection, `NOSCRIPT` answered by loading the
    /// scripts and sending it again; then the heartbeat if due.
    async fn take(
        &self,
        tag: &str,
        items: &[(&StrictScope, &str, u64)],
    ) -> Result<Take, CallError> {
        let (mut con, generation) = self.connection().await?;
        let now_us = now_us();
        let cmd = self.core.take_cmd(tag, items, now_us);
        let raw: Vec<i64> = self.query(&mut con, generation, &cmd).await?;
        let taken = parse_take(&raw, items.len()).map_err(|e| CallError::Redis(e.to_string()))?;
        // With `WAIT`, a take counts only once the replicas hold it (on the connection
        // that wrote it: the multiplexed one, a single node).
        if let Some(wait) = self.core.wait_after(tag, items, &taken) {
            let acked = self.ask::<u64>(&mut con, generation, &wait.cmd()).await?;
            wait.acknowledged(acked).map_err(|e| {
                self.drop_connection(generation);
                CallError::Redis(e.to_string())
            })?;
        }
        if !self.beat_if_due(&mut con, now_us).await {
            self.drop_connection(generation);
        }
        Ok(taken)
    }

    /// Sends `cmd` within the exchange timeout (loading the scripts once on
    /// `NOSCRIPT`); a failure drops the connection it used.
    async fn query(
        &self,
        con: &mut MultiplexedConnection,
        generation: u64,
        cmd: &redis::Cmd,
    ) -> Result<Vec<i64>, CallError> {
        self.ask(con, generation, cmd).await
    }

    /// [`query`](Self::query) for any reply type.
    async fn ask<T: redis::FromRedisValue>(
        &self,
        con: &mut MultiplexedConnection,
        generation: u64,
        cmd: &redis::Cmd,
    ) -> Result<T, CallError> {
        let timeout = self.core.config.exchange_timeout;
        let call = async {
            match cmd.query_async::<T>(con).await {
                Err(e) if is_noscript(&e) => {
                    self.core.scripts.load_async(con).await?;
                    cmd.query_async(con).await
                }
                r => r,
            }
        };
        let r = match tokio::time::timeout(timeout, call).await {
            Ok(Ok(raw)) => return Ok(raw),
            Ok(Err(e)) if e.is_timeout() => CallError::Timeout { after: timeout },
            Ok(Err(e)) => CallError::Redis(e.to_string()),
            Err(_) => CallError::Timeout { after: timeout },
        };
        if matches!(r, CallError::Timeout { .. }) {
            self.core.metrics.timeout();
        }
        self.drop_connection(generation);
        Err(r)
    }

    /// A copy of the held connection's handle, if one is held.
    fn handle(&self) -> Option<(MultiplexedConnection, u64)> {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.con.clone().map(|c| (c, held.generation))
    }

    /// The held connection, or a new one (one caller connects; the others await it).
    async fn connection(&self) -> Result<(MultiplexedConnection, u64), CallError> {
        if let Some(found) = self.handle() {
            return Ok(found);
        }
        let _gate = self.connecting.lock().await;
        if let Some(found) = self.handle() {
            return Ok(found);
        }
        let config = &self.core.config;
        let bound = config.connect_timeout + config.exchange_timeout;
        let con = match tokio::time::timeout(bound, connect::open_async(config, &self.core.scripts))
            .await
        {
            Ok(Ok(con)) => con,
            Ok(Err(e)) => return Err(CallError::Connect(e.to_string())),
            Err(_) => {
                self.core.metrics.timeout();
                return Err(CallError::Timeout { after: bound });
            }
        };
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.generation += 1;
        held.con = Some(con.clone());
        Ok((con, held.generation))
    }

    /// Drops the held connection if it is still the one of `generation`.
    fn drop_connection(&self, generation: u64) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.generation == generation {
            held.con = None;
        }
    }

    /// The fleet heartbeat when due; false when it failed.
    async fn beat_if_due(&self, con: &mut MultiplexedConnection, now_us: u64) -> bool {
        let Some(cmd) = self.core.beat_cmd(now_us) else {
            return true;
        };
        let timeout = self.core.config.exchange_timeout;
        let beat = tokio::time::timeout(timeout, async {
            match cmd.query_async::<(u64, u64)>(con).await {
                Err(e) if is_noscript(&e) => {
                    self.core.scripts.load_async(con).await?;
                    cmd.query_async(con).await
                }
                r => r,
            }
        })
        .await
        .map_err(drop)
        .and_then(|r| r.map_err(drop));
        self.core.beat_done(beat)
    }
}
