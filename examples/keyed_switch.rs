//! A keyed map of a million keys reconfigured while two threads admit on it: how long the
//! switch takes, and admissions per second before it, in the 50 ms after it (while the
//! shards are converted by the operations that meet them) and after that.
//!
//! ```sh
//! cargo run --release --example keyed_switch          # ~10 s
//! cargo run --release --example keyed_switch -- hot N # N decisions on 100,000 keys, for callgrind
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokengate::{Inherit, KeyedLimiter, Policy};

const KEYS: u64 = 1_000_000;

/// A cheap per-thread sequence of keys spread over the map (xorshift).
fn next_key(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state % KEYS
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("hot") {
        let n: u64 = args
            .get(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(1_000_000);
        let map =
            KeyedLimiter::<u64>::new(Policy::per_second(1e6).burst(100).unwrap(), 1 << 17).unwrap();
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for k in 0..100_000u64 {
            let _ = map.try_acquire(&k, 0);
        }
        let mut admitted = 0u64;
        for _ in 0..n {
            let key = next_key(&mut state) % 100_000;
            admitted += u64::from(map.try_acquire(&key, 1).is_ok_and(|d| d.is_admitted()));
        }
        println!("{admitted} of {n} admitted");
        return;
    }
    let map =
        KeyedLimiter::<u64>::new(Policy::per_second(1000.0).burst(100).unwrap(), 1 << 20).unwrap();
    let start = Instant::now();
    for key in 0..KEYS {
        let _ = map.try_acquire(&key, 1);
    }
    println!(
        "{KEYS} keys in {} shards, inserted in {:.2?}",
        map.shards(),
        start.elapsed()
    );

    // Switch times on the full map (each converts nothing: the shards convert lazily).
    let mut times = Vec::new();
    let mut conversions = Vec::new();
    for i in 0..9 {
        let t = Instant::now();
        map.reconfigure(
            Policy::per_second(1000.0).burst(100 + i % 2 * 100).unwrap(),
            Inherit::Proportional,
        );
        times.push(t.elapsed());
        // Touch every shard (converting each) so that the next switch starts from
        // converted shards.
        let t = Instant::now();
        for key in (0..KEYS).step_by(1000) {
            let _ = map.available(&key);
        }
        conversions.push(t.elapsed());
    }
    times.sort();
    conversions.sort();
    println!(
        "switch of a {KEYS}-key map: median {:.2?} (min {:.2?}, max {:.2?}, 9 switches)",
        times[4], times[0], times[8]
    );
    println!(
        "then converting every shard (first touches): median {:.2?}, {:.1} ns per key",
        conversions[4],
        conversions[4].as_nanos() as f64 / KEYS as f64
    );

    // Throughput around a switch: two threads admitting on random keys, counting per
    // window; the main thread switches once the first window is done.
    let stop = AtomicBool::new(false);
    let count = AtomicU64::new(0);
    let windows = std::thread::scope(|s| {
        for t in 0..2u64 {
            let (map, stop, count) = (&map, &stop, &count);
            s.spawn(move || {
                let mut state = 0x2545_F491_4F6C_DD1Du64 ^ (t + 1);
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        let _ = map.try_acquire(&next_key(&mut state), 1);
                    }
                    count.fetch_add(256, Ordering::Relaxed);
                }
            });
        }
        let window = |d: Duration| {
            let c0 = count.load(Ordering::Relaxed);
            let t0 = Instant::now();
            std::thread::sleep(d);
            (count.load(Ordering::Relaxed) - c0) as f64 / t0.elapsed().as_secs_f64()
        };
        let before = window(Duration::from_millis(1000));
        let c0 = count.load(Ordering::Relaxed);
        let t0 = Instant::now();
        map.reconfigure(
            Policy::per_second(500.0).burst(50).unwrap(),
            Inherit::Proportional,
        );
        let switch = t0.elapsed();
        std::thread::sleep(Duration::from_millis(50));
        let during = (count.load(Ordering::Relaxed) - c0) as f64 / t0.elapsed().as_secs_f64();
        let after = window(Duration::from_millis(1000));
        stop.store(true, Ordering::Relaxed);
        (before, switch, during, after)
    });
    let (before, switch, during, after) = windows;
    println!("2 threads, random keys: admissions+rejections per second");
    println!("  1 s before the switch:        {before:>12.0}");
    println!("  switch under load:             {switch:>12.2?}");
    println!(
        "  first 50 ms after (converting): {during:>12.0}  ({:.2}x before)",
        during / before
    );
    println!(
        "  the next 1 s:                  {after:>12.0}  ({:.2}x before)",
        after / before
    );
}
