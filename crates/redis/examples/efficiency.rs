//! Steady-traffic efficiency: how much of the budget one instance gets when it always
//! wants more, `admitted / (B + r*T)`, through `RemoteBucket` and through the engine's
//! `LeasedBucket` over it, at B = 1000, r = 5000/s, two threads deciding in a loop.
//!
//! `cargo run --release -p tokengate-redis --example efficiency [seconds]` against the
//! Redis at `TOKENGATE_REDIS_URL` (default 127.0.0.1:6379). Each run uses a fresh bucket
//! (created full); `T` runs from the first decision to the last.

use std::time::{Duration, Instant};

use tokengate_redis::{PoolConfig, RedisPool, RemotePolicy};

const CAP: u64 = 1000;
const RATE: f64 = 5000.0;

/// Runs `decide` from two threads for `secs`; returns (admitted, elapsed s).
fn run(secs: f64, decide: &(dyn Fn() -> bool + Sync)) -> (u64, f64) {
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let admitted: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(move || {
                    let mut n = 0u64;
                    while Instant::now() < end {
                        if decide() {
                            n += 1;
                        } else {
                            std::hint::spin_loop();
                        }
                    }
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    (admitted, start.elapsed().as_secs_f64())
}

fn report(what: &str, (admitted, t): (u64, f64)) {
    let bound = CAP as f64 + RATE * t;
    println!(
        "{what}: {admitted} admitted in {t:.3} s, B + r*T = {bound:.0}: {:.1}%",
        100.0 * admitted as f64 / bound
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url =
        std::env::var("TOKENGATE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let secs: f64 = std::env::args()
        .nth(1)
        .map_or(Ok(3.0), |s| s.parse())
        .unwrap_or(3.0);
    let ns = format!("efficiency-{}", std::process::id());
    let pool = RedisPool::connect(PoolConfig::new(url, ns))?;
    let policy = RemotePolicy::new(CAP, RATE)?;
    let remote = pool.bucket("remote", policy)?;
    report("RemoteBucket", run(secs, &|| remote.try_acquire(1).is_ok()));
    let leased = pool
        .bucket("leased", policy)?
        .leased(tokengate::leased::LeaseConfig::new())?;
    report(
        "LeasedBucket over RemoteBucket",
        run(secs, &|| {
            leased.try_acquire(1).is_ok_and(|d| d.is_admitted())
        }),
    );
    Ok(())
}
