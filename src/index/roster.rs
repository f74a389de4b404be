//! The roster: which worker each membership bit stands for, and how many
//! blocks each worker holds (its tree size).
//!
//! Readers see one immutable roster per query (published through
//! crossbeam-epoch); only the tree sizes change in place. A slot freed by
//! `remove_worker` is given to another worker only once every reader that
//! could still hold a roster naming the old worker has finished
//! ([`Quarantine`]): a reader never credits one worker with another's bits.

use radixd_ipc::sync::{Arc, AtomicU32, AtomicU64, Ordering};

use super::Worker;

/// Who the membership bits stand for.
pub(crate) struct Roster {
    /// The worker of each slot; `None`: free.
    pub(crate) workers: Vec<Option<Worker>>,
    /// Whether each slot stands for its worker's store (medium `CPU`, the
    /// node-wide store) rather than its device cache.
    pub(crate) store: Vec<bool>,
    /// Blocks each slot's worker holds.
    pub(crate) sizes: Box<[AtomicU64]>,
    /// Bit `s` set: slot `s` has a worker (one word per 64 slots).
    pub(crate) occupied: Vec<u64>,
}

impl Roster {
    /// An empty roster.
    pub(crate) fn empty() -> Self {
        Self {
            workers: Vec::new(),
            store: Vec::new(),
            sizes: Box::new([]),
            occupied: Vec::new(),
        }
    }

    /// Writer only: this roster with slot `slot` given to `worker`
    /// (`None`: freed), standing for its store when `store`, tree sizes
    /// carried over (the writer is their only writer, so none is lost
    /// between the copy and the publication).
    pub(crate) fn with(&self, slot: usize, worker: Option<Worker>, store: bool) -> Self {
        let mut workers = self.workers.clone();
        let mut tiers = self.store.clone();
        if workers.len() <= slot {
            workers.resize(slot + 1, None);
        }
        tiers.resize(workers.len(), false);
        workers[slot] = worker;
        tiers[slot] = store && worker.is_some();
        let sizes = (0..workers.len())
            .map(|s| {
                let carried = match (s == slot, self.sizes.get(s)) {
                    // Relaxed: the writer's own figure (it alone stores
                    // sizes).
                    (false, Some(n)) => n.load(Ordering::Relaxed),
                    _ => 0,
                };
                AtomicU64::new(carried)
            })
            .collect();
        let mut occupied = vec![0u64; workers.len().div_ceil(64)];
        for (s, w) in workers.iter().enumerate() {
            if w.is_some() {
                occupied[s / 64] |= 1 << (s % 64);
            }
        }
        Self {
            workers,
            store: tiers,
            sizes,
            occupied,
        }
    }

    /// Whether `slot` stands for a worker's store.
    pub(crate) fn is_store(&self, slot: usize) -> bool {
        self.store.get(slot).copied().unwrap_or(false)
    }

    /// Tree size of `slot`.
    pub(crate) fn size(&self, slot: usize) -> u64 {
        // Relaxed: a figure; the writer stores it after the blocks changed.
        self.sizes
            .get(slot)
            .map_or(0, |n| n.load(Ordering::Relaxed))
    }

    /// Writer only: records `slot`'s tree size.
    pub(crate) fn set_size(&self, slot: usize, n: usize) {
        if let Some(c) = self.sizes.get(slot) {
            // Relaxed: a figure readers report, not a publication.
            c.store(n as u64, Ordering::Relaxed);
        }
    }
}

/// Slots freed by `remove_worker`, each with a flag that an epoch-deferred
/// function raises once no reader can hold a roster naming its old worker.
#[derive(Default)]
pub(crate) struct Quarantine {
    waiting: Vec<(usize, Arc<AtomicU32>)>,
}

impl Quarantine {
    /// Holds `slot` back until `flag` is raised (the caller defers that).
    pub(crate) fn hold(&mut self, slot: usize, flag: Arc<AtomicU32>) {
        self.waiting.push((slot, flag));
    }

    /// A slot whose readers are gone, if any.
    pub(crate) fn take(&mut self) -> Option<usize> {
        // Acquire: pairs with the Release store of the deferred function,
        // which crossbeam-epoch runs after every reader of the old roster
        // unpinned.
        let i = self
            .waiting
            .iter()
            .position(|(_, f)| f.load(Ordering::Acquire) == 1)?;
        Some(self.waiting.swap_remove(i).0)
    }
}
