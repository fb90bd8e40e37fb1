//! The loom models, one module per file of `tests/`, in one test binary so that the test
//! harness runs them side by side on every core (separate binaries would run one after
//! the other), each test in a process of its own (`loom_tests::in_own_process!`, the
//! first line of every test: two models in one process stall each other's stack unmaps).
//!
//! Run them all, or one file's, from the repository root:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p loom-tests --release
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p loom-tests --release -- hot::
//! ```
#![cfg(loom)]

mod acquire_race;
mod clock_advance;
mod epoch;
mod hot;
mod keyed_read;
mod keyed_search;
mod leased_reconfigure;
mod live_reconfigure;
mod multi;
mod refund;
mod scoped_held;
mod scoped_reconfigure;
mod scoped_retire;
mod scoped_two_held;
mod stale_now;
mod step_back;

/// Every model runs in a process of its own (`loom_tests::ran_in_own_process`): this
/// test's body runs only there, and every test of `tests/` opens with the line that
/// sends it there.
#[test]
fn every_model_runs_in_a_process_of_its_own() {
    loom_tests::in_own_process!();
    assert_eq!(
        std::env::var("LOOM_TESTS_OWN_PROCESS").as_deref(),
        Ok("every_model_runs_in_a_process_of_its_own"),
        "the test body ran in the harness's process"
    );
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut tests = 0;
    for file in std::fs::read_dir(&dir).unwrap() {
        let path = file.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if line != "#[test]" {
                continue;
            }
            let mut header = lines.next().unwrap_or_default();
            while header.starts_with("#[") {
                header = lines.next().unwrap_or_default();
            }
            let first = lines.next().unwrap_or_default();
            assert_eq!(
                first.trim(),
                "loom_tests::in_own_process!();",
                "{}: `{header}` does not open with it",
                path.display()
            );
            tests += 1;
        }
    }
    assert!(tests > 90, "found {tests} tests in {}", dir.display());
}
