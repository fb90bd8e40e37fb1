//! One named test per invariant of the design notes (I1-I6, I8), through the public API
//! and the pure `state` layer.

use std::time::Duration;

use tokengate::state::Layout;
use tokengate::{AcquireError, Bucket, Clock, ManualClock, Policy};

fn bucket(capacity: u64, rate: f64) -> (Bucket<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let bucket = Bucket::with_clock(Policy::new(capacity, rate).unwrap(), clock.clone());
    (bucket, clock)
}

fn units(bucket: &Bucket<ManualClock>) -> u64 {
    bucket
        .policy()
        .layout()
        .decode(bucket.stored_word())
        .unwrap()
        .1
}

fn tick(bucket: &Bucket<ManualClock>) -> u64 {
    bucket
        .policy()
        .layout()
        .decode(bucket.stored_word())
        .unwrap()
        .0
}

/// I1: however long the idle time and however many refunds, the balance stays at B.
#[test]
fn i1_balance_never_exceeds_capacity() {
    let (bucket, clock) = bucket(10, 3.0);
    let max = bucket.policy().layout().max_units();
    assert_eq!(units(&bucket), max);
    for _ in 0..100 {
        bucket.refund(10).unwrap();
        assert!(units(&bucket) <= max);
    }
    assert!(bucket.try_acquire(10).unwrap().is_admitted());
    // 10 tokens at 3/s take 3.34 s; every idle period from here fills the bucket.
    for idle in [4, 10, 1_000, 1_000_000, 100_000_000] {
        clock.advance(Duration::from_secs(idle));
        assert_eq!(bucket.available(), 10.0, "after {idle} s idle");
        bucket.refund(7).unwrap();
        assert_eq!(units(&bucket), max);
        assert!(bucket.try_acquire(3).unwrap().is_admitted());
        bucket.refund(10).unwrap();
        assert_eq!(units(&bucket), max);
    }
    // Eleven tokens are never there at once.
    assert!(bucket.try_acquire(10).unwrap().is_admitted());
    assert!(bucket.try_acquire(1).unwrap().is_rejected());
}

/// I2, a lost race: a `now` older than the stored tick (within the race tolerance) adds
/// no credit, and the stored tick does not move back.
#[test]
fn i2_stale_now_adds_no_credit() {
    let (bucket, clock) = bucket(100, 1000.0);
    let layout = *bucket.policy().layout();
    assert!(layout.tolerance_ticks() >= 1);
    assert!(bucket.try_acquire(100).unwrap().is_admitted());
    clock.advance(layout.tick() * 10);
    assert!(bucket.try_acquire(1).unwrap().is_admitted()); // stores tick 10
    let stored = tick(&bucket);
    let balance = bucket.available();

    // A thread that read the clock up to the race tolerance ago decides on the stored
    // state.
    clock.set(layout.tick() * (10 - layout.tolerance_ticks().min(10) as u32));
    assert_eq!(bucket.available(), balance);
    let d = bucket.try_acquire(1).unwrap();
    assert_eq!(d.tokens_remaining(), balance - 1.0);
    assert_eq!(tick(&bucket), stored, "the stored tick moved backwards");

    // And the pure layer says the same for any stale tick within the tolerance.
    let word = bucket.stored_word();
    for back in 1..=layout.tolerance_ticks().min(1000) {
        let snapshot = layout.refill(word, stored - back);
        assert_eq!(snapshot.units(), units(&bucket));
        assert_eq!(snapshot.tick(&layout), stored);
    }
}

/// I2, a clock that steps back: no credit and no error (the bucket reads its clock
/// through a high-water mark: time stands still), the stored tick never moves back, and
/// when the clock catches up the same time is not counted twice.
#[test]
fn i2_clock_stepping_back_adds_no_credit() {
    let (bucket, clock) = bucket(100, 10.0);
    let layout = *bucket.policy().layout();
    clock.set(Duration::from_secs(100));
    assert!(bucket.try_acquire(50).unwrap().is_admitted());
    let (tick, _) = layout.decode(bucket.stored_word()).unwrap();

    clock.set(Duration::from_secs(40)); // one minute back
    assert!(bucket.try_acquire(1).unwrap().is_admitted());
    let (after, _) = layout.decode(bucket.stored_word()).unwrap();
    assert!(
        after >= tick,
        "the stored tick moved back: {after} < {tick}"
    );
    assert_eq!(bucket.available(), 49.0);
    bucket.refund(6).unwrap();
    assert_eq!(bucket.available(), 55.0);

    // Back at the highest reading: nothing was credited for the minute walked twice.
    clock.set(Duration::from_secs(100));
    assert_eq!(bucket.available(), 55.0);
    // One more second adds 10 tokens, less up to two ticks' refill (the drain from full
    // anchored at the next edge, and the partial tick at the end), not 610.
    clock.advance(Duration::from_secs(1));
    let available = bucket.available();
    let two_ticks = 2.0 * 10.0 * layout.tick().as_secs_f64();
    assert!(
        (65.0 - two_ticks..=65.0).contains(&available),
        "{available}"
    );
}

/// I3: refill is exact on the tick grid. A million one-tick updates give exactly what
/// one update over the same ticks gives, and exactly `R` units per tick.
#[test]
fn i3_refill_is_exact_on_the_tick_grid() {
    let policy = Policy::new(1_000_000, 333.0).unwrap().start_empty();
    let layout = *policy.layout();
    let (stepped_clock, once_clock) = (ManualClock::new(), ManualClock::new());
    let stepped = Bucket::with_clock(policy, stepped_clock.clone());
    let once = Bucket::with_clock(policy, once_clock.clone());
    // Up to a million ticks, short of filling the bucket (the cap is I1's business).
    let ticks = (layout.max_units() / layout.refill_per_tick() - 2).min(1_000_000);
    assert!(ticks > 10_000, "{layout:?}");
    for _ in 0..ticks {
        stepped_clock.advance(layout.tick());
        // Two writes at every tick (give one token, take it back) force an update.
        stepped.refund(1).unwrap();
        assert!(stepped.try_acquire(1).unwrap().is_admitted());
    }
    once_clock.advance(layout.tick() * ticks as u32);
    assert!(once.try_acquire(0).unwrap().is_admitted());
    once.refund(1).unwrap();
    assert!(once.try_acquire(1).unwrap().is_admitted());
    assert_eq!(stepped.available(), once.available());
    assert_eq!(units(&once), units(&stepped));
    // Created at tick 0, anchored at the edge of tick 1: `ticks - 1` whole ticks of refill.
    assert_eq!(units(&stepped), (ticks - 1) * layout.refill_per_tick());

    // Sub-tick steps add nothing until the second edge after creation (the first is the
    // anchor), then exactly R.
    let clock = ManualClock::new();
    let b = Bucket::with_clock(policy, clock.clone());
    for _ in 0..15 {
        clock.advance(layout.tick() / 8);
        assert_eq!(b.available(), 0.0);
    }
    clock.advance(layout.tick() / 8);
    b.refund(1).unwrap();
    assert!(b.try_acquire(1).unwrap().is_admitted());
    assert_eq!(units(&b), layout.refill_per_tick());
}

/// I4: over every interval, admitted tokens never exceed the balance at its start plus
/// `R` times the ticks elapsed, whatever the pattern of requests.
#[test]
fn i4_admissions_bounded_by_start_balance_plus_refill() {
    let (bucket, clock) = bucket(50, 7.5);
    let layout = *bucket.policy().layout();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    // (tick, balance in units) at each checkpoint, and admitted units between them.
    let mut checkpoints = vec![(
        layout.tick_of(clock.now_nanos()),
        units(&bucket) as i128,
        0i128,
    )];
    for _ in 0..20_000 {
        clock.advance(Duration::from_nanos(next() % 80_000_000));
        let cost = next() % 6;
        if bucket.try_acquire(cost).unwrap().is_admitted() {
            checkpoints.last_mut().unwrap().2 += i128::from(cost << layout.frac_bits());
        }
        if next() % 16 == 0 {
            let t = layout.tick_of(clock.now_nanos());
            let balance = bucket.available() * f64::from(1u32 << layout.frac_bits());
            checkpoints.push((t, balance as i128, 0));
        }
    }
    let r = i128::from(layout.refill_per_tick());
    for i in 0..checkpoints.len() {
        let mut admitted = 0;
        for j in i..checkpoints.len() - 1 {
            admitted += checkpoints[j].2;
            let (start_tick, start_balance, _) = checkpoints[i];
            let end_tick = checkpoints[j + 1].0;
            let bound = start_balance + r * i128::from(end_tick - start_tick);
            assert!(admitted <= bound, "interval {i}..{j}: {admitted} > {bound}");
        }
    }
}

/// I5: a rejection is read-only. Under a flood of rejected requests, the packed word is
/// never written.
#[test]
fn i5_rejection_writes_nothing() {
    let (bucket, clock) = bucket(5, 1.0);
    assert!(bucket.try_acquire(5).unwrap().is_admitted());
    let word = bucket.stored_word();
    for i in 0..10_000 {
        clock.advance(Duration::from_micros(10));
        let d = bucket.try_acquire(1 + i % 5).unwrap();
        assert!(d.is_rejected());
        assert!(d.retry_after().is_some());
        assert_eq!(bucket.stored_word(), word, "rejection {i} wrote the word");
    }
    // available() is a peek too.
    let _ = bucket.available();
    assert_eq!(bucket.stored_word(), word);
}

/// I6: a refund restores exactly the state the bucket would have had without the
/// reservation, capped at B, whenever it happens and however the cap binds.
#[test]
fn i6_refund_restores_the_exact_state() {
    for (taken, idle_ms) in [(3u64, 0u64), (3, 250), (10, 999), (10, 5_000), (1, 100_000)] {
        let clock = ManualClock::new();
        let policy = Policy::new(10, 2.0).unwrap();
        let with = Bucket::with_clock(policy, clock.clone());
        let without = Bucket::with_clock(policy, clock.clone());
        // Both at 4 tokens.
        assert!(with.try_acquire(6).unwrap().is_admitted());
        assert!(without.try_acquire(6).unwrap().is_admitted());

        assert!(with.try_acquire(taken.min(4)).unwrap().is_admitted());
        clock.advance(Duration::from_millis(idle_ms));
        with.refund(taken.min(4)).unwrap();
        without.refund(0).unwrap(); // the same refill, no reservation
        assert_eq!(
            with.available(),
            without.available(),
            "taken {taken}, idle {idle_ms} ms"
        );
        clock.advance(Duration::from_millis(1234));
        assert_eq!(with.available(), without.available());
        assert_eq!(
            with.try_acquire(7).unwrap().tokens_remaining(),
            without.try_acquire(7).unwrap().tokens_remaining()
        );
    }
}

/// I6 at the pure layer: `min(B, refill(now) + c)` equals refilling a bucket from which
/// nothing was taken, for every split of the elapsed ticks.
#[test]
fn i6_refund_commutes_with_capped_refill() {
    let layout = Layout::new(10, 4, 3, 5, 0).unwrap();
    for start in 0..=layout.max_units() {
        for cost in 0..=start {
            for elapsed in 0..20 {
                let taken = layout.encode(0, start - cost).unwrap();
                let snapshot = layout.refill(taken, elapsed);
                let refunded = layout.refund(&snapshot, cost);
                let never = layout.refill(layout.encode(0, start).unwrap(), elapsed);
                assert_eq!(layout.decode(refunded).unwrap().1, never.units());
            }
        }
    }
}

/// I8: a cost above the capacity is an immediate, distinct error, never a rejection with
/// an endless wait, and it changes nothing.
#[test]
fn i8_cost_above_capacity_is_an_immediate_error() {
    let (bucket, clock) = bucket(20, 1.0);
    let word = bucket.stored_word();
    assert_eq!(
        bucket.try_acquire(21),
        Err(AcquireError::CostExceedsCapacity {
            cost: 21,
            capacity: 20
        })
    );
    assert_eq!(
        bucket.refund(u64::MAX),
        Err(AcquireError::CostExceedsCapacity {
            cost: u64::MAX,
            capacity: 20
        })
    );
    assert_eq!(bucket.stored_word(), word);
    clock.advance(Duration::from_secs(1_000_000));
    assert!(bucket.try_acquire(21).is_err());
    // The capacity itself is fine.
    assert!(bucket.try_acquire(20).unwrap().is_admitted());
    let e = bucket.try_acquire(21).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cost 21 tokens exceeds the bucket capacity of 20 tokens: it can never be admitted"
    );
}

/// A full bucket holds the same at every time, so it is immune to the tick wrap: left
/// idle for any time, including one that lands its stored tick in the back window (where
/// the time reads as behind), it admits.
#[test]
fn full_bucket_is_immune_to_the_wrap() {
    for (capacity, rate) in [(100, 20.0), (100_000, 20.0), (1_000_000, 1e-3)] {
        let policy = Policy::new(capacity, rate).unwrap();
        let layout = *policy.layout();
        let wrap = policy.wrap_period();
        let window = layout.tick() * u32::try_from(layout.back_window_ticks()).unwrap_or(u32::MAX);
        for idle in [
            wrap - window / 2,
            wrap * 3 - layout.tick() * 3,
            wrap * 7 + window,
        ] {
            let clock = ManualClock::new();
            let bucket = Bucket::with_clock(policy, clock.clone());
            clock.advance(idle);
            let d = bucket.try_acquire(1).unwrap_or_else(|e| {
                panic!("B={capacity} r={rate}, idle {idle:?} of a {wrap:?} wrap: {e}")
            });
            assert!(d.is_admitted());
            assert_eq!(d.tokens_remaining(), (capacity - 1) as f64);
            // ... and the bucket carries on from there.
            clock.advance(layout.tick() * 2);
            assert!(bucket.try_acquire(1).unwrap().is_admitted());
        }
    }
}

/// Ordinary policies wrap after years, so no bucket in ordinary use idles past it.
#[test]
fn ordinary_policies_wrap_after_years() {
    let two_years = std::time::Duration::from_secs(2 * 365 * 86_400);
    for capacity in [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 100_000_000] {
        for rate in [0.01, 0.1, 1.0, 20.0, 1_000.0, 1e6, 1e9] {
            let Ok(policy) = Policy::new(capacity, rate) else {
                continue;
            };
            assert!(
                policy.wrap_period() >= two_years,
                "B={capacity} r={rate}: wraps after {:?} ({:?})",
                policy.wrap_period(),
                policy.layout()
            );
            assert!(
                policy.rate_error() <= tokengate::policy::MAX_RATE_ERROR,
                "B={capacity} r={rate}"
            );
        }
    }
}
