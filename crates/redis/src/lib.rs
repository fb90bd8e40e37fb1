//! One tokengate budget across many instances: token leases from a global pool on Redis.
//!
//! See the crate's README for the design, the bounds and how they are tested.

#![warn(missing_docs, unreachable_pub, missing_debug_implementations, rust_2018_idioms)]
#![doc(test(attr(deny(warnings))))]

pub mod model;
mod policy;
pub mod script;

pub use policy::{LUA_EXACT_LIMIT, MIN_RATE, Mode, PolicyError, RemotePolicy, Start, UNITS_PER_TOKEN};
