//! A borrowed bucket of a keyed map (or a global scope) with where its counts go: a
//! word-backed member of an all-or-nothing acquisition.

use std::fmt;

use crate::bucket::RawBucket;
use crate::clock::{Clock, Monotonic};
use crate::decision::Decision;
use crate::error::AcquireError;
use crate::multi::{BucketRef, WordBacked};
use crate::pass::Passes;
use crate::state::Layout;
use crate::telemetry::CounterRef;

/// A bucket word with the layout of its map, the map's clock and where its counts go.
/// Valid while the lock guarding the word is held (the borrow says so).
pub(crate) struct Handle<'a, C> {
    pub(crate) raw: &'a RawBucket,
    pub(crate) layout: &'a Layout,
    pub(crate) clock: &'a Monotonic<C>,
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
        // Apart: the caller moves the result into a `Result<Decision, KeyedError>`.
        self.raw
            .try_acquire_with::<C, true>(self.layout, self.clock, now, cost)
    }
}

impl<C: Clock> WordBacked for Handle<'_, C> {
    type Clock = C;

    #[inline]
    fn bucket_ref(&self) -> BucketRef<'_, C> {
        BucketRef {
            raw: self.raw,
            layout: self.layout,
            clock: self.clock,
        }
    }
}

/// A key's bucket found in a reader section of its shard, valid while the
/// [`Sections`](super::table::Sections) holding the section are borrowed (see
/// [`KeyedLimiter::hold`](super::KeyedLimiter::hold)), with the map's passes.
pub(crate) struct Held<'a, C> {
    pub(crate) handle: Handle<'a, C>,
    /// The passes of the map's epoch the handle's layout is of.
    passes: &'a Passes,
}

impl<C> Clone for Held<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C> Copy for Held<'_, C> {}

impl<'a, C> Held<'a, C> {
    #[inline(always)]
    pub(super) fn new(handle: Handle<'a, C>, passes: &'a Passes) -> Held<'a, C> {
        Held { handle, passes }
    }

    /// The map's re-anchoring passes: when one is due, its bucket is not to be decided
    /// held (the pass locks every shard of the map).
    #[inline(always)]
    pub(crate) fn passes(&self) -> &'a Passes {
        self.passes
    }
}

impl<C> fmt::Debug for Held<'_, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Held")
            .field("handle", &self.handle)
            .finish()
    }
}
