//! Where a scope's key comes from: the client's address, a header, a path segment, or a
//! closure.

use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};

use siphasher::sip::SipHasher13;

use http::{Extensions, HeaderMap, HeaderName, Method, Uri};

use tokengate::scope::{ApiKeyId, ClientId, Request, ScopeKind, TenantId, UserId};

use crate::ip::{Proxies, canonical, client_ip, mask};

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

/// The keyed hash that turns every key taken from a request into its scope id:
/// SipHash-1-3 under a 128-bit secret.
///
/// No id is ever taken from a request as it is: a header value `42` is hashed like
/// `acme`, and so is a [custom](Key::custom) closure's number. An id that shows in a 429
/// body, a log line or a trace (`api_key:6853586831852496954`) is therefore useless as
/// input: sent back as a header value it is hashed again, into another id, and spends
/// another bucket.
///
/// The secret is random per process by default (one for every layer of the process, so
/// layers sharing a limiter agree). Processes that share remote scopes (one fleet-wide
/// budget per tenant) must map a client to the same id everywhere: give them one secret
/// with [`key_secret`](crate::RateLimitLayerBuilder::key_secret), kept like any other.
#[derive(Clone)]
pub(crate) struct KeyHasher {
    k0: u64,
    k1: u64,
    /// SipHash's state after its initialization under `(k0, k1)`, for the addresses'
    /// hash ([`sip13`]), which starts from it.
    init: [u64; 4],
}

impl fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyHasher(<secret>)")
    }
}

impl KeyHasher {
    /// The process's hasher: its secret drawn once, from the OS's randomness (through
    /// std's `RandomState`, whose keys come from it).
    pub(crate) fn process() -> KeyHasher {
        static PROCESS: OnceLock<KeyHasher> = OnceLock::new();
        PROCESS
            .get_or_init(|| {
                let (a, b) = (RandomState::new(), RandomState::new());
                KeyHasher::new(
                    a.hash_one(0x746f_6b65_6e67_6174_u64),
                    b.hash_one(0x6b65_795f_7365_6372_u64),
                )
            })
            .clone()
    }

    /// A hasher with a given secret (the same in every process given it).
    pub(crate) fn with_secret(secret: [u8; 16]) -> KeyHasher {
        let (a, b) = secret.split_at(8);
        KeyHasher::new(
            u64::from_le_bytes(a.try_into().expect("8 bytes")),
            u64::from_le_bytes(b.try_into().expect("8 bytes")),
        )
    }

    fn new(k0: u64, k1: u64) -> KeyHasher {
        KeyHasher {
            k0,
            k1,
            init: [
                k0 ^ 0x736f_6d65_7073_6575,
                k1 ^ 0x646f_7261_6e64_6f6d,
                k0 ^ 0x6c79_6765_6e65_7261,
                k1 ^ 0x7465_6462_7974_6573,
            ],
        }
    }

    /// The id of `value` (domain-tagged, so that a value of one source cannot be made to
    /// collide with one of another by construction).
    pub(crate) fn id(&self, domain: u8, value: impl Hash) -> u64 {
        let mut h = SipHasher13::new_with_keys(self.k0, self.k1);
        h.write_u8(domain);
        value.hash(&mut h);
        h.finish()
    }

    /// The id of a header value or a path segment (one domain: `x-tenant: acme` and
    /// `/t/acme` name the same tenant).
    pub(crate) fn text(&self, bytes: &[u8]) -> u64 {
        self.id(TEXT, bytes)
    }

    /// The id of a client address (already masked to its prefix): SipHash-1-3 of one
    /// fixed-size message, the domain byte then the address's bytes in network order
    /// (5 bytes for IPv4, 17 for IPv6), under the same secret as every other key's, on a
    /// message of its own domain. Written out for these two lengths ([`sip13`]): one
    /// compression round and the finalization for IPv4, three and the finalization for
    /// IPv6, from the state initialized once per hasher, with no streaming state and no
    /// tail read byte by byte (the same function as `SipHasher13` of the message:
    /// tested).
    #[inline(always)]
    pub(crate) fn addr(&self, ip: IpAddr) -> u64 {
        match ip {
            IpAddr::V4(v4) => {
                // Bytes 0-4 of the message, then its length in the top byte.
                let m = u64::from(ADDR_V4) | u64::from(v4.to_bits().swap_bytes()) << 8;
                sip13(self.init, [m | 5 << 56])
            }
            IpAddr::V6(v6) => {
                let o = v6.octets();
                let mut m = [0u8; 24];
                m[0] = ADDR_V6;
                m[1..17].copy_from_slice(&o);
                m[23] = 17;
                let word =
                    |i: usize| u64::from_le_bytes(m[8 * i..8 * i + 8].try_into().expect("8 bytes"));
                sip13(self.init, [word(0), word(1), word(2)])
            }
        }
    }

    /// The id of a peer address for [`KeyPlan::Peer`]: [`addr`](Self::addr) of the
    /// address made canonical ([`canonical`]) and masked to its prefix ([`mask`]), the
    /// IPv4 mask applied to the message's bytes as they are (tested against the three
    /// steps).
    #[inline(always)]
    pub(crate) fn peer(&self, ip: IpAddr, masks: &PeerMasks) -> u64 {
        let v4 = match ip {
            IpAddr::V4(v4) => v4,
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => v4,
                None => return self.addr(IpAddr::V6((v6.to_bits() & masks.v6).into())),
            },
        };
        let bytes = u32::from_le_bytes(v4.octets()) & masks.v4;
        sip13(
            self.init,
            [u64::from(ADDR_V4) | u64::from(bytes) << 8 | 5 << 56],
        )
    }
}

/// SipHash-1-3 from the initialized state `v` of a message given as its little-endian
/// words, the last one holding the tail bytes and the message's length in its top byte.
#[inline(always)]
fn sip13<const N: usize>(mut v: [u64; 4], words: [u64; N]) -> u64 {
    #[inline(always)]
    fn round(v: &mut [u64; 4]) {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }
    for b in words {
        v[3] ^= b;
        round(&mut v);
        v[0] ^= b;
    }
    v[2] ^= 0xff;
    round(&mut v);
    round(&mut v);
    round(&mut v);
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

const TEXT: u8 = 0;
const ADDR_V4: u8 = 4;
const ADDR_V6: u8 = 6;
const CUSTOM: u8 = 0xc;

/// Where one scope kind's key comes from, and whether a request must have it.
///
/// Every key becomes the scope's 64-bit id through one keyed hash (SipHash-1-3 under a
/// per-process secret, or the one given to
/// [`key_secret`](crate::RateLimitLayerBuilder::key_secret)): header values and path
/// segments (a decimal value too: `x-tenant: 42` is not `tenant:42`), addresses, and a
/// custom closure's number. No id is taken from a request as it is, so an id seen in a
/// response or a log cannot be sent back to reach its bucket.
/// [`RateLimitLayer::key_id`](crate::RateLimitLayer::key_id) gives the id of a value.
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

    /// The value of header `name`, a name built at run time
    /// (`HeaderName::from_bytes`).
    pub fn header_name(name: HeaderName) -> Key {
        Key {
            source: Source::Header(name),
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

    /// A closure's number for the request, `None` when it has none. The number is hashed
    /// like any other key (so a number read from the request cannot name another
    /// client's id).
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

    /// A request without this key is answered with the missing-key response (400 by
    /// default) instead of skipping the scope.
    ///
    /// A [`client_ip`](Key::client_ip) key needs no `required`: its address is missing
    /// only when the server does not record the peer (served without `ConnectInfo`), a
    /// misconfiguration answered `500` whether or not the key is required (see
    /// [`RateLimitLayer::per_ip`](crate::RateLimitLayer::per_ip)). A malformed forwarding
    /// chain from a trusted proxy gets the missing-key answer.
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
    #[inline]
    pub(crate) fn extract(
        &self,
        head: &Head<'_>,
        proxies: &Proxies,
        hasher: &KeyHasher,
    ) -> Result<Option<u64>, KeyError> {
        match &self.source {
            Source::ClientIp {
                v4_prefix,
                v6_prefix,
            } => {
                let Some(peer) = peer_ip(head.extensions) else {
                    return Ok(None);
                };
                // No trusted proxy (`per_ip`): the peer is the client, no field read.
                let ip = if proxies.nets.is_empty() {
                    canonical(peer)
                } else {
                    client_ip(peer, head.headers, proxies)?
                };
                Ok(Some(hasher.addr(mask(ip, *v4_prefix, *v6_prefix))))
            }
            Source::Header(name) => Ok(head.headers.get(name).map(|v| hasher.text(v.as_bytes()))),
            Source::PathSegment(i) => Ok(head
                .uri
                .path()
                .split('/')
                .skip(1)
                .nth(*i)
                .filter(|s| !s.is_empty())
                .map(|s| hasher.text(s.as_bytes()))),
            Source::Custom(f) => Ok(f(head).map(|n| hasher.id(CUSTOM, n))),
        }
    }
}

/// How a request's keys are taken, decided when the layer is built.
#[derive(Clone, Copy, Debug)]
#[repr(u8)]
pub(crate) enum KeyPlan {
    /// No key is configured.
    None,
    /// One key, the client's address, and no trusted proxy: the peer address is the
    /// client's, masked to its prefix and hashed ([`KeyHasher::peer`]), with no field
    /// read (what [`Key::extract`] does for it, without the walk over the keys).
    Peer { kind: ScopeKind, masks: PeerMasks },
    /// Any other set of keys: each one's [`Key::extract`] in kind order.
    Keys,
}

impl KeyPlan {
    /// The plan for the configured keys `keyed` behind `proxies`.
    pub(crate) fn new(keyed: &[(ScopeKind, Key)], proxies: &Proxies) -> KeyPlan {
        match keyed {
            [] => KeyPlan::None,
            [
                (
                    kind,
                    Key {
                        source:
                            Source::ClientIp {
                                v4_prefix,
                                v6_prefix,
                            },
                        ..
                    },
                ),
            ] if proxies.nets.is_empty() => KeyPlan::Peer {
                kind: *kind,
                masks: PeerMasks::new(*v4_prefix, *v6_prefix),
            },
            _ => KeyPlan::Keys,
        }
    }
}

/// A client-address key's prefixes as masks, made once: the IPv4 one in the order of
/// the address's bytes in memory (network order, read as a little-endian word, as the
/// hashed message holds them), the IPv6 one on the address's integer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerMasks {
    v4: u32,
    v6: u128,
}

impl PeerMasks {
    pub(crate) fn new(v4_prefix: u8, v6_prefix: u8) -> PeerMasks {
        let v4 = u32::MAX.checked_shl(32u32.saturating_sub(u32::from(v4_prefix)));
        let v6 = u128::MAX.checked_shl(128u32.saturating_sub(u32::from(v6_prefix)));
        PeerMasks {
            v4: v4.unwrap_or(0).swap_bytes(),
            v6: v6.unwrap_or(0),
        }
    }
}

/// Puts `id`, the key of `kind` taken from a request's head, in `request`; `false` for
/// a kind no [`Key`] gives (the global scope has no key; the route and tenant-route
/// scopes come from the matched route). No `_` arm: a new scope kind does not compile
/// until it is placed here.
#[inline]
pub(crate) fn set_key_id(request: &mut Request, kind: ScopeKind, id: u64) -> bool {
    match kind {
        ScopeKind::Tenant => request.tenant = Some(TenantId(id)),
        ScopeKind::User => request.user = Some(UserId(id)),
        ScopeKind::ApiKey => request.api_key = Some(ApiKeyId(id)),
        ScopeKind::Client => request.client = Some(ClientId(id)),
        ScopeKind::Global | ScopeKind::Route | ScopeKind::TenantRoute => return false,
    }
    true
}

/// Whether a [`Key`] can give the key of `kind` (see [`set_key_id`]).
pub(crate) fn takes_key(kind: ScopeKind) -> bool {
    set_key_id(&mut Request::new(), kind, 0)
}

/// The peer address the server put in the request extensions.
#[inline(always)]
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
    fn a_decimal_value_is_hashed_like_any_other_and_an_id_does_not_map_to_itself() {
        let h = KeyHasher::process();
        assert_ne!(h.text(b"42"), 42);
        assert_eq!(h.text(b"acme"), h.text(b"acme"));
        assert_ne!(h.text(b"acme"), h.text(b"acm"));
        let id = h.text(b"victim");
        assert_ne!(h.text(id.to_string().as_bytes()), id);
        assert_ne!(h.id(CUSTOM, id), id);
        // One secret per process; a given secret is the same everywhere.
        assert_eq!(KeyHasher::process().text(b"x"), h.text(b"x"));
        let s = KeyHasher::with_secret([7; 16]);
        assert_eq!(s.text(b"x"), KeyHasher::with_secret([7; 16]).text(b"x"));
        assert_ne!(s.text(b"x"), KeyHasher::with_secret([8; 16]).text(b"x"));
        assert_eq!(format!("{s:?}"), "KeyHasher(<secret>)");
    }

    /// Ids are names a fleet shares (remote scopes' keys) and operators look buckets up
    /// by: under a given secret they stay what they are from one release to the next.
    /// A change of the hash, the domains or the messages fails here, on purpose.
    ///
    /// A text key's id goes through std's `Hash` for byte slices, whose length prefix is
    /// the target's word: the value pinned is the 64-bit targets' (a 32-bit process
    /// names the same text differently), and a compiler whose `Hash` fed it otherwise
    /// would fail here too. Addresses and custom numbers are hashed from fixed-size
    /// messages on every target.
    #[test]
    fn ids_under_a_given_secret_are_fixed_across_releases() {
        let s = KeyHasher::with_secret(*b"0123456789abcdef");
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        let v6: IpAddr = "2001:db8::7".parse().unwrap();
        #[cfg(target_pointer_width = "64")]
        assert_eq!(s.text(b"acme"), 9_333_696_975_683_537_767, "text acme");
        let known = [
            (
                "custom 42",
                s.id(CUSTOM, 42_u64),
                12_401_295_046_436_872_535,
            ),
            ("192.0.2.7", s.addr(v4), 18_031_644_285_874_955_216),
            ("2001:db8::7", s.addr(v6), 4_203_129_613_841_075_170),
            (
                "peer 192.0.2.7 /24",
                s.peer(v4, &PeerMasks::new(24, 128)),
                10_118_985_990_340_410_907,
            ),
            (
                "peer 2001:db8::7 /64",
                s.peer(v6, &PeerMasks::new(32, 64)),
                12_490_299_479_960_431_119,
            ),
        ];
        for (what, id, expected) in known {
            assert_eq!(id, expected, "{what}");
        }
    }

    #[test]
    fn an_address_id_is_siphash_1_3_of_its_domain_and_bytes_under_the_secret() {
        let s = KeyHasher::with_secret(*b"0123456789abcdef");
        let streamed = |bytes: &[u8]| {
            let mut h = SipHasher13::new_with_keys(s.k0, s.k1);
            h.write(bytes);
            h.finish()
        };
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        assert_eq!(s.addr(v4), streamed(&[ADDR_V4, 192, 0, 2, 7]));
        let v6: IpAddr = "2001:db8::7".parse().unwrap();
        let mut m = vec![ADDR_V6];
        m.extend_from_slice(
            &"2001:db8::7"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        assert_eq!(s.addr(v6), streamed(&m));
        // Keyed: another secret, another id; an address is not its own id, nor its
        // bytes read as text or as a custom number.
        let other = KeyHasher::with_secret(*b"0123456789abcdeF");
        assert_ne!(s.addr(v4), other.addr(v4));
        assert_ne!(s.addr(v4), u64::from(u32::from_be_bytes([192, 0, 2, 7])));
        assert_ne!(s.addr(v4), s.text(&[192, 0, 2, 7]));
        assert_ne!(s.addr(v4), s.id(CUSTOM, 0xc000_0207_u64));
        // The fixed-length hash is the streamed one over every length of prefix.
        for (v4, v6) in [
            (v4, v6),
            (
                "255.1.128.0".parse().unwrap(),
                "ff00:1::8000:1".parse().unwrap(),
            ),
        ] {
            for bits in [0, 1, 7, 8, 24, 31, 32, 64, 127, 128] {
                for ip in [mask(v4, bits, bits), mask(v6, bits, bits)] {
                    let mut m = match ip {
                        IpAddr::V4(_) => vec![ADDR_V4],
                        IpAddr::V6(_) => vec![ADDR_V6],
                    };
                    match ip {
                        IpAddr::V4(a) => m.extend_from_slice(&a.octets()),
                        IpAddr::V6(a) => m.extend_from_slice(&a.octets()),
                    }
                    assert_eq!(s.addr(ip), streamed(&m), "{ip}");
                }
            }
        }
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_ne!(s.addr(v4), s.addr(mapped), "the domains differ by family");
    }

    #[test]
    fn a_peer_id_is_the_address_made_canonical_masked_and_hashed() {
        let s = KeyHasher::with_secret(*b"0123456789abcdef");
        let ips: Vec<IpAddr> = [
            "192.0.2.7",
            "255.1.128.0",
            "0.0.0.0",
            "::ffff:192.0.2.7",
            "::ffff:255.1.128.1",
            "2001:db8::7",
            "ff00:1::8000:1",
            "::1",
            "::",
        ]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
        for ip in ips {
            for v4 in [0, 1, 7, 8, 9, 16, 24, 31, 32, 33, 255] {
                for v6 in [0, 1, 48, 56, 64, 127, 128, 129, 255] {
                    let masks = PeerMasks::new(v4, v6);
                    let expected = s.addr(mask(canonical(ip), v4.min(32), v6.min(128)));
                    assert_eq!(s.peer(ip, &masks), expected, "{ip} /{v4} /{v6}");
                }
            }
        }
    }
}
