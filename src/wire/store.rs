//! Store requests and answers as records and payloads.
//!
//! - `namespace`: `arg` the value size, payload the name's bytes; answer
//!   `a` the id, `b` the value size.
//! - `reserve`: `arg` the namespace, `aux[0]` the key count, payload the
//!   [`KeyList`]; answer 16 bytes per key: entry index, generation (`u32`
//!   each) and data offset (`u64`, `u64::MAX`: not reserved).
//! - `commit`/`abort`: `arg` the namespace, payload 16 bytes per slot as
//!   above; answer `a` the slots done.
//! - `clear`: `arg` the namespace, no payload; answer `a` the values
//!   dropped.

use super::{kind, malformed, opcode, BadReply, EncodedRequest, Payload, WireReply, WireRequest};
use crate::op::{KeyList, Rejection, StoreReply, StoreRequest};
use crate::store::{StoreNs, StoreSlot};

/// Bytes of one slot in a payload.
const SLOT_BYTES: usize = 16;

/// Most keys (or slots) in one request.
pub const MAX_BATCH: u32 = 1 << 16;

fn push_slot(out: &mut Vec<u8>, slot: Option<&StoreSlot>) {
    let (index, generation, offset) = slot.map_or((u32::MAX, 0, u64::MAX), |s| {
        (s.index, s.generation, s.offset)
    });
    out.extend_from_slice(&index.to_ne_bytes());
    out.extend_from_slice(&generation.to_ne_bytes());
    out.extend_from_slice(&offset.to_ne_bytes());
}

fn slots_of(bytes: &[u8]) -> Vec<Option<StoreSlot>> {
    bytes
        .chunks_exact(SLOT_BYTES)
        .map(|c| {
            let word = |i: usize| u32::from_ne_bytes([c[i], c[i + 1], c[i + 2], c[i + 3]]);
            let mut o = [0u8; 8];
            o.copy_from_slice(&c[8..16]);
            let offset = u64::from_ne_bytes(o);
            (offset != u64::MAX).then(|| StoreSlot {
                index: word(0),
                generation: word(4),
                offset,
            })
        })
        .collect()
}

/// Bytes the answer to `r` needs.
pub(super) fn reply_need(r: &StoreRequest) -> usize {
    match r {
        StoreRequest::Reserve { keys, .. } => keys.count as usize * SLOT_BYTES,
        _ => 0,
    }
}

/// The record and payload of `r`.
pub(super) fn encode(r: &StoreRequest) -> EncodedRequest<'_> {
    let (op, arg, count, bytes) = match r {
        StoreRequest::Namespace { name, value_size } => {
            (opcode::STORE_NAMESPACE, *value_size, 0, name.clone())
        }
        StoreRequest::Reserve { ns, keys } => (
            opcode::STORE_RESERVE,
            u64::from(*ns),
            keys.count,
            keys.bytes.clone(),
        ),
        StoreRequest::Commit { ns, slots } | StoreRequest::Abort { ns, slots } => {
            let op = if matches!(r, StoreRequest::Commit { .. }) {
                opcode::STORE_COMMIT
            } else {
                opcode::STORE_ABORT
            };
            let mut bytes = Vec::with_capacity(slots.len() * SLOT_BYTES);
            for s in slots {
                push_slot(&mut bytes, Some(s));
            }
            (op, u64::from(*ns), slots.len() as u32, bytes)
        }
        StoreRequest::Clear { ns } => (opcode::STORE_CLEAR, u64::from(*ns), 0, Vec::new()),
    };
    let mut e = EncodedRequest {
        record: WireRequest {
            op,
            arg,
            aux: [count, 0],
            ..WireRequest::default()
        },
        reply_need: reply_need(r).max(super::MIN_REPLY_WINDOW),
        tokens: &[],
        pages: &[],
        anchor_words: super::AnchorWords::default(),
        session: &[],
        bytes,
        ns: &[],
    };
    e.record.payload_len = e.payload_len() as u32;
    e
}

/// Whether `op` is a store op.
pub(super) fn is_store_op(op: u32) -> bool {
    matches!(
        op,
        opcode::STORE_NAMESPACE
            | opcode::STORE_RESERVE
            | opcode::STORE_COMMIT
            | opcode::STORE_ABORT
            | opcode::STORE_CLEAR
    )
}

/// Decodes a store request (`r.op` is a store op).
pub(super) fn decode<P: Payload + ?Sized>(
    r: &WireRequest,
    payload: &P,
) -> Result<StoreRequest, Rejection> {
    if r.n_tokens != 0 || r.n_pages != 0 || r.aux[1] != 0 || r.flags != 0 {
        return Err(malformed("a store request carries fields it does not take"));
    }
    let count = r.aux[0];
    if count > MAX_BATCH {
        return Err(malformed(format!("{count} keys in one store request")));
    }
    let ns = || u32::try_from(r.arg).map_err(|_| malformed("namespace id out of range"));
    let bytes = payload.bytes(0, payload.len())?;
    Ok(match r.op {
        opcode::STORE_NAMESPACE => {
            if count != 0 {
                return Err(malformed("a namespace request has no count"));
            }
            StoreRequest::Namespace {
                name: bytes,
                value_size: r.arg,
            }
        }
        opcode::STORE_RESERVE => StoreRequest::Reserve {
            ns: ns()?,
            keys: KeyList { bytes, count },
        },
        opcode::STORE_CLEAR => {
            if count != 0 || !bytes.is_empty() {
                return Err(malformed("a clear request carries only its namespace"));
            }
            StoreRequest::Clear { ns: ns()? }
        }
        _ => {
            if bytes.len() != count as usize * SLOT_BYTES {
                return Err(malformed("slot list length disagrees with its count"));
            }
            let slots = slots_of(&bytes)
                .into_iter()
                .map(|s| s.ok_or_else(|| malformed("an empty slot in a commit")))
                .collect::<Result<Vec<_>, _>>()?;
            if r.op == opcode::STORE_COMMIT {
                StoreRequest::Commit { ns: ns()?, slots }
            } else {
                StoreRequest::Abort { ns: ns()?, slots }
            }
        }
    })
}

/// Fills the reply record and payload of a store answer.
pub(super) fn encode_reply(w: &mut WireReply, r: &StoreReply, payload: &mut Vec<u8>) {
    match r {
        StoreReply::Namespace(ns) => {
            w.kind = kind::STORE_NAMESPACE;
            (w.a, w.b) = (u64::from(ns.id), ns.value_size);
        }
        StoreReply::Reserved(slots) => {
            w.kind = kind::STORE_RESERVED;
            for s in slots {
                push_slot(payload, s.as_ref());
            }
        }
        StoreReply::Done(n) => {
            w.kind = kind::STORE_DONE;
            w.a = *n;
        }
    }
}

/// Decodes a store answer (`w.kind` is a store kind).
pub(super) fn decode_reply(w: &WireReply, payload: &[u8]) -> Result<StoreReply, BadReply> {
    Ok(match w.kind {
        kind::STORE_NAMESPACE => StoreReply::Namespace(StoreNs {
            id: u32::try_from(w.a).map_err(|_| BadReply::BadField("namespace id"))?,
            value_size: w.b,
        }),
        kind::STORE_RESERVED => {
            if payload.len() % SLOT_BYTES != 0 {
                return Err(BadReply::BadField("slot list"));
            }
            StoreReply::Reserved(slots_of(payload))
        }
        _ => StoreReply::Done(w.a),
    })
}

/// Whether `k` is a store reply kind.
pub(super) fn is_store_kind(k: u32) -> bool {
    matches!(
        k,
        kind::STORE_NAMESPACE | kind::STORE_RESERVED | kind::STORE_DONE
    )
}
