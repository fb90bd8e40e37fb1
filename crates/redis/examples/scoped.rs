//! A request's keyed scopes in Redis, its global scope local: `GlobalThenScopes`.
//!
//! `cargo run -p tokengate-redis --example scoped` against the Redis on 127.0.0.1:6379 (or
//! `TOKENGATE_REDIS_URL`). Prints each decision: the global scope (6 tokens, local) pays
//! first and gets its token back whenever the tenant (5) or user (2) scope refuses.

use tokengate::{Bucket, ManualClock, Policy};
use tokengate_redis::{GlobalThenScopes, PoolConfig, RedisScopes, RemotePolicy};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url =
        std::env::var("TOKENGATE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let namespace = format!("example-{}", std::process::id());
    let scopes = RedisScopes::connect(PoolConfig::new(url, namespace))?;
    // Refilling a token every 1,000 s: nothing comes back during the run.
    let tenant = scopes.scope("tenant", RemotePolicy::new(5, 0.001)?)?;
    let user = scopes.scope("user", RemotePolicy::new(2, 0.001)?)?;
    let global = Bucket::with_clock(Policy::new(6, 1.0)?, ManualClock::new());
    let limiter = GlobalThenScopes::new(global, scopes);
    for who in [
        "alice", "alice", "alice", "bob", "bob", "carol", "carol", "dave",
    ] {
        let decision = limiter.try_acquire(1, "acme", &[(&tenant, "acme", 1), (&user, who, 1)]);
        match decision {
            Ok(how) => println!("{who:>6}: admitted ({how:?})"),
            Err(e) => println!("{who:>6}: refused: {e}"),
        }
        println!(
            "        global scope holds {} tokens",
            limiter.global().available()
        );
    }
    Ok(())
}
