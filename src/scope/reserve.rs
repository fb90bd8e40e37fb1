//! A scoped request's charge (to refund it on outcome), owned reservations across scopes,
//! and acquisition with some scopes left out (shadow mode).

use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use crate::bucket::Sealed;
use crate::clock::{Clock, Monotonic};
use crate::keyed::{Handle, Slot};
use crate::owned::{OwnedReservation, Place, Reservable, reserve_on, sealed};
use crate::policy::Policy;
use crate::reservation::{Limits, ReserveError};
use crate::scope::decision::{Tag, tag};
use crate::scope::generation::{Generation, carried, refund_global};
use crate::scope::kind::PerKind;
use crate::scope::maps::KindSlots;
use crate::scope::{
    ClassId, MAX_PAYERS, MAX_POLICIES_PER_RULE, Request, Retry, Scope, ScopeDecision, ScopeError,
    ScopeKind, ScopedLimiter,
};

/// What an admitted scoped request took from each scope: the request and the cost per
/// scope kind. Given back with [`ScopedLimiter::refund`] when the work turned out not to
/// count (a failed upstream call, a cached answer).
///
/// ```
/// use tokengate::scope::*;
/// use tokengate::{ManualClock, Policy};
/// let limiter = RuleSet::new()
///     .rule(ScopeKind::Global, Rule::new(Policy::new(10, 1.0)?))
///     .rule(ScopeKind::Tenant, Rule::new(Policy::new(5, 1.0)?))
///     .class(WorkClass::new("search", 3))
///     .build_with_clock(ManualClock::new())?;
/// let search = limiter.class("search").unwrap();
/// let request = Request::new().tenant(TenantId(1));
/// let charge = limiter.try_acquire(&request, search)?.charge().unwrap();
/// assert_eq!(charge.cost(ScopeKind::Tenant), 3);
/// limiter.refund(&charge);
/// assert_eq!(limiter.available(&Scope::Tenant(TenantId(1))), Some(5.0));
/// assert_eq!(limiter.available(&Scope::Global), Some(10.0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Charge {
    request: Request,
    costs: PerKind<u64>,
    /// The limiter's configuration it was paid under (its generation's tag): a refund
    /// after a reconfiguration gives back what the switch's strategy makes of it.
    generation: Tag,
}

impl Charge {
    /// The request that paid.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// The cost taken from the scope of `kind`, in tokens (0 when it paid nothing there,
    /// or paid a shared overflow bucket, which a refund does not reach).
    pub fn cost(&self, kind: ScopeKind) -> u64 {
        self.costs[kind.index()]
    }
}

impl ScopeDecision<'_> {
    /// What the admission took, to [`refund`](ScopedLimiter::refund) later; `None` for a
    /// rejection (nothing was taken).
    pub fn charge(&self) -> Option<Charge> {
        if self.is_rejected() {
            return None;
        }
        Some(Charge {
            request: self.request,
            costs: std::array::from_fn(|k| self.own_cost(k)),
            generation: self.generation,
        })
    }
}

/// Why [`ScopedLimiter::reserve_owned`] refused. Nothing was taken from any scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScopeReserveError {
    /// The class was not given by this limiter.
    UnknownClass(ClassId),
    /// A scope's bucket refused the reservation.
    Reserve {
        /// The scope.
        scope: Scope,
        /// Its bucket's refusal.
        error: ReserveError,
    },
    /// A scope's key is new and its map is full, under
    /// [`Overflow::Reject`](crate::keyed::Overflow::Reject).
    KeyLimit {
        /// The scope.
        scope: Scope,
        /// The map's maximum number of keys.
        max_keys: usize,
    },
    /// The global scope is leased ([`Rule::leased`](crate::scope::Rule::leased)): its slots
    /// cannot hold debt, so it does not reserve ahead.
    LeasedGlobal,
    /// The request pays a scope kept in the remote store
    /// ([`Rule::remote`](crate::scope::Rule::remote)), which takes now or refuses: it does
    /// not reserve ahead.
    RemoteScope {
        /// The first remote scope of the request.
        scope: Scope,
    },
}

impl fmt::Display for ScopeReserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScopeReserveError::UnknownClass(c) => ScopeError::UnknownClass(*c).fmt(f),
            ScopeReserveError::Reserve { scope, error } => write!(f, "scope {scope}: {error}"),
            ScopeReserveError::KeyLimit { scope, max_keys } => write!(
                f,
                "scope {scope}: the key is new and its map holds its maximum of {max_keys} \
                 keys; nothing was taken"
            ),
            ScopeReserveError::LeasedGlobal => f.write_str(
                "the global scope is leased to per-core slots, which do not reserve ahead; \
                 nothing was taken",
            ),
            ScopeReserveError::RemoteScope { scope } => write!(
                f,
                "scope {scope} is kept in the remote store, which does not reserve ahead; \
                 nothing was taken"
            ),
        }
    }
}

impl std::error::Error for ScopeReserveError {}

/// Where a scoped reservation stands on each word it took from: the global words by
/// limit, and each kind's buckets at `kind * MAX_POLICIES_PER_RULE + limit`.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct Places {
    global: [Option<Place>; MAX_POLICIES_PER_RULE],
    keyed: [Option<Place>; MAX_PAYERS],
}

impl<C: Clock, S> sealed::Sealed for ScopedLimiter<C, S> {}

impl<C: Clock, S: BuildHasher + Send + Sync> Reservable for ScopedLimiter<C, S> {
    type Charge = Charge;

    type Places = Places;

    fn now_nanos(&self) -> u64 {
        self.now()
    }

    /// On each word, as [`Reservation::cancel`](crate::Reservation::cancel) while the
    /// configuration it was reserved under is current; a word reconfigured since (sealed
    /// and carried) gets the [`refund`](ScopedLimiter::refund) of its cost instead.
    fn give_back(&self, charge: &Charge, places: &Places) {
        let r = &charge.request;
        let c = &charge.costs;
        let current = self.generation();
        let Some(paid) = self.generations.find(&current, charge.generation) else {
            // Reserved more than `KEPT_GENERATIONS` switches ago: the generation is
            // gone, and with it what each switch since made of the cost. Nothing is
            // given back (less than the bound allows, never more).
            return;
        };
        let cost = c[ScopeKind::Global.index()];
        if cost > 0 {
            // A leased global scope does not reserve ahead: the words are plain.
            let now = self.now_on(paid);
            for (limit, place) in places.global.iter().enumerate() {
                if let Some(place) = place {
                    cancel_global(paid, limit, place, &self.clock, cost, now);
                }
            }
        }
        for kind in ScopeKind::ALL {
            let k = kind.index();
            let cost = c[k];
            if let (Some(m), Some(scope), true) =
                (self.maps.get(kind), Scope::of(r, kind), cost > 0)
            {
                let at = k * MAX_POLICIES_PER_RULE;
                let places = &places.keyed[at..at + MAX_POLICIES_PER_RULE];
                m.cancel(
                    paid,
                    &|| self.generations.current_while(&current),
                    &scope,
                    cost,
                    places,
                );
            }
        }
    }
}

impl<C: Clock, S: BuildHasher> ScopedLimiter<C, S> {
    /// The policy of `kind`'s buckets, if it has a rule (its first, for a rule with
    /// several: see [`policies`](ScopedLimiter::policies)).
    pub fn policy(&self, kind: ScopeKind) -> Option<&Policy> {
        self.generations.config(&self.generation()).policies.rules[kind.index()]
            .as_ref()
            .map(|p| p.policy())
    }

    /// Every policy of `kind`'s rule, in its order, if it has a rule (what keys
    /// without an override are held to: see [`policies_for`](ScopedLimiter::policies_for)).
    pub fn policies(&self, kind: ScopeKind) -> Option<&[Policy]> {
        self.generations.config(&self.generation()).policies.rules[kind.index()]
            .as_ref()
            .map(|p| p.as_slice())
    }

    /// The policies `scope` is held to, in their order: its tier's when the key has an
    /// override ([`RuleSet::override_key`](crate::scope::RuleSet::override_key)), else
    /// its kind's rule's; `None` when its kind has no rule.
    ///
    /// ```
    /// use tokengate::{Policy, scope::*};
    /// let limiter = RuleSet::new()
    ///     .rule(ScopeKind::User, Rule::new(Policy::new(10, 1.0)?))
    ///     .tier("bulk", vec![Policy::new(50, 5.0)?, Policy::new(500, 1.0)?])
    ///     .override_key(Scope::User(UserId(7)), "bulk")
    ///     .build()?;
    /// assert_eq!(limiter.policies_for(&Scope::User(UserId(7))).map(<[_]>::len), Some(2));
    /// assert_eq!(limiter.policies_for(&Scope::User(UserId(8))).map(<[_]>::len), Some(1));
    /// assert_eq!(limiter.policies_for(&Scope::Tenant(TenantId(1))), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policies_for(&self, scope: &Scope) -> Option<&[Policy]> {
        let kind = scope.kind();
        let g = self.generation();
        let tier = match self.maps.get(kind) {
            Some(m) => m.tier_of(&g, scope)?,
            None => 0,
        };
        self.generations
            .config(&g)
            .policies
            .get(kind.index(), tier)
            .map(|p| p.as_slice())
    }

    /// Gives every scope of `charge` its cost back, with the exact refund of
    /// [`Bucket::refund`](crate::Bucket::refund) (capped at capacity). A key evicted
    /// meanwhile had refilled to full: its refund would be capped away and is dropped.
    /// Counters are not changed (the request was admitted). Scopes of remote kinds
    /// ([`Rule::remote`](crate::scope::Rule::remote)) are given back through the store's
    /// [`give_back`](crate::scope::RemoteScopes::give_back), in one call.
    ///
    /// After reconfigurations, each local scope gets what the switches' strategies made
    /// of its cost, when the charge was paid at most 16 reconfigurations ago (the
    /// limiter keeps that many replaced configurations); an older charge gives the local
    /// scopes nothing back (never more than the bound allows).
    pub fn refund(&self, charge: &Charge) {
        let r = &charge.request;
        let c = &charge.costs;
        let current = self.generation();
        // The configuration it was paid under: when it is gone (paid more than
        // `KEPT_GENERATIONS` switches ago), so is what each switch since made of the
        // cost, and the local scopes get nothing back (less than the bound allows,
        // never more).
        let Some(paid) = self.generations.find(&current, charge.generation) else {
            self.give_back_remote(r, c);
            return;
        };
        let cost = c[ScopeKind::Global.index()];
        if cost > 0 {
            if let Some(b) = self.leased() {
                let cost = carried(paid, &current, ScopeKind::Global.index(), &|_| 0, 0, cost);
                let _ = b.refund(cost.min(b.policy().capacity()));
            } else {
                let now = self.now_on(&current);
                for limit in 0..current.words.len() {
                    let cost = carried(
                        paid,
                        &current,
                        ScopeKind::Global.index(),
                        &|_| 0,
                        limit,
                        cost,
                    );
                    refund_global(&current, limit, &self.clock, cost, now);
                }
            }
        }
        for kind in ScopeKind::ALL {
            let k = kind.index();
            let cost = c[k];
            if let (Some(m), Some(scope), true) =
                (self.maps.get(kind), Scope::of(r, kind), cost > 0)
            {
                m.refund(
                    paid,
                    &|| self.generations.current_while(&current),
                    &scope,
                    cost,
                );
            }
        }
        self.give_back_remote(r, c);
    }

    /// [`try_acquire`](ScopedLimiter::try_acquire) paying only the scopes whose kind is
    /// not in `skip`: the skipped kinds are not consulted, not charged and not counted.
    ///
    /// The layer's shadow mode uses it: when a shadowed scope refuses, the request is
    /// decided again by the enforced scopes alone.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](ScopedLimiter::try_acquire).
    pub fn try_acquire_without(
        &self,
        request: &Request,
        class: ClassId,
        skip: &[ScopeKind],
    ) -> Result<ScopeDecision<'_>, ScopeError> {
        self.pay(request, class, skip, false)
    }
}

impl<C: Clock, S: BuildHasher + Send + Sync> ScopedLimiter<C, S> {
    /// Reserves `class`'s cost in every scope `request` pays, all or none, each into its
    /// policy's reservation allowance
    /// ([`PolicyBuilder::max_reservation`](crate::PolicyBuilder::max_reservation)) if
    /// needed: the caller may proceed when every scope has refilled its debt, at
    /// [`ready_at`](OwnedReservation::ready_at), the latest of the scopes' times.
    ///
    /// Reservations are served in the order they are made, scope by scope. Cancelling
    /// (or dropping) before `ready_at` gives each scope's bucket back what it charged
    /// there as [`Reservation::cancel`](crate::Reservation::cancel) does: all of it where
    /// no reservation was made on that bucket after it, nothing where one was (the queued
    /// holders keep their times); a scope that had the tokens at once gets them back as a
    /// [`refund`](ScopedLimiter::refund). After a reconfiguration, each scope gets the
    /// refund of its cost (nothing, for a reservation made more than 16
    /// reconfigurations ago: see [`refund`](ScopedLimiter::refund)). [`consume`](OwnedReservation::consume) returns the
    /// [`Charge`]. Reservations count as admissions in the scopes' counters.
    ///
    /// # Errors
    ///
    /// [`ScopeReserveError`]: a scope whose wait exceeds `max_wait` or its policy's
    /// horizon, a full map, a cost above a capacity, a leased global scope, a scope kept
    /// in the remote store. The scopes reserved before the refusing one are given back;
    /// nothing is taken.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tokengate::scope::*;
    /// use tokengate::{ManualClock, Policy};
    ///
    /// let policy = Policy::builder(10, 10.0).max_reservation(Duration::from_secs(2)).build()?;
    /// let limiter = Arc::new(
    ///     RuleSet::new()
    ///         .rule(ScopeKind::Global, Rule::new(Policy::new(100, 100.0)?))
    ///         .rule(ScopeKind::Tenant, Rule::new(policy))
    ///         .class(WorkClass::new("export", 10))
    ///         .build_with_clock(ManualClock::new())?,
    /// );
    /// let export = limiter.class("export").unwrap();
    /// let request = Request::new().tenant(TenantId(9));
    /// let first = limiter.reserve_owned(&request, export, Duration::ZERO)?;
    /// assert!(first.is_ready()); // there at once
    /// let second = limiter.reserve_owned(&request, export, Duration::from_secs(2))?;
    /// assert!(second.wait() >= Duration::from_secs(1)); // queued behind the first
    /// let tenant = limiter.available(&Scope::Tenant(TenantId(9))).unwrap();
    /// assert!(tenant < -10.0 && tenant > -10.01); // charged to its ready edge
    /// drop(second); // nobody reserved after it: every scope as if it never had
    /// assert_eq!(limiter.available(&Scope::Tenant(TenantId(9))), Some(0.0));
    /// assert_eq!(limiter.available(&Scope::Global), Some(90.0));
    /// # first.consume();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_owned(
        self: &Arc<Self>,
        request: &Request,
        class: ClassId,
        max_wait: Duration,
    ) -> Result<OwnedReservation<Self>, ScopeReserveError> {
        if class.limiter != self.id {
            return Err(ScopeReserveError::UnknownClass(class));
        }
        loop {
            let g = self.generation();
            let Some(work) = g.classes().get(class.index as usize) else {
                return Err(ScopeReserveError::UnknownClass(class));
            };
            let costs = *work.costs();
            if costs[ScopeKind::Global.index()] > 0 && self.leased().is_some() {
                return Err(ScopeReserveError::LeasedGlobal);
            }
            if let Some(scope) = self.pays_remote(request, &costs) {
                return Err(ScopeReserveError::RemoteScope { scope });
            }
            let now = self.now_on(&g);
            let reserved = self.maps.with_slots(
                &g,
                &|| self.generations.is_current(&g),
                request,
                &costs,
                now,
                |slots| {
                    // With a map's lock held the generation cannot change; with none it may.
                    if !self.generations.is_current(&g) {
                        return Err(Retry);
                    }
                    self.reserve_slots(&g, slots, &costs, request, now, max_wait)
                },
            );
            let (ready_at, places) = match reserved {
                Ok(r) => r?,
                Err(Retry) => {
                    self.generations.await_successor(&g);
                    continue;
                }
            };
            let charge = Charge {
                request: *request,
                costs: self.paid_costs(&g, &costs, request),
                generation: tag(g.number),
            };
            return Ok(OwnedReservation::new(
                Arc::clone(self),
                charge,
                places,
                now,
                ready_at,
            ));
        }
    }

    /// The costs a request pays, by kind: zero where the kind has no rule or the request
    /// no key of it.
    fn paid_costs(&self, g: &Generation, costs: &PerKind<u64>, request: &Request) -> PerKind<u64> {
        let mut paid = [0; ScopeKind::COUNT];
        for k in ScopeKind::ALL {
            let has_rule = g.policies().rules[k.index()].is_some();
            if has_rule && Scope::of(request, k).is_some() {
                paid[k.index()] = costs[k.index()];
            }
        }
        paid
    }

    /// Reserves on the held slots and generation `g`'s global words at `now` (every
    /// limit of every kind), rolling back on a refusal; the latest ready time and where
    /// the reservation stands on each word. A global
    /// word found sealed gives back what was reserved and starts again ([`Retry`]).
    fn reserve_slots(
        &self,
        g: &Generation,
        slots: PerKind<&KindSlots<'_, C>>,
        costs: &PerKind<u64>,
        request: &Request,
        now: u64,
        max_wait: Duration,
    ) -> Result<Result<(u64, Places), ScopeReserveError>, Retry> {
        let mut places = Places {
            global: [None; MAX_POLICIES_PER_RULE],
            keyed: [None; MAX_PAYERS],
        };
        let global_cost = costs[ScopeKind::Global.index()];
        // The plain global words, when the class charges the global scope.
        let words = if global_cost > 0 { &g.words[..] } else { &[] };
        // Kind `k`'s limit `l` at `k * MAX_POLICIES_PER_RULE + l` (the global kind's
        // are `words`).
        let mut handles: [Option<Handle<'_, C>>; MAX_PAYERS] = [None; MAX_PAYERS];
        let mut tiers = [0u8; ScopeKind::COUNT];
        for (k, &&(tier, ref limits)) in slots.iter().enumerate() {
            tiers[k] = tier;
            for (l, slot) in limits.iter().enumerate() {
                match *slot {
                    None => {}
                    Some(Slot::Bucket(h)) => handles[k * MAX_POLICIES_PER_RULE + l] = Some(h),
                    // Only when `g` was replaced (which the caller checked): start again.
                    Some(Slot::Stale) => return Err(Retry),
                    Some(Slot::Full { max_keys }) => {
                        let kind = ScopeKind::ALL[k];
                        return Ok(Err(ScopeReserveError::KeyLimit {
                            scope: Scope::of(request, kind).unwrap_or(Scope::Global),
                            max_keys,
                        }));
                    }
                }
            }
        }
        // Cancels the reservations on the first `global` words and the handles before
        // `keyed`, at the same reading, each as `Reservation::cancel` does: exactly,
        // unless another reservation was made on the word since.
        let give_back = |places: &Places, global: usize, keyed: usize| {
            for (limit, place) in places.global.iter().enumerate().take(global) {
                if let Some(place) = place {
                    cancel_global(g, limit, place, &self.clock, global_cost, now);
                }
            }
            for (done, place) in handles[..keyed].iter().zip(&places.keyed) {
                if let (Some(d), Some(place)) = (done, place) {
                    place.cancel(d.raw, d.layout, d.clock, now);
                }
            }
        };
        let horizon = |k: usize, tier: u8, l: usize| {
            g.policies()
                .get(k, tier)
                .and_then(|p| p.as_slice().get(l))
                .map_or(Duration::ZERO, |p| p.max_reservation())
        };
        let mut ready_at = now;
        for (l, core) in words.iter().enumerate() {
            let layout = core.policy().layout();
            let refused = |error| {
                give_back(&places, l, 0);
                Ok(Err(ScopeReserveError::Reserve {
                    scope: Scope::Global,
                    error,
                }))
            };
            let Some(units) = layout.units_of(global_cost) else {
                return refused(ReserveError::CostExceedsCapacity {
                    cost: global_cost,
                    capacity: layout.capacity(),
                });
            };
            let limits = Limits {
                max_wait,
                horizon: horizon(ScopeKind::Global.index(), 0, l),
            };
            match reserve_on(core.raw(), layout, &self.clock, now, units, &limits) {
                Ok(Ok((_, ready, place))) => {
                    ready_at = ready_at.max(ready);
                    if let Some(slot) = places.global.get_mut(l) {
                        *slot = place;
                    }
                }
                Ok(Err(e)) => return refused(e),
                Err(Sealed) => {
                    give_back(&places, l, 0);
                    return Err(Retry);
                }
            }
        }
        for (i, h) in handles.iter().enumerate() {
            let Some(h) = *h else { continue };
            let (k, l) = (i / MAX_POLICIES_PER_RULE, i % MAX_POLICIES_PER_RULE);
            let kind = ScopeKind::ALL[k];
            let refused = |error| {
                // Give back what this request reserved so far, at the same reading.
                give_back(&places, words.len(), i);
                Ok(Err(ScopeReserveError::Reserve {
                    scope: Scope::of(request, kind).unwrap_or(Scope::Global),
                    error,
                }))
            };
            let Some(units) = h.layout.units_of(costs[k]) else {
                return refused(ReserveError::CostExceedsCapacity {
                    cost: costs[k],
                    capacity: h.layout.capacity(),
                });
            };
            let limits = Limits {
                max_wait,
                horizon: horizon(k, tiers[k], l),
            };
            match reserve_on(h.raw, h.layout, h.clock, now, units, &limits) {
                Ok((_, ready, place)) => {
                    ready_at = ready_at.max(ready);
                    places.keyed[i] = place;
                }
                Err(e) => return refused(e),
            }
        }
        if !words.is_empty() {
            self.global_counters()
                .record(true, global_cost, request.attempt);
        }
        for (i, h) in handles.iter().enumerate() {
            if let (Some(h), 0) = (h, i % MAX_POLICIES_PER_RULE) {
                h.counters
                    .record(true, costs[i / MAX_POLICIES_PER_RULE], request.attempt);
            }
        }
        Ok(Ok((ready_at, places)))
    }
}

/// Cancels a reservation of `cost` standing at `place` on generation `g`'s global word of
/// limit `limit`, at `now` ([`Place::cancel`]); a word sealed since (reconfigured)
/// gets the refund of `cost`, carried to the current generation.
fn cancel_global<C: Clock>(
    g: &Generation,
    limit: usize,
    place: &Place,
    clock: &Monotonic<C>,
    cost: u64,
    now: u64,
) {
    let Some(core) = g.words.get(limit) else {
        return;
    };
    let layout = core.policy().layout();
    if let Err(Sealed) = place.cancel(core.raw(), layout, clock, now) {
        refund_global(g, limit, clock, cost, now);
    }
}
