//! [`Core`]: one policy, its word and its re-anchoring passes.

use crossbeam_utils::CachePadded;

use super::raw::RawBucket;
use super::seal::{Fixed, SEALED_ERROR, Seal};
use crate::clock::{Clock, Monotonic};
use crate::decision::Decision;
use crate::error::{AcquireError, cost_exceeds_capacity};
use crate::pass::Passes;
use crate::policy::Policy;
use crate::state::Snapshot;

/// One policy and its word: a [`Bucket`]'s state (`Core<Fixed>`), and one policy epoch
/// of a [`LiveBucket`](crate::LiveBucket) or a scoped limiter's global word
/// (`Core<Sealable>`). Its operations take the limiter's clock; `S` says whether the word
/// may be sealed (see [`Seal`]).
// `repr(C)`: the due time of the next pass sits right after the word's padded line, on
// the line that holds the layout every operation reads.
#[repr(C)]
pub(crate) struct Core<S: Seal = Fixed> {
    raw: CachePadded<RawBucket<S>>,
    /// When the word is next re-anchored against the tick wrap (see [`crate::pass`]).
    passes: Passes,
    policy: Policy,
}

impl<S: Seal> Core<S> {
    /// A policy's state at `created`: `word`, or the policy's start state.
    pub(crate) fn new(policy: Policy, created: u64, word: Option<u64>) -> Core<S> {
        let layout = policy.layout();
        let raw = match word {
            Some(word) => RawBucket::from_word(word),
            None => RawBucket::new(layout, created, policy.starts_full()),
        };
        Core {
            raw: CachePadded::new(raw),
            passes: Passes::new(layout, created),
            policy,
        }
    }

    /// `from`'s policy holding `word` (a state of `from`, read at its seal) from the
    /// switch reading `at`, its passes due no later than `from`'s: a word whose policy a
    /// switch does not change, carried over untouched.
    pub(crate) fn carried(from: &Core<S>, word: u64, at: u64) -> Core<S> {
        let timing = crate::pass::Timing::of(from.policy.layout());
        Core {
            raw: CachePadded::new(RawBucket::from_word(word)),
            passes: Passes::continuing(&from.passes, timing, at),
            policy: from.policy,
        }
    }

    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    pub(crate) fn raw(&self) -> &RawBucket<S> {
        &self.raw
    }

    pub(crate) fn passes(&self) -> &Passes {
        &self.passes
    }

    /// `now` (a guarded reading), after the re-anchoring pass if one is due: one relaxed
    /// load and a predicted branch otherwise. See [`crate::pass`]. A pass on a sealed
    /// word writes nothing: the operation then finds it sealed.
    #[inline(always)]
    pub(crate) fn at<C: Clock + ?Sized>(&self, clock: &Monotonic<C>, now: u64) -> u64 {
        self.passes
            .check(now, clock, |now, idle| self.pass::<C>(clock, now, idle))
    }

    /// The re-anchoring pass: the word refilled to `now` at its own tick, or, after an
    /// idle longer than the fill time (`idle`), full.
    #[cold]
    #[inline(never)]
    fn pass<C: Clock + ?Sized>(&self, clock: &Monotonic<C>, now: u64, idle: bool) {
        let layout = self.policy.layout();
        // A sealed word is left as it is: its policy has been replaced.
        let _sealed = if idle {
            self.raw.fill(layout, now)
        } else {
            self.raw.reanchor(layout, clock, now)
        };
    }

    /// [`Bucket::try_acquire`] at the guarded reading `now`; [`SEALED_ERROR`] on a sealed
    /// word.
    #[inline(always)]
    pub(crate) fn try_acquire<C: Clock + ?Sized>(
        &self,
        clock: &Monotonic<C>,
        now: u64,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        if self.passes.is_due(now) {
            return self.acquire_due::<C>(clock, now, cost);
        }
        self.raw.try_acquire(self.policy.layout(), clock, now, cost)
    }

    /// [`try_acquire`](Core::try_acquire) where the word's first attempt decides (see
    /// [`RawBucket::try_first`]); `None`, having written nothing, where it does not or a
    /// pass is due.
    #[inline(always)]
    pub(crate) fn try_first<C: Clock + ?Sized>(
        &self,
        clock: &Monotonic<C>,
        now: u64,
        cost: u64,
    ) -> Option<Result<Decision, AcquireError>> {
        if self.passes.is_due(now) {
            return None;
        }
        self.raw.try_first(self.policy.layout(), clock, now, cost)
    }

    /// [`try_acquire`](Core::try_acquire) at a reading at or after the re-anchoring
    /// pass's due time: a decision that writes nothing (a rejection, a zero cost) is
    /// made read-only on the pass's view (see [`crate::pass`]), so it still writes
    /// nothing; an admission runs the pass first.
    #[cold]
    #[inline(never)]
    pub(crate) fn acquire_due<C: Clock + ?Sized>(
        &self,
        clock: &Monotonic<C>,
        now: u64,
        cost: u64,
    ) -> Result<Decision, AcquireError> {
        let layout = self.policy.layout();
        let Some(cost_units) = layout.units_of(cost) else {
            return Err(cost_exceeds_capacity(layout, cost));
        };
        if !self.passes.idle_at(now) {
            // The word reads exactly.
            if cost_units == 0 {
                return self.raw.try_acquire(layout, clock, now, cost);
            }
            match S::result(self.raw.refusal(layout, now, cost)) {
                Ok(Some(refusal)) => return Ok(refusal),
                Ok(None) => {}
                Err(_) => return Err(SEALED_ERROR),
            }
        } else if cost_units == 0 {
            if S::check(self.raw.load()).is_err() {
                return Err(SEALED_ERROR);
            }
            let full = layout.reanchor_full(layout.tick_of(now));
            return Ok(Decision::new(layout, &full, now, cost, 0, true));
        }
        let now = self.at::<C>(clock, now);
        self.raw.try_acquire(layout, clock, now, cost)
    }

    /// [`Bucket::refund`].
    pub(crate) fn refund<C: Clock + ?Sized>(
        &self,
        clock: &Monotonic<C>,
        cost: u64,
    ) -> S::Out<Result<(), AcquireError>> {
        let layout = self.policy.layout();
        let Some(units) = layout.units_of(cost) else {
            return S::out(Ok(Err(cost_exceeds_capacity(layout, cost))));
        };
        if units == 0 {
            return S::out(Ok(Ok(())));
        }
        let now = self.at::<C>(clock, clock.now_nanos());
        S::out(S::result(self.raw.refund_units(layout, clock, now, units)).map(Ok))
    }

    /// [`Bucket::reset`].
    pub(crate) fn reset<C: Clock + ?Sized>(&self, clock: &Monotonic<C>) -> S::Out<()> {
        let now = self.at::<C>(clock, clock.now_nanos());
        self.raw
            .reset(self.policy.layout(), clock, now, self.policy.starts_full())
    }

    /// The snapshot a decision at the guarded reading `now` sees, writing nothing: the
    /// pass's view once one is due (full after an idle longer than the fill time).
    pub(crate) fn view(&self, now: u64) -> S::Out<Snapshot> {
        let layout = self.policy.layout();
        let word = self.raw.load();
        S::out(S::check(word).map(|()| {
            if self.passes.is_due(now) && self.passes.idle_at(now) {
                layout.reanchor_full(layout.tick_of(now))
            } else {
                layout.refill(word, layout.tick_of(now))
            }
        }))
    }

    /// [`Bucket::available`].
    pub(crate) fn available<C: Clock + ?Sized>(&self, clock: &Monotonic<C>) -> S::Out<f64> {
        let layout = self.policy.layout();
        S::out(
            S::result(self.view(clock.now_nanos()))
                .map(|snapshot| layout.units_to_tokens(layout.balance_units(&snapshot))),
        )
    }
}
