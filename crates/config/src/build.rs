//! The engine's rules from a validated configuration, for what the engine consumes today.

use std::fmt;

use tokengate::scope::{Rule, RuleSet};

use crate::model::Config;

/// Parts of a valid configuration the engine cannot enforce yet; building from it would
/// enforce something other than what the file says, so it is refused instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    /// One line per part, naming the rule or table.
    pub parts: Vec<String>,
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the engine does not enforce these parts of the configuration yet: ")?;
        f.write_str(&self.parts.join("; "))
    }
}

impl std::error::Error for Unsupported {}

impl Config {
    /// The parts of this configuration the engine does not enforce yet: rules with
    /// several policies, and per-key overrides (tiers). Empty when [`rule_set`] builds.
    ///
    /// [`rule_set`]: Config::rule_set
    pub fn unsupported(&self) -> Vec<String> {
        let mut parts: Vec<String> = self
            .rules
            .iter()
            .filter(|r| r.policies.len() > 1)
            .map(|r| {
                format!(
                    "rule {:?} has {} policies (one bucket per key holds one)",
                    r.name,
                    r.policies.len()
                )
            })
            .collect();
        if !self.overrides.is_empty() {
            parts.push(format!(
                "{} per-key overrides (keys get their rule's policy)",
                self.overrides.len()
            ));
        }
        parts
    }

    /// The engine's [`RuleSet`]: each rule's policy, map options and lease settings, and
    /// the work classes. Shadow rules are included: pass [`shadow_kinds`] to the layer
    /// (or skip them with `ScopedLimiter::try_acquire_without`), which decides them
    /// without refusing. The inheritance strategies and evidence figures are not part
    /// of a rule set.
    ///
    /// # Errors
    ///
    /// [`Unsupported`] when the file uses parts the engine does not enforce yet (see
    /// [`unsupported`](Config::unsupported)): nothing half-applies.
    ///
    /// ```
    /// use tokengate::scope::{Request, TenantId};
    /// use tokengate_config::Config;
    ///
    /// let config = Config::from_toml(r#"
    ///     [[rule]]
    ///     name = "per-tenant"
    ///     scope = "tenant"
    ///     policies = ["10/s burst 20"]
    ///
    ///     [[class]]
    ///     name = "search"
    ///     cost = 3
    /// "#)?;
    /// let limiter = config.rule_set()?.build()?;
    /// let search = limiter.class("search").unwrap();
    /// assert!(limiter.try_acquire(&Request::new().tenant(TenantId(1)), search)?.is_admitted());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// [`shadow_kinds`]: Config::shadow_kinds
    pub fn rule_set(&self) -> Result<RuleSet, Unsupported> {
        let parts = self.unsupported();
        if !parts.is_empty() {
            return Err(Unsupported { parts });
        }
        let mut set = RuleSet::new();
        for r in &self.rules {
            // Validation guarantees exactly one policy here.
            if let Some(&p) = r.policies.first() {
                let mut rule = Rule::new(p).options(r.options);
                if let Some(lease) = r.lease {
                    rule = rule.leased(lease.to_lease_config());
                }
                set = set.rule(r.kind, rule);
            }
        }
        for class in &self.classes {
            set = set.class(class.clone());
        }
        Ok(set)
    }
}
