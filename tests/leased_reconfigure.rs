//! Live reconfiguration of a `LeasedBucket`: every strategy converts the pool's balance
//! and the tokens idle in slots together, nothing is lost or minted at a switch racing
//! slot admissions, pool exchanges and refunds on several slots, and on real times the
//! bucket stays under the old policy's curve before a switch and under the new one's
//! after it, deciding exactly as a `LiveBucket` given the same history.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tokengate::leased::{LeaseConfig, LeaseConfigError};
use tokengate::{AcquireError, Inherit, LeasedBucket, LiveBucket, ManualClock, Policy};
use tokengate_testkit::Ideal;
use tokengate_testkit::reconfigure::{STRATEGIES, switch_policies};

/// A bucket of 100 (10/s, time frozen) on two slots leasing at most 10, with 30 tokens
/// left, 7 of them idle in slots (placed by `try_acquire_on`).
fn thirty_left_partly_in_slots() -> LeasedBucket<ManualClock> {
    let config = LeaseConfig::new().slots(2).max_lease(10);
    let bucket =
        LeasedBucket::with_config(Policy::new(100, 10.0).unwrap(), ManualClock::new(), config)
            .unwrap();
    for (slot, cost) in SLOT_TAKES {
        assert!(bucket.try_acquire_on(slot, cost).unwrap().is_admitted());
    }
    assert_eq!(bucket.available(), 30.0);
    assert_eq!(bucket.leased_tokens(), 7, "{:?}", bucket.slot_words());
    bucket
}

/// The admissions that leave [`thirty_left_partly_in_slots`]: (slot, cost).
const SLOT_TAKES: [(usize, u64); 4] = [(0, 20), (1, 40), (1, 3), (0, 7)];

#[test]
fn each_strategy_converts_the_pool_and_the_slots_together() {
    // 30 of 100 left (7 of them in slots), then to capacity 50 and 300.
    let cases = [
        (50, Inherit::Proportional, 15.0),
        (50, Inherit::AsIs, 30.0),
        (50, Inherit::Reset, 50.0),
        (50, Inherit::Additive, 0.0), // 30 less the 50 the capacity lost, down to zero
        (300, Inherit::Proportional, 90.0),
        (300, Inherit::AsIs, 30.0),
        (300, Inherit::Reset, 300.0),
        (300, Inherit::Additive, 230.0),
    ];
    for (capacity, how, expected) in cases {
        let bucket = thirty_left_partly_in_slots();
        let old_words = bucket.slot_words();
        let switch = bucket
            .reconfigure(Policy::new(capacity, 25.0).unwrap(), how)
            .unwrap();
        assert_eq!(switch.before, 30.0, "{how:?} to {capacity}");
        assert_eq!(switch.after, expected, "{how:?} to {capacity}");
        assert_eq!(bucket.available(), expected, "{how:?} to {capacity}");
        assert_eq!(
            bucket.leased_tokens(),
            0,
            "the slots' tokens joined the balance"
        );
        assert_ne!(bucket.slot_words(), old_words, "new, empty slots");
        assert_eq!(bucket.policy().capacity(), capacity);
        assert_eq!(bucket.max_lease(), 10, "the configured lease is kept");
        // The new balance is exactly what can be taken, from either slot, and no more.
        let whole = expected as u64;
        if whole > 0 {
            assert!(bucket.try_acquire_on(1, 1).unwrap().is_admitted());
            assert!(bucket.try_acquire_on(0, whole - 1).unwrap().is_admitted() || whole == 1);
        }
        assert!(
            bucket.try_acquire_on(0, 1).unwrap().is_rejected(),
            "{how:?}"
        );
        assert!(
            bucket.try_acquire_on(1, 1).unwrap().is_rejected(),
            "{how:?}"
        );
        assert_eq!(bucket.epochs(), 2);
    }
}

#[test]
fn a_refund_after_the_switch_goes_to_the_new_policy_and_passes_are_its_own() {
    let bucket = thirty_left_partly_in_slots();
    bucket
        .reconfigure(Policy::new(40, 10.0).unwrap(), Inherit::AsIs)
        .unwrap();
    // 70 taken before the switch; a refund of 15 now is capped at the new capacity.
    bucket.refund(15).unwrap();
    assert_eq!(bucket.available(), 40.0);
    assert_eq!(
        bucket.refund(41),
        Err(AcquireError::CostExceedsCapacity {
            cost: 41,
            capacity: 40
        })
    );
    bucket.reclaim();
    bucket.reset();
    assert_eq!(bucket.available(), 40.0);
}

#[test]
fn a_cost_above_the_new_capacity_and_a_lease_that_no_longer_fits_are_typed_errors() {
    let bucket = thirty_left_partly_in_slots();
    let words = (bucket.stored_word(), bucket.slot_words());
    // A fixed largest lease of 10 does not fit a capacity of 5: nothing changes.
    assert_eq!(
        bucket.reconfigure(Policy::new(5, 1.0).unwrap(), Inherit::AsIs),
        Err(LeaseConfigError::LeaseOutOfRange {
            max_lease: 10,
            max: 5
        })
    );
    assert_eq!((bucket.stored_word(), bucket.slot_words()), words);
    assert_eq!(bucket.epochs(), 1);
    assert_eq!(bucket.available(), 30.0);

    // With the default lease, the largest lease is the new policy's default.
    let bucket = LeasedBucket::with_config(
        Policy::new(100, 10.0).unwrap(),
        ManualClock::new(),
        LeaseConfig::new().slots(4),
    )
    .unwrap();
    assert_eq!(bucket.max_lease(), 12);
    let empty = Policy::new(10, 1.0).unwrap().start_empty();
    let switch = bucket.reconfigure(empty, Inherit::Reset).unwrap();
    assert_eq!((switch.before, switch.after), (100.0, 0.0));
    assert_eq!(bucket.max_lease(), 1);
    // A cost the old policy could pay, above the new capacity: a typed error.
    assert_eq!(
        bucket.try_acquire(50),
        Err(AcquireError::CostExceedsCapacity {
            cost: 50,
            capacity: 10
        })
    );
    assert!(bucket.refund(50).is_err());
    assert_eq!(bucket.available(), 0.0);
}

#[test]
fn the_new_policy_refills_from_the_switch_at_its_own_rate() {
    let clock = ManualClock::new();
    let config = LeaseConfig::new().slots(2);
    let bucket =
        LeasedBucket::with_config(Policy::new(10, 1.0).unwrap(), clock.clone(), config).unwrap();
    assert!(bucket.try_acquire_on(0, 10).unwrap().is_admitted());
    clock.advance(Duration::from_secs(3));
    let switch = bucket
        .reconfigure(Policy::new(100, 50.0).unwrap(), Inherit::AsIs)
        .unwrap();
    // Three seconds at 1/s, less the refill lag (under two ticks).
    assert!(switch.before > 2.99 && switch.before <= 3.0, "{switch:?}");
    clock.advance(Duration::from_secs(1));
    let available = bucket.available();
    assert!(
        available <= switch.after + 50.0 && available > switch.after + 49.9,
        "{available}"
    );
}

/// Three threads admitting (from their slots and through the pool) and refunding on
/// four slots, one of them reclaiming now and then, while another thread switches the
/// policy hundreds of times. The admitters run until the switches are done and refund
/// most admissions, so that slots hold tokens at many switches. Time stands still, so
/// no refill: whatever the interleaving, admitted less refunded plus what is left equals
/// the start. Capacities alternate between 1,000 and 2,000 with `AsIs`: never capped
/// (at most 1,000 is ever held), never added to.
#[test]
fn racing_admissions_refunds_and_switches_neither_lose_nor_mint_tokens() {
    use std::sync::atomic::AtomicBool;
    // Leases of at most 10 on 4 slots, and 400 taken first: credit below 900 tokens
    // cannot meet the capacity whatever the slots hold, so refunds leave the slots be.
    let config = LeaseConfig::new().slots(4).max_lease(10);
    let bucket =
        LeasedBucket::with_config(Policy::new(1_000, 1.0).unwrap(), ManualClock::new(), config)
            .unwrap();
    assert!(bucket.try_acquire_on(0, 400).unwrap().is_admitted());
    let policies = [
        Policy::new(2_000, 3.0).unwrap(),
        Policy::new(1_000, 1.0).unwrap(),
    ];
    let net = AtomicI64::new(400);
    let (switches, admitted, done) = (AtomicU64::new(0), AtomicU64::new(0), AtomicBool::new(false));
    let during = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let (bucket, net, admitted, done) = (&bucket, &net, &admitted, &done);
            s.spawn(move || {
                let mut i = 0u64;
                while !done.load(Ordering::Relaxed) || i < 2_000 {
                    i += 1;
                    let cost = 1 + (i + t) % 3;
                    let slot = (t + i / 7) as usize;
                    if bucket.try_acquire_on(slot, cost).unwrap().is_admitted() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                        net.fetch_add(cost as i64, Ordering::Relaxed);
                        // Keep most of it in play: a refund, but for one in 50 while
                        // less than 600 is taken.
                        if !i.is_multiple_of(50) || net.load(Ordering::Relaxed) > 600 {
                            bucket.refund(cost).unwrap();
                            net.fetch_sub(cost as i64, Ordering::Relaxed);
                        }
                    }
                    if t == 0 && i.is_multiple_of(97) {
                        bucket.reclaim();
                    }
                }
            });
        }
        let (bucket, switches, during, done) = (&bucket, &switches, &during, &done);
        s.spawn(move || {
            for i in 0..400 {
                if bucket.leased_tokens() > 0 {
                    during.fetch_add(1, Ordering::Relaxed);
                }
                bucket.reconfigure(policies[i % 2], Inherit::AsIs).unwrap();
                switches.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
            }
            done.store(true, Ordering::Relaxed);
        });
    });
    assert_eq!(switches.load(Ordering::Relaxed), 400);
    assert_eq!(bucket.epochs(), 401);
    assert!(
        during.load(Ordering::Relaxed) > 0,
        "no switch found tokens in slots"
    );
    let left = bucket.available();
    assert_eq!(left.fract(), 0.0);
    assert_eq!(
        net.load(Ordering::Relaxed) + left as i64,
        1_000,
        "tokens lost or minted: net taken {}, {left} left ({} admissions, {} switches found \
         tokens in slots)",
        net.load(Ordering::Relaxed),
        admitted.load(Ordering::Relaxed),
        during.load(Ordering::Relaxed),
    );
}

#[test]
fn concurrent_reconfigurations_apply_one_after_the_other() {
    // Each switch grows the capacity by one token with `Additive`: the final balance
    // counts every one of them exactly once (full throughout).
    let config = LeaseConfig::new().slots(2);
    let bucket =
        LeasedBucket::with_config(Policy::new(1, 1.0).unwrap(), ManualClock::new(), config)
            .unwrap();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..20 {
                    let c = bucket.policy().capacity();
                    bucket
                        .reconfigure(Policy::new(c + 1, 1.0).unwrap(), Inherit::Additive)
                        .unwrap();
                }
            });
        }
    });
    assert_eq!(bucket.epochs(), 41);
    assert_eq!(bucket.available(), bucket.policy().capacity() as f64);
    // The memory the docs state per kept policy.
    assert!(bucket.epoch_bytes() <= 640 + 128 * bucket.slots());
}

#[test]
fn a_leased_bucket_takes_part_in_all_or_nothing_acquisitions_across_switches() {
    use tokengate::{Bucket, acquire_all};
    // A leased bucket of 100 (switched between 100 and 300 with `AsIs`) and a plain
    // bucket of 60, time frozen: each acquisition took 1 from both or from neither.
    let clock = ManualClock::new();
    let config = LeaseConfig::new().slots(2);
    let leased =
        LeasedBucket::with_config(Policy::new(100, 1.0).unwrap(), clock.clone(), config).unwrap();
    let plain = Bucket::with_clock(Policy::new(60, 1.0).unwrap(), clock.clone());
    let admitted = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..100 {
                    let members: [(&dyn tokengate::multi::Member, u64); 2] =
                        [(&leased, 1), (&plain, 1)];
                    if acquire_all(&members).unwrap().is_admitted() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        s.spawn(|| {
            for i in 0..200 {
                let capacity = if i % 2 == 0 { 300 } else { 100 };
                leased
                    .reconfigure(Policy::new(capacity, 1.0).unwrap(), Inherit::AsIs)
                    .unwrap();
            }
        });
    });
    let admitted = admitted.load(Ordering::Relaxed);
    assert_eq!(admitted, 60, "the plain bucket's 60 tokens bound them");
    assert_eq!(plain.available(), 0.0);
    assert_eq!(leased.available(), 100.0 - admitted as f64);
    leased
        .reconfigure(Policy::new(10, 1.0).unwrap(), Inherit::AsIs)
        .unwrap();
    let members: [(&dyn tokengate::multi::Member, u64); 2] = [(&leased, 20), (&plain, 0)];
    assert!(acquire_all(&members).is_err());
}

/// One step of a random history on a leased bucket.
#[derive(Clone, Debug)]
enum Step {
    Advance(u64),
    Take(usize, u64),
    Refund(u64),
    Switch(usize, Inherit),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => prop_oneof![0u64..64, 0u64..40_000, 0u64..5_000_000, 0u64..2_000_000_000]
            .prop_map(Step::Advance),
        6 => (0usize..4, 1u64..40).prop_map(|(slot, cost)| Step::Take(slot, cost)),
        1 => (1u64..10).prop_map(Step::Refund),
        1 => (0usize..4, prop::sample::select(STRATEGIES.to_vec()))
            .prop_map(|(p, how)| Step::Switch(p, how)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Random histories with switches on real nanoseconds, on four slots: a leased
    /// bucket decides every request exactly as a `LiveBucket` given the same history
    /// (the leased bucket is exact, and its switch converts the same balance), each
    /// switch reports the same balances, and the admissions between two switches are
    /// covered by an ideal bucket of that period's policy started at the switch with the
    /// balance the switch reports.
    #[test]
    fn a_leased_bucket_switches_as_a_live_bucket_and_stays_under_each_curve(
        start in 0u64..(1 << 40),
        steps in prop::collection::vec(step(), 1..60),
    ) {
        let policies = switch_policies();
        let clock = ManualClock::new();
        clock.set(Duration::from_nanos(start));
        let config = LeaseConfig::new().slots(4);
        let leased = LeasedBucket::with_config(policies[0], clock.clone(), config).unwrap();
        let live = LiveBucket::with_clock(policies[0], clock.clone());
        let mut policy = policies[0];
        let mut ideal = Ideal::new(&policy, start).unwrap();
        for s in steps {
            let now = clock.now().as_nanos() as u64;
            match s {
                Step::Advance(d) => clock.advance(Duration::from_nanos(d)),
                Step::Take(slot, c) => {
                    let c = c.min(policy.capacity());
                    let admitted = leased.try_acquire_on(slot, c).unwrap().is_admitted();
                    prop_assert_eq!(admitted, live.try_acquire(c).unwrap().is_admitted());
                    if admitted {
                        prop_assert!(ideal.take(c, now), "{} tokens at {} ns above the curve of {:?}", c, now, policy);
                    }
                }
                Step::Refund(c) => {
                    let c = c.min(policy.capacity());
                    leased.refund(c).unwrap();
                    live.refund(c).unwrap();
                    ideal.refund(c, now);
                }
                Step::Switch(p, how) => {
                    let next = policies[p];
                    let switch = leased.reconfigure(next, how).unwrap();
                    let reference = live.reconfigure(next, how);
                    prop_assert_eq!(switch, reference);
                    prop_assert_eq!(leased.leased_tokens(), 0);
                    let before_units = (switch.before * f64::from(1u32 << 20)) as i128;
                    if how == Inherit::AsIs {
                        prop_assert!(ideal.covers_units(before_units, 20, now));
                    }
                    let frac = next.layout().frac_bits();
                    let after_units = (switch.after * (1u128 << frac) as f64) as i128;
                    policy = next;
                    ideal = Ideal::with_balance(&policy, now, after_units, frac).unwrap();
                }
            }
            prop_assert_eq!(leased.available(), live.available());
        }
    }
}

/// A clock that panics on the reading after `panic_at` (counted from now on), for a
/// switch that unwinds after sealing its pool.
struct Faulty {
    reads: AtomicU64,
    panic_at: AtomicU64,
}

impl tokengate::Clock for Faulty {
    fn now_nanos(&self) -> u64 {
        let n = self.reads.fetch_add(1, Ordering::Relaxed);
        assert!(
            n != self.panic_at.load(Ordering::Relaxed),
            "the clock failed"
        );
        1_000_000_000
    }
}

#[test]
fn a_switch_that_unwinds_leaves_the_old_policy_whole() {
    let clock = Faulty {
        reads: AtomicU64::new(0),
        panic_at: AtomicU64::new(u64::MAX),
    };
    let config = LeaseConfig::new().slots(2).max_lease(10);
    let bucket = LeasedBucket::with_config(Policy::new(100, 10.0).unwrap(), clock, config).unwrap();
    for (slot, cost) in SLOT_TAKES {
        assert!(bucket.try_acquire_on(slot, cost).unwrap().is_admitted());
    }
    assert_eq!(bucket.available(), 30.0);
    // The switch reads the clock once, after sealing the pool: that reading panics.
    let reads = bucket.clock().reads.load(Ordering::Relaxed);
    bucket.clock().panic_at.store(reads, Ordering::Relaxed);
    let switch = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        bucket.reconfigure(Policy::new(50, 1.0).unwrap(), Inherit::AsIs)
    }));
    assert!(switch.is_err());
    // The old policy is current, its word unsealed (the slots' tokens back in it), its
    // slots open again: every token is still there to take, and a switch works.
    assert_eq!(bucket.epochs(), 1);
    assert_eq!(bucket.policy().capacity(), 100);
    assert_eq!(bucket.available(), 30.0);
    assert!(bucket.try_acquire_on(0, 5).unwrap().is_admitted());
    assert!(bucket.try_acquire_on(1, 5).unwrap().is_admitted());
    bucket.refund(10).unwrap();
    let switch = bucket
        .reconfigure(Policy::new(50, 1.0).unwrap(), Inherit::AsIs)
        .unwrap();
    assert_eq!((switch.before, switch.after), (30.0, 30.0));
    assert!(bucket.try_acquire_on(1, 30).unwrap().is_admitted());
    assert!(bucket.try_acquire_on(0, 1).unwrap().is_rejected());
}
