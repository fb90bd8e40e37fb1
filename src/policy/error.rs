//! [`PolicyError`]: what is wrong with a policy, with the value and the valid range.

use std::fmt;
use std::time::Duration;

/// Why a policy is invalid. Each variant names the field, the value and the valid range.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum PolicyError {
    /// `capacity` is zero.
    ZeroCapacity,
    /// `capacity` is above what the packed word holds at this rate.
    CapacityTooLarge {
        /// The capacity asked for.
        capacity: u64,
        /// The refill rate asked for, in tokens per second.
        refill_per_second: f64,
        /// The largest capacity below the one asked for that is representable at this
        /// rate.
        max: u64,
    },
    /// `refill_per_second` is NaN or infinite.
    RateNotFinite(f64),
    /// `refill_per_second` is zero or negative.
    RateNotPositive(f64),
    /// `refill_per_second` is below what the packed word represents within 0.1%.
    RateTooSmall {
        /// The refill rate asked for, in tokens per second.
        refill_per_second: f64,
        /// The capacity asked for.
        capacity: u64,
        /// The smallest representable rate above it for this capacity, in tokens per
        /// second (none is representable below).
        min: f64,
    },
    /// `refill_per_second` is above what the packed word represents.
    RateTooLarge {
        /// The refill rate asked for, in tokens per second.
        refill_per_second: f64,
        /// The capacity asked for.
        capacity: u64,
        /// The largest representable rate below it for this capacity, in tokens per
        /// second (none is representable above).
        max: f64,
    },
    /// `refill_per_second` falls in a gap: the packed word represents rates below and
    /// above it for this capacity, but not this one within 0.1% (an exact rate such as
    /// 1e9 tokens/s can fit where slightly lower ones do not).
    RateNotRepresentable {
        /// The refill rate asked for, in tokens per second.
        refill_per_second: f64,
        /// The capacity asked for.
        capacity: u64,
        /// A representable rate just below, in tokens per second.
        below: f64,
        /// A representable rate just above, in tokens per second.
        above: f64,
    },
    /// Neither the capacity nor the rate fits the packed word with the other: no rate
    /// fits this capacity and no capacity up to it fits this rate.
    NotRepresentable {
        /// The capacity asked for.
        capacity: u64,
        /// The refill rate asked for, in tokens per second.
        refill_per_second: f64,
    },
    /// The refill period of [`Policy::per`](super::Policy::per) is zero.
    ZeroPeriod,
    /// `max_reservation` is longer than the packed word can owe at this rate.
    ReservationTooLong {
        /// The reservation horizon asked for.
        max_reservation: Duration,
        /// The longest horizon representable for this capacity and rate.
        max: Duration,
    },
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PolicyError::ZeroCapacity => f.write_str("capacity must be at least 1 token, got 0"),
            PolicyError::CapacityTooLarge {
                capacity,
                refill_per_second,
                max,
            } => write!(
                f,
                "capacity {capacity} tokens is above what the packed word holds at \
                 {refill_per_second:e} tokens/s; the largest capacity below it that fits is {max}"
            ),
            PolicyError::RateNotFinite(r) => write!(
                f,
                "refill rate must be a finite number of tokens per second, got {r}"
            ),
            PolicyError::RateNotPositive(r) => {
                write!(f, "refill rate must be above 0 tokens per second, got {r}")
            }
            PolicyError::RateTooSmall {
                refill_per_second,
                capacity,
                min,
            } => write!(
                f,
                "refill rate {refill_per_second:e} tokens/s is below the smallest this layout \
                 represents for capacity {capacity}, {min:.3e}"
            ),
            PolicyError::RateTooLarge {
                refill_per_second,
                capacity,
                max,
            } => write!(
                f,
                "refill rate {refill_per_second:e} tokens/s is above the largest this layout \
                 represents for capacity {capacity}, {max:.3e}"
            ),
            PolicyError::RateNotRepresentable {
                refill_per_second,
                capacity,
                below,
                above,
            } => write!(
                f,
                "refill rate {refill_per_second:e} tokens/s cannot be represented within 0.1% \
                 for capacity {capacity}; the nearest representable rates are {below:.4e} \
                 and {above:.4e}"
            ),
            PolicyError::NotRepresentable {
                capacity,
                refill_per_second,
            } => write!(
                f,
                "capacity {capacity} tokens at {refill_per_second:e} tokens/s cannot be \
                 represented: no rate fits this capacity and no smaller capacity fits this \
                 rate (capacities up to about 2^54 tokens and rates from about 1e-15 to 1e27 \
                 tokens/s fit, not in every combination)"
            ),
            PolicyError::ZeroPeriod => f.write_str("refill period must be longer than zero"),
            PolicyError::ReservationTooLong {
                max_reservation,
                max,
            } => write!(
                f,
                "max reservation {max_reservation:?} is longer than the packed word can owe \
                 at this rate: at most {max:?}"
            ),
        }
    }
}

impl std::error::Error for PolicyError {}
