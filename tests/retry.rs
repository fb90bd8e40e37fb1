//! The retry helper on a manual clock with seeded jitter: bounds, floors, deadline,
//! attempt marking, and a thundering herd with and without jitter.

use std::time::Duration;

use tokengate::retry::{
    Failure, GiveUp, Jitter, RandomSource, Retry, RetryPolicy, RetryPolicyError, SplitMix64,
};
use tokengate::{ManualClock, Policy, telemetry::Attempt};
use tokengate_testkit::herd::{Herd, max_in_window, simulate};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn splitmix64_matches_the_reference_sequence() {
    // First outputs of the reference implementation (Vigna, splitmix64.c) seeded with 1234567.
    let mut rng = SplitMix64::new(1234567);
    let got: Vec<u64> = (0..5).map(|_| rng.next_u64()).collect();
    assert_eq!(
        got,
        [
            6457827717110365317,
            3203168211198807973,
            9817491932198370423,
            4593380528125082431,
            16408922859458223821,
        ]
    );
}

#[test]
fn invalid_retry_policies_are_refused_with_the_valid_range() {
    assert_eq!(
        RetryPolicy::new(0, ms(1), ms(1)),
        Err(RetryPolicyError::ZeroAttempts)
    );
    assert_eq!(
        RetryPolicy::new(3, Duration::ZERO, ms(1)),
        Err(RetryPolicyError::ZeroBase)
    );
    let e = RetryPolicy::new(3, ms(10), ms(5)).unwrap_err();
    assert_eq!(
        e,
        RetryPolicyError::CapBelowBase {
            base: ms(10),
            cap: ms(5)
        }
    );
    assert!(e.to_string().contains("at least the base"), "{e}");
    assert!(matches!(
        RetryPolicy::new(3, ms(1), Duration::MAX),
        Err(RetryPolicyError::CapTooLong { .. })
    ));
}

#[test]
fn attempts_are_bounded_and_marked_original_then_retry_n() {
    let policy = RetryPolicy::new(5, ms(10), ms(1000)).unwrap();
    let clock = ManualClock::new();
    let retry = Retry::with_rng(policy, clock.clone(), SplitMix64::new(3));
    let mut seen = Vec::new();
    let err = retry
        .run(&clock, |attempt| {
            seen.push(attempt);
            Err::<(), _>(Failure::transient(attempt))
        })
        .unwrap_err();
    assert_eq!(
        seen,
        [
            Attempt::Original,
            Attempt::Retry(1),
            Attempt::Retry(2),
            Attempt::Retry(3),
            Attempt::Retry(4)
        ]
    );
    assert_eq!(err.attempts, 5);
    assert_eq!(err.error, Attempt::Retry(4), "the last attempt's error");
    assert_eq!(err.reason, GiveUp::AttemptsExhausted { attempts: 5 });
}

#[test]
fn a_single_attempt_policy_never_retries() {
    let policy = RetryPolicy::new(1, ms(10), ms(10)).unwrap();
    let mut retry = Retry::with_rng(policy, ManualClock::new(), SplitMix64::new(0));
    assert_eq!(
        retry.next_delay(None),
        Err(GiveUp::AttemptsExhausted { attempts: 1 })
    );
    assert_eq!(retry.attempt(), Attempt::Original);
}

#[test]
fn full_jitter_draws_cover_zero_to_the_exponential_ceiling() {
    let policy = RetryPolicy::new(u32::MAX, ms(100), ms(1600)).unwrap();
    for n in 1..=8u32 {
        let ceiling = ms(100 * (1 << (n - 1))).min(ms(1600));
        assert_eq!(policy.ceiling(n), ceiling);
    }
    // Many independent clients: retry n's delay lies in [0, ceiling(n)], and the draws
    // reach both ends of the range (within 2%), with a mean near the middle.
    for n in 1..=6u32 {
        let mut delays = Vec::new();
        for seed in 0..2000 {
            let mut retry = Retry::with_rng(policy, ManualClock::new(), SplitMix64::new(seed));
            let mut d = Duration::ZERO;
            for _ in 0..n {
                d = retry.next_delay(None).unwrap();
            }
            delays.push(d);
        }
        let ceiling = policy.ceiling(n);
        assert!(delays.iter().all(|&d| d <= ceiling), "retry {n}");
        let min = *delays.iter().min().unwrap();
        let max = *delays.iter().max().unwrap();
        assert!(
            min < ceiling / 50 && max > ceiling * 49 / 50,
            "retry {n}: {min:?}..{max:?}"
        );
        let mean = delays.iter().sum::<Duration>() / 2000;
        assert!(
            mean > ceiling * 45 / 100 && mean < ceiling * 55 / 100,
            "retry {n}: {mean:?}"
        );
    }
}

#[test]
fn no_jitter_waits_exactly_the_exponential_ceiling() {
    let policy = RetryPolicy::new(6, ms(100), ms(1000))
        .unwrap()
        .jitter(Jitter::None);
    let mut retry = Retry::with_rng(policy, ManualClock::new(), SplitMix64::new(9));
    let delays: Vec<_> = (0..5).map(|_| retry.next_delay(None).unwrap()).collect();
    assert_eq!(delays, [ms(100), ms(200), ms(400), ms(800), ms(1000)]);
}

#[test]
fn a_server_retry_after_is_a_floor_and_the_jitter_comes_on_top() {
    let policy = RetryPolicy::new(u32::MAX, ms(50), ms(400)).unwrap();
    let after = Duration::from_secs(3);
    for seed in 0..500 {
        let mut retry = Retry::with_rng(policy, ManualClock::new(), SplitMix64::new(seed));
        for n in 1..=6 {
            let d = retry.next_delay(Some(after)).unwrap();
            assert!(d >= after && d <= after + policy.ceiling(n), "{d:?}");
        }
    }
}

#[test]
fn the_deadline_stops_a_retry_that_would_start_too_late() {
    let policy = RetryPolicy::new(100, ms(1000), ms(1000))
        .unwrap()
        .jitter(Jitter::None)
        .deadline(Duration::from_millis(3500));
    let clock = ManualClock::new();
    clock.set(Duration::from_secs(50)); // the deadline counts from the first attempt
    let retry = Retry::with_rng(policy, clock.clone(), SplitMix64::new(0));
    let mut starts = Vec::new();
    let err = retry
        .run(&clock, |_| {
            starts.push(clock.now());
            clock.advance(ms(100)); // each attempt takes 100 ms
            Err::<(), _>(Failure::transient("busy"))
        })
        .unwrap_err();
    let s = |ms: u64| Duration::from_secs(50) + Duration::from_millis(ms);
    assert_eq!(starts, [s(0), s(1100), s(2200), s(3300)]);
    assert_eq!(err.attempts, 4);
    assert_eq!(
        err.reason,
        GiveUp::DeadlineExceeded {
            deadline: ms(3500),
            next_start: ms(4400)
        }
    );
}

#[test]
fn a_permanent_failure_is_not_retried() {
    let policy = RetryPolicy::new(10, ms(1), ms(10)).unwrap();
    let clock = ManualClock::new();
    let retry = Retry::with_rng(policy, clock.clone(), SplitMix64::new(0));
    let mut calls = 0;
    let err = retry
        .run(&clock, |_| {
            calls += 1;
            Err::<(), _>(Failure::permanent("forbidden"))
        })
        .unwrap_err();
    assert_eq!((calls, err.attempts, err.reason), (1, 1, GiveUp::Permanent));
    assert_eq!(clock.now(), Duration::ZERO);
}

#[test]
fn the_same_seed_replays_the_same_delays_and_another_seed_does_not() {
    let policy = RetryPolicy::new(8, ms(100), ms(10_000)).unwrap();
    let delays = |seed| {
        let mut r = Retry::with_rng(policy, ManualClock::new(), SplitMix64::new(seed));
        (0..7)
            .map(|_| r.next_delay(None).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(delays(42), delays(42));
    assert_ne!(delays(42), delays(43));
}

#[test]
fn max_in_window_counts_a_sliding_half_open_window() {
    let t: Vec<_> = [0, 5, 9, 10, 19, 20, 21].map(ms).to_vec();
    assert_eq!(max_in_window(&t, ms(10)), 3); // [0,10): 0,5,9 ; [10,20): 10,19 ; [19,29): 19,20,21
    assert_eq!(max_in_window(&t, ms(1)), 1);
    assert_eq!(max_in_window(&[], ms(10)), 0);
}

/// 1,000 clients refused at the same instant by a bucket of 100 tokens refilled at
/// 100/s; each retries up to 9 times (base 1 s, cap 30 s, deadline 120 s), honouring the
/// server's `Retry-After`.
fn herd(jitter: Jitter) -> Herd {
    Herd {
        clients: 1000,
        server: Policy::new(100, 100.0).unwrap(),
        retry: RetryPolicy::new(10, Duration::from_secs(1), Duration::from_secs(30))
            .unwrap()
            .deadline(Duration::from_secs(120))
            .jitter(jitter),
        seed: 2024,
        window: ms(10),
    }
}

#[test]
fn jittered_retries_spread_a_thundering_herd_that_plain_backoff_keeps_together() {
    let plain = simulate(&herd(Jitter::None));
    let jittered = simulate(&herd(Jitter::Full));
    println!("without jitter: {plain:?}", plain = Summary(&plain));
    println!(
        "full jitter:    {jittered:?}",
        jittered = Summary(&jittered)
    );

    // Without jitter every refused client comes back in the same instant.
    assert_eq!(plain.max_retries_in_window, 1000);
    // With full jitter no 10 ms window sees even a twentieth of the herd.
    assert!(
        jittered.max_retries_in_window * 20 <= plain.max_retries_in_window,
        "{} vs {}",
        jittered.max_retries_in_window,
        plain.max_retries_in_window
    );
    // And the spread costs no admissions: everyone gets through within the deadline.
    assert_eq!(jittered.admitted, 1000);
    assert_eq!(jittered.gave_up, 0);
    assert!(jittered.retries < plain.retries, "fewer wasted retries");
    // Deterministic: the same seed gives the same run.
    assert_eq!(simulate(&herd(Jitter::Full)), jittered);
}

struct Summary<'a>(&'a tokengate_testkit::herd::HerdReport);

impl std::fmt::Debug for Summary<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self.0;
        write!(
            f,
            "max retries in any 10 ms = {}, retries = {}, admitted = {}, gave up = {}, last admission at {:?}",
            r.max_retries_in_window, r.retries, r.admitted, r.gave_up, r.last_admission
        )
    }
}
