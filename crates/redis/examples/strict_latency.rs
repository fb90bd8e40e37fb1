//! The strict path's latency, blocking (`RedisScopes`, K threads) vs async
//! (`AsyncRedisScopes`, K tasks on a tokio runtime), against a real Redis, and the async
//! path's latency while the server is stalled (a loopback proxy that stops forwarding).
//!
//! ```sh
//! cargo run --release -p tokengate-redis --features tokio --example strict_latency -- [URL] [CALLS_PER_WORKER]
//! ```

use std::sync::Arc;
use std::time::Instant;

use tokengate_redis::{AsyncRedisScopes, FailMode, PoolConfig, RedisScopes, RemotePolicy};
use tokengate_testkit::net::{BlackHole, LOCAL_REDIS_URL, namespace};

/// p50, p99 and max of `ns`, as µs.
fn summary(mut ns: Vec<u64>) -> String {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() as f64 * q) as usize).min(ns.len() - 1)] as f64 / 1000.0;
    format!(
        "n {:>6}  p50 {:>8.1} µs  p99 {:>8.1} µs  max {:>9.1} µs",
        ns.len(),
        at(0.50),
        at(0.99),
        *ns.last().unwrap() as f64 / 1000.0
    )
}

fn policy() -> RemotePolicy {
    // Large enough that every call is a take (the same script work each time).
    RemotePolicy::new(1_000_000, 100_000.0).unwrap()
}

fn blocking(url: &str, k: usize, calls: usize) -> Vec<u64> {
    let scopes = Arc::new(
        RedisScopes::connect(PoolConfig::new(url, namespace("bench-latency-sync"))).unwrap(),
    );
    let scope = scopes.scope("tenant", policy()).unwrap();
    let threads: Vec<_> = (0..k)
        .map(|i| {
            let (scopes, scope) = (Arc::clone(&scopes), scope.clone());
            std::thread::spawn(move || {
                let key = format!("k{i}");
                (0..calls)
                    .map(|_| {
                        let t = Instant::now();
                        scopes.try_acquire(&key, &[(&scope, &key, 1)]).unwrap();
                        t.elapsed().as_nanos() as u64
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect()
}

async fn awaited(
    config: PoolConfig,
    k: usize,
    calls: usize,
    stall: Option<&BlackHole>,
) -> Vec<u64> {
    let scopes = Arc::new(AsyncRedisScopes::connect(config).await.unwrap());
    let scope = scopes.scope("tenant", policy()).unwrap();
    if let Some(proxy) = stall {
        proxy.cut();
    }
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..k {
        let (scopes, scope) = (Arc::clone(&scopes), scope.clone());
        tasks.spawn(async move {
            let key = format!("k{i}");
            let mut out = Vec::with_capacity(calls);
            for _ in 0..calls {
                let t = Instant::now();
                let _ = scopes.try_acquire(&key, &[(&scope, &key, 1)]).await;
                out.push(t.elapsed().as_nanos() as u64);
            }
            out
        });
    }
    let mut all = Vec::new();
    while let Some(t) = tasks.join_next().await {
        all.extend(t.unwrap());
    }
    all
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| LOCAL_REDIS_URL.to_owned());
    let calls: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(2000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "strict take, one key per worker, {calls} calls per worker, {url}, {} CPUs",
        std::thread::available_parallelism().map_or(0, usize::from)
    );
    for k in [1, 8, 32] {
        println!(
            "K = {k:>2} sync  threads: {}",
            summary(blocking(&url, k, calls))
        );
        let config = PoolConfig::new(url.as_str(), namespace("bench-latency-async"));
        println!(
            "K = {k:>2} async tasks:   {}",
            summary(rt.block_on(awaited(config, k, calls, None)))
        );
    }
    // Stalled: every call meets either the exchange timeout (a call on the network) or
    // the open breaker (the fail mode, at once).
    for k in [1, 8, 32] {
        let proxy = BlackHole::to_url(&url);
        let config = PoolConfig::new(proxy.url(), namespace("bench-latency-stall"))
            .fail_mode(FailMode::FailOpen);
        let start = Instant::now();
        let ns = rt.block_on(awaited(config, k, calls / 10, Some(&proxy)));
        println!(
            "K = {k:>2} async, stalled server (exchange timeout 50 ms, fail open): {}  ({:.1} s)",
            summary(ns),
            start.elapsed().as_secs_f64()
        );
    }
}
