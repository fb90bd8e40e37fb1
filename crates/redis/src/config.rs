//! A pool's settings, checked when the pool starts.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::reservoir::MAX_LEASE_TOKENS;
use crate::script::TimeSource;

/// The fewest leases an instance may hold per bucket: the one it spends and one behind it.
pub(crate) const MIN_LEASE_DEPTH: u64 = 2;
/// The most leases an instance may hold per bucket.
pub(crate) const MAX_LEASE_DEPTH: u64 = 64;

/// What a bucket decides once its lease is spent and Redis cannot be reached (the
/// breaker is open). A live lease is always honoured first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FailMode {
    /// Reject, with `retry_after` at the breaker's next probe.
    FailClosed,
    /// Admit, counted ([`crate::BucketStats::fail_open_admitted`]).
    FailOpen,
    /// Decide on a local bucket of `B/K` tokens refilled at `r/K`, both rounded down
    /// ([`RemotePolicy::share`](crate::RemotePolicy::share)), for the `K` instances Redis
    /// last reported (the configured [`instances`](PoolConfig::instances) only until it
    /// has reported one). The default. Built when the breaker opens; decisions reach it
    /// through a read lock, only during an outage. A bucket whose share rounds down to
    /// nothing (`B < K`) refuses with [`Refused::Unavailable`](crate::Refused::Unavailable).
    #[default]
    Local,
}

/// The settings of a [`RedisPool`](crate::RedisPool).
///
/// ```
/// use std::time::Duration;
/// use tokengate_redis::{FailMode, PoolConfig};
/// let config = PoolConfig::new("redis://127.0.0.1:6379/", "api")
///     .lease_ttl(Duration::from_secs(2))
///     .max_lease(100)
///     .fail_mode(FailMode::FailClosed);
/// assert_eq!(config.max_lease_tokens(), 100);
/// ```
#[derive(Clone, Debug)]
pub struct PoolConfig {
    pub(crate) url: RedisUrl,
    pub(crate) namespace: String,
    pub(crate) lease_ttl: Duration,
    pub(crate) grace: Duration,
    pub(crate) max_lease: u64,
    pub(crate) lease_depth: u64,
    pub(crate) exchange_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) fail_mode: FailMode,
    pub(crate) instances: u64,
    pub(crate) probe_min: Duration,
    pub(crate) probe_max: Duration,
    pub(crate) key_keep: Duration,
    pub(crate) time: TimeSource,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<Secret>,
    pub(crate) root_ca: Option<RootCa>,
    /// `WAIT replicas timeout` after each round that asks for grants.
    pub(crate) wait: Option<(u64, Duration)>,
}

impl PoolConfig {
    /// Settings for the Redis at `url`, keys under `namespace`. The URL picks the kind:
    /// `redis://host:port/db` (`rediss://` over TLS) one primary;
    /// `redis+cluster://host:port,host:port` (`rediss+cluster://`) a Redis Cluster through
    /// its seed nodes; `redis+sentinel://host:port,host:port/name[/db]`
    /// (`rediss+sentinel://`) the primary the Sentinels name `name`. User information
    /// (`user:password@`) applies to the data nodes. A malformed cluster or Sentinel URL is
    /// [`PoolError::Url`](crate::PoolError::Url) at connect.
    /// Defaults: lease time-to-live 2 s, grace 100 ms, leases of up to 100 tokens, at
    /// most 32 of them held per bucket,
    /// exchange timeout 50 ms, connect timeout 200 ms, [`FailMode::Local`] with a fleet
    /// of at least 1, probes every 100 ms to 5 s.
    pub fn new(url: impl Into<String>, namespace: impl Into<String>) -> Self {
        Self {
            url: RedisUrl(url.into()),
            namespace: namespace.into(),
            lease_ttl: Duration::from_secs(2),
            grace: Duration::from_millis(100),
            max_lease: 100,
            lease_depth: 32,
            exchange_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_millis(200),
            fail_mode: FailMode::Local,
            instances: 1,
            probe_min: Duration::from_millis(100),
            probe_max: Duration::from_secs(5),
            key_keep: Duration::from_secs(60),
            time: TimeSource::Redis,
            username: None,
            password: None,
            root_ca: None,
            wait: None,
        }
    }

    /// Waits for `replicas` replicas to acknowledge each round that asks for grants
    /// (`WAIT replicas timeout` on the connection that wrote them: on a cluster, the
    /// primary of each slot written), and installs the round's grants only when they did;
    /// otherwise they are settled unspent and the round counts as failed (the breaker and
    /// the fail mode follow). A strict call ([`RedisScopes`](crate::RedisScopes)) is
    /// admitted only once its take is acknowledged, and fails like an unreachable Redis
    /// otherwise. A failover to a replica that acknowledged then loses no grant or take
    /// that was spent: the fleet's bound stays `B + r*T` across it (README "Failover and
    /// its bound"). Costs one more round trip per grant round, plus the replication
    /// delay. `timeout` must be below the exchange timeout.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokengate_redis::PoolConfig;
    /// let config = PoolConfig::new("redis+cluster://127.0.0.1:7000,127.0.0.1:7001", "api")
    ///     .wait_for_replicas(1, Duration::from_millis(20));
    /// assert_eq!(config.replicas_waited_for(), Some(1));
    /// ```
    #[must_use]
    pub fn wait_for_replicas(mut self, replicas: u64, timeout: Duration) -> Self {
        self.wait = Some((replicas, timeout));
        self
    }

    /// The replicas each grant round waits for, if any
    /// ([`wait_for_replicas`](Self::wait_for_replicas)).
    pub fn replicas_waited_for(&self) -> Option<u64> {
        self.wait.map(|(n, _)| n)
    }

    /// The most one exchange may take ([`exchange_timeout`](Self::exchange_timeout); 50 ms
    /// unless set): a [`wait_for_replicas`](Self::wait_for_replicas) timeout must be below
    /// it.
    pub fn exchange_timeout_limit(&self) -> Duration {
        self.exchange_timeout
    }

    /// The ACL user to authenticate as (`AUTH user password`), in place of the URL's.
    /// Without a password from [`password_from_env`](Self::password_from_env),
    /// [`password_file`](Self::password_file) or the URL, no `AUTH` is sent.
    #[must_use]
    pub fn username(mut self, user: impl Into<String>) -> Self {
        self.username = Some(user.into());
        self
    }

    /// Reads the password from the environment variable `var` at each connection, in
    /// place of the URL's: the value is never stored in the settings, shown by `Debug` or
    /// put into an error (those name the variable only).
    ///
    /// ```
    /// use tokengate_redis::PoolConfig;
    /// let config = PoolConfig::new("redis://127.0.0.1:6379/", "api")
    ///     .username("tokengate")
    ///     .password_from_env("TOKENGATE_REDIS_PASSWORD");
    /// assert!(format!("{config:?}").contains("TOKENGATE_REDIS_PASSWORD"));
    /// ```
    #[must_use]
    pub fn password_from_env(mut self, var: impl Into<String>) -> Self {
        self.password = Some(Secret::Env(var.into()));
        self
    }

    /// Reads the password from the file at `path` at each connection (a mounted secret;
    /// a rotated file is read again on the next reconnect), its trailing line break and
    /// spaces removed, in place of the URL's. Never stored in the settings nor shown.
    #[must_use]
    pub fn password_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.password = Some(Secret::File(path.into()));
        self
    }

    /// Trusts only the CA certificates in `pem` (one or more PEM blocks) for a
    /// `rediss://` URL, in place of the system's roots: a private CA. Needs the `tls`
    /// feature; without it a `rediss://` URL is a [`PoolError::Url`](crate::PoolError::Url).
    #[must_use]
    pub fn tls_root_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_ca = Some(RootCa::Pem(pem.into().into()));
        self
    }

    /// As [`tls_root_ca`](Self::tls_root_ca), read from the file at `path` at each
    /// connection.
    #[must_use]
    pub fn tls_root_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.root_ca = Some(RootCa::File(path.into()));
        self
    }

    /// How long a lease is spendable here, from the exchange's send time.
    #[must_use]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// How long after `ttl` Redis waits before it reclaims a lease: covers clock drift
    /// between this host and Redis over `ttl`, and steps of Redis's wall clock.
    #[must_use]
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The largest lease asked for, tokens (`L`).
    #[must_use]
    pub fn max_lease(mut self, tokens: u64) -> Self {
        self.max_lease = tokens;
        self
    }

    /// The most leases one instance holds per bucket at once (`d`): those being spent,
    /// those prefetched behind them and those asked for and not yet answered. An
    /// instance therefore holds at most `H = d * L` tokens of a bucket, the term of the
    /// loose bound (`B + r*T + K*H`) and of what a dead instance strands. A hot bucket
    /// uses the depth to keep several grants in flight, so a thread spending faster than
    /// one lease per round trip does not wait on the network; a slow one holds one or
    /// two small leases sized from its rate.
    #[must_use]
    pub fn lease_depth(mut self, leases: u64) -> Self {
        self.lease_depth = leases;
        self
    }

    /// The most one exchange with Redis may take before it counts as failed.
    #[must_use]
    pub fn exchange_timeout(mut self, timeout: Duration) -> Self {
        self.exchange_timeout = timeout;
        self
    }

    /// The most a connection attempt may take.
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// What to decide when the lease is spent and Redis cannot be reached.
    #[must_use]
    pub fn fail_mode(mut self, mode: FailMode) -> Self {
        self.fail_mode = mode;
        self
    }

    /// The fleet size assumed by [`FailMode::Local`] until Redis has reported one. Redis
    /// counts the instances that exchanged or sent a heartbeat within two lease
    /// lifetimes (an idle pool beats every half lifetime, a
    /// [`RedisScopes`](crate::RedisScopes) at connect and then with a take at most every
    /// half lifetime); from the first count on, the count replaces this hint, up or down.
    #[must_use]
    pub fn instances(mut self, k: u64) -> Self {
        self.instances = k;
        self
    }

    /// The breaker's probe backoff: from `min` doubling up to `max`, with full jitter.
    #[must_use]
    pub fn probe_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.probe_min = min;
        self.probe_max = max;
        self
    }

    /// Reads time from the scripts' argument instead of Redis `TIME`: for tests only.
    #[doc(hidden)]
    #[must_use]
    pub fn time_source(mut self, time: TimeSource) -> Self {
        self.time = time;
        self
    }

    /// The largest lease asked for, tokens.
    pub fn max_lease_tokens(&self) -> u64 {
        self.max_lease
    }

    /// The most leases one instance holds per bucket at once.
    pub fn lease_depth_leases(&self) -> u64 {
        self.lease_depth
    }

    /// The most tokens one instance holds per bucket (`H = d * L`), the per-instance term
    /// of the loose bound.
    ///
    /// ```
    /// use tokengate_redis::PoolConfig;
    /// let config = PoolConfig::new("redis://127.0.0.1:6379/", "api").max_lease(10).lease_depth(2);
    /// assert_eq!(config.held_bound_tokens(), 20);
    /// ```
    pub fn held_bound_tokens(&self) -> u64 {
        self.max_lease.saturating_mul(self.lease_depth)
    }

    /// Checks every setting.
    /// The fleet heartbeat's sorted set (`lua/fleet.lua`): `tg:{namespace}:fleet`.
    pub(crate) fn fleet_key(&self) -> String {
        format!("tg:{{{}}}:fleet", self.namespace)
    }

    /// How long, µs, an instance stays counted after its last heartbeat: two lease
    /// lifetimes, `2*(ttl + grace)`. An instance that beats at least every half lifetime
    /// stays counted, and one that stopped is counted a while longer (a smaller local
    /// share), never shorter.
    pub(crate) fn fleet_window_us(&self) -> u64 {
        2 * (self.lease_ttl + self.grace).as_micros() as u64
    }

    /// How often an instance sends the fleet heartbeat: every half lease lifetime.
    pub(crate) fn heartbeat_every(&self) -> Duration {
        self.lease_ttl / 2
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let ms = |d: Duration| d.as_millis() as u64;
        if self.lease_ttl < Duration::from_millis(10) || self.lease_ttl > Duration::from_secs(3600)
        {
            return Err(ConfigError::new(
                "lease_ttl",
                ms(self.lease_ttl),
                "10 ..= 3,600,000 ms",
            ));
        }
        if self.grace < Duration::from_millis(1) || self.grace > Duration::from_secs(3600) {
            return Err(ConfigError::new(
                "grace",
                ms(self.grace),
                "1 ..= 3,600,000 ms",
            ));
        }
        if self.max_lease == 0 || self.max_lease > MAX_LEASE_TOKENS {
            return Err(ConfigError::new(
                "max_lease",
                self.max_lease,
                "1 ..= 16,777,215 tokens",
            ));
        }
        if !(MIN_LEASE_DEPTH..=MAX_LEASE_DEPTH).contains(&self.lease_depth) {
            return Err(ConfigError::new(
                "lease_depth",
                self.lease_depth,
                "2 ..= 64 leases",
            ));
        }
        for (name, d) in [
            ("exchange_timeout", self.exchange_timeout),
            ("connect_timeout", self.connect_timeout),
            ("probe_min", self.probe_min),
        ] {
            if d < Duration::from_millis(1) || d > Duration::from_secs(60) {
                return Err(ConfigError::new(name, ms(d), "1 ..= 60,000 ms"));
            }
        }
        if self.instances == 0 || self.instances > 1_000_000 {
            return Err(ConfigError::new(
                "instances",
                self.instances,
                "1 ..= 1,000,000",
            ));
        }
        if let Some((replicas, timeout)) = self.wait {
            if replicas == 0 || replicas > 16 {
                return Err(ConfigError::new("wait_replicas", replicas, "1 ..= 16"));
            }
            if timeout.is_zero() || timeout >= self.exchange_timeout {
                return Err(ConfigError::new(
                    "wait_timeout",
                    ms(timeout),
                    "1 ms ..= below the exchange timeout",
                ));
            }
        }
        if self.namespace.is_empty() || self.namespace.contains(['{', '}']) {
            return Err(ConfigError::new(
                "namespace",
                self.namespace.len() as u64,
                "a non-empty name without '{' or '}'",
            ));
        }
        Ok(())
    }
}

/// A setting outside its range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The setting.
    pub setting: &'static str,
    /// Its value (ms for durations, the length for names).
    pub value: u64,
    /// The valid range.
    pub valid: &'static str,
}

impl ConfigError {
    fn new(setting: &'static str, value: u64, valid: &'static str) -> Self {
        Self {
            setting,
            value,
            valid,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} must be {}, got {}",
            self.setting, self.valid, self.value
        )
    }
}

impl std::error::Error for ConfigError {}

/// Where a password comes from: named in `Debug` and errors, its value never.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Secret {
    /// An environment variable.
    Env(String),
    /// A file.
    File(PathBuf),
}

impl Secret {
    /// Where it comes from, for errors.
    pub(crate) fn source(&self) -> String {
        match self {
            Self::Env(var) => format!("environment variable {var}"),
            Self::File(path) => format!("file {}", path.display()),
        }
    }

    /// Reads the password: an environment variable as it is, a file without its trailing
    /// whitespace. Empty is an error (a missing secret would otherwise connect without
    /// `AUTH` and fail later as `NOAUTH`). The error's detail never holds the value.
    pub(crate) fn read(&self) -> Result<String, String> {
        let value = match self {
            Self::Env(var) => std::env::var(var).map_err(|e| e.to_string())?,
            Self::File(path) => std::fs::read_to_string(path)
                .map_err(|e| e.to_string())?
                .trim_end()
                .to_owned(),
        };
        if value.is_empty() {
            return Err("empty".to_owned());
        }
        Ok(value)
    }
}

/// The CA certificates a `rediss://` connection trusts, when not the system's.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum RootCa {
    /// PEM given in the settings.
    Pem(Arc<[u8]>),
    /// A PEM file read at each connection.
    File(PathBuf),
}

impl RootCa {
    /// The PEM bytes, or where they could not be read from and why.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(crate) fn pem(&self) -> Result<Vec<u8>, String> {
        match self {
            Self::Pem(pem) => Ok(pem.to_vec()),
            Self::File(path) => {
                std::fs::read(path).map_err(|e| format!("CA file {}: {e}", path.display()))
            }
        }
    }
}

impl fmt::Debug for RootCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pem(pem) => write!(f, "Pem({} bytes)", pem.len()),
            Self::File(path) => f.debug_tuple("File").field(path).finish(),
        }
    }
}

/// A Redis URL whose password never leaves it: `Debug` and [`RedisUrl::redacted`] show
/// `***` in its place (errors and logs use those).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct RedisUrl(pub(crate) String);

impl RedisUrl {
    /// The URL as given, for the client only.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The URL with the user information's password (or, without a `:`, the whole user
    /// information) replaced by `***`.
    pub(crate) fn redacted(&self) -> String {
        let url = &self.0;
        let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
            return url.clone();
        };
        let rest = &url[scheme_end..];
        let authority = rest.find(['/', '?', '#']).map_or(rest, |i| &rest[..i]);
        let Some(at) = authority.rfind('@') else {
            return url.clone();
        };
        let user = match authority[..at].find(':') {
            Some(colon) => format!("{}:***", &authority[..colon]),
            None => "***".to_owned(),
        };
        format!("{}{user}{}", &url[..scheme_end], &rest[at..])
    }
}

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

#[cfg(test)]
mod url_tests {
    use super::*;

    #[test]
    fn secrets_are_read_where_named_and_never_shown() {
        let dir = std::env::temp_dir().join(format!("tg-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pw");
        std::fs::write(&file, "s3cret \n").unwrap();
        let secret = Secret::File(file.clone());
        assert_eq!(secret.read().unwrap(), "s3cret");
        std::fs::write(&file, "\n").unwrap();
        assert_eq!(secret.read().unwrap_err(), "empty");
        assert!(Secret::File(dir.join("absent")).read().is_err());
        assert!(
            Secret::Env("TG_SURELY_UNSET_VARIABLE".into())
                .read()
                .is_err()
        );
        let config = PoolConfig::new("rediss://h/", "ns")
            .username("u")
            .password_file(&file)
            .tls_root_ca(b"-----BEGIN CERTIFICATE-----\nMIIB\n".to_vec());
        let shown = format!("{config:?}");
        assert!(shown.contains("Pem(") && !shown.contains("MIIB"), "{shown}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_password_never_shows() {
        let cases = [
            ("redis://u:s3cret@h:6379/0", "redis://u:***@h:6379/0"),
            ("redis://:s3cret@h/", "redis://:***@h/"),
            ("rediss://s3cret@h", "rediss://***@h"),
            ("redis://h:6379/", "redis://h:6379/"),
            ("redis://u:p@ss:w@h/", "redis://u:***@h/"),
        ];
        for (url, shown) in cases {
            let u = RedisUrl(url.to_owned());
            assert_eq!(u.redacted(), shown);
            let config = PoolConfig::new(url, "ns");
            assert!(!format!("{config:?}").contains("s3cret"), "{config:?}");
        }
    }
}
