//! The token-bucket contract's worked examples, on the manual clock, plus a two-thread
//! stress test on a frozen clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokengate::{Bucket, ManualClock, Policy};

/// Sends one cost-1 request every `every` for `span`, returning how many were admitted
/// in each whole second of the span.
fn offer(
    bucket: &Bucket<ManualClock>,
    clock: &ManualClock,
    every: Duration,
    span: Duration,
) -> Vec<u64> {
    let start = clock.now();
    let mut per_second = vec![0u64; span.as_secs() as usize];
    while clock.now() - start < span {
        let second = (clock.now() - start).as_secs() as usize;
        if bucket.try_acquire(1).unwrap().is_admitted() {
            per_second[second] += 1;
        }
        clock.advance(every);
    }
    per_second
}

/// B = 100, r = 20/s: after 5 idle seconds the bucket holds exactly 100 (not more), a
/// caller may spend them at once, and then only 20 per second pass.
#[test]
fn burst_of_100_then_20_per_second() {
    let clock = ManualClock::new();
    let policy = Policy::new(100, 20.0).unwrap();
    let bucket = Bucket::with_clock(policy, clock.clone());
    clock.advance(Duration::from_secs(5));
    assert_eq!(bucket.available(), 100.0);

    let burst = (0..1000)
        .take_while(|_| bucket.try_acquire(1).unwrap().is_admitted())
        .count();
    assert_eq!(burst, 100);

    // A request every millisecond for 60 s: 20 per second pass. The effective rate is
    // the configured one rounded down by `rate_error` (about 1e-5), and refill arrives
    // at tick edges, so a one-second window holds 19 or 20, never 21, and the total
    // falls short of 20/s by less than one token.
    assert!(policy.rate_error() < 1e-4);
    let per_second = offer(
        &bucket,
        &clock,
        Duration::from_millis(1),
        Duration::from_secs(60),
    );
    assert!(
        per_second.iter().all(|&n| n == 19 || n == 20),
        "{per_second:?}"
    );
    let total: u64 = per_second.iter().sum();
    assert!((1199..=1200).contains(&total), "{total}");
}

/// B = 60, r = 10/s, 25 requests/s offered: 60 pass at once, the balance drains at
/// 15/s, then 10 per second pass.
#[test]
fn sixty_at_once_then_the_refill_rate_under_25_per_second() {
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(Policy::new(60, 10.0).unwrap(), clock.clone());
    let per_second = offer(
        &bucket,
        &clock,
        Duration::from_millis(40),
        Duration::from_secs(30),
    );
    // The first seconds pass all 25: the burst drains at 25 - 10 = 15/s for 4 s (the
    // last request of the fourth second meets an empty bucket or just makes it,
    // depending on the tick edges).
    assert_eq!(&per_second[..3], &[25, 25, 25]);
    assert!((24..=25).contains(&per_second[3]), "{per_second:?}");
    // From then on the refill rate is the limit.
    assert!(
        per_second[5..].iter().all(|&n| n == 9 || n == 10),
        "{per_second:?}"
    );
    let total: u64 = per_second.iter().sum();
    // 60 at once plus 10/s for 30 s, less under one token of rounding.
    assert!((359..=360).contains(&total), "{total}");
}

/// With 12 tokens left, a cost-20 export is rejected while a cost-3 search passes.
#[test]
fn weighted_cost_20_rejected_with_12_left_while_cost_3_passes() {
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(Policy::new(100, 20.0).unwrap(), clock.clone());
    assert!(bucket.try_acquire(88).unwrap().is_admitted());
    assert_eq!(bucket.available(), 12.0);

    let export = bucket.try_acquire(20).unwrap();
    assert!(export.is_rejected());
    assert_eq!(export.tokens_remaining(), 12.0);
    // 8 more tokens at 20/s: 0.4 s, up to the next tick edge.
    let wait = export.retry_after().unwrap();
    assert!(
        wait >= Duration::from_millis(400) && wait < Duration::from_millis(402),
        "{wait:?}"
    );

    let search = bucket.try_acquire(3).unwrap();
    assert!(search.is_admitted());
    assert_eq!(search.tokens_remaining(), 9.0);
}

/// Start empty: nothing at creation, the first token after 1/r.
#[test]
fn start_empty_admits_nothing_at_creation() {
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(Policy::new(100, 20.0).unwrap().start_empty(), clock.clone());
    assert_eq!(bucket.available(), 0.0);
    let d = bucket.try_acquire(1).unwrap();
    assert!(d.is_rejected());
    let wait = d.retry_after().unwrap();
    clock.advance(wait - Duration::from_nanos(1));
    assert!(bucket.try_acquire(1).unwrap().is_rejected());
    clock.advance(Duration::from_nanos(1));
    assert!(bucket.try_acquire(1).unwrap().is_admitted());

    // A reset brings it back to empty, not full.
    clock.advance(Duration::from_secs(60));
    bucket.reset();
    assert_eq!(bucket.available(), 0.0);
}

/// Two threads race on one bucket with a frozen clock: exactly the capacity is admitted,
/// never more.
#[test]
fn two_threads_admit_exactly_the_capacity() {
    for round in 0..20 {
        let clock = ManualClock::new();
        let bucket = Arc::new(Bucket::with_clock(
            Policy::new(200_000, 1.0).unwrap(),
            clock,
        ));
        let admitted = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (bucket, admitted) = (Arc::clone(&bucket), Arc::clone(&admitted));
                std::thread::spawn(move || {
                    let mut mine = 0;
                    while bucket.try_acquire(1).unwrap().is_admitted() {
                        mine += 1;
                    }
                    admitted.fetch_add(mine, Ordering::Relaxed);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(admitted.load(Ordering::Relaxed), 200_000, "round {round}");
        assert_eq!(bucket.available(), 0.0);
    }
}

/// Two threads with mixed costs: admitted cost plus what is left equals the capacity.
#[test]
fn two_threads_with_mixed_costs_conserve_tokens() {
    let clock = ManualClock::new();
    let bucket = Arc::new(Bucket::with_clock(
        Policy::new(1_000_000, 1.0).unwrap(),
        clock,
    ));
    let admitted = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let (bucket, admitted) = (Arc::clone(&bucket), Arc::clone(&admitted));
            std::thread::spawn(move || {
                let mut mine = 0;
                let mut rejected_in_a_row = 0;
                let mut i = t;
                while rejected_in_a_row < 100 {
                    let cost = 1 + i % 7;
                    i += 1;
                    if bucket.try_acquire(cost).unwrap().is_admitted() {
                        mine += cost;
                        rejected_in_a_row = 0;
                    } else {
                        rejected_in_a_row += 1;
                    }
                }
                admitted.fetch_add(mine, Ordering::Relaxed);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let left = bucket.available();
    assert_eq!(left.fract(), 0.0);
    assert_eq!(admitted.load(Ordering::Relaxed) + left as u64, 1_000_000);
    assert!(left < 7.0);
}
