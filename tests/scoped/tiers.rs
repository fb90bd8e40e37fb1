//! Tiers and per-key overrides: an overridden key pays its tier's buckets instead of its
//! rule's, all or nothing with the request's other scopes; every other key pays the rule.

use std::time::Duration;

use tokengate::{
    ManualClock, Policy, ScopedLimiter,
    scope::{
        MAX_OVERRIDES, MAX_POLICIES_PER_RULE, MAX_TIERS, Refusal, Request, RouteId, Rule,
        RuleError, RuleSet, Scope, ScopeKind, TenantId, UserId, WorkClass,
    },
};

use crate::support::{SLACK, close, near, p};

/// Admissions of one-token requests in a row until the first refusal.
fn admitted_in_a_row(limiter: &ScopedLimiter<ManualClock>, request: &Request) -> usize {
    let one = limiter.class("one").unwrap();
    let mut n = 0;
    while limiter.try_acquire(request, one).unwrap().is_admitted() {
        n += 1;
        assert!(n <= 1000, "never refused");
    }
    n
}

/// Tenants get 2 tokens at 1/s; tenant 42 is in tier "gold", 20 tokens at 10/s.
fn gold_tenant(clock: &ManualClock) -> ScopedLimiter<ManualClock> {
    RuleSet::new()
        .rule(ScopeKind::Global, Rule::new(p(10_000, 1000.0)))
        .rule(ScopeKind::Tenant, Rule::new(p(2, 1.0)).counters(true))
        .tier("gold", vec![p(20, 10.0)])
        .override_key(Scope::Tenant(TenantId(42)), "gold")
        .class(WorkClass::new("one", 1))
        .build_with_clock(clock.clone())
        .unwrap()
}

#[test]
fn an_overridden_tenant_gets_its_tiers_burst_and_rate_while_others_get_the_rules() {
    let clock = ManualClock::new();
    let limiter = gold_tenant(&clock);
    let gold = Request::new().tenant(TenantId(42));
    let plain = Request::new().tenant(TenantId(7));
    assert_eq!(admitted_in_a_row(&limiter, &gold), 20);
    assert_eq!(admitted_in_a_row(&limiter, &plain), 2);
    clock.advance(Duration::from_secs(1) + SLACK);
    assert_eq!(admitted_in_a_row(&limiter, &gold), 10);
    assert_eq!(admitted_in_a_row(&limiter, &plain), 1);
    assert_eq!(
        limiter
            .policies_for(&Scope::Tenant(TenantId(42)))
            .map(|p| p[0].capacity()),
        Some(20)
    );
    assert_eq!(
        limiter
            .policies_for(&Scope::Tenant(TenantId(7)))
            .map(|p| p[0].capacity()),
        Some(2)
    );
    assert_eq!(
        limiter
            .policies_for(&Scope::Global)
            .map(|p| p[0].capacity()),
        Some(10_000)
    );
    assert_eq!(limiter.policies_for(&Scope::User(UserId(1))), None);
    // Both keys are kept, in their own maps.
    assert_eq!(limiter.len(ScopeKind::Tenant), 2);
    // What the slack refilled at the tier's rate, a tenth of a token at most.
    assert!(
        limiter
            .available(&Scope::Tenant(TenantId(42)))
            .is_some_and(|a| a < 0.15)
    );
}

#[test]
fn an_overridden_keys_refusal_names_its_scope_and_its_tiers_policy() {
    let clock = ManualClock::new();
    let limiter = gold_tenant(&clock);
    let one = limiter.class("one").unwrap();
    let gold = Request::new().tenant(TenantId(42));
    for _ in 0..20 {
        assert!(limiter.try_acquire(&gold, one).unwrap().is_admitted());
    }
    let d = limiter.try_acquire(&gold, one).unwrap();
    assert_eq!(d.refused_scope(), Some(Scope::Tenant(TenantId(42))));
    assert_eq!(d.refused_limit(), Some(0));
    assert_eq!(d.refused_policy().map(Policy::capacity), Some(20));
    assert!(matches!(d.refusal(), Some(Refusal::RateLimited(_))));
    // A token at 10/s: a tenth of a second, not the rule's second.
    assert!(near(d.retry_after(), 0.1), "{:?}", d.retry_after());
    let record = d.records().next().unwrap().to_string();
    assert!(
        record.contains("limiter=tenant:42") && record.contains("bucket_capacity=20"),
        "{record}"
    );
    // An admission reports the tier's bucket too.
    clock.advance(Duration::from_secs(1) + SLACK);
    let d = limiter.try_acquire(&gold, one).unwrap();
    assert!(d.is_admitted());
    let own = d.decision(Scope::Tenant(TenantId(42))).unwrap();
    // Ten tokens refilled at the tier's rate, one taken.
    assert!((own.tokens_remaining() - 9.0).abs() < 0.15, "{own:?}");
    let record = d.records().nth(1).unwrap().to_string();
    assert!(
        record.contains("limiter=tenant:42") && record.contains("bucket_capacity=20"),
        "{record}"
    );
    // The tier's bucket keeps the key's counters.
    let c = limiter.counters(&Scope::Tenant(TenantId(42))).unwrap();
    assert_eq!(c.original.admitted_tokens, 21);
    assert_eq!(c.original.rejected_tokens, 1);
    let mut seen = Vec::new();
    limiter.for_each_counters(|scope, _| seen.push(scope));
    assert!(seen.contains(&Scope::Tenant(TenantId(42))));
}

#[test]
fn a_tier_with_two_policies_pays_both_all_or_nothing() {
    let clock = ManualClock::new();
    let limiter = RuleSet::new()
        .rule(ScopeKind::Global, Rule::new(p(100, 1.0)))
        .rule(ScopeKind::Tenant, Rule::new(p(50, 1.0)))
        .rule(ScopeKind::User, Rule::new(p(100, 1.0)))
        .tier("metered", vec![p(5, 1.0), p(3, 0.1)])
        .override_key(Scope::Tenant(TenantId(1)), "metered")
        .class(WorkClass::new("one", 1))
        .class(WorkClass::new("user-heavy", 1).with_cost(ScopeKind::User, 100))
        .build_with_clock(clock.clone())
        .unwrap();
    let scope = Scope::Tenant(TenantId(1));
    let request = Request::new().tenant(TenantId(1));
    assert_eq!(admitted_in_a_row(&limiter, &request), 3);
    let one = limiter.class("one").unwrap();
    let d = limiter.try_acquire(&request, one).unwrap();
    assert_eq!(d.refused_scope(), Some(scope));
    assert_eq!(d.refused_limit(), Some(1));
    assert_eq!(d.refused_policy().map(Policy::capacity), Some(3));
    // The refusal took nothing from the first limit, nor from the global scope.
    assert!(close(limiter.available_in(&scope, 0), 2.0));
    assert!(close(limiter.available_in(&scope, 1), 0.0));
    assert_eq!(limiter.available_in(&scope, 2), None);
    assert!(close(limiter.available(&Scope::Global), 97.0));
    // Another scope's refusal rolls both of the tier's limits back.
    clock.advance(Duration::from_secs(20) + SLACK);
    let heavy = limiter.class("user-heavy").unwrap();
    let both = request.user(UserId(5));
    assert!(limiter.try_acquire(&both, heavy).unwrap().is_admitted());
    let before = (
        limiter.available_in(&scope, 0),
        limiter.available_in(&scope, 1),
    );
    let d = limiter.try_acquire(&both, heavy).unwrap();
    assert_eq!(d.refused_scope(), Some(Scope::User(UserId(5))));
    let after = (
        limiter.available_in(&scope, 0),
        limiter.available_in(&scope, 1),
    );
    assert!(close(after.0, before.0.unwrap()) && close(after.1, before.1.unwrap()));
}

#[test]
fn overrides_work_for_user_and_tenant_route_keys() {
    let clock = ManualClock::new();
    let limiter = RuleSet::new()
        .rule(ScopeKind::User, Rule::new(p(1, 1.0)))
        .rule(ScopeKind::TenantRoute, Rule::new(p(2, 1.0)))
        .tier("bulk", vec![p(6, 1.0)])
        .tier("batch", vec![p(4, 1.0)])
        .override_key(Scope::User(UserId(9)), "bulk")
        .override_key(Scope::TenantRoute(TenantId(1), RouteId(3)), "batch")
        .class(WorkClass::new("one", 1))
        .build_with_clock(clock.clone())
        .unwrap();
    assert_eq!(
        admitted_in_a_row(&limiter, &Request::new().user(UserId(9))),
        6
    );
    assert_eq!(
        admitted_in_a_row(&limiter, &Request::new().user(UserId(8))),
        1
    );
    let route = |t, r| Request::new().tenant(TenantId(t)).route(RouteId(r));
    assert_eq!(admitted_in_a_row(&limiter, &route(1, 3)), 4);
    // The same route of another tenant, and another route of the same tenant: the rule.
    assert_eq!(admitted_in_a_row(&limiter, &route(2, 3)), 2);
    assert_eq!(admitted_in_a_row(&limiter, &route(1, 4)), 2);
    let one = limiter.class("one").unwrap();
    let d = limiter.try_acquire(&route(1, 3), one).unwrap();
    assert_eq!(
        d.refused_scope(),
        Some(Scope::TenantRoute(TenantId(1), RouteId(3)))
    );
    assert_eq!(d.refused_policy().map(Policy::capacity), Some(4));
}

#[test]
fn an_overridden_keys_refund_goes_to_its_tiers_buckets() {
    let clock = ManualClock::new();
    let limiter = gold_tenant(&clock);
    let one = limiter.class("one").unwrap();
    let d = limiter
        .try_acquire(&Request::new().tenant(TenantId(42)), one)
        .unwrap();
    assert!(close(limiter.available(&Scope::Tenant(TenantId(42))), 19.0));
    limiter.refund(&d.charge().unwrap());
    assert!(close(limiter.available(&Scope::Tenant(TenantId(42))), 20.0));
}

fn tenant_rules() -> RuleSet {
    RuleSet::new()
        .rule(ScopeKind::Global, Rule::new(p(100, 1.0)))
        .rule(ScopeKind::Tenant, Rule::new(p(10, 1.0)))
        .tier("gold", vec![p(20, 1.0)])
}

#[test]
fn build_refuses_an_override_naming_an_unknown_tier() {
    let e = tenant_rules()
        .override_key(Scope::Tenant(TenantId(1)), "platinum")
        .build()
        .unwrap_err();
    assert_eq!(
        e,
        RuleError::UnknownTier {
            scope: Scope::Tenant(TenantId(1)),
            tier: "platinum".into()
        }
    );
    assert!(e.to_string().contains("platinum"), "{e}");
}

#[test]
fn build_refuses_an_override_of_the_global_scope_or_a_kind_without_a_rule() {
    let e = tenant_rules()
        .override_key(Scope::Global, "gold")
        .build()
        .unwrap_err();
    assert_eq!(e, RuleError::OverrideOnGlobal);
    let e = tenant_rules()
        .override_key(Scope::User(UserId(3)), "gold")
        .build()
        .unwrap_err();
    assert_eq!(
        e,
        RuleError::OverrideWithoutRule {
            scope: Scope::User(UserId(3))
        }
    );
    assert!(e.to_string().contains("user:3"), "{e}");
}

#[test]
fn build_refuses_more_overrides_than_the_maximum() {
    let mut set = tenant_rules();
    for i in 0..=MAX_OVERRIDES as u64 {
        set = set.override_key(Scope::Tenant(TenantId(i)), "gold");
    }
    assert_eq!(
        set.build().unwrap_err(),
        RuleError::TooManyOverrides {
            count: MAX_OVERRIDES + 1,
            max: MAX_OVERRIDES
        }
    );
}

#[test]
fn build_refuses_a_tier_with_no_policy_or_too_many() {
    let e = tenant_rules().tier("empty", vec![]).build().unwrap_err();
    assert_eq!(
        e,
        RuleError::TierPolicies {
            tier: "empty".into(),
            count: 0,
            max: MAX_POLICIES_PER_RULE
        }
    );
    let many = vec![p(10, 1.0); MAX_POLICIES_PER_RULE + 1];
    let e = tenant_rules().tier("many", many).build().unwrap_err();
    assert_eq!(
        e,
        RuleError::TierPolicies {
            tier: "many".into(),
            count: MAX_POLICIES_PER_RULE + 1,
            max: MAX_POLICIES_PER_RULE
        }
    );
}

#[test]
fn build_refuses_more_tiers_than_the_maximum() {
    let mut set = tenant_rules();
    for i in 0..MAX_TIERS {
        set = set.tier(format!("t{i}"), vec![p(10, 1.0)]);
    }
    assert_eq!(
        set.build().unwrap_err(),
        RuleError::TooManyTiers {
            count: MAX_TIERS + 1,
            max: MAX_TIERS
        }
    );
}

#[test]
fn build_refuses_a_class_costing_more_than_a_used_tiers_capacity() {
    let small = || {
        RuleSet::new()
            .rule(ScopeKind::Tenant, Rule::new(p(50, 1.0)))
            .tier("small", vec![p(100, 1.0), p(8, 1.0)])
            .class(WorkClass::new("export", 20).with_cost(ScopeKind::Global, 1))
    };
    // Unused, the tier holds no key that could never be admitted.
    assert!(small().build().is_ok());
    let e = small()
        .override_key(Scope::Tenant(TenantId(1)), "small")
        .build()
        .unwrap_err();
    assert_eq!(
        e,
        RuleError::TierCostExceedsCapacity {
            class: "export".into(),
            tier: "small".into(),
            kind: ScopeKind::Tenant,
            cost: 20,
            capacity: 8
        }
    );
}

#[test]
fn a_later_tier_or_override_replaces_an_earlier_one() {
    let limiter = tenant_rules()
        .tier("gold", vec![p(30, 1.0)])
        .tier("silver", vec![p(15, 1.0)])
        .override_key(Scope::Tenant(TenantId(1)), "gold")
        .override_key(Scope::Tenant(TenantId(1)), "silver")
        .build()
        .unwrap();
    assert_eq!(
        limiter
            .policies_for(&Scope::Tenant(TenantId(1)))
            .map(|p| p[0].capacity()),
        Some(15)
    );
}

#[test]
fn a_tier_of_many_keys_holds_every_one_of_them() {
    // More keys than a small tier map has shards: none is refused for room.
    let mut set = RuleSet::new()
        .rule(ScopeKind::Tenant, Rule::new(p(1, 1.0)).shards(8))
        .tier("gold", vec![p(3, 1.0)])
        .class(WorkClass::new("one", 1));
    for t in 0..100 {
        set = set.override_key(Scope::Tenant(TenantId(t)), "gold");
    }
    let limiter = set.build_with_clock(ManualClock::new()).unwrap();
    for t in 0..100 {
        assert_eq!(
            admitted_in_a_row(&limiter, &Request::new().tenant(TenantId(t))),
            3,
            "tenant {t}"
        );
    }
    assert_eq!(limiter.len(ScopeKind::Tenant), 100);
}

#[test]
fn an_overridden_key_reserves_within_its_tiers_allowance() {
    let tier = Policy::builder(2, 1.0)
        .max_reservation(Duration::from_secs(5))
        .build()
        .unwrap();
    let limiter = std::sync::Arc::new(
        RuleSet::new()
            .rule(ScopeKind::Tenant, Rule::new(p(2, 1.0)))
            .tier("patient", vec![tier])
            .override_key(Scope::Tenant(TenantId(1)), "patient")
            .class(WorkClass::new("two", 2))
            .build_with_clock(ManualClock::new())
            .unwrap(),
    );
    let two = limiter.class("two").unwrap();
    let wait = Duration::from_secs(5);
    for t in [1, 2] {
        let r = Request::new().tenant(TenantId(t));
        limiter.reserve_owned(&r, two, wait).unwrap().consume();
    }
    // The tier allows a reservation into the future; the rule allows none.
    let patient = limiter.reserve_owned(&Request::new().tenant(TenantId(1)), two, wait);
    assert!(patient.is_ok_and(|r| r.wait() >= Duration::from_secs(1)));
    let plain = limiter.reserve_owned(&Request::new().tenant(TenantId(2)), two, wait);
    assert!(plain.is_err());
}
