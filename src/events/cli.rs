//! The command-line faces of KV events: the `--kv-events*` flags of
//! `radixd serve`, and `radixd events`, a subscriber printing JSON lines.

use std::io::Write;
use std::time::{Duration, Instant};

use super::{EventsConfig, EventsError};

/// `radixd serve`'s KV event flags.
#[derive(clap::Args, Clone, Debug)]
pub struct ServeEventsArgs {
    /// Publish KV events in vLLM's format on this ZeroMQ endpoint (bound),
    /// e.g. `tcp://*:5557`, `tcp://127.0.0.1:5557`, `ipc:///tmp/radixd-ev`.
    #[arg(long, value_name = "ENDPOINT")]
    pub kv_events: Option<String>,
    /// Connect the PUB socket to the endpoint instead of binding it.
    #[arg(long, requires = "kv_events")]
    pub kv_events_connect: bool,
    /// ROUTER endpoint (bound) answering replay requests.
    #[arg(long, value_name = "ENDPOINT", requires = "kv_events")]
    pub kv_events_replay: Option<String>,
    /// Topic frame of every message.
    #[arg(long, default_value = "", value_name = "T")]
    pub kv_events_topic: String,
    /// Block hashes: `xxh3` (Dynamo) or `sha256-cbor` (vLLM, llm-d).
    #[arg(long, default_value = "xxh3", value_parser = ["xxh3", "sha256-cbor"])]
    pub kv_events_hash: String,
    /// vLLM's PYTHONHASHSEED, the root of `sha256-cbor` hashes (default:
    /// $PYTHONHASHSEED as vLLM reads it, else "0").
    #[arg(long, value_name = "SEED")]
    pub kv_events_hash_seed: Option<String>,
    /// Batches kept for replay.
    #[arg(long, default_value_t = 10_000, value_name = "BATCHES")]
    pub kv_events_buffer: usize,
    /// Events the daemon → publisher queue holds before it resyncs.
    #[arg(long, default_value_t = 1 << 16, value_name = "EVENTS")]
    pub kv_events_queue: usize,
    /// The `medium` of every event.
    #[arg(long, default_value = "GPU")]
    pub kv_events_medium: String,
    /// msgspec layout: `array` (array_like=True, as vLLM's example decodes),
    /// `map` (batch and events maps) or `vllm` (vLLM 0.33.0's own: an
    /// array batch of map events).
    #[arg(long, default_value = "array", value_parser = ["array", "map", "vllm"])]
    pub kv_events_layout: String,
}

impl ServeEventsArgs {
    /// The configuration the flags name; `None` without `--kv-events`.
    pub fn config(&self) -> Option<EventsConfig> {
        let endpoint = self.kv_events.clone()?;
        Some(EventsConfig {
            endpoint,
            connect: self.kv_events_connect,
            replay_endpoint: self.kv_events_replay.clone(),
            topic: self.kv_events_topic.clone(),
            hash: self.kv_events_hash.clone(),
            hash_seed: self
                .kv_events_hash_seed
                .clone()
                .or_else(|| std::env::var("PYTHONHASHSEED").ok())
                .unwrap_or_else(|| "0".into()),
            medium: self.kv_events_medium.clone(),
            layout: self.kv_events_layout.clone(),
            replay_buffer: self.kv_events_buffer,
            queue: self.kv_events_queue,
        })
    }
}

/// `radixd events`: subscribe and print one JSON line per event.
#[derive(clap::Args, Clone, Debug)]
pub struct SubscribeArgs {
    /// The daemon's PUB endpoint, e.g. `tcp://127.0.0.1:5557`.
    pub endpoint: String,
    /// The daemon's replay (ROUTER) endpoint: fills gaps, and with
    /// `--replay-from` fetches the past.
    #[arg(long, value_name = "ENDPOINT")]
    pub replay: Option<String>,
    /// Start from this sequence number (needs `--replay`).
    #[arg(long, value_name = "SEQ", requires = "replay")]
    pub replay_from: Option<u64>,
    /// Topic prefix to subscribe to.
    #[arg(long, default_value = "")]
    pub topic: String,
    /// Exit after this many seconds without a batch (default: never).
    #[arg(long, value_name = "SECS")]
    pub idle_exit: Option<f64>,
}

/// Runs `radixd events` until interrupted (or idle for `--idle-exit`).
pub fn subscribe(args: &SubscribeArgs, out: &mut impl Write) -> Result<(), EventsError> {
    #[cfg(feature = "kv-events")]
    {
        use super::subscriber::Subscriber;
        let mut sub = Subscriber::connect(&args.endpoint, &args.topic, args.replay.as_deref())?;
        if let Some(from) = args.replay_from {
            sub.replay_from(from, Duration::from_secs(10))?;
        }
        let idle = args
            .idle_exit
            .and_then(|s| Duration::try_from_secs_f64(s).ok());
        let mut last = Instant::now();
        let stop = &crate::signal::STOP;
        // Relaxed: a plain flag set by the signal handler.
        while stop.load(radixd_ipc::sync::Ordering::Relaxed) == 0 {
            match sub.recv(Duration::from_millis(100))? {
                Some(r) => {
                    last = Instant::now();
                    for line in json_lines(&r) {
                        if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
                            return Ok(()); // stdout closed: done.
                        }
                    }
                }
                None if idle.is_some_and(|d| last.elapsed() >= d) => return Ok(()),
                None => {}
            }
        }
        Ok(())
    }
    #[cfg(not(feature = "kv-events"))]
    {
        let _ = (args, out, Instant::now(), Duration::ZERO);
        Err(EventsError::NotBuilt)
    }
}

/// One JSON object per event of a batch, carrying the batch's `seq`, `ts`
/// and `data_parallel_rank`, and the event's fields as vLLM names them.
#[cfg(feature = "kv-events")]
pub fn json_lines(r: &super::subscriber::Received) -> Vec<serde_json::Value> {
    use super::batch::KvEvent;
    use serde_json::json;
    r.batch
        .events
        .iter()
        .map(|e| {
            let mut v = match e {
                KvEvent::BlockStored {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    lora_id,
                    medium,
                } => json!({
                    "type": "BlockStored",
                    "block_hashes": block_hashes,
                    "parent_block_hash": parent_block_hash,
                    "token_ids": token_ids,
                    "block_size": block_size,
                    "lora_id": lora_id,
                    "medium": medium,
                }),
                KvEvent::BlockRemoved {
                    block_hashes,
                    medium,
                } => json!({
                    "type": "BlockRemoved",
                    "block_hashes": block_hashes,
                    "medium": medium,
                }),
                KvEvent::AllBlocksCleared => json!({"type": "AllBlocksCleared"}),
            };
            if let Some(obj) = v.as_object_mut() {
                obj.insert("seq".into(), json!(r.seq));
                obj.insert("ts".into(), json!(r.batch.ts));
                obj.insert(
                    "data_parallel_rank".into(),
                    json!(r.batch.data_parallel_rank),
                );
            }
            v
        })
        .collect()
}
