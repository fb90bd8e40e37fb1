//! Tiers and per-key overrides: named sets of policies some keys get instead of their
//! rule's, checked and laid out once when a rule set is built.
//!
//! Each keyed kind with overrides gets, per tier its keys use, its own maps (one per
//! policy of the tier, like a rule with several policies) holding at most the keys
//! overridden to that tier, and an immutable table from key to tier. A request of a kind
//! without overrides pays what it paid before: the empty table costs one predicted
//! branch. Each configuration of a running limiter has its own tables (see `maps`): a
//! reconfiguration that changes a kind's tiers or overrides lays out new ones and moves
//! the keys whose tier changes.

use std::collections::BTreeMap;

use crate::policy::Policy;
use crate::scope::decision::KindPolicies;
use crate::scope::kind::{PerKind, Scope, ScopeKind};
use crate::scope::rules::{MAX_POLICIES_PER_RULE, RuleError, RuleSet};

/// The most per-key overrides one rule set holds ([`RuleSet::override_key`]): the
/// override tables are built whole and kept for the limiter's life (one per distinct
/// layout a kind has had), and the tier maps hold at most one key per override, so this
/// bounds the memory each layout adds.
pub const MAX_OVERRIDES: usize = 100_000;

/// The most tiers one rule set defines ([`RuleSet::tier`]): a decision records each
/// kind's tier in a byte.
pub const MAX_TIERS: usize = 64;

/// A named set of policies, as given to [`RuleSet::tier`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TierDef {
    pub(crate) name: String,
    pub(crate) policies: Vec<Policy>,
}

/// One keyed kind's overrides, laid out: the tiers its keys use (the kind's tier `t`,
/// from 1, is `tiers[t - 1]`), and each overridden key with its kind-local tier.
#[derive(Clone, Debug, Default)]
pub(crate) struct KindTiers {
    /// Each used tier's name and policies, in the kind's local order.
    pub(crate) tiers: Vec<(String, KindPolicies)>,
    /// Every overridden key of the kind and its local tier (from 1).
    pub(crate) keys: Vec<(Scope, u8)>,
}

/// A kind's tiers without their policies: each used tier's name and number of
/// policies, and each overridden key's tier. Keys whose tiers keep their shape across a
/// reconfiguration keep their maps (whose policies may change in place).
pub(crate) type TierShape = (Vec<(String, usize)>, Vec<(Scope, u8)>);

impl KindTiers {
    /// The layout without its policies.
    pub(crate) fn shape(&self) -> TierShape {
        (
            self.tiers
                .iter()
                .map(|(name, p)| (name.clone(), p.as_slice().len()))
                .collect(),
            self.keys.clone(),
        )
    }
}

/// Checks the rule set's tiers and overrides and lays them out per kind.
///
/// # Errors
///
/// [`RuleError::TooManyTiers`], [`RuleError::TierPolicies`],
/// [`RuleError::TooManyOverrides`], [`RuleError::OverrideOnGlobal`],
/// [`RuleError::OverrideWithoutRule`], [`RuleError::UnknownTier`] and
/// [`RuleError::TierCostExceedsCapacity`].
pub(crate) fn lay_out(set: &RuleSet) -> Result<PerKind<KindTiers>, RuleError> {
    if set.tiers.len() > MAX_TIERS {
        return Err(RuleError::TooManyTiers {
            count: set.tiers.len(),
            max: MAX_TIERS,
        });
    }
    for t in &set.tiers {
        let count = t.policies.len();
        if count == 0 || count > MAX_POLICIES_PER_RULE {
            return Err(RuleError::TierPolicies {
                tier: t.name.clone(),
                count,
                max: MAX_POLICIES_PER_RULE,
            });
        }
    }
    if set.overrides.len() > MAX_OVERRIDES {
        return Err(RuleError::TooManyOverrides {
            count: set.overrides.len(),
            max: MAX_OVERRIDES,
        });
    }
    let mut out: PerKind<KindTiers> = Default::default();
    // Per kind, the local index of each used tier, by its position in `set.tiers`.
    let mut local: PerKind<BTreeMap<usize, u8>> = Default::default();
    for (scope, name) in &set.overrides {
        let kind = scope.kind();
        if kind == ScopeKind::Global {
            return Err(RuleError::OverrideOnGlobal);
        }
        if set.rules[kind.index()].is_none() {
            return Err(RuleError::OverrideWithoutRule { scope: *scope });
        }
        let Some(i) = set.tiers.iter().position(|t| &t.name == name) else {
            return Err(RuleError::UnknownTier {
                scope: *scope,
                tier: name.clone(),
            });
        };
        let k = kind.index();
        let next = out[k].tiers.len();
        let t = match local[k].get(&i) {
            Some(&t) => t,
            None => {
                let def = &set.tiers[i];
                let mut policies = [def.policies[0]; MAX_POLICIES_PER_RULE];
                policies[..def.policies.len()].copy_from_slice(&def.policies);
                out[k].tiers.push((
                    def.name.clone(),
                    KindPolicies {
                        policies,
                        len: def.policies.len(),
                        overflow: None,
                        // Counted below, one per key overridden to the tier.
                        max_keys: 0,
                    },
                ));
                // At most MAX_TIERS (64) tiers: the local index, from 1, fits a byte.
                let t = (next + 1) as u8;
                local[k].insert(i, t);
                t
            }
        };
        out[k].keys.push((*scope, t));
        if let Some((_, p)) = out[k].tiers.get_mut(usize::from(t) - 1) {
            p.max_keys += 1;
        }
    }
    for class in &set.classes {
        for kind in ScopeKind::ALL {
            let cost = class.cost_in(kind);
            for (name, p) in &out[kind.index()].tiers {
                let capacity = p.as_slice().iter().map(Policy::capacity).min().unwrap_or(0);
                if cost > capacity {
                    return Err(RuleError::TierCostExceedsCapacity {
                        class: class.name().to_owned(),
                        tier: name.clone(),
                        kind,
                        cost,
                        capacity,
                    });
                }
            }
        }
    }
    Ok(out)
}
