//! Rules with several policies, from TOML to an engine enforcing every one of them.

use std::time::Duration;

use tokengate::ManualClock;
use tokengate::scope::{Request, Scope, ScopeKind, TenantId};
use tokengate_config::Config;

const TWO_POLICIES: &str = r#"
[[rule]]
name = "per-tenant"
scope = "tenant"
policies = ["2/s burst 4", "6/m"]

[[class]]
name = "call"
cost = 1
"#;

#[test]
fn a_two_policy_rule_is_built_and_both_limits_are_enforced() {
    let config = Config::from_toml(TWO_POLICIES).unwrap();
    assert!(config.unsupported().is_empty());
    let clock = ManualClock::new();
    let limiter = config
        .rule_set()
        .unwrap()
        .build_with_clock(clock.clone())
        .unwrap();
    assert_eq!(
        limiter.policies(ScopeKind::Tenant),
        Some(&config.rules[0].policies[..])
    );
    let call = limiter.class("call").unwrap();
    let request = Request::new().tenant(TenantId(3));
    let scope = Scope::Tenant(TenantId(3));

    // The burst limit (4) refuses the fifth call.
    for _ in 0..4 {
        assert!(limiter.try_acquire(&request, call).unwrap().is_admitted());
    }
    let d = limiter.try_acquire(&request, call).unwrap();
    assert_eq!(d.refused_scope(), Some(scope));
    assert_eq!(d.refused_limit(), Some(0));
    assert_eq!(d.refused_policy(), Some(&config.rules[0].policies[0]));

    // Two seconds later the burst limit is full again, but the minute limit (6, at
    // 0.1/s) holds about 2.2: two calls, then the minute limit refuses.
    clock.advance(Duration::from_secs(2));
    for _ in 0..2 {
        assert!(limiter.try_acquire(&request, call).unwrap().is_admitted());
    }
    let d = limiter.try_acquire(&request, call).unwrap();
    assert_eq!(d.refused_scope(), Some(scope));
    assert_eq!(d.refused_limit(), Some(1));
    assert_eq!(d.refused_policy(), Some(&config.rules[0].policies[1]));
    assert!(d.retry_after().is_some_and(|w| w > Duration::from_secs(5)));
    // Nothing was taken from the burst limit by the refusal.
    let burst = limiter.available_in(&scope, 0).unwrap();
    assert!((burst - 2.0).abs() < 0.05, "{burst}");
}

#[test]
fn what_the_engine_cannot_hold_is_refused_whole() {
    let five = Config::from_toml(
        r#"
        [[rule]]
        name = "many"
        scope = "global"
        policies = ["1/s", "2/s", "3/s", "4/s", "5/s"]
        "#,
    )
    .unwrap();
    let err = five.rule_set().unwrap_err();
    assert_eq!(err.parts.len(), 1, "{err}");
    assert!(err.parts[0].contains("at most 4"), "{err}");

    let leased = Config::from_toml(
        r#"
        [[rule]]
        name = "hot"
        scope = "global"
        policies = ["1000/s burst 2000", "10000/m"]
        lease = { slots = 4 }
        "#,
    )
    .unwrap();
    let err = leased.rule_set().unwrap_err();
    assert!(err.parts[0].contains("leased"), "{err}");

    let shared = Config::from_toml(
        r#"
        [[rule]]
        name = "t"
        scope = "tenant"
        policies = ["10/s burst 20", "100/m"]
        overflow = { share = "10/s burst 20" }
        "#,
    )
    .unwrap();
    let err = shared.rule_set().unwrap_err();
    assert!(err.parts[0].contains("overflow"), "{err}");
}

#[test]
fn a_key_of_a_two_policy_rule_costs_two_entries() {
    let config = Config::from_toml(TWO_POLICIES).unwrap();
    let m = config.rules[0].memory_bound().unwrap();
    // Two maps, each with the 8-byte key and the 8-byte word.
    assert_eq!(m.entry_bytes, 32);
}
