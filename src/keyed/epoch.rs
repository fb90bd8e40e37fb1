//! A keyed map's policies over time, and the lazy conversion of its shards.
//!
//! [`KeyedLimiter::reconfigure`](super::KeyedLimiter::reconfigure) publishes a new
//! *epoch* (policy, switch reading, strategy) in constant time, whatever the number of
//! keys. Each shard records the epoch its words are in; the first operation that meets
//! a shard from an older epoch converts the shard's words under its write lock (no reader
//! holds a word of it meanwhile), epoch by epoch, each as of that epoch's switch reading.
//! So a key converted an hour after the switch holds what it would have held had it been
//! converted at the switch: the old policy refills it up to the switch, the new one after.
//!
//! The switch holds every shard's write lock while it reads the clock and publishes the
//! epoch (a barrier: constant in the number of keys, one lock per shard), and operations
//! read the current epoch after locking their shard: so every word of the old epoch was
//! written before the switch reading, and none after. Each word is then converted
//! exactly as a [`LiveBucket`](crate::LiveBucket) switched at that reading converts its
//! own (`tests/keyed_reconfigure.rs` compares the two on random histories).
//!
//! Epochs are kept until the map is dropped (a shard may still be in any of them): a
//! few hundred bytes per reconfiguration, whatever the number of keys.

use std::ptr;

use crate::bucket::reread_snapshot;
use crate::inherit::{self, Inherit};
use crate::pass::{Passes, Timing};
use crate::policy::Policy;
use crate::sync::{AtomicPtr, Ordering};

/// One policy of a keyed map, and how its words come from the previous one.
pub(crate) struct MapEpoch {
    pub(crate) policy: Policy,
    /// 0 for the map's first policy, then one more per reconfiguration.
    pub(crate) number: u64,
    /// The switch reading (the map's creation for the first).
    pub(crate) at: u64,
    /// How the previous epoch's words carry over.
    pub(crate) inherit: Inherit,
    /// Whether full buckets may be evicted under this policy.
    pub(crate) evict: bool,
    /// The map's re-anchoring passes from this epoch on.
    pub(crate) passes: Passes,
    prev: *mut MapEpoch,
}

impl MapEpoch {
    /// The first epoch of a map created at `created`.
    pub(crate) fn first(policy: Policy, created: u64, evict: bool) -> MapEpoch {
        MapEpoch {
            policy,
            number: 0,
            at: created,
            inherit: Inherit::Reset,
            evict,
            passes: Passes::new(policy.layout(), created),
            prev: ptr::null_mut(),
        }
    }
}

/// The chain of a map's epochs: the current one, each holding the one it replaced.
pub(crate) struct Epochs {
    current: AtomicPtr<MapEpoch>,
}

// SAFETY: epochs are shared as `&MapEpoch` (atomics, `Copy` fields); `prev` is written
// before publication and freed only by `Drop` (`&mut self`).
unsafe impl Send for Epochs {}
// SAFETY: as above.
unsafe impl Sync for Epochs {}

impl Epochs {
    pub(crate) fn new(first: MapEpoch) -> Epochs {
        Epochs {
            current: AtomicPtr::new(Box::into_raw(Box::new(first))),
        }
    }

    /// The current epoch.
    #[inline(always)]
    pub(crate) fn current(&self) -> &MapEpoch {
        // SAFETY: always a live epoch from `Box::into_raw`, freed only by `Drop`; the
        // acquire load pairs with the release store that published it.
        unsafe { &*self.current.load(Ordering::Acquire) }
    }

    /// Publishes the epoch after the current one: `policy` from the switch reading `at`,
    /// carried over with `inherit`. Callers serialize (the map's reconfiguration lock).
    pub(crate) fn push(&self, policy: Policy, at: u64, inherit: Inherit, evict: bool) {
        let old = self.current();
        // Until every shard is converted, words of both policies exist: passes as often
        // as the shorter period needs, due no later than the old epoch's next one.
        let timing = old.passes.timing().merge(Timing::of(policy.layout()));
        let passes = Passes::continuing(&old.passes, timing, at);
        let next = Box::new(MapEpoch {
            policy,
            number: old.number + 1,
            at,
            inherit,
            evict,
            passes,
            prev: ptr::from_ref(old).cast_mut(),
        });
        self.current.store(Box::into_raw(next), Ordering::Release);
    }

    /// The switches from epoch `from` to `to` (a later one), oldest first, each with the
    /// epoch it starts from: what [`convert()`] applies to each word of a shard.
    pub(crate) fn steps<'a>(
        &'a self,
        from: u64,
        to: &'a MapEpoch,
    ) -> Vec<(&'a MapEpoch, &'a MapEpoch)> {
        let mut chain: Vec<&MapEpoch> = Vec::new();
        let mut e = to;
        loop {
            chain.push(e);
            if e.number <= from || e.prev.is_null() {
                break;
            }
            // SAFETY: a live epoch, freed only by `Drop`.
            e = unsafe { &*e.prev };
        }
        chain.reverse();
        chain.windows(2).map(|w| (w[0], w[1])).collect()
    }
}

/// Brings `word` through `steps` (from [`Epochs::steps`]), one switch at a time, each as
/// of its switch reading.
pub(crate) fn convert(steps: &[(&MapEpoch, &MapEpoch)], word: u64) -> u64 {
    steps
        .iter()
        .fold(word, |word, &(old, next)| convert_word(old, next, word))
}

impl Drop for Epochs {
    fn drop(&mut self) {
        let mut p = self.current.load(Ordering::Acquire);
        while !p.is_null() {
            // SAFETY: each epoch came from `Box::into_raw` and is reachable once;
            // `&mut self` excludes every other access.
            let epoch = unsafe { Box::from_raw(p) };
            p = epoch.prev;
        }
    }
}

/// One switch: `word` of `old`'s layout as of `next`'s switch reading, converted with
/// `next`'s strategy. Every word of `old` was written before that reading (the switch
/// held every shard's write lock while it read the clock and published `next`), so the
/// reading is after the word's last write: far behind it, the word idled past its wrap
/// and is full, exactly as a [`LiveBucket`](crate::LiveBucket) switched at that reading
/// reads it.
fn convert_word(old: &MapEpoch, next: &MapEpoch, word: u64) -> u64 {
    convert_between(&old.policy, word, next.at, &next.policy, next.inherit).word
}

/// `word` of policy `from`, read at `at` (a reading after its last write), converted
/// to policy `to` with `inherit`: a keyed bucket switched to another policy, or moved
/// to a map of another.
pub(crate) fn convert_between(
    from: &Policy,
    word: u64,
    at: u64,
    to: &Policy,
    inherit: Inherit,
) -> inherit::Converted {
    let layout = from.layout();
    let snapshot = reread_snapshot(layout, word, at);
    inherit::convert(
        layout,
        &snapshot,
        at,
        to.layout(),
        inherit,
        to.starts_full(),
    )
}
