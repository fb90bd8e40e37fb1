//! [`RedisPool`]: one connection, one background thread, many buckets; and
//! [`RemoteBucket`], a bucket whose budget is shared by every instance using the same
//! Redis keys.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use crate::config::{FailMode, PoolConfig};
use crate::connect;
use crate::error::{PoolError, Refused};
use crate::policy::RemotePolicy;
use crate::reservoir::{MAX_LEASE_TOKENS, Reservoir, Spend, TIME_SHIFT};
use crate::script::{BucketKeys, Scripts};
use crate::worker::Worker;

pub(crate) const HEALTHY: u8 = 0;
pub(crate) const UNAVAILABLE: u8 = 1;

/// What the pool's decisions and its thread share.
#[derive(Debug)]
pub(crate) struct PoolShared {
    pub(crate) config: PoolConfig,
    clock: quanta::Clock,
    start: quanta::Instant,
    pub(crate) health: AtomicU8,
    pub(crate) probe_at_ns: AtomicU64,
    pub(crate) stop: AtomicBool,
    pub(crate) thread: OnceLock<Thread>,
    pub(crate) new_buckets: Mutex<Vec<Arc<BucketShared>>>,
    pub(crate) instances_seen: AtomicU64,
    pub(crate) round_trips: AtomicU64,
    pub(crate) exchanges: AtomicU64,
    pub(crate) failed_rounds: AtomicU64,
}

impl PoolShared {
    /// Nanoseconds since the pool started, on the monotonic clock.
    #[inline]
    pub(crate) fn now_ns(&self) -> u64 {
        self.clock.now().duration_since(self.start).as_nanos() as u64
    }

    pub(crate) fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
}

/// One bucket as its decisions and the pool's thread share it.
#[derive(Debug)]
pub(crate) struct BucketShared {
    pub(crate) keys: BucketKeys,
    pub(crate) policy: RemotePolicy,
    pub(crate) reservoir: Reservoir,
    /// A decision that leaves a word below this many tokens wakes the thread: half the
    /// lease size the thread last chose.
    pub(crate) low_water: AtomicU64,
    pub(crate) max_cost: u64,
    /// A decision found the reservoir low or short.
    pub(crate) demand: AtomicBool,
    /// The largest cost the reservoir could not pay since the last grant.
    pub(crate) need: AtomicU64,
    /// Redis rejected a grant: until this pool time (ns) the budget is spent.
    pub(crate) rejected_until_ns: AtomicU64,
    /// Whole tokens handed back or refunded, to credit on the next exchange.
    pub(crate) returned: AtomicU64,
    /// The last balance Redis reported, units.
    pub(crate) balance_units: AtomicU64,
    /// The last outstanding total Redis reported, tokens.
    pub(crate) outstanding: AtomicU64,
    pub(crate) local: RwLock<Option<tokengate::Bucket>>,
    /// Drop the bucket's keys (and this instance's leases) on the next round.
    pub(crate) reset: AtomicBool,
    pub(crate) stats: Counters,
}

/// Counters of one bucket.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) leased: AtomicU64,
    pub(crate) fail_open: AtomicU64,
    pub(crate) local: AtomicU64,
    pub(crate) grants: AtomicU64,
    pub(crate) granted_tokens: AtomicU64,
}

/// A bucket's counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BucketStats {
    /// Decisions admitted from a lease.
    pub leased_admitted: u64,
    /// Decisions admitted by [`FailMode::FailOpen`] while Redis was unreachable.
    pub fail_open_admitted: u64,
    /// Decisions admitted by [`FailMode::Local`]'s local bucket.
    pub local_admitted: u64,
    /// Leases granted by Redis.
    pub grants: u64,
    /// Tokens granted by Redis.
    pub granted_tokens: u64,
    /// Redis's balance at the last exchange, tokens (rounded down).
    pub redis_balance: u64,
    /// Tokens out on lease fleet-wide at the last exchange.
    pub redis_outstanding: u64,
}

/// How a decision was admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admitted {
    /// Paid from a lease of the shared budget.
    Leased,
    /// Redis unreachable and the lease spent: admitted by [`FailMode::FailOpen`].
    FailOpen,
    /// Redis unreachable and the lease spent: paid by [`FailMode::Local`]'s local bucket.
    Local,
}

/// A pool of shared budgets on one Redis: a background thread owns the connection and
/// keeps every bucket's local reservoir above its low-water mark, so decisions never wait
/// on the network.
///
/// Dropping the pool stops the thread after it settles the leases it holds (best effort,
/// within the exchange timeout).
#[derive(Debug)]
pub struct RedisPool {
    shared: Arc<PoolShared>,
    thread: Option<JoinHandle<()>>,
}

impl RedisPool {
    /// Connects, loads the scripts, and starts the background thread.
    ///
    /// # Errors
    ///
    /// [`PoolError::Config`] for a setting out of range, [`PoolError::Url`] for a URL that
    /// does not parse, [`PoolError::Unreachable`] when Redis does not answer within the
    /// connect and exchange timeouts, [`PoolError::Misconfigured`] when it answers but
    /// refuses the setup. Never blocks past those timeouts.
    pub fn connect(config: PoolConfig) -> Result<Self, PoolError> {
        config.validate()?;
        let scripts = Scripts::new(config.time);
        let con = connect::open(&config, &scripts)?;
        let clock = quanta::Clock::new();
        let start = clock.now();
        let shared = Arc::new(PoolShared {
            instances_seen: AtomicU64::new(config.instances),
            config,
            clock,
            start,
            health: AtomicU8::new(HEALTHY),
            probe_at_ns: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            thread: OnceLock::new(),
            new_buckets: Mutex::new(Vec::new()),
            round_trips: AtomicU64::new(0),
            exchanges: AtomicU64::new(0),
            failed_rounds: AtomicU64::new(0),
        });
        let worker = Worker::new(shared.clone(), scripts, con);
        let handle = std::thread::Builder::new()
            .name("tokengate-redis".into())
            .spawn(move || worker.run())
            .map_err(|e| PoolError::Misconfigured {
                url: shared.config.url.redacted(),
                detail: format!("cannot start the pool's thread: {e}"),
            })?;
        let _ = shared.thread.set(handle.thread().clone());
        Ok(Self {
            shared,
            thread: Some(handle),
        })
    }

    /// The bucket `scope` of this pool's namespace under `policy`. Every instance using
    /// the same namespace, scope and policy shares one budget.
    ///
    /// # Errors
    ///
    /// [`PoolError::Scope`] when `scope` is empty or holds `{` or `}`.
    pub fn bucket(&self, scope: &str, policy: RemotePolicy) -> Result<RemoteBucket, PoolError> {
        let keys =
            BucketKeys::new(&self.shared.config.namespace, scope).map_err(PoolError::Scope)?;
        let max_cost = self
            .shared
            .config
            .max_lease
            .min(policy.capacity())
            .min(MAX_LEASE_TOKENS);
        let shared = Arc::new(BucketShared {
            keys,
            policy,
            reservoir: Reservoir::default(),
            low_water: AtomicU64::new(max_cost.div_ceil(2)),
            max_cost,
            demand: AtomicBool::new(true),
            need: AtomicU64::new(0),
            rejected_until_ns: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            balance_units: AtomicU64::new(0),
            outstanding: AtomicU64::new(0),
            local: RwLock::new(None),
            reset: AtomicBool::new(false),
            stats: Counters::default(),
        });
        self.shared
            .new_buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(shared.clone());
        self.shared.wake();
        Ok(RemoteBucket {
            pool: self.shared.clone(),
            bucket: shared,
        })
    }

    /// Round trips to Redis so far (one per pipeline of exchanges).
    pub fn round_trips(&self) -> u64 {
        self.shared.round_trips.load(Ordering::Relaxed)
    }

    /// Exchanges (script calls) so far.
    pub fn exchanges(&self) -> u64 {
        self.shared.exchanges.load(Ordering::Relaxed)
    }

    /// Rounds that failed so far (connection lost, a timeout, or, with
    /// [`wait_for_replicas`](PoolConfig::wait_for_replicas), too few replicas
    /// acknowledging).
    pub fn failed_rounds(&self) -> u64 {
        self.shared.failed_rounds.load(Ordering::Relaxed)
    }

    /// Whether the breaker is open (Redis unreachable).
    pub fn is_unavailable(&self) -> bool {
        self.shared.health.load(Ordering::Relaxed) == UNAVAILABLE
    }

    /// The fleet size Redis last reported (instances that exchanged or sent a heartbeat
    /// within two lease lifetimes, this one included), or the configured
    /// [`instances`](PoolConfig::instances) until it has reported one.
    pub fn instances_seen(&self) -> u64 {
        self.shared.instances_seen.load(Ordering::Relaxed)
    }
}

impl Drop for RedisPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A bucket whose budget every instance shares through Redis: decisions pay from a local
/// lease (one clock read and one CAS), never wait on the network, and the pool's thread
/// renews the lease before it runs out.
#[derive(Clone, Debug)]
pub struct RemoteBucket {
    pool: Arc<PoolShared>,
    bucket: Arc<BucketShared>,
}

impl RemoteBucket {
    /// Decides a request of `cost` whole tokens.
    ///
    /// # Errors
    ///
    /// [`Refused::Rejected`] when the fleet's budget cannot pay now,
    /// [`Refused::Unavailable`] when Redis is unreachable, the lease is spent and the
    /// fail mode is [`FailMode::FailClosed`], [`Refused::Cost`] for a cost of zero or
    /// above the bucket's largest lease.
    #[inline]
    pub fn try_acquire(&self, cost: u64) -> Result<Admitted, Refused> {
        let b = &*self.bucket;
        if cost == 0 || cost > b.max_cost {
            return Err(Refused::Cost {
                cost,
                max: b.max_cost,
            });
        }
        let now_ns = self.pool.now_ns();
        match b.reservoir.spend(cost, now_ns >> TIME_SHIFT) {
            Spend::Paid { left } => {
                if left < b.low_water.load(Ordering::Relaxed)
                    && (left == 0 || !b.demand.load(Ordering::Relaxed))
                {
                    b.demand.store(true, Ordering::Relaxed);
                    self.pool.wake();
                }
                b.stats.leased.fetch_add(1, Ordering::Relaxed);
                Ok(Admitted::Leased)
            }
            Spend::Short => self.short(cost, now_ns),
        }
    }

    #[cold]
    fn short(&self, cost: u64, now_ns: u64) -> Result<Admitted, Refused> {
        let b = &*self.bucket;
        b.need.fetch_max(cost, Ordering::Relaxed);
        if !b.demand.swap(true, Ordering::Relaxed) {
            self.pool.wake();
        }
        if self.pool.health.load(Ordering::Relaxed) == UNAVAILABLE {
            let probe = self.pool.probe_at_ns.load(Ordering::Relaxed);
            let retry_after = Duration::from_nanos(probe.saturating_sub(now_ns));
            return match self.pool.config.fail_mode {
                FailMode::FailClosed => Err(Refused::Unavailable { retry_after }),
                FailMode::FailOpen => {
                    b.stats.fail_open.fetch_add(1, Ordering::Relaxed);
                    Ok(Admitted::FailOpen)
                }
                FailMode::Local => {
                    let local = b
                        .local
                        .read()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    match local.as_ref().map(|l| l.try_acquire(cost)) {
                        Some(Ok(d)) if d.is_admitted() => {
                            b.stats.local.fetch_add(1, Ordering::Relaxed);
                            Ok(Admitted::Local)
                        }
                        Some(Ok(d)) => Err(Refused::Rejected {
                            retry_after: d.retry_after().unwrap_or(retry_after),
                        }),
                        _ => Err(Refused::Unavailable { retry_after }),
                    }
                }
            };
        }
        let until = b.rejected_until_ns.load(Ordering::Relaxed);
        let retry_after = if until > now_ns {
            Duration::from_nanos(until - now_ns)
        } else {
            self.pool.config.exchange_timeout
        };
        Err(Refused::Rejected { retry_after })
    }

    pub(crate) fn shared(&self) -> &BucketShared {
        &self.bucket
    }

    pub(crate) fn pool_now_ns(&self) -> u64 {
        self.pool.now_ns()
    }

    pub(crate) fn wake(&self) {
        self.pool.wake();
    }

    /// Drops the shared bucket's state in Redis on the pool's next round (it comes back
    /// per its [`Start`](crate::Start)), and this instance's leases with it. Leases other
    /// instances hold are not recalled: their settlements find nothing.
    pub fn request_reset(&self) {
        self.bucket.reset.store(true, Ordering::Relaxed);
        self.pool.wake();
    }

    /// Hands back `tokens` paid earlier and not used (a refund): credited to the shared
    /// budget on the pool's next exchange, capped so the budget never exceeds `B`.
    pub fn refund(&self, tokens: u64) {
        let tokens = tokens.min(self.bucket.policy.capacity());
        self.bucket.returned.fetch_add(tokens, Ordering::Relaxed);
    }

    /// Tokens this instance can still spend from its live leases.
    pub fn leased_tokens(&self) -> u64 {
        self.bucket.reservoir.live(self.pool.now_ns() >> TIME_SHIFT)
    }

    /// The bucket's policy.
    pub fn policy(&self) -> &RemotePolicy {
        &self.bucket.policy
    }

    /// The largest cost one decision pays.
    pub fn max_cost(&self) -> u64 {
        self.bucket.max_cost
    }

    /// The bucket's counters.
    pub fn stats(&self) -> BucketStats {
        let s = &self.bucket.stats;
        BucketStats {
            leased_admitted: s.leased.load(Ordering::Relaxed),
            fail_open_admitted: s.fail_open.load(Ordering::Relaxed),
            local_admitted: s.local.load(Ordering::Relaxed),
            grants: s.grants.load(Ordering::Relaxed),
            granted_tokens: s.granted_tokens.load(Ordering::Relaxed),
            redis_balance: self.bucket.balance_units.load(Ordering::Relaxed)
                / crate::UNITS_PER_TOKEN,
            redis_outstanding: self.bucket.outstanding.load(Ordering::Relaxed),
        }
    }
}
