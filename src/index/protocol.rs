//! The query protocol of `radixd index serve`: one msgpack map per
//! request and per answer, over a ZeroMQ REQ/REP pair (docs/routing.md has
//! the table).
//!
//! | request | answer |
//! |---|---|
//! | `{"op":"query","tokens":[u32...]}` (optional `"early_exit":bool`) | `{"ok":true,"scores":{WORKER:BLOCKS...},"tree_sizes":{WORKER:BLOCKS...}}` (and `"store_scores"`, `"store_sizes"` once a worker has a store) |
//! | `{"op":"query","hashes":[u64...]}` (chained hashes in the index's scheme) | the same |
//! | `{"op":"stats"}` | `{"ok":true,"workers":N,"blocks":N,"held":N,"events":N,"queries":N,"query_p50_us":F,"query_p99_us":F,"feeds":[...],"errors":{KIND:N...}}` |
//! | anything else | `{"ok":false,"error":KIND,"message":TEXT}` |

use std::fmt;

use super::OverlapScores;
use super::Worker;
use crate::events::msgpack::{self, DecodeError, Value};

/// Most tokens (or hashes) a query may carry.
pub const MAX_QUERY_ITEMS: usize = 1 << 20;

/// What a query names blocks by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Keys {
    /// Token ids: the server cuts them into blocks and hashes them.
    Tokens(Vec<u32>),
    /// Chained block hashes in the index's scheme.
    Hashes(Vec<u64>),
}

/// A request to the index server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Overlap scores of one request.
    Query {
        /// The request's blocks.
        keys: Keys,
        /// Stop as soon as one worker is left (Dynamo's `early_exit`).
        early_exit: bool,
    },
    /// The server's figures.
    Stats,
}

/// Why a request could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// Not msgpack.
    Msgpack(DecodeError),
    /// msgpack, but not a request: what was expected.
    Shape(&'static str),
}

impl ProtocolError {
    /// The `error` kind of the answer.
    pub fn kind(&self) -> &'static str {
        "bad_request"
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Msgpack(e) => write!(f, "not a msgpack request: {e}"),
            Self::Shape(what) => write!(f, "bad request: expected {what}"),
        }
    }
}

impl std::error::Error for ProtocolError {}

/// `Value::Str(s)`.
pub fn text(s: &str) -> Value {
    Value::Str(s.to_string())
}

/// The value under `key` in a map's pairs.
pub fn get<'a>(pairs: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
    pairs
        .iter()
        .find(|(k, _)| matches!(k, Value::Str(s) if s == key))
        .map(|(_, v)| v)
}

impl Request {
    /// The request as msgpack.
    pub fn encode(&self) -> Vec<u8> {
        let v = match self {
            Self::Stats => Value::Map(vec![(text("op"), text("stats"))]),
            Self::Query { keys, early_exit } => {
                let (name, items): (&str, Vec<Value>) = match keys {
                    Keys::Tokens(t) => (
                        "tokens",
                        t.iter().map(|&x| Value::UInt(u64::from(x))).collect(),
                    ),
                    Keys::Hashes(h) => ("hashes", h.iter().map(|&x| Value::UInt(x)).collect()),
                };
                Value::Map(vec![
                    (text("op"), text("query")),
                    (text(name), Value::Array(items)),
                    (text("early_exit"), Value::Bool(*early_exit)),
                ])
            }
        };
        let mut out = Vec::new();
        msgpack::encode(&mut out, &v);
        out
    }

    /// Reads a request; never panics on any input.
    pub fn decode(bytes: &[u8]) -> Result<Self, ProtocolError> {
        let v = msgpack::decode(bytes).map_err(ProtocolError::Msgpack)?;
        let Value::Map(pairs) = v else {
            return Err(ProtocolError::Shape("a map"));
        };
        match get(&pairs, "op") {
            Some(Value::Str(op)) if op == "stats" => Ok(Self::Stats),
            Some(Value::Str(op)) if op == "query" => {
                let early_exit = match get(&pairs, "early_exit") {
                    None | Some(Value::Nil) => false,
                    Some(Value::Bool(b)) => *b,
                    Some(_) => return Err(ProtocolError::Shape("early_exit, a boolean")),
                };
                let list = |v: &Value| -> Result<Vec<u64>, ProtocolError> {
                    let Value::Array(items) = v else {
                        return Err(ProtocolError::Shape("an array of integers"));
                    };
                    if items.len() > MAX_QUERY_ITEMS {
                        return Err(ProtocolError::Shape("at most 2^20 items"));
                    }
                    items
                        .iter()
                        .map(|x| {
                            x.as_u64()
                                .ok_or(ProtocolError::Shape("non-negative integers"))
                        })
                        .collect()
                };
                let keys = match (get(&pairs, "tokens"), get(&pairs, "hashes")) {
                    (Some(t), None) => Keys::Tokens(
                        list(t)?
                            .into_iter()
                            .map(|x| {
                                u32::try_from(x).map_err(|_| ProtocolError::Shape("u32 token ids"))
                            })
                            .collect::<Result<_, _>>()?,
                    ),
                    (None, Some(h)) => Keys::Hashes(list(h)?),
                    _ => return Err(ProtocolError::Shape("either tokens or hashes")),
                };
                Ok(Self::Query { keys, early_exit })
            }
            _ => Err(ProtocolError::Shape(r#"op "query" or "stats""#)),
        }
    }
}

/// The answer to a query: scores and tree sizes keyed by worker name, and,
/// once some worker published store events, the same for the workers'
/// stores (`store_scores`, `store_sizes`; a fleet without stores gets the
/// answer it always got).
pub fn scores_answer(scores: &OverlapScores, name: impl Fn(Worker) -> String) -> Value {
    let by_name = |pairs: Vec<(Worker, u64)>| {
        let mut pairs = pairs;
        pairs.sort_unstable();
        Value::Map(
            pairs
                .into_iter()
                .map(|(w, n)| (Value::Str(name(w)), Value::UInt(n)))
                .collect(),
        )
    };
    let widen = |v: &[(Worker, u32)]| v.iter().map(|&(w, n)| (w, u64::from(n))).collect();
    let mut answer = vec![
        (text("ok"), Value::Bool(true)),
        (text("scores"), by_name(widen(&scores.scores))),
        (text("tree_sizes"), by_name(scores.tree_sizes.clone())),
    ];
    if !scores.store_sizes.is_empty() {
        answer.push((text("store_scores"), by_name(widen(&scores.store_scores))));
        answer.push((text("store_sizes"), by_name(scores.store_sizes.clone())));
    }
    Value::Map(answer)
}

/// An error answer.
pub fn error_answer(kind: &str, message: &str) -> Value {
    Value::Map(vec![
        (text("ok"), Value::Bool(false)),
        (text("error"), text(kind)),
        (text("message"), text(message)),
    ])
}

/// `v` as msgpack.
pub fn to_bytes(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    msgpack::encode(&mut out, v);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fleet without stores gets the answer it always got; once a worker
    /// has a store, its store scores and sizes come along.
    #[test]
    fn store_scores_come_with_stores_only() {
        let w = Worker::new(3);
        let mut s = OverlapScores {
            scores: vec![(w, 2)],
            tree_sizes: vec![(w, 5)],
            ..OverlapScores::default()
        };
        let keys = |v: Value| match v {
            Value::Map(pairs) => pairs
                .into_iter()
                .map(|(k, v)| match k {
                    Value::Str(k) => (k, v),
                    other => panic!("key {other:?}"),
                })
                .collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        let plain = keys(scores_answer(&s, |w| w.to_string()));
        let names: Vec<&str> = plain.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["ok", "scores", "tree_sizes"]);
        s.store_scores = vec![(w, 4)];
        s.store_sizes = vec![(w, 9)];
        let tiered = keys(scores_answer(&s, |w| w.to_string()));
        let names: Vec<&str> = tiered.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            ["ok", "scores", "tree_sizes", "store_scores", "store_sizes"]
        );
        let one = |v: &Value| match v {
            Value::Map(p) => p.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            one(&tiered[3].1),
            vec![(Value::Str("3".into()), Value::UInt(4))]
        );
        assert_eq!(
            one(&tiered[4].1),
            vec![(Value::Str("3".into()), Value::UInt(9))]
        );
    }

    #[test]
    fn requests_round_trip() {
        for r in [
            Request::Stats,
            Request::Query {
                keys: Keys::Tokens(vec![1, 2, u32::MAX]),
                early_exit: true,
            },
            Request::Query {
                keys: Keys::Hashes(vec![0, u64::MAX]),
                early_exit: false,
            },
        ] {
            assert_eq!(Request::decode(&r.encode()), Ok(r));
        }
    }

    #[test]
    fn bad_requests_are_errors() {
        let enc = |v: Value| to_bytes(&v);
        let q =
            |k: &str, v: Value| enc(Value::Map(vec![(text("op"), text("query")), (text(k), v)]));
        for bytes in [
            vec![],
            vec![0xc1],
            vec![0x92, 0x01],
            enc(Value::Array(vec![])),
            enc(Value::Map(vec![(text("op"), text("nope"))])),
            q("tokens", Value::Array(vec![Value::Int(-1)])),
            q("tokens", Value::Array(vec![Value::UInt(1 << 33)])),
            q("tokens", text("1,2")),
            q("hashes", Value::Array(vec![Value::Float(1.0)])),
            q("neither", Value::Array(vec![])),
        ] {
            assert!(Request::decode(&bytes).is_err(), "{bytes:?}");
        }
    }
}
