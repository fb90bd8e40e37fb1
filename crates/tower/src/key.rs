//! Where a scope's key comes from: the client's address, a header, a path segment, or a
//! closure.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::{Extensions, HeaderMap, HeaderName, Method, Uri};

use crate::ip::{IpNet, client_ip, mask};

/// Why a request has no key for a scope. The layer answers with the configured
/// [missing-key response](crate::RateLimitLayerBuilder::missing_key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyError {
    /// The request does not carry the key (no header, no such path segment, no peer
    /// address in the extensions, or the closure returned `None`).
    Absent,
    /// The source was there but could not be read (a forwarding chain entry that is not
    /// an address); names the source.
    Malformed(&'static str),
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::Absent => f.write_str("the request carries no key"),
            KeyError::Malformed(src) => write!(f, "the {src} field is malformed"),
        }
    }
}

impl std::error::Error for KeyError {}

/// What a custom key closure sees of a request.
#[derive(Clone, Copy, Debug)]
pub struct Head<'a> {
    /// The method.
    pub method: &'a Method,
    /// The URI.
    pub uri: &'a Uri,
    /// The headers.
    pub headers: &'a HeaderMap,
    /// The extensions (the peer address lives here).
    pub extensions: &'a Extensions,
}

type Custom = Arc<dyn Fn(&Head<'_>) -> Option<u64> + Send + Sync>;

#[derive(Clone)]
enum Source {
    ClientIp { v4_prefix: u8, v6_prefix: u8 },
    Header(HeaderName),
    PathSegment(usize),
    Custom(Custom),
}

/// Where one scope kind's key comes from, and whether a request must have it.
///
/// Keys become the scope's 64-bit id: a header or path value that is a decimal `u64`
/// is used as is (so `x-tenant: 42` is `tenant:42` in records and counters); any other
/// value, and every address, is hashed with a per-layer random SipHash key.
///
/// ```
/// use tokengate_tower::Key;
/// let per_client = Key::client_ip().ipv6_prefix(64); // an IPv6 /64 is one client
/// let tenant = Key::header("x-tenant").required();
/// let from_path = Key::path_segment(1); // "/t/{tenant}/..."
/// let custom = Key::custom(|head| head.headers.get("x-user").map(|v| v.len() as u64));
/// # let _ = (per_client, tenant, from_path, custom);
/// ```
#[derive(Clone)]
pub struct Key {
    source: Source,
    required: bool,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Key");
        match &self.source {
            Source::ClientIp {
                v4_prefix,
                v6_prefix,
            } => d
                .field("client_ip_v4_prefix", v4_prefix)
                .field("client_ip_v6_prefix", v6_prefix),
            Source::Header(h) => d.field("header", h),
            Source::PathSegment(i) => d.field("path_segment", i),
            Source::Custom(_) => d.field("custom", &"<closure>"),
        };
        d.field("required", &self.required).finish()
    }
}

impl Key {
    /// The client's IP address: the peer address (axum's `ConnectInfo<SocketAddr>`, or a
    /// `SocketAddr` or `IpAddr` in the request extensions), or, when the peer is one of
    /// the layer's [trusted proxies](crate::RateLimitLayerBuilder::trusted_proxies), the
    /// client named by `Forwarded` / `X-Forwarded-For`. Full addresses by default.
    pub fn client_ip() -> Key {
        Key {
            source: Source::ClientIp {
                v4_prefix: 32,
                v6_prefix: 128,
            },
            required: false,
        }
    }

    /// The value of header `name`.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name (a programming error, like
    /// `HeaderName::from_static`).
    pub fn header(name: &'static str) -> Key {
        Key {
            source: Source::Header(HeaderName::from_static(name)),
            required: false,
        }
    }

    /// The path segment at `index` (0 is the first after the leading `/`).
    pub fn path_segment(index: usize) -> Key {
        Key {
            source: Source::PathSegment(index),
            required: false,
        }
    }

    /// A closure's id for the request, `None` when it has none.
    pub fn custom(f: impl Fn(&Head<'_>) -> Option<u64> + Send + Sync + 'static) -> Key {
        Key {
            source: Source::Custom(Arc::new(f)),
            required: false,
        }
    }

    /// Groups IPv4 clients by their first `bits` bits (at most 32; larger is 32).
    pub fn ipv4_prefix(mut self, bits: u8) -> Key {
        if let Source::ClientIp { v4_prefix, .. } = &mut self.source {
            *v4_prefix = bits.min(32);
        }
        self
    }

    /// Groups IPv6 clients by their first `bits` bits (at most 128): 64 makes a /64, the
    /// usual allocation to one subscriber, one client.
    pub fn ipv6_prefix(mut self, bits: u8) -> Key {
        if let Source::ClientIp { v6_prefix, .. } = &mut self.source {
            *v6_prefix = bits.min(128);
        }
        self
    }

    /// A request without this key is answered with the missing-key response instead of
    /// skipping the scope.
    pub fn required(mut self) -> Key {
        self.required = true;
        self
    }

    pub(crate) fn is_required(&self) -> bool {
        self.required
    }

    /// Whether the key is the client's address, which needs the peer address the
    /// server puts in the request extensions.
    pub(crate) fn is_client_ip(&self) -> bool {
        matches!(self.source, Source::ClientIp { .. })
    }

    /// The key's id for a request, `Ok(None)` when absent.
    pub(crate) fn extract(
        &self,
        head: &Head<'_>,
        trusted: &[IpNet],
        hasher: &RandomState,
    ) -> Result<Option<u64>, KeyError> {
        match &self.source {
            Source::ClientIp {
                v4_prefix,
                v6_prefix,
            } => {
                let Some(peer) = peer_ip(head.extensions) else {
                    return Ok(None);
                };
                let ip = client_ip(peer, head.headers, trusted)?;
                Ok(Some(match ip {
                    IpAddr::V4(_) => hasher.hash_one((4u8, mask(ip, *v4_prefix))),
                    IpAddr::V6(_) => hasher.hash_one((6u8, mask(ip, *v6_prefix))),
                }))
            }
            Source::Header(name) => Ok(head.headers.get(name).map(|v| id_of(v.as_bytes(), hasher))),
            Source::PathSegment(i) => Ok(head
                .uri
                .path()
                .split('/')
                .skip(1)
                .nth(*i)
                .filter(|s| !s.is_empty())
                .map(|s| id_of(s.as_bytes(), hasher))),
            Source::Custom(f) => Ok(f(head)),
        }
    }
}

/// A decimal `u64` as itself; anything else hashed.
fn id_of(bytes: &[u8], hasher: &RandomState) -> u64 {
    if !bytes.is_empty() && bytes.len() <= 20 && bytes.iter().all(u8::is_ascii_digit) {
        if let Some(n) = std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
        {
            return n;
        }
    }
    hasher.hash_one(bytes)
}

/// The peer address the server put in the request extensions.
pub(crate) fn peer_ip(ext: &Extensions) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(ci) = ext.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(ci.0.ip());
    }
    if let Some(sa) = ext.get::<SocketAddr>() {
        return Some(sa.ip());
    }
    ext.get::<IpAddr>().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_values_are_their_own_ids_others_are_hashed() {
        let h = RandomState::new();
        assert_eq!(id_of(b"42", &h), 42);
        assert_eq!(id_of(b"18446744073709551615", &h), u64::MAX);
        assert_eq!(id_of(b"acme", &h), id_of(b"acme", &h));
        assert_ne!(id_of(b"acme", &h), id_of(b"acm", &h));
        // Too large for a u64: hashed, not wrapped.
        assert_eq!(
            id_of(b"18446744073709551616", &h),
            h.hash_one(b"18446744073709551616".as_slice())
        );
    }
}
