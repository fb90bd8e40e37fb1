//! The circuit breaker of a pool's connection: opens after consecutive failed rounds,
//! probes again after a full-jitter backoff that doubles up to a ceiling.

use std::time::Duration;

/// Consecutive failed rounds that open the breaker.
pub(crate) const FAILURES_TO_OPEN: u32 = 3;

/// The breaker's state, owned by the background thread.
#[derive(Debug)]
pub(crate) struct Breaker {
    failures: u32,
    open_rounds: u32,
    probe_at: Option<u64>,
    min: Duration,
    max: Duration,
    rng: u64,
}

impl Breaker {
    pub(crate) fn new(min: Duration, max: Duration, seed: u64) -> Self {
        Self {
            failures: 0,
            open_rounds: 0,
            probe_at: None,
            min,
            max: max.max(min),
            rng: seed | 1,
        }
    }

    /// Whether a round may run at `now_ns`: closed, or open with its probe due.
    pub(crate) fn may_try(&self, now_ns: u64) -> bool {
        self.probe_at.is_none_or(|at| now_ns >= at)
    }

    /// Whether the breaker is open.
    pub(crate) fn is_open(&self) -> bool {
        self.probe_at.is_some()
    }

    /// The next probe time, ns, while open.
    pub(crate) fn probe_at(&self) -> Option<u64> {
        self.probe_at
    }

    pub(crate) fn success(&mut self) {
        self.failures = 0;
        self.open_rounds = 0;
        self.probe_at = None;
    }

    /// Records a failed round at `now_ns`; returns whether the breaker is open.
    pub(crate) fn failure(&mut self, now_ns: u64) -> bool {
        self.failures = self.failures.saturating_add(1);
        if self.failures >= FAILURES_TO_OPEN {
            let ceiling = self
                .min
                .saturating_mul(1 << self.open_rounds.min(16))
                .min(self.max)
                .as_nanos() as u64;
            self.open_rounds += 1;
            // Full jitter (xorshift): uniform in [min/2, ceiling], so instances that
            // failed together do not probe together.
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let floor = (self.min.as_nanos() as u64) / 2;
            let wait = floor + self.rng % (ceiling.saturating_sub(floor) + 1);
            self.probe_at = Some(now_ns.saturating_add(wait));
        }
        self.is_open()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_three_failures_and_closes_on_success() {
        let mut b = Breaker::new(Duration::from_millis(100), Duration::from_secs(5), 7);
        assert!(!b.failure(0));
        assert!(!b.failure(0));
        assert!(b.failure(0));
        let at = b.probe_at().unwrap();
        assert!((50_000_000..=100_000_000).contains(&at), "{at}");
        assert!(!b.may_try(at - 1));
        assert!(b.may_try(at));
        b.success();
        assert!(!b.is_open());
        assert!(b.may_try(0));
    }

    #[test]
    fn probes_back_off_up_to_the_ceiling_with_jitter() {
        let mut b = Breaker::new(Duration::from_millis(100), Duration::from_secs(5), 99);
        let mut waits = Vec::new();
        for _ in 0..12 {
            b.failure(0);
            if let Some(at) = b.probe_at() {
                waits.push(at);
            }
        }
        assert!(waits.iter().all(|&w| w <= 5_000_000_000));
        assert!(waits.iter().any(|&w| w > 400_000_000), "{waits:?}");
        let mut distinct = waits.clone();
        distinct.dedup();
        assert!(distinct.len() > 3, "{waits:?}");
    }
}
