//! The pool's background thread: owns the connection, renews and settles every bucket's
//! leases in one pipeline per round, and runs the breaker.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::{Connection, RedisResult, Value};

use crate::breaker::Breaker;
use crate::config::{FailMode, PoolConfig};
use crate::error::PoolError;
use crate::policy::UNITS_PER_TOKEN;
use crate::pool::{BucketShared, HEALTHY, PoolShared, UNAVAILABLE};
use crate::reservoir::{TIME_SHIFT, tokens};
use crate::script::{Exchange, Outcome, Reply, Scripts, Target, bad_reply};

/// Opens a connection with the configured timeouts and loads the scripts.
pub(crate) fn open(config: &PoolConfig, scripts: &Scripts) -> Result<Connection, PoolError> {
    let client = redis::Client::open(config.url.as_str()).map_err(|e| PoolError::Url {
        url: config.url.clone(),
        detail: e.to_string(),
    })?;
    let unreachable = |e: redis::RedisError, timeout| PoolError::Unreachable {
        url: config.url.clone(),
        timeout,
        detail: e.to_string(),
    };
    let mut con = client
        .get_connection_with_timeout(config.connect_timeout)
        .map_err(|e| unreachable(e, config.connect_timeout))?;
    con.set_read_timeout(Some(config.exchange_timeout))
        .and_then(|()| con.set_write_timeout(Some(config.exchange_timeout)))
        .map_err(|e| unreachable(e, config.exchange_timeout))?;
    scripts.load(&mut con).map_err(|e| {
        if e.is_timeout() || e.is_io_error() || e.is_connection_dropped() {
            unreachable(e, config.exchange_timeout)
        } else {
            PoolError::Misconfigured {
                url: config.url.clone(),
                detail: e.to_string(),
            }
        }
    })?;
    Ok(con)
}

/// A lease this instance holds in one reservoir word.
#[derive(Debug)]
struct Held {
    id: String,
    installed_ns: u64,
}

/// The thread's view of one bucket.
#[derive(Debug)]
struct Tracked {
    shared: Arc<BucketShared>,
    held: [Option<Held>; 2],
    /// Leases retired locally, to settle: (id, unspent tokens).
    pending: Vec<(String, u64)>,
    pending_since_ns: Option<u64>,
    /// A grant asked and not answered: retried with the same id.
    in_flight: Option<(String, u64, u64)>,
    epoch: u64,
    /// Redis answered with a new epoch: the state was lost (a restart without
    /// persistence); the live leases are registered again on the next round.
    reregister: bool,
}

/// What one round sends for one bucket.
#[derive(Debug)]
struct Planned {
    index: usize,
    exchange: Exchange,
    /// Delete the bucket's keys first.
    reset: bool,
    /// The exchange re-registers the live leases.
    reregistering: bool,
}

pub(crate) struct Worker {
    pool: Arc<PoolShared>,
    scripts: Scripts,
    con: Option<Connection>,
    buckets: Vec<Tracked>,
    breaker: Breaker,
    instance: String,
    seq: u64,
    last_redis_us: u64,
    rng: u64,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl Worker {
    pub(crate) fn new(pool: Arc<PoolShared>, scripts: Scripts, con: Connection) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let instance = format!("{:x}-{:x}", std::process::id(), nanos);
        let breaker = Breaker::new(
            pool.config.probe_min,
            pool.config.probe_max,
            nanos ^ 0x9e37_79b9_7f4a_7c15,
        );
        Self {
            pool,
            scripts,
            con: Some(con),
            buckets: Vec::new(),
            breaker,
            instance,
            seq: 0,
            last_redis_us: 0,
            rng: nanos | 1,
        }
    }

    fn ttl_ns(&self) -> u64 {
        self.pool.config.lease_ttl.as_nanos() as u64
    }

    pub(crate) fn run(mut self) {
        let poll = (self.pool.config.lease_ttl / 16)
            .clamp(Duration::from_micros(500), Duration::from_millis(5));
        loop {
            let stopping = self.pool.stop.load(Ordering::Relaxed);
            self.adopt_new_buckets();
            let now = self.pool.now_ns();
            let plans = self.plan(now, stopping);
            if !plans.is_empty() && (stopping || self.breaker.may_try(now)) {
                self.round(plans, now);
            }
            if stopping {
                return;
            }
            std::thread::park_timeout(poll);
        }
    }

    fn adopt_new_buckets(&mut self) {
        let mut new = self
            .pool
            .new_buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for shared in new.drain(..) {
            self.buckets.push(Tracked {
                shared,
                held: [None, None],
                pending: Vec::new(),
                pending_since_ns: None,
                in_flight: None,
                epoch: 0,
                reregister: false,
            });
        }
    }

    /// Retires spent, aging and (when stopping) all leases, and decides what each bucket
    /// exchanges this round.
    fn plan(&mut self, now: u64, stopping: bool) -> Vec<Planned> {
        let ttl = self.ttl_ns();
        let idle_settle = ttl / 4;
        let mut plans = Vec::new();
        for (index, t) in self.buckets.iter_mut().enumerate() {
            let b = &*t.shared;
            let reset = b.reset.swap(false, Ordering::Relaxed);
            if reset {
                for (i, slot) in t.held.iter_mut().enumerate() {
                    b.reservoir.retire(i);
                    *slot = None;
                }
                t.pending.clear();
                t.pending_since_ns = None;
                t.in_flight = None;
            }
            for (i, slot) in t.held.iter_mut().enumerate() {
                let Some(h) = slot else { continue };
                let left = tokens(b.reservoir.load(i));
                let old = now.saturating_sub(h.installed_ns) >= ttl / 2;
                if left == 0 || old || stopping {
                    let unspent = b.reservoir.retire(i);
                    t.pending.push((std::mem::take(&mut h.id), unspent));
                    t.pending_since_ns.get_or_insert(now);
                    *slot = None;
                }
            }
            // Credit is capped at B - outstanding by the script: more than B is never needed.
            let credit = b
                .returned
                .swap(0, Ordering::Relaxed)
                .min(b.policy.capacity());
            let free = t.held.iter().any(Option::is_none);
            // A credit may pay what Redis refused: ask again with it.
            let spent = credit == 0 && now < b.rejected_until_ns.load(Ordering::Relaxed);
            let grant = if stopping {
                None
            } else if let Some((id, need, want)) = &t.in_flight {
                Some((id.clone(), *need, *want))
            } else if free && !spent && b.demand.swap(false, Ordering::Relaxed) {
                let need = b.need.swap(0, Ordering::Relaxed).max(1);
                // At most B / (2K) for the K instances last seen, so the fleet's leases
                // (two per instance) never hold the whole budget: exact mode's early
                // rejection stays at most about B.
                let k = self.pool.instances_seen.load(Ordering::Relaxed).max(1);
                let share = (b.policy.capacity() / (2 * k)).max(1);
                let want = b.max_cost.min(share).max(need);
                self.seq += 1;
                let id = format!("{}:{}", self.instance, self.seq);
                t.in_flight = Some((id.clone(), need, want));
                Some((id, need, want))
            } else {
                None
            };
            let settle_due = t
                .pending_since_ns
                .is_some_and(|since| stopping || now.saturating_sub(since) >= idle_settle);
            let reregistering = t.reregister && !reset;
            if grant.is_none() && !settle_due && credit == 0 && !reset && !reregistering {
                continue;
            }
            let mut exchange = Exchange {
                credit_units: credit * UNITS_PER_TOKEN,
                settle: t.pending.clone(),
                ..Exchange::default()
            };
            if let Some((id, need, want)) = grant {
                exchange.request_id = Some(id);
                exchange.need = need;
                exchange.want = want;
            }
            if reregistering {
                exchange.register = t
                    .held
                    .iter()
                    .enumerate()
                    .filter_map(|(i, h)| {
                        Some((h.as_ref()?.id.clone(), tokens(b.reservoir.load(i))))
                    })
                    .filter(|(_, g)| *g > 0)
                    .collect();
            }
            plans.push(Planned {
                index,
                exchange,
                reset,
                reregistering,
            });
        }
        plans
    }

    /// Sends one pipeline; on a connection failure reconnects and resends once (same
    /// request ids: a grant that ran is replayed, a settlement that ran is a no-op).
    fn round(&mut self, plans: Vec<Planned>, now: u64) {
        let mut result = self.send(&plans);
        if result.is_err() {
            self.con = None;
            result = self.send(&plans);
        }
        match result {
            Ok(replies) => {
                self.breaker.success();
                if self.pool.health.swap(HEALTHY, Ordering::Relaxed) != HEALTHY {
                    for t in &self.buckets {
                        *t.shared
                            .local
                            .write()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
                    }
                }
                for (plan, reply) in plans.iter().zip(replies) {
                    self.apply(plan, reply, now);
                }
            }
            Err(_) => {
                self.con = None;
                self.pool.failed_rounds.fetch_add(1, Ordering::Relaxed);
                // Credits not sent are kept for the next round.
                for plan in &plans {
                    let t = &self.buckets[plan.index];
                    let credit = plan.exchange.credit_units / UNITS_PER_TOKEN;
                    t.shared.returned.fetch_add(credit, Ordering::Relaxed);
                    if plan.exchange.request_id.is_some() {
                        t.shared.demand.store(true, Ordering::Relaxed);
                    }
                }
                let now = self.pool.now_ns();
                if self.breaker.failure(now) {
                    self.pool
                        .probe_at_ns
                        .store(self.breaker.probe_at().unwrap_or(now), Ordering::Relaxed);
                    if self.pool.health.swap(UNAVAILABLE, Ordering::Relaxed) == HEALTHY
                        && self.pool.config.fail_mode == FailMode::Local
                    {
                        self.start_local_buckets();
                    }
                }
            }
        }
    }

    /// Local buckets of B/K and r/K for the fleet last seen.
    fn start_local_buckets(&self) {
        let k = self
            .pool
            .instances_seen
            .load(Ordering::Relaxed)
            .max(self.pool.config.instances)
            .max(1);
        for t in &self.buckets {
            let p = &t.shared.policy;
            let cap = (p.capacity() / k).max(1);
            let rate = (p.tokens_per_second() / k as f64).max(1e-6);
            let local = tokengate::Policy::new(cap, rate)
                .ok()
                .map(tokengate::Bucket::new);
            *t.shared
                .local
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = local;
        }
    }

    /// One pipeline: every planned exchange, then the fleet heartbeat. Items answered
    /// `NOSCRIPT` did not run: the script is loaded and they are sent again.
    fn send(&mut self, plans: &[Planned]) -> RedisResult<Vec<Reply>> {
        let mut con = match self.con.take() {
            Some(con) => con,
            None => open(&self.pool.config, &self.scripts).map_err(|e| {
                redis::RedisError::from((redis::ErrorKind::Io, "reconnect failed", e.to_string()))
            })?,
        };
        let replies = self.send_on(&mut con, plans)?;
        self.con = Some(con);
        Ok(replies)
    }

    fn send_on(&mut self, con: &mut Connection, plans: &[Planned]) -> RedisResult<Vec<Reply>> {
        let pool = self.pool.clone();
        let config = &pool.config;
        let lease_us = (config.lease_ttl + config.grace).as_micros() as u64;
        let keep_ms = config.key_keep.as_millis() as u64;
        let fleet = format!("tg:{{{}}}:fleet", config.namespace);
        let window_us = 2 * lease_us;
        let now_us = self.last_redis_us;
        let argv: Vec<Vec<String>> = plans
            .iter()
            .map(|p| {
                let t = &self.buckets[p.index];
                self.scripts.exchange_args(
                    &Target {
                        keys: &t.shared.keys,
                        policy: &t.shared.policy,
                        lease_us,
                        keep_ms,
                    },
                    &p.exchange,
                    0,
                )
            })
            .collect();
        let sha = self.scripts.exchange_sha().to_owned();
        let instance = self.instance.clone();
        let mut pipe = redis::pipe();
        let mut dels = 0;
        for p in plans.iter().filter(|p| p.reset) {
            let k = &self.buckets[p.index].shared.keys;
            pipe.cmd("DEL").arg(&k.state).arg(&k.leases).arg(&k.expiry);
            dels += 1;
        }
        for a in &argv {
            pipe.cmd("EVALSHA").arg(&sha).arg(a);
        }
        if now_us > 0 {
            pipe.cmd("ZADD").arg(&fleet).arg(now_us).arg(&instance);
            pipe.cmd("ZREMRANGEBYSCORE")
                .arg(&fleet)
                .arg("-inf")
                .arg(now_us.saturating_sub(window_us));
            pipe.cmd("ZCARD").arg(&fleet);
            pipe.cmd("PEXPIRE").arg(&fleet).arg(window_us / 1000 + 1);
        }
        let raw: Vec<RedisResult<Value>> = pipe.ignore_errors().query(con)?;
        pool.round_trips.fetch_add(1, Ordering::Relaxed);
        let mut replies = Vec::with_capacity(plans.len());
        let mut missing = Vec::new();
        let raw = &raw[dels.min(raw.len())..];
        for (i, item) in raw.iter().take(plans.len()).enumerate() {
            match item {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    missing.push(i);
                    replies.push(None);
                }
                Err(e) => return Err(e.clone()),
                Ok(v) => replies.push(Some(parse(v)?)),
            }
        }
        if now_us > 0 {
            if let Some(Ok(Value::Int(k))) = raw.get(plans.len() + 2) {
                let k = u64::try_from(*k).unwrap_or(0).max(config.instances);
                pool.instances_seen.store(k, Ordering::Relaxed);
            }
        }
        if !missing.is_empty() {
            self.scripts.load(con)?;
            let mut again = redis::pipe();
            for &i in &missing {
                again.cmd("EVALSHA").arg(&sha).arg(&argv[i]);
            }
            let raw: Vec<Value> = again.query(con)?;
            pool.round_trips.fetch_add(2, Ordering::Relaxed);
            for (&i, v) in missing.iter().zip(&raw) {
                replies[i] = Some(parse(v)?);
            }
        }
        pool.exchanges
            .fetch_add(plans.len() as u64, Ordering::Relaxed);
        let replies: Vec<Reply> = replies.into_iter().flatten().collect();
        if let Some(r) = replies.last() {
            self.last_redis_us = r.now_us;
        }
        Ok(replies)
    }

    fn apply(&mut self, plan: &Planned, reply: Reply, sent_ns: u64) {
        let ttl = self.ttl_ns();
        let t = &mut self.buckets[plan.index];
        let b = &*t.shared;
        b.balance_units
            .store(reply.balance_units, Ordering::Relaxed);
        b.outstanding.store(reply.outstanding, Ordering::Relaxed);
        if !plan.exchange.settle.is_empty() {
            let sent = plan.exchange.settle.len();
            t.pending.drain(..sent.min(t.pending.len()));
            if t.pending.is_empty() {
                t.pending_since_ns = None;
            }
        }
        if plan.reregistering {
            t.reregister = false;
        }
        if t.epoch != 0 && reply.epoch != t.epoch && !plan.reset {
            t.reregister = true;
        }
        t.epoch = reply.epoch;
        if reply.balance_units >= UNITS_PER_TOKEN {
            b.rejected_until_ns.store(0, Ordering::Relaxed);
        }
        match reply.outcome {
            Outcome::Granted { tokens: g, .. } | Outcome::Replayed { tokens: g, .. } => {
                let (id, _, _) = t.in_flight.take().unwrap_or_default();
                if g > 0 {
                    if let Some(i) = t.held.iter().position(Option::is_none) {
                        // Spendable until the send time plus the time-to-live, rounded
                        // down to the reservoir's time unit: before Redis's reclaim at
                        // its grant time + ttl + grace.
                        let expiry = (sent_ns + ttl) >> TIME_SHIFT;
                        b.reservoir.install(i, expiry, g);
                        t.held[i] = Some(Held {
                            id,
                            installed_ns: sent_ns,
                        });
                        b.stats.grants.fetch_add(1, Ordering::Relaxed);
                        b.stats.granted_tokens.fetch_add(g, Ordering::Relaxed);
                        b.rejected_until_ns.store(0, Ordering::Relaxed);
                    } else {
                        t.pending.push((id, g));
                        t.pending_since_ns.get_or_insert(sent_ns);
                    }
                }
            }
            Outcome::Rejected { retry_after_us } => {
                t.in_flight = None;
                // Ask again when a whole lease could be paid, not one token: a fleet far
                // over its budget then polls about K*r/L times a second, not once per
                // token per instance. Jittered up to half again, so instances refused
                // together do not ask together; never past the lease lifetime.
                let lease_ns = plan
                    .exchange
                    .want
                    .saturating_sub(plan.exchange.need)
                    .saturating_mul(1_000_000_000_000)
                    / b.policy.rate_milli().max(1);
                let wait = retry_after_us.map_or(ttl, |us| {
                    let base = us.saturating_mul(1000).saturating_add(lease_ns);
                    self.rng ^= self.rng << 13;
                    self.rng ^= self.rng >> 7;
                    self.rng ^= self.rng << 17;
                    base.saturating_add(self.rng % (base / 2 + 1)).min(ttl)
                });
                b.rejected_until_ns
                    .store(sent_ns.saturating_add(wait), Ordering::Relaxed);
                b.demand.store(true, Ordering::Relaxed);
            }
            Outcome::NoGrant => {}
        }
    }
}

fn parse(v: &Value) -> RedisResult<Reply> {
    let raw: Vec<i64> = redis::from_redis_value_ref(v)?;
    Reply::parse(&raw).ok_or_else(|| bad_reply(&raw))
}
