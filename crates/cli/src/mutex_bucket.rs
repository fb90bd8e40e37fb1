//! The peer every hand-written service starts with: a floating-point token bucket behind a
//! `std::sync::Mutex`. Shared by the `bench` subcommand and `benches/engine.rs`.

use std::sync::{Mutex, PoisonError};

/// A token bucket with an `f64` balance, refilled lazily under a mutex.
///
/// Time comes from quanta's global TSC clock, the same counter tokengate's default clock
/// and governor read, so a comparison measures the lock and the arithmetic, not the clock.
/// The clock is read before taking the lock (a shorter critical section); a reading older
/// than the stored one adds nothing.
#[derive(Debug)]
pub struct MutexBucket {
    state: Mutex<State>,
    capacity: f64,
    refill_per_nano: f64,
}

#[derive(Debug)]
struct State {
    tokens: f64,
    last: quanta::Instant,
}

impl MutexBucket {
    /// A full bucket of `capacity` tokens refilled at `refill_per_second`.
    pub fn new(capacity: f64, refill_per_second: f64) -> MutexBucket {
        MutexBucket {
            state: Mutex::new(State {
                tokens: capacity,
                last: quanta::Instant::now(),
            }),
            capacity,
            refill_per_nano: refill_per_second / 1e9,
        }
    }

    /// Takes `cost` tokens if the balance covers them.
    #[inline]
    pub fn try_acquire(&self, cost: f64) -> bool {
        let now = quanta::Instant::now();
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if now > s.last {
            let elapsed = now.duration_since(s.last).as_nanos() as f64;
            s.tokens = (s.tokens + elapsed * self.refill_per_nano).min(self.capacity);
            s.last = now;
        }
        if s.tokens >= cost {
            s.tokens -= cost;
            true
        } else {
            false
        }
    }
}
