//! Re-anchoring passes: what keeps a word that idles past its tick wrap reading its true
//! balance.
//!
//! A word's tick field wraps (see [`state`](crate::state)): a reading less than the wrap
//! period less the back window after the word's last write reads the idle exactly; a
//! later one reads it modulo the wrap. So every limiter re-anchors its words before that:
//! each operation compares its clock reading with the time the next pass is due (one
//! relaxed load and a predicted branch), and the first operation at or after that time
//! runs the pass, which rewrites the limiter's words refilled to its reading (exact:
//! refill is exact on the tick grid). Passes are [`Timing::period`] apart: days for the
//! shortest wraps, years for ordinary policies.
//!
//! When the limiter was left untouched so long that the pass runs [`Timing::idle_after`]
//! or more past its due time, every word was last written before the due time (an
//! operation that writes at a reading at or after it runs or waits for the pass first),
//! more than the fill time ago: each is full, however it reads after an idle that may
//! exceed the wrap, and the pass writes it full.
//!
//! On a plain [`Bucket`](crate::Bucket) (and the buckets of an all-or-nothing
//! acquisition), operations that write nothing (a rejection, a peek) do not run the
//! pass: they decide on the same view read-only ([`Passes::idle_at`]): the word as it
//! reads before `idle_after` past the due time (exact, as the pass would read it), a full
//! word from then on. So a bucket's rejection still writes nothing (I5), and a bucket
//! that only ever rejects reads its true balance after any idle. Keyed maps, leased
//! buckets and scoped limiters run the pass on whatever operation comes first, once per
//! period.
//!
//! The due time is a `std` atomic even under loom: passes are days apart and never come
//! due in a model, and an extra load in every operation would multiply the interleavings
//! the models explore.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock::Clock;
use crate::state::Layout;

/// The due time while a pass runs: every reading is at or after it, so operations
/// arriving meanwhile wait.
const RUNNING: u64 = 0;

/// A pass's timing for one layout, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timing {
    /// From one pass to the next.
    pub(crate) period: u64,
    /// From a pass's due time on, every word has idled for longer than the fill time.
    pub(crate) idle_after: u64,
}

impl Timing {
    /// With `tick` the tick length, `fill` the fill time (any balance refills to full
    /// within it) and `M` the wrap period less the back window (readings less than `M`
    /// after a word's last write read it exactly):
    ///
    /// - `idle_after = fill + 2 ticks`: a pass running that long past its due time finds
    ///   every word written before the due time (at a tick at most one past the due
    ///   time's, a write near full anchoring at the next edge), so at least `fill` ago:
    ///   full.
    /// - `period = (M - fill - 3 ticks) / 2`: a pass running less than `idle_after` past
    ///   its due time is less than `period + fill + 2 ticks <= M - tick - period` after
    ///   the last one, so it reads every word exactly, with `period` to spare for an
    ///   operation descheduled between its clock reading and its write. Every layout
    ///   wraps after at least twice the fill time plus the back window, so `M >= 2 * fill`,
    ///   and with wraps of at least 2^50 ns the period is days at least.
    pub(crate) fn of(layout: &Layout) -> Timing {
        let tick = 1u64 << layout.tick_shift();
        let fill = layout.fill_ticks().saturating_mul(tick);
        let idle_after = fill.saturating_add(2 * tick);
        let m = exact_for_nanos(layout);
        let period = (m.saturating_sub(idle_after.saturating_add(tick)) / 2).max(tick);
        Timing { period, idle_after }
    }

    /// The timing after a switch from `self`'s layout to `next`'s: the shorter period
    /// (words of both layouts exist until every shard is converted), and `next`'s idle
    /// time: old words are converted as of the switch reading, which is before the next
    /// pass's due time, and only refill under `next` after it.
    pub(crate) fn merge(self, next: Timing) -> Timing {
        Timing {
            period: self.period.min(next.period),
            idle_after: next.idle_after,
        }
    }
}

/// The longest time a word of `layout` may go unwritten and still read its idle time
/// exactly: the wrap period less the back window, in nanoseconds (saturating).
pub(crate) fn exact_for_nanos(layout: &Layout) -> u64 {
    let wrap = u64::try_from(layout.wrap_period().as_nanos()).unwrap_or(u64::MAX);
    let back = layout
        .back_window_ticks()
        .saturating_mul(1 << layout.tick_shift());
    wrap.saturating_sub(back)
}

/// The due time of a limiter's next pass, and its timing.
pub(crate) struct Passes {
    due: AtomicU64,
    timing: Timing,
}

impl std::fmt::Debug for Passes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Passes")
            .field("due", &self.due.load(Ordering::Relaxed))
            .field("timing", &self.timing)
            .finish()
    }
}

impl Passes {
    /// The passes of a limiter of `layout` created at `created`: the first one a period
    /// later.
    pub(crate) fn new(layout: &Layout, created: u64) -> Passes {
        let timing = Timing::of(layout);
        Passes {
            due: AtomicU64::new(created.saturating_add(timing.period).max(RUNNING + 1)),
            timing,
        }
    }

    /// The passes after a reconfiguration at `at` of a limiter whose passes were `old`:
    /// with `timing`, due a period after `at` or at `old`'s due time, whichever comes
    /// first (now, if `old`'s pass is running).
    pub(crate) fn continuing(old: &Passes, timing: Timing, at: u64) -> Passes {
        let old_due = match old.due.load(Ordering::Acquire) {
            RUNNING => at,
            due => due,
        };
        Passes {
            due: AtomicU64::new(
                old_due
                    .min(at.saturating_add(timing.period))
                    .max(RUNNING + 1),
            ),
            timing,
        }
    }

    /// The timing of these passes.
    pub(crate) fn timing(&self) -> Timing {
        self.timing
    }

    /// Whether a pass is due at `now` (or running): one relaxed load.
    #[inline(always)]
    pub(crate) fn is_due(&self, now: u64) -> bool {
        now >= self.due.load(Ordering::Relaxed)
    }

    /// For an operation that writes nothing at `now`, once [`is_due`](Passes::is_due):
    /// whether the limiter idled so long that its words are full (`true`), or they read
    /// exactly as they are (`false`). Waits for a pass another thread runs.
    #[cold]
    pub(crate) fn idle_at(&self, now: u64) -> bool {
        loop {
            let due = self.due.load(Ordering::Acquire);
            if due != RUNNING {
                return self.idle_since(due, now);
            }
            crate::sync::yield_now();
        }
    }

    /// Runs the pass first if it is due at `now` (`pass(reading, idle)` rewrites the
    /// limiter's words; `idle`: every word idled for longer than the fill time, write it
    /// full) and returns the reading to decide on: `now`, or a fresh one from `clock`
    /// after waiting for another thread's pass. One relaxed load and a comparison when
    /// nothing is due.
    #[inline(always)]
    pub(crate) fn check<C: Clock + ?Sized>(
        &self,
        now: u64,
        clock: &C,
        pass: impl FnOnce(u64, bool),
    ) -> u64 {
        if now < self.due.load(Ordering::Relaxed) {
            return now;
        }
        self.due_or_running(now, clock, pass)
    }

    #[cold]
    #[inline(never)]
    fn due_or_running<C: Clock + ?Sized>(
        &self,
        now: u64,
        clock: &C,
        pass: impl FnOnce(u64, bool),
    ) -> u64 {
        let mut due = self.due.load(Ordering::Acquire);
        loop {
            if due == RUNNING {
                // Another thread runs the pass: wait for it (once per period, for the
                // time a pass takes), then read the clock again.
                crate::sync::yield_now();
                due = self.due.load(Ordering::Acquire);
                if due != RUNNING {
                    return clock.now_nanos().max(now);
                }
                continue;
            }
            if now < due {
                return now;
            }
            match self.claim(due, now) {
                Ok(_running) => {
                    pass(now, self.idle_since(due, now));
                    return now;
                }
                Err(actual) => due = actual,
            }
        }
    }

    /// Runs the pass now, due or not (after one another thread runs, if any), at a
    /// reading of `clock` taken once it is claimed: what a limiter's explicit `sweep`
    /// does. The next pass is then due a period later.
    pub(crate) fn run_now<C: Clock + ?Sized, R>(
        &self,
        clock: &C,
        pass: impl FnOnce(u64, bool) -> R,
    ) -> R {
        loop {
            let due = self.due.load(Ordering::Acquire);
            if due == RUNNING {
                crate::sync::yield_now();
                continue;
            }
            let now = clock.now_nanos();
            if let Ok(_running) = self.claim(due, now) {
                return pass(now, self.idle_since(due, now));
            }
        }
    }

    /// Whether a pass at `now` for the one due at `due` finds every word idle for longer
    /// than the fill time. Not `due + idle_after`, which saturates at the top of the
    /// clock's range (a pass there would then find the words idle again and again).
    fn idle_since(&self, due: u64, now: u64) -> bool {
        now.checked_sub(due)
            .is_some_and(|d| d >= self.timing.idle_after)
    }

    /// Marks the pass due at `due` as running, for the caller to run at `now`; the next
    /// one is due a period after `now` once the returned guard is dropped.
    fn claim(&self, due: u64, now: u64) -> Result<Running<'_>, u64> {
        self.due
            .compare_exchange(due, RUNNING, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| Running {
                due: &self.due,
                next: now.saturating_add(self.timing.period).max(RUNNING + 1),
            })
    }
}

/// A claimed pass: stores the next due time when dropped, even if the pass panics (the
/// due time must not stay `RUNNING`).
struct Running<'a> {
    due: &'a AtomicU64,
    next: u64,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.due.store(self.next, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ManualClock, Policy};

    #[test]
    fn a_pass_runs_once_when_due_and_reports_an_idle_past_the_fill_time() {
        let policy = Policy::new(166, 3.173e9).unwrap();
        let layout = policy.layout();
        let passes = Passes::new(layout, 0);
        let t = passes.timing;
        assert!(t.period > t.idle_after, "{t:?}");
        let mut runs = Vec::new();
        assert_eq!(
            passes.check(t.period - 1, &ManualClock::new(), |n, i| runs.push((n, i))),
            t.period - 1
        );
        assert!(runs.is_empty());
        passes.check(t.period, &ManualClock::new(), |n, i| runs.push((n, i)));
        passes.check(t.period + 1, &ManualClock::new(), |n, i| runs.push((n, i)));
        assert_eq!(runs, [(t.period, false)]);
        let late = 2 * t.period + t.idle_after;
        passes.check(late, &ManualClock::new(), |n, i| runs.push((n, i)));
        assert_eq!(runs[1], (late, true));
        // Wrap and timing: a pass on time, and one `idle_after` late, both fall within
        // the span a word reads exactly.
        assert!(
            2 * t.period + t.idle_after + (1 << layout.tick_shift()) <= exact_for_nanos(layout)
        );
    }
}
