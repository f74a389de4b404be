//! vLLM's KV event messages (`vllm/distributed/kv_events.py`): the
//! `EventBatch` / `KVEventBatch` msgspec structs and their events, encoded as
//! msgspec encodes them with `array_like=True, omit_defaults=True` and a
//! tagged union (`tag=True`: the class name first):
//!
//! ```text
//! [ts, [event, ...], data_parallel_rank]
//! ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name]
//! ["BlockRemoved", block_hashes, medium]
//! ["AllBlocksCleared"]
//! ```
//!
//! Fields with defaults that are at their default (`extra_keys`,
//! `group_idx`, the `kv_cache_spec_*` fields) are omitted, as msgspec omits
//! them; `lora_name` has no default in vLLM, so it is written (nil). A
//! decoder with an older definition (the 7-field `BlockStored` of
//! `examples/online_serving/kv_events_subscriber.py`) ignores trailing
//! fields. Block hashes go out as integers, as vLLM sends them by default.

use super::msgpack::{self, DecodeError, Value};

/// vLLM's `MEDIUM_GPU`.
pub const MEDIUM_GPU: &str = "GPU";

/// One KV cache event as a consumer sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Pages became cached.
    BlockStored {
        /// One hash per page.
        block_hashes: Vec<u64>,
        /// Hash of the page before the first one; `None` at the root.
        parent_block_hash: Option<u64>,
        /// `block_size` tokens per page.
        token_ids: Vec<u32>,
        /// Tokens per page.
        block_size: u32,
        /// Always `None` (radixd caches no LoRA adapters).
        lora_id: Option<u64>,
        /// Where the pages live (`"GPU"` unless configured).
        medium: Option<String>,
    },
    /// Pages were evicted.
    BlockRemoved {
        /// One hash per page.
        block_hashes: Vec<u64>,
        /// As in `BlockStored`.
        medium: Option<String>,
    },
    /// Everything was dropped.
    AllBlocksCleared,
}

/// One decoded `KVEventBatch`.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Seconds since the Unix epoch when the batch was made.
    pub ts: f64,
    /// The events, in order.
    pub events: Vec<KvEvent>,
    /// vLLM's `data_parallel_rank`, when present.
    pub data_parallel_rank: Option<i64>,
}

/// Builds one `KVEventBatch` payload event by event.
#[derive(Debug, Default)]
pub struct BatchWriter {
    body: Vec<u8>,
    count: usize,
}

impl BatchWriter {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Events written so far.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether no event was written yet.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Appends a `BlockStored`.
    pub fn stored(
        &mut self,
        block_hashes: &[u64],
        parent: Option<u64>,
        tokens: &[u32],
        block_size: u32,
        medium: &str,
    ) {
        let b = &mut self.body;
        msgpack::array(b, 8);
        msgpack::str(b, "BlockStored");
        msgpack::array(b, block_hashes.len());
        for &h in block_hashes {
            msgpack::uint(b, h);
        }
        match parent {
            Some(h) => msgpack::uint(b, h),
            None => msgpack::nil(b),
        }
        msgpack::array(b, tokens.len());
        for &t in tokens {
            msgpack::uint(b, u64::from(t));
        }
        msgpack::uint(b, u64::from(block_size));
        msgpack::nil(b); // lora_id
        msgpack::str(b, medium);
        msgpack::nil(b); // lora_name
        self.count += 1;
    }

    /// Appends a `BlockRemoved`.
    pub fn removed(&mut self, block_hashes: &[u64], medium: &str) {
        let b = &mut self.body;
        msgpack::array(b, 3);
        msgpack::str(b, "BlockRemoved");
        msgpack::array(b, block_hashes.len());
        for &h in block_hashes {
            msgpack::uint(b, h);
        }
        msgpack::str(b, medium);
        self.count += 1;
    }

    /// Appends an `AllBlocksCleared`.
    pub fn cleared(&mut self) {
        msgpack::array(&mut self.body, 1);
        msgpack::str(&mut self.body, "AllBlocksCleared");
        self.count += 1;
    }

    /// The payload `[ts, [events...], data_parallel_rank]`; the writer is
    /// empty again afterwards.
    pub fn finish(&mut self, ts: f64, data_parallel_rank: u32) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.body.len() + 24);
        msgpack::array(&mut out, 3);
        msgpack::float(&mut out, ts);
        msgpack::array(&mut out, self.count);
        out.extend_from_slice(&self.body);
        msgpack::uint(&mut out, u64::from(data_parallel_rank));
        self.body.clear();
        self.count = 0;
        out
    }
}

/// Decodes a `KVEventBatch` payload, array-like (as written here and by
/// vLLM with `array_like=True`).
pub fn decode_batch(payload: &[u8]) -> Result<Batch, DecodeError> {
    let Value::Array(top) = msgpack::decode(payload)? else {
        return Err(DecodeError::Shape("an array [ts, events, ...]"));
    };
    let ts = match top.first() {
        Some(Value::Float(x)) => *x,
        Some(Value::Int(i)) => *i as f64,
        _ => return Err(DecodeError::Shape("ts, a number")),
    };
    let Some(Value::Array(raw)) = top.get(1) else {
        return Err(DecodeError::Shape("events, an array"));
    };
    let data_parallel_rank = match top.get(2) {
        Some(Value::Int(i)) => Some(*i),
        _ => None,
    };
    let events = raw.iter().map(decode_event).collect::<Result<_, _>>()?;
    Ok(Batch {
        ts,
        events,
        data_parallel_rank,
    })
}

fn hashes(v: Option<&Value>) -> Result<Vec<u64>, DecodeError> {
    let Some(Value::Array(items)) = v else {
        return Err(DecodeError::Shape("block_hashes, an array"));
    };
    items
        .iter()
        .map(|h| {
            h.as_u64()
                .ok_or(DecodeError::Shape("an integer block hash"))
        })
        .collect()
}

fn opt_str(v: Option<&Value>) -> Result<Option<String>, DecodeError> {
    match v {
        None | Some(Value::Nil) => Ok(None),
        Some(Value::Str(s)) => Ok(Some(s.clone())),
        _ => Err(DecodeError::Shape("a string or nil")),
    }
}

fn decode_event(v: &Value) -> Result<KvEvent, DecodeError> {
    let Value::Array(f) = v else {
        return Err(DecodeError::Shape("an event, a tagged array"));
    };
    match f.first() {
        Some(Value::Str(tag)) if tag == "BlockStored" => {
            let parent_block_hash = match f.get(2) {
                Some(Value::Nil) => None,
                Some(h) => Some(
                    h.as_u64()
                        .ok_or(DecodeError::Shape("parent_block_hash, an integer or nil"))?,
                ),
                None => return Err(DecodeError::Shape("parent_block_hash")),
            };
            let Some(Value::Array(toks)) = f.get(3) else {
                return Err(DecodeError::Shape("token_ids, an array"));
            };
            let token_ids = toks
                .iter()
                .map(|t| {
                    t.as_u64()
                        .and_then(|t| u32::try_from(t).ok())
                        .ok_or(DecodeError::Shape("a u32 token id"))
                })
                .collect::<Result<_, _>>()?;
            let block_size = f
                .get(4)
                .and_then(Value::as_u64)
                .and_then(|b| u32::try_from(b).ok())
                .ok_or(DecodeError::Shape("block_size, an integer"))?;
            let lora_id = f.get(5).and_then(Value::as_u64);
            Ok(KvEvent::BlockStored {
                block_hashes: hashes(f.get(1))?,
                parent_block_hash,
                token_ids,
                block_size,
                lora_id,
                medium: opt_str(f.get(6))?,
            })
        }
        Some(Value::Str(tag)) if tag == "BlockRemoved" => Ok(KvEvent::BlockRemoved {
            block_hashes: hashes(f.get(1))?,
            medium: opt_str(f.get(2))?,
        }),
        Some(Value::Str(tag)) if tag == "AllBlocksCleared" => Ok(KvEvent::AllBlocksCleared),
        _ => Err(DecodeError::Shape(
            "a BlockStored, BlockRemoved or AllBlocksCleared tag",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_round_trips() {
        let mut w = BatchWriter::new();
        w.stored(&[1, u64::MAX], None, &[1, 2, 3, 4], 2, MEDIUM_GPU);
        w.removed(&[u64::MAX], MEDIUM_GPU);
        w.cleared();
        let payload = w.finish(12.5, 0);
        assert!(w.is_empty());
        let b = decode_batch(&payload).unwrap();
        assert_eq!(b.ts, 12.5);
        assert_eq!(b.data_parallel_rank, Some(0));
        assert_eq!(
            b.events,
            vec![
                KvEvent::BlockStored {
                    block_hashes: vec![1, u64::MAX],
                    parent_block_hash: None,
                    token_ids: vec![1, 2, 3, 4],
                    block_size: 2,
                    lora_id: None,
                    medium: Some("GPU".into()),
                },
                KvEvent::BlockRemoved {
                    block_hashes: vec![u64::MAX],
                    medium: Some("GPU".into()),
                },
                KvEvent::AllBlocksCleared,
            ]
        );
    }
}
