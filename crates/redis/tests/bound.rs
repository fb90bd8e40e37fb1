//! The bound `admitted(T) <= B + r*T` of one instance under schedules that are not steady,
//! checked by the ideal bucket of `common::ideal` on the admissions' wall-clock times.

mod common;

use std::time::Duration;

use tokengate_redis::{PoolConfig, RedisPool, RemotePolicy};

/// One token taken, 900 ms of quiet while the instance holds its lease and Redis sits at
/// its cap `B - out`, then a burst: the settlement of the spent lease must not refill the
/// quiet time a second time. (Refilled after the settlement, 289 were admitted in 100 ms
/// where 210 are allowed.)
#[test]
fn a_burst_after_a_quiet_period_stays_within_b_plus_rt() {
    let (cap, rate) = (200, 100.0);
    let pool =
        RedisPool::connect(PoolConfig::new(common::url(), common::namespace("quiet"))).unwrap();
    let bucket = pool
        .bucket("global", RemotePolicy::new(cap, rate).unwrap())
        .unwrap();
    let mut log = Vec::new();
    common::wait_until(
        "the first token",
        Duration::from_secs(5),
        || {
            let before = common::wall_ns();
            let ok = bucket.try_acquire(1).is_ok();
            if ok {
                log.push((before, common::wall_ns()));
            }
            ok
        },
        || std::thread::sleep(Duration::from_millis(1)),
    );
    std::thread::sleep(Duration::from_millis(900));
    common::drive_logged(&bucket, Duration::from_millis(300), &mut log);
    common::ideal::assert_within(
        "quiet 900 ms then burst, one instance",
        &log,
        cap,
        100_000,
        0,
    );
}
