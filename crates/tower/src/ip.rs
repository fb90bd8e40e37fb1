//! Client addresses: networks (`10.0.0.0/8`), prefixes (an IPv6 /64 as one client), and
//! the client behind trusted proxies (`Forwarded`, `X-Forwarded-For`).

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use http::HeaderMap;

use crate::key::KeyError;

/// An IP network: an address and a prefix length, such as `10.0.0.0/8` or `fd00::/8`.
/// A bare address is a network of one (`/32` or `/128`). Parsed and matched by the
/// [`ipnet`] crate (re-exported as `tokengate_tower::ipnet`); an [`ipnet::IpNet`],
/// `Ipv4Net` or `Ipv6Net` converts into it.
///
/// ```
/// use tokengate_tower::IpNet;
/// let net: IpNet = "10.0.0.0/8".parse()?;
/// assert!(net.contains("10.1.2.3".parse()?));
/// assert!(!net.contains("11.0.0.1".parse()?));
/// assert!(net.contains("::ffff:10.0.0.1".parse()?)); // IPv4-mapped counts as IPv4
/// assert!("fd00::/129".parse::<IpNet>().is_err());
/// let one: IpNet = "192.0.2.7".parse()?;
/// assert_eq!(one.to_string(), "192.0.2.7/32");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpNet(ipnet::IpNet);

/// Why a network did not parse: the text and what was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpNetError {
    text: String,
    reason: &'static str,
}

impl fmt::Display for IpNetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid IP network {:?}: {}", self.text, self.reason)
    }
}

impl std::error::Error for IpNetError {}

const PREFIX_TOO_LONG: &str = "the prefix length must be at most 32 for IPv4, 128 for IPv6";

impl IpNet {
    /// The network of `addr` with `prefix` leading bits (host bits cleared).
    ///
    /// # Errors
    ///
    /// A prefix above 32 (IPv4) or 128 (IPv6).
    pub fn new(addr: IpAddr, prefix: u8) -> Result<IpNet, IpNetError> {
        ipnet::IpNet::new(addr, prefix)
            .map(IpNet::from)
            .map_err(|_| IpNetError {
                text: format!("{addr}/{prefix}"),
                reason: PREFIX_TOO_LONG,
            })
    }

    /// Whether `ip` is in the network (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&canonical(ip))
    }

    /// The network as the [`ipnet`] crate's type.
    pub fn as_ipnet(&self) -> ipnet::IpNet {
        self.0
    }
}

impl From<ipnet::IpNet> for IpNet {
    /// Host bits cleared; an IPv4-mapped IPv6 network of at least 96 bits as the IPv4
    /// network it maps.
    fn from(net: ipnet::IpNet) -> IpNet {
        let net = net.trunc();
        if let ipnet::IpNet::V6(v6) = net {
            if let (Some(v4), true) = (v6.addr().to_ipv4_mapped(), v6.prefix_len() >= 96) {
                if let Ok(n) = ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96) {
                    return IpNet(ipnet::IpNet::V4(n));
                }
            }
        }
        IpNet(net)
    }
}

impl From<ipnet::Ipv4Net> for IpNet {
    fn from(net: ipnet::Ipv4Net) -> IpNet {
        IpNet::from(ipnet::IpNet::V4(net))
    }
}

impl From<ipnet::Ipv6Net> for IpNet {
    fn from(net: ipnet::Ipv6Net) -> IpNet {
        IpNet::from(ipnet::IpNet::V6(net))
    }
}

impl From<IpAddr> for IpNet {
    /// The network of one address.
    fn from(addr: IpAddr) -> IpNet {
        IpNet::from(ipnet::IpNet::from(addr))
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for IpNet {
    type Err = IpNetError;

    fn from_str(s: &str) -> Result<IpNet, IpNetError> {
        let err = |reason| IpNetError {
            text: s.to_owned(),
            reason,
        };
        if !s.contains('/') {
            let addr: IpAddr = s.parse().map_err(|_| err("not an IP address"))?;
            return Ok(IpNet::from(addr));
        }
        match s.parse::<ipnet::IpNet>() {
            Ok(net) => Ok(IpNet::from(net)),
            Err(_) => {
                let (addr, prefix) = s.split_once('/').unwrap_or((s, ""));
                Err(err(match (addr.parse::<IpAddr>(), prefix.parse::<u8>()) {
                    (Err(_), _) => "not an IP address",
                    (Ok(_), Err(_)) => "the prefix length is not a number",
                    (Ok(_), Ok(_)) => PREFIX_TOO_LONG,
                }))
            }
        }
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) as IPv4.
#[inline]
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

/// `ip` with all but its first `v4` (IPv4) or `v6` (IPv6) bits cleared (a prefix
/// beyond the family's width keeps every bit): shifts on the address's integer.
#[inline]
pub(crate) fn mask(ip: IpAddr, v4: u8, v6: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let keep = u32::MAX.checked_shl(32u32.saturating_sub(u32::from(v4)));
            IpAddr::V4((a.to_bits() & keep.unwrap_or(0)).into())
        }
        IpAddr::V6(a) => {
            let keep = u128::MAX.checked_shl(128u32.saturating_sub(u32::from(v6)));
            IpAddr::V6((a.to_bits() & keep.unwrap_or(0)).into())
        }
    }
}

/// Which forwarding field a trusted proxy's client is read from.
///
/// A proxy passes on the fields it does not write as the client sent them: a proxy that
/// appends `X-Forwarded-For` (nginx, HAProxy, most load balancers) forwards a client's
/// own `Forwarded` untouched. Only the named field is read, so the other one, which only
/// a client could have written, never picks the key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Forwarding {
    /// `X-Forwarded-For` only (the default: the field nginx, HAProxy and most load
    /// balancers write).
    #[default]
    XForwardedFor,
    /// `Forwarded` (RFC 7239) only, for proxies that write it.
    Forwarded,
    /// `Forwarded` when the request has it, else `X-Forwarded-For`. **Unsafe unless every
    /// trusted proxy strips or rewrites both fields**: behind a proxy that only appends
    /// `X-Forwarded-For`, a client writes its own `Forwarded: for=...` and picks its key
    /// (a fresh budget per request, or a victim's budget to drain).
    Either,
}

/// The trusted proxies and the field they write.
#[derive(Clone, Debug, Default)]
pub(crate) struct Proxies {
    pub(crate) nets: Vec<IpNet>,
    pub(crate) forwarding: Forwarding,
}

impl Proxies {
    #[inline]
    fn trusts(&self, ip: IpAddr) -> bool {
        !self.nets.is_empty() && self.nets.iter().any(|n| n.contains(ip))
    }
}

/// The client of a request that came from `peer`: `peer` itself unless it is a trusted
/// proxy; then the rightmost address of the forwarding chain that is not a trusted proxy
/// (the field [`Forwarding`] names), or the leftmost when all are.
///
/// The chain is read from the right (the hop nearest to us) and no further than the
/// client: entries a client wrote to the left of it are never parsed. A malformed entry met before an untrusted address is an error: the layer
/// then answers as for a missing key rather than guess (taking the proxy's own address
/// would put every client behind it in one bucket; taking an unparsed entry would let a
/// client choose its key).
pub(crate) fn client_ip(
    peer: IpAddr,
    headers: &HeaderMap,
    proxies: &Proxies,
) -> Result<IpAddr, KeyError> {
    let peer = canonical(peer);
    if !proxies.trusts(peer) {
        return Ok(peer);
    }
    let forwarded = headers.get_all(http::header::FORWARDED);
    let use_forwarded = match proxies.forwarding {
        Forwarding::Either => forwarded.iter().next().is_some(),
        Forwarding::Forwarded => true,
        Forwarding::XForwardedFor => false,
    };
    let mut last = peer;
    if use_forwarded {
        for v in forwarded.iter().rev() {
            let v = v.to_str().map_err(|_| KeyError::Malformed("forwarded"))?;
            for element in split_unquoted(v, b',') {
                let ip = canonical(forwarded_for(element)?);
                if !proxies.trusts(ip) {
                    return Ok(ip);
                }
                last = ip;
            }
        }
    } else {
        for v in headers.get_all("x-forwarded-for").iter().rev() {
            let v = v
                .to_str()
                .map_err(|_| KeyError::Malformed("x-forwarded-for"))?;
            for entry in v.rsplit(',') {
                let ip = canonical(parse_xff(entry.trim())?);
                if !proxies.trusts(ip) {
                    return Ok(ip);
                }
                last = ip;
            }
        }
    }
    Ok(last)
}

/// `s` split at each `sep` outside a quoted string (RFC 7230 `quoted-string`, with `\`
/// escapes), so that `for="a,b"` stays one element: the parts from the right (the hop
/// nearest to us first), found by scanning backwards, allocating nothing.
fn split_unquoted(s: &str, sep: u8) -> RSplitUnquoted<'_> {
    RSplitUnquoted { rest: Some(s), sep }
}

/// The parts of [`split_unquoted`], rightmost first.
///
/// Read backwards, a `"` met outside a quoted string closes one; inside, a `"` opens it
/// unless an odd run of `\` precedes it (then it is an escaped quote). For a
/// well-formed field this is the forward reading; an unbalanced quote keeps the rest of
/// the field (to the left) as one part, which then fails to parse.
struct RSplitUnquoted<'a> {
    rest: Option<&'a str>,
    sep: u8,
}

impl<'a> Iterator for RSplitUnquoted<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let s = self.rest?;
        let bytes = s.as_bytes();
        let mut quoted = false;
        let mut i = bytes.len();
        while i > 0 {
            i -= 1;
            let b = bytes[i];
            if !quoted {
                if b == self.sep {
                    // `sep` is ASCII: both sides are on char boundaries.
                    self.rest = Some(&s[..i]);
                    return Some(&s[i + 1..]);
                }
                quoted = b == b'"';
            } else if b == b'"' {
                let backslashes = bytes[..i].iter().rev().take_while(|&&c| c == b'\\').count();
                // An even run: the quote is not escaped, and opens the string.
                quoted = backslashes % 2 == 1;
            }
        }
        self.rest = None;
        Some(s)
    }
}

/// The address of one `Forwarded` element's `for=` parameter: exactly one `for`, every
/// parameter a `name=value` pair.
fn forwarded_for(element: &str) -> Result<IpAddr, KeyError> {
    let bad = KeyError::Malformed("forwarded");
    let mut found = None;
    for pair in split_unquoted(element, b';') {
        let (k, val) = pair.trim().split_once('=').ok_or(bad)?;
        if k.trim().eq_ignore_ascii_case("for") {
            if found.is_some() {
                return Err(bad);
            }
            found = Some(val.trim());
        }
    }
    parse_forwarded_for(found.ok_or(bad)?)
}

fn parse_xff(e: &str) -> Result<IpAddr, KeyError> {
    e.parse::<IpAddr>()
        .or_else(|_| e.parse::<SocketAddr>().map(|s| s.ip()))
        .map_err(|_| KeyError::Malformed("x-forwarded-for"))
}

/// A `for=` value of RFC 7239: `192.0.2.43`, `"192.0.2.43:47011"`, `"[2001:db8::1]:4711"`.
/// `unknown` and obfuscated identifiers (`_hidden`) name no address: malformed here.
fn parse_forwarded_for(v: &str) -> Result<IpAddr, KeyError> {
    let bad = KeyError::Malformed("forwarded");
    let v = match v.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"').ok_or(bad)?,
        None => v,
    };
    if let Some(rest) = v.strip_prefix('[') {
        let (inner, after) = rest.split_once(']').ok_or(bad)?;
        // Nothing or a port after the bracket.
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return Err(bad);
        }
        return inner.parse::<Ipv6Addr>().map(IpAddr::V6).map_err(|_| bad);
    }
    v.parse::<IpAddr>()
        .or_else(|_| {
            v.parse::<std::net::SocketAddrV4>()
                .map(|s| IpAddr::V4(*s.ip()))
        })
        .map_err(|_| bad)
}

/// A port: 1 to 5 digits, or an obfuscated one (`_abc`).
fn is_port(p: &str) -> bool {
    (!p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
        || (p.starts_with('_') && p.len() > 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn proxies(forwarding: Forwarding) -> Proxies {
        Proxies {
            nets: vec!["10.0.0.0/8".parse().unwrap()],
            forwarding,
        }
    }

    #[test]
    fn a_forwarded_element_is_split_outside_quotes_and_needs_one_for() {
        let trusted = proxies(Forwarding::Either);
        let h = headers(&[(
            "forwarded",
            r#"for=6.6.6.6;by="a,b;c", for="[2001:db8::2]:80";proto=https"#,
        )]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &h, &trusted),
            Ok(ip("2001:db8::2"))
        );
        for bad in [
            "for=1.2.3.4;for=5.6.7.8",
            "for=\"1.2.3.4",
            "for=\"[2001:db8::1]x\"",
            "proto=https",
            "for=",
        ] {
            let h = headers(&[("forwarded", bad)]);
            assert!(client_ip(ip("10.0.0.1"), &h, &trusted).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_the_named_field_is_read_and_entries_left_of_the_client_are_not() {
        let h = headers(&[
            ("forwarded", "for=7.7.7.7"),
            ("x-forwarded-for", "garbage, 1.2.3.4, 10.0.0.3"),
        ]);
        let xff = proxies(Forwarding::XForwardedFor);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &xff), Ok(ip("1.2.3.4")));
        let fwd = proxies(Forwarding::Forwarded);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &fwd), Ok(ip("7.7.7.7")));
        assert_eq!(
            client_ip(ip("10.0.0.1"), &h, &proxies(Forwarding::Either)),
            Ok(ip("7.7.7.7"))
        );
        // Forwarded named and absent: the proxy itself is the client.
        let h = headers(&[("x-forwarded-for", "1.2.3.4")]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &fwd), Ok(ip("10.0.0.1")));
        // Several fields: the last one is nearest.
        let h = headers(&[
            ("x-forwarded-for", "9.9.9.9"),
            ("x-forwarded-for", "1.2.3.4"),
        ]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &xff), Ok(ip("1.2.3.4")));
    }

    #[test]
    fn fields_split_from_the_right_outside_quoted_strings() {
        let parts = |s| split_unquoted(s, b',').collect::<Vec<_>>();
        assert_eq!(parts("a, b,c"), ["c", " b", "a"]);
        assert_eq!(parts(""), [""]);
        assert_eq!(parts(",x,"), ["", "x", ""]);
        assert_eq!(
            parts(r#"for="a,b", by="x\",y", for="q\\",z"#),
            ["z", r#" for="q\\""#, r#" by="x\",y""#, r#"for="a,b""#]
        );
        // An unbalanced quote keeps the rest, to its left, as one part.
        assert_eq!(parts(r#"for="1.2, 3.4"#), [" 3.4", r#"for="1.2"#]);
    }

    /// Counts the allocations made by the current thread (other tests' threads do not
    /// disturb the count).
    struct Counting;

    std::thread_local! {
        static ALLOCATIONS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    // SAFETY: every call is passed on to the system allocator unchanged.
    unsafe impl std::alloc::GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
            // SAFETY: the caller's contract, passed on.
            unsafe { std::alloc::System.alloc(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
            // SAFETY: the caller's contract, passed on.
            unsafe { std::alloc::System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    #[test]
    fn reading_a_forwarding_chain_allocates_nothing() {
        let chain = "1.1.1.1, 10.0.0.9, 10.0.0.8, 10.0.0.7";
        let forwarded = r#"for=1.1.1.1;by="a,b", for="[2001:db8::1]:80";proto=https, for=10.0.0.7"#;
        let xff = headers(&[("x-forwarded-for", chain), ("x-forwarded-for", "10.0.0.6")]);
        let fwd = headers(&[("forwarded", forwarded)]);
        let (x, f) = (
            proxies(Forwarding::XForwardedFor),
            proxies(Forwarding::Forwarded),
        );
        let peer = ip("10.0.0.1");
        let before = ALLOCATIONS.with(std::cell::Cell::get);
        let got = (client_ip(peer, &xff, &x), client_ip(peer, &fwd, &f));
        let after = ALLOCATIONS.with(std::cell::Cell::get);
        assert_eq!(got, (Ok(ip("1.1.1.1")), Ok(ip("2001:db8::1"))));
        assert_eq!(after - before, 0, "allocations while reading the chains");
    }

    #[test]
    fn the_default_reads_x_forwarded_for_only() {
        let h = headers(&[("forwarded", "for=7.7.7.7"), ("x-forwarded-for", "1.2.3.4")]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &h, &proxies(Forwarding::default())),
            Ok(ip("1.2.3.4"))
        );
    }

    #[test]
    fn networks_parse_through_ipnet_with_bare_addresses_and_mapped_v4() {
        let n: IpNet = "10.1.2.3/8".parse().unwrap();
        assert_eq!(n.to_string(), "10.0.0.0/8");
        assert!(n.contains(ip("::ffff:10.9.9.9")));
        let mapped: IpNet = "::ffff:10.0.0.0/104".parse().unwrap();
        assert_eq!(mapped, n);
        assert_eq!(
            "10.0.0.0/33".parse::<IpNet>().unwrap_err().to_string(),
            format!("invalid IP network \"10.0.0.0/33\": {PREFIX_TOO_LONG}")
        );
        assert!("10.0.0.0/x".parse::<IpNet>().is_err());
        assert!("nope/8".parse::<IpNet>().is_err());
        assert!(IpNet::new(ip("fd00::"), 129).is_err());
        assert_eq!(IpNet::from(ip("fd00::1")).to_string(), "fd00::1/128");
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_forwards() {
        let trusted = proxies(Forwarding::Either);
        let h = headers(&[("x-forwarded-for", "1.2.3.4")]);
        assert_eq!(client_ip(ip("9.9.9.9"), &h, &trusted), Ok(ip("9.9.9.9")));
    }

    #[test]
    fn a_trusted_chain_is_walked_from_the_right_past_trusted_hops() {
        let trusted = proxies(Forwarding::Either);
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 1.2.3.4, 10.0.0.2")]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &trusted), Ok(ip("1.2.3.4")));
        let h = headers(&[(
            "forwarded",
            "for=6.6.6.6, for=\"[2001:db8::1]:4711\";proto=https",
        )]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &h, &trusted),
            Ok(ip("2001:db8::1"))
        );
    }

    #[test]
    fn a_malformed_entry_before_the_client_is_an_error() {
        let trusted = proxies(Forwarding::Either);
        let h = headers(&[("x-forwarded-for", "1.2.3.4, garbage")]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &h, &trusted),
            Err(KeyError::Malformed("x-forwarded-for"))
        );
        let h = headers(&[("forwarded", "for=unknown")]);
        assert!(client_ip(ip("10.0.0.1"), &h, &trusted).is_err());
    }

    #[test]
    fn prefixes_mask_the_host_bits() {
        assert_eq!(
            mask(ip("2001:db8:1:2:aaaa::1"), 32, 64),
            ip("2001:db8:1:2::")
        );
        assert_eq!(mask(ip("192.168.7.9"), 24, 128), ip("192.168.7.0"));
        assert_eq!(mask(ip("192.168.7.9"), 0, 128), ip("0.0.0.0"));
        assert_eq!(mask(ip("192.168.7.9"), 32, 0), ip("192.168.7.9"));
        assert_eq!(mask(ip("192.168.7.9"), 40, 0), ip("192.168.7.9"));
        assert_eq!(mask(ip("2001:db8::1"), 32, 0), ip("::"));
        assert_eq!(mask(ip("2001:db8::1"), 0, 128), ip("2001:db8::1"));
        assert_eq!(mask(ip("2001:db8::1"), 0, 200), ip("2001:db8::1"));
        // The same networks as the ipnet crate's, for every prefix length.
        for p in 0..=32 {
            let a = ip("203.0.113.255");
            let n = ipnet::IpNet::new(a, p).unwrap().network();
            assert_eq!(mask(a, p, 128), n, "/{p}");
        }
        for p in 0..=128 {
            let a = ip("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff");
            let n = ipnet::IpNet::new(a, p).unwrap().network();
            assert_eq!(mask(a, 32, p), n, "/{p}");
        }
        assert_eq!(canonical(ip("::ffff:1.2.3.4")), ip("1.2.3.4"));
    }
}
