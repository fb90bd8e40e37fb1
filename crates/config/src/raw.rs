//! The file's shape as TOML gives it, every value with its span: unknown fields are
//! refused here; the meaning is checked in `validate`, which lists every problem.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::{Spanned, Value};

use crate::model::Inheritance;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFile {
    #[serde(default)]
    pub(crate) rule: Vec<Spanned<RawRule>>,
    #[serde(default)]
    pub(crate) class: Vec<Spanned<RawClass>>,
    #[serde(default)]
    pub(crate) tier: BTreeMap<Spanned<String>, Spanned<RawTier>>,
    #[serde(default, rename = "override")]
    pub(crate) overrides: Vec<Spanned<RawOverride>>,
    #[serde(default)]
    pub(crate) reload: Option<RawReload>,
    #[serde(default)]
    pub(crate) redis: Option<Spanned<RawRedis>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    pub(crate) name: Spanned<String>,
    pub(crate) scope: Spanned<String>,
    /// Policies stay TOML values here so that every invalid one is reported, not only the
    /// first.
    pub(crate) policies: Spanned<Vec<Spanned<Value>>>,
    pub(crate) max_keys: Option<Spanned<i64>>,
    pub(crate) shards: Option<Spanned<i64>>,
    pub(crate) overflow: Option<Spanned<Value>>,
    pub(crate) eviction: Option<Spanned<RawEviction>>,
    pub(crate) counters: Option<bool>,
    pub(crate) shadow: Option<bool>,
    pub(crate) lease: Option<Spanned<RawLease>>,
    pub(crate) inheritance: Option<Inheritance>,
    pub(crate) normal_rate: Option<Spanned<f64>>,
    pub(crate) downstream_queue: Option<Spanned<i64>>,
    pub(crate) remote: Option<Spanned<bool>>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawEviction {
    Lossless,
    Full,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLease {
    pub(crate) slots: Option<Spanned<i64>>,
    pub(crate) max_lease: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawClass {
    pub(crate) name: Spanned<String>,
    pub(crate) cost: Spanned<i64>,
    #[serde(default)]
    pub(crate) costs: BTreeMap<Spanned<String>, Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTier {
    pub(crate) policies: Spanned<Vec<Spanned<Value>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOverride {
    pub(crate) scope: Spanned<String>,
    pub(crate) key: Spanned<Value>,
    pub(crate) tier: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReload {
    pub(crate) inheritance: Option<Inheritance>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRedis {
    pub(crate) url: Spanned<String>,
    pub(crate) namespace: Option<Spanned<String>>,
    pub(crate) tls_ca_file: Option<Spanned<String>>,
    pub(crate) username: Option<Spanned<String>>,
    /// Refused: a secret written in the file. Any value; never read or shown.
    pub(crate) password: Option<Spanned<Value>>,
    pub(crate) password_env: Option<Spanned<String>>,
    pub(crate) password_file: Option<Spanned<String>>,
    pub(crate) exchange_timeout: Option<Spanned<String>>,
    pub(crate) connect_timeout: Option<Spanned<String>>,
    pub(crate) lease_ttl: Option<Spanned<String>>,
    pub(crate) fail_mode: Option<Spanned<String>>,
    pub(crate) instances: Option<Spanned<i64>>,
    pub(crate) wait_for_replicas: Option<Spanned<i64>>,
    pub(crate) wait_timeout: Option<Spanned<String>>,
    pub(crate) cluster_nodes: Option<Spanned<Vec<String>>>,
    pub(crate) sentinel_master: Option<Spanned<String>>,
    pub(crate) sentinels: Option<Spanned<Vec<String>>>,
}
