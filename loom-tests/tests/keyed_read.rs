//! A keyed map's found key decided in a reader section (no lock) while a writer changes
//! the same shard: a new key inserted (the table grown, its entries moved), a sweep that
//! evicts the very key being decided, a policy switch converting the shard; two sections
//! at once against an insert, and one section against two competing inserts; a found key
//! and the map's policy read while two switches retire (and free) the epochs they read,
//! with a retirement that frees at once (the pinned read then reads a freed epoch) and a
//! switch that leaves a shard two epochs behind (its words converted from the wrong
//! policy). A section's read of an epoch is ordered before its free twice over: by the
//! barrier of the switch that retires it, and by the write lock of the conversion that
//! takes the shard past it before the next switch can free it.
//!
//! Frozen clock, one shard, so every token is accounted for. Besides each model's
//! exactness assertions, loom checks every access to the shard's data: a reader section
//! that overlaps a writer's changes, with no synchronization ordering them, is reported
//! as a causality violation. The two deliberate bugs below (a writer that does not wait
//! for the sections in its shard, a section that ignores the shard's writing flag) are
//! caught by each model.
#![cfg(loom)]

use loom::sync::Arc;
use loom_tests::{
    ByParity, Forward, Model, Tally, assert_key_one_conserved, keyed_map, keyed_map_with_key_one,
    spawn_with,
};
use tokengate::{Inherit, KeyedLimiter, Policy};

type Map = KeyedLimiter<u64, Forward>;

/// A map of capacity 2 per key holding keys 1 to 3, full: they fill its table's first
/// allocation, so the next insertion grows it (every entry moves).
fn three_keys() -> Arc<Map> {
    let map = keyed_map(2, 8);
    for k in 1..=3 {
        assert!(map.try_acquire(&k, 0).unwrap().is_admitted());
    }
    map
}

/// Reader: takes 1 twice from key 1 (full, capacity 2). Writer: a request for key 4, new,
/// whose insertion grows the shard's table (keys 1 to 3 fill its first allocation), so
/// every entry moves. Both admissions and the new key's are exact.
fn decide_racing_an_insert() -> impl Fn() + Sync + Send + 'static {
    || {
        let map = three_keys();
        let reader = spawn_with(&map, |map| {
            [map.try_acquire(&1, 1), map.try_acquire(&1, 1)].map(|d| d.unwrap().is_admitted())
        });
        let inserted = map.try_acquire(&4, 1).unwrap().is_admitted();
        let admitted = reader.join().unwrap();
        assert_eq!(admitted, [true, true], "a found key's admission lost");
        assert!(inserted, "the new key refused");
        assert_eq!(map.len(), 4);
        assert_eq!(map.available(&1), 0.0, "tokens lost or minted on key 1");
        assert_eq!(map.available(&4), 1.0, "tokens lost or minted on key 4");
    }
}

/// Reader: takes 1 from key 1 (full, capacity 2). Writer: a sweep, which evicts key 1 if
/// it is still full. Either the take came first (the key kept, 1 left) or the key was
/// evicted and the take made it afresh (1 left): the same balance either way. (In every
/// execution loom 0.7 explores, the sweep evicts: the reader's section overlaps it, as
/// the deliberate bugs below show, but its take never completes before the sweep reads
/// the bucket.)
fn decide_racing_an_eviction(evicted: Tally) -> impl Fn() + Sync + Send + 'static {
    move || {
        let map = keyed_map_with_key_one(2);
        let reader = spawn_with(&map, |map| map.try_acquire(&1, 1).unwrap().is_admitted());
        let report = map.sweep();
        let admitted = reader.join().unwrap();
        assert!(admitted, "the key's admission lost");
        assert_eq!(map.len(), 1);
        assert_eq!(
            map.available(&1),
            1.0,
            "tokens lost or minted across the eviction: {report:?}"
        );
        evicted.hit_if(report.evicted == 1);
    }
}

/// Reader: takes 1 from key 1 twice (full, capacity 2). Writer: switches to capacity 3,
/// `Additive` (one token more). The key ends with 3 less what the reader took.
fn decide_racing_a_switch() -> impl Fn() + Sync + Send + 'static {
    || {
        let map = keyed_map_with_key_one(2);
        let reader = spawn_with(&map, |map| {
            [map.try_acquire(&1, 1), map.try_acquire(&1, 1)]
                .map(|d| i64::from(d.unwrap().is_admitted()))
                .iter()
                .sum::<i64>()
        });
        map.reconfigure(Policy::new(3, 1.0).unwrap(), Inherit::Additive);
        let net = reader.join().unwrap();
        assert_eq!(net, 2, "an admission refused with tokens left");
        assert_key_one_conserved(&map, net, 3.0, "at the switch");
    }
}

/// Two shards (key `k` in shard `k & 1`). Reader: takes 1 from key 2 (shard 0), then from
/// key 1 (shard 1). Writer: a request for key 4, new, in shard 0. The writer may find the
/// reader's record already naming shard 1 (its exit from shard 0 overwritten): that
/// entry's store must still order the reader's reads of shard 0 before the writer's
/// changes (a `Release` store; a relaxed one is caught below).
fn decide_in_two_shards_racing_an_insert() -> impl Fn() + Sync + Send + 'static {
    || {
        let map = Arc::new(
            KeyedLimiter::<u64>::builder(Policy::new(2, 1.0).unwrap(), 8)
                .clock(Forward::new()) // frozen
                .hasher(ByParity)
                .shards(2)
                .build()
                .unwrap(),
        );
        for k in [1, 2] {
            assert!(map.try_acquire(&k, 0).unwrap().is_admitted());
        }
        let reader = spawn_with(&map, |map| {
            [map.try_acquire(&2, 1), map.try_acquire(&1, 1)].map(|d| d.unwrap().is_admitted())
        });
        let inserted = map.try_acquire(&4, 1).unwrap().is_admitted();
        let admitted = reader.join().unwrap();
        assert_eq!(admitted, [true, true], "a found key's admission lost");
        assert!(inserted, "the new key refused");
        assert_eq!(map.len(), 3);
        for (key, left) in [(1, 1.0), (2, 1.0), (4, 1.0)] {
            assert_eq!(
                map.available(&key),
                left,
                "tokens lost or minted on key {key}"
            );
        }
    }
}

/// Two readers in sections of the same shard at once (the model's main thread and one
/// more, each with a record), each taking 1 from key 1 (full, capacity 2), while a third
/// thread inserts key 4, growing the table. The writer waits for both sections; both
/// admissions and the new key's are exact.
fn two_sections_racing_an_insert() -> impl Fn() + Sync + Send + 'static {
    || {
        let map = three_keys();
        let reader = spawn_with(&map, |map| map.try_acquire(&1, 1).unwrap().is_admitted());
        let writer = spawn_with(&map, |map| map.try_acquire(&4, 1).unwrap().is_admitted());
        let mine = map.try_acquire(&1, 1).unwrap().is_admitted();
        let theirs = reader.join().unwrap();
        let inserted = writer.join().unwrap();
        assert!(
            mine && theirs,
            "a found key's admission lost: {mine} {theirs}"
        );
        assert!(inserted, "the new key refused");
        assert_eq!(map.len(), 4);
        assert_eq!(map.available(&1), 0.0, "tokens lost or minted on key 1");
        assert_eq!(map.available(&4), 1.0, "tokens lost or minted on key 4");
    }
}

/// One reader taking 1 from key 1 twice (full, capacity 2) while two writers insert keys
/// 4 and 5 into its shard, competing for the write lock (the first insert grows the
/// table). Every admission exact, both keys in.
fn a_section_racing_two_inserts() -> impl Fn() + Sync + Send + 'static {
    || {
        let map = three_keys();
        let reader = spawn_with(&map, |map| {
            [map.try_acquire(&1, 1), map.try_acquire(&1, 1)].map(|d| d.unwrap().is_admitted())
        });
        let writer = spawn_with(&map, |map| map.try_acquire(&5, 1).unwrap().is_admitted());
        let four = map.try_acquire(&4, 1).unwrap().is_admitted();
        let admitted = reader.join().unwrap();
        let five = writer.join().unwrap();
        assert_eq!(admitted, [true, true], "a found key's admission lost");
        assert!(four && five, "a new key refused: {four} {five}");
        assert_eq!(map.len(), 5);
        for (key, left) in [(1, 0.0), (4, 1.0), (5, 1.0)] {
            assert_eq!(
                map.available(&key),
                left,
                "tokens lost or minted on key {key}"
            );
        }
    }
}

/// Reader: takes 1 from key 1 (full, capacity 2) in a reader section, then reads the
/// map's policy (pinned). Writer: two switches, `Additive` to capacities 3 and 4; the
/// second retirement frees the first epoch whenever nothing can still read it. Each
/// epoch's probe (a loom cell its drop writes) is read on every access to the epoch: a
/// free that no synchronization orders after a read is reported, in a real run a read
/// of freed memory. `freed` counts executions where an epoch was freed while the
/// reader ran.
fn decide_racing_two_retirements(freed: Tally) -> impl Fn() + Sync + Send + 'static {
    move || {
        let map = keyed_map_with_key_one(2);
        let reader = spawn_with(&map, |map| {
            let admitted = map.try_acquire(&1, 1).unwrap().is_admitted();
            let capacity = map.policy().capacity();
            assert!(
                (2..=4).contains(&capacity),
                "read a freed epoch: {capacity}"
            );
            i64::from(admitted)
        });
        map.reconfigure(Policy::new(3, 1.0).unwrap(), Inherit::Additive);
        map.reconfigure(Policy::new(4, 1.0).unwrap(), Inherit::Additive);
        freed.hit_if(map.retired_epochs() < 2);
        let net = reader.join().unwrap();
        assert_eq!(net, 1, "an admission refused with tokens left");
        assert_key_one_conserved(&map, net, 4.0, "across the switches");
    }
}

/// Not exhaustive: two whole switches (each pins, converts, locks, publishes, fences and
/// retires) against a section and a pin make too many interleavings to finish; the
/// bound explores every order a scheduler with two preemptions makes.
const RETIRE: Model = Model {
    name: "keyed read: found key and policy vs two retirements",
    threads: 2,
    preemption_bound: Some(2),
};

#[test]
fn a_found_key_racing_two_retirements_never_reads_a_freed_epoch() {
    loom_tests::in_own_process!();
    let freed = Tally::new();
    RETIRE.check(decide_racing_two_retirements(freed.clone()));
    // Not vacuous: some executions free an epoch while the reader runs.
    assert!(freed.get() > 0, "no execution freed an epoch");
}

#[test]
fn a_switch_that_leaves_shards_behind_is_caught() {
    loom_tests::in_own_process!();
    let bug = &tokengate::mutants::KEYED_SWITCH_LEAVES_SHARDS_BEHIND;
    let message = RETIRE.expect_violation(bug, decide_racing_two_retirements(Tally::new()));
    assert!(message.contains("lost or minted"), "{message}");
}

#[test]
fn a_keyed_retirement_that_frees_at_once_is_caught() {
    loom_tests::in_own_process!();
    let bug = &tokengate::mutants::EPOCH_FREES_EARLY;
    assert_race(&RETIRE.expect_violation(bug, decide_racing_two_retirements(Tally::new())));
}

const INSERT: Model = Model::exhaustive("keyed read: found key vs insert (table grows)", 2);
const EVICT: Model = Model::exhaustive("keyed read: found key vs sweep evicting it", 2);
const SWITCH: Model = Model::exhaustive("keyed read: found key vs switch", 2);
const TWO_SHARDS: Model = Model::exhaustive("keyed read: two shards, found keys vs an insert", 2);

const TWO_READERS: Model = Model::exhaustive("keyed read: two sections vs an insert", 3);
/// Not exhaustive: two writers' inserts (the table grown by one of them) make too many
/// interleavings to finish; the bound explores every order of the three threads'
/// steps that a scheduler with four preemptions makes (96,698 executions).
const TWO_WRITERS: Model = Model {
    name: "keyed read: a section vs two inserts",
    threads: 3,
    preemption_bound: Some(4),
};

#[test]
fn two_sections_race_an_insert_exactly() {
    loom_tests::in_own_process!();
    TWO_READERS.check(two_sections_racing_an_insert());
}

#[test]
fn a_section_races_two_competing_inserts_exactly() {
    loom_tests::in_own_process!();
    TWO_WRITERS.check(a_section_racing_two_inserts());
}

#[test]
fn found_keys_in_two_shards_race_an_insert_exactly() {
    loom_tests::in_own_process!();
    TWO_SHARDS.check(decide_in_two_shards_racing_an_insert());
}

#[test]
fn a_section_entered_with_a_relaxed_store_is_caught() {
    loom_tests::in_own_process!();
    let bug = &tokengate::mutants::SECTION_ENTRY_RELAXED;
    assert_race(&TWO_SHARDS.expect_violation(bug, decide_in_two_shards_racing_an_insert()));
}

#[test]
fn a_found_key_decided_without_a_lock_races_an_insert_exactly() {
    loom_tests::in_own_process!();
    INSERT.check(decide_racing_an_insert());
}

#[test]
fn a_found_key_decided_without_a_lock_races_its_eviction_exactly() {
    loom_tests::in_own_process!();
    let evicted = Tally::new();
    EVICT.check(decide_racing_an_eviction(evicted.clone()));
    assert!(evicted.get() > 0, "the sweep never evicted the key");
}

#[test]
fn a_found_key_decided_without_a_lock_races_a_switch_exactly() {
    loom_tests::in_own_process!();
    SWITCH.check(decide_racing_a_switch());
}

fn assert_race(message: &str) {
    assert!(message.contains("Causality violation"), "{message}");
}

#[test]
fn a_writer_that_skips_the_readers_is_caught() {
    loom_tests::in_own_process!();
    let bug = &tokengate::mutants::WRITER_SKIPS_READERS;
    assert_race(&INSERT.expect_violation(bug, decide_racing_an_insert()));
    assert_race(&EVICT.expect_violation(bug, decide_racing_an_eviction(Tally::new())));
    assert_race(&SWITCH.expect_violation(bug, decide_racing_a_switch()));
    assert_race(&TWO_READERS.expect_violation(bug, two_sections_racing_an_insert()));
    assert_race(&TWO_WRITERS.expect_violation(bug, a_section_racing_two_inserts()));
}

#[test]
fn a_reader_that_skips_the_writing_flag_is_caught() {
    loom_tests::in_own_process!();
    let bug = &tokengate::mutants::READER_SKIPS_FLAG;
    assert_race(&INSERT.expect_violation(bug, decide_racing_an_insert()));
    assert_race(&EVICT.expect_violation(bug, decide_racing_an_eviction(Tally::new())));
    assert_race(&SWITCH.expect_violation(bug, decide_racing_a_switch()));
}
