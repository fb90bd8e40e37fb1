//! The circuit breaker of a pool's connection: opens after consecutive failed rounds,
//! probes again after a full-jitter backoff that doubles up to a ceiling, and closes only
//! after consecutive successful rounds (one lucky probe of a flapping link does not close
//! it; a failure while closing opens it again at once).

use std::time::Duration;

/// Consecutive failed rounds that open the breaker.
pub(crate) const FAILURES_TO_OPEN: u32 = 3;

/// Consecutive successful rounds, after it opened, that close the breaker.
pub(crate) const SUCCESSES_TO_CLOSE: u32 = 3;

/// The breaker's state, owned by the background thread.
#[derive(Debug)]
pub(crate) struct Breaker {
    failures: u32,
    open_rounds: u32,
    probe_at: Option<u64>,
    /// Successful rounds since the last failure while it closes (`None`: not closing).
    closing: Option<u32>,
    /// A probe is in flight (claimed by [`Breaker::claim`], not yet released).
    probing: bool,
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
            closing: None,
            probing: false,
            min,
            max: max.max(min),
            rng: seed | 1,
        }
    }

    /// Whether a round may run at `now_ns`: closed, or open with its probe due.
    pub(crate) fn may_try(&self, now_ns: u64) -> bool {
        self.probe_at.is_none_or(|at| now_ns >= at)
    }

    /// The right of a caller among many to send a round at `now_ns`: `Some(false)` while
    /// closed (or closing), `Some(true)` for the one caller that takes the probe once it
    /// is due, `None` while open for everyone else, until the probe's holder
    /// [releases](Breaker::release_probe) it after recording its round.
    pub(crate) fn claim(&mut self, now_ns: u64) -> Option<bool> {
        match self.probe_at {
            None => Some(false),
            Some(at) if now_ns >= at && !self.probing => {
                self.probing = true;
                Some(true)
            }
            Some(_) => None,
        }
    }

    /// Ends the probe claimed by [`Breaker::claim`] (recorded or abandoned).
    pub(crate) fn release_probe(&mut self) {
        self.probing = false;
    }

    /// Whether the breaker is open (or closing: not yet closed).
    pub(crate) fn is_open(&self) -> bool {
        self.probe_at.is_some() || self.closing.is_some()
    }

    /// Whether the breaker is closing: rounds run back to back until it closes.
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.is_some()
    }

    /// The next probe time, ns, while open.
    pub(crate) fn probe_at(&self) -> Option<u64> {
        self.probe_at
    }

    /// Records a successful round; returns whether the breaker is closed.
    pub(crate) fn success(&mut self) -> bool {
        self.failures = 0;
        if !self.is_open() {
            return true;
        }
        self.probe_at = None;
        let n = self.closing.map_or(1, |n| n + 1);
        if n >= SUCCESSES_TO_CLOSE {
            self.closing = None;
            self.open_rounds = 0;
            true
        } else {
            self.closing = Some(n);
            false
        }
    }

    /// Records a failed round at `now_ns`; returns whether the breaker is open.
    pub(crate) fn failure(&mut self, now_ns: u64) -> bool {
        if self.closing.take().is_some() {
            self.failures = FAILURES_TO_OPEN - 1;
        }
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
        // Closed by consecutive successes only; a failure while closing opens it again.
        assert!(!b.success());
        assert!(b.is_open() && b.may_try(at));
        assert!(b.failure(at));
        assert!(!b.may_try(at));
        for _ in 1..SUCCESSES_TO_CLOSE {
            assert!(!b.success());
        }
        assert!(b.success());
        assert!(!b.is_open());
        assert!(b.may_try(0));
        assert!(b.success());
    }

    #[test]
    fn one_probe_is_claimed_at_a_time() {
        let mut b = Breaker::new(Duration::from_millis(100), Duration::from_secs(5), 7);
        assert_eq!(b.claim(0), Some(false));
        for _ in 0..FAILURES_TO_OPEN {
            b.failure(0);
        }
        let at = b.probe_at().unwrap();
        assert_eq!(b.claim(at - 1), None);
        assert_eq!(b.claim(at), Some(true));
        assert_eq!(b.claim(at), None, "a second probe while the first is out");
        // The probe fails: open again, later; released, the next is claimed when due.
        b.failure(at);
        b.release_probe();
        let next = b.probe_at().unwrap();
        assert_eq!(b.claim(next - 1), None);
        assert_eq!(b.claim(next), Some(true));
        // It succeeds: closing, everyone may call.
        b.success();
        b.release_probe();
        assert_eq!(b.claim(next), Some(false));
        assert_eq!(b.claim(next), Some(false));
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
