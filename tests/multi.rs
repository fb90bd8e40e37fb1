//! All-or-nothing acquisition across buckets (`acquire_all`): errors, rollback, the
//! retry time, heterogeneous and large sets, no allocation for small sets, and two
//! threads racing 100,000 random overlapping requests each.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokengate::{
    AcquireError, Bucket, ManualClock, Policy, acquire_all, multi::INLINE_MEMBERS, multi::Member,
    multi::MultiError, multi::acquire_all_with,
};

/// Counts the allocations made on threads that asked to be counted.
struct CountingAlloc;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards every call to the system allocator unchanged; counting touches only
// a const-initialised thread-local and an atomic, neither of which allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Allocations `f` makes on this thread.
fn allocations_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    COUNTING.with(|c| c.set(true));
    let out = f();
    COUNTING.with(|c| c.set(false));
    (out, ALLOCATIONS.load(Ordering::Relaxed) - before)
}

type Clocked = Bucket<ManualClock>;

/// `n` full buckets of `capacity` tokens on one clock. Kept in one `Vec`, so their
/// identities (addresses) ascend with their index: the order `acquire_all` takes them in.
fn buckets(n: usize, capacity: u64, clock: &ManualClock) -> Vec<Clocked> {
    (0..n)
        .map(|_| Bucket::with_clock(Policy::new(capacity, 1.0).unwrap(), clock.clone()))
        .collect()
}

fn words(buckets: &[&Clocked]) -> Vec<u64> {
    buckets.iter().map(|b| b.stored_word()).collect()
}

/// The units a bucket holds at its stored tick.
fn units(bucket: &Clocked) -> i64 {
    let layout = bucket.policy().layout();
    let (_, units) = layout
        .decode(bucket.stored_word())
        .expect("units above capacity");
    units as i64 - layout.base_units() as i64
}

fn unit(bucket: &Clocked) -> i64 {
    1 << bucket.policy().layout().frac_bits()
}

#[test]
fn a_bucket_named_twice_is_refused_and_nothing_is_taken() {
    let clock = ManualClock::new();
    let b = buckets(3, 10, &clock);
    let before = words(&[&b[0], &b[1], &b[2]]);
    let err = acquire_all(&[(&b[2], 1), (&b[0], 1), (&b[1], 1), (&b[0], 2)]).unwrap_err();
    assert_eq!(
        err,
        MultiError::DuplicateBucket {
            first: 1,
            second: 3
        }
    );
    assert!(err.to_string().contains("positions 1 and 3"), "{err}");
    assert_eq!(words(&[&b[0], &b[1], &b[2]]), before);
}

#[test]
fn a_cost_above_a_capacity_is_the_immediate_error_and_nothing_is_taken() {
    let clock = ManualClock::new();
    let small = Bucket::with_clock(Policy::new(5, 1.0).unwrap(), clock.clone());
    let large = Bucket::with_clock(Policy::new(100, 1.0).unwrap(), clock.clone());
    let before = words(&[&small, &large]);
    // The admissible bucket is listed first, and taken first if its id is lower: the
    // capacity check runs before anything is taken either way.
    let err = acquire_all(&[(&large, 50), (&small, 6)]).unwrap_err();
    assert_eq!(
        err,
        MultiError::Bucket {
            index: 1,
            error: AcquireError::CostExceedsCapacity {
                cost: 6,
                capacity: 5
            }
        }
    );
    assert_eq!(words(&[&small, &large]), before);
    // A cost equal to the capacity is a rate decision, not an error.
    assert!(
        acquire_all(&[(&large, 50), (&small, 5)])
            .unwrap()
            .is_admitted()
    );
}

#[test]
fn a_set_that_cannot_be_paid_is_refused_without_a_write() {
    let clock = ManualClock::new();
    let b = buckets(4, 10, &clock);
    assert!(b[2].try_acquire(9).unwrap().is_admitted()); // leaves 1
    let before = words(&[&b[0], &b[1], &b[2], &b[3]]);
    // The read-only first pass finds bucket 2 short: only it is observed, nothing taken.
    let mut observed = Vec::new();
    let d = acquire_all_with(&[(&b[3], 3), (&b[1], 4), (&b[2], 2), (&b[0], 5)], |i, d| {
        observed.push((i, d.is_admitted()))
    })
    .unwrap();
    assert!(d.is_rejected());
    assert_eq!(d.refused_index(), Some(2));
    assert_eq!(d.refused_decision().unwrap().tokens_remaining(), 1.0);
    assert_eq!(observed, [(2, false)]);
    assert_eq!(
        words(&[&b[0], &b[1], &b[2], &b[3]]),
        before,
        "a refusal wrote (I5)"
    );
}

#[test]
fn a_refused_set_after_time_passed_leaves_every_word_as_it_was() {
    let clock = ManualClock::new();
    let b = buckets(3, 10, &clock);
    for bucket in &b {
        assert!(bucket.try_acquire(8).unwrap().is_admitted()); // 2 left each
    }
    clock.advance(Duration::from_millis(1500)); // about 1.5 tokens of refill each
    let expected: Vec<f64> = b.iter().map(Bucket::available).collect();
    let before = words(&[&b[0], &b[1], &b[2]]);
    // 3.5 tokens each: buckets 0 and 1 could pay 3, bucket 2 cannot pay 4.
    let d = acquire_all(&[(&b[0], 3), (&b[1], 3), (&b[2], 4)]).unwrap();
    assert_eq!(d.refused_index(), Some(2));
    assert_eq!(
        b.iter().map(Bucket::available).collect::<Vec<_>>(),
        expected
    );
    assert_eq!(words(&[&b[0], &b[1], &b[2]]), before);
}

#[test]
fn a_clock_stepped_back_under_an_acquisition_credits_no_member() {
    // One reading for the set (the first member's), brought up to each member's own
    // highest reading: a member that saw a later time is decided there, with no credit
    // for the half second walked back, and its stored tick never moves back.
    let clock = ManualClock::new();
    let b = buckets(2, 10, &clock);
    assert!(b[0].try_acquire(8).unwrap().is_admitted());
    clock.advance(Duration::from_secs(1));
    assert!(b[1].try_acquire(8).unwrap().is_admitted()); // b[1] read at 1 s, 2 left
    let layout = *b[1].policy().layout();
    let (b1_tick, _) = layout.decode(b[1].stored_word()).unwrap();
    clock.set(Duration::from_millis(500)); // half a second back

    let got = acquire_all(&[(&b[0], 1), (&b[1], 2)]).unwrap();
    assert!(got.is_admitted(), "{got:?}");
    let (tick, units) = layout.decode(b[1].stored_word()).unwrap();
    assert!(
        tick >= b1_tick,
        "b[1]'s tick moved back: {tick} < {b1_tick}"
    );
    assert_eq!(units, 0, "b[1] was credited for time walked back");
    // And until the clock passes one second again, b[1] holds nothing.
    clock.set(Duration::from_millis(999));
    assert!(!acquire_all(&[(&b[1], 1)]).unwrap().is_admitted());
}

#[test]
fn refused_index_and_retry_after_name_the_first_short_bucket_and_the_slowest_wait() {
    let clock = ManualClock::new();
    let policies = [
        Policy::new(100, 100.0).unwrap(), // plenty
        Policy::new(20, 10.0).unwrap(),   // 0 left, asked 4: 0.4 s
        Policy::new(10, 1.0).unwrap(),    // 2 left, asked 5: 3 s
    ];
    let b: Vec<Clocked> = policies
        .iter()
        .map(|&p| Bucket::with_clock(p, clock.clone()))
        .collect();
    assert!(b[1].try_acquire(20).unwrap().is_admitted());
    assert!(b[2].try_acquire(8).unwrap().is_admitted());

    let d = acquire_all(&[(&b[2], 5), (&b[0], 10), (&b[1], 4)]).unwrap();
    // Buckets 2 and 1 are both short: the refusal names the first listed, whatever
    // the buckets' addresses (the Vec puts bucket 1 before bucket 2 in memory).
    assert_eq!(d.refused_index(), Some(0));
    let d = acquire_all(&[(&b[0], 10), (&b[1], 4), (&b[2], 5)]).unwrap();
    assert_eq!(d.refused_index(), Some(1));

    // By hand, at time 0: a balance of `have` tokens needs ceil((cost - have) * 2^F / R)
    // ticks of 2^S ns to pay `cost`, counted from the edge of tick 1 (the drains from
    // full anchored there).
    let wait = |p: &Policy, have: u64, cost: u64| {
        let l = p.layout();
        let ticks = 1 + ((cost - have) << l.frac_bits()).div_ceil(l.refill_per_tick());
        Duration::from_nanos(ticks << l.tick_shift())
    };
    let route = wait(&policies[1], 0, 4);
    let tenant = wait(&policies[2], 2, 5);
    // The rates are rounded down, so each wait is at least the exact one and at most one
    // tick and the rate error longer.
    assert!(route >= Duration::from_millis(400) && route < Duration::from_millis(402));
    assert!(tenant >= Duration::from_secs(3) && tenant < Duration::from_millis(3004));

    assert_eq!(d.refused_decision().unwrap().retry_after(), Some(route));
    assert_eq!(d.retry_after(), Some(tenant));
    // Waiting that long and asking again succeeds (nobody else takes meanwhile).
    clock.advance(tenant);
    assert!(
        acquire_all(&[(&b[2], 5), (&b[0], 10), (&b[1], 4)])
            .unwrap()
            .is_admitted()
    );
}

#[test]
fn an_admission_reports_no_refusal_and_no_wait() {
    let clock = ManualClock::new();
    let b = buckets(2, 10, &clock);
    let d = acquire_all(&[(&b[0], 10), (&b[1], 1)]).unwrap();
    assert!(d.is_admitted() && !d.is_rejected());
    assert_eq!((d.refused_index(), d.retry_after()), (None, None));
    assert!(d.refused_decision().is_none());
    assert_eq!((b[0].available(), b[1].available()), (0.0, 9.0));
}

#[test]
fn an_empty_set_is_admitted() {
    let none: [(&Clocked, u64); 0] = [];
    assert!(acquire_all(&none).unwrap().is_admitted());
}

#[test]
fn heterogeneous_members_behind_dyn_member_are_all_or_nothing() {
    let clock = ManualClock::new();
    let by_value = Bucket::with_clock(Policy::new(10, 1.0).unwrap(), clock.clone());
    let shared = Bucket::with_clock(Policy::new(3, 1.0).unwrap(), Arc::new(clock.clone()));
    let borrowed = Bucket::with_clock(Policy::per(50, 5, Duration::from_secs(1)).unwrap(), &clock);
    let set: [(&dyn Member, u64); 3] = [(&by_value, 4), (&shared, 2), (&borrowed, 20)];

    assert!(acquire_all(&set).unwrap().is_admitted());
    assert_eq!(
        (
            by_value.available(),
            shared.available(),
            borrowed.available()
        ),
        (6.0, 1.0, 30.0)
    );
    let d = acquire_all(&set).unwrap();
    assert_eq!(d.refused_index(), Some(1));
    assert_eq!(
        (
            by_value.available(),
            shared.available(),
            borrowed.available()
        ),
        (6.0, 1.0, 30.0)
    );
    assert_eq!(
        set.iter().map(|(m, _)| m.capacity()).collect::<Vec<_>>(),
        [10, 3, 50]
    );
}

#[test]
fn sets_larger_than_the_inline_size_work() {
    let clock = ManualClock::new();
    let b = buckets(INLINE_MEMBERS + 4, 5, &clock);
    // Listed in reverse id order.
    let mut set: Vec<(&Clocked, u64)> = b.iter().rev().map(|bucket| (bucket, 2)).collect();
    assert!(acquire_all(&set).unwrap().is_admitted());
    assert!(b.iter().all(|bucket| bucket.available() == 3.0));

    // The last bucket taken (the highest id, listed first) refuses: every other one is
    // refunded.
    set[0].1 = 4;
    let before: Vec<u64> = b.iter().map(Bucket::stored_word).collect();
    let d = acquire_all(&set).unwrap();
    assert_eq!(d.refused_index(), Some(0));
    assert_eq!(
        b.iter().map(Bucket::stored_word).collect::<Vec<_>>(),
        before
    );

    // A duplicate among many is still found.
    set.push((&b[3], 1));
    assert_eq!(
        acquire_all(&set).unwrap_err(),
        MultiError::DuplicateBucket {
            first: b.len() - 1 - 3,
            second: b.len()
        }
    );
}

#[test]
fn sets_up_to_the_inline_size_do_not_allocate() {
    let clock = ManualClock::new();
    let b = buckets(INLINE_MEMBERS + 1, 10, &clock);
    let set: Vec<(&Clocked, u64)> = b.iter().rev().map(|bucket| (bucket, 3)).collect();
    let (inline, overflow) = set.split_at(INLINE_MEMBERS);
    assert_eq!(inline.len(), 8);

    let (d, n) = allocations_during(|| acquire_all(inline).unwrap());
    assert!(d.is_admitted());
    assert_eq!(n, 0, "an admitted set of 8 allocated");

    // A refusal with rollback and the retry time.
    assert!(b[4].try_acquire(6).unwrap().is_admitted());
    let (d, n) = allocations_during(|| acquire_all(inline).unwrap());
    assert!(d.is_rejected() && d.retry_after().is_some());
    assert_eq!(n, 0, "a refused set of 8 allocated");

    // The errors, too.
    let (err, n) = allocations_during(|| acquire_all(&[(&b[0], 1), (&b[0], 1)]).unwrap_err());
    assert!(matches!(err, MultiError::DuplicateBucket { .. }));
    assert_eq!(n, 0);

    // The counter works: a ninth member does allocate.
    let mut nine = inline.to_vec();
    nine.extend_from_slice(overflow);
    let (_, n) = allocations_during(|| acquire_all(&nine).unwrap());
    assert!(n > 0, "a set of 9 was expected to allocate its ordering");
}

/// SplitMix64: a small deterministic generator for the random requests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What one thread did: per bucket, the units it holds at the end (taken and not
/// refunded), and counts of outcomes.
#[derive(Default)]
struct Tally {
    holding: Vec<i64>,
    admitted: usize,
    refused: usize,
    rolled_back: usize,
}

const REQUESTS_PER_THREAD: usize = 100_000;

/// One thread's run: random subsets of the buckets in random order with random costs;
/// some admitted requests are given back later (the work did not run), as a service
/// would, which keeps the buckets from simply draining.
fn stress_thread(b: &[Clocked], seed: u64) -> Tally {
    let mut rng = Rng(seed);
    let mut tally = Tally {
        holding: vec![0; b.len()],
        ..Tally::default()
    };
    let mut outstanding: Vec<Vec<(usize, u64)>> = Vec::new();
    for _ in 0..REQUESTS_PER_THREAD {
        // A random subset of 1..=n buckets, in random order.
        let mut picked: Vec<usize> = (0..b.len()).collect();
        for i in (1..picked.len()).rev() {
            picked.swap(i, rng.below(i as u64 + 1) as usize);
        }
        picked.truncate(1 + rng.below(b.len() as u64) as usize);
        let request: Vec<(usize, u64)> = picked
            .iter()
            .map(|&i| (i, 1 + rng.below(b[i].policy().capacity() / 4)))
            .collect();
        let set: Vec<(&Clocked, u64)> = request.iter().map(|&(i, c)| (&b[i], c)).collect();

        let mut took_some = false;
        let d = acquire_all_with(&set, |k, d| {
            let bucket = set[k].0;
            let capacity = bucket.policy().capacity() as i64 * unit(bucket);
            assert!(
                (0..=capacity).contains(&d.balance_units()),
                "a bucket decided on {} units, capacity {capacity}",
                d.balance_units()
            );
            took_some |= d.is_admitted();
        })
        .unwrap();
        if d.is_admitted() {
            tally.admitted += 1;
            for &(i, c) in &request {
                tally.holding[i] += c as i64 * unit(&b[i]);
            }
            outstanding.push(request);
        } else {
            tally.refused += 1;
            tally.rolled_back += usize::from(took_some);
        }
        // Give back a random earlier admission now and then.
        if !outstanding.is_empty() && rng.below(3) < 2 {
            let k = rng.below(outstanding.len() as u64) as usize;
            for (i, c) in outstanding.swap_remove(k) {
                b[i].refund(c).unwrap();
                tally.holding[i] -= c as i64 * unit(&b[i]);
            }
        }
    }
    tally
}

#[test]
fn two_threads_of_random_overlapping_requests_conserve_every_bucket() {
    let clock = ManualClock::new(); // frozen: no refill, so every unit is accounted for
    let b: Vec<Clocked> = [40, 25, 60, 12, 100]
        .iter()
        .map(|&capacity| Bucket::with_clock(Policy::new(capacity, 1.0).unwrap(), clock.clone()))
        .collect();
    let initial: Vec<i64> = b.iter().map(units).collect();

    let tallies: Vec<Tally> = std::thread::scope(|s| {
        let handles: Vec<_> = [0x5eed_0001, 0x5eed_0002]
            .map(|seed| {
                s.spawn({
                    let b = &b;
                    move || stress_thread(b, seed)
                })
            })
            .into_iter()
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });

    for (i, bucket) in b.iter().enumerate() {
        let held: i64 = tallies.iter().map(|t| t.holding[i]).sum();
        let now = units(bucket);
        assert!(now >= 0, "bucket {i} is negative: {now}");
        assert!(now <= initial[i], "bucket {i} is above its capacity");
        assert_eq!(now + held, initial[i], "bucket {i} lost or created units");
    }
    for (k, t) in tallies.iter().enumerate() {
        println!(
            "thread {k}: {} admitted, {} refused ({} after a rollback)",
            t.admitted, t.refused, t.rolled_back
        );
        assert_eq!(t.admitted + t.refused, REQUESTS_PER_THREAD);
        // Not vacuous: both outcomes happen on every thread. (Rollbacks need the other
        // thread to take tokens between this thread's read-only first pass and its takes:
        // rare here, explored exhaustively by the loom models, and pinned by
        // `a_take_refused_after_the_first_pass_rolls_back_exactly`.)
        assert!(t.admitted > 1000, "thread {k} admitted only {}", t.admitted);
        assert!(t.refused > 1000, "thread {k} refused only {}", t.refused);
    }
}
