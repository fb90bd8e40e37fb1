//! Helpers shared by the tests against a real Redis.
#![allow(dead_code, unreachable_pub)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use tokengate_redis::model::{ModelBucket, ModelState};
use tokengate_redis::script::BucketKeys;

/// The shared server the tests run against (`.ci/run` starts it).
pub fn url() -> String {
    std::env::var("TOKENGATE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned())
}

/// A connection to the shared server; a test fails (never skips) when it is not there.
pub fn connect() -> redis::Connection {
    let client = redis::Client::open(url()).expect("redis url");
    client
        .get_connection_with_timeout(std::time::Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("a Redis server must answer on {} (see .ci/run): {e}", url()))
}

/// A namespace no other test (or run) uses.
pub fn namespace(test: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("t-{test}-{}-{nanos}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// The bucket's keys as they are in Redis, in the model's shape.
pub fn read_bucket(con: &mut redis::Connection, keys: &BucketKeys) -> ModelBucket {
    let (state, leases, expiry): (
        BTreeMap<String, u64>,
        BTreeMap<String, u64>,
        Vec<(String, u64)>,
    ) = redis::pipe()
        .hgetall(&keys.state)
        .hgetall(&keys.leases)
        .zrange_withscores(&keys.expiry, 0, -1)
        .query(con)
        .expect("read bucket");
    let state = (!state.is_empty()).then(|| ModelState {
        u: state["u"],
        ts: state["ts"],
        rem: state["rem"],
        out: state["out"],
        ep: state["ep"],
    });
    ModelBucket {
        state,
        leases,
        expiry: expiry.into_iter().map(|(id, at)| (at, id)).collect::<BTreeSet<_>>(),
    }
}

/// Deletes the bucket's keys.
pub fn delete(con: &mut redis::Connection, keys: &BucketKeys) {
    let _: () = redis::cmd("DEL")
        .arg(&keys.state)
        .arg(&keys.leases)
        .arg(&keys.expiry)
        .query(con)
        .expect("del");
}
