//! The `metrics` feature's series, read from a Prometheus recorder installed for this test
//! binary: a pool's round trips and grants, its breaker opening when its private server
//! stops and closing when it comes back, and fail-mode admissions, for a pool and for
//! strict scopes, blocking and async (`client="strict_async"`, with its timeouts); leases
//! that expired here unspent and the unspent tokens awaiting settlement.

mod common;

use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokengate_redis::series::{
    BREAKER_OPEN, BREAKER_TRANSITIONS, EXPIRED_UNSPENT_TOKENS, FAIL_MODE_ADMISSIONS, GRANT_TOKENS,
    GRANTS, RETRIES, ROUND_TRIP_SECONDS, ROUND_TRIPS, TIMEOUTS, UNSETTLED_TOKENS,
};
use tokengate_redis::{
    Admitted, AsyncRedisScopes, FailMode, PoolConfig, RedisPool, RedisScopes, RemoteBucket,
    RemotePolicy, StrictAdmitted,
};

/// The recorder of this test binary, installed at the first call (its tests share it).
fn recorder() -> PrometheusHandle {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).expect("the only recorder of this binary");
            handle
        })
        .clone()
}

/// The sum of the samples of `name` (exactly: `name{...} value` or `name value`) whose
/// labels include every one of `labels` (`key="value"`).
fn value(rendered: &str, name: &str, labels: &[&str]) -> f64 {
    rendered
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            (n == name && labels.iter().all(|want| rest.contains(want)))
                .then(|| v.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// Asserts that every one of `series` has its `# HELP` line in `shown`.
fn assert_described(shown: &str, series: &[&str]) {
    for series in series {
        assert!(
            shown.contains(&format!("# HELP {series} ")),
            "{series} undescribed: {shown}"
        );
    }
}

/// A client of the server at `url` in a namespace of its own, quick to time out and to
/// probe, admitting by `FailOpen` while the server is unreachable.
fn config(url: String, test: &str) -> PoolConfig {
    PoolConfig::new(url, common::namespace(test))
        .exchange_timeout(Duration::from_millis(30))
        .connect_timeout(Duration::from_millis(30))
        .probe_backoff(Duration::from_millis(10), Duration::from_millis(40))
        .fail_mode(FailMode::FailOpen)
}

/// Waits (up to 5 s) for the bucket's first admission on a lease.
fn first_lease(bucket: &RemoteBucket) {
    common::wait_until(
        "no lease paid",
        Duration::from_secs(5),
        || bucket.try_acquire(1) == Ok(Admitted::Leased),
        || std::thread::sleep(Duration::from_millis(1)),
    );
}

#[test]
fn round_trips_grants_breaker_transitions_and_fail_mode_admissions_are_counted() {
    let handle = recorder();
    let mut server = common::Server::start();
    let pool = RedisPool::connect(config(server.url(), "m-pool")).unwrap();
    let scopes = RedisScopes::connect(config(server.url(), "m-strict")).unwrap();
    let bucket = pool
        .bucket("g", RemotePolicy::new(1000, 100.0).unwrap())
        .unwrap();
    let tenant = scopes
        .scope("tenant", RemotePolicy::new(10, 1.0).unwrap())
        .unwrap();

    // Round trips and grants.
    let pool_ok = [r#"client="pool""#, r#"outcome="ok""#];
    first_lease(&bucket);
    assert_eq!(
        scopes.try_acquire("t", &[(&tenant, "a", 1)]),
        Ok(StrictAdmitted::Taken)
    );
    let shown = handle.render();
    assert!(value(&shown, ROUND_TRIPS, &pool_ok) >= 1.0, "{shown}");
    assert!(
        value(
            &shown,
            ROUND_TRIPS,
            &[r#"client="strict""#, r#"outcome="ok""#]
        ) >= 1.0,
        "{shown}"
    );
    let count = format!("{ROUND_TRIP_SECONDS}_count");
    assert!(
        value(&shown, &count, &[r#"client="pool""#]) >= 1.0,
        "{shown}"
    );
    assert!(
        value(&shown, &count, &[r#"client="strict""#]) >= 1.0,
        "{shown}"
    );
    assert!(
        value(&shown, GRANTS, &[r#"outcome="granted""#]) >= 1.0,
        "{shown}"
    );
    assert!(
        value(&shown, &format!("{GRANT_TOKENS}_count"), &[]) >= 1.0,
        "{shown}"
    );
    assert_eq!(value(&shown, BREAKER_OPEN, &[]), 0.0, "{shown}");
    assert_described(
        &shown,
        &[ROUND_TRIPS, ROUND_TRIP_SECONDS, GRANTS, GRANT_TOKENS],
    );

    // The server stops: both breakers open, and FailOpen admits (counted once each).
    server.stop();
    common::wait_unavailable(&pool, &bucket, Duration::from_secs(5));
    common::wait_until(
        "the pool never admitted by FailOpen",
        Duration::from_secs(5),
        || bucket.try_acquire(1) == Ok(Admitted::FailOpen),
        || std::thread::sleep(Duration::from_millis(1)),
    );
    // A failed call is decided by the fail mode; three in a row open the breaker.
    common::wait_until(
        "the strict scopes' breaker never opened",
        Duration::from_secs(5),
        || scopes.is_unavailable(),
        || {
            let admitted = scopes.try_acquire("t", &[(&tenant, "a", 1)]);
            assert_eq!(admitted, Ok(StrictAdmitted::FailOpen));
            std::thread::sleep(Duration::from_millis(2));
        },
    );
    let pool_admitted = bucket.stats().fail_open_admitted as f64;
    let strict_admitted = scopes.fail_open_admitted() as f64;
    let pool_open = [r#"client="pool""#, r#"mode="fail_open""#];
    // The pool's thread exports its decisions' counts within a loop (a few ms).
    common::wait_until(
        "the pool's fail-open admissions never exported",
        Duration::from_secs(5),
        || value(&handle.render(), FAIL_MODE_ADMISSIONS, &pool_open) >= pool_admitted,
        || std::thread::sleep(Duration::from_millis(5)),
    );
    let shown = handle.render();
    assert_eq!(
        value(
            &shown,
            FAIL_MODE_ADMISSIONS,
            &[r#"client="strict""#, r#"mode="fail_open""#]
        ),
        strict_admitted,
        "{shown}"
    );
    for client in [r#"client="pool""#, r#"client="strict""#] {
        assert_eq!(value(&shown, BREAKER_OPEN, &[client]), 1.0, "{shown}");
        assert_eq!(
            value(&shown, BREAKER_TRANSITIONS, &[client, r#"to="open""#]),
            1.0,
            "{shown}"
        );
        assert!(
            value(&shown, ROUND_TRIPS, &[client, r#"outcome="failed""#]) >= 1.0,
            "{shown}"
        );
    }
    assert_described(
        &shown,
        &[BREAKER_OPEN, BREAKER_TRANSITIONS, FAIL_MODE_ADMISSIONS],
    );

    // It comes back: the pool's breaker closes (three good rounds), counted once.
    server.ensure_running();
    common::wait_until(
        "the pool's breaker never closed",
        Duration::from_secs(10),
        || !pool.is_unavailable(),
        || {
            let _ = bucket.try_acquire(1);
            std::thread::sleep(Duration::from_millis(5));
        },
    );
    let shown = handle.render();
    assert_eq!(
        value(
            &shown,
            BREAKER_TRANSITIONS,
            &[r#"client="pool""#, r#"to="closed""#]
        ),
        1.0,
        "{shown}"
    );
    assert_eq!(
        value(&shown, BREAKER_OPEN, &[r#"client="pool""#]),
        0.0,
        "{shown}"
    );
}

/// A reply lost on the way back (a proxy swallows it and closes the connection): the pool
/// sends the round again on a new connection (a retry), and a grant that ran is answered
/// again under its id (a replay).
#[test]
fn a_lost_reply_is_counted_as_a_retry_and_its_grant_as_replayed() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let handle = recorder();
    let server = common::Server::start();
    let arm = Arc::new(AtomicBool::new(false));
    let port = common::lossy_proxy(server.port(), arm.clone());
    let pool = RedisPool::connect(
        PoolConfig::new(
            format!("redis://127.0.0.1:{port}/"),
            common::namespace("m-lost"),
        )
        .max_lease(10)
        .exchange_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(1)),
    )
    .unwrap();
    let bucket = pool
        .bucket("g", RemotePolicy::new(1_000_000, 100_000.0).unwrap())
        .unwrap();
    first_lease(&bucket);
    // Lose replies (of rounds that granted, sooner or later) until a replay is counted.
    common::wait_until(
        "no retry and replayed grant counted",
        Duration::from_secs(10),
        || {
            let shown = handle.render();
            value(&shown, RETRIES, &[r#"client="pool""#]) >= 1.0
                && value(&shown, GRANTS, &[r#"outcome="replayed""#]) >= 1.0
        },
        || {
            arm.store(true, Ordering::SeqCst);
            for _ in 0..100 {
                let _ = bucket.try_acquire(1);
            }
            std::thread::sleep(Duration::from_millis(2));
        },
    );
    assert!(!pool.is_unavailable());
}

/// The async client's series under `client="strict_async"`: round trips and their
/// latency, timeouts of a stalled server (a black-holed proxy), the breaker opening and
/// closing, and fail-open admissions.
#[test]
fn the_async_strict_client_counts_round_trips_timeouts_breaker_and_fail_mode() {
    let handle = recorder();
    let server = common::Server::start();
    let proxy = tokengate_testkit::net::BlackHole::to_port(server.port());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = config(proxy.url(), "m-async");
    let client = [r#"client="strict_async""#];
    rt.block_on(async {
        let scopes = AsyncRedisScopes::connect(config).await.unwrap();
        let tenant = scopes
            .scope("tenant", RemotePolicy::new(10, 1.0).unwrap())
            .unwrap();
        let items = [(&tenant, "a", 1)];
        let ask = || scopes.try_acquire("t", &items);
        assert_eq!(ask().await, Ok(StrictAdmitted::Taken));
        let shown = handle.render();
        let ok = [client[0], r#"outcome="ok""#];
        assert_eq!(value(&shown, ROUND_TRIPS, &ok), 1.0, "{shown}");
        let count = format!("{ROUND_TRIP_SECONDS}_count");
        assert_eq!(value(&shown, &count, &client), 1.0, "{shown}");

        // Stalled: each call times out, is admitted by the fail mode; three open the
        // breaker, and then decisions follow the fail mode without a call.
        proxy.cut();
        for _ in 0..3 {
            assert_eq!(ask().await, Ok(StrictAdmitted::FailOpen));
        }
        assert!(scopes.is_unavailable());
        assert_eq!(ask().await, Ok(StrictAdmitted::FailOpen));
        let shown = handle.render();
        assert!(value(&shown, TIMEOUTS, &client) >= 1.0, "{shown}");
        assert_described(&shown, &[TIMEOUTS]);
        let failed = [client[0], r#"outcome="failed""#];
        assert_eq!(value(&shown, ROUND_TRIPS, &failed), 3.0, "{shown}");
        assert_eq!(value(&shown, BREAKER_OPEN, &client), 1.0, "{shown}");
        let opened = [client[0], r#"to="open""#];
        assert_eq!(value(&shown, BREAKER_TRANSITIONS, &opened), 1.0, "{shown}");
        let fail_open = [client[0], r#"mode="fail_open""#];
        assert_eq!(
            value(&shown, FAIL_MODE_ADMISSIONS, &fail_open),
            scopes.fail_open_admitted() as f64,
            "{shown}"
        );
        assert_eq!(scopes.fail_open_admitted(), 4);

        // It answers again: probes succeed, three in a row close the breaker.
        proxy.restore();
        let start = std::time::Instant::now();
        while scopes.is_unavailable() {
            assert!(start.elapsed() < Duration::from_secs(10), "never closed");
            let _ = ask().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let shown = handle.render();
        let closed = [client[0], r#"to="closed""#];
        assert_eq!(value(&shown, BREAKER_TRANSITIONS, &closed), 1.0, "{shown}");
        assert_eq!(value(&shown, BREAKER_OPEN, &client), 0.0, "{shown}");
    });
}

/// Leases that expire here unspent: the pool's thread is held up in a round to a
/// black-holed server (an exchange timeout, twice with the retry), sent before the leases
/// it holds reached half their lifetime, until past their expiry, so when it retires them
/// they have expired. Their tokens are counted
/// once in `expired_unspent_tokens_total` and shown in `unsettled_tokens` until Redis
/// answers again and their settlement goes through, when the gauge returns to 0. Exact:
/// both are the tokens granted less those admitted. The pool's series go to a recorder of
/// this test alone (the two series have no labels: another test's pool would set them).
#[test]
fn leases_expired_unspent_are_counted_and_unsettled_until_settled() {
    let server = common::Server::start();
    let proxy = tokengate_testkit::net::BlackHole::to_port(server.port());
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    // Leases live 400 ms; a round to the stalled server takes 500 ms, then as much again
    // on a new connection.
    let pool = metrics::with_local_recorder(&recorder, || {
        RedisPool::connect(
            PoolConfig::new(proxy.url(), common::namespace("m-expired"))
                .lease_ttl(Duration::from_millis(400))
                .exchange_timeout(Duration::from_millis(500))
                .connect_timeout(Duration::from_millis(500))
                .fail_mode(FailMode::FailClosed),
        )
    })
    .unwrap();
    let bucket = pool
        .bucket("g", RemotePolicy::new(1000, 0.001).unwrap())
        .unwrap();
    first_lease(&bucket);
    for _ in 0..3 {
        assert_eq!(bucket.try_acquire(1), Ok(Admitted::Leased));
    }
    // At once, while the leases are younger than half their lifetime (when the pool
    // retires them unexpired): a refund makes the next round, which stalls past their
    // expiry. The refund is a credit; it does not go back into the leases.
    proxy.cut();
    bucket.refund(1);
    common::wait_until(
        "no expired lease counted",
        Duration::from_secs(20),
        || value(&handle.render(), EXPIRED_UNSPENT_TOKENS, &[]) > 0.0,
        || std::thread::sleep(Duration::from_millis(5)),
    );
    let stats = bucket.stats();
    let unspent = (stats.granted_tokens - stats.leased_admitted) as f64;
    let shown = handle.render();
    eprintln!(
        "granted {}, admitted {}: expired unspent {}, unsettled {}",
        stats.granted_tokens,
        stats.leased_admitted,
        value(&shown, EXPIRED_UNSPENT_TOKENS, &[]),
        value(&shown, UNSETTLED_TOKENS, &[])
    );
    assert!(unspent > 0.0, "{stats:?}");
    assert_eq!(
        value(&shown, EXPIRED_UNSPENT_TOKENS, &[]),
        unspent,
        "{shown}"
    );
    assert_eq!(value(&shown, UNSETTLED_TOKENS, &[]), unspent, "{shown}");
    assert_described(&shown, &[EXPIRED_UNSPENT_TOKENS, UNSETTLED_TOKENS]);

    // Redis answers again: the settlement goes through and nothing is left unsettled;
    // the expired tokens were counted once.
    proxy.restore();
    common::wait_until(
        "the unspent tokens were never settled",
        Duration::from_secs(20),
        || value(&handle.render(), UNSETTLED_TOKENS, &[]) == 0.0,
        || std::thread::sleep(Duration::from_millis(5)),
    );
    let shown = handle.render();
    assert_eq!(
        value(&shown, EXPIRED_UNSPENT_TOKENS, &[]),
        unspent,
        "{shown}"
    );
}
