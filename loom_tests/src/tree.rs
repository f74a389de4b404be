//! What the models of the tree reader against the engine writer share
//! (`tests/walk.rs`, `tests/demote.rs`): an engine on a mirrored region and
//! a reader of it, the reader's answer as pages, and the stage witness.

use std::sync::Arc as StdArc;

use radixd::engine::{Engine, EngineLayout, Mirror, MirroredRegion, TreeReader};
use radixd_ipc::sync::{Arc, AtomicU32, Ordering};

/// The engine writer, on a region whose plain stores loom sees.
pub type Writer = Engine<MirroredRegion>;
/// The tree reader, reading through the mirror.
pub type Reader = TreeReader<StdArc<Mirror>>;

/// An empty engine of `capacity` pages of one token and a host tier of
/// `host` host pages (0: none), and a reader of it.
pub fn engine(capacity: u32, host: u32) -> (Writer, Reader) {
    let layout = EngineLayout::with_host(1, capacity, host).expect("layout");
    let (region, mirror) = MirroredRegion::new(layout).expect("region");
    let engine = Engine::in_region(region, layout).expect("engine");
    (engine, TreeReader::over(mirror))
}

/// Caches `key` (the cached part keeps its pages, the rest gets new ones)
/// and returns its pages.
pub fn put(e: &mut Writer, key: &[u32], lock: bool) -> Vec<u32> {
    let mut pages = Vec::new();
    let cached = e.peek(key, &mut pages);
    pages.extend(e.alloc(1, (key.len() - cached) as u64).expect("alloc"));
    e.insert(1, key, &pages, lock).expect("insert");
    pages
}

/// The reader's answer for `key` (`None`: gave up), as a list of pages.
pub fn peek(r: &Reader, key: &[u32]) -> Option<Vec<u32>> {
    let mut pages = Vec::new();
    let peeked = r.peek_anchored(key, &mut pages)?;
    assert_eq!(peeked.len, pages.len(), "one page per matched token");
    Some(pages)
}

/// Where the writer is, for the model's assertions and floors: 0 before
/// its first change, then as each model says. SeqCst: a witness outside
/// the protocol, totally ordered with the reader's loads of it.
pub struct Stage(AtomicU32);

impl Stage {
    /// At 0.
    pub fn new() -> Arc<Self> {
        Arc::new(Self(AtomicU32::new(0)))
    }
    /// Moves to `s`.
    pub fn set(&self, s: u32) {
        self.0.store(s, Ordering::SeqCst);
    }
    /// Where it is.
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}
