//! A scoped request decided on buckets held in reader sections (a tenant's and a user's,
//! no lock) while a writer changes one of their shards: a new tenant inserted (the
//! table grown, its entries moved), a sweep that evicts the very user being paid, a
//! switch of both kinds' policies.
//!
//! Frozen clock, one shard per kind, so every token is accounted for: each model checks
//! that the held request paid both scopes or neither, exactly. Besides that, loom checks
//! every access to the shards' data: a section that overlaps a writer's changes, with
//! no synchronization ordering them, is a causality violation. The deliberate bugs (a
//! writer that does not wait for the sections in its shard, a section that ignores the
//! writing flag) are caught by each model.
#![cfg(loom)]

use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;

use loom::sync::Arc;
use loom::thread;
use loom_tests::{Forward, Model, Tally};
use tokengate::scope::*;
use tokengate::{Inherit, Policy};

type Limiter = ScopedLimiter<Forward, BuildHasherDefault<DefaultHasher>>;

/// As in `scoped_reconfigure`: a scoped request's lists live on the stack.
fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
    thread::Builder::new().stack_size(4 << 20).spawn(f).unwrap()
}

fn p(capacity: u64) -> Policy {
    Policy::new(capacity, 1.0).unwrap()
}

/// Tenants and users of `capacity` tokens (a fixed hasher: the model must be
/// deterministic), one shard each.
fn rules(capacity: u64) -> RuleSet {
    RuleSet::new()
        .rule(
            ScopeKind::Tenant,
            Rule::new(p(capacity))
                .max_keys(8)
                .shards(1)
                .inherit(Inherit::Additive),
        )
        .rule(
            ScopeKind::User,
            Rule::new(p(capacity))
                .max_keys(8)
                .shards(1)
                .inherit(Inherit::Additive),
        )
        .class(WorkClass::new("one", 1))
}

/// Tenants 1 to 3 and users 1 and 2 in their maps, full. Three tenants fill the shard's
/// first allocation: the next one grows it.
fn limiter() -> Arc<Limiter> {
    let limiter = Arc::new(
        rules(2)
            .build_with(Forward::new(), BuildHasherDefault::default())
            .unwrap(),
    );
    let one = limiter.class("one").unwrap();
    for t in 1..=3 {
        // Made by a request and given back: in the maps, full.
        let r = Request::new().tenant(TenantId(t)).user(UserId(1 + t % 2));
        let d = limiter.try_acquire(&r, one).unwrap();
        limiter.refund(&d.charge().unwrap());
    }
    limiter
}

fn left(limiter: &Limiter, scope: Scope) -> f64 {
    limiter.available(&scope).unwrap()
}

/// Reader: pays tenant 1 and user 1 twice (capacity 2 each), held. Writer: a request for
/// tenant 4, new, and user 2, whose insertion grows the tenant shard's table (every
/// entry moves). Every admission and every balance exact.
fn held_racing_an_insert() -> impl Fn() + Sync + Send + 'static {
    || {
        let limiter = limiter();
        let one = limiter.class("one").unwrap();
        let reader = {
            let limiter = limiter.clone();
            spawn(move || {
                let r = Request::new().tenant(TenantId(1)).user(UserId(1));
                [limiter.try_acquire(&r, one), limiter.try_acquire(&r, one)]
                    .map(|d| d.unwrap().is_admitted())
            })
        };
        let w = Request::new().tenant(TenantId(4)).user(UserId(2));
        let inserted = limiter.try_acquire(&w, one).unwrap().is_admitted();
        let admitted = reader.join().unwrap();
        assert_eq!(admitted, [true, true], "a held request's admission lost");
        assert!(inserted, "the new key's request refused");
        assert_eq!(limiter.len(ScopeKind::Tenant), 4);
        for (scope, expected) in [
            (Scope::Tenant(TenantId(1)), 0.0),
            (Scope::User(UserId(1)), 0.0),
            (Scope::Tenant(TenantId(4)), 1.0),
            (Scope::User(UserId(2)), 1.0),
        ] {
            assert_eq!(
                left(&limiter, scope),
                expected,
                "tokens lost or minted on {scope}"
            );
        }
    }
}

/// Reader: pays tenant 1 and user 1 once (both full), held. Writer: a sweep, which evicts
/// every full bucket it finds. Either the request came first (its buckets kept, 1 left
/// in each) or its keys were evicted, and it made them afresh on the locked path (1
/// left): the same balances either way, and both scopes paid together.
fn held_racing_a_sweep(evicted: Tally) -> impl Fn() + Sync + Send + 'static {
    move || {
        let limiter = limiter();
        let one = limiter.class("one").unwrap();
        let reader = {
            let limiter = limiter.clone();
            spawn(move || {
                let r = Request::new().tenant(TenantId(1)).user(UserId(1));
                limiter.try_acquire(&r, one).unwrap().is_admitted()
            })
        };
        let report = limiter.sweep();
        let admitted = reader.join().unwrap();
        assert!(admitted, "the held request's admission lost");
        for scope in [Scope::Tenant(TenantId(1)), Scope::User(UserId(1))] {
            assert_eq!(
                left(&limiter, scope),
                1.0,
                "tokens lost or minted on {scope} across the sweep: {report:?}"
            );
        }
        evicted.hit_if(report.evicted > 0);
    }
}

/// Reader: pays tenant 1 and user 1 twice (capacity 2 each), held. Writer: switches both
/// kinds to capacity 3, `Additive` (one token more each). Both scopes end with 3 less
/// what the reader took, and it took the same from each.
fn held_racing_a_switch() -> impl Fn() + Sync + Send + 'static {
    || {
        let limiter = limiter();
        let one = limiter.class("one").unwrap();
        let reader = {
            let limiter = limiter.clone();
            spawn(move || {
                let r = Request::new().tenant(TenantId(1)).user(UserId(1));
                [limiter.try_acquire(&r, one), limiter.try_acquire(&r, one)]
                    .map(|d| i64::from(d.unwrap().is_admitted()))
                    .iter()
                    .sum::<i64>()
            })
        };
        limiter.reconfigure(rules(3)).unwrap();
        let net = reader.join().unwrap();
        assert_eq!(net, 2, "an admission refused with tokens left");
        for scope in [Scope::Tenant(TenantId(1)), Scope::User(UserId(1))] {
            assert_eq!(
                left(&limiter, scope) + net as f64,
                3.0,
                "tokens lost or minted on {scope} at the switch: net taken {net}"
            );
        }
    }
}

const INSERT: Model = Model::exhaustive("scoped held: two sections vs an insert", 2);
const SWEEP: Model = Model::exhaustive("scoped held: two sections vs a sweep", 2);
const SWITCH: Model = Model::exhaustive("scoped held: two sections vs a switch", 2);

#[test]
fn a_held_request_races_an_insert_exactly() {
    INSERT.check(held_racing_an_insert());
}

#[test]
fn a_held_request_races_a_sweep_evicting_its_keys_exactly() {
    let evicted = Tally::new();
    SWEEP.check(held_racing_a_sweep(evicted.clone()));
    assert!(evicted.get() > 0, "the sweep never evicted a key");
}

#[test]
fn a_held_request_races_a_switch_of_both_kinds_exactly() {
    SWITCH.check(held_racing_a_switch());
}

fn assert_race(message: &str) {
    assert!(message.contains("Causality violation"), "{message}");
}

#[test]
fn a_writer_that_skips_the_held_sections_is_caught() {
    let bug = &tokengate::mutants::WRITER_SKIPS_READERS;
    assert_race(&INSERT.expect_violation(bug, held_racing_an_insert()));
    assert_race(&SWEEP.expect_violation(bug, held_racing_a_sweep(Tally::new())));
    assert_race(&SWITCH.expect_violation(bug, held_racing_a_switch()));
}

#[test]
fn a_held_section_that_skips_the_writing_flag_is_caught() {
    let bug = &tokengate::mutants::READER_SKIPS_FLAG;
    assert_race(&INSERT.expect_violation(bug, held_racing_an_insert()));
    assert_race(&SWEEP.expect_violation(bug, held_racing_a_sweep(Tally::new())));
    assert_race(&SWITCH.expect_violation(bug, held_racing_a_switch()));
}
