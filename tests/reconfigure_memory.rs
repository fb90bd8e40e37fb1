//! Memory stays flat while a limiter is reconfigured over and over and another thread
//! decides on it: every replaced epoch is freed once no operation holds it.
//!
//! Each limiter is switched between two policies `ROUNDS` times (default 20,000; set
//! `TOKENGATE_RECONFIGURE_ROUNDS=1000000` for the long run) while a second thread
//! admits, refunds and reads it without pause. The resident set is read from
//! `/proc/self/statm` before and after and printed; growth must stay under 16 MiB (the
//! epochs kept until the drop would take hundreds of bytes each).
#![cfg(target_os = "linux")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use tokengate::{Inherit, KeyedLimiter, LeasedBucket, LiveBucket, Policy};

/// Growth allowed over a whole run.
const BOUND: usize = 16 << 20;

fn rounds() -> usize {
    std::env::var("TOKENGATE_RECONFIGURE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

/// The resident set, in bytes.
fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("resident pages");
    pages * 4096
}

/// Runs `switch(i)` `rounds()` times while another thread runs `decide` until the
/// switches end; prints and bounds the growth of the resident set.
fn flat<L: Send + Sync + 'static>(
    name: &str,
    limiter: L,
    switch: impl Fn(&L, usize),
    decide: impl Fn(&L) + Send + 'static,
    retired: impl Fn(&L) -> usize,
) {
    let limiter = Arc::new(limiter);
    let done = Arc::new(AtomicBool::new(false));
    let decider = {
        let (limiter, done) = (limiter.clone(), done.clone());
        thread::spawn(move || {
            let mut decisions = 0u64;
            while !done.load(Ordering::Relaxed) {
                decide(&limiter);
                decisions += 1;
            }
            decisions
        })
    };
    // Warm up: the allocator's arenas and both threads' pin records.
    for i in 0..1_000 {
        switch(&limiter, i);
    }
    let before = rss();
    let n = rounds();
    for i in 0..n {
        switch(&limiter, i);
    }
    let after = rss();
    let waiting = retired(&limiter);
    done.store(true, Ordering::Relaxed);
    let decisions = decider.join().unwrap();
    let growth = after.saturating_sub(before);
    println!(
        "{name}: {n} reconfigurations ({decisions} decisions meanwhile): RSS {:.1} -> {:.1} MiB \
         ({} bytes per reconfiguration), {waiting} epochs awaiting their free",
        before as f64 / (1 << 20) as f64,
        after as f64 / (1 << 20) as f64,
        growth / n.max(1),
    );
    assert!(growth < BOUND, "{name}: RSS grew by {growth} bytes");
    // The decider gone, one more switch frees every epoch but the one it replaced (its
    // own pin held that one).
    switch(&limiter, n);
    assert_eq!(retired(&limiter), 1, "{name}: epochs kept");
}

fn policies() -> [Policy; 2] {
    [
        Policy::new(100, 10.0).unwrap(),
        Policy::new(200, 20.0).unwrap(),
    ]
}

/// One test, each limiter after the other: the resident set is the process's.
#[test]
fn every_limiter_reconfigured_over_and_over_stays_flat() {
    let p = policies();
    flat(
        "LiveBucket",
        LiveBucket::new(p[0]),
        move |b, i| {
            b.reconfigure(p[i % 2], Inherit::Proportional);
        },
        |b| {
            if b.try_acquire(1).unwrap().is_admitted() {
                b.refund(1).unwrap();
            }
            assert!(b.available() >= 0.0);
        },
        LiveBucket::retired_epochs,
    );
    flat(
        "LeasedBucket",
        LeasedBucket::new(p[0]),
        move |b, i| {
            b.reconfigure(p[i % 2], Inherit::Proportional).unwrap();
        },
        |b| {
            if b.try_acquire(1).unwrap().is_admitted() {
                b.refund(1).unwrap();
            }
            assert!(b.available() >= 0.0);
        },
        LeasedBucket::retired_epochs,
    );
    // Keys in several shards (the deciding thread's and others, idle): each switch first
    // converts the shards still in the epoch before, so none holds on to a retired one.
    let map = KeyedLimiter::<u64>::builder(p[0], 1_000)
        .shards(16)
        .build()
        .unwrap();
    for k in 0..64 {
        map.try_acquire(&k, 1).unwrap();
    }
    flat(
        "KeyedLimiter",
        map,
        move |m, i| {
            m.reconfigure(p[i % 2], Inherit::Proportional);
        },
        |m| {
            for k in 0..4u64 {
                if m.try_acquire(&k, 1).unwrap().is_admitted() {
                    m.refund(&k, 1).unwrap();
                }
                assert!(m.available(&k) >= 0.0);
            }
            assert!(m.policy().capacity() >= 100);
        },
        KeyedLimiter::retired_epochs,
    );
}
