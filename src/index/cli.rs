//! `radixd index`: `serve` (the router's KV index over ZeroMQ), `query`
//! (one JSON line per question, for a person or a script) and `stat`
//! (live figures of a running index).

use std::io::Write;
use std::time::Duration;

use radixd_ipc::segment::human_bytes;
use radixd_ipc::sync::AtomicU32;

use super::protocol::{get, Keys, Request};
use super::server::{self, IndexClient, ServerConfig, Subscription};
use super::IndexConfig;
use crate::events::hash::{Scheme, SchemeName};
use crate::events::msgpack::Value;

/// `radixd index …`.
#[derive(clap::Args, Clone, Debug)]
pub struct IndexArgs {
    #[command(subcommand)]
    pub command: IndexCommand,
}

/// The `radixd index` subcommands.
#[derive(clap::Subcommand, Clone, Debug)]
pub enum IndexCommand {
    /// Follow workers' KV events and answer overlap queries.
    Serve(ServeArgs),
    /// Ask a running index for the overlap scores of one request.
    Query(QueryArgs),
    /// Print live figures of a running index.
    Stat(StatArgs),
}

/// `radixd index serve`.
#[derive(clap::Args, Clone, Debug)]
pub struct ServeArgs {
    /// ZeroMQ endpoint (bound) answering queries, e.g. `tcp://127.0.0.1:5600`.
    #[arg(long, value_name = "ENDPOINT")]
    pub listen: String,
    /// A worker to follow: `WORKER=PUB_ENDPOINT[@REPLAY_ENDPOINT]` (repeat
    /// for each worker; WORKER names it in answers).
    #[arg(long, value_name = "WORKER=PUB[@REPLAY]", required = true, value_parser = Subscription::parse)]
    pub subscribe: Vec<Subscription>,
    /// Tokens per block (a radixd daemon's page size).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub block_size: u32,
    /// Block hashes: `xxh3` (Dynamo, radixd's default) or `sha256-cbor`
    /// (vLLM, llm-d).
    #[arg(long, default_value = "xxh3", value_parser = ["xxh3", "sha256-cbor"])]
    pub hash: String,
    /// vLLM's PYTHONHASHSEED, the root of `sha256-cbor` hashes (default:
    /// $PYTHONHASHSEED, else "0").
    #[arg(long, value_name = "SEED")]
    pub hash_seed: Option<String>,
    /// Topic prefix to subscribe to.
    #[arg(long, default_value = "", value_name = "T")]
    pub topic: String,
    /// Milliseconds a replay may take before it counts as failed.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub replay_timeout_ms: u64,
}

/// `radixd index query`.
#[derive(clap::Args, Clone, Debug)]
pub struct QueryArgs {
    /// The index's query endpoint.
    #[arg(long, value_name = "ENDPOINT")]
    pub connect: String,
    /// The request's token ids, a JSON array.
    #[arg(
        long,
        value_name = "JSON",
        conflicts_with = "hashes",
        required_unless_present = "hashes"
    )]
    pub tokens: Option<String>,
    /// The request's chained block hashes instead, a JSON array.
    #[arg(long, value_name = "JSON")]
    pub hashes: Option<String>,
    /// Stop as soon as a single worker is left (Dynamo's early exit).
    #[arg(long)]
    pub early_exit: bool,
    /// Milliseconds to wait for the answer.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
}

/// `radixd index stat`.
#[derive(clap::Args, Clone, Debug)]
pub struct StatArgs {
    /// The index's query endpoint.
    #[arg(long, value_name = "ENDPOINT")]
    pub connect: String,
    /// Seconds between the two readings that give events per second.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Milliseconds to wait for each answer.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
}

/// A msgpack value as JSON (map keys as strings).
pub fn to_json(v: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        Value::Nil => J::Null,
        Value::Bool(b) => J::Bool(*b),
        Value::Int(i) => J::from(*i),
        Value::UInt(u) => J::from(*u),
        Value::Float(x) => serde_json::Number::from_f64(*x).map_or(J::Null, J::Number),
        Value::Str(s) => J::String(s.clone()),
        Value::Bin(b) => J::Array(b.iter().map(|&x| J::from(x)).collect()),
        Value::Array(items) => J::Array(items.iter().map(to_json).collect()),
        Value::Map(pairs) => J::Object(
            pairs
                .iter()
                .map(|(k, v)| {
                    let key = match k {
                        Value::Str(s) => s.clone(),
                        other => to_json(other).to_string(),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
    }
}

/// A failure as `radixd index query` prints it.
fn error_line(kind: &str, message: &str) -> String {
    serde_json::json!({"ok": false, "error": kind, "message": message}).to_string()
}

/// `serve`: until `stop`.
pub fn serve(args: &ServeArgs, stop: &AtomicU32) -> Result<(), String> {
    let name: SchemeName = args.hash.parse().map_err(|e| format!("{e}"))?;
    let seed = args
        .hash_seed
        .clone()
        .or_else(|| std::env::var("PYTHONHASHSEED").ok())
        .unwrap_or_else(|| "0".into());
    let config = ServerConfig {
        listen: args.listen.clone(),
        subscriptions: args.subscribe.clone(),
        index: IndexConfig {
            block_size: args.block_size,
            scheme: Scheme::new(name, &seed),
        },
        topic: args.topic.clone(),
        replay_timeout: Duration::from_millis(args.replay_timeout_ms),
    };
    server::serve(&config, stop, || {
        eprintln!(
            "radixd index: answering on {} for {} worker(s) ({}, block size {})",
            args.listen,
            args.subscribe.len(),
            args.hash,
            args.block_size
        )
    })
    .map_err(|e| e.to_string())
}

/// Parses a JSON array of integers that fit `T`.
fn json_list<T: TryFrom<u64>>(s: &str, what: &str) -> Result<Vec<T>, String> {
    let v: serde_json::Value =
        serde_json::from_str(s).map_err(|e| format!("{what} is not JSON: {e}"))?;
    let items = v
        .as_array()
        .ok_or_else(|| format!("{what} is not a JSON array"))?;
    items
        .iter()
        .map(|x| {
            x.as_u64()
                .and_then(|n| T::try_from(n).ok())
                .ok_or_else(|| format!("{what}: {x} is not a valid value"))
        })
        .collect()
}

/// `query`: prints one JSON line; `Err` carries that line for a failure
/// (printed on stdout too, and the exit status is non-zero).
pub fn query(args: &QueryArgs, out: &mut impl Write) -> Result<(), String> {
    let keys = match (&args.tokens, &args.hashes) {
        (Some(t), _) => json_list::<u32>(t, "--tokens").map(Keys::Tokens),
        (None, Some(h)) => json_list::<u64>(h, "--hashes").map(Keys::Hashes),
        (None, None) => Err("--tokens or --hashes is required".into()),
    };
    let line = match keys {
        Err(m) => Err(error_line("bad_argument", &m)),
        Ok(keys) => {
            let request = Request::Query {
                keys,
                early_exit: args.early_exit,
            };
            match IndexClient::connect(&args.connect, Duration::from_millis(args.timeout_ms))
                .and_then(|c| c.call(&request))
            {
                Err(e) => Err(error_line(e.kind(), &e.to_string())),
                Ok(answer) => {
                    let ok = matches!(&answer, Value::Map(p) if get(p, "ok") == Some(&Value::Bool(true)));
                    let line = to_json(&answer).to_string();
                    if ok {
                        Ok(line)
                    } else {
                        Err(line)
                    }
                }
            }
        }
    };
    let text = match &line {
        Ok(l) | Err(l) => l,
    };
    writeln!(out, "{text}").map_err(|e| e.to_string())?;
    line.map(|_| ())
}

fn stats(client: &IndexClient) -> Result<serde_json::Value, String> {
    let v = client.call(&Request::Stats).map_err(|e| e.to_string())?;
    let j = to_json(&v);
    if j["ok"] != serde_json::Value::Bool(true) {
        return Err(format!("the index answered {j}"));
    }
    Ok(j)
}

/// `stat`: two readings `interval` apart, then the figures.
pub fn stat(args: &StatArgs, out: &mut impl Write) -> Result<(), String> {
    if !(args.interval.is_finite() && args.interval > 0.0 && args.interval <= 3600.0) {
        return Err("--interval must be above 0 and at most 3600 seconds".into());
    }
    let client = IndexClient::connect(&args.connect, Duration::from_millis(args.timeout_ms))
        .map_err(|e| e.to_string())?;
    let a = stats(&client)?;
    std::thread::sleep(Duration::from_secs_f64(args.interval));
    let b = stats(&client)?;
    let n = |j: &serde_json::Value, k: &str| j[k].as_u64().unwrap_or(0);
    let rate = |k: &str| n(&b, k).saturating_sub(n(&a, k)) as f64 / args.interval;
    let w = |e: std::io::Error| e.to_string();
    writeln!(
        out,
        "workers      {}, blocks {} ({} held across workers), table {}",
        n(&b, "workers"),
        n(&b, "blocks"),
        n(&b, "held"),
        human_bytes(n(&b, "table_bytes"))
    )
    .map_err(w)?;
    writeln!(
        out,
        "events       {} applied, {:.1}/s, {} ignored (not GPU)",
        n(&b, "events"),
        rate("events"),
        n(&b, "ignored")
    )
    .map_err(w)?;
    writeln!(
        out,
        "queries      {} answered, {:.1}/s, p50 {:.1} µs, p99 {:.1} µs (last 4096)",
        n(&b, "queries"),
        rate("queries"),
        b["query_p50_us"].as_f64().unwrap_or(0.0),
        b["query_p99_us"].as_f64().unwrap_or(0.0)
    )
    .map_err(w)?;
    for f in b["feeds"].as_array().into_iter().flatten() {
        writeln!(
            out,
            "feed {:<8} {} blocks, {} batches (last seq {}), {} refused, {} malformed, {} gaps, {} replay failures",
            f["name"].as_str().unwrap_or("?"),
            n(f, "blocks"),
            n(f, "batches"),
            n(f, "last_seq"),
            n(f, "refused"),
            n(f, "malformed"),
            n(f, "gaps"),
            n(f, "replay_failures"),
        )
        .map_err(w)?;
    }
    let errors: Vec<String> = b["errors"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, v)| v.as_u64().unwrap_or(0) > 0)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    writeln!(
        out,
        "refusals     {}",
        if errors.is_empty() {
            "none".to_string()
        } else {
            errors.join(", ")
        }
    )
    .map_err(w)?;
    Ok(())
}
