//! Reconfiguring a running [`ScopedLimiter`]: new policies for its rules and tiers and
//! new class costs, switched atomically, every bucket carrying its tokens over with its
//! rule's [`Inherit`] strategy. See [`ScopedLimiter::reconfigure`] and, for why a
//! request never sees half of each configuration, the `generation` module.

use std::hash::BuildHasher;

use crate::bucket::{Core, Sealable};
use crate::clock::Clock;
use crate::inherit::Inherit;
use crate::keyed::KeyedOptions;
use crate::leased::LeaseConfig;
use crate::live::{Reconfigured, Unseal, convert_sealed};
use crate::policy::Policy;
use crate::scope::ScopedLimiter;
use crate::scope::decision::PolicySet;
use crate::scope::generation::Generation;
use crate::scope::kind::{PerKind, ScopeKind};
use crate::scope::rules::{MAX_POLICIES_PER_RULE, Reshape, Rule, RuleError, RuleSet};
use crate::state::SEALED;

/// What a [`ScopedLimiter::reconfigure`] did.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ScopeReconfigured {
    /// The global scope's buckets, one per policy of its rule: what each held before
    /// and after the switch (empty when the global scope has no rule; for a leased
    /// global scope, its bucket, slots included, when its policy changes).
    pub global: Vec<Reconfigured>,
    /// Keyed maps switched (of the maps of each local keyed rule's policies and of each
    /// tier in use, those whose policy changed): each converts its keys on their first
    /// touch after the switch, as of the switch.
    pub maps: usize,
    /// The limiter's reconfigurations so far, this one included.
    pub reconfigurations: u64,
}

/// The parts of one kind's rule a reconfiguration may not change.
#[derive(Clone, Debug, PartialEq)]
struct RuleShape {
    len: usize,
    /// A local keyed kind's map options; for the global kind and remote kinds, only
    /// whether it counts.
    options: Option<KeyedOptions>,
    counters: bool,
    lease: Option<LeaseConfig>,
    remote: bool,
    /// The policies, where they may not change either: a remote kind's (its store
    /// holds them).
    fixed: Option<[Policy; MAX_POLICIES_PER_RULE]>,
}

impl RuleShape {
    fn of(kind: ScopeKind, rule: &Rule) -> RuleShape {
        let fixed = rule.remote;
        RuleShape {
            len: rule.policies().len(),
            // A remote kind has no map: its map options are unused.
            options: (kind != ScopeKind::Global && !rule.remote).then_some(rule.options),
            counters: rule.options.counters,
            lease: rule.lease,
            remote: rule.remote,
            fixed: fixed.then_some(rule.policies),
        }
    }
}

/// What a running limiter's rule set may not change: which maps exist, how each is
/// bounded, the classes' names and order.
#[derive(Debug)]
pub(super) struct Shape {
    rules: PerKind<Option<RuleShape>>,
    classes: Vec<String>,
}

impl Shape {
    pub(super) fn of(set: &RuleSet) -> Shape {
        Shape {
            rules: ScopeKind::ALL.map(|k| set.rules[k.index()].map(|r| RuleShape::of(k, &r))),
            classes: set.classes.iter().map(|c| c.name().to_owned()).collect(),
        }
    }

    /// Whether kind `k`'s rule keeps counters (a reconfiguration cannot change it).
    pub(super) fn counts(&self, k: usize) -> bool {
        self.rules
            .get(k)
            .and_then(Option::as_ref)
            .is_some_and(|r| r.counters)
    }

    /// The first difference that keeps `next` from replacing this shape in place.
    fn check(&self, next: &Shape) -> Result<(), Reshape> {
        for kind in ScopeKind::ALL {
            let k = kind.index();
            match (&self.rules[k], &next.rules[k]) {
                (None, None) => {}
                (Some(a), Some(b)) => {
                    if a.remote != b.remote {
                        return Err(Reshape::Remote { kind });
                    }
                    if a.len != b.len {
                        return Err(Reshape::PolicyCount {
                            kind,
                            was: a.len,
                            now: b.len,
                        });
                    }
                    if a.lease != b.lease {
                        return Err(Reshape::Lease);
                    }
                    if a.options != b.options || a.counters != b.counters {
                        return Err(Reshape::Options { kind });
                    }
                    if a.fixed != b.fixed {
                        return Err(Reshape::RemotePolicies { kind });
                    }
                }
                _ => return Err(Reshape::Kinds { kind }),
            }
        }
        if self.classes != next.classes {
            return Err(Reshape::Classes);
        }
        Ok(())
    }
}

impl<C: Clock + Clone, S: BuildHasher + Clone> ScopedLimiter<C, S> {
    /// Replaces the limiter's policies (of every rule and tier), its tiers and per-key
    /// overrides, and its classes' costs while it runs, carrying every bucket's tokens
    /// over with its rule's [`Inherit`] strategy ([`Rule::inherit`]; a tier's keys use
    /// their kind's rule's).
    ///
    /// `rules` is checked whole, as [`RuleSet::build`] checks it, and must have the
    /// running limiter's shape ([`Reshape`]): the same kinds with rules, each with as
    /// many policies, the same map options, leasing and remote kinds, and the same
    /// classes in the same order (whose costs may change). Tiers may be added, renamed,
    /// removed or given other policies, and keys overridden anew or no longer: a key
    /// whose tier changes (to or from its rule, or between tiers) moves its buckets to
    /// its new tier's maps, each converted from its old policy to the new one with its
    /// kind's strategy as of the switch reading, limit by limit (a limit the new tier
    /// lacks goes; one the old lacked starts as a new key's), while every map's barrier
    /// is held and before the new configuration is published: a request decides with
    /// the key's old buckets or its new ones, never both. A key without a bucket in
    /// its old maps (it never came, or its full bucket was evicted) starts in its new
    /// tier as a new key does there, as after a switch in place; a moved bucket that is
    /// full under a start-full policy is not kept either (it is a new key's bucket, as
    /// eviction knows). A key's counters move with it (or join the kind's evicted counts when
    /// its bucket is not kept). The rule's maps must have room for the keys moving back
    /// to them with a bucket (less the keys moving out): else [`Reshape::TierRoom`],
    /// checked under the barrier
    /// (so not by [`check_reconfigure`](ScopedLimiter::check_reconfigure)); a kind's
    /// tier maps are laid out anew when its tiers change (costing the overridden keys'
    /// buckets, at most [`MAX_OVERRIDES`](crate::scope::MAX_OVERRIDES), under the
    /// barrier), and switched in place when only their policies change. Remote kinds keep their
    /// policies (their store holds them); a leased global scope is switched as
    /// [`LeasedBucket::reconfigure`](crate::LeasedBucket::reconfigure) switches it (its
    /// slots' tokens join the converted balance), before the new configuration is
    /// published, and a request of the old configuration that reaches its new epoch
    /// starts again. Anything else is refused with a typed error
    /// and changes nothing: build a new limiter for it.
    ///
    /// The switch is atomic: every request is decided wholly on the old configuration
    /// (classes, policies, buckets) or wholly on the new, never half of each. It holds
    /// every keyed map's shard locks for a moment (a barrier: the keyed requests under
    /// way finish first, and new ones wait; constant in the number of keys), seals the
    /// plain global words, reads the clock once per bucket set, converts the global
    /// words and publishes the new configuration; each keyed map then converts a key's
    /// buckets on their first touch, as of the switch (as
    /// [`KeyedLimiter::reconfigure`](crate::KeyedLimiter::reconfigure) does), however
    /// late that is. A request holding no lock that meets a sealed word writes nothing
    /// there, gives back what it took, and starts again on the new configuration. Each
    /// bucket then holds what [`inherit::convert`](crate::inherit::convert) promises (never more than its
    /// strategy's balance), and admits under the new policy from there.
    ///
    /// Tokens taken before a switch and given back after it ([`refund`](ScopedLimiter::refund)
    /// of a [`Charge`](crate::scope::Charge) paid under the old configuration, a
    /// reservation cancelled, a request rolled back when another of its buckets met a
    /// seal or the remote store refused) are converted by the switch's strategy, in whole
    /// tokens rounded down: proportional gives back `cost * B' / B`, as is and additive
    /// `cost`, reset nothing (the switch forgot the take), an unchanged policy `cost`. So
    /// a take and its give-back across a switch leave each bucket where the switch alone
    /// would have (up to a token less), except where the switch's cap or floor bound: as
    /// is capped at `B'`, or additive shrunk to zero, may have made less of the take
    /// than `cost`, and the give-back then credits up to `cost` more than the switch
    /// alone would have left (never above the capacity). A key's give-back is
    /// converted with the key's tier in each configuration (`cost * B' / B` between its
    /// old tier's capacity and its new one's, nothing for a limit it did not pay), and
    /// made on the maps of the configuration it was converted for, checked under the
    /// key's lock: one that a switch overtakes is converted again and goes to the key's
    /// new maps. A global give-back racing a further switch is converted up to the
    /// configuration it read.
    ///
    /// Rules and tiers whose policies do not change keep their buckets untouched,
    /// whatever their strategy (a reload that changed a comment refills nothing); a rule
    /// set equal to the running one switches nothing. Concurrent reconfigurations are
    /// applied one after the other. A replaced generation (its number, links and global
    /// words) stays linked for the next 16 switches, so that a charge paid on it is
    /// converted through every switch since; a charge or reservation paid more than 16
    /// switches before its give-back gives nothing back (less than the bound allows,
    /// never more; a charge keeps its generation's number modulo 2^32, so one kept
    /// unrefunded across 2^32 switches could be taken for a recent one's). Older generations are freed once no request can still hold them.
    /// What is kept until the limiter is dropped is each distinct configuration's
    /// policies and classes (about 6 KiB for a switch to policies the limiter never had,
    /// stored as the switch publishes: a refused one stores none; a switch back to one
    /// it had shares it) and each distinct tier layout's table
    /// (tiers and overridden keys: about 8 KiB for one overridden key, 73 KiB for 1,000
    /// keys in 4 tiers of 2 limits; one back to a layout it had fills that table's
    /// emptied maps again). A service flipping between a few configurations keeps a flat
    /// amount however often it switches; one pushing configurations it never had before,
    /// over and over, grows by theirs and should build a new limiter now and then. The remote store given with `rules`,
    /// if any, is not used: the limiter keeps the store it was built with.
    ///
    /// ```
    /// use tokengate::{Inherit, ManualClock, Policy, scope::*};
    ///
    /// let rules = |global: u64, tenant: u64, cost: u64| -> Result<RuleSet, tokengate::PolicyError> {
    ///     Ok(RuleSet::new()
    ///         .rule(ScopeKind::Global, Rule::new(Policy::new(global, 10.0)?).inherit(Inherit::AsIs))
    ///         .rule(ScopeKind::Tenant, Rule::new(Policy::new(tenant, 1.0)?).inherit(Inherit::Additive))
    ///         .class(WorkClass::new("read", cost)))
    /// };
    /// let limiter = rules(100, 10, 1)?.build_with_clock(ManualClock::new())?;
    /// let read = limiter.class("read").unwrap();
    /// let request = Request::new().tenant(TenantId(7));
    /// for _ in 0..10 {
    ///     assert!(limiter.try_acquire(&request, read)?.is_admitted());
    /// }
    /// assert!(limiter.try_acquire(&request, read)?.is_rejected()); // tenant 7 is empty
    ///
    /// let done = limiter.reconfigure(rules(50, 30, 2)?)?;
    /// assert_eq!(done.global[0].before, 90.0);
    /// assert_eq!(done.global[0].after, 50.0); // as is, capped at the new capacity
    /// assert_eq!(limiter.available(&Scope::Tenant(TenantId(7))), Some(20.0)); // 0 + (30 - 10)
    /// assert_eq!(limiter.work_class(read).unwrap().cost_in(ScopeKind::Global), 2); // the same class, its new cost
    /// assert!(limiter.try_acquire(&request, read)?.is_admitted());
    /// assert_eq!(limiter.available(&Scope::Global), Some(48.0));
    ///
    /// // Another shape is refused whole, and nothing changes.
    /// let more = rules(50, 30, 2)?.rule(ScopeKind::User, Rule::new(Policy::new(5, 1.0)?));
    /// assert_eq!(
    ///     limiter.reconfigure(more).unwrap_err(),
    ///     RuleError::Reshape(Reshape::Kinds { kind: ScopeKind::User })
    /// );
    /// assert_eq!(limiter.policy(ScopeKind::Tenant).unwrap().capacity(), 30);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// What [`RuleSet::build`] refuses, and [`RuleError::Reshape`] for a rule set of
    /// another shape. Nothing changes.
    pub fn reconfigure(&self, rules: RuleSet) -> Result<ScopeReconfigured, RuleError> {
        let _one = self
            .switching
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (tiers, policies) = rules.check()?;
        self.shape
            .check(&Shape::of(&rules))
            .map_err(RuleError::Reshape)?;
        self.check_leased(&policies)?;
        let inherit: PerKind<Inherit> = ScopeKind::ALL
            .map(|k| rules.rules[k.index()].map_or(Inherit::Proportional, |r| r.inherit));
        let old = self.generation();
        let same_tiers = ScopeKind::ALL.into_iter().all(|kind| {
            self.maps
                .switchable(kind)
                .is_none_or(|m| m.same_tiers(&old, &tiers[kind.index()]))
        });
        if same_tiers && *old.policies() == policies && *old.classes() == rules.classes[..] {
            // Nothing to switch: no bucket changes, and no generation is kept for it.
            return Ok(ScopeReconfigured {
                global: Vec::new(),
                maps: 0,
                reconfigurations: old.number,
            });
        }
        let global_inherit = inherit[ScopeKind::Global.index()];
        let global_policies: Vec<Policy> = policies
            .get(ScopeKind::Global.index(), 0)
            .map(|p| p.as_slice().to_vec())
            .unwrap_or_default();
        // Allocated before the barrier and the seals: between the seals and the
        // publication, only arithmetic.
        let (config, new_config) = self.generations.intern(policies, rules.classes);
        let mut next = crate::epoch::Next::new(Generation::new(
            old.number + 1,
            Box::new([]),
            config,
            old.global_single,
            inherit,
            old.tables,
        ));
        let mut words: Vec<Core<Sealable>> = Vec::with_capacity(old.words.len());
        let mut unseals: Vec<Unseal<'_>> = Vec::with_capacity(old.words.len());
        let mut report = Vec::with_capacity(old.words.len());

        // The barrier: every keyed map's, in the lock order (kind, then policy, then
        // tier), so that no request holding a map's lock is under way from here on;
        // each kind checks that its keys moving back from tiers fit. Then the new tier
        // tables, once no kind can refuse.
        let mut held = Vec::new();
        for kind in ScopeKind::ALL {
            if let Some(m) = self.maps.switchable(kind) {
                held.push((kind, m.begin_switch(&old, &tiers[kind.index()])?));
            }
        }
        for (kind, s) in &mut held {
            s.lay_out()?;
            next.tables[kind.index()] = s.table();
        }
        // Seal the plain global words: a request holding no lock that reaches one now
        // writes nothing there and starts again on the new generation.
        for core in old.words.iter() {
            let word = if mutant!(SCOPED_SWITCH_SKIPS_SEAL) {
                core.raw().load()
            } else {
                core.raw().seal()
            };
            // Only this switch seals (one at a time, under `switching`).
            debug_assert_ne!(word, SEALED);
            // Should anything below unwind (a clock that panics), the words are
            // unsealed again and the old generation stays current.
            unseals.push(Unseal {
                raw: core.raw(),
                word,
            });
        }
        // Read after the seals: not earlier than any reading stored in the words.
        let now = self.clock.now_nanos();
        for ((core, unseal), &policy) in old.words.iter().zip(&unseals).zip(&global_policies) {
            let unchanged = *core.policy() == policy;
            let how = if unchanged {
                Inherit::AsIs
            } else {
                global_inherit
            };
            let from = core.policy().layout();
            let (word, mut done) =
                convert_sealed(from, core.passes(), unseal.word, now, &policy, how);
            if unchanged {
                // The word is carried over untouched, whatever the strategy.
                words.push(Core::carried(core, unseal.word, now));
                done.after = done.before;
            } else {
                words.push(Core::new(policy, now, Some(word)));
            }
            report.push(done);
        }
        next.words = words.into_boxed_slice();
        if let (Some(b), Some(&policy)) = (self.leased(), global_policies.first()) {
            // Switched before the new generation is published: a request of the old
            // one that reaches the new epoch finds its epoch gone and starts again.
            if b.policy() != policy {
                let r = b
                    .reconfigure(policy, global_inherit)
                    .map_err(RuleError::Lease)?;
                report.push(r);
            }
            next.leased_epoch = b.epoch_id();
        }
        // Keys changing tiers move (converted as of the same reading) before the new
        // generation, which routes them to their new maps, is published, and after
        // everything that may fail or unwind (the leased switch reads a clock): the
        // moves empty the old maps, and cannot be undone.
        for (kind, s) in &mut held {
            if let Some(rule) = next.policies().rules[kind.index()].as_ref() {
                s.move_keys(rule, inherit[kind.index()], now);
            }
        }
        let retiring = self.generations.publish(&old, next, new_config);
        for unseal in unseals {
            std::mem::forget(unseal);
        }
        // The maps' new policies from the same reading, while every barrier is still
        // held; each lets its own go once switched. Nothing from here reads a clock.
        let current = self.generations.current_while(&old);
        let mut maps = 0;
        for (kind, s) in held {
            let k = kind.index();
            if let Some(rule) = current.policies().rules[k].as_ref() {
                maps += s.finish(rule, &current.policies().tiers[k], inherit[k], now);
            }
        }
        let reconfigurations = current.number;
        // The generation that left the window is retired once no request waits on a
        // barrier, and after this thread's own pin ends (which it need not wait for).
        drop(old);
        drop(retiring);
        Ok(ScopeReconfigured {
            global: report,
            maps,
            reconfigurations,
        })
    }

    /// Whether [`reconfigure`](ScopedLimiter::reconfigure) would take `rules`, without
    /// changing anything: the checks it makes before switching.
    ///
    /// # Errors
    ///
    /// As [`reconfigure`](ScopedLimiter::reconfigure).
    pub fn check_reconfigure(&self, rules: &RuleSet) -> Result<(), RuleError> {
        let (_, policies) = rules.check()?;
        self.shape
            .check(&Shape::of(rules))
            .map_err(RuleError::Reshape)?;
        self.check_leased(&policies)
    }

    /// Whether the leased global bucket (if any) takes the global rule's policy in
    /// `policies`: a fixed lease must fit it.
    fn check_leased(&self, policies: &PolicySet) -> Result<(), RuleError> {
        match (self.leased(), policies.get(ScopeKind::Global.index(), 0)) {
            (Some(b), Some(p)) => b.check_policy(p.policy()).map_err(RuleError::Lease),
            _ => Ok(()),
        }
    }

    /// How many times the limiter was reconfigured.
    pub fn reconfigurations(&self) -> u64 {
        self.generation().number
    }

    /// The configurations this limiter has had, the current one included. Only the
    /// current one and the 16 it replaced last are kept (a refund paid on one of them
    /// is converted through every switch since; one paid earlier gives nothing back),
    /// and each distinct set of policies and classes the limiter has had.
    pub fn generations(&self) -> usize {
        self.generations.count()
    }

    /// Generations replaced and no longer kept that a request may still hold, not yet
    /// freed (for tests and diagnostics): a handful at most.
    #[doc(hidden)]
    pub fn retired_generations(&self) -> usize {
        self.generations.retired()
    }

    /// The distinct configurations (policies and classes) the limiter has had, each
    /// kept until it is dropped (for tests and diagnostics).
    #[doc(hidden)]
    pub fn stored_configurations(&self) -> usize {
        self.generations.configs()
    }
}
