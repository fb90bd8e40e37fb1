//! The clock of a rate lease's local bucket: lease time, which stops at the lease's
//! local expiry and does not run while the instance holds no lease.
//!
//! A reading is `min(real - skip, until)`: `until` is the local expiry in lease time and
//! `skip` the real time spent without a lease. So the engine bucket refills only while a
//! lease is live (never for time past its expiry or between leases), and a new lease
//! starts its bucket at the instant the previous one stopped: no refill is minted by a
//! gap. Only the pool's thread writes `skip` and `until` (`skip` first, both Release);
//! readers load `until` first (Acquire), so a reader that sees a new `until` sees the
//! `skip` that goes with it. Every reading is at least every earlier one.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokengate::{Clock, QuantaClock};

#[derive(Debug, Default)]
pub(crate) struct LeaseTimes {
    skip: AtomicU64,
    until: AtomicU64,
}

/// Lease time over the monotonic TSC clock.
#[derive(Clone, Debug)]
pub(crate) struct LeaseClock {
    real: QuantaClock,
    times: Arc<LeaseTimes>,
}

impl LeaseClock {
    pub(crate) fn new(real: QuantaClock) -> Self {
        Self {
            real,
            times: Arc::new(LeaseTimes::default()),
        }
    }

    /// Real nanoseconds (the TSC clock's origin).
    #[inline]
    pub(crate) fn real(&self) -> u64 {
        self.real.now_nanos()
    }

    /// `(lease time now, unclamped; the local expiry in lease time)`: the lease is live
    /// while the first is below the second.
    #[inline]
    pub(crate) fn lease_now(&self) -> (u64, u64) {
        let until = self.times.until.load(Ordering::Acquire);
        let skip = self.times.skip.load(Ordering::Acquire);
        (self.real().saturating_sub(skip), until)
    }

    /// Ends the live lease now (if any) and returns the frozen lease time: from here the
    /// clock reads this until [`resume`](Self::resume).
    pub(crate) fn stop(&self) -> u64 {
        let (now, until) = self.lease_now();
        let frozen = now.min(until);
        self.times.until.store(frozen, Ordering::Release);
        frozen
    }

    /// Starts a lease ending at real time `until_real`, lease time going on from
    /// `frozen` (what [`stop`](Self::stop) returned). `false` (and nothing changed) when
    /// `until_real` has passed.
    pub(crate) fn resume(&self, frozen: u64, until_real: u64) -> bool {
        let real = self.real();
        if until_real <= real {
            return false;
        }
        let skip = real - frozen;
        self.times.skip.store(skip, Ordering::Release);
        self.times.until.store(until_real - skip, Ordering::Release);
        true
    }
}

impl Clock for LeaseClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        let (now, until) = self.lease_now();
        now.min(until)
    }
}
