//! Helpers the scoped tests share.

use std::time::Duration;

use tokengate::Policy;

/// A valid policy of `capacity` tokens refilled at `rate` per second.
pub(crate) fn p(capacity: u64, rate: f64) -> Policy {
    Policy::new(capacity, rate).unwrap()
}

/// Added to each step of the manual clock: effective refill rates are rounded down, so
/// a token due at exactly `n` seconds may arrive a tick later.
pub(crate) const SLACK: Duration = Duration::from_millis(10);

/// Balances within what the slack and the rounded-down rates move them.
pub(crate) fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 0.05)
}

/// A wait within what the slack and the rounded-down rates move it.
pub(crate) fn near(d: Option<Duration>, secs: f64) -> bool {
    d.is_some_and(|d| (d.as_secs_f64() - secs).abs() < 0.05)
}
