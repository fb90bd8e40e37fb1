//! The fleet on a private Redis Cluster (3 primaries, 3 replicas, started by the test on
//! free loopback ports): strict multi-scope calls in one slot per tenant, tenants spread
//! over the primaries, and a fleet of instances (threads, each with its own pool) run
//! through a resharding of the slots it uses, a SIGKILLed primary and a forced failover,
//! its admissions checked by the ideal bucket of `common::ideal`.
//!
//! The tests of this binary run one at a time (each starts its own cluster).

mod common;

use std::collections::BTreeSet;
use std::sync::{Barrier, Mutex};
use std::time::Duration;

use common::cluster::{Cluster, config, fleet, fleets_without_and_with_wait};
use tokengate::scope::{ApiKeyId, RemoteScopes, Scope, ScopeKind, TenantId, UserId};
use tokengate_redis::{
    PoolConfig, RedisScopeKinds, RedisScopes, RemotePolicy, StrictAdmitted, StrictRefused,
};

/// One cluster at a time: six servers each, on two cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Scope names whose buckets live on `n` different primaries (the first found for each).
fn scopes_on_distinct_primaries(c: &Cluster, ns: &str, n: usize) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for i in 0..1000 {
        let scope = format!("b{i}");
        let primary = c.primary_of(c.slot(&format!("tg:{{{ns}:{scope}}}")));
        if seen.insert(primary) {
            out.push(scope);
            if out.len() == n {
                break;
            }
        }
    }
    out
}

/// `n` scope names whose buckets live on one primary (the first name's).
fn scopes_on_one_primary(c: &Cluster, ns: &str, n: usize) -> Vec<String> {
    let primary = |scope: &str| c.primary_of(c.slot(&format!("tg:{{{ns}:{scope}}}")));
    let first = primary("b0");
    (0..1000)
        .map(|i| format!("b{i}"))
        .filter(|s| primary(s) == first)
        .take(n)
        .collect()
}

fn balance(c: &Cluster, key: &str) -> Option<u64> {
    let mut con = c.connect(c.primary_of(c.slot(key)));
    let u: Option<u64> = redis::cmd("HGET")
        .arg(key)
        .arg("u")
        .query(&mut con)
        .unwrap();
    u.map(|u| u / tokengate_redis::UNITS_PER_TOKEN)
}

#[test]
fn strict_calls_keep_a_requests_keys_in_one_slot_and_spread_tenants_over_the_primaries() {
    let _one = serial();
    let c = Cluster::start();
    let ns = common::namespace("cluster-strict");
    let kinds = |redis: RedisScopes| {
        RedisScopeKinds::new(redis)
            .kind(ScopeKind::Tenant, RemotePolicy::new(10, 0.001).unwrap())
            .unwrap()
            .kind(ScopeKind::User, RemotePolicy::new(2, 0.001).unwrap())
            .unwrap()
            .kind(ScopeKind::ApiKey, RemotePolicy::new(10, 0.001).unwrap())
            .unwrap()
    };
    let store = kinds(RedisScopes::connect(config(&c.url(), &ns)).unwrap());
    let mut primaries = BTreeSet::new();
    for t in 0..24 {
        let items = [
            (Scope::Tenant(TenantId(t)), 1),
            (Scope::User(UserId(7)), 1),
            (Scope::ApiKey(ApiKeyId(t)), 1),
        ];
        // Three kinds in one script call: a CROSSSLOT would be an error here.
        store.take(&items).unwrap();
        let scopes: Vec<Scope> = items.iter().map(|i| i.0).collect();
        let slots: BTreeSet<u16> = scopes
            .iter()
            .map(|s| c.slot(&store.key_in(&scopes, s).unwrap()))
            .collect();
        assert_eq!(
            slots.len(),
            1,
            "tenant {t}: one request's keys in {slots:?}"
        );
        let slot = *slots.first().unwrap();
        primaries.insert(c.primary_of(slot));
        let tenant_key = store.key_in(&scopes, &scopes[0]).unwrap();
        assert_eq!(balance(&c, &tenant_key), Some(9), "tenant {t}");
    }
    assert_eq!(
        primaries.len(),
        3,
        "24 tenants landed on the primaries {primaries:?} only"
    );
    // All or nothing on the cluster: user 7 of tenant 0 has one token left.
    let items = [(Scope::Tenant(TenantId(0)), 1), (Scope::User(UserId(7)), 1)];
    store.take(&items).unwrap();
    match store.take(&items) {
        Err(tokengate::scope::RemoteRefusal::Refused { scope, .. }) => {
            assert_eq!(scope, Scope::User(UserId(7)));
        }
        other => panic!("{other:?}"),
    }
    let scopes = [items[0].0, items[1].0];
    assert_eq!(
        balance(&c, &store.key_in(&scopes, &scopes[0]).unwrap()),
        Some(8)
    );
    // Unpartitioned: every tenant in one slot.
    let flat = kinds(RedisScopes::connect(config(&c.url(), &ns)).unwrap()).unpartitioned();
    let slots: BTreeSet<u16> = (0..24)
        .map(|t| c.slot(&flat.key(&Scope::Tenant(TenantId(t))).unwrap()))
        .collect();
    assert_eq!(slots.len(), 1);
    // A strict call straight on RedisScopes, tagged by the caller, works the same.
    let s = RedisScopes::connect(config(&c.url(), &ns)).unwrap();
    let tenant = s
        .scope("tenant", RemotePolicy::new(1, 0.001).unwrap())
        .unwrap();
    let user = s
        .scope("user", RemotePolicy::new(1, 0.001).unwrap())
        .unwrap();
    let ask = || s.try_acquire("acme", &[(&tenant, "acme", 1), (&user, "al", 1)]);
    assert_eq!(ask(), Ok(StrictAdmitted::Taken));
    assert!(matches!(
        ask(),
        Err(StrictRefused::Rejected { index: 0, .. })
    ));
}

#[test]
fn the_fleet_stays_within_its_bound_while_the_slots_it_uses_move() {
    let _one = serial();
    let c = Cluster::start();
    let ns = common::namespace("cluster-reshard");
    let scopes = scopes_on_distinct_primaries(&c, &ns, 2);
    let slots: Vec<u16> = scopes
        .iter()
        .map(|s| c.slot(&format!("tg:{{{ns}:{s}}}")))
        .collect();
    let mut moved = 0;
    let run = fleet(
        &c.url(),
        &ns,
        &scopes,
        (4, 2, common::runs(3000, 4000)),
        |cfg| cfg,
        || {
            for &slot in &slots {
                let from = c.primary_of(slot);
                let to = c.other_primary(from);
                moved += c.migrate_slot(slot, from, to, Duration::from_millis(200));
                c.wait_ok(Duration::from_secs(10));
                assert_eq!(c.primary_of(slot), to);
            }
        },
    );
    eprintln!("resharding: {moved} keys moved");
    assert!(moved > 0, "the buckets' keys were not in the slots moved");
    // After the move the fleet goes on at its rate: MOVED is followed.
    run.check("resharding", 0);
}

#[test]
fn a_sigkilled_primary_fails_over_and_the_fleet_stays_within_the_lost_grant_term() {
    let _one = serial();
    let mut c = Cluster::start();
    let ns = common::namespace("cluster-kill");
    let scopes = scopes_on_distinct_primaries(&c, &ns, 1);
    let primary = c.primary_of(c.slot(&format!("tg:{{{ns}:{}}}", scopes[0])));
    let replica = c.replica_of(primary);
    let url = c.url();
    let run = fleet(
        &url,
        &ns,
        &scopes,
        (4, 2, common::runs(3000, 4000)),
        |cfg| cfg,
        || {
            c.kill(primary);
            c.wait_ok(Duration::from_secs(20));
        },
    );
    assert!(c.is_primary(replica), "the replica was not promoted");
    run.check("SIGKILLed primary", run.slack(false));
}

#[test]
fn a_forced_failover_stays_within_the_lost_grant_term_and_with_wait_within_b_plus_rt() {
    let _one = serial();
    let c = Cluster::start();
    let url = c.url();
    // Each failover with both settings at once: four instances without WAIT and four
    // with it, each group on its own bucket, both buckets on the primary that fails over.
    // Once; three times with TOKENGATE_SOAK=1.
    for _ in 0..common::runs(1, 3) {
        let ns = common::namespace("cluster-force");
        let scopes = scopes_on_one_primary(&c, &ns, 2);
        let primary = c.primary_of(c.slot(&format!("tg:{{{ns}:{}}}", scopes[0])));
        let replica = c.replica_of(primary);
        let scopes: &[String; 2] = scopes[..].try_into().unwrap();
        let sizes = (4, 2, common::runs(3000, 4000));
        let runs = fleets_without_and_with_wait(&url, &ns, scopes, sizes, || {
            c.failover_force(replica);
            common::wait_until(
                "the old primary never became a replica",
                Duration::from_secs(20),
                || !c.is_primary(primary),
                || std::thread::sleep(Duration::from_millis(5)),
            );
            c.wait_ok(Duration::from_secs(20));
            // The old primary, now a replica, in sync again: WAIT can be answered.
            c.wait_replicas_online(Duration::from_secs(20));
        });
        for (run, wait) in runs.iter().zip([false, true]) {
            run.check(&format!("forced failover, wait {wait}"), run.slack(wait));
        }
    }
}

/// Decisions, round trips, and per-decision latencies (ns, sorted) of one measurement.
struct Measured {
    decisions: u64,
    round_trips: u64,
    secs: f64,
    latency_ns: Vec<u64>,
}

impl Measured {
    fn print(&self, what: &str) {
        let q = |p: usize| {
            self.latency_ns
                .get(self.latency_ns.len().saturating_sub(1) * p / 100)
                .copied()
                .unwrap_or(0)
        };
        println!(
            "| {what} | {:.0} | {:.1} | {} | {} |",
            self.decisions as f64 / self.secs,
            self.round_trips as f64 * 1000.0 / self.decisions.max(1) as f64,
            q(50),
            q(99)
        );
    }
}

/// `k` instances (threads, each its own client) deciding as fast as they can for `secs`;
/// `decide(instance, i)` decides once and says whether it admitted; `setup` makes an
/// instance's client and `trips` reads its round trips.
fn measure<C: Send>(
    k: usize,
    secs: f64,
    setup: impl Fn(usize) -> C + Sync,
    decide: impl Fn(&C, usize, u64) -> bool + Sync,
    trips: impl Fn(&C, u64) -> u64 + Sync,
) -> Measured {
    let ready = Barrier::new(k);
    let out = Mutex::new(Measured {
        decisions: 0,
        round_trips: 0,
        secs,
        latency_ns: Vec::new(),
    });
    std::thread::scope(|s| {
        for inst in 0..k {
            let (ready, out, setup, decide, trips) = (&ready, &out, &setup, &decide, &trips);
            s.spawn(move || {
                let client = setup(inst);
                ready.wait();
                let end = std::time::Instant::now() + Duration::from_secs_f64(secs);
                let (mut n, mut i, mut lat) = (0, 0, Vec::new());
                while std::time::Instant::now() < end {
                    let t = std::time::Instant::now();
                    if decide(&client, inst, i) {
                        n += 1;
                    }
                    lat.push(t.elapsed().as_nanos() as u64);
                    i += 1;
                }
                let mut o = out.lock().unwrap();
                o.decisions += n;
                o.round_trips += trips(&client, n);
                o.latency_ns.extend(lat);
            });
        }
    });
    let mut m = out.into_inner().unwrap();
    m.latency_ns.sort_unstable();
    m
}

/// The figures of BENCHMARKS.md "Redis: single node vs cluster": K = 8 instances on one
/// node (with a replica) and on the 3-primary cluster, token leases and strict calls,
/// with and without `WAIT`. A measurement, not a check.
#[test]
#[ignore = "a measurement: cargo test --release -p tokengate-redis --test cluster -- --ignored --nocapture"]
fn single_node_vs_cluster_at_k_8() {
    let _one = serial();
    let node = common::cluster::Sentinels::start(0);
    let c = Cluster::start();
    let secs = 3.0;
    let k = 8;
    let single = node.primary.url();
    // WAIT's cost, paired: one thread alternates a strict call without WAIT and one
    // with it, so the machine's load weighs on both alike.
    println!("| case | p50 µs | p90 µs | p99 µs |");
    println!("|---|---|---|---|");
    for (name, url) in [
        ("single node", single.as_str()),
        ("3-primary cluster", &c.url()),
    ] {
        let ns = common::namespace("bench-wait");
        let policy = RemotePolicy::new(9_000_000, 1e6).unwrap();
        let plain = RedisScopes::connect(PoolConfig::new(url, &ns)).unwrap();
        let waiting = RedisScopes::connect(
            PoolConfig::new(url, &ns)
                .exchange_timeout(Duration::from_millis(200))
                .wait_for_replicas(1, Duration::from_millis(100)),
        )
        .unwrap();
        let (tp, tw) = (
            plain.scope("tenant", policy).unwrap(),
            waiting.scope("tenant", policy).unwrap(),
        );
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for i in 0..4000 {
            for (s, t, lat) in [(&plain, &tp, &mut a), (&waiting, &tw, &mut b)] {
                let start = std::time::Instant::now();
                s.try_acquire("acme", &[(t, "acme", 1)]).unwrap();
                if i >= 200 {
                    lat.push(start.elapsed().as_nanos() as u64);
                }
            }
        }
        for (what, lat) in [("strict call", &mut a), ("strict call, WAIT 1", &mut b)] {
            lat.sort_unstable();
            let q = |p: usize| lat[(lat.len() - 1) * p / 100] as f64 / 1000.0;
            println!(
                "| {name}, {what} | {:.0} | {:.0} | {:.0} |",
                q(50),
                q(90),
                q(99)
            );
        }
    }
    println!("| case | decisions/s | round trips / 1,000 decisions | p50 ns | p99 ns |");
    println!("|---|---|---|---|---|");
    for (name, url) in [
        ("single node", single.as_str()),
        ("3-primary cluster", &c.url()),
    ] {
        let fast = |cfg: PoolConfig| {
            cfg.exchange_timeout(Duration::from_millis(200))
                .connect_timeout(Duration::from_millis(500))
                .fail_mode(tokengate_redis::FailMode::FailClosed)
        };
        for wait in [false, true] {
            let tune = |cfg: PoolConfig| {
                let cfg = fast(cfg);
                if wait {
                    cfg.wait_for_replicas(1, Duration::from_millis(50))
                } else {
                    cfg
                }
            };
            let w = if wait { ", WAIT 1" } else { "" };
            // Token leases: 24 buckets (spread over the slots), B = 9,000,000,
            // r = 10^6/s, leases of up to 100.
            let ns = common::namespace("bench-lease");
            let policy = RemotePolicy::new(9_000_000, 1e6).unwrap();
            let m = measure(
                k,
                secs,
                |_| {
                    let pool = tokengate_redis::RedisPool::connect(tune(PoolConfig::new(url, &ns)))
                        .unwrap();
                    let buckets: Vec<_> = (0..24)
                        .map(|b| pool.bucket(&format!("b{b}"), policy).unwrap())
                        .collect();
                    (pool, buckets)
                },
                |(_, b), _, i| b[i as usize % b.len()].try_acquire(1).is_ok(),
                |(p, _), _| p.round_trips(),
            );
            m.print(&format!("{name}, token leases, K = {k}{w}"));
            // Strict calls: a tenant and a user per call, one script call each, tenants
            // spread over the slots; K = 8, then one instance alone (the round trip's
            // own latency, without queueing behind the others).
            for k in [k, 1] {
                let ns = common::namespace("bench-strict");
                let m = measure(
                    k,
                    secs,
                    |_| {
                        let s = RedisScopes::connect(tune(PoolConfig::new(url, &ns))).unwrap();
                        let t = s.scope("tenant", policy).unwrap();
                        let u = s.scope("user", policy).unwrap();
                        (s, t, u)
                    },
                    |(s, t, u), inst, i| {
                        let tenant = format!("t{}", (inst as u64 * 7 + i) % 64);
                        s.try_acquire(&tenant, &[(t, &tenant, 1), (u, "u", 1)])
                            .is_ok()
                    },
                    |_, n| if wait { 2 * n } else { n },
                );
                m.print(&format!("{name}, strict calls, K = {k}{w}"));
            }
        }
    }
}

/// The pools' rounds sent again on a new connection so far, from this binary's metrics
/// recorder (installed at the first call).
fn retries() -> f64 {
    use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    let handle = HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder).expect("the only recorder of this binary");
        handle
    });
    handle
        .render()
        .lines()
        .filter(|l| {
            l.starts_with(tokengate_redis::series::RETRIES) && l.contains(r#"client="pool""#)
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[test]
fn ask_and_moved_are_followed_within_the_call_and_the_round() {
    let _one = serial();
    // The recorder first: a pool registers its series when it starts.
    retries();
    let c = Cluster::start();
    let ns = common::namespace("cluster-redirect");
    let url = c.url();
    // A pool holding at most two one-token leases (decisions need rounds), and a strict
    // call with one key, both in the slot of tag "t".
    let pool = tokengate_redis::RedisPool::connect(
        config(&url, &ns)
            .max_lease(1)
            .lease_depth(2)
            .exchange_timeout(Duration::from_secs(1))
            // No heartbeat or idle settlement within the test: the rounds are the
            // decisions'.
            .lease_ttl(Duration::from_secs(20)),
    )
    .unwrap();
    let bucket = pool
        .bucket("t", RemotePolicy::new(1000, 0.001).unwrap())
        .unwrap();
    let strict = RedisScopes::connect(config(&url, &ns)).unwrap();
    let tenant = strict
        .scope("tenant", RemotePolicy::new(1000, 0.001).unwrap())
        .unwrap();
    let state = format!("tg:{{{ns}:t}}");
    let take_key = strict.key("t", &tenant, "acme");
    let slot = c.slot(&state);
    let drive = |n: usize| {
        let mut admitted = 0;
        for _ in 0..2000 {
            if bucket.try_acquire(1).is_ok() {
                admitted += 1;
                if admitted == n {
                    return;
                }
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        panic!("{admitted} of {n} admitted");
    };
    let take = || strict.try_acquire("t", &[(&tenant, "acme", 1)]);
    drive(5);
    assert_eq!(take(), Ok(StrictAdmitted::Taken));
    assert_eq!(c.slot(&take_key), slot);
    // The prefetch that followed the decisions is done before the slot moves.
    std::thread::sleep(Duration::from_millis(200));
    let from = c.primary_of(slot);
    let to = c.other_primary(from);
    // Mid-migration, every key moved: the source answers ASK for the strict key, which
    // the call follows (ASKING, then the take on the target).
    c.open_migration(slot, from, to);
    assert!(c.move_keys(slot, from, to, Duration::ZERO) > 0);
    assert!(!c.holds(from, &take_key) && c.holds(to, &take_key));
    assert_eq!(take(), Ok(StrictAdmitted::Taken));
    // Done: the pool's cached slot map is stale, its next round meets MOVED and follows
    // it within the round: no failed round, and no round sent again on a new connection
    // (`tokengate_redis_retries_total`).
    c.close_migration(slot, from, to);
    c.wait_ok(Duration::from_secs(10));
    let failed = pool.failed_rounds();
    let trips = pool.round_trips();
    let retried = retries();
    drive(20);
    assert!(pool.round_trips() > trips, "no round after the move");
    assert_eq!(pool.failed_rounds(), failed, "a round failed on MOVED");
    assert_eq!(retries(), retried, "a round was sent again to follow MOVED");
    assert_eq!(take(), Ok(StrictAdmitted::Taken));
    assert!(!strict.is_unavailable() && !pool.is_unavailable());
    let mut con = c.connect(to);
    let u: u64 = redis::cmd("HGET")
        .arg(&take_key)
        .arg("u")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        u / tokengate_redis::UNITS_PER_TOKEN,
        997,
        "three takes, on the target"
    );
}
