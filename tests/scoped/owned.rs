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
fn dropping_waiting_futures_into_debt_gives_nothing_back_and_mints_nothing() {
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
    // Each had holders behind it, or the debt: nothing is given back (a credit into the
    // debt would be refilled again while later holders wait), and nothing is minted.
    assert_eq!(bucket.available(), -6.0);
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
fn a_scoped_reservation_waits_for_its_slowest_scope_and_cancels_where_nothing_is_owed() {
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
    // The global scope (not owed) gets its cost back; the tenant's, owed, nothing.
    assert_eq!(limiter.available(&Scope::Tenant(TenantId(1))), Some(tenant));
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
