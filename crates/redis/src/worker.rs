//! The pool's background thread: owns the connection, renews and settles every bucket's
//! leases in one pipeline per round, and runs the breaker.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::{Cmd, RedisResult, Value};

use crate::breaker::Breaker;
use crate::config::FailMode;
use crate::connect::{self, Link};
use crate::policy::UNITS_PER_TOKEN;
use crate::pool::{BucketShared, HEALTHY, PoolShared, UNAVAILABLE};
use crate::reservoir::{TIME_SHIFT, tokens};
use crate::script::{Exchange, Outcome, Reply, Scripts, Target, bad_reply};
use crate::series::Metrics;
use crate::sizing::{self, Inputs};

/// A fleet member's id in the heartbeat's set (process id and start time, hex), and the
/// start time (ns since the epoch) it was made from, a seed for the caller's jitter.
pub(crate) fn instance_id() -> (String, u64) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (format!("{:x}-{:x}", std::process::id(), nanos), nanos)
}

/// A lease this instance holds in one reservoir word.
#[derive(Debug)]
struct Held {
    id: String,
    granted: u64,
    installed_ns: u64,
}

/// A credit sent and not yet acknowledged: sent again, under the same id, until a reply
/// confirms it (Redis applies an id once), or dropped unconfirmed once half the credit
/// window has passed (the fleet then admits less, never more).
#[derive(Debug)]
struct PendingCredit {
    id: String,
    tokens: u64,
    since_ns: u64,
}

/// A grant asked and not yet answered.
#[derive(Clone, Debug)]
struct Asked {
    id: String,
    need: u64,
    want: u64,
}

/// The thread's view of one bucket.
#[derive(Debug)]
struct Tracked {
    shared: Arc<BucketShared>,
    /// The leases merged into each reservoir word, oldest first.
    held: [Vec<Held>; 2],
    /// Leases retired locally, to settle: (id, unspent tokens).
    pending: Vec<(String, u64)>,
    pending_since_ns: Option<u64>,
    /// Grants asked and not answered: retried with the same ids.
    in_flight: Vec<Asked>,
    /// The credit sent and not acknowledged.
    credit: Option<PendingCredit>,
    epoch: u64,
    /// Redis answered with a new epoch: the state was lost (a restart without
    /// persistence); the live leases are registered again on the next round.
    reregister: bool,
    /// Tokens put into the reservoir minus unspent tokens retired from it: what was spent
    /// here is this less what the words hold.
    supplied: u64,
    /// Tokens per second spent here, `None` before the first measurement.
    rate: Option<f64>,
    rate_at_ns: u64,
    spent_at: u64,
    /// Tokens of words that had expired unspent when retired, not yet exported.
    expired_unspent: u64,
    /// The decisions' fail-mode admissions exported so far: (fail open, local).
    exported: (u64, u64),
}

impl Tracked {
    /// Empties word `i` and queues its leases for settlement. The leftover is unspent:
    /// it is split over the word's leases newest first, each at most its grant.
    fn retire(&mut self, i: usize, now: u64) {
        // An expired word is spent no more: what it held is exact.
        let expired = crate::reservoir::expiry(self.shared.reservoir.load(i)) <= now >> TIME_SHIFT;
        let left = self.shared.reservoir.retire(i);
        if expired {
            self.expired_unspent += left;
        }
        self.supplied = self.supplied.saturating_sub(left);
        let unspent = split_newest_first(&self.held[i], left);
        self.pending.extend(unspent);
        self.held[i].clear();
        self.pending_since_ns.get_or_insert(now);
    }

    /// Settles the oldest leases of word `i` that are wholly spent, keeping the word: its
    /// tokens are counted against its leases newest first, so once the word holds no
    /// more than its newer leases' grants the older ones are spent (a spend only lowers
    /// the word, so the count read here is an upper bound). Frees the depth they held.
    fn settle_spent(&mut self, i: usize, now: u64) {
        let left = tokens(self.shared.reservoir.load(i));
        let mut covered = 0;
        let live = self.held[i]
            .iter()
            .rev()
            .take_while(|h| {
                let more = covered < left;
                covered += h.granted;
                more
            })
            .count();
        let spent = self.held[i].len() - live;
        if spent > 0 {
            for h in self.held[i].drain(..spent) {
                self.pending.push((h.id, 0));
            }
            self.pending_since_ns.get_or_insert(now);
        }
    }

    /// How long the thread may sleep before this bucket's live tokens run low at its
    /// rate, ns (an empty reservoir is the decisions' to signal: they find it short).
    fn runs_low_in_ns(&self, now: u64) -> u64 {
        let live = self.shared.reservoir.live(now >> TIME_SHIFT);
        match self.rate {
            Some(r) if r > 0.0 && live > 0 => (live as f64 / r * 1e9 / 2.0) as u64,
            _ => u64::MAX,
        }
    }

    /// The leases of word `i` with what each can still spend (the word's tokens split
    /// newest first).
    fn live_leases(&self, i: usize) -> Vec<(String, u64)> {
        split_newest_first(&self.held[i], tokens(self.shared.reservoir.load(i)))
    }

    /// Samples the local spending rate, at most once per `every_ns`.
    fn measure(&mut self, now: u64, every_ns: u64) {
        let r = &self.shared.reservoir;
        let in_words = tokens(r.load(0)) + tokens(r.load(1));
        let spent = self.supplied.saturating_sub(in_words);
        let dt = now.saturating_sub(self.rate_at_ns);
        if dt < every_ns {
            return;
        }
        let sample = spent.saturating_sub(self.spent_at) as f64 * 1e9 / dt as f64;
        self.rate = Some(self.rate.map_or(sample, |r| (r + sample) / 2.0));
        self.rate_at_ns = now;
        self.spent_at = spent;
    }
}

/// Splits `left` tokens of one reservoir word over its leases newest first, each at most
/// its grant: (lease id, its part), newest first.
fn split_newest_first(held: &[Held], mut left: u64) -> Vec<(String, u64)> {
    held.iter()
        .rev()
        .map(|h| {
            let part = left.min(h.granted);
            left -= part;
            (h.id.clone(), part)
        })
        .collect()
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
    con: Option<Link>,
    buckets: Vec<Tracked>,
    breaker: Breaker,
    instance: String,
    seq: u64,
    last_redis_us: u64,
    /// Pool time (ns) of the last round Redis answered: an idle pool beats every half
    /// lease lifetime so the fleet keeps counting it.
    beat_at_ns: u64,
    rng: u64,
    /// Round-trip time, ns (moving average).
    rtt_ns: u64,
    /// Redis's clock against the pool's: (Redis µs, pool ns) at the first answer, and the
    /// most Redis has run ahead of the pool's clock since, ns.
    clock: Option<(u64, u64)>,
    ahead_ns: i64,
    metrics: Metrics,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl Worker {
    pub(crate) fn new(pool: Arc<PoolShared>, scripts: Scripts, con: Link) -> Self {
        let (instance, nanos) = instance_id();
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
            beat_at_ns: 0,
            rng: nanos | 1,
            rtt_ns: 1_000_000,
            clock: None,
            ahead_ns: 0,
            metrics: Metrics::new("pool"),
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
            let every = self.pool.config.heartbeat_every().as_nanos() as u64;
            // A closing breaker runs rounds back to back (heartbeats when idle).
            let beat_due = !stopping
                && (now.saturating_sub(self.beat_at_ns) >= every || self.breaker.is_closing());
            if (!plans.is_empty() || beat_due) && (stopping || self.breaker.may_try(now)) {
                self.round(plans, now);
            } else {
                // Not sent (the breaker is open): the grants stay in flight and the
                // settlements pending.
                self.keep_for_next_round(&plans, false);
            }
            self.export_metrics();
            if stopping {
                return;
            }
            // A hot bucket wakes the thread before its live tokens run low, as well as
            // its decisions do (a word that falls below the low-water mark or empties).
            let now = self.pool.now_ns();
            let low = self
                .buckets
                .iter()
                .map(|t| t.runs_low_in_ns(now))
                .min()
                .unwrap_or(u64::MAX)
                .max(50_000);
            std::thread::park_timeout(poll.min(Duration::from_nanos(low)));
        }
    }

    fn adopt_new_buckets(&mut self) {
        let mut new = self
            .pool
            .new_buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = self.pool.now_ns();
        for shared in new.drain(..) {
            self.buckets.push(Tracked {
                shared,
                held: [Vec::new(), Vec::new()],
                pending: Vec::new(),
                pending_since_ns: None,
                in_flight: Vec::new(),
                credit: None,
                epoch: 0,
                reregister: false,
                supplied: 0,
                rate: None,
                rate_at_ns: now,
                spent_at: 0,
                expired_unspent: 0,
                exported: (0, 0),
            });
        }
    }

    /// Retires spent, aging and (when stopping) all leases, and decides what each bucket
    /// exchanges this round: one exchange carrying its settlements, credit and first
    /// grant, then one per further grant (see [`sizing`]).
    fn plan(&mut self, now: u64, stopping: bool) -> Vec<Planned> {
        let ttl = self.ttl_ns();
        let idle_settle = ttl / 4;
        let rtt = self.rtt_ns;
        let depth = self.pool.config.lease_depth;
        let lease_us = (self.pool.config.lease_ttl + self.pool.config.grace).as_micros() as u64;
        let credit_keep_ns = crate::model::credit_window_us(lease_us).saturating_mul(500);
        let k = self.pool.instances_seen.load(Ordering::Relaxed).max(1);
        let mut plans = Vec::new();
        for (index, t) in self.buckets.iter_mut().enumerate() {
            let reset = t.shared.reset.swap(false, Ordering::Relaxed);
            if reset {
                for i in 0..2 {
                    t.retire(i, now);
                }
                t.pending.clear();
                t.pending_since_ns = None;
                t.in_flight.clear();
                t.credit = None;
            }
            for i in 0..2 {
                t.settle_spent(i, now);
                let Some(oldest) = t.held[i].first() else {
                    continue;
                };
                let old = now.saturating_sub(oldest.installed_ns) >= ttl / 2;
                if old || stopping {
                    t.retire(i, now);
                }
            }
            t.measure(now, (2 * rtt).max(1_000_000));
            let b = &*t.shared;
            if t.credit
                .as_ref()
                .is_some_and(|c| now.saturating_sub(c.since_ns) > credit_keep_ns)
            {
                t.credit = None;
            }
            if t.credit.is_none() {
                // Capped at B - outstanding by the script: more than B is never needed.
                let tokens = b
                    .returned
                    .swap(0, Ordering::Relaxed)
                    .min(b.policy.capacity());
                if tokens > 0 {
                    self.seq += 1;
                    t.credit = Some(PendingCredit {
                        id: format!("{}:c{}", self.instance, self.seq),
                        tokens,
                        since_ns: now,
                    });
                }
            }
            let credit = t.credit.as_ref().map_or(0, |c| c.tokens);
            // A credit may pay what Redis refused: ask again with it.
            let spent = credit == 0 && now < b.rejected_until_ns.load(Ordering::Relaxed);
            let mut grants: Vec<Asked> = if stopping {
                Vec::new()
            } else {
                t.in_flight.clone()
            };
            if !stopping && !spent {
                let r = &b.reservoir;
                let live = r.live(now >> TIME_SHIFT);
                let asked: u64 = t.in_flight.iter().map(|a| a.want).sum();
                let need = b.need.load(Ordering::Relaxed);
                let demand = b.demand.load(Ordering::Relaxed);
                let ask = sizing::ask(&Inputs {
                    rate: t.rate,
                    rtt_ns: rtt,
                    ttl_ns: ttl,
                    max_lease: b.max_cost,
                    share: (b.policy.capacity() / (2 * k)).max(1),
                    depth,
                    leases: (t.held[0].len() + t.held[1].len() + t.in_flight.len()) as u64,
                    tokens: live.saturating_add(asked),
                    short: need > 0,
                    demand,
                });
                b.low_water.store(ask.size.div_ceil(2), Ordering::Relaxed);
                if ask.grants > 0 {
                    b.demand.store(false, Ordering::Relaxed);
                    let need = b.need.swap(0, Ordering::Relaxed).max(1);
                    for n in 0..ask.grants {
                        self.seq += 1;
                        let a = Asked {
                            id: format!("{}:{}", self.instance, self.seq),
                            need: if n == 0 { need } else { 1 },
                            want: ask.size.max(need),
                        };
                        t.in_flight.push(a.clone());
                        grants.push(a);
                    }
                }
            }
            let settle_due = t
                .pending_since_ns
                .is_some_and(|since| stopping || now.saturating_sub(since) >= idle_settle);
            let reregistering = t.reregister && !reset;
            if grants.is_empty() && !settle_due && credit == 0 && !reset && !reregistering {
                continue;
            }
            let mut exchange = Exchange {
                credit_units: credit * UNITS_PER_TOKEN,
                credit_id: t.credit.as_ref().map(|c| c.id.clone()),
                settle: t.pending.clone(),
                ..Exchange::default()
            };
            if reregistering {
                exchange.register = (0..2)
                    .flat_map(|i| t.live_leases(i))
                    .filter(|(_, g)| *g > 0)
                    .collect();
            }
            let mut grants = grants.into_iter();
            if let Some(a) = grants.next() {
                exchange.request_id = Some(a.id);
                exchange.need = a.need;
                exchange.want = a.want;
                exchange.more = grants.map(|a| a.id).collect();
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
        let started = self.pool.now_ns();
        let mut result = self.send(&plans);
        if result.is_err() {
            self.con = None;
            self.metrics.retry();
            result = self.send(&plans);
        }
        match result {
            Ok((replies, Some(false))) => {
                // The replicas did not acknowledge the round in time: its grants are
                // settled unspent, its other effects stand (a lost settlement or credit
                // only makes the fleet admit less), and it counts as a failed round.
                for (plan, reply) in plans.iter().zip(replies) {
                    self.apply(plan, reply, now, Some(false));
                }
                self.failed();
            }
            Ok((replies, confirmed)) => {
                let received = self.pool.now_ns();
                self.metrics.latency_ns(received.saturating_sub(started));
                let took = received.saturating_sub(now);
                self.rtt_ns = (3 * self.rtt_ns + took) / 4;
                self.beat_at_ns = now;
                let closed = self.breaker.success();
                if closed && self.pool.health.swap(HEALTHY, Ordering::Relaxed) != HEALTHY {
                    self.metrics.breaker(false);
                    for t in &self.buckets {
                        *t.shared
                            .local
                            .write()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
                    }
                }
                self.watch_redis_clock(self.pool.now_ns());
                for (plan, reply) in plans.iter().zip(replies) {
                    self.apply(plan, reply, now, confirmed);
                }
            }
            Err(_) => {
                self.con = None;
                self.keep_for_next_round(&plans, true);
                self.failed();
            }
        }
    }

    /// Counts a failed round: the breaker opens after enough of them.
    fn failed(&mut self) {
        self.pool.failed_rounds.fetch_add(1, Ordering::Relaxed);
        self.metrics.failed_round();
        let now = self.pool.now_ns();
        if self.breaker.failure(now) {
            self.pool
                .probe_at_ns
                .store(self.breaker.probe_at().unwrap_or(now), Ordering::Relaxed);
            if self.pool.health.swap(UNAVAILABLE, Ordering::Relaxed) == HEALTHY {
                self.metrics.breaker(true);
                if self.pool.config.fail_mode == FailMode::Local {
                    self.start_local_buckets();
                }
            }
        }
    }

    /// Compares Redis's `TIME` of the round just answered (received at pool time
    /// `received_ns`) with the pool's clock: when Redis ran ahead by more than half the
    /// grace since the last answer (a forward step of its wall clock, a failover to a
    /// server whose clock is ahead), Redis reclaims the leases held here that much
    /// earlier than their local expiries assume, so every held lease is retired now
    /// (settled with the next exchange; a lease Redis already reclaimed settles as a
    /// no-op). Grants of this round are installed after, on Redis's new time.
    fn watch_redis_clock(&mut self, received_ns: u64) {
        let grace_ns = self.pool.config.grace.as_nanos() as u64;
        let (ahead, stepped) = clock_step(
            &mut self.clock,
            self.ahead_ns,
            self.last_redis_us,
            received_ns,
            grace_ns / 2,
        );
        self.ahead_ns = self.ahead_ns.max(ahead);
        if stepped {
            for t in &mut self.buckets {
                for i in 0..2 {
                    if !t.held[i].is_empty() {
                        t.retire(i, received_ns);
                    }
                }
            }
        }
    }

    /// Exports what the decisions counted since the last call (their fail-mode
    /// admissions: the decisions themselves touch no recorder), the tokens of leases that
    /// expired here unspent, and the unspent tokens awaiting settlement.
    fn export_metrics(&mut self) {
        if !Metrics::ENABLED {
            return;
        }
        let mut unsettled = 0;
        for t in &mut self.buckets {
            let s = &t.shared.stats;
            let now = (
                s.fail_open.load(Ordering::Relaxed),
                s.local.load(Ordering::Relaxed),
            );
            if now.0 > t.exported.0 {
                self.metrics.fail_open(now.0 - t.exported.0);
            }
            if now.1 > t.exported.1 {
                self.metrics.local(now.1 - t.exported.1);
            }
            t.exported = now;
            if t.expired_unspent > 0 {
                self.metrics
                    .expired_unspent(std::mem::take(&mut t.expired_unspent));
            }
            unsettled += t.pending.iter().map(|(_, left)| left).sum::<u64>();
        }
        self.metrics.unsettled(unsettled);
    }

    /// Puts back what unsent (or failed) `plans` carried, for the next round: their
    /// resets (credits stay pending under their ids); with `ask_again`, a bucket that
    /// asked for a grant asks again.
    fn keep_for_next_round(&self, plans: &[Planned], ask_again: bool) {
        for p in plans {
            let shared = &self.buckets[p.index].shared;
            if ask_again && p.exchange.request_id.is_some() {
                shared.demand.store(true, Ordering::Relaxed);
            }
            if p.reset {
                shared.reset.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Local buckets of `B/K` and `r/K` (rounded down: [`RemotePolicy::share`]) for the `K`
    /// instances Redis last reported (the configured `instances` until it has reported
    /// one), starting empty: an outage grants no burst, so a flapping link cannot hand
    /// out `B/K` again on every flap (the local buckets admit at most `r/K` per second of
    /// outage). They live until the breaker closes again, whatever probes fail or succeed
    /// meanwhile. A bucket whose share rounds down to nothing gets no local bucket: its
    /// decisions are refused while Redis is away.
    ///
    /// [`RemotePolicy::share`]: crate::RemotePolicy::share
    fn start_local_buckets(&self) {
        let k = self.pool.instances_seen.load(Ordering::Relaxed);
        for t in &self.buckets {
            let local = t
                .shared
                .policy
                .share(k)
                .map(|p| tokengate::Bucket::new(p.start_empty()));
            *t.shared
                .local
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = local;
        }
    }

    /// One pipeline: every planned exchange, then the fleet heartbeat (alone when the
    /// pool is idle). Items answered
    /// `NOSCRIPT` did not run: the script is loaded and they are sent again.
    ///
    /// With [`PoolConfig::wait_for_replicas`](crate::PoolConfig::wait_for_replicas), a
    /// round that asked for grants then sends `WAIT` on the same connection (on a cluster,
    /// to the primary of each slot it asked in); the second value says whether enough
    /// replicas acknowledged (`None` without it).
    fn send(&mut self, plans: &[Planned]) -> RedisResult<(Vec<Reply>, Option<bool>)> {
        let mut con = match self.con.take() {
            Some(con) => con,
            None => connect::open(&self.pool.config, &self.scripts).map_err(|e| {
                redis::RedisError::from((redis::ErrorKind::Io, "reconnect failed", e.to_string()))
            })?,
        };
        let replies = self.send_on(&mut con, plans)?;
        let confirmed = match self.pool.config.wait {
            Some((replicas, timeout)) => {
                let keys: Vec<&str> = plans
                    .iter()
                    .filter(|p| p.exchange.request_id.is_some())
                    .map(|p| self.buckets[p.index].shared.keys.state.as_str())
                    .collect();
                if keys.is_empty() {
                    Some(true)
                } else {
                    let acked = con.wait(&keys, replicas, timeout)?;
                    self.pool.round_trips.fetch_add(1, Ordering::Relaxed);
                    self.metrics.round_trips(1);
                    Some(acked >= replicas)
                }
            }
            None => None,
        };
        self.con = Some(con);
        Ok((replies, confirmed))
    }

    fn send_on(&mut self, con: &mut Link, plans: &[Planned]) -> RedisResult<Vec<Reply>> {
        let pool = self.pool.clone();
        let config = &pool.config;
        let lease_us = (config.lease_ttl + config.grace).as_micros() as u64;
        let keep_ms = config.key_keep.as_millis() as u64;
        let heartbeat = self.scripts.heartbeat_args(
            &config.fleet_key(),
            &self.instance,
            config.fleet_window_us(),
            self.last_redis_us,
        );
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
        let mut cmds: Vec<Cmd> = Vec::with_capacity(argv.len() + 1);
        let mut dels = 0;
        for p in plans.iter().filter(|p| p.reset) {
            let k = &self.buckets[p.index].shared.keys;
            let mut del = redis::cmd("DEL");
            del.arg(&k.all()[..]);
            cmds.push(del);
            dels += 1;
        }
        for a in &argv {
            let mut ev = redis::cmd("EVALSHA");
            ev.arg(&sha).arg(a);
            cmds.push(ev);
        }
        let mut beat = redis::cmd("EVALSHA");
        beat.arg(self.scripts.heartbeat_sha()).arg(&heartbeat);
        cmds.push(beat);
        let mut resent = 0;
        let raw = con.round(&cmds, &self.scripts, &mut resent)?;
        pool.round_trips.fetch_add(1 + resent, Ordering::Relaxed);
        self.metrics.round_trips(1 + resent);
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
        // The fleet as Redis counts it replaces the configured hint; a heartbeat answered
        // NOSCRIPT loads the scripts and counts next round.
        let mut beat_missing = false;
        match raw.get(plans.len()) {
            Some(Ok(v)) => {
                let (k, now_us): (u64, u64) = redis::from_redis_value_ref(v)?;
                pool.instances_seen.store(k.max(1), Ordering::Relaxed);
                self.last_redis_us = now_us;
            }
            Some(Err(e))
                if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                beat_missing = true;
            }
            Some(Err(e)) => return Err(e.clone()),
            None => {}
        }
        if beat_missing && missing.is_empty() {
            self.scripts.load(con)?;
        }
        if !missing.is_empty() {
            self.scripts.load(con)?;
            let mut again = redis::pipe();
            for &i in &missing {
                again.cmd("EVALSHA").arg(&sha).arg(&argv[i]);
            }
            let raw: Vec<Value> = again.query(con)?;
            pool.round_trips.fetch_add(2, Ordering::Relaxed);
            self.metrics.round_trips(2);
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

    /// Applies one exchange's reply. With `WAIT` (`confirmed` is `Some`), grants the
    /// replicas did not acknowledge are not installed, nor are replayed ones (a replay
    /// writes nothing, so a `WAIT` on a new connection would not cover the first grant):
    /// they are settled unspent with the next exchange, so a failover that loses them
    /// loses nothing this instance spent.
    fn apply(&mut self, plan: &Planned, reply: Reply, sent_ns: u64, confirmed: Option<bool>) {
        let ttl = self.ttl_ns();
        let grace_ns = self.pool.config.grace.as_nanos() as u64;
        let t = &mut self.buckets[plan.index];
        let shared = t.shared.clone();
        let b = &*shared;
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
        if plan.exchange.credit_id.is_some()
            && t.credit.as_ref().map(|c| &c.id) == plan.exchange.credit_id.as_ref()
        {
            t.credit = None;
        }
        if t.epoch != 0 && reply.epoch != t.epoch && !plan.reset {
            t.reregister = true;
        }
        t.epoch = reply.epoch;
        if reply.balance_units >= UNITS_PER_TOKEN {
            b.rejected_until_ns.store(0, Ordering::Relaxed);
        }
        let ex = &plan.exchange;
        if ex.request_id.is_some() {
            t.in_flight
                .retain(|a| ex.request_id.as_ref() != Some(&a.id) && !ex.more.contains(&a.id));
        }
        // Spendable until the send time plus the time-to-live, and never past Redis's
        // reclaim less the grace (a replayed grant ran in an earlier round), rounded down
        // to the reservoir's time unit.
        let expiry_of = |reclaim_at_us: u64| {
            let left_ns = reclaim_at_us
                .saturating_sub(reply.now_us)
                .saturating_mul(1000)
                .saturating_sub(grace_ns);
            (sent_ns + ttl.min(left_ns)) >> TIME_SHIFT
        };
        let first = match reply.outcome {
            Outcome::Granted {
                tokens,
                reclaim_at_us,
            }
            | Outcome::Replayed {
                tokens,
                reclaim_at_us,
            } => Some((tokens, reclaim_at_us)),
            _ => None,
        };
        let granted = ex
            .request_id
            .iter()
            .zip(first)
            .chain(ex.more.iter().zip(reply.more.iter().copied()));
        let replayed = matches!(reply.outcome, Outcome::Replayed { .. });
        let confirmed = confirmed.is_none_or(|c| c && !replayed);
        for (id, (g, reclaim_at_us)) in granted {
            if g > 0 {
                self.metrics.grant(g, replayed);
            }
            if g > 0 && !confirmed {
                t.pending.push((id.clone(), g));
                t.pending_since_ns.get_or_insert(sent_ns);
            } else if g > 0 && Self::install(t, id.clone(), g, expiry_of(reclaim_at_us), sent_ns) {
                b.stats.grants.fetch_add(1, Ordering::Relaxed);
                b.stats.granted_tokens.fetch_add(g, Ordering::Relaxed);
                b.rejected_until_ns.store(0, Ordering::Relaxed);
            }
        }
        match reply.outcome {
            Outcome::Rejected { retry_after_us } => {
                self.metrics.rejected();
                // Ask again when a whole lease of the largest size (at most the share)
                // could be paid, not one token nor a lease sized from the refused rate: a
                // fleet far over its budget then polls about K*r/L times a second, not
                // once per token per instance. Jittered up to half again, so instances
                // refused together do not ask together; never past the lease lifetime.
                let k = self.pool.instances_seen.load(Ordering::Relaxed).max(1);
                let whole = b
                    .max_cost
                    .min(b.policy.capacity() / (2 * k))
                    .max(plan.exchange.want);
                let lease_ns = whole
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
            Outcome::Granted { .. } | Outcome::Replayed { .. } | Outcome::NoGrant => {}
        }
    }

    /// Puts a grant into the reservoir: into a word holding no lease, or merged into the
    /// word holding the younger leases while its expiry is not near. A grant with no
    /// room is settled unspent with the next exchange. Returns whether it was installed.
    fn install(t: &mut Tracked, id: String, g: u64, expiry: u64, sent_ns: u64) -> bool {
        let r = &t.shared.reservoir;
        let held = Held {
            id,
            granted: g,
            installed_ns: sent_ns,
        };
        if let Some(i) = t.held.iter().position(Vec::is_empty) {
            r.install(i, expiry, g);
            t.held[i].push(held);
            t.supplied += g;
            return true;
        }
        let young = |i: usize| t.held[i].first().map_or(0, |h| h.installed_ns);
        let i = usize::from(young(1) > young(0));
        let sent = sent_ns >> TIME_SHIFT;
        let soon = sent + expiry.saturating_sub(sent) / 2;
        if crate::reservoir::expiry(r.load(i)) > soon && r.merge(i, expiry, g) {
            t.held[i].push(held);
            t.supplied += g;
            return true;
        }
        t.pending.push((held.id, g));
        t.pending_since_ns.get_or_insert(sent_ns);
        false
    }
}

/// How far Redis's clock (`redis_us`, read during a round answered at pool time
/// `received_ns`) has run ahead of the pool's since `base` (set at the first call), ns,
/// and whether that is more than `most_ahead_ns + threshold_ns`: a forward step. Redis
/// read its time before the answer arrived, so its elapsed time is at most the pool's
/// unless its clock ran ahead.
fn clock_step(
    base: &mut Option<(u64, u64)>,
    most_ahead_ns: i64,
    redis_us: u64,
    received_ns: u64,
    threshold_ns: u64,
) -> (i64, bool) {
    if redis_us == 0 {
        return (most_ahead_ns, false);
    }
    let (redis0, local0) = *base.get_or_insert((redis_us, received_ns));
    let redis_ns = (redis_us as i64 - redis0 as i64).saturating_mul(1000);
    let local_ns = received_ns as i64 - local0 as i64;
    let ahead = redis_ns - local_ns;
    (
        ahead,
        ahead > most_ahead_ns.saturating_add(threshold_ns as i64),
    )
}

fn parse(v: &Value) -> RedisResult<Reply> {
    let raw: Vec<i64> = redis::from_redis_value_ref(v)?;
    Reply::parse(&raw).ok_or_else(|| bad_reply(&raw))
}

#[cfg(test)]
mod tests {
    use super::clock_step;

    #[test]
    fn a_forward_step_of_redis_time_is_seen_and_drift_within_the_threshold_is_not() {
        let mut base = None;
        // First answer: the base.
        assert_eq!(
            clock_step(&mut base, 0, 1_000_000, 5_000, 25_000_000),
            (0, false)
        );
        // 1 s later on both clocks, Redis read 1 ms before the answer arrived: behind.
        let (ahead, stepped) = clock_step(&mut base, 0, 1_999_000, 1_000_005_000, 25_000_000);
        assert!(!stepped && ahead == -1_000_000, "{ahead}");
        // Redis 20 ms ahead: within half a 50 ms grace.
        let (ahead, stepped) = clock_step(&mut base, 0, 2_020_000, 1_000_005_000, 25_000_000);
        assert!(!stepped && ahead == 20_000_000, "{ahead}");
        // Redis stepped 2 s forward: seen.
        let (ahead, stepped) =
            clock_step(&mut base, 20_000_000, 4_000_000, 1_000_005_000, 25_000_000);
        assert!(stepped && ahead == 2_000_000_000, "{ahead}");
        // Redis stepped back: nothing to retire (refill pauses).
        let (_, stepped) = clock_step(&mut base, 2_000_000_000, 500_000, 2_000_005_000, 25_000_000);
        assert!(!stepped);
    }
}
