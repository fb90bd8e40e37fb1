//! Client addresses: networks (`10.0.0.0/8`), prefixes (an IPv6 /64 as one client), and
//! the client behind trusted proxies (`Forwarded`, `X-Forwarded-For`).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use http::HeaderMap;

use crate::key::KeyError;

/// An IP network: an address and a prefix length, such as `10.0.0.0/8` or `fd00::/8`.
/// A bare address is a network of one (`/32` or `/128`).
///
/// ```
/// use tokengate_tower::IpNet;
/// let net: IpNet = "10.0.0.0/8".parse()?;
/// assert!(net.contains("10.1.2.3".parse()?));
/// assert!(!net.contains("11.0.0.1".parse()?));
/// assert!("fd00::/129".parse::<IpNet>().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

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

impl IpNet {
    /// The network of `addr` with `prefix` leading bits.
    ///
    /// # Errors
    ///
    /// A prefix above 32 (IPv4) or 128 (IPv6).
    pub fn new(addr: IpAddr, prefix: u8) -> Result<IpNet, IpNetError> {
        if prefix > max_prefix(addr) {
            return Err(IpNetError {
                text: format!("{addr}/{prefix}"),
                reason: "the prefix length must be at most 32 for IPv4, 128 for IPv6",
            });
        }
        Ok(IpNet {
            addr: mask(addr, prefix),
            prefix,
        })
    }

    /// Whether `ip` is in the network (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        matches!(
            (self.addr, ip),
            (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_))
        ) && mask(ip, self.prefix) == self.addr
    }
}

impl FromStr for IpNet {
    type Err = IpNetError;

    fn from_str(s: &str) -> Result<IpNet, IpNetError> {
        let err = |reason| IpNetError {
            text: s.to_owned(),
            reason,
        };
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| err("not an IP address"))?;
        let addr = canonical(addr);
        let prefix = match prefix {
            None => max_prefix(addr),
            Some(p) => p
                .parse::<u8>()
                .map_err(|_| err("the prefix length is not a number"))?,
        };
        if prefix > max_prefix(addr) {
            return Err(err(
                "the prefix length must be at most 32 for IPv4, 128 for IPv6",
            ));
        }
        Ok(IpNet {
            addr: mask(addr, prefix),
            prefix,
        })
    }
}

fn max_prefix(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) as IPv4.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

/// `ip` with all but the first `prefix` bits cleared (`prefix` at most the family's width).
pub(crate) fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let m = u32::MAX
                .checked_shl(32 - u32::from(prefix.min(32)))
                .unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(bits & m))
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let m = u128::MAX
                .checked_shl(128 - u32::from(prefix.min(128)))
                .unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(bits & m))
        }
    }
}

/// The client of a request that came from `peer`: `peer` itself unless it is a trusted
/// proxy; then the rightmost address of the forwarding chain that is not a trusted proxy
/// (`Forwarded` if present, else `X-Forwarded-For`), or the leftmost when all are.
///
/// A malformed chain entry met before an untrusted address is an error: the layer then
/// answers as for a missing key rather than guess (taking the proxy's own address would
/// put every client behind it in one bucket; taking an unparsed entry would let a client
/// choose its key).
pub(crate) fn client_ip(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &[IpNet],
) -> Result<IpAddr, KeyError> {
    let peer = canonical(peer);
    if !trusted.iter().any(|n| n.contains(peer)) {
        return Ok(peer);
    }
    let forwarded = headers.get_all(http::header::FORWARDED);
    if forwarded.iter().next().is_some() {
        let mut entries = Vec::new();
        for v in forwarded {
            let v = v.to_str().map_err(|_| KeyError::Malformed("forwarded"))?;
            for element in v.split(',') {
                let mut found = None;
                for pair in element.split(';') {
                    let Some((k, val)) = pair.trim().split_once('=') else {
                        return Err(KeyError::Malformed("forwarded"));
                    };
                    if k.trim().eq_ignore_ascii_case("for") {
                        found = Some(val.trim());
                    }
                }
                entries.push(found.ok_or(KeyError::Malformed("forwarded"))?);
            }
        }
        return walk(
            peer,
            entries.iter().map(|e| parse_forwarded_for(e)),
            trusted,
        );
    }
    let xff = headers.get_all("x-forwarded-for");
    if xff.iter().next().is_none() {
        return Ok(peer);
    }
    let mut entries = Vec::new();
    for v in xff {
        let v = v
            .to_str()
            .map_err(|_| KeyError::Malformed("x-forwarded-for"))?;
        entries.extend(v.split(',').map(|e| parse_xff(e.trim())));
    }
    walk(peer, entries.into_iter(), trusted)
}

/// Walks the chain from the right (the hop nearest to us) past trusted proxies.
fn walk(
    peer: IpAddr,
    chain: impl DoubleEndedIterator<Item = Result<IpAddr, KeyError>>,
    trusted: &[IpNet],
) -> Result<IpAddr, KeyError> {
    let mut last = peer;
    for entry in chain.rev() {
        let ip = canonical(entry?);
        if !trusted.iter().any(|n| n.contains(ip)) {
            return Ok(ip);
        }
        last = ip;
    }
    Ok(last)
}

fn parse_xff(e: &str) -> Result<IpAddr, KeyError> {
    e.parse::<IpAddr>()
        .or_else(|_| e.parse::<SocketAddr>().map(|s| s.ip()))
        .map_err(|_| KeyError::Malformed("x-forwarded-for"))
}

/// A `for=` value of RFC 7239: `192.0.2.43`, `"192.0.2.43:47011"`, `"[2001:db8::1]:4711"`.
/// `unknown` and obfuscated identifiers (`_hidden`) name no address: malformed here.
fn parse_forwarded_for(v: &str) -> Result<IpAddr, KeyError> {
    let v = v.trim_matches('"');
    let bad = KeyError::Malformed("forwarded");
    if let Some(rest) = v.strip_prefix('[') {
        let inner = rest.split(']').next().ok_or(bad)?;
        return inner.parse::<Ipv6Addr>().map(IpAddr::V6).map_err(|_| bad);
    }
    v.parse::<IpAddr>()
        .or_else(|_| v.parse::<SocketAddr>().map(|s| s.ip()))
        .map_err(|_| bad)
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

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_forwards() {
        let trusted = ["10.0.0.0/8".parse().unwrap()];
        let h = headers(&[("x-forwarded-for", "1.2.3.4")]);
        assert_eq!(client_ip(ip("9.9.9.9"), &h, &trusted), Ok(ip("9.9.9.9")));
    }

    #[test]
    fn a_trusted_chain_is_walked_from_the_right_past_trusted_hops() {
        let trusted = ["10.0.0.0/8".parse().unwrap()];
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
        let trusted = ["10.0.0.0/8".parse().unwrap()];
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
        assert_eq!(mask(ip("2001:db8:1:2:aaaa::1"), 64), ip("2001:db8:1:2::"));
        assert_eq!(mask(ip("192.168.7.9"), 24), ip("192.168.7.0"));
        assert_eq!(mask(ip("192.168.7.9"), 0), ip("0.0.0.0"));
        assert_eq!(canonical(ip("::ffff:1.2.3.4")), ip("1.2.3.4"));
    }
}
