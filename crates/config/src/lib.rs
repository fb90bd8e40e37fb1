//! tokengate deployments as TOML files: read, validated whole, built into the engine's
//! rules, and reloaded live.
//!
//! A file names rules per scope kind (each with one or several policies, map bounds,
//! shadow mode, lease settings and the token-inheritance strategy for reloads), the work
//! classes and their costs, tiers of policies and per-key overrides. The format, with a
//! sample, is in the crate's README.
//!
//! - [`Config::from_file`] / [`Config::from_toml`]: parse and validate. Unknown fields
//!   are refused; every problem of the file is listed, each with its line, column and
//!   field ([`ConfigError`]); a file with any problem is refused whole.
//! - [`Config::rule_set`]: the engine's [`RuleSet`](tokengate::scope::RuleSet) for what
//!   it enforces today (up to [`MAX_POLICIES_PER_RULE`](tokengate::scope::MAX_POLICIES_PER_RULE)
//!   policies per rule or tier, tiers and per-key overrides); a file using more is
//!   refused with [`Unsupported`] rather than half-applied.
//! - [`ConfigWatcher`]: reload on change, debounced, published atomically.
//!
//! # What the engine consumes, and what it does not yet
//!
//! The inheritance strategy of each rule ([`Inherit`](tokengate::Inherit) from
//! [`Inheritance`], which a [`tokengate::LiveBucket`], a [`tokengate::LeasedBucket`] on
//! its local pool and a [`tokengate::KeyedLimiter`] apply when reconfigured) goes into
//! the rules [`Config::rule_set`] builds
//! ([`Rule::inherit`](tokengate::scope::Rule::inherit)): a running
//! [`tokengate::ScopedLimiter`] given to [`ConfigWatcher::apply_to`] takes each reload in
//! place ([`ScopedLimiter::reconfigure`](tokengate::ScopedLimiter::reconfigure)), every
//! bucket carrying its tokens over with its rule's strategy; a file it cannot take in
//! place (a rule added or removed, new map bounds, leasing or class names) is refused
//! whole, the running configuration kept. Tiers and per-key overrides are built into the
//! engine's rules (an overridden key pays its tier's policies,
//! [`Config::policies_for`]); a reload may change the tiers and which keys are
//! overridden, each key whose tier changes carrying its tokens to its new tier with its
//! rule's strategy. Rules with
//! several policies ([`RuleConfig::policies`]) are built, each scope paying every one of
//! them all-or-nothing, except where the engine cannot hold them: more than
//! [`MAX_POLICIES_PER_RULE`](tokengate::scope::MAX_POLICIES_PER_RULE) policies, a leased
//! global rule, or a keyed rule with a shared overflow bucket ([`Config::unsupported`]
//! lists them, and [`Config::rule_set`] refuses the file). Shadow flags are consumed by the tower layer
//! ([`Config::shadow_kinds`]); the evidence figures (`normal_rate`,
//! `downstream_queue`) by `tokengate check-config`.
//!
//! ```
//! use tokengate_config::Config;
//!
//! let config = Config::from_toml(r#"
//!     [[rule]]
//!     name = "everyone"
//!     scope = "global"
//!     policies = [{ capacity = 1000, refill_per_second = 500 }]
//!
//!     [[rule]]
//!     name = "per-tenant"
//!     scope = "tenant"
//!     policies = ["20/s burst 100"]
//!     max_keys = 50000
//! "#)?;
//! assert_eq!(config.rules.len(), 2);
//! let limiter = config.rule_set()?.build()?;
//! assert!(limiter.class("anything").is_none());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    rust_2018_idioms
)]
#![doc(test(attr(deny(warnings))))]

mod build;
mod error;
mod model;
mod raw;
mod redis;
mod reload;
mod validate;

/// The README's sample configuration, checked by the tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

pub use build::Unsupported;
pub use error::{ConfigError, Location, Problem, ProblemKind};
pub use model::{
    COUNTER_BYTES, Config, Inheritance, LeaseSettings, MAX_OVERRIDES, MemoryBound, RuleConfig,
    Tier, WORD_BYTES,
};
pub use redis::{PasswordSource, RedisConfigError, RedisSection, Topology};
pub use reload::{ConfigWatcher, ReloadEvent, WatchError, WatchOptions};
