//! Time sources: the TSC clock (default), a coarse clock kept by an upkeep thread, and a
//! manual clock for tests and simulations.

//!
//! One clock per file: [`QuantaClock`] (`quanta.rs`), [`CoarseClock`] (`coarse.rs`),
//! [`ManualClock`] (`manual.rs`); [`Monotonic`] (`monotonic.rs`) is the guard every
//! limiter reads its clock through.

mod coarse;
mod manual;
mod monotonic;
mod quanta;

pub use coarse::{COARSE_INTERVAL, ClockError, CoarseClock};
pub use manual::ManualClock;
pub use monotonic::Monotonic;
pub use quanta::QuantaClock;

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
