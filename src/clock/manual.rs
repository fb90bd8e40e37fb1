//! [`ManualClock`]: a clock moved by hand, for tests and simulations.

use std::fmt;
use std::time::Duration;

use super::Clock;
use crate::sync::{Arc, AtomicU64, Ordering};

/// A clock that moves only when told: for tests, simulations and loom models.
///
/// Clones share one time. It starts at zero. Built on the crate's atomics, so loom
/// explores its reads and writes like any other shared state.
///
/// ```
/// use std::time::Duration;
/// use tokengate::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let other = clock.clone();
/// clock.advance(Duration::from_millis(1500));
/// assert_eq!(other.now(), Duration::from_millis(1500));
/// other.set(Duration::from_secs(1)); // may go backwards, to test that
/// assert_eq!(clock.now_nanos(), 1_000_000_000);
/// ```
#[derive(Clone)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ManualClock").field(&self.now()).finish()
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> ManualClock {
        ManualClock {
            nanos: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Moves the time forward by `by` (saturating at `u64::MAX` nanoseconds).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        // The CAS loop starts from a guess rather than a load: a failed CAS returns the
        // current time. Opening with a read-modify-write lets loom order this advance
        // against other threads' earlier readings; loom 0.7's exploration never runs a
        // load-then-CAS writer ahead of a reader that loaded first (tokio-rs/loom#166,
        // #392), so those threads would never see the advanced time.
        let mut cur = 0;
        loop {
            match self.nanos.compare_exchange_weak(
                cur,
                cur.saturating_add(by),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Sets the time to `to` since the origin. May move backwards: a manual clock does
    /// not declare [`is_monotonic`](Clock::is_monotonic), so limiters see a step back as
    /// time standing still (see [`Monotonic`](super::Monotonic)).
    pub fn set(&self, to: Duration) {
        let to = u64::try_from(to.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.store(to, Ordering::Relaxed);
    }

    /// The current time since the origin.
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.now_nanos())
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        self.nanos.load(Ordering::Relaxed)
    }
}
