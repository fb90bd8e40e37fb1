//! What the layer writes: `Retry-After`, the IETF `RateLimit-Policy` / `RateLimit`
//! fields, the legacy `x-ratelimit-*` fields, and the refusal and missing-key bodies.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use tokengate::http::{MAX_INTEGER, Quota};
use tokengate::Decision;
use tokengate::scope::{RouteId, Scope, ScopeKind};

use crate::key::KeyError;

/// `x-ratelimit-limit`: the quota of the reported scope.
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `x-ratelimit-remaining`: whole tokens left in it.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `x-ratelimit-reset`: seconds until it is full again (or, refused, until the retry).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// A wait as `Retry-After` seconds: rounded up, at least 1, at most the largest
/// structured-field integer (so `Duration::MAX` saturates instead of overflowing).
///
/// ```
/// use std::time::Duration;
/// use tokengate_tower::retry_after_seconds;
/// assert_eq!(retry_after_seconds(Duration::ZERO), 1);
/// assert_eq!(retry_after_seconds(Duration::from_millis(2001)), 3);
/// assert_eq!(retry_after_seconds(Duration::MAX), 999_999_999_999_999);
/// ```
pub fn retry_after_seconds(wait: Duration) -> u64 {
    let up = wait
        .as_secs()
        .saturating_add(u64::from(wait.subsec_nanos() > 0));
    up.clamp(1, MAX_INTEGER)
}

/// A refused request, as the [refusal body hook](crate::RateLimitLayerBuilder::refusal_body)
/// sees it.
#[derive(Clone, Copy, Debug)]
pub struct Refused {
    /// The scope that refused.
    pub scope: Scope,
    /// `Retry-After` in seconds; `None` when the scope's map was full of keys (no
    /// estimate, no `Retry-After`).
    pub retry_after: Option<u64>,
    /// The cost the request asked of the refusing scope, in tokens.
    pub cost: u64,
    /// The matched route, if any.
    pub route: Option<RouteId>,
}

/// A request without a key its layer requires, as the
/// [missing-key hook](crate::RateLimitLayerBuilder::missing_key) sees it.
#[derive(Clone, Copy, Debug)]
pub struct MissingKey {
    /// The scope kind whose key is missing.
    pub kind: ScopeKind,
    /// Absent or malformed.
    pub error: KeyError,
}

/// A response body and its content type.
pub type Body = (HeaderValue, Bytes);

pub(crate) const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// The default refusal body: RFC 9457 problem details.
pub fn problem_refused(r: &Refused) -> Body {
    let mut s = String::with_capacity(192);
    let _ = write!(
        s,
        r#"{{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"rate limited by scope {}","scope":"{}""#,
        r.scope, r.scope
    );
    if let Some(ra) = r.retry_after {
        let _ = write!(s, r#","retry_after":{ra}"#);
    }
    s.push('}');
    (PROBLEM_JSON, Bytes::from(s))
}

/// The default missing-key answer: 400 with RFC 9457 problem details.
pub fn problem_missing(m: &MissingKey) -> (StatusCode, Body) {
    let body = format!(
        r#"{{"type":"about:blank","title":"Bad Request","status":400,"detail":"no {} key: {}"}}"#,
        m.kind, m.error
    );
    (StatusCode::BAD_REQUEST, (PROBLEM_JSON, Bytes::from(body)))
}

/// The quotas of each scope kind, built once per layer.
pub(crate) struct Quotas {
    pub(crate) by_kind: [Option<Quota>; 6],
}

/// One scope's figures for the rate-limit fields.
pub(crate) struct Item<'a> {
    pub(crate) name: &'static str,
    pub(crate) quota: &'a Quota,
    pub(crate) remaining: u64,
    pub(crate) reset: u64,
}

impl<'a> Item<'a> {
    /// From a scope's decision; `reset` overrides the decision's `t` (a refusal reports
    /// the request's `Retry-After`, the wait for every scope).
    pub(crate) fn new(
        kind: ScopeKind,
        quota: &'a Quota,
        d: &Decision,
        reset: Option<u64>,
    ) -> Item<'a> {
        let limit = quota.service_limit(d);
        Item {
            name: kind.name(),
            quota,
            remaining: limit.remaining(),
            reset: reset.unwrap_or(limit.reset_seconds()),
        }
    }
}

/// Writes `RateLimit-Policy` and `RateLimit` for `items`, and the legacy fields for the
/// item with the fewest tokens left.
pub(crate) fn write_fields(
    headers: &mut HeaderMap,
    items: &[Item<'_>],
    ietf: bool,
    legacy: bool,
) {
    if items.is_empty() {
        return;
    }
    if ietf {
        let mut policy = String::new();
        let mut limit = String::new();
        for (i, it) in items.iter().enumerate() {
            if i > 0 {
                policy.push_str(", ");
                limit.push_str(", ");
            }
            let _ = write!(policy, "{}", it.quota.policy_item());
            // The quota is named after the scope kind (plain ASCII, no escaping).
            let _ = write!(limit, "\"{}\";r={};t={}", it.name, it.remaining, it.reset);
        }
        if let Ok(v) = HeaderValue::try_from(policy) {
            headers.insert(RATELIMIT_POLICY, v);
        }
        if let Ok(v) = HeaderValue::try_from(limit) {
            headers.insert(RATELIMIT, v);
        }
    }
    if legacy {
        let tightest = items
            .iter()
            .min_by_key(|it| it.remaining)
            .expect("items is not empty");
        headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(tightest.quota.quota()));
        headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(tightest.remaining));
        headers.insert(X_RATELIMIT_RESET, HeaderValue::from(tightest.reset));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_and_saturates() {
        assert_eq!(retry_after_seconds(Duration::from_nanos(1)), 1);
        assert_eq!(retry_after_seconds(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_seconds(Duration::new(2, 1)), 3);
        assert_eq!(retry_after_seconds(Duration::new(u64::MAX, 1)), MAX_INTEGER);
    }

    #[test]
    fn the_default_refusal_body_is_problem_json_naming_the_scope() {
        let (ct, body) = problem_refused(&Refused {
            scope: Scope::Tenant(tokengate::scope::TenantId(4)),
            retry_after: Some(2),
            cost: 3,
            route: None,
        });
        assert_eq!(ct, "application/problem+json");
        assert_eq!(
            body,
            r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"rate limited by scope tenant:4","scope":"tenant:4","retry_after":2}"#
        );
    }
}
