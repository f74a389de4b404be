//! A client slot as the daemon sees it ([`Peer`]) and its life cycle:
//! adopting a new claim (the hand-over protocol of `radixd_ipc::slots`,
//! daemon side), the liveness sweep, and releasing what a client that has
//! gone held (locks, sessions, pages, the pool's binding, its group rank).
//! Apart from the serving: this changes when clients come and go
//! differently, not when requests do.

use std::time::Instant;

use radixd_ipc::{
    Consumer, Doorbell, Producer, ReaderSlot, RegionError, Scratch, Segment, SlotLocks, SlotTable,
    Tenancy,
};

use super::{guarded, store, ServeError, SWEEP};
use crate::binding::{Binding, Released};
use crate::engine::{ClientId, Engine};
use crate::group::Groups;
use crate::shared::{LiveStats, SharedLayout};
use crate::wire::{WireReply, WireRequest};

/// A request the daemon answers later (see `Peer::deferred`).
pub(super) struct Deferred {
    pub(super) record: WireRequest,
    pub(super) until: Instant,
    pub(super) why: Wait,
}

/// What a deferred request waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wait {
    /// Pages readers hold (an `alloc`).
    Readers,
    /// The slowest rank of the client's group (see `crate::group`).
    Group,
}

/// One client slot as the daemon sees it.
pub(super) struct Peer<'s> {
    pub(super) requests: Consumer<'s, WireRequest>,
    pub(super) replies: Producer<'s, WireReply>,
    pub(super) doorbell: &'s Doorbell,
    pub(super) scratch: Scratch<'s>,
    /// Which claim the daemon adopted and serves (see `radixd_ipc::Tenancy`).
    pub(super) tenancy: Tenancy,
    /// Whether the slot word was the served claim at the last look.
    pub(super) serving: bool,
    /// Earliest time of the next liveness probe of a slot whose word moved
    /// away from the served claim without a new claim (rate limit).
    next_probe: Instant,
    /// A reply that found the ring full; nothing more is read until it goes.
    pub(super) pending: Option<WireReply>,
    /// A request waiting (an `alloc` for evicted pages that readers still
    /// hold, a group's rank for its slowest rank), and until when it waits;
    /// nothing more is read until it is answered.
    pub(super) deferred: Option<Deferred>,
    /// The client has made stepped requests on its own (so it cannot join
    /// a group: see `group::Groups::join`).
    pub(super) alone: bool,
    /// The ring was found corrupt: ignored until the slot is claimed anew.
    pub(super) broken: bool,
    /// The engine stopped at corrupt shared data while serving this slot.
    pub(super) corrupt: Option<String>,
    /// The slot's reader announcement, cleared when its client is gone.
    reader: &'s ReaderSlot,
}

pub(super) fn peer<'s>(
    segment: &'s Segment,
    layout: &SharedLayout,
    readers: &'s [ReaderSlot],
    index: u32,
) -> Result<Peer<'s>, ServeError> {
    let reader =
        readers
            .get(index as usize)
            .ok_or(ServeError::Region(RegionError::NoSuchClient {
                index,
                clients: readers.len() as u32,
            }))?;
    let block = segment
        .client_block(&layout.ipc, index)
        .map_err(ServeError::Region)?;
    // SAFETY: the daemon is the only consumer of every request ring and the
    // only producer of every response ring, and builds one view of each.
    let requests = unsafe { Consumer::new(block.request_header, block.request_slots) }
        .map_err(ServeError::Ring)?;
    // SAFETY: as above.
    let replies = unsafe { Producer::new(block.response_header, block.response_slots) }
        .map_err(ServeError::Ring)?;
    Ok(Peer {
        requests,
        replies,
        doorbell: block.response_doorbell,
        scratch: block.scratch,
        tenancy: Tenancy::new(),
        serving: false,
        next_probe: Instant::now(),
        pending: None,
        deferred: None,
        alone: false,
        broken: false,
        corrupt: None,
        reader,
    })
}

/// The engine's name for the client in slot `index`. A slot's resources are
/// released before the slot can be claimed again, so the index suffices.
pub(super) fn client_id(index: u32) -> ClientId {
    index
}

/// Keeps the peer in step with the slot word (the hand-over protocol of
/// `radixd_ipc::slots`, daemon side); returns whether the slot is served.
///
/// A new claim (CLAIMED) is adopted here, between two drains, so no pop is
/// in flight: the previous client's holdings are released, both rings
/// reset, then ACTIVE is published. A word that moved away from the served
/// claim otherwise (released, or a stray write) stops the serving at once,
/// but releases what the client holds only when its liveness lock is free
/// (probed at most every [`SWEEP`]).
pub(super) fn adopt<R: crate::engine::Region, L: SlotLocks>(
    engine: &mut Engine<R>,
    peer: &mut Peer<'_>,
    slots: &SlotTable<'_, L>,
    index: u32,
    word: (u32, u32),
    live: &LiveStats,
    mut holds: Holds<'_, '_>,
) -> bool {
    if peer.tenancy.serves(word) {
        return true;
    }
    let probe = peer.tenancy.owner().is_some() && {
        let now = Instant::now();
        let due = now >= peer.next_probe;
        if due {
            peer.next_probe = now + SWEEP;
        }
        due
    };
    let Peer {
        tenancy,
        requests,
        replies,
        pending,
        deferred,
        alone,
        broken,
        corrupt,
        reader,
        ..
    } = peer;
    let before = tenancy.owner();
    let mut kv_store = holds.store.take();
    let served = tenancy.settle(
        slots,
        index,
        word,
        probe,
        &mut || {
            reader.clear();
            if let Err(damage) = forget(engine, index, live, &mut holds) {
                *corrupt = Some(damage);
            }
        },
        &mut || {
            // Only this thread pops the request ring and pushes the reply
            // ring, and it is not inside `drain` now; the client does not
            // touch them before it sees ACTIVE.
            requests.reset();
            replies.reset();
            *pending = None;
            *deferred = None;
            *alone = false;
            *broken = false;
            // Before the client sees its claim served: it reads the store
            // only after that.
            store::claimed(kv_store.as_deref_mut(), index);
        },
    );
    if served && tenancy.owner() != before {
        // Counted here, before the client's first request is answered, so
        // `stat` never misses a client that has had an answer.
        LiveStats::bump(&live.clients, 1);
    }
    served
}

/// Drops whatever the client that held slot `index` holds, and stops
/// counting it as connected. Called by `Tenancy` only for a slot it had
/// adopted, once its holder is provably gone. `Err` names corrupt shared
/// data the engine met on the way (see `guarded`).
///
/// The last holder of the pool's binding leaving unbinds it, and the tree
/// is emptied (`Engine::drop_cached`: every client's locks and sessions,
/// then every cached prefix, evicted as `evict` evicts): the KV they index
/// lived in the buffer that went with its last holder.
fn forget<R: crate::engine::Region>(
    engine: &mut Engine<R>,
    index: u32,
    live: &LiveStats,
    holds: &mut Holds<'_, '_>,
) -> Result<(), String> {
    LiveStats::bump(&live.clients, -1);
    guarded(|| engine.release_client(client_id(index)))?;
    // The last connected rank of a group takes the group's holdings with
    // it, as a client's go with it.
    if let Some(group) = holds.groups.leave(client_id(index)) {
        guarded(|| engine.release_client(group))?;
    }
    if holds.binding.release(client_id(index)) == Released::Unbound {
        // Every client's locks and sessions go too: a lock an unbound
        // client took must not keep this buffer's pages cached for the
        // next binder (its handle is `stale` now).
        guarded(|| engine.drop_cached())?;
    }
    Ok(())
}

/// What clients hold beside the engine's pages and locks, released when
/// they go: the pool's binding and their ranks in groups.
pub(super) struct Holds<'a, 's> {
    pub(super) binding: &'a mut Binding<'s>,
    pub(super) groups: &'a mut Groups,
    /// The store, whose per-client counters restart with each claim.
    pub(super) store: Option<&'a mut crate::store::StoreFile>,
}

/// Probes every occupied slot and reclaims the dead.
pub(super) fn sweep<R: crate::engine::Region, L: radixd_ipc::SlotLocks>(
    engine: &mut Engine<R>,
    peers: &mut [Peer<'_>],
    slots: &radixd_ipc::SlotTable<'_, L>,
    live: &LiveStats,
    mut holds: Holds<'_, '_>,
) {
    for status in slots.occupied() {
        let Some(peer) = peers.get_mut(status.index as usize) else {
            continue;
        };
        if status.is_dead() {
            // Only requests of an adopted claim are answered, so a client
            // the daemon never adopted holds nothing to release.
            let Peer {
                tenancy,
                corrupt,
                reader,
                ..
            } = peer;
            tenancy.vacate(&mut || {
                reader.clear();
                if let Err(damage) = forget(engine, status.index, live, &mut holds) {
                    *corrupt = Some(damage);
                }
            });
            if slots.reclaim(status).is_ok() {
                LiveStats::bump(&live.reaped, 1);
            }
        }
    }
}
