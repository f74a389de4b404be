//! One request's answer: its payload copied once out of the scratch and
//! checked, the daemon's own requests (`bind`, `join`, the store,
//! `reset`) kept from the engine, the rest run on it, guarded (a rank's
//! stepped request as its group's step, posted on the group's board for
//! the other ranks), and the answer written to the reply window. Apart
//! from the ring it came from (`service`): this changes when a request's
//! routing does.

use radixd_ipc::Scratch;

use super::service::Service;
use super::{guarded, store};
use crate::engine::{ClientId, Engine};
use crate::group::{self, Groups};
use crate::op::{self, ErrorKind, Rejection, Request};
use crate::wire::{self, ScratchWindow, WireReply, WireRequest};

/// Answers one request record: copy its payload once out of the scratch,
/// check everything, apply it, and write the answer into the reply window
/// (or the record, when it is small).
pub(super) fn answer<R: crate::engine::Region>(
    engine: &mut Engine<R>,
    service: &mut Service<'_>,
    client: ClientId,
    scratch: &Scratch<'_>,
    record: &WireRequest,
    corrupt: &mut Option<String>,
    alone: &mut bool,
) -> WireReply {
    let Service {
        spare,
        out,
        allow_reset,
        binding,
        groups,
        boards,
        board_out,
        store: kv_store,
        live,
        free,
        ..
    } = service;
    let window_ok = record
        .reply_off
        .checked_add(record.reply_len)
        .is_some_and(|end| u64::from(end) <= scratch.len());
    let result = if !window_ok {
        Err(Rejection::new(
            ErrorKind::Malformed,
            "reply window lies outside the scratch area",
        ))
    } else {
        ScratchWindow::new(scratch, record.payload_off, record.payload_len)
            .map_err(|e| Rejection::new(ErrorKind::Malformed, format!("payload window: {e}")))
            .and_then(|window| wire::decode_request(record, &window, spare))
            .and_then(|request| {
                let need = wire::reply_need(&request, engine.page_size(), engine.capacity());
                if need > record.reply_len as usize {
                    return Err(Rejection::new(
                        ErrorKind::TooLarge,
                        format!(
                            "the answer needs {need} bytes, the window has {}",
                            record.reply_len
                        ),
                    ));
                }
                if let Request::Bind { pool } = &request {
                    // The daemon's own state, not the engine's.
                    let fresh = binding.identity().is_none();
                    let holders = binding.bind(client, pool)?;
                    if fresh {
                        // A binding starts from an empty tree: what is
                        // cached was cached under no buffer, or under one
                        // gone (see `crate::binding`).
                        if let Err(damage) = guarded(|| engine.drop_cached()) {
                            *corrupt = Some(damage);
                            return Err(Rejection::new(
                                ErrorKind::Protocol,
                                "the daemon found its engine corrupted and is stopping",
                            ));
                        }
                    }
                    return Ok(op::Reply::Bound { holders });
                }
                // A client that has not bound a bound pool may not fill it.
                binding.admits(client, &request)?;
                if let Request::Join(join) = &request {
                    let mut joined = groups.join(client, *alone, join, engine.page_size());
                    if let (Ok(op::Reply::Joined { joined, board, .. }), Some((index, _))) =
                        (&mut joined, groups.position(client))
                    {
                        if let Some(b) = boards.get(index as usize) {
                            // A new group: its board starts empty (nobody
                            // reads it before this answer names it).
                            if *joined == 1 {
                                b.reset();
                            }
                            *board = Some(index);
                        }
                    }
                    return joined;
                }
                if let Request::Store(r) = request {
                    let generation = (record.seq >> 32) as u32;
                    return store::answer(kv_store.as_mut(), client, generation, r);
                }
                if matches!(request, Request::Reset) && !*allow_reset {
                    // One client must not wipe every other scheduler's
                    // pages and locks unless the operator said so.
                    return Err(Rejection::new(
                        ErrorKind::NotPermitted,
                        "reset of the shared cache is off (start the daemon with --allow-reset)",
                    ));
                }
                let page = (engine.page_size(), engine.capacity());
                let mut run = |client, request| {
                    guarded(|| op::apply_with(engine, client, request, spare)).unwrap_or_else(
                        |damage| {
                            *corrupt = Some(damage);
                            Err(Rejection::new(
                                ErrorKind::Protocol,
                                "the daemon found its engine corrupted and is stopping",
                            ))
                        },
                    )
                };
                if !group::is_stepped(&request) {
                    return run(client, request);
                }
                // A rank's step is its group's (see `crate::group`).
                if let Some((index, rank)) = groups.position(client) {
                    let board = boards.get(index as usize).copied();
                    return step(
                        groups, board, index, rank, client, request, run, page, board_out,
                    );
                }
                *alone = true;
                run(client, request)
            })
    };
    // Before the answer goes: a counted one hands its client the counts.
    let counted = matches!(result, Ok(op::Reply::Counted { .. }));
    let who = u64::from(client) | (record.seq >> 32) << 32;
    free.answered(live, engine.free_counts(), who, counted);
    let room = if window_ok {
        record.reply_len as usize
    } else {
        0
    };
    let mut reply = wire::encode_reply(record.seq, &result, room, out);
    spare.keep_reply(result);
    if !out.is_empty()
        && scratch
            .write_bytes(u64::from(record.reply_off), out)
            .is_err()
    {
        reply.payload_len = 0;
    }
    reply
}

/// A rank's stepped request (see `crate::group`): first the steps the rank
/// took off its group's board count as done, then the step runs; a step it
/// led goes on the board for the other ranks to take, and the rank is told
/// where its steps stand.
#[allow(clippy::too_many_arguments)]
fn step(
    groups: &mut Groups,
    board: Option<&radixd_ipc::Board>,
    index: u32,
    rank: u32,
    client: ClientId,
    request: Request,
    run: impl FnOnce(ClientId, Request) -> Result<op::Reply, Rejection>,
    (page_size, capacity): (u32, u32),
    out: &mut Vec<u8>,
) -> Result<op::Reply, Rejection> {
    if let Some(b) = board {
        groups.catch_up(index, rank, b.taken(rank as usize));
    }
    let Some((result, led)) = groups.step_leading(client, request, run) else {
        return Err(Rejection::new(ErrorKind::Protocol, "no group"));
    };
    let Some(b) = board else {
        return result;
    };
    if let Some(s) = led {
        match groups.kept_request(index, s) {
            Some(kept) => {
                let e = wire::encode_request(kept, page_size, capacity);
                let reply = wire::encode_reply(0, &result, e.reply_need, out);
                b.publish(s, wire::digest(&e), wire::reply_words(&reply), out);
            }
            // Nobody else will take it.
            None => b.pass(s),
        }
    }
    if let Some(next) = groups.next_step(index, rank) {
        b.tell(rank as usize, next);
    }
    // Steps the others took off the board are dropped now and then.
    if groups.kept(index) > CATCH_UP_AT {
        groups.catch_up_all(index, |r| b.taken(r as usize));
    }
    result
}

/// Kept steps past which a group's ranks' board cursors are read.
const CATCH_UP_AT: usize = 256;

/// Every group's steps its ranks took off the board count as done.
pub(super) fn catch_up_all(groups: &mut Groups, boards: &[&radixd_ipc::Board]) {
    if groups.is_empty() {
        return;
    }
    // A board without a group is skipped by `catch_up_all`.
    for (index, b) in boards.iter().enumerate() {
        groups.catch_up_all(index as u32, |r| b.taken(r as usize));
    }
}
