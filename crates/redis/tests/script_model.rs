//! The exchange script against its Rust model (`tokengate_redis::model`) on a real Redis,
//! with the test clock prologue so time is exact.

mod common;

use proptest::prelude::*;
use tokengate_redis::model::ModelBucket;
use tokengate_redis::script::{
    BucketKeys, Exchange, Outcome, Reply, Scripts, Take, Target, TimeSource,
};
use tokengate_redis::{Mode, RemotePolicy, Start, UNITS_PER_TOKEN};

const KEEP_MS: u64 = 600_000;
const T0: u64 = 1_700_000_000_000_000;

struct Rig {
    con: redis::Connection,
    scripts: Scripts,
    keys: BucketKeys,
    policy: RemotePolicy,
    lease_us: u64,
    model: ModelBucket,
}

impl Rig {
    fn new(test: &str, policy: RemotePolicy, lease_us: u64) -> Self {
        let keys = BucketKeys::new(&common::namespace(test), "global").unwrap();
        Self {
            con: common::connect(),
            scripts: Scripts::new(TimeSource::Argument),
            keys,
            policy,
            lease_us,
            model: ModelBucket::new(),
        }
    }

    /// Runs `ex` at `now` on Redis and on the model; asserts both agree, reply and state.
    fn run(&mut self, ex: &Exchange, now: u64) -> tokengate_redis::script::Reply {
        let got = self
            .scripts
            .exchange(
                &mut self.con,
                &Target {
                    keys: &self.keys,
                    policy: &self.policy,
                    lease_us: self.lease_us,
                    keep_ms: KEEP_MS,
                },
                ex,
                now,
            )
            .expect("exchange");
        let want = self.model.exchange(&self.policy, self.lease_us, ex, now);
        assert_eq!(got, want, "reply of {ex:?} at {now}");
        let stored = common::read_bucket(&mut self.con, &self.keys);
        assert_eq!(stored, self.model, "state after {ex:?} at {now}");
        got
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        common::delete(&mut self.con, &self.keys);
    }
}

/// An ideal token bucket of `B` and `r`, written from the definition and sharing no step
/// with the script: it sees only what was granted, settled and credited, and when. A lease
/// is open from its grant until its settlement (then `granted - unspent` of it may have
/// been spent) or, when it was reclaimed, until its reclaim time (then all of it). In any
/// window `[s, e]` the leases open in it may have spent at most
/// `B + r*(e - s) + credits so far`: the bound `admitted(T) <= B + r*T` in exact mode.
/// One lease as the ideal bucket sees it.
struct IdealLease {
    granted_at: u64,
    tokens: u64,
    reclaim_at: u64,
    /// (time, unspent tokens) when it was settled.
    settled: Option<(u64, u64)>,
}

#[derive(Default)]
struct Ideal {
    leases: Vec<IdealLease>,
    /// Lease id -> index in `leases`, while Redis holds it.
    open: std::collections::BTreeMap<String, usize>,
    /// (time, units) of each credit.
    credits: Vec<(u64, u64)>,
    /// The latest time seen (a clock behind it moves nothing back).
    at: u64,
}

impl Ideal {
    /// Records one exchange at `now`, its reply, and the lease ids Redis holds after it.
    fn observe(&mut self, ex: &Exchange, reply: &Reply, now: u64, held: &ModelBucket) {
        self.at = self.at.max(now);
        let at = self.at;
        let gone: Vec<String> = self
            .open
            .keys()
            .filter(|id| !held.leases.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            let i = self.open.remove(&id).unwrap();
            let lease = &mut self.leases[i];
            let settled = ex.settle.iter().find(|(s, _)| *s == id);
            if let Some((_, unspent)) = settled.filter(|_| now < lease.reclaim_at) {
                lease.settled = Some((at, (*unspent).min(lease.tokens)));
            }
        }
        let first = match reply.outcome {
            Outcome::Granted {
                tokens,
                reclaim_at_us,
            } => Some((tokens, reclaim_at_us)),
            _ => None,
        };
        let fresh = ex
            .request_id
            .iter()
            .zip(first)
            .chain(ex.more.iter().zip(reply.more.iter().copied()));
        for (id, (g, reclaim_at)) in fresh {
            if g > 0 && !self.open.contains_key(id) {
                self.open.insert(id.clone(), self.leases.len());
                self.leases.push(IdealLease {
                    granted_at: at,
                    tokens: g,
                    reclaim_at,
                    settled: None,
                });
            }
        }
        if ex.credit_units > 0 {
            self.credits.push((at, ex.credit_units));
        }
    }

    /// The window where the leases spent most above the bound: (spent units, allowed
    /// units, start, end), or `None` when every window is within it.
    fn worst(&self, policy: &RemotePolicy) -> Option<(u64, u64, u64, u64)> {
        let spans: Vec<(u64, u64, u64)> = self
            .leases
            .iter()
            .map(|l| match l.settled {
                Some((t, unspent)) => (l.granted_at, t, l.tokens - unspent),
                None => (l.granted_at, l.reclaim_at.max(l.granted_at), l.tokens),
            })
            .collect();
        let mut worst: Option<(u64, u64, u64, u64)> = None;
        for &(e, _, _) in &spans {
            let credits: u64 = self
                .credits
                .iter()
                .filter(|(t, _)| *t <= e)
                .map(|(_, c)| c)
                .sum();
            let starts = spans.iter().map(|&(_, to, _)| to).chain([e]);
            for s in starts.filter(|&s| s <= e) {
                let spent: u64 = spans
                    .iter()
                    .filter(|&&(from, to, _)| from <= e && to >= s)
                    .map(|&(_, _, n)| n * UNITS_PER_TOKEN)
                    .sum();
                let allowed = policy.capacity_units()
                    + ((e - s) * policy.rate_milli()).div_ceil(1000)
                    + credits;
                if spent > allowed && worst.is_none_or(|w| spent - allowed > w.0 - w.1) {
                    worst = Some((spent, allowed, s, e));
                }
            }
        }
        worst
    }
}

fn grant(id: &str, need: u64, want: u64) -> Exchange {
    Exchange {
        request_id: Some(id.to_owned()),
        need,
        want,
        ..Exchange::default()
    }
}

#[derive(Clone, Debug)]
enum Op {
    Grant {
        id: u8,
        need: u64,
        want: u64,
    },
    Settle {
        id: u8,
        unspent: u64,
    },
    GrantSettling {
        id: u8,
        need: u64,
        want: u64,
        old: u8,
        unspent: u64,
    },
    GrantMany {
        id: u8,
        need: u64,
        want: u64,
        more: Vec<u8>,
        old: u8,
        unspent: u64,
    },
    Credit {
        units: u64,
        id: Option<u8>,
    },
    Register {
        id: u8,
        tokens: u64,
    },
    Peek,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..12, 0u64..6, 0u64..60).prop_map(|(id, need, want)| Op::Grant { id, need, want }),
        2 => (0u8..12, 0u64..70).prop_map(|(id, unspent)| Op::Settle { id, unspent }),
        2 => (0u8..12, 0u64..6, 0u64..60, 0u8..12, 0u64..70)
            .prop_map(|(id, need, want, old, unspent)| Op::GrantSettling { id, need, want, old, unspent }),
        2 => (0u8..12, 0u64..6, 0u64..40, prop::collection::vec(0u8..16, 0..5), 0u8..16, 0u64..70)
            .prop_map(|(id, need, want, more, old, unspent)| Op::GrantMany { id, need, want, more, old, unspent }),
        1 => (0u64..5_000_000, prop::option::of(0u8..4)).prop_map(|(units, id)| Op::Credit { units, id }),
        1 => (0u8..12, 0u64..80).prop_map(|(id, tokens)| Op::Register { id, tokens }),
        1 => Just(Op::Peek),
    ]
}

fn to_exchange(op: &Op) -> Exchange {
    let id = |i: &u8| format!("r{i}");
    match op {
        Op::Grant { id: i, need, want } => grant(&id(i), *need, *want),
        Op::Settle { id: i, unspent } => Exchange {
            settle: vec![(id(i), *unspent)],
            ..Exchange::default()
        },
        Op::GrantSettling {
            id: i,
            need,
            want,
            old,
            unspent,
        } => Exchange {
            settle: vec![(id(old), *unspent)],
            ..grant(&id(i), *need, *want)
        },
        Op::GrantMany {
            id: i,
            need,
            want,
            more,
            old,
            unspent,
        } => Exchange {
            settle: vec![(id(old), *unspent)],
            more: more.iter().map(id).collect(),
            ..grant(&id(i), *need, *want)
        },
        Op::Credit { units, id: i } => Exchange {
            credit_units: *units,
            credit_id: i.map(|i| format!("c{i}")),
            ..Exchange::default()
        },
        Op::Register { id: i, tokens } => Exchange {
            register: vec![(id(i), *tokens)],
            ..Exchange::default()
        },
        Op::Peek => Exchange::default(),
    }
}

fn policy() -> impl Strategy<Value = RemotePolicy> {
    (1u64..300, 1u64..2_000_000, any::<bool>(), any::<bool>()).prop_map(
        |(cap, rate_milli, loose, full)| {
            RemotePolicy::new(cap, rate_milli as f64 / 1000.0)
                .unwrap()
                .with_mode(if loose { Mode::Loose } else { Mode::Exact })
                .with_start(if full { Start::Full } else { Start::Empty })
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Random operations at random times (steps back included): Redis and the model agree on
    /// every reply and every stored field, and in exact mode balance + outstanding <= B
    /// (re-registered leases excepted: they restore tokens the lost state had out).
    #[test]
    fn script_matches_model_on_random_sequences(
        policy in policy(),
        lease_us in 1u64..3_000_000,
        steps in prop::collection::vec((op(), -200_000i64..1_500_000), 1..40),
    ) {
        let mut rig = Rig::new("prop", policy, lease_us);
        let mut ideal = Ideal::default();
        let mut now = T0;
        let mut registered = false;
        for (op, dt) in &steps {
            now = now.saturating_add_signed(*dt);
            registered |= matches!(op, Op::Register { .. });
            let ex = to_exchange(op);
            let reply = rig.run(&ex, now);
            ideal.observe(&ex, &reply, now, &rig.model);
            if policy.mode() == Mode::Exact && !registered {
                prop_assert!(
                    reply.balance_units + reply.outstanding * UNITS_PER_TOKEN <= policy.capacity_units(),
                    "balance + outstanding above B: {reply:?}"
                );
            } else {
                prop_assert!(reply.balance_units <= policy.capacity_units());
            }
        }
        if policy.mode() == Mode::Exact && !registered {
            let worst = ideal.worst(&policy);
            prop_assert!(
                worst.is_none(),
                "leases spent above B + r*T (units spent, allowed, window µs from T0): {:?}",
                worst.map(|(n, a, s, e)| (n, a, s - T0, e - T0))
            );
        }
    }
}

/// One lease out, a quiet period while the balance sits at its cap `B - out`, then the
/// lease settled wholly spent and a large grant: the time the balance spent capped is not
/// refilled again once the settlement lowers `out`. (Refilling after the settlement granted
/// 200 here, 80 more than the 120 the bucket holds: 280 tokens spendable within 0 s.)
#[test]
fn a_settlement_after_a_quiet_period_does_not_refill_the_time_spent_at_the_cap() {
    let policy = RemotePolicy::new(200, 100.0).unwrap();
    let mut rig = Rig::new("quiet", policy, 5_000_000);
    let mut ideal = Ideal::default();
    let steps = [
        (grant("a", 1, 80), T0),
        (
            Exchange {
                settle: vec![("a".into(), 0)],
                ..grant("b", 1, 200)
            },
            T0 + 900_000,
        ),
    ];
    for (ex, now) in &steps {
        let reply = rig.run(ex, *now);
        ideal.observe(ex, &reply, *now, &rig.model);
    }
    let worst = ideal.worst(&policy);
    assert!(
        worst.is_none(),
        "B = 200, r = 100/s: leases spent above B + r*T (units spent, allowed, window): {worst:?}"
    );
    // A lease reclaimed mid-way lifts the cap from its reclaim time only.
    let mut rig = Rig::new("quiet-reclaim", policy, 500_000);
    let mut ideal = Ideal::default();
    let steps = [(grant("a", 1, 80), T0), (grant("b", 1, 200), T0 + 900_000)];
    let mut got = Vec::new();
    for (ex, now) in &steps {
        let reply = rig.run(ex, *now);
        ideal.observe(ex, &reply, *now, &rig.model);
        got.push(reply.outcome);
    }
    // 120 at the cap until the reclaim at T0 + 0.5 s, then 0.4 s of refill: 160.
    assert_eq!(
        got[1],
        Outcome::Granted {
            tokens: 160,
            reclaim_at_us: T0 + 1_400_000
        }
    );
    let worst = ideal.worst(&policy);
    assert!(worst.is_none(), "reclaim: {worst:?}");
}

#[test]
fn thousand_small_refills_equal_one_large() {
    let policy = RemotePolicy::new(1000, 333.333)
        .unwrap()
        .with_start(Start::Empty);
    let mut small = Rig::new("small", policy, 1_000_000);
    let mut large = Rig::new("large", policy, 1_000_000);
    let credit = |units| Exchange {
        credit_units: units,
        ..Exchange::default()
    };
    small.run(&credit(1), T0);
    large.run(&credit(1), T0);
    let mut now = T0;
    for i in 0..1000u64 {
        now += 1 + (i * 7919) % 997;
        small.run(&credit(1), now);
    }
    let one = large.run(&credit(1000), now);
    let many = small.run(&Exchange::default(), now);
    assert_eq!(many.balance_units, one.balance_units);
    let state = |r: &mut Rig| common::read_bucket(&mut r.con, &r.keys).state.unwrap();
    assert_eq!(state(&mut small).rem, state(&mut large).rem);
    // The refill is the exact product: 333.333 tokens/s over `now - T0` µs, plus the credits.
    let exact = (now - T0) * 333_333 / 1000 + 1001;
    assert_eq!(one.balance_units, exact);
}

#[test]
fn same_request_id_twice_is_one_grant() {
    let policy = RemotePolicy::new(100, 1.0).unwrap();
    let mut rig = Rig::new("idem", policy, 5_000_000);
    let first = rig.run(&grant("a", 1, 30), T0);
    let again = rig.run(&grant("a", 1, 30), T0 + 10);
    assert_eq!(
        first.outcome,
        Outcome::Granted {
            tokens: 30,
            reclaim_at_us: T0 + 5_000_000
        }
    );
    assert_eq!(
        again.outcome,
        Outcome::Replayed {
            tokens: 30,
            reclaim_at_us: T0 + 5_000_000
        }
    );
    assert_eq!(again.outstanding, 30);
    // Full at B - outstanding: no refill while the lease is out.
    assert_eq!(again.balance_units, 70 * UNITS_PER_TOKEN);
}

#[test]
fn further_grants_in_one_call_are_granted_once_and_replayed_on_retry() {
    let policy = RemotePolicy::new(100, 0.001).unwrap();
    let mut rig = Rig::new("more", policy, 5_000_000);
    let ex = Exchange {
        more: vec!["b".into(), "c".into(), "d".into()],
        ..grant("a", 1, 30)
    };
    let first = rig.run(&ex, T0);
    let at = T0 + 5_000_000;
    assert_eq!(
        first.outcome,
        Outcome::Granted {
            tokens: 30,
            reclaim_at_us: at
        }
    );
    // 70 left: 30, 30, then the 10 that remain.
    assert_eq!(first.more, vec![(30, at), (30, at), (10, at)]);
    assert_eq!(first.outstanding, 100);
    assert_eq!(first.balance_units, 0);
    // The same call again (a lost reply retried): every grant replayed, nothing new.
    let again = rig.run(&ex, T0 + 10);
    assert_eq!(again.more, first.more);
    assert_eq!(again.outstanding, 100);
    // A first grant refused: no further grant either.
    let refused = rig.run(
        &Exchange {
            more: vec!["f".into()],
            ..grant("e", 1, 30)
        },
        T0 + 20,
    );
    assert!(matches!(refused.outcome, Outcome::Rejected { .. }));
    assert_eq!(refused.more, vec![(0, 0)]);
}

#[test]
fn settling_twice_credits_once() {
    let policy = RemotePolicy::new(100, 0.001).unwrap();
    let mut rig = Rig::new("settle2", policy, 5_000_000);
    rig.run(&grant("a", 1, 40), T0);
    let settle = Exchange {
        settle: vec![("a".into(), 25)],
        ..Exchange::default()
    };
    let once = rig.run(&settle, T0);
    let twice = rig.run(&settle, T0);
    assert_eq!(once.balance_units, 85 * UNITS_PER_TOKEN);
    assert_eq!(once.outstanding, 0);
    assert_eq!(twice, once);
}

/// A credit retried under its id (a reply lost after the script ran, a timeout) is
/// applied once; another id is another credit.
#[test]
fn same_credit_id_twice_is_one_credit() {
    let policy = RemotePolicy::new(100, 0.001)
        .unwrap()
        .with_start(Start::Empty);
    let mut rig = Rig::new("credit2", policy, 5_000_000);
    let credit = |id: &str| Exchange {
        credit_units: 40 * UNITS_PER_TOKEN,
        credit_id: Some(id.to_owned()),
        ..Exchange::default()
    };
    let once = rig.run(&credit("c1"), T0);
    let twice = rig.run(&credit("c1"), T0 + 10);
    assert_eq!(once.balance_units, 40 * UNITS_PER_TOKEN);
    assert_eq!(twice.balance_units, 40 * UNITS_PER_TOKEN, "applied twice");
    let other = rig.run(&credit("c2"), T0 + 20);
    assert_eq!(other.balance_units, 80 * UNITS_PER_TOKEN);
}

#[test]
fn reclaim_credits_nothing() {
    let policy = RemotePolicy::new(100, 0.001).unwrap();
    let mut rig = Rig::new("reclaim", policy, 1_000);
    rig.run(&grant("a", 1, 40), T0);
    // A settlement after the reclaim time is too late: the lease is gone, and its tokens too.
    let late = Exchange {
        settle: vec![("a".into(), 40)],
        ..Exchange::default()
    };
    let after = rig.run(&late, T0 + 1_000);
    assert_eq!(after.outstanding, 0);
    // Up to the reclaim time the balance sat at its cap, 60: nothing refilled then.
    assert_eq!(after.balance_units, 60 * UNITS_PER_TOKEN);
}

#[test]
fn rejection_writes_nothing() {
    let policy = RemotePolicy::new(10, 1.0).unwrap();
    let mut rig = Rig::new("reject", policy, 500_000);
    rig.run(&grant("a", 10, 10), T0);
    let before = common::read_bucket(&mut rig.con, &rig.keys);
    // Later, with lease "a" past its reclaim time: the reclaim is seen but not written.
    // Refilled from the reclaim at 0.5 s only: 1.5 tokens, 1.5 s short of 3.
    let no = rig.run(&grant("b", 3, 3), T0 + 2_000_000);
    assert!(
        matches!(
            no.outcome,
            Outcome::Rejected {
                retry_after_us: Some(1_500_000)
            }
        ),
        "{no:?}"
    );
    assert_eq!(common::read_bucket(&mut rig.con, &rig.keys), before);
}

#[test]
fn clock_behind_the_state_adds_nothing() {
    let policy = RemotePolicy::new(100, 10.0)
        .unwrap()
        .with_start(Start::Empty);
    let mut rig = Rig::new("behind", policy, 60_000_000);
    let credit = Exchange {
        credit_units: 1,
        ..Exchange::default()
    };
    rig.run(&credit, T0);
    let back = rig.run(&credit, T0 - 5_000_000);
    assert_eq!(back.balance_units, 2);
    let state = common::read_bucket(&mut rig.con, &rig.keys).state.unwrap();
    assert_eq!(state.ts, T0);
    // Time resumes from the stored T0: one second later, exactly 10 tokens more.
    let later = rig.run(&Exchange::default(), T0 + 1_000_000);
    assert_eq!(later.balance_units, 2 + 10 * UNITS_PER_TOKEN);
}

#[test]
fn largest_policy_refills_exactly_after_years() {
    let cap = RemotePolicy::max_capacity(1000.0);
    let policy = RemotePolicy::new(cap, 1000.0)
        .unwrap()
        .with_start(Start::Empty);
    assert!(RemotePolicy::new(cap + 1, 1000.0).is_err());
    let mut rig = Rig::new("largest", policy, 1_000_000);
    rig.run(&Exchange::default(), T0);
    rig.run(&grant("a", 1, 5), T0 + 9_999_999);
    let year = rig.run(&grant("b", 1, 1), T0 + 3_600_000_000 * 24 * 365 * 20);
    assert_eq!(
        year.balance_units + year.outstanding * UNITS_PER_TOKEN,
        policy.capacity_units()
    );
}

#[test]
fn script_flush_is_recovered_by_reloading() {
    let policy = RemotePolicy::new(10, 1.0).unwrap();
    let mut rig = Rig::new("flush", policy, 1_000_000);
    rig.run(&grant("a", 1, 1), T0);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut rig.con)
        .unwrap();
    let r = rig.run(&grant("b", 1, 1), T0);
    assert_eq!(r.outstanding, 2);
}

fn strict_policy() -> impl Strategy<Value = RemotePolicy> {
    (1u64..40, 1u64..200_000, any::<bool>()).prop_map(|(cap, rate_milli, full)| {
        RemotePolicy::new(cap, rate_milli as f64 / 1000.0)
            .unwrap()
            .with_start(if full { Start::Full } else { Start::Empty })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The strict all-or-nothing take on three buckets equals its model: every reply and
    /// every stored state; a refusal names the first bucket that cannot pay and writes
    /// nothing but the creation of missing keys.
    #[test]
    fn strict_take_matches_model_on_random_sequences(
        policies in [strict_policy(), strict_policy(), strict_policy()],
        steps in prop::collection::vec(
            (prop::sample::subsequence(vec![0usize, 1, 2], 1..=3), 1u64..8, 0u64..600_000),
            1..30,
        ),
    ) {
        let ns = common::namespace("take");
        let keys: Vec<BucketKeys> = ["a", "b", "c"].iter().map(|s| BucketKeys::new(&ns, s).unwrap()).collect();
        let mut models = [ModelBucket::new(), ModelBucket::new(), ModelBucket::new()];
        let mut con = common::connect();
        let scripts = Scripts::new(TimeSource::Argument);
        let mut now = T0;
        for (which, cost, dt) in &steps {
            now += dt;
            let items: Vec<_> = which.iter().map(|&i| (&keys[i], &policies[i], *cost)).collect();
            let got = scripts.take(&mut con, &items, KEEP_MS, now).unwrap();
            let [m0, m1, m2] = &mut models;
            let mut all: Vec<Option<&mut ModelBucket>> = vec![Some(m0), Some(m1), Some(m2)];
            let mut picked: Vec<_> = which
                .iter()
                .map(|&i| (all[i].take().unwrap(), &policies[i], *cost))
                .collect();
            let want = tokengate_redis::model::take_all(&mut picked, now);
            prop_assert_eq!(&got, &want);
            for i in 0..3 {
                let stored = common::read_bucket(&mut con, &keys[i]).state;
                prop_assert_eq!(stored, models[i].state, "bucket {}", i);
            }
        }
        for k in &keys {
            common::delete(&mut con, k);
        }
    }
}

#[test]
fn strict_take_refuses_with_the_first_bucket_that_cannot_pay_and_takes_nothing() {
    let ns = common::namespace("take1");
    let (a, b) = (
        BucketKeys::new(&ns, "a").unwrap(),
        BucketKeys::new(&ns, "b").unwrap(),
    );
    let (pa, pb) = (
        RemotePolicy::new(10, 1.0).unwrap(),
        RemotePolicy::new(3, 1.0).unwrap(),
    );
    let mut con = common::connect();
    let scripts = Scripts::new(TimeSource::Argument);
    let ok = scripts
        .take(&mut con, &[(&a, &pa, 2), (&b, &pb, 2)], KEEP_MS, T0)
        .unwrap();
    assert_eq!(ok, Take::Taken(vec![8 * UNITS_PER_TOKEN, UNITS_PER_TOKEN]));
    let before = (
        common::read_bucket(&mut con, &a),
        common::read_bucket(&mut con, &b),
    );
    let no = scripts
        .take(
            &mut con,
            &[(&a, &pa, 2), (&b, &pb, 2)],
            KEEP_MS,
            T0 + 500_000,
        )
        .unwrap();
    assert_eq!(
        no,
        Take::Refused {
            index: 1,
            retry_after_us: Some(500_000)
        }
    );
    assert_eq!(
        (
            common::read_bucket(&mut con, &a),
            common::read_bucket(&mut con, &b)
        ),
        before
    );
    common::delete(&mut con, &a);
    common::delete(&mut con, &b);
}
