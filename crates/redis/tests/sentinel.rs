//! The pool and strict scopes finding their primary through Sentinel: a primary, its
//! replica and three Sentinels started by the test on free loopback ports; a failover
//! through Sentinel (`SENTINEL FAILOVER`) while a fleet runs, followed by reconnection to
//! the new primary; the fleet's admissions checked by the ideal bucket of
//! `common::ideal`; and the typed errors of a Sentinel setup that cannot work.

mod common;

use std::time::Duration;

use common::cluster::{CAP, RATE, Sentinels, config, fleet, over_admission};
use tokengate_redis::{
    PoolConfig, PoolError, RedisPool, RedisScopes, RemotePolicy, StrictAdmitted,
};

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
    // Without WAIT, then with it (failing back to the first primary).
    for wait in [false, true] {
        let (old, new) = (
            s.named_primary(),
            if wait {
                s.primary.port()
            } else {
                s.replica.port()
            },
        );
        let ns = common::namespace(if wait { "sentinel-wait" } else { "sentinel" });
        let key = format!("tg:{{{ns}:global}}");
        let tune = |c: PoolConfig| {
            if wait {
                c.wait_for_replicas(1, Duration::from_millis(20))
            } else {
                c
            }
        };
        let mut before = None;
        let run = fleet(
            &url,
            &ns,
            &["global".to_owned()],
            (3, 2, 4000),
            tune,
            || {
                before = state_ts(old, &key);
                s.failover();
            },
        );
        assert!(
            before.is_some(),
            "the pool did not write on the primary Sentinel named"
        );
        assert_eq!(s.named_primary(), new);
        // Reconnected: the bucket's state on the new primary moved on after the failover.
        let after = state_ts(new, &key).expect("no state on the new primary");
        assert!(
            after > before.unwrap(),
            "no exchange reached the new primary"
        );
        let adm = &run.admissions[0];
        eprintln!(
            "Sentinel failover, wait {wait}: over-admission {} (term: {} tokens granted during \
             the failover), {} failed rounds, last second {:?}",
            over_admission(adm),
            run.granted_in_fault,
            run.failed_rounds,
            run.last_second
        );
        let slack = if wait { 0 } else { run.granted_in_fault };
        common::ideal::assert_within(
            &format!("Sentinel failover, wait {wait}"),
            adm,
            CAP,
            RATE * 1000,
            slack,
        );
        assert!(
            run.last_second[0] as u64 >= RATE / 2,
            "{:?}",
            run.last_second
        );
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
