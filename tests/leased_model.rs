//! `LeasedBucket` against a plain `Bucket` on the same manual clock, driven by the same
//! requests.
//!
//! What "the same" means here. When operations do not overlap in time (each completes
//! before the next starts, on any slot), a leased bucket is exact: it decides every
//! request as the plain bucket does (admitted or rejected, the same error), a rejection
//! carries the same balance and `retry_after` (but one decided on the global word alone,
//! when even full slots could not pay, carries the global balance: the plain bucket's
//! less the tokens in slots), an admission reports at most the plain bucket's balance
//! (the slot's leftover is a lower bound), and `available()` is equal after every step.
//! In particular it never admits more over any prefix, and it rejects only when the plain
//! bucket rejects: tokens idle in slots are reclaimed first.
//!
//! With overlapping threads, tokens in flight between the global word and a slot can make
//! a rejection early (bounded, see the `leased` module docs), never late: the threaded
//! tests check conservation instead (admitted total equals the balance exactly once the
//! threads are done and the bucket is drained).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tokengate::{
    Bucket, Clock, LeasedBucket, ManualClock, Policy, acquire_all, leased::LeaseConfig,
};

#[derive(Clone, Debug)]
enum Op {
    Acquire { slot: usize, cost: u64 },
    Advance(u64),
    Refund(u64),
    Reset,
    Reclaim,
}

#[derive(Clone, Debug)]
struct Case {
    capacity: u64,
    rate: f64,
    start_empty: bool,
    reservation_nanos: u64,
    slots: usize,
    max_lease: Option<u64>,
    start_nanos: u64,
    ops: Vec<Op>,
}

fn op(capacity: u64) -> impl Strategy<Value = Op> {
    let cost = prop_oneof![
        6 => 1u64..=3,
        3 => 0u64..=capacity.min(50),
        1 => 0u64..=capacity,
        1 => Just(capacity + 1),
    ];
    prop_oneof![
        12 => (0usize..16, cost).prop_map(|(slot, cost)| Op::Acquire { slot, cost }),
        4 => prop_oneof![
            2 => 0u64..2_000_000,
            2 => 0u64..5_000_000_000,
            1 => 0u64..3_600_000_000_000,
        ]
        .prop_map(Op::Advance),
        1 => (0u64..=capacity.min(20)).prop_map(Op::Refund),
        1 => Just(Op::Reclaim),
        1 => Just(Op::Reset),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let capacity = prop_oneof![4 => 1u64..=64, 2 => 1u64..=1000, 1 => 1u64..=1_000_000];
    (
        capacity,
        prop::sample::select(vec![0.5, 1.0, 3.0, 20.0, 1000.0, 1e6, 1e9]),
        any::<bool>(),
        prop_oneof![4 => Just(0u64), 1 => 0u64..5_000_000_000],
        prop::sample::select(vec![1usize, 2, 4, 8]),
        any::<bool>(),
        prop_oneof![Just(0u64), 0u64..(1 << 40)],
    )
        .prop_flat_map(
            |(capacity, rate, start_empty, reservation_nanos, slots, default, start)| {
                let lease = if default {
                    Just(None).boxed()
                } else {
                    (1u64..=capacity).prop_map(Some).boxed()
                };
                (lease, prop::collection::vec(op(capacity), 0..150)).prop_map(
                    move |(max_lease, ops)| Case {
                        capacity,
                        rate,
                        start_empty,
                        reservation_nanos,
                        slots,
                        max_lease,
                        start_nanos: start,
                        ops,
                    },
                )
            },
        )
}

fn policy(c: &Case) -> Option<Policy> {
    let mut b = Policy::builder(c.capacity, c.rate);
    if c.start_empty {
        b = b.start(tokengate::Start::Empty);
    }
    if c.reservation_nanos > 0 {
        b = b.max_reservation(Duration::from_nanos(c.reservation_nanos));
    }
    b.build().ok()
}

/// Runs `c` on both buckets, failing at the first step where they differ.
fn compare(c: &Case) -> Result<(), TestCaseError> {
    let Some(policy) = policy(c) else {
        return Ok(());
    };
    let clock = ManualClock::new();
    clock.set(Duration::from_nanos(c.start_nanos));
    let mut config = LeaseConfig::new().slots(c.slots);
    if let Some(lease) = c.max_lease {
        config = config.max_lease(lease);
    }
    let config = match LeasedBucket::with_config(policy, clock.clone(), config) {
        Ok(_) => config,
        // A lease above what a slot holds for this policy: use the largest allowed.
        Err(tokengate::leased::LeaseConfigError::LeaseOutOfRange { max, .. }) => {
            config.max_lease(max)
        }
        Err(e) => panic!("{e}"),
    };
    let hot = LeasedBucket::with_config(policy, clock.clone(), config).unwrap();
    // The same bucket on the same clock read out of line: every decision goes through
    // the path a call to the clock takes, and must be the same.
    let called = LeasedBucket::with_config(policy, OutOfLine(clock.clone()), config).unwrap();
    let plain = Bucket::with_clock(policy, clock.clone());
    let (mut hot_admitted, mut plain_admitted) = (0u64, 0u64);
    for (step, op) in c.ops.iter().enumerate() {
        match *op {
            Op::Acquire { slot, cost } => {
                let held = hot.leased_tokens();
                let h = hot.try_acquire_on(slot, cost);
                prop_assert_eq!(called.try_acquire_on(slot, cost), h, "step {}", step);
                let p = plain.try_acquire(cost);
                match (h, p) {
                    (Ok(h), Ok(p)) => {
                        prop_assert_eq!(h.is_admitted(), p.is_admitted(), "step {}", step);
                        if h.is_admitted() {
                            hot_admitted += cost;
                            plain_admitted += cost;
                            prop_assert!(
                                h.tokens_remaining() <= p.tokens_remaining(),
                                "step {}: {:?} reports more than {:?}",
                                step,
                                h,
                                p
                            );
                        } else if h != p {
                            // Decided on the global word alone (even full slots could
                            // not pay): the global balance, without the slots' tokens.
                            let units =
                                |tokens: u64| i128::from(tokens) << policy.layout().frac_bits();
                            let (hb, pb) = (h.balance_units() as i128, p.balance_units() as i128);
                            let bound = units(hot.slots() as u64 * hot.max_lease());
                            prop_assert!(
                                hb + bound < units(cost),
                                "step {}: {:?} differs from {:?}",
                                step,
                                h,
                                p
                            );
                            prop_assert_eq!(hb + units(held), pb);
                            prop_assert!(h.retry_after() >= p.retry_after());
                        }
                    }
                    (h, p) => prop_assert_eq!(h, p, "step {}", step),
                }
            }
            Op::Advance(d) => clock.advance(Duration::from_nanos(d)),
            Op::Refund(cost) => {
                let refunded = hot.refund(cost);
                prop_assert_eq!(called.refund(cost), refunded);
                prop_assert_eq!(plain.refund(cost), refunded);
            }
            Op::Reset => {
                hot.reset();
                called.reset();
                plain.reset();
            }
            Op::Reclaim => {
                hot.reclaim();
                called.reclaim();
                prop_assert_eq!(hot.leased_tokens(), 0);
            }
        }
        prop_assert_eq!(called.leased_tokens(), hot.leased_tokens());
        prop_assert_eq!(called.available(), hot.available());
        prop_assert!(hot_admitted <= plain_admitted);
        prop_assert_eq!(
            hot.available(),
            plain.available(),
            "step {}: {:?}",
            step,
            op
        );
        prop_assert!(hot.leased_tokens() <= hot.slots() as u64 * hot.max_lease());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 10_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Request by request, over random policies, lease settings, slots and times, the
    /// leased bucket decides as the plain bucket does (see the file docs).
    #[test]
    fn leased_bucket_decides_as_the_plain_bucket(c in case()) {
        compare(&c)?;
    }
}

fn config(slots: usize, max_lease: u64) -> LeaseConfig {
    LeaseConfig::new().slots(slots).max_lease(max_lease)
}

/// The trap a leasing design must close: a lease taken just before a tick edge, the
/// global word refilled (capped at full), then the lease spent. A plain bucket admits
/// only the capacity after the refill.
#[test]
fn leased_tokens_do_not_survive_a_capped_refill() {
    let clock = ManualClock::new();
    let policy = Policy::new(10, 10.0).unwrap(); // a full refill takes one second
    let hot = LeasedBucket::with_config(policy, clock.clone(), config(2, 5)).unwrap();
    let plain = Bucket::with_clock(policy, clock.clone());
    assert!(hot.try_acquire_on(0, 1).unwrap().is_admitted()); // slot 0 leases 2
    assert!(plain.try_acquire(1).unwrap().is_admitted());
    assert!(hot.leased_tokens() > 0);
    clock.advance(Duration::from_secs(5));
    let hot_after = (0..40)
        .filter(|i| hot.try_acquire_on(i % 2, 1).unwrap().is_admitted())
        .count();
    let plain_after = (0..40)
        .filter(|_| plain.try_acquire(1).unwrap().is_admitted())
        .count();
    assert_eq!(plain_after, 10);
    assert_eq!(hot.available(), 0.0);
    assert!(hot_after <= plain_after, "{hot_after} > {plain_after}");
}

#[test]
fn a_rejection_comes_only_after_idle_slots_are_reclaimed() {
    let clock = ManualClock::new();
    let policy = Policy::new(100, 1.0).unwrap();
    let hot = LeasedBucket::with_config(policy, clock, config(4, 25)).unwrap();
    // Spread leases over every slot, then drain from slot 0 alone.
    for slot in 0..4 {
        assert!(hot.try_acquire_on(slot, 1).unwrap().is_admitted());
    }
    assert!(hot.leased_tokens() >= 30, "{}", hot.leased_tokens());
    let admitted: u64 = (0..200)
        .map(|_| hot.try_acquire_on(0, 1).unwrap())
        .filter(|d| d.is_admitted())
        .count() as u64;
    assert_eq!(admitted, 96);
    let rejected = hot.try_acquire_on(0, 1).unwrap();
    assert!(rejected.is_rejected());
    assert_eq!(rejected.tokens_remaining(), 0.0);
    assert_eq!(hot.leased_tokens(), 0);
}

#[test]
fn a_cost_above_every_lease_is_paid_from_the_global_word_and_the_slots() {
    let clock = ManualClock::new();
    let hot =
        LeasedBucket::with_config(Policy::new(100, 1.0).unwrap(), clock, config(2, 10)).unwrap();
    assert!(hot.try_acquire_on(0, 1).unwrap().is_admitted());
    assert!(hot.try_acquire_on(1, 1).unwrap().is_admitted());
    let d = hot.try_acquire_on(0, 98).unwrap();
    assert!(d.is_admitted(), "{d:?}");
    assert_eq!(hot.available(), 0.0);
}

/// A clock whose readings are never inline ([`Clock::now_inline`] is `None`): the
/// limiters decide through the path a clock read out of line takes.
#[derive(Clone, Default)]
struct OutOfLine(ManualClock);

impl Clock for OutOfLine {
    fn now_nanos(&self) -> u64 {
        self.0.now_nanos()
    }

    fn now_inline(&self) -> Option<u64> {
        None
    }
}

/// A clock that counts its readings.
#[derive(Clone, Default)]
struct CountingClock {
    inner: ManualClock,
    reads: Arc<AtomicU64>,
}

impl Clock for CountingClock {
    fn now_nanos(&self) -> u64 {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.now_nanos()
    }
}

#[test]
fn admissions_paid_from_a_slot_read_the_clock_once_and_never_touch_the_global_word() {
    let clock = CountingClock::default();
    let policy = Policy::new(1_000_000, 1e9).unwrap();
    let hot = LeasedBucket::with_config(policy, clock.clone(), config(2, 10_000)).unwrap();
    assert!(hot.try_acquire_on(0, 1).unwrap().is_admitted());
    let (reads, word) = (clock.reads.load(Ordering::Relaxed), hot.stored_word());
    for _ in 0..9_000 {
        assert!(hot.try_acquire_on(0, 1).unwrap().is_admitted());
    }
    assert_eq!(clock.reads.load(Ordering::Relaxed), reads + 9_000);
    assert_eq!(hot.stored_word(), word);
}

#[test]
fn a_lease_expires_at_the_tick_edge_and_is_given_back() {
    let clock = ManualClock::new();
    let policy = Policy::new(1000, 1.0).unwrap();
    let hot = LeasedBucket::with_config(policy, clock.clone(), config(2, 100)).unwrap();
    let plain = Bucket::with_clock(policy, clock.clone());
    assert!(hot.try_acquire_on(0, 1).unwrap().is_admitted());
    assert!(plain.try_acquire(1).unwrap().is_admitted());
    let word = hot.stored_word();
    clock.advance(policy.tick());
    assert!(hot.try_acquire_on(0, 1).unwrap().is_admitted());
    assert!(plain.try_acquire(1).unwrap().is_admitted());
    assert_ne!(
        hot.stored_word(),
        word,
        "the expired lease went back through the global word"
    );
    assert_eq!(hot.available(), plain.available());
    assert_eq!(hot.leased_tokens(), 100);
}

#[test]
fn the_lease_shrinks_as_the_bucket_empties() {
    let clock = ManualClock::new();
    let hot =
        LeasedBucket::with_config(Policy::new(1000, 1.0).unwrap(), clock, config(2, 1000)).unwrap();
    assert!(hot.try_acquire_on(0, 1).unwrap().is_admitted());
    let first = hot.leased_tokens();
    assert_eq!(first, 999 / 4); // spare / (2 * slots)
    hot.reclaim();
    assert!(hot.try_acquire_on(0, 990).unwrap().is_admitted());
    assert!(hot.try_acquire_on(1, 1).unwrap().is_admitted());
    assert_eq!(hot.leased_tokens(), 2 + 1); // 9 spare / 4, then 6 spare / 4
}

#[test]
fn invalid_lease_configurations_are_refused_with_the_valid_range() {
    let policy = Policy::new(10, 1.0).unwrap();
    for (config, message) in [
        (
            LeaseConfig::new().slots(0),
            "slot count must be a power of two from 1 to 65536, got 0",
        ),
        (
            LeaseConfig::new().slots(6),
            "slot count must be a power of two from 1 to 65536, got 6",
        ),
        (
            LeaseConfig::new().max_lease(0),
            "largest lease must be from 1 to 10 tokens (the capacity, or what a slot holds \
             for this policy), got 0",
        ),
        (
            LeaseConfig::new().max_lease(11),
            "largest lease must be from 1 to 10 tokens (the capacity, or what a slot holds \
             for this policy), got 11",
        ),
    ] {
        let err = LeasedBucket::with_config(policy, ManualClock::new(), config).unwrap_err();
        assert_eq!(err.to_string(), message);
    }
}

#[test]
fn a_clock_step_back_is_time_standing_still_as_for_a_plain_bucket() {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(100));
    let policy = Policy::new(10, 1.0).unwrap();
    let hot = LeasedBucket::with_config(policy, clock.clone(), config(1, 1)).unwrap();
    let plain = Bucket::with_clock(policy, clock.clone());
    assert!(hot.try_acquire(5).unwrap().is_admitted());
    assert!(plain.try_acquire(5).unwrap().is_admitted());
    // Fifty seconds back, then forward to just below the highest reading: no time passed.
    clock.set(Duration::from_secs(50));
    assert!(hot.try_acquire(2).unwrap().is_admitted());
    assert!(plain.try_acquire(2).unwrap().is_admitted());
    clock.set(Duration::from_millis(99_900));
    assert!(hot.try_acquire(3).unwrap().is_admitted());
    assert!(plain.try_acquire(3).unwrap().is_admitted());
    assert_eq!(hot.available(), 0.0);
    assert!(!hot.try_acquire(1).unwrap().is_admitted());
    // Two seconds past it: refill resumes from the highest reading.
    clock.set(Duration::from_secs(102));
    assert_eq!(hot.available(), plain.available());
    assert!(hot.available() > 1.99 && hot.available() < 2.0);
}

#[test]
fn all_or_nothing_acquisition_rolls_a_leased_bucket_back_exactly() {
    let clock = ManualClock::new();
    let global = LeasedBucket::with_config(
        Policy::new(1000, 10.0).unwrap(),
        clock.clone(),
        config(2, 50),
    )
    .unwrap();
    let tenant = Bucket::with_clock(Policy::new(10, 1.0).unwrap(), clock.clone());
    let members: [(&dyn tokengate::multi::Member, u64); 2] = [(&global, 8), (&tenant, 8)];
    assert!(acquire_all(&members).unwrap().is_admitted());
    let d = acquire_all(&members).unwrap();
    assert!(d.is_rejected());
    assert_eq!(global.available(), 992.0);
    assert_eq!(tenant.available(), 2.0);
    let d = acquire_all(&[
        (&global as &dyn tokengate::multi::Member, 993),
        (&tenant, 1),
    ])
    .unwrap();
    assert!(d.is_rejected());
    assert_eq!(d.refused_index(), Some(0));
    assert_eq!(global.available(), 992.0);
}

/// Threads hammering one bucket on a frozen clock: nothing is created or lost.
#[test]
fn concurrent_admissions_on_a_frozen_clock_conserve_tokens() {
    for (slots, max_lease) in [(1, 7), (2, 50), (4, 1), (8, 300)] {
        let clock = ManualClock::new();
        let policy = Policy::new(10_000, 1000.0).unwrap();
        let hot = LeasedBucket::with_config(policy, clock, config(slots, max_lease)).unwrap();
        let admitted = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (hot, admitted) = (&hot, &admitted);
                s.spawn(move || {
                    for i in 0..4_000u64 {
                        let cost = 1 + (i * 7 + t) % 5;
                        if hot.try_acquire(cost).unwrap().is_admitted() {
                            admitted.fetch_add(cost, Ordering::Relaxed);
                        }
                        if i % 97 == 0 {
                            hot.refund(0).unwrap();
                            if hot.try_acquire(1).unwrap().is_admitted() {
                                hot.refund(1).unwrap();
                            }
                        }
                    }
                });
            }
        });
        let mut total = admitted.load(Ordering::Relaxed);
        while hot.try_acquire(1).unwrap().is_admitted() {
            total += 1;
        }
        assert_eq!(total, 10_000, "slots {slots}, lease {max_lease}");
        assert_eq!(hot.leased_tokens(), 0);
    }
}

#[test]
fn a_rejection_with_nothing_to_reclaim_writes_nothing() {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(1)); // slot stamps are then not zero
    let hot =
        LeasedBucket::with_config(Policy::new(10, 1.0).unwrap(), clock, config(2, 2)).unwrap();
    assert!(hot.try_acquire_on(0, 10).unwrap().is_admitted());
    let words =
        |h: &LeasedBucket<ManualClock>| [h.stored_word(), h.slot_words()[0], h.slot_words()[1]];
    let before = words(&hot);
    for slot in 0..4 {
        assert!(hot.try_acquire_on(slot, 1).unwrap().is_rejected());
    }
    assert_eq!(words(&hot), before);
    assert_eq!(hot.leased_tokens(), 0);
}

/// A clock handing out scripted readings in order (the last one again once they run
/// out), running `hook` with each reading's index after taking it and before returning
/// it: the hook stands for other threads acting between a thread's reading and its next
/// step, so a lost race plays out on one thread, deterministically.
#[derive(Clone)]
struct Scripted(Arc<Script>);

struct Script {
    readings: Vec<u64>,
    next: AtomicU64,
    hook: std::sync::OnceLock<Box<dyn Fn(usize) + Send + Sync>>,
}

impl Scripted {
    fn new(readings_ms: &[u64]) -> Scripted {
        Scripted(Arc::new(Script {
            readings: readings_ms.iter().map(|ms| ms * 1_000_000).collect(),
            next: AtomicU64::new(0),
            hook: std::sync::OnceLock::new(),
        }))
    }

    fn on_reading(&self, hook: impl Fn(usize) + Send + Sync + 'static) {
        assert!(self.0.hook.set(Box::new(hook)).is_ok());
    }
}

impl Clock for Scripted {
    fn now_nanos(&self) -> u64 {
        let index = self.0.next.fetch_add(1, Ordering::SeqCst) as usize;
        let reading = self.0.readings[index.min(self.0.readings.len() - 1)];
        if let Some(hook) = self.0.hook.get() {
            hook(index);
        }
        reading
    }
}

/// The lost race of a thread descheduled between its clock reading and its trip to the
/// global word. Readings in real-time order: 0 ms (creation); A reads 150 ms, then B
/// reads 200 ms and writes; A loads B's word, is well behind it, and reads the clock
/// again (200 ms), then C reads 250 ms and writes; A loads C's word, is behind again,
/// reads again (250 ms), then D reads 300 ms and writes before A's CAS. A's CAS fails on
/// D's word, which is again well ahead of A's reading: a lost race (D read the clock
/// after A's load), not a clock that stepped back. A plain bucket loads the word again
/// and reads the clock again after every lost CAS, and admits; so must a leased bucket.
#[test]
fn a_lost_race_after_a_reread_is_not_a_clock_step_back() {
    fn run<B: Send + Sync + 'static>(
        make: impl FnOnce(Scripted) -> B,
        take: fn(&B, usize) -> Result<tokengate::Decision, tokengate::AcquireError>,
    ) -> Result<tokengate::Decision, tokengate::AcquireError> {
        let clock = Scripted::new(&[0, 150, 200, 200, 250, 250, 300]);
        let bucket = Arc::new(make(clock.clone()));
        let weak = Arc::downgrade(&bucket);
        clock.on_reading(move |index| {
            let bucket = weak
                .upgrade()
                .expect("the bucket outlives its clock readings");
            // B, C and D, each on its own slot, right after one of A's readings.
            if let 1 | 3 | 5 = index {
                let d = take(&bucket, index.div_ceil(2)).expect("B, C and D read the latest time");
                assert!(d.is_admitted());
            }
        });
        take(&bucket, 0)
    }
    let policy = Policy::new(100, 20.0).unwrap();
    let plain = run(
        |clock| Bucket::with_clock(policy, clock),
        |b, _| b.try_acquire(1),
    );
    assert!(plain.unwrap().is_admitted());
    let hot = run(
        |clock| LeasedBucket::with_config(policy, clock, config(4, 5)).unwrap(),
        |b, slot| b.try_acquire_on(slot, 1),
    );
    assert!(hot.unwrap().is_admitted(), "{hot:?}");
}

/// A clock stepping back one minute under a full bucket: admissions go on at the highest
/// reading, the stored tick never moves back, and refill resumes only once the clock
/// passes that reading again.
#[test]
fn a_full_bucket_admits_after_the_clock_steps_back_without_moving_its_tick_back() {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(120));
    let policy = Policy::new(100, 1.0).unwrap();
    let hot = LeasedBucket::with_config(policy, clock.clone(), config(2, 10)).unwrap();
    let layout = policy.layout();
    let (before, _) = layout.decode(hot.stored_word()).unwrap();
    clock.set(Duration::from_secs(60));
    let d = hot.try_acquire_on(0, 1).unwrap();
    assert!(d.is_admitted(), "{d:?}");
    let (tick, _) = layout.decode(hot.stored_word()).unwrap();
    assert!(
        tick >= before,
        "the stored tick moved back: {tick} < {before}"
    );
    assert_eq!(hot.available(), 99.0);
    // Back at the highest reading plus two seconds: two seconds of refill, capped.
    clock.set(Duration::from_secs(122));
    assert_eq!(hot.available(), 100.0);
    let burst = (0..200)
        .filter(|i| hot.try_acquire_on(i % 2, 1).unwrap().is_admitted())
        .count();
    assert_eq!(burst, 100);
}

/// A bucket that is not full, its clock stepped back one minute: no error and no credit;
/// the leases and the global word are read at the highest reading.
#[test]
fn a_bucket_not_full_decides_a_clock_step_back_at_its_highest_reading() {
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(120));
    let policy = Policy::new(100, 1.0).unwrap();
    let hot = LeasedBucket::with_config(policy, clock.clone(), config(2, 10)).unwrap();
    assert!(hot.try_acquire_on(0, 1).unwrap().is_admitted()); // slot 0 holds a lease
    assert!(hot.leased_tokens() > 0);
    let before = hot.available();
    clock.set(Duration::from_secs(60));
    for slot in 0..2 {
        assert!(hot.try_acquire_on(slot, 1).unwrap().is_admitted());
    }
    assert_eq!(hot.available(), before - 2.0);
    clock.set(Duration::from_secs(119));
    assert_eq!(
        hot.available(),
        before - 2.0,
        "no time passed below the highest reading"
    );
}
