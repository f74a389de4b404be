//! End to end on one host: how long after a client's `insert` into
//! `radixd serve --kv-events` a query to `radixd index serve` (subscribed
//! to that daemon) sees the pages. Starts both daemons (`RADIXD_BIN`,
//! `target/release/radixd` by default), then inserts a fresh 4-page prompt
//! and queries (every 50 µs) until the index scores it 4 pages, 300 times, 10 or 200 ms
//! apart (a busy and a quiet publisher alike), and prints p50, p99 and max,
//! in all and by the gap before the insert.
//!
//! ```sh
//! cargo build --release --bin radixd --example kv_events_latency
//! target/release/examples/kv_events_latency [SAMPLES]
//! ```

use std::error::Error;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use radixd::index::cli::to_json;
use radixd::index::protocol::{Keys, Request};
use radixd::index::server::IndexClient;
use radixd::Client;

/// Pause between two queries of one sample.
const POLL: Duration = Duration::from_micros(50);

/// Stops a child daemon on drop.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid; no memory involved.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn spawn(bin: &str, args: &[&str]) -> Result<Daemon, String> {
    let child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{bin}: {e}"))?;
    Ok(Daemon(child))
}

fn main() -> Result<(), Box<dyn Error>> {
    let samples: usize = match std::env::args().nth(1) {
        Some(s) => s.parse().map_err(|e| format!("SAMPLES {s:?}: {e}"))?,
        None => 300,
    };
    if samples == 0 {
        return Err("SAMPLES: at least 1".into());
    }
    let bin = std::env::var("RADIXD_BIN").unwrap_or_else(|_| "target/release/radixd".into());
    let name = format!("lat-{}", std::process::id());
    let (publ, replay, listen) = (
        format!("ipc:///tmp/{name}.pub"),
        format!("ipc:///tmp/{name}.rep"),
        format!("ipc:///tmp/{name}.q"),
    );
    let _serve = spawn(
        &bin,
        &[
            "serve",
            "--name",
            &name,
            "--page-size",
            "16",
            "--capacity",
            "65536",
            "--kv-events",
            &publ,
            "--kv-events-replay",
            &replay,
        ],
    )?;
    let mut client = Client::connect_waiting(&name, Duration::from_secs(10))?;
    let subscribe = format!("w={publ}@{replay}");
    let _index = spawn(
        &bin,
        &[
            "index",
            "serve",
            "--listen",
            &listen,
            "--subscribe",
            &subscribe,
            "--block-size",
            "16",
        ],
    )?;
    let index = IndexClient::connect(&listen, Duration::from_secs(2))?;
    // The index answers once it is up (its subscription may take longer:
    // the first sample waits for it and is not counted).
    let scored = |tokens: &[u32]| {
        let answer = index.call(&Request::Query {
            keys: Keys::Tokens(tokens.to_vec()),
            early_exit: false,
        });
        answer.is_ok_and(|a| to_json(&a)["scores"]["w"] == 4)
    };

    // Samples by the gap before them: 10 ms (the publisher was busy a
    // moment ago) or 200 ms (it went idle).
    let gap_ms = |i: usize| if i % 2 == 1 { 10 } else { 200 };
    let (mut busy, mut quiet) = (Vec::new(), Vec::new());
    for i in 0..=samples {
        let tokens: Vec<u32> = (0..64).map(|j| i as u32 * 100_000 + j).collect();
        let pages = client.alloc(4)?;
        let t0 = Instant::now();
        client.insert(&tokens, &pages, false)?;
        while !scored(&tokens) {
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(format!("sample {i}: not visible after 30 s").into());
            }
            // Leaves the cores to the daemons between queries (on a small
            // host a spinning poller would stand in the publisher's way).
            sleep(POLL);
        }
        if i > 0 {
            let lat = t0.elapsed();
            if gap_ms(i - 1) == 10 {
                busy.push(lat);
            } else {
                quiet.push(lat);
            }
        }
        sleep(Duration::from_millis(gap_ms(i)));
    }
    let all: Vec<Duration> = busy.iter().chain(&quiet).copied().collect();
    for (what, mut lat) in [("all", all), ("10 ms apart", busy), ("200 ms apart", quiet)] {
        if lat.is_empty() {
            continue;
        }
        lat.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "event visible after insert ({what}): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} samples)",
            ms(lat[lat.len() / 2]),
            ms(lat[(lat.len() * 99 / 100).min(lat.len() - 1)]),
            ms(lat[lat.len() - 1]),
            lat.len()
        );
    }
    Ok(())
}
