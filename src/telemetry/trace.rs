//! Decision records as `tracing` events (feature `tracing`).

use crate::attempt::Attempt;
use crate::scope::ScopeDecision;

/// The target of the events ([`ScopeDecision::trace`]).
pub const TARGET: &str = "tokengate";

impl ScopeDecision<'_> {
    /// Emits the decision's [`records`](ScopeDecision::records) as `tracing` events with
    /// the seed's field names: `limiter`, `result`, `bucket_capacity`, `refill_per_second`,
    /// `token_cost`, `tokens_remaining`, `attempt`. Admissions and rejections alike at
    /// `DEBUG`, target [`TARGET`]: a refusal is the limiter working, and a flood of them
    /// at `INFO` would be a flood of log lines (count them with the counters instead). A
    /// disabled level costs a cached check per call.
    pub fn trace(&self) {
        if !tracing::enabled!(target: TARGET, tracing::Level::DEBUG) {
            return;
        }
        for r in self.records() {
            let attempt = AttemptField(r.attempt);
            tracing::debug!(
                target: TARGET,
                limiter = %r.limiter,
                result = %r.result,
                bucket_capacity = r.bucket_capacity,
                refill_per_second = r.refill_per_second,
                token_cost = r.token_cost,
                tokens_remaining = r.tokens_remaining,
                attempt = %attempt,
            );
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
