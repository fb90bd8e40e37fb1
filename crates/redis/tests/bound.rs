//! The bound `admitted(T) <= B + r*T` of one instance under schedules that are not steady,
//! checked by the ideal bucket of `common::ideal` on the admissions' wall-clock times.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokengate_redis::{FailMode, PoolConfig, RedisPool, RemotePolicy};
use tokengate_testkit::net::BlackHole;

/// One token taken, 900 ms of quiet while the instance holds its lease and Redis sits at
/// its cap `B - out`, then a burst: the settlement of the spent lease must not refill the
/// quiet time a second time. (Refilled after the settlement, 289 were admitted in 100 ms
/// where 210 are allowed.)
#[test]
fn a_burst_after_a_quiet_period_stays_within_b_plus_rt() {
    let (cap, rate) = (200, 100.0);
    let pool =
        RedisPool::connect(PoolConfig::new(common::url(), common::namespace("quiet"))).unwrap();
    let bucket = pool
        .bucket("global", RemotePolicy::new(cap, rate).unwrap())
        .unwrap();
    let mut log = Vec::new();
    common::wait_until(
        "the first token",
        Duration::from_secs(5),
        || {
            let before = common::wall_ns();
            let ok = bucket.try_acquire(1).is_ok();
            if ok {
                log.push((before, common::wall_ns()));
            }
            ok
        },
        || std::thread::sleep(Duration::from_millis(1)),
    );
    std::thread::sleep(Duration::from_millis(900));
    common::drive_logged(&bucket, Duration::from_millis(300), &mut log);
    common::ideal::assert_within(
        "quiet 900 ms then burst, one instance",
        &log,
        cap,
        100_000,
        0,
    );
}

/// Drives `bucket` from one thread until `stop`, logging admissions (sleeping 200 µs
/// after a refusal).
fn driver(
    bucket: tokengate_redis::RemoteBucket,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<(u64, u64)>> {
    std::thread::spawn(move || {
        let mut log = Vec::new();
        let end = std::time::Instant::now() + Duration::from_secs(30);
        while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < end {
            let before = common::wall_ns();
            if bucket.try_acquire(1).is_ok() {
                log.push((before, common::wall_ns()));
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        log
    })
}

/// Connects with [`outage_config`]'s 20 ms connect timeout, trying again (at most 50
/// times, 20 ms apart) when the first connection is not made in time: a busy machine can
/// take longer than that to accept it, and only the outages are what these tests time.
fn connect_for_outages(url: &str, ns: &str) -> RedisPool {
    let mut last = None;
    for _ in 0..50 {
        match RedisPool::connect(outage_config(url.to_owned(), ns)) {
            Ok(pool) => return pool,
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no connection to {url} in 50 tries: {last:?}");
}

fn outage_config(url: String, ns: &str) -> PoolConfig {
    PoolConfig::new(url, ns)
        .max_lease(5)
        .lease_ttl(Duration::from_millis(200))
        .exchange_timeout(Duration::from_millis(20))
        .connect_timeout(Duration::from_millis(20))
        .probe_backoff(Duration::from_millis(20), Duration::from_millis(60))
        .fail_mode(FailMode::Local)
}

/// A flapping server (paused 400 ms, then answering 200 ms, five times) under
/// [`FailMode::Local`]: the local bucket starts empty at each outage and lives until the
/// breaker closes after several successes, so every window, those straddling an outage's
/// end included, stays within `B + r*T` (Redis's leases) plus the local share's
/// `(B + r*T)/K` (here K = 1), whatever the number of flaps. (Local buckets rebuilt full
/// on each switch admitted `B/K` = 100 more per flap.)
#[test]
fn a_flapping_server_grants_no_budget_per_flap() {
    let server = common::Server::start();
    let (cap, rate_milli) = (100, 10_000);
    let pool = connect_for_outages(&server.url(), "flap");
    let bucket = pool
        .bucket("g", RemotePolicy::new(cap, 10.0).unwrap())
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let drive = driver(bucket.clone(), stop.clone());
    let mut con = server.connect();
    std::thread::sleep(Duration::from_millis(300));
    let mut local_seen = false;
    for _ in 0..5 {
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(400)
            .arg("ALL")
            .query(&mut con)
            .unwrap();
        std::thread::sleep(Duration::from_millis(600));
        local_seen |= bucket.stats().local_admitted > 0;
    }
    stop.store(true, Ordering::Relaxed);
    let log = drive.join().unwrap();
    assert!(
        local_seen && pool.round_trips() > 0,
        "the local bucket never decided: {:?}",
        bucket.stats()
    );
    // B + r*T from Redis, as much again from the local share (K = 1).
    common::ideal::assert_within(
        "flapping server, Local mode",
        &log,
        2 * cap,
        2 * rate_milli,
        1,
    );
}

/// A partial partition: one of three instances behind a proxy that black-holes while the
/// others reach Redis; all quiet until the cut-off one runs on its local share, then a
/// burst from all three. Bound `(1 + m/K)(B + r*T)` with m = 1, K = 3: the others spend
/// Redis's budget, the cut-off one its share `(B + r*T)/K` (started empty, it fills
/// during the outage).
#[test]
fn a_partial_partition_adds_at_most_the_cut_off_share_of_the_rate() {
    let server = common::Server::start();
    let (cap, rate) = (90, 30.0);
    let ns = common::namespace("partition");
    let proxy = BlackHole::to_port(server.port());
    let urls = [server.url(), server.url(), proxy.url()];
    let pools: Vec<RedisPool> = urls.iter().map(|u| connect_for_outages(u, &ns)).collect();
    let policy = RemotePolicy::new(cap, rate).unwrap();
    let buckets: Vec<_> = pools
        .iter()
        .map(|p| p.bucket("g", policy).unwrap())
        .collect();
    common::wait_until(
        "Redis never reported three instances",
        Duration::from_secs(5),
        || pools.iter().all(|p| p.instances_seen() == 3),
        || {
            for b in &buckets {
                let _ = b.try_acquire(1);
            }
            std::thread::sleep(Duration::from_millis(5));
        },
    );
    proxy.cut();
    common::wait_until(
        "the cut-off instance's breaker never opened",
        Duration::from_secs(5),
        || pools[2].is_unavailable(),
        || {
            let _ = buckets[2].try_acquire(1);
            std::thread::sleep(Duration::from_millis(2));
        },
    );
    // Its leases expire (ttl 200 ms) and Redis refills to B - out meanwhile.
    std::thread::sleep(Duration::from_millis(1_000));
    let stop = Arc::new(AtomicBool::new(false));
    let drives: Vec<_> = buckets
        .iter()
        .map(|b| driver(b.clone(), stop.clone()))
        .collect();
    std::thread::sleep(Duration::from_millis(1_500));
    stop.store(true, Ordering::Relaxed);
    let log: Vec<(u64, u64)> = drives.into_iter().flat_map(|d| d.join().unwrap()).collect();
    assert!(
        buckets[2].stats().local_admitted > 0,
        "{:?}",
        buckets[2].stats()
    );
    assert!(!pools[0].is_unavailable() && !pools[1].is_unavailable());
    // (1 + 1/3)(B + r*T): 120 tokens and 40 per second.
    common::ideal::assert_within("partial partition, 1 of 3 cut off", &log, 120, 40_000, 1);
}
