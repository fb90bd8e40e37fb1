//! `Policy` through serde (feature `serde` of the engine): the table and string forms,
//! the canonical form written back, and no panic on any input.

use std::time::Duration;

use proptest::prelude::*;
use serde::Deserialize;
use tokengate::{Policy, Start};

#[derive(Debug, Deserialize, serde::Serialize)]
struct Doc {
    p: Policy,
}

fn read(value: &str) -> Result<Policy, toml::de::Error> {
    toml::from_str::<Doc>(&format!("p = {value}")).map(|d| d.p)
}

fn written(p: Policy) -> String {
    toml::to_string(&Doc { p }).unwrap()
}

#[test]
fn table_forms_build_the_policies_they_name() {
    assert_eq!(
        read("{ capacity = 200, refill_per_second = 100 }").unwrap(),
        Policy::new(200, 100.0).unwrap()
    );
    assert_eq!(
        read("{ capacity = 200, refill_per_second = 0.5 }").unwrap(),
        Policy::new(200, 0.5).unwrap()
    );
    assert_eq!(
        read("{ capacity = 100, per = \"1m\", tokens = 100 }").unwrap(),
        Policy::per(100, 100, Duration::from_secs(60)).unwrap()
    );
    let p = read(
        "{ capacity = 60, refill_per_second = 10, start = \"empty\", max_reservation = \"2s\" }",
    )
    .unwrap();
    let q = Policy::builder(60, 10.0)
        .start(Start::Empty)
        .max_reservation(Duration::from_secs(2))
        .build()
        .unwrap();
    assert_eq!(p, q);
    assert_eq!(
        read("\"100/s burst 200\"").unwrap(),
        Policy::new(200, 100.0).unwrap()
    );
}

#[test]
fn policies_are_written_in_one_canonical_form() {
    assert_eq!(
        written(Policy::new(200, 100.0).unwrap()),
        "[p]\ncapacity = 200\nrefill_per_second = 100.0\n"
    );
    // 100 per minute, however it was given, is written per minute; 300 per minute is
    // whole per second, and written so.
    for p in [
        Policy::per(30, 100, Duration::from_secs(60)).unwrap(),
        Policy::per(30, 200, Duration::from_secs(120)).unwrap(),
        "100/m burst 30".parse().unwrap(),
    ] {
        assert_eq!(
            written(p),
            "[p]\ncapacity = 30\ntokens = 100\nper = \"1m\"\n"
        );
    }
    let p = Policy::per(30, 300, Duration::from_secs(60)).unwrap();
    assert_eq!(written(p), "[p]\ncapacity = 30\ntokens = 5\nper = \"1s\"\n");
    let q = Policy::builder(60, 10.0)
        .start(Start::Empty)
        .max_reservation(Duration::from_millis(1500))
        .build()
        .unwrap();
    assert_eq!(
        written(q),
        "[p]\ncapacity = 60\nrefill_per_second = 10.0\nstart = \"empty\"\nmax_reservation = \"1500ms\"\n"
    );
}

/// What must survive writing and reading back.
fn same(a: &Policy, b: &Policy) -> bool {
    a.capacity() == b.capacity()
        && a.start() == b.start()
        && a.max_reservation() == b.max_reservation()
        && a.exact_rate_per_nanosecond() == b.exact_rate_per_nanosecond()
        && a.layout() == b.layout()
}

proptest! {
    #[test]
    fn reading_never_panics_on_random_strings(s in "\\PC{0,40}") {
        let _ = s.parse::<Policy>();
        let _ = read(&format!("{s:?}"));
    }

    #[test]
    fn reading_never_panics_on_policy_like_strings(
        s in "[-0-9.e]{0,8}r?/[0-9]{0,4}(ns|us|ms|s|m|h|d|x)?( burst [-0-9]{0,25})?( start (full|empty|x))?"
    ) {
        if let Ok(p) = s.parse::<Policy>() {
            prop_assert!(p.capacity() >= 1);
        }
    }

    #[test]
    fn reading_never_panics_on_random_tables(
        capacity in any::<i64>(),
        rate in prop_oneof![any::<f64>(), (1u32..1000).prop_map(f64::from)],
        tokens in any::<i64>(),
        per in "[0-9]{0,22}(ns|s|m|d|q)",
        form in 0..3,
    ) {
        let rate = if rate.is_nan() { "nan".to_owned() } else if rate.is_infinite() { format!("{}inf", if rate < 0.0 { "-" } else { "" }) } else { format!("{rate:?}") };
        let table = match form {
            0 => format!("{{ capacity = {capacity}, refill_per_second = {rate} }}"),
            1 => format!("{{ capacity = {capacity}, tokens = {tokens}, per = \"{per}\" }}"),
            _ => format!("{{ capacity = {capacity}, refill_per_second = {rate}, per = \"{per}\" }}"),
        };
        let _ = read(&table);
    }

    #[test]
    fn what_is_written_reads_back_the_same(
        capacity in 1u64..1_000_000,
        rate in 1e-3f64..1e7,
        tokens in 1u64..100_000,
        period_ms in 1u64..10_000_000,
        per_period in any::<bool>(),
        empty in any::<bool>(),
    ) {
        let p = if per_period {
            Policy::per(capacity, tokens, Duration::from_millis(period_ms))
        } else {
            Policy::new(capacity, rate)
        };
        if let Ok(p) = p {
            let p = if empty { p.start_empty() } else { p };
            let text = written(p);
            let back = toml::from_str::<Doc>(&text).unwrap().p;
            prop_assert!(same(&p, &back), "{p:?} -> {text} -> {back:?}");
        }
    }
}
