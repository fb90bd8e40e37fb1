//! [`CoarseClock`]: a time an upkeep thread refreshes every millisecond.

use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::{Clock, QuantaClock};
use crate::sync::Ordering;
// The coarse time's word is a `static`, which loom's atomics cannot be.
use std::sync::atomic::AtomicU64 as StaticU64;

/// How often the coarse clock's upkeep thread refreshes the time.
pub const COARSE_INTERVAL: Duration = Duration::from_millis(1);

/// Why the coarse clock could not start.
#[derive(Debug)]
pub struct ClockError(std::io::Error);

impl fmt::Display for ClockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot start the coarse clock's upkeep thread: {}",
            self.0
        )
    }
}

impl std::error::Error for ClockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// The coarse time: a [`QuantaClock`] reading the upkeep thread stores every
/// [`COARSE_INTERVAL`]. A std atomic (a `static`): its one writer
/// stores readings of a monotonic clock, so every load is at least any load that
/// happens-before it (coherence), which is all a coarse clock promises.
static COARSE_NOW: StaticU64 = StaticU64::new(0);

/// Whether the upkeep thread runs (it is started once and kept for the process's life).
static UPKEEP: Mutex<bool> = Mutex::new(false);

/// A coarse clock: a time an upkeep thread refreshes every [`COARSE_INTERVAL`] (1 ms),
/// read with one relaxed load of one process-wide word, inlined where it is read,
/// instead of the counter.
///
/// For callers who accept up to about a millisecond of staleness in exchange for a
/// cheaper read. Staleness never creates credit: a stale reading is an earlier time, so
/// it can only delay refill (a descheduled upkeep thread stops the time, which delays
/// refill the same way).
///
/// The upkeep thread (`tokengate-coarse-clock`) is process-wide, started by the first
/// `CoarseClock::new()` and kept for the life of the process; it stores a
/// [`QuantaClock`] reading each interval, so every coarse clock in the process reads one
/// time and buckets on different coarse clocks can share an
/// [`acquire_all`](crate::acquire_all). (Do not mix clocks of different kinds in one
/// acquisition.)
///
/// ```
/// use tokengate::{Clock, CoarseClock};
/// let clock = CoarseClock::new()?;
/// let a = clock.now_nanos();
/// let b = clock.now_nanos();
/// assert!(b >= a); // monotonic; it moves once per upkeep interval
/// # Ok::<(), tokengate::clock::ClockError>(())
/// ```
#[derive(Clone)]
pub struct CoarseClock {
    _started: (),
}

impl fmt::Debug for CoarseClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoarseClock")
            .field("now_nanos", &self.now_nanos())
            .finish()
    }
}

impl CoarseClock {
    /// Starts (once per process) the upkeep thread and returns a clock reading it.
    ///
    /// # Errors
    ///
    /// [`ClockError`] when the upkeep thread cannot be spawned (a later call tries
    /// again).
    pub fn new() -> Result<CoarseClock, ClockError> {
        let mut started = UPKEEP.lock().unwrap_or_else(PoisonError::into_inner);
        if !*started {
            let source = QuantaClock::new();
            // The first time is there before any clock reads it.
            COARSE_NOW.store(source.now_nanos(), Ordering::Relaxed);
            std::thread::Builder::new()
                .name("tokengate-coarse-clock".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(COARSE_INTERVAL);
                        COARSE_NOW.store(source.now_nanos(), Ordering::Relaxed);
                    }
                })
                .map_err(ClockError)?;
            *started = true;
        }
        Ok(CoarseClock { _started: () })
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        COARSE_NOW.load(Ordering::Relaxed)
    }

    /// One word, stored by one thread from a monotonic clock: it never moves back.
    #[inline]
    fn is_monotonic(&self) -> bool {
        true
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Coarse clocks made at different times count from one origin, so their readings
    /// interleave in order (a later clock with its own origin would read earlier).
    #[test]
    fn coarse_clocks_share_one_origin() {
        let a = CoarseClock::new().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let b = CoarseClock::new().unwrap();
        let (a1, b1, a2) = (a.now_nanos(), b.now_nanos(), a.now_nanos());
        assert!(a1 <= b1 && b1 <= a2, "{a1} {b1} {a2}");
    }

    /// The coarse time is a counter reading taken earlier (never ahead of the counter
    /// read after it), and it moves: within five seconds (a bound on a busy machine, not
    /// a timing claim) it passes a counter reading taken before the wait.
    #[test]
    fn the_coarse_clock_trails_the_counter_and_moves() {
        let coarse = CoarseClock::new().unwrap();
        let counter = QuantaClock::new();
        for _ in 0..1_000 {
            let (c, q) = (coarse.now_nanos(), counter.now_nanos());
            assert!(c <= q, "coarse {c} ahead of the counter {q}");
        }
        let before = counter.now_nanos();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while coarse.now_nanos() <= before {
            assert!(
                std::time::Instant::now() < deadline,
                "the coarse time stood still"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
