//! K instance processes share one budget by rate leases on a real Redis, under
//! adversarial schedules: quiet then burst with one instance SIGSTOPped past its lease's
//! expiry (it resumes with a full bucket of a share that was handed on), demand shifting
//! from instance to instance, an instance SIGKILLed, and a Redis restart.
//!
//! Each child records every admission as [wall clock before the decision, wall clock
//! after] and prints it at once; the parent checks every window of 10 ms, 100 ms, 1 s and
//! 5 s (and the whole run) with the ideal bucket of `common::ideal`: at most `B + r*T`,
//! with no slack (one host, one clock). Each scenario runs on a private `redis-server`,
//! one at a time; the binary takes about 30 s.

mod common;

use std::process::Child;
use std::sync::Mutex;
use std::time::Duration;

use common::spawn;
use tokengate_redis::{PoolConfig, RateConfig, RatePool, RemotePolicy, Start};

const B: u64 = 200;
const RATE: u64 = 100;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} must be set for a rate child"))
}

fn env_u64(name: &str) -> u64 {
    env(name).parse().unwrap()
}

/// The child's entry point: ignored in a plain run, started by the scenarios below.
/// `TG_PHASES` is its schedule from the start time: `ms:kind,...`, kind `h` (hot: decide
/// as fast as possible), `l` (light: one decision per 200 ms per thread) or `i` (idle).
#[test]
#[ignore = "a rate-lease child, started by the rate fleet tests"]
fn rate_child() {
    let start_state = if env("TG_START") == "empty" {
        Start::Empty
    } else {
        Start::Full
    };
    let policy = RemotePolicy::new(env_u64("TG_CAP"), env_u64("TG_RATE") as f64)
        .unwrap()
        .with_start(start_state);
    let timeout = Duration::from_millis(50);
    let pool = RatePool::connect(
        RateConfig::new(
            PoolConfig::new(env("TG_URL"), env("TG_NS"))
                .lease_ttl(Duration::from_millis(env_u64("TG_TTL_MS")))
                .grace(Duration::from_millis(50))
                .exchange_timeout(timeout)
                .connect_timeout(timeout),
        )
        .refresh_divisor(4)
        .min_share_divisor(64),
    )
    .unwrap();
    let bucket = pool.bucket("global", policy).unwrap();
    let phases: Vec<(u64, char)> = env("TG_PHASES")
        .split(',')
        .map(|p| {
            let (ms, kind) = p.split_once(':').unwrap();
            (ms.parse().unwrap(), kind.chars().next().unwrap())
        })
        .collect();
    let start = env_u64("TG_START_NS");
    spawn::sleep_until(start);
    let mut at = start;
    for (ms, kind) in phases {
        let end = at + ms * 1_000_000;
        std::thread::scope(|s| {
            for _ in 0..env_u64("TG_THREADS") {
                let bucket = &bucket;
                s.spawn(move || {
                    for _ in 0..100_000_000u64 {
                        let before = common::wall_ns();
                        if before >= end {
                            break;
                        }
                        match kind {
                            'i' => {
                                std::thread::sleep(Duration::from_nanos(
                                    (end - before).min(5_000_000),
                                ));
                                continue;
                            }
                            'l' => std::thread::sleep(Duration::from_millis(200)),
                            _ => {}
                        }
                        let before = common::wall_ns();
                        if bucket.try_acquire(1).is_ok() {
                            println!("a {before} {}", common::wall_ns());
                        } else if kind == 'h' {
                            std::thread::sleep(Duration::from_micros(200));
                        }
                    }
                });
            }
        });
        at = end;
    }
    println!("rt {}", pool.round_trips());
}

/// The scenarios run one at a time (each is several processes).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `phases` (one schedule per child) on a private server, `faults` meanwhile (with
/// the children and the start time), and checks every window against `B + r*T`.
/// Returns the start time (wall ns) and each child's admissions.
fn run(
    name: &str,
    start_state: &str,
    ttl_ms: u64,
    phases: &[&str],
    faults: impl FnOnce(&mut common::Server, &mut [Child], u64),
) -> (u64, Vec<Vec<(u64, u64)>>) {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut server = common::Server::start();
    let ns = common::namespace(name);
    let start = common::wall_ns() + 1_500_000_000;
    let total_ms: u64 = phases
        .iter()
        .map(|p| {
            p.split(',')
                .map(|x| x.split_once(':').unwrap().0.parse::<u64>().unwrap())
                .sum::<u64>()
        })
        .max()
        .unwrap();
    let envs: Vec<Vec<(String, String)>> = phases
        .iter()
        .map(|p| {
            [
                ("TG_URL", server.url()),
                ("TG_NS", ns.clone()),
                ("TG_CAP", B.to_string()),
                ("TG_RATE", RATE.to_string()),
                ("TG_START", start_state.to_owned()),
                ("TG_TTL_MS", ttl_ms.to_string()),
                ("TG_THREADS", "2".to_owned()),
                ("TG_START_NS", start.to_string()),
                ("TG_PHASES", (*p).to_owned()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect()
        })
        .collect();
    let deadline = start + (total_ms + 20_000) * 1_000_000;
    let lines = spawn::run("rate_child", &envs, deadline, |children| {
        faults(&mut server, children, start);
    });
    let per_child: Vec<Vec<(u64, u64)>> = lines.iter().map(|l| spawn::admissions(l)).collect();
    let rts: u64 = lines
        .iter()
        .flatten()
        .filter_map(|l| l.strip_prefix("rt ").map(|n| n.parse::<u64>().unwrap()))
        .sum();
    let mut all: Vec<(u64, u64)> = per_child.iter().flatten().copied().collect();
    all.sort_unstable();
    eprintln!(
        "{name}: {} admitted, per child {:?}, {rts} round trips",
        all.len(),
        per_child.iter().map(Vec::len).collect::<Vec<_>>()
    );
    common::ideal::assert_within(name, &all, B, RATE * 1000, 0);
    (start, per_child)
}

/// Six instances idle for 2.5 s (their buckets fill with the whole burst split among
/// them); instance 0 is SIGSTOPped at 1 s with its bucket full, past its lease's expiry,
/// while the others take over its share and fill it; at 2.5 s it resumes and everyone
/// bursts. The resumed instance must not spend the tokens of its expired share.
#[test]
fn quiet_then_burst_with_an_instance_stopped_past_its_expiry() {
    let phases = ["2500:i,1500:h"; 6];
    let (_, per_child) = run(
        "rate-quiet-stop",
        "full",
        400,
        &phases,
        |_, children, start| {
            spawn::sleep_until(start + 1_000_000_000);
            spawn::signal(&children[0], "-STOP");
            spawn::sleep_until(start + 2_500_000_000);
            spawn::signal(&children[0], "-CONT");
        },
    );
    assert!(
        per_child.iter().all(|a| !a.is_empty()),
        "an instance never admitted"
    );
}

/// The hot spot moves: instance 0 hot for 1.2 s, then instance 1, then 2, then 3 (the
/// others light). Shares follow; every window stays within the bound.
#[test]
fn demand_shifting_between_instances() {
    let phases = [
        "1200:h,3600:l",
        "1200:l,1200:h,2400:l",
        "2400:l,1200:h,1200:l",
        "3600:l,1200:h",
        "4800:l",
        "4800:l",
    ];
    let (start, per_child) = run("rate-shift", "full", 400, &phases, |_, _, _| {});
    // Instance 3 is hot only in the last 1.2 s, beside light instances asking 50/s in
    // all: it admitted there three times what its minimum share (r/64) and the burst
    // that goes with it could.
    let hot = per_child[3]
        .iter()
        .filter(|a| a.0 >= start + 3_600_000_000)
        .count();
    assert!(hot > 30, "the hot spot's share did not follow it: {hot}");
}

/// Every instance hot; instance 0 SIGKILLed at 1 s: its share is stranded until its
/// lease expires, then taken over.
#[test]
fn an_instance_killed_mid_run() {
    let phases = ["3000:h"; 6];
    run("rate-kill", "full", 400, &phases, |_, children, start| {
        spawn::sleep_until(start + 1_000_000_000);
        let _ = children[0].kill();
    });
}

/// Redis killed and restarted empty at 1 s, every instance hot, the policy starting
/// empty: for one lease lifetime nobody gets more than it reports spending, so the
/// fleet stays within `B + r*T` across the loss.
#[test]
fn a_redis_restart() {
    let phases = ["3000:h"; 6];
    run("rate-restart", "empty", 400, &phases, |server, _, start| {
        spawn::sleep_until(start + 1_000_000_000);
        server.stop();
        server.ensure_running();
    });
}
