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
//! That is the layout the issue specifies and vLLM's example subscriber
//! decodes ([`BatchLayout::Array`], the default). Recent vLLM main dropped
//! `array_like` (events become maps tagged by `"type"`, the batch a map
//! `{"ts", "events", "data_parallel_rank"}`); [`BatchLayout::Map`]
//! (`--kv-events-layout map`) writes that form. vLLM 0.33.0 itself keeps
//! the batch `array_like` and makes only the events maps:
//! [`BatchLayout::Vllm`] (`--kv-events-layout vllm`) is the one its own
//! `KVEventBatch` decodes. [`decode_batch`] reads all three.
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
        /// The LoRA adapter of a namespace named `lora:ID[:NAME]` (see
        /// `encode::lora_of`); `None` otherwise.
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

/// How msgspec lays the structs out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BatchLayout {
    /// `array_like=True`: positional arrays, the event's tag first.
    #[default]
    Array,
    /// Maps keyed by field name, the event's tag under `"type"`.
    Map,
    /// vLLM 0.33.0's own (`vllm/distributed/kv_events.py`): the batch
    /// `array_like` (`[ts, [event, ...], data_parallel_rank]`), each event
    /// a map tagged `"type"` (its `KVCacheEvent` is not `array_like`). The
    /// only one of the three that vLLM 0.33.0's `KVEventBatch` decodes.
    Vllm,
}

impl BatchLayout {
    /// Whether events are maps keyed by field name.
    fn map_events(self) -> bool {
        self != Self::Array
    }
}

/// A `--kv-events-layout` value that names no layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownBatchLayout(pub String);

impl std::fmt::Display for UnknownBatchLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown layout {:?} (expected array, map or vllm)",
            self.0
        )
    }
}

impl std::error::Error for UnknownBatchLayout {}

impl std::str::FromStr for BatchLayout {
    type Err = UnknownBatchLayout;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "array" => Ok(Self::Array),
            "map" => Ok(Self::Map),
            "vllm" => Ok(Self::Vllm),
            other => Err(UnknownBatchLayout(other.into())),
        }
    }
}

/// Builds one `KVEventBatch` payload event by event.
#[derive(Debug, Default)]
pub struct BatchWriter {
    body: Vec<u8>,
    count: usize,
    layout: BatchLayout,
}

impl BatchWriter {
    /// An empty batch, array-like.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty batch in `layout`.
    pub fn with_layout(layout: BatchLayout) -> Self {
        Self {
            layout,
            ..Self::default()
        }
    }

    /// Opens a struct of `n` fields (the tag counted) tagged `tag`.
    fn open(&mut self, n: usize, tag: &str) {
        if self.layout.map_events() {
            msgpack::map(&mut self.body, n);
            msgpack::str(&mut self.body, "type");
        } else {
            msgpack::array(&mut self.body, n);
        }
        msgpack::str(&mut self.body, tag);
    }

    /// The field name, when events are maps.
    fn key(&mut self, name: &str) {
        if self.layout.map_events() {
            msgpack::str(&mut self.body, name);
        }
    }

    /// The `block_hashes` field.
    fn block_hashes(&mut self, block_hashes: &[u64]) {
        self.key("block_hashes");
        msgpack::array(&mut self.body, block_hashes.len());
        for &h in block_hashes {
            msgpack::uint(&mut self.body, h);
        }
    }

    /// Events written so far.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether no event was written yet.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Appends a `BlockStored`; `lora`: its `lora_id` and `lora_name`
    /// (`None`: nil, nil).
    pub fn stored(
        &mut self,
        block_hashes: &[u64],
        parent: Option<u64>,
        tokens: &[u32],
        block_size: u32,
        medium: &str,
        lora: Option<(u64, Option<&str>)>,
    ) {
        self.stored_in_group(block_hashes, parent, tokens, block_size, medium, lora, None);
    }

    /// [`BatchWriter::stored`] with vLLM's `group_idx` (the KV cache group;
    /// `None`: omitted, msgspec's default). In the array layout a group
    /// index needs the field before it, `extra_keys`, written (nil).
    #[allow(clippy::too_many_arguments)]
    pub fn stored_in_group(
        &mut self,
        block_hashes: &[u64],
        parent: Option<u64>,
        tokens: &[u32],
        block_size: u32,
        medium: &str,
        lora: Option<(u64, Option<&str>)>,
        group_idx: Option<u32>,
    ) {
        let fields = match (group_idx, self.layout) {
            (None, _) => 8,
            (Some(_), BatchLayout::Array) => 10,
            (Some(_), BatchLayout::Map | BatchLayout::Vllm) => 9,
        };
        self.open(fields, "BlockStored");
        self.block_hashes(block_hashes);
        self.key("parent_block_hash");
        match parent {
            Some(h) => msgpack::uint(&mut self.body, h),
            None => msgpack::nil(&mut self.body),
        }
        self.key("token_ids");
        msgpack::u32_array(&mut self.body, tokens);
        self.key("block_size");
        msgpack::uint(&mut self.body, u64::from(block_size));
        self.key("lora_id");
        match lora {
            Some((id, _)) => msgpack::uint(&mut self.body, id),
            None => msgpack::nil(&mut self.body),
        }
        self.key("medium");
        msgpack::str(&mut self.body, medium);
        self.key("lora_name");
        match lora.and_then(|(_, name)| name) {
            Some(name) => msgpack::str(&mut self.body, name),
            None => msgpack::nil(&mut self.body),
        }
        if let Some(group) = group_idx {
            if self.layout == BatchLayout::Array {
                msgpack::nil(&mut self.body);
            }
            self.key("group_idx");
            msgpack::uint(&mut self.body, u64::from(group));
        }
        self.count += 1;
    }

    /// Appends a `BlockRemoved`.
    pub fn removed(&mut self, block_hashes: &[u64], medium: &str) {
        self.open(3, "BlockRemoved");
        self.block_hashes(block_hashes);
        self.key("medium");
        msgpack::str(&mut self.body, medium);
        self.count += 1;
    }

    /// Appends an `AllBlocksCleared`.
    pub fn cleared(&mut self) {
        self.open(1, "AllBlocksCleared");
        self.count += 1;
    }

    /// The payload `[ts, [events...], data_parallel_rank]`; the writer is
    /// empty again afterwards.
    pub fn finish(&mut self, ts: f64, data_parallel_rank: u32) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.body.len() + 48);
        let map = self.layout == BatchLayout::Map;
        let key = |out: &mut Vec<u8>, name: &str| {
            if map {
                msgpack::str(out, name);
            }
        };
        if map {
            msgpack::map(&mut out, 3);
        } else {
            msgpack::array(&mut out, 3);
        }
        key(&mut out, "ts");
        msgpack::float(&mut out, ts);
        key(&mut out, "events");
        msgpack::array(&mut out, self.count);
        out.extend_from_slice(&self.body);
        key(&mut out, "data_parallel_rank");
        msgpack::uint(&mut out, u64::from(data_parallel_rank));
        self.body.clear();
        self.count = 0;
        out
    }
}

/// The fields of a struct in declaration order: an array as it is, a map
/// looked up by `names` (missing fields nil).
fn fields(v: Value, names: &[&str]) -> Option<Vec<Value>> {
    match v {
        Value::Array(items) => Some(items),
        Value::Map(pairs) => Some(
            names
                .iter()
                .map(|n| {
                    pairs
                        .iter()
                        .find(|(k, _)| matches!(k, Value::Str(s) if s == n))
                        .map_or(Value::Nil, |(_, v)| v.clone())
                })
                .collect(),
        ),
        _ => None,
    }
}

/// Decodes a `KVEventBatch` payload in either [`BatchLayout`].
pub fn decode_batch(payload: &[u8]) -> Result<Batch, DecodeError> {
    let top = fields(
        msgpack::decode(payload)?,
        &["ts", "events", "data_parallel_rank"],
    )
    .ok_or(DecodeError::Shape("an EventBatch array or map"))?;
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
    const NAMES: [&str; 7] = [
        "type",
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
    ];
    let f = match v {
        Value::Array(_) | Value::Map(_) => fields(v.clone(), &NAMES).unwrap_or_default(),
        _ => return Err(DecodeError::Shape("an event, a tagged array or map")),
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
            // In a map, `medium` is found by name (slot 6); in an array it
            // follows the hashes.
            medium: opt_str(if matches!(v, Value::Map(_)) {
                f.get(6)
            } else {
                f.get(2)
            })?,
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
    fn both_layouts_round_trip() {
        for layout in [BatchLayout::Array, BatchLayout::Map, BatchLayout::Vllm] {
            let mut w = BatchWriter::with_layout(layout);
            w.stored(&[7, 8], Some(6), &[1, 2], 1, MEDIUM_GPU, None);
            w.removed(&[7], MEDIUM_GPU);
            w.cleared();
            let b = decode_batch(&w.finish(1.0, 0)).unwrap();
            assert_eq!(b.events.len(), 3, "{layout:?}");
            assert_eq!(
                b.events[1],
                KvEvent::BlockRemoved {
                    block_hashes: vec![7],
                    medium: Some("GPU".into()),
                },
                "{layout:?}"
            );
        }
    }

    /// vLLM 0.33.0's form: an array batch of map events.
    #[test]
    fn the_vllm_layout_is_an_array_of_maps() {
        let mut w = BatchWriter::with_layout(BatchLayout::Vllm);
        w.stored_in_group(&[9], None, &[], 16, "CPU", None, Some(1));
        w.removed(&[9], "CPU");
        let Value::Array(top) = msgpack::decode(&w.finish(2.0, 0)).unwrap() else {
            panic!("an array batch")
        };
        assert_eq!(top.len(), 3);
        let Value::Array(events) = &top[1] else {
            panic!("events")
        };
        for (e, (tag, n)) in events.iter().zip([("BlockStored", 9), ("BlockRemoved", 3)]) {
            let Value::Map(pairs) = e else {
                panic!("a map event: {e:?}")
            };
            assert_eq!(pairs.len(), n);
            assert_eq!(
                pairs[0],
                (Value::Str("type".into()), Value::Str(tag.into()))
            );
        }
    }

    #[test]
    fn a_group_index_follows_nil_extra_keys() {
        for layout in [BatchLayout::Array, BatchLayout::Map] {
            let mut w = BatchWriter::with_layout(layout);
            w.stored_in_group(&[9], Some(8), &[], 16, "CPU", None, Some(2));
            let payload = w.finish(1.0, 0);
            let Value::Array(top) = msgpack::decode(&payload).unwrap() else {
                // The map layout: the event is a map with 9 pairs.
                let b = decode_batch(&payload).unwrap();
                assert_eq!(b.events.len(), 1);
                continue;
            };
            let Value::Array(events) = &top[1] else {
                panic!("events")
            };
            let Value::Array(e) = &events[0] else {
                panic!("event")
            };
            assert_eq!(e.len(), 10, "{layout:?}");
            assert_eq!(e[8], Value::Nil);
            assert_eq!(e[9].as_u64(), Some(2));
            let b = decode_batch(&payload).unwrap();
            assert_eq!(
                b.events[0],
                KvEvent::BlockStored {
                    block_hashes: vec![9],
                    parent_block_hash: Some(8),
                    token_ids: vec![],
                    block_size: 16,
                    lora_id: None,
                    medium: Some("CPU".into()),
                }
            );
        }
    }

    #[test]
    fn batch_round_trips() {
        let mut w = BatchWriter::new();
        w.stored(&[1, u64::MAX], None, &[1, 2, 3, 4], 2, MEDIUM_GPU, None);
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
