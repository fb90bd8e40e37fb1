//! Several limits per scope: a rule's policies are all paid, all or nothing, and a
//! refusal names the scope and the limit that refused.

use std::time::Duration;

use tokengate::{
    ManualClock, Policy, ScopedLimiter, keyed::Overflow, leased::LeaseConfig, scope::Refusal,
    scope::Request, scope::Rule, scope::RuleError, scope::RuleSet, scope::Scope, scope::ScopeKind,
    scope::TenantId, scope::WorkClass,
};

use crate::support::{SLACK, close, near, p};

fn one_class(rules: RuleSet) -> RuleSet {
    rules.class(WorkClass::new("one", 1))
}

/// Global limits: 5 tokens at 1/s (the burst), and 8 at 0.25/s (the sustained rate).
fn burst_and_sustained(clock: &ManualClock) -> ScopedLimiter<ManualClock> {
    let rule = Rule::with_policies(vec![p(5, 1.0), p(8, 0.25)]).unwrap();
    one_class(RuleSet::new().rule(ScopeKind::Global, rule))
        .build_with_clock(clock.clone())
        .unwrap()
}

#[test]
fn a_rule_keeps_its_policies_in_order() {
    let rule = Rule::with_policies(vec![p(5, 1.0), p(8, 0.25)]).unwrap();
    assert_eq!(rule.policies(), [p(5, 1.0), p(8, 0.25)]);
    assert_eq!(rule.policy(), &p(5, 1.0));
    assert_eq!(Rule::new(p(3, 1.0)).policies(), [p(3, 1.0)]);
    let limiter = burst_and_sustained(&ManualClock::new());
    assert_eq!(
        limiter.policies(ScopeKind::Global),
        Some(&[p(5, 1.0), p(8, 0.25)][..])
    );
    assert_eq!(limiter.policy(ScopeKind::Global), Some(&p(5, 1.0)));
}

#[test]
fn the_burst_limit_refuses_first_and_is_named() {
    let clock = ManualClock::new();
    let limiter = burst_and_sustained(&clock);
    let one = limiter.class("one").unwrap();
    for _ in 0..5 {
        assert!(
            limiter
                .try_acquire(&Request::new(), one)
                .unwrap()
                .is_admitted()
        );
    }
    let d = limiter.try_acquire(&Request::new(), one).unwrap();
    assert!(d.is_rejected());
    assert_eq!(d.refused_scope(), Some(Scope::Global));
    assert_eq!(d.refused_limit(), Some(0));
    assert_eq!(d.refused_policy(), Some(&p(5, 1.0)));
    assert!(near(d.retry_after(), 1.0), "{:?}", d.retry_after());
    // Nothing taken from either limit.
    assert!(close(limiter.available_in(&Scope::Global, 0), 0.0));
    assert!(close(limiter.available_in(&Scope::Global, 1), 3.0));
}

#[test]
fn the_sustained_limit_refuses_later_and_nothing_is_taken() {
    let clock = ManualClock::new();
    let limiter = burst_and_sustained(&clock);
    let one = limiter.class("one").unwrap();
    let take = |n: usize| {
        for _ in 0..n {
            assert!(
                limiter
                    .try_acquire(&Request::new(), one)
                    .unwrap()
                    .is_admitted()
            );
        }
    };
    take(5); // burst 0, sustained 3
    clock.advance(Duration::from_secs(2) + SLACK);
    take(2); // burst 0, sustained 1.5
    clock.advance(Duration::from_secs(1) + SLACK);
    take(1); // burst 0, sustained 0.75
    clock.advance(Duration::from_secs(2) + SLACK);
    take(1); // burst 1, sustained 0.25
    let d = limiter.try_acquire(&Request::new(), one).unwrap();
    assert!(d.is_rejected());
    assert_eq!(d.refused_scope(), Some(Scope::Global));
    assert_eq!(d.refused_limit(), Some(1));
    assert_eq!(d.refused_policy(), Some(&p(8, 0.25)));
    // The refusal's decision is the sustained bucket's.
    let Some(Refusal::RateLimited(own)) = d.refusal() else {
        panic!("a rate-limit refusal: {d:?}");
    };
    assert!((own.tokens_remaining() - 0.25).abs() < 0.05, "{own:?}");
    let expected = (1.0 - own.tokens_remaining()) / 0.25;
    assert!(near(d.retry_after(), expected), "{:?}", d.retry_after());
    // All or nothing: the burst bucket, which could pay, was not charged.
    assert!(close(limiter.available_in(&Scope::Global, 0), 1.0));
    assert!(close(limiter.available_in(&Scope::Global, 1), 0.25));
    assert_eq!(limiter.available_in(&Scope::Global, 2), None);
}

#[test]
fn when_several_limits_refuse_the_longest_wait_is_named() {
    for (policies, slow) in [
        (vec![p(2, 1.0), p(2, 0.5)], 1),
        (vec![p(2, 0.5), p(2, 1.0)], 0),
    ] {
        let clock = ManualClock::new();
        let rule = Rule::with_policies(policies).unwrap();
        let limiter = one_class(RuleSet::new().rule(ScopeKind::Global, rule))
            .build_with_clock(clock.clone())
            .unwrap();
        let one = limiter.class("one").unwrap();
        for _ in 0..2 {
            assert!(
                limiter
                    .try_acquire(&Request::new(), one)
                    .unwrap()
                    .is_admitted()
            );
        }
        let d = limiter.try_acquire(&Request::new(), one).unwrap();
        assert_eq!(d.refused_limit(), Some(slow));
        assert_eq!(d.refused_policy(), Some(&p(2, 0.5)));
        assert!(near(d.retry_after(), 2.0), "{:?}", d.retry_after());
        let Some(Refusal::RateLimited(own)) = d.refusal() else {
            panic!("a rate-limit refusal: {d:?}");
        };
        assert!(near(own.retry_after(), 2.0), "{own:?}");
    }
}

#[test]
fn a_keyed_kind_has_a_bucket_per_key_and_policy() {
    let clock = ManualClock::new();
    let tenant = Rule::with_policies(vec![p(4, 1.0), p(6, 0.5)])
        .unwrap()
        .counters(true);
    let limiter = one_class(
        RuleSet::new()
            .rule(ScopeKind::Global, Rule::new(p(100, 10.0)))
            .rule(ScopeKind::Tenant, tenant),
    )
    .build_with_clock(clock.clone())
    .unwrap();
    let one = limiter.class("one").unwrap();
    let t1 = Request::new().tenant(TenantId(1));
    let s1 = Scope::Tenant(TenantId(1));
    for _ in 0..4 {
        assert!(limiter.try_acquire(&t1, one).unwrap().is_admitted());
    }
    let d = limiter.try_acquire(&t1, one).unwrap();
    assert_eq!(d.refused_scope(), Some(s1));
    assert_eq!(d.refused_limit(), Some(0));
    assert!(close(limiter.available_in(&s1, 0), 0.0));
    assert!(close(limiter.available_in(&s1, 1), 2.0));
    assert!(close(limiter.available(&Scope::Global), 96.0));

    // Four seconds later the first limit is full again (4), the second holds 4: four
    // requests empty both, and then both refuse; the second waits longer (2 s to the
    // first's 1 s) and is named.
    clock.advance(Duration::from_secs(4) + SLACK);
    for _ in 0..4 {
        assert!(limiter.try_acquire(&t1, one).unwrap().is_admitted());
    }
    let d = limiter.try_acquire(&t1, one).unwrap();
    assert_eq!(d.refused_scope(), Some(s1));
    assert_eq!(d.refused_limit(), Some(1));
    assert_eq!(d.refused_policy(), Some(&p(6, 0.5)));
    assert!(near(d.retry_after(), 2.0), "{:?}", d.retry_after());
    assert!(close(limiter.available_in(&s1, 0), 0.0));
    assert!(close(limiter.available_in(&s1, 1), 0.0));
    assert!(close(limiter.available(&Scope::Global), 96.0));

    // Another tenant has its own buckets.
    let s2 = Scope::Tenant(TenantId(2));
    assert!(
        limiter
            .try_acquire(&Request::new().tenant(TenantId(2)), one)
            .unwrap()
            .is_admitted()
    );
    assert!(close(limiter.available_in(&s2, 0), 3.0));
    assert!(close(limiter.available_in(&s2, 1), 5.0));

    // Counters count each request once, in the kind's first limit.
    let c = limiter.counters(&s1).unwrap();
    assert_eq!(c.original.admitted_tokens, 8);
    assert_eq!(c.original.rejected_tokens, 2);
}

#[test]
fn a_refund_gives_every_limit_its_cost_back_and_a_lone_cancel_its_whole_charge() {
    let clock = ManualClock::new();
    let reservable = |capacity, rate| {
        Policy::builder(capacity, rate)
            .max_reservation(Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let rule = Rule::with_policies(vec![reservable(4, 1.0), reservable(6, 0.5)]).unwrap();
    let limiter = std::sync::Arc::new(
        RuleSet::new()
            .rule(ScopeKind::Global, rule)
            .rule(ScopeKind::Tenant, rule)
            .class(WorkClass::new("four", 4))
            .build_with_clock(clock.clone())
            .unwrap(),
    );
    let four = limiter.class("four").unwrap();
    let request = Request::new().tenant(TenantId(7));
    let scopes = [Scope::Global, Scope::Tenant(TenantId(7))];
    let charge = limiter
        .try_acquire(&request, four)
        .unwrap()
        .charge()
        .unwrap();
    for s in &scopes {
        assert!(close(limiter.available_in(s, 0), 0.0));
        assert!(close(limiter.available_in(s, 1), 2.0));
    }
    limiter.refund(&charge);
    for s in &scopes {
        assert!(close(limiter.available_in(s, 0), 4.0));
        assert!(close(limiter.available_in(s, 1), 6.0));
    }
    assert!(limiter.try_acquire(&request, four).unwrap().is_admitted());
    // Into debt in both limits: the second is 2 tokens short at 0.5/s, the first 4 at 1/s.
    let r = limiter
        .reserve_owned(&request, four, Duration::from_secs(10))
        .unwrap();
    assert!(!r.is_ready());
    for s in &scopes {
        assert!(limiter.available_in(s, 0).is_some_and(|t| t < 1.0));
        assert!(limiter.available_in(s, 1).is_some_and(|t| t < 1.0));
    }
    // Cancelled while its limits are owed, with no reservation made after it: each limit
    // of each scope gets its whole charge back, as if it had never reserved.
    assert!(r.cancel());
    for s in &scopes {
        assert!(close(limiter.available_in(s, 0), 0.0));
        assert!(close(limiter.available_in(s, 1), 2.0));
    }
}

#[test]
fn a_request_paying_no_keyed_scope_still_pays_every_global_limit() {
    // The global-only path of a multi-policy rule goes through the multi-bucket
    // acquisition: a tenant rule exists but the request names no tenant.
    let clock = ManualClock::new();
    let limiter = one_class(
        RuleSet::new()
            .rule(
                ScopeKind::Global,
                Rule::with_policies(vec![p(10, 1.0), p(3, 1.0)]).unwrap(),
            )
            .rule(ScopeKind::Tenant, Rule::new(p(10, 1.0))),
    )
    .build_with_clock(clock)
    .unwrap();
    let one = limiter.class("one").unwrap();
    for _ in 0..3 {
        assert!(
            limiter
                .try_acquire(&Request::new(), one)
                .unwrap()
                .is_admitted()
        );
    }
    let d = limiter.try_acquire(&Request::new(), one).unwrap();
    assert_eq!(d.refused_limit(), Some(1));
    assert!(close(limiter.available_in(&Scope::Global, 0), 7.0));
    // The same request with a tenant: the tenant's bucket is not charged either.
    let d = limiter
        .try_acquire(&Request::new().tenant(TenantId(1)), one)
        .unwrap();
    assert_eq!(d.refused_scope(), Some(Scope::Global));
    assert!(close(limiter.available(&Scope::Tenant(TenantId(1))), 10.0));
}

#[test]
fn bad_policy_lists_are_typed_errors() {
    assert_eq!(
        Rule::with_policies(vec![]).unwrap_err(),
        RuleError::NoPolicies
    );
    assert_eq!(
        Rule::with_policies(vec![p(1, 1.0); 5]).unwrap_err(),
        RuleError::TooManyPolicies { count: 5, max: 4 }
    );
    assert_eq!(tokengate::scope::MAX_POLICIES_PER_RULE, 4);
    assert!(Rule::with_policies(vec![p(1, 1.0); 4]).is_ok());
    let two = Rule::with_policies(vec![p(10, 1.0), p(5, 1.0)]).unwrap();

    let leased = RuleSet::new()
        .rule(ScopeKind::Global, two.leased(LeaseConfig::new()))
        .build();
    assert_eq!(leased.unwrap_err(), RuleError::MultiPolicyLease);

    let shared = RuleSet::new()
        .rule(ScopeKind::Tenant, two.overflow(Overflow::Share(p(10, 1.0))))
        .build();
    assert_eq!(
        shared.unwrap_err(),
        RuleError::MultiPolicyOverflow {
            kind: ScopeKind::Tenant
        }
    );

    // A class must fit the smallest capacity of the rule's policies.
    let big = RuleSet::new()
        .rule(ScopeKind::Global, two)
        .class(WorkClass::new("big", 6))
        .build();
    assert_eq!(
        big.unwrap_err(),
        RuleError::CostExceedsCapacity {
            class: "big".to_owned(),
            kind: ScopeKind::Global,
            cost: 6,
            capacity: 5,
        }
    );
    for e in [
        RuleError::NoPolicies,
        RuleError::TooManyPolicies { count: 5, max: 4 },
        RuleError::MultiPolicyLease,
    ] {
        assert!(!e.to_string().is_empty());
    }
}
