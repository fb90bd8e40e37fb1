//! The pool and strict scopes finding their primary through Sentinel: a primary, its
//! replica and three Sentinels started by the test on free loopback ports; a failover
//! through Sentinel (`SENTINEL FAILOVER`) while a fleet runs, followed by reconnection to
//! the new primary; the fleet's admissions checked by the ideal bucket of
//! `common::ideal`; and the typed errors of a Sentinel setup that cannot work.

mod common;

use std::time::Duration;

use common::cluster::{Sentinels, config, fleets_without_and_with_wait};
use tokengate_redis::{PoolError, RedisPool, RedisScopes, RemotePolicy, StrictAdmitted};

fn state_ts(port: u16, key: &str) -> Option<u64> {
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap();
    redis::cmd("HGET")
        .arg(key)
        .arg("ts")
        .query(&mut con)
        .unwrap()
}

#[test]
fn the_fleet_finds_its_primary_through_sentinel_and_follows_a_sentinel_failover() {
    let s = Sentinels::start(3);
    let url = s.url();
    let ns = common::namespace("sentinel-strict");
    assert_eq!(s.named_primary(), s.primary.port());
    // Strict scopes through Sentinel, before and after the failover.
    let strict = RedisScopes::connect(config(&url, &ns)).unwrap();
    let tenant = strict
        .scope("tenant", RemotePolicy::new(1000, 0.001).unwrap())
        .unwrap();
    assert_eq!(
        strict.try_acquire("acme", &[(&tenant, "acme", 1)]),
        Ok(StrictAdmitted::Taken)
    );
    // Each failover with both settings at once: three instances without WAIT and three
    // with it, each group on its own bucket. Once (the first primary to its replica);
    // three times, back and forth, with TOKENGATE_SOAK=1.
    for _ in 0..common::runs(1, 3) {
        let old = s.named_primary();
        let new = if old == s.primary.port() {
            s.replica.port()
        } else {
            s.primary.port()
        };
        let ns = common::namespace("sentinel");
        let scopes = ["global".to_owned(), "waited".to_owned()];
        let keys = scopes.each_ref().map(|sc| format!("tg:{{{ns}:{sc}}}"));
        let mut before = [None, None];
        let runs = fleets_without_and_with_wait(&url, &ns, &scopes, (3, 2, 4000), || {
            before = keys.each_ref().map(|k| state_ts(old, k));
            s.failover();
        });
        assert_eq!(s.named_primary(), new);
        for (i, wait) in [false, true].into_iter().enumerate() {
            let before = before[i].expect("the pool did not write on the primary Sentinel named");
            // Reconnected: the bucket's state on the new primary moved on after the
            // failover.
            let after = state_ts(new, &keys[i]).expect("no state on the new primary");
            assert!(
                after > before,
                "wait {wait}: no exchange reached the new primary"
            );
            runs[i].check(
                &format!("Sentinel failover, wait {wait}"),
                runs[i].slack(wait),
            );
        }
    }
    // The strict scopes reconnect through Sentinel as well (the first call after the
    // failover may meet the demoted primary and fail; the next asks the Sentinels).
    common::wait_until(
        "strict scopes never reached the new primary",
        Duration::from_secs(10),
        || strict.try_acquire("acme", &[(&tenant, "acme", 1)]) == Ok(StrictAdmitted::Taken),
        || std::thread::sleep(Duration::from_millis(50)),
    );
}

#[test]
fn a_sentinel_setup_that_cannot_work_is_a_typed_error() {
    let s = Sentinels::start(1);
    let ns = common::namespace("sentinel-errors");
    // A name no Sentinel knows.
    let sentinel = s.sentinels[0].port();
    let unknown = format!("redis+sentinel://127.0.0.1:{sentinel}/nosuch");
    match RedisPool::connect(config(&unknown, &ns)) {
        Err(PoolError::Sentinel { master, detail }) => {
            assert_eq!(master, "nosuch");
            assert!(detail.contains("does not know it"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    // No Sentinel answers (a closed port).
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis+sentinel://127.0.0.1:{closed}/{}", Sentinels::NAME);
    assert!(
        matches!(
            RedisPool::connect(config(&url, &ns)),
            Err(PoolError::Sentinel { .. })
        ),
        "a closed Sentinel port"
    );
    // A URL without the primary's name, with a password that never shows.
    let url = format!("redis+sentinel://:s3cret@127.0.0.1:{sentinel}");
    match RedisScopes::connect(config(&url, &ns)) {
        Err(e @ PoolError::Url { .. }) => {
            let shown = format!("{e} {e:?}");
            assert!(
                shown.contains("name is missing") && !shown.contains("s3cret"),
                "{shown}"
            );
        }
        other => panic!("{other:?}"),
    }
    // A cluster URL naming a node that is not in cluster mode.
    let url = format!("redis+cluster://127.0.0.1:{}", s.primary.port());
    match RedisPool::connect(config(&url, &ns)) {
        Err(PoolError::Misconfigured { detail, .. }) => {
            assert!(detail.contains("cluster support disabled"), "{detail}");
        }
        other => panic!("a standalone node behind redis+cluster://: {other:?}"),
    }
}
