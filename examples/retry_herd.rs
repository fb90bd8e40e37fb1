//! 1,000 clients refused at the same instant, retrying with and without jitter.
//!
//! A server bucket of 100 tokens refilled at 100/s starts empty; every client sends one
//! request at time zero and is refused with `Retry-After: 1`. Each client then retries up
//! to 9 times (backoff base 1 s, cap 30 s, deadline 120 s) on top of the server's
//! `Retry-After`. The simulation runs on a manual clock with seeded jitter, so it is
//! deterministic and instant.
//!
//! Run: `cargo run --example retry_herd` (a seed may be given as the first argument).

use std::time::Duration;

use tokengate::Policy;
use tokengate::retry::{Jitter, RetryPolicy};
use tokengate_testkit::herd::{Herd, simulate};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seed = match std::env::args().nth(1) {
        Some(s) => s.parse()?,
        None => 2024,
    };
    println!("1000 clients refused at t = 0 by a bucket of 100 tokens at 100/s (seed {seed})");
    println!(
        "{:<14} {:>22} {:>8} {:>9} {:>8} {:>15}",
        "retry jitter", "max retries in 10 ms", "retries", "admitted", "gave up", "last admitted"
    );
    for (label, jitter) in [("none", Jitter::None), ("full", Jitter::Full)] {
        let report = simulate(&Herd {
            clients: 1000,
            server: Policy::per_second(100.0).burst(100)?,
            retry: RetryPolicy::new(10, Duration::from_secs(1), Duration::from_secs(30))?
                .deadline(Duration::from_secs(120))
                .jitter(jitter),
            seed,
            window: Duration::from_millis(10),
        });
        println!(
            "{:<14} {:>22} {:>8} {:>9} {:>8} {:>14.3}s",
            label,
            report.max_retries_in_window,
            report.retries,
            report.admitted,
            report.gave_up,
            report.last_admission.as_secs_f64()
        );
    }
    Ok(())
}
