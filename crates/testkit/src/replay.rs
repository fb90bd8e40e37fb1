//! The checks run on raw bytes, exactly as the fuzz targets decode them (feature
//! `arbitrary`): corpus replay and deterministic random sweeps on stable Rust.
//!
//! Each fuzz target in `fuzz/fuzz_targets/` is
//! `fuzz_target!(|input: T| if let Err(v) = check(&input) { panic!(..) })`, where
//! `libfuzzer-sys` decodes `T` with `Arbitrary::arbitrary_take_rest`. [`Target::run`]
//! decodes the same way, so a file from a fuzzer's corpus or crash artifacts replays
//! identically under `cargo test`.
//!
//! ```
//! use tokengate_testkit::replay::{Rng, Target};
//!
//! // Any bytes decode to some input; the checks hold on all of them.
//! let mut rng = Rng::new(7);
//! for target in Target::ALL {
//!     let bytes = rng.bytes(300);
//!     assert!(target.run(&bytes).is_ok(), "{}", target.name());
//! }
//! assert_eq!(Target::from_name("packing"), Some(Target::Packing));
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};

use arbitrary::{Arbitrary, Unstructured};

use crate::check::{Scenario, Violation, check, violation};
use crate::multi::{MultiScenario, check_multi};
use crate::packing::{PackingCase, check_packing};
use crate::reconfigure::{ReconfigureCase, check_reconfigure};

/// A fuzz target: which input type the bytes decode to and which check runs on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// [`Scenario`] through [`check`].
    Rounding,
    /// [`PackingCase`] through [`check_packing`].
    Packing,
    /// [`MultiScenario`] through [`check_multi`].
    Multi,
    /// [`ReconfigureCase`] through [`check_reconfigure`].
    Reconfigure,
}

/// Counters of what runs exercised, by name (summed over a sweep).
pub type Tally = BTreeMap<&'static str, u64>;

/// A check that failed on some bytes.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The input that failed.
    pub bytes: Vec<u8>,
    /// The decoded input, pretty-printed (what `cargo fuzz fmt` prints).
    pub input: String,
    /// What broke; a panic inside the engine is reported with its message.
    pub violation: Violation,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}\ninput: {}", self.violation, self.input)
    }
}

impl std::error::Error for Failure {}

/// Decodes `bytes` into `T` as `libfuzzer-sys` does (`Arbitrary::arbitrary_take_rest`);
/// `None` when they do not decode.
///
/// ```
/// use tokengate_testkit::{Scenario, replay::decode};
///
/// // Even no bytes at all decode: a valid policy and no operations.
/// let s: Scenario = decode(&[]).unwrap();
/// assert!(s.ops.is_empty());
/// assert!(s.policy.build().is_ok());
/// ```
pub fn decode<'a, T: Arbitrary<'a>>(bytes: &'a [u8]) -> Option<T> {
    T::arbitrary_take_rest(Unstructured::new(bytes)).ok()
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".to_string())
}

impl Target {
    /// Every target.
    pub const ALL: [Target; 4] = [
        Target::Rounding,
        Target::Packing,
        Target::Multi,
        Target::Reconfigure,
    ];

    /// The fuzz target's name (`fuzz/fuzz_targets/<name>.rs`, `fuzz/seeds/<name>/`).
    pub fn name(self) -> &'static str {
        match self {
            Target::Rounding => "rounding",
            Target::Packing => "packing",
            Target::Multi => "multi",
            Target::Reconfigure => "reconfigure",
        }
    }

    /// The target of that name.
    pub fn from_name(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The decoded input, pretty-printed; `None` when the bytes do not decode.
    pub fn describe(self, bytes: &[u8]) -> Option<String> {
        match self {
            Target::Rounding => decode::<Scenario>(bytes).map(|s| format!("{s:#?}")),
            Target::Packing => decode::<PackingCase>(bytes).map(|c| format!("{c:#?}")),
            Target::Multi => decode::<MultiScenario>(bytes).map(|s| format!("{s:#?}")),
            Target::Reconfigure => decode::<ReconfigureCase>(bytes).map(|c| format!("{c:#?}")),
        }
    }

    /// Decodes `bytes` as the fuzz target does and runs its check: what the run
    /// exercised (empty when the bytes do not decode, which the fuzz target skips too).
    ///
    /// # Errors
    ///
    /// A [`Failure`] for a violation or a panic.
    pub fn run(self, bytes: &[u8]) -> Result<Tally, Failure> {
        let result = catch_unwind(AssertUnwindSafe(|| self.run_unguarded(bytes)));
        let violation = match result {
            Ok(Ok(tally)) => return Ok(tally),
            Ok(Err(v)) => v,
            Err(payload) => violation(0, format!("panic: {}", panic_message(&*payload))),
        };
        Err(Failure {
            bytes: bytes.to_vec(),
            input: self.describe(bytes).unwrap_or_default(),
            violation,
        })
    }

    fn run_unguarded(self, bytes: &[u8]) -> Result<Tally, Violation> {
        let mut t = Tally::new();
        match self {
            Target::Rounding => {
                let Some(s) = decode::<Scenario>(bytes) else {
                    return Ok(t);
                };
                let r = check(&s)?;
                t.insert("ops", s.ops.len() as u64);
                t.insert("invalid_policy", r.invalid_policy.into());
                t.insert("admitted", r.admitted);
                t.insert("rejected", r.rejected);
                t.insert("errors", r.errors);
                t.insert("ambiguous_steps", r.ambiguous_steps);
            }
            Target::Packing => {
                let Some(c) = decode::<PackingCase>(bytes) else {
                    return Ok(t);
                };
                let r = check_packing(&c)?;
                t.insert("invalid_layout", r.invalid_layout.into());
                t.insert("valid_words", r.valid_words);
                t.insert("invalid_words", r.invalid_words);
                t.insert("behind", r.behind);
                t.insert("full", r.full);
                t.insert("two_steps", r.two_steps);
                t.insert("taken", r.taken);
                t.insert("waits_checked", r.waits_checked);
            }
            Target::Multi => {
                let Some(s) = decode::<MultiScenario>(bytes) else {
                    return Ok(t);
                };
                let r = check_multi(&s)?;
                t.insert("buckets", r.buckets);
                t.insert("admitted", r.admitted);
                t.insert("rejected", r.rejected);
                t.insert("rollbacks", r.rollbacks);
                t.insert("duplicates", r.duplicates);
                t.insert("over_capacity", r.over_capacity);
                t.insert("clock_errors", r.clock_errors);
                t.insert("ambiguous_steps", r.ambiguous_steps);
            }
            Target::Reconfigure => {
                let Some(c) = decode::<ReconfigureCase>(bytes) else {
                    return Ok(t);
                };
                let r = check_reconfigure(&c)?;
                t.insert("invalid_policy", r.invalid_policy.into());
                t.insert("conversions", r.conversions);
                t.insert("debts", r.debts);
                t.insert("forgiven", r.forgiven);
                t.insert("capped", r.capped);
                t.insert("switches", r.switches);
                t.insert("admitted", r.admitted);
                t.insert("rejected", r.rejected);
            }
        }
        t.insert("runs", 1);
        Ok(t)
    }

    /// Runs `cases` inputs of random bytes (lengths up to `max_len`) from a PRNG seeded
    /// with `seed`: the same inputs on every machine and every run.
    ///
    /// # Errors
    ///
    /// The first [`Failure`].
    pub fn sweep(self, seed: u64, cases: u64, max_len: usize) -> Result<Tally, Failure> {
        let mut rng = Rng::new(seed ^ self as u64);
        let mut total = Tally::new();
        for _ in 0..cases {
            let len = (rng.next_u64() % (max_len as u64 + 1)) as usize;
            let bytes = rng.bytes(len);
            for (k, v) in self.run(&bytes)? {
                *total.entry(k).or_default() += v;
            }
        }
        Ok(total)
    }
}

/// A small deterministic PRNG (SplitMix64) for sweeps: no dependency, the same sequence
/// everywhere.
///
/// ```
/// use tokengate_testkit::replay::Rng;
/// let (mut a, mut b) = (Rng::new(1), Rng::new(1));
/// assert_eq!(a.bytes(16), b.bytes(16));
/// ```
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        out.truncate(len);
        out
    }
}
