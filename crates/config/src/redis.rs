//! The `[redis]` section: where the fleet's shared budget lives, validated with the rest
//! of the file, and the client settings ([`PoolConfig`]) and remote store built from it.
//!
//! ```toml
//! [redis]
//! url = "rediss://redis.internal:6380/0"   # never a password here
//! namespace = "api"
//! tls_ca_file = "/etc/tokengate/redis-ca.pem"
//! username = "tokengate"
//! password_env = "TOKENGATE_REDIS_PASSWORD" # or password_file = "/run/secrets/redis"
//! exchange_timeout = "50ms"                 # humantime durations
//! connect_timeout = "200ms"
//! lease_ttl = "2s"
//! fail_mode = "local"                       # or "fail_open", "fail_closed"
//! instances = 4
//! wait_for_replicas = 1                     # a grant or take counts once a replica has it
//! wait_timeout = "20ms"                     # below exchange_timeout
//! # cluster_nodes = ["rediss://a:7000/", "rediss://b:7000/"] # a Redis Cluster, or
//! # sentinel_master = "mymaster"; sentinels = ["redis://s1:26379/"] # a Sentinel group
//!
//! [[rule]]
//! name = "per-tenant"
//! scope = "tenant"
//! policies = ["100/s burst 200"]
//! remote = true                             # enforced through the fleet's budget
//! ```

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokengate::scope::ScopeKind;
use tokengate_redis::{
    FailMode, PoolConfig, PoolError, RedisScopeKinds, RedisScopes, RemotePolicy,
};
use toml::Spanned;

use crate::error::ProblemKind;
use crate::model::Config;

/// Where the password comes from: named, its value never held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PasswordSource {
    /// An environment variable, read at each connection.
    Env(String),
    /// A file (a mounted secret), read at each connection.
    File(PathBuf),
}

/// How the fleet's Redis is deployed.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Topology {
    /// One primary at `url`.
    #[default]
    Standalone,
    /// A Redis Cluster, discovered from these seed nodes and `url`'s node, all of
    /// `url`'s scheme (`rediss://` for TLS), database 0: the client's
    /// `redis+cluster://` URL ([`RedisSection::client_url`]).
    Cluster {
        /// Seed node URLs.
        nodes: Vec<String>,
    },
    /// The primary the Sentinels (`redis://`: spoken to without TLS or `AUTH`) name
    /// `master`, reached with `url`'s scheme, credentials and database: the client's
    /// `redis+sentinel://` URL ([`RedisSection::client_url`]).
    Sentinel {
        /// The master's name in Sentinel.
        master: String,
        /// Sentinel URLs.
        sentinels: Vec<String>,
    },
}

/// The validated `[redis]` section. Its `Debug` shows the URL with no password (a URL
/// holding one is refused) and names the password's source, never its value.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisSection {
    /// `redis://host:port/db` or `rediss://...`, without credentials.
    pub url: String,
    /// The keys' namespace (default `tokengate`).
    pub namespace: String,
    /// The CA file a `rediss://` connection trusts instead of the system's roots.
    pub tls_ca_file: Option<PathBuf>,
    /// The ACL user.
    pub username: Option<String>,
    /// The password's source.
    pub password: Option<PasswordSource>,
    /// The most one exchange may take.
    pub exchange_timeout: Option<Duration>,
    /// The most a connection attempt may take.
    pub connect_timeout: Option<Duration>,
    /// How long a lease is spendable.
    pub lease_ttl: Option<Duration>,
    /// What decisions do while Redis is unreachable.
    pub fail_mode: Option<FailMode>,
    /// The fleet size assumed until Redis reports one.
    pub instances: Option<u64>,
    /// Replicas that must acknowledge each grant round and strict take (`WAIT`), and the
    /// most to wait for them (below the exchange timeout):
    /// [`PoolConfig::wait_for_replicas`]. Both fields or neither.
    pub wait_for_replicas: Option<(u64, Duration)>,
    /// Standalone, cluster or Sentinel.
    pub topology: Topology,
}

/// Why the Redis client or store could not be built from a valid section.
#[derive(Debug)]
#[non_exhaustive]
pub enum RedisConfigError {
    /// No `[redis]` section, or no remote rule.
    NotConfigured(&'static str),
    /// The client refused the settings or could not connect (typed, within the
    /// configured timeouts).
    Pool(PoolError),
}

impl fmt::Display for RedisConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotConfigured(what) => f.write_str(what),
            Self::Pool(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for RedisConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Pool(e) => Some(e),
            _ => None,
        }
    }
}

impl RedisSection {
    /// The URL the client connects to, in the form that names the topology: `url` for
    /// one primary; `redis+cluster://a:7000,b:7000/` (`rediss+cluster://` when `url` is
    /// `rediss://`) with `url`'s node first, then the cluster nodes not already named;
    /// `redis+sentinel://s1:26379,s2:26379/master/db` (`rediss+sentinel://`), `db` being
    /// `url`'s database. Never holds a password (the section refuses one in a URL).
    pub fn client_url(&self) -> String {
        let (scheme, node, db) = parts(&self.url);
        match &self.topology {
            Topology::Standalone => self.url.clone(),
            Topology::Cluster { nodes } => {
                let mut seeds = vec![node];
                for n in nodes {
                    let (_, n, _) = parts(n);
                    if !seeds.contains(&n) {
                        seeds.push(n);
                    }
                }
                format!("{scheme}+cluster://{}/", seeds.join(","))
            }
            Topology::Sentinel { master, sentinels } => {
                let hosts: Vec<&str> = sentinels.iter().map(|u| parts(u).1).collect();
                let db = if db.is_empty() { "0" } else { db };
                format!("{scheme}+sentinel://{}/{master}/{db}", hosts.join(","))
            }
        }
    }

    /// The client settings: every field mapped to [`PoolConfig`] (the URL as
    /// [`client_url`](Self::client_url) gives it), the password and CA named by where
    /// they are read from. Every topology maps: the blocking clients
    /// ([`RedisScopes`], [`RedisPool`](tokengate_redis::RedisPool)) connect to each; the
    /// async one (`AsyncRedisScopes`, tokengate-redis's feature `tokio`) refuses a cluster or Sentinel URL at connect
    /// ([`PoolError::AsyncTopology`]).
    ///
    /// # Errors
    ///
    /// None today: the section was validated when the file was read. The `Result`
    /// keeps room for settings a build cannot map.
    pub fn pool_config(&self) -> Result<PoolConfig, RedisConfigError> {
        let mut c = PoolConfig::new(self.client_url(), self.namespace.clone());
        if let Some(ca) = &self.tls_ca_file {
            c = c.tls_root_ca_file(ca);
        }
        if let Some(user) = &self.username {
            c = c.username(user);
        }
        c = match &self.password {
            Some(PasswordSource::Env(var)) => c.password_from_env(var),
            Some(PasswordSource::File(path)) => c.password_file(path),
            None => c,
        };
        if let Some(t) = self.exchange_timeout {
            c = c.exchange_timeout(t);
        }
        if let Some(t) = self.connect_timeout {
            c = c.connect_timeout(t);
        }
        if let Some(t) = self.lease_ttl {
            c = c.lease_ttl(t);
        }
        if let Some(m) = self.fail_mode {
            c = c.fail_mode(m);
        }
        if let Some(k) = self.instances {
            c = c.instances(k);
        }
        if let Some((replicas, timeout)) = self.wait_for_replicas {
            c = c.wait_for_replicas(replicas, timeout);
        }
        Ok(c)
    }

    /// The fields that differ from `other`'s, by name: a running client takes none of
    /// them live (it was built from them), so a reload changing any is refused.
    pub fn changed_fields(&self, other: &RedisSection) -> Vec<&'static str> {
        let mut changed = Vec::new();
        let mut check = |name, same: bool| {
            if !same {
                changed.push(name);
            }
        };
        check("url", self.url == other.url);
        check("namespace", self.namespace == other.namespace);
        check("tls_ca_file", self.tls_ca_file == other.tls_ca_file);
        check("username", self.username == other.username);
        check("password", self.password == other.password);
        check(
            "exchange_timeout",
            self.exchange_timeout == other.exchange_timeout,
        );
        check(
            "connect_timeout",
            self.connect_timeout == other.connect_timeout,
        );
        check("lease_ttl", self.lease_ttl == other.lease_ttl);
        check("fail_mode", self.fail_mode == other.fail_mode);
        check("instances", self.instances == other.instances);
        let (wait, other_wait) = (self.wait_for_replicas, other.wait_for_replicas);
        check(
            "wait_for_replicas",
            wait.map(|w| w.0) == other_wait.map(|w| w.0),
        );
        check("wait_timeout", wait.map(|w| w.1) == other_wait.map(|w| w.1));
        check("topology", self.topology == other.topology);
        changed
    }
}

impl Config {
    /// The kinds whose rules are `remote = true`, with the policy Redis enforces for each
    /// (the rule's first policy).
    pub fn remote_kinds(&self) -> Vec<(ScopeKind, RemotePolicy)> {
        self.rules
            .iter()
            .filter(|r| r.remote)
            .filter_map(|r| {
                let p = r.policies.first()?;
                let policy = RemotePolicy::new(p.capacity(), p.refill_per_second()).ok()?;
                Some((r.kind, policy))
            })
            .collect()
    }

    /// Connects to the section's Redis (within its connect and exchange timeouts) and
    /// builds the remote store of the `remote = true` rules: pass it to
    /// [`RuleSet::remote_scopes`](tokengate::scope::RuleSet::remote_scopes) with
    /// [`rule_set`](Config::rule_set).
    ///
    /// # Errors
    ///
    /// [`RedisConfigError`]: no section, a topology this build does not connect to, or
    /// the client's typed error (unreachable, refused credentials, TLS).
    pub fn remote_store(&self) -> Result<Arc<RedisScopeKinds>, RedisConfigError> {
        let section = self
            .redis
            .as_ref()
            .ok_or(RedisConfigError::NotConfigured("no [redis] section"))?;
        let scopes =
            RedisScopes::connect(section.pool_config()?).map_err(RedisConfigError::Pool)?;
        let mut store = RedisScopeKinds::new(scopes);
        for (kind, policy) in self.remote_kinds() {
            store = store.kind(kind, policy).map_err(RedisConfigError::Pool)?;
        }
        Ok(Arc::new(store))
    }
}

/// What a reload from `running` to `new` changes that a running Redis client cannot take
/// live: each changed `[redis]` field (the section added or removed counts as a whole),
/// each rule whose `remote` flag changed, and each remote rule whose policies changed (the
/// store enforces those it was built with). Empty when the reload may apply: local rules'
/// policies change live through the limiter's reconfiguration.
pub(crate) fn not_live(running: &Config, new: &Config) -> Vec<String> {
    let mut fields: Vec<String> = match (&running.redis, &new.redis) {
        (Some(a), Some(b)) => a
            .changed_fields(b)
            .into_iter()
            .map(|f| format!("redis.{f}"))
            .collect(),
        (None, None) => Vec::new(),
        _ => vec!["[redis]".to_owned()],
    };
    for rule in &new.rules {
        let was = running.rule(rule.kind);
        if was.is_some_and(|r| r.remote) != rule.remote {
            fields.push(format!("rule[{}].remote", rule.name));
        } else if rule.remote && was.is_some_and(|r| r.policies != rule.policies) {
            // The remote store enforces the policy it was built with.
            fields.push(format!("rule[{}].policies", rule.name));
        }
    }
    fields
}

/// The `[redis]` fields, as the file gives them.
pub(crate) const REDIS_FIELDS: &[&str] = &[
    "url",
    "namespace",
    "tls_ca_file",
    "username",
    "password",
    "password_env",
    "password_file",
    "exchange_timeout",
    "connect_timeout",
    "lease_ttl",
    "fail_mode",
    "instances",
    "wait_for_replicas",
    "wait_timeout",
    "cluster_nodes",
    "sentinel_master",
    "sentinels",
];

/// A problem found in the section: its span, field and kind.
pub(crate) type Found = (Range<usize>, String, ProblemKind);

/// Validates the raw section; every problem is pushed to `found`.
pub(crate) fn section(raw: &crate::raw::RawRedis, found: &mut Vec<Found>) -> Option<RedisSection> {
    let before = found.len();
    let mut bad = |span: Range<usize>, field: &str, kind: ProblemKind| {
        found.push((span, format!("redis.{field}"), kind));
    };
    let range = |value: String, expected: &str| ProblemKind::OutOfRange {
        value,
        expected: expected.to_owned(),
    };
    if let Some(p) = &raw.password {
        bad(p.span(), "password", ProblemKind::InlineSecret);
    }
    let url = raw.url.get_ref().clone();
    url_problems(&url, raw.url.span(), "url", &mut bad);
    let namespace = raw
        .namespace
        .as_ref()
        .map_or_else(|| "tokengate".to_owned(), |n| n.get_ref().clone());
    if let Some(n) = &raw.namespace {
        if n.get_ref().is_empty() || n.get_ref().contains(['{', '}']) {
            bad(
                n.span(),
                "namespace",
                range(
                    format!("{:?}", n.get_ref()),
                    "a non-empty name without '{' or '}'",
                ),
            );
        }
    }
    let password = match (&raw.password_env, &raw.password_file) {
        (Some(e), Some(_)) => {
            bad(
                e.span(),
                "password_env",
                range(
                    "both password_env and password_file".to_owned(),
                    "one source of the password",
                ),
            );
            None
        }
        (Some(e), None) if e.get_ref().is_empty() => {
            bad(
                e.span(),
                "password_env",
                range(String::new(), "a variable name"),
            );
            None
        }
        (Some(e), None) => Some(PasswordSource::Env(e.get_ref().clone())),
        (None, Some(f)) => Some(PasswordSource::File(PathBuf::from(f.get_ref()))),
        (None, None) => None,
    };
    let mut duration = |v: &Option<Spanned<String>>, field: &str, min: Duration, max: Duration| {
        let v = v.as_ref()?;
        match humantime::parse_duration(v.get_ref()) {
            Ok(d) if (min..=max).contains(&d) => Some(d),
            Ok(_) => {
                bad(
                    v.span(),
                    field,
                    range(
                        v.get_ref().clone(),
                        &format!(
                            "{} ..= {}",
                            humantime::format_duration(min),
                            humantime::format_duration(max)
                        ),
                    ),
                );
                None
            }
            Err(e) => {
                bad(
                    v.span(),
                    field,
                    range(
                        v.get_ref().clone(),
                        &format!("a duration such as \"50ms\" ({e})"),
                    ),
                );
                None
            }
        }
    };
    // The client's ranges (`PoolConfig`): checked again when it connects.
    let (ms, s) = (Duration::from_millis, Duration::from_secs);
    let exchange_timeout = duration(&raw.exchange_timeout, "exchange_timeout", ms(1), s(60));
    let connect_timeout = duration(&raw.connect_timeout, "connect_timeout", ms(1), s(60));
    let lease_ttl = duration(&raw.lease_ttl, "lease_ttl", ms(10), s(3600));
    let wait_timeout = duration(&raw.wait_timeout, "wait_timeout", ms(1), s(60));
    let fail_mode = raw
        .fail_mode
        .as_ref()
        .and_then(|m| match m.get_ref().as_str() {
            "local" => Some(FailMode::Local),
            "fail_open" => Some(FailMode::FailOpen),
            "fail_closed" => Some(FailMode::FailClosed),
            other => {
                bad(
                    m.span(),
                    "fail_mode",
                    range(
                        format!("{other:?}"),
                        "\"local\", \"fail_open\" or \"fail_closed\"",
                    ),
                );
                None
            }
        });
    let instances = raw
        .instances
        .as_ref()
        .and_then(|k| match u64::try_from(*k.get_ref()) {
            Ok(n) if (1..=1_000_000).contains(&n) => Some(n),
            _ => {
                bad(
                    k.span(),
                    "instances",
                    range(k.get_ref().to_string(), "1 ..= 1,000,000"),
                );
                None
            }
        });
    let wait_replicas =
        raw.wait_for_replicas
            .as_ref()
            .and_then(|n| match u64::try_from(*n.get_ref()) {
                Ok(n) if (1..=16).contains(&n) => Some(n),
                _ => {
                    bad(
                        n.span(),
                        "wait_for_replicas",
                        range(n.get_ref().to_string(), "1 ..= 16 replicas"),
                    );
                    None
                }
            });
    // Below the exchange timeout: `WAIT` is one more exchange of the round.
    let exchange = exchange_timeout
        .unwrap_or_else(|| PoolConfig::new(String::new(), String::new()).exchange_timeout_limit());
    if let (Some(t), Some(d)) = (&raw.wait_timeout, wait_timeout) {
        if d >= exchange {
            bad(
                t.span(),
                "wait_timeout",
                range(
                    t.get_ref().clone(),
                    &format!(
                        "below the exchange timeout ({})",
                        humantime::format_duration(exchange)
                    ),
                ),
            );
        }
    }
    match (&raw.wait_for_replicas, &raw.wait_timeout) {
        (Some(n), None) => bad(
            n.span(),
            "wait_for_replicas",
            range(
                "wait_for_replicas without wait_timeout".to_owned(),
                "both wait_for_replicas and wait_timeout",
            ),
        ),
        (None, Some(t)) => bad(
            t.span(),
            "wait_timeout",
            range(
                "wait_timeout without wait_for_replicas".to_owned(),
                "both wait_for_replicas and wait_timeout",
            ),
        ),
        _ => {}
    }
    let (scheme, _, db) = parts(&url);
    let listed = raw.cluster_nodes.iter().chain(&raw.sentinels);
    let with_query =
        std::iter::once(("url".to_owned(), &url, raw.url.span())).chain(listed.flat_map(|l| {
            l.get_ref()
                .iter()
                .enumerate()
                .map(move |(i, n)| (format!("[{i}]"), n, l.span()))
        }));
    if raw.cluster_nodes.is_some() || raw.sentinels.is_some() {
        for (field, u, span) in with_query {
            if u.contains(['?', '#']) {
                let field = if field == "url" {
                    field
                } else if raw.cluster_nodes.is_some() {
                    format!("cluster_nodes{field}")
                } else {
                    format!("sentinels{field}")
                };
                bad(
                    span,
                    &field,
                    range(
                        "query parameters".to_owned(),
                        "a URL without '?' or '#' with cluster or Sentinel fields",
                    ),
                );
            }
        }
    }
    let topology = match (&raw.cluster_nodes, &raw.sentinel_master, &raw.sentinels) {
        (None, None, None) => Some(Topology::Standalone),
        (Some(nodes), None, None) => {
            if !matches!(db, "" | "0") {
                bad(
                    raw.url.span(),
                    "url",
                    range(format!("database {db}"), "database 0 with cluster_nodes"),
                );
            }
            for (i, n) in nodes.get_ref().iter().enumerate() {
                let field = format!("cluster_nodes[{i}]");
                if url_problems(n, nodes.span(), &field, &mut bad) {
                    let (s, _, d) = parts(n);
                    if s != scheme {
                        bad(
                            nodes.span(),
                            &field,
                            range(format!("{s}://"), &format!("{scheme}://, as the url")),
                        );
                    }
                    if !matches!(d, "" | "0") {
                        bad(
                            nodes.span(),
                            &field,
                            range(format!("database {d}"), "database 0: a cluster has one"),
                        );
                    }
                }
            }
            if nodes.get_ref().len() > MAX_NODES {
                bad(
                    nodes.span(),
                    "cluster_nodes",
                    range(
                        format!("{} nodes", nodes.get_ref().len()),
                        &format!("at most {MAX_NODES}"),
                    ),
                );
            }
            if nodes.get_ref().is_empty() {
                bad(
                    nodes.span(),
                    "cluster_nodes",
                    range("[]".to_owned(), "at least one node URL"),
                );
            }
            Some(Topology::Cluster {
                nodes: nodes.get_ref().clone(),
            })
        }
        (None, Some(master), Some(sentinels)) => {
            if db.parse::<u16>().is_err() && !db.is_empty() {
                bad(
                    raw.url.span(),
                    "url",
                    range(format!("database {db:?}"), "a database number"),
                );
            }
            for (i, n) in sentinels.get_ref().iter().enumerate() {
                let field = format!("sentinels[{i}]");
                if url_problems(n, sentinels.span(), &field, &mut bad) {
                    let (s, _, d) = parts(n);
                    if s != "redis" || !d.is_empty() {
                        bad(
                            sentinels.span(),
                            &field,
                            range(
                                n.clone(),
                                "redis://host:port/ (Sentinels are spoken to without TLS)",
                            ),
                        );
                    }
                }
            }
            if sentinels.get_ref().len() > MAX_NODES {
                bad(
                    sentinels.span(),
                    "sentinels",
                    range(
                        format!("{} Sentinels", sentinels.get_ref().len()),
                        &format!("at most {MAX_NODES}"),
                    ),
                );
            }
            if master.get_ref().contains(|c: char| {
                matches!(c, '/' | ',' | '@' | '?' | '#' | '%') || c.is_whitespace()
            }) {
                bad(
                    master.span(),
                    "sentinel_master",
                    range(
                        format!("{:?}", master.get_ref()),
                        "a name without '/', ',', '@', '?', '#', '%' or spaces",
                    ),
                );
            }
            if sentinels.get_ref().is_empty() {
                bad(
                    sentinels.span(),
                    "sentinels",
                    range("[]".to_owned(), "at least one Sentinel URL"),
                );
            }
            if master.get_ref().is_empty() {
                bad(
                    master.span(),
                    "sentinel_master",
                    range(String::new(), "the master's name"),
                );
            }
            Some(Topology::Sentinel {
                master: master.get_ref().clone(),
                sentinels: sentinels.get_ref().clone(),
            })
        }
        (Some(nodes), _, _) => {
            bad(
                nodes.span(),
                "cluster_nodes",
                range(
                    "cluster_nodes with sentinel fields".to_owned(),
                    "either cluster_nodes or sentinel_master with sentinels",
                ),
            );
            None
        }
        (None, master, sentinels) => {
            let span = master
                .as_ref()
                .map(Spanned::span)
                .or_else(|| sentinels.as_ref().map(Spanned::span))
                .unwrap_or_default();
            bad(
                span,
                "sentinel_master",
                range(
                    "one of sentinel_master and sentinels".to_owned(),
                    "both sentinel_master and sentinels",
                ),
            );
            None
        }
    };
    if found.len() != before {
        return None;
    }
    Some(RedisSection {
        url,
        namespace,
        tls_ca_file: raw.tls_ca_file.as_ref().map(|f| PathBuf::from(f.get_ref())),
        username: raw.username.as_ref().map(|u| u.get_ref().clone()),
        password,
        exchange_timeout,
        connect_timeout,
        lease_ttl,
        fail_mode,
        instances,
        wait_for_replicas: wait_replicas.zip(wait_timeout),
        topology: topology?,
    })
}

/// The most nodes (or Sentinels) the client's URL may list.
const MAX_NODES: usize = 63;

/// A `redis://` or `rediss://` URL's scheme, node (`host:port`, without an empty `@`)
/// and database path (`""` when none); for a URL [`url_problems`] passed.
fn parts(url: &str) -> (&str, &str, &str) {
    let (scheme, rest) = url.split_once("://").unwrap_or(("redis", url));
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let node = authority.rsplit_once('@').map_or(authority, |(_, n)| n);
    (scheme, node, path.trim_end_matches('/'))
}

/// A URL's problems: not `redis://` or `rediss://`, or holding a password (refused, and
/// never echoed: the problem names the field only). True when it has none.
fn url_problems(
    url: &str,
    span: Range<usize>,
    field: &str,
    bad: &mut impl FnMut(Range<usize>, &str, ProblemKind),
) -> bool {
    let Some(rest) = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("rediss://"))
    else {
        let scheme = url.split_once("://").map_or("none", |(s, _)| s);
        bad(
            span,
            field,
            ProblemKind::OutOfRange {
                value: format!("a URL of scheme {scheme:?}"),
                expected: "redis://host:port/db or rediss://host:port/db".to_owned(),
            },
        );
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let mut ok = true;
    if let Some((user, _)) = authority.rsplit_once('@') {
        if !user.is_empty() {
            bad(span.clone(), field, ProblemKind::InlineSecret);
            ok = false;
        }
    }
    if authority.is_empty() || authority.contains(',') {
        let value = if authority.is_empty() {
            "no host".to_owned()
        } else {
            "a list of hosts".to_owned()
        };
        bad(
            span,
            field,
            ProblemKind::OutOfRange {
                value,
                expected: "redis://host:port/db".to_owned(),
            },
        );
        ok = false;
    }
    ok
}
