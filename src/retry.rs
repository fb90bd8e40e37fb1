//! Retrying calls to a rate-limited service without synchronized retry waves.
//!
//! When many clients are refused at the same instant, retrying after the same delay brings
//! them all back at the same instant again. [`Retry`] spreads them out:
//!
//! - **bounded attempts**: at most [`RetryPolicy::max_attempts`], the first included;
//! - **exponential backoff with full jitter** (the "Full Jitter" of AWS's *Exponential
//!   Backoff And Jitter*): before retry `n` (1 for the first retry) it sleeps a uniformly
//!   random time in `[0, min(cap, base * 2^(n-1))]`;
//! - **never earlier than the server said**: a `Retry-After` the server gave is a floor,
//!   and the jitter is added on top of it. Taking the larger of the two instead would
//!   bring back together every client refused in the same second, since they all get the
//!   same whole-second `Retry-After` (see [`http`](crate::http));
//! - **an overall deadline**: a retry that would start after
//!   [`RetryPolicy::deadline`] from the first attempt is not made;
//! - **marked for telemetry**: the operation learns whether it runs as the
//!   [`Attempt::Original`] or as [`Attempt::Retry(n)`](Attempt::Retry), so retries can be
//!   counted apart from organic load.
//!
//! Time comes from a [`Clock`] and randomness from a [`RandomSource`], both injected, so a
//! simulation on a [`ManualClock`](crate::ManualClock) with a seeded [`SplitMix64`] is
//! exactly reproducible. [`Retry::next_delay`] is the runtime-agnostic core (sleep with any
//! timer); [`Retry::run`] drives a blocking loop through a [`Sleep`] strategy.
//!
//! ```
//! use std::time::Duration;
//! use tokengate::retry::{Failure, Retry, RetryPolicy, SplitMix64};
//! use tokengate::{telemetry::Attempt, ManualClock};
//!
//! let policy = RetryPolicy::new(4, Duration::from_millis(100), Duration::from_secs(2))?
//!     .deadline(Duration::from_secs(10));
//! let clock = ManualClock::new();
//! let retry = Retry::with_rng(policy, clock.clone(), SplitMix64::new(7));
//!
//! let mut seen = Vec::new();
//! let result = retry.run(&clock, |attempt| {
//!     seen.push(attempt);
//!     if attempt == Attempt::Retry(2) {
//!         Ok("done")
//!     } else {
//!         // The server answered 429 with `Retry-After: 1`.
//!         Err(Failure::after("throttled", Duration::from_secs(1)))
//!     }
//! });
//! assert_eq!(result.unwrap(), "done");
//! assert_eq!(seen, [Attempt::Original, Attempt::Retry(1), Attempt::Retry(2)]);
//! assert!(clock.now() >= Duration::from_secs(2)); // two waits, each at least 1 s
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::time::Duration;

use crate::attempt::Attempt;
use crate::clock::Clock;
use crate::decision::duration_from_nanos;
use crate::sleep::Sleep;

/// A source of uniformly distributed 64-bit values: where the jitter comes from.
pub trait RandomSource {
    /// The next value.
    fn next_u64(&mut self) -> u64;

    /// A value uniformly distributed in `[0, bound]`, by Lemire's multiply-shift: no
    /// division, and a bias below `bound / 2^64`, negligible for any duration in
    /// nanoseconds.
    ///
    /// ```
    /// use tokengate::retry::{RandomSource, SplitMix64};
    /// let mut rng = SplitMix64::new(1);
    /// assert!((0..1000).all(|_| rng.below_or_equal(10) <= 10));
    /// assert_eq!(rng.below_or_equal(0), 0);
    /// ```
    fn below_or_equal(&mut self, bound: u64) -> u64 {
        let span = u128::from(bound) + 1;
        ((u128::from(self.next_u64()) * span) >> 64) as u64
    }
}

impl<R: RandomSource + ?Sized> RandomSource for &mut R {
    fn next_u64(&mut self) -> u64 {
        (**self).next_u64()
    }
}

/// SplitMix64 (Steele, Lea and Flood, 2014; the seeding generator of the xoshiro family):
/// a 64-bit state advanced by a constant and mixed by two multiply-xorshift rounds. Tiny,
/// fast, and with good enough statistics for jitter; not for cryptography.
///
/// ```
/// use tokengate::retry::{RandomSource, SplitMix64};
/// let mut a = SplitMix64::new(42);
/// let mut b = SplitMix64::new(42);
/// assert_eq!(a.next_u64(), b.next_u64()); // a seed fixes the sequence
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator with the given seed.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// A generator seeded from the standard library's per-process random hash keys, so
    /// that clients in different processes draw different jitter.
    ///
    /// ```
    /// use tokengate::retry::{RandomSource, SplitMix64};
    /// assert_ne!(SplitMix64::from_entropy().next_u64(), SplitMix64::from_entropy().next_u64());
    /// ```
    pub fn from_entropy() -> SplitMix64 {
        use std::hash::{BuildHasher, Hasher};
        // Each `RandomState::new()` has fresh keys (random per process, incremented per
        // call), so successive generators differ too.
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(0x5eed);
        SplitMix64::new(hasher.finish())
    }
}

impl RandomSource for SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// How the backoff before each retry is drawn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Jitter {
    /// Uniformly random in `[0, min(cap, base * 2^(n-1))]` (the default).
    #[default]
    Full,
    /// Exactly `min(cap, base * 2^(n-1))`: plain exponential backoff. Clients refused
    /// together retry together; offered for comparison and for single clients.
    None,
}

/// Why a [`RetryPolicy`] is invalid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryPolicyError {
    /// `max_attempts` is zero; it counts the first attempt, so it must be at least 1.
    ZeroAttempts,
    /// The base backoff is zero; it must be at least 1 ns.
    ZeroBase,
    /// The cap is below the base.
    CapBelowBase {
        /// The base backoff.
        base: Duration,
        /// The cap asked for.
        cap: Duration,
    },
    /// The cap is above the longest backoff drawn, `u64::MAX` nanoseconds (584 years).
    CapTooLong {
        /// The cap asked for.
        cap: Duration,
    },
}

impl fmt::Display for RetryPolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetryPolicyError::ZeroAttempts => {
                f.write_str("max_attempts counts the first attempt and must be at least 1, got 0")
            }
            RetryPolicyError::ZeroBase => f.write_str("the base backoff must be above zero"),
            RetryPolicyError::CapBelowBase { base, cap } => write!(
                f,
                "the backoff cap {cap:?} must be at least the base backoff {base:?}"
            ),
            RetryPolicyError::CapTooLong { cap } => write!(
                f,
                "the backoff cap {cap:?} is above the longest backoff, {:?}",
                Duration::from_nanos(u64::MAX)
            ),
        }
    }
}

impl std::error::Error for RetryPolicyError {}

/// Bounded attempts, exponential backoff with jitter, and an optional overall deadline.
///
/// ```
/// use std::time::Duration;
/// use tokengate::retry::RetryPolicy;
///
/// let policy = RetryPolicy::new(5, Duration::from_millis(100), Duration::from_secs(1))?;
/// assert_eq!(policy.ceiling(1), Duration::from_millis(100));
/// assert_eq!(policy.ceiling(3), Duration::from_millis(400));
/// assert_eq!(policy.ceiling(5), Duration::from_secs(1)); // capped (1.6 s)
/// assert!(RetryPolicy::new(0, Duration::from_millis(100), Duration::from_secs(1)).is_err());
/// # Ok::<(), tokengate::retry::RetryPolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    base: Duration,
    cap: Duration,
    deadline: Option<Duration>,
    jitter: Jitter,
}

impl RetryPolicy {
    /// At most `max_attempts` attempts (the first included), backing off up to
    /// `base * 2^(n-1)` before retry `n`, never more than `cap`; full jitter, no deadline.
    ///
    /// # Errors
    ///
    /// [`RetryPolicyError`] for zero attempts, a zero base, a cap below the base, or a cap
    /// above `u64::MAX` nanoseconds.
    pub fn new(
        max_attempts: u32,
        base: Duration,
        cap: Duration,
    ) -> Result<RetryPolicy, RetryPolicyError> {
        if max_attempts == 0 {
            return Err(RetryPolicyError::ZeroAttempts);
        }
        if base.is_zero() {
            return Err(RetryPolicyError::ZeroBase);
        }
        if cap < base {
            return Err(RetryPolicyError::CapBelowBase { base, cap });
        }
        if cap.as_nanos() > u128::from(u64::MAX) {
            return Err(RetryPolicyError::CapTooLong { cap });
        }
        Ok(RetryPolicy {
            max_attempts,
            base,
            cap,
            deadline: None,
            jitter: Jitter::Full,
        })
    }

    /// No retry starts later than `deadline` after the first attempt started.
    pub fn deadline(mut self, deadline: Duration) -> RetryPolicy {
        self.deadline = Some(deadline);
        self
    }

    /// How backoffs are drawn ([`Jitter::Full`] by default).
    pub fn jitter(mut self, jitter: Jitter) -> RetryPolicy {
        self.jitter = jitter;
        self
    }

    /// The most attempts made, the first included.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The overall deadline, if any.
    pub fn overall_deadline(&self) -> Option<Duration> {
        self.deadline
    }

    /// The jitter mode.
    pub fn jitter_mode(&self) -> Jitter {
        self.jitter
    }

    /// The largest backoff before retry `n` (1 for the first retry):
    /// `min(cap, base * 2^(n-1))`; retry 0 is treated as retry 1.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let cap = self.cap.as_nanos();
        let doublings = retry.saturating_sub(1);
        // base <= cap < 2^64 ns, so 63 doublings fit a u128; beyond, the cap applies.
        let backoff = if doublings > 63 {
            cap
        } else {
            (self.base.as_nanos() << doublings).min(cap)
        };
        duration_from_nanos(backoff)
    }
}

/// Why a retry loop stopped without success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GiveUp {
    /// The operation said its failure is not worth retrying ([`Failure::permanent`]).
    Permanent,
    /// Every allowed attempt was made.
    AttemptsExhausted {
        /// The policy's maximum, all of them made.
        attempts: u32,
    },
    /// The next retry would have started after the overall deadline.
    DeadlineExceeded {
        /// The policy's deadline, from the start of the first attempt.
        deadline: Duration,
        /// When the next retry would have started, from the start of the first attempt.
        next_start: Duration,
    },
}

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GiveUp::Permanent => f.write_str("the failure is permanent"),
            GiveUp::AttemptsExhausted { attempts } => {
                write!(f, "all {attempts} allowed attempts were made")
            }
            GiveUp::DeadlineExceeded {
                deadline,
                next_start,
            } => write!(
                f,
                "the next retry would start {next_start:?} after the first attempt, past the \
                 deadline of {deadline:?}"
            ),
        }
    }
}

/// How an attempt failed: the error, whether to retry, and the server's `Retry-After`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure<E> {
    error: E,
    retry_after: Option<Duration>,
    retryable: bool,
}

impl<E> Failure<E> {
    /// A failure worth retrying, with no hint from the server.
    pub fn transient(error: E) -> Failure<E> {
        Failure {
            error,
            retry_after: None,
            retryable: true,
        }
    }

    /// A failure worth retrying no earlier than `retry_after` from now (the server's
    /// `Retry-After`, see [`http::parse_retry_after`](crate::http::parse_retry_after)).
    pub fn after(error: E, retry_after: Duration) -> Failure<E> {
        Failure {
            error,
            retry_after: Some(retry_after),
            retryable: true,
        }
    }

    /// A failure not worth retrying (a 400, an authorization error).
    pub fn permanent(error: E) -> Failure<E> {
        Failure {
            error,
            retry_after: None,
            retryable: false,
        }
    }

    /// The error.
    pub fn error(&self) -> &E {
        &self.error
    }

    /// The server's hint, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Whether a retry may help.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }
}

/// The last error of a retry loop that gave up, with how many attempts were made and why
/// it stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryError<E> {
    /// The error of the last attempt.
    pub error: E,
    /// Attempts made, the first included.
    pub attempts: u32,
    /// Why no further attempt was made.
    pub reason: GiveUp,
}

impl<E: fmt::Display> fmt::Display for RetryError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "gave up after {} attempt(s) ({}): {}",
            self.attempts, self.reason, self.error
        )
    }
}

impl<E: std::error::Error + 'static> std::error::Error for RetryError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// The retry state of one operation: which attempt is next, and how long to wait before
/// it.
///
/// Made when the first attempt starts (it reads the clock then, for the deadline).
#[derive(Debug)]
pub struct Retry<C: Clock, R: RandomSource = SplitMix64> {
    policy: RetryPolicy,
    clock: C,
    rng: R,
    started_at: u64,
    attempt: Attempt,
}

impl<C: Clock> Retry<C> {
    /// Retry state on `clock`, with jitter from [`SplitMix64::from_entropy`].
    pub fn new(policy: RetryPolicy, clock: C) -> Retry<C> {
        Retry::with_rng(policy, clock, SplitMix64::from_entropy())
    }
}

impl<C: Clock, R: RandomSource> Retry<C, R> {
    /// Retry state on `clock`, with jitter from `rng` (seed it for reproducible runs).
    pub fn with_rng(policy: RetryPolicy, clock: C, rng: R) -> Retry<C, R> {
        let started_at = clock.now_nanos();
        Retry {
            policy,
            clock,
            rng,
            started_at,
            attempt: Attempt::Original,
        }
    }

    /// The attempt to make now: [`Attempt::Original`] first, then
    /// [`Attempt::Retry(n)`](Attempt::Retry) after each granted [`next_delay`](Self::next_delay).
    pub fn attempt(&self) -> Attempt {
        self.attempt
    }

    /// Attempts made or being made, the first included.
    pub fn attempts(&self) -> u32 {
        match self.attempt {
            Attempt::Original => 1,
            Attempt::Retry(n) => n.saturating_add(1),
        }
    }

    /// Time since the first attempt started, on the clock.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.clock.now_nanos().saturating_sub(self.started_at))
    }

    /// After the current attempt failed: how long to wait before the next one, or why
    /// there is none. On success the next [`attempt`](Self::attempt) is the following
    /// retry.
    ///
    /// The wait is `retry_after` (zero if `None`) plus the backoff for retry `n`:
    /// uniform in `[0, ceiling(n)]` with full jitter, `ceiling(n)` without.
    ///
    /// # Errors
    ///
    /// [`GiveUp::AttemptsExhausted`] when every allowed attempt was made;
    /// [`GiveUp::DeadlineExceeded`] when the next attempt would start past the deadline.
    /// Neither changes the state.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokengate::retry::{GiveUp, Jitter, Retry, RetryPolicy, SplitMix64};
    /// use tokengate::{telemetry::Attempt, ManualClock};
    ///
    /// let policy = RetryPolicy::new(3, Duration::from_secs(1), Duration::from_secs(8))?
    ///     .jitter(Jitter::None);
    /// let mut retry = Retry::with_rng(policy, ManualClock::new(), SplitMix64::new(0));
    /// assert_eq!(retry.next_delay(None), Ok(Duration::from_secs(1)));
    /// assert_eq!(retry.attempt(), Attempt::Retry(1));
    /// // The server's Retry-After is a floor, the backoff comes on top.
    /// assert_eq!(retry.next_delay(Some(Duration::from_secs(5))), Ok(Duration::from_secs(7)));
    /// assert_eq!(retry.next_delay(None), Err(GiveUp::AttemptsExhausted { attempts: 3 }));
    /// # Ok::<(), tokengate::retry::RetryPolicyError>(())
    /// ```
    pub fn next_delay(&mut self, retry_after: Option<Duration>) -> Result<Duration, GiveUp> {
        let made = self.attempts();
        if made >= self.policy.max_attempts {
            return Err(GiveUp::AttemptsExhausted { attempts: made });
        }
        let ceiling = self.policy.ceiling(made);
        let backoff = match self.policy.jitter {
            Jitter::Full => {
                // The cap is validated to fit u64 nanoseconds.
                let bound = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
                Duration::from_nanos(self.rng.below_or_equal(bound))
            }
            Jitter::None => ceiling,
        };
        let delay = retry_after
            .unwrap_or(Duration::ZERO)
            .saturating_add(backoff);
        if let Some(deadline) = self.policy.deadline {
            let next_start = self.elapsed().saturating_add(delay);
            if next_start > deadline {
                return Err(GiveUp::DeadlineExceeded {
                    deadline,
                    next_start,
                });
            }
        }
        self.attempt = self.attempt.next();
        Ok(delay)
    }

    /// Runs `op` until it succeeds or the policy gives up, sleeping between attempts with
    /// `sleep` ([`ThreadSleep`](crate::reservation::ThreadSleep) for real clocks, the
    /// [`ManualClock`](crate::ManualClock) itself in simulations). `op` is told which
    /// attempt it is, for telemetry.
    ///
    /// # Errors
    ///
    /// [`RetryError`] with the last attempt's error, the number of attempts made, and why
    /// the loop stopped.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tokengate::retry::{Failure, GiveUp, Retry, RetryPolicy, SplitMix64};
    /// use tokengate::ManualClock;
    ///
    /// let policy = RetryPolicy::new(3, Duration::from_millis(10), Duration::from_secs(1))?;
    /// let clock = ManualClock::new();
    /// let retry = Retry::with_rng(policy, clock.clone(), SplitMix64::new(1));
    /// let err = retry
    ///     .run(&clock, |_| Err::<(), _>(Failure::transient("busy")))
    ///     .unwrap_err();
    /// assert_eq!(err.attempts, 3);
    /// assert_eq!(err.reason, GiveUp::AttemptsExhausted { attempts: 3 });
    /// # Ok::<(), tokengate::retry::RetryPolicyError>(())
    /// ```
    pub fn run<T, E, S: Sleep + ?Sized>(
        mut self,
        sleep: &S,
        mut op: impl FnMut(Attempt) -> Result<T, Failure<E>>,
    ) -> Result<T, RetryError<E>> {
        loop {
            let failure = match op(self.attempt) {
                Ok(value) => return Ok(value),
                Err(failure) => failure,
            };
            let attempts = self.attempts();
            let outcome = if failure.retryable {
                self.next_delay(failure.retry_after)
            } else {
                Err(GiveUp::Permanent)
            };
            match outcome {
                Ok(delay) => sleep.sleep(delay),
                Err(reason) => {
                    return Err(RetryError {
                        error: failure.error,
                        attempts,
                        reason,
                    });
                }
            }
        }
    }
}
