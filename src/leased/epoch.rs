//! One policy of a [`LeasedBucket`](super::LeasedBucket): its pool, its slots and the
//! figures derived from the policy (an epoch of the bucket's chain (`src/epoch.rs`)).
//!
//! A bucket never reconfigured has one epoch for its whole life. A reconfiguration
//! ([`LeasedBucket::reconfigure`](super::LeasedBucket::reconfigure)) closes the current
//! epoch's slots for good, seals its pool's word and publishes a successor; operations
//! that meet a sealed epoch decide and write nothing there and start again on the
//! successor. The pool operations here answer [`Replaced`] on a sealed word, with the
//! units the operation held, for the caller to give to the successor.

use super::exchange;
use super::pool::{Local, LocalPool, Replaced};
use super::slots::Slots;
use super::{LeaseOutcome, LeaseRequest, Lessees, Pool, PoolState, Quiesced};
use crate::clock::Clock;
use crate::error::AcquireError;
use crate::pass::Passes;
use crate::policy::Policy;
use crate::state::Layout;
use crate::sync::{AtomicU64, Ordering};

/// One policy of a leased bucket and the state it decides on.
pub(super) struct Epoch<P> {
    pub(super) pool: P,
    pub(super) slots: Slots,
    pub(super) policy: Policy,
    pub(super) max_lease: u64,
    /// `log2(slots) + 1`: a lease is at most `spare >> lease_shift`.
    pub(super) lease_shift: u32,
    /// `2 * slots * max_lease` in units, saturated: a bound on tokens outside the global
    /// word (twice the tightest, see `Epoch::new`).
    pub(super) max_outstanding_units: u64,
    /// `slots * max_lease` in units, saturated: a bound on tokens held in OPEN slots.
    pub(super) max_held_units: u64,
    /// When the pool and the slots are next re-anchored against the tick wrap.
    pub(super) passes: Passes,
    /// Non-zero while a reconfiguration replaces this epoch (set before it closes the
    /// slots, cleared only if it unwinds).
    replacing: AtomicU64,
}

impl<P: Pool> Epoch<P> {
    pub(super) fn new(
        policy: Policy,
        slots: usize,
        max_lease: u64,
        pool: P,
        passes: Passes,
    ) -> Epoch<P> {
        let layout = policy.layout();
        // Per slot: its OPEN tokens, or one hand's (a lessee's, or, closed, a closer's or a
        // cancelled lessee's), at most one lease. The bound that decides when a credit
        // quiesces counts twice that: a margin that costs quiescing, never credit (the
        // reserve a credit is capped by counts one lease per slot, see `quiesce`).
        let held = (max_lease as u128 * slots as u128) << layout.frac_bits();
        let outstanding = 2 * held;
        Epoch {
            pool,
            slots: Slots::new(slots, layout.tick_bits()),
            policy,
            max_lease,
            lease_shift: slots.trailing_zeros() + 1,
            max_outstanding_units: u64::try_from(outstanding).unwrap_or(u64::MAX),
            max_held_units: u64::try_from(held).unwrap_or(u64::MAX),
            passes,
            replacing: AtomicU64::new(0),
        }
    }

    /// The pool as a [`LocalPool`], whose word a reconfiguration may seal; `None` for
    /// any other pool (never sealed). Resolved at compile time for each pool type.
    #[inline(always)]
    pub(super) fn local(&self) -> Option<&LocalPool> {
        self.pool.as_local(Local)
    }

    /// Claims the right to replace this epoch: `false` when another reconfiguration
    /// holds it.
    pub(super) fn claim_replacement(&self) -> bool {
        self.replacing
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Gives the claim up again (a reconfiguration that unwinds).
    pub(super) fn drop_replacement(&self) {
        self.replacing.store(0, Ordering::Release);
    }

    /// Whether a reconfiguration is replacing this epoch.
    pub(super) fn is_replacing(&self) -> bool {
        self.replacing.load(Ordering::Acquire) != 0
    }

    pub(super) fn other_slots(&self, keep: Option<usize>) -> OtherSlots<'_> {
        OtherSlots {
            slots: &self.slots,
            keep,
            frac_bits: self.policy.layout().frac_bits(),
            lease_shift: self.lease_shift,
            max_lease: self.max_lease,
            max_outstanding_units: self.max_outstanding_units,
            closed: false,
        }
    }

    /// [`Pool::peek`], or [`Replaced`] on a sealed word.
    #[inline]
    pub(super) fn peek(&self, layout: &Layout, now: u64) -> Result<PoolState, Replaced> {
        match self.local() {
            Some(local) => local.peek_in(layout, now),
            None => Ok(self.pool.peek(layout, now)),
        }
    }

    /// [`Pool::reread`], or [`Replaced`] on a sealed word.
    pub(super) fn reread<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
    ) -> Result<Result<(PoolState, u64), AcquireError>, Replaced> {
        match self.local() {
            Some(local) => local.reread_in(layout, clock),
            None => Ok(self.pool.reread(layout, clock)),
        }
    }

    /// [`Pool::lease`], or [`Replaced`] (with the units in hand) on a sealed word.
    pub(super) fn lease<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
        request: LeaseRequest,
        lessees: &mut impl Lessees,
    ) -> Result<Result<LeaseOutcome, AcquireError>, Replaced> {
        match self.local() {
            Some(local) => local.lease_in(layout, clock, request, lessees),
            None => Ok(self.pool.lease(layout, clock, request, lessees)),
        }
    }

    /// [`Pool::give_back`], or [`Replaced`] (with the units) on a sealed word.
    pub(super) fn give_back(&self, layout: &Layout, units: u64) -> Result<(), Replaced> {
        match self.local() {
            Some(local) => local.give_back_in(layout, units),
            None => {
                self.pool.give_back(layout, units);
                Ok(())
            }
        }
    }

    /// [`Pool::credit`], or [`Replaced`] (with what quiescing took) on a sealed word.
    pub(super) fn credit(
        &self,
        layout: &Layout,
        now: u64,
        units: u64,
        lessees: &mut impl Lessees,
    ) -> Result<(), Replaced> {
        match self.local() {
            Some(local) => local.credit_in(layout, now, units, lessees),
            None => {
                self.pool.credit(layout, now, units, lessees);
                Ok(())
            }
        }
    }

    /// The pool re-anchored at `now` ([`LocalPool::reanchor_in`]), or [`Replaced`] on a
    /// sealed word; another pool that [`wraps`](Pool::wraps) is credited nothing at
    /// `now`, and one that does not keeps its own time.
    pub(super) fn reanchor_pool<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
        now: u64,
    ) -> Result<(), Replaced> {
        match self.local() {
            Some(local) => local.reanchor_in(layout, clock, now),
            None if self.pool.wraps() => {
                let mut others = self.other_slots(None);
                let out = self.credit(layout, now, 0, &mut others);
                others.release();
                out
            }
            None => Ok(()),
        }
    }

    /// [`Pool::reset`], or [`Replaced`] on a sealed word.
    pub(super) fn reset_pool<C: Clock + ?Sized>(
        &self,
        layout: &Layout,
        clock: &C,
        now: u64,
        full: bool,
        lessees: &mut impl Lessees,
    ) -> Result<(), Replaced> {
        match self.local() {
            Some(local) => local.reset_in(layout, clock, now, full, lessees),
            None => {
                self.pool.reset(layout, now, full, lessees);
                Ok(())
            }
        }
    }

    /// The pool full at `now`'s next tick edge, whatever it held ([`LocalPool::fill_in`],
    /// as a plain bucket's idle pass stores), or [`Replaced`] on a sealed word; another
    /// pool is reset full.
    pub(super) fn fill_pool(
        &self,
        layout: &Layout,
        now: u64,
        lessees: &mut impl Lessees,
    ) -> Result<(), Replaced> {
        match self.local() {
            Some(local) => local.fill_in(layout, now, lessees),
            None => {
                self.pool.reset(layout, now, true, lessees);
                Ok(())
            }
        }
    }
}

/// The lessees as one exchange with the pool sees them: every slot but the caller's own
/// marked one.
pub(super) struct OtherSlots<'a> {
    slots: &'a Slots,
    keep: Option<usize>,
    frac_bits: u32,
    lease_shift: u32,
    max_lease: u64,
    max_outstanding_units: u64,
    closed: bool,
}

impl OtherSlots<'_> {
    /// Reopens what this exchange closed.
    pub(super) fn release(self) {
        if self.closed {
            self.slots.reopen(self.keep);
        }
    }
}

impl Lessees for OtherSlots<'_> {
    #[inline]
    fn max_outstanding_units(&self) -> u64 {
        self.max_outstanding_units
    }

    fn quiesce(&mut self) -> Quiesced {
        if self.closed {
            return Quiesced::default();
        }
        self.closed = true;
        let found = self.slots.close(self.keep);
        // Each slot that was not OPEN has at most one hand holding its tokens, and at most
        // one lease of them (see `Slots::close`): a LEASING slot's lessee, or, for a slot
        // already closed, either the closer that took its OPEN tokens or the lessee whose
        // lease that close cancelled, never both. Whatever this reserves beyond what those
        // hands hold is credit withheld for good.
        let mut closed = found.closed_with_hand;
        if mutant!(RESERVE_COUNTS_CLOSED_TWICE) {
            closed = found.closed.saturating_mul(2);
        }
        if mutant!(RESERVE_SKIPS_CLOSED_SLOTS) {
            closed = 0;
        }
        let in_flight = found
            .leasing
            .saturating_add(closed)
            .saturating_mul(self.max_lease);
        Quiesced {
            taken_units: found.taken << self.frac_bits,
            in_flight_units: in_flight.saturating_mul(1 << self.frac_bits),
        }
    }

    #[inline]
    fn lease_units(&self, spare: u64) -> u64 {
        exchange::lease_units(spare, self.frac_bits, self.lease_shift, self.max_lease)
    }
}
