//! `radixd bench` flags: what to measure, and what a worker process is told.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::BenchError;
use crate::Client;

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
    /// Tokens per KV page [default: 16; with --connect, the daemon's].
    #[arg(long)]
    pub page_size: Option<u32>,
    /// Pages in the pool [default: 65536; with --connect, the daemon's].
    #[arg(long)]
    pub capacity: Option<u32>,
    /// Transport to measure.
    #[arg(long, value_enum, default_value_t = Transport::Shm)]
    pub transport: Transport,
    /// Run shm and uds back to back and print the ratios (implies
    /// `--baseline`).
    #[arg(long)]
    pub compare: bool,
    /// Measure, in the same run, a two-process one-cache-line ping-pong and
    /// a 4 KiB cross-core copy, and print every round trip as a ratio to
    /// them.
    #[arg(long)]
    pub baseline: bool,
    /// Run the daemon with --busy-poll.
    #[arg(long)]
    pub busy_poll: bool,
    /// Send `match` and `insert` with the whole key, not by anchor (shm;
    /// see `Client::set_anchoring`).
    #[arg(long)]
    pub full_requests: bool,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Measure the running daemon of this segment name instead of starting
    /// one (shm only).
    #[arg(long, visible_alias = "name")]
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
    /// Reader processes that `peek` cached prompts of `--prompt-tokens`
    /// lock-free while the writer clients run (shm runs only); their
    /// success rate and latency are reported next to the writers'.
    #[arg(long, default_value_t = 0)]
    pub readers: u32,
    /// Run the workload as the N tensor-parallel ranks of one server (N
    /// clients in one group, every rank the same steps, each step carried
    /// out once), after one client alone in the same run, and print each
    /// operation's p50 per rank over the lone client's (shm only; whole
    /// keys both, as ranks send).
    #[arg(long, conflicts_with_all = ["compare", "kv_events_compare"])]
    pub tp: Option<u32>,
    /// Prompts (one page each) that one more client keeps locked for the
    /// whole run, cached before the workload's prompts: long-running
    /// requests, which eviction must not pay for.
    #[arg(long, default_value_t = 0)]
    pub locked: u32,
    /// With KV events on, subscribe nobody (a router runs on its own host):
    /// measures the daemon and publisher side alone.
    #[arg(long)]
    pub kv_events_no_subscriber: bool,
    /// With KV events on (implies `--kv-events` without
    /// `--kv-events-compare`), also measure change to event: from a
    /// client's answer to an insert that cached pages until the bench's
    /// subscriber (ZeroMQ SUB, msgpack, as a router) receives the
    /// `BlockStored` naming them; p50, p99 and max, split at the batch's
    /// `ts` stamp into the daemon's side and the wire's (docs/kv-events.md).
    #[arg(long, conflicts_with = "kv_events_no_subscriber")]
    pub kv_events_latency: bool,
    /// Components of the daemon this bench starts (a hybrid model):
    /// full, full,swa or full,mamba. With MAMBA each step also takes a
    /// state slot and checkpoints it with the insert (shm only).
    #[arg(long, default_value = "full")]
    pub components: String,
    /// SWA window in tokens (with `--components full,swa`).
    #[arg(long, value_name = "TOKENS")]
    pub swa_window: Option<u32>,
    /// SWA pool in pages (default: the capacity).
    #[arg(long, value_name = "PAGES")]
    pub swa_capacity: Option<u32>,
    /// State slots (with `--components full,mamba`).
    #[arg(long, value_name = "SLOTS")]
    pub mamba_capacity: Option<u32>,
    /// Measure the node-wide KV store instead: batch get/set of 128 pages
    /// of 64 KiB, 256 KiB and 2 MiB against a plain copy, then 1, 2, 4, 8
    /// reader processes at once (docs/store.md).
    #[arg(long)]
    pub store: bool,
    /// Timed batches per figure of `--store`.
    #[arg(long, default_value_t = 20)]
    pub store_rounds: u32,
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
    /// Peek a cached prompt of its own until told to stop, instead of
    /// running scheduler steps.
    #[arg(long)]
    pub reader: bool,
    /// Send `match` and `insert` with the whole key (shm).
    #[arg(long)]
    pub full_requests: bool,
    /// Join this group (shm) as rank `--rank` of `--group-size` before
    /// the steps.
    #[arg(long)]
    pub group: Option<String>,
    #[arg(long, default_value_t = 0)]
    pub rank: u32,
    #[arg(long, default_value_t = 1)]
    pub group_size: u32,
    /// Note when each insert that cached pages was answered
    /// (`--kv-events-latency`).
    #[arg(long)]
    pub stamp_inserts: bool,
}

impl BenchArgs {
    /// Tokens per page of the measured cache.
    pub fn page_size(&self) -> u32 {
        self.page_size.unwrap_or(16)
    }

    /// The components of the daemon this bench starts.
    pub fn components(&self) -> Result<crate::engine::Components, String> {
        crate::engine::Components::parse(
            &self.components,
            self.swa_window,
            self.swa_capacity,
            self.mamba_capacity,
            self.capacity(),
        )
        .map_err(|e| e.to_string())
    }

    /// Pages of the measured cache.
    pub fn capacity(&self) -> u32 {
        self.capacity.unwrap_or(65_536)
    }

    /// With `--connect`, the daemon's page size and capacity: a flag that
    /// disagrees with the daemon is an error, not a silently wrong workload.
    pub(super) fn resolve(&self) -> Result<Self, BenchError> {
        let Some(name) = &self.connect else {
            return Ok(self.clone());
        };
        let client = Client::connect(name)
            .map_err(|e| BenchError::Server(format!("cannot connect to {name}: {e}")))?;
        let daemon = [("--page-size", self.page_size, client.page_size())]
            .into_iter()
            .chain([("--capacity", self.capacity, client.capacity())]);
        for (flag, asked, has) in daemon {
            if asked.is_some_and(|a| a != has) {
                return Err(BenchError::Args(format!(
                    "{flag} {} disagrees with the daemon {name} ({flag} {has}); leave it out",
                    asked.unwrap_or_default()
                )));
            }
        }
        Ok(Self {
            page_size: Some(client.page_size()),
            capacity: Some(client.capacity()),
            ..self.clone()
        })
    }
}
