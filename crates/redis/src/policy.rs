//! A bucket's policy as the Redis scripts see it: integer fields that stay inside Lua's
//! exact integer range.

use std::fmt;

/// Units of a token in the Redis state: balances are kept in micro-tokens.
pub const UNITS_PER_TOKEN: u64 = 1_000_000;

/// Lua 5.1 numbers are doubles: integers are exact up to this bound.
pub const LUA_EXACT_LIMIT: u64 = 1 << 53;

/// The finest rate the scripts represent: rates are kept in milli-tokens per second,
/// rounded down.
pub const MIN_RATE: f64 = 0.001;

/// How the pool treats tokens out on lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// Refill stops at `B - outstanding`: the fleet admits at most `B + r*T` (plus the
    /// clock term) in any window of length `T`, at the price of rejecting early by at most
    /// the outstanding leases.
    #[default]
    Exact,
    /// Refill stops at `B` whatever is out on lease: at most `B + r*T + K*H` for `K`
    /// instances each holding at most `H = d*L` tokens (`d` leases of at most `L`).
    Loose,
}

/// Whether a bucket missing from Redis (new, expired, or lost in a restart without
/// persistence) starts full or empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Start {
    /// Starts holding its capacity.
    #[default]
    Full,
    /// Starts holding nothing.
    Empty,
}

/// A validated remote bucket policy: capacity `B` in whole tokens, rate `r` in
/// milli-tokens per second, the mode and the start state.
///
/// Every intermediate of the scripts' arithmetic is below [`LUA_EXACT_LIMIT`]: the
/// largest is `B * 10^9 + rate_milli` (a refill is computed only while it stays below
/// time-to-full, and a retry time rounds up over it), and [`RemotePolicy::new`] refuses
/// any policy where that could reach 2^53.
///
/// ```
/// use tokengate_redis::RemotePolicy;
/// let policy = RemotePolicy::new(200, 100.0).unwrap();
/// assert_eq!(policy.capacity(), 200);
/// assert_eq!(policy.rate_milli(), 100_000);
/// assert!(RemotePolicy::new(10_000_000, 1.0).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemotePolicy {
    capacity: u64,
    rate_milli: u64,
    mode: Mode,
    start: Start,
}

impl RemotePolicy {
    /// A policy of `capacity` tokens refilled at `tokens_per_second`, exact mode,
    /// starting full. The rate is rounded down to a multiple of [`MIN_RATE`].
    ///
    /// # Errors
    ///
    /// [`PolicyError`] when the capacity is zero, the rate is not finite or below
    /// [`MIN_RATE`], or `capacity * 10^9 + rate_milli` reaches 2^53.
    pub fn new(capacity: u64, tokens_per_second: f64) -> Result<Self, PolicyError> {
        if capacity == 0 {
            return Err(PolicyError::ZeroCapacity);
        }
        if !tokens_per_second.is_finite() || tokens_per_second < MIN_RATE {
            return Err(PolicyError::Rate { tokens_per_second });
        }
        let scaled = (tokens_per_second * 1000.0).floor();
        if scaled >= LUA_EXACT_LIMIT as f64 {
            return Err(PolicyError::Range {
                capacity,
                tokens_per_second,
            });
        }
        let rate_milli = scaled as u64;
        let fits = capacity
            .checked_mul(UNITS_PER_TOKEN * 1000)
            .and_then(|x| x.checked_add(rate_milli))
            .is_some_and(|x| x < LUA_EXACT_LIMIT);
        if !fits {
            return Err(PolicyError::Range {
                capacity,
                tokens_per_second,
            });
        }
        Ok(Self {
            capacity,
            rate_milli,
            mode: Mode::Exact,
            start: Start::Full,
        })
    }

    /// The same policy in `mode`.
    #[must_use]
    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The same policy starting in `start` when the bucket is missing from Redis.
    #[must_use]
    pub fn with_start(mut self, start: Start) -> Self {
        self.start = start;
        self
    }

    /// Capacity `B`, whole tokens.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Capacity in the scripts' units (micro-tokens).
    pub fn capacity_units(&self) -> u64 {
        self.capacity * UNITS_PER_TOKEN
    }

    /// Refill rate, milli-tokens per second (the requested rate rounded down).
    pub fn rate_milli(&self) -> u64 {
        self.rate_milli
    }

    /// Refill rate, tokens per second, as represented.
    pub fn tokens_per_second(&self) -> f64 {
        self.rate_milli as f64 / 1000.0
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The start state.
    pub fn start(&self) -> Start {
        self.start
    }

    /// One instance's share of this policy when `instances` split it with no Redis to
    /// arbitrate: `B/K` tokens refilled at `r/K`, both rounded down (the capacity to whole
    /// tokens, the rate to milli-tokens per second and then to what the local bucket
    /// represents), so `K` shares together never hold more than `B` nor refill faster than
    /// `r`. This is what [`FailMode::Local`](crate::FailMode::Local) decides on during an
    /// outage.
    ///
    /// `None` when a share would round down to nothing: fewer than one token (`B < K`) or
    /// a rate below one milli-token per second (`r < K * 0.001`), or when the local
    /// bucket cannot represent it (see [`tokengate::Policy::per`]). A share of nothing
    /// cannot admit anything without the fleet exceeding `B` or `r`, so the local bucket
    /// refuses every decision ([`Refused::Unavailable`](crate::Refused::Unavailable)).
    ///
    /// ```
    /// use tokengate_redis::RemotePolicy;
    /// let policy = RemotePolicy::new(100, 10.0).unwrap();
    /// let share = policy.share(3).unwrap();
    /// assert_eq!(share.capacity(), 33);
    /// assert!(share.effective_refill_per_second() <= 10.0 / 3.0);
    /// assert!(policy.share(101).is_none());
    /// ```
    pub fn share(&self, instances: u64) -> Option<tokengate::Policy> {
        let k = instances.max(1);
        let capacity = self.capacity / k;
        let rate_milli = self.rate_milli / k;
        if capacity == 0 || rate_milli == 0 {
            return None;
        }
        tokengate::Policy::per(capacity, rate_milli, std::time::Duration::from_secs(1000)).ok()
    }

    /// The largest capacity, in tokens, that a policy of `tokens_per_second` admits.
    pub fn max_capacity(tokens_per_second: f64) -> u64 {
        let rate_milli = (tokens_per_second.max(0.0) * 1000.0)
            .floor()
            .min(u64::MAX as f64) as u64;
        LUA_EXACT_LIMIT.saturating_sub(rate_milli + 1) / (UNITS_PER_TOKEN * 1000)
    }
}

/// A policy the scripts cannot run exactly.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum PolicyError {
    /// The capacity was zero.
    ZeroCapacity,
    /// The rate was not finite or below [`MIN_RATE`].
    Rate {
        /// The rate asked for, tokens per second.
        tokens_per_second: f64,
    },
    /// `capacity * 10^9 + rate_milli` would reach 2^53, outside Lua's exact integers.
    Range {
        /// The capacity asked for, tokens.
        capacity: u64,
        /// The rate asked for, tokens per second.
        tokens_per_second: f64,
    },
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::ZeroCapacity => write!(f, "capacity must be at least 1 token, got 0"),
            Self::Rate { tokens_per_second } => write!(
                f,
                "refill rate {tokens_per_second} tokens/s is not a finite rate of at least {MIN_RATE} tokens/s"
            ),
            Self::Range {
                capacity,
                tokens_per_second,
            } => write!(
                f,
                "capacity {capacity} tokens at {tokens_per_second} tokens/s leaves Lua's exact integers \
                 (capacity * 10^9 + rate in milli-tokens/s must stay below 2^53; at this rate the largest \
                 capacity is {} tokens)",
                RemotePolicy::max_capacity(tokens_per_second)
            ),
        }
    }
}

impl std::error::Error for PolicyError {}
