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

/// Held by each test for its whole run: the resident set is the process's, and a
/// retirement waits for every thread's pin (whatever chain it pins), so the tests run
/// one after the other.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

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
    let _one = one_at_a_time();
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

/// A scoped limiter's rules: a global rule, tenants with 1,000 keys overridden to four
/// tiers of two limits (which tier each key gets turns with `flip`, so that every
/// switch changes the tier layout and moves every key; not with
/// `TOKENGATE_SCOPED_SAME_TIERS` set, for a switch of policies alone), and users. The
/// two rule sets differ in every policy.
fn scoped_rules(flip: bool) -> tokengate::scope::RuleSet {
    use std::time::Duration;
    use tokengate::scope::{Rule, RuleSet, Scope, ScopeKind, TenantId, WorkClass};
    let n = if flip { 2 } else { 1 };
    let policy = |capacity: u64, rate: f64| {
        Policy::builder(capacity * n, rate * n as f64)
            .max_reservation(Duration::from_secs(1))
            .build()
            .unwrap()
    };
    let mut set = RuleSet::new()
        .rule(
            ScopeKind::Global,
            Rule::new(policy(1_000_000, 1_000_000.0)).inherit(Inherit::Proportional),
        )
        .rule(
            ScopeKind::Tenant,
            Rule::new(policy(100, 100.0))
                .inherit(Inherit::AsIs)
                .max_keys(10_000),
        )
        .rule(ScopeKind::User, Rule::new(policy(50, 50.0)));
    for t in 0..4u64 {
        set = set.tier(
            format!("tier{t}"),
            vec![policy(200 + 10 * t, 100.0), policy(400 + 10 * t, 10.0)],
        );
    }
    for key in 0..1_000u64 {
        let moved = flip && std::env::var_os("TOKENGATE_SCOPED_SAME_TIERS").is_none();
        let tier = (key + u64::from(moved)) % 4;
        set = set.override_key(Scope::Tenant(TenantId(key)), format!("tier{tier}"));
    }
    set.class(WorkClass::new("read", 1))
}

/// Bytes a scoped limiter may keep per reconfiguration, beyond [`SCOPED_SLACK`]: it
/// frees the generations it replaces (keeping the 16 latest), and stores each distinct
/// configuration once (policies, classes, tier tables), so nothing grows with the
/// number of switches. (Keeping every generation took 1,201 bytes per switch here.)
const SCOPED_PER_SWITCH: usize = 64;

/// Growth of the resident set a scoped run may show whatever its length: the
/// allocator's arenas settling, both threads' caches.
const SCOPED_SLACK: usize = 1 << 20;

/// A scoped limiter reconfigured over and over (default 2,000 times), alternating two
/// rule sets whose tier layouts differ (every switch moves every overridden key), while
/// another thread decides on a few scopes (tiered and untiered keys), refunds, reserves,
/// and commits or cancels its reservations. What the limiter keeps per switch is
/// bounded by [`SCOPED_PER_SWITCH`]: it stays flat.
#[test]
fn scoped_limiter_reconfigured_over_and_over_stays_flat() {
    use std::time::Duration;
    use tokengate::scope::{Request, TenantId, UserId};

    let _one = one_at_a_time();
    let limiter = Arc::new(scoped_rules(false).build().unwrap());
    let read = limiter.class("read").unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let decider = {
        let (limiter, done) = (limiter.clone(), done.clone());
        thread::spawn(move || {
            let requests = [
                Request::new(),
                Request::new().tenant(TenantId(3)).user(UserId(1)),
                Request::new().tenant(TenantId(5_000)),
                Request::new().tenant(TenantId(998)).user(UserId(2)),
            ];
            let mut decisions = 0u64;
            while !done.load(Ordering::Relaxed) {
                let request = &requests[(decisions % 4) as usize];
                let d = limiter.try_acquire(request, read).unwrap();
                if let Some(charge) = d.charge() {
                    if decisions.is_multiple_of(3) {
                        limiter.refund(&charge);
                    }
                }
                let _ = limiter.try_acquire_verdict(request, read).unwrap();
                if let Ok(r) = limiter.reserve_owned(request, read, Duration::from_millis(100)) {
                    if decisions.is_multiple_of(2) {
                        let charge = r.consume();
                        limiter.refund(&charge);
                    } else {
                        r.cancel();
                    }
                }
                decisions += 1;
            }
            decisions
        })
    };
    let switch = |i: usize| {
        limiter.reconfigure(scoped_rules(i % 2 == 1)).unwrap();
    };
    // Warm up: the allocator's arenas, and both tier tables laid out.
    for i in 0..100 {
        switch(i);
    }
    let before = rss();
    let n = std::env::var("TOKENGATE_RECONFIGURE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    for i in 0..n {
        switch(i);
    }
    let after = rss();
    let waiting = limiter.retired_generations();
    done.store(true, Ordering::Relaxed);
    let decisions = decider.join().unwrap();
    let growth = after.saturating_sub(before);
    println!(
        "ScopedLimiter: {n} reconfigurations ({decisions} decisions meanwhile): RSS {:.1} -> \
         {:.1} MiB ({} bytes per reconfiguration), {} generations had, {waiting} awaiting \
         their free, {} configurations stored",
        before as f64 / (1 << 20) as f64,
        after as f64 / (1 << 20) as f64,
        growth / n.max(1),
        limiter.generations(),
        limiter.stored_configurations(),
    );
    assert!(
        growth < SCOPED_SLACK + SCOPED_PER_SWITCH * n,
        "ScopedLimiter: RSS grew by {growth} bytes over {n} reconfigurations"
    );
    // Two rule sets: two configurations stored, whatever the number of switches.
    assert_eq!(limiter.stored_configurations(), 2);
    // The decider gone, one more switch frees every generation out of the window: it
    // retires once its own pin has ended, and no other thread pins.
    switch(n);
    assert!(
        limiter.retired_generations() == 0,
        "ScopedLimiter: {} generations retired and kept",
        limiter.retired_generations()
    );
}
