//! Owned reservations: cancel-safe waits, all-or-nothing across scopes, and the scoped
//! helpers the HTTP layer builds on (refund of a charge, acquisition without some kinds).

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokengate::owned::OwnedReservation;
use tokengate::scope::{
    Request, Rule, RuleSet, Scope, ScopeKind, ScopeReserveError, TenantId, WorkClass,
};
use tokengate::{Bucket, ManualClock, Policy, Start};

fn poll_once<F: Future>(fut: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn dropping_waiting_futures_gives_back_only_the_last_in_the_queue_and_mints_nothing() {
    let policy = Policy::builder(4, 2.0)
        .max_reservation(Duration::from_secs(10))
        .build()
        .unwrap();
    let bucket = Arc::new(Bucket::with_clock(policy, ManualClock::new()));
    bucket.try_acquire(4).unwrap();
    let before = bucket.stored_word();
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let r: OwnedReservation<Bucket<ManualClock>> =
            bucket.reserve_owned(2, Duration::from_secs(10)).unwrap();
        // A timer that never fires: the future waits until it is dropped.
        waiters.push(Box::pin(r.ready(|_| std::future::pending::<()>())));
    }
    for w in &mut waiters {
        assert!(poll_once(w.as_mut()).is_pending());
    }
    assert_eq!(bucket.available(), -6.0);
    drop(waiters); // aborted, in the order they queued
    // The first two had holders behind them when dropped: nothing is given back (a
    // credit into the debt would be refilled again while later holders wait). The last
    // had nobody behind it: its charge comes back exactly. Nothing is minted.
    assert_eq!(bucket.available(), -4.0);
    assert_ne!(bucket.stored_word(), before);
}

#[test]
fn a_completed_wait_keeps_the_tokens_and_returns_the_charge() {
    let policy = Policy::builder(2, 1.0)
        .max_reservation(Duration::from_secs(5))
        .start(Start::Empty)
        .build()
        .unwrap();
    let clock = ManualClock::new();
    let bucket = Arc::new(Bucket::with_clock(policy, clock.clone()));
    let r = bucket.reserve_owned(2, Duration::from_secs(5)).unwrap();
    let wait = r.wait();
    let fut = r.ready(|d| {
        clock.advance(d);
        std::future::ready(())
    });
    assert_eq!(poll_once(std::pin::pin!(fut)), Poll::Ready(2));
    assert_eq!(clock.now(), wait);
    // Paid by refill and kept: back to zero, plus what refill adds up to the tick edge.
    let left = bucket.available();
    assert!((0.0..0.01).contains(&left), "{left}");
}

fn two_scopes(tenant_horizon: Duration) -> Arc<tokengate::ScopedLimiter<ManualClock>> {
    let global = Policy::builder(10, 1.0)
        .max_reservation(Duration::from_secs(60))
        .build()
        .unwrap();
    let tenant = Policy::builder(3, 1.0)
        .max_reservation(tenant_horizon)
        .build()
        .unwrap();
    Arc::new(
        RuleSet::new()
            .rule(ScopeKind::Global, Rule::new(global))
            .rule(ScopeKind::Tenant, Rule::new(tenant))
            .class(WorkClass::new("search", 3))
            .build_with_clock(ManualClock::new())
            .unwrap(),
    )
}

#[test]
fn a_scoped_reservation_refused_by_one_scope_takes_nothing_from_the_others() {
    let limiter = two_scopes(Duration::ZERO); // the tenant cannot reserve ahead
    let search = limiter.class("search").unwrap();
    let request = Request::new().tenant(TenantId(1));
    assert!(limiter.try_acquire(&request, search).unwrap().is_admitted());
    let global = limiter.stored_word(&Scope::Global);
    let err = limiter
        .reserve_owned(&request, search, Duration::from_secs(60))
        .unwrap_err();
    assert!(matches!(
        err,
        ScopeReserveError::Reserve {
            scope: Scope::Tenant(TenantId(1)),
            ..
        }
    ));
    assert_eq!(limiter.stored_word(&Scope::Global), global);
    assert_eq!(limiter.available(&Scope::Global), Some(7.0));
}

#[test]
fn a_scoped_reservation_waits_for_its_slowest_scope_and_cancels_exactly_when_alone() {
    let limiter = two_scopes(Duration::from_secs(60));
    let search = limiter.class("search").unwrap();
    let request = Request::new().tenant(TenantId(1));
    assert!(limiter.try_acquire(&request, search).unwrap().is_admitted());
    let r = limiter
        .reserve_owned(&request, search, Duration::from_secs(60))
        .unwrap();
    // The tenant (3 tokens at 1/s) is the slower scope; the global one held 7.
    assert!(r.wait() >= Duration::from_secs(3));
    // The tenant's holder takes a full bucket: it is charged to its ready edge (less
    // than one tick's refill more than its cost).
    let tenant = limiter.available(&Scope::Tenant(TenantId(1))).unwrap();
    assert!((-3.01..=-3.0).contains(&tenant), "{tenant}");
    assert_eq!(limiter.available(&Scope::Global), Some(4.0));
    assert!(r.cancel());
    // Nobody reserved after it: every scope gets its charge back exactly, the tenant's
    // (charged to its ready edge) and the global one's (taken at once).
    assert_eq!(limiter.available(&Scope::Tenant(TenantId(1))), Some(0.0));
    assert_eq!(limiter.available(&Scope::Global), Some(7.0));
}

#[test]
fn acquiring_without_a_kind_neither_consults_nor_charges_it() {
    let limiter = two_scopes(Duration::ZERO);
    let search = limiter.class("search").unwrap();
    let request = Request::new().tenant(TenantId(1));
    assert!(limiter.try_acquire(&request, search).unwrap().is_admitted());
    assert!(limiter.try_acquire(&request, search).unwrap().is_rejected());
    let d = limiter
        .try_acquire_without(&request, search, &[ScopeKind::Tenant])
        .unwrap();
    assert!(d.is_admitted());
    assert_eq!(d.scopes().collect::<Vec<_>>(), [Scope::Global]);
    assert_eq!(limiter.available(&Scope::Tenant(TenantId(1))), Some(0.0));
    assert_eq!(limiter.available(&Scope::Global), Some(4.0));
    // Its charge refunds the global scope only.
    limiter.refund(&d.charge().unwrap());
    assert_eq!(limiter.available(&Scope::Global), Some(7.0));
    assert_eq!(limiter.available(&Scope::Tenant(TenantId(1))), Some(0.0));
}

/// A reservable policy: `capacity` tokens at `rate` per second, reserving a minute ahead.
fn reservable(capacity: u64, rate: f64) -> Policy {
    Policy::builder(capacity, rate)
        .max_reservation(Duration::from_secs(60))
        .build()
        .unwrap()
}

#[test]
fn a_lone_owned_reservation_dropped_before_its_time_leaves_the_bucket_as_if_never_reserved() {
    let clock = ManualClock::new();
    let bucket = Arc::new(Bucket::with_clock(reservable(4, 2.0), clock.clone()));
    let twin = Bucket::with_clock(reservable(4, 2.0), clock.clone()); // never reserves
    bucket.try_acquire(3).unwrap();
    twin.try_acquire(3).unwrap();
    let r = bucket.reserve_owned(3, Duration::from_secs(60)).unwrap();
    assert!(bucket.available() < 0.0);
    clock.advance(r.wait() / 2);
    drop(r); // a client hanging up while the server waits
    assert_eq!(
        bucket.available(),
        twin.available(),
        "a lone owned reservation dropped before its time must give its whole charge back"
    );
    let (a, b) = (bucket.try_acquire(1).unwrap(), twin.try_acquire(1).unwrap());
    assert_eq!(a.is_admitted(), b.is_admitted());
    assert!(a.is_admitted());
    assert_eq!(bucket.available(), twin.available());
}

#[test]
fn an_owned_reservation_cancelled_ahead_of_a_later_one_gives_nothing_and_the_later_time_stands() {
    let clock = ManualClock::new();
    let bucket = Arc::new(Bucket::with_clock(reservable(4, 2.0), clock.clone()));
    bucket.try_acquire(4).unwrap(); // drained
    let a = bucket.reserve_owned(4, Duration::from_secs(60)).unwrap();
    let c = bucket.reserve_owned(4, Duration::from_secs(60)).unwrap();
    let owed = bucket.available();
    assert!(a.cancel()); // before its time, but a holder is queued behind it
    assert_eq!(
        bucket.available(),
        owed,
        "a cancel ahead of a queued holder gives nothing"
    );
    clock.set(c.ready_at());
    assert!(c.is_ready());
    assert_eq!(c.consume(), 4); // the later holder proceeds with a full bucket
    assert!(
        !bucket.try_acquire(4).unwrap().is_admitted(),
        "a newcomer took a full bucket at the instant a holder did: 2B at one instant"
    );
}

fn keyed(clock: &ManualClock) -> Arc<tokengate::KeyedLimiter<u64, ManualClock>> {
    Arc::new(
        tokengate::KeyedLimiter::<u64, _>::builder(reservable(4, 2.0), 100)
            .clock(clock.clone())
            .build()
            .unwrap(),
    )
}

#[test]
fn a_lone_keyed_owned_reservation_dropped_before_its_time_leaves_the_key_as_if_never_reserved() {
    let clock = ManualClock::new();
    let map = keyed(&clock);
    // Key 7 reserves; key 8, its twin, never does.
    for key in [7, 8] {
        map.try_acquire(&key, 3).unwrap();
    }
    let r = map.reserve_owned(7, 3, Duration::from_secs(60)).unwrap();
    assert!(map.available(&7) < 0.0);
    clock.advance(r.wait() / 2);
    drop(r);
    assert_eq!(
        map.available(&7),
        map.available(&8),
        "a lone keyed owned reservation dropped before its time must give its charge back"
    );
    let (a, b) = (
        map.try_acquire(&7, 1).unwrap(),
        map.try_acquire(&8, 1).unwrap(),
    );
    assert_eq!(a.is_admitted(), b.is_admitted());
    assert!(a.is_admitted());
    assert_eq!(map.available(&7), map.available(&8));
}

#[test]
fn a_keyed_owned_reservation_cancelled_ahead_of_a_later_one_gives_nothing() {
    let clock = ManualClock::new();
    let map = keyed(&clock);
    map.try_acquire(&7, 4).unwrap(); // drained
    let a = map.reserve_owned(7, 4, Duration::from_secs(60)).unwrap();
    let c = map.reserve_owned(7, 4, Duration::from_secs(60)).unwrap();
    let owed = map.available(&7);
    assert!(a.cancel());
    assert_eq!(
        map.available(&7),
        owed,
        "a cancel ahead of a queued holder gives nothing"
    );
    clock.set(c.ready_at());
    c.consume();
    assert!(
        !map.try_acquire(&7, 4).unwrap().is_admitted(),
        "a newcomer took a full bucket at the instant a holder did: 2B at one instant"
    );
}

/// A global scope of 10 at 1/s and a tenant scope of 3 at 1/s, both reserving a minute
/// ahead; the class costs 3.
fn scoped(clock: &ManualClock) -> Arc<tokengate::ScopedLimiter<ManualClock>> {
    Arc::new(
        RuleSet::new()
            .rule(ScopeKind::Global, Rule::new(reservable(10, 1.0)))
            .rule(ScopeKind::Tenant, Rule::new(reservable(3, 1.0)))
            .class(WorkClass::new("search", 3))
            .build_with_clock(clock.clone())
            .unwrap(),
    )
}

#[test]
fn a_lone_scoped_owned_reservation_dropped_before_its_time_leaves_every_scope_as_if_never_reserved()
{
    let clock = ManualClock::new();
    let (limiter, twin) = (scoped(&clock), scoped(&clock)); // the twin never reserves
    let request = Request::new().tenant(TenantId(1));
    let scopes = [Scope::Global, Scope::Tenant(TenantId(1))];
    for l in [&limiter, &twin] {
        let search = l.class("search").unwrap();
        assert!(l.try_acquire(&request, search).unwrap().is_admitted());
    }
    let search = limiter.class("search").unwrap();
    let r = limiter
        .reserve_owned(&request, search, Duration::from_secs(60))
        .unwrap();
    assert!(!r.is_ready());
    clock.advance(r.wait() / 2);
    drop(r);
    for scope in &scopes {
        assert_eq!(
            limiter.available(scope),
            twin.available(scope),
            "scope {scope}: a lone scoped owned reservation dropped before its time must \
             give its charge back"
        );
    }
    clock.advance(Duration::from_secs(2)); // the tenant holds 3 again
    let a = limiter.try_acquire(&request, search).unwrap().is_admitted();
    let b = twin
        .try_acquire(&request, twin.class("search").unwrap())
        .unwrap()
        .is_admitted();
    assert_eq!(a, b);
    assert!(a);
    for scope in &scopes {
        assert_eq!(
            limiter.available(scope),
            twin.available(scope),
            "scope {scope}"
        );
    }
}

#[test]
fn a_scoped_owned_reservation_cancelled_ahead_of_a_later_one_gives_nothing() {
    let clock = ManualClock::new();
    let limiter = scoped(&clock);
    let search = limiter.class("search").unwrap();
    let request = Request::new().tenant(TenantId(1));
    let tenant = Scope::Tenant(TenantId(1));
    assert!(limiter.try_acquire(&request, search).unwrap().is_admitted()); // tenant drained
    let a = limiter
        .reserve_owned(&request, search, Duration::from_secs(60))
        .unwrap();
    let c = limiter
        .reserve_owned(&request, search, Duration::from_secs(60))
        .unwrap();
    let (owed, global) = (
        limiter.available(&tenant),
        limiter.available(&Scope::Global),
    );
    assert!(a.cancel());
    assert_eq!(
        limiter.available(&tenant),
        owed,
        "a cancel ahead of a queued holder gives nothing"
    );
    // The global scope had the tokens at once: they were an admission there, and come
    // back as a refund does.
    assert_eq!(limiter.available(&Scope::Global), global.map(|g| g + 3.0));
    clock.set(c.ready_at());
    c.consume();
    assert!(
        !limiter.try_acquire(&request, search).unwrap().is_admitted(),
        "a newcomer took the tenant's full bucket at the instant a holder did: 2B at one instant"
    );
}
