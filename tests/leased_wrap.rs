//! A leased bucket after idles of any length stores what a plain bucket stores.
//!
//! The pool is the same packed word as a plain [`Bucket`]'s, and its re-anchoring passes
//! must leave it exactly where a plain bucket's leave its word: the same tick, the same
//! units, after an idle shorter than, just short of, at, or past any multiple of the
//! wrap, and after the resets and clock jumps around them. The same holds through a
//! scoped limiter whose global scope is leased. The histories are also replayed on the
//! testkit's ideal bucket on exact times.

use std::time::Duration;

use proptest::prelude::*;
use tokengate::scope::{Request, Rule, RuleSet, ScopeKind, WorkClass};
use tokengate::{Bucket, LeasedBucket, ManualClock, Policy, ScopedLimiter, leased::LeaseConfig};
use tokengate_testkit::Ideal;

fn leased(policy: Policy, clock: &ManualClock) -> LeasedBucket<ManualClock> {
    LeasedBucket::with_config(
        policy,
        clock.clone(),
        LeaseConfig::new().slots(2).max_lease(1),
    )
    .unwrap()
}

/// `(tick, units)` of a word.
fn decoded(policy: &Policy, word: u64) -> (u64, u64) {
    policy.layout().decode(word).unwrap()
}

/// `Policy::new(100, 20.0)?.start_empty()`, the clock at 2^30 ns, an idle of the wrap
/// period less an hour, then `reset()`: both buckets read 0, but the leased pool's idle
/// pass kept the stale stored tick (read as an hour ahead), the reset kept it too, and
/// the next admission read the word as idle past the wrap: full, 100 admitted.
#[test]
fn a_reset_after_an_idle_just_short_of_the_wrap_leaves_the_leased_pool_empty() {
    let policy = Policy::new(100, 20.0).unwrap().start_empty();
    let clock = ManualClock::new();
    clock.set(Duration::from_nanos(1 << 30));
    let plain = Bucket::with_clock(policy, clock.clone());
    let hot = leased(policy, &clock);
    clock.advance(policy.wrap_period() - Duration::from_secs(3600));
    plain.reset();
    hot.reset();
    assert_eq!(plain.available(), 0.0);
    assert_eq!(hot.available(), 0.0);
    assert_eq!(
        decoded(&policy, hot.stored_word()),
        decoded(&policy, plain.stored_word()),
        "the leased pool (left) is not stored as the plain bucket's word (right)"
    );
    assert!(!plain.try_acquire(100).unwrap().is_admitted());
    assert!(
        !hot.try_acquire(100).unwrap().is_admitted(),
        "the leased bucket admitted 100 tokens right after a reset to empty"
    );
}

/// The same idle without the reset: after draining 100, one tick later the plain bucket
/// read 0.020971 and the leased one 0.0 (its pool stored at the reading's tick + 2).
#[test]
fn after_an_idle_just_short_of_the_wrap_the_leased_pool_refills_as_the_plain_word() {
    let policy = Policy::new(100, 20.0).unwrap().start_empty();
    let clock = ManualClock::new();
    clock.set(Duration::from_nanos(1 << 30));
    let plain = Bucket::with_clock(policy, clock.clone());
    let hot = leased(policy, &clock);
    clock.advance(policy.wrap_period() - Duration::from_secs(3600));
    assert!(plain.try_acquire(100).unwrap().is_admitted());
    assert!(hot.try_acquire(100).unwrap().is_admitted());
    hot.reclaim();
    clock.advance(policy.tick());
    assert_eq!(
        hot.available(),
        plain.available(),
        "one tick after the drain: leased (left) and plain (right)"
    );
    assert_eq!(
        decoded(&policy, hot.stored_word()),
        decoded(&policy, plain.stored_word())
    );
}

/// Clock jumps around 2^60 ns (two wraps of this policy) and a cost-0 acquire: the
/// leased pool's idle pass stored a full word at the stale stored tick (read as hours
/// ahead of the reading, or behind it), where the plain bucket's pass stores it full at
/// the reading's next edge.
#[test]
fn a_jump_around_a_wrap_multiple_leaves_the_leased_pool_at_the_reading() {
    let policy = Policy::new(100, 20.0).unwrap();
    let layout = *policy.layout();
    let mask = (1u64 << layout.tick_bits()) - 1;
    let hour = 3_600_000_000_000u64;
    for jump in [
        1 << 60,
        (1 << 60) - hour,
        (1 << 60) + hour,
        (1 << 60) - (3 << 19),
    ] {
        let clock = ManualClock::new();
        clock.set(Duration::from_nanos(1 << 30));
        let plain = Bucket::with_clock(policy, clock.clone());
        let hot = leased(policy, &clock);
        assert!(plain.try_acquire(100).unwrap().is_admitted());
        assert!(hot.try_acquire(100).unwrap().is_admitted());
        clock.advance(Duration::from_nanos(jump));
        let now_tick = layout.tick_of((1 << 30) + jump);
        let full = ((now_tick + 1) & mask, layout.max_units());
        // A leased bucket runs its pass on any operation; this one writes nothing else.
        assert!(hot.try_acquire(0).unwrap().is_admitted());
        let (hot_tick, units) = decoded(&policy, hot.stored_word());
        assert_eq!(
            (hot_tick, units),
            full,
            "jump {jump} ns: the leased pool is stored at tick {hot_tick} with {units} \
             units, the reading is at tick {}",
            now_tick & mask
        );
        // The plain bucket's pass (run by its first write) stores the same word.
        plain.refund(1).unwrap(); // capped: full
        assert_eq!(
            decoded(&policy, plain.stored_word()),
            full,
            "jump {jump} ns"
        );
    }
}

fn scoped(policy: Policy, clock: &ManualClock, lease: bool) -> ScopedLimiter<ManualClock> {
    let rule = Rule::new(policy);
    let rule = if lease {
        rule.leased(LeaseConfig::new().slots(2).max_lease(1))
    } else {
        rule
    };
    RuleSet::new()
        .rule(ScopeKind::Global, rule)
        .class(WorkClass::new("one", 1))
        .class(WorkClass::new("all", policy.capacity()))
        .build_with_clock(clock.clone())
        .unwrap()
}

/// Through a scoped limiter: after the same idle and a drain, its leased global scope
/// admits exactly when the plain global scope does, tick by tick.
#[test]
fn a_leased_global_scope_after_an_idle_just_short_of_the_wrap_decides_as_a_plain_one() {
    let policy = Policy::new(100, 20.0).unwrap().start_empty();
    let clock = ManualClock::new();
    clock.set(Duration::from_nanos(1 << 30));
    let plain = scoped(policy, &clock, false);
    let hot = scoped(policy, &clock, true);
    let request = Request::new();
    clock.advance(policy.wrap_period() - Duration::from_secs(3600));
    for s in [&plain, &hot] {
        let all = s.class("all").unwrap();
        assert!(s.try_acquire(&request, all).unwrap().is_admitted());
    }
    // One token takes 50 ms, about 95 ticks: step a tick at a time across it.
    for step in 0..200 {
        clock.advance(policy.tick());
        let (p, h) = (
            plain
                .try_acquire(&request, plain.class("one").unwrap())
                .unwrap(),
            hot.try_acquire(&request, hot.class("one").unwrap())
                .unwrap(),
        );
        assert_eq!(
            h.is_admitted(),
            p.is_admitted(),
            "tick {step} after the drain: leased global scope admitted {}, plain {}",
            h.is_admitted(),
            p.is_admitted()
        );
    }
}

/// One step of a random history.
#[derive(Clone, Debug)]
enum Step {
    /// An idle: a multiple of the wrap plus or minus an offset (in ticks or hours).
    Idle {
        wraps: u64,
        ticks: i64,
        hours: i64,
    },
    Advance(u64),
    Take(u64),
    Refund(u64),
    Reset,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (0u64..3, -40i64..40, -3i64..3)
            .prop_map(|(wraps, ticks, hours)| Step::Idle { wraps, ticks, hours }),
        4 => prop_oneof![0u64..64, 0u64..5_000_000, 0u64..2_000_000_000].prop_map(Step::Advance),
        6 => (0u64..120).prop_map(Step::Take),
        1 => (0u64..60).prop_map(Step::Refund),
        1 => Just(Step::Reset),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3_000))]

    /// Idles of any length between operations: the leased bucket (all its tokens back in
    /// the pool after each decision) decides, reads and stores as the plain bucket does,
    /// and its admissions are covered by the ideal bucket on exact times.
    #[test]
    fn a_leased_bucket_after_idles_of_any_length_stores_what_a_plain_bucket_stores(
        capacity in prop::sample::select(vec![1u64, 10, 100, 1_000]),
        rate in prop::sample::select(vec![1.0, 20.0, 1e4]),
        empty in any::<bool>(),
        start in 0u64..(1 << 40),
        steps in prop::collection::vec(step(), 1..30),
    ) {
        let mut policy = Policy::new(capacity, rate).unwrap();
        if empty {
            policy = policy.start_empty();
        }
        let wrap = u64::try_from(policy.wrap_period().as_nanos()).unwrap();
        let tick = 1u64 << policy.layout().tick_shift();
        let clock = ManualClock::new();
        clock.set(Duration::from_nanos(start));
        let plain = Bucket::with_clock(policy, clock.clone());
        let hot = leased(policy, &clock);
        let mut ideal = Ideal::new(&policy, start);
        for (i, s) in steps.into_iter().enumerate() {
            let now = u64::try_from(clock.now().as_nanos()).unwrap();
            match s {
                Step::Idle { wraps, ticks, hours } => {
                    let d = i128::from(wraps) * i128::from(wrap)
                        + i128::from(ticks) * i128::from(tick)
                        + i128::from(hours) * 3_600_000_000_000;
                    let Ok(d) = u64::try_from(d) else { continue };
                    if now.checked_add(d).is_none_or(|t| t > u64::MAX / 2) {
                        continue;
                    }
                    clock.advance(Duration::from_nanos(d));
                }
                Step::Advance(d) => clock.advance(Duration::from_nanos(d)),
                Step::Take(c) => {
                    let c = c % (capacity + 1);
                    let (p, h) = (plain.try_acquire(c).unwrap(), hot.try_acquire_on(i % 2, c).unwrap());
                    hot.reclaim();
                    prop_assert_eq!(h.is_admitted(), p.is_admitted(), "step {}: take {}", i, c);
                    if h.is_admitted() && c > 0 {
                        if let Some(ideal) = ideal.as_mut() {
                            prop_assert!(ideal.take(c, now), "step {}: {} tokens above the curve", i, c);
                        }
                    }
                }
                Step::Refund(c) => {
                    let c = c % (capacity + 1);
                    plain.refund(c).unwrap();
                    hot.refund(c).unwrap();
                    if let Some(ideal) = ideal.as_mut() {
                        ideal.refund(c, now);
                    }
                }
                Step::Reset => {
                    plain.reset();
                    hot.reset();
                    if let Some(ideal) = ideal.as_mut() {
                        ideal.reset(now);
                    }
                }
            }
            prop_assert_eq!(hot.available(), plain.available(), "step {}", i);
        }
    }
}
