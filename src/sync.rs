//! The crate's one door to atomics: `core` normally, `loom` under `cfg(loom)`.
//!
//! Everything that touches shared state imports from here, so the same code is
//! model-checked by `loom-tests/` (the pattern tokio and crossbeam use).

#[cfg(not(loom))]
pub(crate) use std::sync::Arc;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
