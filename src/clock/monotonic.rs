//! [`Monotonic`]: a clock's readings through a high-water mark.

use std::fmt;

use super::Clock;
use crate::sync::{AtomicU64, Ordering};

/// A clock made monotonic: readings pass through a high-water mark, so a reading is never
/// below one taken before it. A clock that already declares
/// [`is_monotonic`](Clock::is_monotonic) is read as it is, at no cost.
///
/// Every limiter wraps its clock in one; wrap a clock yourself to share one high-water
/// mark among several limiters.
///
/// ```
/// use std::time::Duration;
/// use tokengate::{Clock, ManualClock};
/// use tokengate::clock::Monotonic;
///
/// let manual = ManualClock::new();
/// let clock = Monotonic::new(manual.clone());
/// manual.set(Duration::from_secs(10));
/// assert_eq!(clock.now_nanos(), 10_000_000_000);
/// manual.set(Duration::from_secs(4)); // steps back six seconds
/// assert_eq!(clock.now_nanos(), 10_000_000_000); // time stands still
/// manual.set(Duration::from_secs(11));
/// assert_eq!(clock.now_nanos(), 11_000_000_000);
/// assert!(clock.is_monotonic());
/// ```
pub struct Monotonic<C: ?Sized> {
    high: AtomicU64,
    clock: C,
}

impl<C: Clock> Monotonic<C> {
    /// Guards `clock`; its next reading sets the first high-water mark.
    pub fn new(clock: C) -> Monotonic<C> {
        Monotonic {
            high: AtomicU64::new(0),
            clock,
        }
    }
}

impl<C: Clock + ?Sized> Monotonic<C> {
    /// The guarded clock.
    #[inline]
    pub fn get_ref(&self) -> &C {
        &self.clock
    }

    /// A reading of this clock's source taken elsewhere (another limiter's guard, an
    /// all-or-nothing acquisition's one reading), passed through this guard: never below
    /// a reading this guard has returned. Free when the source is monotonic.
    #[inline]
    pub(crate) fn observe(&self, reading: u64) -> u64 {
        if self.clock.is_monotonic() {
            reading
        } else {
            self.guarded(reading)
        }
    }

    #[inline(never)]
    fn guarded(&self, reading: u64) -> u64 {
        if mutant!(MONOTONIC_GUARD_SKIPPED) {
            return reading;
        }
        // Relaxed suffices: the maximum is one read-modify-write order, and a reader that
        // must see a writer's reading acquires it through the word the writer stored.
        self.high.fetch_max(reading, Ordering::Relaxed).max(reading)
    }
}

impl<C: Clock + ?Sized> Clock for Monotonic<C> {
    #[inline]
    fn now_nanos(&self) -> u64 {
        self.observe(self.clock.now_nanos())
    }

    /// The source's inline reading through the guard (which calls out of line only for
    /// a source that is not monotonic).
    #[inline]
    fn now_inline(&self) -> Option<u64> {
        Some(self.observe(self.clock.now_inline()?))
    }

    #[inline]
    fn is_monotonic(&self) -> bool {
        true
    }
}

impl<C: Clock + Clone> Clone for Monotonic<C> {
    fn clone(&self) -> Self {
        Monotonic {
            high: AtomicU64::new(self.high.load(Ordering::Relaxed)),
            clock: self.clock.clone(),
        }
    }
}

impl<C: fmt::Debug> fmt::Debug for Monotonic<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Monotonic")
            .field("clock", &self.clock)
            .field("high", &self.high.load(Ordering::Relaxed))
            .finish()
    }
}
