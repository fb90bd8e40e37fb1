//! A `ScopedLimiter` reconfigured while requests are paid.
//!
//! Time stands still and every strategy is `AsIs` to a larger capacity (never capped), so
//! every token is accounted for: for each bucket, the net taken before the switch is
//! what the switch found missing from the start, the net taken after it is what the new
//! balance lost since, and each request lands wholly on one generation. A request that
//! wrote an old global word after the switch read it (a switch that does not seal), or
//! a give-back lost on a sealed word, breaks the sum.
#![cfg(loom)]

use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;

use loom::sync::Arc;
use loom_tests::{Forward, Model, Tally, policy, spawn_scoped};
use tokengate::Inherit;
use tokengate::scope::*;

/// The global rule: one limit per capacity of `caps`, paid together by every request
/// (with two, a request meets the seal of one word after taking the other, and gives
/// it back; with one, a request is paid on the global scope's own path, without the
/// keyed kinds' nest, and a seal sends it to the nest's retry loop).
fn global_limits(caps: &[u64]) -> RuleSet {
    RuleSet::new()
        .rule(
            ScopeKind::Global,
            Rule::with_policies(caps.iter().map(|&c| policy(c)).collect())
                .unwrap()
                .inherit(Inherit::AsIs),
        )
        .class(WorkClass::new("one", 1))
}

/// How thread A asks.
#[derive(Clone, Copy)]
enum Ask {
    /// `try_acquire`: pay 1, give it back if admitted, pay 1 again.
    Decision,
    /// `try_acquire_verdict` twice (a verdict has no charge to give back).
    Verdict,
}

impl Ask {
    /// The name of the global-only model asked so.
    fn global_model(self) -> &'static str {
        match self {
            Ask::Decision => "scoped reconfigure: global-only requests vs switch",
            Ask::Verdict => "scoped reconfigure: global-only verdicts vs switch",
        }
    }
}

/// Thread A: pay as `ask` says. Thread S: switch the global limits from capacities
/// `before` to `after` (`AsIs`). `after_switch` counts executions where a request was
/// paid after the switch.
fn global_switch_racing_requests(
    before: &'static [u64],
    after: &'static [u64],
    ask: Ask,
    after_switch: &Tally,
) -> impl Fn() + Sync + Send + 'static {
    let after_switch = after_switch.clone();
    move || {
        let after_switch = after_switch.clone();
        spawn_scoped(move || model_global(before, after, ask, &after_switch))
            .join()
            .unwrap();
    }
}

fn model_global(before: &[u64], after: &'static [u64], ask: Ask, after_switch: &Tally) {
    {
        let limiter = Arc::new(
            global_limits(before)
                .build_with_clock(Forward::new())
                .unwrap(),
        );
        let a = {
            let limiter = limiter.clone();
            spawn_scoped(move || {
                let one = limiter.class("one").unwrap();
                let r = Request::new();
                let mut net = 0i64;
                match ask {
                    Ask::Decision => {
                        let d = limiter.try_acquire(&r, one).unwrap();
                        if d.is_admitted() {
                            net += 1;
                            limiter.refund(&d.charge().unwrap());
                            net -= 1;
                        }
                        if limiter.try_acquire(&r, one).unwrap().is_admitted() {
                            net += 1;
                        }
                    }
                    Ask::Verdict => {
                        for _ in 0..2 {
                            if limiter.try_acquire_verdict(&r, one).unwrap().is_admitted() {
                                net += 1;
                            }
                        }
                    }
                }
                net
            })
        };
        let s = {
            let limiter = limiter.clone();
            spawn_scoped(move || limiter.reconfigure(global_limits(after)).unwrap())
        };
        let net = a.join().unwrap();
        let switch = s.join().unwrap();
        assert_eq!(limiter.reconfigurations(), 1);
        let mut paid_after = false;
        for (limit, &start) in before.iter().enumerate() {
            let start = start as f64;
            let report = switch.global[limit];
            let left = limiter.available_in(&Scope::Global, limit).unwrap();
            assert_eq!(report.after, report.before, "as is, never capped");
            let taken_before = start - report.before;
            let taken_after = report.after - left;
            assert!(
                taken_before >= 0.0 && taken_after >= 0.0,
                "limit {limit}: the switch found {report:?}, {left} left after it"
            );
            assert_eq!(
                net as f64,
                taken_before + taken_after,
                "tokens lost or minted at the switch on limit {limit}: net taken {net}, \
                 switch {report:?}, {left} left"
            );
            paid_after |= taken_after > 0.0;
        }
        after_switch.hit_if(paid_after);
    }
}

#[test]
fn a_switch_racing_requests_and_a_give_back_loses_and_mints_nothing() {
    loom_tests::in_own_process!();
    let after = Tally::new();
    // Exhaustive, it runs 168,715 executions (54 s); at most 3 preemptions, 5,308.
    Model {
        preemption_bound: Some(3),
        ..Model::exhaustive("scoped reconfigure: requests vs switch", 4)
    }
    .check(global_switch_racing_requests(
        &[2, 3],
        &[4, 5],
        Ask::Decision,
        &after,
    ));
    assert!(after.get() > 0, "no request was ever paid after the switch");
}

/// The same race on a global scope of one limit: its requests are paid on the global
/// scope's own path (a verdict's on the global-only verdict's own path), which a seal
/// sends to the retry loop of the keyed kinds' nest.
#[test]
fn a_switch_racing_requests_on_the_global_path_loses_and_mints_nothing() {
    loom_tests::in_own_process!();
    for ask in [Ask::Decision, Ask::Verdict] {
        let after = Tally::new();
        Model::exhaustive(ask.global_model(), 4).check(global_switch_racing_requests(
            &[2],
            &[4],
            ask,
            &after,
        ));
        assert!(after.get() > 0, "no request was ever paid after the switch");
    }
}

#[test]
fn a_switch_that_does_not_seal_is_caught_on_the_global_path() {
    loom_tests::in_own_process!();
    for ask in [Ask::Decision, Ask::Verdict] {
        let after = Tally::new();
        let message = Model::exhaustive(ask.global_model(), 4).expect_violation(
            &tokengate::mutants::SCOPED_SWITCH_SKIPS_SEAL,
            global_switch_racing_requests(&[2], &[4], ask, &after),
        );
        assert!(message.contains("lost or minted"), "{message}");
    }
}

#[test]
fn a_scoped_switch_that_does_not_seal_is_caught() {
    loom_tests::in_own_process!();
    let after = Tally::new();
    let message = Model {
        preemption_bound: Some(3),
        ..Model::exhaustive("scoped reconfigure: requests vs switch", 4)
    }
    .expect_violation(
        &tokengate::mutants::SCOPED_SWITCH_SKIPS_SEAL,
        global_switch_racing_requests(&[2, 3], &[4, 5], Ask::Decision, &after),
    );
    assert!(message.contains("lost or minted"), "{message}");
}

/// A request paying the global scope and a tenant (its shard's lock held while it pays
/// both) racing a switch of both: paid in both or in neither, each bucket converted
/// with what it had lost.
#[test]
fn a_request_holding_a_map_lock_is_decided_wholly_on_one_generation() {
    loom_tests::in_own_process!();
    let set = |global: u64, tenant: u64| {
        RuleSet::new()
            .rule(
                ScopeKind::Global,
                Rule::new(policy(global)).inherit(Inherit::AsIs),
            )
            .rule(
                ScopeKind::Tenant,
                Rule::new(policy(tenant))
                    .max_keys(4)
                    .shards(1)
                    .inherit(Inherit::AsIs),
            )
            .class(WorkClass::new("one", 1))
    };
    let model = move || {
        spawn_scoped(move || {
            // A fixed hasher: the model must be deterministic.
            let hasher = BuildHasherDefault::<DefaultHasher>::default();
            let limiter = Arc::new(set(2, 2).build_with(Forward::new(), hasher).unwrap());
            let one = limiter.class("one").unwrap();
            let r = Request::new().tenant(TenantId(1));
            // The key exists before the race (its insertion is not what is modelled).
            assert!(limiter.try_acquire(&r, one).unwrap().is_admitted());
            let a = {
                let limiter = limiter.clone();
                spawn_scoped(move || i64::from(limiter.try_acquire(&r, one).unwrap().is_admitted()))
            };
            let s = {
                let limiter = limiter.clone();
                spawn_scoped(move || limiter.reconfigure(set(4, 3)).unwrap())
            };
            let net = 1 + a.join().unwrap();
            let switch = s.join().unwrap();
            let global = limiter.available(&Scope::Global).unwrap();
            let tenant = limiter.available(&Scope::Tenant(TenantId(1))).unwrap();
            assert_eq!(
                (net as f64 + global, net as f64 + tenant),
                (2.0, 2.0),
                "tokens lost or minted: {switch:?}, global {global}, tenant {tenant}"
            );
            // The request came before the switch (the global word had lost 2 then) or after
            // it (1).
            let paid_before = 2.0 - switch.global[0].before;
            assert!(paid_before == 1.0 || paid_before == 2.0, "{switch:?}");
        })
        .join()
        .unwrap()
    };
    // Bounded: exhaustive, 1,712,227 executions (about twelve minutes) once the request
    // pins its generation; three preemptions order each of the request's steps against
    // each of the switch's.
    Model {
        name: "scoped reconfigure: keyed request vs switch",
        threads: 4,
        preemption_bound: Some(3),
    }
    .check(model);
}

/// A key's give-back and a request racing a switch that moves the key from its rule
/// (capacity 2) to a tier (capacity 3), as is: every token is accounted for, on
/// whichever maps the key is in when each lands.
fn tier_move_racing_a_give_back_and_a_request() {
    let set = |gold: bool| {
        let s = RuleSet::new()
            .rule(
                ScopeKind::Tenant,
                Rule::new(policy(2))
                    .max_keys(4)
                    .shards(1)
                    .inherit(Inherit::AsIs),
            )
            .tier("gold", vec![policy(3)])
            .class(WorkClass::new("one", 1));
        if gold {
            s.override_key(Scope::Tenant(TenantId(1)), "gold")
        } else {
            s
        }
    };
    spawn_scoped(move || {
        // A fixed hasher: the model must be deterministic.
        let hasher = BuildHasherDefault::<DefaultHasher>::default();
        let limiter = Arc::new(set(false).build_with(Forward::new(), hasher).unwrap());
        let one = limiter.class("one").unwrap();
        let r = Request::new().tenant(TenantId(1));
        let charge = limiter.try_acquire(&r, one).unwrap().charge().unwrap();
        let a = {
            let limiter = limiter.clone();
            spawn_scoped(move || {
                limiter.refund(&charge);
                i64::from(limiter.try_acquire(&r, one).unwrap().is_admitted())
            })
        };
        let s = {
            let limiter = limiter.clone();
            spawn_scoped(move || limiter.reconfigure(set(true)).unwrap())
        };
        let net = a.join().unwrap();
        s.join().unwrap();
        let tenant = limiter.available(&Scope::Tenant(TenantId(1))).unwrap();
        assert_eq!(
            limiter.policies_for(&Scope::Tenant(TenantId(1))).unwrap()[0].capacity(),
            3
        );
        assert_eq!(
            net as f64 + tenant,
            2.0,
            "tokens lost or minted by the move: net taken {net}, {tenant} left"
        );
    })
    .join()
    .unwrap()
}

#[test]
fn a_tier_move_racing_a_give_back_and_a_request_loses_and_mints_nothing() {
    loom_tests::in_own_process!();
    Model::exhaustive("scoped reconfigure: tier move vs give-back", 4)
        .check(tier_move_racing_a_give_back_and_a_request);
}

#[test]
fn a_give_back_that_does_not_recheck_its_generation_is_caught() {
    loom_tests::in_own_process!();
    let message = Model::exhaustive("scoped reconfigure: tier move vs give-back", 4)
        .expect_violation(
            &tokengate::mutants::SCOPED_REFUND_SKIPS_RECHECK,
            tier_move_racing_a_give_back_and_a_request,
        );
    assert!(message.contains("lost or minted"), "{message}");
}

/// A key's give-back and a request racing a switch back to a tier layout the kind had:
/// the key was moved to "gold" (table T) and back to its rule before the model, so the
/// switch fills T's emptied maps again rather than laying out new ones. A request or
/// give-back of the generation before (which routes the key to its rule) may reach
/// T's maps only on the switch's generation; one that read an older generation routing
/// it to T (the first, before the model's two switches) is stale and starts again.
/// Rule and tier both hold 2, as is: every token is accounted for.
fn tier_layout_refilled_racing_a_give_back_and_a_request() {
    let set = |gold: bool| {
        let s = RuleSet::new()
            .rule(
                ScopeKind::Tenant,
                Rule::new(policy(2))
                    .max_keys(4)
                    .shards(1)
                    .inherit(Inherit::AsIs),
            )
            .tier("gold", vec![policy(2)])
            .class(WorkClass::new("one", 1));
        if gold {
            s.override_key(Scope::Tenant(TenantId(1)), "gold")
        } else {
            s
        }
    };
    spawn_scoped(move || {
        let hasher = BuildHasherDefault::<DefaultHasher>::default();
        let limiter = Arc::new(set(true).build_with(Forward::new(), hasher).unwrap());
        let one = limiter.class("one").unwrap();
        let r = Request::new().tenant(TenantId(1));
        // Paid in gold (table T), then the key goes back to its rule: T is emptied.
        let charge = limiter.try_acquire(&r, one).unwrap().charge().unwrap();
        limiter.reconfigure(set(false)).unwrap();
        let a = {
            let limiter = limiter.clone();
            spawn_scoped(move || {
                limiter.refund(&charge);
                i64::from(limiter.try_acquire(&r, one).unwrap().is_admitted())
            })
        };
        let s = {
            let limiter = limiter.clone();
            spawn_scoped(move || limiter.reconfigure(set(true)).unwrap())
        };
        let net = a.join().unwrap();
        s.join().unwrap();
        let tenant = limiter.available(&Scope::Tenant(TenantId(1))).unwrap();
        assert_eq!(
            limiter.len(ScopeKind::Tenant),
            1,
            "one entry for the one key"
        );
        assert_eq!(
            net as f64 + tenant,
            2.0,
            "tokens lost or minted by the refill: net taken {net}, {tenant} left"
        );
    })
    .join()
    .unwrap()
}

#[test]
fn a_tier_layout_refilled_racing_a_give_back_and_a_request_loses_and_mints_nothing() {
    loom_tests::in_own_process!();
    Model::exhaustive("scoped reconfigure: tier table refilled vs give-back", 4)
        .check(tier_layout_refilled_racing_a_give_back_and_a_request);
}

#[test]
fn a_give_back_on_a_refilled_table_that_does_not_recheck_is_caught() {
    loom_tests::in_own_process!();
    let message = Model::exhaustive("scoped reconfigure: tier table refilled vs give-back", 4)
        .expect_violation(
            &tokengate::mutants::SCOPED_REFUND_SKIPS_RECHECK,
            tier_layout_refilled_racing_a_give_back_and_a_request,
        );
    assert!(message.contains("lost or minted"), "{message}");
}
