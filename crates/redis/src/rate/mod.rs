//! Rate leases: each instance holds a share `(r_i, b_i)` of the fleet's budget `(B, r)`
//! with an expiry, decides locally on an engine bucket of that share, and refreshes at a
//! fixed fraction of the lease's lifetime, reporting its demand; one script on Redis
//! divides the budget max-min fairly among the live instances' demands
//! (`lua/rate.lua`). Round trips grow with instances and the refresh rate, not with
//! requests.
//!
//! # The bound, and what keeps it
//!
//! In any window of length `T` the fleet admits at most `B + r*T`, with no term for `K`
//! or for moving shares, provided the clock term holds (below). Let `Φ(t)` be the tokens
//! all instances' local buckets hold. A decision spends a token the bucket holds, so the
//! fleet admits in `[t1, t2]` at most `Φ(t1)` plus what the buckets refill in between,
//! and:
//!
//! - **Refill never exceeds `r`.** A bucket refills at its share's rate `r_i` only while
//!   its lease is live locally (its clock, [`clock`], stops at the local expiry and does
//!   not run between leases), and the script grants rate only from what the other
//!   instances may still spend (the larger of each one's grant and the share it reported
//!   spending, each until its expiry on Redis): the rates being spent sum to at most `r`
//!   at every instant.
//! - **`Φ` never exceeds `B`, and nothing is minted.** A bucket holds at most its burst
//!   `b_i`, bursts are granted like rates (summing to at most `B`), a smaller share caps
//!   the tokens at the new burst, and a larger one adds no token: it only lets the bucket
//!   fill further at `r_i`. A grant that does not continue a share Redis still counted
//!   (a new instance, one whose lease lapsed, one Redis lost) starts its bucket empty: the
//!   burst it holds was freed by leases that expired, whose tokens may have been spent.
//!   So `Φ(t1) <= B` and the refill adds at most `r*T`.
//! - **The clock term.** An instance's local lease ends `ttl` after it *sent* the request
//!   (its monotonic clock); Redis counts the grant until `ttl + grace` after it ran the
//!   script (its clock), which is after the send. The local end precedes Redis's as long
//!   as `grace >= ttl * (ρ_L + ρ_R) + D` (the clocks' drift rates, `D` the largest forward
//!   step of Redis's clock within a lease). Beyond that, a share can be spent and handed
//!   on at once for at most the excess: `r * excess` more in a window.
//!
//! After Redis loses the state (a restart without persistence), a policy starting
//! [`Start::Empty`](crate::Start::Empty) keeps the bound: for one lease lifetime the script
//! grants nobody more than the share it reports spending (newcomers nothing), so grants
//! made before the loss expire before their capacity is handed out again. With
//! [`Start::Full`](crate::Start::Full) instances start at once, and the lost grants may be
//! spent beside new ones for one lifetime: at most `B + r * (ttl + grace)` more.
//!
//! # Cost
//!
//! One round trip per instance per refresh (`ttl / refresh_divisor`), plus at most one
//! more per second: right after a share shrinks (the acknowledgement that frees it for
//! others at once, not at its expiry) or while the instance is starved below its fair
//! share. An idle instance keeps its share (at least the minimum) until its demand is
//! reported at the next refresh, and a dead one until its lease expires: rate stranded
//! there, where token leases strand tokens.
//!
//! The local bucket is the engine's [`LiveBucket`]: each change of a share replaces its
//! epoch ([`tokengate::EPOCH_BYTES`], 512 bytes), the old one freed once no operation
//! holds it. The script grants the same share again while the fair target stays within
//! 1/32 of it, so a steady fleet changes nothing.

mod clock;
pub mod script;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use tokengate::{Inherit, LiveBucket, Policy, QuantaClock};

use crate::config::{ConfigError, PoolConfig};
use crate::connect::Link;
use crate::error::{PoolError, Refused};
use crate::policy::RemotePolicy;
use crate::pool::Admitted;
use crate::script::Scripts;
use clock::LeaseClock;
use script::{RateAsk, RateKeys, RateReply, RateScript, RateTarget};

/// Settings of a [`RatePool`]: the connection, namespace, lease lifetime (`lease_ttl`),
/// `grace` and timeouts of a [`PoolConfig`] (its token-lease settings are not used), and
/// the refresh and the minimum share.
#[derive(Clone, Debug)]
pub struct RateConfig {
    pool: PoolConfig,
    refresh_divisor: u32,
    min_share_divisor: u64,
}

impl RateConfig {
    /// Rate leases over `pool`'s connection settings: refresh every quarter lease
    /// lifetime, minimum share `r/64`.
    pub fn new(pool: PoolConfig) -> Self {
        Self {
            pool,
            refresh_divisor: 4,
            min_share_divisor: 64,
        }
    }

    /// Refresh every `lease_ttl / n` (2 to 64): round trips per instance per second are
    /// `n / ttl` (plus at most one).
    #[must_use]
    pub fn refresh_divisor(mut self, n: u32) -> Self {
        self.refresh_divisor = n;
        self
    }

    /// The minimum share is `r / n` (2 to 1,000,000): every live instance's demand counts
    /// as at least this, and this much is kept free so a new instance starts at once. An
    /// idle instance strands it until its lease expires; the fleet admits at most
    /// `r - r/n` while demand is unbalanced enough for it to bind.
    #[must_use]
    pub fn min_share_divisor(mut self, n: u64) -> Self {
        self.min_share_divisor = n;
        self
    }

    /// The refresh interval.
    pub fn refresh_every(&self) -> Duration {
        self.pool.lease_ttl / self.refresh_divisor.max(1)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.pool.validate()?;
        if !(2..=64).contains(&self.refresh_divisor) {
            return Err(ConfigError {
                setting: "refresh_divisor",
                value: u64::from(self.refresh_divisor),
                valid: "2 ..= 64",
            });
        }
        if !(2..=1_000_000).contains(&self.min_share_divisor) {
            return Err(ConfigError {
                setting: "min_share_divisor",
                value: self.min_share_divisor,
                valid: "2 ..= 1,000,000",
            });
        }
        Ok(())
    }
}

/// What the pool's buckets and its thread share.
#[derive(Debug)]
struct PoolShared {
    config: RateConfig,
    instance: String,
    stop: AtomicBool,
    thread: OnceLock<Thread>,
    new_buckets: Mutex<Vec<Arc<Shared>>>,
    round_trips: AtomicU64,
    failed_rounds: AtomicU64,
    /// The last round failed.
    unreachable: AtomicBool,
}

/// One bucket as its decisions and the pool's thread share it.
#[derive(Debug)]
struct Shared {
    keys: RateKeys,
    policy: RemotePolicy,
    clock: LeaseClock,
    bucket: LiveBucket<LeaseClock>,
    /// Tokens admitted (the demand the thread reports).
    admitted: AtomicU64,
    /// A decision was refused since the last refresh.
    starved: AtomicBool,
    rate_milli: AtomicU64,
    burst: AtomicU64,
    target_milli: AtomicU64,
    live: AtomicU64,
    share_changes: AtomicU64,
}

impl Shared {
    fn new(keys: RateKeys, policy: RemotePolicy) -> Self {
        let clock = LeaseClock::new(QuantaClock::new());
        // No lease yet: the clock is stopped at 0 and this policy is never decided on.
        let idle = Policy::per(1, 1, Duration::from_secs(1))
            .expect("one token per second is a policy")
            .start_empty();
        Self {
            keys,
            policy,
            bucket: LiveBucket::with_clock(idle, clock.clone()),
            clock,
            admitted: AtomicU64::new(0),
            starved: AtomicBool::new(true),
            rate_milli: AtomicU64::new(0),
            burst: AtomicU64::new(0),
            target_milli: AtomicU64::new(0),
            live: AtomicU64::new(0),
            share_changes: AtomicU64::new(0),
        }
    }
}

/// A pool of rate-leased budgets on one Redis: one thread owns the connection and
/// refreshes every bucket's share; decisions never wait on the network.
///
/// Dropping the pool gives every share back (best effort, within the exchange timeout)
/// and stops the thread.
#[derive(Debug)]
pub struct RatePool {
    shared: Arc<PoolShared>,
    thread: Option<JoinHandle<()>>,
}

impl RatePool {
    /// Connects, loads the script, and starts the thread.
    ///
    /// # Errors
    ///
    /// As [`RedisPool::connect`](crate::RedisPool::connect); [`PoolError::Config`] also
    /// for a refresh or minimum-share divisor out of range.
    pub fn connect(config: RateConfig) -> Result<Self, PoolError> {
        config.validate().map_err(PoolError::Config)?;
        let script = RateScript::new(config.pool.time);
        let con = open(&config.pool, &script)?;
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let shared = Arc::new(PoolShared {
            instance: format!(
                "{}-{nanos}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ),
            config,
            stop: AtomicBool::new(false),
            thread: OnceLock::new(),
            new_buckets: Mutex::new(Vec::new()),
            round_trips: AtomicU64::new(0),
            failed_rounds: AtomicU64::new(0),
            unreachable: AtomicBool::new(false),
        });
        let worker = Worker {
            shared: shared.clone(),
            script,
            con: Some(con),
            buckets: Vec::new(),
        };
        let handle = std::thread::Builder::new()
            .name("tokengate-rate".into())
            .spawn(move || worker.run())
            .map_err(|e| PoolError::Misconfigured {
                url: shared.config.pool.url.redacted(),
                detail: format!("cannot start the pool's thread: {e}"),
            })?;
        let _ = shared.thread.set(handle.thread().clone());
        Ok(Self {
            shared,
            thread: Some(handle),
        })
    }

    /// The bucket `scope` of this pool's namespace under `policy` (the fleet's `B` and
    /// `r`). Every instance using the same namespace, scope and policy shares one
    /// budget. It holds no share until the pool's first refresh of it.
    ///
    /// # Errors
    ///
    /// [`PoolError::Scope`] when `scope` is empty or holds `{` or `}`.
    pub fn bucket(&self, scope: &str, policy: RemotePolicy) -> Result<RateBucket, PoolError> {
        let keys =
            RateKeys::new(&self.shared.config.pool.namespace, scope).map_err(PoolError::Scope)?;
        let shared = Arc::new(Shared::new(keys, policy));
        self.shared
            .new_buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(shared.clone());
        if let Some(t) = self.shared.thread.get() {
            t.unpark();
        }
        Ok(RateBucket {
            pool: self.shared.clone(),
            shared,
        })
    }

    /// Round trips to Redis so far (one per refresh).
    pub fn round_trips(&self) -> u64 {
        self.shared.round_trips.load(Ordering::Relaxed)
    }

    /// Refreshes that failed (Redis unreachable or refusing).
    pub fn failed_rounds(&self) -> u64 {
        self.shared.failed_rounds.load(Ordering::Relaxed)
    }

    /// This pool's instance id in Redis.
    pub fn instance_id(&self) -> &str {
        &self.shared.instance
    }
}

impl Drop for RatePool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.shared.thread.get() {
            t.unpark();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A budget shared by rate leases: decisions spend from a local engine bucket of this
/// instance's share `(b_i, r_i)` (two clock reads and one CAS), never wait on the network,
/// and admit nothing while the instance holds no live lease.
#[derive(Clone, Debug)]
pub struct RateBucket {
    pool: Arc<PoolShared>,
    shared: Arc<Shared>,
}

/// A rate-leased bucket's share and counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateStats {
    /// Tokens admitted.
    pub admitted: u64,
    /// The share's rate, milli-tokens per second (0: none held).
    pub rate_milli: u64,
    /// The share's burst, tokens.
    pub burst: u64,
    /// The max-min fair rate Redis computed at the last refresh, milli-tokens per second.
    pub target_milli: u64,
    /// Live instances at the last refresh, this one included.
    pub live: u64,
    /// Times the local bucket's policy changed (each keeps one engine epoch).
    pub share_changes: u64,
}

impl RateBucket {
    /// Decides a request of `cost` whole tokens on this instance's share.
    ///
    /// # Errors
    ///
    /// [`Refused::Rejected`] when the share cannot pay now, or no share is held while
    /// Redis answers; [`Refused::Unavailable`] when no share is held and the last refresh
    /// failed; [`Refused::Cost`] for a cost of zero or above `B`.
    #[inline]
    pub fn try_acquire(&self, cost: u64) -> Result<Admitted, Refused> {
        let s = &*self.shared;
        let (now, until) = s.clock.lease_now();
        if now < until {
            if let Ok(d) = s.bucket.try_acquire(cost) {
                if d.is_admitted() && cost > 0 {
                    s.admitted.fetch_add(cost, Ordering::Relaxed);
                    return Ok(Admitted::Leased);
                }
            }
        }
        self.refused(cost, now < until)
    }

    #[cold]
    fn refused(&self, cost: u64, live: bool) -> Result<Admitted, Refused> {
        let s = &*self.shared;
        let max = s.policy.capacity();
        if cost == 0 || cost > max {
            return Err(Refused::Cost { cost, max });
        }
        if !s.starved.load(Ordering::Relaxed) {
            s.starved.store(true, Ordering::Relaxed);
        }
        let retry_after = self.pool.config.refresh_every();
        if !live && self.pool.unreachable.load(Ordering::Relaxed) {
            return Err(Refused::Unavailable { retry_after });
        }
        Err(Refused::Rejected { retry_after })
    }

    /// The share held now: `(rate in tokens per second, burst in tokens)`, or `None`.
    pub fn share(&self) -> Option<(f64, u64)> {
        let s = &*self.shared;
        let (now, until) = s.clock.lease_now();
        (now < until).then(|| {
            (
                s.rate_milli.load(Ordering::Relaxed) as f64 / 1000.0,
                s.burst.load(Ordering::Relaxed),
            )
        })
    }

    /// The fleet's policy.
    pub fn policy(&self) -> &RemotePolicy {
        &self.shared.policy
    }

    /// The bucket's share and counters.
    pub fn stats(&self) -> RateStats {
        let s = &*self.shared;
        RateStats {
            admitted: s.admitted.load(Ordering::Relaxed),
            rate_milli: s.rate_milli.load(Ordering::Relaxed),
            burst: s.burst.load(Ordering::Relaxed),
            target_milli: s.target_milli.load(Ordering::Relaxed),
            live: s.live.load(Ordering::Relaxed),
            share_changes: s.share_changes.load(Ordering::Relaxed),
        }
    }
}

/// Opens the connection as the token-lease pool does, and loads the rate script.
fn open(config: &PoolConfig, script: &RateScript) -> Result<Link, PoolError> {
    let mut con = crate::connect::open(config, &Scripts::new(config.time))?;
    script
        .load(&mut con)
        .map_err(|e| PoolError::Misconfigured {
            url: config.url.redacted(),
            detail: e.to_string(),
        })?;
    Ok(con)
}

/// The thread's view of one bucket.
struct Local {
    shared: Arc<Shared>,
    seq: u64,
    /// The grant spent now: (sequence number, rate milli-tokens/s, burst).
    has: Option<(u64, u64, u64)>,
    last_at: u64,
    /// (time, admitted) at each of the last four rounds, oldest first.
    history: [(u64, u64); 4],
    /// (time, admitted) three quarters through the period.
    mid: Option<(u64, u64)>,
    /// Samples taken this period, and how many saw a refusal.
    polls: u32,
    starved_polls: u32,
    /// The same in the last quarter of the period.
    late_polls: u32,
    late_starved: u32,
    /// The last round asked for the whole rate.
    asked_all: bool,
    next_at: u64,
    last_extra: Option<u64>,
}

struct Worker {
    shared: Arc<PoolShared>,
    script: RateScript,
    con: Option<Link>,
    buckets: Vec<Local>,
}

const SECOND_NS: u64 = 1_000_000_000;

impl Worker {
    fn run(mut self) {
        let refresh = self.shared.config.refresh_every().as_nanos() as u64;
        loop {
            let fresh: Vec<Arc<Shared>> = std::mem::take(
                &mut *self
                    .shared
                    .new_buckets
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
            for shared in fresh {
                let now = shared.clock.real();
                self.buckets.push(Local {
                    shared,
                    seq: 0,
                    has: None,
                    last_at: now,
                    history: [(now, 0); 4],
                    mid: None,
                    polls: 0,
                    starved_polls: 0,
                    late_polls: 0,
                    late_starved: 0,
                    asked_all: false,
                    next_at: 0,
                    last_extra: None,
                });
            }
            if self.shared.stop.load(Ordering::Relaxed) {
                for i in 0..self.buckets.len() {
                    if self.con.is_some() {
                        self.round(i, true);
                    }
                }
                return;
            }
            let poll = refresh / 16;
            let mut wait = poll;
            for i in 0..self.buckets.len() {
                let b = &mut self.buckets[i];
                let now = b.shared.clock.real();
                if b.mid.is_none() && now >= b.last_at + refresh * 3 / 4 {
                    // Three quarters through: what the period admitted so far.
                    b.mid = Some((now, b.shared.admitted.load(Ordering::Relaxed)));
                }
                // Sixteen samples a period of whether decisions were refused: the share of
                // the period the instance was starved, and of its last quarter.
                b.polls += 1;
                let refused = b.shared.starved.swap(false, Ordering::Relaxed);
                b.starved_polls += u32::from(refused);
                if b.mid.is_some() {
                    b.late_polls += 1;
                    b.late_starved += u32::from(refused);
                }
                // One round more per second at most: refused while its last round did not
                // ask for everything, or below its fair share.
                let extra = b.last_extra.is_none_or(|at| now >= at + SECOND_NS)
                    && b.starved_polls > 0
                    && (!b.asked_all
                        || b.shared.target_milli.load(Ordering::Relaxed)
                            > b.shared.rate_milli.load(Ordering::Relaxed))
                    && now >= b.last_at + refresh / 8;
                if now >= b.next_at || extra {
                    if extra && now < b.next_at {
                        self.buckets[i].last_extra = Some(now);
                    }
                    self.round(i, false);
                }
                let b = &self.buckets[i];
                wait = wait.min(b.next_at.saturating_sub(b.shared.clock.real()));
            }
            // Poll sixteen times a period; sleep to the next refresh.
            std::thread::park_timeout(Duration::from_nanos(wait.max(100_000)));
        }
    }

    /// One refresh of bucket `i` (or its give-back when `leave`).
    fn round(&mut self, i: usize, leave: bool) {
        let cfg = &self.shared.config;
        let refresh = cfg.refresh_every().as_nanos() as u64;
        let ttl = cfg.pool.lease_ttl.as_nanos() as u64;
        if self.con.is_none() {
            match open(&cfg.pool, &self.script) {
                Ok(c) => self.con = Some(c),
                Err(_) => {
                    self.failed();
                    let b = &mut self.buckets[i];
                    b.next_at = b.shared.clock.real() + refresh.min(100_000_000);
                    return;
                }
            }
        }
        let b = &mut self.buckets[i];
        let s = b.shared.clone();
        b.seq += 1;
        let sent = s.clock.real();
        let admitted = s.admitted.load(Ordering::Relaxed);
        let rate_of = |count: u64, since: u64| {
            (u128::from(count) * 1_000_000_000_000 / u128::from(sent.saturating_sub(since).max(1)))
                as u64
        };
        // Demand over the last four periods (about one lease lifetime: enough admissions
        // to be steady at low rates)...
        let (t0, a0) = b.history[0];
        let long_milli = rate_of(admitted - a0, t0);
        let mut used_milli = long_milli;
        let mut dropped = false;
        let share_milli = b.has.map_or(0, |h| h.1);
        // ...or over the last quarter of this period when it fell below a quarter of the
        // share, and the share would have paid at least 8 tokens there: a drop is
        // reported at once.
        if let Some((at, count)) = b.mid.filter(|m| m.0 > b.last_at && sent > m.0) {
            // One admission more than counted: a few admissions measure a low rate
            // coarsely, and too small a share would be refused at once.
            let half = rate_of(admitted - count + 1, at);
            let meaningful =
                u128::from(share_milli) * u128::from(sent - at) >= 8 * 1_000_000_000_000;
            if meaningful && half < share_milli / 4 {
                used_milli = half;
                // Used before, not now: the share goes back before the round.
                dropped = long_milli >= share_milli / 2;
            }
        }
        for k in 0..3 {
            b.history[k] = b.history[k + 1];
        }
        b.history[3] = (sent, admitted);
        // Refused for three quarters of the period or more: it wants the whole rate; for
        // a fraction f of it: (1 + 2f) times what it has or used. Otherwise its use, with
        // an eighth of headroom; a share it still uses half of is kept as it is (fewer
        // changes).
        b.polls += 1;
        if s.starved.swap(false, Ordering::Relaxed) {
            b.starved_polls += 1;
            b.late_starved += u32::from(b.mid.is_some());
        }
        b.late_polls += u32::from(b.mid.is_some());
        let (polls, starved_polls) = (u64::from(b.polls), u64::from(b.starved_polls));
        // Refused at every sample of the last quarter: demand just rose.
        let late = b.late_polls >= 2 && b.late_starved == b.late_polls;
        (b.polls, b.starved_polls, b.late_polls, b.late_starved) = (0, 0, 0, 0);
        b.mid = None;
        let starved = starved_polls > 0;
        b.asked_all = late || starved_polls * 4 >= polls * 3;
        let want_milli = if b.asked_all {
            s.policy.rate_milli()
        } else if starved {
            let more = share_milli.max(used_milli);
            (more + more * 2 * starved_polls / polls).min(s.policy.rate_milli())
        } else if used_milli >= share_milli / 2 {
            share_milli.max(used_milli + used_milli / 8)
        } else {
            used_milli + used_milli / 8
        };
        // Demand fell well below a share it used: shrink the share here first and report
        // the smaller one, so Redis can hand the difference to others at once. (An idle
        // instance keeps what it holds: Redis splits what nobody wants evenly, so a quiet
        // fleet's buckets fill to its whole burst.)
        if let (true, false, false, Some((seq, r, bu))) = (dropped, starved, leave, b.has) {
            let min_r = (s.policy.rate_milli() / cfg.min_share_divisor).max(1);
            let r2 = want_milli.max(min_r);
            let b2 = ((u128::from(s.policy.capacity()) * u128::from(r2)
                / u128::from(s.policy.rate_milli())) as u64)
                .clamp(1, bu.max(1));
            if r2 < r - r / 4 {
                if let Ok(p) = Policy::per(b2, r2, Duration::from_secs(1000)) {
                    s.bucket.reconfigure(p, Inherit::AsIs);
                    s.share_changes.fetch_add(1, Ordering::Relaxed);
                    b.has = Some((seq, r2, b2));
                    s.rate_milli.store(r2, Ordering::Relaxed);
                    s.burst.store(b2, Ordering::Relaxed);
                }
            }
        }
        let (now, until) = s.clock.lease_now();
        let ask = RateAsk {
            instance: self.shared.instance.clone(),
            seq: b.seq,
            has: b.has.filter(|_| now < until),
            want_milli,
            leave,
        };
        let target = RateTarget {
            keys: &s.keys,
            policy: &s.policy,
            lease_us: (cfg.pool.lease_ttl + cfg.pool.grace).as_micros() as u64,
            min_share_milli: (s.policy.rate_milli() / cfg.min_share_divisor).max(1),
            keep_ms: cfg.pool.key_keep.as_millis() as u64,
        };
        let con = self.con.as_mut().expect("connected above");
        let result = self.script.refresh(con, &target, &ask, wall_us());
        self.shared.round_trips.fetch_add(1, Ordering::Relaxed);
        b.last_at = sent;
        b.next_at = sent + refresh;
        match result {
            Ok(reply) if reply.granted => {
                self.shared.unreachable.store(false, Ordering::Relaxed);
                let before = b.has;
                apply(&s, b, &reply, sent + ttl);
                // A smaller share is acknowledged at once (one round more per second at
                // most), so Redis hands the difference to others now, not at expiry.
                let shrank = matches!((before, b.has), (Some((_, r0, b0)), Some((_, r1, b1))) if r1 < r0 || b1 < b0);
                if shrank && !leave && b.last_extra.is_none_or(|at| sent >= at + SECOND_NS) {
                    b.last_extra = Some(sent);
                    b.next_at = sent;
                }
            }
            Ok(_) => {}
            Err(_) => {
                self.con = None;
                self.failed();
                let b = &mut self.buckets[i];
                b.next_at = b.next_at.min(sent + refresh.min(100_000_000));
            }
        }
    }

    fn failed(&self) {
        self.shared.failed_rounds.fetch_add(1, Ordering::Relaxed);
        self.shared.unreachable.store(true, Ordering::Relaxed);
    }
}

/// Applies a grant to the local bucket: stop the lease clock, change the policy (carrying
/// the tokens over only when Redis counted the share continuously, capped at the new
/// burst; else empty), and start the lease clock again until `until_real`.
fn apply(s: &Shared, b: &mut Local, reply: &RateReply, until_real: u64) {
    s.target_milli.store(reply.target_milli, Ordering::Relaxed);
    s.live.store(reply.live, Ordering::Relaxed);
    let frozen = s.clock.stop();
    let policy = (reply.rate_milli > 0 && reply.burst > 0)
        .then(|| Policy::per(reply.burst, reply.rate_milli, Duration::from_secs(1000)).ok())
        .flatten();
    let Some(policy) = policy else {
        b.has = None;
        s.rate_milli.store(0, Ordering::Relaxed);
        s.burst.store(0, Ordering::Relaxed);
        return;
    };
    let same = b
        .has
        .is_some_and(|(_, r, bu)| (r, bu) == (reply.rate_milli, reply.burst));
    if !reply.continuous || b.has.is_none() {
        s.bucket.reconfigure(policy.start_empty(), Inherit::Reset);
        s.share_changes.fetch_add(1, Ordering::Relaxed);
    } else if !same {
        s.bucket.reconfigure(policy, Inherit::AsIs);
        s.share_changes.fetch_add(1, Ordering::Relaxed);
    }
    if s.clock.resume(frozen, until_real) {
        b.has = Some((b.seq, reply.rate_milli, reply.burst));
        s.rate_milli.store(reply.rate_milli, Ordering::Relaxed);
        s.burst.store(reply.burst, Ordering::Relaxed);
    } else {
        b.has = None;
        s.rate_milli.store(0, Ordering::Relaxed);
        s.burst.store(0, Ordering::Relaxed);
    }
}

/// Wall-clock µs, for scripts reading time from their argument (tests).
fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    //! The local side of a grant, without Redis: what a bucket holds when a share starts,
    //! grows, lapses and resumes.

    use super::*;
    use tokengate::Clock;

    fn grant(rate_milli: u64, burst: u64, continuous: bool) -> RateReply {
        RateReply {
            granted: true,
            rate_milli,
            burst,
            expiry_us: 0,
            continuous,
            now_us: 0,
            epoch: 0,
            live: 1,
            target_milli: rate_milli,
        }
    }

    fn setup() -> (Local, Arc<Shared>) {
        let keys = RateKeys::new("unit", "b").unwrap();
        let policy = RemotePolicy::new(1000, 1000.0).unwrap();
        let shared = Arc::new(Shared::new(keys, policy));
        let local = Local {
            shared: shared.clone(),
            seq: 1,
            has: None,
            last_at: 0,
            history: [(0, 0); 4],
            mid: None,
            polls: 0,
            starved_polls: 0,
            late_polls: 0,
            late_starved: 0,
            asked_all: false,
            next_at: 0,
            last_extra: None,
        };
        (local, shared)
    }

    /// Spins until the lease clock has run `ns` of real time.
    fn spin(s: &Shared, ns: u64) {
        let end = s.clock.real() + ns;
        while s.clock.real() < end {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn a_new_share_starts_empty_and_a_larger_one_adds_no_token() {
        let (mut local, s) = setup();
        let t = s.clock.real();
        apply(
            &s,
            &mut local,
            &grant(1_000_000, 10, false),
            t + 10_000_000_000,
        );
        // Empty at the start: at most what 1000/s refilled since (a microsecond or so).
        let start = s.bucket.available();
        assert!(start < 1.0, "a new share started with {start} tokens");
        spin(&s, 30_000_000); // 30 ms at 1000/s: full (10)
        let full = s.bucket.available();
        assert!((full - 10.0).abs() < 1e-9, "{full}");
        // The same share continued, ten times larger: the tokens stay; the bucket only
        // fills further at its rate.
        local.seq += 1;
        let before = s.clock.real();
        apply(&s, &mut local, &grant(1_000, 100, true), t + 10_000_000_000);
        let elapsed_s = (s.clock.real() - before) as f64 / 1e9;
        let after = s.bucket.available();
        assert!(
            after <= 10.0 + elapsed_s + 1e-9,
            "a larger share added tokens: {after}"
        );
        // A share that does not continue (Redis lost it, or the lease lapsed) empties.
        local.seq += 1;
        apply(
            &s,
            &mut local,
            &grant(1_000, 100, false),
            t + 10_000_000_000,
        );
        assert!(s.bucket.available() < 1.0);
    }

    #[test]
    fn an_expired_share_is_not_spent_and_a_gap_refills_nothing() {
        let (mut local, s) = setup();
        let bucket = RateBucket {
            pool: Arc::new(PoolShared {
                config: RateConfig::new(PoolConfig::new("redis://127.0.0.1:1/", "unit")),
                instance: "unit".into(),
                stop: AtomicBool::new(false),
                thread: OnceLock::new(),
                new_buckets: Mutex::new(Vec::new()),
                round_trips: AtomicU64::new(0),
                failed_rounds: AtomicU64::new(0),
                unreachable: AtomicBool::new(false),
            }),
            shared: s.clone(),
        };
        let t = s.clock.real();
        // A lease of 20 ms at 1000/s, burst 5: full within 5 ms.
        apply(&s, &mut local, &grant(1_000_000, 5, false), t + 20_000_000);
        spin(&s, 25_000_000);
        assert!(s.clock.real() > t + 20_000_000);
        // Expired: the five tokens it holds are not spent.
        assert!(matches!(
            bucket.try_acquire(1),
            Err(Refused::Rejected { .. })
        ));
        assert!((s.bucket.available() - 5.0).abs() < 1e-9);
        // Resumed by a continuing grant after the gap: the clock did not run meanwhile.
        let frozen = s.clock.now_nanos();
        spin(&s, 5_000_000);
        assert_eq!(
            s.clock.now_nanos(),
            frozen,
            "lease time ran past the expiry"
        );
        local.seq += 1;
        apply(
            &s,
            &mut local,
            &grant(1_000_000, 5, true),
            s.clock.real() + 1_000_000_000,
        );
        assert!(s.bucket.available() <= 5.0);
        for _ in 0..5 {
            assert!(bucket.try_acquire(1).is_ok());
        }
    }
}
