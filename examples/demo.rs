//! A bucket admitting a burst, then the sustained rate, on the real (TSC) clock and on
//! the manual clock. Run with `cargo run --release --example demo`.

use std::time::{Duration, Instant};

use tokengate::{Bucket, ManualClock, Policy};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let policy = Policy::per_second(20.0).burst(100)?;
    let layout = policy.layout();
    println!("policy: capacity 100 tokens, refill 20 tokens/s");
    println!(
        "layout: tick {:?} (2^{} ns), {} fraction bits, {} tick bits, refill {} units/tick",
        policy.tick(),
        layout.tick_shift(),
        layout.frac_bits(),
        layout.tick_bits(),
        layout.refill_per_tick()
    );
    println!(
        "        effective rate {:.6} tokens/s (error {:.2e}), wrap period {:.1} years\n",
        policy.effective_refill_per_second(),
        policy.rate_error(),
        policy.wrap_period().as_secs_f64() / (365.25 * 86400.0)
    );

    println!("real clock: one thread asks for a token as fast as it can for 3 s");
    let bucket = Bucket::new(policy);
    let start = Instant::now();
    let (mut asked, mut admitted, mut window_admitted) = (0u64, 0u64, 0u64);
    let mut window = 0u32;
    while start.elapsed() < Duration::from_secs(3) {
        let d = bucket.try_acquire(1)?;
        asked += 1;
        if d.is_admitted() {
            admitted += 1;
            window_admitted += 1;
            if admitted == 100 {
                println!(
                    "  burst: 100 admitted in {:?}, then the bucket is empty (next token in {:?})",
                    start.elapsed(),
                    bucket.try_acquire(1)?.retry_after().unwrap_or_default()
                );
                window_admitted = 0;
            }
        }
        let elapsed_windows = (start.elapsed().as_millis() / 500) as u32;
        if elapsed_windows > window {
            if window > 0 || admitted > 100 {
                println!(
                    "  {:>4} ms .. {:>4} ms: {:>2} admitted ({:.1}/s)",
                    window * 500,
                    (window + 1) * 500,
                    window_admitted,
                    window_admitted as f64 * 2.0
                );
            }
            window = elapsed_windows;
            window_admitted = 0;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "  {asked} decisions in {secs:.1} s ({:.1} M/s), {admitted} admitted: 100 burst + {} at ~20/s\n",
        asked as f64 / secs / 1e6,
        admitted - 100
    );

    println!("manual clock: B = 60, r = 10/s, 25 requests/s offered for 10 s");
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(Policy::per_second(10.0).burst(60)?, clock.clone());
    for second in 0..10 {
        let mut passed = 0;
        for _ in 0..25 {
            if bucket.try_acquire(1)?.is_admitted() {
                passed += 1;
            }
            clock.advance(Duration::from_millis(40));
        }
        println!(
            "  second {second}: {passed:>2}/25 admitted, {:>5.1} tokens left",
            bucket.available()
        );
    }
    Ok(())
}
