//! A `ScopedLimiter` whose tenant scopes live in Redis (`RedisScopeKinds`) while its
//! leased global scope and its user scopes stay local, against the real Redis on
//! 127.0.0.1:6379: two limiters (two instances) share one tenant budget.

mod common;

use std::sync::Arc;

use tokengate::leased::LeaseConfig;
use tokengate::scope::{
    Refusal, Request, Rule, RuleSet, Scope, ScopeKind, TenantId, UserId, WorkClass,
};
use tokengate::{ManualClock, Policy, ScopedLimiter};
use tokengate_redis::{PoolConfig, RedisScopeKinds, RedisScopes, RemotePolicy, UNITS_PER_TOKEN};

/// The tenant budget, tokens.
const B: u64 = 10;

/// Refills 1 milli-token per second: less than a token within a test.
fn still_rate() -> f64 {
    0.001
}

/// One instance: a leased global scope of 1000 and users of 100 (local, on a manual
/// clock: they never refill), tenants of `B` in Redis under namespace `ns`.
fn instance(ns: &str) -> (ScopedLimiter<ManualClock>, Arc<RedisScopeKinds>) {
    let redis = RedisScopes::connect(PoolConfig::new(common::url(), ns)).unwrap();
    let store = Arc::new(
        RedisScopeKinds::new(redis)
            .kind(
                ScopeKind::Tenant,
                RemotePolicy::new(B, still_rate()).unwrap(),
            )
            .unwrap(),
    );
    let limiter = RuleSet::new()
        .rule(
            ScopeKind::Global,
            Rule::new(Policy::new(1000, 1.0).unwrap()).leased(LeaseConfig::new()),
        )
        .rule(
            ScopeKind::Tenant,
            Rule::new(Policy::new(B, 1.0).unwrap()).remote(),
        )
        .rule(ScopeKind::User, Rule::new(Policy::new(100, 1.0).unwrap()))
        .class(WorkClass::new("one", 1))
        .remote_scopes(store.clone())
        .build_with_clock(ManualClock::new())
        .unwrap();
    (limiter, store)
}

fn balance(con: &mut redis::Connection, key: &str) -> Option<u64> {
    let u: Option<u64> = redis::cmd("HGET").arg(key).arg("u").query(con).unwrap();
    u.map(|u| u / UNITS_PER_TOKEN)
}

#[test]
fn two_limiters_share_a_tenant_budget_in_redis_and_keep_their_global_scopes_local() {
    let ns = common::namespace("scoped-share");
    let (a, store) = instance(&ns);
    let (b, _) = instance(&ns);
    assert!(a.global_is_leased() && b.global_is_leased());
    let one = (a.class("one").unwrap(), b.class("one").unwrap());
    let tenant = TenantId(42);
    let mut admitted = [0u64; 2];
    for i in 0..3 * B {
        let (limiter, class, n) = if i % 2 == 0 {
            (&a, one.0, 0)
        } else {
            (&b, one.1, 1)
        };
        let request = Request::new().tenant(tenant).user(UserId(i % 3));
        let d = limiter.try_acquire(&request, class).unwrap();
        if d.is_admitted() {
            admitted[n] += 1;
        } else {
            assert_eq!(d.refused_scope(), Some(Scope::Tenant(tenant)));
            assert!(matches!(d.refusal(), Some(Refusal::Remote { .. })));
            assert!(d.retry_after().is_some());
        }
    }
    // Together at most B (the refill adds less than a token), and both took part.
    assert_eq!(admitted.iter().sum::<u64>(), B, "{admitted:?}");
    assert!(admitted[0] > 0 && admitted[1] > 0, "{admitted:?}");
    // Each global scope is local: it paid its own admissions only, the refused requests
    // given back.
    assert_eq!(
        a.available(&Scope::Global),
        Some(1000.0 - admitted[0] as f64)
    );
    assert_eq!(
        b.available(&Scope::Global),
        Some(1000.0 - admitted[1] as f64)
    );
    // And so are the users: each instance's user 0 paid only there.
    let users = |l: &ScopedLimiter<ManualClock>| {
        (0..3)
            .map(|u| 100.0 - l.available(&Scope::User(UserId(u))).unwrap())
            .sum::<f64>()
    };
    assert_eq!(users(&a), admitted[0] as f64);
    assert_eq!(users(&b), admitted[1] as f64);
    // Redis holds the tenant's bucket and nothing of the global or user scopes.
    let mut con = common::connect();
    let key = store.key(&Scope::Tenant(tenant)).unwrap();
    assert_eq!(balance(&mut con, &key), Some(0));
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("tg:{{{ns}*"))
        .query(&mut con)
        .unwrap();
    assert!(keys.contains(&key), "{keys:?}");
    for k in &keys {
        assert!(k == &key || k.ends_with(":fleet"), "unexpected key {k}");
    }
}

#[test]
fn a_refund_gives_the_tenant_its_tokens_back_in_redis() {
    let ns = common::namespace("scoped-refund");
    let (a, store) = instance(&ns);
    let (b, _) = instance(&ns);
    let request = Request::new().tenant(TenantId(7));
    let mut charges = Vec::new();
    for _ in 0..B {
        let d = a.try_acquire(&request, a.class("one").unwrap()).unwrap();
        charges.push(d.charge().unwrap());
    }
    let mut con = common::connect();
    let key = store.key(&Scope::Tenant(TenantId(7))).unwrap();
    assert_eq!(balance(&mut con, &key), Some(0));
    assert!(
        b.try_acquire(&request, b.class("one").unwrap())
            .unwrap()
            .is_rejected()
    );
    for c in &charges[..3] {
        a.refund(c);
    }
    assert_eq!(balance(&mut con, &key), Some(3));
    assert_eq!(a.available(&Scope::Global), Some(1000.0 - (B - 3) as f64));
    // The other instance may now spend what was given back.
    for _ in 0..3 {
        assert!(
            b.try_acquire(&request, b.class("one").unwrap())
                .unwrap()
                .is_admitted()
        );
    }
    assert!(
        b.try_acquire(&request, b.class("one").unwrap())
            .unwrap()
            .is_rejected()
    );
}
