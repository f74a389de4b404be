//! loom models of the cross-process protocols of `radixd-ipc` (SPSC ring,
//! futex doorbell, client slot claim/release/reclaim), and of the router
//! index's block table (`src/index/table.rs`, compiled here by path); see
//! `tests/`.
//!
//! Run with `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p loom_tests --release`.
//!
//! Every model runs through [`explore`], which asserts a floor on the
//! executions loom explored: a model that stops exploring (a bound hit
//! early, a loop that no longer branches) fails instead of passing empty.

/// Runs `model` under loom (with room for the models' yield loops) and
/// asserts it explored at least `floor` executions, counted outside the
/// model with a std atomic (loom's own would reset with each execution).
#[cfg(loom)]
pub fn explore(name: &str, floor: usize, model: impl Fn() + Sync + Send + 'static) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let mut builder = loom::model::Builder::new();
    // The models' threads wait for each other in yield loops.
    builder.max_branches = 20_000;
    builder.check(move || {
        // Relaxed: a tally read after `check` returns (same thread).
        counter.fetch_add(1, Ordering::Relaxed);
        model();
    });
    // Relaxed: every execution ran on this thread's watch and is done.
    let runs = runs.load(Ordering::Relaxed);
    eprintln!("{name}: {runs} executions");
    assert!(
        runs >= floor,
        "{name}: only {runs} executions explored (floor {floor})"
    );
}
