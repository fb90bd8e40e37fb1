//! The epoch chain that frees what it retires (`src/epoch.rs`): a reader racing a
//! retirement never reads a freed epoch.
//!
//! Each epoch is a probe whose drop writes its cell. A reader pins the current epoch and
//! reads the cell; the writer replaces the epoch twice (the second retirement frees the
//! first epoch whenever no pin can still hold it). A free that does not happen after
//! every read of the epoch is a write concurrent with a read, which loom reports: in a
//! real run, a read of freed memory.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use loom_tests::{Model, Tally};
use tokengate::epoch_model::FreedChain;

/// An epoch whose drop writes its cell.
struct Probe(UnsafeCell<u64>);

// SAFETY: shared, the cell is only read; the one write is the drop's (`&mut`), which
// loom checks against every read.
unsafe impl Sync for Probe {}

impl Probe {
    fn new(value: u64) -> Probe {
        Probe(UnsafeCell::new(value))
    }

    fn read(&self) -> u64 {
        // SAFETY: only the drop writes the cell; loom checks that it happens after.
        self.0.with(|p| unsafe { *p })
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        // SAFETY: as above; loom reports a write that no synchronization orders after a
        // read.
        self.0.with_mut(|p| unsafe { *p = u64::MAX });
    }
}

/// Thread R reads the current epoch (pinned) `reads` times; the main thread replaces it
/// twice. `freed` counts executions where the first epoch was freed before the drop.
fn reader_racing_retirements(reads: usize, freed: &Tally) -> impl Fn() + Sync + Send + 'static {
    let freed = freed.clone();
    move || {
        let chain = Arc::new(FreedChain::new(Probe::new(0)));
        let reader = {
            let chain = chain.clone();
            thread::spawn(move || {
                for _ in 0..reads {
                    let seen = chain.read(Probe::read);
                    assert!(seen <= 2, "read a freed epoch: {seen}");
                }
            })
        };
        chain.replace(Probe::new(1));
        chain.replace(Probe::new(2));
        freed.hit_if(chain.retired() < 2);
        reader.join().unwrap();
    }
}

#[test]
fn a_reader_racing_retirements_never_reads_a_freed_epoch() {
    loom_tests::in_own_process!();
    let freed = Tally::new();
    Model::exhaustive("epoch: pinned reader vs two retirements", 2)
        .check(reader_racing_retirements(1, &freed));
    // Not vacuous: some executions free the first epoch while the reader runs.
    assert!(freed.get() > 0, "no execution freed an epoch");
}

#[test]
fn a_reader_pinning_twice_racing_retirements_never_reads_a_freed_epoch() {
    loom_tests::in_own_process!();
    let freed = Tally::new();
    Model {
        preemption_bound: Some(3),
        ..Model::exhaustive("epoch: two pins vs two retirements", 2)
    }
    .check(reader_racing_retirements(2, &freed));
    assert!(freed.get() > 0, "no execution freed an epoch");
}

#[test]
fn a_retirement_that_frees_at_once_is_caught() {
    loom_tests::in_own_process!();
    let freed = Tally::new();
    let message = Model::exhaustive("epoch: pinned reader vs two retirements", 2).expect_violation(
        &tokengate::mutants::EPOCH_FREES_EARLY,
        reader_racing_retirements(1, &freed),
    );
    assert!(
        message.contains("Causality violation") || message.contains("freed"),
        "{message}"
    );
}
