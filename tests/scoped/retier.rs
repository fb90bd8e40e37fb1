//! Moving keys between tiers in a running `ScopedLimiter`: a reconfiguration that
//! overrides keys anew, takes overrides away or adds, renames or removes tiers moves each
//! key's buckets to its new maps, converted with its kind's strategy as of the switch;
//! keys that would not fit the rule's map are refused whole; give-backs across a move
//! are converted; requests and give-backs racing moves neither lose nor mint tokens.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use proptest::strategy::Strategy;
use tokengate::scope::*;
use tokengate::telemetry::CounterSnapshot;
use tokengate::{Inherit, ManualClock, Policy};

use crate::support::p;

fn tenant(t: u64) -> Scope {
    Scope::Tenant(TenantId(t))
}

/// Tenants 10 per key, tier "gold" 100, tier "silver" 50; class "one" costs 1 tenant
/// token; `overrides` lists each overridden tenant and its tier.
fn rules(how: Inherit, max_keys: usize, overrides: &[(u64, &str)]) -> RuleSet {
    let mut set = RuleSet::new()
        .rule(
            ScopeKind::Tenant,
            Rule::new(p(10, 1.0)).max_keys(max_keys).inherit(how),
        )
        .tier("gold", vec![p(100, 10.0)])
        .tier("silver", vec![p(50, 5.0)])
        .class(WorkClass::new("one", 1));
    for &(t, tier) in overrides {
        set = set.override_key(tenant(t), tier);
    }
    set
}

fn take(limiter: &ScopedLimiter<ManualClock>, t: u64, n: usize) {
    let one = limiter.class("one").unwrap();
    let r = Request::new().tenant(TenantId(t));
    for _ in 0..n {
        assert!(limiter.try_acquire(&r, one).unwrap().is_admitted());
    }
}

#[test]
fn keys_move_between_the_rule_and_tiers_with_their_kinds_strategy() {
    // Before: tenant 1 (rule) 4 of 10, tenant 2 (gold) 60 of 100, tenant 3 (rule)
    // untouched. After: 1 in gold, 2 back in the rule, 3 in silver (a key that never
    // came: it starts there as a new key, full), 4 untouched.
    let cases = [
        (Inherit::Proportional, 40.0, 6.0, 50.0),
        (Inherit::AsIs, 4.0, 10.0, 50.0),
        (Inherit::Reset, 100.0, 10.0, 50.0),
        // 4 + (100 - 10); 60 - (100 - 10), down to zero.
        (Inherit::Additive, 94.0, 0.0, 50.0),
    ];
    for (how, t1, t2, t3) in cases {
        let clock = ManualClock::new();
        let limiter = rules(how, 100, &[(2, "gold")])
            .build_with_clock(clock.clone())
            .unwrap();
        take(&limiter, 1, 6);
        take(&limiter, 2, 40);
        assert_eq!(limiter.len(ScopeKind::Tenant), 2);
        let done = limiter
            .reconfigure(rules(how, 100, &[(1, "gold"), (3, "silver")]))
            .unwrap();
        assert_eq!(done.reconfigurations, 1);
        assert_eq!(done.maps, 2, "{how:?}: gold's and silver's new maps");
        assert_eq!(limiter.available(&tenant(1)), Some(t1), "{how:?}");
        assert_eq!(limiter.available(&tenant(2)), Some(t2), "{how:?}");
        assert_eq!(limiter.available(&tenant(3)), Some(t3), "{how:?}");
        assert_eq!(limiter.available(&tenant(4)), Some(10.0), "{how:?}");
        let capacity = |t| limiter.policies_for(&tenant(t)).unwrap()[0].capacity();
        assert_eq!((capacity(1), capacity(2), capacity(3)), (100, 10, 50));
        // Each key decides on its new bucket.
        let one = limiter.class("one").unwrap();
        let r = Request::new().tenant(TenantId(1));
        let d = limiter.try_acquire(&r, one).unwrap();
        assert!(d.is_admitted());
        assert_eq!(limiter.available(&tenant(1)), Some(t1 - 1.0), "{how:?}");
        let remaining = d.decision(tenant(1)).unwrap().tokens_remaining();
        assert_eq!(remaining, t1 - 1.0, "{how:?}: decided on the new bucket");
    }
}

#[test]
fn a_key_without_a_bucket_starts_in_its_new_tier_as_a_new_key() {
    // Tenant 5 never came: in gold it is a new key there (full), as it would be in a
    // limiter built with the override, and as a map switched in place treats it.
    let clock = ManualClock::new();
    let limiter = rules(Inherit::AsIs, 100, &[])
        .build_with_clock(clock.clone())
        .unwrap();
    limiter
        .reconfigure(rules(Inherit::AsIs, 100, &[(5, "gold")]))
        .unwrap();
    assert_eq!(limiter.available(&tenant(5)), Some(100.0));
    assert_eq!(limiter.len(ScopeKind::Tenant), 0);
    // Back to the rule: no entry either.
    limiter.reconfigure(rules(Inherit::AsIs, 100, &[])).unwrap();
    assert_eq!(limiter.available(&tenant(5)), Some(10.0));
    assert_eq!(limiter.len(ScopeKind::Tenant), 0);
    // Into a start-empty tier: empty, as a new key of it; no bucket is made for it.
    let empty = RuleSet::new()
        .rule(
            ScopeKind::Tenant,
            Rule::new(p(10, 1.0)).inherit(Inherit::Proportional),
        )
        .tier("gold", vec![p(100, 10.0).start_empty()])
        .class(WorkClass::new("one", 1));
    let limiter = empty.clone().build_with_clock(clock.clone()).unwrap();
    limiter
        .reconfigure(empty.override_key(tenant(5), "gold"))
        .unwrap();
    assert_eq!(limiter.available(&tenant(5)), Some(0.0));
    assert_eq!(limiter.len(ScopeKind::Tenant), 0);
}

#[test]
fn a_keys_counts_move_with_it_and_none_are_lost() {
    // Counters on: tenant 1 moves between the rule and gold ten times (reset: its bucket
    // starts anew each time, so its counters go to the evicted counts); every admission
    // stays counted, in the key's counters or the evicted ones.
    let set = |gold: bool| {
        let s = RuleSet::new()
            .rule(
                ScopeKind::Tenant,
                Rule::new(p(10, 1.0)).counters(true).inherit(Inherit::Reset),
            )
            .tier("gold", vec![p(100, 10.0)])
            .class(WorkClass::new("one", 1));
        if gold {
            s.override_key(tenant(1), "gold")
        } else {
            s
        }
    };
    for how_many in [3, 10] {
        let limiter = set(false).build_with_clock(ManualClock::new()).unwrap();
        for round in 0..10 {
            take(&limiter, 1, how_many);
            limiter.reconfigure(set(round % 2 == 0)).unwrap();
        }
        let counted = |s: Option<CounterSnapshot>| s.map_or(0, |s| s.total().admitted_requests);
        let key = counted(limiter.counters(&tenant(1)));
        let evicted = limiter
            .evicted_counters(ScopeKind::Tenant)
            .total()
            .admitted_requests;
        assert_eq!(
            key + evicted,
            10 * how_many as u64,
            "key {key}, evicted {evicted}"
        );
    }
}

#[test]
fn tiers_are_added_renamed_and_removed_and_keys_between_them_keep_their_tokens() {
    let clock = ManualClock::new();
    let set = |tiers: &[(&str, Policy)], overrides: &[(u64, &str)]| {
        let mut s = RuleSet::new()
            .rule(
                ScopeKind::Tenant,
                Rule::new(p(10, 1.0)).inherit(Inherit::Proportional),
            )
            .class(WorkClass::new("one", 1));
        for &(name, policy) in tiers {
            s = s.tier(name, vec![policy]);
        }
        for &(t, tier) in overrides {
            s = s.override_key(tenant(t), tier);
        }
        s
    };
    let limiter = set(&[("gold", p(100, 10.0))], &[(1, "gold"), (2, "gold")])
        .build_with_clock(clock.clone())
        .unwrap();
    take(&limiter, 1, 30);
    take(&limiter, 2, 50);
    // Renamed with the same policy: the words move as they are.
    limiter
        .reconfigure(set(
            &[("premium", p(100, 10.0))],
            &[(1, "premium"), (2, "premium")],
        ))
        .unwrap();
    assert_eq!(limiter.available(&tenant(1)), Some(70.0));
    assert_eq!(limiter.available(&tenant(2)), Some(50.0));
    // Split between two tiers, one new.
    limiter
        .reconfigure(set(
            &[("premium", p(100, 10.0)), ("bronze", p(20, 1.0))],
            &[(1, "premium"), (2, "bronze")],
        ))
        .unwrap();
    assert_eq!(limiter.available(&tenant(1)), Some(70.0));
    assert_eq!(limiter.available(&tenant(2)), Some(10.0), "50/100 of 20");
    // Every tier gone: the keys are back in the rule.
    limiter.reconfigure(set(&[], &[])).unwrap();
    assert_eq!(limiter.available(&tenant(1)), Some(7.0));
    assert_eq!(limiter.available(&tenant(2)), Some(5.0));
    assert_eq!(limiter.reconfigurations(), 3);
    assert_eq!(limiter.len(ScopeKind::Tenant), 2);
}

#[test]
fn a_tier_with_other_limits_keeps_the_ones_both_have() {
    // The rule: 10 with a slow second limit of 30; tier "bulk": one limit of 100.
    let set = |overrides: &[(u64, &str)]| {
        let mut s = RuleSet::new()
            .rule(
                ScopeKind::User,
                Rule::with_policies(vec![p(10, 1.0), p(30, 0.1)])
                    .unwrap()
                    .inherit(Inherit::AsIs),
            )
            .tier("bulk", vec![p(100, 10.0)])
            .class(WorkClass::new("one", 1));
        for &(u, tier) in overrides {
            s = s.override_key(Scope::User(UserId(u)), tier);
        }
        s
    };
    let user = Scope::User(UserId(7));
    let limiter = set(&[]).build_with_clock(ManualClock::new()).unwrap();
    let one = limiter.class("one").unwrap();
    let r = Request::new().user(UserId(7));
    for _ in 0..6 {
        assert!(limiter.try_acquire(&r, one).unwrap().is_admitted());
    }
    assert_eq!(limiter.available_in(&user, 1), Some(24.0));
    limiter.reconfigure(set(&[(7, "bulk")])).unwrap();
    // Limit 0 as is (4 of 100); limit 1 goes with the tier that lacks it.
    assert_eq!(limiter.available(&user), Some(4.0));
    assert_eq!(limiter.available_in(&user, 1), None);
    limiter.reconfigure(set(&[])).unwrap();
    // Back: limit 0 as is; limit 1 starts as a new key's would (full).
    assert_eq!(limiter.available(&user), Some(4.0));
    assert_eq!(limiter.available_in(&user, 1), Some(30.0));
}

#[test]
fn keys_leaving_tiers_must_fit_the_rules_map_or_nothing_changes() {
    let clock = ManualClock::new();
    // The rule's map holds 2 keys: tenants 1 and 2 fill it; tenant 9 is gold.
    let limiter = rules(Inherit::AsIs, 2, &[(9, "gold")])
        .build_with_clock(clock.clone())
        .unwrap();
    take(&limiter, 1, 1);
    take(&limiter, 2, 1);
    take(&limiter, 9, 30);
    let before = [1, 2, 9].map(|t| limiter.stored_word(&tenant(t)));
    assert_eq!(
        limiter
            .reconfigure(rules(Inherit::AsIs, 2, &[]))
            .unwrap_err(),
        RuleError::Reshape(Reshape::TierRoom {
            kind: ScopeKind::Tenant,
            keys: 1,
            room: 0,
        })
    );
    assert_eq!(limiter.reconfigurations(), 0);
    // Refused with policies the limiter never had: they are not stored either.
    let other = RuleSet::new()
        .rule(
            ScopeKind::Tenant,
            Rule::new(p(12, 1.0)).max_keys(2).inherit(Inherit::AsIs),
        )
        .tier("gold", vec![p(100, 10.0)])
        .tier("silver", vec![p(50, 5.0)])
        .class(WorkClass::new("one", 1));
    assert!(matches!(
        limiter.reconfigure(other),
        Err(RuleError::Reshape(Reshape::TierRoom { .. }))
    ));
    assert_eq!(limiter.stored_configurations(), 1);
    assert_eq!([1, 2, 9].map(|t| limiter.stored_word(&tenant(t))), before);
    assert_eq!(limiter.available(&tenant(9)), Some(70.0));
    assert_eq!(limiter.policies_for(&tenant(9)).unwrap()[0].capacity(), 100);
    // Tenant 1 leaving for silver makes room for tenant 9.
    limiter
        .reconfigure(rules(Inherit::AsIs, 2, &[(1, "silver")]))
        .unwrap();
    assert_eq!(
        limiter.available(&tenant(9)),
        Some(10.0),
        "70, capped at 10"
    );
    assert_eq!(limiter.available(&tenant(1)), Some(9.0));
    // Tenant 9 full (no entry kept), 2 in the rule, 1 in silver.
    assert_eq!(limiter.len(ScopeKind::Tenant), 2);
}

#[test]
fn a_give_back_across_a_move_gives_back_what_the_move_made_of_the_take() {
    // Tenant 1 takes 4 of 10, then moves to gold (100): a refund afterwards leaves it
    // where the move alone would have (as if the 4 had not been taken).
    for (how, after_move, after_refund) in [
        (Inherit::Proportional, 60.0, 100.0),
        (Inherit::AsIs, 6.0, 10.0),
        (Inherit::Reset, 100.0, 100.0),
        (Inherit::Additive, 96.0, 100.0),
    ] {
        let limiter = rules(how, 100, &[])
            .build_with_clock(ManualClock::new())
            .unwrap();
        let one = limiter.class("one").unwrap();
        let r = Request::new().tenant(TenantId(1));
        let mut charges = Vec::new();
        for _ in 0..4 {
            charges.push(limiter.try_acquire(&r, one).unwrap().charge().unwrap());
        }
        limiter
            .reconfigure(rules(how, 100, &[(1, "gold")]))
            .unwrap();
        assert_eq!(limiter.available(&tenant(1)), Some(after_move), "{how:?}");
        for c in &charges {
            limiter.refund(c);
        }
        assert_eq!(limiter.available(&tenant(1)), Some(after_refund), "{how:?}");
    }
}

#[test]
fn requests_and_give_backs_racing_moves_neither_lose_nor_mint_tokens() {
    // Every tier and the rule hold 100 tokens (other rates, a frozen clock): as is, a
    // move keeps every token. Two threads pay and give back 63 of 64 admissions on
    // tenants 0..8 while a third moves the tenants between the rule and the tiers.
    let set = |round: u64| {
        let mut s = RuleSet::new()
            .rule(
                ScopeKind::Tenant,
                Rule::new(p(100, 1.0)).inherit(Inherit::AsIs),
            )
            .tier("a", vec![p(100, 2.0)])
            .tier("b", vec![p(100, 3.0)])
            .class(WorkClass::new("one", 1));
        for t in 0..8u64 {
            match (t + round) % 3 {
                0 => {}
                1 => s = s.override_key(tenant(t), "a"),
                _ => s = s.override_key(tenant(t), "b"),
            }
        }
        s
    };
    let clock = ManualClock::new();
    let limiter = Arc::new(set(0).build_with_clock(clock).unwrap());
    let one = limiter.class("one").unwrap();
    let net = Arc::new(AtomicI64::new(0));
    // Refunds made more than 16 moves after their payment, which may give nothing back
    // (the limiter keeps that many replaced configurations): tokens that may be missing.
    let late = Arc::new(AtomicI64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2u64)
        .map(|w| {
            let (limiter, net, stop) = (Arc::clone(&limiter), Arc::clone(&net), Arc::clone(&stop));
            let late = Arc::clone(&late);
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) || i < 20_000 {
                    let t = (i * 7 + w * 3) % 8;
                    let r = Request::new().tenant(TenantId(t));
                    let paid_after = limiter.reconfigurations();
                    let d = limiter.try_acquire(&r, one).unwrap();
                    if let Some(c) = d.charge() {
                        if i.is_multiple_of(64) {
                            net.fetch_add(1, Ordering::Relaxed);
                        } else {
                            limiter.refund(&c);
                            if limiter.reconfigurations() - paid_after > 16 {
                                late.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    i += 1;
                }
            })
        })
        .collect();
    for round in 1..=300 {
        limiter.reconfigure(set(round)).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    // Exact but for the refunds that came too late: none minted, none lost in the window.
    let left: f64 = (0..8).map(|t| limiter.available(&tenant(t)).unwrap()).sum();
    let (accounted, late) = (
        left + net.load(Ordering::Relaxed) as f64,
        late.load(Ordering::Relaxed),
    );
    assert!(
        accounted <= 800.0 && accounted >= 800.0 - late as f64,
        "tokens lost or minted across the moves ({left} left, {accounted} accounted for, {late} refunded late)"
    );
    assert_eq!(limiter.reconfigurations(), 300);
}

#[test]
fn requests_racing_moves_leave_no_stray_entries_and_every_count() {
    // Two threads pay tenant 1 while a third moves it between the rule and gold 2,000
    // times (as is). A request that waited out a move on its old map must not leave an
    // entry there: the key has one entry in all, and every admission is counted in its
    // counters or the evicted ones.
    let set = |gold: bool| {
        let s = RuleSet::new()
            .rule(
                ScopeKind::Tenant,
                Rule::new(p(1_000_000, 1.0))
                    .counters(true)
                    .inherit(Inherit::AsIs),
            )
            .tier("gold", vec![p(1_000_000, 2.0)])
            .class(WorkClass::new("one", 1));
        if gold {
            s.override_key(tenant(1), "gold")
        } else {
            s
        }
    };
    let limiter = Arc::new(set(false).build_with_clock(ManualClock::new()).unwrap());
    let one = limiter.class("one").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (limiter, stop) = (Arc::clone(&limiter), Arc::clone(&stop));
            std::thread::spawn(move || {
                let r = Request::new().tenant(TenantId(1));
                let mut admitted = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    admitted += u64::from(limiter.try_acquire(&r, one).unwrap().is_admitted());
                }
                admitted
            })
        })
        .collect();
    let mut strays = 0;
    for round in 0..2_001 {
        limiter.reconfigure(set(round % 2 == 0)).unwrap();
        std::thread::yield_now();
        strays += usize::from(limiter.len(ScopeKind::Tenant) > 1);
    }
    stop.store(true, Ordering::Relaxed);
    let admitted: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert_eq!(strays, 0, "rounds that saw a second entry for the one key");
    assert_eq!(
        limiter.len(ScopeKind::Tenant),
        1,
        "one entry for the one key"
    );
    let key = limiter
        .counters(&tenant(1))
        .map_or(0, |s| s.total().admitted_requests);
    let evicted = limiter
        .evicted_counters(ScopeKind::Tenant)
        .total()
        .admitted_requests;
    assert_eq!(key + evicted, admitted, "key {key}, evicted {evicted}");
    assert_eq!(
        limiter.available(&tenant(1)),
        Some(1_000_000.0 - admitted as f64)
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

    /// Random histories on real nanoseconds: four tenants paying while their tiers
    /// change (rule, "a", "b", with changing policies, start-empty ones among them) at
    /// random readings with random strategies decide as one live bucket per tenant,
    /// made on its first request with its tier's policy then, and switched to its new
    /// tier's policy at the same readings with the same strategy; a key that moved and
    /// ended full under a start-full policy is a new key again (its map keeps no entry
    /// for it, as for one that never came).
    #[test]
    fn keys_moving_between_tiers_decide_as_live_buckets_switched_at_the_same_readings(
        start in 0u64..(1 << 40),
        steps in proptest::collection::vec(
            proptest::prop_oneof![
                3 => (0u64..2_000_000_000).prop_map(|d| (0u8, d)),
                6 => (0u64..1_000).prop_map(|c| (1u8, c)),
                1 => (0u64..1_000_000).prop_map(|s| (2u8, s)),
            ],
            1..80,
        ),
    ) {
        use tokengate::LiveBucket;
        let policies = [
            p(8, 3.0),
            p(50, 100.0),
            Policy::new(5, 0.25).unwrap().start_empty(),
            p(200, 7.0),
            Policy::new(40, 2.0).unwrap().start_empty(),
        ];
        // A configuration: the rule's, a's and b's policy, each tenant's tier (0: the
        // rule), the strategy.
        let set = |pol: [usize; 3], tiers: [usize; 4], how: Inherit| {
            let mut set = RuleSet::new()
                .rule(
                    ScopeKind::Tenant,
                    Rule::new(policies[pol[0]]).max_keys(64).inherit(how),
                )
                .tier("a", vec![policies[pol[1]]])
                .tier("b", vec![policies[pol[2]]]);
            for (t, &tier) in tiers.iter().enumerate() {
                if tier > 0 {
                    set = set.override_key(tenant(t as u64), ["a", "b"][tier - 1]);
                }
            }
            for c in 1..=5 {
                set = set.class(WorkClass::new(format!("c{c}"), c));
            }
            set
        };
        let policy_of = |pol: [usize; 3], tier: usize| policies[pol[tier]];
        let clock = ManualClock::new();
        clock.set(std::time::Duration::from_nanos(start));
        let (mut pol, mut tiers) = ([0, 1, 3], [0, 0, 1, 2]);
        let limiter = set(pol, tiers, Inherit::Reset).build_with_clock(clock.clone()).unwrap();
        let classes: Vec<ClassId> = (1..=5).map(|c| limiter.class(&format!("c{c}")).unwrap()).collect();
        let mut model: Vec<Option<LiveBucket<ManualClock>>> = (0..4).map(|_| None).collect();
        for (i, (kind, v)) in steps.into_iter().enumerate() {
            match kind {
                0 => clock.advance(std::time::Duration::from_nanos(v)),
                1 => {
                    let t = (v % 4) as usize;
                    let cost = 1 + (v / 4) % 5;
                    let d = limiter
                        .try_acquire(&Request::new().tenant(TenantId(t as u64)), classes[cost as usize - 1])
                        .unwrap();
                    let b = model[t].get_or_insert_with(|| LiveBucket::with_clock(policy_of(pol, tiers[t]), clock.clone()));
                    let m = b.try_acquire(cost).unwrap();
                    proptest::prop_assert_eq!(d.is_admitted(), m.is_admitted(), "step {} tenant {} cost {}", i, t, cost);
                }
                _ => {
                    let next_pol = [(v % 5) as usize, ((v / 5) % 5) as usize, ((v / 25) % 5) as usize];
                    let next_tiers = [0, 1, 2, 3].map(|t| ((v / 125 / 3u64.pow(t)) % 3) as usize);
                    let how = tokengate_testkit::reconfigure::STRATEGIES[((v / 10_125) % 4) as usize];
                    // Every capacity holds every class (at most 5): always taken.
                    limiter.reconfigure(set(next_pol, next_tiers, how)).unwrap();
                    // New overrides lay the tiers out anew: every key overridden before
                    // or after moves to new maps; a moved bucket that ends full under a
                    // start-full policy is a new key's (no entry kept). Otherwise each
                    // map switches in place.
                    let retier = tiers != next_tiers;
                    for t in 0..4 {
                        let (from, to) = (policy_of(pol, tiers[t]), policy_of(next_pol, next_tiers[t]));
                        let moved = retier && (tiers[t] > 0 || next_tiers[t] > 0);
                        if from == to {
                            continue;
                        }
                        if let Some(b) = &model[t] {
                            b.reconfigure(to, how);
                            if moved && to.starts_full() && b.available() == to.capacity() as f64 {
                                model[t] = None;
                            }
                        }
                    }
                    pol = next_pol;
                    tiers = next_tiers;
                }
            }
        }
    }
}

#[test]
fn a_tier_layout_switched_back_to_counts_what_its_keys_evicted_once() {
    // Tenant 1 in gold, evicted there by a sweep once full again; the kind then switches
    // away from gold and back, twice: the eviction's counts join the rule's once, and a
    // table filled again counts only what it evicts from then on.
    let set = |gold: bool| {
        let s = RuleSet::new()
            .rule(
                ScopeKind::Tenant,
                Rule::new(p(10, 1.0)).counters(true).inherit(Inherit::AsIs),
            )
            .tier("gold", vec![p(100, 10.0)])
            .class(WorkClass::new("one", 1));
        if gold {
            s.override_key(tenant(1), "gold")
        } else {
            s
        }
    };
    let clock = ManualClock::new();
    let limiter = set(true).build_with_clock(clock.clone()).unwrap();
    take(&limiter, 1, 5);
    clock.advance(std::time::Duration::from_secs(100));
    limiter.sweep();
    let evicted = |l: &ScopedLimiter<ManualClock>| {
        l.evicted_counters(ScopeKind::Tenant)
            .total()
            .admitted_requests
    };
    assert_eq!(evicted(&limiter), 5, "evicted by the sweep");
    for round in 0..4 {
        limiter.reconfigure(set(round % 2 == 1)).unwrap();
        assert_eq!(evicted(&limiter), 5, "after switch {round}");
    }
    take(&limiter, 1, 2);
    assert_eq!(
        limiter
            .counters(&tenant(1))
            .map(|s| s.total().admitted_requests),
        Some(2)
    );
}
