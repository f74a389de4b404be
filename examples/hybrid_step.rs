//! One scheduler step through a daemon, full-only against SWA: match a
//! cached 4,096-token prompt plus 16 new tokens and lock it, allocate a
//! page (FULL, paired with an SWA page), insert, unlock. Prints the median
//! step of each configuration, alternated over three rounds.
//!
//! ```sh
//! cargo run --release --example hybrid_step
//! ```

use std::time::{Duration, Instant};

use radixd::daemon::{serve, ServeConfig};
use radixd::engine::{Components, SwaConfig};
use radixd::Client;
use radixd_ipc::sync::{AtomicU32, Ordering};

const PAGE: u32 = 16;
const PROMPT: u32 = 4096;
const STEPS: u32 = 4000;
const CAPACITY: u32 = 65_536;

/// The median step in µs on a daemon keeping `components`; `with` asks
/// for the hybrid extras (`match_with`).
fn median_step(name: &str, components: Components, with: bool) -> Result<f64, String> {
    let config = ServeConfig {
        name: name.to_owned(),
        page_size: PAGE,
        capacity: CAPACITY,
        max_clients: 2,
        scratch_bytes: 1 << 20,
        components,
        ..ServeConfig::default()
    };
    let stop = std::sync::Arc::new(AtomicU32::new(0));
    let flag = stop.clone();
    let daemon = std::thread::spawn(move || serve(&config, &flag));
    let result = steps(name, with);
    // Relaxed: a plain flag the serving loop polls; nothing to order.
    stop.store(1, Ordering::Relaxed);
    let served = daemon
        .join()
        .map_err(|_| "the daemon panicked".to_owned())?;
    served.map_err(|e| e.to_string())?;
    result
}

fn steps(name: &str, with: bool) -> Result<f64, String> {
    let e = |e: radixd::ClientError| e.to_string();
    let mut c = Client::connect_waiting(name, Duration::from_secs(5)).map_err(e)?;
    let mut key: Vec<u32> = (0..PROMPT).collect();
    let pages = c.alloc(u64::from(PROMPT / PAGE)).map_err(e)?;
    c.insert(&key, &pages, false).map_err(e)?;
    let mut times = Vec::with_capacity(STEPS as usize);
    for i in 0..STEPS {
        key.truncate(PROMPT as usize);
        key.extend((0..PAGE).map(|j| PROMPT + i * PAGE + j));
        let start = Instant::now();
        let m = if with {
            c.match_with(&key, true).map_err(e)?.0
        } else {
            c.match_prefix(&key, true).map_err(e)?
        };
        let mut pages = m.pages;
        pages.extend(c.alloc(1).map_err(e)?);
        c.insert(&key, &pages, false).map_err(e)?;
        if let Some(h) = m.handle {
            c.unlock(h).map_err(e)?;
        }
        times.push(start.elapsed().as_secs_f64() * 1e6);
        if m.len != PROMPT as usize {
            return Err(format!("step {i} matched {} tokens", m.len));
        }
        // Keep the pool from filling: the new leaves go, the prompt stays.
        if i % 512 == 511 {
            c.evict(u64::from(512 * PAGE)).map_err(e)?;
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn main() -> Result<(), String> {
    let swa = |window| Components {
        swa: Some(SwaConfig {
            window,
            capacity: CAPACITY,
        }),
        mamba: None,
    };
    let runs = [
        ("full", Components::full(), false),
        ("swa W=512", swa(512), true),
        ("swa W=4096", swa(4096), true),
    ];
    for round in 0..3 {
        let mut line = format!("round {round}:");
        for (i, (label, components, with)) in runs.iter().enumerate() {
            let name = format!("radixd-hybrid-step-{}-{round}-{i}", std::process::id());
            let us = median_step(&name, *components, *with)?;
            line += &format!(" {label} {us:.1} µs;");
        }
        println!("{line}");
    }
    Ok(())
}
