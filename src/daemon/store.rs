//! The daemon's store: opened (created or adopted) at start-up beside the
//! segment, sharing the engine's grace period, answering the store
//! requests, and giving back what clients that left had reserved.

use radixd_ipc::sync::Ordering;

use super::{ServeConfig, ServeError};
use crate::op::{apply_store, Rejection, Reply, StoreRequest};
use crate::shared::{Info, SharedGrace};
use crate::store::{owner, StoreConfig, StoreFile};

/// Opens the store `config` asks for (`None` without `--store`) and
/// announces its size in `info` (published with `serving`).
pub(super) fn open(
    config: &ServeConfig,
    grace: &SharedGrace,
    info: &Info,
) -> Result<Option<StoreFile>, ServeError> {
    let Some(bytes) = config.store else {
        return Ok(None);
    };
    let store_config = StoreConfig::for_size(bytes, config.max_clients)
        .map_err(|e| ServeError::Store(e.to_string()))?;
    let mut store = StoreFile::open(&config.name, store_config, config.mode, config.store_reset)
        .map_err(|e| ServeError::Store(e.to_string()))?;
    store.index.set_grace(Box::new(grace.clone()));
    // Relaxed: published by the Release store of `serving`.
    info.store_bytes
        .store(store_config.data_bytes, Ordering::Relaxed);
    Ok(Some(store))
}

/// Answers a store request of the client in slot `slot` under claim
/// `generation`.
pub(super) fn answer(
    store: Option<&mut StoreFile>,
    slot: u32,
    generation: u32,
    request: StoreRequest,
) -> Result<Reply, Rejection> {
    apply_store(
        store.map(|s| &mut s.index),
        owner(slot, generation),
        request,
    )
    .map(Reply::Store)
}

/// A client's claim of slot `slot` is about to be served: its store
/// counters restart from zero (issue 37 item 9).
pub(super) fn claimed(store: Option<&mut StoreFile>, slot: u32) {
    if let Some(store) = store {
        store.index.reset_counters(slot);
    }
}

/// Between rounds: reuses what readers have left, and aborts the
/// reservations of every claim no longer served (its client released
/// its slot or died between reserve and commit).
pub(super) fn tidy(
    store: Option<&mut StoreFile>,
    owner: impl Fn(usize) -> Option<u32>,
    sweep: bool,
) {
    let Some(store) = store else { return };
    if store.index.in_limbo() > 0 {
        store.index.reclaim();
    }
    if sweep && store.index.has_reservations() {
        store.index.release_stale(|o| {
            let (slot, generation) = ((o >> 32) as usize, o as u32);
            owner(slot) == Some(generation)
        });
    }
}
