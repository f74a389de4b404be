//! `radixd exec`'s store ops (exact shapes, docs/protocol.md):
//!
//! - `{"op":"store_put","ns":NS,"key":K,"parent":K|null,"data":BASE64}` →
//!   `{"ok":true,"stored":true}` (`false`: already stored); the first put in
//!   a namespace fixes its value size;
//! - `{"op":"store_get","ns":NS,"key":K}` → `{"ok":true,"data":BASE64}` or
//!   `{"ok":true,"data":null}`;
//! - `{"op":"store_exists","ns":NS,"keys":[K,...]}` → `{"ok":true,"run":N}`;
//! - `{"op":"store_stats"}` → `{"ok":true,"values":N,"bytes":B,
//!   "capacity_bytes":C,"hits":H,"misses":M,"evicted":E}` (plus
//!   `namespaces` and `failed_reserves`);
//! - `{"op":"store_clear","ns":NS}` → `{"ok":true,"cleared":N}`: drops
//!   every committed value of the namespace (0 for one nobody registered).
//!
//! Keys and namespace names are the UTF-8 bytes of the strings given.

use serde_json::{json, Map, Value};

use crate::op::{check_key, Backend, ErrorKind, Rejection, StoreAccess};
use crate::store::{StoreError, StoreItem};

fn malformed(message: impl Into<String>) -> Rejection {
    Rejection::new(ErrorKind::Malformed, message)
}

/// The answer to `line` if it is a store op (`None`: another op).
pub fn answer(backend: &mut impl Backend, line: &[u8]) -> Option<String> {
    // Only lines that can name a store op are parsed here.
    if !line.windows(6).any(|w| w == b"store_") {
        return None;
    }
    let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(line) else {
        return None;
    };
    let op = match obj.get("op") {
        Some(Value::String(op)) if op.starts_with("store_") => op.clone(),
        _ => return None,
    };
    let result = run(backend, &op, &obj);
    Some(
        match result {
            Ok(v) => v,
            Err(r) => json!({"ok": false, "error": r.kind.name(), "message": r.message}),
        }
        .to_string(),
    )
}

fn string<'a>(obj: &'a Map<String, Value>, name: &str) -> Result<&'a str, Rejection> {
    match obj.get(name) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(malformed(format!("{name:?} must be a string"))),
        None => Err(malformed(format!("missing {name:?}"))),
    }
}

fn run(backend: &mut impl Backend, op: &str, obj: &Map<String, Value>) -> Result<Value, Rejection> {
    // A field the op does not take is malformed, as for every other op
    // (`exec::known_fields`): never answered as if it were not there.
    let known: &[&str] = match op {
        "store_put" => &["ns", "key", "parent", "data"],
        "store_get" => &["ns", "key"],
        "store_exists" => &["ns", "keys"],
        "store_clear" => &["ns"],
        "store_stats" => &[],
        other => {
            return Err(Rejection::new(
                ErrorKind::UnknownOp,
                format!("unknown op {other:?}"),
            ))
        }
    };
    if let Some(field) = obj
        .keys()
        .find(|k| k.as_str() != "op" && !known.contains(&k.as_str()))
    {
        return Err(malformed(format!("unknown field {field:?} for op {op:?}")));
    }
    // Parse before asking for the store: a malformed line is malformed
    // with or without one.
    match op {
        "store_put" => {
            let ns = string(obj, "ns")?;
            let key = string(obj, "key")?;
            let parent = match obj.get("parent") {
                None | Some(Value::Null) => None,
                Some(Value::String(p)) => Some(p.as_str()),
                Some(_) => return Err(malformed("\"parent\" must be a string or null")),
            };
            let data = decode_base64(string(obj, "data")?)
                .ok_or_else(|| malformed("\"data\" is not base64"))?;
            check_key(key.as_bytes())?;
            if let Some(p) = parent {
                check_key(p.as_bytes())?;
            }
            let store = store_of(backend)?;
            let space = match store.find_namespace(ns.as_bytes())? {
                Some(space) if space.value_size != data.len() as u64 => {
                    return Err(StoreError::SizeMismatch {
                        expected: space.value_size,
                        got: data.len() as u64,
                    }
                    .into())
                }
                Some(space) => space,
                None => store.namespace(ns.as_bytes(), data.len() as u64)?,
            };
            let item = StoreItem {
                key: key.as_bytes(),
                parent: parent.map(str::as_bytes),
                value: &data,
            };
            let stored = store.put(space, &[item])?;
            Ok(json!({"ok": true, "stored": stored.first().copied().unwrap_or(false)}))
        }
        "store_get" => {
            let ns = string(obj, "ns")?;
            let key = string(obj, "key")?;
            check_key(key.as_bytes())?;
            let store = store_of(backend)?;
            let Some(space) = store.find_namespace(ns.as_bytes())? else {
                return Ok(json!({"ok": true, "data": null}));
            };
            let mut out = vec![0u8; space.value_size as usize];
            let data = store
                .get(space, key.as_bytes(), &mut out)?
                .then(|| encode_base64(&out));
            Ok(json!({"ok": true, "data": data}))
        }
        "store_exists" => {
            let ns = string(obj, "ns")?;
            let keys = match obj.get("keys") {
                Some(Value::Array(keys)) => keys
                    .iter()
                    .map(|k| k.as_str().map(str::as_bytes))
                    .collect::<Option<Vec<&[u8]>>>()
                    .ok_or_else(|| malformed("\"keys\" must hold strings"))?,
                _ => return Err(malformed("\"keys\" must be an array")),
            };
            for k in &keys {
                check_key(k)?;
            }
            let store = store_of(backend)?;
            let run = match store.find_namespace(ns.as_bytes())? {
                Some(space) => store.run(space, &keys)?,
                None => 0,
            };
            Ok(json!({"ok": true, "run": run}))
        }
        "store_clear" => {
            let ns = string(obj, "ns")?;
            let store = store_of(backend)?;
            let cleared = match store.find_namespace(ns.as_bytes())? {
                Some(space) => store.clear(space)?,
                None => 0,
            };
            Ok(json!({"ok": true, "cleared": cleared}))
        }
        "store_stats" => {
            let s = store_of(backend)?.stats()?;
            Ok(json!({
                "ok": true,
                "values": s.values,
                "bytes": s.bytes,
                "capacity_bytes": s.capacity_bytes,
                "hits": s.hits,
                "misses": s.misses,
                "evicted": s.evicted,
                "namespaces": s.namespaces,
                "failed_reserves": s.failed_reserves,
            }))
        }
        other => Err(Rejection::new(
            ErrorKind::UnknownOp,
            format!("unknown op {other:?}"),
        )),
    }
}

fn store_of(backend: &mut impl Backend) -> Result<&mut dyn StoreAccess, Rejection> {
    backend.store().ok_or_else(|| StoreError::NoStore.into())
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (RFC 4648 §4).
pub fn encode_base64(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes standard base64 (padding optional, no whitespace); `None` for
/// anything else.
pub fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let text = text.as_bytes();
    let body = text
        .strip_suffix(b"==")
        .or_else(|| text.strip_suffix(b"="))
        .unwrap_or(text);
    if body.len() % 4 == 1 || (body.len() != text.len() && text.len() % 4 != 0) {
        return None;
    }
    let value = |c: u8| ALPHABET.iter().position(|&a| a == c).map(|v| v as u32);
    let mut out = Vec::with_capacity(body.len() / 4 * 3 + 2);
    for chunk in body.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c)? << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_and_refuses_garbage() {
        for n in 0..20usize {
            let bytes: Vec<u8> = (0..n).map(|i| (i * 37 + 5) as u8).collect();
            let text = encode_base64(&bytes);
            assert_eq!(decode_base64(&text), Some(bytes));
        }
        assert_eq!(encode_base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(encode_base64(b"fo"), "Zm8=");
        assert_eq!(decode_base64("Zm8"), Some(b"fo".to_vec()));
        assert_eq!(decode_base64("Z"), None);
        assert_eq!(decode_base64("Zm9v!mFy"), None);
    }
}
