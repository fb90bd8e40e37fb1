//! The held path (a request whose keyed buckets are all found in reader sections, see
//! [`held`](crate::scope::held)) decides as the locked path does: two limiters built alike, on
//! clocks moved together, one paid through [`ScopedLimiter::try_acquire`] and the other
//! always through the locked path, give the same decisions, records, charges, counters
//! and balances, for requests naming any set of kinds, keys of a tier among them.

use std::cell::Cell;
use std::time::Duration;

use crate::leased::LeaseConfig;
use crate::scope::{
    ApiKeyId, Request, RouteId, Rule, RuleSet, Scope, ScopeDecision, ScopeKind, ScopedLimiter,
    TenantId, UserId, WorkClass,
};
use crate::telemetry::Attempt;
use crate::{ManualClock, Policy};

std::thread_local! {
    /// Requests this thread's limiters decided on the held path.
    static HELD: Cell<u64> = const { Cell::new(0) };
}

/// Counts a request decided on the held path (this thread's, for the tests below).
pub(in crate::scope) fn count_held() {
    HELD.with(|h| h.set(h.get() + 1));
}

fn held() -> u64 {
    HELD.with(Cell::get)
}

/// A global rule (leased or not) of 40 tokens at 30 per second, counting; tenants of 6
/// tokens at 4 per second, counting, tenant 2 in a tier of 12 tokens; users of 5 at 3,
/// API keys of 4 at 2, tenant routes of 3 at 2; classes costing 1, 3 (none in the user
/// scope) and 2 (3 in the tenant scope).
fn rules(leased: bool) -> RuleSet {
    let mut global = Rule::new(Policy::new(40, 30.0).unwrap()).counters(true);
    if leased {
        global = global.leased(LeaseConfig::new());
    }
    RuleSet::new()
        .rule(ScopeKind::Global, global)
        .rule(
            ScopeKind::Tenant,
            Rule::new(Policy::new(6, 4.0).unwrap())
                .counters(true)
                .shards(2),
        )
        .rule(ScopeKind::User, Rule::new(Policy::new(5, 3.0).unwrap()))
        .rule(
            ScopeKind::ApiKey,
            Rule::new(Policy::new(4, 2.0).unwrap()).counters(true),
        )
        .rule(
            ScopeKind::TenantRoute,
            Rule::new(Policy::new(3, 2.0).unwrap()),
        )
        .tier("gold", vec![Policy::new(12, 4.0).unwrap()])
        .override_key(Scope::Tenant(TenantId(2)), "gold")
        .class(WorkClass::new("one", 1))
        .class(WorkClass::new("three", 3).with_cost(ScopeKind::User, 0))
        .class(WorkClass::new("two", 2).with_cost(ScopeKind::Tenant, 3))
}

/// Everything a caller can read of a decision, and of the limiter's scopes it names, as
/// text.
fn seen(limiter: &ScopedLimiter<ManualClock>, d: &ScopeDecision<'_>) -> String {
    let records: Vec<String> = d.records().map(|r| r.to_string()).collect();
    let scopes: Vec<Scope> = ScopeKind::ALL
        .into_iter()
        .filter_map(|k| Scope::of(d.request(), k))
        .collect();
    let per_scope: Vec<String> = scopes
        .iter()
        .map(|s| {
            format!(
                "{s}: decision={:?} cost={:?} overflowed={} available={:?} counters={:?} \
                 word={:?}",
                d.decision(*s),
                d.cost(*s),
                d.overflowed(*s),
                limiter.available(s),
                limiter.counters(s),
                limiter.stored_word(s).is_some(),
            )
        })
        .collect();
    format!(
        "{d:?} scopes={:?} refused={:?} limit={:?} refusal={:?} retry={:?} charge={:?} \
         records={records:?} per_scope={per_scope:?}",
        d.scopes().collect::<Vec<_>>(),
        d.refused_scope(),
        d.refused_limit(),
        d.refusal(),
        d.retry_after(),
        d.charge(),
    )
}

fn same_on_both_paths(leased: bool) {
    let (clock_a, clock_b) = (ManualClock::new(), ManualClock::new());
    let a = rules(leased).build_with_clock(clock_a.clone()).unwrap();
    let b = rules(leased).build_with_clock(clock_b.clone()).unwrap();
    let classes = ["one", "three", "two"];
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let (mut admitted, mut refused) = (0, 0);
    let held_before = held();
    let requests = 2000;
    for i in 0..requests {
        // xorshift: a fixed sequence of classes, keys, attempts and gaps.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let name = classes[(state % 3) as usize];
        let bits = state >> 8;
        let mut request = Request::new();
        if bits & 1 != 0 {
            request = request.tenant(TenantId(1 + (bits >> 5) % 3));
        }
        if bits & 2 != 0 {
            request = request.user(UserId(1 + (bits >> 7) % 4));
        }
        if bits & 4 != 0 {
            request = request.api_key(ApiKeyId(1 + (bits >> 9) % 2));
        }
        if bits & 8 != 0 {
            request = request.route(RouteId(1 + (bits >> 11) % 2));
        }
        if bits & 16 != 0 {
            request = request.attempt(Attempt::Retry(1));
        }
        let (class_a, class_b) = (a.class(name).unwrap(), b.class(name).unwrap());
        let da = a.try_acquire(&request, class_a).unwrap();
        let db = b.pay_scopes(&request, class_b).unwrap();
        assert_eq!(seen(&a, &da), seen(&b, &db), "request {i} ({name})");
        if da.is_admitted() {
            admitted += 1;
        } else {
            refused += 1;
        }
        let gap = Duration::from_micros((state >> 20) % 300_000);
        clock_a.advance(gap);
        clock_b.advance(gap);
    }
    let on_held = held() - held_before;
    assert!(
        admitted > 300 && refused > 300,
        "{admitted} admitted, {refused} refused"
    );
    // Every request that names a keyed scope whose keys are all in their maps.
    assert!(
        on_held > requests / 2,
        "only {on_held} of {requests} on the held path"
    );
    for kind in ScopeKind::ALL {
        assert_eq!(a.len(kind), b.len(kind), "{kind}");
        assert_eq!(a.evicted_counters(kind), b.evicted_counters(kind), "{kind}");
    }
    let mut counters_a = Vec::new();
    a.for_each_counters(|s, c| counters_a.push((s, c)));
    let mut counters_b = Vec::new();
    b.for_each_counters(|s, c| counters_b.push((s, c)));
    counters_a.sort_by_key(|(s, _)| *s);
    counters_b.sort_by_key(|(s, _)| *s);
    assert_eq!(counters_a, counters_b);
    assert!(counters_a.len() > 4, "{counters_a:?}");
}

#[test]
fn the_held_path_decides_as_the_locked_path_does() {
    same_on_both_paths(false);
}

#[test]
fn the_held_path_decides_as_the_locked_path_does_on_a_leased_global_scope() {
    same_on_both_paths(true);
}

/// A request that meets a key new to its map takes the locked path (which inserts it)
/// with nothing taken on the held path: its other scopes are paid once.
#[test]
fn a_new_key_is_paid_once_on_the_locked_path() {
    let clock = ManualClock::new();
    let limiter = rules(false).build_with_clock(clock).unwrap();
    let one = limiter.class("one").unwrap();
    let known = Request::new().tenant(TenantId(1));
    assert!(limiter.try_acquire(&known, one).unwrap().is_admitted());
    let before = held();
    let fresh = Request::new().tenant(TenantId(1)).user(UserId(9));
    assert!(limiter.try_acquire(&fresh, one).unwrap().is_admitted());
    assert_eq!(held(), before, "a new key was decided held");
    assert_eq!(limiter.available(&Scope::Tenant(TenantId(1))), Some(4.0));
    assert_eq!(limiter.available(&Scope::User(UserId(9))), Some(4.0));
    assert_eq!(limiter.available(&Scope::Global), Some(38.0));
    assert!(limiter.try_acquire(&fresh, one).unwrap().is_admitted());
    assert_eq!(held(), before + 1, "known keys were not decided held");
    assert_eq!(limiter.available(&Scope::Tenant(TenantId(1))), Some(3.0));
}
