//! The validated configuration: what a file means once every check has passed.

use std::collections::BTreeMap;

use serde::Deserialize;
use tokengate::Policy;
use tokengate::keyed::KeyedOptions;
use tokengate::scope::{Scope, ScopeKind, WorkClass};

/// How a bucket's tokens carry over when its policy changes on reload.
///
/// The file names the strategy (`[reload] inheritance`, or per rule); the engine applies
/// it ([`tokengate::Inherit`], through `From`) to a `LiveBucket`, a `LeasedBucket` or a
/// `KeyedLimiter` it reconfigures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Inheritance {
    /// The same fraction of the new capacity (the default).
    #[default]
    Proportional,
    /// The same tokens, capped at the new capacity.
    AsIs,
    /// The new policy's start state (full or empty).
    Reset,
    /// A capacity grown by `d` adds `d` tokens (and a shrunk one removes them, down to
    /// zero).
    Additive,
}

impl From<Inheritance> for tokengate::Inherit {
    fn from(i: Inheritance) -> tokengate::Inherit {
        match i {
            Inheritance::Proportional => tokengate::Inherit::Proportional,
            Inheritance::AsIs => tokengate::Inherit::AsIs,
            Inheritance::Reset => tokengate::Inherit::Reset,
            Inheritance::Additive => tokengate::Inherit::Additive,
        }
    }
}

impl Inheritance {
    /// The name used in files: `proportional`, `as_is`, `reset`, `additive`.
    pub fn name(self) -> &'static str {
        match self {
            Inheritance::Proportional => "proportional",
            Inheritance::AsIs => "as_is",
            Inheritance::Reset => "reset",
            Inheritance::Additive => "additive",
        }
    }
}

/// The global rule's lease settings, as given (defaults where absent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Number of slots, if given.
    pub slots: Option<usize>,
    /// Largest lease in tokens, if given.
    pub max_lease: Option<u64>,
}

impl LeaseSettings {
    /// The engine's configuration.
    pub fn to_lease_config(self) -> tokengate::leased::LeaseConfig {
        let mut c = tokengate::leased::LeaseConfig::new();
        if let Some(s) = self.slots {
            c = c.slots(s);
        }
        if let Some(m) = self.max_lease {
            c = c.max_lease(m);
        }
        c
    }
}

/// One validated rule: how one scope kind is limited.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RuleConfig {
    /// The rule's name (unique in the file), for logs and reports.
    pub name: String,
    /// The scope kind it limits (one rule per kind).
    pub kind: ScopeKind,
    /// Its policies, at least one: a request must pass all of them.
    pub policies: Vec<Policy>,
    /// The keyed map's bounds (defaults for the global rule).
    pub options: KeyedOptions,
    /// Lease settings: the global rule only.
    pub lease: Option<LeaseSettings>,
    /// Shadow mode: decide and count, never refuse.
    pub shadow: bool,
    /// How tokens carry over when this rule's policies change on reload.
    pub inheritance: Inheritance,
    /// Tokens per second the scope sees in normal legitimate traffic (per key for
    /// keyed kinds), if the file gives it: evidence for `check-config`.
    pub normal_rate: Option<f64>,
    /// Tokens a downstream queue absorbs as a burst, if the file gives it.
    pub downstream_queue: Option<u64>,
    /// `remote = true`: enforced through the fleet's budget in Redis (the `[redis]`
    /// section), after the local scopes ([`Config::remote_store`]).
    pub remote: bool,
}

/// Bytes of a keyed map entry besides its key: the bare bucket word.
pub const WORD_BYTES: usize = 8;

/// Bytes of per-key counters, when they are on (see `KeyedOptions::counters`).
pub const COUNTER_BYTES: usize = 64;

/// The memory bound of a keyed scope: its most keys times the most bytes a key costs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryBound {
    /// The most keys the map holds.
    pub max_keys: usize,
    /// Bytes of one key's entries: key and bucket word per policy's map, counters
    /// (once) when on.
    pub entry_bytes: usize,
    /// The most bytes a key costs in a hashbrown table: the entry and its control byte,
    /// over the lowest load a table has just after growing (7/16).
    pub bytes_per_key: f64,
    /// `max_keys * bytes_per_key`.
    pub total_bytes: f64,
}

impl RuleConfig {
    /// The smallest capacity among the rule's policies.
    pub fn min_capacity(&self) -> u64 {
        self.policies
            .iter()
            .map(Policy::capacity)
            .min()
            .unwrap_or(0)
    }

    /// The memory bound of a keyed rule (`None` for the global rule).
    ///
    /// The figure the keyed map documents: an entry is the key and the 8-byte word
    /// (plus 64 bytes of counters), in hashbrown tables at most 7/8 and, just after
    /// growing, 7/16 full, one control byte per slot: at most `(entry + 1) * 16 / 7`
    /// bytes per key (38.9 for `u64` keys), excluding the fixed cost of the shards. With
    /// several policies per rule the engine keeps one map per policy: each further
    /// policy adds an entry of the key and its word (the counters are kept once), and
    /// `entry_bytes` is the sum over the maps.
    pub fn memory_bound(&self) -> Option<MemoryBound> {
        if self.kind == ScopeKind::Global {
            return None;
        }
        let maps = self.policies.len().max(1);
        let counters = if self.options.counters_on() {
            COUNTER_BYTES
        } else {
            0
        };
        let entry_bytes = maps * (self.kind.key_bytes() + WORD_BYTES) + counters;
        // One control byte per map's slot.
        let bytes_per_key = (entry_bytes + maps) as f64 * 16.0 / 7.0;
        let max_keys = self.options.max_keys_value();
        Some(MemoryBound {
            max_keys,
            entry_bytes,
            bytes_per_key,
            total_bytes: max_keys as f64 * bytes_per_key,
        })
    }
}

/// A named set of policies given to some keys instead of their rule's.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Tier {
    /// The tier's name.
    pub name: String,
    /// Its policies, at least one.
    pub policies: Vec<Policy>,
}

/// The most overrides one file may hold: the engine's bound
/// ([`tokengate::scope::MAX_OVERRIDES`]). The table is built whole with the limiter and
/// bounds the memory of the tiers' maps; a bound keeps it from growing into a database.
pub const MAX_OVERRIDES: usize = tokengate::scope::MAX_OVERRIDES;

/// A validated deployment configuration: every check passed, nothing left to refuse.
///
/// Read one with [`Config::from_file`] or [`Config::from_toml`]; build the engine's
/// rules from it with [`Config::rule_set`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// The rules, in file order, one per scope kind.
    pub rules: Vec<RuleConfig>,
    /// The work classes, in file order.
    pub classes: Vec<WorkClass>,
    /// The tiers, by name.
    pub tiers: BTreeMap<String, Tier>,
    /// Per-key overrides: a key's scope and the tier it gets (at most
    /// [`MAX_OVERRIDES`]). Every other key gets its rule's policies.
    pub overrides: BTreeMap<Scope, String>,
    /// The default inheritance strategy on reload (`[reload] inheritance`).
    pub inheritance: Inheritance,
    /// The `[redis]` section, if the file has one.
    pub redis: Option<crate::redis::RedisSection>,
}

impl Config {
    /// The rule for `kind`, if any.
    pub fn rule(&self, kind: ScopeKind) -> Option<&RuleConfig> {
        self.rules.iter().find(|r| r.kind == kind)
    }

    /// The policies `scope`'s bucket gets: its tier's when it has an override, else its
    /// kind's rule's; `None` when the kind has no rule.
    pub fn policies_for(&self, scope: &Scope) -> Option<&[Policy]> {
        let rule = self.rule(scope.kind())?;
        match self.overrides.get(scope).and_then(|t| self.tiers.get(t)) {
            Some(tier) => Some(&tier.policies),
            None => Some(&rule.policies),
        }
    }

    /// The kinds whose rules are in shadow mode (decided and counted, never refusing):
    /// what the tower layer's `shadow_scope` takes.
    pub fn shadow_kinds(&self) -> Vec<ScopeKind> {
        self.rules
            .iter()
            .filter(|r| r.shadow)
            .map(|r| r.kind)
            .collect()
    }
}
