//! The Lua scripts, invoked by SHA, and the typed form of one exchange and its reply.
//!
//! Each script is composed at build time from three Lua sources: a clock prologue, the
//! refill fragment both scripts share (`lua/refill.lua`: one definition), and its body
//! (`lua/exchange.lua`, `lua/take.lua`); the fleet heartbeat (`lua/fleet.lua`) is a clock
//! prologue and its body. The production prologue reads Redis `TIME`; the
//! test prologue reads `now` (µs) from the last argument, so tests drive refill, reclaim
//! and clock steps exactly.

use redis::{ConnectionLike, RedisResult, Script};

use crate::policy::{Mode, RemotePolicy, Start};

/// A script's source: the clock prologue, the shared refill, the body.
macro_rules! compose {
    ($clock:literal, $body:literal) => {
        concat!(
            include_str!(concat!("../lua/", $clock)),
            include_str!("../lua/refill.lua"),
            include_str!(concat!("../lua/", $body)),
        )
    };
}

const EXCHANGE_ON_REDIS_TIME: &str = compose!("clock_redis.lua", "exchange.lua");
const EXCHANGE_ON_ARGUMENT: &str = compose!("clock_arg.lua", "exchange.lua");
const TAKE_ON_REDIS_TIME: &str = compose!("clock_redis.lua", "take.lua");
const TAKE_ON_ARGUMENT: &str = compose!("clock_arg.lua", "take.lua");
const FLEET_ON_REDIS_TIME: &str = concat!(
    include_str!("../lua/clock_redis.lua"),
    include_str!("../lua/fleet.lua")
);
const FLEET_ON_ARGUMENT: &str = concat!(
    include_str!("../lua/clock_arg.lua"),
    include_str!("../lua/fleet.lua")
);

/// Where the scripts read the time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSource {
    /// Redis `TIME` (µs since the Unix epoch on the server's wall clock).
    Redis,
    /// The caller's `now` argument: for tests that need exact time.
    Argument,
}

/// The compiled scripts, each loaded on demand by SHA (`EVALSHA`; `NOSCRIPT` loads and
/// retries, and means the script did not run).
#[derive(Debug, Clone)]
pub struct Scripts {
    exchange: Script,
    take: Script,
    fleet: Script,
    time: TimeSource,
}

/// The three keys of one bucket, under one hash tag so a cluster keeps them in one slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketKeys {
    /// The state hash.
    pub state: String,
    /// Lease id -> granted tokens.
    pub leases: String,
    /// Lease ids by reclaim time (µs).
    pub expiry: String,
    /// Credit ids applied, by the time each was applied (µs): a credit is applied once.
    pub credits: String,
}

impl BucketKeys {
    /// The keys of bucket `scope` in `namespace`: `tg:{namespace:scope}` and its `:l`, `:x`.
    ///
    /// # Errors
    ///
    /// A message naming the offending text when either part is empty or holds `{` or `}`
    /// (which would break the hash tag).
    pub fn new(namespace: &str, scope: &str) -> Result<Self, String> {
        for (what, s) in [("namespace", namespace), ("scope", scope)] {
            if s.is_empty() || s.contains(['{', '}']) {
                return Err(format!(
                    "{what} {s:?} must be non-empty and hold neither '{{' nor '}}'"
                ));
            }
        }
        Ok(Self::under(format!("tg:{{{namespace}:{scope}}}")))
    }

    /// The keys of the bucket whose state hash is `state`: it and its `:l`, `:x`, `:c`.
    pub fn under(state: String) -> Self {
        Self {
            leases: format!("{state}:l"),
            expiry: format!("{state}:x"),
            credits: format!("{state}:c"),
            state,
        }
    }

    /// Every key of the bucket.
    pub fn all(&self) -> [&str; 4] {
        [&self.state, &self.leases, &self.expiry, &self.credits]
    }
}

/// Which bucket an exchange is for, under which policy and lease lifetimes.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// The bucket's keys.
    pub keys: &'a BucketKeys,
    /// Its policy.
    pub policy: &'a RemotePolicy,
    /// A grant's lifetime on Redis (ttl + grace), µs: its reclaim time is the grant time
    /// plus this.
    pub lease_us: u64,
    /// How long past its time-to-full an idle state key is kept, ms.
    pub keep_ms: u64,
}

/// What one exchange asks.
#[derive(Clone, Debug, Default)]
pub struct Exchange {
    /// The grant's request id (`None`: settle, credit or peek only). The same id twice is
    /// one grant.
    pub request_id: Option<String>,
    /// The smallest grant accepted, tokens (at least 1 when a grant is asked).
    pub need: u64,
    /// The largest grant wanted, tokens.
    pub want: u64,
    /// New credit (a refund), units.
    pub credit_units: u64,
    /// The credit's id: a credit whose id Redis applied within the credit window (eight
    /// lease lifetimes, at least a minute) is not applied again, so a retried exchange
    /// credits once. `None`: applied every time it is sent.
    pub credit_id: Option<String>,
    /// Leases given back: (lease id, unspent tokens).
    pub settle: Vec<(String, u64)>,
    /// Leases re-registered after the bucket's state was lost: (lease id, tokens the
    /// holder can still spend). Ids the state knows are skipped.
    pub register: Vec<(String, u64)>,
    /// Further grants in the same call, by their request ids: when the first grant is
    /// granted or replayed, each is granted up to `want` tokens (at least 1, while the
    /// balance holds one), or replays what its id was granted before.
    pub more: Vec<String>,
}

/// How an exchange's grant went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A new lease was granted.
    Granted {
        /// Tokens leased.
        tokens: u64,
        /// Redis's reclaim time for the lease, µs.
        reclaim_at_us: u64,
    },
    /// The request id was already granted: the recorded grant, nothing new.
    Replayed {
        /// Tokens leased by the first grant.
        tokens: u64,
        /// Its reclaim time, µs.
        reclaim_at_us: u64,
    },
    /// The balance cannot pay the need; the grant wrote nothing.
    Rejected {
        /// µs until the balance could pay, or `None` when only a settlement can help
        /// (the need exceeds what refill may reach).
        retry_after_us: Option<u64>,
    },
    /// No grant was asked.
    NoGrant,
}

/// The reply of one exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The grant.
    pub outcome: Outcome,
    /// The balance after the exchange, units.
    pub balance_units: u64,
    /// Tokens out on lease after the exchange.
    pub outstanding: u64,
    /// The bucket's epoch: its creation time; a new epoch means the state was lost.
    pub epoch: u64,
    /// Redis's time of the exchange, µs.
    pub now_us: u64,
    /// Per further grant asked ([`Exchange::more`]), in order: (tokens, reclaim time
    /// µs); (0, 0) when none was granted.
    pub more: Vec<(u64, u64)>,
}

impl Reply {
    /// Parses the script's integer array.
    pub(crate) fn parse(v: &[i64]) -> Option<Self> {
        let (&[status, granted, third, u, out, ep, now], more) = v.split_first_chunk::<7>()?;
        if more.len() % 2 != 0 {
            return None;
        }
        let nonneg = |x: i64| u64::try_from(x).ok();
        let outcome = match status {
            1 => Outcome::Granted {
                tokens: nonneg(granted)?,
                reclaim_at_us: nonneg(third)?,
            },
            2 => Outcome::Replayed {
                tokens: nonneg(granted)?,
                reclaim_at_us: nonneg(third)?,
            },
            0 => Outcome::Rejected {
                retry_after_us: nonneg(third),
            },
            3 => Outcome::NoGrant,
            _ => return None,
        };
        Some(Self {
            outcome,
            balance_units: nonneg(u)?,
            outstanding: nonneg(out)?,
            epoch: nonneg(ep)?,
            now_us: nonneg(now)?,
            more: more
                .chunks_exact(2)
                .map(|p| Some((nonneg(p[0])?, nonneg(p[1])?)))
                .collect::<Option<Vec<_>>>()?,
        })
    }
}

/// A reply the scripts cannot have produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadReply(pub String);

impl Scripts {
    /// The scripts reading time from `time`.
    pub fn new(time: TimeSource) -> Self {
        let (exchange, take, fleet) = match time {
            TimeSource::Redis => (
                EXCHANGE_ON_REDIS_TIME,
                TAKE_ON_REDIS_TIME,
                FLEET_ON_REDIS_TIME,
            ),
            TimeSource::Argument => (EXCHANGE_ON_ARGUMENT, TAKE_ON_ARGUMENT, FLEET_ON_ARGUMENT),
        };
        Self {
            exchange: Script::new(exchange),
            take: Script::new(take),
            fleet: Script::new(fleet),
            time,
        }
    }

    /// Where these scripts read the time.
    pub fn time_source(&self) -> TimeSource {
        self.time
    }

    /// Loads every script (`SCRIPT LOAD`), so a later pipeline finds them.
    ///
    /// # Errors
    ///
    /// The connection's error.
    pub fn load(&self, con: &mut dyn ConnectionLike) -> RedisResult<()> {
        self.exchange.prepare_invoke().load(con)?;
        self.take.prepare_invoke().load(con)?;
        self.fleet.prepare_invoke().load(con).map(drop)
    }

    /// The SHA1 of the exchange script.
    pub fn exchange_sha(&self) -> &str {
        self.exchange.get_hash()
    }

    /// The `EVALSHA` arguments of the fleet heartbeat after the SHA: key count, the fleet
    /// key, this instance's id and the window (µs) within which an instance counts as
    /// seen. It replies `{instances seen, Redis's now (µs)}`, this instance included.
    /// `now_us` is appended for [`TimeSource::Argument`] scripts and ignored otherwise.
    pub fn heartbeat_args(
        &self,
        fleet_key: &str,
        instance: &str,
        window_us: u64,
        now_us: u64,
    ) -> Vec<String> {
        let mut a = vec![
            "1".to_owned(),
            fleet_key.to_owned(),
            instance.to_owned(),
            window_us.to_string(),
        ];
        if self.time == TimeSource::Argument {
            a.push(now_us.to_string());
        }
        a
    }

    /// The SHA1 of the fleet heartbeat script.
    pub fn heartbeat_sha(&self) -> &str {
        self.fleet.get_hash()
    }

    /// Runs the fleet heartbeat alone by `EVALSHA` (loading the scripts on `NOSCRIPT`),
    /// with the arguments of [`Scripts::heartbeat_args`]; returns `(instances seen,
    /// Redis's now in µs)`.
    ///
    /// # Errors
    ///
    /// The connection's or server's error; a reply of the wrong shape is a
    /// [`redis::ErrorKind::Parse`] error.
    pub fn heartbeat(
        &self,
        con: &mut dyn ConnectionLike,
        fleet_key: &str,
        instance: &str,
        window_us: u64,
        now_us: u64,
    ) -> RedisResult<(u64, u64)> {
        let cmd = self.heartbeat_cmd(fleet_key, instance, window_us, now_us);
        match cmd.query(con) {
            Err(e) if is_noscript(&e) => {
                self.load(con)?;
                cmd.query(con)
            }
            r => r,
        }
    }

    /// The `EVALSHA` of [`Scripts::heartbeat`].
    pub(crate) fn heartbeat_cmd(
        &self,
        fleet_key: &str,
        instance: &str,
        window_us: u64,
        now_us: u64,
    ) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.heartbeat_sha())
            .arg(self.heartbeat_args(fleet_key, instance, window_us, now_us));
        cmd
    }

    /// The `EVALSHA` arguments of one exchange after the SHA: key count, keys, argv.
    /// `now_us` is appended for [`TimeSource::Argument`] scripts and ignored otherwise.
    pub fn exchange_args(&self, target: &Target<'_>, ex: &Exchange, now_us: u64) -> Vec<String> {
        let Target {
            keys,
            policy,
            lease_us,
            keep_ms,
        } = *target;
        let mut a = vec![
            "4".to_owned(),
            keys.state.clone(),
            keys.leases.clone(),
            keys.expiry.clone(),
            keys.credits.clone(),
            policy.capacity_units().to_string(),
            policy.rate_milli().to_string(),
            u8::from(policy.mode() == Mode::Loose).to_string(),
            u8::from(policy.start() == Start::Full).to_string(),
            lease_us.to_string(),
            keep_ms.to_string(),
            ex.request_id.clone().unwrap_or_default(),
            ex.need.to_string(),
            ex.want.to_string(),
            ex.credit_units.to_string(),
            ex.credit_id.clone().unwrap_or_default(),
            ex.settle.len().to_string(),
        ];
        for (id, back) in &ex.settle {
            a.push(id.clone());
            a.push(back.to_string());
        }
        a.push(ex.register.len().to_string());
        for (id, g) in &ex.register {
            a.push(id.clone());
            a.push(g.to_string());
        }
        a.push(ex.more.len().to_string());
        a.extend(ex.more.iter().cloned());
        if self.time == TimeSource::Argument {
            a.push(now_us.to_string());
        }
        a
    }

    /// Runs one exchange by `EVALSHA` (loading the script on `NOSCRIPT`).
    ///
    /// # Errors
    ///
    /// The connection's or server's error; a reply of the wrong shape is a
    /// [`redis::ErrorKind::Parse`] error.
    pub fn exchange(
        &self,
        con: &mut dyn ConnectionLike,
        target: &Target<'_>,
        ex: &Exchange,
        now_us: u64,
    ) -> RedisResult<Reply> {
        let cmd = self.exchange_cmd(target, ex, now_us);
        let raw: Vec<i64> = match cmd.query(con) {
            Err(e) if is_noscript(&e) => {
                self.load(con)?;
                cmd.query(con)?
            }
            r => r?,
        };
        Reply::parse(&raw).ok_or_else(|| bad_reply(&raw))
    }

    /// The `EVALSHA` of [`Scripts::exchange`].
    pub(crate) fn exchange_cmd(
        &self,
        target: &Target<'_>,
        ex: &Exchange,
        now_us: u64,
    ) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.exchange_sha())
            .arg(self.exchange_args(target, ex, now_us));
        cmd
    }

    /// [`Scripts::load`] on an async connection.
    #[cfg(feature = "tokio")]
    pub(crate) async fn load_async(
        &self,
        con: &mut redis::aio::MultiplexedConnection,
    ) -> RedisResult<()> {
        self.exchange.prepare_invoke().load_async(con).await?;
        self.take.prepare_invoke().load_async(con).await?;
        self.fleet.prepare_invoke().load_async(con).await.map(drop)
    }
}

/// The answer of a strict, all-or-nothing [`Scripts::take`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Take {
    /// Every bucket paid; their balances after, units, in the order asked.
    Taken(Vec<u64>),
    /// The bucket at `index` (0-based, the first in order) cannot pay; nothing was taken
    /// and nothing written but missing keys' creation.
    Refused {
        /// Which bucket.
        index: usize,
        /// µs until it could pay, or `None` when its capacity is below the cost.
        retry_after_us: Option<u64>,
    },
}

impl Scripts {
    /// Strict per-request mode: takes `cost` whole tokens from each bucket, all or nothing,
    /// in one script (no lease; one round trip per decision). For low-rate keyed scopes
    /// whose keys share a hash tag: a cluster refuses keys of different slots.
    ///
    /// # Errors
    ///
    /// The connection's or server's error; a reply of the wrong shape is a
    /// [`redis::ErrorKind::Parse`] error.
    pub fn take(
        &self,
        con: &mut dyn ConnectionLike,
        items: &[(&BucketKeys, &RemotePolicy, u64)],
        keep_ms: u64,
        now_us: u64,
    ) -> RedisResult<Take> {
        let cmd = self.take_cmd(items, keep_ms, now_us);
        let raw: Vec<i64> = match cmd.query(con) {
            Err(e) if is_noscript(&e) => {
                self.load(con)?;
                cmd.query(con)?
            }
            r => r?,
        };
        parse_take(&raw, items.len())
    }

    /// The `EVALSHA` of [`Scripts::take`]: one command, the same for a blocking and an
    /// async connection.
    pub(crate) fn take_cmd(
        &self,
        items: &[(&BucketKeys, &RemotePolicy, u64)],
        keep_ms: u64,
        now_us: u64,
    ) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.take.get_hash()).arg(items.len());
        for (keys, _, _) in items {
            cmd.arg(&keys.state);
        }
        for (_, policy, cost) in items {
            cmd.arg(policy.capacity_units())
                .arg(policy.rate_milli())
                .arg(u8::from(policy.start() == Start::Full))
                .arg(*cost);
        }
        cmd.arg(keep_ms);
        if self.time == TimeSource::Argument {
            cmd.arg(now_us);
        }
        cmd
    }
}

/// The typed answer of the strict take script for a call of `n` items.
pub(crate) fn parse_take(raw: &[i64], n: usize) -> RedisResult<Take> {
    let parsed = match raw {
        [1, balances @ ..] if balances.len() == n => balances
            .iter()
            .map(|&b| u64::try_from(b).ok())
            .collect::<Option<Vec<_>>>()
            .map(Take::Taken),
        &[0, index, retry] => usize::try_from(index)
            .ok()
            .filter(|&i| (1..=n).contains(&i))
            .map(|i| Take::Refused {
                index: i - 1,
                retry_after_us: u64::try_from(retry).ok(),
            }),
        _ => None,
    };
    parsed.ok_or_else(|| bad_reply(raw))
}

/// Whether `e` is `NOSCRIPT`: the script did not run, so loading it and sending the
/// call again is safe.
pub(crate) fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

pub(crate) fn bad_reply(raw: &[i64]) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Parse,
        "exchange reply of the wrong shape",
        format!("{raw:?}"),
    ))
}
