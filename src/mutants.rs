//! Deliberate bugs that the loom models must catch, switched on at run time.
//!
//! Compiled only under `cfg(loom)`, so normal builds carry neither the flags nor the
//! checks. A test switches one bug on for its own thread ([`enable`]) before it runs a
//! model expected to fail: loom runs every thread of a model as a coroutine on the thread
//! that started the model, so the model sees the bug and models run by other test
//! threads of the same process at the same time do not. (Were loom to move a model's
//! threads elsewhere, the broken model would pass and its test would fail: no bug can be
//! missed silently.)

use std::cell::Cell;
use std::ptr;

/// One deliberate bug: a name, and an address that identifies it.
#[derive(Debug)]
pub struct Mutant(pub &'static str);

thread_local! {
    /// The bug switched on for this thread's models, if any.
    static ENABLED: Cell<*const Mutant> = const { Cell::new(ptr::null()) };
}

/// A refund that adds the tokens without capping at the capacity (breaks I1 and I6).
pub static REFUND_SKIPS_CAP: Mutant = Mutant("REFUND_SKIPS_CAP");

/// A reading behind the stored tick (a thread that lost a CAS race) writes its own,
/// older tick back instead of keeping the stored one (breaks I2: the next reader is
/// credited the same interval twice).
pub static STALE_NOW_MOVES_TICK_BACK: Mutant = Mutant("STALE_NOW_MOVES_TICK_BACK");

/// Multi-bucket acquisition keeps what it took from the buckets before the one that
/// refused, instead of refunding them (breaks I7: all-or-nothing).
pub static ROLLBACK_SKIPS_REFUND: Mutant = Mutant("ROLLBACK_SKIPS_REFUND");

/// Multi-bucket acquisition takes the buckets in the order they are listed instead of one
/// global order (breaks I7: two acquirers listing a shared pair in opposite orders can
/// each hold one bucket and both be refused).
pub static TAKE_IN_LISTED_ORDER: Mutant = Mutant("TAKE_IN_LISTED_ORDER");
/// A lease that is not taken from the global bucket: the leased batch is handed to the
/// slot and left in the global word too (breaks exactness of `LeasedBucket`).
pub static LEASE_KEEPS_GLOBAL: Mutant = Mutant("LEASE_KEEPS_GLOBAL");

/// Credit (refill or refund) added to a `LeasedBucket`'s global word without first taking
/// back the tokens out on lease: the capped-refill over-credit.
pub static CREDIT_IGNORES_LEASES: Mutant = Mutant("CREDIT_IGNORES_LEASES");

/// A `LeasedBucket` credit (a refund, a refill) that reserves two leases, instead of one,
/// for every slot it finds already closed by another closer: credit withheld for tokens
/// no hand holds, lost for good (a refund made far below the capacity can vanish).
pub static RESERVE_COUNTS_CLOSED_TWICE: Mutant = Mutant("RESERVE_COUNTS_CLOSED_TWICE");

/// A `LeasedBucket` credit that reserves nothing for the slots it finds already closed
/// by another closer, whose hand may still hold the tokens it took from them: given back
/// after the credit met the cap, they are admitted on top (an over-admission).
pub static RESERVE_SKIPS_CLOSED_SLOTS: Mutant = Mutant("RESERVE_SKIPS_CLOSED_SLOTS");

/// A `LeasedBucket` close that takes an OPEN slot's tokens without setting the CLOSED
/// word's hand bit: a later credit finds the slot closed, reserves nothing for it, and
/// the tokens in the closer's hand are admitted on top of a credit that met the cap.
pub static CLOSE_FORGETS_HAND: Mutant = Mutant("CLOSE_FORGETS_HAND");

/// A `LeasedBucket` close that lowers the stocked-slot count for a slot it finds
/// LEASING too, which its lessee still counts (and settles itself): the count drops
/// below the slots holding tokens, or wraps, and a rejection that trusts it can refuse
/// what the slots hold.
pub static CLOSE_UNSTOCKS_LEASES: Mutant = Mutant("CLOSE_UNSTOCKS_LEASES");

/// A slot lease spendable after the tick it was leased in (the expiry removed): the
/// capped-refill over-credit of a lazily refilled global word.
pub static LEASE_NEVER_EXPIRES: Mutant = Mutant("LEASE_NEVER_EXPIRES");

/// A slot's spend landed by a plain store of the word it read, not a compare-and-swap:
/// a trip's claim or a close in between is overwritten (its tokens spent twice).
pub static SPEND_STORES_BLIND: Mutant = Mutant("SPEND_STORES_BLIND");

/// A `LeasedBucket` trip that finds its clock reading well behind the global word decides
/// at once that the word idled past its wrap (re-anchoring it full), without reading the
/// clock again after the load: a lost race credited as a full bucket.
pub static LEASE_SKIPS_REREAD: Mutant = Mutant("LEASE_SKIPS_REREAD");

/// A `LiveBucket` reconfiguration that reads the old word instead of sealing it: an
/// operation holding the old policy can still write it after the switch (an admission
/// lost, or tokens counted twice).
pub static RECONFIGURE_SKIPS_SEAL: Mutant = Mutant("RECONFIGURE_SKIPS_SEAL");

/// A `LeasedBucket` reconfiguration that reads its pool's word instead of sealing it: an
/// exchange holding the old policy can still write the old pool after the switch read it
/// (an admission lost, or tokens counted twice).
pub static LEASED_SWITCH_SKIPS_SEAL: Mutant = Mutant("LEASED_SWITCH_SKIPS_SEAL");

/// A `LeasedBucket` reconfiguration that seals its pool's word without waiting for the
/// hands that took tokens from it (leases cancelled in flight, closers' takings): they
/// reach the new policy as they are, not through the strategy.
pub static LEASED_SWITCH_SKIPS_WAIT: Mutant = Mutant("LEASED_SWITCH_SKIPS_WAIT");

/// A keyed shard moved to a new policy without converting its words: the old words are
/// read in the new policy's layout (no strategy applied).
pub static KEYED_SHARD_NOT_CONVERTED: Mutant = Mutant("KEYED_SHARD_NOT_CONVERTED");

/// A keyed map's switch that reads its switch reading and publishes the new policy
/// without holding every shard's lock: an admission on the old policy can refill past
/// the switch reading, and the conversion credits that time again.
pub static KEYED_SWITCH_SKIPS_BARRIER: Mutant = Mutant("KEYED_SWITCH_SKIPS_BARRIER");

/// A keyed map's switch that leaves the shards no operation met since the previous
/// switch in the epoch before: they fall two epochs behind, and their words are converted
/// from a policy they were never in (the one that could convert them is retired).
pub static KEYED_SWITCH_LEAVES_SHARDS_BEHIND: Mutant = Mutant("KEYED_SWITCH_LEAVES_SHARDS_BEHIND");

/// A retired epoch freed at the next retirement whether or not a pin that may hold it
/// has ended: a reader racing the switch reads freed memory.
pub static EPOCH_FREES_EARLY: Mutant = Mutant("EPOCH_FREES_EARLY");

/// A freeing chain that keeps replaced epochs linked behind the current one (a scoped
/// limiter's generations, for refunds across switches) retires each one replacement too
/// early: a walk of the window reaches an epoch retired, and freed, while it is pinned.
pub static EPOCH_WINDOW_SHORT: Mutant = Mutant("EPOCH_WINDOW_SHORT");

/// Whether `bug` is switched on for the calling thread.
pub fn on(bug: &Mutant) -> bool {
    ENABLED.with(|enabled| ptr::eq(enabled.get(), bug))
}

/// Switches `bug` on for the calling thread (and the models it runs) until the guard is
/// dropped; one bug at a time, the one switched on last.
pub fn enable(bug: &'static Mutant) -> Guard {
    Guard(ENABLED.with(|enabled| enabled.replace(bug)))
}

/// Switches the calling thread's bug back to the one before when dropped.
#[derive(Debug)]
pub struct Guard(*const Mutant);

impl Drop for Guard {
    fn drop(&mut self) {
        ENABLED.with(|enabled| enabled.set(self.0));
    }
}

/// A write near full keeps the current tick instead of anchoring at the next tick edge:
/// the next edge then credits a whole tick's refill although only part of it passed
/// since the write (the tick-edge burst, above the exact-time curve).
pub static NEAR_FULL_WRITE_KEEPS_TICK: Mutant = Mutant("NEAR_FULL_WRITE_KEEPS_TICK");

/// A clock reading that stepped back reaches the bucket as it is, without the monotonic
/// guard: a step back longer than the back window reads as a forward jump.
pub static MONOTONIC_GUARD_SKIPPED: Mutant = Mutant("MONOTONIC_GUARD_SKIPPED");

/// A new key at a keyed map's maximum sweeps only its own shard, never the others: it is
/// refused while other shards hold buckets that could be evicted.
pub static KEYED_SEARCH_SKIPS_OTHER_SHARDS: Mutant = Mutant("KEYED_SEARCH_SKIPS_OTHER_SHARDS");

/// A `ScopedLimiter` reconfiguration that reads the plain global words instead of
/// sealing them: a request holding no lock can still pay an old word after the switch
/// converted it (tokens spent twice, or a decision on the old policy after the switch).
pub static SCOPED_SWITCH_SKIPS_SEAL: Mutant = Mutant("SCOPED_SWITCH_SKIPS_SEAL");

/// A scoped limiter's keyed give-back made on the maps it chose without checking, under
/// the key's lock, that their generation is still current: a switch that moved the key
/// to another tier's maps meanwhile leaves the give-back on maps no request reads.
pub static SCOPED_REFUND_SKIPS_RECHECK: Mutant = Mutant("SCOPED_REFUND_SKIPS_RECHECK");

/// A keyed shard's writer that takes the write lock and sets the shard's writing flag
/// without waiting for the reader sections already in the shard: it changes the shard
/// while a lock-free reader still reads it.
pub static WRITER_SKIPS_READERS: Mutant = Mutant("WRITER_SKIPS_READERS");

/// A keyed reader section that ignores the shard's writing flag: it reads the shard
/// while a writer that did not see its record changes it.
pub static READER_SKIPS_FLAG: Mutant = Mutant("READER_SKIPS_FLAG");

/// A keyed reader section entered with a relaxed store of its record: a writer that
/// reads it (the thread's exit from an earlier section of the writer's shard overwritten
/// unseen) is not ordered after that earlier section's reads.
pub static SECTION_ENTRY_RELAXED: Mutant = Mutant("SECTION_ENTRY_RELAXED");

/// The one fence of a scoped request's reader sections (`Sections::fence`, after every
/// section's record is stored) left out: a record store may then be ordered after its
/// shard's flag load, so a writer and a section can each miss the other.
pub static SECTIONS_SKIP_FENCE: Mutant = Mutant("SECTIONS_SKIP_FENCE");

/// An all-or-nothing acquisition's planned take landed by a plain store of the word it
/// planned, not a compare-and-swap from the word it read: a take by another thread in
/// between is overwritten (tokens minted).
pub static PLANNED_TAKE_STORES_BLIND: Mutant = Mutant("PLANNED_TAKE_STORES_BLIND");
