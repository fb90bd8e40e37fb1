//! A flood of distinct keys against a keyed limiter bounded at 100,000 keys: 10 million in
//! optimized builds (a tenth in debug builds), on a manual clock.

use std::time::Duration;

use tokengate::{KeyedLimiter, ManualClock, Policy, keyed::KeyedError};

const MAX_KEYS: usize = 100_000;
const RESIDENTS: u64 = 1_000;

fn flood_keys() -> u64 {
    if cfg!(debug_assertions) {
        1_000_000
    } else {
        10_000_000
    }
}

/// Floods the limiter while 1,000 resident keys are served; returns (refused, evicted
/// keys seen missing from the map, resident admissions).
fn flood(limiter: &KeyedLimiter<u64, ManualClock>, clock: &ManualClock, tick: Duration) -> u64 {
    for r in 0..RESIDENTS {
        assert!(limiter.try_acquire(&r, 50).unwrap().is_admitted());
    }
    let mut refused = 0;
    for i in 0..flood_keys() {
        match limiter.try_acquire(&(u64::MAX - i), 1) {
            Ok(d) => assert!(d.is_admitted()),
            Err(KeyedError::KeyLimit { max_keys }) => {
                assert_eq!(max_keys, MAX_KEYS);
                refused += 1;
            }
            Err(e) => panic!("flood key {i}: {e}"),
        }
        if i % 1_000 == 0 {
            assert!(limiter.len() <= MAX_KEYS, "{} keys", limiter.len());
            clock.advance(tick);
        }
    }
    assert!(limiter.len() <= MAX_KEYS);
    refused
}

/// Nothing ever refills on a frozen clock, so nothing can be evicted: once the map holds
/// its maximum, new keys are refused with a typed error, and the resident keys keep
/// exactly their state.
#[test]
fn frozen_flood_stays_at_the_maximum_and_residents_keep_their_state() {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<u64, _>::builder(Policy::new(100, 1000.0).unwrap(), MAX_KEYS)
        .clock(clock.clone())
        .build()
        .unwrap();
    let refused = flood(&limiter, &clock, Duration::ZERO);
    assert_eq!(limiter.len(), MAX_KEYS);
    assert_eq!(refused, flood_keys() - (MAX_KEYS as u64 - RESIDENTS));
    for r in 0..RESIDENTS {
        assert_eq!(limiter.available(&r), 50.0, "resident {r}");
        assert!(limiter.try_acquire(&r, 50).unwrap().is_admitted());
        assert!(limiter.try_acquire(&r, 1).unwrap().is_rejected());
    }
}

/// With time passing (1 ms per 1,000 keys), flood buckets refill to full and are evicted
/// to make room: the map never exceeds its maximum, almost no key is refused (only when a
/// full shard has nothing evictable yet at that instant), and residents, whose state is
/// kept or losslessly evicted, are served throughout.
#[test]
fn flood_with_time_passing_evicts_losslessly_within_the_maximum() {
    let clock = ManualClock::new();
    let limiter = KeyedLimiter::<u64, _>::builder(Policy::new(100, 1000.0).unwrap(), MAX_KEYS)
        .clock(clock.clone())
        .build()
        .unwrap();
    let refused = flood(&limiter, &clock, Duration::from_millis(1));
    println!("{refused} of {} flood keys refused", flood_keys());
    assert!(refused <= flood_keys() / 10_000, "{refused} refused");
    for r in 0..RESIDENTS {
        // Long refilled: full whether kept or evicted and recreated.
        assert_eq!(limiter.available(&r), 100.0, "resident {r}");
        assert!(limiter.try_acquire(&r, 100).unwrap().is_admitted());
    }
}
