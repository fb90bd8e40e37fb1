//! One decision as the telemetry record of the seed.

use std::fmt;

use crate::attempt::Attempt;
use crate::decision::Decision;
use crate::policy::Policy;

/// Whether a recorded request was admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The cost was taken.
    Admitted,
    /// The bucket refused the cost (nothing was taken).
    Rejected,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::Admitted => "admitted",
            Outcome::Rejected => "rejected",
        })
    }
}

/// One limiter decision as a telemetry record: the structured form, and (through
/// `Display`) the flat line
///
/// ```text
/// limiter=tenant:42 result=rejected bucket_capacity=100 refill_per_second=20 token_cost=3 tokens_remaining=1.4 attempt=original
/// ```
///
/// `limiter` is any label: a [`Scope`](crate::scope::Scope) from a
/// [`ScopeDecision`](crate::scope::ScopeDecision), or a name of your own for a plain
/// [`Bucket`](crate::Bucket). `refill_per_second` is the configured rate;
/// `tokens_remaining` is printed rounded to three decimals (the fixed-point balance is
/// exact to `2^-F` tokens, which would print as a long tail of digits). `attempt` is
/// `original` or `retry:N`, so retry waves can be told from organic traffic.
///
/// ```
/// use tokengate::{telemetry::Attempt, Bucket, ManualClock, Policy, telemetry::Record, telemetry::Outcome};
///
/// let policy = Policy::new(100, 20.0)?;
/// let bucket = Bucket::with_clock(policy, ManualClock::new());
/// bucket.try_acquire(98)?;
/// let d = bucket.try_acquire(3)?;
/// let record = Record::new("tenant_api", &policy, &d, Attempt::Original);
/// assert_eq!(record.result, Outcome::Rejected);
/// assert_eq!(
///     record.to_string(),
///     "limiter=tenant_api result=rejected bucket_capacity=100 refill_per_second=20 \
///      token_cost=3 tokens_remaining=2 attempt=original"
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Record<L> {
    /// Which limiter decided: a scope key or a name.
    pub limiter: L,
    /// Admitted or rejected.
    pub result: Outcome,
    /// The bucket's capacity `B`, in tokens.
    pub bucket_capacity: u64,
    /// The configured refill rate, in tokens per second.
    pub refill_per_second: f64,
    /// The cost asked for, in tokens.
    pub token_cost: u64,
    /// Tokens left after the decision (fractional).
    pub tokens_remaining: f64,
    /// Original attempt or retry.
    pub attempt: Attempt,
}

impl<L> Record<L> {
    /// The record of `decision`, made by a bucket of `policy` labelled `limiter`.
    pub fn new(limiter: L, policy: &Policy, decision: &Decision, attempt: Attempt) -> Record<L> {
        Record {
            limiter,
            result: if decision.is_admitted() {
                Outcome::Admitted
            } else {
                Outcome::Rejected
            },
            bucket_capacity: policy.capacity(),
            refill_per_second: policy.refill_per_second(),
            token_cost: decision.cost(),
            tokens_remaining: decision.tokens_remaining(),
            attempt,
        }
    }
}

impl<L: fmt::Display> fmt::Display for Record<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let remaining = (self.tokens_remaining * 1000.0).round() / 1000.0;
        write!(
            f,
            "limiter={} result={} bucket_capacity={} refill_per_second={} token_cost={} \
             tokens_remaining={} attempt=",
            self.limiter,
            self.result,
            self.bucket_capacity,
            self.refill_per_second,
            self.token_cost,
            remaining + 0.0, // turns -0 into 0
        )?;
        match self.attempt {
            Attempt::Original => f.write_str("original"),
            Attempt::Retry(n) => write!(f, "retry:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_matches_the_seed_field_order_and_rounds_the_balance() {
        let r = Record {
            limiter: "tenant_api",
            result: Outcome::Rejected,
            bucket_capacity: 100,
            refill_per_second: 20.0,
            token_cost: 3,
            tokens_remaining: 1.399_999_6,
            attempt: Attempt::Retry(2),
        };
        assert_eq!(
            r.to_string(),
            "limiter=tenant_api result=rejected bucket_capacity=100 refill_per_second=20 \
             token_cost=3 tokens_remaining=1.4 attempt=retry:2"
        );
    }
}
