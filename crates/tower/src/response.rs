//! What the layer writes: `Retry-After`, the IETF `RateLimit-Policy` / `RateLimit`
//! fields, the legacy `x-ratelimit-*` fields, and the refusal and missing-key bodies.

use std::fmt::Write as _;
use std::sync::OnceLock;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use tokengate::Decision;
use tokengate::http::{self as http_rules, Quota};
use tokengate::scope::{PerKind, RouteId, Scope, ScopeKind};

use crate::key::KeyError;

/// `x-ratelimit-limit`: the quota of the reported scope
/// ([`tokengate::http::X_RATELIMIT_LIMIT`]).
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static(http_rules::X_RATELIMIT_LIMIT);
/// `x-ratelimit-remaining`: whole tokens left in it
/// ([`tokengate::http::X_RATELIMIT_REMAINING`]).
pub const X_RATELIMIT_REMAINING: HeaderName =
    HeaderName::from_static(http_rules::X_RATELIMIT_REMAINING);
/// `x-ratelimit-reset`: seconds until it is full again (or, refused, until the retry)
/// ([`tokengate::http::X_RATELIMIT_RESET`]).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static(http_rules::X_RATELIMIT_RESET);
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static(http_rules::RATELIMIT_POLICY);
const RATELIMIT: HeaderName = HeaderName::from_static(http_rules::RATELIMIT);

// The one rule for `Retry-After` seconds is the engine's (capped at
// `tokengate::http::MAX_INTEGER`, so it equals a refusal's `t`).
pub use tokengate::http::retry_after_seconds;

/// A refused request, as the [refusal body hook](crate::RateLimitLayerBuilder::refusal_body)
/// sees it.
#[derive(Clone, Copy, Debug)]
pub struct Refused {
    /// The scope that refused.
    pub scope: Scope,
    /// `Retry-After` in seconds. The layer's 429s always have one (a scope whose key
    /// map is full answers `503` with the kind's window as `Retry-After`, not through
    /// this hook).
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

/// The quotas of each scope kind, built once per layer, and the `RateLimit-Policy`
/// values of each set of kinds, built on first use: a policy field costs no formatting
/// and no allocation per response.
pub(crate) struct Quotas {
    pub(crate) by_kind: PerKind<Option<Quota>>,
    /// Per kind, the tokens left below which an admission is near its limit (below a
    /// tenth of the quota: `remaining * 10 < quota` is `remaining < ceil(quota / 10)`);
    /// 0 for a kind without a quota.
    pub(crate) near: PerKind<u64>,
    /// Indexed by a [`KindMask`].
    policy_fields: [OnceLock<Option<HeaderValue>>; KINDS_SETS],
}

/// A set of scope kinds, one bit per kind at its [`index`](ScopeKind::index).
type KindMask = u8;

// Every kind has its bit in a mask.
const _: () = assert!(ScopeKind::COUNT <= KindMask::BITS as usize);

/// How many sets of kinds there are.
const KINDS_SETS: usize = 1 << ScopeKind::COUNT;

/// The bit of `kind` in a [`KindMask`].
#[inline]
const fn kind_bit(kind: ScopeKind) -> KindMask {
    1 << kind.index()
}

impl Quotas {
    pub(crate) fn new(by_kind: PerKind<Option<Quota>>) -> Quotas {
        let near = std::array::from_fn(|k| {
            by_kind[k]
                .as_ref()
                .map_or(0, |q: &Quota| q.quota().div_ceil(10))
        });
        Quotas {
            by_kind,
            near,
            policy_fields: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// The `RateLimit-Policy` value listing the kinds in `mask` (bit = kind index).
    fn policy_field(&self, mask: KindMask) -> Option<HeaderValue> {
        self.policy_fields[usize::from(mask) & (KINDS_SETS - 1)]
            .get_or_init(|| {
                let mut v = String::new();
                for kind in ScopeKind::ALL {
                    let Some(q) = &self.by_kind[kind] else {
                        continue;
                    };
                    if mask & kind_bit(kind) != 0 {
                        if !v.is_empty() {
                            v.push_str(", ");
                        }
                        let _ = write!(v, "{}", q.policy_item());
                    }
                }
                HeaderValue::try_from(v).ok()
            })
            .clone()
    }
}

/// One scope's figures for the rate-limit fields.
#[derive(Clone, Copy)]
pub(crate) struct Item {
    pub(crate) kind: ScopeKind,
    pub(crate) quota: u64,
    pub(crate) remaining: u64,
    pub(crate) reset: u64,
}

impl Item {
    /// From a scope's decision; `reset` overrides the decision's `t` (a refusal reports
    /// the request's `Retry-After`, the wait for every scope).
    pub(crate) fn new(kind: ScopeKind, quota: &Quota, d: &Decision, reset: Option<u64>) -> Item {
        let limit = quota.service_limit(d);
        Item {
            kind,
            quota: quota.quota(),
            remaining: limit.remaining(),
            reset: reset.unwrap_or(limit.reset_seconds()),
        }
    }
}

/// The rate-limit fields of one response, built before the inner service answers.
#[derive(Default)]
pub(crate) struct Fields {
    policy: Option<HeaderValue>,
    limit: Option<HeaderValue>,
    legacy: Option<[HeaderValue; 3]>,
}

impl Fields {
    /// `RateLimit-Policy` and `RateLimit` for `items` (at most one per kind), and the
    /// legacy fields for the item with the fewest tokens left.
    pub(crate) fn new(quotas: &Quotas, items: &[Item], ietf: bool, legacy: bool) -> Fields {
        let mut fields = Fields::default();
        let Some(tightest) = items.iter().min_by_key(|it| it.remaining) else {
            return fields;
        };
        if ietf {
            let mask = items.iter().fold(0, |m, it| m | kind_bit(it.kind));
            fields.policy = quotas.policy_field(mask);
            // At most one item per kind: fits (see `LIMIT_FIELD_BYTES`).
            let mut buf = StackBuf::<LIMIT_FIELD_BYTES>::new();
            for (i, it) in items.iter().enumerate() {
                if i > 0 {
                    buf.push(b", ");
                }
                buf.push(b"\"");
                buf.push(it.kind.name().as_bytes());
                buf.push(b"\";r=");
                buf.push_u64(it.remaining);
                buf.push(b";t=");
                buf.push_u64(it.reset);
            }
            fields.limit = HeaderValue::from_bytes(buf.as_bytes()).ok();
        }
        if legacy {
            fields.legacy = Some([
                HeaderValue::from(tightest.quota),
                HeaderValue::from(tightest.remaining),
                HeaderValue::from(tightest.reset),
            ]);
        }
        fields
    }

    /// Puts the fields in `headers`.
    pub(crate) fn write(self, headers: &mut HeaderMap) {
        if let Some(v) = self.policy {
            headers.insert(RATELIMIT_POLICY, v);
        }
        if let Some(v) = self.limit {
            headers.insert(RATELIMIT, v);
        }
        if let Some([limit, remaining, reset]) = self.legacy {
            headers.insert(X_RATELIMIT_LIMIT, limit);
            headers.insert(X_RATELIMIT_REMAINING, remaining);
            headers.insert(X_RATELIMIT_RESET, reset);
        }
    }
}

/// The longest `RateLimit` value: one item per kind, each at most
/// `, "<name>";r=<20 digits>;t=<20 digits>`.
const LIMIT_FIELD_BYTES: usize = {
    let mut bytes = 0;
    let mut i = 0;
    while i < ScopeKind::COUNT {
        bytes += ScopeKind::ALL[i].name().len() + r#", "";r=;t="#.len() + 2 * 20;
        i += 1;
    }
    bytes
};

/// A fixed buffer for writing a field value without allocating; text past its end is
/// dropped (the caller's values are bounded: at most one item per kind, in
/// [`LIMIT_FIELD_BYTES`]).
struct StackBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> StackBuf<N> {
    fn new() -> Self {
        StackBuf {
            buf: [0; N],
            len: 0,
        }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Appends `bytes`; past the end, nothing (the caller's values are bounded).
    #[inline]
    fn push(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if end <= N {
            self.buf[self.len..end].copy_from_slice(bytes);
            self.len = end;
        }
    }

    /// Appends `n` in decimal, without the formatting machinery.
    #[inline]
    fn push_u64(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_written_in_decimal() {
        let mut b = StackBuf::<64>::new();
        for n in [0, 7, 10, 999_999_999_999_999, u64::MAX] {
            b.push_u64(n);
            b.push(b",");
        }
        assert_eq!(
            b.as_bytes(),
            b"0,7,10,999999999999999,18446744073709551615,"
        );
    }

    #[test]
    fn the_field_names_are_the_engines() {
        assert_eq!(http::header::RETRY_AFTER.as_str(), http_rules::RETRY_AFTER);
        assert_eq!(RATELIMIT_POLICY.as_str(), http_rules::RATELIMIT_POLICY);
        assert_eq!(RATELIMIT.as_str(), http_rules::RATELIMIT);
        assert_eq!(X_RATELIMIT_RESET.as_str(), "x-ratelimit-reset");
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
