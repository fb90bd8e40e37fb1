//! Strict keyed scopes in Redis (`RedisScopes`) and their composition with a global scope
//! decided locally (`GlobalThenScopes`), against the real Redis on 127.0.0.1:6379 (and a
//! private server for the fail modes).

mod common;

use std::time::Duration;

use tokengate::{Bucket, LeasedBucket, ManualClock, Policy};
use tokengate_redis::{
    ComposedRefused, FailMode, GlobalThenScopes, InvalidRequest, PoolConfig, PoolError,
    RedisScopes, RemotePolicy, StrictAdmitted, StrictRefused, UNITS_PER_TOKEN,
};

fn scopes(ns: &str) -> RedisScopes {
    RedisScopes::connect(PoolConfig::new(common::url(), common::namespace(ns))).unwrap()
}

/// A policy that refills 1 milli-token per second: nothing comes back within a test.
fn still(cap: u64) -> RemotePolicy {
    RemotePolicy::new(cap, 0.001).unwrap()
}

fn balance(con: &mut redis::Connection, key: &str) -> Option<u64> {
    let u: Option<u64> = redis::cmd("HGET").arg(key).arg("u").query(con).unwrap();
    u.map(|u| u / UNITS_PER_TOKEN)
}

fn exists(con: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<u64>(con).unwrap() == 1
}

#[test]
fn a_request_takes_every_keyed_scope_or_none_and_names_the_one_that_refused() {
    let s = scopes("strict-all");
    let tenant = s.scope("tenant", still(5)).unwrap();
    let user = s.scope("user", still(2)).unwrap();
    let mut con = common::connect();
    let ask = |who: &str| s.try_acquire("acme", &[(&tenant, "acme", 1), (&user, who, 1)]);
    assert_eq!(ask("alice"), Ok(StrictAdmitted::Taken));
    assert_eq!(ask("alice"), Ok(StrictAdmitted::Taken));
    // Alice's bucket is empty: refused by the user scope (item 1), the tenant untouched.
    match ask("alice") {
        Err(StrictRefused::Rejected { index: 1, .. }) => {}
        other => panic!("{other:?}"),
    }
    let tenant_key = s.key("acme", &tenant, "acme");
    assert_eq!(balance(&mut con, &tenant_key), Some(3));
    assert_eq!(ask("bob"), Ok(StrictAdmitted::Taken));
    assert_eq!(ask("bob"), Ok(StrictAdmitted::Taken));
    assert_eq!(ask("carol"), Ok(StrictAdmitted::Taken));
    // The tenant is spent: refused by item 0, and carol keeps her last token.
    match ask("carol") {
        Err(StrictRefused::Rejected { index: 0, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(balance(&mut con, &s.key("acme", &user, "carol")), Some(1));
    assert_eq!(balance(&mut con, &tenant_key), Some(0));
}

#[test]
fn one_requests_keys_share_one_cluster_hash_tag() {
    let s = scopes("strict-tag");
    let tenant = s.scope("tenant", still(5)).unwrap();
    let user = s.scope("user", still(2)).unwrap();
    // Redis Cluster hashes the text between the first '{' and the next '}'.
    let tag = |key: &str| {
        let open = key.find('{').unwrap();
        let close = open + key[open..].find('}').unwrap();
        key[open + 1..close].to_owned()
    };
    let a = s.key("acme", &tenant, "acme");
    let b = s.key("acme", &user, "al}i{ce");
    assert_eq!(tag(&a), tag(&b), "{a} {b}");
    assert_eq!(cluster_slot(&a), cluster_slot(&b));
    assert_ne!(tag(&a), tag(&s.key("globex", &tenant, "acme")));
    // And the script accepts keys whose text holds braces after the tag.
    assert_eq!(
        s.try_acquire("acme", &[(&tenant, "acme", 1), (&user, "al}i{ce", 1)]),
        Ok(StrictAdmitted::Taken)
    );
}

/// Redis Cluster's key slot: CRC16 (XMODEM) of the hash tag, modulo 16384.
fn cluster_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = match key.find('{') {
        Some(open) => match key[open + 1..].find('}') {
            Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
            _ => bytes,
        },
        None => bytes,
    };
    let mut crc: u16 = 0;
    for &b in hashed {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[test]
fn a_malformed_request_is_a_typed_error_and_writes_nothing() {
    let s = scopes("strict-bad");
    let user = s.scope("user", still(3)).unwrap();
    let mut con = common::connect();
    type Case<'a> = (&'a str, Vec<(&'a str, u64)>, InvalidRequest);
    let cases: Vec<Case<'_>> = vec![
        ("t", vec![], InvalidRequest::NoScopes),
        ("", vec![("a", 1)], InvalidRequest::Tag(String::new())),
        ("t{x", vec![("a", 1)], InvalidRequest::Tag("t{x".into())),
        (
            "t",
            vec![("a", 1), ("", 1)],
            InvalidRequest::Key { index: 1 },
        ),
        (
            "t",
            vec![("a", 0)],
            InvalidRequest::Cost {
                index: 0,
                cost: 0,
                max: 3,
            },
        ),
        (
            "t",
            vec![("a", 1), ("b", 4)],
            InvalidRequest::Cost {
                index: 1,
                cost: 4,
                max: 3,
            },
        ),
    ];
    for (tag, keys, want) in cases {
        let items: Vec<_> = keys.iter().map(|(k, c)| (&user, *k, *c)).collect();
        assert_eq!(
            s.try_acquire(tag, &items),
            Err(StrictRefused::Invalid(want.clone())),
            "{tag:?} {keys:?}"
        );
    }
    let long = "k".repeat(tokengate_redis::MAX_KEY_BYTES + 1);
    assert_eq!(
        s.try_acquire("t", &[(&user, &long, 1)]),
        Err(StrictRefused::Invalid(InvalidRequest::Key { index: 0 }))
    );
    let many: Vec<_> = (0..=tokengate_redis::MAX_STRICT_SCOPES)
        .map(|_| (&user, "a", 1))
        .collect();
    assert!(matches!(
        s.try_acquire("t", &many),
        Err(StrictRefused::Invalid(InvalidRequest::TooManyScopes {
            count: 17
        }))
    ));
    for key in ["a", "b"] {
        assert!(!exists(&mut con, &s.key("t", &user, key)), "{key} written");
    }
    assert!(matches!(s.scope("a:b", still(1)), Err(PoolError::Scope(_))));
}

#[test]
fn the_global_scope_is_taken_locally_first_and_given_back_when_the_keyed_scopes_refuse() {
    let s = scopes("strict-compose");
    let user = s.scope("user", still(1)).unwrap();
    let clock = ManualClock::new();
    let global = Bucket::with_clock(Policy::new(3, 1.0).unwrap(), clock);
    let limiter = GlobalThenScopes::new(global, s);
    let ask = |who: &str| limiter.try_acquire(1, "acme", &[(&user, who, 1)]);
    assert_eq!(ask("alice"), Ok(StrictAdmitted::Taken));
    for _ in 0..10 {
        match ask("alice") {
            Err(ComposedRefused::Scopes(StrictRefused::Rejected { index: 0, .. })) => {}
            other => panic!("{other:?}"),
        }
    }
    // Every refused request's global token came back: two left of three.
    assert_eq!(limiter.global().available(), 2.0);
    assert_eq!(ask("bob"), Ok(StrictAdmitted::Taken));
    assert_eq!(ask("carol"), Ok(StrictAdmitted::Taken));
    // The global scope refuses before Redis is asked: dave's key is never created.
    assert!(matches!(ask("dave"), Err(ComposedRefused::Global { .. })));
    let mut con = common::connect();
    assert!(!exists(
        &mut con,
        &limiter.scopes().key("acme", &user, "dave")
    ));
    assert!(exists(
        &mut con,
        &limiter.scopes().key("acme", &user, "carol")
    ));
    // A malformed request takes nothing from the global scope either.
    assert!(matches!(
        limiter.try_acquire(1, "", &[(&user, "erin", 1)]),
        Err(ComposedRefused::Scopes(StrictRefused::Invalid(_)))
    ));
    assert_eq!(limiter.global().available(), 0.0);
}

#[test]
fn a_leased_global_scope_composes_the_same_way() {
    let s = scopes("strict-leased");
    let user = s.scope("user", still(1)).unwrap();
    // The engine's per-core leased bucket, refilling 1 token a day.
    let global = LeasedBucket::new(Policy::new(5, 1.0 / 86_400.0).unwrap());
    let limiter = GlobalThenScopes::new(global, s);
    assert_eq!(
        limiter.try_acquire(1, "acme", &[(&user, "alice", 1)]),
        Ok(StrictAdmitted::Taken)
    );
    for _ in 0..20 {
        assert!(
            limiter
                .try_acquire(1, "acme", &[(&user, "alice", 1)])
                .is_err()
        );
    }
    // The twenty refusals gave their global tokens back: four more users get in.
    let admitted = (0..10)
        .filter(|i| {
            limiter
                .try_acquire(1, "acme", &[(&user, &format!("u{i}"), 1)])
                .is_ok()
        })
        .count();
    assert_eq!(admitted, 4);
}

#[test]
fn unreachable_redis_at_start_is_a_typed_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = RedisScopes::connect(
        PoolConfig::new(format!("redis://127.0.0.1:{port}/"), "x")
            .connect_timeout(Duration::from_millis(50)),
    )
    .unwrap_err();
    assert!(matches!(err, PoolError::Unreachable { .. }), "{err}");
}

#[test]
fn each_fail_mode_decides_once_redis_is_gone() {
    let mut server = common::Server::start();
    for mode in [FailMode::FailClosed, FailMode::FailOpen, FailMode::Local] {
        server.ensure_running();
        let s = RedisScopes::connect(
            PoolConfig::new(server.url(), common::namespace("strict-fail"))
                .exchange_timeout(Duration::from_millis(30))
                .connect_timeout(Duration::from_millis(30))
                .probe_backoff(Duration::from_secs(10), Duration::from_secs(20))
                .fail_mode(mode)
                .instances(2),
        )
        .unwrap();
        let user = s
            .scope("user", RemotePolicy::new(10, 0.001).unwrap())
            .unwrap();
        assert_eq!(
            s.try_acquire("t", &[(&user, "alice", 1)]),
            Ok(StrictAdmitted::Taken)
        );
        server.stop();
        let mut answers = Vec::new();
        common::wait_until(
            "breaker never opened",
            Duration::from_secs(5),
            || s.is_unavailable(),
            || answers.push(s.try_acquire("t", &[(&user, "alice", 1)])),
        );
        // Three failed calls open the breaker; each already answered per the fail mode.
        assert_eq!(answers.len(), 3, "{answers:?}");
        let got = s.try_acquire("t", &[(&user, "bob", 1)]);
        match mode {
            FailMode::FailClosed => {
                assert!(
                    matches!(got, Err(StrictRefused::Unavailable { .. })),
                    "{got:?}"
                );
                assert_eq!(s.fail_open_admitted() + s.local_admitted(), 0);
            }
            FailMode::FailOpen => {
                assert_eq!(got, Ok(StrictAdmitted::FailOpen));
                assert_eq!(s.fail_open_admitted(), 4);
            }
            FailMode::Local => {
                assert_eq!(got, Ok(StrictAdmitted::Local));
                // Redis counted this one instance, not the configured 2: B/K = 10 tokens
                // per key locally, then rejections naming the scope.
                assert_eq!(s.instances_seen(), 1);
                let mut n = 1;
                while s.try_acquire("t", &[(&user, "bob", 1)]).is_ok() {
                    n += 1;
                    assert!(n < 100);
                }
                assert_eq!(n, 10);
                assert!(matches!(
                    s.try_acquire("t", &[(&user, "bob", 1)]),
                    Err(StrictRefused::Rejected { index: 0, .. })
                ));
            }
        }
    }
}

/// Spends `scope`'s key `key` on `s` in one burst, counting what the local buckets admit
/// (bounded).
fn local_burst(s: &RedisScopes, scope: &tokengate_redis::StrictScope, key: &str) -> u64 {
    let mut n = 0;
    while let Ok(how) = s.try_acquire("t", &[(scope, key, 1)]) {
        assert_eq!(how, StrictAdmitted::Local);
        n += 1;
        assert!(n <= scope.policy().capacity(), "{n} admitted locally");
    }
    n
}

#[test]
fn local_fail_mode_splits_each_key_by_the_fleet_redis_last_reported() {
    let mut server = common::Server::start();
    let config = PoolConfig::new(server.url(), common::namespace("strict-fleetk"))
        .lease_ttl(Duration::from_millis(200))
        .exchange_timeout(Duration::from_millis(30))
        .connect_timeout(Duration::from_millis(30))
        .probe_backoff(Duration::from_secs(10), Duration::from_secs(20))
        .fail_mode(FailMode::Local)
        // The hint: 8 instances. Redis will count 3, and 3 is what the shares use.
        .instances(8);
    let fleet: Vec<RedisScopes> = (0..3)
        .map(|_| RedisScopes::connect(config.clone()).unwrap())
        .collect();
    // B = 100, r = 0.3/s: a share is floor(100/3) = 33 tokens per key (12 under the hint's
    // 8) refilled at 0.1/s, nothing within a burst. B = 2 < K: a share rounds down to
    // nothing.
    let user_policy = RemotePolicy::new(100, 0.3).unwrap();
    let tiny_policy = RemotePolicy::new(2, 0.3).unwrap();
    let scopes: Vec<_> = fleet
        .iter()
        .map(|s| {
            (
                s.scope("user", user_policy).unwrap(),
                s.scope("tiny", tiny_policy).unwrap(),
            )
        })
        .collect();
    let poke = |key: &str| {
        for (s, (user, _)) in fleet.iter().zip(&scopes) {
            let _ = s.try_acquire("t", &[(user, key, 1)]);
        }
    };
    // Each beat at connect; the first two learn of the later ones with a take half a
    // lease lifetime on.
    common::wait_until(
        "Redis never reported three instances",
        Duration::from_secs(5),
        || fleet.iter().all(|s| s.instances_seen() == 3),
        || {
            poke("warm");
            std::thread::sleep(Duration::from_millis(20));
        },
    );
    server.stop();
    common::wait_until(
        "breaker never opened",
        Duration::from_secs(5),
        || fleet.iter().all(RedisScopes::is_unavailable),
        || poke("warm"),
    );
    for (s, (user, tiny)) in fleet.iter().zip(&scopes) {
        assert_eq!(s.instances_seen(), 3);
        assert_eq!(local_burst(s, user, "alice"), 100 / 3);
        assert_eq!(local_burst(s, user, "bob"), 100 / 3);
        assert!(matches!(
            s.try_acquire("t", &[(tiny, "alice", 1)]),
            Err(StrictRefused::Unavailable { .. })
        ));
        // All or nothing: the share of nothing refuses the request, the user's token
        // taken before it is given back.
        assert!(matches!(
            s.try_acquire("t", &[(user, "carol", 1), (tiny, "carol", 1)]),
            Err(StrictRefused::Unavailable { .. })
        ));
        assert_eq!(local_burst(s, user, "carol"), 100 / 3);
    }
}
