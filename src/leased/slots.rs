//! Core-local lease slots: cache-padded words holding tokens leased from a global bucket.
//!
//! Each slot is one `AtomicU64` in one of three states:
//!
//! ```text
//!  63 62  61                    token_bits  token_bits-1             0
//! +-----+-------------------------------+---------------------------+
//! | 0 0 |  lease tick (T bits)          |  tokens                   |  OPEN
//! | 0 1 |  tag                                                      |  LEASING
//! | 1 0 |h|  count                                                  |  CLOSED
//! +-----+-----------------------------------------------------------+
//! ```
//!
//! * OPEN slots hold whole tokens leased at a tick (the global word's tick, modulo
//!   `2^T` as in the global word, so stamps wrap with the same period). They are spent by
//!   [`Slots::consume`], the hot path: one load and one CAS on a line that only the
//!   threads mapped to this slot write, and only within the tick they were leased in.
//!   A spend leaves at least one token: a slot is emptied only by a lessee or a closer,
//!   which keep the count of stocked slots ([`Slots::stocked`]) that lets a rejection
//!   skip reading the slots when none holds a token.
//! * A lessee turns its slot OPEN → LEASING (taking the tokens left in it), goes to the
//!   global bucket, and publishes its new lease LEASING → OPEN.
//! * A closer (a thread about to add credit to the global bucket, or to reclaim idle
//!   tokens before rejecting) turns every other slot CLOSED, taking the tokens of OPEN
//!   slots, and reopens them after its global CAS. While a slot is CLOSED nothing can be
//!   spent from it or published to it; closes nest (the count), so concurrent closers
//!   compose.
//! * Closing a LEASING slot cancels the lease: it becomes CLOSED with one extra count,
//!   held for the lessee, whose publish then fails; the lessee gives its tokens back to
//!   the global bucket and only then drops that count ([`Slots::abandon`]). Tokens
//!   outside the global bucket are therefore always visible in some slot: OPEN (in the
//!   word), LEASING (in the lessee's hand) or CLOSED (in a closer's or a cancelled
//!   lessee's hand), which is what lets a closer bound them ([`Closed`]). The first
//!   close of a slot sets the CLOSED word's `h` bit ([`HAND`]) when it took tokens from
//!   it or cancelled a lease: only then may a hand hold tokens taken through the slot,
//!   and later closers reserve room for them. And since a cancelled slot cannot reopen
//!   before its lessee has seen the cancellation, a publish can never land in a later
//!   lease's marker (no ABA).
//!
//! # Orderings
//!
//! Every write to a slot word is a read-modify-write with `AcqRel` (loads `Acquire`), as
//! every write to the global word is. Each word's modification order is then part of
//! happens-before (each RMW reads its predecessor and synchronizes with it), so the
//! execution has a sequential witness: any linear extension of happens-before. The
//! exactness argument in [`crate::guide::leasing`] is made on that witness. On x86 these
//! orderings cost nothing over `Relaxed`.

use std::fmt;

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU64, Ordering};

/// Bit position of the two state bits.
const STATE_SHIFT: u32 = 62;
/// Low bits: tokens (OPEN), tag (LEASING) or close count (CLOSED).
pub(crate) const PAYLOAD_MASK: u64 = (1 << STATE_SHIFT) - 1;
/// State bits of an OPEN slot (zero, so an OPEN word is its token count).
const OPEN: u64 = 0;
/// The word of a slot whose lessee is at the global bucket.
const LEASING: u64 = 1 << STATE_SHIFT;
/// State bits of a slot held shut by closers.
const CLOSED: u64 = 2 << STATE_SHIFT;
/// In a CLOSED word: set by the close that shut an OPEN slot holding tokens (taking them)
/// or a LEASING one (cancelling its lease), so a hand may hold tokens taken through the
/// slot; cleared when the cancelled lessee abandons the slot (its tokens given back) and
/// when the slot reopens. A closer's hand is stored before its count is dropped, so the
/// bit may stay set after that hand is stored: a bound, never short.
const HAND: u64 = 1 << (STATE_SHIFT - 1);
/// Low bits of a CLOSED word: the close count.
const COUNT_MASK: u64 = HAND - 1;
/// Mask of the state bits.
const STATE_MASK: u64 = 3 << STATE_SHIFT;

/// The decoded state of a slot word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Open(u64),
    Leasing,
    Closed(u64),
}

#[inline]
fn decode(word: u64) -> State {
    let payload = word & PAYLOAD_MASK;
    match word & STATE_MASK {
        OPEN => State::Open(payload),
        LEASING => State::Leasing,
        _ => State::Closed(payload),
    }
}

/// One slot, alone on its cache line.
struct Slot {
    word: AtomicU64,
}

/// What a [`Slots::close`] found: the tokens it took, and how many slots may have tokens
/// in other threads' hands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Closed {
    /// Tokens taken from OPEN slots (now in the closer's hand).
    pub(crate) taken: u64,
    /// LEASING slots cancelled: each lessee holds at most one lease (or its leftover).
    pub(crate) leasing: u64,
    /// Slots already CLOSED.
    pub(crate) closed: u64,
    /// Of those, the slots whose [`HAND`] bit is set: each may have tokens in one hand, at
    /// most one lease: the earlier closer's that took its OPEN tokens, or the lessee's
    /// whose lease the first close cancelled (never both: a closed slot is neither
    /// claimed nor taken from, and that hand is stored before its count is dropped). A
    /// slot shut empty has no such hand.
    pub(crate) closed_with_hand: u64,
}

/// A power-of-two array of cache-padded slots.
pub(crate) struct Slots {
    slots: Box<[CachePadded<Slot>]>,
    /// How many slots are stocked: OPEN holding tokens, or LEASING for a lessee whose
    /// claim took tokens (its slot counts until it publishes). Raised before a publish
    /// that stocks a slot and lowered only after the write that leaves one without
    /// tokens (a close, a publish of nothing, a cancelled publish), so it is
    /// never below the OPEN slots holding tokens, and equal to them when nothing runs
    /// concurrently. Written only at a trip to the pool that stocks or empties a slot
    /// (a spend never empties one: see [`Slots::consume`]), so a rejection that finds
    /// it zero reads no slot.
    stocked: CachePadded<AtomicU64>,
    mask: usize,
    /// Bits of the token field of an OPEN word: `62 - T`.
    token_bits: u32,
    /// `2^(62 - T) - 1`: the token field, and the most tokens one slot holds.
    token_mask: u64,
    /// `2^T - 1`: stamps are ticks modulo `2^T`.
    tick_mask: u64,
}

impl fmt::Debug for Slots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(
                self.slots
                    .iter()
                    .map(|s| decode(s.word.load(Ordering::Relaxed))),
            )
            .finish()
    }
}

/// What one [`consume`](Slots::consume) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spend {
    /// The cost was taken; the tokens left in the slot (at least one).
    Paid(u64),
    /// The slot cannot pay the cost: nothing written.
    Unpayable,
    /// The slot's word changed between the load and the swap: nothing written.
    Raced,
}

impl Slots {
    /// The most tokens one slot can hold when stamps have `tick_bits` bits.
    pub(crate) fn max_tokens(tick_bits: u32) -> u64 {
        PAYLOAD_MASK >> tick_bits.min(STATE_SHIFT)
    }

    /// `count` empty OPEN slots stamped with `tick_bits`-bit ticks; `count` must be a
    /// power of two (checked by the caller).
    pub(crate) fn new(count: usize, tick_bits: u32) -> Slots {
        debug_assert!(count.is_power_of_two());
        let tick_bits = tick_bits.min(STATE_SHIFT);
        let token_bits = STATE_SHIFT - tick_bits;
        Slots {
            slots: (0..count)
                .map(|_| {
                    CachePadded::new(Slot {
                        word: AtomicU64::new(OPEN),
                    })
                })
                .collect(),
            stocked: CachePadded::new(AtomicU64::new(0)),
            mask: count - 1,
            token_bits,
            token_mask: Slots::max_tokens(tick_bits),
            tick_mask: PAYLOAD_MASK >> token_bits,
        }
    }

    /// The stamp field of an OPEN word leased at `tick`.
    #[inline]
    fn stamp(&self, tick: u64) -> u64 {
        (tick & self.tick_mask) << self.token_bits
    }

    /// Bytes the slot array holds.
    pub(crate) fn heap_bytes(&self) -> usize {
        std::mem::size_of_val::<[CachePadded<Slot>]>(&self.slots)
    }

    /// Number of slots.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    #[inline]
    fn slot(&self, index: usize) -> &Slot {
        let index = index & self.mask;
        debug_assert!(index < self.slots.len());
        // SAFETY: `mask` is `slots.len() - 1` for a power-of-two length (set in `new`,
        // never changed), so `index & mask` is below the length.
        unsafe { self.slots.get_unchecked(index) }
    }

    /// The hot path: spends `cost` tokens (at least one) from an OPEN slot leased at
    /// `now_tick` and holding more than `cost`, in one compare-and-swap. Returns the
    /// tokens left in it (at least one); [`Spend::Unpayable`] (writing nothing) when the
    /// slot is not OPEN, was leased at another tick, or holds `cost` or fewer;
    /// [`Spend::Raced`] (writing nothing) when its word changed between the load and the
    /// swap. Only a trip or a close writes another thread's slot, so the caller leaves a
    /// race to its trip rather than looping here: a loop would keep the word's address
    /// and its fields alive across the swap, and every spend would save registers for
    /// them.
    ///
    /// A spend never empties a slot: its last tokens are spent by a trip to the pool,
    /// which claims them (giving them back in its exchange, where they pay). So a slot
    /// holding tokens stays [stocked](Slots::stocked) until a trip or a close empties
    /// it, and the count is kept by those alone, never on this path.
    #[inline]
    pub(crate) fn consume(&self, index: usize, cost: u64, now_tick: u64) -> Spend {
        let word = &self.slot(index).word;
        let cur = word.load(Ordering::Acquire);
        let Some(tokens) = self.payable(cur, cost, now_tick) else {
            return Spend::Unpayable;
        };
        let landed = if mutant!(SPEND_STORES_BLIND) {
            word.store(cur - cost, Ordering::Release);
            Ok(cur)
        } else {
            word.compare_exchange(cur, cur - cost, Ordering::AcqRel, Ordering::Acquire)
        };
        match landed {
            Ok(_) => Spend::Paid(tokens - cost),
            Err(_) => Spend::Raced,
        }
    }

    /// The tokens a slot whose word is `cur` holds, when [`consume`](Slots::consume)
    /// would take `cost` of them at `now_tick`: the slot OPEN, leased at that tick, and
    /// holding more than `cost`.
    #[inline(always)]
    fn payable(&self, cur: u64, cost: u64, now_tick: u64) -> Option<u64> {
        let stamp = if mutant!(LEASE_NEVER_EXPIRES) && cur & STATE_MASK == OPEN {
            cur >> self.token_bits
        } else {
            now_tick & self.tick_mask
        };
        // One comparison checks both the state (OPEN is zero, any other state sets bits
        // above every stamp) and the lease tick.
        let tokens = cur & self.token_mask;
        // More than `cost`: a spend leaves at least one token (see `consume`).
        (cur >> self.token_bits == stamp && tokens > cost).then_some(tokens)
    }

    /// [`consume`](Slots::consume)'s take computed on the slot's word as loaded now,
    /// writing nothing: the word and the tokens the take would leave, or `None` when it
    /// would take nothing. [`land`](Slots::land) makes it.
    #[inline]
    pub(crate) fn plan(&self, index: usize, cost: u64, now_tick: u64) -> Option<(u64, u64)> {
        let cur = self.slot(index).word.load(Ordering::Acquire);
        let tokens = self.payable(cur, cost, now_tick)?;
        Some((cur, tokens - cost))
    }

    /// Takes `cost` tokens from the slot whose word [`plan`](Slots::plan) read as `cur`,
    /// if it is still `cur`; `false`, writing nothing, otherwise.
    #[inline]
    pub(crate) fn land(&self, index: usize, cur: u64, cost: u64) -> bool {
        self.slot(index)
            .word
            .compare_exchange(cur, cur - cost, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Whether [`consume`](Slots::consume) would find the slot able to pay `cost` now.
    /// Reads the slot's word alone; writes nothing.
    #[inline]
    pub(crate) fn can_pay(&self, index: usize, cost: u64, now_tick: u64) -> bool {
        let cur = self.slot(index).word.load(Ordering::Acquire);
        cur >> self.token_bits == now_tick & self.tick_mask && cur & self.token_mask > cost
    }

    /// Marks an OPEN slot LEASING, taking the tokens left in it (of any tick). Returns
    /// the slot's index and those tokens; `None` (writing nothing) when the slot is being
    /// leased by another thread or is closed. A slot claimed with tokens stays
    /// [stocked](Slots::stocked) for its lessee, who settles the count when it publishes
    /// ([`publish`](Slots::publish)), whether the publish lands or finds the lease
    /// cancelled.
    pub(crate) fn claim(&self, index: usize) -> Option<(usize, u64)> {
        let index = index & self.mask;
        let word = &self.slots[index].word;
        let mut cur = word.load(Ordering::Acquire);
        loop {
            let State::Open(payload) = decode(cur) else {
                return None;
            };
            match word.compare_exchange_weak(cur, LEASING, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some((index, payload & self.token_mask)),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Turns the caller's LEASING slot back into an OPEN slot holding `tokens` leased at
    /// `tick`; `claimed`: the caller's [`claim`](Slots::claim) took tokens (the slot is
    /// stocked for it). The [stocked](Slots::stocked) count is raised before a publish
    /// that stocks the slot, and lowered after the write when the slot is left without
    /// tokens: published empty, or cancelled. `false` (writing nothing to the slot) when
    /// a closer cancelled the lease: the caller must give its tokens back and then
    /// [`abandon`](Slots::abandon) the slot.
    pub(crate) fn publish(&self, index: usize, tick: u64, tokens: u64, claimed: bool) -> bool {
        debug_assert!(tokens <= self.token_mask);
        let counted = claimed || tokens > 0;
        if !claimed && tokens > 0 {
            self.stocked.fetch_add(1, Ordering::AcqRel);
        }
        let published = self
            .slot(index)
            .word
            .compare_exchange(
                LEASING,
                OPEN | self.stamp(tick) | tokens,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok();
        if counted && !(published && tokens > 0) {
            self.unstock(1);
        }
        published
    }

    /// Drops the count a cancellation held for the caller (after a failed
    /// [`publish`](Slots::publish), once its tokens are back in the global bucket).
    /// The slot's [`HAND`] bit is cleared: the bit was set by the close that cancelled
    /// this lessee (the slot has stayed closed since), whose tokens are now back.
    pub(crate) fn abandon(&self, index: usize) {
        self.release(&self.slot(index).word, true);
    }

    /// How many slots are stocked (see the field): zero only when no OPEN slot holds
    /// tokens, unless a publish is racing the load. Exact, and at most the slot count,
    /// when nothing runs concurrently.
    #[inline(always)]
    pub(crate) fn stocked(&self) -> u64 {
        self.stocked.load(Ordering::Acquire)
    }

    /// Lowers the stocked count by `n` slots, emptied by the caller's write.
    fn unstock(&self, n: u64) {
        if n > 0 {
            self.stocked.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Closes every slot but `keep`: OPEN tokens are taken (the slots emptied leave the
    /// [stocked](Slots::stocked) count), LEASING leases cancelled (with a count held for
    /// their lessee), CLOSED counts raised. Every slot but `keep`
    /// stays closed until [`reopen`](Slots::reopen) with the same `keep`.
    pub(crate) fn close(&self, keep: Option<usize>) -> Closed {
        let mut found = Closed::default();
        // OPEN slots taken holding tokens: emptied here, so no longer stocked. (A
        // LEASING slot stays counted for its lessee, who settles it.)
        let mut stocked = 0u64;
        for (i, slot) in self.slots.iter().enumerate() {
            if Some(i) == keep {
                continue;
            }
            let mut cur = slot.word.load(Ordering::Acquire);
            loop {
                let next = match decode(cur) {
                    State::Open(payload)
                        if payload & self.token_mask == 0 || mutant!(CLOSE_FORGETS_HAND) =>
                    {
                        CLOSED | 1
                    }
                    State::Open(_) => CLOSED | HAND | 1,
                    State::Leasing => CLOSED | HAND | 2,
                    // The count grows below the bit, which stays.
                    State::Closed(n) => CLOSED | (n + 1),
                };
                match slot.word.compare_exchange_weak(
                    cur,
                    next,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        match decode(cur) {
                            State::Open(payload) => {
                                let tokens = payload & self.token_mask;
                                found.taken += tokens;
                                stocked += u64::from(tokens > 0);
                            }
                            State::Leasing => {
                                found.leasing += 1;
                                stocked += u64::from(mutant!(CLOSE_UNSTOCKS_LEASES));
                            }
                            State::Closed(n) => {
                                found.closed += 1;
                                found.closed_with_hand += u64::from(n & HAND != 0);
                            }
                        }
                        break;
                    }
                    Err(actual) => cur = actual,
                }
            }
        }
        self.unstock(stocked);
        found
    }

    /// After a [`close`](Slots::close) of every slot by the caller, waits until each slot
    /// holds the caller's close alone: every lessee whose lease that close cancelled has
    /// given it back and let its slot go, and every closer that closed a slot before it
    /// has stored its hand and reopened it. Then no token taken from the pool is in any
    /// hand: a close made after the caller's takes nothing (every slot is closed), and a
    /// lessee can claim no slot. A reconfiguration waits so before sealing the pool.
    pub(crate) fn await_settled(&self) {
        for slot in self.slots.iter() {
            let mut spins = 0u32;
            while slot.word.load(Ordering::Acquire) & !HAND != CLOSED | 1 {
                crate::sync::spin(&mut spins);
            }
        }
    }

    /// Undoes one [`close`](Slots::close) with the same `keep`.
    pub(crate) fn reopen(&self, keep: Option<usize>) {
        for (i, slot) in self.slots.iter().enumerate() {
            if Some(i) != keep {
                self.release(&slot.word, false);
            }
        }
    }

    /// Drops one close count: CLOSED(1) becomes OPEN and empty. `hand_back`: the
    /// caller's hand, the one the [`HAND`] bit stands for, is stored; the bit is cleared.
    fn release(&self, word: &AtomicU64, hand_back: bool) {
        let mut cur = word.load(Ordering::Acquire);
        loop {
            let next = match decode(cur) {
                State::Closed(n) if n & COUNT_MASK == 1 => OPEN,
                State::Closed(n) if hand_back => CLOSED | ((n - 1) & COUNT_MASK),
                State::Closed(n) => CLOSED | (n - 1),
                other => {
                    debug_assert!(false, "releasing a slot that is not closed: {other:?}");
                    return;
                }
            };
            match word.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    /// The word of slot `index`, for tests and diagnostics.
    pub(crate) fn word(&self, index: usize) -> u64 {
        self.slot(index).word.load(Ordering::Acquire)
    }

    /// Tokens held in OPEN slots now (a racy sum; exact when nothing runs concurrently).
    /// Loads every slot's line.
    pub(crate) fn held(&self) -> u64 {
        #[cfg(all(test, not(loom)))]
        SCANS.with(|n| n.set(n.get() + 1));
        self.slots
            .iter()
            .map(|s| match decode(s.word.load(Ordering::Acquire)) {
                State::Open(payload) => payload & self.token_mask,
                _ => 0,
            })
            .sum()
    }

    /// [`held`](Slots::held) when it is at most `most` tokens, else `None`, loading the
    /// slots' lines in order only until the sum exceeds `most` (the same loads as
    /// `held` up to there). For the trip's rejection, which must count the slots: one
    /// select per slot and no unrolling, so that it keeps few registers alive.
    #[inline(always)]
    pub(crate) fn held_at_most(&self, most: u64) -> Option<u64> {
        #[cfg(all(test, not(loom)))]
        SCANS.with(|n| n.set(n.get() + 1));
        let mut held = 0u64;
        for slot in self.slots.iter() {
            let word = slot.word.load(Ordering::Acquire);
            // OPEN is zero in the state bits; LEASING and CLOSED words hold no tokens.
            held += if word & STATE_MASK == OPEN {
                word & self.token_mask
            } else {
                0
            };
            if held > most {
                return None;
            }
        }
        Some(held)
    }
}

#[cfg(all(test, not(loom)))]
thread_local! {
    /// Calls of [`Slots::held`] on this thread, for tests of which paths read every slot.
    static SCANS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many times this thread has read every slot ([`Slots::held`]).
#[cfg(all(test, not(loom)))]
pub(crate) fn scans() -> usize {
    SCANS.with(|n| n.get())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const T: u32 = 40;

    fn lease(slots: &Slots, index: usize, tick: u64, tokens: u64) {
        let (i, held) = slots.claim(index).unwrap();
        assert!(slots.publish(i, tick, tokens, held > 0));
    }

    /// The OPEN slots holding tokens, counted by reading every slot.
    fn holding(slots: &Slots) -> u64 {
        (0..slots.len())
            .filter(
                |&i| matches!(decode(slots.word(i)), State::Open(t) if t & slots.token_mask > 0),
            )
            .count() as u64
    }

    #[test]
    fn consume_spends_only_open_slots_leased_this_tick_holding_more_than_the_cost() {
        let slots = Slots::new(2, T);
        // `can_pay`, read-only, agrees with every `consume` before it runs.
        let consume = |i: usize, cost: u64, tick: u64| {
            let could = slots.can_pay(i, cost, tick);
            let spent = match slots.consume(i, cost, tick) {
                Spend::Paid(left) => Some(left),
                Spend::Unpayable => None,
                Spend::Raced => panic!("no other thread writes the slots"),
            };
            assert_eq!(could, spent.is_some(), "slot {i}, cost {cost}, tick {tick}");
            spent
        };
        assert_eq!(consume(0, 1, 0), None);
        let (i, t) = slots.claim(0).unwrap();
        assert_eq!((i, t), (0, 0));
        assert_eq!(consume(0, 1, 7), None, "a LEASING slot is not spendable");
        assert!(slots.publish(i, 7, 5, false));
        assert_eq!(consume(0, 6, 7), None);
        assert_eq!(consume(0, 5, 7), None, "a spend leaves a token");
        assert_eq!(consume(0, 1, 8), None, "expired at the next tick");
        assert_eq!(consume(0, 1, 6), None, "nor spendable from an earlier tick");
        assert_eq!(consume(0, 2, 7), Some(3));
        assert_eq!(consume(2, 2, 7), Some(1), "indices wrap by the mask");
        assert_eq!(consume(0, 1, 7), None, "the last token is the trip's");
        assert_eq!(consume(0, 1, 7 + (1 << T)), None);
        assert_eq!(slots.stocked(), 1, "still stocked: the trip empties it");
    }

    /// The stocked count follows every write that stocks or empties a slot: a publish
    /// of tokens, a publish of none after a claim that took some, a close, a cancelled
    /// publish; a claim alone leaves the slot counted for its lessee.
    #[test]
    fn the_stocked_count_is_the_open_slots_holding_tokens() {
        let slots = Slots::new(4, T);
        let check = |claimed: u64, what: &str| {
            assert_eq!(slots.stocked(), holding(&slots) + claimed, "{what}");
        };
        check(0, "new");
        lease(&slots, 0, 1, 3);
        lease(&slots, 1, 1, 2);
        check(0, "two leases");
        let (zero, held) = slots.claim(0).unwrap();
        assert_eq!(held, 3);
        check(1, "slot 0 claimed with its tokens: counted for its lessee");
        assert!(slots.publish(zero, 2, 4, true));
        check(0, "published again holding tokens");
        let (zero, held) = slots.claim(0).unwrap();
        assert!(slots.publish(zero, 3, 0, held > 0));
        check(0, "published empty");
        assert_eq!(slots.stocked(), 1);
        let (two, held) = slots.claim(2).unwrap();
        assert_eq!(held, 0);
        check(0, "slot 2 claimed empty");
        lease(&slots, 3, 3, 1);
        let found = slots.close(Some(3));
        assert_eq!((found.taken, found.leasing), (2, 1));
        check(
            0,
            "slot 1 emptied by the close; slot 2's lessee holds nothing yet",
        );
        assert!(!slots.publish(two, 3, 5, false), "cancelled");
        check(0, "a cancelled publish leaves the slot uncounted");
        slots.abandon(two);
        check(0, "abandoned");
        slots.reopen(Some(3));
        check(0, "reopened empty");
        assert_eq!(slots.stocked(), 1, "slot 3 alone");
    }

    #[test]
    fn stamps_wrap_with_the_tick_field() {
        let slots = Slots::new(1, T);
        lease(&slots, 0, (1 << T) + 3, 4);
        assert_eq!(slots.consume(0, 1, 3), Spend::Paid(3));
        assert_eq!(Slots::max_tokens(T), (1 << (62 - T)) - 1);
    }

    #[test]
    fn close_takes_tokens_cancels_leases_and_nests() {
        let slots = Slots::new(4, T);
        lease(&slots, 0, 1, 7);
        let (one, _) = slots.claim(1).unwrap();
        let found = slots.close(Some(3));
        assert_eq!(
            found,
            Closed {
                taken: 7,
                leasing: 1,
                closed: 0,
                closed_with_hand: 0,
            }
        );
        let found = slots.close(None);
        // Slots 0 (its 7 tokens taken) and 1 (a lease cancelled) may have a hand holding
        // tokens; slot 2 was shut empty.
        assert_eq!(
            found,
            Closed {
                taken: 0,
                leasing: 0,
                closed: 3,
                closed_with_hand: 2,
            }
        );
        assert!(
            !slots.publish(one, 1, 4, false),
            "a cancelled lease cannot publish"
        );
        assert_eq!(slots.consume(0, 1, 1), Spend::Unpayable);
        assert!(slots.claim(2).is_none(), "closed slots cannot be leased");
        slots.reopen(None);
        slots.reopen(Some(3));
        assert!(slots.claim(0).is_some());
        assert!(
            slots.claim(1).is_none(),
            "held shut for the cancelled lessee"
        );
        slots.abandon(one);
        assert!(slots.claim(1).is_some());
        assert_eq!(slots.stocked(), 0);
    }

    #[test]
    fn a_slot_shut_empty_or_abandoned_by_its_cancelled_lessee_has_no_hand() {
        let slots = Slots::new(4, T);
        lease(&slots, 0, 1, 3);
        let (one, _) = slots.claim(1).unwrap();
        slots.close(Some(3)); // takes slot 0's 3, cancels slot 1's lease, shuts 2 empty
        let found = slots.close(Some(3));
        assert_eq!((found.closed, found.closed_with_hand), (3, 2));
        slots.abandon(one); // the cancelled lessee's tokens are back
        let found = slots.close(Some(3));
        assert_eq!((found.closed, found.closed_with_hand), (3, 1));
        for _ in 0..3 {
            slots.reopen(Some(3));
        }
        let found = slots.close(None);
        assert_eq!(
            (found.taken, found.closed, found.closed_with_hand),
            (0, 0, 0)
        );
        slots.reopen(None);
        assert_eq!(
            (0..4).map(|i| slots.word(i)).sum::<u64>(),
            0,
            "all OPEN and empty"
        );
    }

    #[test]
    fn held_counts_open_tokens_of_any_tick() {
        let slots = Slots::new(4, T);
        for (i, t) in [(0, 3), (1, 4), (2, 5)] {
            lease(&slots, i, i as u64, t);
        }
        let _leasing = slots.claim(3).unwrap();
        assert_eq!(slots.held(), 12);
    }

    /// Every combination of three slots (OPEN holding 0 to 3 tokens at two ticks,
    /// LEASING, CLOSED with and without a hand) and every bound: the rejection's count
    /// is the OPEN slots' tokens when they are at most the bound, else `None`.
    #[test]
    fn the_bounded_count_is_the_open_tokens_within_the_bound() {
        let words: Vec<u64> = (0..4)
            .flat_map(|t| [OPEN | (5 << (62 - T)) | t, OPEN | (6 << (62 - T)) | t])
            .chain([LEASING | 3, CLOSED | 1, CLOSED | HAND | 2])
            .collect();
        // A fourth slot, OPEN and empty, adds nothing (slot counts are powers of two).
        let slots = Slots::new(4, T);
        for &a in &words {
            for &b in &words {
                for &c in &words {
                    for (slot, word) in slots.slots.iter().zip([a, b, c]) {
                        slot.word.store(word, Ordering::Relaxed);
                    }
                    let open: u64 = [a, b, c]
                        .iter()
                        .filter(|&&w| w & STATE_MASK == OPEN)
                        .map(|&w| w & slots.token_mask)
                        .sum();
                    assert_eq!(slots.held(), open);
                    for most in 0..12 {
                        let expected = (open <= most).then_some(open);
                        assert_eq!(
                            slots.held_at_most(most),
                            expected,
                            "{a:#x} {b:#x} {c:#x}, most {most}"
                        );
                    }
                }
            }
        }
    }
}
