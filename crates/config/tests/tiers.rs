//! Tiers and per-key overrides, from TOML to an engine enforcing them.

use std::time::Duration;

use tokengate::ManualClock;
use tokengate::scope::{Request, RouteId, Scope, TenantId};
use tokengate_config::Config;

const TIERS: &str = r#"
[[rule]]
name = "per-tenant"
scope = "tenant"
policies = ["1/s burst 2"]
counters = true

[[rule]]
name = "per-tenant-route"
scope = "tenant_route"
policies = ["1/s burst 100"]

[tier.gold]
policies = ["10/s burst 20"]

[tier.metered]
policies = ["1/s burst 5", "3/m"]

[[override]]
scope = "tenant"
key = 42
tier = "gold"

[[override]]
scope = "tenant"
key = 9
tier = "metered"

[[override]]
scope = "tenant_route"
key = [42, 7]
tier = "metered"

[[class]]
name = "call"
cost = 1
"#;

/// Admitted calls in a row until the first refusal.
fn in_a_row(limiter: &tokengate::ScopedLimiter<ManualClock>, request: &Request) -> usize {
    let call = limiter.class("call").unwrap();
    let mut n = 0;
    while limiter.try_acquire(request, call).unwrap().is_admitted() {
        n += 1;
        assert!(n <= 1000, "never refused");
    }
    n
}

#[test]
fn a_file_with_tiers_and_overrides_builds_and_enforces_them() {
    let config = Config::from_toml(TIERS).unwrap();
    assert!(
        config.unsupported().is_empty(),
        "{:?}",
        config.unsupported()
    );
    let clock = ManualClock::new();
    let limiter = config
        .rule_set()
        .unwrap()
        .build_with_clock(clock.clone())
        .unwrap();
    for scope in [
        Scope::Tenant(TenantId(42)),
        Scope::Tenant(TenantId(9)),
        Scope::Tenant(TenantId(1)),
        Scope::TenantRoute(TenantId(42), RouteId(7)),
        Scope::TenantRoute(TenantId(42), RouteId(8)),
    ] {
        assert_eq!(
            limiter.policies_for(&scope),
            config.policies_for(&scope),
            "{scope}"
        );
    }
    let tenant = |t| Request::new().tenant(TenantId(t));
    assert_eq!(in_a_row(&limiter, &tenant(42)), 20);
    assert_eq!(in_a_row(&limiter, &tenant(1)), 2);
    // Both of the metered tier's limits: the burst of 5, then 3 a minute.
    assert_eq!(in_a_row(&limiter, &tenant(9)), 3);
    let call = limiter.class("call").unwrap();
    let d = limiter.try_acquire(&tenant(9), call).unwrap();
    assert_eq!(d.refused_scope(), Some(Scope::Tenant(TenantId(9))));
    assert_eq!(d.refused_limit(), Some(1));
    clock.advance(Duration::from_secs(1) + Duration::from_millis(10));
    assert_eq!(in_a_row(&limiter, &tenant(42)), 10);
    let c = limiter.counters(&Scope::Tenant(TenantId(42))).unwrap();
    assert_eq!(c.original.admitted_tokens, 30);
}

#[test]
fn a_tenant_route_override_refuses_in_its_own_scope() {
    let config = Config::from_toml(TIERS).unwrap();
    let limiter = config
        .rule_set()
        .unwrap()
        .build_with_clock(ManualClock::new())
        .unwrap();
    let call = limiter.class("call").unwrap();
    // Tenant 42 is gold (20); its route 7 is metered (3 a minute).
    let request = Request::new().tenant(TenantId(42)).route(RouteId(7));
    for _ in 0..3 {
        assert!(limiter.try_acquire(&request, call).unwrap().is_admitted());
    }
    let d = limiter.try_acquire(&request, call).unwrap();
    assert_eq!(
        d.refused_scope(),
        Some(Scope::TenantRoute(TenantId(42), RouteId(7)))
    );
    // Nothing was taken from the tenant by the refused call.
    let left = limiter.available(&Scope::Tenant(TenantId(42))).unwrap();
    assert!((left - 17.0).abs() < 0.05, "{left}");
}

#[test]
fn a_tier_with_more_policies_than_the_engine_holds_is_unsupported() {
    let file = TIERS.replace(
        r#"policies = ["10/s burst 20"]"#,
        r#"policies = ["10/s burst 20", "20/m", "30/h", "40/h", "50/h"]"#,
    );
    let config = Config::from_toml(&file).unwrap();
    let parts = config.rule_set().unwrap_err().parts;
    assert_eq!(parts.len(), 1, "{parts:?}");
    assert!(
        parts[0].contains("tier \"gold\" has 5 policies"),
        "{parts:?}"
    );
}
