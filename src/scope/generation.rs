//! A scoped limiter's configuration over time: what a request is decided with (the work
//! classes, every kind's policies, the plain global scope's words, each keyed kind's
//! tier table), one *generation* per reconfiguration.
//!
//! A request loads the current generation once and is decided on it alone. A
//! reconfiguration ([`ScopedLimiter::reconfigure`](super::ScopedLimiter::reconfigure))
//! holds every keyed map's barrier (all their shard write locks, in the lock order),
//! seals the old generation's global words, reads the clock, converts them, publishes
//! the new generation and switches the maps' policies, then lets the barriers go. So:
//!
//! * a request holding a map's lock cannot meet a switch: it took its locks either
//!   before the barrier (the switch waits for it, and it decides wholly on the old
//!   generation) or after (wholly on the new);
//! * a request holding no lock (it pays the global scope alone) decides on the old
//!   generation's words before their seal, or finds one sealed, writes nothing there,
//!   gives back what it took elsewhere, and starts again on the new generation.
//!
//! Either way a decision reads one generation's classes and policies, and its buckets
//! are that generation's.
//!
//! # What is kept, and for how long
//!
//! Generations live in a freeing chain (`Chain<Generation, Freed>`, `src/epoch.rs`):
//! every operation pins the current one once (a request, a refund, a read) and reads
//! nothing of it after the pin ends. The current generation and the
//! [`KEPT_GENERATIONS`] (16) it replaced last stay linked behind it; a switch retires
//! the one that leaves that window, freed once no pin can still hold it. So:
//!
//! * a decision does not borrow from its generation: its policies and class costs are
//!   read from the limiter's store of configurations ([`Generations::intern`]), which
//!   keeps each distinct set of policies and classes once, until the limiter is
//!   dropped (a switch to one it had before reuses it). Memory grows with the distinct
//!   configurations a limiter has had, not with its switches; tier tables are the
//!   kinds' (one per distinct layout: see `maps`). A decision names its generation by
//!   a 32-bit tag;
//! * a charge or reservation paid on a generation still in the window is given back
//!   through every switch since ([`carried`]: each switch's strategy, the key's tier in
//!   each generation); one paid earlier than that gives nothing back (its generation,
//!   and what the switches made of the cost, are gone): less than the bound allows,
//!   never more;
//! * a request that finds a global word sealed waits for the successor
//!   ([`Generations::await_successor`]) and starts again on the current generation; a
//!   give-back that finds one sealed follows the successor links, within its pin (each
//!   successor was published after the pinned generation was loaded, so its
//!   retirement waits for that pin).

use std::mem::MaybeUninit;
use std::ptr;
use std::time::Duration;

use crate::bucket::{Core, SEALED_ERROR, Sealable, Sealed};
use crate::clock::{Clock, Monotonic};
use crate::decision::Decision;
use crate::epoch::{Chain, Freed, Held, Kept, Linked, Next, Pinned, Retiring, Successor};
use crate::error::AcquireError;
use crate::inherit::Inherit;
use crate::multi::{Member, Planned, Prepared, sealed};
use crate::scope::decision::{self, Policies, PolicySet, Tag};
use crate::scope::kind::{PerKind, ScopeKind};
use crate::scope::maps::TableRef;
use crate::scope::rules::WorkClass;
use crate::state::SEALED;
use crate::telemetry::CounterRef;

/// One configuration of a scoped limiter.
pub(super) struct Generation {
    /// 0 at build, one more per reconfiguration.
    pub(super) number: u64,
    /// The plain global scope's words, one per policy of its rule, in its order (empty
    /// when the global scope has no rule or is leased: see `leased_epoch`).
    pub(super) words: Box<[Core<Sealable>]>,
    /// Its classes and policies, in the limiter's store of configurations
    /// ([`Generations::intern`]).
    config: ConfigRef,
    /// Whether the global scope has one bucket: a request paying no keyed scope then
    /// pays it directly, without the multi-bucket path.
    pub(super) global_single: bool,
    /// The strategy each kind's buckets were carried over with into this generation.
    pub(super) inherit: PerKind<Inherit>,
    /// Each keyed kind's tier table (see `maps`): which keys are overridden to which
    /// tier, and the tiers' maps.
    pub(super) tables: PerKind<TableRef>,
    /// The epoch of the leased global bucket this generation decides with
    /// ([`LeasedBucket::epoch_id`](crate::LeasedBucket)); 0 when not leased.
    pub(super) leased_epoch: usize,
    /// The generation that replaced this one, once published.
    next: Successor<Generation>,
    /// Under loom: read on every pin of the generation, written by its drop, so that the
    /// model reports a free that no synchronization orders after a read.
    #[cfg(loom)]
    probe: crate::sync::Probe,
}

/// A configuration's classes and policy set: what a decision borrows, for the
/// limiter's life.
#[derive(Debug, PartialEq)]
pub(super) struct Config {
    pub(super) policies: PolicySet,
    pub(super) classes: Box<[WorkClass]>,
}

/// A generation's [`Config`], in the store of the limiter's configurations.
#[derive(Clone, Copy)]
pub(super) struct ConfigRef(Held<Config>);

impl ConfigRef {
    /// The configuration, for as long as `owner` (a generation, or the limiter's
    /// [`Generations`]) is borrowed.
    #[inline(always)]
    fn get<T>(self, owner: &T) -> &Config {
        let _ = owner;
        // SAFETY: a `ConfigRef` is made only by a `Generations` (`new`, `intern`), of a
        // configuration in its store or of one that `intern` allocated for the one
        // generation that holds it, stored when that generation is published (and
        // dropped, unread, after it when a switch fails). It is held only by that
        // `Generations`' generations (or the one a switch is building), so `owner` is
        // borrowed from that `Generations`, whose store is dropped after its chain of
        // generations (field order): the configuration lives while `owner` is
        // borrowed.
        unsafe { self.0.get() }
    }
}

// SAFETY: `next` is a field of the generation.
unsafe impl Linked for Generation {
    fn successor(&self) -> &Successor<Generation> {
        &self.next
    }
}

impl Generation {
    pub(super) fn new(
        number: u64,
        words: Box<[Core<Sealable>]>,
        config: ConfigRef,
        global_single: bool,
        inherit: PerKind<Inherit>,
        tables: PerKind<TableRef>,
    ) -> Generation {
        Generation {
            number,
            words,
            config,
            global_single,
            inherit,
            tables,
            leased_epoch: 0,
            next: Successor::new(),
            #[cfg(loom)]
            probe: crate::sync::Probe::new(),
        }
    }

    /// Its policy set.
    #[inline(always)]
    pub(super) fn policies(&self) -> &PolicySet {
        &self.config.get(self).policies
    }

    /// Its classes.
    #[inline(always)]
    pub(super) fn classes(&self) -> &[WorkClass] {
        &self.config.get(self).classes
    }

    /// Reports the access to the model (nothing outside loom).
    #[inline(always)]
    fn touch(&self) {
        #[cfg(loom)]
        self.probe.read();
    }

    /// Whether a reconfiguration has sealed one of this generation's words and has
    /// neither published a successor nor unsealed it (a switch that unwound).
    fn sealing(&self) -> bool {
        self.words.iter().any(|c| c.raw().load() == SEALED)
    }

    /// The generation that replaced this one, waiting for it while a switch is between
    /// sealing this one's words and publishing it; `None` when no switch is under way
    /// (the word that was found sealed was unsealed again: retry on this one).
    fn successor(&self) -> Option<&Generation> {
        let mut spins = 0u32;
        loop {
            if let Some(next) = self.next.get() {
                return Some(next);
            }
            if !self.sealing() {
                return None;
            }
            crate::sync::spin(&mut spins);
        }
    }
}

/// How many replaced generations stay linked behind the current one, for a refund or a
/// cancelled reservation paid on one of them to be converted through every switch since
/// (older ones are freed once no request holds them; a give-back paid on one gives
/// nothing back).
pub(super) const KEPT_GENERATIONS: u64 = if cfg!(loom) {
    // Three switches retire a generation in a model; a give-back two switches after its
    // payment (the scoped models' most) still finds its generation.
    2
} else {
    16
};

/// The chain of a limiter's generations: the current one and the
/// [`KEPT_GENERATIONS`] it replaced last, each linked to its successor; and the store of
/// the configurations they had.
pub(super) struct Generations {
    /// Dropped before `configs`, from which its generations borrow.
    chain: Chain<Generation, Freed>,
    /// Every distinct configuration the limiter has had, kept until it is dropped:
    /// decisions borrow their policies and class costs from here, for the limiter's
    /// life. A switch to a configuration it had before reuses that one's.
    configs: Chain<Config, Kept>,
}

impl Generations {
    /// The chain of the first generation, `first` made with the configuration of
    /// `policies` and `classes`.
    pub(super) fn new(
        policies: PolicySet,
        classes: Vec<WorkClass>,
        first: impl FnOnce(ConfigRef) -> Generation,
    ) -> Generations {
        let configs = Chain::new(Config {
            policies,
            classes: classes.into_boxed_slice(),
        });
        let config = ConfigRef(configs.find(|_| true).expect("a chain has its first epoch"));
        Generations {
            chain: Chain::freeing_keeping(first(config), KEPT_GENERATIONS),
            configs,
        }
    }

    /// The configuration of `policies` and `classes` as a new generation holds it: the
    /// stored one when the limiter had it before, else a new one, allocated here and
    /// stored only when the generation is published ([`publish`](Generations::publish)
    /// takes it): a switch refused after this stores nothing. Callers serialize (the
    /// limiter's reconfiguration lock).
    pub(super) fn intern(
        &self,
        policies: PolicySet,
        classes: Vec<WorkClass>,
    ) -> (ConfigRef, Option<Next<Config>>) {
        if let Some(found) = self
            .configs
            .find(|c| c.policies == policies && *c.classes == classes[..])
        {
            return (ConfigRef(found), None);
        }
        let next = Next::new(Config {
            policies,
            classes: classes.into_boxed_slice(),
        });
        (ConfigRef(next.held()), Some(next))
    }

    /// `g`'s configuration, for as long as the limiter is borrowed. `g` is one of this
    /// limiter's published generations (pinned from its chain): its configuration is
    /// then in this store, which lives as long as the limiter. Not checked but in debug
    /// builds (a look-up on every request).
    #[inline(always)]
    pub(super) fn config(&self, g: &Generation) -> &Config {
        let config = g.config.get(self);
        debug_assert!(
            self.configs.iter().any(|c| std::ptr::eq(c, config)),
            "a generation of another limiter"
        );
        config
    }

    /// `g`'s policies as its decisions hold them, for as long as the limiter is borrowed
    /// (`g` as for [`config`](Generations::config)).
    #[inline(always)]
    pub(super) fn policies(&self, g: &Generation) -> Policies<'_> {
        Policies::new(g.number, &self.config(g).policies)
    }

    /// The current generation, held until the guard is dropped.
    #[inline(always)]
    pub(super) fn pin(&self) -> Pinned<'_, Generation> {
        let g = self.chain.pin();
        g.touch();
        g
    }

    /// [`pin`](Generations::pin), or `None` (having done nothing) when the calling
    /// thread has not pinned yet: for a hot path, which then starts again on a path
    /// that pins with [`pin`](Generations::pin).
    #[inline(always)]
    pub(super) fn try_pin(&self) -> Option<Pinned<'_, Generation>> {
        let g = self.chain.try_pin()?;
        g.touch();
        Some(g)
    }

    /// Whether `g` (held) is the current generation.
    #[inline(always)]
    pub(super) fn is_current(&self, g: &Generation) -> bool {
        self.chain.is_current(g)
    }

    /// The current generation, while the caller holds `held` (pinned).
    #[inline]
    pub(super) fn current_while<'a>(&'a self, held: &'a Generation) -> &'a Generation {
        let g = self.chain.current_while(held);
        g.touch();
        g
    }

    /// Waits until `g` is replaced, or until no switch is sealing it any more (one that
    /// unwound): a request that met a sealed word of `g` then starts again.
    #[cold]
    #[inline(never)]
    pub(super) fn await_successor(&self, g: &Generation) {
        self.chain.await_successor(g, Generation::sealing);
    }

    /// Publishes `next` after the current generation `old` (whose words the caller
    /// sealed), storing its configuration first when it is new (`config`, from
    /// [`intern`](Generations::intern)). The generation that leaves the window is
    /// retired when the guard returned is dropped. Callers serialize (the limiter's
    /// reconfiguration lock). Allocates nothing.
    pub(super) fn publish(
        &self,
        old: &Pinned<'_, Generation>,
        next: Next<Generation>,
        config: Option<Next<Config>>,
    ) -> Retiring<'_, Generation> {
        if let Some(config) = config {
            self.configs.push(config);
        }
        self.chain.replace_linked(old, next)
    }

    /// The generation tagged `tag`, if it is `current` (pinned) or one of the
    /// generations kept behind it.
    pub(super) fn find<'a>(
        &'a self,
        current: &'a Pinned<'_, Generation>,
        tag: Tag,
    ) -> Option<&'a Generation> {
        let back = decision::tag(current.number).wrapping_sub(tag);
        if u64::from(back) > KEPT_GENERATIONS {
            return None;
        }
        let g = self.chain.kept(current).nth(back as usize)?;
        g.touch();
        Some(g)
    }

    /// How many generations the limiter has had, the current one included.
    pub(super) fn count(&self) -> usize {
        usize::try_from(self.chain.count()).unwrap_or(usize::MAX)
    }

    /// Generations replaced, out of the window, and not yet freed (a pin may hold them).
    pub(super) fn retired(&self) -> usize {
        self.chain.retired()
    }

    /// Distinct configurations stored.
    pub(super) fn configs(&self) -> usize {
        self.configs.iter().count()
    }
}

/// What `cost` tokens taken from kind `k`'s bucket of limit `limit` under `from` (the
/// key then of local tier `tier_from`) are under `next`, the generation that replaced
/// it (the key now of `tier_next`): what the switch's strategy made of them, so that
/// giving them back after the switch leaves the bucket as if they had not been taken
/// before it. Whole tokens, rounded down: proportional, `cost * B' / B`; as is and
/// additive, `cost` (exact but where the switch's cap or floor bound; a refund is
/// capped at the capacity); reset, nothing (the switch forgot the take); an unchanged
/// policy, `cost`; a limit the key did not pay, or no longer has, nothing.
fn carry_hop(
    from: &Generation,
    next: &Generation,
    k: usize,
    (tier_from, tier_next): (u8, u8),
    limit: usize,
    cost: u64,
) -> u64 {
    let policy = |g: &Generation, tier| {
        g.policies()
            .get(k, tier)
            .and_then(|p| p.as_slice().get(limit).copied())
    };
    let (Some(a), Some(b)) = (policy(from, tier_from), policy(next, tier_next)) else {
        return 0;
    };
    if a == b {
        return cost;
    }
    match next.inherit.get(k).copied().unwrap_or(Inherit::AsIs) {
        Inherit::Proportional => {
            let scaled =
                u128::from(cost) * u128::from(b.capacity()) / u128::from(a.capacity().max(1));
            u64::try_from(scaled).unwrap_or(u64::MAX)
        }
        Inherit::AsIs | Inherit::Additive => cost,
        Inherit::Reset => 0,
    }
}

/// [`carry_hop`] through every switch from `from` to `to` (a later generation, or
/// `from` itself), with the key's local tier in each generation (`tier`; 0 for the
/// global kind).
pub(super) fn carried(
    from: &Generation,
    to: &Generation,
    k: usize,
    tier: &dyn Fn(&Generation) -> u8,
    limit: usize,
    mut cost: u64,
) -> u64 {
    let mut g = from;
    let mut t = tier(g);
    while !ptr::eq(g, to) && cost > 0 {
        let Some(next) = g.next.get() else {
            break;
        };
        let t_next = tier(next);
        cost = carry_hop(g, next, k, (t, t_next), limit, cost);
        g = next;
        t = t_next;
    }
    cost
}

/// Gives `cost` tokens back to the global word of limit `limit` of `g`, or, when a switch
/// has sealed it, to the same limit's word of the generation that replaced it, converted
/// by that switch's strategy ([`carry_hop`]): a take rolled back across a switch leaves
/// the words as if it had not been made. Capped at the capacity, as any refund.
pub(super) fn refund_global<C: Clock>(
    mut g: &Generation,
    limit: usize,
    clock: &Monotonic<C>,
    mut cost: u64,
    now: u64,
) {
    loop {
        let Some(core) = g.words.get(limit) else {
            return;
        };
        let layout = core.policy().layout();
        let units = layout.units_of(cost.min(layout.capacity())).unwrap_or(0);
        if units == 0 {
            return;
        }
        let now = clock.observe(now);
        match core.raw().refund_units(layout, clock, now, units) {
            Ok(()) => return,
            Err(Sealed) => {
                if let Some(next) = g.successor() {
                    cost = carry_hop(g, next, ScopeKind::Global.index(), (0, 0), limit, cost);
                    g = next;
                }
            }
        }
    }
}

/// Gives `cost` tokens back to the leased global bucket `bucket` on the epoch of
/// generation `g`, or, when a switch has replaced it, on the epoch of the generation
/// that replaced `g`, converted by that switch's strategy (as [`refund_global`]).
pub(super) fn refund_leased<C: Clock>(
    bucket: &crate::LeasedBucket<C>,
    mut g: &Generation,
    mut cost: u64,
    now: u64,
) {
    let mut spins = 0u32;
    loop {
        if cost == 0 || bucket.refund_exactly(g.leased_epoch, cost, now) {
            return;
        }
        let Some(next) = g.next.get() else {
            // The bucket is being switched (or was, and its generation is about to be
            // published), or a switch of it unwound: wait, then try again.
            crate::sync::spin(&mut spins);
            continue;
        };
        cost = carry_hop(g, next, ScopeKind::Global.index(), (0, 0), 0, cost);
        g = next;
    }
}

/// A plain global word of one generation as a member of a request's acquisition: a
/// take that finds it sealed decides and writes nothing and returns [`SEALED_ERROR`]
/// (the request starts again on the new generation); a give-back that finds it sealed
/// goes to the new generation's word.
pub(super) struct GlobalWord<'a, C> {
    pub(super) generation: &'a Generation,
    /// The word: `generation.words[limit]`.
    core: &'a Core<Sealable>,
    pub(super) limit: usize,
    pub(super) clock: &'a Monotonic<C>,
    pub(super) counters: CounterRef<'a>,
}

impl<C> Clone for GlobalWord<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C> Copy for GlobalWord<'_, C> {}

impl<'a, C: Clock> GlobalWord<'a, C> {
    /// Limit `limit`'s word of `generation`, if it has one.
    #[inline(always)]
    pub(super) fn new(
        generation: &'a Generation,
        limit: usize,
        clock: &'a Monotonic<C>,
        counters: CounterRef<'a>,
    ) -> Option<GlobalWord<'a, C>> {
        Some(GlobalWord {
            generation,
            core: generation.words.get(limit)?,
            limit,
            clock,
            counters,
        })
    }

    #[inline(always)]
    fn core(&self) -> &'a Core<Sealable> {
        self.core
    }
}

impl<C: Clock> GlobalWord<'_, C> {
    /// [`prepare`](sealed::Sealed::prepare)'s plan.
    #[inline(always)]
    pub(super) fn plan(&self, cost: u64, now: u64) -> Prepared {
        // As the take reads it.
        let now = self.clock.observe(now);
        let core = self.core();
        let passes = core.passes();
        if passes.is_due(now) && passes.idle_at(now) {
            return Prepared::Open;
        }
        core.raw().prepare(core.policy().layout(), now, cost)
    }
}

impl<C: Clock> Member for GlobalWord<'_, C> {
    #[inline]
    fn member_id(&self) -> usize {
        self.core().raw().id()
    }

    fn capacity(&self) -> u64 {
        self.core().policy().capacity()
    }
}

impl<C: Clock> sealed::Sealed for GlobalWord<'_, C> {
    fn now_nanos(&self) -> u64 {
        self.clock.now_nanos()
    }

    /// The limiter ran the word's due pass when it read the request's time.
    #[inline(always)]
    fn take_at(&self, cost: u64, now: u64) -> Result<Decision, AcquireError> {
        let core = self.core();
        core.raw()
            .try_acquire(core.policy().layout(), self.clock, now, cost)
    }

    fn refund_at(&self, cost: u64, now: u64) {
        refund_global(self.generation, self.limit, self.clock, cost, now);
    }

    fn wait_at(&self, cost: u64, now: u64) -> Duration {
        let core = self.core();
        match core.view(self.clock.observe(now)) {
            Ok(snapshot) => {
                Decision::new(core.policy().layout(), &snapshot, now, cost, 0, false).wait_for(cost)
            }
            // The request starts again on the new generation.
            Err(Sealed) => Duration::ZERO,
        }
    }

    #[inline]
    fn refusal_at(&self, cost: u64, now: u64) -> Option<Decision> {
        let core = self.core();
        let passes = core.passes();
        if passes.is_due(now) && passes.idle_at(now) {
            return None;
        }
        // A sealed word: no refusal known; the take finds the seal.
        core.raw()
            .refusal(core.policy().layout(), now, cost)
            .unwrap_or(None)
    }

    #[inline(always)]
    fn prepare(&self, cost: u64, now: u64, plan: &mut MaybeUninit<Prepared>) {
        plan.write(self.plan(cost, now));
    }

    #[inline(always)]
    fn commit(&self, plan: &Planned, cost: u64, now: u64) -> Result<Decision, AcquireError> {
        let core = self.core();
        core.raw()
            .commit(core.policy().layout(), self.clock, now, cost, plan)
    }
}

/// Whether `error`, from a take on a [`GlobalWord`], says the word was sealed.
#[inline]
pub(super) fn is_sealed(error: &AcquireError) -> bool {
    *error == SEALED_ERROR
}
