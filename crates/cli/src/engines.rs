//! The engines the `bench` subcommand compares, the regimes they run in, and the
//! multi-threaded harness that drives them. `benches/engine.rs` includes this same file, so
//! the command-line sweep and the criterion benches measure the same code.
//!
//! # Adding an engine
//!
//! 1. a variant in [`Engine`] and in [`Engine::ALL`], with its `name` (the command-line
//!    value), `label` (the table heading) and `regimes`;
//! 2. a [`Limiter`] impl for its type (one decision of cost 1; keyed engines draw their
//!    key with [`random_key`]);
//! 3. one arm in [`Engine::visit`] building it for a [`Regime`].
//!

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use tokengate::{Bucket, Clock, CoarseClock, KeyedLimiter, LeasedBucket, Policy, QuantaClock};

use crate::mutex_bucket::MutexBucket;

/// Keys of the keyed regime, picked uniformly at random.
pub const KEYS: u64 = 100_000;

/// The key bound of tokengate's keyed limiter in the keyed regime (above [`KEYS`]).
const MAX_KEYS: usize = 1 << 20;

/// A traffic regime: the policy every engine enforces, the same for all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Regime {
    /// 1e9 tokens/s, burst 1e6, one shared bucket: practically every request is admitted,
    /// so every decision writes (a CAS, a lock).
    Admit,
    /// 1 token/s, burst 1, one shared bucket: practically every request is rejected, the
    /// read-only path.
    Reject,
    /// 1000 tokens/s, burst 100 per key, over [`KEYS`] `u64` keys picked uniformly at
    /// random: a lookup plus a decision.
    Keyed,
}

impl Regime {
    /// Every regime, in table order.
    pub const ALL: [Regime; 3] = [Regime::Admit, Regime::Reject, Regime::Keyed];

    /// The command-line value.
    pub fn name(self) -> &'static str {
        match self {
            Regime::Admit => "admit",
            Regime::Reject => "reject",
            Regime::Keyed => "keyed",
        }
    }

    /// Capacity (burst) in tokens.
    pub fn capacity(self) -> u32 {
        match self {
            Regime::Admit => 1_000_000,
            Regime::Reject => 1,
            Regime::Keyed => 100,
        }
    }

    /// Refill rate in tokens per second.
    pub fn refill_per_second(self) -> u32 {
        match self {
            Regime::Admit => 1_000_000_000,
            Regime::Reject => 1,
            Regime::Keyed => 1_000,
        }
    }

    /// One line saying what the regime measures.
    pub fn describe(self) -> &'static str {
        match self {
            Regime::Admit => {
                "admit-heavy: one shared bucket, B = 1e6, r = 1e9 tokens/s; every request is admitted (a write per decision)"
            }
            Regime::Reject => {
                "reject-heavy: one shared bucket, B = 1, r = 1 token/s; every request is rejected (the read-only path)"
            }
            Regime::Keyed => {
                "keyed: B = 100, r = 1000 tokens/s per key, 100,000 u64 keys picked uniformly at random"
            }
        }
    }

    /// The tokengate policy of this regime.
    pub fn policy(self) -> Result<Policy, tokengate::PolicyError> {
        Policy::new(
            u64::from(self.capacity()),
            f64::from(self.refill_per_second()),
        )
    }

    /// The governor quota of this regime.
    pub fn quota(self) -> Quota {
        let nz = |v: u32| NonZeroU32::new(v).expect("regime constants are positive");
        Quota::per_second(nz(self.refill_per_second())).allow_burst(nz(self.capacity()))
    }

    /// The engine ratios are taken against in this regime.
    pub fn baseline(self) -> Engine {
        match self {
            Regime::Admit | Regime::Reject => Engine::Governor,
            Regime::Keyed => Engine::GovernorKeyed,
        }
    }
}

/// A limiter under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Engine {
    /// tokengate `Bucket` on the TSC clock (`QuantaClock`, the default).
    Tokengate,
    /// tokengate `Bucket` on the coarse clock (`CoarseClock`, one atomic load per read).
    TokengateCoarse,
    /// governor's direct limiter (`check()`), its default quanta clock.
    Governor,
    /// A floating-point token bucket behind `std::sync::Mutex`.
    Mutex,
    /// tokengate's keyed limiter (`KeyedLimiter<u64>`, default hasher: aHash).
    TokengateKeyed,
    /// governor's keyed limiter (`check_key`), default dashmap store and hasher.
    GovernorKeyed,
    /// The keyed floor: 2^18 atomic words indexed by the key's hash (no key stored, no
    /// lookup), one TSC read, one load and one CAS: the least a keyed admission can cost.
    FloorKeyed,
    /// tokengate `LeasedBucket`: core-local leases, on the TSC clock.
    Leased,
    /// tokengate `LeasedBucket` on the coarse clock (the local path reads one shared,
    /// rarely written line instead of the TSC).
    LeasedCoarse,
}

impl Engine {
    /// Every engine, in table order.
    pub const ALL: [Engine; 9] = [
        Engine::Tokengate,
        Engine::TokengateCoarse,
        Engine::Leased,
        Engine::LeasedCoarse,
        Engine::Governor,
        Engine::Mutex,
        Engine::TokengateKeyed,
        Engine::GovernorKeyed,
        Engine::FloorKeyed,
    ];

    /// The command-line value.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Tokengate => "tokengate",
            Engine::TokengateCoarse => "tokengate-coarse",
            Engine::Governor => "governor",
            Engine::Mutex => "mutex",
            Engine::TokengateKeyed => "tokengate-keyed",
            Engine::GovernorKeyed => "governor-keyed",
            Engine::FloorKeyed => "floor-keyed",
            Engine::Leased => "tokengate-leased",
            Engine::LeasedCoarse => "tokengate-leased-coarse",
        }
    }

    /// The table heading and chart legend.
    pub fn label(self) -> &'static str {
        match self {
            Engine::Tokengate => "tokengate (TSC clock)",
            Engine::TokengateCoarse => "tokengate (coarse clock)",
            Engine::Governor => "governor check()",
            Engine::Mutex => "Mutex<f64 bucket>",
            Engine::TokengateKeyed => "tokengate keyed",
            Engine::GovernorKeyed => "governor keyed",
            Engine::FloorKeyed => "floor (hashed words)",
            Engine::Leased => "tokengate leased (TSC clock)",
            Engine::LeasedCoarse => "tokengate leased (coarse clock)",
        }
    }

    /// The regimes this engine runs in.
    pub fn regimes(self) -> &'static [Regime] {
        match self {
            Engine::Tokengate
            | Engine::TokengateCoarse
            | Engine::Leased
            | Engine::LeasedCoarse
            | Engine::Governor
            | Engine::Mutex => &[Regime::Admit, Regime::Reject],
            Engine::TokengateKeyed | Engine::GovernorKeyed | Engine::FloorKeyed => &[Regime::Keyed],
        }
    }

    /// Builds this engine for `regime` and hands it to `visit` (monomorphised per engine,
    /// so the harness calls it without dynamic dispatch).
    ///
    /// # Errors
    ///
    /// A message when the engine does not run in `regime` or cannot be built.
    pub fn visit<V: Visit>(self, regime: Regime, visit: V) -> Result<V::Out, String> {
        if !self.regimes().contains(&regime) {
            return Err(format!(
                "engine {} does not run in the {} regime",
                self.name(),
                regime.name()
            ));
        }
        let policy = || regime.policy().map_err(|e| e.to_string());
        Ok(match self {
            Engine::Tokengate => visit.visit(&Bucket::new(policy()?)),
            Engine::TokengateCoarse => {
                let clock = CoarseClock::new().map_err(|e| e.to_string())?;
                visit.visit(&Bucket::with_clock(policy()?, clock))
            }
            Engine::Leased => visit.visit(&LeasedBucket::new(policy()?)),
            Engine::LeasedCoarse => {
                let clock = CoarseClock::new().map_err(|e| e.to_string())?;
                visit.visit(&LeasedBucket::with_clock(policy()?, clock))
            }
            Engine::Governor => visit.visit(&Direct(RateLimiter::direct(regime.quota()))),
            Engine::Mutex => visit.visit(&MutexBucket::new(
                f64::from(regime.capacity()),
                f64::from(regime.refill_per_second()),
            )),
            Engine::TokengateKeyed => {
                let limiter = Keyed::new(policy()?)?;
                limiter.fill();
                visit.visit(&limiter)
            }
            Engine::GovernorKeyed => {
                let limiter = GovernorKeyed(RateLimiter::keyed(regime.quota()));
                limiter.fill();
                visit.visit(&limiter)
            }
            Engine::FloorKeyed => visit.visit(&KeyedFloor::new()),
        })
    }
}

/// A generic callback over the engine types: what [`Engine::visit`] hands each engine to.
pub trait Visit {
    /// What the callback returns.
    type Out;
    /// Called with the built engine.
    fn visit<L: Limiter>(self, limiter: &L) -> Self::Out;
}

/// One admission decision of cost 1, shared across threads.
pub trait Limiter: Sync {
    /// Decides one request; `rng` is the calling thread's private random state (keyed
    /// engines draw their key from it with [`random_key`]). Returns whether it was
    /// admitted. The engine's full result passes through `black_box`, so it is computed.
    fn decide(&self, rng: &mut u64) -> bool;
}

impl<C: Clock> Limiter for Bucket<C> {
    #[inline]
    fn decide(&self, _: &mut u64) -> bool {
        matches!(black_box(self.try_acquire(1)), Ok(d) if d.is_admitted())
    }
}

/// governor's direct limiter.
#[derive(Debug)]
pub struct Direct(pub DefaultDirectRateLimiter);

impl Limiter for Direct {
    #[inline]
    fn decide(&self, _: &mut u64) -> bool {
        black_box(self.0.check()).is_ok()
    }
}

impl Limiter for MutexBucket {
    #[inline]
    fn decide(&self, _: &mut u64) -> bool {
        black_box(self.try_acquire(1.0))
    }
}

/// tokengate's keyed limiter over `u64` keys.
#[derive(Debug)]
pub struct Keyed(pub KeyedLimiter<u64>);

impl Keyed {
    /// A limiter for up to `MAX_KEYS` keys, each with `policy`.
    pub fn new(policy: Policy) -> Result<Keyed, String> {
        KeyedLimiter::new(policy, MAX_KEYS)
            .map(Keyed)
            .map_err(|e| e.to_string())
    }

    /// Inserts every key once, so the measurement is of lookups, not of inserts.
    pub fn fill(&self) {
        for key in 0..KEYS {
            let _ = self.0.try_acquire(&key, 1);
        }
    }
}

impl Limiter for Keyed {
    #[inline]
    fn decide(&self, rng: &mut u64) -> bool {
        let key = random_key(rng);
        matches!(black_box(self.0.try_acquire(&key, 1)), Ok(d) if d.is_admitted())
    }
}

/// The keyed floor: [`KeyedFloor::WORDS`] atomic words, a key's word picked by its hash
/// (tokengate's default hasher), then what the one-bucket floor does: one TSC read through
/// the path `QuantaClock` uses, one load, one CAS. No key is stored or compared, so two
/// keys may share a word: not a limiter, the least a keyed admission can cost.
pub struct KeyedFloor {
    words: Box<[AtomicU64]>,
    hasher: tokengate::keyed::KeyHasher,
    clock: QuantaClock,
}

impl KeyedFloor {
    /// 2^18 words (2 MiB): room for [`KEYS`] keys at a load like a hash table's.
    pub const WORDS: usize = 1 << 18;

    /// Zeroed words, a fresh seeded hasher.
    pub fn new() -> KeyedFloor {
        KeyedFloor {
            words: (0..Self::WORDS).map(|_| AtomicU64::new(0)).collect(),
            hasher: tokengate::keyed::KeyHasher::default(),
            clock: QuantaClock::new(),
        }
    }
}

impl Default for KeyedFloor {
    fn default() -> Self {
        KeyedFloor::new()
    }
}

impl Limiter for KeyedFloor {
    #[inline]
    fn decide(&self, rng: &mut u64) -> bool {
        let key = random_key(rng);
        let hash = self.hasher.hash_one(key);
        let word = &self.words[(hash >> (64 - Self::WORDS.trailing_zeros())) as usize];
        let now = self.clock.now_nanos();
        let cur = word.load(Ordering::Relaxed);
        black_box(
            word.compare_exchange(cur, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok(),
        )
    }
}

/// governor's keyed limiter over `u64` keys.
#[derive(Debug)]
pub struct GovernorKeyed(pub DefaultKeyedRateLimiter<u64>);

impl GovernorKeyed {
    /// Inserts every key once, so the measurement is of lookups, not of inserts.
    pub fn fill(&self) {
        for key in 0..KEYS {
            let _ = self.0.check_key(&key);
        }
    }
}

impl Limiter for GovernorKeyed {
    #[inline]
    fn decide(&self, rng: &mut u64) -> bool {
        let key = random_key(rng);
        black_box(self.0.check_key(&key)).is_ok()
    }
}

impl<C: Clock> Limiter for LeasedBucket<C> {
    #[inline]
    fn decide(&self, _: &mut u64) -> bool {
        matches!(black_box(self.try_acquire(1)), Ok(d) if d.is_admitted())
    }
}

/// A key in `0..KEYS`, uniform, from a xorshift64 state (never zero).
#[inline]
pub fn random_key(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    ((u128::from(x) * u128::from(KEYS)) >> 64) as u64
}

/// A distinct non-zero random state for thread `index`.
pub fn thread_seed(index: usize) -> u64 {
    0x9E37_79B9_7F4A_7C15_u64.wrapping_mul(index as u64 + 1) | 1
}

/// What one multi-threaded run measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// Decisions made, all threads together.
    pub decisions: u64,
    /// Of which admitted.
    pub admitted: u64,
    /// Wall time from the common start to the last thread's end.
    pub elapsed: Duration,
}

impl Sample {
    /// Aggregate throughput, in millions of decisions per second.
    pub fn mops(&self) -> f64 {
        self.decisions as f64 / self.elapsed.as_secs_f64() / 1e6
    }
}

/// Runs `threads` threads on `limiter` until `duration` has passed: every thread starts
/// at one barrier and checks a stop flag every 256 decisions.
pub fn run_for<L: Limiter>(limiter: &L, threads: usize, duration: Duration) -> Sample {
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (stop, barrier) = (&stop, &barrier);
                s.spawn(move || {
                    let mut rng = thread_seed(t);
                    let (mut decisions, mut admitted) = (0u64, 0u64);
                    barrier.wait();
                    let start = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..256 {
                            admitted += u64::from(limiter.decide(&mut rng));
                        }
                        decisions += 256;
                    }
                    (decisions, admitted, start, Instant::now())
                })
            })
            .collect();
        barrier.wait();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        collect(
            workers
                .into_iter()
                .map(|w| w.join().expect("worker panicked")),
        )
    })
}

/// Runs `ops` decisions split over `threads` threads started at one barrier; returns the
/// wall time from the first thread's start to the last one's end (for criterion's
/// `iter_custom`).
#[allow(dead_code)] // used by benches/engine.rs, which includes this file
pub fn run_ops<L: Limiter>(limiter: &L, threads: usize, ops: u64) -> Duration {
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                let share = ops / threads as u64 + u64::from((t as u64) < ops % threads as u64);
                s.spawn(move || {
                    let mut rng = thread_seed(t);
                    let mut admitted = 0u64;
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..share {
                        admitted += u64::from(limiter.decide(&mut rng));
                    }
                    (share, admitted, start, Instant::now())
                })
            })
            .collect();
        collect(
            workers
                .into_iter()
                .map(|w| w.join().expect("worker panicked")),
        )
        .elapsed
    })
}

fn collect(results: impl Iterator<Item = (u64, u64, Instant, Instant)>) -> Sample {
    let mut sample = Sample::default();
    let (mut first, mut last) = (None::<Instant>, None::<Instant>);
    for (decisions, admitted, start, end) in results {
        sample.decisions += decisions;
        sample.admitted += admitted;
        first = Some(first.map_or(start, |f| f.min(start)));
        last = Some(last.map_or(end, |l| l.max(end)));
    }
    if let (Some(first), Some(last)) = (first, last) {
        sample.elapsed = last.duration_since(first);
    }
    sample
}

/// Starts the process-wide clocks (quanta's calibration, the coarse clock's upkeep thread)
/// before anything is timed.
pub fn warm_clocks() {
    let _ = QuantaClock::new().now_nanos();
    let _ = quanta::Instant::now();
    let _ = CoarseClock::new();
}
