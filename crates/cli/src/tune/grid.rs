//! The grid of policies and the replay of one cell: every request charged to its key's
//! bucket in a keyed limiter on its own manual clock, as production would decide it.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::time::Duration;

use tokengate::keyed::{KeyedError, KeyedLimiter};
use tokengate::reservation::ReserveError;
use tokengate::{AcquireError, Bucket, ManualClock, Policy, PolicyError};

use super::stream::Event;

/// A fixed hasher: the map's layout, and so which keys an eviction finds, is the same on
/// every run. The keys are dense indices `tune` assigned, not attacker-chosen text.
type Fixed = BuildHasherDefault<IdHasher>;

/// Fibonacci hashing of a key index: one multiplication. The high bits (the map's tag
/// and shard) are well mixed, and the low bits (the slot) are a bijection of the index's
/// low bits, so dense indices do not collide.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// The shard count of every cell's map: fixed, so the replay does not depend on the
/// machine's number of hardware threads (the engine's default).
const SHARDS: usize = 16;

/// Bins of the reservation delay histogram, over `0..=max_wait`.
pub(crate) const DELAY_BINS: usize = 1000;

/// `n` values from `lo` to `hi` (both included), evenly spaced on a log scale.
pub(crate) fn log_spaced(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if n <= 1 || lo == hi {
        return vec![lo];
    }
    let (a, b) = (lo.ln(), hi.ln());
    (0..n)
        .map(|i| {
            let v = (a + (b - a) * i as f64 / (n - 1) as f64).exp();
            // Land exactly on the ends despite rounding in exp(ln(x)).
            if i == 0 {
                lo
            } else if i == n - 1 {
                hi
            } else {
                v
            }
        })
        .collect()
}

/// Capacities: `n` log-spaced whole numbers from `lo` to `hi`, duplicates (from
/// rounding at the low end) dropped.
pub(crate) fn capacities(lo: u64, hi: u64, n: usize) -> Vec<u64> {
    let mut v: Vec<u64> = log_spaced(lo as f64, hi as f64, n)
        .into_iter()
        .map(|c| (c.round() as u64).clamp(lo, hi))
        .collect();
    v.dedup();
    v
}

/// How every cell replays.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Setup {
    /// The keyed limiter's maximum number of keys.
    pub(crate) max_keys: usize,
    /// Simulated time between sweeps of the keyed map (eviction of refilled buckets).
    pub(crate) sweep_every: Duration,
    /// With a maximum wait, requests reserve (wait up to this long) instead of being
    /// rejected at once.
    pub(crate) max_wait: Option<Duration>,
}

/// What one cell decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    pub(crate) requests: u64,
    pub(crate) tokens: u64,
    pub(crate) rejected: u64,
    pub(crate) rejected_tokens: u64,
    /// Rejections of a new key because the map held its maximum of keys.
    pub(crate) key_limit: u64,
    /// Rejections of a cost above the capacity.
    pub(crate) too_costly: u64,
    /// Rejected requests of each key, by key index.
    pub(crate) rejected_by_key: Vec<u64>,
    /// Reservation delays, with a maximum wait: `DELAY_BINS` bins over `0..=max_wait`.
    pub(crate) delays: Vec<u64>,
    /// Requests admitted after a wait above zero.
    pub(crate) delayed: u64,
    /// The longest wait, exact.
    pub(crate) max_delay: Duration,
}

enum Engine {
    Keyed {
        limiter: Box<KeyedLimiter<u32, ManualClock, Fixed>>,
        /// When the last sweep ran, if one has.
        last_sweep: Option<u64>,
    },
    Reserve {
        buckets: HashMap<u32, Bucket<ManualClock>>,
        policy: Box<Policy>,
        max_wait: Duration,
    },
}

/// One policy of the grid and its replay state.
pub(crate) struct Cell {
    pub(crate) capacity: u64,
    pub(crate) rate: f64,
    pub(crate) stats: Stats,
    clock: ManualClock,
    engine: Engine,
    sweep_every: u64,
}

impl std::fmt::Debug for Cell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cell")
            .field("capacity", &self.capacity)
            .field("rate", &self.rate)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Cell {
    /// A cell of capacity `capacity` and refill rate `rate`.
    ///
    /// # Errors
    ///
    /// The policy's error when the engine cannot represent it (for example a rate too
    /// small for the capacity), or a bad maximum number of keys.
    pub(crate) fn new(capacity: u64, rate: f64, setup: &Setup) -> Result<Cell, String> {
        let clock = ManualClock::new();
        let engine = match setup.max_wait {
            None => {
                let policy = Policy::new(capacity, rate).map_err(|e: PolicyError| e.to_string())?;
                let limiter = KeyedLimiter::builder(policy, setup.max_keys)
                    .clock(clock.clone())
                    .hasher(Fixed::default())
                    .shards(SHARDS)
                    .build()
                    .map_err(|e| e.to_string())?;
                Engine::Keyed {
                    limiter: Box::new(limiter),
                    last_sweep: None,
                }
            }
            Some(max_wait) => Engine::Reserve {
                policy: Box::new(
                    Policy::builder(capacity, rate)
                        .max_reservation(max_wait)
                        .build()
                        .map_err(|e| e.to_string())?,
                ),
                buckets: HashMap::new(),
                max_wait,
            },
        };
        let stats = Stats {
            delays: if setup.max_wait.is_some() {
                vec![0; DELAY_BINS]
            } else {
                Vec::new()
            },
            ..Stats::default()
        };
        Ok(Cell {
            capacity,
            rate,
            stats,
            clock,
            engine,
            sweep_every: u64::try_from(setup.sweep_every.as_nanos()).unwrap_or(u64::MAX),
        })
    }

    /// Replays `events`, which are in time order and later than every event replayed
    /// before.
    pub(crate) fn replay(&mut self, events: &[Event]) {
        for e in events {
            self.clock.set(Duration::from_nanos(e.at));
            let cost = u64::from(e.cost);
            let s = &mut self.stats;
            s.requests += 1;
            s.tokens += cost;
            let admitted = match &mut self.engine {
                Engine::Keyed {
                    limiter,
                    last_sweep,
                } => {
                    sweep_until(limiter, last_sweep, self.sweep_every, e.at);
                    match limiter.try_acquire(&e.key, cost) {
                        Ok(d) => d.is_admitted(),
                        Err(KeyedError::KeyLimit { .. }) => {
                            s.key_limit += 1;
                            false
                        }
                        Err(KeyedError::Acquire(AcquireError::CostExceedsCapacity { .. })) => {
                            s.too_costly += 1;
                            false
                        }
                        // The clock only moves forward here: no other error can occur,
                        // and a refusal is what production would see.
                        Err(_) => false,
                    }
                }
                Engine::Reserve {
                    buckets,
                    policy,
                    max_wait,
                } => {
                    let bucket = buckets
                        .entry(e.key)
                        .or_insert_with(|| Bucket::with_clock(**policy, self.clock.clone()));
                    match bucket.reserve(cost, *max_wait) {
                        Ok(r) => {
                            let wait = r.wait();
                            r.consume();
                            record_delay(s, wait, *max_wait);
                            true
                        }
                        Err(ReserveError::CostExceedsCapacity { .. }) => {
                            s.too_costly += 1;
                            false
                        }
                        Err(_) => false,
                    }
                }
            };
            if !admitted {
                s.rejected += 1;
                s.rejected_tokens += cost;
                let k = e.key as usize;
                if k >= s.rejected_by_key.len() {
                    s.rejected_by_key.resize(k + 1, 0);
                }
                s.rejected_by_key[k] += 1;
            }
        }
    }
}

/// Runs the sweeps a sweeper every `every` nanoseconds of log time would have run up to
/// `now`. Between two requests nothing but refill happens, so one sweep at the last
/// scheduled time leaves the map as all of them would (a bucket full at an earlier sweep
/// is still full); across a long gap, sweeps at most half the map's
/// [`max_sweep_interval`](KeyedLimiter::max_sweep_interval) apart re-anchor idle buckets
/// before they leave their tick field's window. Leaves the clock at `now`.
fn sweep_until(
    limiter: &KeyedLimiter<u32, ManualClock, Fixed>,
    last_sweep: &mut Option<u64>,
    every: u64,
    now: u64,
) {
    let every = every.max(1);
    let due = last_sweep.map_or(0, |t| t.saturating_add(every));
    if now < due {
        return;
    }
    let last = due + (now - due) / every * every;
    let step = u64::try_from(limiter.max_sweep_interval().as_nanos() / 2)
        .unwrap_or(u64::MAX)
        .max(1);
    let mut t = last_sweep.unwrap_or(0);
    while last - t > step {
        t += step;
        limiter.clock().set(Duration::from_nanos(t));
        limiter.sweep();
    }
    limiter.clock().set(Duration::from_nanos(last));
    limiter.sweep();
    limiter.clock().set(Duration::from_nanos(now));
    *last_sweep = Some(last);
}

fn record_delay(s: &mut Stats, wait: Duration, max_wait: Duration) {
    let bins = DELAY_BINS as u128;
    let bin = (wait.as_nanos() * bins / max_wait.as_nanos().max(1)).min(bins - 1);
    s.delays[bin as usize] += 1;
    if !wait.is_zero() {
        s.delayed += 1;
    }
    s.max_delay = s.max_delay.max(wait);
}

/// The `q`-quantile (0 < q <= 1) of the recorded delays, nearest rank, as the upper edge
/// of its bin: at most `max_wait / DELAY_BINS` above the true value, never below it.
pub(crate) fn delay_quantile(s: &Stats, q: f64, max_wait: Duration) -> Option<Duration> {
    let total: u64 = s.delays.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (i, &n) in s.delays.iter().enumerate() {
        seen += n;
        if seen >= rank {
            let edge = max_wait.as_nanos() * (i as u128 + 1) / DELAY_BINS as u128;
            let edge = Duration::from_nanos(u64::try_from(edge).unwrap_or(u64::MAX));
            return Some(edge.min(s.max_delay));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokengate_testkit::{Model, Outcome};

    const NANOS: u64 = 1_000_000_000;

    fn setup() -> Setup {
        Setup {
            max_keys: 1 << 20,
            sweep_every: Duration::from_secs(10),
            max_wait: None,
        }
    }

    #[test]
    fn log_spacing_hits_both_ends_and_rounds_capacities() {
        let v = log_spaced(1.0, 1000.0, 4);
        assert_eq!(v[0], 1.0);
        assert_eq!(v[3], 1000.0);
        assert!((v[1] - 10.0).abs() < 1e-9 && (v[2] - 100.0).abs() < 1e-9);
        assert_eq!(capacities(1, 4, 10), [1, 2, 3, 4]);
        assert_eq!(capacities(5, 5, 3), [5]);
    }

    /// A small deterministic generator (xorshift) for the replay property below.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn replay_decides_as_the_exact_model_per_key() {
        for seed in 1..=20u64 {
            let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let capacity = 1 + next(&mut rng) % 20;
            let rate = [0.5, 3.0, 10.0, 77.7][(next(&mut rng) % 4) as usize];
            let mut cell = Cell::new(capacity, rate, &setup()).unwrap();
            let policy = Policy::new(capacity, rate).unwrap();
            let mut models: HashMap<u32, Model> = HashMap::new();
            let (mut at, mut expected, mut by_key) = (0u64, 0u64, vec![0u64; 4]);
            let mut events = Vec::new();
            for _ in 0..2000 {
                at += next(&mut rng) % (NANOS / 5);
                let key = (next(&mut rng) % 4) as u32;
                let cost = (1 + next(&mut rng) % 4) as u32;
                events.push(Event { at, key, cost });
                let model = models.entry(key).or_insert_with(|| Model::new(&policy, at));
                match model.try_acquire(u64::from(cost), at) {
                    Outcome::Admitted { .. } => {}
                    _ => {
                        expected += 1;
                        by_key[key as usize] += 1;
                    }
                }
            }
            // Chunk boundaries do not matter.
            cell.replay(&events[..700]);
            cell.replay(&events[700..]);
            assert_eq!(cell.stats.requests, 2000);
            assert_eq!(
                cell.stats.rejected, expected,
                "seed {seed}: B={capacity} r={rate}"
            );
            let mut got = cell.stats.rejected_by_key.clone();
            got.resize(4, 0);
            assert_eq!(got, by_key, "seed {seed}");
        }
    }

    #[test]
    fn a_cost_above_the_capacity_is_rejected_and_counted() {
        let mut cell = Cell::new(3, 1.0, &setup()).unwrap();
        cell.replay(&[
            Event {
                at: 0,
                key: 0,
                cost: 4,
            },
            Event {
                at: 1,
                key: 0,
                cost: 3,
            },
        ]);
        assert_eq!((cell.stats.rejected, cell.stats.too_costly), (1, 1));
        assert_eq!(cell.stats.rejected_tokens, 4);
    }

    #[test]
    fn a_full_map_rejects_a_new_key_until_a_refilled_bucket_can_go() {
        let s = Setup {
            max_keys: 1,
            ..setup()
        };
        let mut cell = Cell::new(1, 1.0, &s).unwrap();
        cell.replay(&[
            Event {
                at: 0,
                key: 0,
                cost: 1,
            },
            Event {
                at: 1,
                key: 1,
                cost: 1,
            },
            // Key 0 has refilled by 10 s: evictable, it makes room for key 1.
            Event {
                at: 10 * NANOS,
                key: 1,
                cost: 1,
            },
        ]);
        assert_eq!(cell.stats.key_limit, 1);
        assert_eq!(cell.stats.rejected_by_key, [0, 1]);
    }

    #[test]
    fn idle_buckets_across_gaps_longer_than_the_tick_wrap_decide_as_the_model() {
        // The slowest-filling policy on a decade grid whose tick field wraps within the
        // clock's range (and 1.5 wraps still fit in a u64 of nanoseconds) fills in
        // years; a layout wraps after more than twice its fill time. A drained bucket idle
        // for 1.5 wrap periods is full, as the model says, whatever the gap reads modulo
        // the wrap.
        let (policy, rate) = (0..=6)
            .flat_map(|c| (0..=12).map(move |k| (10u64.pow(c), 10f64.powi(-k))))
            .filter_map(|(c, r)| Some((Policy::new(c, r).ok()?, r)))
            .filter(|(p, _)| p.wrap_period() <= Duration::from_nanos(1 << 62))
            .max_by(|a, b| {
                let fill = |(p, r): &(Policy, f64)| p.capacity() as f64 / r;
                fill(a).total_cmp(&fill(b))
            })
            .unwrap();
        let capacity = policy.capacity();
        let wrap = u64::try_from(policy.wrap_period().as_nanos()).unwrap();
        let fill = capacity as f64 / rate * 1e9;
        assert!(fill > 1e9 * 3600.0 * 24.0 * 365.0, "fills in {fill} ns");
        let mut cell = Cell::new(policy.capacity(), rate, &setup()).unwrap();
        let gap = wrap + wrap / 2;
        let refilled = capacity;
        let events = [
            Event {
                at: 0,
                key: 0,
                cost: capacity as u32,
            },
            Event {
                at: gap,
                key: 1,
                cost: 1,
            },
            Event {
                at: gap,
                key: 0,
                cost: (refilled - 10) as u32,
            },
            Event {
                at: gap,
                key: 0,
                cost: 20,
            },
        ];
        let mut models: HashMap<u32, Model> = HashMap::new();
        let mut outcomes = Vec::new();
        for e in &events {
            let m = models
                .entry(e.key)
                .or_insert_with(|| Model::new(&policy, e.at));
            outcomes.push(matches!(
                m.try_acquire(u64::from(e.cost), e.at),
                Outcome::Admitted { .. }
            ));
        }
        assert_eq!(outcomes, [true, true, true, false]);
        cell.replay(&events);
        // The last request (20 tokens) is the one refused, not the big one.
        assert_eq!(cell.stats.rejected_by_key, [1], "{:?}", cell.stats);
        assert_eq!(cell.stats.rejected_tokens, 20, "{:?}", cell.stats);
    }

    #[test]
    fn reservations_wait_instead_of_rejecting_up_to_the_maximum() {
        let max_wait = Duration::from_millis(1200);
        let s = Setup {
            max_wait: Some(max_wait),
            ..setup()
        };
        // B = 1, r = 2/s, a burst of 4: waits of 0, about 500 ms and about 1 s; the
        // fourth would wait about 1.5 s, beyond the maximum: rejected.
        let mut cell = Cell::new(1, 2.0, &s).unwrap();
        let burst: Vec<Event> = (0..4)
            .map(|_| Event {
                at: 0,
                key: 0,
                cost: 1,
            })
            .collect();
        cell.replay(&burst);
        let st = &cell.stats;
        assert_eq!((st.rejected, st.delayed), (1, 2), "{st:?}");
        assert_eq!(st.delays.iter().sum::<u64>(), 3);
        let p50 = delay_quantile(st, 0.5, max_wait).unwrap();
        assert!(
            p50 >= Duration::from_millis(500) && p50 <= Duration::from_millis(502),
            "{p50:?}"
        );
        assert!(st.max_delay >= Duration::from_secs(1) && st.max_delay <= max_wait);
        assert_eq!(delay_quantile(st, 1.0, max_wait), Some(st.max_delay));
    }
}
