//! The fuzz targets' checks on stable Rust: every committed seed input (every crash the
//! fuzzers ever found included) is replayed, and a deterministic random sweep runs the
//! same decoding and checks. The regressions the fuzzers found are pinned by name.
//!
//! Seeds live in `fuzz/seeds/<target>/`, one raw libFuzzer input per file. Set
//! `TOKENGATE_SWEEP_SCALE=N` to run N times more sweep cases.

use std::path::{Path, PathBuf};

use tokengate_testkit::replay::{Failure, Tally, Target, decode};
use tokengate_testkit::{
    MultiOp, MultiScenario, Op, PolicySpec, Scenario, acceptable_layout, check, check_multi,
};

fn seed_dir(target: Target) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target.name())
}

fn seeds(target: Target) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = seed_dir(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("readable seed directory").path())
        .filter(|p| p.is_file())
        .map(|p| {
            let bytes = std::fs::read(&p).expect("readable seed");
            (p, bytes)
        })
        .collect();
    files.sort();
    files
}

/// Saves a failing input where it can be replayed and added to the seeds.
fn report(target: Target, failure: &Failure) -> String {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("crash-{}", target.name()));
    let saved = std::fs::write(&path, &failure.bytes)
        .map(|()| format!("saved to {}", path.display()))
        .unwrap_or_else(|e| format!("not saved: {e}"));
    format!(
        "{failure}\n(input {saved}; reproduce with `cargo +nightly fuzz run {} {}`)",
        target.name(),
        path.display()
    )
}

fn replay(target: Target) -> Tally {
    let seeds = seeds(target);
    assert!(
        seeds.len() >= 10,
        "{}: only {} seeds",
        seed_dir(target).display(),
        seeds.len()
    );
    let mut total = Tally::new();
    for (path, bytes) in &seeds {
        match target.run(bytes) {
            Ok(tally) => {
                for (k, v) in tally {
                    *total.entry(k).or_default() += v;
                }
            }
            Err(f) => panic!("{}: {f}", path.display()),
        }
    }
    eprintln!("{} seeds: {} files, {total:?}", target.name(), seeds.len());
    total
}

/// Cases of a sweep: `release` in optimized builds, a tenth in debug builds, times
/// `TOKENGATE_SWEEP_SCALE` (default 1) for longer runs.
fn sweep_cases(release: u64) -> u64 {
    let scale = std::env::var("TOKENGATE_SWEEP_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let cases = if cfg!(debug_assertions) {
        release / 10
    } else {
        release
    };
    cases * scale
}

/// Sweeps `target` with random inputs of up to `max_len` bytes.
fn sweep(target: Target, max_len: usize, release_cases: u64) -> Tally {
    let cases = sweep_cases(release_cases);
    match target.sweep(0x70_6b_65_6e_67_61_74_65, cases, max_len) {
        Ok(tally) => {
            eprintln!("{} sweep: {cases} cases, {tally:?}", target.name());
            tally
        }
        Err(f) => panic!("{}", report(target, &f)),
    }
}

fn get(t: &Tally, key: &str) -> u64 {
    t.get(key).copied().unwrap_or(0)
}

#[test]
fn rounding_seeds_replay_clean() {
    let t = replay(Target::Rounding);
    assert!(get(&t, "admitted") > 0 && get(&t, "rejected") > 0, "{t:?}");
}

#[test]
fn packing_seeds_replay_clean() {
    let t = replay(Target::Packing);
    assert!(
        get(&t, "valid_words") > 0 && get(&t, "two_steps") > 0,
        "{t:?}"
    );
}

#[test]
fn multi_seeds_replay_clean() {
    let t = replay(Target::Multi);
    assert!(get(&t, "admitted") > 0 && get(&t, "rejected") > 0, "{t:?}");
}

#[test]
fn reconfigure_seeds_replay_clean() {
    let t = replay(Target::Reconfigure);
    assert!(
        get(&t, "conversions") > 0 && get(&t, "switches") > 0,
        "{t:?}"
    );
}

#[test]
fn reconfigure_random_sweep_holds() {
    let t = sweep(Target::Reconfigure, 600, 20_000);
    for key in [
        "conversions",
        "debts",
        "forgiven",
        "capped",
        "switches",
        "admitted",
        "rejected",
    ] {
        assert!(get(&t, key) > 0, "the sweep never reached {key}: {t:?}");
    }
}

/// The sweep must reach every kind of outcome, or it checks little.
#[test]
fn rounding_random_sweep_holds() {
    let t = sweep(Target::Rounding, 600, 40_000);
    let runs = get(&t, "runs");
    assert!(
        get(&t, "invalid_policy") * 2 < runs,
        "mostly invalid policies: {t:?}"
    );
    for key in [
        "admitted",
        "rejected",
        "errors",
        "ambiguous_steps",
        "invalid_policy",
    ] {
        assert!(get(&t, key) > 0, "the sweep never reached {key}: {t:?}");
    }
}

#[test]
fn packing_random_sweep_holds() {
    let t = sweep(Target::Packing, 600, 400_000);
    assert!(get(&t, "invalid_layout") * 4 < get(&t, "runs") * 3, "{t:?}");
    for key in [
        "valid_words",
        "invalid_words",
        "behind",
        "full",
        "two_steps",
        "taken",
        "waits_checked",
    ] {
        assert!(get(&t, key) > 0, "the sweep never reached {key}: {t:?}");
    }
}

#[test]
fn multi_random_sweep_holds() {
    let t = sweep(Target::Multi, 1200, 10_000);
    // Rollbacks and clock errors no longer happen on one thread: the read-only first
    // pass refuses before anything is taken, and clocks that step back are read through
    // a high-water mark. The threaded tests and the loom models cover rollbacks.
    for key in ["admitted", "rejected", "duplicates", "over_capacity"] {
        assert!(get(&t, key) > 0, "the sweep never reached {key}: {t:?}");
    }
}

/// The decoding of policies spans the representable range: capacities from 1 to beyond
/// 2^32 tokens (the word holds up to about 2^39, at slow rates), rates from below 1e-6
/// to above 1e12 tokens per second, both start states, with reservations; most decode
/// to valid policies, and garbage is refused without panicking.
#[test]
fn policy_decoding_reaches_tiny_to_huge_rates_and_capacities() {
    let mut rng = tokengate_testkit::replay::Rng::new(11);
    let (mut rates, mut capacities) = (Vec::new(), Vec::new());
    let (mut invalid, mut empty, mut reserving) = (0, 0, 0);
    for _ in 0..2000 {
        let bytes = rng.bytes(40);
        let spec: PolicySpec = decode::<Scenario>(&bytes).expect("decodes").policy;
        match spec.build() {
            Ok(p) => {
                rates.push(p.refill_per_second());
                capacities.push(p.capacity());
                empty += u32::from(!p.starts_full());
                reserving += u32::from(!p.max_reservation().is_zero());
            }
            Err(_) => invalid += 1,
        }
    }
    let lowest = rates.iter().copied().fold(f64::INFINITY, f64::min);
    let highest = rates.iter().copied().fold(0.0, f64::max);
    assert!(
        lowest < 1e-6 && highest > 1e12,
        "rates {lowest:e}..{highest:e}"
    );
    assert!(capacities.contains(&1));
    assert!(
        capacities.iter().any(|&c| c > 1 << 32),
        "no capacity above 2^32"
    );
    assert!(invalid > 0 && invalid < 1000, "{invalid} of 2000 invalid");
    assert!(empty > 0 && reserving > 0);
}

/// Decoding the same bytes gives the same input (corpus files replay identically) and
/// an exhausted input still decodes.
#[test]
fn decoding_is_deterministic_and_total() {
    let bytes: Vec<u8> = (0..=255).collect();
    for target in Target::ALL {
        assert_eq!(target.describe(&bytes), target.describe(&bytes));
        assert!(target.describe(&[]).is_some(), "{}", target.name());
    }
}

// Regressions the sweeps and fuzzers found, as typed inputs (their crash files are in
// the seeds too, under `fuzz/seeds/<target>/crash-*`).

/// The ideal bucket's refund summed `scaled + cost * den` in `u128`, which wraps for
/// rates whose exact fraction has a denominator near 2^106: the reference itself
/// created a false alarm (release) or panicked (debug).
#[test]
fn ideal_refund_near_the_top_of_u128_saturates() {
    let s = Scenario {
        start_nanos: 31_023_495_346_031_753,
        policy: PolicySpec {
            capacity: 2_701_306,
            refill_per_second: 2.206e-9,
            start_empty: true,
            max_reservation_nanos: 36_241_030,
        },
        ops: vec![Op::Refund(2_687_056), Op::Refund(1_976_615)],
    };
    // Such a bucket takes some 38 million years to fill: it is now refused (the tick
    // field could not wrap later than twice that), and the reference's saturating sum
    // stays for the policies that remain.
    assert_eq!(check(&s).map(|r| r.invalid_policy), Ok(true));
}

/// Ten thousand tokens at one per second has a layout meeting every bound (1 ms ticks,
/// F = 20, 0.05% error, wrap 2^50 ns); the layout search once refused it.
#[test]
fn large_burst_at_a_slow_rate_is_accepted_and_exact() {
    let spec = PolicySpec {
        capacity: 10_000,
        refill_per_second: 1.0,
        start_empty: false,
        max_reservation_nanos: 0,
    };
    assert!(acceptable_layout(&spec).is_some());
    let s = Scenario {
        start_nanos: 0,
        policy: spec,
        ops: vec![
            Op::Acquire(10_000),
            Op::Advance(2_500_000_000),
            Op::Acquire(2),
            Op::Peek,
        ],
    };
    let report = check(&s).expect("no violation");
    assert!(!report.invalid_policy);
    assert_eq!(report.admitted, 2);
}

/// A multi-bucket acquisition rolled back writes the taken buckets at `now` (their
/// stored tick moves there); after a clock step back the bucket reads its stored state,
/// so the model has to have moved to `now` as well.
#[test]
fn rolled_back_bucket_is_compared_at_the_time_it_was_written() {
    let s = MultiScenario {
        start_nanos: 328,
        buckets: vec![
            PolicySpec {
                capacity: 113,
                refill_per_second: 884_000.0,
                start_empty: false,
                max_reservation_nanos: 63,
            },
            PolicySpec {
                capacity: 205,
                refill_per_second: 5.5,
                start_empty: true,
                max_reservation_nanos: 0,
            },
        ],
        ops: vec![
            MultiOp::Acquire { bucket: 0, cost: 2 },
            MultiOp::Advance(4_521_149),
            MultiOp::AcquireAll(vec![(0, 3), (1, 4)]),
            MultiOp::StepBack(542_849_191_474),
            MultiOp::Acquire { bucket: 0, cost: 1 },
            MultiOp::Advance(10_000_000),
            MultiOp::Acquire { bucket: 0, cost: 1 },
        ],
    };
    let report = check_multi(&s).expect("no violation");
    assert_eq!(report.rejected, 1);
}

/// A bucket named in a refused acquisition but never reached (a lower identity refused
/// first) is not written, so its ideal bucket must not see that time either: after a
/// clock step back it would miss refill the engine rightly gets.
#[test]
fn untouched_bucket_of_a_refused_set_keeps_its_ideal_time() {
    let spec = |capacity, refill_per_second, max_reservation_nanos| PolicySpec {
        capacity,
        refill_per_second,
        start_empty: true,
        max_reservation_nanos,
    };
    // Buckets are ordered by address, which follows their order here: with the slow
    // bucket first the fast one is never reached; with it second the fast one is taken
    // and rolled back. Both must hold.
    for slow_first in [true, false] {
        let (slow, fast) = if slow_first { (0, 1) } else { (1, 0) };
        let mut buckets = vec![
            spec(241, 4.081e-6, 7_656_840_928_240_091_569),
            spec(82, 3.34, 0),
        ];
        if !slow_first {
            buckets.reverse();
        }
        let s = MultiScenario {
            start_nanos: 0,
            buckets,
            ops: vec![
                MultiOp::Advance(3_026_289_355_441),
                MultiOp::AcquireAll(vec![(slow, 3), (fast, 1)]),
                MultiOp::StepBack(318_787_508_251),
                MultiOp::Acquire {
                    bucket: fast,
                    cost: 1,
                },
                MultiOp::Advance(27_986_474_681),
                MultiOp::Acquire {
                    bucket: fast,
                    cost: 27,
                },
            ],
        };
        check_multi(&s).expect("no violation");
    }
}
