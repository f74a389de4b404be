//! Serving one slot's ring: up to a batch of requests a round, one in
//! [`TIME_EVERY`] timed, all counted, and the deferral of a request that
//! must wait (an `alloc` for pages readers hold, a rank for its group's
//! slowest). Apart from the loop that visits the slots (`daemon`), from
//! what one request's answer is (`answer`) and from the state kept between
//! requests (`service`).

use std::time::Instant;

use super::answer::{answer, catch_up_all};
use super::peer::{client_id, Deferred, Peer, Wait};
use super::service::Service;
use super::TIME_EVERY;
use crate::engine::Engine;
use crate::group;
use crate::op::ErrorKind;
use crate::shared::bucket_of;
use crate::wire;

/// Requests answered per slot per round.
const BATCH: usize = 16;

/// Whether an `alloc` of `want` pages falls short only because readers
/// hold pages in limbo: free and held together would do.
fn held_back<R: crate::engine::Region>(engine: &Engine<R>, want: u64) -> bool {
    let free = engine.stats().free_pages;
    let held = u64::from(engine.in_limbo().0);
    free < want && free + held >= want
}

/// Answers up to [`BATCH`] requests of one active slot; returns how many.
pub(super) fn drain<R: crate::engine::Region>(
    engine: &mut Engine<R>,
    service: &mut Service<'_>,
    peer: &mut Peer<'_>,
    index: u32,
    word: impl Fn(u32) -> Option<(u32, u32)>,
) -> usize {
    if let Some(reply) = peer.pending.take() {
        if let Err(reply) = peer.replies.push(reply) {
            // A client that does not read its answers, or that wrote an
            // impossible cursor: the latter is ignored until claimed anew.
            peer.broken = peer.replies.is_corrupt();
            peer.pending = Some(reply);
            return 0;
        }
        peer.doorbell.ring();
    }
    let (mut answered, mut popped) = (0, 0);
    // Dropped records count too, so a ring refilled with them still yields.
    while answered < BATCH && popped < 2 * BATCH {
        popped += 1;
        let (record, retry) = match peer.deferred.take() {
            Some(d) => {
                let blocked = match d.why {
                    Wait::Readers => held_back(engine, wire::alloc_count(&d.record).unwrap_or(0)),
                    Wait::Group => {
                        catch_up_all(&mut service.groups, &service.boards);
                        service.groups.lagging(client_id(index))
                    }
                };
                if blocked && Instant::now() < d.until {
                    peer.deferred = Some(d);
                    break;
                }
                (d.record, Some((d.why, d.until)))
            }
            None => match peer.requests.pop() {
                Some(record) => (record, None),
                None => break,
            },
        };
        // SYNC POINT: re-read the slot word after the pop (Acquire in
        // `SlotTable::word`, pairing with the client's Release in
        // `release`): a record whose client has released the slot since is
        // dropped unanswered, and so is one stamped with another claim's
        // generation (`seq >> 32`). The ring cannot hold the next holder's
        // records: it is reset, and the claim activated, only in `adopt`,
        // never while a pop is in flight.
        let generation = (record.seq >> 32) as u32;
        match word(index) {
            Some(w) if peer.tenancy.admits(w, generation) => {}
            Some(w) if peer.tenancy.serves(w) => continue,
            _ => break,
        }
        // One request in `TIME_EVERY` is timed: the histogram's shape is
        // the same, and the clock stays off most requests' path.
        let start = (service.tally.requests % TIME_EVERY == 0).then(Instant::now);
        let reply = answer(
            engine,
            service,
            client_id(index),
            &peer.scratch,
            &record,
            &mut peer.corrupt,
            &mut peer.alone,
        );
        // An `alloc` that evicted pages readers still hold waits for them
        // (the grace period, at most until the readers are expired) rather
        // than fail as if the cache were locked full: other slots are
        // served meanwhile, and this one reads nothing more until then.
        let short = reply.status == ErrorKind::InsufficientPages as u32;
        let held = short && wire::alloc_count(&record).is_some_and(|want| held_back(engine, want));
        if held && retry.is_none() {
            peer.deferred = Some(Deferred {
                record,
                until: Instant::now() + service.reader_wait,
                why: Wait::Readers,
            });
            break;
        }
        // A rank too far ahead of its group waits for the slowest rank
        // (nothing changed), up to `group::LAG_WAIT` from its first try.
        if reply.status == ErrorKind::GroupLag as u32 {
            let now = Instant::now();
            let until = match retry {
                Some((Wait::Group, until)) => until,
                _ => now + group::LAG_WAIT,
            };
            if now < until {
                peer.deferred = Some(Deferred {
                    record,
                    until,
                    why: Wait::Group,
                });
                break;
            }
        }
        let tally = &mut service.tally;
        tally.held_by_readers += u64::from(held);
        if let Some(start) = start {
            let ns = start.elapsed().as_nanos().try_into().unwrap_or(u64::MAX);
            tally.service_ns[bucket_of(ns)] += 1;
        }
        tally.requests += 1;
        tally.rejected += u64::from(reply.status != 0);
        answered += 1;
        if let Err(reply) = peer.replies.push(reply) {
            peer.broken = peer.replies.is_corrupt();
            peer.pending = Some(reply);
            break;
        }
    }
    if answered > 0 {
        peer.doorbell.ring();
    }
    answered
}
