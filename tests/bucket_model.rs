//! The engine against the exact reference models, over random policies and operation
//! sequences (property tests), plus the regressions they found.

use proptest::prelude::*;
use tokengate::testkit::{Op, PolicySpec, Scenario, check};

fn capacity() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..=200,
        2 => 1u64..=1_000_000,
        1 => 1u64..=(1 << 40),
    ]
}

fn rate() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => (-60i32..=120).prop_map(|e| 10f64.powf(f64::from(e) / 10.0)),
        2 => prop::sample::select(vec![0.5, 1.0, 2.0, 3.0, 10.0, 20.0, 1000.0, 1e6, 1e9]),
        1 => 1e-6f64..1e12,
    ]
}

fn policy() -> impl Strategy<Value = PolicySpec> {
    (
        capacity(),
        rate(),
        any::<bool>(),
        prop_oneof![4 => Just(0u64), 1 => 0u64..10_000_000_000],
    )
        .prop_map(
            |(capacity, refill_per_second, start_empty, max_reservation_nanos)| PolicySpec {
                capacity,
                refill_per_second,
                start_empty,
                max_reservation_nanos,
            },
        )
}

fn duration() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => Just(0u64),
        4 => 0u64..2_000_000,              // within a few ticks
        4 => 0u64..10_000_000_000,         // up to 10 s
        1 => 0u64..(1 << 50),              // up to 13 days
        1 => (1u64 << 50)..(1 << 62),      // far past most wrap periods
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => duration().prop_map(Op::Advance),
        1 => duration().prop_map(Op::StepBack),
        8 => any::<u64>().prop_map(|c| Op::Acquire(c % 4 + c % 300)),
        1 => any::<u64>().prop_map(Op::Acquire),
        2 => (0u64..50).prop_map(Op::Refund),
        1 => Just(Op::Reset),
        2 => Just(Op::Peek),
    ]
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        prop_oneof![Just(0u64), any::<u64>(), 0u64..(1 << 40)],
        policy(),
        prop::collection::vec(op(), 0..120),
    )
        .prop_map(|(start_nanos, policy, ops)| Scenario {
            start_nanos,
            policy,
            ops,
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 10_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Decisions, balances and retry-afters equal the grid-exact model; no admission is
    /// beyond the ideal bucket at the configured rate; I1 and I5 hold after every step.
    #[test]
    fn engine_matches_the_reference_model(s in scenario()) {
        if let Err(v) = check(&s) {
            prop_assert!(false, "{v}\n{s:?}");
        }
    }
}
