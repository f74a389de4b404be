//! Four scheduler processes sharing one radixd cache.
//!
//! ```sh
//! cargo run --release --example multi_scheduler
//! ```
//!
//! The example runs the daemon in a thread and re-executes itself four times
//! as schedulers. Each scheduler serves requests whose prompts share a
//! system prompt and one of a few few-shot blocks, as a real serving stack
//! would: match and lock the cached prefix, allocate pages for the rest,
//! insert the prompt, unlock. Each prints its hit rate and latencies; the
//! parent sums them up.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use radixd::bench::Rng;
use radixd::daemon::{serve, ServeConfig};
use radixd::Client;
use radixd_ipc::sync::{AtomicU32, Ordering};

const SCHEDULERS: u32 = 4;
const REQUESTS: u32 = 2_000;
const PAGE: u32 = 16;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, role, name, id] = args.as_slice() {
        if role == "scheduler" {
            return scheduler(name, id.parse()?);
        }
    }
    let name = format!("radixd-example-{}", std::process::id());
    let config = ServeConfig {
        name: name.clone(),
        page_size: PAGE,
        capacity: 16_384,
        max_clients: 8,
        scratch_bytes: 1 << 20,
        ..ServeConfig::default()
    };
    static STOP: AtomicU32 = AtomicU32::new(0);
    let daemon = std::thread::spawn(move || serve(&config, &STOP));
    drop(Client::connect_waiting(&name, Duration::from_secs(5))?);
    println!("daemon up on /dev/shm/{name}; {SCHEDULERS} schedulers × {REQUESTS} requests");
    let me = std::env::current_exe()?;
    let children: Vec<_> = (0..SCHEDULERS)
        .map(|id| {
            Command::new(&me)
                .args(["scheduler", &name, &id.to_string()])
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let (mut hit, mut total) = (0u64, 0u64);
    for child in children {
        let out = child.wait_with_output()?;
        for line in BufReader::new(&out.stdout[..]).lines() {
            let line = line?;
            println!("{line}");
            // "scheduler N: hit H of T tokens ..."
            let words: Vec<&str> = line.split_whitespace().collect();
            if let (Some(h), Some(t)) = (words.get(3), words.get(5)) {
                hit += h.parse::<u64>().unwrap_or(0);
                total += t.parse::<u64>().unwrap_or(0);
            }
        }
    }
    let mut client = Client::connect(&name)?;
    let (stats, _) = client.stats()?;
    client.validate()?;
    drop(client);
    println!(
        "all: hit rate {:.1}% ({hit} of {total} prompt tokens); cache holds {} tokens in {} nodes, {} pages evicted",
        100.0 * hit as f64 / total.max(1) as f64,
        stats.total_tokens,
        stats.nodes,
        stats.evicted_pages
    );
    STOP.store(1, Ordering::Relaxed); // Relaxed: a lone stop flag.
    daemon.join().map_err(|_| "daemon thread panicked")??;
    Ok(())
}

fn scheduler(name: &str, id: u32) -> Result<(), Box<dyn std::error::Error>> {
    let mut client = Client::connect(name)?;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ u64::from(id + 1));
    let system: Vec<u32> = (0..512).collect();
    let (mut hit, mut total) = (0u64, 0u64);
    let mut match_ns = Vec::with_capacity(REQUESTS as usize);
    let mut insert_ns = Vec::with_capacity(REQUESTS as usize);
    for request in 0..REQUESTS {
        // System prompt, one of 8 few-shot blocks, then the user's turn
        // (repeated now and then, as a multi-turn chat would).
        let mut prompt = system.clone();
        let shot = rng.below(8);
        prompt.extend((0..256).map(|i| 10_000 + shot * 1_000 + i));
        let user = if rng.below(4) == 0 {
            rng.below(50)
        } else {
            1_000 + id * REQUESTS + request
        };
        prompt.extend((0..256).map(|i| 100_000 + user * 512 + i));

        let t = Instant::now();
        let m = client.match_prefix(&prompt, true)?;
        match_ns.push(t.elapsed().as_nanos() as u64);
        let rest = (prompt.len() - m.len) / PAGE as usize;
        let t = Instant::now();
        let mut pages = m.pages.clone();
        pages.extend(client.alloc(rest as u64)?);
        client.insert(&prompt, &pages, false)?;
        insert_ns.push(t.elapsed().as_nanos() as u64);
        if let Some(handle) = m.handle {
            client.unlock(handle)?;
        }
        hit += m.len as u64;
        total += prompt.len() as u64;
    }
    let p = |v: &mut Vec<u64>, q: f64| {
        v.sort_unstable();
        v[((v.len() - 1) as f64 * q) as usize] as f64 / 1e3
    };
    println!(
        "scheduler {id}: hit {hit} of {total} tokens ({:.1}%); match+lock p50 {:.1} µs p99 {:.1} µs; alloc+insert p50 {:.1} µs p99 {:.1} µs",
        100.0 * hit as f64 / total as f64,
        p(&mut match_ns, 0.5),
        p(&mut match_ns, 0.99),
        p(&mut insert_ns, 0.5),
        p(&mut insert_ns, 0.99),
    );
    Ok(())
}
