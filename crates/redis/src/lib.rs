//! One tokengate budget across many instances: token leases from a global pool on Redis.
//!
//! See the crate's README for the design, the bounds and how they are tested.

#![warn(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    rust_2018_idioms
)]
#![doc(test(attr(deny(warnings))))]

#[cfg(feature = "tokio")]
mod async_kinds;
#[cfg(feature = "tokio")]
mod async_scopes;
mod breaker;
mod compose;
mod config;
mod connect;
mod error;
pub mod ideal;
mod lease_pool;
pub mod model;
mod policy;
mod pool;
pub mod rate;
mod reservoir;
mod scoped;
pub mod script;
pub mod series;
mod sizing;
mod strict;
mod strict_core;
mod worker;

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(feature = "tokio")]
pub use async_kinds::AsyncRedisScopeKinds;
#[cfg(feature = "tokio")]
pub use async_scopes::{AsyncRedisScopes, CallError};
pub use compose::{ComposedRefused, GlobalScope, GlobalThenScopes};
pub use config::{ConfigError, FailMode, PoolConfig};
pub use error::{PoolError, Refused};
pub use lease_pool::LeasedError;
pub use policy::{
    LUA_EXACT_LIMIT, MIN_RATE, Mode, PolicyError, RemotePolicy, Start, UNITS_PER_TOKEN,
};
pub use pool::{Admitted, BucketStats, RedisPool, RemoteBucket};
pub use rate::{RateBucket, RateConfig, RatePool, RateStats};
pub use reservoir::MAX_LEASE_TOKENS;
pub use scoped::RedisScopeKinds;
pub use strict::{
    InvalidRequest, MAX_KEY_BYTES, MAX_STRICT_SCOPES, RedisScopes, StrictAdmitted, StrictRefused,
    StrictScope,
};
