//! The loom models, one module per file of `tests/`, in one test binary so that the test
//! harness runs them side by side on every core (separate binaries would run one after
//! the other).
//!
//! Run them all, or one file's, from the repository root:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p loom-tests --release
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p loom-tests --release -- hot::
//! ```

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
