//! A hint for the optimizer: which paths are cold.

/// Marks the path that calls it as cold: the compiler then weighs the branches leading
/// to it as rarely taken, and the paths beside them as the common ones.
///
/// Where several early exits nest (a held request's keys, each announced, confirmed and
/// looked up), every one counted as even odds made the lookups at the end look rarer
/// than LLVM's cold call-site cutoff, so hashbrown's probe was kept out of line there
/// (measured: BENCHMARKS.md, "Scoped path: the early exits marked cold"). A call to an
/// empty `#[cold]` function, not `std::hint::cold_path` (stable only from Rust 1.95,
/// above this crate's minimum), and never inlined, so the mark outlives inlining.
#[cold]
#[inline(never)]
pub(crate) fn cold_path() {}
