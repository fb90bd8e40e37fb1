//! A borrowed bucket of a keyed map (or a global scope) as a member of an all-or-nothing
//! acquisition.

use std::fmt;
use std::time::Duration;

use crate::bucket::RawBucket;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::AcquireError;
use crate::multi::{Member, sealed};
use crate::state::Layout;
use crate::telemetry::CounterRef;

/// A bucket word with the layout of its map, the map's clock and where its counts go.
/// Valid while the lock guarding the word is held (the borrow says so).
pub(crate) struct Handle<'a, C> {
    pub(crate) raw: &'a RawBucket,
    pub(crate) layout: &'a Layout,
    pub(crate) clock: &'a C,
    pub(crate) counters: CounterRef<'a>,
}

impl<C> Clone for Handle<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C> Copy for Handle<'_, C> {}

impl<C> fmt::Debug for Handle<'_, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handle")
            .field("raw", self.raw)
            .field("layout", self.layout)
            .finish()
    }
}

impl<C: Clock> Handle<'_, C> {
    #[inline]
    pub(crate) fn take(&self, cost: u64, now: u64) -> Result<Decision, AcquireError> {
        self.raw.try_acquire(self.layout, self.clock, now, cost)
    }
}

impl<C: Clock> sealed::Sealed for Handle<'_, C> {}

impl<C: Clock> Member for Handle<'_, C> {
    #[inline]
    fn member_id(&self) -> usize {
        self.raw.id()
    }

    fn capacity(&self) -> u64 {
        self.layout.capacity()
    }

    #[inline]
    fn now_nanos(&self) -> u64 {
        self.clock.now_nanos()
    }

    #[inline]
    fn take_at(&self, cost: u64, now: u64) -> Result<Decision, AcquireError> {
        self.take(cost, now)
    }

    #[inline]
    fn refund_at(&self, cost: u64, now: u64) {
        let units = self
            .layout
            .units_of(cost)
            .expect("acquire_all checks every cost against its capacity first");
        self.raw.refund_units(self.layout, self.clock, now, units);
    }

    fn wait_at(&self, cost: u64, now: u64) -> Duration {
        self.raw.wait(self.layout, now, cost)
    }

    #[inline]
    fn refusal_at(&self, cost: u64, now: u64) -> Option<Decision> {
        self.raw.refusal(self.layout, now, cost)
    }
}
