//! The one place the connection kind is decided: a single node (`redis://`, `rediss://`),
//! a Redis Cluster (`redis+cluster://`, `rediss+cluster://`: a list of seed nodes), or a
//! primary found through Sentinel (`redis+sentinel://`). Everything above this module
//! speaks to a [`Link`] and never asks which kind it is, except for what a cluster changes:
//! a round's pipeline (one per node, sent to every node before any reply is read) and
//! `WAIT` (sent to the primary of each slot written).
//!
//! # URL forms
//!
//! - `redis://[user:password@]host:port/db` and `rediss://...`: one node.
//! - `redis+cluster://[user:password@]host:port[,host:port...]` (and `rediss+cluster://`):
//!   the seed nodes of a cluster; the topology is read from the first that answers and
//!   followed through `MOVED` and `ASK` (redis-rs's cluster client). Database 0 only.
//! - `redis+sentinel://[user:password@]host:port[,host:port...]/master_name[/db]` (and
//!   `rediss+sentinel://`): the Sentinels (port 26379 when none is given), asked in turn
//!   for the primary named `master_name`; the user information and the scheme's TLS apply
//!   to the primary, the Sentinels are spoken to without `AUTH` or TLS. The primary found
//!   must say it is one (`ROLE`): a Sentinel that has not seen a failover yet is not
//!   followed to a replica.

use std::time::Duration;

use redis::cluster::{ClusterClientBuilder, ClusterConnection, cluster_pipe};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Connection, ConnectionLike, IntoConnectionInfo, RedisResult, Value};

use crate::config::{PoolConfig, RedisUrl};
use crate::error::PoolError;
use crate::script::Scripts;

/// The most nodes one URL may list.
const MAX_NODES: usize = 64;
/// The Sentinel port when a Sentinel address gives none.
const SENTINEL_PORT: u16 = 26379;

/// Where a URL says Redis is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Topology {
    /// One node: the URL as given.
    Node,
    /// A cluster, through these seed nodes (`redis://` or `rediss://` URLs).
    Cluster { seeds: Vec<RedisUrl> },
    /// The primary `master` the Sentinels name; reached as `{prefix}host:port{db}`,
    /// `prefix` the scheme and user information (`redis://user:password@`), `db` the
    /// database path (`/0`).
    Sentinel {
        sentinels: Vec<String>,
        master: String,
        prefix: RedisUrl,
        db: String,
    },
}

impl Topology {
    /// The topology `url` names, or what is wrong with it.
    pub(crate) fn of(url: &RedisUrl) -> Result<Self, String> {
        let s = url.as_str();
        let Some((scheme, rest)) = s.split_once("://") else {
            return Ok(Self::Node);
        };
        let (data, cluster) = match scheme {
            "redis+cluster" => ("redis", true),
            "rediss+cluster" => ("rediss", true),
            "redis+sentinel" => ("redis", false),
            "rediss+sentinel" => ("rediss", false),
            // Anything else is the client's to parse (and refuse).
            _ => return Ok(Self::Node),
        };
        if rest.contains(['?', '#']) {
            return Err("query parameters are not supported in a cluster or Sentinel URL".into());
        }
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => (&authority[..=at], &authority[at + 1..]),
            None => ("", authority),
        };
        let hosts: Vec<&str> = hosts.split(',').collect();
        if hosts.iter().any(|h| h.is_empty()) {
            return Err("an empty address in the node list".into());
        }
        if hosts.len() > MAX_NODES {
            return Err(format!("at most {MAX_NODES} nodes, got {}", hosts.len()));
        }
        if cluster {
            if !matches!(path, "" | "/" | "/0") {
                return Err(format!(
                    "a cluster has database 0 only, got the path {path:?}"
                ));
            }
            let seeds = hosts
                .iter()
                .map(|h| RedisUrl(format!("{data}://{userinfo}{h}/")))
                .collect();
            return Ok(Self::Cluster { seeds });
        }
        let mut parts = path.trim_start_matches('/').splitn(2, '/');
        let master = parts.next().unwrap_or_default();
        if master.is_empty() {
            return Err(
                "the primary's name is missing: redis+sentinel://host:port[,host:port]/name[/db]"
                    .into(),
            );
        }
        let db = parts.next().unwrap_or("0");
        if db.parse::<u16>().is_err() {
            return Err(format!("the database must be a number, got {db:?}"));
        }
        let sentinels = hosts
            .iter()
            .map(|h| {
                // `host` or `[v6]` without a port: the Sentinel port.
                if h.ends_with(']') || !h.contains(':') {
                    format!("redis://{h}:{SENTINEL_PORT}/")
                } else {
                    format!("redis://{h}/")
                }
            })
            .collect();
        Ok(Self::Sentinel {
            sentinels,
            master: master.to_owned(),
            prefix: RedisUrl(format!("{data}://{userinfo}")),
            db: format!("/{db}"),
        })
    }
}

/// A connection to Redis as the URL names it: one node (directly or found through
/// Sentinel) or a cluster.
pub(crate) enum Link {
    /// One node.
    Node(Connection),
    /// A cluster: a connection per node, routed by key.
    Cluster(Box<ClusterConnection>),
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Node(_) => "Link::Node",
            Self::Cluster(_) => "Link::Cluster",
        })
    }
}

impl ConnectionLike for Link {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        match self {
            Self::Node(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        match self {
            Self::Node(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    // The cluster routes a command by its keys and follows MOVED/ASK here.
    fn req_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Self::Node(c) => c.req_command(cmd),
            Self::Cluster(c) => c.req_command(cmd),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Node(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }

    fn supports_pipelining(&self) -> bool {
        match self {
            Self::Node(c) => c.supports_pipelining(),
            Self::Cluster(c) => c.supports_pipelining(),
        }
    }

    fn check_connection(&mut self) -> bool {
        match self {
            Self::Node(c) => c.check_connection(),
            Self::Cluster(c) => c.check_connection(),
        }
    }

    fn is_open(&self) -> bool {
        match self {
            Self::Node(c) => c.is_open(),
            Self::Cluster(c) => c.is_open(),
        }
    }
}

impl Link {
    /// Runs `cmds` as one round and returns each command's result in order.
    ///
    /// One node: one pipeline; a command the server refused (`NOSCRIPT`) is an `Err` in
    /// its place, the others ran.
    ///
    /// Cluster: one pipeline per node, all sent before any reply is read (one round trip
    /// of wall time). redis-rs's cluster pipeline reports a redirected command (`MOVED`,
    /// `ASK`, `TRYAGAIN`) as a failure of the whole pipeline without following it, so
    /// then every command is sent again one at a time through the cluster client, which
    /// follows `MOVED` (refreshing its slot map), `ASK` (with `ASKING`) and `TRYAGAIN`;
    /// `NOSCRIPT` there loads the scripts on every primary and sends that command again.
    /// The commands must therefore be idempotent: the exchanges are (a grant replays its
    /// request id, a settlement or credit applies once). A lost connection fails the
    /// round.
    pub(crate) fn round(
        &mut self,
        cmds: &[Cmd],
        scripts: &Scripts,
        resent: &mut u64,
    ) -> RedisResult<Vec<RedisResult<Value>>> {
        match self {
            Self::Node(c) => {
                let mut pipe = redis::pipe();
                for cmd in cmds {
                    pipe.add_command(cmd.clone());
                }
                pipe.ignore_errors().query(c)
            }
            Self::Cluster(c) => {
                let mut pipe = cluster_pipe();
                for cmd in cmds {
                    pipe.add_command(cmd.clone());
                }
                match pipe.query::<Vec<Value>>(c) {
                    Ok(values) => Ok(values.into_iter().map(Ok).collect()),
                    Err(e) if lost(&e) => Err(e),
                    Err(_) => {
                        let mut out = Vec::with_capacity(cmds.len());
                        for cmd in cmds {
                            *resent += 1;
                            let v = match c.req_command(cmd) {
                                Err(e)
                                    if e.kind()
                                        == redis::ErrorKind::Server(
                                            redis::ServerErrorKind::NoScript,
                                        ) =>
                                {
                                    scripts.load(&mut **c)?;
                                    *resent += 1;
                                    c.req_command(cmd)
                                }
                                r => r,
                            };
                            if let Err(e) = &v {
                                if lost(e) {
                                    return Err(e.clone());
                                }
                            }
                            out.push(v);
                        }
                        Ok(out)
                    }
                }
            }
        }
    }

    /// `WAIT replicas timeout` on the connection that wrote `keys` (on a cluster, on the
    /// primary of each of their slots, one after the other): the fewest replicas that
    /// acknowledged every write made so far on it. Returns `replicas` at once when `keys`
    /// is empty.
    pub(crate) fn wait(
        &mut self,
        keys: &[&str],
        replicas: u64,
        timeout: Duration,
    ) -> RedisResult<u64> {
        if keys.is_empty() {
            return Ok(replicas);
        }
        let cmd = wait_cmd(replicas, timeout);
        match self {
            Self::Node(c) => cmd.query(c),
            Self::Cluster(c) => {
                let mut routes: Vec<Route> = Vec::new();
                for key in keys {
                    let r = Route::with_key(key, SlotAddr::Master);
                    if !routes.contains(&r) {
                        routes.push(r);
                    }
                }
                let mut fewest = replicas;
                for r in routes {
                    let v = c.route_command(
                        &cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(r)),
                    )?;
                    fewest = fewest.min(redis::from_redis_value_ref(&v)?);
                }
                Ok(fewest)
            }
        }
    }
}

/// `WAIT replicas timeout`: the replicas that acknowledged every write made so far on the
/// connection it is sent on.
pub(crate) fn wait_cmd(replicas: u64, timeout: Duration) -> Cmd {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(replicas).arg(timeout.as_millis() as u64);
    cmd
}

/// Opens the connection the configuration names, with its timeouts, credentials and CA,
/// and loads the scripts (on every primary of a cluster).
pub(crate) fn open(config: &PoolConfig, scripts: &Scripts) -> Result<Link, PoolError> {
    let topology = Topology::of(&config.url).map_err(|detail| PoolError::Url {
        url: config.url.redacted(),
        detail,
    })?;
    match topology {
        Topology::Node => open_node(config, &config.url, scripts).map(Link::Node),
        Topology::Cluster { seeds } => open_cluster(config, &seeds, scripts),
        Topology::Sentinel {
            sentinels,
            master,
            prefix,
            db,
        } => {
            let (host, port) = ask_sentinels(config, &sentinels, &master)?;
            let host = if host.contains(':') {
                format!("[{host}]")
            } else {
                host
            };
            let url = RedisUrl(format!("{}{host}:{port}{db}", prefix.as_str()));
            let mut con = open_node(config, &url, scripts)?;
            let role: Vec<Value> = redis::cmd("ROLE")
                .query(&mut con)
                .map_err(|e| classify(&url.redacted(), e, config.exchange_timeout))?;
            match role.first() {
                Some(Value::BulkString(b)) if b == b"master" => Ok(Link::Node(con)),
                _ => Err(PoolError::Sentinel {
                    master,
                    detail: format!("{} is not a primary (yet)", url.redacted()),
                }),
            }
        }
    }
}

/// Asks each Sentinel in turn for the address of the primary `master`.
fn ask_sentinels(
    config: &PoolConfig,
    sentinels: &[String],
    master: &str,
) -> Result<(String, u16), PoolError> {
    let mut why = Vec::new();
    for s in sentinels {
        let asked = redis::Client::open(s.as_str())
            .and_then(|c| c.get_connection_with_timeout(config.connect_timeout))
            .and_then(|mut c| {
                c.set_read_timeout(Some(config.exchange_timeout))?;
                c.set_write_timeout(Some(config.exchange_timeout))?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(master)
                    .query::<Option<(String, u16)>>(&mut c)
            });
        match asked {
            Ok(Some(addr)) => return Ok(addr),
            Ok(None) => why.push(format!("{s}: does not know it")),
            Err(e) => why.push(format!("{s}: {e}")),
        }
    }
    Err(PoolError::Sentinel {
        master: master.to_owned(),
        detail: why.join("; "),
    })
}

/// A cluster through its seed nodes. redis-rs retries a redirected command up to 4 times,
/// waiting 1 ms up to a quarter of the exchange timeout between tries (`TRYAGAIN` during
/// a slot's migration, `CLUSTERDOWN` during a failover), so a round stays bounded.
fn open_cluster(
    config: &PoolConfig,
    seeds: &[RedisUrl],
    scripts: &Scripts,
) -> Result<Link, PoolError> {
    let url = config.url.redacted();
    let wait_ms = (config.exchange_timeout.as_millis() as u64 / 4).max(2);
    let mut builder = ClusterClientBuilder::new(seeds.iter().map(RedisUrl::as_str))
        .connection_timeout(config.connect_timeout)
        .response_timeout(config.exchange_timeout)
        .retries(4)
        .min_retry_wait(1)
        .max_retry_wait(wait_ms)
        .retry_wait_formula(1, 2);
    if let Some(user) = &config.username {
        builder = builder.username(user);
    }
    if let Some(secret) = &config.password {
        let password = secret.read().map_err(|detail| PoolError::Credentials {
            source: secret.source(),
            detail,
        })?;
        builder = builder.password(password);
    }
    builder = cluster_tls(config, builder, &url)?;
    let client = builder.build().map_err(|e| PoolError::Url {
        url: url.clone(),
        detail: e.to_string(),
    })?;
    let con = client.get_connection().map_err(|e| {
        // redis-rs reports a seed's refusal of `CLUSTER SLOTS` as an I/O failure.
        if e.to_string().contains("cluster support disabled") {
            PoolError::Misconfigured {
                url: url.clone(),
                detail: format!("a seed node is not in cluster mode: {e}"),
            }
        } else {
            classify(&url, e, config.connect_timeout)
        }
    })?;
    con.set_write_timeout(Some(config.exchange_timeout))
        .map_err(|e| classify(&url, e, config.exchange_timeout))?;
    let mut link = Link::Cluster(Box::new(con));
    scripts
        .load(&mut link)
        .map_err(|e| classify(&url, e, config.exchange_timeout))?;
    Ok(link)
}

#[cfg(feature = "tls")]
fn cluster_tls(
    config: &PoolConfig,
    builder: ClusterClientBuilder,
    url: &str,
) -> Result<ClusterClientBuilder, PoolError> {
    let Some(ca) = &config.root_ca else {
        return Ok(builder);
    };
    let pem = ca.pem().map_err(|detail| PoolError::Tls {
        url: url.to_owned(),
        detail,
    })?;
    Ok(builder.certs(redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem),
    }))
}

#[cfg(not(feature = "tls"))]
fn cluster_tls(
    config: &PoolConfig,
    builder: ClusterClientBuilder,
    url: &str,
) -> Result<ClusterClientBuilder, PoolError> {
    if config.root_ca.is_some() {
        return Err(PoolError::Tls {
            url: url.to_owned(),
            detail: "a TLS root CA is set but the crate is built without the tls feature"
                .to_owned(),
        });
    }
    Ok(builder)
}

/// Opens a connection to the node at `target` with the configured timeouts, credentials
/// and CA, and loads the scripts. A cluster-mode node is refused: a `redis+cluster://`
/// URL is the way to it.
fn open_node(
    config: &PoolConfig,
    target: &RedisUrl,
    scripts: &Scripts,
) -> Result<Connection, PoolError> {
    let (client, url) = node_client(config, target)?;
    let failed = |e: redis::RedisError, timeout| classify(&url, e, timeout);
    let mut con = client
        .get_connection_with_timeout(config.connect_timeout)
        .map_err(|e| failed(e, config.connect_timeout))?;
    con.set_read_timeout(Some(config.exchange_timeout))
        .and_then(|()| con.set_write_timeout(Some(config.exchange_timeout)))
        .map_err(|e| failed(e, config.exchange_timeout))?;
    // Over TLS without `AUTH`, this is the handshake.
    not_cluster(
        redis::cmd("INFO").arg("cluster").query::<String>(&mut con),
        &url,
        config.exchange_timeout,
    )?;
    scripts
        .load(&mut con)
        .map_err(|e| failed(e, config.exchange_timeout))?;
    Ok(con)
}

/// [`open`] for async callers: a multiplexed connection on the tokio runtime to the node
/// the URL names, with the same client setup, checks and scripts as [`open_node`], each
/// step bounded by the same timeouts. A cluster or Sentinel URL is refused
/// ([`PoolError::AsyncTopology`]): the async client speaks to one node.
#[cfg(feature = "tokio")]
pub(crate) async fn open_async(
    config: &PoolConfig,
    scripts: &Scripts,
) -> Result<redis::aio::MultiplexedConnection, PoolError> {
    let url = config.url.redacted();
    let kind = match Topology::of(&config.url) {
        Ok(Topology::Node) => None,
        Ok(Topology::Cluster { .. }) => Some("cluster"),
        Ok(Topology::Sentinel { .. }) => Some("sentinel"),
        Err(detail) => return Err(PoolError::Url { url, detail }),
    };
    if let Some(kind) = kind {
        return Err(PoolError::AsyncTopology { url, kind });
    }
    let (client, url) = node_client(config, &config.url)?;
    let failed = |e: redis::RedisError, timeout| classify(&url, e, timeout);
    let settings = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.exchange_timeout));
    let mut con = client
        .get_multiplexed_async_connection_with_config(&settings)
        .await
        .map_err(|e| failed(e, config.connect_timeout))?;
    not_cluster(
        redis::cmd("INFO")
            .arg("cluster")
            .query_async::<String>(&mut con)
            .await,
        &url,
        config.exchange_timeout,
    )?;
    scripts
        .load_async(&mut con)
        .await
        .map_err(|e| failed(e, config.exchange_timeout))?;
    Ok(con)
}

/// The client of the node at `target` (credentials read now, TLS roots), and the URL as
/// errors show it.
fn node_client(
    config: &PoolConfig,
    target: &RedisUrl,
) -> Result<(redis::Client, String), PoolError> {
    let url = target.redacted();
    let bad_url = |e: redis::RedisError| PoolError::Url {
        url: url.clone(),
        detail: e.to_string(),
    };
    // No `CLIENT SETINFO` after connecting: a listener that never answers then costs one
    // exchange timeout (the script load), not the connect timeout once per setup reply.
    let info = target.as_str().into_connection_info().map_err(bad_url)?;
    let mut settings = info.redis_settings().clone().set_skip_set_lib_name();
    if let Some(user) = &config.username {
        settings = settings.set_username(user);
    }
    if let Some(secret) = &config.password {
        let password = secret.read().map_err(|detail| PoolError::Credentials {
            source: secret.source(),
            detail,
        })?;
        settings = settings.set_password(password);
    }
    let client = client(config, info.set_redis_settings(settings), &url)?;
    Ok((client, url))
}

/// A cluster-mode server would answer MOVED for keys of other nodes and the breaker
/// would never close: refused at start. (A server without INFO, or a user not allowed
/// it, is taken as not one.) `info` is the node's `INFO cluster`.
fn not_cluster(
    info: redis::RedisResult<String>,
    url: &str,
    timeout: Duration,
) -> Result<(), PoolError> {
    match info {
        Ok(info) if info.lines().any(|l| l.trim() == "cluster_enabled:1") => {
            Err(PoolError::Cluster {
                url: url.to_owned(),
            })
        }
        Err(e) => match classify(url, e, timeout) {
            PoolError::Misconfigured { .. } => Ok(()),
            e => Err(e),
        },
        Ok(_) => Ok(()),
    }
}

/// The client for `info`: over TLS trusting the configured CA when one is given.
#[cfg(feature = "tls")]
fn client(
    config: &PoolConfig,
    info: redis::ConnectionInfo,
    url: &str,
) -> Result<redis::Client, PoolError> {
    let Some(ca) = &config.root_ca else {
        return redis::Client::open(info).map_err(|e| PoolError::Url {
            url: url.to_owned(),
            detail: e.to_string(),
        });
    };
    let tls = |detail: String| PoolError::Tls {
        url: url.to_owned(),
        detail,
    };
    if !matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
        return Err(PoolError::Url {
            url: url.to_owned(),
            detail: "a TLS root CA is set: the URL must be rediss://".to_owned(),
        });
    }
    let pem = ca.pem().map_err(tls)?;
    let certificates = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem),
    };
    redis::Client::build_with_tls(info, certificates).map_err(|e| tls(e.to_string()))
}

/// The client for `info` (no TLS support built: a `rediss://` URL failed to parse, and a
/// CA is refused rather than ignored).
#[cfg(not(feature = "tls"))]
fn client(
    config: &PoolConfig,
    info: redis::ConnectionInfo,
    url: &str,
) -> Result<redis::Client, PoolError> {
    if matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
        return Err(PoolError::Url {
            url: url.to_owned(),
            detail: "rediss:// needs the crate's tls feature".to_owned(),
        });
    }
    if config.root_ca.is_some() {
        return Err(PoolError::Tls {
            url: url.to_owned(),
            detail: "a TLS root CA is set but the crate is built without the tls feature"
                .to_owned(),
        });
    }
    redis::Client::open(info).map_err(|e| PoolError::Url {
        url: url.to_owned(),
        detail: e.to_string(),
    })
}

/// Whether `e` lost the connection (refused, reset, timed out) rather than being refused
/// by the server.
pub(crate) fn lost(e: &redis::RedisError) -> bool {
    e.is_timeout() || e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()
}

/// The typed error of a failed connection setup: TLS, credentials, unreachable (within
/// `timeout`), or a refused setup.
fn classify(url: &str, e: redis::RedisError, timeout: Duration) -> PoolError {
    let url = url.to_owned();
    if let Some(detail) = tls_failure(&e) {
        return PoolError::Tls { url, detail };
    }
    if e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH"))
    {
        return PoolError::Auth {
            url,
            detail: e.to_string(),
        };
    }
    if lost(&e) {
        PoolError::Unreachable {
            url,
            timeout,
            detail: e.to_string(),
        }
    } else {
        PoolError::Misconfigured {
            url,
            detail: e.to_string(),
        }
    }
}

/// The TLS library's message when `e` is a failed handshake: a [`rustls::Error`] in the
/// I/O error redis-rs keeps (behind an `Arc`, its error's source).
#[cfg(feature = "tls")]
fn tls_failure(e: &redis::RedisError) -> Option<String> {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let rustls_in = |io: &std::io::Error| {
        io.get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .map(ToString::to_string)
    };
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(t) = s.downcast_ref::<rustls::Error>() {
            return Some(t.to_string());
        }
        let io = s.downcast_ref::<std::io::Error>().or_else(|| {
            s.downcast_ref::<Shared>()
                .and_then(|shared| shared.downcast_ref::<std::io::Error>())
        });
        if let Some(found) = io.and_then(rustls_in) {
            return Some(found);
        }
        source = s.source();
    }
    None
}

#[cfg(not(feature = "tls"))]
fn tls_failure(_: &redis::RedisError) -> Option<String> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(url: &str) -> Result<Topology, String> {
        Topology::of(&RedisUrl(url.to_owned()))
    }

    #[test]
    fn urls_name_a_node_a_cluster_or_a_sentinel_group() {
        assert_eq!(of("redis://h:1/0"), Ok(Topology::Node));
        assert_eq!(of("rediss://u:p@h:1/"), Ok(Topology::Node));
        let Ok(Topology::Cluster { seeds }) = of("rediss+cluster://u:p@a:1,b:2/") else {
            panic!()
        };
        let seeds: Vec<&str> = seeds.iter().map(RedisUrl::as_str).collect();
        assert_eq!(seeds, ["rediss://u:p@a:1/", "rediss://u:p@b:2/"]);
        let Ok(Topology::Sentinel {
            sentinels,
            master,
            prefix,
            db,
        }) = of("rediss+sentinel://:pw@s1,s2:5000,[::1]/main/3")
        else {
            panic!()
        };
        assert_eq!(
            sentinels,
            [
                "redis://s1:26379/",
                "redis://s2:5000/",
                "redis://[::1]:26379/"
            ]
        );
        assert_eq!((master.as_str(), db.as_str()), ("main", "/3"));
        assert_eq!(prefix.as_str(), "rediss://:pw@");
        // Shown without the password.
        let shown = format!("{:?}", of("redis+sentinel://u:pw@s/m").unwrap());
        assert!(!shown.contains("pw") && shown.contains("u:***@"), "{shown}");
        let shown = format!("{:?}", of("redis+cluster://u:pw@a:1,b:2").unwrap());
        assert!(!shown.contains("pw"), "{shown}");
    }

    #[test]
    fn a_malformed_cluster_or_sentinel_url_says_what_is_wrong() {
        for (url, says) in [
            ("redis+cluster://a:1,,b:2", "empty address"),
            ("redis+cluster://a:1/2", "database 0 only"),
            ("redis+cluster://a:1?x=1", "query parameters"),
            ("redis+sentinel://a:1", "name is missing"),
            ("redis+sentinel://a:1/", "name is missing"),
            ("redis+sentinel://a:1/m/x", "must be a number"),
        ] {
            let e = of(url).unwrap_err();
            assert!(e.contains(says), "{url}: {e}");
        }
        let many = format!("redis+cluster://{}", vec!["h:1"; 65].join(","));
        assert!(of(&many).unwrap_err().contains("at most 64"));
    }
}
