//! Decision records as `tracing` events (feature `tracing`).

use crate::attempt::Attempt;
use crate::scope::ScopeDecision;
use crate::telemetry::Outcome;

/// The target of the events ([`ScopeDecision::trace`]).
pub const TARGET: &str = "tokengate";

impl ScopeDecision<'_> {
    /// Emits the decision's [`records`](ScopeDecision::records) as `tracing` events with
    /// the seed's field names: `limiter`, `result`, `bucket_capacity`, `refill_per_second`,
    /// `token_cost`, `tokens_remaining`, `attempt`. Rejections at `INFO`, admissions at
    /// `DEBUG`, target [`TARGET`]. A disabled level costs a cached check per call.
    pub fn trace(&self) {
        let level_on = if self.is_rejected() {
            tracing::enabled!(target: TARGET, tracing::Level::INFO)
        } else {
            tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
        };
        if !level_on {
            return;
        }
        for r in self.records() {
            let attempt = AttemptField(r.attempt);
            macro_rules! event {
                ($level:expr) => {
                    tracing::event!(
                        target: TARGET,
                        $level,
                        limiter = %r.limiter,
                        result = %r.result,
                        bucket_capacity = r.bucket_capacity,
                        refill_per_second = r.refill_per_second,
                        token_cost = r.token_cost,
                        tokens_remaining = r.tokens_remaining,
                        attempt = %attempt,
                    )
                };
            }
            match r.result {
                Outcome::Rejected => event!(tracing::Level::INFO),
                Outcome::Admitted => event!(tracing::Level::DEBUG),
            }
        }
    }
}

/// `original` or `retry:n`, as in the record's text form.
struct AttemptField(Attempt);

impl std::fmt::Display for AttemptField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Attempt::Original => f.write_str("original"),
            Attempt::Retry(n) => write!(f, "retry:{n}"),
        }
    }
}
