//! The `radixd` command line.

use std::io;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use radixd::engine::{Config, Engine};
use radixd::exec::{self, Local};
use radixd::replay::{self, ReplayArgs};

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
    /// Answer JSON-lines requests from stdin on stdout.
    Exec(ExecArgs),
    /// Replay a Mooncake trace under cache policies and print hit rates.
    Replay(ReplayArgs),
}

#[derive(clap::Args)]
struct ExecArgs {
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Exec(args) => exec(args),
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
