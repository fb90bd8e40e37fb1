//! The two-bucket verdict (`ScopedLimiter::try_acquire_verdict` on a request that pays
//! the global scope and one keyed scope whose key is in its map): the global word and
//! the held key's word taken in one read-only pass and two takes, with no decision
//! built. Two such requests race for the last token of either bucket, and one races an
//! insert that grows the key's shard (every entry moves).
//!
//! Frozen clock, one shard, so every token is accounted for: each model checks that a
//! request paid both scopes or neither, and the balances exactly. The deliberate bugs (a
//! rollback that keeps the global token, a take stored without a compare-and-swap, a
//! writer that does not wait for the held section) are each caught.
#![cfg(loom)]

use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;

use loom::sync::Arc;
use loom::thread;
use loom_tests::{Forward, Model};
use tokengate::Policy;
use tokengate::scope::*;

type Limiter = ScopedLimiter<Forward, BuildHasherDefault<DefaultHasher>>;

/// A scoped request's lists live on the stack, more than a loom thread's default holds.
fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
    thread::Builder::new().stack_size(4 << 20).spawn(f).unwrap()
}

fn run(f: impl FnOnce() + Send + 'static) {
    spawn(f).join().unwrap();
}

fn p(capacity: u64) -> Policy {
    Policy::new(capacity, 1.0).unwrap()
}

/// A global bucket of `global` tokens and users of `users` (one shard, a fixed hasher),
/// users 1 to 3 in their map, full.
fn limiter(global: u64, users: u64) -> Arc<Limiter> {
    let limiter = Arc::new(
        RuleSet::new()
            .rule(ScopeKind::Global, Rule::new(p(global)))
            .rule(ScopeKind::User, Rule::new(p(users)).max_keys(8).shards(1))
            .class(WorkClass::new("one", 1))
            .build_with(Forward::new(), BuildHasherDefault::default())
            .unwrap(),
    );
    let one = limiter.class("one").unwrap();
    for u in 1..=3 {
        let d = limiter
            .try_acquire(&Request::new().user(UserId(u)), one)
            .unwrap();
        limiter.refund(&d.charge().unwrap());
    }
    limiter
}

fn left(limiter: &Limiter, scope: Scope) -> f64 {
    limiter.available(&scope).unwrap()
}

/// The verdict of one request for `user`: admitted, and the scope named if refused.
fn verdict(limiter: &Limiter, user: u64) -> (bool, Option<Scope>) {
    let one = limiter.class("one").unwrap();
    let r = Request::new().user(UserId(user));
    let v = limiter.try_acquire_verdict(&r, one).unwrap();
    (v.is_admitted(), v.refused_scope(&r))
}

/// Two requests, for users 1 and 2 (two tokens each), race for the global scope's one
/// token: exactly one is admitted, the other is refused by the global scope, and only
/// the admitted request's user paid.
fn racing_for_the_global_token() -> impl Fn() + Sync + Send + 'static {
    || {
        run(move || {
            let limiter = limiter(1, 2);
            let other = {
                let limiter = limiter.clone();
                spawn(move || verdict(&limiter, 1))
            };
            let mine = verdict(&limiter, 2);
            let theirs = other.join().unwrap();
            assert!(
                mine.0 != theirs.0,
                "all or nothing: not exactly one admitted: {mine:?} {theirs:?}"
            );
            let refused = if mine.0 { theirs } else { mine };
            assert_eq!(refused.1, Some(Scope::Global));
            assert_eq!(left(&limiter, Scope::Global), 0.0);
            let users =
                left(&limiter, Scope::User(UserId(1))) + left(&limiter, Scope::User(UserId(2)));
            assert_eq!(
                users, 3.0,
                "conservation: the refused request kept a user token"
            );
        })
    }
}

/// Two requests for user 1 (one token) race with the global scope holding three:
/// exactly one is admitted, the other is refused by user 1, and if it had taken its
/// global token it gave it back.
fn racing_for_the_users_token() -> impl Fn() + Sync + Send + 'static {
    || {
        run(move || {
            let limiter = limiter(3, 1);
            let other = {
                let limiter = limiter.clone();
                spawn(move || verdict(&limiter, 1))
            };
            let mine = verdict(&limiter, 1);
            let theirs = other.join().unwrap();
            assert!(
                mine.0 != theirs.0,
                "all or nothing: not exactly one admitted: {mine:?} {theirs:?}"
            );
            let refused = if mine.0 { theirs } else { mine };
            assert_eq!(refused.1, Some(Scope::User(UserId(1))));
            assert_eq!(left(&limiter, Scope::User(UserId(1))), 0.0);
            assert_eq!(
                left(&limiter, Scope::Global),
                2.0,
                "conservation: the refused request kept its global token"
            );
        })
    }
}

/// Reader: two verdicts for user 1 (two tokens), held. Writer: a request for user 4, new:
/// three users fill the shard's first allocation (as in `scoped_held`), so its insertion
/// grows the table and moves every entry. Every admission and balance exact.
fn racing_an_insert() -> impl Fn() + Sync + Send + 'static {
    || {
        run(move || {
            let limiter = limiter(8, 2);
            let reader = {
                let limiter = limiter.clone();
                spawn(move || [verdict(&limiter, 1).0, verdict(&limiter, 1).0])
            };
            let one = limiter.class("one").unwrap();
            let w = Request::new().user(UserId(4));
            let inserted = limiter.try_acquire(&w, one).unwrap().is_admitted();
            let admitted = reader.join().unwrap();
            assert_eq!(admitted, [true, true], "a held request's admission lost");
            assert!(inserted, "the new key's request refused");
            assert_eq!(limiter.len(ScopeKind::User), 4);
            for (scope, expected) in [
                (Scope::Global, 5.0),
                (Scope::User(UserId(1)), 0.0),
                (Scope::User(UserId(4)), 1.0),
            ] {
                assert_eq!(
                    left(&limiter, scope),
                    expected,
                    "tokens lost or minted on {scope}"
                );
            }
        })
    }
}

const GLOBAL: Model = Model::exhaustive("two-bucket verdicts racing for the global token", 3);
const USER: Model = Model::exhaustive("two-bucket verdicts racing for a user's token", 3);
const INSERT: Model = Model::exhaustive("two-bucket verdicts racing an insert", 3);

#[test]
fn two_bucket_verdicts_for_the_last_global_token_are_all_or_nothing() {
    GLOBAL.check(racing_for_the_global_token());
}

#[test]
fn two_bucket_verdicts_for_a_users_last_token_are_all_or_nothing() {
    USER.check(racing_for_the_users_token());
}

#[test]
fn a_two_bucket_verdict_races_an_insert_exactly() {
    INSERT.check(racing_an_insert());
}

#[test]
fn a_two_bucket_rollback_that_keeps_the_global_token_is_caught() {
    let message = USER.expect_violation(
        &tokengate::mutants::ROLLBACK_SKIPS_REFUND,
        racing_for_the_users_token(),
    );
    assert!(message.contains("conservation"), "{message}");
}

#[test]
fn a_two_bucket_take_stored_without_a_compare_and_swap_is_caught() {
    for message in [
        GLOBAL.expect_violation(
            &tokengate::mutants::PLANNED_TAKE_STORES_BLIND,
            racing_for_the_global_token(),
        ),
        USER.expect_violation(
            &tokengate::mutants::PLANNED_TAKE_STORES_BLIND,
            racing_for_the_users_token(),
        ),
    ] {
        assert!(message.contains("all or nothing"), "{message}");
    }
}

#[test]
fn a_writer_that_skips_a_two_bucket_section_is_caught() {
    let message = INSERT.expect_violation(
        &tokengate::mutants::WRITER_SKIPS_READERS,
        racing_an_insert(),
    );
    assert!(message.contains("Causality violation"), "{message}");
}
