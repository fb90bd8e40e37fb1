//! HTTP field values against hand-worked examples, including the rounding edges.

use std::time::Duration;

use tokengate::http::{
    self, MAX_INTEGER, Quota, QuotaError, parse_retry_after, retry_after_seconds,
};
use tokengate::{Bucket, ManualClock, Policy, acquire_all};

#[test]
fn retry_after_rounds_up_to_whole_seconds_and_is_never_zero() {
    let cases = [
        (Duration::ZERO, 1),
        (Duration::from_nanos(1), 1),
        (Duration::from_millis(1), 1),
        (Duration::from_nanos(999_999_999), 1),
        (Duration::from_secs(1), 1),
        (Duration::new(1, 1), 2),
        (Duration::from_secs(2), 2),
        (Duration::new(2, 1), 3),
        (Duration::from_millis(2500), 3),
        (Duration::from_secs(86_400), 86_400),
    ];
    for (wait, secs) in cases {
        assert_eq!(retry_after_seconds(wait), secs, "{wait:?}");
    }
}

/// One token per 2^31 ns, represented exactly (R is a power of two): waits are exact
/// nanosecond counts, so the rounding edges can be hit on real decisions.
fn exact_policy() -> Policy {
    let p = Policy::per(1, 1, Duration::from_nanos(1 << 31)).unwrap();
    assert_eq!(p.rate_error(), 0.0);
    p
}

#[test]
fn retry_after_of_real_decisions_at_the_rounding_edges() {
    let p = exact_policy();
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(p, clock.clone());
    // Drained at t = 0 from full: the write anchors at the next tick edge, so the token
    // is back one refill time after that edge.
    assert!(bucket.try_acquire(1).unwrap().is_admitted());
    let full_at = (1u64 << 31) + p.tick().as_nanos() as u64;

    // 2.000000001 s before the token is back: 3 (readings in increasing order: the
    // bucket sees a clock that steps back as time standing still).
    clock.set(Duration::from_nanos(full_at - 2_000_000_001));
    let d = bucket.try_acquire(1).unwrap();
    assert_eq!(d.retry_after(), Some(Duration::new(2, 1)));
    assert_eq!(http::retry_after(&d), Some(3));

    // Exactly 2.0 s before: 2.
    clock.set(Duration::from_nanos(full_at - 2_000_000_000));
    let d = bucket.try_acquire(1).unwrap();
    assert_eq!(d.retry_after(), Some(Duration::from_secs(2)));
    assert_eq!(http::retry_after(&d), Some(2));
    assert_eq!(http::status(&d), Some(429));

    // 1 ms before: 1.
    clock.set(Duration::from_nanos(full_at - 1_000_000));
    let d = bucket.try_acquire(1).unwrap();
    assert_eq!(d.retry_after(), Some(Duration::from_millis(1)));
    assert_eq!(http::retry_after(&d), Some(1));

    // 1 ns before: still 1, never 0.
    clock.set(Duration::from_nanos(full_at - 1));
    let d = bucket.try_acquire(1).unwrap();
    assert_eq!(d.retry_after(), Some(Duration::from_nanos(1)));
    assert_eq!(http::retry_after(&d), Some(1));

    // At the edge: admitted, so no status and no Retry-After.
    clock.set(Duration::from_nanos(full_at));
    let d = bucket.try_acquire(1).unwrap();
    assert!(d.is_admitted());
    assert_eq!((http::status(&d), http::retry_after(&d)), (None, None));
}

#[test]
fn policy_items_for_hand_worked_policies() {
    let item = |name: &str, p: Policy| Quota::new(name, &p).unwrap().policy_item().to_string();
    // 100 tokens at 20/s fill in exactly 5 s.
    assert_eq!(
        item("api", Policy::new(100, 20.0).unwrap()),
        r#""api";q=100;w=5"#
    );
    // 60 at 1/s: exactly 60 s, not 61 (the window comes from the configured rate).
    assert_eq!(item("m", Policy::new(60, 1.0).unwrap()), r#""m";q=60;w=60"#);
    // 100 per minute given as a period.
    let per_minute = Policy::per(100, 100, Duration::from_secs(60)).unwrap();
    assert_eq!(item("pm", per_minute), r#""pm";q=100;w=60"#);
    // 10 at 3/s: 3.33 s, rounded up to 4 (so q/w = 2.5/s never exceeds the rate).
    assert_eq!(item("t", Policy::new(10, 3.0).unwrap()), r#""t";q=10;w=4"#);
    // 1 at 1000/s fills in 1 ms: the window is at least 1 s.
    assert_eq!(
        item("fast", Policy::new(1, 1000.0).unwrap()),
        r#""fast";q=1;w=1"#
    );
    // 1 per 10^9 s.
    assert_eq!(
        item("slow", Policy::new(1, 1e-9).unwrap()),
        r#""slow";q=1;w=1000000000"#
    );
    // 1 per 2^31 ns = 2.147483648 s: w = 3.
    assert_eq!(item("x", exact_policy()), r#""x";q=1;w=3"#);
}

#[test]
fn names_are_escaped_or_refused_as_sf_strings_require() {
    let p = Policy::new(5, 1.0).unwrap();
    let q = Quota::new(r#"a "quoted" \ name"#, &p).unwrap();
    assert_eq!(
        q.policy_item().to_string(),
        r#""a \"quoted\" \\ name";q=5;w=5"#
    );
    assert_eq!(
        Quota::new("tab\there", &p),
        Err(QuotaError::InvalidName {
            position: 3,
            byte: b'\t'
        })
    );
    let e = Quota::new("é", &p).unwrap_err();
    assert_eq!(
        e,
        QuotaError::InvalidName {
            position: 0,
            byte: 0xc3
        }
    );
    assert!(e.to_string().contains("0x20..=0x7E"), "{e}");
    assert!(Quota::new("", &p).is_ok(), "an empty sf-string is valid");
}

#[test]
fn service_limit_items_for_hand_worked_decisions() {
    let p = Policy::new(100, 20.0).unwrap();
    let quota = Quota::new("api", &p).unwrap();
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(p, clock.clone());
    let item = |d| quota.service_limit(&d).to_string();

    // Full: 100 left, full already.
    assert_eq!(item(bucket.try_acquire(0).unwrap()), r#""api";r=100;t=0"#);
    // 3 taken: 97 left; 3 tokens refill in 150 ms -> t=1.
    assert_eq!(item(bucket.try_acquire(3).unwrap()), r#""api";r=97;t=1"#);
    // 57 more: 40 left; 60 tokens refill in 3 s (and the 0.01% rate rounding) -> t=4.
    assert_eq!(item(bucket.try_acquire(57).unwrap()), r#""api";r=40;t=4"#);
    // Drain: r=0, full again in just over 5 s -> t=6.
    assert_eq!(item(bucket.try_acquire(40).unwrap()), r#""api";r=0;t=6"#);
    // 1.7 s later: 33.99... tokens -> r=33 (floor); a cost of 50 needs ~0.8 s more.
    clock.advance(Duration::from_millis(1700));
    let d = bucket.try_acquire(50).unwrap();
    assert!(d.is_rejected());
    assert_eq!(item(d), r#""api";r=33;t=1"#);
    assert_eq!(
        http::retry_after(&d),
        Some(1),
        "t equals Retry-After on a rejection"
    );
}

#[test]
fn owed_reservations_report_zero_remaining_and_the_queue_in_retry_after() {
    let p = Policy::builder(10, 10.0)
        .max_reservation(Duration::from_secs(5))
        .build()
        .unwrap();
    let quota = Quota::new("q", &p).unwrap();
    let bucket = Bucket::with_clock(p, ManualClock::new());
    bucket.try_acquire(10).unwrap();
    bucket
        .reserve(10, Duration::from_secs(5))
        .unwrap()
        .consume(); // balance -10
    let d = bucket.try_acquire(1).unwrap();
    assert!(d.tokens_remaining() < 0.0);
    // 11 tokens at 10/s: 1.1 s -> 2.
    assert_eq!(quota.service_limit(&d).to_string(), r#""q";r=0;t=2"#);
    assert_eq!(http::retry_after(&d), Some(2));
}

#[test]
fn reset_equals_retry_after_on_every_rejection_and_never_exceeds_it() {
    let p = Policy::new(50, 7.0).unwrap();
    let quota = Quota::new("p", &p).unwrap();
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(p, clock.clone());
    let mut rejections = 0;
    for step in 0u64..2000 {
        clock.advance(Duration::from_nanos(step * 7_919_993 % 400_000_000));
        let d = bucket.try_acquire(step % 51).unwrap();
        let limit = quota.service_limit(&d);
        assert!(limit.remaining() <= 50);
        match http::retry_after(&d) {
            Some(ra) => {
                rejections += 1;
                assert!(ra >= 1);
                assert_eq!(limit.reset_seconds(), ra);
            }
            None => assert!(limit.reset_seconds() <= quota.window_seconds() + 1),
        }
    }
    assert!(rejections > 100, "{rejections}");
}

#[test]
fn multi_bucket_decisions_answer_429_with_the_set_wait() {
    let clock = ManualClock::new();
    let global = Bucket::with_clock(Policy::new(100, 100.0).unwrap(), clock.clone());
    let tenant = Bucket::with_clock(Policy::new(5, 1.0).unwrap(), clock.clone());
    let ok = acquire_all(&[(&global, 5), (&tenant, 5)]).unwrap();
    assert_eq!((http::status(&ok), http::retry_after(&ok)), (None, None));
    let refused = acquire_all(&[(&global, 5), (&tenant, 3)]).unwrap();
    assert_eq!(http::status(&refused), Some(429));
    // The tenant needs 3 s (and the rate's rounding): 4.
    assert_eq!(http::retry_after(&refused), Some(4));
}

#[test]
fn delay_seconds_parse_and_anything_else_does_not() {
    assert_eq!(parse_retry_after("0"), Some(Duration::ZERO));
    assert_eq!(parse_retry_after("120"), Some(Duration::from_secs(120)));
    assert_eq!(parse_retry_after("\t 7 "), Some(Duration::from_secs(7)));
    for bad in [
        "",
        " ",
        "+1",
        "-1",
        "1.5",
        "1s",
        "Wed, 21 Oct 2015 07:28:00 GMT",
    ] {
        assert_eq!(parse_retry_after(bad), None, "{bad:?}");
    }
    // Past the cap, however many digits: the cap (RFC 9111 1.2.2), not "no hint".
    for long in ["1000000000000000", "18446744073709551616", &"9".repeat(400)] {
        assert_eq!(
            parse_retry_after(long),
            Some(Duration::from_secs(MAX_INTEGER)),
            "{long}"
        );
    }
    assert_eq!(
        parse_retry_after("999999999999999"),
        Some(Duration::from_secs(MAX_INTEGER))
    );
    // What the server writes, the client reads back.
    for secs in [1, 2, 59, 3600] {
        assert_eq!(
            parse_retry_after(&secs.to_string()),
            Some(Duration::from_secs(secs))
        );
    }
}

#[test]
fn field_values_fit_structured_field_integers() {
    assert_eq!(MAX_INTEGER.to_string().len(), 15);
    assert_eq!(http::DRAFT, "draft-ietf-httpapi-ratelimit-headers-11");
    assert_eq!(
        (http::RETRY_AFTER, http::RATELIMIT_POLICY, http::RATELIMIT),
        ("retry-after", "ratelimit-policy", "ratelimit")
    );
    assert_eq!(
        (
            http::X_RATELIMIT_LIMIT,
            http::X_RATELIMIT_REMAINING,
            http::X_RATELIMIT_RESET
        ),
        (
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset"
        )
    );
}

#[test]
fn retry_after_seconds_of_a_wait_that_never_ends_is_the_cap() {
    use std::time::Duration;
    use tokengate::http::retry_after_seconds;
    assert_eq!(retry_after_seconds(Duration::MAX), MAX_INTEGER);
    assert_eq!(retry_after_seconds(Duration::new(u64::MAX, 0)), MAX_INTEGER);
    assert_eq!(
        retry_after_seconds(Duration::new(MAX_INTEGER - 1, 1)),
        MAX_INTEGER
    );
    assert_eq!(
        retry_after_seconds(Duration::new(MAX_INTEGER, 1)),
        MAX_INTEGER
    );
    assert_eq!(
        retry_after_seconds(Duration::new(MAX_INTEGER - 2, 1)),
        MAX_INTEGER - 1
    );
}

/// A rejection whose wait has no end (`Duration::MAX`, what a limiter reports when it
/// cannot say): `Retry-After` is the cap, the `RateLimit` field's `t` of a refusal is
/// the same function's value, and the client reads the same wait back.
#[test]
fn an_endless_wait_is_the_cap_written_and_read_back() {
    struct Endless;
    impl http::Verdict for Endless {
        fn is_admitted(&self) -> bool {
            false
        }
        fn retry_after(&self) -> Option<Duration> {
            Some(Duration::MAX)
        }
    }
    let secs = http::retry_after(&Endless).unwrap();
    assert_eq!(secs, MAX_INTEGER);
    assert_eq!(
        parse_retry_after(&secs.to_string()),
        Some(Duration::from_secs(secs))
    );
}
