//! Answers on the wire: [`encode_reply`], the daemon's side (a record, a
//! payload of at most [`INLINE_BYTES`] inside it, an error message cut to
//! the room), and [`decode_reply`], the client's side, whose [`BadReply`]
//! names a reply the daemon should never have sent.

use super::payload::{push_u32s, u32s};
use super::record::{
    kind, WireReply, FLAG_COUNTED, FLAG_EXTRA, FLAG_HANDLE, FLAG_INLINE, FLAG_LOCK, FREE_BYTES,
};
use super::record::{STATS_BYTES, STATS_WITH_BYTES};
use super::{store, BadReply, INLINE_BYTES, MAX_ERROR_MESSAGE};
use crate::engine::{ComponentStats, FreeCounts, Stats};
use crate::op::{ErrorKind, Rejection, Reply};

/// Encodes an answer into a reply record and `payload` (cleared first),
/// the bytes for its window of `room` bytes; a payload of at most
/// [`INLINE_BYTES`] goes into the record instead, leaving `payload` empty.
/// Only an error message can outgrow a window whose room was checked
/// against [`reply_need`](super::reply_need): it is cut to the room (at most
/// [`MAX_ERROR_MESSAGE`]), never inside a character.
pub fn encode_reply(
    seq: u64,
    result: &Result<Reply, Rejection>,
    room: usize,
    payload: &mut Vec<u8>,
) -> WireReply {
    let mut w = WireReply {
        seq,
        ..WireReply::default()
    };
    payload.clear();
    match result {
        Err(rejection) => {
            w.status = rejection.kind as u32;
            let message = utf8_prefix(&rejection.message, room.min(MAX_ERROR_MESSAGE));
            payload.extend_from_slice(message.as_bytes());
        }
        Ok(reply) => encode_answer(&mut w, reply, payload),
    }
    w.payload_len = payload.len() as u32;
    if payload.len() <= INLINE_BYTES {
        w.flags |= FLAG_INLINE;
        w.inline[..payload.len()].copy_from_slice(payload);
        payload.clear();
    }
    w
}

/// The record's fields and the payload (appended) of a successful answer.
fn encode_answer(w: &mut WireReply, reply: &Reply, payload: &mut Vec<u8>) {
    match reply {
        Reply::Pages(pages) => {
            w.kind = kind::PAGES;
            push_u32s(payload, pages);
        }
        Reply::SwaPages(pages) => {
            w.kind = kind::SWA_PAGES;
            push_u32s(payload, pages);
        }
        Reply::Done => w.kind = kind::DONE,
        Reply::Locked(handle) => {
            w.kind = kind::LOCKED;
            w.a = *handle;
        }
        Reply::Inserted {
            cached,
            len,
            handle,
            locked,
        } => {
            w.kind = kind::INSERTED;
            (w.a, w.b) = (*cached, *len);
            set_handle(w, *handle, *locked);
        }
        Reply::Matched { len, pages, handle } => {
            w.kind = kind::MATCHED;
            w.a = *len;
            set_handle(w, *handle, false);
            push_u32s(payload, pages);
        }
        Reply::Evicted(tokens) => {
            w.kind = kind::EVICTED;
            w.a = *tokens;
        }
        Reply::EvictedLeaf { handle, tokens } => {
            w.kind = kind::EVICTED_LEAF;
            w.a = *tokens;
            set_handle(w, *handle, false);
        }
        Reply::Session {
            resident_tokens,
            idle_ms,
        } => {
            w.kind = kind::SESSION;
            (w.a, w.b) = (*resident_tokens, *idle_ms);
        }
        Reply::Stats { stats: s, sessions } => {
            w.kind = kind::STATS;
            for x in s.to_array().into_iter().chain([*sessions]) {
                payload.extend_from_slice(&x.to_ne_bytes());
            }
        }
        Reply::MatchedWith {
            len,
            pages,
            handle,
            full_len,
            mamba_state,
        } => {
            w.kind = kind::MATCHED_WITH;
            (w.a, w.b) = (*len, *full_len);
            set_handle(w, *handle, false);
            push_u32s(payload, pages);
            if let Some(state) = mamba_state {
                w.flags |= FLAG_EXTRA;
                payload.extend_from_slice(&state.to_ne_bytes());
            }
        }
        Reply::InsertedWith {
            cached,
            len,
            handle,
            locked,
            mamba_exist,
        } => {
            w.kind = kind::INSERTED_WITH;
            (w.a, w.b) = (*cached, *len);
            set_handle(w, *handle, *locked);
            if *mamba_exist {
                w.flags |= FLAG_EXTRA;
            }
        }
        Reply::EvictedComponents {
            tokens,
            swa_tokens,
            mamba_states,
        } => {
            w.kind = kind::EVICTED_COMPONENTS;
            (w.a, w.b, w.c) = (*tokens, *swa_tokens, *mamba_states);
        }
        Reply::State { state } => {
            w.kind = kind::STATE;
            w.a = u64::from(*state);
        }
        Reply::SwaFreed { n } => {
            w.kind = kind::SWA_FREED;
            w.a = *n;
        }
        Reply::Store(r) => store::encode_reply(w, r, payload),
        Reply::Namespace { id } => {
            w.kind = kind::NAMESPACE;
            w.a = u64::from(*id);
        }
        Reply::StatsWith {
            stats: s,
            sessions,
            components,
        } => {
            w.kind = kind::STATS_WITH;
            let figures = components.as_ref().map(ComponentStats::to_array);
            if figures.is_some() {
                w.flags |= FLAG_EXTRA;
            }
            let all = s.to_array().into_iter().chain([*sessions]);
            for x in all.chain(figures.into_iter().flatten()) {
                payload.extend_from_slice(&x.to_ne_bytes());
            }
        }
        Reply::Bound { holders } => {
            w.kind = kind::BOUND;
            w.a = *holders;
        }
        Reply::Joined {
            joined,
            size,
            board,
        } => {
            w.kind = kind::JOINED;
            (w.a, w.b) = (u64::from(*joined), u64::from(*size));
            w.c = board.map_or(u64::MAX, u64::from);
        }
        Reply::PagesPaired { pages, swa_pages } => {
            w.kind = kind::PAGES_PAIRED;
            w.a = pages.len() as u64;
            push_u32s(payload, pages);
            push_u32s(payload, swa_pages);
        }
        Reply::LockedPaired {
            lock,
            delta,
            swa_pages,
        } => {
            w.kind = kind::LOCKED_PAIRED;
            (w.a, w.b) = (*lock, *delta as u64);
            push_u32s(payload, swa_pages);
        }
        Reply::InsertedPaired {
            cached,
            len,
            handle,
            locked,
            mamba_exist,
            pages,
            swa_pages,
        } => {
            w.kind = kind::INSERTED_PAIRED;
            (w.a, w.b) = (*cached, *len);
            set_handle(w, *handle, *locked);
            if *mamba_exist {
                w.flags |= FLAG_EXTRA;
            }
            // The key's page count first: the SWA peers follow its pages.
            push_u32s(payload, &[pages.len() as u32]);
            push_u32s(payload, pages);
            push_u32s(payload, swa_pages);
        }
        Reply::States(states) => {
            w.kind = kind::STATES;
            push_u32s(payload, states);
        }
        Reply::Counted { reply, free } => {
            encode_answer(w, reply, payload);
            w.flags |= FLAG_COUNTED;
            for x in free.to_array() {
                payload.extend_from_slice(&x.to_ne_bytes());
            }
        }
    }
}

/// Where a reply's payload is: `Some(bytes)` in the record itself, `None`
/// in the request's reply window (`payload_len` bytes at its start).
pub fn inline_payload(w: &WireReply) -> Result<Option<&[u8]>, BadReply> {
    if w.flags & FLAG_INLINE == 0 {
        return Ok(None);
    }
    w.inline
        .get(..w.payload_len as usize)
        .map(Some)
        .ok_or(BadReply::PayloadLength)
}

/// Bit 0 of `flags`: the request asked for a lock; [`FLAG_HANDLE`]: `c` is
/// the handle.
fn set_handle(w: &mut WireReply, handle: Option<u64>, locked: bool) {
    if locked {
        w.flags |= FLAG_LOCK;
    }
    if let Some(h) = handle {
        w.flags |= FLAG_HANDLE;
        w.c = h;
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a
/// character boundary.
pub(super) fn utf8_prefix(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Decodes a reply record and the bytes of its window (ignored when the
/// payload is inline, see [`inline_payload`]).
pub fn decode_reply(w: &WireReply, window: &[u8]) -> Result<Result<Reply, Rejection>, BadReply> {
    let payload = inline_payload(w)?.unwrap_or(window);
    if payload.len() != w.payload_len as usize {
        return Err(BadReply::PayloadLength);
    }
    if w.status != 0 {
        let kind = ErrorKind::from_code(w.status).ok_or(BadReply::UnknownError(w.status))?;
        return Ok(Err(Rejection::new(kind, String::from_utf8_lossy(payload))));
    }
    decode_answer(w, payload).map(Ok)
}

/// The successful answer of record `w` whose payload is `payload`.
fn decode_answer(w: &WireReply, payload: &[u8]) -> Result<Reply, BadReply> {
    if w.flags & FLAG_COUNTED != 0 {
        // The counts are the payload's last bytes, after the answer's own.
        let at = payload
            .len()
            .checked_sub(FREE_BYTES)
            .ok_or(BadReply::BadField("free counts"))?;
        let (own, counts) = payload.split_at(at);
        let mut free = [0u64; FreeCounts::LEN];
        for (v, b) in free.iter_mut().zip(counts.chunks_exact(8)) {
            *v = u64::from_ne_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
        }
        let inner = WireReply {
            flags: w.flags & !FLAG_COUNTED,
            payload_len: own.len() as u32,
            ..*w
        };
        return Ok(Reply::Counted {
            reply: Box::new(decode_answer(&inner, own)?),
            free: FreeCounts::from_array(free),
        });
    }
    let handle = (w.flags & FLAG_HANDLE != 0).then_some(w.c);
    let locked = w.flags & FLAG_LOCK != 0;
    let extra = w.flags & FLAG_EXTRA != 0;
    let words = || {
        if payload.len() % 4 == 0 {
            Ok(u32s(payload))
        } else {
            Err(BadReply::RaggedPages)
        }
    };
    // The engine's figures and the sessions count, from the payload's start.
    let figures = |payload: &[u8]| {
        let mut x = [0u64; Stats::LEN + 1];
        for (v, c) in x.iter_mut().zip(payload.chunks_exact(8)) {
            *v = u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        }
        let mut figures = [0u64; Stats::LEN];
        figures.copy_from_slice(&x[..Stats::LEN]);
        (Stats::from_array(figures), x[Stats::LEN])
    };
    Ok(match w.kind {
        kind::PAGES => Reply::Pages(words()?),
        kind::SWA_PAGES => Reply::SwaPages(words()?),
        kind::DONE => Reply::Done,
        kind::LOCKED => Reply::Locked(w.a),
        kind::INSERTED => Reply::Inserted {
            cached: w.a,
            len: w.b,
            handle,
            locked,
        },
        kind::MATCHED => Reply::Matched {
            len: w.a,
            pages: words()?,
            handle,
        },
        kind::EVICTED => Reply::Evicted(w.a),
        kind::EVICTED_LEAF => Reply::EvictedLeaf {
            handle,
            tokens: w.a,
        },
        kind::SESSION => Reply::Session {
            resident_tokens: w.a,
            idle_ms: w.b,
        },
        kind::STATS => {
            if payload.len() != STATS_BYTES {
                return Err(BadReply::StatsSize(payload.len()));
            }
            let (stats, sessions) = figures(payload);
            Reply::Stats { stats, sessions }
        }
        kind::MATCHED_WITH => {
            let mut pages = words()?;
            let mamba_state = if extra {
                Some(pages.pop().ok_or(BadReply::BadField("state word"))?)
            } else {
                None
            };
            Reply::MatchedWith {
                len: w.a,
                pages,
                handle,
                full_len: w.b,
                mamba_state,
            }
        }
        kind::INSERTED_WITH => Reply::InsertedWith {
            cached: w.a,
            len: w.b,
            handle,
            locked,
            mamba_exist: extra,
        },
        kind::EVICTED_COMPONENTS => Reply::EvictedComponents {
            tokens: w.a,
            swa_tokens: w.b,
            mamba_states: w.c,
        },
        kind::STATE => Reply::State {
            state: u32::try_from(w.a).map_err(|_| BadReply::BadField("state slot"))?,
        },
        kind::SWA_FREED => Reply::SwaFreed { n: w.a },
        kind::NAMESPACE => Reply::Namespace {
            id: u32::try_from(w.a).map_err(|_| BadReply::BadField("namespace id"))?,
        },
        kind::STATS_WITH => {
            let want = if extra { STATS_WITH_BYTES } else { STATS_BYTES };
            if payload.len() != want {
                return Err(BadReply::StatsSize(payload.len()));
            }
            let (stats, sessions) = figures(payload);
            let components = extra.then(|| {
                let mut c = [0u64; ComponentStats::LEN];
                for (v, b) in c.iter_mut().zip(payload[STATS_BYTES..].chunks_exact(8)) {
                    *v = u64::from_ne_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
                }
                ComponentStats::from_array(c)
            });
            Reply::StatsWith {
                stats,
                sessions,
                components,
            }
        }
        kind::BOUND => Reply::Bound { holders: w.a },
        kind::JOINED => Reply::Joined {
            joined: u32::try_from(w.a).map_err(|_| BadReply::BadField("ranks joined"))?,
            size: u32::try_from(w.b).map_err(|_| BadReply::BadField("group size"))?,
            board: match w.c {
                u64::MAX => None,
                c => Some(u32::try_from(c).map_err(|_| BadReply::BadField("group board"))?),
            },
        },
        k if store::is_store_kind(k) => Reply::Store(store::decode_reply(w, payload)?),
        kind::PAGES_PAIRED => {
            let mut pages = words()?;
            let n = usize::try_from(w.a).map_err(|_| BadReply::BadField("page count"))?;
            // The SWA peers follow the pages: one each, or none.
            if n > pages.len() || !(pages.len() == n || pages.len() == 2 * n) {
                return Err(BadReply::BadField("page count"));
            }
            let swa_pages = pages.split_off(n);
            Reply::PagesPaired { pages, swa_pages }
        }
        kind::LOCKED_PAIRED => Reply::LockedPaired {
            lock: w.a,
            delta: w.b as i64,
            swa_pages: words()?,
        },
        kind::INSERTED_PAIRED => {
            let mut words = words()?;
            let n = match words.first() {
                Some(&n) if (n as usize) < words.len() => n as usize,
                _ => return Err(BadReply::BadField("page count")),
            };
            let swa_pages = words.split_off(1 + n);
            words.remove(0);
            Reply::InsertedPaired {
                cached: w.a,
                len: w.b,
                handle,
                locked,
                mamba_exist: extra,
                pages: words,
                swa_pages,
            }
        }
        kind::STATES => Reply::States(words()?),
        k => return Err(BadReply::UnknownKind(k)),
    })
}
