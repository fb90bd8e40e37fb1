//! A private Redis Cluster (3 primaries, each with a replica) and a private primary with a
//! replica watched by Sentinels, on free loopback ports. Every process is a [`Server`]:
//! killed on drop, and when the test process dies by any signal or panic.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};

use redis::Value;
use tokengate_redis::{FailMode, PoolConfig, RedisPool, RemotePolicy};

use super::Server;

/// A scratch directory for node and Sentinel files, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "tg-{what}-{}-{}",
            std::process::id(),
            super::wall_ns()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A free port whose cluster bus port (`port + 10000`) is free too.
fn cluster_port() -> u16 {
    for _ in 0..1000 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair for a cluster node");
}

fn connect(port: u16) -> redis::Connection {
    let c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("node {port}: {e}"));
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c
}

fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))?
        .get_connection_with_timeout(Duration::from_millis(500))
        .and_then(|mut c| {
            c.set_read_timeout(Some(Duration::from_secs(2)))?;
            cmd.query(&mut c)
        })
}

fn int(v: &Value) -> i64 {
    redis::from_redis_value_ref(v).unwrap()
}

/// A 3-primary, 3-replica cluster on loopback, `cluster-node-timeout` 500 ms.
pub struct Cluster {
    nodes: Vec<Server>,
    _dir: Scratch,
}

impl Cluster {
    /// Starts six nodes, joins them with `redis-cli --cluster create --cluster-replicas
    /// 1`, and waits until every node says `cluster_state:ok`.
    pub fn start() -> Self {
        let dir = Scratch::new("cluster");
        let nodes: Vec<Server> = (0..6)
            .map(|_| {
                let port = cluster_port();
                // Each node in its own directory: a replica writes the RDB it loads there.
                let at = dir.path(&format!("n{port}"));
                std::fs::create_dir_all(&at).unwrap();
                Server::start_on(
                    port,
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &format!("{at}/nodes.conf"),
                        "--cluster-node-timeout",
                        "500",
                        // Replicas in sync at once (the default waits 5 s for more).
                        "--repl-diskless-sync-delay",
                        "0",
                        "--dir",
                        &at,
                    ]
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect(),
                )
            })
            .collect();
        let status = std::process::Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())))
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("redis-cli must run");
        assert!(status.success(), "redis-cli --cluster create failed");
        let c = Self { nodes, _dir: dir };
        c.wait_ok(Duration::from_secs(30));
        c.wait_replicas_online(Duration::from_secs(30));
        c
    }

    /// Waits until every primary has a replica in sync (`state=online`).
    pub fn wait_replicas_online(&self, within: Duration) {
        let start = Instant::now();
        loop {
            let online = self.live().iter().all(|&p| {
                !self.is_primary(p)
                    || query::<String>(p, redis::cmd("INFO").arg("replication"))
                        .is_ok_and(|i| i.contains("state=online"))
            });
            if online {
                return;
            }
            assert!(
                start.elapsed() < within,
                "replicas not online within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis+cluster://` naming every node.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The ports of the nodes still running.
    pub fn live(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.is_running())
            .map(Server::port)
            .collect()
    }

    /// A connection to the node on `port`.
    pub fn connect(&self, port: u16) -> redis::Connection {
        connect(port)
    }

    /// Waits until every running node says `cluster_state:ok` and agrees on who serves
    /// every slot.
    pub fn wait_ok(&self, within: Duration) {
        let start = Instant::now();
        loop {
            let ok = self.live().iter().all(|&p| {
                query::<String>(p, redis::cmd("CLUSTER").arg("INFO"))
                    .is_ok_and(|i| i.contains("cluster_state:ok"))
            });
            let maps: Vec<_> = self.live().iter().map(|&p| self.slot_map(p)).collect();
            if ok && maps.windows(2).all(|w| w[0] == w[1]) && !maps[0].is_empty() {
                return;
            }
            assert!(start.elapsed() < within, "cluster not ok within {within:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// (first slot, last slot, primary port) as node `port` sees it, sorted.
    fn slot_map(&self, port: u16) -> Vec<(i64, i64, i64)> {
        let Ok(slots) = query::<Vec<Vec<Value>>>(port, redis::cmd("CLUSTER").arg("SLOTS")) else {
            return Vec::new();
        };
        let mut map: Vec<_> = slots
            .iter()
            .map(|s| {
                let primary: Vec<Value> = redis::from_redis_value_ref(&s[2]).unwrap();
                (int(&s[0]), int(&s[1]), int(&primary[1]))
            })
            .collect();
        map.sort_unstable();
        map
    }

    /// The slot of `key`.
    pub fn slot(&self, key: &str) -> u16 {
        query(
            self.live()[0],
            redis::cmd("CLUSTER").arg("KEYSLOT").arg(key),
        )
        .unwrap()
    }

    /// The port of the primary serving `slot`.
    pub fn primary_of(&self, slot: u16) -> u16 {
        let slot = i64::from(slot);
        let p = self.live()[0];
        self.slot_map(p)
            .iter()
            .find(|(a, b, _)| (*a..=*b).contains(&slot))
            .map(|m| m.2 as u16)
            .expect("every slot is served")
    }

    /// A running primary other than the one on `port`.
    pub fn other_primary(&self, port: u16) -> u16 {
        self.live()
            .into_iter()
            .find(|&p| p != port && self.is_primary(p))
            .expect("another primary")
    }

    /// The port of `primary`'s replica, once it is attached (within 10 s).
    pub fn replica_of(&self, primary: u16) -> u16 {
        for _ in 0..500 {
            let role: Vec<Value> = query(primary, &redis::cmd("ROLE")).unwrap();
            let replicas: Vec<Vec<Value>> = redis::from_redis_value_ref(&role[2]).unwrap();
            if let Some(r) = replicas.first() {
                let port: String = redis::from_redis_value_ref(&r[1]).unwrap();
                return port.parse().unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("primary {primary} has no replica attached");
    }

    /// Whether the node on `port` is a primary.
    pub fn is_primary(&self, port: u16) -> bool {
        query::<Vec<Value>>(port, &redis::cmd("ROLE"))
            .is_ok_and(|r| matches!(&r[0], Value::BulkString(b) if b == b"master"))
    }

    /// SIGKILLs the node on `port`.
    pub fn kill(&mut self, port: u16) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.port() == port) {
            n.stop();
        }
    }

    /// `CLUSTER FAILOVER FORCE` on the replica on `port`: it becomes primary without
    /// its primary's agreement, which goes on accepting writes until it learns.
    pub fn failover_force(&self, replica: u16) {
        let ok: String =
            query(replica, redis::cmd("CLUSTER").arg("FAILOVER").arg("FORCE")).unwrap();
        assert_eq!(ok, "OK");
    }

    fn id(port: u16) -> String {
        query(port, redis::cmd("CLUSTER").arg("MYID")).unwrap()
    }

    /// Moves `slot` from the primary on `from` to the one on `to` as `redis-cli --cluster
    /// reshard` does (IMPORTING, MIGRATING, MIGRATE key by key, SETSLOT NODE), pausing
    /// `pause` after opening the migration and between keys, so clients meet `ASK` and
    /// `TRYAGAIN` while it runs and `MOVED` after. Returns the keys moved.
    pub fn migrate_slot(&self, slot: u16, from: u16, to: u16, pause: Duration) -> usize {
        self.open_migration(slot, from, to);
        std::thread::sleep(pause);
        let moved = self.move_keys(slot, from, to, pause / 4);
        self.close_migration(slot, from, to);
        moved
    }

    fn setslot(port: u16, slot: u16, how: &str, id: &str) {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SETSLOT").arg(slot).arg(how).arg(id);
        let ok: String = query(port, &cmd).unwrap();
        assert_eq!(ok, "OK");
    }

    /// Marks `slot` IMPORTING on `to` and MIGRATING on `from`.
    pub fn open_migration(&self, slot: u16, from: u16, to: u16) {
        Self::setslot(to, slot, "IMPORTING", &Self::id(from));
        Self::setslot(from, slot, "MIGRATING", &Self::id(to));
    }

    /// MIGRATEs the keys of `slot` from `from` to `to` one at a time, `pause` between
    /// them; returns how many.
    pub fn move_keys(&self, slot: u16, from: u16, to: u16, pause: Duration) -> usize {
        let mut moved = 0;
        let mut con = connect(from);
        for _ in 0..10_000 {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(1)
                .query(&mut con)
                .unwrap();
            if keys.is_empty() {
                break;
            }
            let _: Value = redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(to)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys)
                .query(&mut con)
                .unwrap();
            moved += keys.len();
            std::thread::sleep(pause);
        }
        moved
    }

    /// Gives `slot` to `to` on every primary (`SETSLOT NODE`).
    pub fn close_migration(&self, slot: u16, from: u16, to: u16) {
        let to_id = Self::id(to);
        Self::setslot(to, slot, "NODE", &to_id);
        Self::setslot(from, slot, "NODE", &to_id);
        for p in self.live() {
            if p != from && p != to && self.is_primary(p) {
                Self::setslot(p, slot, "NODE", &to_id);
            }
        }
    }

    /// Whether the node on `port` holds `key`.
    pub fn holds(&self, port: u16, key: &str) -> bool {
        let mut con = connect(port);
        let _: () = redis::cmd("ASKING").query(&mut con).unwrap();
        redis::cmd("EXISTS")
            .arg(key)
            .query::<u64>(&mut con)
            .is_ok_and(|n| n == 1)
    }
}

/// A primary, its replica, and `n` Sentinels watching it as `tgm` (quorum 1).
pub struct Sentinels {
    pub primary: Server,
    pub replica: Server,
    pub sentinels: Vec<Server>,
    _dir: Scratch,
}

impl Sentinels {
    /// The primary's name the Sentinels know.
    pub const NAME: &'static str = "tgm";

    /// Starts the primary, its replica and `n` Sentinels; waits until the replica is in
    /// sync and every Sentinel sees it.
    pub fn start(n: usize) -> Self {
        let dir = Scratch::new("sentinel");
        // Each in its own directory: a replica writes the RDB it loads there.
        let node = |name: &str, mut extra: Vec<String>| {
            let at = dir.path(name);
            std::fs::create_dir_all(&at).unwrap();
            extra.extend([
                "--repl-diskless-sync-delay".into(),
                "0".into(),
                "--dir".into(),
                at,
            ]);
            Server::start_on(cluster_port(), extra)
        };
        let primary = node("primary", Vec::new());
        let replica = node(
            "replica",
            vec![
                "--replicaof".into(),
                "127.0.0.1".into(),
                primary.port().to_string(),
            ],
        );
        let sentinels = (0..n)
            .map(|_| {
                let port = cluster_port();
                let conf = dir.path(&format!("sentinel-{port}.conf"));
                std::fs::write(
                    &conf,
                    format!(
                        "sentinel monitor {name} 127.0.0.1 {p} 1\n\
                         sentinel down-after-milliseconds {name} 1000\n\
                         sentinel failover-timeout {name} 5000\n",
                        name = Self::NAME,
                        p = primary.port()
                    ),
                )
                .unwrap();
                Server::start_conf(
                    port,
                    vec![conf, "--sentinel".into()],
                    vec!["--dir".into(), dir.path("")],
                )
            })
            .collect();
        let s = Self {
            primary,
            replica,
            sentinels,
            _dir: dir,
        };
        let start = Instant::now();
        loop {
            let synced = query::<String>(s.replica.port(), redis::cmd("INFO").arg("replication"))
                .is_ok_and(|i| i.contains("master_link_status:up"));
            let seen = s.sentinels.iter().all(|x| {
                query::<Vec<Value>>(
                    x.port(),
                    redis::cmd("SENTINEL").arg("REPLICAS").arg(Self::NAME),
                )
                .is_ok_and(|r| !r.is_empty())
            });
            if synced && seen {
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the replica or the Sentinels were not ready within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `redis+sentinel://` naming every Sentinel and the primary.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+sentinel://{}/{}", hosts.join(","), Self::NAME)
    }

    /// The primary's port the first Sentinel names.
    pub fn named_primary(&self) -> u16 {
        let (_, port): (String, u16) = query(
            self.sentinels[0].port(),
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(Self::NAME),
        )
        .unwrap();
        port
    }

    /// `SENTINEL FAILOVER` through the first Sentinel, then waits until every Sentinel
    /// names the other node and the old primary follows it.
    pub fn failover(&self) {
        let old = self.named_primary();
        let new = if old == self.primary.port() {
            self.replica.port()
        } else {
            self.primary.port()
        };
        let ok: String = query(
            self.sentinels[0].port(),
            redis::cmd("SENTINEL").arg("FAILOVER").arg(Self::NAME),
        )
        .unwrap();
        assert_eq!(ok, "OK");
        let start = Instant::now();
        loop {
            let named = self.sentinels.iter().all(|x| {
                query::<(String, u16)>(
                    x.port(),
                    redis::cmd("SENTINEL")
                        .arg("get-master-addr-by-name")
                        .arg(Self::NAME),
                )
                .is_ok_and(|(_, p)| p == new)
            });
            let demoted = query::<Vec<Value>>(old, &redis::cmd("ROLE"))
                .is_ok_and(|r| matches!(&r[0], Value::BulkString(b) if b == b"slave"));
            let synced = query::<String>(old, redis::cmd("INFO").arg("replication"))
                .is_ok_and(|i| i.contains("master_link_status:up"));
            if named && demoted && synced {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the Sentinel failover did not finish within 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub const CAP: u64 = 200;
pub const RATE: u64 = 100;

pub fn config(url: &str, ns: &str) -> PoolConfig {
    PoolConfig::new(url, ns)
        .max_lease(5)
        .lease_ttl(Duration::from_secs(2))
        .grace(Duration::from_millis(50))
        .exchange_timeout(Duration::from_millis(100))
        .connect_timeout(Duration::from_millis(100))
        .probe_backoff(Duration::from_millis(20), Duration::from_millis(100))
        .fail_mode(FailMode::FailClosed)
}

/// What a fleet run gave.
pub struct Run {
    /// Admissions per bucket, (wall ns before, wall ns after).
    pub admissions: Vec<Vec<(u64, u64)>>,
    /// Tokens granted to the fleet while the fault ran (from its start until the
    /// cluster was whole again plus 300 ms), summed over the instances' pools.
    pub granted_in_fault: u64,
    /// Rounds that failed, over the instances.
    pub failed_rounds: u64,
    /// Admissions per bucket in the run's last second.
    pub last_second: Vec<usize>,
}

/// `k` instances, each a pool with `threads` threads offering far more than the budget
/// to every bucket of `scopes`, for `ms`; `fault` runs on this thread 1 s in and the
/// grants made from its start until it returns (plus 300 ms) are counted.
pub fn fleet(
    url: &str,
    ns: &str,
    scopes: &[String],
    (k, threads, ms): (usize, usize, u64),
    tune: impl Fn(PoolConfig) -> PoolConfig + Sync,
    fault: impl FnOnce(),
) -> Run {
    let group = Group {
        scopes,
        tune: &tune,
    };
    fleets(url, ns, &[group], (k, threads, ms), fault).remove(0)
}

/// Instances of one setting within [`fleets`]: their pools' settings, and their buckets.
pub struct Group<'a> {
    pub scopes: &'a [String],
    pub tune: &'a (dyn Fn(PoolConfig) -> PoolConfig + Sync),
}

/// [`fleet`] for several groups at once, through one fault: `k` instances per group, each
/// group on its own buckets and settings; a run per group.
pub fn fleets(
    url: &str,
    ns: &str,
    groups: &[Group<'_>],
    (k, threads, ms): (usize, usize, u64),
    fault: impl FnOnce(),
) -> Vec<Run> {
    let policy = RemotePolicy::new(CAP, RATE as f64).unwrap();
    // Per group, per bucket: the admissions, (wall ns before, wall ns after).
    type Log = Mutex<Vec<(u64, u64)>>;
    let logs: Vec<Vec<Log>> = groups
        .iter()
        .map(|g| g.scopes.iter().map(|_| Mutex::new(Vec::new())).collect())
        .collect();
    let all = k * groups.len();
    let ready = Barrier::new(all + 1);
    let sample = Barrier::new(all + 1);
    let sampled = Barrier::new(all + 1);
    let granted: Vec<Mutex<u64>> = groups.iter().map(|_| Mutex::new(0)).collect();
    let failed: Vec<Mutex<u64>> = groups.iter().map(|_| Mutex::new(0)).collect();
    let end = AtomicU64::new(super::wall_ns() + 60_000_000_000);
    std::thread::scope(|s| {
        for (g, group) in groups.iter().enumerate() {
            for _ in 0..k {
                let (logs, granted, failed) = (&logs[g], &granted[g], &failed[g]);
                let (ready, sample, sampled, end) = (&ready, &sample, &sampled, &end);
                s.spawn(move || {
                    let pool = RedisPool::connect((group.tune)(config(url, ns))).unwrap();
                    let buckets: Vec<_> = group
                        .scopes
                        .iter()
                        .map(|sc| pool.bucket(sc, policy).unwrap())
                        .collect();
                    let grants = || {
                        buckets
                            .iter()
                            .map(|b| b.stats().granted_tokens)
                            .sum::<u64>()
                    };
                    ready.wait();
                    std::thread::scope(|t| {
                        for _ in 0..threads {
                            t.spawn(|| {
                                let mut mine: Vec<Vec<(u64, u64)>> =
                                    buckets.iter().map(|_| Vec::new()).collect();
                                while super::wall_ns() < end.load(Ordering::Relaxed) {
                                    let mut any = false;
                                    for (i, b) in buckets.iter().enumerate() {
                                        let before = super::wall_ns();
                                        if b.try_acquire(1).is_ok() {
                                            mine[i].push((before, super::wall_ns()));
                                            any = true;
                                        }
                                    }
                                    if !any {
                                        std::thread::sleep(Duration::from_micros(300));
                                    }
                                }
                                for (i, m) in mine.into_iter().enumerate() {
                                    logs[i].lock().unwrap().extend(m);
                                }
                            });
                        }
                        sample.wait();
                        let g0 = grants();
                        sampled.wait();
                        sample.wait();
                        *granted.lock().unwrap() += grants() - g0;
                        sampled.wait();
                    });
                    *failed.lock().unwrap() += pool.failed_rounds();
                });
            }
        }
        ready.wait();
        let start = super::wall_ns();
        std::thread::sleep(Duration::from_secs(1));
        sample.wait();
        sampled.wait();
        fault();
        std::thread::sleep(Duration::from_millis(300));
        sample.wait();
        sampled.wait();
        let done = (super::wall_ns() + 1_500_000_000).max(start + ms * 1_000_000);
        end.store(done, Ordering::Relaxed);
    });
    logs.into_iter()
        .zip(granted.into_iter().zip(failed))
        .map(|(logs, (granted, failed))| {
            let admissions: Vec<Vec<(u64, u64)>> =
                logs.into_iter().map(|l| l.into_inner().unwrap()).collect();
            let last_second = admissions
                .iter()
                .map(|a| {
                    let last = a.iter().map(|x| x.1).max().unwrap_or(0);
                    a.iter().filter(|x| x.0 + 1_000_000_000 >= last).count()
                })
                .collect();
            Run {
                admissions,
                granted_in_fault: granted.into_inner().unwrap(),
                failed_rounds: failed.into_inner().unwrap(),
                last_second,
            }
        })
        .collect()
}

impl Run {
    /// The slack a failover's check allows: none with `WAIT` (a replica acknowledged
    /// every grant), else the tokens granted while the fault ran (the lost-grant term).
    pub fn slack(&self, wait: bool) -> u64 {
        if wait { 0 } else { self.granted_in_fault }
    }

    /// Prints what the run gave and checks each bucket: every window within
    /// `B + r*T + slack` (the ideal bucket of `common::ideal`), and at least half the rate
    /// admitted in the run's last second (the fleet reached its buckets again after the
    /// fault).
    pub fn check(&self, what: &str, slack: u64) {
        for (i, adm) in self.admissions.iter().enumerate() {
            eprintln!(
                "{what}, bucket {i}: over-admission {} (term: {} tokens granted during the \
                 fault), {} failed rounds, {} admitted in the last second",
                over_admission(adm),
                self.granted_in_fault,
                self.failed_rounds,
                self.last_second[i]
            );
            super::ideal::assert_within(
                &format!("{what}, bucket {i}"),
                adm,
                CAP,
                RATE * 1000,
                slack,
            );
            assert!(
                self.last_second[i] as u64 >= RATE / 2,
                "{what}: bucket {i} admitted {} in the last second",
                self.last_second[i]
            );
        }
    }
}

/// [`fleets`] of two groups through one fault, each on its own bucket: instances on
/// `scopes[0]` that do not wait for a replica and instances on `scopes[1]` that do
/// ([`with_wait`]); their runs in that order.
pub fn fleets_without_and_with_wait(
    url: &str,
    ns: &str,
    scopes: &[String; 2],
    sizes: (usize, usize, u64),
    fault: impl FnOnce(),
) -> Vec<Run> {
    let (plain, waiting) = (with_wait(false), with_wait(true));
    let groups = [
        Group {
            scopes: &scopes[..1],
            tune: &plain,
        },
        Group {
            scopes: &scopes[1..],
            tune: &waiting,
        },
    ];
    fleets(url, ns, &groups, sizes, fault)
}

/// `cfg` waiting for one replica's acknowledgement (20 ms) when `wait`.
pub fn with_wait(wait: bool) -> impl Fn(PoolConfig) -> PoolConfig + Sync {
    move |cfg| {
        if wait {
            cfg.wait_for_replicas(1, Duration::from_millis(20))
        } else {
            cfg
        }
    }
}

/// The most any window exceeded `B + r*w` by (0 when none did).
pub fn over_admission(adm: &[(u64, u64)]) -> u64 {
    super::ideal::worst_windows(adm, CAP, RATE * 1000, 0)
        .iter()
        .map(|w| w.admitted.saturating_sub(w.bound))
        .max()
        .unwrap_or(0)
}
