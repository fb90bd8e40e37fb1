//! Loom models of tokengate live in `tests/`; run them with
//! `RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release`.
