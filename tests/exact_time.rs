//! Never above the token-bucket curve, on the clock's own times and on any clock.
//!
//! For real times `s <= e`, tokens admitted in `[s, e]` are at most `B + r * (e - s)`
//! (`r` the configured rate), and from the creation of a bucket that starts empty at most
//! `r * (e - s)`: exactly what an ideal, continuously refilled bucket could pay. The
//! reference here is the testkit's [`Ideal`], in exact rational arithmetic on every
//! nanosecond (not the tick grid); every admission is replayed on it and must be covered.
//! A clock that steps back is time standing still: the curve is over the time the
//! readings imply moving forward.

use std::time::Duration;

use proptest::prelude::*;
use tokengate::scope::{Request, Rule, RuleSet, ScopeKind, WorkClass};
use tokengate::{Bucket, KeyedLimiter, LeasedBucket, ManualClock, Policy, leased::LeaseConfig};
use tokengate_testkit::Ideal;

const SECOND: u64 = 1_000_000_000;

fn tick_nanos(policy: &Policy) -> u64 {
    u64::try_from(policy.tick().as_nanos()).unwrap()
}

/// `Policy::new(1_000_000, 1e9)` (ticks of 16.384 us, 16,384 tokens of refill each): a
/// bucket created one nanosecond before a tick edge and drained gets no tick of refill
/// one nanosecond later. The curve allows 1,000,001 tokens over those two readings; the
/// grid once gave 1,016,384.
#[test]
fn a_bucket_drained_just_before_a_tick_edge_gets_no_whole_tick_a_nanosecond_later() {
    let policy = Policy::new(1_000_000, 1e9).unwrap();
    let tick = tick_nanos(&policy);
    let clock = ManualClock::new();
    clock.set(Duration::from_nanos(5 * tick - 1));
    let bucket = Bucket::with_clock(policy, clock.clone());
    assert!(bucket.try_acquire(1_000_000).unwrap().is_admitted());
    clock.advance(Duration::from_nanos(1));
    assert!(!bucket.try_acquire(2).unwrap().is_admitted());
    assert!(!bucket.try_acquire(16_384).unwrap().is_admitted());
}

/// The README's policy, B = 100 and r = 20/s: 101 tokens within 49.28 ms once passed,
/// where the curve allows 100.99.
#[test]
fn the_readme_policy_never_admits_101_tokens_within_49_ms() {
    let policy = Policy::new(100, 20.0).unwrap();
    let tick = tick_nanos(&policy);
    for offset in [1, tick / 2, tick - 1] {
        let clock = ManualClock::new();
        clock.set(Duration::from_nanos(7 * tick - offset));
        let bucket = Bucket::with_clock(policy, clock.clone());
        let start = clock.now();
        let mut admitted = 0;
        while clock.now() - start <= Duration::from_micros(49_280) {
            if bucket.try_acquire(1).unwrap().is_admitted() {
                admitted += 1;
            }
            clock.advance(Duration::from_micros(40));
        }
        assert!(
            admitted <= 100,
            "offset {offset}: {admitted} tokens in 49.28 ms"
        );
    }
}

/// The same tick-edge drain through every limiter that decides on a bucket word.
#[test]
fn leased_keyed_and_scoped_limiters_get_no_whole_tick_a_nanosecond_after_a_drain() {
    let policy = Policy::new(1_000_000, 1e9).unwrap();
    let tick = tick_nanos(&policy);
    let at_edge = |clock: &ManualClock| clock.set(Duration::from_nanos(9 * tick - 1));

    let clock = ManualClock::new();
    at_edge(&clock);
    let leased =
        LeasedBucket::with_config(policy, clock.clone(), LeaseConfig::new().slots(2)).unwrap();
    assert!(leased.try_acquire_on(0, 1_000_000).unwrap().is_admitted());
    clock.advance(Duration::from_nanos(1));
    assert!(!leased.try_acquire_on(1, 2).unwrap().is_admitted());

    let clock = ManualClock::new();
    at_edge(&clock);
    let keyed: KeyedLimiter<u64, ManualClock> = KeyedLimiter::builder(policy, 16)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(keyed.try_acquire(&7, 1_000_000).unwrap().is_admitted());
    clock.advance(Duration::from_nanos(1));
    assert!(!keyed.try_acquire(&7, 2).unwrap().is_admitted());

    let clock = ManualClock::new();
    at_edge(&clock);
    let scoped = RuleSet::new()
        .rule(ScopeKind::Global, Rule::new(policy))
        .class(WorkClass::new("all", 1_000_000))
        .class(WorkClass::new("two", 2))
        .build_with_clock(clock.clone())
        .unwrap();
    let (all, two) = (scoped.class("all").unwrap(), scoped.class("two").unwrap());
    assert!(
        scoped
            .try_acquire(&Request::new(), all)
            .unwrap()
            .is_admitted()
    );
    clock.advance(Duration::from_nanos(1));
    assert!(
        !scoped
            .try_acquire(&Request::new(), two)
            .unwrap()
            .is_admitted()
    );
}

/// Steps back longer than the old detection window (about 19.5 hours) once read as a
/// forward jump: a drained bucket refilled at once. Now any step back is time standing
/// still, until the clock passes its highest reading again.
#[test]
fn a_clock_stepping_back_any_distance_refills_nothing() {
    let hour = 3600 * SECOND;
    for capacity in [100, 1_000_000] {
        let policy = Policy::new(capacity, capacity as f64 / 10.0).unwrap();
        for back in [20 * hour, 48 * hour, 30 * 24 * hour, 365 * 24 * hour] {
            let clock = ManualClock::new();
            let high = 400 * 24 * hour;
            clock.set(Duration::from_nanos(high));
            let bucket = Bucket::with_clock(policy, clock.clone());
            assert!(bucket.try_acquire(capacity).unwrap().is_admitted());
            clock.set(Duration::from_nanos(high - back));
            assert!(
                !bucket.try_acquire(1).unwrap().is_admitted(),
                "B = {capacity}, {back} ns back"
            );
            // Forward again, still short of the highest reading: nothing either.
            clock.set(Duration::from_nanos(high - 1));
            assert_eq!(bucket.available(), 0.0, "B = {capacity}, {back} ns back");
        }
    }
}

/// A full bucket re-anchored at a reading that stepped back once moved its stored tick
/// back, and the clock's return credited the same interval again: 2B for no net time.
#[test]
fn a_full_bucket_under_a_step_back_is_not_refilled_twice() {
    for (capacity, back) in [(100u64, 3600 * SECOND), (1_000_000, 10_000_000)] {
        let policy = Policy::new(capacity, capacity as f64 / 100.0).unwrap();
        let clock = ManualClock::new();
        clock.set(Duration::from_nanos(10 * 3600 * SECOND));
        let bucket = Bucket::with_clock(policy, clock.clone());
        let high = clock.now();
        clock.set(high - Duration::from_nanos(back));
        assert!(bucket.try_acquire(capacity).unwrap().is_admitted());
        clock.set(high);
        let again = bucket.available();
        assert!(
            again < 1.0,
            "B = {capacity}: {again} tokens after no net time"
        );
    }
}

/// `Policy::new(1_000_000, 1e-3)` fills in 31.7 years; its layout once wrapped after 9.1
/// and then starved large costs. Every policy's tick field now wraps after at least twice
/// its fill time plus the back window, and a `retry_after` is kept.
#[test]
fn slow_policies_wrap_after_twice_their_fill_time_and_keep_their_retry_after() {
    let policy = Policy::new(1_000_000, 1e-3).unwrap();
    let layout = policy.layout();
    let fill = u128::from(layout.fill_ticks()) << layout.tick_shift();
    assert!(policy.wrap_period().as_nanos() >= 2 * fill, "{policy:?}");

    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(policy, clock.clone());
    assert!(bucket.try_acquire(1_000_000).unwrap().is_admitted());
    let refused = bucket.try_acquire(500_000).unwrap();
    let wait = refused.retry_after().expect("a refusal says when");
    clock.advance(wait);
    assert!(bucket.try_acquire(500_000).unwrap().is_admitted());

    for capacity in [1, 6, 100, 10_000, 1_000_000, 100_000_000] {
        for rate in [1e-3, 1e-1, 1.0, 20.0, 1e4, 1e6, 1e8, 1e9] {
            if let Ok(p) = Policy::new(capacity, rate) {
                let l = p.layout();
                let fill = u128::from(l.fill_ticks()) << l.tick_shift();
                assert!(p.wrap_period().as_nanos() >= 2 * fill, "{p:?}");
            }
        }
    }
}

/// Idles of any length: the true balance, never an error. A drained bucket idle for its
/// wrap period or longer is full, whatever the idle reads modulo the wrap: at an exact
/// multiple of the wrap (once read as no time at all), just short of one (once read as
/// a clock step back for hours), or a few ticks past one. Every limiter re-anchors its
/// words in passes a fraction of the wrap apart, and a pass that comes due after an idle
/// longer than the fill time writes them full.
#[test]
fn an_idle_of_any_length_reads_the_true_balance_and_is_never_an_error() {
    for (capacity, rate) in [(6, 1e8), (166, 3.173e9), (100, 20.0), (1_000_000, 1e-3)] {
        let policy = Policy::new(capacity, rate).unwrap();
        let wrap = policy.wrap_period();
        let tick = policy.tick();
        for idle in [
            wrap - tick * 3,
            wrap - Duration::from_secs(3600).min(wrap / 4),
            wrap,
            wrap + tick,
            wrap * 2 - tick * 5,
            wrap * 2,
            wrap * 3 + tick * 7,
        ] {
            let what = format!("B = {capacity}, r = {rate}, idle {idle:?}");
            let clock = ManualClock::new();
            clock.set(Duration::from_secs(1));
            let bucket = Bucket::with_clock(policy, clock.clone());
            let leased = LeasedBucket::with_config(
                policy,
                clock.clone(),
                LeaseConfig::new().slots(2).max_lease(1),
            )
            .unwrap();
            let scoped = |lease: bool| {
                let rule = Rule::new(policy);
                let rule = if lease {
                    rule.leased(LeaseConfig::new().slots(2).max_lease(1))
                } else {
                    rule
                };
                RuleSet::new()
                    .rule(ScopeKind::Global, rule)
                    .class(WorkClass::new("all", capacity))
                    .build_with_clock(clock.clone())
                    .unwrap()
            };
            let (plain_scoped, leased_scoped) = (scoped(false), scoped(true));
            let request = Request::new();
            // Drained.
            assert!(
                bucket.try_acquire(capacity).unwrap().is_admitted(),
                "{what}"
            );
            assert!(
                leased.try_acquire(capacity).unwrap().is_admitted(),
                "{what}"
            );
            for s in [&plain_scoped, &leased_scoped] {
                let all = s.class("all").unwrap();
                assert!(
                    s.try_acquire(&request, all).unwrap().is_admitted(),
                    "{what}"
                );
            }
            clock.advance(idle);
            assert_eq!(bucket.available(), capacity as f64, "bucket: {what}");
            assert!(
                bucket.try_acquire(capacity).unwrap().is_admitted(),
                "bucket: {what}"
            );
            assert!(
                leased.try_acquire(capacity).unwrap().is_admitted(),
                "leased: {what}"
            );
            for (name, s) in [("scoped", &plain_scoped), ("leased scoped", &leased_scoped)] {
                let got = s.available(&tokengate::scope::Scope::Global).unwrap();
                assert_eq!(got, capacity as f64, "{name}: {what}");
            }
        }
    }
}

/// One step of a random history.
#[derive(Clone, Debug)]
enum Step {
    Advance(u64),
    Take(u64),
    Reserve(u64),
    Back(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => prop_oneof![0u64..64, 0u64..40_000, 0u64..5_000_000, 0u64..2_000_000_000]
            .prop_map(Step::Advance),
        6 => (1u64..40).prop_map(Step::Take),
        1 => (1u64..10).prop_map(Step::Reserve),
        1 => (0u64..3_000_000_000).prop_map(Step::Back),
    ]
}

fn policy() -> impl Strategy<Value = (u64, f64, bool)> {
    (
        prop::sample::select(vec![1u64, 3, 10, 40, 100, 1_000]),
        prop::sample::select(vec![0.5, 1.0, 7.0, 20.0, 333.0, 1e4, 1e6]),
        any::<bool>(),
    )
}

/// Replays `admissions` (time, tokens), sorted by time, on an ideal bucket.
fn covered(policy: &Policy, created: u64, mut admissions: Vec<(u64, u64)>) -> Result<(), String> {
    let Some(mut ideal) = Ideal::new(policy, created) else {
        return Ok(());
    };
    admissions.sort_by_key(|&(t, _)| t);
    for (t, cost) in admissions {
        if !ideal.take(cost, t) {
            return Err(format!("{cost} tokens at {t} ns are above the curve"));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    /// Random histories on real nanoseconds (tick edges hit, missed, and straddled):
    /// every admission and every reservation (at the time it is ready) is covered by the
    /// ideal bucket.
    #[test]
    fn a_bucket_stays_under_the_curve_on_real_times(
        (capacity, rate, empty) in policy(),
        start in 0u64..(1 << 40),
        steps in prop::collection::vec(step(), 1..60),
    ) {
        let mut builder = Policy::builder(capacity, rate).max_reservation(Duration::from_secs(2));
        if empty {
            builder = builder.start(tokengate::Start::Empty);
        }
        let Ok(policy) = builder.build() else { return Ok(()) };
        let clock = ManualClock::new();
        clock.set(Duration::from_nanos(start));
        let bucket = Bucket::with_clock(policy, clock.clone());
        let mut high = start;
        let mut admissions = Vec::new();
        let mut reservations = Vec::new();
        for s in steps {
            let now = clock.now().as_nanos() as u64;
            match s {
                Step::Advance(d) => clock.advance(Duration::from_nanos(d)),
                Step::Back(d) => clock.set(Duration::from_nanos(now.saturating_sub(d))),
                Step::Take(c) => {
                    // The bucket reads the clock: its highest reading dates the decision.
                    high = high.max(now);
                    if bucket.try_acquire(c.min(capacity)).unwrap().is_admitted() {
                        admissions.push((high, c.min(capacity)));
                    }
                }
                Step::Reserve(c) => {
                    high = high.max(now);
                    if let Ok(r) = bucket.reserve(c.min(capacity), Duration::from_secs(2)) {
                        let ready = r.ready_at().as_nanos() as u64;
                        admissions.push((ready.max(high), c.min(capacity)));
                        reservations.push(r);
                    }
                }
            }
        }
        // Holders of reservations are held to the same curve as admissions: each waits
        // whole ticks of refill for its own cost, so queued holders are never closer
        // than the refill rate allows (`tests/reservation_curve.rs` has the histories
        // with cancellations and refunds).
        let reference = policy;
        for r in reservations {
            r.consume();
        }
        prop_assert_eq!(covered(&reference, start, admissions), Ok(()));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// The same for a leased bucket, spending on two slots, and a keyed limiter's key.
    #[test]
    fn leased_and_keyed_limiters_stay_under_the_curve_on_real_times(
        (capacity, rate, _) in policy(),
        start in 0u64..(1 << 40),
        steps in prop::collection::vec(step(), 1..60),
    ) {
        let Ok(policy) = Policy::new(capacity, rate) else { return Ok(()) };
        let clock = ManualClock::new();
        clock.set(Duration::from_nanos(start));
        let leased =
            LeasedBucket::with_config(policy, clock.clone(), LeaseConfig::new().slots(2)).unwrap();
        let keyed: KeyedLimiter<u64, ManualClock> =
            KeyedLimiter::builder(policy, 4).clock(clock.clone()).build().unwrap();
        let mut high = start;
        let (mut on_leased, mut on_keyed) = (Vec::new(), Vec::new());
        for (i, s) in steps.into_iter().enumerate() {
            let now = clock.now().as_nanos() as u64;
            match s {
                Step::Advance(d) => clock.advance(Duration::from_nanos(d)),
                Step::Back(d) => clock.set(Duration::from_nanos(now.saturating_sub(d))),
                Step::Take(c) | Step::Reserve(c) => {
                    high = high.max(now);
                    let c = c.min(capacity);
                    if leased.try_acquire_on(i % 2, c).unwrap().is_admitted() {
                        on_leased.push((high, c));
                    }
                    if keyed.try_acquire(&1, c).unwrap().is_admitted() {
                        on_keyed.push((high, c));
                    }
                }
            }
        }
        prop_assert_eq!(covered(&policy, start, on_leased), Ok(()));
        prop_assert_eq!(covered(&policy, start, on_keyed), Ok(()));
    }
}
