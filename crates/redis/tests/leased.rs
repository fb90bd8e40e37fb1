//! The engine's `LeasedBucket` over a `RemoteBucket` pool: per-core slots lease from the
//! local reservoir, which leases from Redis.

mod common;

use std::time::{Duration, Instant};

use tokengate::leased::LeaseConfig;
use tokengate_redis::{PoolConfig, RedisPool, RemotePolicy};

#[test]
fn leased_buckets_of_two_instances_spend_one_budget_exactly() {
    let ns = common::namespace("leased");
    let policy = RemotePolicy::new(60, 10.0).unwrap();
    let pools: Vec<_> = (0..2)
        .map(|_| {
            RedisPool::connect(PoolConfig::new(common::url(), ns.clone()).max_lease(8)).unwrap()
        })
        .collect();
    let buckets: Vec<_> = pools
        .iter()
        .map(|p| {
            p.bucket("g", policy)
                .unwrap()
                .leased(LeaseConfig::new().slots(2))
                .unwrap()
        })
        .collect();
    let start = Instant::now();
    let admitted: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = buckets
            .iter()
            .flat_map(|b| [b, b])
            .map(|b| {
                s.spawn(move || {
                    let end = Instant::now() + Duration::from_millis(900);
                    let mut n = 0;
                    while Instant::now() < end {
                        match b.try_acquire(1) {
                            Ok(d) if d.is_admitted() => n += 1,
                            Ok(_) => std::thread::sleep(Duration::from_micros(300)),
                            Err(e) => panic!("{e}"),
                        }
                    }
                    n
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    // Never above B + r*T; slot leftovers go back to Redis as credit and are leased again,
    // so the budget is spent to within what the instances still hold.
    let span = start.elapsed().as_secs_f64();
    let held: u64 = buckets.iter().map(|b| b.leased_tokens()).sum();
    eprintln!("admitted {admitted} in {span:.3} s, held {held}");
    assert!(admitted as f64 <= 60.0 + 10.0 * span, "{admitted}");
    assert!(
        admitted + held >= 60 + 9 - 2 * 2 * 8,
        "admitted {admitted}, held {held}"
    );
}

#[test]
fn a_leased_decision_never_touches_the_network() {
    let server = common::Server::start();
    let pool = RedisPool::connect(
        PoolConfig::new(server.url(), "pause")
            .max_lease(1000)
            .lease_ttl(Duration::from_secs(5))
            .exchange_timeout(Duration::from_millis(30)),
    )
    .unwrap();
    let remote = pool
        .bucket("g", RemotePolicy::new(100_000, 1.0).unwrap())
        .unwrap();
    let bucket = remote.leased(LeaseConfig::new().slots(1)).unwrap();
    common::wait_until(
        "no lease of 1000",
        Duration::from_secs(10),
        || remote.leased_tokens() >= 1000,
        || {
            let _ = bucket.try_acquire(1);
        },
    );
    let mut con = server.connect();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1000)
        .arg("ALL")
        .query(&mut con)
        .unwrap();
    let rounds = pool.round_trips();
    for _ in 0..500 {
        assert!(bucket.try_acquire(1).unwrap().is_admitted());
    }
    assert_eq!(pool.round_trips(), rounds);
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut con)
        .unwrap_or(());
}
