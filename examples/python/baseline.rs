//! The Rust side of `python/bench/bench.py`: the same calls the Python
//! benchmark makes, through `radixd::Client`, against the same daemon, so the
//! two medians compare Python's overhead and nothing else.
//!
//! ```sh
//! cargo run --release --example python_baseline -- SEGMENT [ROUNDS]
//! ```
//!
//! Prints one line of `key=value` medians in nanoseconds.

use std::time::Instant;

use radixd::{Client, Policy};

/// Calls per figure unless the second argument says otherwise.
const ROUNDS: usize = 20_000;
const ORDER_ROUNDS: usize = 11;

/// The prompts `bench.py` builds (same formulas): a cached 1K-token prompt,
/// and 1,000 waiting 2K-token prompts over 10 system prompts.
fn prompt_1k() -> Vec<u32> {
    (0..1024).map(|i| 7 * i + 1).collect()
}

fn waiting() -> Vec<Vec<u32>> {
    (0..1000u32)
        .map(|p| {
            let system = (0..1024).map(move |i| 1_000_000 + (p % 10) * 10_000 + i);
            let own = (0..1024).map(move |i| 5_000_000 + p * 2048 + i);
            system.chain(own).collect()
        })
        .collect()
}

/// The median of `rounds` samples taken by `sample`.
fn median_of<E>(rounds: usize, mut sample: impl FnMut() -> Result<u64, E>) -> Result<u64, E> {
    let mut v = (0..rounds)
        .map(|_| sample())
        .collect::<Result<Vec<_>, E>>()?;
    v.sort_unstable();
    Ok(v[v.len() / 2])
}

/// The nanoseconds `call` takes (its result is kept from the optimizer).
fn nanos<T, E>(call: impl FnOnce() -> Result<T, E>) -> Result<u64, E> {
    let t = Instant::now();
    let r = call()?;
    let ns = t.elapsed().as_nanos() as u64;
    std::hint::black_box(r);
    Ok(ns)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let name = std::env::args()
        .nth(1)
        .ok_or("usage: python_baseline SEGMENT [ROUNDS]")?;
    let rounds = match std::env::args().nth(2) {
        Some(r) => r.parse()?,
        None => ROUNDS,
    };
    let mut client = Client::connect(&name)?;
    let tokens = prompt_1k();
    let m = client.match_prefix(&tokens, true)?;
    let handle = m.handle.ok_or("bench.py caches the 1K prompt first")?;
    client.unlock(handle)?;

    let matches = median_of(rounds, || nanos(|| client.match_prefix(&tokens, false)))?;
    let unlocks = median_of(rounds, || {
        client.lock(handle)?;
        nanos(|| client.unlock(handle))
    })?;
    let prompts = waiting();
    let mut orders = Vec::with_capacity(2);
    for policy in [Policy::Lpm, Policy::DfsWeight] {
        orders.push(median_of(ORDER_ROUNDS, || {
            nanos(|| client.order(&prompts, policy))
        })?);
    }
    println!(
        "match_1k_ns={} unlock_ns={} order_lpm_ns={} order_dfs_ns={}",
        matches, unlocks, orders[0], orders[1]
    );
    Ok(())
}
