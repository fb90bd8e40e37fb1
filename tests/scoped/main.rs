//! The scoped limiter's integration tests, one module per subject, in one test binary:
//! the scoped limiter's generic code is compiled once for all of them, and the harness
//! runs them side by side. One subject: `cargo test --release --test scoped -- tiers::`.

mod leased;
mod multi_policy;
mod owned;
mod reconfigure;
mod remote;
mod retier;
mod scopes;
mod support;
mod tiers;
