//! A scoped limiter whose global scope is a `LeasedBucket` (`Rule::leased`): it decides
//! as the same limiter with a plain global bucket, counts as it does, and is exact across
//! threads.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tokengate::{
    ManualClock, Policy, ScopedLimiter, leased::LeaseConfig, leased::LeaseConfigError,
    scope::Request, scope::RouteId, scope::Rule, scope::RuleError, scope::RuleSet, scope::Scope,
    scope::ScopeKind, scope::TenantId,
};

use crate::support::p;

/// Global 100 at 10/s (leased or not), tenant 30 at 3/s, tenant route 12 at 2/s, and
/// classes costing 1, 3 and 7 (the last 2 in the global scope).
fn limiter(clock: &ManualClock, lease: Option<LeaseConfig>) -> ScopedLimiter<ManualClock> {
    let mut global = counted(p(100, 10.0));
    if let Some(config) = lease {
        global = global.leased(config);
    }
    RuleSet::new()
        .rule(ScopeKind::Global, global)
        .rule(ScopeKind::Tenant, counted(p(30, 3.0)))
        .rule(ScopeKind::TenantRoute, counted(p(12, 2.0)))
        .class(tokengate::scope::WorkClass::new("one", 1))
        .class(tokengate::scope::WorkClass::new("three", 3))
        .class(tokengate::scope::WorkClass::new("seven", 7).with_cost(ScopeKind::Global, 2))
        .build_with_clock(clock.clone())
        .unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        tenant: u64,
        route: Option<u64>,
        class: usize,
    },
    Advance(u64),
    Sweep,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..6u64, proptest::option::of(0..2u64), 0..3usize)
            .prop_map(|(tenant, route, class)| Op::Acquire { tenant, route, class }),
        3 => (0..400u64).prop_map(Op::Advance),
        1 => Just(Op::Sweep),
    ]
}

fn lease_config() -> impl Strategy<Value = LeaseConfig> {
    (0..4u32, 1..=20u64).prop_map(|(log_slots, max_lease)| {
        LeaseConfig::new()
            .slots(1 << log_slots)
            .max_lease(max_lease)
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// One thread, the same requests at the same times: a leased global scope admits
    /// and refuses exactly as a plain one (a refusal names the same scope and the same
    /// wait), the balances agree, and the counters agree. The global scope's own
    /// refusing decision may report less (tokens idle in slots left out), never more.
    #[test]
    fn a_leased_global_scope_decides_as_a_plain_one(
        config in lease_config(),
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let (pc, lc) = (ManualClock::new(), ManualClock::new());
        let plain = limiter(&pc, None);
        let leased = limiter(&lc, Some(config));
        prop_assert!(leased.global_is_leased() && !plain.global_is_leased());
        let names = ["one", "three", "seven"];
        for (step, op) in ops.iter().enumerate() {
            match *op {
                Op::Acquire { tenant, route, class } => {
                    let mut r = Request::new().tenant(TenantId(tenant));
                    if let Some(route) = route {
                        r = r.route(RouteId(route));
                    }
                    let a = plain.try_acquire(&r, plain.class(names[class]).unwrap()).unwrap();
                    let b = leased.try_acquire(&r, leased.class(names[class]).unwrap()).unwrap();
                    prop_assert_eq!(a.is_admitted(), b.is_admitted(), "step {}: {:?}", step, op);
                    prop_assert_eq!(a.refused_scope(), b.refused_scope(), "step {}", step);
                    prop_assert_eq!(a.retry_after(), b.retry_after(), "step {}", step);
                    // The global scope's own decision: a leased refusal's balance leaves
                    // out the tokens idle in slots when even full slots could not pay.
                    if let (Some(da), Some(db)) = (a.decision(Scope::Global), b.decision(Scope::Global)) {
                        prop_assert_eq!(da.is_admitted(), db.is_admitted());
                        if da.is_rejected() {
                            prop_assert!(db.tokens_remaining() <= da.tokens_remaining());
                            prop_assert!(db.retry_after() >= da.retry_after());
                        }
                    }
                }
                Op::Advance(ms) => {
                    pc.advance(Duration::from_millis(ms));
                    lc.advance(Duration::from_millis(ms));
                }
                Op::Sweep => {
                    plain.sweep();
                    leased.sweep();
                    prop_assert_eq!(leased.global_leased_tokens(), 0);
                }
            }
            prop_assert_eq!(
                plain.available(&Scope::Global),
                leased.available(&Scope::Global),
                "step {}", step
            );
        }
        prop_assert_eq!(plain.counters(&Scope::Global), leased.counters(&Scope::Global));
    }
}

#[test]
fn leasing_is_for_the_global_scope_with_a_config_that_fits() {
    let kinds = [
        ScopeKind::Tenant,
        ScopeKind::User,
        ScopeKind::ApiKey,
        ScopeKind::Route,
        ScopeKind::TenantRoute,
    ];
    for kind in kinds {
        let err = RuleSet::new()
            .rule(ScopeKind::Global, counted(p(100, 10.0)))
            .rule(kind, counted(p(100, 10.0)).leased(LeaseConfig::new()))
            .build()
            .unwrap_err();
        assert_eq!(err, RuleError::LeasedNotGlobal { kind });
        assert!(err.to_string().contains("only the global scope"), "{err}");
    }
    let err = RuleSet::new()
        .rule(
            ScopeKind::Global,
            counted(p(100, 10.0)).leased(LeaseConfig::new().slots(3)),
        )
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        RuleError::Lease(LeaseConfigError::SlotsOutOfRange { slots: 3 })
    );
    let err = RuleSet::new()
        .rule(
            ScopeKind::Global,
            counted(p(100, 10.0)).leased(LeaseConfig::new().max_lease(101)),
        )
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err,
            RuleError::Lease(LeaseConfigError::LeaseOutOfRange { max_lease: 101, .. })
        ),
        "{err:?}"
    );
    assert!(std::error::Error::source(&err).is_some());
}

#[test]
fn a_leased_global_scope_counts_reports_and_sweeps() {
    let clock = ManualClock::new();
    let config = LeaseConfig::new().slots(2).max_lease(10);
    let l = limiter(&clock, Some(config));
    let one = l.class("one").unwrap();
    let r = Request::new().tenant(TenantId(1));
    assert!(l.try_acquire(&r, one).unwrap().is_admitted());
    // The admission leased a batch to this thread's slot; it still counts as available.
    assert!(l.global_leased_tokens() > 0);
    assert_eq!(l.available(&Scope::Global), Some(99.0));
    // Drain the global scope from tenants that each pay a little.
    let mut admitted = 1;
    for t in 2..200 {
        let r = Request::new().tenant(TenantId(t));
        if l.try_acquire(&r, one).unwrap().is_admitted() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 100, "exactly the global capacity");
    let d = l
        .try_acquire(&Request::new().tenant(TenantId(500)), one)
        .unwrap();
    assert_eq!(d.refused_scope(), Some(Scope::Global));
    assert!(d.retry_after().unwrap() >= Duration::from_millis(100));
    let c = l.counters(&Scope::Global).unwrap().original;
    assert_eq!((c.admitted_requests, c.admitted_tokens), (100, 100));
    assert_eq!(c.rejected_requests, 200 - 100);

    // A sweep returns slot tokens and stores the global word at the current tick.
    clock.advance(Duration::from_secs(2));
    let word = l.stored_word(&Scope::Global).unwrap();
    l.sweep();
    assert_eq!(l.global_leased_tokens(), 0);
    assert_ne!(l.stored_word(&Scope::Global), Some(word), "re-anchored");
    // Two seconds at 10/s, less the rate's rounding down.
    let refilled = l.available(&Scope::Global).unwrap();
    assert!((19.9..=20.0).contains(&refilled), "{refilled}");
}

#[test]
fn threads_on_a_leased_global_scope_admit_exactly_its_balance() {
    // A frozen clock: whatever the interleaving, the threads together admit the global
    // capacity exactly (tokens stranded in other threads' slots are reclaimed before a
    // refusal), and the counters agree.
    let clock = ManualClock::new();
    let l = Arc::new(
        RuleSet::new()
            .rule(
                ScopeKind::Global,
                counted(p(5_000, 1.0)).leased(LeaseConfig::new().slots(4).max_lease(64)),
            )
            .rule(ScopeKind::Tenant, counted(p(100_000, 1.0)))
            .class(tokengate::scope::WorkClass::new("one", 1))
            .build_with_clock(clock)
            .unwrap(),
    );
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let l = l.clone();
            std::thread::spawn(move || {
                let one = l.class("one").unwrap();
                let r = Request::new().tenant(TenantId(t));
                (0..2_000)
                    .filter(|_| l.try_acquire(&r, one).unwrap().is_admitted())
                    .count()
            })
        })
        .collect();
    let admitted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(admitted, 5_000);
    let c = l.counters(&Scope::Global).unwrap().original;
    assert_eq!(c.admitted_requests, 5_000);
    assert_eq!(c.rejected_requests, 8_000 - 5_000);
    assert_eq!(l.available(&Scope::Global), Some(0.0));
}

#[test]
fn a_set_a_leased_bucket_cannot_pay_is_refused_without_a_write() {
    use tokengate::{Bucket, LeasedBucket, acquire_all, multi::Member, multi::acquire_all_with};
    let clock = ManualClock::new();
    let config = LeaseConfig::new().slots(2).max_lease(4);
    // The tenant bucket is taken first (lower address): without a read-only first pass
    // it would be taken and refunded, storing a later tick, before the leased bucket
    // refused.
    let (hot, tenant) = (0..64)
        .map(|_| {
            let tenant = Box::new(Bucket::with_clock(p(100, 1.0), clock.clone()));
            let hot =
                Box::new(LeasedBucket::with_config(p(20, 1.0), clock.clone(), config).unwrap());
            (hot, tenant)
        })
        .find(|(hot, tenant)| tenant.id() < hot.id())
        .expect("a tenant bucket below the leased one in memory");
    let (hot_m, tenant_m): (&dyn Member, &dyn Member) = (&*hot, &*tenant);
    // This thread's slot leases 4 and spends 1; 15 are left in the global word.
    assert!(
        acquire_all(&[(hot_m, 1), (tenant_m, 1)])
            .unwrap()
            .is_admitted()
    );
    assert_eq!(hot.leased_tokens(), 4);
    // Later (the lease has expired): a take of the tenant bucket now would store the new
    // tick even if refunded at once.
    clock.advance(Duration::from_millis(10));
    let words = || {
        (
            hot.stored_word(),
            hot.slot_words()[0],
            hot.slot_words()[1],
            tenant.stored_word(),
        )
    };
    let before = words();
    // About 19 left in all: a cost of 20 is refused by the read-only first pass, which
    // observes the leased bucket alone and writes nothing.
    let mut observed = Vec::new();
    let d = acquire_all_with(&[(tenant_m, 1), (hot_m, 20)], |i, d| {
        observed.push((i, d.is_admitted()))
    })
    .unwrap();
    assert_eq!(observed, [(1, false)]);
    assert_eq!(d.refused_index(), Some(1));
    let left = d.refused_decision().unwrap().tokens_remaining();
    assert!(left > 19.0 && left < 19.1, "{left}");
    assert_eq!(words(), before);
    // A cost the slots' tokens make payable is admitted (reclaiming the slot).
    assert!(
        acquire_all(&[(tenant_m, 1), (hot_m, 19)])
            .unwrap()
            .is_admitted()
    );
    assert!(hot.available() < 1.0);
}

/// A manual clock that counts its readings.
#[derive(Clone)]
struct Counted {
    inner: ManualClock,
    reads: Arc<std::sync::atomic::AtomicUsize>,
}

impl tokengate::Clock for Counted {
    fn now_nanos(&self) -> u64 {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.now_nanos()
    }
}

#[test]
fn a_scoped_request_reads_the_clock_once() {
    for lease in [None, Some(LeaseConfig::new().slots(2).max_lease(8))] {
        let clock = Counted {
            inner: ManualClock::new(),
            reads: Arc::default(),
        };
        let mut global = counted(p(1000, 10.0));
        if let Some(config) = lease {
            global = global.leased(config);
        }
        let l = RuleSet::new()
            .rule(ScopeKind::Global, global)
            .rule(ScopeKind::Tenant, counted(p(100, 3.0)))
            .rule(ScopeKind::TenantRoute, counted(p(50, 2.0)))
            .class(tokengate::scope::WorkClass::new("one", 1))
            .build_with_clock(clock.clone())
            .unwrap();
        let one = l.class("one").unwrap();
        let r = Request::new().tenant(TenantId(1)).route(RouteId(2));
        assert!(l.try_acquire(&r, one).unwrap().is_admitted()); // inserts the keys
        for _ in 0..5 {
            let before = clock.reads.load(std::sync::atomic::Ordering::Relaxed);
            assert!(l.try_acquire(&r, one).unwrap().is_admitted());
            let reads = clock.reads.load(std::sync::atomic::Ordering::Relaxed) - before;
            assert_eq!(reads, 1, "leased global: {}", lease.is_some());
        }
    }
}

/// A rule with per-key counters on (they are off by default), which these tests read.
fn counted(policy: Policy) -> Rule {
    Rule::new(policy).counters(true)
}

/// A sweep re-anchors a leased global scope near its cap as it does a plain one: at the
/// refilled state's own tick, so that it goes on refilling exactly as before. Anchored
/// at the next tick edge (as a credit near the cap is), it read 99.992 two milliseconds
/// later where the plain scope read 100 (found by the property test above).
#[test]
fn a_sweep_near_the_cap_reanchors_a_leased_global_scope_as_a_plain_one() {
    let (pc, lc) = (ManualClock::new(), ManualClock::new());
    let plain = limiter(&pc, None);
    let leased = limiter(&lc, Some(LeaseConfig::new().slots(1).max_lease(1)));
    let advance = |ms| {
        pc.advance(Duration::from_millis(ms));
        lc.advance(Duration::from_millis(ms));
    };
    advance(74);
    let r = Request::new().tenant(TenantId(0));
    let a = plain
        .try_acquire(&r, plain.class("seven").unwrap())
        .unwrap();
    let b = leased
        .try_acquire(&r, leased.class("seven").unwrap())
        .unwrap();
    assert!(a.is_admitted() && b.is_admitted());
    advance(201);
    plain.sweep();
    leased.sweep();
    let global = |l: &ScopedLimiter<ManualClock>| l.available(&Scope::Global);
    assert!(global(&plain).unwrap() < 100.0);
    assert_eq!(global(&plain), global(&leased));
    advance(2);
    assert_eq!(global(&plain), Some(100.0));
    assert_eq!(global(&plain), global(&leased));
}
