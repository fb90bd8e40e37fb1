//! A thundering herd, simulated: many clients refused at the same instant by one bucket,
//! each retrying with the [`retry`](tokengate::retry) helper, on a manual clock.
//!
//! Every client sends one request at time zero to a server bucket that starts empty, so
//! all are refused together. Each refusal goes over the wire as the server would send it
//! (the `Retry-After` header value, parsed back by the client), and the client asks its
//! own [`Retry`] for the next delay. The simulation is event-driven and deterministic: a
//! seed fixes every client's jitter.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use tokengate::retry::{Retry, RetryPolicy, SplitMix64};
use tokengate::{Bucket, ManualClock, Policy, http};

/// What to simulate.
#[derive(Clone, Copy, Debug)]
pub struct Herd {
    /// Clients, all sending their first request at time zero.
    pub clients: usize,
    /// The server's bucket policy (started empty whatever its start state).
    pub server: Policy,
    /// Every client's retry policy.
    pub retry: RetryPolicy,
    /// Seed of the clients' jitter.
    pub seed: u64,
    /// Width of the window in which retries are counted together.
    pub window: Duration,
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HerdReport {
    /// Retries made (attempts after the first), all clients together.
    pub retries: usize,
    /// The most retries that arrived within any one window (sliding, of width
    /// [`Herd::window`]).
    pub max_retries_in_window: usize,
    /// Clients admitted in the end.
    pub admitted: usize,
    /// Clients that gave up (attempts or deadline).
    pub gave_up: usize,
    /// When the last client was admitted.
    pub last_admission: Duration,
    /// Arrival time of every retry, in order.
    pub retry_times: Vec<Duration>,
}

/// Runs the simulation.
pub fn simulate(herd: &Herd) -> HerdReport {
    let clock = ManualClock::new();
    let server = Bucket::with_clock(herd.server.start_empty(), clock.clone());
    let mut seeds = SplitMix64::new(herd.seed);
    let mut clients: Vec<_> = (0..herd.clients)
        .map(|_| {
            let rng = SplitMix64::new(tokengate::retry::RandomSource::next_u64(&mut seeds));
            Retry::with_rng(herd.retry, clock.clone(), rng)
        })
        .collect();
    let mut queue: BinaryHeap<Reverse<(u64, usize)>> =
        (0..herd.clients).map(|c| Reverse((0, c))).collect();

    let mut report = HerdReport {
        retries: 0,
        max_retries_in_window: 0,
        admitted: 0,
        gave_up: 0,
        last_admission: Duration::ZERO,
        retry_times: Vec::new(),
    };
    while let Some(Reverse((at, c))) = queue.pop() {
        clock.set(Duration::from_nanos(at));
        let retry = &mut clients[c];
        if retry.attempt().is_retry() {
            report.retries += 1;
            report.retry_times.push(clock.now());
        }
        let decision = server
            .try_acquire(1)
            .expect("cost 1 fits; the clock only moves forward");
        if decision.is_admitted() {
            report.admitted += 1;
            report.last_admission = clock.now();
            continue;
        }
        // Over the wire and back: whole seconds, rounded up.
        let header = http::retry_after(&decision).map(|s| s.to_string());
        let retry_after = header.as_deref().and_then(http::parse_retry_after);
        match retry.next_delay(retry_after) {
            Ok(delay) => {
                let next = at.saturating_add(u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX));
                queue.push(Reverse((next, c)));
            }
            Err(_) => report.gave_up += 1,
        }
    }
    report.max_retries_in_window = max_in_window(&report.retry_times, herd.window);
    report
}

/// The most of the sorted `times` within any half-open window `[t, t + width)`.
pub fn max_in_window(times: &[Duration], width: Duration) -> usize {
    let mut best = 0;
    let mut start = 0;
    for (end, &t) in times.iter().enumerate() {
        while times[start] + width <= t {
            start += 1;
        }
        best = best.max(end + 1 - start);
    }
    best
}
