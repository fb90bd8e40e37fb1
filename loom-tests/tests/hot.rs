//! Loom models of `LeasedBucket`: threads leasing, spending, reclaiming and refunding on
//! one bucket, exhaustively interleaved.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release -- hot::`.
//!
//! Each model is also run with a deliberate bug switched on (`tokengate::mutants`) and
//! must then fail: that shows the model can see the bug it is there for. The harness
//! (one model at a time, counting executions, expecting a violation) is `loom_tests::Model`.

#![cfg(loom)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use loom_tests::{Forward, Model, Tally, acquirers_racing_an_advance, ticks_per_token};
use tokengate::mutants;
use tokengate::{Clock, LeasedBucket, Policy, leased::LeaseConfig};

/// The two-thread frozen-clock model (each thread leasing, spending, and one of them
/// refunding and reclaiming, the other reclaiming before it decides) did not finish
/// exhaustively within ten minutes once rejections read the slots before writing; it is
/// bounded at four preemptions per execution (300,099 executions, about 40 s; five:
/// 1,526,166, over 3 minutes). Both planted bugs are caught within the bound.
const FROZEN_TWO: Model = Model {
    name: "LeasedBucket: two threads, frozen clock",
    threads: 2,
    preemption_bound: Some(4),
};

/// Three threads on two slots: bounded at two preemptions per execution (three ran past
/// twenty minutes once the epoch's pins came into the leased decision's path).
const FROZEN_THREE: Model = Model {
    name: "LeasedBucket: three threads on two slots, frozen clock",
    threads: 3,
    preemption_bound: Some(2),
};

const SPEND_AND_CLOSE: Model = Model::exhaustive("LeasedBucket: a slot's spend racing a close", 2);

const CAPPED_REFUND: Model = Model::exhaustive("LeasedBucket: capped refund with a lease out", 2);

/// Exhaustive: 188,235 executions (about 20 s); bounded at five preemptions (13,307),
/// and the planted bug is caught within the bound.
const RACING_REFUNDS: Model = Model {
    name: "LeasedBucket: two refunds racing, far below the cap",
    threads: 2,
    preemption_bound: Some(5),
};

/// Exhaustive, about two million executions (3 minutes); bounded at three preemptions
/// per execution, 2,344, and still catching both planted bugs.
const REFUND_AND_RECLAIM: Model = Model {
    name: "LeasedBucket: a refund near the cap racing a reclaim",
    threads: 2,
    preemption_bound: Some(3),
};

/// The tick-edge model (two threads each making a trip to the global word, one of them
/// closing the other's slot) did not finish exhaustively within 15 minutes here; it is
/// bounded at four preemptions per execution (65,789 executions, about 10 s; five:
/// 253,668; each extra preemption multiplies that by about four). The planted bug is
/// caught within the bound.
const TICK_EDGE: Model = Model {
    name: "LeasedBucket: a lease out across a tick edge",
    threads: 3,
    preemption_bound: Some(4),
};

const STALE_SPENDER: Model = Model::exhaustive("LeasedBucket: a delayed spender after a refill", 2);

/// The same spender without waiting for the refill: exhaustive, 424,905 executions
/// (about a minute); bounded at five preemptions per execution (4,592).
const STALE_RACE: Model = Model {
    name: "LeasedBucket: a delayed spender racing a refill",
    threads: 2,
    preemption_bound: Some(5),
};

/// Two acquirers and a clock advance: bounded at three preemptions per execution.
const ADVANCING_CLOCK: Model = Model {
    name: "LeasedBucket: two trips racing a clock advance",
    threads: 4,
    preemption_bound: Some(3),
};

fn bucket(capacity: u64, clock: &Forward) -> LeasedBucket<Forward> {
    let policy = Policy::new(capacity, 1.0).unwrap();
    let config = LeaseConfig::new().slots(2).max_lease(2);
    LeasedBucket::with_config(policy, clock.clone(), config).unwrap()
}

/// Admits `cost` on `slot`, returning the tokens taken.
fn take(b: &LeasedBucket<Forward>, slot: usize, cost: u64) -> u64 {
    if b.try_acquire_on(slot, cost).unwrap().is_admitted() {
        cost
    } else {
        0
    }
}

/// Spends whatever is left, one token at a time, from slot 0. Run once every thread is
/// joined: the count of stocked slots is then exact, and zero once the slots are empty
/// (the drain's last rejection reclaimed whatever they held).
fn drain(b: &LeasedBucket<Forward>) -> u64 {
    let mut n = 0;
    while b.try_acquire_on(0, 1).unwrap().is_admitted() {
        n += 1;
    }
    assert_eq!(
        b.leased_tokens(),
        0,
        "the drain's last rejection reclaimed the slots"
    );
    assert_eq!(b.stocked_slots(), 0, "no slot holds tokens");
    n
}

/// Two threads lease, spend locally, hit a global word that cannot pay (so take back
/// the other slot's lease before deciding), refund and reclaim, on a frozen clock.
/// However they interleave, the tokens admitted (net of refunds) plus what is left
/// equal the initial balance exactly. The refund is made well below the capacity, where
/// no credit can meet the cap (that case is `capped_refund_with_a_lease_out`).
fn frozen_two_threads() {
    let clock = Forward::new();
    let b = Arc::new(bucket(64, &clock));
    let t = {
        let b = b.clone();
        thread::spawn(move || {
            let mut net = take(&b, 1, 20); // leases two more to slot 1
            if take(&b, 1, 1) > 0 {
                b.refund(1).unwrap();
            }
            net += take(&b, 1, 1);
            b.reclaim();
            net
        })
    };
    let mut mine = take(&b, 0, 1); // leases two more to slot 0
    mine += take(&b, 0, 40); // may need slot 1's lease: reclaim before rejecting
    let theirs = t.join().unwrap();
    let total = mine + theirs + drain(&b);
    assert_eq!(
        total, 64,
        "admitted {mine} + {theirs}, then drained the rest"
    );
    assert_eq!(b.leased_tokens(), 0);
}

#[test]
fn frozen_clock_admits_exactly_the_balance() {
    loom_tests::in_own_process!();
    assert!(FROZEN_TWO.check(frozen_two_threads).executions > 1);
}

#[test]
fn frozen_clock_model_catches_a_lease_left_in_the_global_word() {
    loom_tests::in_own_process!();
    FROZEN_TWO.expect_violation(&mutants::LEASE_KEEPS_GLOBAL, frozen_two_threads);
}

#[test]
fn frozen_clock_model_catches_a_close_that_unstocks_a_lease_in_flight() {
    loom_tests::in_own_process!();
    FROZEN_TWO.expect_violation(&mutants::CLOSE_UNSTOCKS_LEASES, frozen_two_threads);
}

/// Three threads on two slots (two share slot 1), frozen clock: exact conservation.
fn frozen_three_threads() {
    let clock = Forward::new();
    let b = Arc::new(bucket(64, &clock));
    let handles: Vec<_> = (0..2)
        .map(|i| {
            let b = b.clone();
            thread::spawn(move || {
                let got = take(&b, i, 20);
                if i == 1 && got > 0 {
                    b.refund(1).unwrap();
                    return got - 1;
                }
                got
            })
        })
        .collect();
    let mut total = take(&b, 1, 2);
    for h in handles {
        total += h.join().unwrap();
    }
    total += drain(&b);
    assert_eq!(total, 64);
}

#[test]
fn frozen_clock_three_threads_admit_exactly_the_balance() {
    loom_tests::in_own_process!();
    assert!(FROZEN_THREE.check(frozen_three_threads).executions > 1);
}

/// A spend from a slot racing a reclaim that closes it (frozen clock). Slot 1 holds a
/// lease of two tokens; one thread spends one of them while the other reclaims every
/// slot. The spend is one compare-and-swap: when the close lands between its load and
/// its swap, the swap fails and the spend is decided by a trip to the pool instead
/// (which finds the slot closed and the tokens back in the pool). Either way the
/// tokens admitted and drained are the capacity exactly.
fn spend_racing_a_close() {
    let clock = Forward::new();
    let b = Arc::new(bucket(16, &clock));
    assert_eq!(take(&b, 1, 1), 1); // leases two more to slot 1
    assert_eq!(b.leased_tokens(), 2);
    let t = {
        let b = b.clone();
        thread::spawn(move || take(&b, 1, 1))
    };
    b.reclaim();
    let spent = t.join().unwrap();
    assert_eq!(spent, 1, "the bucket could pay");
    let total = 1 + spent + drain(&b);
    assert_eq!(total, 16, "admitted {total} of 16");
}

#[test]
fn a_spend_racing_a_close_admits_exactly_the_balance() {
    loom_tests::in_own_process!();
    assert!(SPEND_AND_CLOSE.check(spend_racing_a_close).executions > 1);
}

#[test]
fn spend_and_close_model_catches_a_spend_that_overwrites_a_close() {
    loom_tests::in_own_process!();
    SPEND_AND_CLOSE.expect_violation(&mutants::SPEND_STORES_BLIND, spend_racing_a_close);
}

/// A refund that meets the cap while a lease is out (frozen clock). Thread A leases; the
/// other thread refunds two tokens nobody took. A plain bucket ends with at most one
/// token of credit from the refund (it caps at 16), so at most 17 tokens are admitted in
/// all; crediting the global word without taking the lease back first admits 18 (the
/// lease is two tokens, so that one of them is spent from the slot after the credit: a
/// slot's last token is the trip's, given back, capped). Fewer is allowed: at most one
/// lease withheld.
fn capped_refund_with_a_lease_out() {
    let clock = Forward::new();
    let b = Arc::new(bucket(16, &clock));
    let t = {
        let b = b.clone();
        thread::spawn(move || take(&b, 0, 1)) // leases two more to slot 0
    };
    b.refund(2).unwrap();
    let taken = t.join().unwrap();
    let total = taken + drain(&b);
    assert!(
        (15..=17).contains(&total),
        "admitted {total}, a plain bucket at most 17"
    );
}

#[test]
fn a_capped_refund_takes_leases_back_first() {
    loom_tests::in_own_process!();
    assert!(
        CAPPED_REFUND
            .check(capped_refund_with_a_lease_out)
            .executions
            > 1
    );
}

#[test]
fn capped_refund_model_catches_credit_that_ignores_leases() {
    loom_tests::in_own_process!();
    CAPPED_REFUND.expect_violation(
        &mutants::CREDIT_IGNORES_LEASES,
        capped_refund_with_a_lease_out,
    );
}

/// Two refunds racing each other far below the capacity (frozen clock). Six of eight
/// tokens are taken first (the two left are too few to lease), then two threads each
/// refund one token: every credit quiesces the slots (the tokens that could be out on
/// lease would reach the cap), so each refunder may find both slots closed by the other.
/// Nothing is in any hand, and a plain bucket holds 4 after the refunds, far from its cap
/// of 8: the drain takes exactly 4. Reserving two leases for every slot found closed
/// (`2 * 2 * 2` tokens, the whole capacity) withholds a refund for good.
fn refunds_racing_refunds() {
    let clock = Forward::new();
    let b = Arc::new(bucket(8, &clock));
    assert_eq!(take(&b, 0, 6), 6);
    assert_eq!(b.leased_tokens(), 0);
    let t = {
        let b = b.clone();
        thread::spawn(move || b.refund(1).unwrap())
    };
    b.refund(1).unwrap();
    t.join().unwrap();
    assert_eq!(drain(&b), 4, "a refund was lost");
    assert_eq!(b.leased_tokens(), 0);
}

#[test]
fn refunds_racing_refunds_lose_nothing_below_the_cap() {
    loom_tests::in_own_process!();
    assert!(RACING_REFUNDS.check(refunds_racing_refunds).executions > 1);
}

#[test]
fn racing_refunds_model_catches_a_reserve_counting_closed_slots_twice() {
    loom_tests::in_own_process!();
    RACING_REFUNDS.expect_violation(
        &mutants::RESERVE_COUNTS_CLOSED_TWICE,
        refunds_racing_refunds,
    );
}

/// A refund near the cap racing a reclaim that holds a slot's tokens (frozen clock).
/// Slot 0 leases one token (six left in the pool); one thread reclaims it while the
/// other refunds two tokens and then asks for eight from slot 1. A plain bucket caps the
/// refund at 8, so at most 9 are admitted in all. A refunder that finds slot 0 closed by
/// the reclaim must leave room for the token in the reclaimer's hand (one lease): with
/// no room, the credit fills the pool to 8, the eight are admitted, and the reclaimed
/// token, given back after them, is admitted on top (10). The room it leaves may be
/// withheld for good: at most one lease (two tokens).
fn refund_racing_a_reclaim() {
    let clock = Forward::new();
    let b = Arc::new(bucket(8, &clock));
    assert_eq!(take(&b, 0, 1), 1);
    assert_eq!(b.leased_tokens(), 1);
    let t = {
        let b = b.clone();
        thread::spawn(move || b.reclaim())
    };
    b.refund(2).unwrap();
    let eight = take(&b, 1, 8);
    t.join().unwrap();
    let total = 1 + eight + drain(&b);
    assert!(
        (7..=9).contains(&total),
        "admitted {total}: a plain bucket admits 9"
    );
}

#[test]
fn a_refund_leaves_room_for_a_reclaimer_s_hand() {
    loom_tests::in_own_process!();
    assert!(REFUND_AND_RECLAIM.check(refund_racing_a_reclaim).executions > 1);
}

#[test]
fn refund_and_reclaim_model_catches_a_close_that_forgets_the_hand() {
    loom_tests::in_own_process!();
    REFUND_AND_RECLAIM.expect_violation(&mutants::CLOSE_FORGETS_HAND, refund_racing_a_reclaim);
}

#[test]
fn refund_and_reclaim_model_catches_a_reserve_skipping_closed_slots() {
    loom_tests::in_own_process!();
    REFUND_AND_RECLAIM.expect_violation(
        &mutants::RESERVE_SKIPS_CLOSED_SLOTS,
        refund_racing_a_reclaim,
    );
}

/// The clock advances past a full refill while a lease is out. Slot 0 leases two tokens
/// at tick 0 (two, so that one can be spent from the slot: its last is the trip's);
/// then one thread moves the clock 100 s on and spends on slot 1 (a trip to the global
/// word: refill, capped at full), while the other waits for the new time and spends on
/// slot 0. A plain bucket is full after the advance, so the two spends and the drain
/// take at most 16: 17 in all with the first admission. Spending the tick-0 lease after
/// the advance admits 18. (Fewer than 17 is allowed: a refill made while the other
/// thread's lease is in flight leaves room for it, at most one lease, 2 tokens.)
fn tick_edge_with_a_lease_out() {
    const LATER: Duration = Duration::from_secs(100);
    let clock = Forward::new();
    let b = Arc::new(bucket(16, &clock));
    let first = take(&b, 0, 1); // slot 0 leases two more at tick 0
    assert_eq!(b.leased_tokens(), 2);
    let advanced = Arc::new(loom::sync::atomic::AtomicBool::new(false));
    let refiller = {
        let (b, clock, advanced) = (b.clone(), clock.clone(), advanced.clone());
        thread::spawn(move || {
            clock.advance(LATER);
            advanced.store(true, Ordering::Release);
            take(&b, 1, 1)
        })
    };
    let spender = {
        let (b, advanced) = (b.clone(), advanced.clone());
        thread::spawn(move || {
            while !advanced.load(Ordering::Acquire) {
                thread::yield_now();
            }
            take(&b, 0, 1)
        })
    };
    let total = first + refiller.join().unwrap() + spender.join().unwrap() + drain(&b);
    assert!(
        (15..=17).contains(&total),
        "admitted {total}: a plain bucket admits 17"
    );
}

#[test]
fn a_lease_is_not_spent_after_its_tick() {
    loom_tests::in_own_process!();
    assert!(TICK_EDGE.check(tick_edge_with_a_lease_out).executions > 1);
}

#[test]
fn tick_edge_model_catches_a_lease_that_never_expires() {
    loom_tests::in_own_process!();
    TICK_EDGE.expect_violation(&mutants::LEASE_NEVER_EXPIRES, tick_edge_with_a_lease_out);
}

/// A monotonic clock read by a delayed thread: it reads the manual clock, except that the
/// first reading of the thread that made it, once `stale` is set, is time zero: a reading
/// taken long ago, before the thread was delayed. Its later readings (a re-read after
/// loading a word) are current, as a monotonic clock's are, so the clock declares itself
/// monotonic and the bucket reads it without a high-water guard (which would lift the
/// stale reading at once).
#[derive(Clone)]
struct Skewed {
    inner: Forward,
    stale: Arc<loom::sync::atomic::AtomicBool>,
    reader: loom::thread::ThreadId,
}

impl Clock for Skewed {
    fn now_nanos(&self) -> u64 {
        if thread::current().id() == self.reader && self.stale.swap(false, Ordering::AcqRel) {
            0
        } else {
            self.inner.now_nanos()
        }
    }

    fn is_monotonic(&self) -> bool {
        true
    }
}

/// A spender that read tick 0 and was delayed while another thread refilled the global
/// word at a later tick (capped at full): it must not then spend its tick-0 lease. The
/// refiller moves the clock 100 s on and trips to the global word; the spender waits
/// until the refiller is done, then spends on slot 0 with a tick-0 reading. A plain
/// bucket decides that request at a reading taken again after loading its word (100 s)
/// and admits 9 in all; spending the tick-0 lease admits 10. Without waiting, the spend may also come first
/// and be decided at tick 0, which a plain bucket allows too (9 or 10); a refill made
/// while that spend's trip to the global word is in flight leaves room for its lease (at
/// most 2 tokens), so as few as 7.
fn stale_spender_after_a_refill(wait: bool) {
    const LATER: Duration = Duration::from_secs(100);
    let clock = Skewed {
        inner: Forward::new(),
        stale: Arc::new(loom::sync::atomic::AtomicBool::new(false)),
        reader: thread::current().id(),
    };
    let policy = Policy::new(8, 1.0).unwrap();
    let config = LeaseConfig::new().slots(2).max_lease(2);
    let b = Arc::new(LeasedBucket::with_config(policy, clock.clone(), config).unwrap());
    let take = |b: &LeasedBucket<Skewed>, slot: usize| match b.try_acquire_on(slot, 1) {
        Ok(d) if d.is_admitted() => 1u64,
        _ => 0,
    };
    let first = take(&b, 0); // slot 0 leases one more at tick 0
    let done = Arc::new(loom::sync::atomic::AtomicBool::new(false));
    let refiller = {
        let (b, clock, done) = (b.clone(), clock.clone(), done.clone());
        thread::spawn(move || {
            clock.inner.advance(LATER);
            let got = take(&b, 1);
            done.store(true, Ordering::Release);
            got
        })
    };
    if wait {
        while !done.load(Ordering::Acquire) {
            thread::yield_now();
        }
    }
    clock.stale.store(true, Ordering::Release);
    let stale = take(&b, 0);
    let refilled = refiller.join().unwrap();
    let mut rest = 0;
    while take(&b, 0) == 1 {
        rest += 1;
    }
    let total = first + stale + refilled + rest;
    if wait {
        assert_eq!(total, 9, "a plain bucket admits exactly 9");
    } else {
        assert!((7..=10).contains(&total), "admitted {total}");
    }
}

#[test]
fn a_delayed_spender_cannot_spend_a_lease_across_a_refill() {
    loom_tests::in_own_process!();
    let after = STALE_SPENDER.check(|| stale_spender_after_a_refill(true));
    assert!(after.executions > 1);
    let races = STALE_RACE.check(|| stale_spender_after_a_refill(false));
    assert!(races.executions > 1);
}

#[test]
fn stale_spender_model_catches_credit_that_ignores_leases() {
    loom_tests::in_own_process!();
    STALE_SPENDER.expect_violation(&mutants::CREDIT_IGNORES_LEASES, || {
        stale_spender_after_a_refill(true)
    });
}

/// Outcomes of the clock-advance model, counted across executions.
#[derive(Clone, Default)]
struct AdvanceSeen {
    both: Tally,
    one: Tally,
}

/// Two trips to the global word (slots 0 and 1, each asking two tokens) while a third
/// thread advances the clock by two tokens of refill, twice the race tolerance: the
/// leased analogue of `clock_advance.rs`'s model. A trip whose reading predates the
/// other's CAS finds the word well ahead of it; it loads the word and only then reads the
/// clock again (see "Readings behind the word" on `LocalPool`), so the writer's reading
/// happens-before its new one and it never mistakes the lost race for an idle past the
/// wrap (which re-anchors the word full). Every execution conserves tokens: what was admitted plus what is left is the
/// refill up to the final time.
///
/// A CAS lost *after* that second reading needs a third writer, which this model does not
/// have; `tests/leased_model.rs` scripts that case with a clock that returns chosen
/// readings in a chosen order.
fn advancing_clock(seen: &AdvanceSeen) -> impl Fn() + Sync + Send + 'static {
    let policy = Policy::new(8, 1000.0).unwrap().start_empty();
    let layout = *policy.layout();
    let two_tokens = 2 * ticks_per_token(&layout);
    assert!(two_tokens > layout.tolerance_ticks());
    let step = two_tokens << layout.tick_shift();
    // Created at time 0, the bucket is anchored at the next tick edge (tick 1).
    let refill = |nanos: u64| {
        layout.units_to_tokens(((layout.tick_of(nanos) - 1) * layout.refill_per_tick()) as i64)
    };
    let end = refill(2 * step);
    assert!(end < 8.0, "the model must not reach the cap");
    let seen = seen.clone();
    move || {
        let clock = Forward::new();
        let config = LeaseConfig::new().slots(2).max_lease(1);
        let b = Arc::new(LeasedBucket::with_config(policy, clock.clone(), config).unwrap());
        clock.advance(Duration::from_nanos(step));
        let acquirer = |slot: usize| {
            let b = b.clone();
            move || b.try_acquire_on(slot, 2)
        };
        let outcomes = acquirers_racing_an_advance(&clock, step, acquirer(0), acquirer(1));
        let mut admitted = 0.0;
        for outcome in &outcomes {
            match outcome {
                Ok(d) if d.is_admitted() => admitted += 2.0,
                Ok(_) => {}
                Err(e) => panic!("a lost race was refused: {e}"),
            }
        }
        assert_eq!(
            admitted + b.available(),
            end,
            "conservation: admitted {admitted}: {outcomes:?}"
        );
        seen.both.hit_if(admitted == 4.0);
        seen.one.hit_if(admitted == 2.0);
    }
}

#[test]
fn a_lost_race_beyond_the_tolerance_is_not_a_clock_step_back() {
    loom_tests::in_own_process!();
    let seen = AdvanceSeen::default();
    ADVANCING_CLOCK.check(advancing_clock(&seen));
    println!(
        "  executions admitting both / one: {} / {}",
        seen.both.get(),
        seen.one.get()
    );
    assert!(
        seen.both.get() > 0,
        "the advance never let the second trip in"
    );
    assert!(seen.one.get() > 0, "the second trip was never refused");
}

#[test]
fn advancing_clock_model_catches_a_decision_without_a_second_reading() {
    loom_tests::in_own_process!();
    let seen = AdvanceSeen::default();
    ADVANCING_CLOCK.expect_violation(&mutants::LEASE_SKIPS_REREAD, advancing_clock(&seen));
}
