//! One instance against the Redis on 127.0.0.1:6379 (or `TOKENGATE_REDIS_URL`): decisions
//! per second, Redis round trips per 1,000 decisions, and p50/p99 decision latency, for
//! leases of 1, 10 and 100 tokens against a per-request Lua token bucket (one `EVALSHA`
//! per decision, the redis-cell / Redis-docs pattern) on the same server, and the
//! decision cost while a lease is live against a local `LeasedBucket`.
//!
//! `cargo bench -p tokengate-redis --bench remote` (prints a Markdown table).

use std::time::{Duration, Instant};

use tokengate::leased::LeaseConfig;
use tokengate::{LeasedBucket, Policy};
use tokengate_redis::{PoolConfig, RedisPool, RemoteBucket, RemotePolicy};

const RUN: Duration = Duration::from_millis(1500);

/// A per-request token bucket in Lua: refill from TIME, take `cost` or refuse.
const PER_REQUEST: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cap = tonumber(ARGV[1]); local rate = tonumber(ARGV[2]); local cost = tonumber(ARGV[3])
local s = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(s[1]) or cap
local ts = tonumber(s[2]) or now
if now > ts then tokens = math.min(cap, tokens + (now - ts) * rate / 1000000); ts = now end
if tokens >= cost then
  redis.call('HSET', KEYS[1], 'tokens', tokens - cost, 'ts', ts)
  return 1
end
return 0
";

fn url() -> String {
    std::env::var("TOKENGATE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned())
}

struct Row {
    name: String,
    decisions: u64,
    secs: f64,
    round_trips: u64,
    lat: Vec<u64>,
}

impl Row {
    fn print(&self, baseline: f64) {
        let mut lat = self.lat.clone();
        lat.sort_unstable();
        let q = |p: f64| {
            lat.get(((lat.len() as f64 - 1.0) * p) as usize)
                .copied()
                .unwrap_or(0)
        };
        let per_s = self.decisions as f64 / self.secs;
        println!(
            "| {} | {:.0} | {:.1} | {:.1} | {} | {} |",
            self.name,
            per_s,
            per_s / baseline,
            self.round_trips as f64 * 1000.0 / self.decisions.max(1) as f64,
            q(0.5),
            q(0.99),
        );
    }
}

/// Admitted decisions on one thread for `RUN`, each timed.
fn time_loop(mut decide: impl FnMut() -> bool) -> (u64, f64, Vec<u64>) {
    let start = Instant::now();
    let mut lat = Vec::with_capacity(1 << 22);
    let mut n = 0;
    while start.elapsed() < RUN {
        for _ in 0..64 {
            let t = Instant::now();
            let ok = decide();
            let ns = t.elapsed().as_nanos() as u64;
            if ok {
                n += 1;
                if lat.len() < lat.capacity() {
                    lat.push(ns);
                }
            }
        }
    }
    (n, start.elapsed().as_secs_f64(), lat)
}

fn per_request() -> Row {
    let mut con = redis::Client::open(url())
        .unwrap()
        .get_connection()
        .unwrap();
    let script = redis::Script::new(PER_REQUEST);
    let key = format!("tg-bench-per-request-{}", std::process::id());
    let (n, secs, lat) = time_loop(|| {
        script
            .key(&key)
            .arg(9_000_000)
            .arg(1_000_000)
            .arg(1)
            .invoke::<i64>(&mut con)
            .unwrap()
            == 1
    });
    let _: () = redis::cmd("DEL").arg(&key).query(&mut con).unwrap();
    Row {
        name: "per-request Lua bucket".into(),
        decisions: n,
        secs,
        round_trips: n,
        lat,
    }
}

fn depth() -> u64 {
    std::env::var("TG_DEPTH")
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(32)
}

/// A hot bucket (far more budget than a run spends) on a pool of `config`.
fn hot_bucket(config: PoolConfig, scope: &str) -> (RedisPool, RemoteBucket) {
    let pool = RedisPool::connect(config).unwrap();
    let bucket = pool
        .bucket(scope, RemotePolicy::new(9_000_000, 1_000_000.0).unwrap())
        .unwrap();
    (pool, bucket)
}

/// Times `decide` as [`time_loop`] does, counting `pool`'s round trips meanwhile.
fn pooled_row(name: String, pool: &RedisPool, decide: impl FnMut() -> bool) -> Row {
    let before = pool.round_trips();
    let (n, secs, lat) = time_loop(decide);
    Row {
        name,
        decisions: n,
        secs,
        round_trips: pool.round_trips() - before,
        lat,
    }
}

fn leased(lease: u64) -> Row {
    let (pool, bucket) = hot_bucket(
        PoolConfig::new(url(), format!("bench-{}", std::process::id()))
            .max_lease(lease)
            .lease_depth(depth()),
        &format!("l{lease}"),
    );
    pooled_row(format!("RemoteBucket, lease {lease}"), &pool, || {
        bucket.try_acquire(1).is_ok()
    })
}

fn engine_over_redis(lease: u64) -> Row {
    let (pool, remote) = hot_bucket(
        PoolConfig::new(url(), format!("bench-{}", std::process::id())).max_lease(lease),
        &format!("e{lease}"),
    );
    let bucket = remote.leased(LeaseConfig::new()).unwrap();
    pooled_row(
        format!("LeasedBucket over Redis, lease {lease}"),
        &pool,
        || bucket.try_acquire(1).is_ok_and(|d| d.is_admitted()),
    )
}

fn local() -> Row {
    let bucket = LeasedBucket::new(Policy::new(9_000_000, 1_000_000.0).unwrap());
    let (n, secs, lat) = time_loop(|| bucket.try_acquire(1).is_ok_and(|d| d.is_admitted()));
    Row {
        name: "local LeasedBucket (no Redis)".into(),
        decisions: n,
        secs,
        round_trips: 0,
        lat,
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let base = per_request();
    let base_rate = base.decisions as f64 / base.secs;
    println!(
        "| case | decisions/s | x per-request | round trips / 1,000 decisions | p50 ns | p99 ns |"
    );
    println!("|---|---|---|---|---|---|");
    base.print(base_rate);
    for lease in [1, 10, 100] {
        leased(lease).print(base_rate);
    }
    engine_over_redis(100).print(base_rate);
    local().print(base_rate);
}
