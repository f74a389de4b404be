//! loom models of the cross-process protocols of `radixd-ipc` (SPSC ring,
//! futex doorbell, client slot claim/release/reclaim, reader epochs and
//! the daemon's grace policy, the peek retry loop, per-record versions),
//! of the engine's tree reader racing the real engine writer, of the grace
//! period end to end, and of the router index's block table
//! (`src/index/table.rs`, compiled here by path); see `tests/` and
//! docs/modelcheck.md.
//!
//! Run with `bash scripts/loom-patched`, then `RUSTFLAGS="--cfg loom"
//! LOOM_MAX_PREEMPTIONS=2 cargo test --manifest-path loom_tests/Cargo.toml
//! --release` (as `scripts/test` does). loom is 0.7.2 patched for its
//! load-load blind spot (tokio-rs/loom#392, #166; `loom-0.7.2.patch`).
//!
//! Every model runs through [`explore`], which asserts a floor on the
//! executions that reached the path the model is about (the model says
//! which did): a model that stops exploring, or that explores only
//! executions that never meet the race it is about, fails instead of
//! passing empty.

#[cfg(loom)]
pub mod tree;

/// Runs `model` under loom (with room for the models' yield loops) and
/// asserts that at least `floor` executions reached the model's path
/// (`model` returns whether this one did), counted outside the model with
/// std atomics (loom's own would reset with each execution).
#[cfg(loom)]
pub fn explore(name: &str, floor: usize, model: impl Fn() -> bool + Sync + Send + 'static) {
    explore_bounded(name, floor, None, model);
}

/// [`explore`] with at most `preemptions` preemptions per execution
/// instead of `LOOM_MAX_PREEMPTIONS`, for a model whose race needs fewer
/// than CI's bound and whose writer is too long to explore at it (the
/// model says why its bound is enough).
#[cfg(loom)]
pub fn explore_bounded(
    name: &str,
    floor: usize,
    preemptions: Option<usize>,
    model: impl Fn() -> bool + Sync + Send + 'static,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let counts = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let counter = counts.clone();
    let mut builder = loom::model::Builder::new();
    if preemptions.is_some() {
        builder.preemption_bound = preemptions;
    }
    // The models' threads wait for each other in yield loops.
    builder.max_branches = 20_000;
    builder.check(move || {
        // Relaxed: tallies read after `check` returns (same thread).
        counter[0].fetch_add(1, Ordering::Relaxed);
        if model() {
            counter[1].fetch_add(1, Ordering::Relaxed);
        }
    });
    // Relaxed: every execution ran on this thread's watch and is done.
    let (runs, reached) = (
        counts[0].load(Ordering::Relaxed),
        counts[1].load(Ordering::Relaxed),
    );
    eprintln!("{name}: {runs} executions, {reached} on the path");
    assert!(
        reached >= floor,
        "{name}: only {reached} of {runs} executions reached the path (floor {floor})"
    );
}
