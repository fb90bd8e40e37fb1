//! A flood of 10 million distinct keys against a keyed limiter bounded at 100,000 keys,
//! while 1,000 resident keys keep being served.
//!
//! Two runs: on the real clock (flood buckets refill within milliseconds and are evicted
//! to make room), and on a frozen manual clock (nothing ever refills, so nothing can be
//! evicted and new keys meet the overflow policy). Prints the time, the largest map size
//! seen, the refusals, and the resident memory (VmRSS) before and after.
//!
//! ```text
//! cargo run --release --example key_flood
//! ```

use std::time::Instant;

use tokengate::{Clock, KeyedLimiter, ManualClock, Policy, QuantaClock, keyed::KeyedError};

#[path = "support/rss.rs"]
mod rss;

use rss::rss_kib;

const FLOOD: u64 = 10_000_000;
const MAX_KEYS: usize = 100_000;
const RESIDENTS: u64 = 1_000;

fn flood<C: Clock>(name: &str, limiter: KeyedLimiter<u64, C>) {
    let rss0 = rss_kib();
    for r in 0..RESIDENTS {
        limiter.try_acquire(&r, 50).unwrap();
    }
    let start = Instant::now();
    let (mut refused, mut max_len, mut resident_admitted) = (0u64, 0usize, 0u64);
    for i in 0..FLOOD {
        match limiter.try_acquire(&(u64::MAX - i), 1) {
            Ok(_) => {}
            Err(KeyedError::KeyLimit { .. }) => refused += 1,
            Err(e) => panic!("{e}"),
        }
        if i % 1000 == 0 {
            max_len = max_len.max(limiter.len());
            assert!(limiter.len() <= MAX_KEYS);
            // Residents keep being served from their own state.
            let r = (i / 1000) % RESIDENTS;
            if limiter.try_acquire(&r, 1).unwrap().is_admitted() {
                resident_admitted += 1;
            }
        }
    }
    let elapsed = start.elapsed();
    let rss1 = rss_kib();
    println!(
        "{name}: {FLOOD} flood keys in {:.2} s ({:.0} ns/key); max {} keys (limit {MAX_KEYS}), \
         {} at the end; {refused} refused (key limit); residents admitted {resident_admitted}/{}; \
         VmRSS {} KiB before, {} KiB after",
        elapsed.as_secs_f64(),
        elapsed.as_nanos() as f64 / FLOOD as f64,
        max_len,
        limiter.len(),
        FLOOD / 1000,
        rss0,
        rss1,
    );
}

fn main() {
    let policy = Policy::per_second(1000.0).burst(100).unwrap();
    let real = KeyedLimiter::<u64, QuantaClock>::builder(policy, MAX_KEYS)
        .build()
        .unwrap();
    flood("real clock", real);
    let frozen = KeyedLimiter::<u64, _>::builder(policy, MAX_KEYS)
        .clock(ManualClock::new())
        .build()
        .unwrap();
    flood("frozen clock", frozen);
}
