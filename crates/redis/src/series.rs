//! The crate's series through the `metrics` facade (feature `metrics`, off by default).
//!
//! Each pool and each [`RedisScopes`](crate::RedisScopes) registers its handles once, at
//! connect, with the recorder installed then; a round then adds one atomic update per
//! series it touches. Labels are bounded: `client` (`pool`, `strict`, or `strict_async`
//! for an `AsyncRedisScopes`, feature `tokio`), `outcome`, `to`, `mode`, each
//! with two or three values; never a key, scope, namespace or lease id.
//! Without the feature every call is empty and nothing is registered.

/// Round trips to Redis (one per pipeline), by `client` and `outcome` (`ok`, `failed`).
pub const ROUND_TRIPS: &str = "tokengate_redis_round_trips_total";
/// Seconds per successful round (a pool's pipeline, a strict call), by `client`.
pub const ROUND_TRIP_SECONDS: &str = "tokengate_redis_round_trip_seconds";
/// Calls that got no reply within the exchange timeout (a stalled server), by `client`;
/// each is also a failed round trip.
pub const TIMEOUTS: &str = "tokengate_redis_timeouts_total";
/// Rounds sent again on a new connection after the first attempt failed, by `client`.
pub const RETRIES: &str = "tokengate_redis_retries_total";
/// Lease grants answered, by `outcome`: `granted`, `replayed` (a grant that ran in an
/// earlier round whose reply was lost, answered again under its id), `rejected`.
pub const GRANTS: &str = "tokengate_redis_grants_total";
/// Tokens per lease granted or replayed (a histogram of grant sizes).
pub const GRANT_TOKENS: &str = "tokengate_redis_grant_tokens";
/// Whether the breaker is open (1) or closed (0), by `client`.
pub const BREAKER_OPEN: &str = "tokengate_redis_breaker_open";
/// Breaker transitions, by `client` and `to` (`open`, `closed`).
pub const BREAKER_TRANSITIONS: &str = "tokengate_redis_breaker_transitions_total";
/// Decisions admitted while Redis was unreachable, by `client` and `mode` (`fail_open`,
/// `local`).
pub const FAIL_MODE_ADMISSIONS: &str = "tokengate_redis_fail_mode_admissions_total";
/// Tokens of leases that expired here unspent (the pool's thread did not retire them in
/// time: a stalled or stopped process); Redis holds them until it reclaims the lease.
pub const EXPIRED_UNSPENT_TOKENS: &str = "tokengate_redis_expired_unspent_tokens_total";
/// Unspent tokens of retired leases not yet settled with Redis (their settlement waits
/// for the next round, or for the breaker to close): out of the fleet's budget until
/// settled or reclaimed.
pub const UNSETTLED_TOKENS: &str = "tokengate_redis_unsettled_tokens";

#[cfg(feature = "metrics")]
mod on {
    use metrics::{Counter, Gauge, Histogram, Unit};

    /// One client's handles.
    pub(crate) struct Metrics {
        ok: Counter,
        failed: Counter,
        latency: Histogram,
        retries: Counter,
        timeouts: Counter,
        granted: Counter,
        replayed: Counter,
        rejected: Counter,
        grant_tokens: Histogram,
        open: Gauge,
        opened: Counter,
        closed: Counter,
        fail_open: Counter,
        local: Counter,
        expired: Counter,
        unsettled: Gauge,
    }

    impl std::fmt::Debug for Metrics {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Metrics").finish_non_exhaustive()
        }
    }

    /// Describes every series to the recorder installed now (once per client: a
    /// recorder keeps the last description).
    fn describe() {
        use super::*;
        metrics::describe_counter!(
            ROUND_TRIPS,
            "Round trips to Redis (one per pipeline), by client and outcome"
        );
        metrics::describe_histogram!(
            ROUND_TRIP_SECONDS,
            Unit::Seconds,
            "Seconds per successful round with Redis, by client"
        );
        metrics::describe_counter!(
            TIMEOUTS,
            "Calls with no reply within the exchange timeout, by client"
        );
        metrics::describe_counter!(
            RETRIES,
            "Rounds sent again on a new connection after a failed attempt, by client"
        );
        metrics::describe_counter!(
            GRANTS,
            "Lease grants answered, by outcome (granted, replayed, rejected)"
        );
        metrics::describe_histogram!(
            GRANT_TOKENS,
            Unit::Count,
            "Tokens per lease granted or replayed"
        );
        metrics::describe_gauge!(BREAKER_OPEN, "1 while the breaker is open, by client");
        metrics::describe_counter!(
            BREAKER_TRANSITIONS,
            "Breaker transitions, by client and state entered (open, closed)"
        );
        metrics::describe_counter!(
            FAIL_MODE_ADMISSIONS,
            "Decisions admitted while Redis was unreachable, by client and fail mode"
        );
        metrics::describe_counter!(
            EXPIRED_UNSPENT_TOKENS,
            Unit::Count,
            "Tokens of leases that expired here unspent, held in Redis until reclaimed"
        );
        metrics::describe_gauge!(
            UNSETTLED_TOKENS,
            Unit::Count,
            "Unspent tokens of retired leases not yet settled with Redis"
        );
    }

    impl Metrics {
        /// Registers the handles of `client` (`pool` or `strict`).
        pub(crate) fn new(client: &'static str) -> Self {
            use super::*;
            describe();

            Self {
                ok: metrics::counter!(ROUND_TRIPS, "client" => client, "outcome" => "ok"),
                failed: metrics::counter!(ROUND_TRIPS, "client" => client, "outcome" => "failed"),
                latency: metrics::histogram!(ROUND_TRIP_SECONDS, "client" => client),
                retries: metrics::counter!(RETRIES, "client" => client),
                timeouts: metrics::counter!(TIMEOUTS, "client" => client),
                granted: metrics::counter!(GRANTS, "outcome" => "granted"),
                replayed: metrics::counter!(GRANTS, "outcome" => "replayed"),
                rejected: metrics::counter!(GRANTS, "outcome" => "rejected"),
                grant_tokens: metrics::histogram!(GRANT_TOKENS),
                open: metrics::gauge!(BREAKER_OPEN, "client" => client),
                opened: metrics::counter!(BREAKER_TRANSITIONS, "client" => client, "to" => "open"),
                closed: metrics::counter!(BREAKER_TRANSITIONS, "client" => client, "to" => "closed"),
                fail_open: metrics::counter!(
                    FAIL_MODE_ADMISSIONS, "client" => client, "mode" => "fail_open"
                ),
                local: metrics::counter!(FAIL_MODE_ADMISSIONS, "client" => client, "mode" => "local"),
                expired: metrics::counter!(EXPIRED_UNSPENT_TOKENS),
                unsettled: metrics::gauge!(UNSETTLED_TOKENS),
            }
        }

        pub(crate) const ENABLED: bool = true;

        pub(crate) fn round_trips(&self, n: u64) {
            self.ok.increment(n);
        }

        pub(crate) fn failed_round(&self) {
            self.failed.increment(1);
        }

        pub(crate) fn latency_ns(&self, ns: u64) {
            self.latency.record(ns as f64 / 1e9);
        }

        pub(crate) fn retry(&self) {
            self.retries.increment(1);
        }

        #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
        pub(crate) fn timeout(&self) {
            self.timeouts.increment(1);
        }

        pub(crate) fn grant(&self, tokens: u64, replayed: bool) {
            if replayed {
                self.replayed.increment(1);
            } else {
                self.granted.increment(1);
            }
            self.grant_tokens.record(tokens as f64);
        }

        pub(crate) fn rejected(&self) {
            self.rejected.increment(1);
        }

        /// The breaker entered the open (`true`) or closed state.
        pub(crate) fn breaker(&self, open: bool) {
            if open {
                self.open.set(1.0);
                self.opened.increment(1);
            } else {
                self.open.set(0.0);
                self.closed.increment(1);
            }
        }

        pub(crate) fn fail_open(&self, n: u64) {
            self.fail_open.increment(n);
        }

        pub(crate) fn local(&self, n: u64) {
            self.local.increment(n);
        }

        pub(crate) fn expired_unspent(&self, tokens: u64) {
            self.expired.increment(tokens);
        }

        pub(crate) fn unsettled(&self, tokens: u64) {
            self.unsettled.set(tokens as f64);
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod on {
    /// No series: the `metrics` feature is off.
    #[derive(Debug)]
    pub(crate) struct Metrics;

    #[allow(clippy::unused_self)]
    impl Metrics {
        pub(crate) fn new(_client: &'static str) -> Self {
            Self
        }
        pub(crate) const ENABLED: bool = false;
        pub(crate) fn round_trips(&self, _: u64) {}
        pub(crate) fn failed_round(&self) {}
        pub(crate) fn latency_ns(&self, _: u64) {}
        pub(crate) fn retry(&self) {}
        #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
        pub(crate) fn timeout(&self) {}
        pub(crate) fn grant(&self, _: u64, _: bool) {}
        pub(crate) fn rejected(&self) {}
        pub(crate) fn breaker(&self, _: bool) {}
        pub(crate) fn fail_open(&self, _: u64) {}
        pub(crate) fn local(&self, _: u64) {}
        pub(crate) fn expired_unspent(&self, _: u64) {}
        pub(crate) fn unsettled(&self, _: u64) {}
    }
}

pub(crate) use on::Metrics;
