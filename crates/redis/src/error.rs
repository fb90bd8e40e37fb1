//! Errors of starting a pool and of registering a bucket.

use std::fmt;
use std::time::Duration;

use crate::config::ConfigError;
use crate::policy::PolicyError;

/// Why a pool could not start, or a bucket could not be registered.
#[derive(Debug)]
#[non_exhaustive]
pub enum PoolError {
    /// A setting was out of range.
    Config(ConfigError),
    /// The bucket's policy cannot run exactly in Lua.
    Policy(PolicyError),
    /// The scope name would break the keys' hash tag.
    Scope(String),
    /// The URL did not parse.
    Url {
        /// The URL given, its password shown as `***`.
        url: String,
        /// The client's message.
        detail: String,
    },
    /// Redis did not answer within the timeout (refused, unroutable, or silent).
    Unreachable {
        /// The URL given, its password shown as `***`.
        url: String,
        /// The timeout that applied.
        timeout: Duration,
        /// The client's message.
        detail: String,
    },
    /// The server runs in cluster mode and the URL names one node: a cluster is reached
    /// with `redis+cluster://host:port[,host:port...]` (README "Cluster").
    Cluster {
        /// The URL given, its password shown as `***`.
        url: String,
    },
    /// The async client (`AsyncRedisScopes`, feature `tokio`) was given a
    /// cluster or Sentinel URL: it speaks to one node (`redis://`, `rediss://`) only; the
    /// blocking clients take every URL form.
    AsyncTopology {
        /// The URL given, its password shown as `***`.
        url: String,
        /// The kind the URL names (`cluster` or `sentinel`).
        kind: &'static str,
    },
    /// No Sentinel named a primary for `master` that says it is one: none answered
    /// within the timeouts, none knows the name, or the address named is a replica.
    Sentinel {
        /// The primary's name.
        master: String,
        /// What each Sentinel answered (addresses only, never a password).
        detail: String,
    },
    /// The password could not be read from where the settings say (an environment
    /// variable unset, a file missing or empty). The value is never shown.
    Credentials {
        /// Where it was to come from: the variable's name or the file's path.
        source: String,
        /// Why it could not be read.
        detail: String,
    },
    /// Redis refused the credentials (`WRONGPASS`, a disabled ACL user, or `NOAUTH`:
    /// none given where one is required).
    Auth {
        /// The URL given, its password shown as `***`.
        url: String,
        /// The client's or the server's message (never the password).
        detail: String,
    },
    /// The TLS handshake failed: the server's certificate is not trusted (an unknown CA,
    /// another host name, expired), the CA file does not parse, or the server does not
    /// speak TLS.
    Tls {
        /// The URL given, its password shown as `***`.
        url: String,
        /// The TLS library's message.
        detail: String,
    },
    /// Redis answered but refused the setup (a command the ACL user lacks, scripts
    /// disabled, ...).
    Misconfigured {
        /// The URL given, its password shown as `***`.
        url: String,
        /// The server's message.
        detail: String,
    },
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(e) => write!(f, "invalid pool setting: {e}"),
            Self::Policy(e) => write!(f, "invalid remote policy: {e}"),
            Self::Scope(e) => write!(f, "invalid bucket scope: {e}"),
            Self::Url { url, detail } => write!(f, "invalid Redis URL {url:?}: {detail}"),
            Self::Unreachable {
                url,
                timeout,
                detail,
            } => {
                write!(
                    f,
                    "Redis at {url} did not answer within {timeout:?}: {detail}"
                )
            }
            Self::Cluster { url } => write!(
                f,
                "Redis at {url} runs in cluster mode; name its nodes with redis+cluster://"
            ),
            Self::AsyncTopology { url, kind } => write!(
                f,
                "Redis URL {url:?} names a {kind}; the async client takes one node \
                 (redis:// or rediss://), the blocking clients take a {kind}"
            ),
            Self::Sentinel { master, detail } => {
                write!(f, "no Sentinel named a primary for {master:?}: {detail}")
            }
            Self::Credentials { source, detail } => {
                write!(f, "cannot read the Redis password from {source}: {detail}")
            }
            Self::Auth { url, detail } => {
                write!(f, "Redis at {url} refused the credentials: {detail}")
            }
            Self::Tls { url, detail } => {
                write!(f, "TLS with Redis at {url} failed: {detail}")
            }
            Self::Misconfigured { url, detail } => {
                write!(f, "Redis at {url} refused the pool's setup: {detail}")
            }
        }
    }
}

impl std::error::Error for PoolError {}

impl From<ConfigError> for PoolError {
    fn from(e: ConfigError) -> Self {
        Self::Config(e)
    }
}

impl From<PolicyError> for PoolError {
    fn from(e: PolicyError) -> Self {
        Self::Policy(e)
    }
}

/// Why a decision refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The fleet's budget cannot pay now (Redis said so, or a lease is on its way).
    Rejected {
        /// When the cost could be paid, as far as this instance knows.
        retry_after: Duration,
    },
    /// Redis cannot be reached, the lease is spent, and the fail mode is
    /// [`FailClosed`](crate::FailMode::FailClosed), or [`Local`](crate::FailMode::Local)
    /// with a share that rounds down to nothing (fewer than one token per instance: see
    /// [`RemotePolicy::share`](crate::RemotePolicy::share)).
    Unavailable {
        /// Until the breaker's next probe.
        retry_after: Duration,
    },
    /// The cost was zero or above the largest lease.
    Cost {
        /// The cost asked.
        cost: u64,
        /// The largest cost this bucket pays (its largest lease).
        max: u64,
    },
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rejected { retry_after } => {
                write!(f, "rate limited; retry after {retry_after:?}")
            }
            Self::Unavailable { retry_after } => {
                write!(
                    f,
                    "the shared budget is unreachable; retry after {retry_after:?}"
                )
            }
            Self::Cost { cost, max } => write!(f, "cost must be 1 ..= {max} tokens, got {cost}"),
        }
    }
}

impl std::error::Error for Refused {}
