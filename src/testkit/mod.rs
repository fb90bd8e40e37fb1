//! Test support shared by the property tests, the loom models and the fuzz targets.
//!
//! Enabled by the `testkit` feature; not part of the engine. The models here are written
//! for obviousness, not speed: absolute time and balances in `u128`, no packing, no
//! wrap, no atomics.

pub mod check;
pub mod herd;
mod model;

pub use check::{Op, PolicySpec, Report, Scenario, Violation, check};
pub use model::{Ideal, Model, Outcome};
