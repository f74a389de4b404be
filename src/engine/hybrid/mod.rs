//! Secondary components beside full attention, for hybrid models: SWA
//! (sliding-window KV pages from a second pool) and MAMBA (one recurrent
//! state slot from a third pool per checkpointed node), with the semantics
//! of SGLang 0.5.23's `UnifiedRadixCache` (Python tree core).
//!
//! FULL is the tree of [`super::tree`]: its nodes, pages and locks live in
//! the shared region. Everything here lives in the writer's private
//! memory, as the FULL LRU order does (`super::lru`), except that each
//! node record mirrors its `swa` and `mamba` words for lock-free readers.
//! The private copies stay the truth: a word another process scribbled
//! over is only ever read by readers, never used to free a page or a slot.
//! Privately: per node, whether it holds SWA pages or a state (a node
//! without is a *tombstone* for that component), the component's lock
//! count, and one LRU [`List`] per component; per FULL page, the SWA page
//! paired with it (SGLang's `full_to_swa_index_mapping`). The tree calls the hooks below when it
//! splits a node, trims a page from a leaf, removes a node or frees a
//! client's page, so FULL code paths stay what they were and cost one
//! branch when no component is on.
//!
//! The rules, as SGLang's (`unified_cache/components/{swa,mamba}.py`):
//! - a match is usable as far as every component's validator allows: SWA
//!   needs the last `window` tokens to hold SWA pages (a tombstone resets
//!   the count), MAMBA a state at the node the match ends at;
//! - a lock holds FULL along the whole path, SWA on the nodes covering the
//!   last `window` tokens, MAMBA at the node only;
//! - SWA and MAMBA eviction walk their LRU list from the least recently
//!   used end: an unlocked FULL leaf goes whole (all its components), any
//!   other unlocked node loses only that component (a tombstone);
//! - FULL eviction takes FULL leaves, and their pages' SWA pages and state
//!   with them.

mod list;
pub(crate) mod ops;

use std::collections::VecDeque;
use std::fmt;

use super::layout::NIL;
use list::List;

/// A cache component.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Component {
    /// Full-attention KV pages (the primary component, never tombstoned).
    Full,
    /// Sliding-window-attention KV pages.
    Swa,
    /// Recurrent (Mamba, linear-attention) state slots.
    Mamba,
}

impl Component {
    /// The component's name as the CLI and JSON spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Swa => "swa",
            Self::Mamba => "mamba",
        }
    }
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The SWA component's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwaConfig {
    /// Sliding window, in tokens (SGLang's `sliding_window_size`).
    pub window: u32,
    /// Pages in the SWA pool (same page size as FULL's).
    pub capacity: u32,
}

/// The MAMBA component's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MambaConfig {
    /// State slots in the pool.
    pub capacity: u32,
}

/// Which components an engine caches beside FULL (always on).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Components {
    /// SWA, when on.
    pub swa: Option<SwaConfig>,
    /// MAMBA, when on.
    pub mamba: Option<MambaConfig>,
}

/// Why a component configuration was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentsError(pub String);

impl fmt::Display for ComponentsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ComponentsError {}

/// Largest state pool.
pub const MAX_STATES: u32 = 1 << 24;

impl Components {
    /// FULL alone (the default).
    pub fn full() -> Self {
        Self::default()
    }

    /// Whether only FULL is on.
    pub fn is_full_only(&self) -> bool {
        self.swa.is_none() && self.mamba.is_none()
    }

    /// Parses the CLI's `--components full|full,swa|full,mamba` with its
    /// companions; `full_capacity` is the SWA pool's default size.
    pub fn parse(
        names: &str,
        swa_window: Option<u32>,
        swa_capacity: Option<u32>,
        mamba_capacity: Option<u32>,
        full_capacity: u32,
    ) -> Result<Self, ComponentsError> {
        let err = |m: String| Err(ComponentsError(m));
        let mut c = Self::default();
        match names.trim() {
            "full" => {}
            "full,swa" | "swa,full" => {
                let Some(window) = swa_window else {
                    return err("--components full,swa needs --swa-window TOKENS".into());
                };
                c.swa = Some(SwaConfig {
                    window,
                    capacity: swa_capacity.unwrap_or(full_capacity),
                });
            }
            "full,mamba" | "mamba,full" => {
                let Some(capacity) = mamba_capacity else {
                    return err("--components full,mamba needs --mamba-capacity SLOTS".into());
                };
                c.mamba = Some(MambaConfig { capacity });
            }
            other => {
                return err(format!(
                    "unknown components {other:?}: expected full, full,swa or full,mamba"
                ))
            }
        }
        if c.swa.is_none() && (swa_window.is_some() || swa_capacity.is_some()) {
            return err("--swa-window and --swa-capacity need --components full,swa".into());
        }
        if c.mamba.is_none() && mamba_capacity.is_some() {
            return err("--mamba-capacity needs --components full,mamba".into());
        }
        c.check()?;
        Ok(c)
    }

    /// Checks the sizes.
    pub fn check(&self) -> Result<(), ComponentsError> {
        if let Some(s) = self.swa {
            if s.window == 0 {
                return Err(ComponentsError(
                    "--swa-window must be at least 1 token".into(),
                ));
            }
            if !(1..=super::layout::MAX_CAPACITY).contains(&s.capacity) {
                return Err(ComponentsError(format!(
                    "--swa-capacity {} is outside 1..=2^30 pages",
                    s.capacity
                )));
            }
        }
        if let Some(m) = self.mamba {
            if !(1..=MAX_STATES).contains(&m.capacity) {
                return Err(ComponentsError(format!(
                    "--mamba-capacity {} is outside 1..=2^24 slots",
                    m.capacity
                )));
            }
        }
        Ok(())
    }

    /// `full`, `full,swa` or `full,mamba`.
    pub fn names(&self) -> &'static str {
        match (self.swa.is_some(), self.mamba.is_some()) {
            (false, false) => "full",
            (true, false) => "full,swa",
            (false, true) => "full,mamba",
            (true, true) => "full,swa,mamba",
        }
    }
}

/// Errors of the component operations (`alloc_state`, `free_state`,
/// `free_swa`, and component fields of other requests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ComponentError {
    /// The engine was not started with this component.
    NotEnabled(Component),
    /// A state slot that is out of range, free, cached, or another
    /// client's.
    StateNotOwned { state: u64 },
    /// Every state slot is held by a client or by a locked node.
    NoFreeState,
}

impl fmt::Display for ComponentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::NotEnabled(c) => {
                write!(
                    f,
                    "component {c} is not on (start the daemon with --components full,{c})"
                )
            }
            Self::StateNotOwned { state } => {
                write!(f, "state slot {state} is not owned by this client")
            }
            Self::NoFreeState => {
                write!(
                    f,
                    "no state slot is free or evictable (all are held or locked)"
                )
            }
        }
    }
}

impl std::error::Error for ComponentError {}

/// What an eviction freed, per component.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Evicted {
    /// FULL tokens.
    pub tokens: u64,
    /// SWA tokens.
    pub swa_tokens: u64,
    /// MAMBA states.
    pub mamba_states: u64,
}

/// Figures of the secondary components (zero for one that is off).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ComponentStats {
    /// Tokens with SWA pages on nodes whose SWA no lock protects.
    pub swa_evictable_tokens: u64,
    /// Tokens with SWA pages some lock's window protects.
    pub swa_protected_tokens: u64,
    /// Pages in the SWA pool's free list.
    pub swa_free_pages: u64,
    /// Cached states no lock protects.
    pub mamba_evictable_states: u64,
    /// Cached states some lock protects.
    pub mamba_protected_states: u64,
    /// Slots in the state pool's free list.
    pub mamba_free_states: u64,
    /// SWA LRU nodes visited by eviction walks since start or reset.
    pub evict_scanned_swa: u64,
    /// MAMBA LRU nodes visited by eviction walks since start or reset.
    pub evict_scanned_mamba: u64,
}

impl ComponentStats {
    /// Number of figures.
    pub const LEN: usize = 8;

    /// The figures in declaration order, for compact transport.
    pub fn to_array(&self) -> [u64; Self::LEN] {
        [
            self.swa_evictable_tokens,
            self.swa_protected_tokens,
            self.swa_free_pages,
            self.mamba_evictable_states,
            self.mamba_protected_states,
            self.mamba_free_states,
            self.evict_scanned_swa,
            self.evict_scanned_mamba,
        ]
    }

    /// The inverse of [`ComponentStats::to_array`].
    pub fn from_array(a: [u64; Self::LEN]) -> Self {
        let [swa_evictable_tokens, swa_protected_tokens, swa_free_pages, mamba_evictable_states, mamba_protected_states, mamba_free_states, evict_scanned_swa, evict_scanned_mamba] =
            a;
        Self {
            swa_evictable_tokens,
            swa_protected_tokens,
            swa_free_pages,
            mamba_evictable_states,
            mamba_protected_states,
            mamba_free_states,
            evict_scanned_swa,
            evict_scanned_mamba,
        }
    }
}

/// The extras of an insert into a hybrid engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InsertExtra {
    /// A state slot the client owns, checkpointed at the end of the key:
    /// the tree takes it, unless the node has one already (then it stays
    /// the client's: [`InsertedExtra::mamba_exist`]).
    pub mamba_state: Option<u32>,
    /// Leading tokens whose SWA pages the client already freed
    /// (`free_swa`; SGLang's `swa_evicted_seqlen`): page-aligned; the
    /// pages before are unpaired, those from here on paired.
    pub swa_evicted: u64,
}

/// The hybrid parts of a match's answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatchExtra {
    /// Tokens FULL alone would match (SGLang's `full_kv_hit_length`); the
    /// match's `len` is what every component allows.
    pub full_len: usize,
    /// The state at the node the match ends at (MAMBA on).
    pub mamba_state: Option<u32>,
}

/// The hybrid parts of an insert's answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InsertedExtra {
    /// The key's node held a state already, so the one given stays the
    /// client's (SGLang's `mamba_exist`; its scheduler then frees it).
    pub mamba_exist: bool,
}

/// Per-slot owner marks of the state pool.
const SLOT_FREE: u32 = u32::MAX;
const SLOT_CACHED: u32 = u32::MAX - 1;

/// The SWA component's state.
pub(crate) struct Swa {
    pub window: u32,
    pub capacity: u32,
    pub free: VecDeque<u32>,
    /// Per FULL page: its SWA page, or `NIL`.
    pub pair: Vec<u32>,
    /// Per node: holds SWA pages (else a tombstone).
    pub live: Vec<bool>,
    pub lock: Vec<u32>,
    pub list: List,
    pub evictable: u64,
    pub protected: u64,
    pub scanned: u64,
    /// Per locked node, its locks' receipts in the order they were taken
    /// (SGLang's lock receipt): a release walks up exactly as far as its
    /// own lock did, so the halves of a node split under a lock are both
    /// released, and a lock taken after the split (which covers less)
    /// releases only what it took, in whatever order the locks go.
    pub receipts: std::collections::HashMap<u32, Vec<Receipt>>,
    /// Per node slot, the serial of the last lock taken on it (never reset,
    /// so a lock's serial names it among every lock the slot ever had).
    pub serial: Vec<u32>,
    /// Per node slot, `serial` when its current node was made: the serials
    /// after it are its node's locks.
    pub born: Vec<u32>,
}

/// What one window lock took: the lock's serial (unique on its node) and
/// the tokens it covers from the node up, the edges split since included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Receipt {
    pub serial: u32,
    pub reach: u64,
}

impl Swa {
    /// Whether `serial` names a lock taken on `node`'s current node (held
    /// or released since).
    pub fn names(&self, node: u32, serial: u32) -> bool {
        let i = node as usize;
        let age = serial.wrapping_sub(self.born[i]);
        age != 0 && age <= self.serial[i].wrapping_sub(self.born[i])
    }
}

/// The MAMBA component's state.
pub(crate) struct Mamba {
    pub capacity: u32,
    pub free: VecDeque<u32>,
    /// Per slot: `SLOT_FREE`, `SLOT_CACHED` or the owning client.
    pub owner: Vec<u32>,
    /// Per node: its state slot, or `NIL`.
    pub state: Vec<u32>,
    pub lock: Vec<u32>,
    pub list: List,
    pub evictable: u64,
    pub protected: u64,
    pub scanned: u64,
}

/// What one eviction call freed so far (the trackers of SGLang's walk).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Tally {
    pub full_pages: u64,
    pub swa_tokens: u64,
    pub mamba_states: u64,
}

/// Every secondary component of an engine.
pub(crate) struct Hybrid {
    pub swa: Option<Swa>,
    pub mamba: Option<Mamba>,
    pub tally: Tally,
    /// Reused buffers for the paths a match walks (no allocation per call).
    pub path: Vec<u32>,
    pub chain: Vec<u32>,
}

impl Hybrid {
    /// Empty components for an engine of `nodes` node slots and `pages`
    /// FULL pages; `None` when only FULL is on.
    pub fn new(c: Components, nodes: u32, pages: u32) -> Option<Box<Self>> {
        if c.is_full_only() {
            return None;
        }
        let n = nodes as usize;
        let swa = c.swa.map(|s| Swa {
            window: s.window,
            capacity: s.capacity,
            free: (0..s.capacity).collect(),
            pair: vec![NIL; pages as usize],
            live: vec![false; n],
            lock: vec![0; n],
            list: List::new(nodes),
            evictable: 0,
            protected: 0,
            scanned: 0,
            receipts: Default::default(),
            serial: vec![0; n],
            born: vec![0; n],
        });
        let mamba = c.mamba.map(|m| Mamba {
            capacity: m.capacity,
            free: (0..m.capacity).collect(),
            owner: vec![SLOT_FREE; m.capacity as usize],
            state: vec![NIL; n],
            lock: vec![0; n],
            list: List::new(nodes),
            evictable: 0,
            protected: 0,
            scanned: 0,
        });
        Some(Box::new(Self {
            swa,
            mamba,
            tally: Tally::default(),
            path: Vec::new(),
            chain: Vec::new(),
        }))
    }

    /// Back to empty (the engine was formatted).
    pub fn clear(&mut self) {
        if let Some(s) = self.swa.as_mut() {
            s.free = (0..s.capacity).collect();
            s.pair.fill(NIL);
            s.live.fill(false);
            s.lock.fill(0);
            s.list.clear();
            s.receipts.clear();
            // Serials go on: a lock handle from before names nothing now.
            s.born.copy_from_slice(&s.serial);
            s.evictable = 0;
            s.protected = 0;
            s.scanned = 0;
        }
        if let Some(m) = self.mamba.as_mut() {
            m.free = (0..m.capacity).collect();
            m.owner.fill(SLOT_FREE);
            m.state.fill(NIL);
            m.lock.fill(0);
            m.list.clear();
            m.evictable = 0;
            m.protected = 0;
            m.scanned = 0;
        }
        self.tally = Tally::default();
    }

    /// `Header::components` for these components.
    pub fn header_bits(&self) -> u32 {
        use crate::engine::layout::{COMPONENT_MAMBA, COMPONENT_SWA};
        let swa = if self.swa.is_some() { COMPONENT_SWA } else { 0 };
        let mamba = if self.mamba.is_some() {
            COMPONENT_MAMBA
        } else {
            0
        };
        swa | mamba
    }

    /// The SWA window (0 without SWA).
    pub fn window(&self) -> u32 {
        self.swa.as_ref().map_or(0, |s| s.window)
    }

    /// The components this state was built with.
    pub fn components(&self) -> Components {
        Components {
            swa: self.swa.as_ref().map(|s| SwaConfig {
                window: s.window,
                capacity: s.capacity,
            }),
            mamba: self.mamba.as_ref().map(|m| MambaConfig {
                capacity: m.capacity,
            }),
        }
    }

    /// Current figures.
    pub fn stats(&self) -> ComponentStats {
        let mut st = ComponentStats::default();
        if let Some(s) = &self.swa {
            st.swa_evictable_tokens = s.evictable;
            st.swa_protected_tokens = s.protected;
            st.swa_free_pages = s.free.len() as u64;
            st.evict_scanned_swa = s.scanned;
        }
        if let Some(m) = &self.mamba {
            st.mamba_evictable_states = m.evictable;
            st.mamba_protected_states = m.protected;
            st.mamba_free_states = m.free.len() as u64;
            st.evict_scanned_mamba = m.scanned;
        }
        st
    }
}

impl Mamba {
    /// Hands a free slot to `client`.
    pub fn take(&mut self, client: u32) -> Option<u32> {
        let slot = self.free.pop_front()?;
        self.owner[slot as usize] = client;
        Some(slot)
    }

    /// Returns `slot` (owned or cached) to the free list.
    pub fn put(&mut self, slot: u32) {
        self.owner[slot as usize] = SLOT_FREE;
        self.free.push_back(slot);
    }

    /// Whether `client` owns `slot`.
    pub fn owns(&self, client: u32, slot: u64) -> bool {
        self.owner
            .get(slot as usize)
            .is_some_and(|&o| o == client && o != SLOT_FREE && o != SLOT_CACHED)
    }

    /// Makes the owned `slot` the tree's.
    pub fn adopt(&mut self, slot: u32) {
        self.owner[slot as usize] = SLOT_CACHED;
    }

    /// Slots `client` owns.
    pub fn owned_by(&self, client: u32) -> Vec<u32> {
        (0..self.capacity)
            .filter(|&s| self.owner[s as usize] == client)
            .collect()
    }

    /// Whether `slot` is the tree's.
    pub fn cached(&self, slot: u32) -> bool {
        self.owner.get(slot as usize) == Some(&SLOT_CACHED)
    }

    /// Whether `slot` is free.
    pub fn is_free(&self, slot: u32) -> bool {
        self.owner.get(slot as usize) == Some(&SLOT_FREE)
    }
}
