//! The decision logic of a strict client, shared by the blocking [`RedisScopes`] and the
//! async [`AsyncRedisScopes`](crate::AsyncRedisScopes): request checks, keys, the take
//! script's command and reply, the circuit breaker with its single probe, the fleet
//! heartbeat's schedule, and the fail modes. No I/O here: each client sends the commands
//! this builds on its own connections and reports what came back.
//!
//! [`RedisScopes`]: crate::RedisScopes

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::breaker::Breaker;
use crate::config::{FailMode, PoolConfig};
use crate::error::PoolError;
use crate::policy::{RemotePolicy, UNITS_PER_TOKEN};
use crate::script::{BucketKeys, Exchange, Scripts, Take, Target};
use crate::series::Metrics;
use crate::strict::{
    InvalidRequest, MAX_KEY_BYTES, MAX_STRICT_SCOPES, StrictAdmitted, StrictRefused, StrictScope,
};
use crate::worker;

/// One strict call's items: (scope, key, cost).
pub(crate) type Items<'a> = [(&'a StrictScope, &'a str, u64)];

/// The `WAIT` after a take ([`StrictCore::wait_after`]).
pub(crate) struct Wait {
    /// The key whose primary is asked (a cluster routes `WAIT` by it).
    pub(crate) key: String,
    pub(crate) replicas: u64,
    pub(crate) timeout: Duration,
}

impl Wait {
    /// `WAIT replicas timeout`.
    #[cfg(feature = "tokio")]
    pub(crate) fn cmd(&self) -> redis::Cmd {
        crate::connect::wait_cmd(self.replicas, self.timeout)
    }

    /// `Ok` when `acked` replicas are enough; otherwise the error that fails the call.
    pub(crate) fn acknowledged(&self, acked: u64) -> redis::RedisResult<()> {
        if acked < self.replicas {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "too few replicas acknowledged the take",
            )));
        }
        Ok(())
    }
}

/// The state a strict client keeps besides its connections.
pub(crate) struct StrictCore {
    pub(crate) config: PoolConfig,
    pub(crate) scripts: Scripts,
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
    pub(crate) metrics: Metrics,
}

/// The right to send one call: taken before the call, reported after it. A probe's
/// claim that is dropped unreported (a cancelled future, a panic) lets the next caller
/// probe.
pub(crate) struct Claim<'a> {
    core: &'a StrictCore,
    probe: bool,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.probe {
            self.core.lock_breaker().release_probe();
        }
    }
}

impl StrictCore {
    /// Checks `config` and builds the state of a client named `client` in the series.
    pub(crate) fn new(config: PoolConfig, client: &'static str) -> Result<Self, PoolError> {
        config.validate()?;
        let clock = quanta::Clock::new();
        let start = clock.now();
        let (instance, seed) = worker::instance_id();
        Ok(Self {
            breaker: Mutex::new(Breaker::new(config.probe_min, config.probe_max, seed)),
            scripts: Scripts::new(config.time),
            clock,
            start,
            fail_open: AtomicU64::new(0),
            local: AtomicU64::new(0),
            instance,
            instances_seen: AtomicU64::new(config.instances),
            beat_due_ns: AtomicU64::new(0),
            metrics: Metrics::new(client),
            config,
        })
    }

    fn lock_breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        self.breaker.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn now_ns(&self) -> u64 {
        self.clock.now().duration_since(self.start).as_nanos() as u64
    }

    /// A keyed scope named `name` whose every key has `policy`.
    pub(crate) fn scope(name: &str, policy: RemotePolicy) -> Result<StrictScope, PoolError> {
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

    /// `tg:{namespace:tag}:s:scope:key`.
    pub(crate) fn key(&self, tag: &str, scope: &StrictScope, key: &str) -> String {
        format!(
            "tg:{{{}:{tag}}}:s:{}:{key}",
            self.config.namespace, scope.name
        )
    }

    /// The first thing wrong with a request.
    pub(crate) fn check(tag: &str, items: &Items<'_>) -> Result<(), InvalidRequest> {
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

    /// The take script's command for a checked request, at the wall-clock time `now_us`.
    pub(crate) fn take_cmd(&self, tag: &str, items: &Items<'_>, now_us: u64) -> redis::Cmd {
        let keys: Vec<BucketKeys> = items
            .iter()
            .map(|(scope, key, _)| BucketKeys::under(self.key(tag, scope, key)))
            .collect();
        let args: Vec<(&BucketKeys, &RemotePolicy, u64)> = keys
            .iter()
            .zip(items)
            .map(|(k, (scope, _, cost))| (k, &scope.policy, *cost))
            .collect();
        let keep_ms = self.config.key_keep.as_millis() as u64;
        self.scripts.take_cmd(&args, keep_ms, now_us)
    }

    /// With [`wait_for_replicas`](PoolConfig::wait_for_replicas), the `WAIT` a take that
    /// was taken must pass before it counts: otherwise the call fails (and the fail mode
    /// decides), whatever the take wrote. `None` without it, or when nothing was taken.
    pub(crate) fn wait_after(&self, tag: &str, items: &Items<'_>, taken: &Take) -> Option<Wait> {
        let (replicas, timeout) = self.config.wait?;
        let Take::Taken(_) = taken else {
            return None;
        };
        let (scope, key, _) = items.first()?;
        Some(Wait {
            // The state key of the first item: every key of a call shares its slot.
            key: self.key(tag, scope, key),
            replicas,
            timeout,
        })
    }

    /// The give-back's commands, one exchange per item crediting its cost.
    pub(crate) fn give_back_cmds(
        &self,
        tag: &str,
        items: &Items<'_>,
        now_us: u64,
    ) -> Vec<redis::Cmd> {
        let lease_us = (self.config.lease_ttl + self.config.grace).as_micros() as u64;
        let keep_ms = self.config.key_keep.as_millis() as u64;
        items
            .iter()
            .map(|(scope, key, cost)| {
                let keys = BucketKeys::under(self.key(tag, scope, key));
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
                self.scripts.exchange_cmd(&target, &credit, now_us)
            })
            .collect()
    }

    /// The right to call Redis now: always while the breaker is closed (or closing);
    /// while it is open, only for the first caller once its probe is due, and for no one
    /// else until that probe reports. `None`: follow the fail mode at once.
    pub(crate) fn enter(&self) -> Option<Claim<'_>> {
        let probe = self.lock_breaker().claim(self.now_ns())?;
        Some(Claim { core: self, probe })
    }

    /// The decision for a call that came back with `taken` (`Err`: it failed, the
    /// breaker counts it, and the fail mode decides), `started` ns after the start.
    pub(crate) fn finish<E>(
        &self,
        claim: Claim<'_>,
        started: u64,
        taken: Result<Take, E>,
        items: &Items<'_>,
    ) -> Result<StrictAdmitted, StrictRefused> {
        let decided = match taken {
            Ok(take) => {
                // The take, and `WAIT`'s after it.
                self.metrics
                    .round_trips(1 + u64::from(self.config.wait.is_some()));
                self.metrics
                    .latency_ns(self.now_ns().saturating_sub(started));
                self.success();
                match take {
                    Take::Taken(_) => Ok(StrictAdmitted::Taken),
                    // Checked before the call: a cost never exceeds the capacity, so a
                    // retry time is always given; a missing one is a key whose state has
                    // leases out.
                    Take::Refused {
                        index,
                        retry_after_us,
                    } => Err(StrictRefused::Rejected {
                        index,
                        retry_after: retry_after_us
                            .map_or(self.config.lease_ttl, Duration::from_micros),
                    }),
                }
            }
            Err(_) => {
                self.failure();
                drop(claim);
                return self.fail(items);
            }
        };
        drop(claim);
        decided
    }

    /// Records a successful round: the breaker counts it, and a close is exported.
    pub(crate) fn success(&self) {
        let mut breaker = self.lock_breaker();
        let was_open = breaker.is_open();
        if breaker.success() && was_open {
            self.metrics.breaker(false);
        }
    }

    /// Records a failed round: the breaker counts it, and an opening is exported.
    pub(crate) fn failure(&self) {
        self.metrics.failed_round();
        let now = self.now_ns();
        let mut breaker = self.lock_breaker();
        let was_open = breaker.is_open();
        if breaker.failure(now) && !was_open {
            self.metrics.breaker(true);
        }
    }

    /// Whether the breaker is open (or not yet closed again).
    pub(crate) fn is_unavailable(&self) -> bool {
        self.lock_breaker().is_open()
    }

    pub(crate) fn fail_open_admitted(&self) -> u64 {
        self.fail_open.load(Ordering::Relaxed)
    }

    pub(crate) fn local_admitted(&self) -> u64 {
        self.local.load(Ordering::Relaxed)
    }

    pub(crate) fn instances_seen(&self) -> u64 {
        self.instances_seen.load(Ordering::Relaxed)
    }

    /// The heartbeat's command when one is due (claimed by this caller alone), else
    /// `None`.
    pub(crate) fn beat_cmd(&self, now_us: u64) -> Option<redis::Cmd> {
        let now = self.now_ns();
        let due = self.beat_due_ns.load(Ordering::Relaxed);
        let next = now + self.config.heartbeat_every().as_nanos() as u64;
        if now < due
            || self
                .beat_due_ns
                .compare_exchange(due, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return None;
        }
        Some(self.scripts.heartbeat_cmd(
            &self.config.fleet_key(),
            &self.instance,
            self.config.fleet_window_us(),
            now_us,
        ))
    }

    /// Keeps the count a heartbeat replied, or makes the next take beat again; false
    /// when the beat failed (the connection should be dropped).
    pub(crate) fn beat_done<E>(&self, beat: Result<(u64, u64), E>) -> bool {
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
    pub(crate) fn fail(&self, items: &Items<'_>) -> Result<StrictAdmitted, StrictRefused> {
        let probe = self.lock_breaker().probe_at().unwrap_or(0);
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
        items: &Items<'_>,
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
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
