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
//! Epochs are kept until the map is dropped (a shard may still be in any of them: a
//! `Chain<MapEpoch, Kept>`): a few hundred bytes per reconfiguration,
//! whatever the number of keys.

use crate::bucket::reread_snapshot;
use crate::epoch::{Chain, Kept, Next};
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
    /// Whether full buckets may be evicted under this policy.
    pub(crate) evict: bool,
    /// The map's re-anchoring passes from this epoch on.
    pub(crate) passes: Passes,
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
        }
    }
}

/// The chain of a map's epochs: the current one, each holding the one it replaced.
pub(crate) struct Epochs {
    chain: Chain<MapEpoch, Kept>,
}

impl Epochs {
    pub(crate) fn new(first: MapEpoch) -> Epochs {
        Epochs {
            chain: Chain::new(first),
        }
    }

    /// The current epoch.
    #[inline(always)]
    pub(crate) fn current(&self) -> &MapEpoch {
        self.chain.current()
    }

    /// Publishes the epoch after the current one: `policy` from the switch reading `at`,
    /// carried over with `inherit`. Callers serialize (the map's reconfiguration lock).
    pub(crate) fn push(&self, policy: Policy, at: u64, inherit: Inherit, evict: bool) {
        let old = self.current();
        // Until every shard is converted, words of both policies exist: passes as often
        // as the shorter period needs, due no later than the old epoch's next one.
        let timing = old.passes.timing().merge(Timing::of(policy.layout()));
        let passes = Passes::continuing(&old.passes, timing, at);
        let next = Next::new(MapEpoch {
            policy,
            number: old.number + 1,
            at,
            inherit,
            evict,
            passes,
        });
        self.chain.publish(old, next);
    }

    /// The switches from epoch `from` to `to` (a later one), oldest first, each with the
    /// epoch it starts from: what [`convert()`] applies to each word of a shard.
    pub(crate) fn steps<'a>(
        &'a self,
        from: u64,
        to: &'a MapEpoch,
    ) -> Vec<(&'a MapEpoch, &'a MapEpoch)> {
        let mut chain: Vec<&MapEpoch> = Vec::new();
        for e in self.chain.iter().skip_while(|e| e.number > to.number) {
            chain.push(e);
            if e.number <= from {
                break;
            }
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
