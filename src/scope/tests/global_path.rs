//! The global scope's own path ([`ScopedLimiter::try_acquire`] of a request that pays
//! no keyed or remote scope) decides as the keyed kinds' nest does: two limiters built
//! alike, on clocks moved together, one paid on each path, give the same decisions,
//! records, charges, counters and balances.

use std::time::Duration;

use crate::leased::LeaseConfig;
use crate::scope::{Request, Rule, RuleSet, Scope, ScopeKind, ScopedLimiter, TenantId, WorkClass};
use crate::telemetry::Attempt;
use crate::{ManualClock, Policy};

/// A global rule of 10 tokens at 5 per second (leased or not, counting), a tenant rule
/// that a request naming no tenant does not pay, and classes costing 1, 3 and 7.
fn rules(leased: bool) -> RuleSet {
    let policy = Policy::new(10, 5.0).unwrap();
    let mut global = Rule::new(policy).counters(true);
    if leased {
        global = global.leased(LeaseConfig::new());
    }
    RuleSet::new()
        .rule(ScopeKind::Global, global)
        .rule(ScopeKind::Tenant, Rule::new(policy))
        .class(WorkClass::new("one", 1))
        .class(WorkClass::new("three", 3))
        .class(WorkClass::new("seven", 7))
}

/// Everything a caller can read of a decision, as text.
fn seen(limiter: &ScopedLimiter<ManualClock>, d: &crate::scope::ScopeDecision<'_>) -> String {
    let records: Vec<String> = d.records().map(|r| r.to_string()).collect();
    format!(
        "{d:?} scopes={:?} global={:?} cost={:?} charge={:?} records={records:?} \
         available={:?}",
        d.scopes().collect::<Vec<_>>(),
        d.decision(Scope::Global),
        d.cost(Scope::Global),
        d.charge(),
        limiter.available(&Scope::Global),
    )
}

fn same_on_both_paths(leased: bool) {
    let (clock_a, clock_b) = (ManualClock::new(), ManualClock::new());
    let a = rules(leased).build_with_clock(clock_a.clone()).unwrap();
    let b = rules(leased).build_with_clock(clock_b.clone()).unwrap();
    let classes = ["one", "three", "seven"];
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let (mut admitted, mut refused) = (0, 0);
    for i in 0..400 {
        // xorshift: a fixed sequence of costs, attempts and gaps between requests.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let name = classes[(state % 3) as usize];
        let request = match (state >> 8) % 4 {
            0 => Request::new().attempt(Attempt::Retry(1)),
            1 => Request::new()
                .tenant(TenantId(1))
                .attempt(Attempt::Original),
            _ => Request::new(),
        };
        let (class_a, class_b) = (a.class(name).unwrap(), b.class(name).unwrap());
        let (da, db) = if request.tenant.is_some() {
            // A tenant is paid on the nest in both: compared all the same.
            (
                a.try_acquire(&request, class_a),
                b.try_acquire(&request, class_b),
            )
        } else {
            (
                a.try_acquire(&request, class_a),
                b.pay(&request, class_b, &[], true),
            )
        };
        let (da, db) = (da.unwrap(), db.unwrap());
        assert_eq!(seen(&a, &da), seen(&b, &db), "request {i} ({name})");
        if da.is_admitted() {
            admitted += 1;
        } else {
            refused += 1;
        }
        let gap = Duration::from_micros((state >> 20) % 400_000);
        clock_a.advance(gap);
        clock_b.advance(gap);
    }
    assert!(
        admitted > 50 && refused > 50,
        "{admitted} admitted, {refused} refused"
    );
    assert_eq!(a.counters(&Scope::Global), b.counters(&Scope::Global));
    assert!(
        a.counters(&Scope::Global)
            .unwrap()
            .original
            .admitted_requests
            > 0
    );
}

#[test]
fn the_global_path_decides_as_the_nest_does() {
    same_on_both_paths(false);
}

#[test]
fn the_global_path_decides_as_the_nest_does_when_leased() {
    same_on_both_paths(true);
}
