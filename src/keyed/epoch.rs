//! A keyed map's policies over time, and the lazy conversion of its shards.
//!
//! [`KeyedLimiter::reconfigure`](super::KeyedLimiter::reconfigure) publishes a new
//! *epoch* (policy, switch reading, strategy) in constant time, whatever the number of
//! keys. Each shard records the number of the epoch its words are in; the first
//! operation that meets a shard from the previous epoch converts the shard's words under
//! its write lock (no reader holds a word of it meanwhile), as of the switch reading. So
//! a key converted an hour after the switch holds what it would have held had it been
//! converted at the switch: the old policy refills it up to the switch, the new one
//! after.
//!
//! The switch holds every shard's write lock while it reads the clock and publishes the
//! epoch (a barrier: constant in the number of keys, one lock per shard), and operations
//! read the current epoch after locking their shard: so every word of the old epoch was
//! written before the switch reading, and none after. Each word is then converted
//! exactly as a [`LiveBucket`](crate::LiveBucket) switched at that reading converts its
//! own (`tests/keyed_reconfigure.rs` compares the two on random histories).
//!
//! # Freeing what a switch replaces
//!
//! Epochs live in a freeing chain ([`Chain<MapEpoch, Freed>`](crate::epoch)): a switch
//! retires the epoch it replaces, freed once nothing can still read it. Two rules make
//! that sound with no pin on the hot path:
//!
//! * **No shard is more than one epoch behind.** Before its barrier, a switch brings
//!   every shard still in an older epoch up to the current one (one shard at a time,
//!   under its write lock: the words an operation would have converted on meeting it).
//!   After the switch each shard is in the new epoch or the one it replaced, and the new
//!   epoch holds all a conversion from the replaced one needs (`from`, its policy): no
//!   shard ever needs a retired epoch.
//! * **Every read of an epoch is under a pin or a shard's lock.** An operation on a key
//!   reads the current epoch with its shard read-locked (or in a reader section of it),
//!   and uses it only until it lets the shard go; a switch publishes and retires with
//!   every shard write-locked, each waiting out its readers, so no such read overlaps a
//!   retirement (and an epoch is freed only after the shard is converted past it, under
//!   its write lock, which waits out the same readers). Everything else (the
//!   re-anchoring check before the lock, `policy()`, the switch itself, a search for
//!   room across shards) pins the chain.
//!
//! The loom model `keyed_read` checks both on a reader racing two switches: a retirement
//! that frees at once has the reader's pinned read read a freed epoch, and a switch that
//! leaves a shard two epochs behind loses or mints tokens.

use crate::bucket::reread_snapshot;
use crate::epoch::{Chain, Freed, Next, Pinned};
use crate::inherit::{self, Inherit};
use crate::pass::{Passes, Timing};
use crate::policy::Policy;

/// One policy of a keyed map, and how its words come from the previous one.
pub(crate) struct MapEpoch {
    pub(crate) policy: Policy,
    /// 0 for the map's first policy, then one more per reconfiguration.
    pub(crate) number: u64,
    /// The switch reading (the map's creation for the first).
    pub(crate) at: u64,
    /// How the previous epoch's words carry over.
    pub(crate) inherit: Inherit,
    /// The previous epoch's policy (the first's own): what a word of a shard still in
    /// the previous epoch is converted from.
    pub(crate) from: Policy,
    /// Whether full buckets may be evicted under this policy.
    pub(crate) evict: bool,
    /// The map's re-anchoring passes from this epoch on.
    pub(crate) passes: Passes,
    /// Under loom: read on every access to the epoch, written by its drop, so that the
    /// model reports a free that no synchronization orders after a read.
    #[cfg(loom)]
    probe: crate::sync::Probe,
}

impl MapEpoch {
    /// The first epoch of a map created at `created`.
    pub(crate) fn first(policy: Policy, created: u64, evict: bool) -> MapEpoch {
        MapEpoch {
            policy,
            number: 0,
            at: created,
            inherit: Inherit::Reset,
            from: policy,
            evict,
            passes: Passes::new(policy.layout(), created),
            #[cfg(loom)]
            probe: crate::sync::Probe::new(),
        }
    }

    /// Reports the access to the model (nothing outside loom).
    #[inline(always)]
    fn touch(&self) -> &MapEpoch {
        #[cfg(loom)]
        self.probe.read();
        self
    }
}

/// The chain of a map's epochs: the current one, and those replaced and not yet freed.
pub(crate) struct Epochs {
    chain: Chain<MapEpoch, Freed>,
}

impl Epochs {
    pub(crate) fn new(first: MapEpoch) -> Epochs {
        Epochs {
            chain: Chain::freeing(first),
        }
    }

    /// The current epoch, held until the guard is dropped.
    #[inline]
    pub(crate) fn pin(&self) -> Pinned<'_, MapEpoch> {
        let pinned = self.chain.pin();
        pinned.touch();
        pinned
    }

    /// The current epoch, while the caller holds `held` (an epoch read under a pin).
    #[inline]
    pub(crate) fn current_while<'a>(&'a self, held: &'a MapEpoch) -> &'a MapEpoch {
        self.chain.current_while(held).touch()
    }

    /// The current epoch, read with a shard of the map locked (or in a reader section of
    /// it).
    ///
    /// # Safety
    ///
    /// The caller holds a shard's lock or reader section of this map from before the call
    /// until it last uses the result: a switch publishes and retires with every shard
    /// write-locked ([`push`](Epochs::push)), so the epoch stays current meanwhile.
    #[inline(always)]
    pub(crate) unsafe fn locked(&self) -> &MapEpoch {
        // SAFETY: the caller's contract: no retirement of this chain until it lets the
        // shard go.
        unsafe { self.chain.current_excluded() }.touch()
    }

    /// Whether `epoch` (pinned, or read under a shard lock held now) is the current one.
    #[inline]
    pub(crate) fn is_current(&self, epoch: &MapEpoch) -> bool {
        self.chain.is_current(epoch)
    }

    /// Publishes the epoch after the current one, `policy` from the switch reading `at`,
    /// carried over with `inherit`, and retires the one it replaces. Callers serialize
    /// (the map's reconfiguration lock), hold every shard's write lock (the barrier), and
    /// have brought every shard to the current epoch first.
    pub(crate) fn push(&self, policy: Policy, at: u64, inherit: Inherit, evict: bool) {
        let old = self.pin();
        // Until every shard is converted, words of both policies exist: passes as often
        // as the shorter period needs, due no later than the old epoch's next one.
        let timing = old.passes.timing().merge(Timing::of(policy.layout()));
        let passes = Passes::continuing(&old.passes, timing, at);
        let next = Next::new(MapEpoch {
            policy,
            number: old.number + 1,
            at,
            inherit,
            from: old.policy,
            evict,
            passes,
            #[cfg(loom)]
            probe: crate::sync::Probe::new(),
        });
        self.chain.replace(&old, next);
    }

    /// Epochs replaced and not yet freed.
    pub(crate) fn retired(&self) -> usize {
        self.chain.retired()
    }
}

/// Brings `word`, of the epoch before `epoch`, into `epoch`: converted as of `epoch`'s
/// switch reading, with its strategy. Every word of the previous epoch was written
/// before that reading (the switch held every shard's write lock while it read the clock
/// and published `epoch`), so the reading is after the word's last write: far behind it,
/// the word idled past its wrap and is full, exactly as a
/// [`LiveBucket`](crate::LiveBucket) switched at that reading reads it.
pub(crate) fn convert(epoch: &MapEpoch, word: u64) -> u64 {
    convert_between(&epoch.from, word, epoch.at, &epoch.policy, epoch.inherit).word
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
