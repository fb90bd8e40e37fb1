//! Bytes of memory per key, tokengate's keyed limiter next to governor's, measured the
//! same way in the same run: a counting global allocator (live bytes after inserting N
//! random `u64` keys, less live bytes before) and the resident set size (VmRSS).
//!
//! ```text
//! cargo run --release --example bytes_per_key
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokengate::{KeyedLimiter, Policy};

#[path = "support/rss.rs"]
mod rss;

use rss::rss_kib;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged, only counting sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn keys(n: usize) -> Vec<u64> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d)
        })
        .collect()
}

/// Builds a limiter with `build`, inserts every key with `insert`, and prints the live
/// bytes and RSS it added per key.
fn measure<T>(name: &str, keys: &[u64], build: impl FnOnce() -> T, insert: impl Fn(&T, u64)) {
    let (live0, rss0) = (LIVE.load(Ordering::Relaxed), rss_kib());
    let limiter = build();
    for &k in keys {
        insert(&limiter, k);
    }
    let (live1, rss1) = (LIVE.load(Ordering::Relaxed), rss_kib());
    let n = keys.len() as f64;
    println!(
        "{name:<34} {:>9} keys  {:>6.1} B/key allocated  {:>6.1} B/key RSS",
        keys.len(),
        (live1 - live0) as f64 / n,
        (rss1.saturating_sub(rss0) * 1024) as f64 / n,
    );
    drop(limiter);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let [_, which, n] = &args[..] {
        return child(which, n.parse().expect("a key count"));
    }
    // Each measurement runs in a fresh process, so the resident-set figure is not
    // muddied by pages an earlier measurement freed.
    let exe = std::env::current_exe().expect("own path");
    for n in [
        "1000000", "250000", "500000", "750000", "1500000", "2000000",
    ] {
        for which in ["tokengate", "governor", "tokengate+counters"] {
            let out = std::process::Command::new(&exe)
                .args([which, n])
                .output()
                .expect("child run");
            print!("{}", String::from_utf8_lossy(&out.stdout));
        }
        println!();
    }
}

fn child(which: &str, n: usize) {
    let policy = Policy::per_second(1000.0).burst(100).unwrap();
    let quota = governor::Quota::per_second(NonZeroU32::new(1000).unwrap())
        .allow_burst(NonZeroU32::new(100).unwrap());
    let keys = keys(n);
    match which {
        "tokengate" => measure(
            "tokengate KeyedLimiter<u64>",
            &keys,
            || KeyedLimiter::<u64>::new(policy, 4_000_000).unwrap(),
            |l, k| {
                l.try_acquire(&k, 1).unwrap();
            },
        ),
        "governor" => measure(
            "governor keyed (DashMap)",
            &keys,
            || governor::RateLimiter::keyed(quota),
            |l, k| {
                let _ = l.check_key(&k);
            },
        ),
        _ => measure(
            "tokengate KeyedLimiter<u64>+counters",
            &keys,
            || {
                KeyedLimiter::<u64>::builder(policy, 4_000_000)
                    .counters(true)
                    .build()
                    .unwrap()
            },
            |l, k| {
                l.try_acquire(&k, 1).unwrap();
            },
        ),
    }
}
