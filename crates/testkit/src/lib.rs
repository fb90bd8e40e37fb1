//! Test support shared by the property tests, the loom models and the fuzz targets.
//!
//! Enabled by the `testkit` feature; not part of the engine. The models here are written
//! for obviousness, not speed: absolute time and balances in `u128`, no packing, no
//! wrap, no atomics.
//!
//! Four checks, each a pure function of a typed input, so that property tests, the
//! fuzz targets (`fuzz/`) and the corpus replay of `cargo test` run the same code:
//!
//! - [`check()`]: one bucket on a manual clock against [`Model`] and [`Ideal`];
//! - [`check_packing`]: the packed word's layout and transitions against `u128`;
//! - [`check_multi`]: all-or-nothing acquisition across buckets, each against its models;
//! - [`check_reconfigure`]: reconfiguration's conversion against exact arithmetic, and a
//!   live bucket switching policies against an ideal bucket per policy.
//!
//! With the `arbitrary` feature the inputs implement `arbitrary::Arbitrary` (decoded
//! through distributions that reach the whole useful range, see `replay`) and
//! `replay` runs any of the checks on raw fuzzer bytes.
//!
//! [`net`]: loopback plumbing for the tests and examples against a real Redis (the
//! server's URL, unique key namespaces, a proxy that can be cut into a black hole).

#[cfg(feature = "arbitrary")]
mod arbitrary;
pub mod check;
pub mod herd;
mod model;
pub mod multi;
pub mod net;
pub mod packing;
pub mod reconfigure;
#[cfg(feature = "arbitrary")]
pub mod replay;

pub use check::{Op, PolicySpec, Report, Scenario, Violation, acceptable_layout, check};
pub use model::{Ideal, Model, Outcome};
pub use multi::{MultiOp, MultiReport, MultiScenario, check_multi};
pub use packing::{
    LayoutParams, PackingCase, PackingReport, Probe, TickSpec, UnitsSpec, WordSpec, check_packing,
};
pub use reconfigure::{
    ConvertProbe, LiveOp, ReconfigureCase, ReconfigureReport, check_conversion, check_reconfigure,
};
