//! The `radixd` command line.

use std::io;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use radixd::bench::{self, BenchArgs, WorkerArgs};
use radixd::daemon::{self, ServeConfig};
use radixd::engine::{Config, Engine};
use radixd::exec;
use radixd::op::Local;
use radixd::replay::{self, ReplayArgs};
use radixd::{signal, stat, Client};

#[derive(Parser)]
#[command(
    name = "radixd",
    version,
    about = "A shared-memory prefix (KV) cache server for LLM serving"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: the cache in a shared-memory segment.
    Serve(ServeArgs),
    /// Answer JSON-lines requests from stdin on stdout.
    Exec(ExecArgs),
    /// Print live figures of a running daemon.
    Stat(StatArgs),
    /// Replay a Mooncake trace under cache policies and print hit rates.
    Replay(ReplayArgs),
    /// Latency under contention: shared memory against a Unix socket.
    Bench(BenchArgs),
    /// Subscribe to a daemon's KV events and print them as JSON lines.
    Events(radixd::events::cli::SubscribeArgs),
    /// One client process of `radixd bench` (internal).
    #[command(hide = true)]
    BenchWorker(WorkerArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Segment name (a file under /dev/shm).
    #[arg(long, default_value = DEFAULT_NAME)]
    name: String,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 16)]
    page_size: u32,
    /// Pages in the KV pool.
    #[arg(long, default_value_t = 65536)]
    capacity: u32,
    /// Client slots.
    #[arg(long, default_value_t = 16)]
    max_clients: u32,
    /// Scratch bytes per client (half for requests, half for answers).
    #[arg(long, default_value_t = 16 << 20)]
    scratch_bytes: u64,
    /// Never sleep: trade a core for the lowest latency.
    #[arg(long)]
    busy_poll: bool,
    /// Permission bits of the segment, in octal (0660 admits the group).
    #[arg(long, default_value = "0600", value_parser = octal)]
    mode: u32,
    /// Release sessions idle for this many seconds (off by default).
    #[arg(long)]
    session_ttl: Option<f64>,
    #[command(flatten)]
    events: radixd::events::cli::ServeEventsArgs,
}

#[derive(clap::Args)]
struct StatArgs {
    /// Segment name of the daemon.
    #[arg(default_value = DEFAULT_NAME)]
    name: String,
    /// Seconds between the two readings that give requests per second.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
}

/// The segment name `serve`, `exec --connect` and `stat` use by default.
const DEFAULT_NAME: &str = "radixd";

fn octal(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal mode like 0600"))
}

#[derive(clap::Args)]
struct ExecArgs {
    /// Send the requests to the daemon serving this segment instead of an
    /// in-process engine.
    #[arg(long)]
    connect: Option<String>,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 16)]
    page_size: u32,
    /// Pages in the KV pool.
    #[arg(long, default_value_t = 65536)]
    capacity: u32,
    /// Release sessions idle for this many seconds (off by default).
    #[arg(long)]
    session_ttl: Option<f64>,
}

fn seconds(s: Option<f64>) -> Result<Option<Duration>, String> {
    s.map(|s| Duration::try_from_secs_f64(s).map_err(|e| format!("--session-ttl {s}: {e}")))
        .transpose()
}

fn exec(args: ExecArgs) -> Result<(), String> {
    if let Some(name) = args.connect {
        let mut client = Client::connect(&name).map_err(|e| e.to_string())?;
        return exec::run(&mut client, io::stdin().lock(), io::stdout().lock())
            .map_err(|e| e.to_string());
    }
    let config = Config {
        page_size: args.page_size,
        capacity: args.capacity,
    };
    let engine = Engine::new(config).map_err(|e| e.to_string())?;
    let mut local = Local {
        engine,
        client: 0,
        session_ttl: seconds(args.session_ttl)?,
    };
    exec::run(&mut local, io::stdin().lock(), io::stdout().lock()).map_err(|e| e.to_string())
}

fn serve(args: ServeArgs) -> Result<(), String> {
    let config = ServeConfig {
        name: args.name,
        page_size: args.page_size,
        capacity: args.capacity,
        max_clients: args.max_clients,
        scratch_bytes: args.scratch_bytes,
        mode: args.mode,
        busy_poll: args.busy_poll,
        session_ttl: seconds(args.session_ttl)?,
        events: args.events.config(),
    };
    signal::install().map_err(|e| format!("cannot install signal handlers: {e}"))?;
    eprintln!(
        "radixd: serving /dev/shm/{} (page size {}, {} pages, {} clients{})",
        config.name,
        config.page_size,
        config.capacity,
        config.max_clients,
        if config.busy_poll { ", busy-poll" } else { "" }
    );
    daemon::serve(&config, &signal::STOP).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Exec(args) => exec(args),
        Command::Stat(args) => stat::run(
            &args.name,
            seconds(Some(args.interval))
                .ok()
                .flatten()
                .unwrap_or_default(),
        )
        .map_err(|e| e.to_string()),
        Command::Bench(args) => {
            let mut out = io::stdout().lock();
            bench::run(&args, &mut out).map_err(|e| e.to_string())
        }
        Command::BenchWorker(args) => bench::worker(&args).map_err(|e| e.to_string()),
        Command::Events(args) => signal::install()
            .map_err(|e| format!("cannot install signal handlers: {e}"))
            .and_then(|()| {
                radixd::events::cli::subscribe(&args, &mut io::stdout().lock())
                    .map_err(|e| e.to_string())
            }),
        Command::Replay(args) => {
            let mut out = io::BufWriter::new(io::stdout().lock());
            replay::run(&args, &mut out).map_err(|e| e.to_string())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("radixd: {e}");
            ExitCode::from(2)
        }
    }
}
