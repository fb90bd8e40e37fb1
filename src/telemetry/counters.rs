//! Admission counters: one block of eight per scope key, striped for the global scope.

use std::fmt;
use std::ops::{Add, AddAssign};

use crossbeam_utils::CachePadded;

use crate::attempt::Attempt;
use crate::sync::thread_index;
use crate::sync::{AtomicU64, Ordering};

/// Counters per attempt kind: admitted requests, admitted tokens, rejected requests,
/// rejected tokens.
const PER_ATTEMPT: usize = 4;
const ADMITTED_REQUESTS: usize = 0;
const ADMITTED_TOKENS: usize = 1;
const REJECTED_REQUESTS: usize = 2;
const REJECTED_TOKENS: usize = 3;
/// Offset of the retry counters (original attempts come first).
const RETRY: usize = PER_ATTEMPT;
const CELLS: usize = 2 * PER_ATTEMPT;

/// Requests and tokens admitted and rejected, for one kind of attempt.
///
/// Tokens are whole tokens of the scope's own cost (a work class may cost a different
/// amount in each scope). "Rejected" counts the requests *this* scope refused: in an
/// all-or-nothing acquisition over several scopes, a scope that admitted and was then
/// rolled back because another scope refused counts neither.
///
/// Every count is modulo `2^64`: the counters wrap (an atomic `fetch_add` does), and so do
/// sums of tallies ([`Add`](std::ops::Add), [`requests`](Tally::requests)), which never
/// panic. A token counter at a billion tokens a second wraps after 584 years; a consumer
/// that takes differences of snapshots (`later - earlier`, with `wrapping_sub`) stays
/// exact across a wrap.
///
/// ```
/// use tokengate::telemetry::Tally;
/// let a = Tally { admitted_requests: 2, admitted_tokens: 6, ..Tally::default() };
/// let b = Tally { rejected_requests: 1, rejected_tokens: 20, ..Tally::default() };
/// let sum = a + b;
/// assert_eq!(sum.requests(), 3);
/// assert_eq!(sum.admitted_tokens, 6);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tally {
    /// Requests admitted.
    pub admitted_requests: u64,
    /// Tokens spent by admitted requests.
    pub admitted_tokens: u64,
    /// Requests this scope refused.
    pub rejected_requests: u64,
    /// Tokens asked for by the refused requests.
    pub rejected_tokens: u64,
}

impl Tally {
    /// Admitted plus rejected requests, wrapping at `2^64` as the counters do (see
    /// [`Tally`]).
    ///
    /// ```
    /// use tokengate::telemetry::Tally;
    /// let t = Tally { admitted_requests: 5, rejected_requests: 2, ..Tally::default() };
    /// assert_eq!(t.requests(), 7);
    /// ```
    pub fn requests(&self) -> u64 {
        self.admitted_requests.wrapping_add(self.rejected_requests)
    }
}

/// Field by field, wrapping at `2^64` as the counters do (see [`Tally`]): never a panic,
/// whatever the values.
impl Add for Tally {
    type Output = Tally;

    fn add(self, other: Tally) -> Tally {
        Tally {
            admitted_requests: self.admitted_requests.wrapping_add(other.admitted_requests),
            admitted_tokens: self.admitted_tokens.wrapping_add(other.admitted_tokens),
            rejected_requests: self.rejected_requests.wrapping_add(other.rejected_requests),
            rejected_tokens: self.rejected_tokens.wrapping_add(other.rejected_tokens),
        }
    }
}

impl AddAssign for Tally {
    fn add_assign(&mut self, other: Tally) {
        *self = *self + other;
    }
}

/// The counters of one scope key, original attempts and retries apart.
///
/// ```
/// use tokengate::{telemetry::Attempt, KeyedLimiter, ManualClock, Policy};
///
/// let limiter = KeyedLimiter::<u64, _>::builder(Policy::new(10, 1.0)?, 1000)
///     .clock(ManualClock::new())
///     .counters(true)
///     .build()?;
/// limiter.try_acquire_as(&7, 8, Attempt::Original)?;
/// limiter.try_acquire_as(&7, 8, Attempt::Original)?; // rejected: 2 left
/// limiter.try_acquire_as(&7, 2, Attempt::Retry(1))?;
///
/// let c = limiter.counters(&7).unwrap();
/// assert_eq!(c.original.admitted_tokens, 8);
/// assert_eq!(c.original.rejected_requests, 1);
/// assert_eq!(c.retry.admitted_requests, 1);
/// assert_eq!(c.total().requests(), 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Cost on the hot path
///
/// Counting is two relaxed `fetch_add`s per scope paid, and never a write that every core
/// contends on:
///
/// - A keyed scope's counters live in the key's own map entry, next to its bucket word:
///   only the requests of that key write them.
/// - The global scope is paid by every request, so one counter block would be a line every
///   core writes. Its counters are *striped*: one cache-padded block per stripe, a thread
///   always writing the stripe it was given on first use (round robin), and a snapshot
///   sums the stripes. Threads contend only when there are more of them than stripes
///   (the stripe count is the machine's parallelism rounded up to a power of two).
///
/// Each counter is exact. A snapshot reads the counters one by one while requests may be
/// counting, so it is not an atomic cut across all of them: a request in flight may show
/// in its request count and not yet in its token count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CounterSnapshot {
    /// First attempts.
    pub original: Tally,
    /// Retries, whatever their number.
    pub retry: Tally,
}

impl CounterSnapshot {
    /// Original attempts and retries together.
    pub fn total(&self) -> Tally {
        self.original + self.retry
    }
}

impl Add for CounterSnapshot {
    type Output = CounterSnapshot;

    fn add(self, other: CounterSnapshot) -> CounterSnapshot {
        CounterSnapshot {
            original: self.original + other.original,
            retry: self.retry + other.retry,
        }
    }
}

impl AddAssign for CounterSnapshot {
    fn add_assign(&mut self, other: CounterSnapshot) {
        *self = *self + other;
    }
}

/// One block of eight counters (64 bytes), written with relaxed `fetch_add`s: the counts
/// publish no other memory.
pub(crate) struct CounterCells {
    cells: [AtomicU64; CELLS],
}

impl Default for CounterCells {
    fn default() -> Self {
        CounterCells {
            cells: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl fmt::Debug for CounterCells {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.snapshot().fmt(f)
    }
}

impl CounterCells {
    /// Counts one request of `tokens`, admitted or rejected.
    #[inline]
    pub(crate) fn record(&self, admitted: bool, tokens: u64, attempt: Attempt) {
        let base = if attempt.is_original() { 0 } else { RETRY }
            + if admitted {
                ADMITTED_REQUESTS
            } else {
                REJECTED_REQUESTS
            };
        self.cells[base].fetch_add(1, Ordering::Relaxed);
        // Tokens sit right after their request count (ADMITTED_TOKENS, REJECTED_TOKENS).
        self.cells[base + 1].fetch_add(tokens, Ordering::Relaxed);
    }

    /// Adds a snapshot (used to fold an evicted key's counts into its map's total).
    pub(crate) fn add(&self, s: &CounterSnapshot) {
        for (offset, t) in [(0, &s.original), (RETRY, &s.retry)] {
            let values = [
                (ADMITTED_REQUESTS, t.admitted_requests),
                (ADMITTED_TOKENS, t.admitted_tokens),
                (REJECTED_REQUESTS, t.rejected_requests),
                (REJECTED_TOKENS, t.rejected_tokens),
            ];
            for (i, v) in values {
                if v != 0 {
                    self.cells[offset + i].fetch_add(v, Ordering::Relaxed);
                }
            }
        }
    }

    pub(crate) fn snapshot(&self) -> CounterSnapshot {
        let tally = |o: usize| Tally {
            admitted_requests: self.cells[o + ADMITTED_REQUESTS].load(Ordering::Relaxed),
            admitted_tokens: self.cells[o + ADMITTED_TOKENS].load(Ordering::Relaxed),
            rejected_requests: self.cells[o + REJECTED_REQUESTS].load(Ordering::Relaxed),
            rejected_tokens: self.cells[o + REJECTED_TOKENS].load(Ordering::Relaxed),
        };
        CounterSnapshot {
            original: tally(0),
            retry: tally(RETRY),
        }
    }
}

/// Counter blocks on separate cache lines; each thread writes the block it was assigned
/// on first use, and a snapshot sums them.
pub(crate) struct StripedCounters {
    stripes: Box<[CachePadded<CounterCells>]>,
    mask: usize,
}

impl fmt::Debug for StripedCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StripedCounters")
            .field("stripes", &self.stripes.len())
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

impl StripedCounters {
    /// One stripe per hardware thread, rounded up to a power of two (at most 64).
    pub(crate) fn new() -> StripedCounters {
        let n = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .next_power_of_two()
            .min(64);
        StripedCounters {
            stripes: (0..n)
                .map(|_| CachePadded::new(CounterCells::default()))
                .collect(),
            mask: n - 1,
        }
    }

    #[inline]
    pub(crate) fn record(&self, admitted: bool, tokens: u64, attempt: Attempt) {
        // Which stripe a thread writes never changes a count, only where it lands.
        self.stripes[thread_index() & self.mask].record(admitted, tokens, attempt);
    }

    pub(crate) fn snapshot(&self) -> CounterSnapshot {
        self.stripes
            .iter()
            .fold(CounterSnapshot::default(), |acc, s| acc + s.snapshot())
    }
}

/// Where a bucket's counts go: nowhere, a key's own block, or striped blocks.
#[derive(Clone, Copy, Debug)]
pub(crate) enum CounterRef<'a> {
    Off,
    Cells(&'a CounterCells),
    Striped(&'a StripedCounters),
}

impl CounterRef<'_> {
    /// The counts, or `None` when counting is off.
    pub(crate) fn snapshot(self) -> Option<CounterSnapshot> {
        match self {
            CounterRef::Off => None,
            CounterRef::Cells(c) => Some(c.snapshot()),
            CounterRef::Striped(c) => Some(c.snapshot()),
        }
    }

    /// Counts one request where counting is on: a bucket without counters pays one
    /// compare here, not a call.
    #[inline(always)]
    pub(crate) fn record(self, admitted: bool, tokens: u64, attempt: Attempt) {
        if !matches!(self, CounterRef::Off) {
            self.record_on(admitted, tokens, attempt);
        }
    }

    #[inline]
    fn record_on(self, admitted: bool, tokens: u64, attempt: Attempt) {
        match self {
            CounterRef::Off => {}
            CounterRef::Cells(c) => c.record(admitted, tokens, attempt),
            CounterRef::Striped(c) => c.record(admitted, tokens, attempt),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn record_lands_in_the_attempt_and_outcome_it_names() {
        let c = CounterCells::default();
        c.record(true, 3, Attempt::Original);
        c.record(false, 20, Attempt::Original);
        c.record(true, 1, Attempt::Retry(2));
        c.record(false, 5, Attempt::Retry(1));
        let s = c.snapshot();
        let t = |ar, at, rr, rt| Tally {
            admitted_requests: ar,
            admitted_tokens: at,
            rejected_requests: rr,
            rejected_tokens: rt,
        };
        assert_eq!(s.original, t(1, 3, 1, 20));
        assert_eq!(s.retry, t(1, 1, 1, 5));
    }

    #[test]
    fn striped_counters_sum_every_threads_stripe() {
        let c = StripedCounters::new();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        c.record(true, 2, Attempt::Original);
                    }
                });
            }
        });
        let s = c.snapshot();
        assert_eq!(s.original.admitted_requests, 4000);
        assert_eq!(s.original.admitted_tokens, 8000);
    }

    #[test]
    fn add_folds_a_snapshot_exactly() {
        let a = CounterCells::default();
        a.record(true, 3, Attempt::Original);
        a.record(false, 4, Attempt::Retry(1));
        let b = CounterCells::default();
        b.add(&a.snapshot());
        b.add(&a.snapshot());
        assert_eq!(b.snapshot(), a.snapshot() + a.snapshot());
    }

    #[test]
    fn tally_sums_wrap_at_two_to_the_sixty_four_as_the_counters_do() {
        let near = Tally {
            admitted_requests: u64::MAX,
            admitted_tokens: u64::MAX - 1,
            rejected_requests: 1,
            rejected_tokens: u64::MAX,
        };
        let more = Tally {
            admitted_requests: 2,
            admitted_tokens: 3,
            rejected_requests: 4,
            rejected_tokens: 5,
        };
        let mut sum = near + more;
        assert_eq!(
            sum,
            Tally {
                admitted_requests: 1,
                admitted_tokens: 1,
                rejected_requests: 5,
                rejected_tokens: 4,
            }
        );
        assert_eq!(near.requests(), 0);
        sum += near;
        assert_eq!(sum.admitted_requests, 0);
        // The cells wrap in `fetch_add`; striped sums wrap the same way.
        let c = StripedCounters::new();
        c.stripes[0].add(&CounterSnapshot {
            original: near,
            retry: near,
        });
        c.stripes[c.stripes.len() - 1].add(&CounterSnapshot {
            original: more,
            retry: Tally::default(),
        });
        assert_eq!(c.snapshot().original, near + more);
        assert_eq!(c.snapshot().total().admitted_requests, 0); // 1 + (2^64 - 1)
    }

    /// A request counted from a thread-local's destructor, while the thread's locals are
    /// torn down, is counted (the stripe index falls back to 0 where the thread's own
    /// index cannot be reached) and never panics.
    #[test]
    fn a_thread_local_destructor_may_count() {
        struct CountsOnDrop(std::sync::Arc<StripedCounters>);
        impl Drop for CountsOnDrop {
            fn drop(&mut self) {
                self.0.record(true, 1, Attempt::Original);
            }
        }
        thread_local! {
            static GUARD: std::cell::RefCell<Option<CountsOnDrop>> =
                const { std::cell::RefCell::new(None) };
        }
        let counters = std::sync::Arc::new(StripedCounters::new());
        let c = counters.clone();
        std::thread::spawn(move || {
            GUARD.with(|g| *g.borrow_mut() = Some(CountsOnDrop(c)));
        })
        .join()
        .expect("counting from a thread-local destructor does not panic");
        assert_eq!(counters.snapshot().original.admitted_requests, 1);
    }
}
