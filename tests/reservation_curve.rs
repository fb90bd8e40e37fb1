//! Reservations never above the token-bucket curve, with cancellations and refunds.
//!
//! A reservation's holder proceeds at its ready time: that is its admission. For real
//! times `s <= e`, everything admitted in `[s, e]` (try_acquire admissions at their
//! readings, holders at their ready times) must be at most `B + r * (e - s)`, the
//! configured rate's curve, exactly: the checker is the testkit's [`Ideal`] bucket, on
//! every nanosecond, sharing nothing with the engine's tick grid. A cancelled
//! reservation is taken out of the replayed history altogether (its holder never
//! proceeds); a refund is a credit of its tokens to the ideal bucket at the time it was
//! made, capped at the capacity, whether or not the engine gave them back.

use std::time::Duration;

use proptest::prelude::*;
use tokengate::reservation::Reservation;
use tokengate::{Bucket, ManualClock, Policy, Start};
use tokengate_testkit::Ideal;

/// Replays `events` on an ideal bucket created at `created`, in time order (at equal
/// times in the order they happened; a holder at the step it reserved):
/// `(time, step, tokens, refund)`. The first admission it cannot pay, with the schedule
/// up to it.
fn covered(
    policy: &Policy,
    created: u64,
    mut events: Vec<(u64, usize, u64, bool)>,
) -> Result<(), String> {
    let Some(mut ideal) = Ideal::new(policy, created) else {
        return Ok(());
    };
    events.sort_by_key(|&(t, step, _, _)| (t, step));
    for (i, &(t, _, cost, refund)) in events.iter().enumerate() {
        if refund {
            ideal.refund(cost, t);
            continue;
        }
        if !ideal.take(cost, t) {
            let before = ideal.scaled_balance(t) as f64 / ideal.den() as f64;
            return Err(format!(
                "{cost} tokens at {t} ns are above the curve (the ideal bucket holds \
                 {before:.6}); B = {}, r = {}/s; (time, step, tokens, refund) so far: {:?}",
                policy.capacity(),
                policy.refill_per_second(),
                &events[..=i]
            ));
        }
    }
    Ok(())
}

fn reserving(capacity: u64, rate: f64, horizon: Duration, start: Start) -> Policy {
    Policy::builder(capacity, rate)
        .max_reservation(horizon)
        .start(start)
        .build()
        .unwrap()
}

fn at(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

/// B = 100, r = 10/s, drained at 0; A and C reserve 100 each (ready about 10 s and 20 s);
/// A cancels at 1 s. Its tokens were once credited at once: the bucket was full again
/// by C's ready time, and C's holder and a `try_acquire(100)` took 200 at one instant.
#[test]
fn a_cancel_ahead_of_a_queued_holder_never_lets_two_bursts_through() {
    let p = reserving(100, 10.0, Duration::from_secs(25), Start::Full);
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(p, clock.clone());
    assert!(bucket.try_acquire(100).unwrap().is_admitted());
    let a = bucket.reserve(100, Duration::from_secs(25)).unwrap();
    let c = bucket.reserve(100, Duration::from_secs(25)).unwrap();
    let c_ready = c.ready_at();
    clock.set(Duration::from_secs(1));
    assert!(a.cancel(), "before its time");
    clock.set(c_ready);
    assert!(c.is_ready());
    let extra = bucket.try_acquire(100).unwrap();
    assert!(
        !extra.is_admitted(),
        "C's holder proceeds with 100 at {c_ready:?} and try_acquire(100) was admitted \
         too: 200 tokens at one instant, where the curve allows 100 (available {})",
        bucket.available()
    );
    let mut history = vec![(0, 0, 100, false), (at(c_ready), 2, 100, false)];
    if extra.is_admitted() {
        history.push((at(c_ready), 3, 100, false));
    }
    assert_eq!(covered(&p, 0, history), Ok(()));
    c.consume();
}

/// The same through a refund: an admission given back while a holder waits in the
/// queue once credited the tokens at once, and the bucket refilled past the holder.
#[test]
fn a_refund_while_a_holder_waits_never_lets_two_bursts_through() {
    let p = reserving(100, 10.0, Duration::from_secs(25), Start::Full);
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(p, clock.clone());
    assert!(bucket.try_acquire(100).unwrap().is_admitted());
    let c = bucket.reserve(100, Duration::from_secs(25)).unwrap();
    clock.set(Duration::from_secs(1));
    bucket.refund(100).unwrap(); // the admission at 0 did not run
    clock.set(c.ready_at());
    let extra = bucket.try_acquire(100).unwrap();
    assert!(
        !extra.is_admitted(),
        "the holder proceeds with 100 at {:?} and try_acquire(100) was admitted too",
        c.ready_at()
    );
    c.consume();
}

/// A cancel of the last reservation in the queue still gives its whole charge back:
/// the bucket then decides exactly as a twin that never made it.
#[test]
fn cancelling_the_last_reservation_in_the_queue_gives_everything_back() {
    let p = reserving(100, 10.0, Duration::from_secs(25), Start::Full);
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(p, clock.clone());
    let twin = Bucket::with_clock(p, clock.clone());
    for b in [&bucket, &twin] {
        assert!(b.try_acquire(100).unwrap().is_admitted());
    }
    let a = bucket.reserve(37, Duration::from_secs(25)).unwrap();
    let a_twin = twin.reserve(37, Duration::from_secs(25)).unwrap();
    assert_eq!(a.ready_at(), a_twin.ready_at());
    let c = bucket.reserve(50, Duration::from_secs(25)).unwrap();
    clock.set(Duration::from_millis(1234));
    assert!(c.cancel());
    assert_eq!(bucket.available(), twin.available());
    for step in 0..60u64 {
        clock.advance(Duration::from_millis(97 * step % 413));
        let cost = step * 13 % 101;
        assert_eq!(
            bucket.try_acquire(cost).unwrap(),
            twin.try_acquire(cost).unwrap()
        );
        assert_eq!(bucket.available(), twin.available());
    }
    a.consume();
    a_twin.consume();
}

/// `Policy::builder(1, 1.0)`, drained at 0: two 1-token reservations, each rounded up
/// to the tick grid on its own, were ready 0.999817 s apart: 2 tokens where the curve
/// allows 1.9998. Now each holder waits whole ticks of refill for its own cost.
#[test]
fn queued_holders_are_never_closer_than_the_refill_rate_allows() {
    let p = reserving(1, 1.0, Duration::from_secs(5), Start::Full);
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(p, clock.clone());
    assert!(bucket.try_acquire(1).unwrap().is_admitted());
    let first = bucket.reserve(1, Duration::from_secs(5)).unwrap();
    let second = bucket.reserve(1, Duration::from_secs(5)).unwrap();
    let gap = second.ready_at() - first.ready_at();
    let history = vec![
        (0, 0, 1, false),
        (at(first.ready_at()), 1, 1, false),
        (at(second.ready_at()), 2, 1, false),
    ];
    assert!(
        gap >= Duration::from_secs(1),
        "holders ready {gap:?} apart: 2 tokens where the curve allows {}",
        1.0 + gap.as_secs_f64()
    );
    assert_eq!(covered(&p, 0, history), Ok(()));
    first.consume();
    second.consume();
}

/// One step of a random history.
#[derive(Clone, Debug)]
enum Step {
    Advance(u64),
    Back(u64),
    Take(u64),
    Reserve(u64, u64),
    /// Cancel the reservation at this index (modulo the count) if it is still held.
    Cancel(usize),
    /// Consume the reservation at this index, if it is still held.
    Consume(usize),
    /// Refund the admission at this index, if not refunded yet.
    Refund(usize),
}

fn step(cancels: bool) -> impl Strategy<Value = Step> {
    let cancel_weight = if cancels { 3 } else { 0 };
    prop_oneof![
        5 => prop_oneof![
            0u64..64,
            0u64..40_000,
            0u64..5_000_000,
            0u64..300_000_000,
            0u64..2_000_000_000
        ]
        .prop_map(Step::Advance),
        1 => (0u64..3_000_000_000).prop_map(Step::Back),
        5 => (0u64..1_200).prop_map(Step::Take),
        5 => ((0u64..1_200), (0u64..3_000)).prop_map(|(c, w)| Step::Reserve(c, w)),
        cancel_weight => any::<usize>().prop_map(Step::Cancel),
        2 => any::<usize>().prop_map(Step::Consume),
        2 => any::<usize>().prop_map(Step::Refund),
    ]
}

fn policy() -> impl Strategy<Value = (u64, f64, u64, bool)> {
    (
        prop::sample::select(vec![1u64, 2, 3, 10, 40, 100, 753, 1_000]),
        prop::sample::select(vec![0.5, 1.0, 7.0, 20.0, 333.0, 1e4, 1e6]),
        prop::sample::select(vec![100u64, 1_000, 2_500, 25_000]),
        any::<bool>(),
    )
}

/// A reservation still held, with its admission: ready time, step and cost.
type Held<'a> = (Reservation<'a, ManualClock>, u64, usize, u64);

/// Runs one random history and checks it against the ideal bucket.
fn history(
    (capacity, rate, horizon_ms, empty): (u64, f64, u64, bool),
    start: u64,
    steps: Vec<Step>,
) -> Result<(), TestCaseError> {
    let start_kind = if empty { Start::Empty } else { Start::Full };
    let Ok(policy) = Policy::builder(capacity, rate)
        .max_reservation(Duration::from_millis(horizon_ms))
        .start(start_kind)
        .build()
    else {
        return Ok(());
    };
    let clock = ManualClock::new();
    clock.set(Duration::from_nanos(start));
    let bucket = Bucket::with_clock(policy, clock.clone());
    let mut high = start;
    // (time, step, cost, refunded), and the refunds as (time, step, cost, true).
    let mut admissions: Vec<(u64, usize, u64, bool)> = Vec::new();
    let mut refunds: Vec<(u64, usize, u64, bool)> = Vec::new();
    // (reservation, its admission: ready time, step and cost), None once settled.
    let mut held: Vec<Option<Held<'_>>> = Vec::new();
    for (k, s) in steps.into_iter().enumerate() {
        let now = at(clock.now());
        match s {
            Step::Advance(d) => clock.advance(Duration::from_nanos(d)),
            Step::Back(d) => clock.set(Duration::from_nanos(now.saturating_sub(d))),
            Step::Take(c) => {
                high = high.max(now);
                let c = c % (capacity + 1);
                if bucket.try_acquire(c).unwrap().is_admitted() {
                    admissions.push((high, k, c, false));
                }
            }
            Step::Reserve(c, w) => {
                high = high.max(now);
                let c = c % (capacity + 1);
                if let Ok(r) = bucket.reserve(c, Duration::from_millis(w)) {
                    let ready = at(r.ready_at()).max(high);
                    held.push(Some((r, ready, k, c)));
                }
            }
            Step::Cancel(i) | Step::Consume(i) if !held.is_empty() => {
                let i = i % held.len();
                if let Some((r, ready, step, c)) = held[i].take() {
                    let gave_back = if matches!(s, Step::Cancel(_)) {
                        // A cancel reads the clock; a consume does not.
                        high = high.max(now);
                        r.cancel()
                    } else {
                        r.consume();
                        false
                    };
                    // Consumed, or cancelled at or after its time: it proceeds.
                    if !gave_back {
                        admissions.push((ready, step, c, false));
                    }
                }
            }
            Step::Refund(i) if !admissions.is_empty() => {
                let i = i % admissions.len();
                let a = &mut admissions[i];
                if !a.3 && a.0 <= high.max(now) {
                    // A refund of nothing does not read the clock.
                    if a.2 > 0 {
                        high = high.max(now);
                    }
                    a.3 = true;
                    bucket.refund(a.2).unwrap();
                    refunds.push((high, k, a.2, true));
                }
            }
            _ => {}
        }
    }
    for (r, ready, step, c) in held.into_iter().flatten() {
        r.consume();
        admissions.push((ready, step, c, false));
    }
    refunds.extend(admissions.into_iter().map(|(t, k, c, _)| (t, k, c, false)));
    prop_assert_eq!(covered(&policy, start, refunds), Ok(()));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8_000))]

    /// Reservations, admissions, consumes and refunds, no cancellations: every holder
    /// and every admission under the curve, on exact times.
    #[test]
    fn reservations_with_refunds_stay_under_the_curve(
        policy in policy(),
        start in 0u64..(1 << 40),
        steps in prop::collection::vec(step(false), 1..60),
    ) {
        history(policy, start, steps)?;
    }

    /// The same with cancellations anywhere in the queue.
    #[test]
    fn reservations_with_cancellations_and_refunds_stay_under_the_curve(
        policy in policy(),
        start in 0u64..(1 << 40),
        steps in prop::collection::vec(step(true), 1..60),
    ) {
        history(policy, start, steps)?;
    }
}
