//! `radixd bench`: latency under contention, shared memory against the Unix
//! socket a user would otherwise write.
//!
//! The parent starts the server (the daemon loop in a thread, or a
//! [`UdsServer`]), re-executes itself as N worker processes, releases them
//! together, and merges the latency samples they send back. Every worker
//! runs the same scheduler steps against [`Backend`], so both transports
//! carry exactly the same requests: match and lock the prompt, allocate
//! pages for the rest, insert, unlock, and now and then evict.

mod args;
pub mod baseline;
mod events;
mod latency;
mod plot;
mod stats;
pub mod store;
mod table;
mod uds;
mod worker;
mod workload;

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use radixd_ipc::sync::{AtomicU32, Ordering};
use serde::{Deserialize, Serialize};

use crate::daemon::{serve, ServeConfig};
use crate::engine::Config;
use crate::op::{Backend, Reply, Request};
use crate::Client;
use events::{await_subscriber, consume, events_config, Flags};
use stats::{merge, reader_figures};
use table::{print_event_ratios, print_ratios, print_table};
use workload::load_prompts;

pub use args::{BenchArgs, Transport, WorkerArgs};
pub use baseline::Baseline;
pub use latency::{EventLatency, Spread};
pub use uds::{UdsClient, UdsServer};
pub use worker::worker;
pub use workload::Rng;

/// Operations whose latency is reported, in step order.
pub const OPS: [&str; 5] = ["match", "alloc", "insert", "unlock", "evict"];
/// Every this many steps a worker also evicts.
const EVICT_EVERY: u32 = 50;

/// Why a benchmark failed.
#[derive(Debug)]
pub enum BenchError {
    /// The arguments do not make a run.
    Args(String),
    /// Spawning, waiting or writing failed.
    Io(io::Error),
    /// The daemon or the socket server failed.
    Server(String),
    /// A client process failed or sent a bad report.
    Worker(String),
    /// The `--plot` SVG could not be drawn.
    Plot(String),
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Args(m) => write!(f, "bad arguments: {m}"),
            Self::Io(e) => write!(f, "I/O: {e}"),
            Self::Server(m) => write!(f, "server: {m}"),
            Self::Worker(m) => write!(f, "worker: {m}"),
            Self::Plot(m) => write!(f, "drawing the plot: {m}"),
        }
    }
}

impl std::error::Error for BenchError {}

impl From<io::Error> for BenchError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// What one worker sends back.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct WorkerReport {
    /// Nanoseconds per request, by operation.
    pub samples: BTreeMap<String, Vec<u64>>,
    /// Requests rejected (e.g. no page to allocate).
    pub rejected: u64,
    /// Prompt tokens served from the cache, and in all.
    pub hit_tokens: u64,
    pub prompt_tokens: u64,
    pub elapsed_ns: u64,
    /// Peeks that kept colliding with writes (reader workers).
    #[serde(default)]
    pub contended: u64,
    /// `--kv-events-latency`: `[page key, answered at]` of every insert
    /// that cached pages (see [`EventLatency`]).
    #[serde(default)]
    pub answered: Vec<[u64; 2]>,
}

/// Latency figures of one operation, in microseconds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Latency {
    pub count: u64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
}

/// The result of one run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunReport {
    pub transport: Transport,
    pub clients: u32,
    pub busy_poll: bool,
    pub requests: u64,
    pub rejected: u64,
    pub seconds: f64,
    pub requests_per_second: f64,
    pub hit_rate: f64,
    /// Slowest worker's elapsed time over the fastest's (1 = perfectly fair).
    pub fairness: f64,
    pub ops: BTreeMap<String, Latency>,
    /// Whether the daemon published KV events.
    #[serde(default)]
    pub kv_events_on: bool,
    /// What a subscriber received, when the daemon published KV events
    /// and one subscribed.
    #[serde(default)]
    pub kv_events: Option<EventFigures>,
    /// The physical limits measured in the same run (`--baseline`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Baseline>,
    /// What the `--readers` processes saw, when there were any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readers: Option<ReaderFigures>,
}

/// What the `--readers` processes saw while the writers ran.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ReaderFigures {
    /// Reader processes.
    pub readers: u32,
    /// Peeks that answered.
    pub peeks: u64,
    /// Peeks that kept colliding with writes (`Contended`).
    pub contended: u64,
    /// `peeks / (peeks + contended)`.
    pub success: f64,
    /// Latency of the peeks that answered.
    pub latency: Latency,
}

/// What the bench's KV event subscriber received.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct EventFigures {
    /// Batches (sequence numbers) received.
    pub batches: u64,
    /// Events in them.
    pub events: u64,
    /// Sequence numbers the subscriber never received.
    pub gaps: u64,
    /// Resyncs after a queue overflow (the bench never resets, so each
    /// `AllBlocksCleared` is one).
    pub resyncs: u64,
    /// `--kv-events-latency`: how long after an insert was answered its
    /// `BlockStored` arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<EventLatency>,
}

/// Runs `radixd bench`.
pub fn run(args: &BenchArgs, out: &mut impl Write) -> Result<(), BenchError> {
    if args.store {
        return store::run(args.store_rounds, &std::env::current_exe()?, out);
    }
    if args.clients.is_empty() || args.clients.contains(&0) {
        return Err(BenchError::Args(
            "--clients needs counts of at least 1".into(),
        ));
    }
    if (args.kv_events || args.kv_events_compare || args.kv_events_latency)
        && (args.connect.is_some() || args.transport == Transport::Uds || args.compare)
    {
        return Err(BenchError::Args(
            "--kv-events measures a daemon this bench starts, over shm".into(),
        ));
    }
    if args.connect.is_some() && (args.compare || args.transport == Transport::Uds) {
        return Err(BenchError::Args(
            "--connect measures a running daemon over shm only".into(),
        ));
    }
    let components = args.components().map_err(BenchError::Args)?;
    if !components.is_full_only()
        && (args.connect.is_some() || args.transport == Transport::Uds || args.compare)
    {
        return Err(BenchError::Args(
            "--components configures a daemon this bench starts, over shm (a running one \
             keeps its own: --connect measures it as it is)"
                .into(),
        ));
    }
    if args.tp.is_some()
        && (args.transport == Transport::Uds || args.readers > 0 || args.tp == Some(0))
    {
        return Err(BenchError::Args(
            "--tp N (N ≥ 1) measures the ranks of one group over shm, without --readers".into(),
        ));
    }
    let args = &args.resolve()?;
    if args.requests == 0 || args.prompt_tokens < args.page_size() {
        return Err(BenchError::Args(
            "--requests and --prompt-tokens (≥ one page) must be positive".into(),
        ));
    }
    crate::engine::EngineLayout::new(args.page_size(), args.capacity())
        .map_err(|e| BenchError::Args(e.to_string()))?;
    if let Some(trace) = &args.trace {
        load_prompts(trace, args.block_size, args.prompt_tokens, 0, 1)?;
    }
    let transports = if args.compare {
        vec![Transport::Shm, Transport::Uds]
    } else {
        vec![args.transport]
    };
    let exe = std::env::current_exe()?;
    // First, while this process runs no other thread: the baseline forks.
    let limits = if args.baseline || args.compare {
        let b = baseline::measure()?;
        if !args.json {
            writeln!(
                out,
                "baseline: one cache line between two processes p50 {:.3} µs (p99 {:.3}); with a 4 KiB cross-core copy p50 {:.3} µs (p99 {:.3})\n",
                b.pingpong_p50_us, b.pingpong_p99_us, b.copy4k_p50_us, b.copy4k_p99_us
            )?;
        }
        Some(b)
    } else {
        None
    };
    // `--kv-events-latency` measures a run with events on.
    let args = &BenchArgs {
        kv_events: args.kv_events || (args.kv_events_latency && !args.kv_events_compare),
        ..args.clone()
    };
    let mut reports = Vec::new();
    let variants: Vec<BenchArgs> = if args.kv_events_compare {
        [false, true]
            .into_iter()
            .map(|on| BenchArgs {
                kv_events: on,
                ..args.clone()
            })
            .collect()
    } else {
        vec![args.clone()]
    };
    if let Some(ranks) = args.tp {
        // One client alone, then the ranks of one group: the same steps,
        // with whole keys both (a rank sends no anchored request, and a
        // TP=1 SGLang server sends whole keys too).
        let args = &BenchArgs {
            full_requests: true,
            ..args.clone()
        };
        for clients in [1, ranks] {
            let report = run_once(args, Transport::Shm, clients, &exe)?;
            if args.json {
                writeln!(
                    out,
                    "{}",
                    serde_json::to_string(&report)
                        .map_err(|e| BenchError::Worker(e.to_string()))?
                )?;
            } else {
                if clients > 1 {
                    writeln!(
                        out,
                        "{clients} ranks of one group (every rank the same steps):"
                    )?;
                } else {
                    writeln!(out, "one client alone:")?;
                }
                print_table(out, &report)?;
            }
            reports.push(report);
        }
        if !args.json {
            table::print_group_ratios(out, &reports[0], &reports[1])?;
        }
        return Ok(());
    }
    for &clients in &args.clients {
        for (&transport, args) in transports
            .iter()
            .flat_map(|t| variants.iter().map(move |a| (t, a)))
        {
            let mut report = run_once(args, transport, clients, &exe)?;
            report.baseline = limits;
            if args.json {
                writeln!(
                    out,
                    "{}",
                    serde_json::to_string(&report)
                        .map_err(|e| BenchError::Worker(e.to_string()))?
                )?;
            } else {
                print_table(out, &report)?;
            }
            reports.push(report);
        }
        if args.compare && !args.json {
            print_ratios(out, &reports[reports.len() - 2..])?;
        }
        if args.kv_events_compare && !args.json {
            print_event_ratios(out, &reports[reports.len() - 2..])?;
        }
    }
    if let Some(path) = &args.plot {
        plot::draw(path, &reports).map_err(BenchError::Plot)?;
    }
    Ok(())
}

/// One measurement: starts the server (unless `args.connect` names one),
/// runs `clients` workers, each a process of `exe` (a `radixd` binary),
/// and merges their reports.
pub fn run_once(
    args: &BenchArgs,
    transport: Transport,
    clients: u32,
    exe: &Path,
) -> Result<RunReport, BenchError> {
    let config = Config {
        page_size: args.page_size(),
        capacity: args.capacity(),
    };
    let stop = AtomicU32::new(0);
    let name = format!("radixd-bench-{}-{clients}", std::process::id());
    let socket = std::env::temp_dir().join(format!("{name}.sock"));
    let sub_stop = AtomicU32::new(0);
    let sub_seen = AtomicU32::new(0);
    std::thread::scope(|scope| {
        let mut _uds = None;
        let mut daemon = None;
        let mut subscriber = None;
        // The page keys of the probes that found the subscriber listening.
        let mut probes = Ok(Vec::new());
        let (sub_stop, sub_seen) = (&sub_stop, &sub_seen);
        let target = match (transport, &args.connect) {
            (Transport::Shm, Some(name)) => name.clone(),
            (Transport::Shm, None) => {
                let serve_config = ServeConfig {
                    name: name.clone(),
                    page_size: args.page_size(),
                    capacity: args.capacity(),
                    max_clients: clients + args.readers + 1 + u32::from(args.locked > 0),
                    scratch_bytes: 1 << 20,
                    busy_poll: args.busy_poll,
                    events: args.kv_events.then(|| events_config(&name)),
                    components: args.components().map_err(BenchError::Args)?,
                    ..ServeConfig::default()
                };
                let stop = &stop;
                daemon = Some(scope.spawn(move || serve(&serve_config, stop)));
                wait_for_daemon(&name)?;
                if args.kv_events && !args.kv_events_no_subscriber {
                    let ev = events_config(&name);
                    let timed = args.kv_events_latency;
                    subscriber = Some(scope.spawn(move || {
                        consume(
                            ev,
                            Flags {
                                stop: sub_stop,
                                seen: sub_seen,
                            },
                            timed,
                        )
                    }));
                    // An error stops the daemon below, like the workers'.
                    probes = await_subscriber(&name, args.page_size(), sub_seen);
                }
                name.clone()
            }
            (Transport::Uds, _) => {
                _uds = Some(UdsServer::start(&socket, config)?);
                socket.display().to_string()
            }
        };
        // The holder (if any) lets go before the daemon is stopped, and a
        // refused hold stops the daemon like any other failure.
        let mut result = probes.and_then(|probes| {
            hold_locked(args, transport, &target, config)
                .and_then(|_held| run_workers(args, transport, clients, &target, exe))
                .map(|(report, answered)| (report, answered, probes))
        });
        if let Ok((report, ..)) = result.as_mut() {
            report.kv_events_on = args.kv_events;
        }
        if let Some(sub) = subscriber {
            // Relaxed: a lone stop flag; the subscriber drains what is left.
            sub_stop.store(1, Ordering::Relaxed);
            let got = sub
                .join()
                .map_err(|_| BenchError::Server("the subscriber thread panicked".into()))
                .and_then(|got| got);
            // A failure here, too, stops the daemon below.
            result = result.and_then(|(mut report, answered, probes)| {
                let (mut figures, arrivals) = got?;
                if args.kv_events_latency {
                    let arrivals: Vec<_> = arrivals
                        .into_iter()
                        .filter(|a| !probes.contains(&a.key))
                        .collect();
                    figures.latency = Some(latency::pair(&answered, &arrivals));
                }
                report.kv_events = Some(figures);
                Ok((report, answered, probes))
            });
        }
        // Relaxed: a lone stop flag, polled by the daemon loop.
        stop.store(1, Ordering::Relaxed);
        if let Some(daemon) = daemon {
            let joined = daemon.join();
            if args.kv_events {
                // ZeroMQ unlinks an `ipc://` endpoint from its I/O thread,
                // which may not get to it before this process exits.
                let _ = std::fs::remove_file(events::endpoint_path(&name));
            }
            match joined {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(BenchError::Server(e.to_string())),
                Err(_) => return Err(BenchError::Server("the daemon thread panicked".into())),
            }
        }
        result.map(|(report, ..)| report)
    })
}

/// `--locked`: a client of `target` that caches `args.locked` one-page
/// prompts, locked, and holds them until it is dropped.
fn hold_locked(
    args: &BenchArgs,
    transport: Transport,
    target: &str,
    config: Config,
) -> Result<Option<Box<dyn Backend>>, BenchError> {
    if args.locked == 0 {
        return Ok(None);
    }
    let mut holder: Box<dyn Backend> = match transport {
        Transport::Shm => {
            Box::new(Client::connect(target).map_err(|e| BenchError::Server(e.to_string()))?)
        }
        Transport::Uds => Box::new(UdsClient::connect(Path::new(target), config)?),
    };
    let refused = |e: crate::op::Rejection| BenchError::Server(format!("--locked: {e}"));
    for i in 0..args.locked {
        // Tokens no workload prompt starts with.
        let tokens = vec![u32::MAX - i; config.page_size as usize];
        let Reply::Pages(pages) = holder.call(Request::Alloc { n: 1 }).map_err(refused)? else {
            return Err(BenchError::Server(
                "--locked: alloc answered no pages".into(),
            ));
        };
        holder
            .call(Request::Insert {
                tokens,
                pages,
                lock: true,
            })
            .map_err(refused)?;
    }
    Ok(Some(holder))
}

fn wait_for_daemon(name: &str) -> Result<(), BenchError> {
    Client::connect_waiting(name, Duration::from_secs(10))
        .map(drop)
        .map_err(|e| BenchError::Server(format!("the daemon did not start: {e}")))
}

/// Runs the workers; their report, and `[page key, answered at]` of every
/// insert that cached pages (`--kv-events-latency`).
fn run_workers(
    args: &BenchArgs,
    transport: Transport,
    clients: u32,
    target: &str,
    exe: &Path,
) -> Result<(RunReport, Vec<[u64; 2]>), BenchError> {
    let readers = if transport == Transport::Shm {
        args.readers
    } else {
        0
    };
    let mut children: Vec<Child> = Vec::new();
    // `--tp`: the clients are the ranks of one group, each drawing the
    // prompts of worker 0 of 1.
    let group = args
        .tp
        .filter(|_| clients > 1)
        .map(|_| format!("bench-{}-{clients}", std::process::id()));
    for worker in 0..clients + readers {
        let (as_worker, workers) = match group {
            Some(_) => (0, 1),
            None => (worker, clients),
        };
        let mut cmd = Command::new(exe);
        cmd.args([
            "bench-worker",
            "--transport",
            &transport.to_string(),
            "--target",
            target,
        ])
        .args([
            "--requests",
            &args.requests.to_string(),
            "--prompt-tokens",
            &args.prompt_tokens.to_string(),
        ])
        .args([
            "--page-size",
            &args.page_size().to_string(),
            "--capacity",
            &args.capacity().to_string(),
        ])
        .args([
            "--worker",
            &as_worker.to_string(),
            "--workers",
            &workers.to_string(),
        ])
        .args(["--block-size", &args.block_size.to_string()]);
        if let Some(trace) = &args.trace {
            cmd.arg("--trace").arg(trace);
        }
        if worker >= clients {
            cmd.arg("--reader");
        }
        if args.full_requests {
            cmd.arg("--full-requests");
        }
        // Both runs of `--kv-events-compare` alike: the same work.
        if args.kv_events_latency {
            cmd.arg("--stamp-inserts");
        }
        if let Some(group) = &group {
            cmd.args(["--group", group, "--rank", &worker.to_string()])
                .args(["--group-size", &clients.to_string()]);
        }
        children.push(cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?);
    }
    let outcome = drive(&mut children, clients as usize);
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    let (mut reports, seconds) = outcome?;
    let peeks = reports.split_off(clients as usize);
    let mut report = merge(transport, clients, args.busy_poll, &reports, seconds);
    report.readers = (readers > 0).then(|| reader_figures(readers, &peeks));
    let answered = reports
        .iter_mut()
        .flat_map(|r| r.answered.drain(..))
        .collect();
    Ok((report, answered))
}

/// Waits for every worker to be ready, releases them together, and reads
/// their reports: the first `writers` run their steps; the rest, readers,
/// peek until the writers are done and are then told to stop.
fn drive(children: &mut [Child], writers: usize) -> Result<(Vec<WorkerReport>, f64), BenchError> {
    let mut readers = Vec::new();
    for child in children.iter_mut() {
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| BenchError::Worker("no stdout".into()))?;
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        if line.trim() != "ready" {
            return Err(BenchError::Worker(format!(
                "worker did not start: {line:?}"
            )));
        }
        readers.push(reader);
    }
    let start = Instant::now();
    for child in children.iter_mut() {
        let stdin = child
            .stdin
            .as_mut()
            .ok_or_else(|| BenchError::Worker("no stdin".into()))?;
        stdin.write_all(b"go\n")?;
        stdin.flush()?;
    }
    let read_report = |reader: &mut BufReader<_>| -> Result<WorkerReport, BenchError> {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        serde_json::from_str(&line)
            .map_err(|e| BenchError::Worker(format!("bad report {line:?}: {e}")))
    };
    let mut reports = Vec::new();
    for reader in readers.iter_mut().take(writers) {
        reports.push(read_report(reader)?);
    }
    let seconds = start.elapsed().as_secs_f64();
    for child in children.iter_mut().skip(writers) {
        // The peeking processes stop when their stdin closes.
        drop(child.stdin.take());
    }
    for reader in readers.iter_mut().skip(writers) {
        reports.push(read_report(reader)?);
    }
    Ok((reports, seconds))
}
