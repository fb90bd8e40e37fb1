//! The engine's rules from a validated configuration, for what the engine consumes today.

use std::fmt;

use tokengate::keyed::Overflow;
use tokengate::scope::{MAX_POLICIES_PER_RULE, MAX_TIERS, Rule, RuleSet, ScopeKind};

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
    /// The parts of this configuration the engine does not enforce yet: rules or tiers
    /// with more than [`MAX_POLICIES_PER_RULE`] policies, more than [`MAX_TIERS`] tiers,
    /// and leasing or a shared overflow bucket on a rule with several policies. Empty
    /// when [`rule_set`] builds.
    ///
    /// [`rule_set`]: Config::rule_set
    pub fn unsupported(&self) -> Vec<String> {
        let mut parts = Vec::new();
        for r in self.rules.iter().filter(|r| r.policies.len() > 1) {
            let n = r.policies.len();
            if n > MAX_POLICIES_PER_RULE {
                parts.push(format!(
                    "rule {:?} has {n} policies (the engine holds at most \
                     {MAX_POLICIES_PER_RULE} per rule)",
                    r.name
                ));
            }
            if r.lease.is_some() {
                parts.push(format!(
                    "rule {:?} is leased with {n} policies (only a single-policy global \
                     rule can be leased)",
                    r.name
                ));
            }
            if r.kind != ScopeKind::Global
                && matches!(r.options.overflow_value(), Overflow::Share(_))
            {
                parts.push(format!(
                    "rule {:?} shares an overflow bucket with {n} policies (a key charged \
                     there would skip the rule's other limits)",
                    r.name
                ));
            }
        }
        for t in self.tiers.values() {
            let n = t.policies.len();
            if n > MAX_POLICIES_PER_RULE {
                parts.push(format!(
                    "tier {:?} has {n} policies (the engine holds at most \
                     {MAX_POLICIES_PER_RULE} per tier)",
                    t.name
                ));
            }
        }
        if self.tiers.len() > MAX_TIERS {
            parts.push(format!(
                "{} tiers (the engine holds at most {MAX_TIERS})",
                self.tiers.len()
            ));
        }
        parts
    }

    /// The engine's [`RuleSet`]: each rule's policies (all paid, all or nothing, with a
    /// refusal naming the limit that refused), map options and lease settings, the
    /// work classes, and the tiers with the per-key overrides (an overridden key pays
    /// its tier's policies instead of its rule's; a reload applied to a running limiter
    /// moves a key whose tier changed, its tokens carried with its rule's strategy).
    /// Shadow rules are included: pass [`shadow_kinds`] to the layer
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
    /// use tokengate::scope::{Request, Scope, ScopeKind, TenantId};
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
    ///
    /// // Several policies: every request pays both.
    /// let config = Config::from_toml(r#"
    ///     [[rule]]
    ///     name = "per-tenant"
    ///     scope = "tenant"
    ///     policies = ["10/s burst 20", "100/m"]
    /// "#)?;
    /// let limiter = config.rule_set()?.build()?;
    /// assert_eq!(limiter.policies(ScopeKind::Tenant).map(<[_]>::len), Some(2));
    ///
    /// // A tier for one tenant: it pays "100/s burst 200" instead.
    /// let config = Config::from_toml(r#"
    ///     [[rule]]
    ///     name = "per-tenant"
    ///     scope = "tenant"
    ///     policies = ["10/s burst 20"]
    ///
    ///     [tier.gold]
    ///     policies = ["100/s burst 200"]
    ///
    ///     [[override]]
    ///     scope = "tenant"
    ///     key = 42
    ///     tier = "gold"
    /// "#)?;
    /// let limiter = config.rule_set()?.build()?;
    /// let gold = limiter.policies_for(&Scope::Tenant(TenantId(42))).unwrap();
    /// assert_eq!(gold[0].capacity(), 200);
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
            // Validation guarantees at least one policy, and `unsupported` at most the
            // engine's maximum; should either fail, the file is refused, not half-built.
            let mut rule = Rule::with_policies(r.policies.clone())
                .map_err(|e| Unsupported {
                    parts: vec![format!("rule {:?}: {e}", r.name)],
                })?
                .options(r.options)
                .inherit(r.inheritance.into());
            if let Some(lease) = r.lease {
                rule = rule.leased(lease.to_lease_config());
            }
            if r.remote {
                rule = rule.remote();
            }
            set = set.rule(r.kind, rule);
        }
        for class in &self.classes {
            set = set.class(class.clone());
        }
        for t in self.tiers.values() {
            set = set.tier(t.name.clone(), t.policies.clone());
        }
        for (scope, tier) in &self.overrides {
            set = set.override_key(*scope, tier.clone());
        }
        Ok(set)
    }
}
