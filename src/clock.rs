//! Time sources: the TSC clock (default), a coarse clock kept by an upkeep thread, and a
//! manual clock for tests and simulations.

use std::fmt;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use crate::sync::{Arc, AtomicU64, Ordering};

/// A time source in nanoseconds.
///
/// `now_nanos` counts from an origin fixed for the clock (and shared by its clones); only
/// differences matter. Buckets read it once per decision, so it should be cheap.
///
/// # Monotonicity
///
/// A clock may step back (a wall clock set by hand or by NTP, a test clock). Every
/// limiter in this crate reads its clock through a [`Monotonic`] guard, a high-water mark
/// that turns a step back into a pause: the limiter sees time stand still until the clock
/// passes its highest reading again, so it credits nothing for time that did not pass
/// forward, whatever the clock does. A clock that guarantees never to step back, on any
/// thread, declares it with [`is_monotonic`](Clock::is_monotonic), and the guard then
/// costs nothing: the crate's [`QuantaClock`] and [`CoarseClock`] do.
pub trait Clock: Send + Sync {
    /// Nanoseconds since this clock's origin.
    fn now_nanos(&self) -> u64;

    /// Whether a reading is never below any reading taken before it, on any thread (a
    /// reading that happens-after another is at least as large). `false` unless a clock
    /// declares it: then limiters guard its readings with a high-water mark
    /// ([`Monotonic`]).
    ///
    /// Declaring it is a promise the limiters rely on: a reading far behind a stored
    /// tick is then read as an idle longer than the tick field's wrap period (the bucket
    /// is full), not as a step back.
    #[inline]
    fn is_monotonic(&self) -> bool {
        false
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now_nanos(&self) -> u64 {
        (**self).now_nanos()
    }

    #[inline]
    fn is_monotonic(&self) -> bool {
        (**self).is_monotonic()
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    #[inline]
    fn now_nanos(&self) -> u64 {
        (**self).now_nanos()
    }

    #[inline]
    fn is_monotonic(&self) -> bool {
        (**self).is_monotonic()
    }
}

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
        let reading = self.clock.now_nanos();
        if self.clock.is_monotonic() {
            reading
        } else {
            self.guarded(reading)
        }
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

/// The default clock: quanta's, reading the CPU's time-stamp counter where it is invariant
/// and scaling it to nanoseconds with a multiply and a shift; the OS monotonic clock
/// elsewhere.
///
/// The first clock in a process calibrates the counter (quanta does this once, in up to
/// about 200 ms); later clocks are free to create.
///
/// ```
/// use tokengate::{Clock, QuantaClock};
/// let clock = QuantaClock::new();
/// let a = clock.now_nanos();
/// let b = clock.now_nanos();
/// assert!(b >= a);
/// ```
#[derive(Clone, Debug)]
pub struct QuantaClock {
    inner: quanta::Clock,
}

impl QuantaClock {
    /// A clock on quanta's calibrated counter.
    pub fn new() -> QuantaClock {
        QuantaClock {
            inner: quanta::Clock::new(),
        }
    }
}

impl Default for QuantaClock {
    fn default() -> Self {
        QuantaClock::new()
    }
}

impl Clock for QuantaClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        self.inner.delta_as_nanos(0, self.inner.raw())
    }

    /// An invariant counter (or the OS monotonic clock) never moves back; what cores
    /// disagree by is far below the race tolerance
    /// ([`TOLERANCE_NANOS`](crate::state::TOLERANCE_NANOS)).
    #[inline]
    fn is_monotonic(&self) -> bool {
        true
    }
}

/// How often the coarse clock's upkeep thread refreshes the time.
pub const COARSE_INTERVAL: Duration = Duration::from_millis(1);

/// Why the coarse clock could not start.
#[derive(Debug)]
pub struct ClockError(quanta::Error);

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

/// The upkeep thread this crate started, if it started one (kept for the process's life).
static UPKEEP: Mutex<Option<quanta::Handle>> = Mutex::new(None);

/// The origin every [`CoarseClock`] counts from, fixed by the first one.
static COARSE_ORIGIN: OnceLock<quanta::Instant> = OnceLock::new();

/// A coarse clock: quanta's `Clock::recent`, a time an upkeep thread refreshes every
/// [`COARSE_INTERVAL`] (1 ms), read with one atomic load instead of the counter.
///
/// For callers who accept up to about a millisecond of staleness in exchange for a
/// cheaper read. Staleness never creates credit: a stale reading is an earlier time, so
/// it can only delay refill.
///
/// The upkeep thread is process-wide, started by the first `CoarseClock::new()` and kept
/// for the life of the process. If the application already runs quanta's upkeep thread,
/// that one is used: then the time stops moving if the application stops its thread,
/// which delays refill and never creates credit. Every coarse clock in the process counts
/// from one origin, so buckets on different coarse clocks can share an
/// [`acquire_all`](crate::acquire_all). (Clocks of different kinds count from different
/// origins: do not mix them in one acquisition.)
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
    inner: quanta::Clock,
    origin: quanta::Instant,
}

impl fmt::Debug for CoarseClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoarseClock")
            .field("origin", &self.origin)
            .finish()
    }
}

impl CoarseClock {
    /// Starts (once per process) the upkeep thread and returns a clock reading it.
    ///
    /// # Errors
    ///
    /// [`ClockError`] when the upkeep thread cannot be spawned.
    pub fn new() -> Result<CoarseClock, ClockError> {
        {
            let mut upkeep = UPKEEP.lock().unwrap_or_else(PoisonError::into_inner);
            if upkeep.is_none() {
                match quanta::Upkeep::new(COARSE_INTERVAL).start() {
                    Ok(handle) => *upkeep = Some(handle),
                    // Someone else keeps the recent time: use theirs.
                    Err(quanta::Error::UpkeepRunning) => {}
                    // Not cached: a later call tries again.
                    Err(e) => return Err(ClockError(e)),
                }
            }
        }
        let inner = quanta::Clock::new();
        let origin = *COARSE_ORIGIN.get_or_init(|| inner.recent());
        Ok(CoarseClock { inner, origin })
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        // quanta's `Instant` is a count of nanoseconds, and the difference a `Duration`
        // made from it: the count again, which fits a `u64` (no saturation), and which
        // the compiler forms without the division into seconds.
        let d = self.inner.recent().saturating_duration_since(self.origin);
        d.as_nanos() as u64
    }

    /// Quanta's recent time never moves back: one atomic the upkeep thread advances.
    #[inline]
    fn is_monotonic(&self) -> bool {
        true
    }
}

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
    /// time standing still (see [`Monotonic`]).
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
}
