//! A request decided on buckets held in reader sections: no lock, no closure per kind.
//!
//! Most requests of a running service name keys already in their maps. For those, on a
//! limiter with no remote store and a global scope of one bucket, each keyed bucket the
//! request pays is found in a reader section of its shard ([`KeyedMaps::hold`], or
//! [`KeyedMaps::hold_one`] for a request paying one keyed kind), the
//! sections entered in kind order (the lock order of the [`ScopedLimiter`] docs) around
//! one fence they share, and the buckets are paid all or none in that order, at one
//! clock reading. Every other request (a new key, a writer on a shard, a rule with
//! several limits, a pass due, a sealed word) takes the locked path, with nothing taken
//! here.
//!
//! Why it decides as the locked path does:
//!
//! * A section, like a shard's read lock, keeps every writer out of its shard until it
//!   ends, so each held bucket stays in its map, at its address, in its epoch. Sections
//!   never wait, and a writer holds one shard at a time (a switch holds every shard in
//!   the lock order), so holding several, entered in the lock order, waits on no one.
//! * A switch publishes a generation only while it holds every map's barrier. Once the
//!   sections are entered, the generation read before them is checked to be still the
//!   current one: if it is, it stays current until the sections end, so the request is
//!   decided wholly on it (as under the locks, see [`generation`](super::generation)).
//! * The buckets are paid as [`acquire_all`](crate::acquire_all) pays them, less its
//!   capacity check and its sort: every class cost fits every policy (checked when the
//!   rules are built and reconfigured), and kind order is one order every request of
//!   the limiter keeps. A read-only first pass refuses, writing nothing, when a bucket
//!   seen now cannot pay (naming the first in kind order), each bucket planning its
//!   take on the word it read; the takes follow in kind order, each one
//!   compare-and-swap when no other thread wrote the word in between; a take refused
//!   even so (a race) has every earlier one given back; a take that meets an error
//!   has every earlier one given back, and the request goes to the locked path.
//!
//! [`KeyedMaps::hold`]: super::maps::KeyedMaps::hold
//! [`KeyedMaps::hold_one`]: super::maps::KeyedMaps::hold_one

use std::hash::BuildHasher;
use std::mem::MaybeUninit;
use std::time::Duration;

use super::OwnClass;
use super::decision::{KindSet, Policies};
use super::generation::{Generation, GlobalWord};
use super::inline::Inline;
use super::kind::{PerKind, ScopeKind};
use super::maps::KEYED_KINDS;
use super::rules::{ClassId, Request};
use super::{Payer, ScopeDecision, ScopeError, ScopeVerdict, ScopedLimiter};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::epoch::Pinned;
use crate::hint::cold_path;
use crate::keyed::{Handle, Held, Sections};
use crate::multi::{Prepared, sealed::Sealed, take_inline};
use crate::pass::Passes;
use crate::telemetry::Attempt;

/// One keyed kind's bucket held in a reader section: what the request pays there.
pub(super) struct Keyed<'h, C> {
    handle: Handle<'h, C>,
    passes: &'h Passes,
    // Its cost is the class's in its kind: not stored, so that listing a bucket writes
    // seven words, not nine.
    kind: ScopeKind,
    tier: u8,
}

impl<'h, C> Keyed<'h, C> {
    /// Kind `kind`'s bucket, held, of a key of local tier `tier`.
    #[inline(always)]
    pub(super) fn new(kind: ScopeKind, tier: u8, held: Held<'h, C>) -> Keyed<'h, C> {
        Keyed {
            handle: held.handle,
            passes: held.passes(),
            kind,
            tier,
        }
    }

    /// What the request pays this bucket, of the class's `costs`.
    #[inline(always)]
    fn cost(&self, costs: &PerKind<u64>) -> u64 {
        costs[self.kind.index()]
    }
}

impl<C> Clone for Keyed<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C> Copy for Keyed<'_, C> {}

/// The keyed kinds' buckets a request holds, in kind order (the order their sections
/// were entered in, and the order they are taken in).
pub(super) struct HeldKinds<'h, C> {
    list: Inline<Keyed<'h, C>, KEYED_KINDS>,
}

impl<'h, C> HeldKinds<'h, C> {
    /// Lists kind `kind`'s bucket, held, of a key of local tier `tier`.
    #[inline(always)]
    pub(super) fn push(&mut self, kind: ScopeKind, tier: u8, held: Held<'h, C>) {
        self.list.push(Keyed::new(kind, tier, held));
    }
}

impl<C: Clock, S: BuildHasher> ScopedLimiter<C, S> {
    /// Pays `costs` (of `class`) for `request`, whose keyed kinds are `paid` (not
    /// empty), on generation `g` (the current one when called), whose global scope has
    /// at most one bucket: on buckets held in reader sections where it can, else, with
    /// nothing taken and every section ended, on the locked path (see the module
    /// docs).
    ///
    /// The outcome is written as `O` makes it: the whole [`ScopeDecision`], or its
    /// [`ScopeVerdict`] made as each bucket is taken (for
    /// [`try_acquire_verdict`](ScopedLimiter::try_acquire_verdict): no decision built,
    /// moved and reduced).
    #[inline(always)]
    pub(super) fn pay_held<'s, O: Outcome<'s>>(
        &'s self,
        g: Pinned<'_, Generation>,
        costs: &'s PerKind<u64>,
        request: &Request,
        class: ClassId,
        paid: KindSet,
    ) -> Result<O, ScopeError> {
        let mut out = MaybeUninit::uninit();
        self.pay_held_into(g, costs, request, class, paid, &mut out);
        // SAFETY: `pay_held_into` writes `out` before it returns, on every path.
        unsafe { out.assume_init() }
    }

    /// [`pay_held`](Self::pay_held), writing its outcome into `out` on every path
    /// before it returns, out of line, so that the global scope's own path stays small.
    /// `out` is where the caller returns it from: in the builds measured, the compiler
    /// passes the caller's own return place, and nothing is copied after the call.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn pay_held_into<'s, O: Outcome<'s>>(
        &'s self,
        g: Pinned<'_, Generation>,
        costs: &'s PerKind<u64>,
        request: &Request,
        class: ClassId,
        paid: KindSet,
        out: &mut MaybeUninit<Result<O, ScopeError>>,
    ) {
        // Held until this call returns: the caller hands its pin over, so that nothing
        // follows the call there (the outcome is written in place).
        let pinned = g;
        let g: &Generation = &pinned;
        let policies = self.generations.policies(g);
        macro_rules! ret {
            ($e:expr) => {{
                out.write($e);
                return;
            }};
        }
        let sections = Sections::<KEYED_KINDS>::new();
        let mut held = HeldKinds {
            list: Inline::new(),
        };
        // One kind is found at once; several are each tested for.
        let all_held = if paid.is_power_of_two() {
            match self.maps.hold_one(g, request, paid, &sections, || true) {
                Some(keyed) => {
                    held.list.push(keyed);
                    true
                }
                None => false,
            }
        } else {
            self.maps.hold(g, request, paid, &sections, &mut held)
        };
        // With a section held, no switch can publish until it ends; one may have
        // published before the first was entered.
        if !all_held || !self.generations.is_current(g) {
            cold_path();
            // The locked path takes the shards' locks: the sections end first.
            drop(sections);
            ret!(self.pay_scopes(request, class).map(O::of))
        }
        let now = self.now_on(g);
        let keyed = held.list.as_slice();
        // A map's pass locks every shard: it runs on the locked path.
        if keyed.iter().any(|e| e.passes.is_due(now)) {
            cold_path();
            drop(sections);
            ret!(self.pay_scopes(request, class).map(O::of))
        }
        let global = self.global_payer(g, costs);
        let global_cost = costs[ScopeKind::Global.index()];
        // A held bucket is its key's own, never the kind's overflow bucket.
        let paid = paid | KindSet::from(global.is_some());
        // The tiers as one word, byte `k` kind `k`'s: bytes stored one by one and read
        // back as one load would stall on the store buffer.
        let tiers = keyed
            .iter()
            .fold(0u64, |t, e| t | u64::from(e.tier) << (8 * e.kind.index()));
        let attempt = request.attempt;
        // The admission, written where it is returned ahead of the takes, each bucket's
        // part as the bucket is taken: not gathered here and copied there at the end
        // (measured: BENCHMARKS.md, "Scoped path: the decision written where it is
        // returned"). A refusal or a fall back to the locked path overwrites it.
        let admission = out.write(Ok(O::admission(request, costs, policies, tiers, paid)));
        let Ok(decision) = admission else {
            return;
        };
        let global_ref = global.as_ref();
        // Expanded at each refusal, not a closure: a closure called from four places was
        // compiled out of line, and its captures were stored on the path that admits.
        macro_rules! refused {
            ($at:expr, $d:expr) => {{
                *admission = self
                    .refused_held(
                        Base {
                            request,
                            costs,
                            policies,
                            tiers,
                            paid,
                        },
                        global_ref,
                        keyed,
                        $at,
                        $d,
                        now,
                        attempt,
                    )
                    .map(O::of);
                return;
            }};
        }
        // The first pass, read-only, in kind order: a refusal writes nothing.
        let mut global_plan = MaybeUninit::<Prepared>::uninit();
        if let Some(p) = &global {
            p.prepare(global_cost, now, &mut global_plan);
            // SAFETY: `prepare` wrote the plan.
            if let Prepared::Refused(d) = unsafe { global_plan.assume_init_ref() } {
                refused!(None, d);
            }
        }
        let mut plans = [const { MaybeUninit::<Prepared>::uninit() }; KEYED_KINDS];
        for (i, (e, plan)) in keyed.iter().zip(plans.iter_mut()).enumerate() {
            e.handle.prepare(e.cost(costs), now, plan);
            // SAFETY: `prepare` wrote the plan.
            if let Prepared::Refused(d) = unsafe { plan.assume_init_ref() } {
                refused!(Some(i), d);
            }
        }
        // The takes, in kind order: each lands its plan, or decides on the word as it is
        // then (a race since the first pass); the buckets taken are given back, newest
        // first, if one refuses or fails (an error: a sealed word, which a switch that
        // began after the check above cannot make while a section is held, but the
        // locked path handles whatever it is).
        if let Some(p) = &global {
            // SAFETY: the first pass wrote the plan.
            let outcome = match unsafe { global_plan.assume_init_ref() } {
                Prepared::Take(plan) => p.commit(plan, global_cost, now),
                _ => p.take_at(global_cost, now),
            };
            match outcome {
                Ok(d) if d.is_admitted() => {
                    decision.part(ScopeKind::Global.index(), 0, global_cost, &d);
                }
                Ok(d) => refused!(None, &d),
                Err(_) => {
                    drop(sections);
                    ret!(self.pay_scopes(request, class).map(O::of))
                }
            }
        }
        for (i, (e, plan)) in keyed.iter().zip(&plans).enumerate() {
            // SAFETY: the first pass wrote the plan of every bucket listed.
            let outcome = match unsafe { plan.assume_init_ref() } {
                Prepared::Take(plan) => e.handle.commit(plan, e.cost(costs), now),
                _ => e.handle.take_at(e.cost(costs), now),
            };
            match outcome {
                Ok(d) if d.is_admitted() => {
                    decision.part(e.kind.index(), e.tier, e.cost(costs), &d)
                }
                Ok(d) => {
                    give_back(global.as_ref(), costs, &keyed[..i], now);
                    refused!(Some(i), &d);
                }
                Err(_) => {
                    give_back(global.as_ref(), costs, &keyed[..i], now);
                    drop(sections);
                    ret!(self.pay_scopes(request, class).map(O::of))
                }
            }
        }
        if let Some(p) = &global {
            p.counters().record(true, global_cost, attempt);
        }
        for e in keyed {
            e.handle.counters.record(true, e.cost(costs), attempt);
        }
        #[cfg(test)]
        super::tests::held_path::count_held();
        // Every kind of `paid` decided: the global scope's above, each keyed kind's in
        // the loop (the sections held every one); `out` holds the admission.
    }

    /// [`pay_held`](Self::pay_held) for a request whose one keyed kind (`paid` has one)
    /// is all it pays (no global scope charged), answered as its [`ScopeVerdict`]: the
    /// bucket, held in a reader section, is taken from at once (one bucket is
    /// all-or-nothing by itself: no read-only first pass, no plan, nothing to give
    /// back), and the verdict made from its own decision, with no [`ScopeDecision`]
    /// built. The same take, counts and wait as `pay_held` for a set of one; every
    /// case it sends to the locked path (a new key, a writer on the shard, several
    /// limits, a pass due, a switch) goes there here too, nothing taken.
    #[inline(never)]
    pub(super) fn pay_one_held<'s>(
        &'s self,
        g: Pinned<'_, Generation>,
        costs: &'s PerKind<u64>,
        request: &Request,
        class: OwnClass,
        paid: KindSet,
    ) -> Result<ScopeVerdict<'s>, ScopeError> {
        // Held until this call returns: the caller hands its pin over, so that nothing
        // follows the call there (the outcome is written in place).
        let pinned = g;
        let g: &Generation = &pinned;
        let policies = self.generations.policies(g);
        let sections = Sections::<1>::new();
        let held = self.maps.hold_one(g, request, paid, &sections, || {
            // With the section held, no switch can publish until it ends; one may
            // have published before it was entered.
            self.generations.is_current(g)
        });
        let Some(e) = held else {
            cold_path();
            drop(sections);
            return self.verdict_of_scopes(request, self.class_id(class));
        };
        let e = &e;
        let now = self.now_on(g);
        // A map's pass locks every shard: it runs on the locked path.
        if e.passes.is_due(now) {
            cold_path();
            drop(sections);
            return self.verdict_of_scopes(request, self.class_id(class));
        }
        let (k, cost) = (e.kind.index(), e.cost(costs));
        #[cfg(test)]
        ONE_HELD.with(|c| c.set(c.get() + 1));
        match take_inline(&e.handle, cost, now) {
            Ok(d) if d.is_admitted() => {
                e.handle.counters.record(true, cost, request.attempt);
                Ok(ScopeVerdict::alone(policies, k, e.tier, cost, &d, None))
            }
            Ok(d) => {
                let wait = e.handle.wait_at(cost, now);
                e.handle.counters.record(false, cost, request.attempt);
                Ok(ScopeVerdict::alone(
                    policies,
                    k,
                    e.tier,
                    cost,
                    &d,
                    Some(wait),
                ))
            }
            Err(_) => {
                cold_path();
                drop(sections);
                self.verdict_of_scopes(request, self.class_id(class))
            }
        }
    }

    /// [`pay_held`](Self::pay_held) for a request that pays the global scope, a plain
    /// word of generation `g` (not leased), and one keyed kind (`paid` has one),
    /// answered as its [`ScopeVerdict`]: the two buckets planned on the words read
    /// (a refusal writes nothing), then taken, the global scope's first, and the verdict
    /// made from their decisions as they are taken, with no list, no payer to match on
    /// and no [`ScopeDecision`] built. The same plans, takes, give-backs, counts and
    /// refusals as `pay_held` for these two buckets; every case it sends to the locked
    /// path (a new key, a writer on the shard, several limits, a pass due, a switch, a
    /// sealed word) goes there here too, nothing taken.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pay_two_held<'s>(
        &'s self,
        g: Pinned<'_, Generation>,
        costs: &'s PerKind<u64>,
        request: &Request,
        class: OwnClass,
        paid: KindSet,
    ) -> Result<ScopeVerdict<'s>, ScopeError> {
        // Held until this call returns: the caller hands its pin over, so that nothing
        // follows the call there (the outcome is written in place).
        let pinned = g;
        let g: &Generation = &pinned;
        let policies = self.generations.policies(g);
        let sections = Sections::<1>::new();
        let held = self.maps.hold_one(g, request, paid, &sections, || {
            // With the section held, no switch can publish until it ends; one may
            // have published before it was entered.
            self.generations.is_current(g)
        });
        let Some(e) = held else {
            cold_path();
            drop(sections);
            return self.verdict_of_scopes(request, self.class_id(class));
        };
        let e = &e;
        let now = self.now_on(g);
        let counters = self.global_counters();
        let Some(w) = GlobalWord::new(g, 0, &self.clock, counters) else {
            cold_path();
            drop(sections);
            return self.verdict_of_scopes(request, self.class_id(class));
        };
        // A map's pass locks every shard: it runs on the locked path.
        if e.passes.is_due(now) {
            cold_path();
            drop(sections);
            return self.verdict_of_scopes(request, self.class_id(class));
        }
        let global_cost = costs[ScopeKind::Global.index()];
        let (k, cost) = (e.kind.index(), e.cost(costs));
        #[cfg(test)]
        TWO_HELD.with(|c| c.set(c.get() + 1));
        let keyed = std::slice::from_ref(e);
        // Cold, as on `pay_held`'s path: the refusal of the keyed bucket (`Some(0)`) or
        // of the global scope's (`None`), built as the decision's, then reduced.
        macro_rules! refused {
            ($at:expr, $d:expr) => {{
                let base = Base {
                    request,
                    costs,
                    policies,
                    tiers: u64::from(e.tier) << (8 * k),
                    paid: paid | KindSet::from(true),
                };
                return self
                    .refused_held(
                        base,
                        Some(&Payer::Global(w)),
                        keyed,
                        $at,
                        $d,
                        now,
                        request.attempt,
                    )
                    .map(|d| d.verdict());
            }};
        }
        // The first pass, read-only: a refusal writes nothing.
        let mut global_plan = MaybeUninit::<Prepared>::uninit();
        w.prepare(global_cost, now, &mut global_plan);
        // SAFETY: `prepare` wrote the plan.
        let global_plan = unsafe { global_plan.assume_init_ref() };
        if let Prepared::Refused(d) = global_plan {
            refused!(None, d);
        }
        let mut plan = MaybeUninit::<Prepared>::uninit();
        e.handle.prepare(cost, now, &mut plan);
        // SAFETY: `prepare` wrote the plan.
        let plan = unsafe { plan.assume_init_ref() };
        if let Prepared::Refused(d) = plan {
            refused!(Some(0), d);
        }
        // The takes: each lands its plan, or decides on the word as it is then.
        let outcome = match global_plan {
            Prepared::Take(plan) => w.commit(plan, global_cost, now),
            _ => w.take_at(global_cost, now),
        };
        let global_decision = match outcome {
            Ok(d) if d.is_admitted() => d,
            Ok(d) => refused!(None, &d),
            Err(_) => {
                drop(sections);
                return self.verdict_of_scopes(request, self.class_id(class));
            }
        };
        let outcome = match plan {
            Prepared::Take(plan) => e.handle.commit(plan, cost, now),
            _ => e.handle.take_at(cost, now),
        };
        let decision = match outcome {
            Ok(d) if d.is_admitted() => d,
            Ok(d) => {
                give_back(Some(&Payer::Global(w)), costs, &[], now);
                refused!(Some(0), &d);
            }
            Err(_) => {
                give_back(Some(&Payer::Global(w)), costs, &[], now);
                drop(sections);
                return self.verdict_of_scopes(request, self.class_id(class));
            }
        };
        counters.record(true, global_cost, request.attempt);
        e.handle.counters.record(true, cost, request.attempt);
        Ok(ScopeVerdict::admitted_two(
            policies,
            (global_cost, &global_decision),
            (k, e.tier, cost, &decision),
        ))
    }

    /// The refusal of the held bucket `keyed[i]` (the global scope's for `None`), which
    /// decided `d` at `now`, with the time until every bucket the request pays holds its
    /// cost, counted.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn refused_held<'s>(
        &self,
        base: Base<'_, 's>,
        global: Option<&Payer<'_, C>>,
        keyed: &[Keyed<'_, C>],
        at: Option<usize>,
        d: &Decision,
        now: u64,
        attempt: Attempt,
    ) -> Result<ScopeDecision<'s>, ScopeError> {
        let global_cost = base.costs[ScopeKind::Global.index()];
        let retry_after = global
            .map(|p| p.wait_at(global_cost, now))
            .into_iter()
            .chain(
                keyed
                    .iter()
                    .map(|e| e.handle.wait_at(e.cost(base.costs), now)),
            )
            .max()
            .unwrap_or(Duration::ZERO);
        let k = match at.and_then(|i| keyed.get(i)) {
            Some(e) => {
                e.handle.counters.record(false, e.cost(base.costs), attempt);
                e.kind.index()
            }
            None => {
                if let Some(p) = global {
                    p.counters().record(false, global_cost, attempt);
                }
                ScopeKind::Global.index()
            }
        };
        let mut decision = ScopeDecision::paid_in(
            base.request,
            base.costs,
            base.policies,
            tiers_of(base.tiers),
            base.paid,
        );
        decision.refused_by(k, 0, d, retry_after);
        #[cfg(test)]
        super::tests::held_path::count_held();
        Ok(decision)
    }
}

#[cfg(test)]
std::thread_local! {
    /// Requests this thread's limiters took on [`ScopedLimiter::pay_one_held`]'s own path.
    pub(super) static ONE_HELD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Requests this thread's limiters took on [`ScopedLimiter::pay_two_held`]'s own path.
    pub(super) static TWO_HELD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Requests this thread's limiters took on [`ScopedLimiter::verdict_global`]'s path.
    pub(super) static GLOBAL_VERDICT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// What the held path writes a request's outcome as: the whole [`ScopeDecision`], or
/// its [`ScopeVerdict`], made as the buckets are taken.
pub(super) trait Outcome<'s>: Sized {
    /// The admission of a request paying the kinds of `paid` (each on its own key's
    /// bucket), the local tier of kind `k`'s key in byte `k` of `tiers`, before any
    /// bucket decided: each kind's [`part`](Outcome::part) follows, in kind order.
    fn admission(
        request: &Request,
        costs: &'s PerKind<u64>,
        policies: Policies<'s>,
        tiers: u64,
        paid: KindSet,
    ) -> Self;

    /// Kind `k`'s bucket (its key in local tier `tier`, paying `cost`) admitted with
    /// `d`.
    fn part(&mut self, k: usize, tier: u8, cost: u64, d: &Decision);

    /// The outcome of a whole decision (a refusal, or the locked path's).
    fn of(d: ScopeDecision<'s>) -> Self;
}

impl<'s> Outcome<'s> for ScopeDecision<'s> {
    #[inline(always)]
    fn admission(
        request: &Request,
        costs: &'s PerKind<u64>,
        policies: Policies<'s>,
        tiers: u64,
        paid: KindSet,
    ) -> Self {
        ScopeDecision::paid_in(request, costs, policies, tiers_of(tiers), paid)
    }

    #[inline(always)]
    fn part(&mut self, k: usize, _tier: u8, _cost: u64, d: &Decision) {
        ScopeDecision::part(self, k, d);
    }

    #[inline(always)]
    fn of(d: ScopeDecision<'s>) -> Self {
        d
    }
}

impl<'s> Outcome<'s> for ScopeVerdict<'s> {
    #[inline(always)]
    fn admission(
        _request: &Request,
        _costs: &'s PerKind<u64>,
        policies: Policies<'s>,
        _tiers: u64,
        _paid: KindSet,
    ) -> Self {
        ScopeVerdict::nothing(policies)
    }

    #[inline(always)]
    fn part(&mut self, k: usize, tier: u8, cost: u64, d: &Decision) {
        self.admitted_part(k, tier, cost, d);
    }

    #[inline(always)]
    fn of(d: ScopeDecision<'s>) -> Self {
        d.verdict()
    }
}

/// What a held request's decision is made of, besides its buckets' decisions.
#[derive(Clone, Copy)]
struct Base<'r, 's> {
    request: &'r Request,
    costs: &'s PerKind<u64>,
    policies: Policies<'s>,
    /// Byte `k`: kind `k`'s local tier.
    tiers: u64,
    paid: KindSet,
}

// `tiers_of`'s word holds a byte per kind.
const _: () = assert!(ScopeKind::COUNT <= 8);

/// Each kind's local tier, from a word holding kind `k`'s in byte `k`.
#[inline(always)]
fn tiers_of(word: u64) -> PerKind<u8> {
    let bytes = word.to_le_bytes();
    std::array::from_fn(|k| bytes[k])
}

/// Gives back what the held path took of the class's `costs` (the global scope's bucket,
/// if it pays one, and the keyed buckets `taken`), newest first.
#[cold]
#[inline(never)]
fn give_back<C: Clock>(
    global: Option<&Payer<'_, C>>,
    costs: &PerKind<u64>,
    taken: &[Keyed<'_, C>],
    now: u64,
) {
    if mutant!(ROLLBACK_SKIPS_REFUND) {
        return;
    }
    for e in taken.iter().rev() {
        e.handle.refund_at(e.cost(costs), now);
    }
    if let Some(p) = global {
        p.refund_at(costs[ScopeKind::Global.index()], now);
    }
}
