//! Leasing: why a [`LeasedBucket`](crate::LeasedBucket) admits exactly what a plain
//! bucket admits.
//!
//! This module holds documentation only. The bounds a user relies on are stated on
//! [`crate::leased`]; the pool's contract is on [`Pool`](crate::leased::Pool). Here is the
//! argument: how an admission flows, the three rules that keep it exact, and why the
//! local path reads the clock. The pure arithmetic of one exchange (settling, when to
//! quiesce, the lease size) is in `src/leased/exchange.rs`; the in-process pool's CAS
//! loop, including readings found behind the pool, is documented on
//! [`LocalPool`](crate::leased::LocalPool).
//!
//! Below, "the pool" is the [`LocalPool`](crate::leased::LocalPool): one packed word, a
//! plain bucket's, that refills lazily. A pool on a remote store keeps the same
//! contract, and the same argument holds with its own accounting of what is out on
//! lease.
//!
//! ## Shape
//!
//! A [`LeasedBucket`](crate::LeasedBucket) is a global packed word (the single source of truth, exactly a
//! plain bucket's word) plus a power-of-two array of cache-padded slots. A thread maps to
//! a slot (round-robin on its first use). An admission:
//!
//! 1. **Local** (the common case): one clock read, then one load and one CAS on the
//!    slot's own cache line when the slot holds more than the cost, leased in the current
//!    tick. The pool is not touched. A spend never empties a slot: its last token is
//!    paid by the next trip, which claims it and gives it back in its exchange (exact,
//!    as every give-back is). So a slot holding tokens is one a trip stocked and no trip
//!    or close has emptied since, and the bucket keeps a count of such slots, written
//!    only by those trips and closes (never by a spend).
//! 2. **Lease**: the slot holds the cost or fewer, or its lease is from an earlier tick. The thread
//!    marks its slot LEASING (taking its leftover), and in one exchange with the pool
//!    gives the leftover back, pays the cost and takes a batch (the lease); then
//!    publishes the batch into its slot, stamped with the tick the pool names.
//! 3. **Reject, read-only**: the global balance (refilled) plus every slot's tokens cannot
//!    pay. Nothing is written, as on a plain bucket (I5). When the global balance plus
//!    the most the slots can hold (`slots * max_lease`) cannot pay, or when the count
//!    of stocked slots is zero (every slot empty, as under sustained overload, once the
//!    trips that spent the slots' last tokens have run), the slots are not even read:
//!    such a rejection loads the pool and the count alone, whatever the slot count. The
//!    count is raised before a publish that stocks a slot and lowered after the write
//!    that empties one, so it is never below the OPEN slots holding tokens; a slot
//!    claimed with tokens stays counted for its lessee until it publishes. With the
//!    [`LocalPool`](crate::leased::LocalPool), such a rejection (no slot read) on a
//!    reading at or after the word's tick is decided inline on the loaded word, before
//!    any call. One that must count the slots is decided by the trip, which loads the
//!    slots in order only until they could pay, and counts a slot found mid-lease or
//!    closed as empty.
//! 4. **Reclaim**: the pool cannot pay, but the slots together could. The thread
//!    closes every other slot,
//!    taking the tokens idle in them (and cancelling leases in flight, which their
//!    lessees give back), gives them back in the same CAS, and only if the global
//!    balance plus everything reclaimed cannot pay does it reject (this rejection writes:
//!    it gave the reclaimed tokens back).
//!
//! The lease size adapts: `min(max_lease, spare / (2 * slots))` whole tokens, where
//! `spare` is the balance left after paying the cost. A full bucket leases big batches;
//! a nearly empty one leases little or nothing.
//!
//! ## Exactness
//!
//! Write `g` for the global balance, `O` for the tokens out on lease, and `P` for the
//! balance of a plain bucket given the same requests at the same times. Leasing moves
//! tokens from `g` to `O`; spending from a slot removes them from `O` as the plain bucket
//! removes them from `P`; giving back moves them from `O` to `g`. None of these creates
//! credit. Giving back at once is exact (`min(B, min(B, a) + b) = min(B, a + b)`, the I6
//! argument).
//!
//! Credit is capped, and that is where leasing can go wrong. The plain bucket holds
//! `min(B, P + Δ)` after `Δ` of refill; the pool holds `min(B, g + Δ)` while `O`
//! is out. If the leased tokens are spent after the cap bound, the structure admits up to
//! `O` more than the plain bucket: `min(B, x + c + Δ) - c` for the plain bucket against
//! `min(B, x + Δ)` with `c` still spendable. This happens whether the pool was
//! refilled by another thread or not at all (it is refilled lazily, from its stored tick,
//! as if the tokens had been spent before the refill). Two rules close it:
//!
//! * **Leases expire at the tick edge.** A slot's tokens are spendable only within the
//!   tick they were leased in (refill arrives only at tick edges, so within a tick no
//!   credit can enter behind a lease's back). The local path therefore reads the clock:
//!   one `Clock::now_nanos` per admission. An expired lease is not lost: the next trip to
//!   the pool gives it back (exact), then takes a fresh one.
//! * **Credit quiesces the slots first.** A CAS that adds credit (a refill across a tick
//!   edge, or a refund) first closes every other slot, unless the cap cannot bind even
//!   with every token outside the pool (`g + Δ + hand + 2 * slots * max_lease <=
//!   B`). Closing takes the tokens of OPEN slots into the adder's hand and cancels leases
//!   in flight; the adder's CAS adds the credit and everything in its hand, and then it
//!   reopens the slots. A closed slot can neither be spent from nor published into. Its
//!   own lease is taken in that same CAS, after the credit, so it is published at once.
//!   This also covers a thread that read tick `k`, was delayed, and spends `k`-stamped
//!   tokens after another thread refilled the pool at `k + 1`: its CAS on the
//!   slot either comes before the close (and so before the refill) or fails.
//! * **Tokens in flight are reserved for.** Giving tokens back is exact only when no
//!   capped credit falls between taking them out and giving them back (otherwise the
//!   credit was capped without them, and they are added on top). Tokens leave the
//!   global word only into a slot's view: a lessee's claimed leftover and its new lease
//!   are in its hand while its slot is LEASING; a cancelled lease stays in the lessee's
//!   hand while the slot stays closed on its behalf until it has given the tokens back;
//!   a closer's hand while the slots it closed stay closed. So an adder that closes the
//!   slots knows how many may still have tokens in a hand, and caps its credit at
//!   `B - reserve` instead of `B`, reserving one lease for each slot it found LEASING
//!   or already closed by a close that took tokens from it or cancelled its lease (the
//!   CLOSED word's hand bit, cleared when a cancelled lessee has given its lease back;
//!   a slot shut empty reserves nothing). One lease per slot is enough: a slot has at
//!   most one hand holding tokens taken through it (its lessee's: its leftover before
//!   the exchange, its new lease after; or, once closed, either the first closer's,
//!   which took its OPEN tokens, or the cancelled lessee's, never both, since a closed
//!   slot is neither claimed nor taken from again until that hand is stored). The bit
//!   may outlive a closer's hand (it is cleared when the slot reopens), so the reserve
//!   is a bound, never short. When requests do not overlap nothing is ever in flight,
//!   the reserve is zero and the result is exact; under overlap the reserve can only
//!   withhold credit, never create it. What it withholds is lost against the plain
//!   bucket (only refill reaching the cap makes it up), so it must stay small: it binds
//!   only when `g + hand + credit` comes within `reserve <= slots * max_lease` of `B`,
//!   and leaves at least `B - reserve`, so the shortfall never grows beyond
//!   `slots * max_lease` (see the bounds on [`crate::leased`]). Reserving two leases
//!   for a slot found closed withheld credit for hands that cannot exist: with the
//!   default lease (`B / (2 * slots)`) the reserve reached `B`, and refunds racing each
//!   other far below the cap vanished. The loom model `refunds_racing_refunds` in
//!   `loom-tests/tests/hot.rs` catches that as the planted bug
//!   `RESERVE_COUNTS_CLOSED_TWICE`; `refund_racing_a_reclaim` catches the opposite, no
//!   room for a slot found closed (`RESERVE_SKIPS_CLOSED_SLOTS`: the token in the
//!   reclaimer's hand is admitted on top of a credit that met the cap), and a close that
//!   takes a slot's tokens without setting the hand bit (`CLOSE_FORGETS_HAND`).
//!
//! The argument is made on a sequential witness: every write to the pool and to
//! the slots is an `AcqRel` read-modify-write, so each word's modification order is part
//! of happens-before, and any linear extension of happens-before is a sequential history
//! in which every slot spend comes either before the adder's close of that slot, hence
//! before its CAS, or after its reopen, hence spends tokens leased after the credit.
//!
//! The loom models in `loom-tests/tests/hot.rs` check this, and catch the planted bugs
//! `LEASE_NEVER_EXPIRES` (no expiry: the capped-refill over-credit), `CREDIT_IGNORES_LEASES`
//! (credit added without quiescing) and `LEASE_KEEPS_GLOBAL` (a lease not taken from the
//! pool). The sequential property test `tests/leased_model.rs` also fails at once
//! without the expiry or without the quiescing.
//!
//! ## Reconfiguration
//!
//! [`LeasedBucket::reconfigure`](crate::LeasedBucket::reconfigure) must convert the one
//! balance a plain bucket would hold, `min(B, g + Δ + O)`, and the pool's word alone is
//! `g`. So the switch first brings `O` to zero: it closes every slot (taking the OPEN
//! tokens and giving them back at once, which is exact as any give-back is), and then
//! waits until each slot holds its close alone. Every token outside the word is in some
//! slot's view (the rule above): in a lessee's hand while its slot is LEASING or held
//! shut for it after a cancellation, in a closer's hand while the slots it closed stay
//! closed. A close that comes after the switch's takes nothing (every slot is closed)
//! and a lessee can claim no slot, so once every count is back to one, no hand holds a
//! token taken from the word: `O = 0`, the cap binds on the whole balance, and the word
//! is exactly the plain bucket's. Only then is the word sealed and converted. The slots
//! stay closed for good; the successor starts with empty slots of its own.
//!
//! ## The clock read on the local path
//!
//! An admission paid from a slot costs one clock read, one load and one CAS on a line no
//! other core writes. Exactness against a plain bucket on the same clock rules out
//! skipping the read: without the time, a slot cannot know that a tick edge passed and
//! the plain bucket capped its refill. What the read costs depends on the clock:
//!
//! * [`QuantaClock`](crate::QuantaClock) (the default, as for [`Bucket`](crate::Bucket)):
//!   a TSC read and a multiply, the same read governor's `check()` makes, and most of an
//!   admission's cost on one thread; a leased bucket wins under contention.
//! * [`CoarseClock`](crate::CoarseClock): one load of a line the upkeep thread writes
//!   once a millisecond, so the local path is two loads and a CAS. Refill then arrives
//!   in millisecond steps, never early: the right clock for a hot global bucket.
//!   [`LeasedBucket::coarse`](crate::LeasedBucket::coarse) builds one.
//!
//! What each costs, measured beside governor, is in `BENCHMARKS.md` ("One thread",
//! "Sixteen cores", and "The pool seam").
//!
