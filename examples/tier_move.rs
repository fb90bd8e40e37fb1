//! A running scoped limiter moves 100,000 keys (the most a rule set overrides) into a
//! tier and back: how long each switch holds its barrier, against a switch of policies
//! alone.
//!
//! ```sh
//! cargo run --release --example tier_move   # ~2 s
//! ```

use std::time::{Duration, Instant};

use tokengate::scope::*;
use tokengate::{Inherit, ManualClock, Policy};

const KEYS: u64 = 100_000;

fn rules(tenant: u64, gold: bool) -> RuleSet {
    let mut set = RuleSet::new()
        .rule(
            ScopeKind::Tenant,
            Rule::new(Policy::per_second(10.0).burst(tenant).unwrap())
                .max_keys(1 << 20)
                .inherit(Inherit::AsIs),
        )
        .tier("gold", vec![Policy::per_second(100.0).burst(1000).unwrap()])
        .class(WorkClass::new("one", 1));
    if gold {
        for t in 0..KEYS {
            set = set.override_key(Scope::Tenant(TenantId(t)), "gold");
        }
    }
    set
}

fn timed(limiter: &ScopedLimiter<ManualClock>, set: RuleSet) -> Duration {
    let start = Instant::now();
    limiter.reconfigure(set).expect("same shape");
    start.elapsed()
}

fn main() {
    let limiter = rules(100, false)
        .build_with_clock(ManualClock::new())
        .expect("valid rules");
    let one = limiter.class("one").expect("a class of this limiter");
    for t in 0..KEYS {
        let r = Request::new().tenant(TenantId(t));
        assert!(
            limiter
                .try_acquire(&r, one)
                .expect("no error")
                .is_admitted()
        );
    }
    let policies = timed(&limiter, rules(200, false));
    let into = timed(&limiter, rules(200, true));
    let gold = limiter.available(&Scope::Tenant(TenantId(7)));
    let back = timed(&limiter, rules(200, false));
    let rule = limiter.available(&Scope::Tenant(TenantId(7)));
    println!("{KEYS} keys, each 99 of 100 tokens, then 99 of 200 (as is):");
    println!("  switch of the rule's policy alone      {policies:>10.2?}");
    println!("  all keys into tier gold (1000)         {into:>10.2?}   key 7 then holds {gold:?}");
    println!("  all keys back to the rule               {back:>10.2?}   key 7 then holds {rule:?}");
    println!(
        "  per key moved: {:.0} ns in, {:.0} ns back",
        into.as_nanos() as f64 / KEYS as f64,
        back.as_nanos() as f64 / KEYS as f64
    );
}
