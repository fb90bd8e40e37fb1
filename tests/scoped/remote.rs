//! Keyed scope kinds kept in a remote store (`Rule::remote`, `RemoteScopes`): local scopes
//! paid first, the store after, every local cost given back when the store refuses or
//! cannot decide, and no call to the store for requests that name no remote scope.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokengate::leased::LeaseConfig;
use tokengate::scope::{
    ApiKeyId, Refusal, RemoteRefusal, RemoteScopes, Request, RouteId, Rule, RuleError, RuleSet,
    Scope, ScopeError, ScopeKind, ScopeReserveError, TenantId, UserId, WorkClass,
};
use tokengate::{ManualClock, Policy, ScopedLimiter};

use crate::support::p;

/// The wait the fake store gives for a refusal.
const STORE_WAIT: Duration = Duration::from_secs(7);

/// An in-memory store: a fixed number of tokens per scope (no refill), all or none,
/// counting its calls; `down` makes it unavailable.
#[derive(Default)]
struct Fake {
    budget: u64,
    spent: Mutex<HashMap<Scope, u64>>,
    takes: AtomicUsize,
    given_back: Mutex<Vec<(Scope, u64)>>,
    down: AtomicBool,
}

impl Fake {
    fn new(budget: u64) -> Arc<Fake> {
        Arc::new(Fake {
            budget,
            ..Fake::default()
        })
    }

    fn spent(&self, scope: Scope) -> u64 {
        self.spent.lock().unwrap().get(&scope).copied().unwrap_or(0)
    }

    fn takes(&self) -> usize {
        self.takes.load(Ordering::SeqCst)
    }
}

impl RemoteScopes for Fake {
    fn take(&self, items: &[(Scope, u64)]) -> Result<(), RemoteRefusal> {
        self.takes.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(RemoteRefusal::Unavailable {
                retry_after: Duration::from_secs(3),
            });
        }
        let mut spent = self.spent.lock().unwrap();
        for &(scope, cost) in items {
            if spent.get(&scope).copied().unwrap_or(0) + cost > self.budget {
                return Err(RemoteRefusal::Refused {
                    scope,
                    retry_after: STORE_WAIT,
                });
            }
        }
        for &(scope, cost) in items {
            *spent.entry(scope).or_default() += cost;
        }
        Ok(())
    }

    fn give_back(&self, items: &[(Scope, u64)]) {
        let mut spent = self.spent.lock().unwrap();
        for &(scope, cost) in items {
            if let Some(s) = spent.get_mut(&scope) {
                *s = s.saturating_sub(cost);
            }
            self.given_back.lock().unwrap().push((scope, cost));
        }
    }
}

/// Global 100 (leased or plain), user 10 with two policies, route 50 local; tenant 1000
/// by its rule and kept remote; class "search" costs 3.
fn rules(leased: bool) -> RuleSet {
    let global = Rule::new(p(100, 10.0)).counters(true);
    RuleSet::new()
        .rule(
            ScopeKind::Global,
            if leased {
                global.leased(LeaseConfig::new())
            } else {
                global
            },
        )
        .rule(ScopeKind::Tenant, Rule::new(p(1000, 100.0)).remote())
        .rule(
            ScopeKind::User,
            Rule::with_policies(vec![p(10, 1.0), p(20, 1.0)]).unwrap(),
        )
        .rule(ScopeKind::Route, Rule::new(p(50, 5.0)))
        .class(WorkClass::new("search", 3))
}

fn limiter(leased: bool, store: &Arc<Fake>) -> ScopedLimiter<ManualClock> {
    rules(leased)
        .remote_scopes(store.clone())
        .build_with_clock(ManualClock::new())
        .unwrap()
}

/// Every local bucket the request `r` pays, each limit's balance.
fn local_balances(l: &ScopedLimiter<ManualClock>, r: &Request) -> Vec<Option<f64>> {
    let user = Scope::User(r.user.unwrap());
    let route = Scope::Route(r.route.unwrap());
    vec![
        l.available(&Scope::Global),
        l.available_in(&user, 0),
        l.available_in(&user, 1),
        l.available(&route),
    ]
}

#[test]
fn a_remote_refusal_gives_every_local_scope_its_cost_back() {
    for leased in [false, true] {
        let store = Fake::new(6);
        let l = limiter(leased, &store);
        let search = l.class("search").unwrap();
        let r = Request::new()
            .tenant(TenantId(1))
            .user(UserId(2))
            .route(RouteId(3));
        for _ in 0..2 {
            assert!(l.try_acquire(&r, search).unwrap().is_admitted());
        }
        assert_eq!(store.spent(Scope::Tenant(TenantId(1))), 6);
        let before = local_balances(&l, &r);
        assert_eq!(
            before,
            [Some(94.0), Some(4.0), Some(14.0), Some(44.0)],
            "leased {leased}"
        );
        let d = l.try_acquire(&r, search).unwrap();
        assert!(d.is_rejected());
        assert_eq!(d.refused_scope(), Some(Scope::Tenant(TenantId(1))));
        assert_eq!(
            d.refusal(),
            Some(Refusal::Remote {
                retry_after: STORE_WAIT
            })
        );
        assert_eq!(d.retry_after(), Some(STORE_WAIT));
        assert_eq!(d.refused_limit(), None);
        assert_eq!(d.charge(), None);
        assert_eq!(d.records().count(), 0);
        assert_eq!(local_balances(&l, &r), before, "leased {leased}");
        assert_eq!(store.spent(Scope::Tenant(TenantId(1))), 6);
        assert_eq!(store.takes(), 3);
    }
}

#[test]
fn an_unavailable_store_is_a_typed_error_and_the_local_scopes_are_given_back() {
    for leased in [false, true] {
        let store = Fake::new(100);
        let l = limiter(leased, &store);
        let search = l.class("search").unwrap();
        let r = Request::new()
            .tenant(TenantId(1))
            .user(UserId(2))
            .route(RouteId(3));
        assert!(l.try_acquire(&r, search).unwrap().is_admitted());
        let before = local_balances(&l, &r);
        store.down.store(true, Ordering::SeqCst);
        assert_eq!(
            l.try_acquire(&r, search).unwrap_err(),
            ScopeError::RemoteUnavailable {
                retry_after: Duration::from_secs(3)
            }
        );
        assert_eq!(local_balances(&l, &r), before, "leased {leased}");
        store.down.store(false, Ordering::SeqCst);
        assert!(l.try_acquire(&r, search).unwrap().is_admitted());
    }
}

#[test]
fn requests_without_remote_scopes_never_call_the_store() {
    let store = Fake::new(100);
    let l = limiter(false, &store);
    let search = l.class("search").unwrap();
    let requests = [
        Request::new(),
        Request::new().user(UserId(1)),
        Request::new().user(UserId(1)).route(RouteId(9)),
        Request::new().api_key(ApiKeyId(4)),
    ];
    for r in &requests {
        assert!(l.try_acquire(r, search).unwrap().is_admitted());
    }
    // A remote kind skipped by the caller is not asked either.
    let tenant = Request::new().tenant(TenantId(5));
    assert!(
        l.try_acquire_without(&tenant, search, &[ScopeKind::Tenant])
            .unwrap()
            .is_admitted()
    );
    assert_eq!(store.takes(), 0);
    // A request refused by a local scope never reaches the store.
    let user = Request::new().tenant(TenantId(5)).user(UserId(8));
    for _ in 0..3 {
        assert!(l.try_acquire(&user, search).unwrap().is_admitted());
    }
    assert_eq!(store.takes(), 3);
    let d = l.try_acquire(&user, search).unwrap();
    assert_eq!(d.refused_scope(), Some(Scope::User(UserId(8))));
    assert_eq!(store.takes(), 3);
    assert_eq!(store.spent(Scope::Tenant(TenantId(5))), 9);
}

#[test]
fn an_admission_pays_the_remote_scopes_and_a_refund_gives_them_back() {
    let store = Fake::new(100);
    let l = limiter(false, &store);
    let search = l.class("search").unwrap();
    let r = Request::new().tenant(TenantId(1)).user(UserId(2));
    let d = l.try_acquire(&r, search).unwrap();
    assert!(d.is_admitted());
    assert_eq!(
        d.scopes().collect::<Vec<_>>(),
        [
            Scope::Global,
            Scope::Tenant(TenantId(1)),
            Scope::User(UserId(2))
        ]
    );
    assert_eq!(d.cost(Scope::Tenant(TenantId(1))), Some(3));
    // No local bucket decides a remote scope.
    assert_eq!(d.decision(Scope::Tenant(TenantId(1))), None);
    assert!(d.decision(Scope::User(UserId(2))).is_some());
    let charge = d.charge().unwrap();
    assert_eq!(charge.cost(ScopeKind::Tenant), 3);
    assert_eq!(store.spent(Scope::Tenant(TenantId(1))), 3);
    l.refund(&charge);
    assert_eq!(store.spent(Scope::Tenant(TenantId(1))), 0);
    assert_eq!(
        *store.given_back.lock().unwrap(),
        [(Scope::Tenant(TenantId(1)), 3)]
    );
    assert_eq!(l.available(&Scope::Global), Some(100.0));
    // The remote kind keeps its rule's policies but no local map.
    assert_eq!(l.len(ScopeKind::Tenant), 0);
    assert_eq!(l.available(&Scope::Tenant(TenantId(1))), None);
    assert_eq!(
        l.policy(ScopeKind::Tenant).map(Policy::capacity),
        Some(1000)
    );
    assert_eq!(l.remote_kinds().collect::<Vec<_>>(), [ScopeKind::Tenant]);
}

#[test]
fn a_refusal_naming_a_scope_not_asked_names_the_first_remote_scope() {
    struct Odd;
    impl RemoteScopes for Odd {
        fn take(&self, _: &[(Scope, u64)]) -> Result<(), RemoteRefusal> {
            Err(RemoteRefusal::Refused {
                scope: Scope::Global,
                retry_after: Duration::MAX,
            })
        }
        fn give_back(&self, _: &[(Scope, u64)]) {}
    }
    let l = RuleSet::new()
        .rule(ScopeKind::Global, Rule::new(p(10, 1.0)))
        .rule(ScopeKind::User, Rule::new(p(10, 1.0)).remote())
        .rule(ScopeKind::Route, Rule::new(p(10, 1.0)).remote())
        .class(WorkClass::new("one", 1))
        .remote_scopes(Arc::new(Odd))
        .build_with_clock(ManualClock::new())
        .unwrap();
    let one = l.class("one").unwrap();
    let d = l
        .try_acquire(&Request::new().user(UserId(1)).route(RouteId(2)), one)
        .unwrap();
    assert_eq!(d.refused_scope(), Some(Scope::User(UserId(1))));
    assert_eq!(d.retry_after(), Some(Duration::MAX));
    assert_eq!(l.available(&Scope::Global), Some(10.0));
}

#[test]
fn reserving_ahead_refuses_a_request_with_a_remote_scope() {
    let store = Fake::new(100);
    let l = Arc::new(limiter(false, &store));
    let search = l.class("search").unwrap();
    let err = l
        .reserve_owned(
            &Request::new().tenant(TenantId(1)).user(UserId(2)),
            search,
            Duration::ZERO,
        )
        .unwrap_err();
    assert_eq!(
        err,
        ScopeReserveError::RemoteScope {
            scope: Scope::Tenant(TenantId(1))
        }
    );
    assert_eq!(l.available(&Scope::Global), Some(100.0));
    assert_eq!(store.takes(), 0);
    let local = l
        .reserve_owned(&Request::new().user(UserId(2)), search, Duration::ZERO)
        .unwrap();
    assert!(local.is_ready());
}

#[test]
fn building_checks_the_remote_kinds() {
    let store: Arc<dyn RemoteScopes> = Fake::new(1);
    assert_eq!(
        rules(false).build().unwrap_err(),
        RuleError::RemoteWithoutStore {
            kind: ScopeKind::Tenant
        }
    );
    assert_eq!(
        RuleSet::new()
            .rule(ScopeKind::Global, Rule::new(p(10, 1.0)).remote())
            .build_with_remote(store.clone())
            .unwrap_err(),
        RuleError::RemoteGlobal
    );
    assert_eq!(
        rules(false)
            .tier("gold", vec![p(2000, 100.0)])
            .override_key(Scope::Tenant(TenantId(7)), "gold")
            .build_with_remote(store.clone())
            .unwrap_err(),
        RuleError::RemoteOverride {
            scope: Scope::Tenant(TenantId(7))
        }
    );
    // A remote kind's rule still bounds the classes' costs.
    assert!(matches!(
        rules(false)
            .class(WorkClass::new("huge", 30).with_cost(ScopeKind::Tenant, 1001))
            .build_with_remote(store.clone())
            .unwrap_err(),
        RuleError::CostExceedsCapacity {
            kind: ScopeKind::Tenant,
            cost: 1001,
            ..
        }
    ));
    // A store with no remote kind is never used.
    let plain = RuleSet::new()
        .rule(ScopeKind::Tenant, Rule::new(p(10, 1.0)))
        .class(WorkClass::new("one", 1))
        .build_with_remote(store.clone())
        .unwrap();
    assert_eq!(plain.remote_kinds().count(), 0);
    assert!(
        plain
            .try_acquire(
                &Request::new().tenant(TenantId(1)),
                plain.class("one").unwrap()
            )
            .unwrap()
            .is_admitted()
    );
    assert!(rules(true).build_with_remote(store).is_ok());
}
