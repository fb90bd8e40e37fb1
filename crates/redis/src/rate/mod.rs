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
//!   its lease is live locally (its clock, `clock`, stops at the local expiry and does
//!   not run between leases), and the script grants rate only from what the other
//!   instances may still spend (the larger of each one's grant and the share it reported
//!   spending, each until its expiry on Redis): the rates being spent, with the idle rate
//!   that refills the pool (below), sum to at most `r` at every instant.
//! - **`Φ` never exceeds `B`, and nothing is minted.** A bucket holds at most its burst
//!   `b_i`, bursts are granted like rates (summing to at most `B`: two tokens for each
//!   live instance and one newcomer, the rest in proportion to the rate), a smaller share caps
//!   the tokens at the new burst, and a larger one adds no token: it only lets the bucket
//!   fill further at `r_i`. A grant that does not continue a share Redis still counted
//!   (a new instance, one whose lease lapsed, one Redis lost) starts its bucket empty: the
//!   burst it holds was freed by leases that expired, whose tokens may have been spent.
//!   So `Φ(t1) <= B` and the refill adds at most `r*T`.
//! - **Dropped tokens are handed on, not minted.** A share that shrinks (given back
//!   early, or a smaller grant) caps its bucket at the smaller burst first; the tokens
//!   above it (exactly what the switch dropped, whatever decisions raced it) are reported
//!   at the next round with an id. Redis credits them to a pool once per id (a retry
//!   after a lost reply credits nothing more), only for a share it still counts and at
//!   most by what the instance's counted burst shrank, and the pool keeps their burst:
//!   the bursts any instance may spend plus the pool never exceed `B`. A grant takes
//!   tokens from the pool (before Redis replies) for its bucket to start with, as many as
//!   it has room for, when it wants more than the grant gives or the pool blocks its
//!   burst (what still blocks it leaves the pool unspent: the pool never takes a
//!   newcomer's burst); the pool expires one lease lifetime after it last grew (a pool
//!   held at its cap grows no more, so it is dropped one lease lifetime later and rebuilt
//!   from empty: conservative). So with `Ψ` the buckets' tokens plus the pool, `Ψ <= B`
//!   at every instant: tokens between a drop and its credit, or between a hand-on and its
//!   arrival, are in neither (an instance killed after dropping, or a lost reply, loses
//!   them).
//! - **Idle rate refills the pool, not more.** After each refresh Redis records the rate
//!   no lease holds (`r` less every instance's larger of grant and hold), the time, and
//!   the burst no lease holds (`B` less every instance's larger burst of grant and hold),
//!   which caps the pool. Until the next refresh only expiries change what is held
//!   (grants are made by the script alone), so that rate was free all along: the next
//!   refresh adds it times the time since to the pool (carrying the fraction of a token),
//!   capped at the recorded burst (bursts only shrink meanwhile); the recorded time is
//!   the largest Redis's clock has shown, so a step back accrues nothing and no interval
//!   twice. So the buckets refill at the rates of the shares being spent and the pool at
//!   the rest: `Ψ` grows by at most `r` per unit of time, and nothing else raises it.
//!   While Redis learns after a loss nothing accrues.
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
//! One round trip per instance per refresh (`ttl / refresh_divisor`), plus early rounds:
//! one a second on average, three back to back at most (a credit that accrues one round
//! a second, up to three). An early round goes out, at the earliest three polls (sixteen
//! a refresh period) after the last round:
//!
//! - when demand fell: an instance refused within the last period (or spending half its
//!   share over the last four) that has since spent under a quarter of its share, over at
//!   least two and a half polls where the share would have paid 8 tokens, shrinks its
//!   local bucket first and then reports the smaller share, so the script hands the
//!   difference on at once (the share it reports is what Redis counts it spending: the
//!   bucket no longer pays more, and its tokens are capped at the smaller burst);
//! - when starved: refused at two polls in a row while its last round did not ask for the
//!   whole rate, or Redis's fair target for it is above what it holds (others had not
//!   given theirs back yet): it asks for the whole rate, and the max-min division caps it;
//! - right after a share an eighth smaller or more (the acknowledgement that frees it for
//!   others at once, not at the next refresh or its expiry).
//!
//! So when the hot spot moves, the old holder gives its share back and the new one takes
//! it within a few polls and two or three round trips, not at their refreshes. An idle
//! instance keeps its share (at least the minimum) until its demand is reported at the
//! next refresh, and a dead one until its lease expires: rate stranded there, where token
//! leases strand tokens.
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

use tokengate::{Inherit, LiveBucket, Policy, QuantaClock, Reconfigured};

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
    /// `n / ttl`, plus early ones: at most one a second on average (three back to back).
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

/// Poll samples a bucket keeps: one refresh period's (sixteen) and one more.
const RING: usize = 17;

const SECOND_NS: u64 = 1_000_000_000;

/// Rounds of admissions a bucket keeps (the steady demand is measured over them).
const HISTORY: usize = 8;

/// Early rounds a bucket may make back to back (one a second on average).
const EARLY_MAX: u64 = 3;

/// A share at most this is near a use of `used` (a quarter above it): refused there, the
/// share was what bound.
fn near(used: u64) -> u64 {
    used + used / 4
}

/// Milli-tokens per second of `count` tokens in `ns`.
fn rate_of(count: u64, ns: u64) -> u64 {
    (u128::from(count) * 1_000_000_000_000 / u128::from(ns.max(1))) as u64
}

/// The thread's view of one bucket.
struct Local {
    shared: Arc<Shared>,
    seq: u64,
    /// The grant spent now: (sequence number, rate milli-tokens/s, burst).
    has: Option<(u64, u64, u64)>,
    /// When the last round was sent, and when the next regular one is due (real ns).
    last_at: u64,
    next_at: u64,
    /// (time, admitted) at each of the last `HISTORY` rounds, oldest first.
    history: [(u64, u64); HISTORY],
    /// (time, admitted) at each of the last `RING` polls; the newest at `ring_at`.
    ring: [(u64, u64); RING],
    ring_at: usize,
    /// Polls since the last round, and how many saw a refusal.
    polls: u32,
    starved_polls: u32,
    /// Consecutive polls that saw a refusal, up to the latest one.
    refused_run: u32,
    /// The latest poll that saw a refusal (real ns; 0: none yet).
    last_refused: u64,
    /// The last round asked for the whole rate.
    asked_all: bool,
    /// Credit for early rounds (ns: one round costs a second's; it accrues in real time
    /// up to `EARLY_MAX` seconds), and when it was last brought up to date.
    credit: u64,
    credit_at: u64,
    /// Tokens dropped when the share shrank, not yet acknowledged by Redis: (id, tokens).
    dropped: Option<(u64, u64)>,
    /// The last drop id used.
    drop_ids: u64,
}

impl Local {
    fn new(shared: Arc<Shared>, now: u64) -> Self {
        Self {
            shared,
            seq: 0,
            has: None,
            last_at: now,
            next_at: 0,
            history: [(now, 0); HISTORY],
            ring: [(0, 0); RING],
            ring_at: 0,
            polls: 0,
            starved_polls: 0,
            refused_run: 0,
            last_refused: 0,
            asked_all: false,
            credit: EARLY_MAX * SECOND_NS,
            credit_at: now,
            dropped: None,
            drop_ids: 0,
        }
    }

    /// Records the whole tokens a shrinking switch dropped (what the bucket held at the
    /// switch less what it holds after: exact, whatever decisions raced it), to report
    /// under a new id. A drop not yet acknowledged is replaced: Redis credits ids in
    /// order, so the older one is lost if it was not credited (never credited twice).
    fn record_drop(&mut self, switch: Reconfigured) {
        let lost = (switch.before - switch.after).floor();
        if lost >= 1.0 {
            self.drop_ids += 1;
            self.dropped = Some((self.drop_ids, lost as u64));
        }
    }

    /// One poll: whether a decision was refused since the last, and what was admitted.
    fn sample(&mut self, now: u64) {
        let refused = self.shared.starved.swap(false, Ordering::Relaxed);
        self.polls += 1;
        self.starved_polls += u32::from(refused);
        if refused {
            self.refused_run += 1;
            self.last_refused = now;
        } else {
            self.refused_run = 0;
        }
        self.ring_at = (self.ring_at + 1) % RING;
        self.ring[self.ring_at] = (now, self.shared.admitted.load(Ordering::Relaxed));
        self.credit = (self.credit + (now - self.credit_at)).min(EARLY_MAX * SECOND_NS);
        self.credit_at = now;
    }

    /// Refused at the last two polls while Redis would give more than the instance holds
    /// (or its last round did not ask for everything): it asks again before its refresh.
    fn starving(&self) -> bool {
        let rate = self.shared.rate_milli.load(Ordering::Relaxed);
        self.refused_run >= 2
            && (!self.asked_all
                || rate + rate / 16 < self.shared.target_milli.load(Ordering::Relaxed))
    }

    /// The demand of an instance that used its share (refused within the last refresh
    /// period, or spending half of it over the last four) and now spends under a quarter of
    /// it: its rate since the latest refusal (within the period, at least two and a half
    /// polls, one admission more than counted so that a few admissions do not read as
    /// none), where the share would have paid 8 tokens or more. `None` otherwise.
    fn quiet_drop(&self, now: u64, refresh: u64) -> Option<u64> {
        let (_, share, _) = self.has?;
        let admitted = self.shared.admitted.load(Ordering::Relaxed);
        let (t0, a0) = self.history[HISTORY - 4];
        let used_before =
            self.last_refused + refresh >= now || rate_of(admitted - a0, now - t0) >= share / 2;
        let start = self.last_refused.max(now.saturating_sub(refresh));
        let &(at, count) = self
            .ring
            .iter()
            .filter(|x| x.0 > 0 && x.0 >= start)
            .min_by_key(|x| x.0)?;
        let window = now.saturating_sub(at);
        let meaningful = window >= refresh * 5 / 32
            && u128::from(share) * u128::from(window) >= 8 * 1_000_000_000_000;
        let used = rate_of(admitted - count + 1, window);
        (used_before && meaningful && used < share / 4).then_some(used)
    }
}

struct Worker {
    shared: Arc<PoolShared>,
    script: RateScript,
    con: Option<Link>,
    buckets: Vec<Local>,
}

impl Worker {
    fn run(mut self) {
        let refresh = self.shared.config.refresh_every().as_nanos() as u64;
        let poll = refresh / 16;
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
                self.buckets.push(Local::new(shared, now));
            }
            if self.shared.stop.load(Ordering::Relaxed) {
                for i in 0..self.buckets.len() {
                    if self.con.is_some() {
                        self.round(i, true);
                    }
                }
                return;
            }
            let mut wait = poll;
            for i in 0..self.buckets.len() {
                let b = &mut self.buckets[i];
                let now = b.shared.clock.real();
                // Sixteen samples a period of whether decisions were refused, and of what
                // was admitted.
                if now >= b.ring[b.ring_at].0 + poll / 2 {
                    b.sample(now);
                }
                // Early (one a second, three back to back at most, three polls after the
                // last round): starved while Redis would give more, or demand fell well
                // below the share (given back at once, so Redis can hand it on).
                let early = now < b.next_at
                    && b.credit >= SECOND_NS
                    && now >= b.last_at + poll * 3
                    && (b.starving() || b.quiet_drop(now, refresh).is_some());
                if now >= b.next_at || early {
                    if early {
                        b.credit -= SECOND_NS;
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
        // Demand over the last four rounds (about one lease lifetime), and over the last
        // eight (steadier at low rates: what a share that is kept is measured against),
        // or since the demand fell (reported at once).
        let (t0, a0) = b.history[HISTORY - 4];
        let long_milli = rate_of(admitted - a0, sent - t0);
        let (t0, a0) = b.history[0];
        // (The larger of the two: a demand that rose is not read as the older, lower one.)
        let steady_milli = rate_of(admitted - a0, sent - t0).max(long_milli);
        // Refused since then: its use is what the share paid, not its demand.
        let refused_since = b.last_refused >= t0;
        let share_milli = b.has.map_or(0, |h| h.1);
        let quiet = b.quiet_drop(sent, refresh);
        b.history.rotate_left(1);
        b.history[HISTORY - 1] = (sent, admitted);
        // (A round soon after the last one counts its few polls as part of a period: a
        // refusal or two there is no sign of demand above the share.)
        let (polls, starved_polls) = (u64::from(b.polls.max(16)), u64::from(b.starved_polls));
        (b.polls, b.starved_polls) = (0, 0);
        // Fell well below its share: what it uses now, with an eighth of headroom. Refused
        // at the last two polls or for three quarters of the period or more: it wants the
        // whole rate (Redis's max-min division caps it at the fair share); for a fraction
        // f of the period: (1 + 2f) times what it has or used, unless its share is more
        // than a quarter above what it used (then a refusal is a burst's, not the rate's,
        // and the share follows its use). Otherwise its steady use
        // with a 32nd of headroom; a share from its use to a sixteenth above is kept as
        // it is (fewer changes), and so is one refused over those rounds (what it used is
        // then what the share paid, not its demand). Rate held above use is lost (the
        // bucket is full: what it refills is dropped), so the headroom is small: a refusal
        // raises the share.
        let all = s.policy.rate_milli();
        // Each poll that saw a refusal saw at least one refused token: with what it
        // admitted since the last round, a floor under its demand (an instance holding
        // nothing still asks for what it was refused).
        let since = b.history[HISTORY - 2];
        let seen = rate_of(
            admitted - since.1 + starved_polls,
            (sent - since.0).max(refresh),
        );
        b.asked_all = quiet.is_none() && (b.refused_run >= 2 || starved_polls * 4 >= polls * 3);
        let want_milli = if let Some(used) = quiet {
            used + used / 8
        } else if b.asked_all {
            all
        } else if starved_polls > 0 && share_milli <= near(long_milli.max(seen)) {
            let more = share_milli.max(long_milli).max(seen);
            (more + more * 2 * starved_polls / polls).min(all)
        } else if (refused_since && share_milli <= near(steady_milli.max(seen)))
            || (share_milli >= steady_milli && share_milli <= steady_milli + steady_milli / 16)
        {
            share_milli
        } else {
            steady_milli + steady_milli / 32
        };
        // Demand fell well below a share it used: shrink the share here first and report
        // the smaller one, so Redis can hand the difference to others at once. (An idle
        // instance keeps what it holds: Redis splits what nobody wants evenly, so a quiet
        // fleet's buckets fill to its whole burst.)
        if let (Some(_), false, Some((seq, r, bu))) = (quiet, leave, b.has) {
            let min_r = (all / cfg.min_share_divisor).max(1);
            let r2 = want_milli.max(min_r);
            let b2 = ((u128::from(s.policy.capacity()) * u128::from(r2) / u128::from(all)) as u64)
                .clamp(1, bu.max(1));
            if r2 < r - r / 4 {
                // What it used before the drop is no longer its demand.
                b.history = [(sent, admitted); HISTORY];
                if let Ok(p) = Policy::per(b2, r2, Duration::from_secs(1000)) {
                    // The tokens above the smaller burst are dropped here, before the
                    // report: Redis may hand them on once it has it.
                    b.record_drop(s.bucket.reconfigure(p, Inherit::AsIs));
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
            dropped: b.dropped,
            tokens: if now < until {
                s.bucket.available().max(0.0) as u64
            } else {
                0
            },
        };
        let target = RateTarget {
            keys: &s.keys,
            policy: &s.policy,
            lease_us: (cfg.pool.lease_ttl + cfg.pool.grace).as_micros() as u64,
            min_share_milli: (all / cfg.min_share_divisor).max(1),
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
                // Redis saw the drop (credited now, or earlier under the same id).
                if b.dropped == ask.dropped {
                    b.dropped = None;
                }
                let before = b.has;
                apply(&s, b, &reply, sent + ttl);
                // A share an eighth smaller or more is acknowledged at once (out of the
                // early rounds' credit), so Redis hands the difference to others now, not
                // at the next refresh or expiry.
                let shrank = matches!((before, b.has), (Some((_, r0, b0)), Some((_, r1, b1))) if r1 < r0 - r0 / 8 || b1 < b0 - b0 / 8);
                if shrank && !leave && b.credit >= SECOND_NS {
                    b.credit -= SECOND_NS;
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
        // A smaller burst drops the tokens above it: reported at the next round.
        b.record_drop(s.bucket.reconfigure(policy, Inherit::AsIs));
        s.share_changes.fetch_add(1, Ordering::Relaxed);
    }
    // Tokens handed on from the pool (Redis took them out of it before replying; at most
    // the burst, and the bucket caps them at it).
    if reply.handed > 0 {
        let _ = s.bucket.refund(reply.handed.min(reply.burst));
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
            handed: 0,
        }
    }

    fn setup() -> (Local, Arc<Shared>) {
        let keys = RateKeys::new("unit", "b").unwrap();
        let policy = RemotePolicy::new(1000, 1000.0).unwrap();
        let shared = Arc::new(Shared::new(keys, policy));
        let mut local = Local::new(shared.clone(), 0);
        local.seq = 1;
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
        // A lease of 150 ms at 1000/s, burst 5: full within 5 ms of its start (however
        // long the switch took on a loaded machine).
        apply(&s, &mut local, &grant(1_000_000, 5, false), t + 150_000_000);
        spin(&s, 155_000_000);
        assert!(s.clock.real() > t + 150_000_000);
        // Expired: the five tokens it holds are not spent.
        assert!(matches!(
            bucket.try_acquire(1),
            Err(Refused::Rejected { .. })
        ));
        let held = s.bucket.available();
        assert!((held - 5.0).abs() < 1e-9, "{held}");
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

    /// `polls` samples `poll` apart from `t`, each refused or not and admitting `each`.
    fn polls(local: &mut Local, t: &mut u64, poll: u64, n: u32, refused: bool, each: u64) {
        for _ in 0..n {
            *t += poll;
            local.shared.admitted.fetch_add(each, Ordering::Relaxed);
            local.shared.starved.store(refused, Ordering::Relaxed);
            local.sample(*t);
        }
    }

    #[test]
    fn a_fallen_demand_is_read_within_three_polls_and_a_starved_instance_asks_early() {
        let refresh = 250_000_000;
        let poll = refresh / 16;
        let (mut local, s) = setup();
        let mut t = 2 * SECOND_NS;
        local.history = [(t, 0); HISTORY];
        local.credit_at = t;
        // A share of 800/s, spent whole and refused at every poll (12 tokens a poll).
        local.has = Some((1, 800_000, 160));
        s.rate_milli.store(800_000, Ordering::Relaxed);
        polls(&mut local, &mut t, poll, 16, true, 12);
        assert_eq!(
            local.quiet_drop(t, refresh),
            None,
            "a busy share read as fallen"
        );
        // Refused at two polls in a row, its last round not asking for everything: it asks.
        assert!(local.starving());
        // Asked for everything and holds its fair target: no early round.
        local.asked_all = true;
        s.target_milli.store(800_000, Ordering::Relaxed);
        assert!(!local.starving());
        // Others still hold more than their targets: it asks again.
        s.target_milli.store(900_000, Ordering::Relaxed);
        assert!(local.starving());
        // Demand falls to one admission in three polls: not read after two polls (too few
        // to tell), read after three, as under a quarter of the share.
        polls(&mut local, &mut t, poll, 1, false, 1);
        polls(&mut local, &mut t, poll, 1, false, 0);
        assert_eq!(local.quiet_drop(t, refresh), None);
        polls(&mut local, &mut t, poll, 1, false, 0);
        let used = local.quiet_drop(t, refresh).expect("the drop was not read");
        assert!(used < 800_000 / 4, "{used}");
        assert!(!local.starving());
        // An instance that never used its share (idle since it got it) keeps it.
        let (mut idle, s2) = setup();
        let mut t = 2 * SECOND_NS;
        idle.history = [(t, 0); HISTORY];
        idle.credit_at = t;
        idle.has = Some((1, 800_000, 160));
        s2.rate_milli.store(800_000, Ordering::Relaxed);
        polls(&mut idle, &mut t, poll, 16, false, 0);
        assert_eq!(idle.quiet_drop(t, refresh), None);
    }
}
