//! `RedisPool` and `RemoteBucket` against a real Redis: leases, the budget, start-up errors.

mod common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use tokengate_redis::{
    Admitted, FailMode, PoolConfig, PoolError, RedisPool, Refused, RemotePolicy,
};

fn config(test: &str) -> PoolConfig {
    PoolConfig::new(common::url(), common::namespace(test))
}

/// Spins on `try_acquire(1)` for `d`, counting admissions.
fn drive(bucket: &tokengate_redis::RemoteBucket, d: Duration) -> u64 {
    common::drive(bucket, d, std::thread::yield_now)
}

#[test]
fn one_instance_spends_the_whole_budget_and_no_more() {
    let pool = RedisPool::connect(config("whole").max_lease(10)).unwrap();
    let bucket = pool
        .bucket("global", RemotePolicy::new(50, 0.001).unwrap())
        .unwrap();
    let admitted = drive(&bucket, Duration::from_millis(400));
    // B + r*T with r*T < 1 token: exactly the capacity.
    assert_eq!(admitted, 50);
    // Leases of at most L = 10: five grants at least (several may share a round trip).
    let stats = bucket.stats();
    assert!(stats.grants >= 5, "{stats:?}");
    assert!(stats.granted_tokens <= 10 * stats.grants, "{stats:?}");
    assert!(matches!(
        bucket.try_acquire(1),
        Err(Refused::Rejected { .. })
    ));
}

/// A thread spending as fast as it can runs dry every round: the pool asks several grants
/// per round trip (one per round would cap it at one lease per round trip), and
/// never holds more than the depth's `d` leases of at most `L`.
#[test]
fn a_hot_thread_gets_several_leases_per_round_trip_and_at_most_the_depth() {
    let pool = RedisPool::connect(config("deep").max_lease(10).lease_depth(4)).unwrap();
    let bucket = pool
        .bucket("g", RemotePolicy::new(1_000_000, 1_000_000.0).unwrap())
        .unwrap();
    let end = Instant::now() + Duration::from_millis(400);
    let (mut most, mut admitted) = (0, 0u64);
    while Instant::now() < end {
        for _ in 0..64 {
            admitted += u64::from(bucket.try_acquire(1).is_ok());
        }
        most = most.max(bucket.leased_tokens());
    }
    let stats = bucket.stats();
    let rounds = pool.round_trips();
    eprintln!(
        "{admitted} admitted, {} grants in {rounds} round trips, at most {most} held",
        stats.grants
    );
    assert!(most <= 4 * 10, "held {most} > d * L = 40");
    // Rounds carry several grants (how many depends on when the thread runs; one
    // grant per round would give at most as many grants as round trips).
    assert!(
        stats.grants > rounds,
        "{} grants in {rounds} round trips",
        stats.grants
    );
    assert_eq!(admitted, stats.leased_admitted);
}

/// A thread deciding 50 times a second takes leases sized from that rate (a quarter of the
/// ttl's worth, a few tokens), not whole leases of `L`: the first lease (before the rate is
/// known) is whole, the later ones small.
#[test]
fn a_slow_instance_takes_leases_sized_from_its_rate() {
    let pool = RedisPool::connect(
        config("slow")
            .max_lease(100)
            .lease_ttl(Duration::from_millis(200)),
    )
    .unwrap();
    let bucket = pool
        .bucket("g", RemotePolicy::new(100_000, 100_000.0).unwrap())
        .unwrap();
    let start = Instant::now();
    for i in 0..50u32 {
        let at = start + Duration::from_millis(20) * i;
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        let _ = bucket.try_acquire(1);
    }
    let stats = bucket.stats();
    eprintln!("{} grants, {} tokens", stats.grants, stats.granted_tokens);
    assert!(stats.grants >= 2, "{stats:?}");
    // Whole leases would grant 100 each.
    assert!(
        stats.granted_tokens <= 100 + 50 * (stats.grants - 1),
        "{stats:?}"
    );
}

#[test]
fn two_pools_share_one_budget() {
    let ns = common::namespace("share");
    let policy = RemotePolicy::new(60, 0.001).unwrap();
    let a = RedisPool::connect(PoolConfig::new(common::url(), ns.clone()).max_lease(7)).unwrap();
    let b = RedisPool::connect(PoolConfig::new(common::url(), ns).max_lease(7)).unwrap();
    let (ba, bb) = (
        a.bucket("g", policy).unwrap(),
        b.bucket("g", policy).unwrap(),
    );
    // Both hold their first lease before the drive: a thread spending as fast as it can
    // could otherwise take the whole burst before the other pool's first round.
    common::wait_until(
        "no first lease",
        Duration::from_secs(5),
        || ba.leased_tokens() > 0 && bb.leased_tokens() > 0,
        || std::thread::sleep(Duration::from_millis(1)),
    );
    let (na, nb) = std::thread::scope(|s| {
        let ha = s.spawn(|| drive(&ba, Duration::from_millis(500)));
        let hb = s.spawn(|| drive(&bb, Duration::from_millis(500)));
        (ha.join().unwrap(), hb.join().unwrap())
    });
    assert_eq!(na + nb, 60, "{na} + {nb}");
    assert!(na > 0 && nb > 0, "{na} + {nb}");
}

#[test]
fn a_cost_above_the_largest_lease_is_refused_with_the_range() {
    let pool = RedisPool::connect(config("cost").max_lease(10)).unwrap();
    let bucket = pool
        .bucket("g", RemotePolicy::new(50, 1.0).unwrap())
        .unwrap();
    assert_eq!(
        bucket.try_acquire(11),
        Err(Refused::Cost { cost: 11, max: 10 })
    );
    assert_eq!(
        bucket.try_acquire(0),
        Err(Refused::Cost { cost: 0, max: 10 })
    );
}

#[test]
fn a_refund_returns_to_the_shared_budget() {
    let pool = RedisPool::connect(config("refund").max_lease(5)).unwrap();
    let bucket = pool
        .bucket("g", RemotePolicy::new(20, 0.001).unwrap())
        .unwrap();
    assert_eq!(drive(&bucket, Duration::from_millis(300)), 20);
    bucket.refund(3);
    assert_eq!(drive(&bucket, Duration::from_millis(300)), 3);
}

#[test]
fn a_closed_port_is_a_typed_error_within_the_connect_timeout() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err =
        RedisPool::connect(PoolConfig::new(format!("redis://127.0.0.1:{port}/"), "x")).unwrap_err();
    assert!(matches!(err, PoolError::Unreachable { .. }), "{err}");
}

#[test]
fn a_listener_that_never_answers_is_a_typed_error_not_a_hang() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // A watchdog, not a measurement: a connect that hung would never send.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let start = Instant::now();
        let r = RedisPool::connect(
            PoolConfig::new(format!("redis://127.0.0.1:{port}/"), "x")
                .connect_timeout(Duration::from_millis(200))
                .exchange_timeout(Duration::from_millis(100)),
        );
        // Printed, not asserted: within connect + exchange timeouts (300 ms); it took
        // twice the connect timeout (400 ms) while the client sent CLIENT SETINFO.
        eprintln!("failed after {:?}", start.elapsed());
        let _ = tx.send(r.map(drop));
    });
    let err = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("connect hung")
        .unwrap_err();
    // The exchange timeout applied (the setup's first read), not the connect timeout
    // twice.
    assert!(
        matches!(err, PoolError::Unreachable { timeout, .. } if timeout == Duration::from_millis(100)),
        "{err}"
    );
    drop(listener);
}

/// A cluster-mode server is refused at start with a typed error, not a breaker that
/// never closes.
#[test]
fn a_cluster_mode_server_is_a_typed_error_at_start() {
    let dir = std::env::temp_dir().join(common::namespace("cluster"));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("nodes.conf");
    let server = common::Server::start_with(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        conf.to_str().unwrap(),
    ]);
    let err = RedisPool::connect(PoolConfig::new(server.url(), "x")).unwrap_err();
    assert!(matches!(err, PoolError::Cluster { .. }), "{err}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The URL's password shows neither in the configuration's `Debug` nor in any error:
/// a wrong password, a closed port.
#[test]
fn the_password_never_shows_in_debug_or_errors() {
    let server = common::Server::start_with(&["--requirepass", "right-pw"]);
    let wrong = format!("redis://:s3cret-pw@127.0.0.1:{}/", server.port());
    let config = PoolConfig::new(&wrong, "x");
    assert!(!format!("{config:?}").contains("s3cret"), "{config:?}");
    let err = RedisPool::connect(config).unwrap_err();
    assert!(matches!(err, PoolError::Auth { .. }), "{err}");
    for shown in [format!("{err}"), format!("{err:?}")] {
        assert!(!shown.contains("s3cret"), "{shown}");
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let closed = format!("redis://user:s3cret-pw@127.0.0.1:{port}/");
    let err = RedisPool::connect(PoolConfig::new(closed, "x")).unwrap_err();
    assert!(matches!(err, PoolError::Unreachable { .. }), "{err}");
    for shown in [format!("{err}"), format!("{err:?}")] {
        assert!(
            !shown.contains("s3cret") && shown.contains("***"),
            "{shown}"
        );
    }
    let right = format!("redis://:right-pw@127.0.0.1:{}/", server.port());
    assert!(RedisPool::connect(PoolConfig::new(right, "x")).is_ok());
}

#[test]
fn settings_out_of_range_are_refused_with_the_range() {
    let err = RedisPool::connect(config("cfg").max_lease(0)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid pool setting: max_lease must be 1 ..= 16,777,215 tokens, got 0"
    );
    for depth in [1, 65] {
        let err = RedisPool::connect(config("cfg").lease_depth(depth)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("invalid pool setting: lease_depth must be 2 ..= 64 leases, got {depth}")
        );
    }
    let err = RedisPool::connect(PoolConfig::new("nota url", "x")).unwrap_err();
    assert!(matches!(err, PoolError::Url { .. }), "{err}");
    let pool = RedisPool::connect(config("scope")).unwrap();
    assert!(matches!(
        pool.bucket("a{b", RemotePolicy::new(1, 1.0).unwrap()),
        Err(PoolError::Scope(_))
    ));
}

#[test]
fn fail_modes_answer_once_the_breaker_opens() {
    // A pool whose Redis goes away: a private server we stop.
    let mut server = common::Server::start();
    for (mode, check) in [
        (FailMode::FailClosed, 0),
        (FailMode::FailOpen, 1),
        (FailMode::Local, 2),
    ] {
        server.ensure_running();
        let pool = RedisPool::connect(
            PoolConfig::new(server.url(), common::namespace("fail"))
                .max_lease(5)
                .lease_ttl(Duration::from_millis(100))
                .exchange_timeout(Duration::from_millis(30))
                .connect_timeout(Duration::from_millis(30))
                .fail_mode(mode)
                .instances(2),
        )
        .unwrap();
        let bucket = pool
            .bucket("g", RemotePolicy::new(1000, 1000.0).unwrap())
            .unwrap();
        assert!(drive(&bucket, Duration::from_millis(100)) > 0);
        server.stop();
        common::wait_unavailable(&pool, &bucket, Duration::from_secs(5));
        // The lease has expired (ttl 100 ms) by the time three rounds failed; a local
        // bucket, started empty, is full after B/r = 1 s.
        std::thread::sleep(Duration::from_millis(if check == 2 { 1100 } else { 120 }));
        let got = bucket.try_acquire(1);
        match check {
            0 => assert!(matches!(got, Err(Refused::Unavailable { .. })), "{got:?}"),
            1 => assert_eq!(got, Ok(Admitted::FailOpen)),
            _ => {
                assert_eq!(got, Ok(Admitted::Local));
                // Redis counted this one instance, not the configured 2: B/1 = 1000
                // tokens locally once filled, then rejections.
                assert_eq!(pool.instances_seen(), 1);
                let mut n = 1;
                while bucket.try_acquire(1).is_ok() {
                    n += 1;
                    assert!(n < 2000);
                }
                assert!((1000..=1020).contains(&n), "{n}");
            }
        }
    }
}

#[test]
fn a_huge_refund_is_capped_at_the_capacity() {
    let pool = RedisPool::connect(config("bigrefund").max_lease(5)).unwrap();
    let bucket = pool
        .bucket("g", RemotePolicy::new(20, 0.001).unwrap())
        .unwrap();
    assert_eq!(drive(&bucket, Duration::from_millis(300)), 20);
    bucket.refund(u64::MAX);
    bucket.refund(u64::MAX);
    // Never above B: the credit stops at B - outstanding.
    assert_eq!(drive(&bucket, Duration::from_millis(400)), 20);
    assert!(!pool.is_unavailable());
}

#[test]
fn several_buckets_exchange_in_one_round_trip() {
    let pool = RedisPool::connect(config("batch").max_lease(5)).unwrap();
    let policy = RemotePolicy::new(10, 0.001).unwrap();
    let buckets: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|s| pool.bucket(s, policy).unwrap())
        .collect();
    for b in &buckets {
        assert_eq!(drive(b, Duration::from_millis(200)), 10);
    }
    std::thread::sleep(Duration::from_millis(50));
    let (rt, ex) = (pool.round_trips(), pool.exchanges());
    // Three refunds between two of the thread's rounds: credited in one pipeline.
    for b in &buckets {
        b.refund(2);
    }
    for b in &buckets {
        assert_eq!(drive(b, Duration::from_millis(200)), 2);
    }
    let (rounds, exchanges) = (pool.round_trips() - rt, pool.exchanges() - ex);
    assert!(exchanges >= 3, "{exchanges}");
    assert!(
        rounds < exchanges,
        "{rounds} round trips for {exchanges} exchanges"
    );
}
