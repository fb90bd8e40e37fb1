//! Scoped limiters: isolation between scopes, all-or-nothing payment, work classes,
//! refusals naming their scope, per-scope counters, and the lock order.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use tokengate::{
    ManualClock, Policy, ScopedLimiter, keyed::Overflow, scope::ApiKeyId, scope::Refusal,
    scope::Request, scope::RouteId, scope::Rule, scope::RuleError, scope::RuleSet, scope::Scope,
    scope::ScopeKind, scope::TenantId, scope::UserId, scope::WorkClass, telemetry::Attempt,
    telemetry::Outcome,
};

use crate::support::p;

fn classes(rules: RuleSet) -> RuleSet {
    rules
        .class(WorkClass::new("metadata", 1))
        .class(WorkClass::new("search", 3))
        .class(WorkClass::new("export", 20))
}

/// Every scope kind with a rule: global 1000, tenant 100, user 50, API key 60, route 500,
/// tenant route 40.
fn full_limiter(clock: &ManualClock) -> ScopedLimiter<ManualClock> {
    classes(
        RuleSet::new()
            .rule(ScopeKind::Global, counted(p(1000, 500.0)))
            .rule(ScopeKind::Tenant, counted(p(100, 20.0)))
            .rule(ScopeKind::User, counted(p(50, 10.0)))
            .rule(ScopeKind::ApiKey, counted(p(60, 10.0)))
            .rule(ScopeKind::Route, counted(p(500, 100.0)))
            .rule(ScopeKind::TenantRoute, counted(p(40, 5.0))),
    )
    .build_with_clock(clock.clone())
    .unwrap()
}

fn everything(t: u64, u: u64) -> Request {
    Request::new()
        .tenant(TenantId(t))
        .user(UserId(u))
        .api_key(ApiKeyId(u + 1000))
        .route(RouteId(7))
}

#[test]
fn one_tenant_draining_its_bucket_does_not_touch_another_tenants() {
    let clock = ManualClock::new();
    let l = classes(RuleSet::new().rule(ScopeKind::Tenant, counted(p(100, 20.0))))
        .build_with_clock(clock.clone())
        .unwrap();
    let search = l.class("search").unwrap();
    let b = Request::new().tenant(TenantId(2));
    assert!(l.try_acquire(&b, search).unwrap().is_admitted());
    let b_word = l.stored_word(&Scope::Tenant(TenantId(2))).unwrap();
    let a = Request::new().tenant(TenantId(1));
    let admitted = (0..100)
        .filter(|_| l.try_acquire(&a, search).unwrap().is_admitted())
        .count();
    assert_eq!(admitted, 33);
    assert_eq!(l.stored_word(&Scope::Tenant(TenantId(2))), Some(b_word));
    assert_eq!(l.available(&Scope::Tenant(TenantId(2))), Some(97.0));
    // The drained tenant's rejections are visible at its own scope.
    let c = l.counters(&Scope::Tenant(TenantId(1))).unwrap();
    assert_eq!(c.original.rejected_requests, 67);
    assert_eq!(
        l.counters(&Scope::Tenant(TenantId(2)))
            .unwrap()
            .original
            .rejected_requests,
        0
    );
}

#[test]
fn the_global_bucket_bounds_the_sum_of_all_tenants() {
    let clock = ManualClock::new();
    let l = classes(
        RuleSet::new()
            .rule(ScopeKind::Global, counted(p(100, 10.0)))
            .rule(ScopeKind::Tenant, counted(p(30, 3.0))),
    )
    .build_with_clock(clock.clone())
    .unwrap();
    let meta = l.class("metadata").unwrap();
    let mut admitted = 0;
    for round in 0..40 {
        for t in 0..10 {
            if l.try_acquire(&Request::new().tenant(TenantId(t)), meta)
                .unwrap()
                .is_admitted()
            {
                admitted += 1;
            }
        }
        if round == 19 {
            clock.advance(Duration::from_secs(1));
        }
    }
    // Ten tenants could take 300 at once plus 30 per second; the global scope allows
    // 100 plus 10 per second (less the rate's rounding down).
    assert_eq!(admitted, 109);
    let g = l.counters(&Scope::Global).unwrap().original;
    assert_eq!(g.admitted_requests, 109);
    assert_eq!(g.rejected_requests, 400 - 109);
}

#[test]
fn a_cost_20_export_is_refused_with_12_tokens_left_while_cost_1_lookups_pass() {
    let clock = ManualClock::new();
    let l = full_limiter(&clock);
    let (meta, export) = (l.class("metadata").unwrap(), l.class("export").unwrap());
    let r = Request::new().tenant(TenantId(5));
    let search = l.class("search").unwrap();
    for _ in 0..4 {
        assert!(l.try_acquire(&r, export).unwrap().is_admitted());
    }
    for _ in 0..2 {
        assert!(l.try_acquire(&r, search).unwrap().is_admitted());
    }
    assert!(l.try_acquire(&r, meta).unwrap().is_admitted()); // 100 - 80 - 6 - 1 = 13
    assert!(l.try_acquire(&r, meta).unwrap().is_admitted());
    assert_eq!(l.available(&Scope::Tenant(TenantId(5))), Some(12.0));
    let d = l.try_acquire(&r, export).unwrap();
    assert!(d.is_rejected());
    assert_eq!(d.refused_scope(), Some(Scope::Tenant(TenantId(5))));
    assert!(d.retry_after().unwrap() >= Duration::from_millis(400)); // 8 tokens at 20/s
    for _ in 0..12 {
        assert!(l.try_acquire(&r, meta).unwrap().is_admitted());
    }
    assert!(l.try_acquire(&r, meta).unwrap().is_rejected());
}

#[test]
fn a_refusal_leaves_every_other_scope_untouched() {
    let clock = ManualClock::new();
    let l = full_limiter(&clock);
    let search = l.class("search").unwrap();
    // Drain tenant 1's tenant-route bucket (40) from another user.
    let drain = Request::new().tenant(TenantId(1)).route(RouteId(7));
    for _ in 0..13 {
        assert!(l.try_acquire(&drain, search).unwrap().is_admitted());
    }
    let r = everything(1, 9);
    assert!(
        l.try_acquire(
            &everything(1, 9).attempt(Attempt::Original),
            l.class("metadata").unwrap()
        )
        .unwrap()
        .is_admitted()
    );
    let scopes = [
        Scope::Global,
        Scope::Tenant(TenantId(1)),
        Scope::User(UserId(9)),
        Scope::ApiKey(ApiKeyId(1009)),
        Scope::Route(RouteId(7)),
        Scope::TenantRoute(TenantId(1), RouteId(7)),
    ];
    let words: Vec<Option<u64>> = scopes.iter().map(|s| l.stored_word(s)).collect();
    let d = l.try_acquire(&r, search).unwrap();
    assert_eq!(
        d.refused_scope(),
        Some(Scope::TenantRoute(TenantId(1), RouteId(7)))
    );
    assert!(matches!(d.refusal(), Some(Refusal::RateLimited(_))));
    // Same tick: every word, rolled back or never touched, is bit for bit the same.
    let after: Vec<Option<u64>> = scopes.iter().map(|s| l.stored_word(s)).collect();
    assert_eq!(words, after);
    // Only the refusing scope counted the rejection.
    for s in &scopes[..5] {
        assert_eq!(l.counters(s).unwrap().original.rejected_requests, 0, "{s}");
    }
    assert_eq!(
        l.counters(&scopes[5]).unwrap().original.rejected_requests,
        1
    );
    // Later, after time moved: balances are exactly what they would be without the try.
    clock.advance(Duration::from_millis(1));
    let before: Vec<Option<f64>> = scopes.iter().map(|s| l.available(s)).collect();
    assert!(l.try_acquire(&r, search).unwrap().is_rejected());
    let after: Vec<Option<f64>> = scopes.iter().map(|s| l.available(s)).collect();
    assert_eq!(before, after);
}

#[test]
fn an_admission_pays_every_scope_and_records_each() {
    let clock = ManualClock::new();
    let l = full_limiter(&clock);
    let search = l.class("search").unwrap();
    let d = l
        .try_acquire(&everything(3, 4).attempt(Attempt::Retry(2)), search)
        .unwrap();
    assert!(d.is_admitted());
    let scopes: Vec<String> = d.scopes().map(|s| s.to_string()).collect();
    assert_eq!(
        scopes,
        [
            "global",
            "tenant:3",
            "user:4",
            "api_key:1004",
            "route:7",
            "tenant:3:route:7"
        ]
    );
    let records: Vec<String> = d.records().map(|r| r.to_string()).collect();
    assert_eq!(records.len(), 6);
    assert_eq!(
        records[1],
        "limiter=tenant:3 result=admitted bucket_capacity=100 refill_per_second=20 \
         token_cost=3 tokens_remaining=97 attempt=retry:2"
    );
    assert!(d.records().all(|r| r.result == Outcome::Admitted));
    for s in d.scopes() {
        let c = l.counters(&s).unwrap();
        assert_eq!(
            (c.retry.admitted_requests, c.retry.admitted_tokens),
            (1, 3),
            "{s}"
        );
        assert_eq!(c.original.requests(), 0);
    }
}

#[test]
fn a_class_may_cost_differently_per_scope_and_zero_skips_a_scope() {
    let clock = ManualClock::new();
    let l = RuleSet::new()
        .rule(ScopeKind::Global, counted(p(100, 1.0)))
        .rule(ScopeKind::Tenant, counted(p(100, 1.0)))
        .rule(ScopeKind::User, counted(p(100, 1.0)))
        .class(
            WorkClass::new("export", 20)
                .with_cost(ScopeKind::Global, 2)
                .with_cost(ScopeKind::User, 0),
        )
        .build_with_clock(clock.clone())
        .unwrap();
    let export = l.class("export").unwrap();
    let r = Request::new().tenant(TenantId(1)).user(UserId(1));
    let d = l.try_acquire(&r, export).unwrap();
    assert!(d.is_admitted());
    assert_eq!(d.cost(Scope::Global), Some(2));
    assert_eq!(d.cost(Scope::Tenant(TenantId(1))), Some(20));
    assert_eq!(d.cost(Scope::User(UserId(1))), None);
    assert_eq!(l.available(&Scope::Global), Some(98.0));
    assert_eq!(l.len(ScopeKind::User), 0); // not consulted, no key created
}

#[test]
fn a_full_map_refuses_new_keys_naming_the_scope_or_shares_an_overflow_bucket() {
    let clock = ManualClock::new();
    let l = RuleSet::new()
        .rule(ScopeKind::Global, counted(p(1000, 1.0)))
        .rule(ScopeKind::User, counted(p(10, 1.0)).max_keys(2))
        .rule(
            ScopeKind::ApiKey,
            counted(p(10, 1.0))
                .max_keys(1)
                .overflow(Overflow::Share(p(3, 1.0))),
        )
        .class(WorkClass::new("metadata", 1))
        .build_with_clock(clock.clone())
        .unwrap();
    let meta = l.class("metadata").unwrap();
    for u in 0..2 {
        assert!(
            l.try_acquire(&Request::new().user(UserId(u)), meta)
                .unwrap()
                .is_admitted()
        );
    }
    let global = l.stored_word(&Scope::Global);
    let d = l
        .try_acquire(&Request::new().user(UserId(99)), meta)
        .unwrap();
    assert_eq!(d.refused_scope(), Some(Scope::User(UserId(99))));
    assert_eq!(d.refusal(), Some(Refusal::KeyLimit { max_keys: 2 }));
    assert_eq!(d.retry_after(), None);
    assert_eq!(l.stored_word(&Scope::Global), global);
    assert_eq!(
        l.overflow_counters(ScopeKind::User)
            .original
            .rejected_requests,
        1
    );

    assert!(
        l.try_acquire(&Request::new().api_key(ApiKeyId(0)), meta)
            .unwrap()
            .is_admitted()
    );
    let shared: Vec<bool> = (1..6)
        .map(|k| {
            l.try_acquire(&Request::new().api_key(ApiKeyId(k)), meta)
                .unwrap()
                .is_admitted()
        })
        .collect();
    assert_eq!(shared, [true, true, true, false, false]);
    let d = l
        .try_acquire(&Request::new().api_key(ApiKeyId(9)), meta)
        .unwrap();
    assert!(d.overflowed(Scope::ApiKey(ApiKeyId(9))));
    assert_eq!(d.records().last().unwrap().bucket_capacity, 3);
}

#[test]
fn a_class_that_could_never_be_admitted_is_a_build_error() {
    let err = RuleSet::new()
        .rule(ScopeKind::Tenant, counted(p(10, 1.0)))
        .class(WorkClass::new("export", 20))
        .build_with_clock(ManualClock::new())
        .unwrap_err();
    assert_eq!(
        err,
        RuleError::CostExceedsCapacity {
            class: "export".into(),
            kind: ScopeKind::Tenant,
            cost: 20,
            capacity: 10
        }
    );
    let dup = RuleSet::new()
        .class(WorkClass::new("a", 1))
        .class(WorkClass::new("a", 2))
        .build_with_clock(ManualClock::new())
        .unwrap_err();
    assert_eq!(dup, RuleError::DuplicateClass("a".into()));
}

/// Readers hold shard locks of several maps at once while writers (new keys, sweeps)
/// queue on the same shards. std's reader-writer lock (under crossbeam's `ShardedLock`)
/// makes new readers wait behind a queued writer, so two requests taking their locks in
/// different orders could each wait for the other forever. Every request takes them in
/// scope-kind order; the watchdog fails the test instead of hanging if that ever breaks.
#[test]
fn overlapping_scope_sets_with_queued_writers_never_deadlock() {
    let clock = ManualClock::new();
    let l = Arc::new(
        classes(
            RuleSet::new()
                .rule(ScopeKind::Tenant, counted(p(1_000_000, 1e6)).shards(1))
                .rule(ScopeKind::User, counted(p(1_000_000, 1e6)).shards(1))
                .rule(ScopeKind::Route, counted(p(1_000_000, 1e6)).shards(1)),
        )
        .build_with_clock(clock)
        .unwrap(),
    );
    let (done, finished) = mpsc::channel();
    let threads = 6;
    for t in 0..threads {
        let l = Arc::clone(&l);
        let done = done.clone();
        std::thread::spawn(move || {
            let meta = l.class("metadata").unwrap();
            for i in 0..3_000u64 {
                // Half the requests name new keys (write locks), all overlap on shards.
                let fresh = if i % 2 == 0 {
                    1_000_000 * (t + 1) + i
                } else {
                    i % 4
                };
                let r = Request::new()
                    .tenant(TenantId(i % 3))
                    .user(UserId(fresh))
                    .route(RouteId(fresh % 5));
                l.try_acquire(&r, meta).unwrap();
                if i % 500 == 0 {
                    l.sweep();
                }
            }
            done.send(()).unwrap();
        });
    }
    for _ in 0..threads {
        finished
            .recv_timeout(Duration::from_secs(120))
            .expect("a thread did not finish: lock-order deadlock");
    }
}

/// Threads paying a tenant and a user each, keys already in their maps (decided on
/// buckets held in reader sections, no lock), while another thread inserts new tenants
/// into the same shard and sweeps (write locks, waiting out the sections): on a frozen
/// clock, exactly the tenant's capacity is admitted, every user pays exactly its own
/// admissions, and every refusal names the tenant.
#[test]
fn held_requests_racing_inserts_and_sweeps_pay_exactly() {
    const CAPACITY: u64 = 20_000;
    const EACH: u64 = 10_000;
    let clock = ManualClock::new();
    let l = Arc::new(
        RuleSet::new()
            .rule(
                ScopeKind::Global,
                counted(p(1_000_000, 1.0)).leased(tokengate::leased::LeaseConfig::new()),
            )
            .rule(ScopeKind::Tenant, counted(p(CAPACITY, 1.0)).shards(1))
            .rule(ScopeKind::User, counted(p(CAPACITY, 1.0)).shards(1))
            .class(WorkClass::new("one", 1))
            .build_with_clock(clock)
            .unwrap(),
    );
    let one = l.class("one").unwrap();
    let threads = 4u64;
    // Every key made first, and given back: full.
    for u in 0..threads {
        let d = l
            .try_acquire(&Request::new().tenant(TenantId(1)).user(UserId(u)), one)
            .unwrap();
        l.refund(&d.charge().unwrap());
    }
    let start = Arc::new(std::sync::Barrier::new(threads as usize + 1));
    let (done, finished) = mpsc::channel();
    for u in 0..threads {
        let (l, done, start) = (Arc::clone(&l), done.clone(), Arc::clone(&start));
        std::thread::spawn(move || {
            let r = Request::new().tenant(TenantId(1)).user(UserId(u));
            let mut admitted = 0u64;
            start.wait();
            for _ in 0..EACH {
                let d = l.try_acquire(&r, one).unwrap();
                if d.is_admitted() {
                    admitted += 1;
                } else {
                    assert_eq!(d.refused_scope(), Some(Scope::Tenant(TenantId(1))));
                }
            }
            done.send((u, admitted)).unwrap();
        });
    }
    let writer = {
        let (l, start) = (Arc::clone(&l), Arc::clone(&start));
        std::thread::spawn(move || {
            start.wait();
            for t in 0..2000u64 {
                let d = l
                    .try_acquire(&Request::new().tenant(TenantId(1_000 + t)), one)
                    .unwrap();
                assert!(d.is_admitted());
                if t % 100 == 0 {
                    l.sweep();
                }
            }
        })
    };
    let mut total = 0;
    for _ in 0..threads {
        let (u, admitted) = finished
            .recv_timeout(Duration::from_secs(120))
            .expect("a thread did not finish");
        assert_eq!(
            l.available(&Scope::User(UserId(u))),
            Some((CAPACITY - admitted) as f64),
            "user {u} paid other than its own {admitted} admissions"
        );
        total += admitted;
    }
    writer.join().unwrap();
    assert_eq!(
        total, CAPACITY,
        "the tenant admitted other than its capacity"
    );
    assert_eq!(l.available(&Scope::Tenant(TenantId(1))), Some(0.0));
    // A sweep that ran before the first take found tenant 1 full and evicted it (its
    // counts moved to the kind's evicted tally, the key made again full): the only
    // tenant a sweep can evict here, as every other one paid a token on a frozen clock.
    let c = l.counters(&Scope::Tenant(TenantId(1))).unwrap();
    let evicted = l.evicted_counters(ScopeKind::Tenant);
    assert!(
        [0, threads].contains(&evicted.original.admitted_tokens),
        "evicted tenants' admissions: {evicted:?}"
    );
    assert_eq!(
        c.original.admitted_tokens + evicted.original.admitted_tokens,
        CAPACITY + threads
    );
    assert_eq!(
        c.original.rejected_requests + evicted.original.rejected_requests,
        threads * EACH - CAPACITY
    );
}

/// A class names the limiter that gave it: another limiter refuses it, even one whose
/// class at that position exists (and would charge another cost), and takes nothing.
#[test]
fn a_class_of_another_limiter_is_refused_as_unknown() {
    let clock = ManualClock::new();
    let build = |classes: [(&str, u64); 3]| {
        classes
            .iter()
            .fold(
                RuleSet::new().rule(ScopeKind::Global, counted(p(100, 1.0))),
                |rules, &(name, cost)| rules.class(WorkClass::new(name, cost)),
            )
            .build_with_clock(clock.clone())
            .unwrap()
    };
    let a = build([("metadata", 1), ("search", 3), ("export", 20)]);
    let b = build([("export", 20), ("search", 3), ("metadata", 1)]);
    let export = a.class("export").unwrap();
    assert_eq!(a.work_class(export).unwrap().name(), "export");
    assert!(b.work_class(export).is_none());
    assert_eq!(
        b.try_acquire(&Request::new(), export).unwrap_err(),
        tokengate::scope::ScopeError::UnknownClass(export)
    );
    assert_eq!(b.available(&Scope::Global), Some(100.0));
    assert!(
        a.try_acquire(&Request::new(), export)
            .unwrap()
            .is_admitted()
    );
    assert_eq!(a.available(&Scope::Global), Some(80.0));
}

/// A rule with per-key counters on (they are off by default), which these tests read.
fn counted(policy: Policy) -> Rule {
    Rule::new(policy).counters(true)
}

#[test]
fn a_scope_decision_is_small() {
    // The request (88 bytes), each kind's balance and tick lead (16 bytes each), the
    // retry time, two references, a few bytes of flags and the generation it paid on
    // (four bytes): no whole `Decision` per kind.
    let size = std::mem::size_of::<tokengate::scope::ScopeDecision<'static>>();
    assert!(size <= 240, "ScopeDecision takes {size} bytes");
}

#[test]
fn a_global_only_request_decides_as_a_bucket_of_its_policy() {
    use tokengate::Bucket;
    let clock = ManualClock::new();
    let policy = p(10, 2.0);
    let limiter = RuleSet::new()
        .rule(ScopeKind::Global, counted(policy))
        .class(WorkClass::new("search", 3))
        .build_with_clock(clock.clone())
        .unwrap();
    let bucket = Bucket::with_clock(policy, clock.clone());
    let search = limiter.class("search").unwrap();
    let (mut admitted, mut rejected) = (0, 0);
    for step in 0..40 {
        let d = limiter.try_acquire(&Request::new(), search).unwrap();
        let expected = bucket.try_acquire(3).unwrap();
        assert_eq!(d.is_admitted(), expected.is_admitted(), "step {step}");
        assert_eq!(d.decision(Scope::Global), Some(expected), "step {step}");
        assert_eq!(d.cost(Scope::Global), Some(3));
        assert_eq!(d.scopes().collect::<Vec<_>>(), [Scope::Global]);
        if expected.is_admitted() {
            admitted += 1;
            assert_eq!(d.retry_after(), None);
            assert_eq!(d.charge().unwrap().cost(ScopeKind::Global), 3);
        } else {
            rejected += 1;
            assert_eq!(d.refused_scope(), Some(Scope::Global));
            assert_eq!(d.refusal(), Some(Refusal::RateLimited(expected)));
            assert_eq!(d.retry_after(), expected.retry_after());
        }
        clock.advance(Duration::from_millis(700));
    }
    assert!(
        admitted > 0 && rejected > 0,
        "{admitted} admitted, {rejected} rejected"
    );
    let c = limiter.counters(&Scope::Global).unwrap();
    assert_eq!(c.original.admitted_tokens, 3 * admitted);
    assert_eq!(c.original.rejected_tokens, 3 * rejected);
}
