//! A scoped limiter frees the generations its reconfigurations replace: a request and
//! its refund racing four switches never read a freed generation.
//!
//! Under loom a limiter keeps two replaced generations linked behind the current one (16
//! otherwise), so the third switch retires the first generation, and the fourth frees it
//! when no request can still hold it. The main thread pays 1 on the global scope, then
//! thread A refunds it while the main thread switches four times: the refund finds the
//! generation it paid on among those kept (and converts the cost through the switches
//! since), or gives nothing back when it is gone. Each generation's probe (a
//! loom cell its drop writes) is read on every pin and every find: a free that no
//! synchronization orders after a read is reported, in a real run a read of freed
//! memory. Time stands still and every switch is `AsIs` to a larger capacity, so every
//! token is accounted for.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use loom_tests::{Forward, Model, Tally};
use tokengate::scope::*;
use tokengate::{Inherit, Policy};

/// Spawns `f` on a thread with a stack large enough for a scoped request.
fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
    thread::Builder::new().stack_size(4 << 20).spawn(f).unwrap()
}

fn global(capacity: u64) -> RuleSet {
    RuleSet::new()
        .rule(
            ScopeKind::Global,
            Rule::new(Policy::new(capacity, 1.0).unwrap()).inherit(Inherit::AsIs),
        )
        .class(WorkClass::new("one", 1))
}

/// The main thread pays 1, then switches capacity 2 to 3, 4, 5 and 6 (`AsIs`: the
/// balance carried as it is) while thread A refunds the payment. `freed` counts
/// executions where the fourth switch freed the first generation.
fn refund_racing_four_switches(freed: &Tally) -> impl Fn() + Sync + Send + 'static {
    let freed = freed.clone();
    move || {
        let freed = freed.clone();
        spawn(move || model(&freed)).join().unwrap();
    }
}

fn model(freed: &Tally) {
    let limiter = Arc::new(global(2).build_with_clock(Forward::new()).unwrap());
    let one = limiter.class("one").unwrap();
    let d = limiter.try_acquire(&Request::new(), one).unwrap();
    assert!(d.is_admitted(), "a full bucket refused");
    let charge = d.charge().unwrap();
    let a = {
        let limiter = limiter.clone();
        spawn(move || limiter.refund(&charge))
    };
    limiter.reconfigure(global(3)).unwrap();
    limiter.reconfigure(global(4)).unwrap();
    limiter.reconfigure(global(5)).unwrap();
    limiter.reconfigure(global(6)).unwrap();
    // A generation retired and not freed: the refund's pin held it when a switch
    // retired it (a switch's own pin has ended before it retires).
    freed.hit_if(limiter.retired_generations() == 1);
    a.join().unwrap();
    assert_eq!(limiter.generations(), 5);
    let left = limiter.available(&Scope::Global).unwrap();
    // 2: the refund found its generation; 1: it came three switches or more after the
    // payment, the generation was gone, and it gave nothing back (never more than was
    // taken).
    assert!(
        left == 2.0 || left == 1.0,
        "tokens lost or minted across the switches: {left} left"
    );
}

/// Not exhaustive: four whole switches (each pins, seals, converts, publishes, fences
/// and retires) against a refund make too many interleavings to finish; the bound
/// explores every order a scheduler with three preemptions makes (209,108
/// executions, 30 s).
const RETIRE: Model = Model {
    name: "scoped retire: refund vs four switches",
    threads: 3,
    preemption_bound: Some(3),
};

fn assert_freed_read(message: &str) {
    assert!(
        message.contains("Causality violation") || message.contains("read a freed epoch"),
        "{message}"
    );
}

#[test]
fn a_refund_racing_four_switches_never_reads_a_freed_generation() {
    loom_tests::in_own_process!();
    let freed = Tally::new();
    RETIRE.check(refund_racing_four_switches(&freed));
    // Not vacuous: some executions free the first generation.
    assert!(freed.get() > 0, "no execution freed a generation");
}

#[test]
fn a_window_that_retires_a_generation_too_early_is_caught() {
    loom_tests::in_own_process!();
    let bug = &tokengate::mutants::EPOCH_WINDOW_SHORT;
    assert_freed_read(&RETIRE.expect_violation(bug, refund_racing_four_switches(&Tally::new())));
}

#[test]
fn a_scoped_retirement_that_frees_at_once_is_caught() {
    loom_tests::in_own_process!();
    let bug = &tokengate::mutants::EPOCH_FREES_EARLY;
    assert_freed_read(&RETIRE.expect_violation(bug, refund_racing_four_switches(&Tally::new())));
}
