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

use loom_tests::{
    Model, Scoped as Limiter, insert_user_4_racing, left, run_scoped, spawn_scoped, users_limiter,
};
use tokengate::scope::*;

/// The verdict of one request for `user`: admitted, and the scope named if refused.
fn verdict(limiter: &Limiter, user: u64) -> (bool, Option<Scope>) {
    let one = limiter.class("one").unwrap();
    let r = Request::new().user(UserId(user));
    let v = limiter.try_acquire_verdict(&r, one).unwrap();
    (v.is_admitted(), v.refused_scope(&r))
}

/// Two requests race for the one token of the global scope or of user 1, on a global
/// bucket of `global` tokens and users of `users`, where one of the two is 1:
/// - `global` 1: the requests are for users 1 and 2 (two tokens each);
/// - `users` 1: both are for user 1, with the global scope holding three.
///
/// Exactly one is admitted, the other is refused by the bucket of the last token, and
/// the other buckets the two paid (the users, or the global scope) lost only the
/// admitted request's token: a refused request that had taken one gave it back.
fn racing_for_the_last_token(global: u64, users: u64) -> impl Fn() + Sync + Send + 'static {
    // The bucket of the last token, the user of this thread's request, the other buckets
    // paid and what they hold once the admitted request paid them.
    let (last, mine, others, kept, what) = if global == 1 {
        let users_paid: &[Scope] = &[Scope::User(UserId(1)), Scope::User(UserId(2))];
        (Scope::Global, 2, users_paid, 2 * users - 1, "a user token")
    } else {
        assert_eq!(users, 1, "one of the two buckets holds the last token");
        (
            Scope::User(UserId(1)),
            1,
            &[Scope::Global][..],
            global - 1,
            "its global token",
        )
    };
    move || {
        run_scoped(move || {
            let limiter = users_limiter(Some(global), users);
            let other = {
                let limiter = limiter.clone();
                spawn_scoped(move || verdict(&limiter, 1))
            };
            let mine = verdict(&limiter, mine);
            let theirs = other.join().unwrap();
            assert!(
                mine.0 != theirs.0,
                "all or nothing: not exactly one admitted: {mine:?} {theirs:?}"
            );
            let refused = if mine.0 { theirs } else { mine };
            assert_eq!(refused.1, Some(last));
            assert_eq!(left(&limiter, last), 0.0);
            let others: f64 = others.iter().map(|&s| left(&limiter, s)).sum();
            assert_eq!(
                others, kept as f64,
                "conservation: the refused request kept {what}"
            );
        })
    }
}

/// Reader: two verdicts for user 1 (two tokens), held. Writer: a request for user 4, new:
/// three users fill the shard's first allocation (as in `scoped_held`), so its insertion
/// grows the table and moves every entry. Every admission and balance exact.
fn racing_an_insert() -> impl Fn() + Sync + Send + 'static {
    || {
        run_scoped(move || {
            let limiter = users_limiter(Some(8), 2);
            let reader = {
                let limiter = limiter.clone();
                spawn_scoped(move || [verdict(&limiter, 1).0, verdict(&limiter, 1).0])
            };
            let one = limiter.class("one").unwrap();
            let expected = [
                (Scope::Global, 5.0),
                (Scope::User(UserId(1)), 0.0),
                (Scope::User(UserId(4)), 1.0),
            ];
            insert_user_4_racing(&limiter, one, reader, &expected);
        })
    }
}

const GLOBAL: Model = Model::exhaustive("two-bucket verdicts racing for the global token", 3);
const USER: Model = Model::exhaustive("two-bucket verdicts racing for a user's token", 3);
const INSERT: Model = Model::exhaustive("two-bucket verdicts racing an insert", 3);

#[test]
fn two_bucket_verdicts_for_the_last_global_token_are_all_or_nothing() {
    loom_tests::in_own_process!();
    GLOBAL.check(racing_for_the_last_token(1, 2));
}

#[test]
fn two_bucket_verdicts_for_a_users_last_token_are_all_or_nothing() {
    loom_tests::in_own_process!();
    USER.check(racing_for_the_last_token(3, 1));
}

#[test]
fn a_two_bucket_verdict_races_an_insert_exactly() {
    loom_tests::in_own_process!();
    INSERT.check(racing_an_insert());
}

#[test]
fn a_two_bucket_rollback_that_keeps_the_global_token_is_caught() {
    loom_tests::in_own_process!();
    let message = USER.expect_violation(
        &tokengate::mutants::ROLLBACK_SKIPS_REFUND,
        racing_for_the_last_token(3, 1),
    );
    assert!(message.contains("conservation"), "{message}");
}

#[test]
fn a_two_bucket_take_stored_without_a_compare_and_swap_is_caught() {
    loom_tests::in_own_process!();
    for message in [
        GLOBAL.expect_violation(
            &tokengate::mutants::PLANNED_TAKE_STORES_BLIND,
            racing_for_the_last_token(1, 2),
        ),
        USER.expect_violation(
            &tokengate::mutants::PLANNED_TAKE_STORES_BLIND,
            racing_for_the_last_token(3, 1),
        ),
    ] {
        assert!(message.contains("all or nothing"), "{message}");
    }
}

#[test]
fn a_writer_that_skips_a_two_bucket_section_is_caught() {
    loom_tests::in_own_process!();
    let message = INSERT.expect_violation(
        &tokengate::mutants::WRITER_SKIPS_READERS,
        racing_an_insert(),
    );
    assert!(message.contains("Causality violation"), "{message}");
}
