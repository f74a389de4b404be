//! The `radixd` command line.

use std::io;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use radixd::bench::{self, BenchArgs, WorkerArgs};
use radixd::daemon::{self, ServeConfig, Started};
use radixd::engine::{Components, Config, Engine, Policy, Recency};
use radixd::exec;
use radixd::op::Local;
use radixd::replay::{self, ReplayArgs};
use radixd::{signal, stat, Client};
use radixd_ipc::segment::human_bytes;

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
    /// The cluster router's KV index: follow workers' KV events, answer
    /// per-worker overlap scores (`serve`, `query`, `stat`).
    #[cfg(all(feature = "kv-events", feature = "index"))]
    Index(radixd::index::cli::IndexArgs),
    /// One client process of `radixd bench` (internal).
    #[command(hide = true)]
    BenchWorker(WorkerArgs),
    /// One reader process of `radixd bench --store` (internal).
    #[command(hide = true)]
    BenchStoreReader(bench::store::StoreReaderArgs),
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
    #[arg(long, value_parser = positive_seconds)]
    session_ttl: Option<Duration>,
    /// Let clients `reset` the whole shared cache (off: they get
    /// `not_permitted`).
    #[arg(long)]
    allow_reset: bool,
    /// Milliseconds a lock-free reader (`peek`) may hold back the reuse of
    /// freed records before its announcement is expired (it then reads
    /// again).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    reader_expiry_ms: u64,
    /// Keep a node-wide KV store of this size in shared memory
    /// (/dev/shm/NAME.store, e.g. 64GiB), adopted from a previous daemon
    /// of this name if one left it.
    #[arg(long, value_name = "SIZE", value_parser = radixd::store::parse_size)]
    store: Option<u64>,
    /// Discard the store a previous daemon left and start empty.
    #[arg(long, requires = "store")]
    store_reset: bool,
    #[command(flatten)]
    events: radixd::events::cli::ServeEventsArgs,
    #[command(flatten)]
    components: ComponentArgs,
}

/// `--components` and its companions (`serve` and `exec`).
#[derive(clap::Args)]
struct ComponentArgs {
    /// What the cache keeps per node: full, full,swa (sliding-window
    /// attention pages beside full attention) or full,mamba (recurrent
    /// state slots beside full attention) [default: full].
    #[arg(long, value_name = "COMPONENTS")]
    components: Option<String>,
    /// SWA: the sliding window, in tokens (needed by full,swa).
    #[arg(long, value_name = "TOKENS")]
    swa_window: Option<u32>,
    /// SWA: pages in the SWA pool [default: the FULL capacity].
    #[arg(long, value_name = "PAGES")]
    swa_capacity: Option<u32>,
    /// MAMBA: state slots in the pool (needed by full,mamba).
    #[arg(long, value_name = "SLOTS")]
    mamba_capacity: Option<u32>,
    /// What a split counts as a use of: exact (the part below a match
    /// keeps its last use: exact per-block LRU) or sglang (SGLang's
    /// touch-before-split, to compare evictions with SGLang) [default:
    /// exact].
    #[arg(long, value_name = "exact|sglang")]
    recency: Option<Recency>,
    /// Which unlocked leaf eviction takes first, as SGLang's
    /// --radix-eviction-policy: lru, lfu, fifo, mru, filo, priority, tlru
    /// or slru [default: lru].
    #[arg(long, value_name = "POLICY")]
    eviction_policy: Option<String>,
    /// The policy's parameters as SGLang's --radix-eviction-policy-config
    /// takes them, a JSON object: tlru takes threshold and
    /// next_prompt_estimate (tokens), slru protected_threshold.
    #[arg(long, value_name = "JSON", requires = "eviction_policy")]
    eviction_policy_config: Option<String>,
}

impl ComponentArgs {
    /// The eviction policy the flags name (`None`: neither given), checked
    /// as SGLang's server checks `--radix-eviction-policy-config`.
    fn policy(&self) -> Result<Option<Policy>, String> {
        let Some(name) = &self.eviction_policy else {
            return Ok(None);
        };
        let mut params: Vec<(String, i64)> = Vec::new();
        if let Some(json) = &self.eviction_policy_config {
            let bad = |why: String| format!("--eviction-policy-config {json}: {why}");
            let value: serde_json::Value =
                serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
            let serde_json::Value::Object(map) = value else {
                return Err(bad("not a JSON object".to_owned()));
            };
            for (key, v) in map {
                let n = v
                    .as_i64()
                    .ok_or_else(|| bad(format!("{key} is not an integer")))?;
                params.push((key, n));
            }
        }
        let params: Vec<(&str, i64)> = params.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let policy = Policy::with_parameters(name, &params).map_err(|e| e.to_string())?;
        policy.check().map_err(|e| e.to_string())?;
        Ok(Some(policy))
    }

    /// Whether any of the flags was given.
    fn given(&self) -> bool {
        self.components.is_some()
            || self.swa_window.is_some()
            || self.swa_capacity.is_some()
            || self.mamba_capacity.is_some()
    }

    /// The components for an engine of `capacity` FULL pages.
    fn parse(&self, capacity: u32) -> Result<Components, String> {
        Components::parse(
            self.components.as_deref().unwrap_or("full"),
            self.swa_window,
            self.swa_capacity,
            self.mamba_capacity,
            capacity,
        )
        .map_err(|e| e.to_string())
    }
}

#[derive(clap::Args)]
struct StatArgs {
    /// Segment name of the daemon (or --name NAME).
    #[arg(value_name = "NAME", conflicts_with = "name_flag")]
    name: Option<String>,
    /// Segment name of the daemon [default: radixd].
    #[arg(long = "name", value_name = "NAME")]
    name_flag: Option<String>,
    /// Seconds between the two readings that give requests per second
    /// (more than 0, at most 3600).
    #[arg(long, default_value = "1", value_parser = interval)]
    interval: Duration,
}

/// The segment name `serve`, `exec --connect` and `stat` use by default.
const DEFAULT_NAME: &str = "radixd";

/// Seconds as a duration: finite and more than zero.
fn positive_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("{s} must be a finite number of seconds above 0"));
    }
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s}: {e}"))
}

/// `stat --interval`: above 0 and at most an hour.
fn interval(s: &str) -> Result<Duration, String> {
    let d = positive_seconds(s)?;
    if d > Duration::from_secs(3600) {
        return Err(format!("{s} s is longer than an hour"));
    }
    Ok(d)
}

fn octal(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal mode like 0600"))
}

#[derive(clap::Args)]
struct ExecArgs {
    /// Send the requests to the daemon serving this segment (also spelt
    /// --name) instead of an in-process engine.
    #[arg(long, visible_alias = "name", value_name = "NAME")]
    connect: Option<String>,
    /// Tokens per KV page [default: 16; with --connect, the daemon's].
    #[arg(long)]
    page_size: Option<u32>,
    /// Pages in the KV pool [default: 65536; with --connect, the daemon's].
    #[arg(long)]
    capacity: Option<u32>,
    /// Release sessions idle for this many seconds (off by default;
    /// in-process only: a daemon has its own `serve --session-ttl`).
    #[arg(long, value_parser = positive_seconds, conflicts_with = "connect")]
    session_ttl: Option<Duration>,
    /// With --connect: send every match and insert with its whole key,
    /// instead of reading the shared tree first and sending only where the
    /// match ended (same answers; for comparison).
    #[arg(long, requires = "connect")]
    full_requests: bool,
    /// An in-process KV store of this size for the store ops (with
    /// --connect, the daemon's `serve --store`).
    #[arg(long, value_name = "SIZE", value_parser = radixd::store::parse_size, conflicts_with = "connect")]
    store: Option<u64>,
    /// In-process only (with --connect, the daemon's own `serve
    /// --components` rule).
    #[command(flatten)]
    components: ComponentArgs,
}

fn exec(args: ExecArgs) -> Result<(), String> {
    if let Some(name) = args.connect {
        let mut client = Client::connect(&name).map_err(|e| format!("{name}: {e}"))?;
        client.set_anchoring(!args.full_requests);
        // The daemon's configuration rules; a flag that contradicts it is
        // an error rather than silently ignored.
        let daemon = [
            ("--page-size", args.page_size, client.page_size()),
            ("--capacity", args.capacity, client.capacity()),
        ];
        for (flag, asked, has) in daemon {
            if let Some(asked) = asked.filter(|a| *a != has) {
                return Err(format!(
                    "{flag} {asked} disagrees with the daemon {name} ({flag} {has}); leave it out"
                ));
            }
        }
        if args.components.recency.is_some() {
            return Err(format!(
                "--recency is the daemon's (radixd serve --name {name} --recency ...); leave it out"
            ));
        }
        if args.components.eviction_policy.is_some() {
            return Err(format!(
                "--eviction-policy is the daemon's (radixd serve --name {name} --eviction-policy ...); \
                 leave it out"
            ));
        }
        if args.components.given() {
            let asked = args.components.parse(client.capacity())?;
            if asked != client.components() {
                return Err(format!(
                    "--components {} disagrees with the daemon {name} (--components {}); leave it out",
                    asked.names(),
                    client.components().names()
                ));
            }
        }
        return exec::run(&mut client, io::stdin().lock(), io::stdout().lock())
            .map_err(|e| e.to_string());
    }
    let config = Config {
        page_size: args.page_size.unwrap_or(16),
        capacity: args.capacity.unwrap_or(65_536),
    };
    let components = args.components.parse(config.capacity)?;
    let mut engine = Engine::with_components(config, components).map_err(|e| e.to_string())?;
    engine.set_recency(args.components.recency.unwrap_or_default());
    if let Some(policy) = args.components.policy()? {
        engine.set_policy(policy);
    }
    let local = Local {
        engine,
        client: 0,
        session_ttl: args.session_ttl,
    };
    if let Some(bytes) = args.store {
        let config = radixd::store::StoreConfig::for_size(bytes, 1).map_err(|e| e.to_string())?;
        let store = radixd::store::HeapStore::new(config).map_err(|e| e.to_string())?;
        let mut local = radixd::op::WithStore {
            inner: local,
            store,
        };
        return exec::run(&mut local, io::stdin().lock(), io::stdout().lock())
            .map_err(|e| e.to_string());
    }
    let mut local = local;
    exec::run(&mut local, io::stdin().lock(), io::stdout().lock()).map_err(|e| e.to_string())
}

fn serve(args: ServeArgs) -> Result<(), String> {
    let components = args.components.parse(args.capacity)?;
    let policy = args.components.policy()?.unwrap_or_default();
    let config = ServeConfig {
        name: args.name,
        page_size: args.page_size,
        capacity: args.capacity,
        max_clients: args.max_clients,
        scratch_bytes: args.scratch_bytes,
        mode: args.mode,
        busy_poll: args.busy_poll,
        session_ttl: args.session_ttl,
        allow_reset: args.allow_reset,
        reader_expiry: Duration::from_millis(args.reader_expiry_ms),
        events: args.events.config(),
        components,
        recency: args.components.recency.unwrap_or_default(),
        policy,
        store: args.store,
        store_reset: args.store_reset,
    };
    signal::install().map_err(|e| format!("cannot install signal handlers: {e}"))?;
    // Announced only once the segment exists and is ready: a configuration
    // error is never preceded by a "serving" line.
    let announce = |started: &Started| {
        eprintln!(
            "radixd: serving {} ({}; page size {}, {} pages, {} clients{}{}{}{}{})",
            started.path.display(),
            human_bytes(started.bytes),
            config.page_size,
            config.capacity,
            config.max_clients,
            component_note(&config.components),
            if config.recency == Recency::Sglang {
                ", sglang recency"
            } else {
                ""
            },
            if config.policy.is_lru() {
                String::new()
            } else {
                format!(", eviction policy {}", config.policy)
            },
            if config.busy_poll { ", busy-poll" } else { "" },
            if config.allow_reset {
                ", reset allowed"
            } else {
                ""
            },
        )
    };
    daemon::serve_reporting(&config, &signal::STOP, announce).map_err(|e| e.to_string())
}

/// The components part of the serving line (nothing for FULL alone).
fn component_note(c: &Components) -> String {
    let mut note = String::new();
    if let Some(s) = c.swa {
        note += &format!(", swa window {} tokens, {} swa pages", s.window, s.capacity);
    }
    if let Some(m) = c.mamba {
        note += &format!(", {} mamba states", m.capacity);
    }
    note
}

#[cfg(all(feature = "kv-events", feature = "index"))]
fn index(args: &radixd::index::cli::IndexArgs) -> Result<(), String> {
    use radixd::index::cli::{self, IndexCommand};
    match &args.command {
        IndexCommand::Serve(a) => {
            signal::install().map_err(|e| format!("cannot install signal handlers: {e}"))?;
            cli::serve(a, &signal::STOP)
        }
        IndexCommand::Query(a) => {
            // The answer (or the failure, as JSON) is on stdout already.
            cli::query(a, &mut io::stdout().lock()).map_err(|_| String::new())
        }
        IndexCommand::Stat(a) => cli::stat(a, &mut io::stdout().lock()),
    }
}

/// Lets a write to a closed pipe end the process quietly, as it does for
/// other Unix tools (`radixd stat | head -2`), instead of a panic or an
/// error message. Not for `serve`, whose stderr is not what it serves.
fn quiet_on_closed_pipe() {
    // SAFETY: restoring a signal's default disposition at start-up, before
    // any thread exists; no handler code is involved.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        quiet_on_closed_pipe();
    }
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Exec(args) => exec(args),
        Command::Stat(args) => {
            let name = args.name.or(args.name_flag);
            stat::run(name.as_deref().unwrap_or(DEFAULT_NAME), args.interval)
                .map_err(|e| e.to_string())
        }
        Command::Bench(args) => {
            let mut out = io::stdout().lock();
            bench::run(&args, &mut out).map_err(|e| e.to_string())
        }
        Command::BenchWorker(args) => bench::worker(&args).map_err(|e| e.to_string()),
        Command::BenchStoreReader(args) => bench::store::reader(&args).map_err(|e| e.to_string()),
        Command::Events(args) => signal::install()
            .map_err(|e| format!("cannot install signal handlers: {e}"))
            .and_then(|()| {
                radixd::events::cli::subscribe(&args, &mut io::stdout().lock())
                    .map_err(|e| e.to_string())
            }),
        #[cfg(all(feature = "kv-events", feature = "index"))]
        Command::Index(args) => index(&args),
        Command::Replay(args) => {
            let mut out = io::BufWriter::new(io::stdout().lock());
            replay::run(&args, &mut out).map_err(|e| e.to_string())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("radixd: {e}");
            }
            ExitCode::from(2)
        }
    }
}
