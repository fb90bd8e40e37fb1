//! Exhaustive loom models of tokengate's CAS loops, refunds and multi-bucket acquisition.
//!
//! The models are the integration tests in `tests/`; this library is their harness. Run
//! them from the repository root, in release mode and with their own target directory
//! (so the `--cfg loom` build does not invalidate the normal one):
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p loom-tests --release
//! ```
//!
//! Add `-- --nocapture` to see, per model, the threads, the executions explored and the
//! time taken. Without `--cfg loom` the crate is empty and its tests compile to nothing.
//!
//! # What loom explores
//!
//! Every model runs exhaustively except where its test says why it is bounded. Two
//! limits of loom 0.7 shape the models:
//!
//! - Its exploration never schedules a thread that loads and then CASes an atomic ahead
//!   of another thread that loaded the same atomic first (tokio-rs/loom#166, #392). For
//!   a bucket word this loses nothing: the skipped order (the reader loading the new
//!   word) decides exactly like the explored one (the reader loading the old word, its
//!   CAS failing and returning the new word). For the manual clock it would hide every
//!   advance from the readers, so `ManualClock::advance` opens with its CAS, and
//!   `clock_advance.rs` checks that a racing reader sees both times.
//! - Objects must be created inside the model, and every execution must make the same
//!   choices: multi-bucket models keep their buckets in one array, because the order
//!   buckets are taken in is their address order.
//!
//! Each model also counts, outside loom, the executions reaching the outcomes it is
//! about (a stale reading losing its race, a rollback, each thread succeeding) and fails
//! if one never occurs, so a model cannot pass by exploring nothing of interest.
#![cfg(loom)]
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokengate::Decision;
use tokengate::mutants::Mutant;

/// What one model run explored.
#[derive(Clone, Copy, Debug)]
pub struct Explored {
    /// Executions (complete interleavings) loom ran.
    pub executions: usize,
    /// Wall time of the whole exploration.
    pub elapsed: Duration,
}

/// How a model is explored.
#[derive(Clone, Copy, Debug)]
pub struct Model {
    /// Name printed with the figures.
    pub name: &'static str,
    /// Threads taking part, the model's main thread included.
    pub threads: usize,
    /// `Some(n)`: explore only executions with at most `n` preemptions. `None`:
    /// exhaustive (unless `LOOM_MAX_PREEMPTIONS` is set in the environment).
    pub preemption_bound: Option<usize>,
}

impl Model {
    /// An exhaustive model.
    pub const fn exhaustive(name: &'static str, threads: usize) -> Model {
        Model {
            name,
            threads,
            preemption_bound: None,
        }
    }

    /// Runs `f` in every execution loom explores, counting them; panics (with the
    /// failing execution's message) when an assertion fails in any of them.
    pub fn check<F>(&self, f: F) -> Explored
    where
        F: Fn() + Sync + Send + 'static,
    {
        let explored = self.run(f);
        println!(
            "loom model {}: {} threads, {} executions, {:.2?}{}",
            self.name,
            self.threads,
            explored.executions,
            explored.elapsed,
            match self.preemption_bound {
                Some(n) => format!(" (at most {n} preemptions)"),
                None => String::new(),
            }
        );
        explored
    }

    /// Runs the model with the deliberate bug `mutant` (one of `tokengate::mutants`)
    /// switched on, expecting it to fail: returns the failing assertion's message, and
    /// panics if every execution passed. The bug is switched off again afterwards.
    pub fn expect_violation<F>(&self, mutant: &'static Mutant, f: F) -> String
    where
        F: Fn() + Sync + Send + 'static,
    {
        let start = Instant::now();
        let outcome = {
            let _bug = tokengate::mutants::enable(mutant);
            panic::catch_unwind(AssertUnwindSafe(|| self.run(f)))
        };
        match outcome {
            Ok(explored) => panic!(
                "loom model {} passed all {} executions although it should have failed",
                self.name, explored.executions
            ),
            Err(payload) => {
                let message = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                println!(
                    "loom model {} (broken build): violation found in {:.2?}: {message}",
                    self.name,
                    start.elapsed()
                );
                message
            }
        }
    }

    fn run<F>(&self, f: F) -> Explored
    where
        F: Fn() + Sync + Send + 'static,
    {
        let executions = Arc::new(AtomicUsize::new(0));
        let counter = executions.clone();
        let mut builder = loom::model::Builder::new();
        if self.preemption_bound.is_some() {
            builder.preemption_bound = self.preemption_bound;
        }
        let start = Instant::now();
        builder.check(move || {
            counter.fetch_add(1, Ordering::Relaxed);
            f();
        });
        Explored {
            executions: executions.load(Ordering::Relaxed),
            elapsed: start.elapsed(),
        }
    }
}

/// Set, to the test's name, in the environment of a test's own process: there that test
/// runs as it is.
const OWN_PROCESS: &str = "LOOM_TESTS_OWN_PROCESS";

/// Runs the calling test again in a process of its own and waits for it: `true` once it
/// has passed there (the caller then returns), `false` in that process (the caller goes
/// on and runs the test). Every test of `tests/` opens with [`in_own_process!`], which
/// returns from it when this is `true`.
///
/// Why: loom runs each modelled thread on a stack it maps for every execution and unmaps
/// after it, so a model makes millions of `mmap` and `munmap` calls. Two models side by
/// side in one process (the test harness's threads) make each `munmap` stop the other
/// thread's processor to flush its address translations: measured here on two cores,
/// two 20-second models took 32.6 s side by side in one process (30.1 s user, 28.1 s
/// system) and 22.6 s in two processes (24.1 s user, 16.6 s system).
///
/// The test harness names the thread a test runs on after the test, which is how the
/// test is found again (`--exact`). A test on the main thread or an unnamed one runs where
/// it is. The own process must report one test run and passed, so a name that matches
/// nothing fails rather than passing vacuously; and it runs the test only where the
/// variable names that very test, so a variable left in the environment does not send
/// every test back into one process.
pub fn ran_in_own_process() -> bool {
    let current = std::thread::current();
    let Some(name) = current.name().filter(|n| *n != "main") else {
        return false;
    };
    if std::env::var_os(OWN_PROCESS).is_some_and(|v| v == name) {
        return false;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args(["--exact", name, "--include-ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(OWN_PROCESS, name)
        .output()
        .expect("the test binary starts again");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    // Shown with the test's output (captured unless `--nocapture`).
    print!("{stdout}");
    eprint!("{stderr}");
    assert!(
        out.status.success(),
        "{name} failed in its own process ({}); its output is above",
        out.status
    );
    assert!(
        stdout.contains("running 1 test") && stdout.contains("test result: ok. 1 passed"),
        "{name}'s own process did not run exactly this one test"
    );
    true
}

/// Opens a test: runs it again in a process of its own and returns once it passed there
/// ([`ran_in_own_process`]); in that process, goes on.
#[macro_export]
macro_rules! in_own_process {
    () => {
        if $crate::ran_in_own_process() {
            return;
        }
    };
}

/// A counter shared across the executions of a model (outside loom's view), to show
/// after the exploration that an outcome was reached at least once.
#[derive(Clone, Debug, Default)]
pub struct Tally(Arc<AtomicUsize>);

impl Tally {
    /// A counter at zero.
    pub fn new() -> Tally {
        Tally::default()
    }

    /// Adds one.
    pub fn hit(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds one when `cond` holds.
    pub fn hit_if(&self, cond: bool) {
        if cond {
            self.hit();
        }
    }

    /// The count.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// One operation a thread performed on a bucket, as the thread saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A `try_acquire` and the decision it returned (frozen clock).
    Take {
        /// Cost in units.
        cost_units: u64,
        /// Whether it was admitted.
        admitted: bool,
        /// The balance after the decision, in units.
        balance_after: i64,
    },
    /// A refund of `units`; it returns nothing to check.
    Refund {
        /// Units given back.
        units: u64,
    },
}

impl Op {
    /// The record of a `try_acquire` decision.
    pub fn take(decision: &Decision, frac_bits: u32) -> Op {
        Op::Take {
            cost_units: decision.cost() << frac_bits,
            admitted: decision.is_admitted(),
            balance_after: decision.balance_units(),
        }
    }
}

/// Whether some sequential order of the threads' operations (each thread's in program
/// order), replayed one at a time on a bucket of `max_units` holding `initial` units, gives
/// every decision the threads saw and ends at `final_units`: the concurrent run is then
/// indistinguishable from a sequential one (linearizable). Frozen clock only.
pub fn has_sequential_witness(
    initial: i64,
    max_units: i64,
    threads: &[Vec<Op>],
    final_units: i64,
) -> bool {
    fn search(
        balance: i64,
        max_units: i64,
        threads: &[Vec<Op>],
        next: &mut [usize],
        final_units: i64,
    ) -> bool {
        if next.iter().zip(threads).all(|(&n, ops)| n == ops.len()) {
            return balance == final_units;
        }
        for t in 0..threads.len() {
            let Some(&op) = threads[t].get(next[t]) else {
                continue;
            };
            let after = match op {
                Op::Take {
                    cost_units,
                    admitted,
                    balance_after,
                } => {
                    let fits = balance >= cost_units as i64;
                    let after = if fits {
                        balance - cost_units as i64
                    } else {
                        balance
                    };
                    if fits != admitted || after != balance_after {
                        continue;
                    }
                    after
                }
                Op::Refund { units } => (balance + units as i64).min(max_units),
            };
            next[t] += 1;
            let found = search(after, max_units, threads, next, final_units);
            next[t] -= 1;
            if found {
                return true;
            }
        }
        false
    }
    let mut next = vec![0; threads.len()];
    search(initial, max_units, threads, &mut next, final_units)
}

/// A bucket's balance in units at its stored tick, read from its packed word, asserting
/// that the word decodes (its units are at most `max_units`: invariant I1).
pub fn stored_balance<C: tokengate::Clock>(bucket: &tokengate::Bucket<C>) -> i64 {
    let layout = bucket.policy().layout();
    let word = bucket.stored_word();
    let Some((_, units)) = layout.decode(word) else {
        panic!(
            "I1: the word {word:#x} holds {} units, above the capacity's {}",
            word & ((1u64 << layout.token_bits()) - 1),
            layout.max_units()
        );
    };
    units as i64 - layout.base_units() as i64
}

/// A bucket's balance in units brought forward to its clock's current time (what
/// `available()` reads, exactly), asserting I1 on the stored word first.
pub fn balance_now<C: tokengate::Clock>(bucket: &tokengate::Bucket<C>) -> i64 {
    stored_balance(bucket);
    let layout = bucket.policy().layout();
    let now = bucket.clock().now_nanos();
    let snapshot = layout.refill(bucket.stored_word(), layout.tick_of(now));
    layout.balance_units(&snapshot)
}

/// A hasher that puts key `k` in shard `k & 1` of a two-shard keyed map (the shard is
/// bit 56 of the hash): the same shards in every execution, as loom requires.
#[derive(Clone, Copy, Debug, Default)]
pub struct ByParity;

/// [`ByParity`]'s hasher: the key itself, its parity copied to bit 56.
#[derive(Debug)]
pub struct ParityHasher(u64);

impl std::hash::Hasher for ParityHasher {
    fn finish(&self) -> u64 {
        ((self.0 & 1) << 56) | self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl std::hash::BuildHasher for ByParity {
    type Hasher = ParityHasher;

    fn build_hasher(&self) -> ParityHasher {
        ParityHasher(0)
    }
}

/// A [`ManualClock`](tokengate::ManualClock) that the models only ever move forward,
/// and that says so ([`Clock::is_monotonic`](tokengate::Clock::is_monotonic)): the
/// limiters then read it as they read the crate's real clocks, without the high-water
/// guard a clock that may step back gets (one more atomic read-modify-write per reading,
/// which multiplies the interleavings to explore). The guard has its own model
/// (`tests/step_back.rs`), on a plain `ManualClock` stepped back.
#[derive(Clone, Debug, Default)]
pub struct Forward(tokengate::ManualClock);

impl Forward {
    /// A clock at zero.
    pub fn new() -> Forward {
        Forward::default()
    }
}

impl std::ops::Deref for Forward {
    type Target = tokengate::ManualClock;

    fn deref(&self) -> &tokengate::ManualClock {
        &self.0
    }
}

impl tokengate::Clock for Forward {
    fn now_nanos(&self) -> u64 {
        self.0.now_nanos()
    }

    fn is_monotonic(&self) -> bool {
        true
    }
}

/// Two acquirers and a third thread advancing `clock` by `step` nanoseconds, started in
/// that order; the acquirers' outcomes once all three are done. The shape of the models
/// of a clock moving between a reading and its CAS.
pub fn acquirers_racing_an_advance<T, A, B>(
    clock: &Forward,
    step: u64,
    first: A,
    second: B,
) -> [T; 2]
where
    T: Send + 'static,
    A: FnOnce() -> T + Send + 'static,
    B: FnOnce() -> T + Send + 'static,
{
    let (first, second) = (loom::thread::spawn(first), loom::thread::spawn(second));
    let advancer = {
        let clock = clock.clone();
        loom::thread::spawn(move || clock.advance(Duration::from_nanos(step)))
    };
    advancer.join().unwrap();
    [first.join().unwrap(), second.join().unwrap()]
}

/// Whole ticks for this layout to refill at least one token: `ceil(2^F / R)`.
pub fn ticks_per_token(layout: &tokengate::state::Layout) -> u64 {
    (1u64 << layout.frac_bits()).div_ceil(layout.refill_per_tick())
}

/// Spawns `f` on a loom thread of its own, with its own handle of `shared` (cloned here,
/// before the spawn, as a model would write it out).
pub fn spawn_with<S, T>(
    shared: &loom::sync::Arc<S>,
    f: impl FnOnce(&S) -> T + Send + 'static,
) -> loom::thread::JoinHandle<T>
where
    S: Send + Sync + 'static,
    T: Send + 'static,
{
    let shared = shared.clone();
    loom::thread::spawn(move || f(&shared))
}

/// A keyed map as the keyed models use it: `u64` keys, one shard, a frozen [`Forward`]
/// clock, at most `max_keys` keys of `capacity` tokens (refilled at one a second).
pub fn keyed_map(
    capacity: u64,
    max_keys: usize,
) -> loom::sync::Arc<tokengate::KeyedLimiter<u64, Forward>> {
    loom::sync::Arc::new(
        tokengate::KeyedLimiter::builder(policy(capacity), max_keys)
            .clock(Forward::new()) // frozen
            .shards(1)
            .build()
            .unwrap(),
    )
}

/// A [`keyed_map`] of `capacity` per key (at most 4 keys) with key 1 in it, full: the
/// scaffold of the models of a switch racing the key's admissions.
pub fn keyed_map_with_key_one(
    capacity: u64,
) -> loom::sync::Arc<tokengate::KeyedLimiter<u64, Forward>> {
    let map = keyed_map(capacity, 4);
    assert!(map.try_acquire(&1, 0).unwrap().is_admitted());
    map
}

/// Asserts that key 1 of `map` holds `capacity` less `net`, what the model's threads took
/// from it net: no token lost or minted `at` a switch (the message names where).
pub fn assert_key_one_conserved(
    map: &tokengate::KeyedLimiter<u64, Forward>,
    net: i64,
    capacity: f64,
    at: &str,
) {
    assert_eq!(
        map.available(&1) + net as f64,
        capacity,
        "tokens lost or minted {at}: net taken {net}"
    );
}

/// A policy of `capacity` tokens refilled at one a second: the models' frozen clocks
/// never refill it.
pub fn policy(capacity: u64) -> tokengate::Policy {
    tokengate::Policy::new(capacity, 1.0).unwrap()
}

/// Spawns `f` on a loom thread with a stack large enough for a scoped request (its
/// decision and member lists live on the stack: more than a loom thread's default holds).
pub fn spawn_scoped<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> loom::thread::JoinHandle<T> {
    loom::thread::Builder::new()
        .stack_size(4 << 20)
        .spawn(f)
        .unwrap()
}

/// Runs a scoped model's body on a thread of [`spawn_scoped`]'s (the model's main thread
/// has loom's default stack).
pub fn run_scoped(f: impl FnOnce() + Send + 'static) {
    spawn_scoped(f).join().unwrap();
}

/// The scoped limiter of the scoped models: a frozen [`Forward`] clock, and a fixed
/// hasher (the model must be deterministic).
pub type Scoped = tokengate::scope::ScopedLimiter<
    Forward,
    std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>,
>;

/// A [`Scoped`] limiter of users holding `users` tokens each (one shard of at most 8
/// keys), with a global bucket of `global` tokens when there is one, and one work class,
/// "one", costing 1: users 1 to 3 in their map, full. Three users fill the shard's first
/// allocation, so a fourth grows it (every entry moves).
pub fn users_limiter(global: Option<u64>, users: u64) -> loom::sync::Arc<Scoped> {
    use tokengate::scope::{Request, Rule, RuleSet, ScopeKind, UserId, WorkClass};
    let mut rules = RuleSet::new();
    if let Some(global) = global {
        rules = rules.rule(ScopeKind::Global, Rule::new(policy(global)));
    }
    let limiter = loom::sync::Arc::new(
        rules
            .rule(
                ScopeKind::User,
                Rule::new(policy(users)).max_keys(8).shards(1),
            )
            .class(WorkClass::new("one", 1))
            .build_with(Forward::new(), Default::default())
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

/// The tokens `limiter` holds in `scope`.
pub fn left(limiter: &Scoped, scope: tokengate::scope::Scope) -> f64 {
    limiter.available(&scope).unwrap()
}

/// The writer's side of the held-insert models, with `reader` (two held requests for
/// user 1, of two tokens) running: a request of class `one` for user 4, new, whose
/// insertion grows the user shard's table (every entry moves); then both admissions,
/// the insertion and the balances `expected` exact.
pub fn insert_user_4_racing<R>(
    limiter: &Scoped,
    one: tokengate::scope::ClassId,
    reader: loom::thread::JoinHandle<R>,
    expected: &[(tokengate::scope::Scope, f64)],
) where
    R: PartialEq<[bool; 2]> + std::fmt::Debug,
{
    use tokengate::scope::{Request, ScopeKind, UserId};
    let w = Request::new().user(UserId(4));
    let inserted = limiter.try_acquire(&w, one).unwrap().is_admitted();
    let admitted = reader.join().unwrap();
    assert_eq!(admitted, [true, true], "a held request's admission lost");
    assert!(inserted, "the new key's request refused");
    assert_eq!(limiter.len(ScopeKind::User), 4);
    assert_left(limiter, expected);
}

/// Asserts that `limiter` holds exactly what `expected` says of each scope, in that order:
/// no token lost or minted on it.
pub fn assert_left(limiter: &Scoped, expected: &[(tokengate::scope::Scope, f64)]) {
    for &(scope, expected) in expected {
        assert_eq!(
            left(limiter, scope),
            expected,
            "tokens lost or minted on {scope}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(cost_units: u64, admitted: bool, balance_after: i64) -> Op {
        Op::Take {
            cost_units,
            admitted,
            balance_after,
        }
    }

    #[test]
    fn a_serial_history_has_a_witness() {
        let threads = [vec![take(2, true, 1)], vec![take(2, false, 1)]];
        assert!(has_sequential_witness(3, 3, &threads, 1));
    }

    #[test]
    fn two_admissions_beyond_the_balance_have_no_witness() {
        let threads = [vec![take(2, true, 1)], vec![take(2, true, 1)]];
        assert!(!has_sequential_witness(3, 3, &threads, -1));
    }

    #[test]
    fn a_refusal_nobody_explains_has_no_witness() {
        let threads = [vec![take(2, false, 3)], vec![take(1, true, 2)]];
        assert!(!has_sequential_witness(3, 3, &threads, 2));
    }

    #[test]
    fn a_refund_is_replayed_capped() {
        let threads = [
            vec![take(2, true, 1), Op::Refund { units: 2 }],
            vec![take(3, true, 0)],
        ];
        assert!(has_sequential_witness(3, 3, &threads, 0));
        assert!(!has_sequential_witness(3, 3, &threads, 1));
    }
}
