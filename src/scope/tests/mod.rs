//! Tests that the scoped limiter's fast paths decide as its general path does: each
//! pays two limiters built alike, one on the fast path and one on the general path, and
//! compares everything they report.

mod global_path;
pub(super) mod held_path;
