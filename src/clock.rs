//! Time sources: the TSC clock (default), a coarse clock kept by an upkeep thread, and a
//! manual clock for tests and simulations.

use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::sync::{Arc, AtomicU64, Ordering};
// The coarse time's word is a `static`, which loom's atomics cannot be.
use std::sync::atomic::AtomicU64 as StaticU64;

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

    /// [`now_nanos`](Clock::now_nanos)'s reading when this clock takes it without a
    /// function call, else `None`. The limiters' decisions read the clock here and, on
    /// `None`, start again on a path of their own that calls `now_nanos`: a call on the
    /// decision's path, however rarely taken, makes every decision save and restore the
    /// registers that live across it.
    ///
    /// The default, `Some(self.now_nanos())`, is right for every clock. A clock whose
    /// reading calls out of line only in some configurations (the [`QuantaClock`] where
    /// it does not read the time-stamp counter itself) answers `None` there. Either way
    /// the reading is the same.
    #[inline]
    fn now_inline(&self) -> Option<u64> {
        Some(self.now_nanos())
    }

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
    fn now_inline(&self) -> Option<u64> {
        (**self).now_inline()
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
    fn now_inline(&self) -> Option<u64> {
        (**self).now_inline()
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

/// The default clock: quanta's, reading the CPU's time-stamp counter where it is invariant
/// and scaling it to nanoseconds with a multiply and a shift; the OS monotonic clock
/// elsewhere.
///
/// The first clock in a process calibrates the counter (quanta does this once, in up to
/// about 200 ms); later clocks are free to create.
///
/// On x86-64, where quanta reads the counter, this clock reads it itself with an inlined
/// `rdtsc` (the instruction quanta's `Clock::raw` runs, behind a call) and scales it with
/// one multiply by quanta's own calibration, brought to a 64-bit fraction: the same
/// readings, bit for bit (checked when the clock is made), without a function call or a
/// variable shift on the decision path (measured: BENCHMARKS.md, "The clocks read
/// inline").
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
    /// Nanoseconds per counter tick as a 64-bit fraction (`nanos = raw * f / 2^64`), when
    /// the counter is read inline; 0 when readings go through quanta's `Clock::raw`.
    inline_scale: u64,
}

impl QuantaClock {
    /// A clock on quanta's calibrated counter.
    pub fn new() -> QuantaClock {
        let inner = quanta::Clock::new();
        let inline_scale = counter::inline_scale(&inner);
        QuantaClock {
            inner,
            inline_scale,
        }
    }

    /// Whether readings come from the counter read inline (x86-64, where quanta reads
    /// the time-stamp counter) rather than through quanta's `Clock::raw`. Either way the
    /// readings are the same.
    pub fn reads_counter_inline(&self) -> bool {
        self.inline_scale != 0
    }

    /// The reading through quanta's own calls, as a clock not read inline takes it: out
    /// of line, so that the inline reading stays small enough to inline everywhere.
    #[inline(never)]
    fn quanta_nanos(&self) -> u64 {
        self.inner.delta_as_nanos(0, self.inner.raw())
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
        match self.now_inline() {
            Some(now) => now,
            None => self.quanta_nanos(),
        }
    }

    /// The counter read inline, where it is; `None` where readings go through quanta's
    /// calls.
    #[inline]
    fn now_inline(&self) -> Option<u64> {
        (self.inline_scale != 0).then(|| counter::scaled(counter::read(), self.inline_scale))
    }

    /// An invariant counter (or the OS monotonic clock) never moves back; what cores
    /// disagree by is far below the race tolerance
    /// ([`TOLERANCE_NANOS`](crate::state::TOLERANCE_NANOS)).
    #[inline]
    fn is_monotonic(&self) -> bool {
        true
    }
}

/// The time-stamp counter read inline, where quanta reads it.
mod counter {
    /// `raw * scale / 2^64`: nanoseconds from a counter reading.
    #[inline(always)]
    pub(super) fn scaled(raw: u64, scale: u64) -> u64 {
        ((u128::from(raw) * u128::from(scale)) >> 64) as u64
    }

    /// The scale that gives `clock`'s readings from the counter read inline, or 0 when
    /// its raw readings may not be the counter or its scaling has no such fraction.
    ///
    /// The counter: the CPU has the invariant counter and `rdtscp` (what quanta requires
    /// before it reads the counter), and three raw readings each fall between two counter
    /// reads taken around it (a reading of the OS clock, nanoseconds since boot, does
    /// not: the counter runs at the CPU's base frequency from reset).
    ///
    /// The scale: quanta scales a raw reading `x` as `x * m >> s` (`m` below `2^(s+1)`
    /// for a counter of at least 0.5 GHz). At `x = 2^63` that is `m * 2^(63-s)`, so twice
    /// it is `m * 2^(64-s)` exactly, and `x * that >> 64` is quanta's reading bit for bit;
    /// it is checked on readings across the whole range, and any difference gives 0.
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    pub(super) fn inline_scale(clock: &quanta::Clock) -> u64 {
        let is_counter = (0..3).all(|_| {
            let before = read();
            let raw = clock.raw();
            let after = read();
            before <= raw && raw <= after
        });
        if !(cpu_has_counter() && is_counter) {
            return 0;
        }
        let half = clock.delta_as_nanos(0, 1 << 63);
        let Some(scale) = half.checked_mul(2) else {
            return 0;
        };
        let now = read();
        let probes = [
            1,
            1_000,
            1 << 32,
            now,
            now.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            1 << 62,
            u64::MAX / 3,
            (1 << 63) - 1,
            1 << 63,
            u64::MAX,
        ];
        // A scale of 0 passes only if quanta's is 0 too, and means "not inline" anyway.
        if probes
            .iter()
            .any(|&x| scaled(x, scale) != clock.delta_as_nanos(0, x))
        {
            return 0;
        }
        scale
    }

    /// Whether the CPU has the invariant counter and `rdtscp`: what quanta requires
    /// before it reads the counter.
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    pub(super) fn cpu_has_counter() -> bool {
        use std::arch::x86_64::__cpuid;
        // Leaf 0x8000_0000 gives the highest extended leaf; 0x8000_0001 EDX bit 27 is
        // rdtscp, 0x8000_0007 EDX bit 8 the invariant counter.
        __cpuid(0x8000_0000).eax >= 0x8000_0007
            && __cpuid(0x8000_0001).edx & (1 << 27) != 0
            && __cpuid(0x8000_0007).edx & (1 << 8) != 0
    }

    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
    pub(super) fn inline_scale(_: &quanta::Clock) -> u64 {
        0
    }

    /// The time-stamp counter (read only where `inline_scale` is not 0).
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    #[inline(always)]
    pub(super) fn read() -> u64 {
        // SAFETY: `rdtsc` exists on every x86-64 CPU and reads a register; it touches no
        // memory.
        unsafe { std::arch::x86_64::_rdtsc() }
    }

    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
    #[inline(always)]
    pub(super) fn read() -> u64 {
        0
    }
}

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

    /// The inline counter reads what quanta's calls read: every reading lies between two
    /// of quanta's taken around it (a wrong scale, or a reading of another source, is
    /// out of order at once).
    #[test]
    fn the_inline_reading_is_quantas() {
        let clock = QuantaClock::new();
        for _ in 0..10_000 {
            let (a, b, c) = (
                clock.quanta_nanos(),
                clock.now_nanos(),
                clock.quanta_nanos(),
            );
            assert!(a <= b && b <= c, "{a} {b} {c}");
        }
    }

    /// Where the CPU has what quanta reads the counter with, the counter is read inline,
    /// and its scaling gives quanta's nanoseconds bit for bit across the whole range.
    #[test]
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    fn the_counter_is_read_inline_where_quanta_reads_it() {
        let clock = QuantaClock::new();
        let has_counter = counter::cpu_has_counter();
        assert_eq!(clock.reads_counter_inline(), has_counter);
        // A reading is inline exactly where the counter is, and is then quanta's.
        assert_eq!(clock.now_inline().is_some(), has_counter);
        if let Some(b) = clock.now_inline() {
            let (a, c) = (clock.quanta_nanos(), clock.quanta_nanos());
            let (b2, c2) = (clock.now_inline().unwrap(), clock.quanta_nanos());
            assert!(
                b <= a && a <= c && c <= b2 && b2 <= c2,
                "{b} {a} {c} {b2} {c2}"
            );
        }
        if !has_counter {
            return;
        }
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for shift in 0..64 {
            for _ in 0..1_000 {
                // xorshift: readings of every magnitude.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let raw = x >> shift;
                assert_eq!(
                    counter::scaled(raw, clock.inline_scale),
                    clock.inner.delta_as_nanos(0, raw),
                    "raw {raw}"
                );
            }
        }
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
