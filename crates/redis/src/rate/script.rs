//! The rate-lease script (`lua/rate.lua`), invoked by SHA, and the typed form of one
//! refresh and its reply. Composed like the token-lease scripts: a clock prologue (Redis
//! `TIME`, or `now` from the last argument for tests) and the body.

use redis::{ConnectionLike, RedisResult, Script};

use crate::policy::{RemotePolicy, Start};
use crate::script::{BucketKeys, TimeSource, bad_reply};

const RATE_ON_REDIS_TIME: &str = concat!(
    include_str!("../../lua/clock_redis.lua"),
    include_str!("../../lua/rate.lua")
);
const RATE_ON_ARGUMENT: &str = concat!(
    include_str!("../../lua/clock_arg.lua"),
    include_str!("../../lua/rate.lua")
);

/// The two keys of a bucket's rate leases, under the bucket's hash tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateKeys {
    /// The state hash (`ep`, `learn`, the pool and the idle rate it accrues).
    pub state: String,
    /// Instance id -> its record (current grant, hold, demand).
    pub instances: String,
}

impl RateKeys {
    /// The rate-lease keys of bucket `scope` in `namespace`: `tg:{namespace:scope}:rate`
    /// and `...:rate:i`.
    ///
    /// # Errors
    ///
    /// As [`BucketKeys::new`]: a part empty or holding `{` or `}`.
    pub fn new(namespace: &str, scope: &str) -> Result<Self, String> {
        let base = BucketKeys::new(namespace, scope)?.state;
        Ok(Self {
            instances: format!("{base}:rate:i"),
            state: format!("{base}:rate"),
        })
    }
}

/// The fleet-wide settings of one refresh.
#[derive(Clone, Copy, Debug)]
pub struct RateTarget<'a> {
    /// The keys.
    pub keys: &'a RateKeys,
    /// The fleet's budget `(B, r)`; [`Start::Empty`] turns learning on after a loss.
    pub policy: &'a RemotePolicy,
    /// A grant's lifetime on Redis (ttl + grace), µs.
    pub lease_us: u64,
    /// The minimum share, milli-tokens per second.
    pub min_share_milli: u64,
    /// How long the keys outlive the last grant, ms.
    pub keep_ms: u64,
}

/// What one instance reports and asks.
#[derive(Clone, Debug, Default)]
pub struct RateAsk {
    /// The instance's id.
    pub instance: String,
    /// This request's sequence number: above every earlier one of the instance.
    pub seq: u64,
    /// The grant the instance spends now: (its sequence number, rate in milli-tokens/s,
    /// burst in tokens), or `None`.
    pub has: Option<(u64, u64, u64)>,
    /// Demand, milli-tokens per second.
    pub want_milli: u64,
    /// Give the share back (the instance stops).
    pub leave: bool,
    /// Tokens the instance dropped from its bucket when its share shrank, not yet
    /// acknowledged: (the drop's id, increasing per instance; tokens). Redis credits them
    /// to the pool it hands on once per id.
    pub dropped: Option<(u64, u64)>,
    /// Whole tokens the instance's bucket holds now: how many a grant may add.
    pub tokens: u64,
}

/// The script's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateReply {
    /// `false`: the sequence number was not above the recorded one; nothing written.
    pub granted: bool,
    /// The share's rate, milli-tokens per second (0: no share).
    pub rate_milli: u64,
    /// The share's burst, tokens.
    pub burst: u64,
    /// The grant's expiry on Redis's clock, µs.
    pub expiry_us: u64,
    /// The share the instance reported was still counted: it may keep its tokens.
    pub continuous: bool,
    /// Redis's time of the refresh, µs.
    pub now_us: u64,
    /// The state's epoch (its creation time, µs).
    pub epoch: u64,
    /// Live instances, the caller included.
    pub live: u64,
    /// The caller's max-min fair rate, milli-tokens per second (what it gets once the
    /// shares others hold above theirs have expired or been acknowledged).
    pub target_milli: u64,
    /// Tokens handed on from the pool (dropped by instances whose shares shrank): the
    /// bucket starts the grant with them (taken from the pool before this reply).
    pub handed: u64,
}

impl RateReply {
    fn parse(v: &[i64]) -> Option<Self> {
        let &[status, r, b, exp, cont, now, ep, live, target, handed] = v else {
            return None;
        };
        let n = |x: i64| u64::try_from(x).ok();
        Some(Self {
            granted: status == 1,
            rate_milli: n(r)?,
            burst: n(b)?,
            expiry_us: n(exp)?,
            continuous: cont == 1,
            now_us: n(now)?,
            epoch: n(ep)?,
            live: n(live)?,
            target_milli: n(target)?,
            handed: n(handed)?,
        })
    }
}

/// The compiled rate-lease script.
#[derive(Debug, Clone)]
pub struct RateScript {
    script: Script,
    time: TimeSource,
}

impl RateScript {
    /// The script reading time from `time`.
    pub fn new(time: TimeSource) -> Self {
        Self {
            script: Script::new(match time {
                TimeSource::Redis => RATE_ON_REDIS_TIME,
                TimeSource::Argument => RATE_ON_ARGUMENT,
            }),
            time,
        }
    }

    /// Loads the script (`SCRIPT LOAD`).
    ///
    /// # Errors
    ///
    /// The connection's error.
    pub fn load(&self, con: &mut dyn ConnectionLike) -> RedisResult<()> {
        self.script.prepare_invoke().load(con).map(drop)
    }

    /// Runs one refresh by `EVALSHA` (loading the script on `NOSCRIPT`). `now_us` is sent
    /// for [`TimeSource::Argument`] and ignored otherwise.
    ///
    /// # Errors
    ///
    /// The connection's or server's error; a reply of the wrong shape is a
    /// [`redis::ErrorKind::Parse`] error.
    pub fn refresh(
        &self,
        con: &mut dyn ConnectionLike,
        target: &RateTarget<'_>,
        ask: &RateAsk,
        now_us: u64,
    ) -> RedisResult<RateReply> {
        let (has_seq, has_r, has_b) = ask.has.unwrap_or((0, 0, 0));
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash())
            .arg(2)
            .arg(&target.keys.state)
            .arg(&target.keys.instances)
            .arg(target.policy.capacity())
            .arg(target.policy.rate_milli())
            .arg(target.lease_us)
            .arg(target.min_share_milli)
            .arg(u8::from(target.policy.start() == Start::Empty))
            .arg(target.keep_ms)
            .arg(&ask.instance)
            .arg(ask.seq)
            .arg(has_seq)
            .arg(has_r)
            .arg(has_b)
            .arg(ask.want_milli)
            .arg(u8::from(ask.leave))
            .arg(ask.dropped.map_or(0, |d| d.1))
            .arg(ask.dropped.map_or(0, |d| d.0))
            .arg(ask.tokens);
        if self.time == TimeSource::Argument {
            cmd.arg(now_us);
        }
        let raw: Vec<i64> = match cmd.query(con) {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.load(con)?;
                cmd.query(con)?
            }
            r => r?,
        };
        RateReply::parse(&raw).ok_or_else(|| bad_reply(&raw))
    }
}
