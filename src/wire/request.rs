//! The daemon's side of a request: [`decode_request`] reads an untrusted
//! record and its payload, checks every field against the op it names, and
//! answers a typed [`Rejection`], never a panic. Apart from the encoder
//! because this is the code a hostile client aims at.

use super::payload::{Payload, Prefix};
use super::record::HINTS_BYTES;
use super::record::{opcode, WireRequest, FLAG_COUNTED, FLAG_HINTS, FLAG_LOCK, FLAG_NS};
use super::MAX_POOL_IDENTITY;
use super::{malformed, store};
use crate::engine::{Anchor, Handle, InsertHints};
use crate::group::{Join, MAX_GROUP_KEY};
use crate::op::{check_session_id, check_session_len, ErrorKind, Rejection, Request, Spare};

/// Decodes a request record (copied out of the ring) and its payload (the
/// scratch window the record names, read piece by piece).
///
/// Token and page lists come from `spare` (see [`Spare`]), so a warm server
/// decodes without allocating.
pub fn decode_request<P: Payload + ?Sized>(
    r: &WireRequest,
    payload: &P,
    spare: &mut Spare,
) -> Result<Request, Rejection> {
    if r.flags & FLAG_COUNTED != 0 {
        return decode_counted(r, payload, spare);
    }
    if r.flags & FLAG_NS != 0 {
        return decode_namespaced(r, payload, spare);
    }
    decode_hinted_or_op(r, payload, spare)
}

/// [`decode_request`] of a record without [`FLAG_COUNTED`] or [`FLAG_NS`]:
/// the insert's hints off the payload's end under [`FLAG_HINTS`], then the
/// op.
fn decode_hinted_or_op<P: Payload + ?Sized>(
    r: &WireRequest,
    payload: &P,
    spare: &mut Spare,
) -> Result<Request, Rejection> {
    if r.flags & FLAG_HINTS == 0 {
        return decode_op(r, payload, spare);
    }
    let len = payload.len();
    if len != r.payload_len as usize || len < HINTS_BYTES {
        return Err(malformed("insert hints outside the payload"));
    }
    let at = len - HINTS_BYTES;
    let mut words = spare.list();
    let read = payload.words(at, HINTS_BYTES / 4, &mut words);
    let w = |i: usize| u64::from(words.get(i).copied().unwrap_or(0));
    let hints = InsertHints {
        priority: (w(0) | w(1) << 32) as i64,
        inserted_len: w(2) | w(3) << 32,
    };
    spare.keep(words);
    read?;
    let inner = WireRequest {
        flags: r.flags & !FLAG_HINTS,
        payload_len: at as u32,
        ..*r
    };
    let request = decode_op(&inner, &Prefix { payload, len: at }, spare)?;
    if !request.takes_hints() {
        return Err(malformed(format!(
            "{} takes no insert hints",
            request.name()
        )));
    }
    Ok(Request::Hinted {
        hints,
        request: Box::new(request),
    })
}

/// A request with [`FLAG_COUNTED`]: the request as if it had none (a
/// namespaced one included), which must take a count.
fn decode_counted<P: Payload + ?Sized>(
    r: &WireRequest,
    payload: &P,
    spare: &mut Spare,
) -> Result<Request, Rejection> {
    let inner = WireRequest {
        flags: r.flags & !FLAG_COUNTED,
        ..*r
    };
    let request = decode_request(&inner, payload, spare)?;
    if !request.takes_count() {
        return Err(malformed(format!("{} takes no count", request.name())));
    }
    Ok(Request::Counted(Box::new(request)))
}

/// [`decode_request`] of a record without [`FLAG_NS`] (a namespace inside
/// a namespaced request is an unknown flag here).
fn decode_op<P: Payload + ?Sized>(
    r: &WireRequest,
    payload: &P,
    spare: &mut Spare,
) -> Result<Request, Rejection> {
    if r.flags & !FLAG_LOCK != 0 {
        return Err(malformed(format!("unknown request flags {:#x}", r.flags)));
    }
    if payload.len() != r.payload_len as usize {
        return Err(malformed("payload length disagrees with the record"));
    }
    if store::is_store_op(r.op) {
        return store::decode(r, payload).map(Request::Store);
    }
    let tokens_end = (r.n_tokens as usize).checked_mul(4);
    let pages_end = tokens_end
        .zip((r.n_pages as usize).checked_mul(4))
        .map(|(t, p)| t + p);
    let (Some(tokens_end), Some(pages_end)) = (tokens_end, pages_end) else {
        return Err(malformed("token or page count overflows"));
    };
    if pages_end > payload.len() {
        return Err(malformed(format!(
            "{} tokens and {} pages do not fit a {}-byte payload",
            r.n_tokens,
            r.n_pages,
            payload.len()
        )));
    }
    let list = |spare: &mut Spare, at: usize, n: u32| {
        let mut out = spare.list();
        payload.words(at, n as usize, &mut out).map(|()| out)
    };
    let tail = payload.len() - pages_end;
    let lock = r.flags & FLAG_LOCK != 0;
    let session = || -> Result<String, Rejection> {
        check_session_len(tail)?;
        let bytes = payload.bytes(pages_end, tail)?;
        check_session_id(&bytes).map(str::to_owned)
    };
    let exact = |tokens: bool, pages: bool, rest: bool| {
        let ok = (tokens || r.n_tokens == 0) && (pages || r.n_pages == 0) && (rest || tail == 0);
        if ok {
            Ok(())
        } else {
            Err(malformed("payload carries fields this op does not take"))
        }
    };
    let none = || exact(false, false, false);
    // The anchored ops' words after the pages: `words` of them exactly.
    let anchor_words = |spare: &mut Spare, words: &[usize]| -> Result<[u32; 2], Rejection> {
        let Some(&n) = words.iter().find(|&&n| n * 4 == tail) else {
            return Err(malformed(format!(
                "{tail} bytes after the pages, not an anchor's words"
            )));
        };
        let mut got = spare.list();
        let read = payload.words(pages_end, n, &mut got);
        let out = [got.first().copied(), got.get(1).copied()];
        spare.keep(got);
        read?;
        match out {
            [Some(m), h] => Ok([m, h.unwrap_or(0)]),
            _ => Err(malformed("short anchor words")),
        }
    };
    // The component ops' words after the pages: exactly `n` of them.
    let tail_words = |spare: &mut Spare, n: usize| -> Result<[u32; 4], Rejection> {
        if tail != n * 4 {
            return Err(malformed(format!(
                "{tail} bytes after the pages, not {n} words"
            )));
        }
        let mut got = spare.list();
        let read = payload.words(pages_end, n, &mut got);
        let mut out = [0; 4];
        for (o, w) in out.iter_mut().zip(&got) {
            *o = *w;
        }
        let short = got.len() != n;
        spare.keep(got);
        read?;
        if short {
            return Err(malformed("short words after the pages"));
        }
        Ok(out)
    };
    let anchor = || {
        let node = Handle::from_raw(r.arg);
        Anchor {
            node: node.index,
            generation: node.generation,
            version: r.aux[0],
            pages_into_node: r.aux[1],
        }
    };
    let anchored = matches!(r.op, opcode::MATCH_AT | opcode::INSERT_AT);
    if !anchored && r.aux != [0, 0] {
        return Err(malformed("aux words set on an op that takes none"));
    }
    let request = match r.op {
        opcode::ALLOC => none().map(|()| Request::Alloc { n: r.arg })?,
        opcode::FREE => {
            exact(false, true, false)?;
            Request::Free {
                pages: list(spare, tokens_end, r.n_pages)?,
            }
        }
        opcode::INSERT => {
            exact(true, true, false)?;
            Request::Insert {
                tokens: list(spare, 0, r.n_tokens)?,
                pages: list(spare, tokens_end, r.n_pages)?,
                lock,
            }
        }
        opcode::MATCH => {
            exact(true, false, false)?;
            Request::Match {
                tokens: list(spare, 0, r.n_tokens)?,
                lock,
            }
        }
        opcode::LOCK => none().map(|()| Request::Lock { handle: r.arg })?,
        opcode::UNLOCK => none().map(|()| Request::Unlock { handle: r.arg })?,
        opcode::EVICT => none().map(|()| Request::Evict { tokens: r.arg })?,
        opcode::SESSION_COMMIT => {
            exact(true, true, true)?;
            Request::SessionCommit {
                session: session()?,
                tokens: list(spare, 0, r.n_tokens)?,
                pages: list(spare, tokens_end, r.n_pages)?,
            }
        }
        opcode::SESSION_RELEASE => {
            exact(false, false, true)?;
            Request::SessionRelease {
                session: session()?,
            }
        }
        opcode::SESSION_STATUS => {
            exact(false, false, true)?;
            Request::SessionStatus {
                session: session()?,
            }
        }
        opcode::STATS => none().map(|()| Request::Stats)?,
        opcode::RESET => none().map(|()| Request::Reset)?,
        opcode::VALIDATE => none().map(|()| Request::Validate)?,
        opcode::MATCH_AT => {
            exact(false, false, true)?;
            let [matched_pages, hash] = anchor_words(spare, &[1, 2])?;
            let next_hash = (tail == 8).then_some(hash);
            Request::MatchAt {
                anchor: anchor(),
                matched_pages,
                next_hash,
                lock,
            }
        }
        opcode::INSERT_AT => {
            exact(true, true, true)?;
            let [matched_pages, _] = anchor_words(spare, &[1])?;
            Request::InsertAt {
                anchor: anchor(),
                matched_pages,
                tokens: list(spare, 0, r.n_tokens)?,
                pages: list(spare, tokens_end, r.n_pages)?,
                lock,
            }
        }
        opcode::MATCH_WITH => {
            exact(true, false, false)?;
            Request::MatchWith {
                tokens: list(spare, 0, r.n_tokens)?,
                lock,
            }
        }
        opcode::INSERT_WITH => {
            exact(true, true, true)?;
            let mamba_state = match tail {
                0 => None,
                _ => Some(tail_words(spare, 1)?[0]),
            };
            Request::InsertWith {
                tokens: list(spare, 0, r.n_tokens)?,
                pages: list(spare, tokens_end, r.n_pages)?,
                lock,
                mamba_state,
                swa_evicted: r.arg,
            }
        }
        opcode::EVICT_COMPONENTS => {
            exact(false, false, true)?;
            let [s0, s1, m0, m1] = tail_words(spare, 4)?;
            Request::EvictComponents {
                tokens: r.arg,
                swa_tokens: u64::from(s0) | u64::from(s1) << 32,
                mamba_states: u64::from(m0) | u64::from(m1) << 32,
            }
        }
        opcode::ALLOC_STATE => none().map(|()| Request::AllocState)?,
        opcode::FREE_STATE => none().map(|()| Request::FreeState { state: r.arg })?,
        opcode::FREE_SWA => {
            exact(false, true, false)?;
            Request::FreeSwa {
                pages: list(spare, tokens_end, r.n_pages)?,
            }
        }
        opcode::STATS_WITH => none().map(|()| Request::StatsWith)?,
        opcode::SWA_PAGES => {
            exact(false, true, false)?;
            Request::SwaPages {
                pages: list(spare, tokens_end, r.n_pages)?,
            }
        }
        opcode::BIND => {
            exact(false, false, true)?;
            // The length is checked before anything is copied; what the
            // bytes say, `binding::Binding::bind` checks.
            if tail > MAX_POOL_IDENTITY {
                return Err(malformed(format!(
                    "a pool identity of {tail} bytes is over the limit of {MAX_POOL_IDENTITY}"
                )));
            }
            let bytes = payload.bytes(pages_end, tail)?;
            let pool =
                String::from_utf8(bytes).map_err(|_| malformed("pool identity is not UTF-8"))?;
            Request::Bind { pool }
        }
        opcode::NAMESPACE => {
            exact(false, false, true)?;
            Request::Namespace {
                name: namespace_name(payload, pages_end, tail)?,
            }
        }
        opcode::WALK => {
            exact(true, false, false)?;
            Request::Walk {
                tokens: list(spare, 0, r.n_tokens)?,
            }
        }
        opcode::ALLOC_PAIRED => none().map(|()| Request::AllocPaired { n: r.arg })?,
        opcode::LOCK_PAIRED => {
            exact(false, true, false)?;
            Request::LockPaired {
                handle: r.arg,
                pages: list(spare, tokens_end, r.n_pages)?,
            }
        }
        opcode::INSERT_PAIRED => {
            exact(true, true, true)?;
            // The tail's page count, then the state slot when there is one.
            let n = match tail {
                4 => 1,
                _ => 2,
            };
            let [tail_pages, state, ..] = tail_words(spare, n)?;
            Request::InsertPaired {
                tokens: list(spare, 0, r.n_tokens)?,
                pages: list(spare, tokens_end, r.n_pages)?,
                lock,
                mamba_state: (n == 2).then_some(state),
                swa_evicted: r.arg,
                tail: tail_pages,
            }
        }
        opcode::ALLOC_STATES => none().map(|()| Request::AllocStates { n: r.arg })?,
        opcode::EVICT_LEAF => none().map(|()| Request::EvictLeaf)?,
        opcode::FREE_STATES => {
            exact(false, true, false)?;
            Request::FreeStates {
                states: list(spare, tokens_end, r.n_pages)?,
            }
        }
        opcode::JOIN => {
            exact(false, false, true)?;
            // The page size's word, then the key: its length checked
            // before it is copied; what it says, `group::Groups::join`.
            let key_len = tail
                .checked_sub(4)
                .ok_or_else(|| malformed("join without a page size"))?;
            if key_len > MAX_GROUP_KEY {
                return Err(malformed(format!(
                    "a group key of {key_len} bytes is over the limit of {MAX_GROUP_KEY}"
                )));
            }
            let mut word = spare.list();
            let read = payload.words(pages_end, 1, &mut word);
            let page_size = word.first().copied();
            spare.keep(word);
            read?;
            let bytes = payload.bytes(pages_end + 4, key_len)?;
            let group =
                String::from_utf8(bytes).map_err(|_| malformed("group key is not UTF-8"))?;
            Request::Join(Join {
                group,
                rank: r.arg as u32,
                size: (r.arg >> 32) as u32,
                page_size: page_size.ok_or_else(|| malformed("join without a page size"))?,
            })
        }
        op => {
            return Err(Rejection::new(
                ErrorKind::UnknownOp,
                format!("unknown opcode {op}"),
            ))
        }
    };
    let lockable = matches!(
        request,
        Request::Insert { .. }
            | Request::Match { .. }
            | Request::MatchAt { .. }
            | Request::InsertAt { .. }
            | Request::MatchWith { .. }
            | Request::InsertWith { .. }
            | Request::InsertPaired { .. }
    );
    if lock && !lockable {
        return Err(malformed("only insert and match take a lock flag"));
    }
    // `arg` only on the ops that take it (see `WireRequest::arg`): a value
    // the op would ignore is refused, never answered as if it were not there.
    let takes_arg = matches!(
        request,
        Request::Alloc { .. }
            | Request::Lock { .. }
            | Request::Unlock { .. }
            | Request::Evict { .. }
            | Request::MatchAt { .. }
            | Request::InsertAt { .. }
            | Request::InsertWith { .. }
            | Request::EvictComponents { .. }
            | Request::FreeState { .. }
            | Request::Join(_)
            | Request::AllocPaired { .. }
            | Request::LockPaired { .. }
            | Request::InsertPaired { .. }
            | Request::AllocStates { .. }
    );
    if r.arg != 0 && !takes_arg {
        return Err(malformed("arg set on an op that takes none"));
    }
    Ok(request)
}

/// A namespace's name: `len` bytes of UTF-8 at `at`, its length checked
/// before it is copied.
fn namespace_name<P: Payload + ?Sized>(
    payload: &P,
    at: usize,
    len: usize,
) -> Result<String, Rejection> {
    crate::engine::check_namespace_len(len)?;
    let bytes = payload.bytes(at, len)?;
    String::from_utf8(bytes).map_err(|_| malformed("namespace name is not UTF-8"))
}

/// A request with [`FLAG_NS`]: the name off the payload's end, then the
/// request as if it had none.
fn decode_namespaced<P: Payload + ?Sized>(
    r: &WireRequest,
    payload: &P,
    spare: &mut Spare,
) -> Result<Request, Rejection> {
    let len = r.aux[0] as usize;
    if r.aux[1] != 0 || len > payload.len() || payload.len() != r.payload_len as usize {
        return Err(malformed("namespace name outside the payload"));
    }
    let at = payload.len() - len;
    let ns = namespace_name(payload, at, len)?;
    let inner = WireRequest {
        flags: r.flags & !FLAG_NS,
        aux: [0, 0],
        payload_len: at as u32,
        ..*r
    };
    let request = decode_hinted_or_op(&inner, &Prefix { payload, len: at }, spare)?;
    if !request.takes_namespace() {
        return Err(malformed(
            "only match, insert and session_commit take a namespace",
        ));
    }
    Ok(Request::Namespaced {
        ns,
        request: Box::new(request),
    })
}
