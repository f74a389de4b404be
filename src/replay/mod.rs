//! `radixd replay`: replays a request trace against cache policies and
//! reports prefix hit rates.
//!
//! A request's prefix hit is the longest run of its leading blocks resident
//! on arrival (the scan stops at the first miss and changes nothing); it
//! saves `min(k * block_size, input_length)` prompt tokens. The flat
//! policies ([`Lru`], [`Lfu`], [`S3Fifo`]) then access every block of the
//! request in order. The trace is parsed once and replayed for each
//! `(policy, capacity)`; see [`run`].

mod error;
mod hash;
mod lfu;
mod lru;
mod lru_leaf;
mod plot;
mod policy;
mod radix;
mod registry;
mod s3fifo;
mod slab;
mod store;
mod trace;

use std::convert::Infallible;
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::engine::Components;
pub use error::ReplayError;
pub use lfu::Lfu;
pub use lru::Lru;
pub use plot::{draw_plot, PLOT_TITLE};
pub use policy::Policy;
pub use radix::Radix;
pub use registry::{make_policy, MAX_CAPACITY, POLICY_NAMES};
pub use s3fifo::{small_queue_capacity, S3Fifo};
pub use trace::{parse_trace, TraceRequest};

/// Flags of `radixd replay TRACE --policy ... --capacity ...`.
#[derive(clap::Args, Debug, Clone)]
pub struct ReplayArgs {
    /// Trace file: one JSON object per line with timestamp, input_length,
    /// output_length and hash_ids.
    pub trace: PathBuf,
    /// Policies to replay, comma-separated: lru, lfu, s3fifo, radix,
    /// lru-leaf, store.
    #[arg(long, value_delimiter = ',', required = true)]
    pub policy: Vec<String>,
    /// Cache capacities in blocks, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub capacity: Vec<usize>,
    /// Tokens per block.
    #[arg(long, default_value_t = 512)]
    pub block_size: u64,
    /// Write one JSON line per request here (needs exactly one policy and
    /// one capacity).
    #[arg(long, value_name = "FILE")]
    pub per_request: Option<PathBuf>,
    /// Draw hit rate against capacity, one line per policy, as SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Components the radix policy caches (a hybrid model): full,
    /// full,swa or full,mamba; its lines are then named radix+swa or
    /// radix+mamba.
    #[arg(long, default_value = "full")]
    pub components: String,
    /// SWA window in tokens (rounded up to whole blocks).
    #[arg(long, value_name = "TOKENS")]
    pub swa_window: Option<u64>,
    /// SWA pool in blocks (default: the capacity).
    #[arg(long, value_name = "BLOCKS")]
    pub swa_capacity: Option<u32>,
    /// State slots of the MAMBA pool.
    #[arg(long, value_name = "SLOTS")]
    pub mamba_capacity: Option<u32>,
}

/// The radix policy's components for `capacity` blocks.
fn components(args: &ReplayArgs, capacity: usize) -> Result<Components, ReplayError> {
    let window = args
        .swa_window
        .map(|w| u32::try_from(w.div_ceil(args.block_size.max(1))).unwrap_or(u32::MAX));
    let cap = u32::try_from(capacity).unwrap_or(u32::MAX);
    Components::parse(
        &args.components,
        window,
        args.swa_capacity,
        args.mamba_capacity,
        cap,
    )
    .map_err(|e| ReplayError::Components(e.to_string()))
}

/// [`make_policy`], with the radix policy caching `components`.
fn make_policy_with(
    name: &str,
    capacity: usize,
    components: Components,
) -> Result<Box<dyn Policy>, ReplayError> {
    let policy = make_policy(name, capacity)?;
    if name == "radix" && !components.is_full_only() {
        return Ok(Box::new(Radix::with_components(capacity, components)?));
    }
    Ok(policy)
}

/// Result of one `(policy, capacity)` replay: one output line, fields in
/// this order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Policy name.
    pub policy: String,
    /// Cache capacity in blocks.
    pub capacity_blocks: usize,
    /// Tokens per block.
    pub block_size: u64,
    /// Requests replayed.
    pub requests: u64,
    /// Σ input_length.
    pub total_prompt_tokens: u64,
    /// Σ min(k * block_size, input_length).
    pub total_hit_tokens: u64,
    /// total_hit_tokens / total_prompt_tokens, 0 when there are no tokens.
    pub overall_hit_rate: f64,
    /// Σ len(hash_ids).
    pub total_blocks: u64,
    /// Σ k.
    pub hit_blocks: u64,
    /// Resident blocks after the last request (≤ capacity_blocks).
    pub final_cache_blocks: usize,
}

/// One `--per-request` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestOutcome {
    /// 0-based position of the request among the trace's non-blank lines.
    pub index: u64,
    /// input_length.
    pub prompt_tokens: u64,
    /// min(hit_blocks * block_size, prompt_tokens).
    pub hit_tokens: u64,
    /// Prefix hit k: leading blocks resident on arrival.
    pub hit_blocks: u64,
}

/// Replays `requests` through `policy` (fresh, of `capacity` blocks), calling
/// `each` after every request.
pub fn replay_with<E>(
    requests: &[TraceRequest],
    policy: &mut dyn Policy,
    capacity: usize,
    block_size: u64,
    mut each: impl FnMut(&RequestOutcome) -> Result<(), E>,
) -> Result<Summary, E> {
    let mut summary = Summary {
        policy: policy.name().to_owned(),
        capacity_blocks: capacity,
        block_size,
        requests: 0,
        total_prompt_tokens: 0,
        total_hit_tokens: 0,
        overall_hit_rate: 0.0,
        total_blocks: 0,
        hit_blocks: 0,
        final_cache_blocks: 0,
    };
    for (index, request) in requests.iter().enumerate() {
        let k = policy.request(&request.hash_ids) as u64;
        let hit_tokens = k.saturating_mul(block_size).min(request.input_length);
        summary.requests += 1;
        summary.total_prompt_tokens += request.input_length;
        summary.total_hit_tokens += hit_tokens;
        summary.total_blocks += request.hash_ids.len() as u64;
        summary.hit_blocks += k;
        each(&RequestOutcome {
            index: index as u64,
            prompt_tokens: request.input_length,
            hit_tokens,
            hit_blocks: k,
        })?;
    }
    if summary.total_prompt_tokens > 0 {
        summary.overall_hit_rate =
            summary.total_hit_tokens as f64 / summary.total_prompt_tokens as f64;
    }
    summary.final_cache_blocks = policy.resident_blocks();
    Ok(summary)
}

/// [`replay_with`] without a per-request callback.
pub fn replay(
    requests: &[TraceRequest],
    policy: &mut dyn Policy,
    capacity: usize,
    block_size: u64,
) -> Summary {
    match replay_with(requests, policy, capacity, block_size, |_| {
        Ok::<(), Infallible>(())
    }) {
        Ok(summary) => summary,
        Err(never) => match never {},
    }
}

/// Runs `radixd replay` with the built-in policies: one JSON [`Summary`] line
/// per `(policy, capacity)`, policy-major, written to `out`.
///
/// Every flag is checked, and every `(policy, capacity)` built once, before
/// the trace is read.
pub fn run(args: &ReplayArgs, out: &mut impl Write) -> Result<(), ReplayError> {
    if args.policy.is_empty() {
        return Err(ReplayError::EmptyList { flag: "--policy" });
    }
    if args.capacity.is_empty() {
        return Err(ReplayError::EmptyList { flag: "--capacity" });
    }
    if args.block_size == 0 {
        return Err(ReplayError::ZeroBlockSize);
    }
    if args.per_request.is_some() && (args.policy.len() != 1 || args.capacity.len() != 1) {
        return Err(ReplayError::PerRequestNeedsSingleRun {
            policies: args.policy.len(),
            capacities: args.capacity.len(),
        });
    }
    for name in &args.policy {
        for &capacity in &args.capacity {
            make_policy_with(name.trim(), capacity, components(args, capacity)?)?;
        }
    }

    let trace_name = args.trace.display().to_string();
    let file = File::open(&args.trace)
        .map_err(|e| ReplayError::io(format!("opening trace {trace_name}"), e))?;
    let requests = parse_trace(BufReader::new(file), &trace_name)?;

    let mut per_request = match &args.per_request {
        Some(path) => {
            let file = File::create(path).map_err(|e| {
                ReplayError::io(format!("creating per-request file {}", path.display()), e)
            })?;
            Some((path, BufWriter::new(file)))
        }
        None => None,
    };

    let mut summaries = Vec::with_capacity(args.policy.len() * args.capacity.len());
    for name in &args.policy {
        for &capacity in &args.capacity {
            let comps = components(args, capacity)?;
            let mut policy = make_policy_with(name.trim(), capacity, comps)?;
            let summary = match per_request.as_mut() {
                Some((path, writer)) => {
                    replay_with(&requests, policy.as_mut(), capacity, args.block_size, |o| {
                        write_json_line(writer, o)
                            .map_err(|e| ReplayError::io(format!("writing {}", path.display()), e))
                    })?
                }
                None => replay(&requests, policy.as_mut(), capacity, args.block_size),
            };
            write_json_line(out, &summary).map_err(|e| ReplayError::io("writing results", e))?;
            summaries.push(summary);
        }
    }
    if let Some((path, mut writer)) = per_request {
        writer
            .flush()
            .map_err(|e| ReplayError::io(format!("writing {}", path.display()), e))?;
    }
    out.flush()
        .map_err(|e| ReplayError::io("writing results", e))?;

    if let Some(path) = &args.plot {
        let short_name = args
            .trace
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        draw_plot(path, &summaries, &short_name)?;
    }
    Ok(())
}

/// Serializes `value` as one JSON line.
fn write_json_line<W: Write + ?Sized>(out: &mut W, value: &impl Serialize) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    out.write_all(b"\n")
}
