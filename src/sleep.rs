//! How blocking helpers wait: a strategy, so that simulations and tests can wait on a
//! manual clock instead of the wall clock.

use std::time::Duration;

use crate::clock::ManualClock;

/// A way to let time pass: the only thing [`Bucket::acquire_with`](crate::Bucket::acquire_with)
/// and [`Retry::run`](crate::retry::Retry::run) do to wait.
///
/// [`ThreadSleep`] blocks the thread (real clocks); a [`ManualClock`] sleeps by advancing
/// itself, so a blocking helper runs to completion in a test or simulation, instantly and
/// deterministically. The contract: after `sleep(d)` returns, the clock the caller reads
/// has moved forward by about `d` (at least `d` for the manual clock). The helpers sleep
/// once per wait and never loop on the clock, so a strategy that breaks the contract (a
/// [`ThreadSleep`] with a manual clock) makes them proceed early, never hang.
///
/// ```
/// use std::time::Duration;
/// use tokengate::{ManualClock, reservation::Sleep};
///
/// let clock = ManualClock::new();
/// clock.sleep(Duration::from_millis(250)); // simulated: returns at once
/// assert_eq!(clock.now(), Duration::from_millis(250));
/// ```
pub trait Sleep {
    /// Lets `duration` pass (zero returns at once).
    fn sleep(&self, duration: Duration);
}

impl<S: Sleep + ?Sized> Sleep for &S {
    fn sleep(&self, duration: Duration) {
        (**self).sleep(duration)
    }
}

/// Sleeps the calling thread with [`std::thread::sleep`]: the strategy for real clocks
/// ([`QuantaClock`](crate::QuantaClock), [`CoarseClock`](crate::CoarseClock)).
///
/// ```
/// use std::time::{Duration, Instant};
/// use tokengate::{reservation::Sleep, reservation::ThreadSleep};
///
/// let start = Instant::now();
/// ThreadSleep.sleep(Duration::from_millis(2));
/// assert!(start.elapsed() >= Duration::from_millis(2));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadSleep;

impl Sleep for ThreadSleep {
    fn sleep(&self, duration: Duration) {
        if !duration.is_zero() {
            std::thread::sleep(duration);
        }
    }
}

/// Simulated sleep: advances the clock (and every clone of it) by `duration`.
impl Sleep for ManualClock {
    fn sleep(&self, duration: Duration) {
        self.advance(duration);
    }
}
