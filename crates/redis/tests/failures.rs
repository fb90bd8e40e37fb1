//! Failures against real Redis servers: an instance killed while it holds leases, Redis
//! restarted and paused, a reply lost on the way back.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokengate_redis::script::{BucketKeys, Exchange, Scripts, Target, TimeSource};
use tokengate_redis::{Admitted, FailMode, PoolConfig, RedisPool, Refused, RemotePolicy};

fn drive(bucket: &tokengate_redis::RemoteBucket, d: Duration) -> u64 {
    common::drive(bucket, d, || std::thread::sleep(Duration::from_micros(200)))
}

/// A peek (writes nothing) on Redis's clock: outstanding tokens, with expired leases
/// reclaimed in the answer.
fn peek_outstanding(con: &mut redis::Connection, keys: &BucketKeys, policy: &RemotePolicy) -> u64 {
    Scripts::new(TimeSource::Redis)
        .exchange(
            con,
            &Target {
                keys,
                policy,
                lease_us: 0,
                keep_ms: 60_000,
            },
            &Exchange::default(),
            0,
        )
        .unwrap()
        .outstanding
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} must be set for a holder child"))
}

/// A child that takes leases, says so, and waits to be killed.
#[test]
#[ignore = "a holder child, started by instance_killed_holding_leases_strands_them_until_reclaim"]
fn holder_child() {
    let pool = RedisPool::connect(
        PoolConfig::new(env("TG_URL"), env("TG_NS"))
            .max_lease(10)
            .lease_ttl(Duration::from_millis(600))
            .grace(Duration::from_millis(50)),
    )
    .unwrap();
    let bucket = pool
        .bucket("global", RemotePolicy::new(40, 20.0).unwrap())
        .unwrap();
    let mut n = 0;
    while n < 12 {
        if bucket.try_acquire(1).is_ok() {
            n += 1;
        }
    }
    while bucket.leased_tokens() < 10 {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::fs::write(env("TG_OUT"), format!("{}", std::process::id())).unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn instance_killed_holding_leases_strands_them_until_reclaim() {
    let ns = common::namespace("kill");
    let policy = RemotePolicy::new(40, 20.0).unwrap();
    let keys = BucketKeys::new(&ns, "global").unwrap();
    let out = std::env::temp_dir().join(format!("{ns}.pid"));
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "holder_child", "--quiet"])
        .env("TG_URL", common::url())
        .env("TG_NS", &ns)
        .env("TG_OUT", &out)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    common::wait_until(
        "the holder never reported",
        Duration::from_secs(30),
        || out.exists(),
        || std::thread::sleep(Duration::from_millis(5)),
    );
    child.kill().unwrap(); // SIGKILL: nothing settled.
    child.wait().unwrap();
    let _ = std::fs::remove_file(&out);
    let mut con = common::connect();
    let leases: Vec<(String, u64)> = redis::cmd("ZRANGE")
        .arg(&keys.expiry)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut con)
        .unwrap();
    let held: u64 = redis::cmd("HGET")
        .arg(&keys.state)
        .arg("out")
        .query(&mut con)
        .unwrap();
    assert!(held >= 10, "the dead instance held {held}");
    // Stranded until their reclaim time: grant + ttl + grace on Redis's clock.
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
    let now_us = secs * 1_000_000 + micros;
    let last_reclaim = leases.iter().map(|(_, at)| *at).max().unwrap();
    assert!(
        last_reclaim <= now_us + 650_000,
        "a lease outlives ttl + grace: {last_reclaim} vs {now_us}"
    );
    assert_eq!(
        peek_outstanding(&mut con, &keys, &policy),
        held,
        "reclaimed before its time"
    );
    common::wait_until(
        "never reclaimed",
        Duration::from_secs(30),
        || peek_outstanding(&mut con, &keys, &policy) == 0,
        || std::thread::sleep(Duration::from_millis(20)),
    );
    // Reclaim credits nothing, but lifts the cap: refill brings the budget back to B, and a
    // survivor spends it (at most its own 2 L early-rejection slack short of B).
    std::thread::sleep(Duration::from_millis(40 * 1000 / 20 + 200));
    let pool = RedisPool::connect(PoolConfig::new(common::url(), ns).max_lease(10)).unwrap();
    let bucket = pool.bucket("global", policy).unwrap();
    let got = drive(&bucket, Duration::from_millis(150));
    assert!(got >= 40 - 20, "survivor admitted {got}");
    common::delete(&mut con, &keys);
}

#[test]
fn redis_restart_recreates_the_bucket_and_decisions_resume() {
    let mut server = common::Server::start();
    let policy = RemotePolicy::new(30, 20.0).unwrap();
    let pool = RedisPool::connect(
        PoolConfig::new(server.url(), "restart")
            .max_lease(5)
            .lease_ttl(Duration::from_millis(200))
            .exchange_timeout(Duration::from_millis(50))
            .connect_timeout(Duration::from_millis(50))
            .probe_backoff(Duration::from_millis(20), Duration::from_millis(100))
            .fail_mode(FailMode::FailClosed),
    )
    .unwrap();
    let bucket = pool.bucket("g", policy).unwrap();
    assert!(drive(&bucket, Duration::from_millis(300)) >= 30);
    server.stop();
    common::wait_unavailable(&pool, &bucket, Duration::from_secs(10));
    assert!(matches!(
        bucket.try_acquire(1),
        Err(Refused::Unavailable { .. })
    ));
    server.ensure_running();
    // Without persistence the bucket comes back full (Start::Full): scripts are reloaded
    // after NOSCRIPT, the breaker closes on a probe, and the new budget is spent once,
    // then refill at r.
    let start = Instant::now();
    let got = drive(&bucket, Duration::from_millis(800));
    let span = start.elapsed().as_secs_f64();
    assert!(!pool.is_unavailable());
    assert!(got >= 30, "not recreated full: {got}");
    assert!(got as f64 <= 30.0 + 20.0 * span + 1.0, "{got} in {span} s");
}

#[test]
fn client_pause_opens_the_breaker_and_decisions_never_wait_for_it() {
    let server = common::Server::start();
    let pool = RedisPool::connect(
        PoolConfig::new(server.url(), "pause")
            .max_lease(1000)
            .lease_ttl(Duration::from_secs(5))
            .exchange_timeout(Duration::from_millis(30))
            .connect_timeout(Duration::from_millis(30))
            .fail_mode(FailMode::FailOpen),
    )
    .unwrap();
    let bucket = pool
        .bucket("g", RemotePolicy::new(100_000, 1.0).unwrap())
        .unwrap();
    common::wait_until(
        "no lease of 1000",
        Duration::from_secs(10),
        || bucket.leased_tokens() >= 1000,
        || {
            let _ = bucket.try_acquire(1);
        },
    );
    let mut con = server.connect();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1500)
        .arg("ALL")
        .query(&mut con)
        .unwrap();
    // The lease is live: decisions pay from it while the pool's thread is stuck.
    let before = pool.round_trips();
    let live = bucket.leased_tokens();
    assert!(live >= 1000);
    for _ in 0..live {
        assert_eq!(bucket.try_acquire(1), Ok(Admitted::Leased));
    }
    common::wait_unavailable(&pool, &bucket, Duration::from_secs(10));
    assert_eq!(
        pool.round_trips(),
        before,
        "a round completed during the pause"
    );
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut con)
        .unwrap_or(());
}

#[test]
fn a_lost_grant_reply_retried_with_the_same_id_is_granted_once() {
    let server = common::Server::start();
    let arm = Arc::new(AtomicBool::new(false));
    let port = common::lossy_proxy(server.port(), arm.clone());
    let pool = RedisPool::connect(
        PoolConfig::new(format!("redis://127.0.0.1:{port}/"), "lost").max_lease(10),
    )
    .unwrap();
    arm.store(true, Ordering::SeqCst);
    let policy = RemotePolicy::new(100, 0.001).unwrap();
    let bucket = pool.bucket("g", policy).unwrap();
    common::wait_until(
        "no grant",
        Duration::from_secs(10),
        || bucket.leased_tokens() > 0,
        || std::thread::sleep(Duration::from_millis(1)),
    );
    assert!(!arm.load(Ordering::SeqCst), "the reply was not dropped");
    let keys = BucketKeys::new("lost", "g").unwrap();
    let mut con = server.connect();
    let leases: u64 = redis::cmd("HLEN")
        .arg(&keys.leases)
        .query(&mut con)
        .unwrap();
    let out: u64 = redis::cmd("HGET")
        .arg(&keys.state)
        .arg("out")
        .query(&mut con)
        .unwrap();
    assert_eq!((leases, out), (1, 10), "one grant of 10 tokens");
    assert_eq!(bucket.stats().grants, 1);
    assert_eq!(bucket.leased_tokens(), 10);
}

/// A refund's credit whose reply is lost after the script ran is sent again under its
/// id and credited once. (Without an id, a 40-token credit made the balance 80.)
#[test]
fn a_lost_credit_reply_retried_with_the_same_id_is_credited_once() {
    let server = common::Server::start();
    let arm = Arc::new(AtomicBool::new(false));
    let port = common::lossy_proxy(server.port(), arm.clone());
    let pool = RedisPool::connect(
        PoolConfig::new(format!("redis://127.0.0.1:{port}/"), "lost-credit").max_lease(10),
    )
    .unwrap();
    let policy = RemotePolicy::new(100, 0.001)
        .unwrap()
        .with_start(tokengate_redis::Start::Empty);
    let bucket = pool.bucket("g", policy).unwrap();
    // The first exchange creates the empty bucket and is refused.
    common::wait_until(
        "no first exchange",
        Duration::from_secs(10),
        || pool.exchanges() > 0,
        || std::thread::sleep(Duration::from_millis(1)),
    );
    let before = pool.exchanges();
    arm.store(true, Ordering::SeqCst);
    bucket.refund(40);
    common::wait_until(
        "the credit was never answered",
        Duration::from_secs(10),
        || !arm.load(Ordering::SeqCst) && pool.exchanges() > before,
        || {
            let _ = bucket.try_acquire(1);
            std::thread::sleep(Duration::from_millis(1));
        },
    );
    let keys = BucketKeys::new("lost-credit", "g").unwrap();
    let mut con = server.connect();
    let (u, out): (u64, u64) = redis::cmd("HMGET")
        .arg(&keys.state)
        .arg("u")
        .arg("out")
        .query(&mut con)
        .unwrap();
    // The 40 tokens are in the balance, or leased from it (and some spent since), with
    // less than one token refilled since.
    assert!(
        (40_000_000..41_000_000).contains(&(u + out * 1_000_000)),
        "balance {u} units + {out} out: the credit of 40 applied once"
    );
}

#[test]
fn live_leases_are_registered_again_after_redis_lost_its_state() {
    let mut server = common::Server::start();
    let pool = RedisPool::connect(
        PoolConfig::new(server.url(), "reregister")
            .max_lease(1000)
            .lease_ttl(Duration::from_secs(20))
            .exchange_timeout(Duration::from_millis(50))
            .connect_timeout(Duration::from_millis(50))
            .probe_backoff(Duration::from_millis(20), Duration::from_millis(50)),
    )
    .unwrap();
    let policy = RemotePolicy::new(3000, 0.001).unwrap();
    let bucket = pool.bucket("g", policy).unwrap();
    common::wait_until(
        "no lease",
        Duration::from_secs(10),
        || bucket.leased_tokens() >= 1000,
        || std::thread::sleep(Duration::from_millis(1)),
    );
    for _ in 0..10 {
        assert_eq!(bucket.try_acquire(1), Ok(Admitted::Leased));
    }
    server.stop();
    server.ensure_running();
    // A refund makes the pool exchange: Redis answers from a new bucket (a new epoch),
    // and the next round registers the live leases again.
    bucket.refund(1);
    let keys = BucketKeys::new("reregister", "g").unwrap();
    let mut con = server.connect();
    let live = bucket.leased_tokens();
    let start = Instant::now();
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "leases never registered"
        );
        let out: Option<u64> = redis::cmd("HGET")
            .arg(&keys.state)
            .arg("out")
            .query(&mut con)
            .unwrap();
        if out.is_some_and(|o| o > 0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let (u, out): (u64, u64) = redis::cmd("HMGET")
        .arg(&keys.state)
        .arg("u")
        .arg("out")
        .query(&mut con)
        .unwrap();
    assert_eq!(out, live, "registered what the instance can still spend");
    assert_eq!(
        u + out * 1_000_000,
        3000 * 1_000_000,
        "balance + outstanding = B"
    );
}

/// A refund made while the breaker is open is kept until Redis answers again, then
/// credited: rounds the breaker holds back do not drop their credits.
#[test]
fn a_refund_during_an_outage_is_credited_once_redis_is_back() {
    let mut server = common::Server::start();
    let pool = RedisPool::connect(
        PoolConfig::new(server.url(), "outage-refund")
            .max_lease(10)
            .exchange_timeout(Duration::from_millis(30))
            .connect_timeout(Duration::from_millis(30))
            .probe_backoff(Duration::from_millis(100), Duration::from_millis(200)),
    )
    .unwrap();
    let policy = RemotePolicy::new(100, 0.001)
        .unwrap()
        .with_start(tokengate_redis::Start::Empty);
    server.stop();
    let bucket = pool.bucket("g", policy).unwrap();
    bucket.refund(5);
    common::wait_until(
        "breaker never opened",
        Duration::from_secs(5),
        || pool.is_unavailable(),
        || std::thread::sleep(Duration::from_millis(2)),
    );
    // Several rounds planned while the breaker holds them back.
    std::thread::sleep(Duration::from_millis(60));
    server.ensure_running();
    let start = Instant::now();
    loop {
        let s = bucket.stats();
        // The empty bucket holds the 5 credited tokens, or a lease paid by them.
        if s.redis_balance + s.redis_outstanding == 5 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the credit was lost: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Spends `bucket` in one burst, counting what its local bucket admits (bounded).
fn local_burst(bucket: &tokengate_redis::RemoteBucket) -> u64 {
    let mut n = 0;
    while let Ok(how) = bucket.try_acquire(1) {
        assert_eq!(how, Admitted::Local, "a lease outlived its lifetime");
        n += 1;
        assert!(n <= bucket.policy().capacity(), "{n} admitted locally");
    }
    n
}

#[test]
fn local_fail_mode_splits_the_budget_by_the_fleet_redis_last_reported() {
    let mut server = common::Server::start();
    let ns = common::namespace("fleetk");
    let config = PoolConfig::new(server.url(), &ns)
        .max_lease(5)
        .lease_ttl(Duration::from_millis(200))
        .exchange_timeout(Duration::from_millis(30))
        .connect_timeout(Duration::from_millis(30))
        .probe_backoff(Duration::from_millis(20), Duration::from_millis(100))
        .fail_mode(FailMode::Local)
        // The hint: 8 instances. Redis will count 3, and 3 is what the shares use.
        .instances(8);
    let pools: Vec<RedisPool> = (0..3)
        .map(|_| RedisPool::connect(config.clone()).unwrap())
        .collect();
    // B = 100, r = 100/s: a share is floor(100/3) = 33 tokens refilled at 33.333/s (under
    // the hint's 8 it would be 12), starting empty.
    let policy = RemotePolicy::new(100, 100.0).unwrap();
    // B = 2 < K: a share rounds down to nothing, so its decisions are refused.
    let tiny = RemotePolicy::new(2, 100.0).unwrap();
    let buckets: Vec<_> = pools
        .iter()
        .map(|p| (p.bucket("g", policy).unwrap(), p.bucket("t", tiny).unwrap()))
        .collect();
    common::wait_until(
        "Redis never reported three instances",
        Duration::from_secs(5),
        || pools.iter().all(|p| p.instances_seen() == 3),
        || {
            for (b, _) in &buckets {
                let _ = b.try_acquire(1);
            }
            std::thread::sleep(Duration::from_millis(5));
        },
    );
    server.stop();
    common::wait_until(
        "breaker never opened",
        Duration::from_secs(5),
        || pools.iter().all(RedisPool::is_unavailable),
        || {
            // Only the pools still waiting for their breaker: a poke of one already
            // open would spend its local share before the count below.
            for ((b, t), pool) in buckets.iter().zip(&pools) {
                if !pool.is_unavailable() {
                    let _ = b.try_acquire(1);
                    let _ = t.try_acquire(1);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        },
    );
    // Every lease has expired (ttl 200 ms) and the local buckets, started empty, have
    // filled (33 tokens at 33.333/s: 1 s): only they decide now, a share each.
    std::thread::sleep(Duration::from_millis(1100));
    for ((bucket, tiny), pool) in buckets.iter().zip(&pools) {
        assert!(pool.is_unavailable());
        assert_eq!(pool.instances_seen(), 3);
        assert_eq!(bucket.leased_tokens(), 0);
        // 33, and one more only if the burst itself lasted a refill (30 ms).
        let burst = local_burst(bucket);
        assert!((33..=34).contains(&burst), "{burst} admitted locally");
        assert!(matches!(
            tiny.try_acquire(1),
            Err(Refused::Unavailable { .. })
        ));
    }
}

#[test]
fn the_configured_fleet_size_holds_until_redis_reports_one() {
    let pool = RedisPool::connect(
        PoolConfig::new(common::url(), common::namespace("fleethint")).instances(8),
    )
    .unwrap();
    // No bucket, so no exchange: the first heartbeat comes half a lease lifetime (1 s)
    // after the start.
    assert_eq!(pool.instances_seen(), 8);
    let start = Instant::now();
    common::wait_until(
        "an idle pool never reported itself",
        Duration::from_secs(5),
        || pool.instances_seen() == 1,
        || std::thread::sleep(Duration::from_millis(10)),
    );
    assert!(start.elapsed() >= Duration::from_millis(500));
}
