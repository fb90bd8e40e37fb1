//! Loopback plumbing for the tests and examples that run against a real Redis
//! (`tokengate-redis`, `tokengate-tower`'s remote scope): the server's URL, key namespaces
//! no other test or run uses, and [`BlackHole`], a TCP proxy that can be cut into a
//! stalled server (it accepts and reads, never answers). Standard library only.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The environment variable naming the Redis the tests run against.
pub const REDIS_URL_VAR: &str = "TOKENGATE_REDIS_URL";

/// The Redis the tests run against when [`REDIS_URL_VAR`] is not set.
pub const LOCAL_REDIS_URL: &str = "redis://127.0.0.1:6379/";

/// [`REDIS_URL_VAR`]'s value, else [`LOCAL_REDIS_URL`].
pub fn redis_url() -> String {
    std::env::var(REDIS_URL_VAR).unwrap_or_else(|_| LOCAL_REDIS_URL.to_owned())
}

/// A key namespace no other test, process or run uses: `{what}-{pid}-{wall ns}-{n}`, `n`
/// counting this process's calls.
pub fn namespace(what: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{what}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The `host:port` of a `redis://` or `rediss://` URL (`redis://user:pw@host:port/db`
/// gives `host:port`); `None` for another form (a cluster or Sentinel URL lists several).
pub fn host_port(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("rediss://"))?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let node = authority.rsplit_once('@').map_or(authority, |(_, n)| n);
    (!node.is_empty() && !node.contains(',')).then_some(node)
}

/// A loopback TCP proxy to one server. It forwards both ways until [cut](Self::cut);
/// from then on it is a black hole: it accepts connections and reads what either side
/// sends, but forwards nothing (a server that stalled, a partition that answers nothing),
/// until [restored](Self::restore). It counts the connections it accepted.
#[derive(Debug)]
pub struct BlackHole {
    port: u16,
    cut: Arc<AtomicBool>,
    accepted: Arc<AtomicU64>,
}

impl BlackHole {
    /// A proxy on a free loopback port to the server on loopback port `upstream`.
    pub fn to_port(upstream: u16) -> Self {
        Self::start(format!("127.0.0.1:{upstream}"))
    }

    /// A proxy to the server of a `redis://host:port/` URL ([`host_port`]).
    ///
    /// # Panics
    ///
    /// When `url` names no single `host:port`.
    pub fn to_url(url: &str) -> Self {
        let node = host_port(url).unwrap_or_else(|| panic!("a redis://host:port/ URL: {url}"));
        Self::start(node.to_owned())
    }

    /// A proxy on a free loopback port to the server at `upstream` (`host:port`).
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound.
    pub fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
        let port = listener.local_addr().expect("a bound listener").port();
        let cut = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let (flag, count) = (Arc::clone(&cut), Arc::clone(&accepted));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                count.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(upstream.as_str()) else {
                    continue;
                };
                let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                for (from, to) in [(c, s), (server, client)] {
                    let cut = Arc::clone(&flag);
                    std::thread::spawn(move || forward(from, to, &cut));
                }
            }
        });
        Self {
            port,
            cut,
            accepted,
        }
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// From now on nothing is forwarded, on open connections and new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    /// Forwards again (what was read while cut stays lost).
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// Whether it is cut.
    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// Copies `from` to `to` until either closes, dropping what it reads while `cut` is set.
fn forward(mut from: TcpStream, mut to: TcpStream, cut: &AtomicBool) {
    let mut buf = [0u8; 65536];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 {
            break;
        }
        if !cut.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_takes_the_node_of_one_server_urls_only() {
        assert_eq!(host_port("redis://127.0.0.1:6379/"), Some("127.0.0.1:6379"));
        assert_eq!(host_port("rediss://u:pw@h:6380/2"), Some("h:6380"));
        assert_eq!(host_port("redis://h:1"), Some("h:1"));
        assert_eq!(host_port("redis+cluster://a:1,b:2"), None);
        assert_eq!(host_port("redis:///"), None);
    }

    #[test]
    fn namespaces_differ_between_calls() {
        assert_ne!(namespace("t"), namespace("t"));
        assert!(namespace("t-x").starts_with(&format!("t-x-{}-", std::process::id())));
    }

    /// Forwards while open; once cut, a reply is never delivered; restored, it is.
    #[test]
    fn a_cut_proxy_answers_nothing_until_restored() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream = echo.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for s in echo.incoming() {
                let Ok(s) = s else { return };
                let r = s.try_clone().unwrap();
                std::thread::spawn(move || forward(r, s, &AtomicBool::new(false)));
            }
        });
        let proxy = BlackHole::to_port(upstream);
        let mut c = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
        let wait = |c: &TcpStream, ms| {
            c.set_read_timeout(Some(std::time::Duration::from_millis(ms)))
                .unwrap();
        };
        let mut buf = [0u8; 4];
        wait(&c, 10_000);
        c.write_all(b"ping").unwrap();
        c.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
        proxy.cut();
        assert!(proxy.is_cut());
        c.write_all(b"lost").unwrap();
        // Nothing comes back, however long one waits (200 ms here).
        wait(&c, 200);
        assert!(c.read(&mut buf).is_err(), "a cut proxy answered");
        proxy.restore();
        wait(&c, 10_000);
        c.write_all(b"back").unwrap();
        c.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"back");
        assert_eq!(proxy.accepted(), 1);
    }
}
