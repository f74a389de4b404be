//! loom models of the cross-process protocols of `radixd-ipc` (SPSC ring,
//! futex doorbell, client slot claim/release/reclaim); see `tests/`.
//!
//! Run with `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p loom_tests --release`.
