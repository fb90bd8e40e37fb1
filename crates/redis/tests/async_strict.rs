//! The async strict client (`AsyncRedisScopes`, feature `tokio`): a stalled Redis does not
//! stall other tasks of a current-thread runtime, one probe is in flight while the breaker
//! is open, the fleet admits within `B + r*T` through it (the independent ideal bucket of
//! `common::ideal`), and blocking and async instances share one bucket. Real servers: the
//! shared one for the bound, private ones behind a loopback proxy for the stalls
//! (`tokengate_testkit::net::BlackHole`).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokengate_redis::{
    AsyncRedisScopeKinds, AsyncRedisScopes, CallError, FailMode, PoolConfig, RedisScopes,
    RemotePolicy, StrictAdmitted, StrictRefused,
};
use tokengate_testkit::net::BlackHole;

fn still(cap: u64) -> RemotePolicy {
    RemotePolicy::new(cap, 0.001).unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn a_stalled_redis_does_not_stall_other_tasks_on_a_current_thread_runtime() {
    let server = common::Server::start();
    let proxy = BlackHole::to_port(server.port());
    let timeout = Duration::from_millis(300);
    let config = PoolConfig::new(proxy.url(), common::namespace("async-stall"))
        .exchange_timeout(timeout)
        .connect_timeout(timeout)
        .fail_mode(FailMode::FailClosed);
    let scopes = Arc::new(AsyncRedisScopes::connect(config).await.unwrap());
    let tenant = scopes.scope("tenant", still(100)).unwrap();
    assert_eq!(
        scopes.try_acquire("t", &[(&tenant, "a", 1)]).await,
        Ok(StrictAdmitted::Taken)
    );

    proxy.cut();
    // Completion order: each finisher takes the next number.
    let order = Arc::new(AtomicU64::new(0));
    let ticks = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let remote = {
        let (scopes, tenant, order) = (Arc::clone(&scopes), tenant.clone(), Arc::clone(&order));
        tokio::spawn(async move {
            let started = Instant::now();
            let decided = scopes.try_acquire("t", &[(&tenant, "a", 1)]).await;
            (
                decided,
                started.elapsed(),
                order.fetch_add(1, Ordering::SeqCst),
            )
        })
    };
    // A ticker: progresses only while the thread is free.
    let ticker = {
        let (ticks, stop) = (Arc::clone(&ticks), Arc::clone(&stop));
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                ticks.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    // A request decided locally only, sent after the remote call started.
    let local = {
        let order = Arc::clone(&order);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let bucket = tokengate::Bucket::new(tokengate::Policy::new(10, 1.0).unwrap());
            let admitted = bucket.try_acquire(1).is_ok_and(|d| d.is_admitted());
            (admitted, order.fetch_add(1, Ordering::SeqCst))
        })
    };
    let (admitted, local_at) = local.await.unwrap();
    let ticks_when_local_answered = ticks.load(Ordering::SeqCst);
    let (decided, waited, remote_at) = remote.await.unwrap();
    let ticks_when_remote_answered = ticks.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    ticker.await.unwrap();

    eprintln!(
        "remote waited {waited:?}; ticks: {ticks_when_local_answered} when the local request \
         was answered, {ticks_when_remote_answered} when the remote call returned"
    );
    assert!(admitted);
    assert!(
        local_at < remote_at,
        "the local request must be answered while the remote call waits"
    );
    assert!(
        matches!(decided, Err(StrictRefused::Unavailable { .. })),
        "{decided:?}"
    );
    assert_eq!(
        scopes.last_failure(),
        Some(CallError::Timeout { after: timeout })
    );
    // The ticker ran all along the wait (about one tick per ms of it; a blocked thread
    // would leave it where the call started).
    assert!(
        ticks_when_remote_answered >= ticks_when_local_answered + 20,
        "the runtime's thread stalled during the remote call: {ticks_when_local_answered} -> \
         {ticks_when_remote_answered} ticks"
    );
    // A bounded wait: the timeout, not forever.
    assert!(waited < Duration::from_secs(10), "{waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_breaker_is_open_one_probe_is_in_flight_and_the_others_follow_the_fail_mode() {
    let server = common::Server::start();
    let proxy = BlackHole::to_port(server.port());
    let timeout = Duration::from_millis(500);
    let config = PoolConfig::new(proxy.url(), common::namespace("async-probe"))
        .exchange_timeout(timeout)
        .connect_timeout(timeout)
        .probe_backoff(Duration::from_millis(40), Duration::from_millis(40))
        .fail_mode(FailMode::FailOpen);
    let scopes = Arc::new(AsyncRedisScopes::connect(config).await.unwrap());
    let tenant = scopes.scope("tenant", still(100)).unwrap();
    proxy.cut();
    // Three failed calls open the breaker.
    for _ in 0..3 {
        assert_eq!(
            scopes.try_acquire("t", &[(&tenant, "a", 1)]).await,
            Ok(StrictAdmitted::FailOpen)
        );
    }
    assert!(scopes.is_unavailable());
    // Past the probe time (at most 40 ms).
    tokio::time::sleep(Duration::from_millis(80)).await;
    let before = proxy.accepted();
    let fail_open_before = scopes.fail_open_admitted();

    const CALLERS: u64 = 64;
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CALLERS {
        let (scopes, tenant, done) = (Arc::clone(&scopes), tenant.clone(), Arc::clone(&done));
        tasks.spawn(async move {
            let decided = scopes.try_acquire("t", &[(&tenant, "a", 1)]).await;
            done.fetch_add(1, Ordering::SeqCst);
            decided
        });
    }
    // Every caller but the probe is answered by the fail mode without waiting on it.
    let start = Instant::now();
    while done.load(Ordering::SeqCst) < CALLERS - 1 && start.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let done_while_probing = done.load(Ordering::SeqCst);
    let attempts_while_probing = proxy.accepted() - before;
    while let Some(decided) = tasks.join_next().await {
        assert_eq!(decided.unwrap(), Ok(StrictAdmitted::FailOpen));
    }
    let attempts = proxy.accepted() - before;
    eprintln!(
        "{done_while_probing} of {CALLERS} answered while the probe was out; \
         {attempts_while_probing} connection attempts then, {attempts} in all"
    );
    assert_eq!(
        done_while_probing,
        CALLERS - 1,
        "all but the probe follow the fail mode at once"
    );
    assert_eq!(attempts, 1, "exactly one probe reached the server");
    assert_eq!(scopes.fail_open_admitted() - fail_open_before, CALLERS);
    // The probe opened a connection again, whose setup got no answer.
    let failure = scopes.last_failure();
    assert!(
        matches!(&failure, Some(CallError::Connect(e)) if e.contains("did not answer")),
        "{failure:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_path_admits_within_b_plus_r_t_after_quiet_and_burst() {
    const B: u64 = 20;
    const RATE_MILLI: u64 = 50_000;
    let config = PoolConfig::new(common::url(), common::namespace("async-bound"));
    let scopes = Arc::new(AsyncRedisScopes::connect(config).await.unwrap());
    let tenant = scopes
        .scope(
            "tenant",
            RemotePolicy::new(B, RATE_MILLI as f64 / 1000.0).unwrap(),
        )
        .unwrap();
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    // Eight tasks: a burst at creation, steady pressure, a quiet spell (a third of the
    // fill time), a burst again.
    let phases = [
        (Duration::from_millis(600), true),
        (Duration::from_millis(130), false),
        (Duration::from_millis(600), true),
    ];
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (scopes, tenant, log) = (Arc::clone(&scopes), tenant.clone(), Arc::clone(&log));
        tasks.spawn(async move {
            let mut mine = Vec::new();
            for (length, busy) in phases {
                let end = Instant::now() + length;
                if !busy {
                    tokio::time::sleep_until(end.into()).await;
                    continue;
                }
                while Instant::now() < end {
                    let before = common::wall_ns();
                    let decided = scopes.try_acquire("t", &[(&tenant, "k", 1)]).await;
                    match decided {
                        Ok(StrictAdmitted::Taken) => mine.push((before, common::wall_ns())),
                        Err(StrictRefused::Rejected { .. }) => tokio::task::yield_now().await,
                        other => panic!("{other:?}"),
                    }
                }
            }
            log.lock().unwrap().extend(mine);
        });
    }
    while let Some(t) = tasks.join_next().await {
        t.unwrap();
    }
    let log = log.lock().unwrap().clone();
    assert!(log.len() as u64 > B, "only {} admitted", log.len());
    common::ideal::assert_within("async strict, 8 tasks", &log, B, RATE_MILLI, 0);
}

#[tokio::test(flavor = "current_thread")]
async fn blocking_and_async_clients_share_one_bucket() {
    let ns = common::namespace("async-shared");
    let blocking = RedisScopes::connect(PoolConfig::new(common::url(), &ns)).unwrap();
    let awaited = AsyncRedisScopes::connect(PoolConfig::new(common::url(), &ns))
        .await
        .unwrap();
    let b = blocking.scope("tenant", still(5)).unwrap();
    let a = awaited.scope("tenant", still(5)).unwrap();
    assert_eq!(blocking.key("t", &b, "acme"), awaited.key("t", &a, "acme"));
    let mut admitted = 0;
    for i in 0..10 {
        let taken = if i % 2 == 0 {
            blocking.try_acquire("t", &[(&b, "acme", 1)]).is_ok()
        } else {
            awaited.try_acquire("t", &[(&a, "acme", 1)]).await.is_ok()
        };
        admitted += u64::from(taken);
    }
    assert_eq!(admitted, 5);
    // A give-back from the async client is paid to the same bucket.
    awaited.give_back("t", &[(&a, "acme", 2)]).await;
    assert_eq!(
        blocking.try_acquire("t", &[(&b, "acme", 2)]),
        Ok(StrictAdmitted::Taken)
    );
    // Malformed requests are typed errors, nothing sent.
    assert!(matches!(
        awaited.try_acquire("t", &[(&a, "acme", 6)]).await,
        Err(StrictRefused::Invalid(_))
    ));
}

#[tokio::test(flavor = "current_thread")]
async fn async_scope_kinds_map_refusals_like_the_blocking_store() {
    use tokengate::scope::{RemoteRefusal, Scope, ScopeKind, TenantId, UserId};
    let scopes = AsyncRedisScopes::connect(PoolConfig::new(
        common::url(),
        common::namespace("async-kinds"),
    ))
    .await
    .unwrap();
    let store = AsyncRedisScopeKinds::new(scopes)
        .kind(ScopeKind::Tenant, still(2))
        .unwrap();
    assert!(
        AsyncRedisScopeKinds::new(
            AsyncRedisScopes::connect(PoolConfig::new(common::url(), "x"))
                .await
                .unwrap()
        )
        .kind(ScopeKind::Global, still(2))
        .is_err()
    );
    let t = Scope::Tenant(TenantId(7));
    assert_eq!(store.take(&[(t, 1)]).await, Ok(()));
    assert_eq!(store.take(&[(t, 1)]).await, Ok(()));
    assert!(matches!(
        store.take(&[(t, 1)]).await,
        Err(RemoteRefusal::Refused { scope, .. }) if scope == t
    ));
    // A kind not kept here: refused with no wait that cures it.
    let u = Scope::User(UserId(1));
    assert_eq!(
        store.take(&[(u, 1)]).await,
        Err(RemoteRefusal::Refused {
            scope: u,
            retry_after: Duration::MAX
        })
    );
    store.give_back(&[(t, 1)]).await;
    assert_eq!(store.take(&[(t, 1)]).await, Ok(()));
}

#[tokio::test(flavor = "current_thread")]
async fn cluster_and_sentinel_urls_are_refused_by_the_async_client_at_construction() {
    use tokengate_redis::PoolError;
    for (url, want) in [
        ("redis+cluster://127.0.0.1:7000,127.0.0.1:7001", "cluster"),
        ("rediss+cluster://127.0.0.1:7000", "cluster"),
        ("redis+sentinel://127.0.0.1:26379/mymaster", "sentinel"),
    ] {
        let e = AsyncRedisScopes::connect(PoolConfig::new(url, "x"))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, PoolError::AsyncTopology { kind, .. } if *kind == want),
            "{url}: {e}"
        );
        assert!(e.to_string().contains(want), "{e}");
    }
    // A malformed one is the URL's error, as for the blocking clients.
    let e = AsyncRedisScopes::connect(PoolConfig::new("redis+sentinel://h:1/", "x"))
        .await
        .unwrap_err();
    assert!(matches!(e, PoolError::Url { .. }), "{e}");
}

#[tokio::test(flavor = "current_thread")]
async fn with_wait_for_replicas_an_async_take_counts_only_once_a_replica_holds_it() {
    let primary = common::Server::start();
    let config = || {
        PoolConfig::new(primary.url(), common::namespace("async-wait"))
            .fail_mode(FailMode::FailClosed)
            .exchange_timeout(Duration::from_millis(500))
            .wait_for_replicas(1, Duration::from_millis(20))
    };
    let scopes = AsyncRedisScopes::connect(config()).await.unwrap();
    let s = scopes.scope("tenant", still(100)).unwrap();
    // No replica: the take is not acknowledged, the call fails and the fail mode refuses.
    assert!(matches!(
        scopes.try_acquire("t", &[(&s, "acme", 1)]).await,
        Err(StrictRefused::Unavailable { .. })
    ));
    assert!(matches!(scopes.last_failure(), Some(CallError::Redis(_))));
    // A replica attached: the same take is admitted once it acknowledges.
    let port = primary.port().to_string();
    let _replica = common::Server::start_with(&["--replicaof", "127.0.0.1", &port]);
    let fresh = AsyncRedisScopes::connect(config()).await.unwrap();
    let s = fresh.scope("tenant", still(100)).unwrap();
    let started = Instant::now();
    loop {
        match fresh.try_acquire("t", &[(&s, "acme", 1)]).await {
            Ok(StrictAdmitted::Taken) => break,
            other => {
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "never acknowledged: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn async_scope_kinds_tag_each_call_with_its_tenant_like_the_blocking_store() {
    use tokengate::scope::{Scope, ScopeKind, TenantId, UserId};
    let ns = common::namespace("async-tenant-tag");
    let connect = || async {
        AsyncRedisScopes::connect(PoolConfig::new(common::url(), &ns))
            .await
            .unwrap()
    };
    let blocking = tokengate_redis::RedisScopeKinds::new(
        RedisScopes::connect(PoolConfig::new(common::url(), &ns)).unwrap(),
    )
    .kind(ScopeKind::User, still(1))
    .unwrap();
    let store = AsyncRedisScopeKinds::new(connect().await)
        .kind(ScopeKind::User, still(1))
        .unwrap()
        .kind(ScopeKind::Tenant, still(10))
        .unwrap();
    let (t1, t2, u) = (
        Scope::Tenant(TenantId(1)),
        Scope::Tenant(TenantId(2)),
        Scope::User(UserId(9)),
    );
    let key = store.key_in(&[t1, u], &u).unwrap();
    assert!(key.contains("{") && key.contains(":tenant:1}"), "{key}");
    // The same key as the blocking store's for the same request.
    assert_eq!(blocking.key_in(&[t1, u], &u), Some(key));
    // A user is a budget within each tenant: one token in tenant 1 and one in tenant 2.
    assert_eq!(store.take(&[(t1, 1), (u, 1)]).await, Ok(()));
    assert_eq!(store.take(&[(t2, 1), (u, 1)]).await, Ok(()));
    assert!(store.take(&[(t1, 1), (u, 1)]).await.is_err());
    // Unpartitioned: one budget across tenants, under the fixed tag.
    let flat = AsyncRedisScopeKinds::new(connect().await)
        .with_tag("flat")
        .unwrap()
        .unpartitioned()
        .kind(ScopeKind::User, still(1))
        .unwrap()
        .kind(ScopeKind::Tenant, still(10))
        .unwrap();
    assert!(flat.key_in(&[t1, u], &u).unwrap().contains(":flat}"));
    assert_eq!(flat.take(&[(t1, 1), (u, 1)]).await, Ok(()));
    assert!(flat.take(&[(t2, 1), (u, 1)]).await.is_err());
}
