//! Every key the crate writes carries an expiry, after any sequence of calls: leased
//! buckets with leases out or not, credits, strict takes granted and refused (a fresh key
//! ahead of an exhausted one, fresh keys of a scope that starts empty), the fleet set.

mod common;

use std::time::Duration;

use tokengate_redis::{PoolConfig, RedisPool, RedisScopes, RemotePolicy, Start};

/// Every key of namespace `ns` with its `PTTL` (-1: no expiry).
fn keys_with_ttl(con: &mut redis::Connection, ns: &str) -> Vec<(String, i64)> {
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    for _ in 0..10_000 {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("tg:{{{ns}*"))
            .arg("COUNT")
            .arg(1000)
            .query(con)
            .unwrap();
        keys.extend(batch);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|k| {
            let ttl: i64 = redis::cmd("PTTL").arg(&k).query(con).unwrap();
            (k, ttl)
        })
        .collect()
}

#[test]
fn every_key_written_carries_an_expiry() {
    let ns = common::namespace("ttl");
    let config = PoolConfig::new(common::url(), &ns).max_lease(5);
    // Leased buckets: one holding leases when we look, one given back, one refunded.
    let pool = RedisPool::connect(config.clone()).unwrap();
    let held = pool
        .bucket("held", RemotePolicy::new(1000, 10.0).unwrap())
        .unwrap();
    let spent = pool
        .bucket("spent", RemotePolicy::new(20, 0.001).unwrap())
        .unwrap();
    common::wait_until(
        "no lease",
        Duration::from_secs(5),
        || held.leased_tokens() > 0,
        || std::thread::sleep(Duration::from_millis(1)),
    );
    let admitted = common::drive(&spent, Duration::from_millis(300), || {
        std::thread::sleep(Duration::from_micros(200))
    });
    assert_eq!(admitted, 20);
    spent.refund(3);
    // Strict takes: 200 fresh users ahead of an exhausted tenant (every take refused),
    // then 50 fresh keys of a scope that starts empty (refused too).
    let scopes = RedisScopes::connect(config).unwrap();
    let tenant = scopes
        .scope("tenant", RemotePolicy::new(1, 0.001).unwrap())
        .unwrap();
    let user = scopes
        .scope("user", RemotePolicy::new(5, 1.0).unwrap())
        .unwrap();
    let empty = scopes
        .scope(
            "empty",
            RemotePolicy::new(5, 1.0).unwrap().with_start(Start::Empty),
        )
        .unwrap();
    assert!(scopes.try_acquire("t", &[(&tenant, "acme", 1)]).is_ok());
    for i in 0..200 {
        let u = format!("u{i}");
        let got = scopes.try_acquire("t", &[(&user, u.as_str(), 1), (&tenant, "acme", 1)]);
        assert!(got.is_err(), "the tenant is exhausted: {got:?}");
    }
    for i in 0..50 {
        let k = format!("k{i}");
        assert!(scopes.try_acquire("t", &[(&empty, k.as_str(), 1)]).is_err());
    }
    // Let the refund's credit and a round of the pool through.
    std::thread::sleep(Duration::from_millis(100));
    let mut con = common::connect();
    let keys = keys_with_ttl(&mut con, &ns);
    let lasting: Vec<_> = keys.iter().filter(|(_, ttl)| *ttl < 0).collect();
    eprintln!("{} keys, {} without an expiry", keys.len(), lasting.len());
    assert!(keys.len() >= 250, "{} keys: {keys:?}", keys.len());
    assert!(
        keys.iter().any(|(k, _)| k.ends_with(":l")),
        "no lease key while leases are out: {keys:?}"
    );
    assert!(
        lasting.is_empty(),
        "{} of {} keys have no expiry, e.g. {:?}",
        lasting.len(),
        keys.len(),
        &lasting[..lasting.len().min(5)]
    );
    drop(pool);
}
