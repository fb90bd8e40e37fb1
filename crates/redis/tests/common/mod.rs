//! Helpers shared by the tests against a real Redis.
#![allow(dead_code, unreachable_pub)]

pub mod cluster;
pub use tokengate_redis::ideal;
pub mod spawn;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use tokengate_redis::model::{ModelBucket, ModelState};
use tokengate_redis::script::BucketKeys;

use tokengate_testkit::net::{LOCAL_REDIS_URL, REDIS_URL_VAR};

/// The shared server the tests run against: `TOKENGATE_REDIS_URL` when set; else the
/// Redis answering on 127.0.0.1:6379; else a `redis-server` this test binary starts on a
/// free port, once, at the first call (it dies with this process: see [`Server`]).
pub fn url() -> String {
    static URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var(REDIS_URL_VAR) {
            return url;
        }
        if answers(LOCAL_REDIS_URL) {
            return LOCAL_REDIS_URL.to_owned();
        }
        static SHARED: std::sync::OnceLock<Server> = std::sync::OnceLock::new();
        SHARED.get_or_init(Server::start).url()
    })
    .clone()
}

/// Whether a Redis answers `PING` at `url` within 200 ms.
fn answers(url: &str) -> bool {
    redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(std::time::Duration::from_millis(200)))
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
        .is_ok()
}

/// A connection to the shared server; a test fails (never skips) when it is not there.
pub fn connect() -> redis::Connection {
    let client = redis::Client::open(url()).expect("redis url");
    client
        .get_connection_with_timeout(std::time::Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("a Redis server must answer on {}: {e}", url()))
}

/// A namespace no other test (or run) uses.
pub fn namespace(test: &str) -> String {
    tokengate_testkit::net::namespace(&format!("t-{test}"))
}

/// The bucket's keys as they are in Redis, in the model's shape.
pub fn read_bucket(con: &mut redis::Connection, keys: &BucketKeys) -> ModelBucket {
    type Stored = (
        BTreeMap<String, u64>,
        BTreeMap<String, u64>,
        Vec<(String, u64)>,
        Vec<(String, u64)>,
    );
    let (state, leases, expiry, credits): Stored = redis::pipe()
        .hgetall(&keys.state)
        .hgetall(&keys.leases)
        .zrange_withscores(&keys.expiry, 0, -1)
        .zrange_withscores(&keys.credits, 0, -1)
        .query(con)
        .expect("read bucket");
    let state = (!state.is_empty()).then(|| ModelState {
        u: state["u"],
        ts: state["ts"],
        rem: state["rem"],
        out: state["out"],
        ep: state["ep"],
    });
    ModelBucket {
        state,
        leases,
        expiry: expiry
            .into_iter()
            .map(|(id, at)| (at, id))
            .collect::<BTreeSet<_>>(),
        credits: credits.into_iter().collect(),
    }
}

/// Deletes the bucket's keys.
pub fn delete(con: &mut redis::Connection, keys: &BucketKeys) {
    let _: () = redis::cmd("DEL")
        .arg(&keys.all()[..])
        .query(con)
        .expect("del");
}

/// How to install the server, said in one line when it is missing.
const INSTALL: &str = "redis-server is not installed and no Redis answers on 127.0.0.1:6379: \
install Redis 5 or newer (Debian/Ubuntu: `apt-get install redis-server`; macOS: `brew install \
redis`) or set TOKENGATE_REDIS_URL";

/// A private `redis-server` on a free port, stopped on drop. It runs under a small shell
/// that kills it (`kill -9`) when its stdin, a pipe from this process, closes: on drop,
/// and when this process exits or dies by any signal, so no server outlives the tests.
/// A process's statics are never dropped; the pipe closes all the same.
pub struct Server {
    port: u16,
    child: Option<std::process::Child>,
    /// Arguments before `--port` (a configuration file).
    leading: Vec<String>,
    extra: Vec<String>,
}

impl Server {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A private server started with `extra` arguments too.
    pub fn start_with(extra: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Self::start_on(port, extra.iter().map(|a| (*a).to_owned()).collect())
    }

    /// A private server on `port` started with `extra` arguments too.
    pub fn start_on(port: u16, extra: Vec<String>) -> Self {
        Self::start_conf(port, Vec::new(), extra)
    }

    /// A private server on `port` started as `redis-server <leading> --port <port> ...
    /// <extra>` (a configuration file first, as `--sentinel` needs).
    pub fn start_conf(port: u16, leading: Vec<String>, extra: Vec<String>) -> Self {
        let mut s = Self {
            port,
            child: None,
            leading,
            extra,
        };
        s.ensure_running();
        s
    }

    /// Whether it runs (started and not stopped).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts the server unless it runs; waits until it answers.
    pub fn ensure_running(&mut self) {
        if self.child.is_some() {
            return;
        }
        static INSTALLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let installed = INSTALLED.get_or_init(|| {
            std::process::Command::new("redis-server")
                .arg("--version")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        assert!(*installed, "{INSTALL}");
        let child = std::process::Command::new("sh")
            .args([
                "-c",
                "redis-server \"$@\" & pid=$!; read -r _; kill -9 $pid; wait $pid 2>/dev/null",
                "sh",
            ])
            .args(&self.leading)
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(&self.extra)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("sh must run");
        self.child = Some(child);
        let client = redis::Client::open(self.url()).unwrap();
        for _ in 0..200 {
            if let Ok(mut c) =
                client.get_connection_with_timeout(std::time::Duration::from_millis(50))
            {
                // An answer, even NOAUTH from a server with a password, means it is up.
                match redis::cmd("PING").query::<String>(&mut c) {
                    Ok(_) => return,
                    Err(e) if !e.is_io_error() && !e.is_timeout() => return,
                    Err(_) => {}
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("redis-server on port {} did not start", self.port);
    }

    /// Kills the server (like a crash: nothing saved): closing the shell's stdin makes it
    /// `kill -9` the server and wait for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            drop(c.stdin.take());
            let _ = c.wait();
        }
    }

    /// A connection to it.
    pub fn connect(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection_with_timeout(std::time::Duration::from_secs(2))
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether this run soaks (`TOKENGATE_SOAK=1`): the fault scenarios repeat their faults
/// and run longer (each run checked like the first); by default each runs once, short.
pub fn soaking() -> bool {
    std::env::var("TOKENGATE_SOAK").is_ok_and(|v| v == "1")
}

/// `default`, or `soak` when [`soaking`].
pub fn runs<T>(default: T, soak: T) -> T {
    if soaking() { soak } else { default }
}

/// Waits until `done` holds, calling `between` after each miss (a decision that keeps the
/// pool busy, a sleep); fails the test with `what` once `within` has passed.
pub fn wait_until(
    what: &str,
    within: std::time::Duration,
    mut done: impl FnMut() -> bool,
    mut between: impl FnMut(),
) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(start.elapsed() < within, "{what} within {within:?}");
        between();
    }
}

/// Waits until `pool`'s breaker opens, deciding on `bucket` every 5 ms meanwhile (the
/// decisions wake the pool's thread, whose failed rounds open the breaker).
pub fn wait_unavailable(
    pool: &tokengate_redis::RedisPool,
    bucket: &tokengate_redis::RemoteBucket,
    within: std::time::Duration,
) {
    wait_until(
        "breaker never opened",
        within,
        || pool.is_unavailable(),
        || {
            let _ = bucket.try_acquire(1);
            std::thread::sleep(std::time::Duration::from_millis(5));
        },
    );
}

/// Decides `try_acquire(1)` on `bucket` for `d`, calling `refused` after each refusal (a
/// yield, a short sleep); returns how many were admitted.
pub fn drive(
    bucket: &tokengate_redis::RemoteBucket,
    d: std::time::Duration,
    mut refused: impl FnMut(),
) -> u64 {
    let end = std::time::Instant::now() + d;
    let mut n = 0;
    while std::time::Instant::now() < end {
        if bucket.try_acquire(1).is_ok() {
            n += 1;
        } else {
            refused();
        }
    }
    n
}

/// Wall-clock ns since the Unix epoch: every process on the host reads the same clock.
pub fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Decides `try_acquire(1)` on `bucket` for `d`, yielding after each refusal; logs each
/// admission as (wall ns before, wall ns after) into `log`.
pub fn drive_logged(
    bucket: &tokengate_redis::RemoteBucket,
    d: std::time::Duration,
    log: &mut Vec<(u64, u64)>,
) {
    let end = std::time::Instant::now() + d;
    while std::time::Instant::now() < end {
        let before = wall_ns();
        if bucket.try_acquire(1).is_ok() {
            log.push((before, wall_ns()));
        } else {
            std::thread::yield_now();
        }
    }
}

/// A TCP proxy to `upstream` that, once armed, swallows the next reply and closes the
/// connection.
pub fn lossy_proxy(upstream: u16, arm: std::sync::Arc<std::sync::atomic::AtomicBool>) -> u16 {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::Ordering;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let server = TcpStream::connect(("127.0.0.1", upstream)).unwrap();
            let (mut c_read, mut s_write) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = c_read.read(&mut buf) {
                    if n == 0 || s_write.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
            let (mut s_read, mut c_write) = (server, client);
            let arm = arm.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = s_read.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if arm.swap(false, Ordering::SeqCst) {
                        let _ = c_write.shutdown(std::net::Shutdown::Both);
                        let _ = s_read.shutdown(std::net::Shutdown::Both);
                        return;
                    }
                    if c_write.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// A loopback TCP proxy to `upstream` that loses the reply of each request carrying a
/// credit (an argument line equal to `credit`, the credit in units) the first time it sees
/// that request: it forwards the request, swallows the reply and closes the connection,
/// so the script ran and the client sends the same round again (which passes). Returns
/// its port and the count of replies lost.
pub fn credit_losing_proxy(
    upstream: u16,
    credit: &'static [u8],
) -> (u16, std::sync::Arc<AtomicU64>) {
    use std::io::{Read, Write};
    let lost = std::sync::Arc::new(AtomicU64::new(0));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(BTreeSet::<Vec<u8>>::new()));
    let count = lost.clone();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            let drop_next = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (mut c_read, mut s_write) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (seen, flag) = (seen.clone(), drop_next.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = c_read.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let carries = buf[..n]
                        .split(|&b| b == b'\n')
                        .any(|line| line.strip_suffix(b"\r").unwrap_or(line) == credit);
                    if carries && seen.lock().unwrap().insert(buf[..n].to_vec()) {
                        flag.store(true, Ordering::SeqCst);
                    }
                    if s_write.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
            let (mut s_read, mut c_write) = (server, client);
            let count = count.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = s_read.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if drop_next.swap(false, Ordering::SeqCst) {
                        count.fetch_add(1, Ordering::Relaxed);
                        let _ = c_write.shutdown(std::net::Shutdown::Both);
                        let _ = s_read.shutdown(std::net::Shutdown::Both);
                        return;
                    }
                    if c_write.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    (port, lost)
}
