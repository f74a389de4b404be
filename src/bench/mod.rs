//! `radixd bench`: latency under contention, shared memory against the Unix
//! socket a user would otherwise write.
//!
//! The parent starts the server (the daemon loop in a thread, or a
//! [`UdsServer`]), re-executes itself as N worker processes, releases them
//! together, and merges the latency samples they send back. Every worker
//! runs the same scheduler steps against [`Backend`], so both transports
//! carry exactly the same requests: match and lock the prompt, allocate
//! pages for the rest, insert, unlock, and now and then evict.

mod plot;
mod uds;

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use radixd_ipc::copy;
use radixd_ipc::sync::{AtomicU32, Ordering};
use serde::{Deserialize, Serialize};

use crate::daemon::{serve, ServeConfig};
use crate::engine::Config;
use crate::op::Backend;
use crate::op::{Reply, Request};
use crate::replay::parse_trace;
use crate::Client;

pub use uds::{UdsClient, UdsServer};

/// Operations whose latency is reported, in step order.
pub const OPS: [&str; 5] = ["match", "alloc", "insert", "unlock", "evict"];
/// Every this many steps a worker also evicts.
const EVICT_EVERY: u32 = 50;

/// How requests travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Shared-memory rings (radixd).
    Shm,
    /// A Unix domain socket (the baseline).
    Uds,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Shm => "shm",
            Self::Uds => "uds",
        })
    }
}

/// `radixd bench` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Client processes; a comma-separated list (1,2,4,8) runs each in turn.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub clients: Vec<u32>,
    /// Scheduler steps per client (each is 4 requests, plus an evict every 50).
    #[arg(long, default_value_t = 5_000)]
    pub requests: u32,
    /// Tokens per prompt (trace prompts are cut to this).
    #[arg(long, default_value_t = 1024)]
    pub prompt_tokens: u32,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 16)]
    pub page_size: u32,
    /// Pages in the pool.
    #[arg(long, default_value_t = 65_536)]
    pub capacity: u32,
    /// Transport to measure.
    #[arg(long, value_enum, default_value_t = Transport::Shm)]
    pub transport: Transport,
    /// Run shm and uds back to back and print the ratios.
    #[arg(long)]
    pub compare: bool,
    /// Run the daemon with --busy-poll.
    #[arg(long)]
    pub busy_poll: bool,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Measure a running daemon instead of starting one (shm only).
    #[arg(long)]
    pub connect: Option<String>,
    /// Draw prompts from a Mooncake trace (block ids expanded to tokens).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Tokens per trace block.
    #[arg(long, default_value_t = 512)]
    pub block_size: u32,
    /// Draw p50 and p99 of `match` against clients as SVG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Run the daemon with `--kv-events` (shm only), with a subscriber
    /// consuming the stream, and report what it received.
    #[arg(long)]
    pub kv_events: bool,
    /// Run shm with KV events off, then on, and print the ratios.
    #[arg(long, conflicts_with = "compare")]
    pub kv_events_compare: bool,
    /// With KV events on, subscribe nobody (a router runs on its own host):
    /// measures the daemon and publisher side alone.
    #[arg(long)]
    pub kv_events_no_subscriber: bool,
}

/// Flags of the hidden worker subcommand.
#[derive(clap::Args, Debug, Clone, Serialize, Deserialize)]
pub struct WorkerArgs {
    #[arg(long, value_enum)]
    pub transport: Transport,
    /// Segment name (shm) or socket path (uds).
    #[arg(long)]
    pub target: String,
    #[arg(long)]
    pub requests: u32,
    #[arg(long)]
    pub prompt_tokens: u32,
    #[arg(long)]
    pub page_size: u32,
    #[arg(long)]
    pub capacity: u32,
    /// Worker number: seeds its prompts.
    #[arg(long)]
    pub worker: u32,
    /// Workers in all (trace requests are dealt round-robin).
    #[arg(long)]
    pub workers: u32,
    #[arg(long)]
    pub trace: Option<PathBuf>,
    #[arg(long, default_value_t = 512)]
    pub block_size: u32,
}

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
}

/// Runs `radixd bench`.
pub fn run(args: &BenchArgs, out: &mut impl Write) -> Result<(), BenchError> {
    if args.clients.is_empty() || args.clients.contains(&0) {
        return Err(BenchError::Args(
            "--clients needs counts of at least 1".into(),
        ));
    }
    if args.requests == 0 || args.prompt_tokens < args.page_size {
        return Err(BenchError::Args(
            "--requests and --prompt-tokens (≥ one page) must be positive".into(),
        ));
    }
    if (args.kv_events || args.kv_events_compare)
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
    crate::engine::EngineLayout::new(args.page_size, args.capacity)
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
    for &clients in &args.clients {
        for (&transport, args) in transports
            .iter()
            .flat_map(|t| variants.iter().map(move |a| (t, a)))
        {
            let report = run_once(args, transport, clients, &exe)?;
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
        page_size: args.page_size,
        capacity: args.capacity,
    };
    let stop = AtomicU32::new(0);
    let name = format!("radixd-bench-{}-{clients}", std::process::id());
    let socket = std::env::temp_dir().join(format!("{name}.sock"));
    let sub_stop = AtomicU32::new(0);
    std::thread::scope(|scope| {
        let mut _uds = None;
        let mut daemon = None;
        let mut subscriber = None;
        let sub_stop = &sub_stop;
        let target = match (transport, &args.connect) {
            (Transport::Shm, Some(name)) => name.clone(),
            (Transport::Shm, None) => {
                let serve_config = ServeConfig {
                    name: name.clone(),
                    page_size: args.page_size,
                    capacity: args.capacity,
                    max_clients: clients + 1,
                    scratch_bytes: 1 << 20,
                    mode: 0o600,
                    busy_poll: args.busy_poll,
                    session_ttl: None,
                    events: args.kv_events.then(|| events_config(&name)),
                };
                let stop = &stop;
                daemon = Some(scope.spawn(move || serve(&serve_config, stop)));
                wait_for_daemon(&name)?;
                if args.kv_events && !args.kv_events_no_subscriber {
                    let ev = events_config(&name);
                    subscriber = Some(scope.spawn(move || consume(ev, sub_stop)));
                    // Let the subscription reach the publisher.
                    std::thread::sleep(Duration::from_millis(200));
                }
                name.clone()
            }
            (Transport::Uds, _) => {
                _uds = Some(UdsServer::start(&socket, config)?);
                socket.display().to_string()
            }
        };
        let mut result = run_workers(args, transport, clients, &target, exe);
        if let Ok(report) = result.as_mut() {
            report.kv_events_on = args.kv_events;
        }
        if let Some(sub) = subscriber {
            // Relaxed: a lone stop flag; the subscriber drains what is left.
            sub_stop.store(1, Ordering::Relaxed);
            let figures = sub
                .join()
                .map_err(|_| BenchError::Server("the subscriber thread panicked".into()))?;
            if let Ok(report) = result.as_mut() {
                report.kv_events = Some(figures?);
            }
        }
        // Relaxed: a lone stop flag, polled by the daemon loop.
        stop.store(1, Ordering::Relaxed);
        if let Some(daemon) = daemon {
            match daemon.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(BenchError::Server(e.to_string())),
                Err(_) => return Err(BenchError::Server("the daemon thread panicked".into())),
            }
        }
        result
    })
}

/// The KV event endpoint of the bench daemon `name`.
fn events_config(name: &str) -> crate::events::EventsConfig {
    let ep = std::env::temp_dir().join(format!("{name}.kv-events"));
    crate::events::EventsConfig::new(format!("ipc://{}", ep.display()))
}

/// Subscribes to the bench daemon's events until `stop`, then until 0.5 s
/// pass without a batch.
fn consume(
    config: crate::events::EventsConfig,
    stop: &AtomicU32,
) -> Result<EventFigures, BenchError> {
    #[cfg(feature = "kv-events")]
    {
        use crate::events::batch::KvEvent;
        // The router runs on its own host in a deployment; here it shares
        // the cores, so keep it out of the request path's way.
        crate::events::publisher::batch_priority();
        let mut sub = crate::events::subscriber::Subscriber::connect(&config.endpoint, "", None)
            .map_err(|e| BenchError::Server(e.to_string()))?;
        let mut f = EventFigures::default();
        let mut idle = Instant::now();
        loop {
            match sub
                .recv(Duration::from_millis(50))
                .map_err(|e| BenchError::Server(e.to_string()))?
            {
                Some(r) => {
                    idle = Instant::now();
                    f.batches += 1;
                    f.events += r.batch.events.len() as u64;
                    f.resyncs += r
                        .batch
                        .events
                        .iter()
                        .filter(|e| matches!(e, KvEvent::AllBlocksCleared))
                        .count() as u64;
                }
                // Relaxed: a lone stop flag.
                None if stop.load(Ordering::Relaxed) != 0
                    && idle.elapsed() > Duration::from_millis(500) =>
                {
                    break
                }
                None => {}
            }
        }
        f.gaps = sub.gaps();
        Ok(f)
    }
    #[cfg(not(feature = "kv-events"))]
    {
        let _ = (config, stop);
        Err(BenchError::Server(
            crate::events::EventsError::NotBuilt.to_string(),
        ))
    }
}

fn wait_for_daemon(name: &str) -> Result<(), BenchError> {
    let start = Instant::now();
    while Client::connect(name).is_err() {
        if start.elapsed() > Duration::from_secs(10) {
            return Err(BenchError::Server("the daemon did not start".into()));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

fn run_workers(
    args: &BenchArgs,
    transport: Transport,
    clients: u32,
    target: &str,
    exe: &Path,
) -> Result<RunReport, BenchError> {
    let mut children: Vec<Child> = Vec::new();
    for worker in 0..clients {
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
            &args.page_size.to_string(),
            "--capacity",
            &args.capacity.to_string(),
        ])
        .args([
            "--worker",
            &worker.to_string(),
            "--workers",
            &clients.to_string(),
        ])
        .args(["--block-size", &args.block_size.to_string()]);
        if let Some(trace) = &args.trace {
            cmd.arg("--trace").arg(trace);
        }
        children.push(cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?);
    }
    let outcome = drive(&mut children);
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    let (reports, seconds) = outcome?;
    Ok(merge(transport, clients, args.busy_poll, &reports, seconds))
}

/// Waits for every worker to be ready, releases them together, and reads
/// their reports.
fn drive(children: &mut [Child]) -> Result<(Vec<WorkerReport>, f64), BenchError> {
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
    let mut reports = Vec::new();
    for reader in &mut readers {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let report: WorkerReport = serde_json::from_str(&line)
            .map_err(|e| BenchError::Worker(format!("bad report {line:?}: {e}")))?;
        reports.push(report);
    }
    Ok((reports, start.elapsed().as_secs_f64()))
}

fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1e3
}

fn merge(
    transport: Transport,
    clients: u32,
    busy_poll: bool,
    reports: &[WorkerReport],
    seconds: f64,
) -> RunReport {
    let mut ops = BTreeMap::new();
    let mut requests = 0;
    for op in OPS {
        let mut all: Vec<u64> = reports
            .iter()
            .flat_map(|r| r.samples.get(op).into_iter().flatten().copied())
            .collect();
        all.sort_unstable();
        requests += all.len() as u64;
        ops.insert(
            op.to_owned(),
            Latency {
                count: all.len() as u64,
                p50_us: percentile(&all, 0.5),
                p90_us: percentile(&all, 0.9),
                p99_us: percentile(&all, 0.99),
                p999_us: percentile(&all, 0.999),
            },
        );
    }
    let elapsed = reports.iter().map(|r| r.elapsed_ns as f64);
    let (fast, slow) = elapsed.fold((f64::INFINITY, 0.0f64), |(lo, hi), e| {
        (lo.min(e), hi.max(e))
    });
    let (hit, total) = reports
        .iter()
        .fold((0, 0), |(h, t), r| (h + r.hit_tokens, t + r.prompt_tokens));
    RunReport {
        transport,
        clients,
        busy_poll,
        requests,
        rejected: reports.iter().map(|r| r.rejected).sum(),
        seconds,
        requests_per_second: requests as f64 / seconds.max(1e-9),
        hit_rate: hit as f64 / total.max(1) as f64,
        fairness: if fast > 0.0 && fast.is_finite() {
            slow / fast
        } else {
            1.0
        },
        ops,
        kv_events_on: false,
        kv_events: None,
    }
}

fn print_table(out: &mut impl Write, r: &RunReport) -> io::Result<()> {
    let mode = if r.transport == Transport::Shm && r.busy_poll {
        " (busy-poll)"
    } else {
        ""
    };
    writeln!(
        out,
        "{}{mode}, {} client(s): {} requests in {:.2} s = {:.0} req/s, hit rate {:.1}%, slowest/fastest client {:.2}",
        r.transport,
        r.clients,
        r.requests,
        r.seconds,
        r.requests_per_second,
        r.hit_rate * 100.0,
        r.fairness
    )?;
    writeln!(
        out,
        "  {:<7} {:>8} {:>10} {:>10} {:>10} {:>10}",
        "op", "count", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs"
    )?;
    for op in OPS {
        if let Some(l) = r.ops.get(op) {
            writeln!(
                out,
                "  {op:<7} {:>8} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
                l.count, l.p50_us, l.p90_us, l.p99_us, l.p999_us
            )?;
        }
    }
    if r.kv_events_on && r.kv_events.is_none() {
        writeln!(out, "  kv events: on, nobody subscribed")?;
    }
    if let Some(e) = &r.kv_events {
        writeln!(
            out,
            "  kv events: {} batches, {} events received; {} gaps, {} resyncs after overflow",
            e.batches, e.events, e.gaps, e.resyncs
        )?;
    }
    Ok(())
}

fn print_event_ratios(out: &mut impl Write, pair: &[RunReport]) -> io::Result<()> {
    let [off, on] = pair else { return Ok(()) };
    let ratio = |op: &str, f: fn(&Latency) -> f64| {
        let (a, b) = (
            off.ops.get(op).map_or(0.0, f),
            on.ops.get(op).map_or(0.0, f),
        );
        if a > 0.0 {
            b / a
        } else {
            0.0
        }
    };
    writeln!(
        out,
        "  events on/off: match p50 {:.2}×, p99 {:.2}×; insert p50 {:.2}×, p99 {:.2}×; throughput {:.2}×\n",
        ratio("match", |l| l.p50_us),
        ratio("match", |l| l.p99_us),
        ratio("insert", |l| l.p50_us),
        ratio("insert", |l| l.p99_us),
        on.requests_per_second / off.requests_per_second.max(1e-9)
    )
}

fn print_ratios(out: &mut impl Write, pair: &[RunReport]) -> io::Result<()> {
    let [shm, uds] = pair else { return Ok(()) };
    let ratio = |f: fn(&Latency) -> f64| {
        let (a, b) = (
            shm.ops.get("match").map_or(0.0, f),
            uds.ops.get("match").map_or(0.0, f),
        );
        if a > 0.0 {
            b / a
        } else {
            0.0
        }
    };
    writeln!(
        out,
        "  uds/shm, match: p50 {:.1}×, p99 {:.1}×; throughput shm/uds {:.1}×\n",
        ratio(|l| l.p50_us),
        ratio(|l| l.p99_us),
        shm.requests_per_second / uds.requests_per_second.max(1e-9)
    )
}

/// Prompts for worker `worker` of `workers`: trace requests dealt
/// round-robin, each block id expanded to `block_size` tokens, cut to
/// `max_tokens`.
fn load_prompts(
    path: &Path,
    block_size: u32,
    max_tokens: u32,
    worker: u32,
    workers: u32,
) -> Result<Vec<Vec<u32>>, BenchError> {
    let file = std::fs::File::open(path)?;
    let requests = parse_trace(BufReader::new(file), &path.display().to_string())
        .map_err(|e| BenchError::Args(e.to_string()))?;
    let prompts: Vec<Vec<u32>> = requests
        .iter()
        .skip(worker as usize)
        .step_by(workers.max(1) as usize)
        .map(|r| {
            let len = (r.input_length as usize).min(max_tokens as usize);
            let tokens = r.hash_ids.iter().flat_map(|&id| {
                (0..block_size).map(move |i| (id as u32).wrapping_mul(block_size).wrapping_add(i))
            });
            tokens.take(len).collect()
        })
        .filter(|p: &Vec<u32>| !p.is_empty())
        .collect();
    if prompts.is_empty() {
        return Err(BenchError::Args(format!(
            "{} holds no prompt for worker {worker}",
            path.display()
        )));
    }
    Ok(prompts)
}

/// A tiny deterministic generator (xorshift), so runs repeat exactly.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % u64::from(n.max(1))) as u32
    }
}

/// Synthetic prompt `step` of `worker`: one of 4 system prompts, one of 16
/// few-shot blocks, and the user's turn (a quarter of them repeat an
/// earlier one, as multi-turn chats do).
fn synthetic_prompt(rng: &mut Rng, worker: u32, step: u32, tokens: u32) -> Vec<u32> {
    let system = rng.below(4);
    let shot = rng.below(16);
    let user = if step > 0 && rng.below(4) == 0 {
        rng.below(step)
    } else {
        step
    };
    let part = tokens / 4;
    let mut p: Vec<u32> = (0..part).map(|i| 1 << 30 | system << 20 | i).collect();
    p.extend((0..part).map(|i| 2 << 30 | shot << 20 | i));
    p.extend(
        (0..tokens - 2 * part)
            .map(|i| 3 << 30 | (worker & 0xff) << 22 | (user & 0x3fff) << 8 | (i & 0xff)),
    );
    p
}

/// The hidden `bench-worker` subcommand: connect, say "ready", wait for
/// "go", run the steps, print one JSON report.
pub fn worker(args: &WorkerArgs) -> Result<(), BenchError> {
    let config = Config {
        page_size: args.page_size,
        capacity: args.capacity,
    };
    let mut backend: Box<dyn Backend> = match args.transport {
        Transport::Shm => {
            Box::new(Client::connect(&args.target).map_err(|e| BenchError::Server(e.to_string()))?)
        }
        Transport::Uds => Box::new(UdsClient::connect(Path::new(&args.target), config)?),
    };
    let prompts = match &args.trace {
        Some(path) => Some(load_prompts(
            path,
            args.block_size,
            args.prompt_tokens,
            args.worker,
            args.workers,
        )?),
        None => None,
    };
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "ready")?;
    stdout.flush()?;
    let mut go = String::new();
    io::stdin().read_line(&mut go)?;

    let mut report = WorkerReport::default();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (u64::from(args.worker) + 1) << 17);
    let start = Instant::now();
    for step in 0..args.requests {
        let prompt = match &prompts {
            Some(p) => p[step as usize % p.len()].clone(),
            None => synthetic_prompt(&mut rng, args.worker, step, args.prompt_tokens),
        };
        scheduler_step(backend.as_mut(), &prompt, args.page_size, step, &mut report);
    }
    report.elapsed_ns = start.elapsed().as_nanos() as u64;
    writeln!(
        stdout,
        "{}",
        serde_json::to_string(&report).map_err(|e| BenchError::Worker(e.to_string()))?
    )?;
    Ok(())
}

/// One step of a scheduler: match+lock, alloc the rest, insert, unlock.
fn scheduler_step(
    backend: &mut dyn Backend,
    prompt: &[u32],
    page_size: u32,
    step: u32,
    report: &mut WorkerReport,
) {
    let mut timed = |op: &str, request: Request| {
        let t = Instant::now();
        let result = backend.call(request);
        report
            .samples
            .entry(op.to_owned())
            .or_default()
            .push(t.elapsed().as_nanos() as u64);
        if result.is_err() {
            report.rejected += 1;
        }
        result.ok()
    };
    let (len, mut pages, handle) = match timed(
        "match",
        Request::Match {
            tokens: copy::to_vec(prompt),
            lock: true,
        },
    ) {
        Some(Reply::Matched {
            len, pages, handle, ..
        }) => (len, pages, handle),
        _ => (0, Vec::new(), None),
    };
    let whole = prompt.len() / page_size as usize;
    if let Some(Reply::Pages(fresh)) = timed(
        "alloc",
        Request::Alloc {
            n: (whole - pages.len()) as u64,
        },
    ) {
        pages.extend(fresh);
        timed(
            "insert",
            Request::Insert {
                tokens: copy::to_vec(prompt),
                pages,
                lock: false,
            },
        );
    }
    if let Some(handle) = handle {
        timed("unlock", Request::Unlock { handle });
    }
    if step % EVICT_EVERY == EVICT_EVERY - 1 {
        timed(
            "evict",
            Request::Evict {
                tokens: u64::from(4 * page_size),
            },
        );
    }
    report.hit_tokens += len;
    report.prompt_tokens += prompt.len() as u64;
}
