//! The [`Engine`] type: the arena and the writer's private tables beside it
//! (locks, sessions, namespace names), how an engine is built over a region
//! and configured, and how it is emptied or cleared of a client. The
//! requests it serves live in the modules of their families (`prefix`,
//! `anchor`, `lock`, `pool`, `session`, `namespace`, `record`, `stats`).

use std::collections::HashMap;
use std::time::Instant;

use super::arena::Arena;
use super::config::{Config, ConfigError};
use super::event::CacheEvent;
use super::hybrid::{Components, ComponentsError, Hybrid};
use super::layout::{EngineLayout, PAGE_OWNED};
use super::lock_map::LockMap;
use super::lru::Recency;
use super::policy::Policy;
use super::region::{HeapRegion, Region};

/// Identifies the client that owns pages and locks.
pub type ClientId = u32;

/// A radix-tree prefix cache over a region `R`.
pub struct Engine<R = HeapRegion> {
    pub(super) arena: Arena<R>,
    /// `(client, node)` → locks that client holds on that node.
    pub(super) locks: LockMap<u32>,
    /// With SWA: `(client, node)` → the serials of those locks, oldest
    /// first (see [`Handle`](super::Handle)).
    pub(super) serials: LockMap<Vec<u32>>,
    /// Live sessions by id.
    pub(super) sessions: HashMap<String, Session>,
    /// Reused buffer for the pages a walk passes.
    pub(super) walked: Vec<u32>,
    /// The namespaces' names (see `namespace`).
    pub(super) namespaces: Namespaces,
}

/// One live session.
#[derive(Clone, Debug)]
pub(crate) struct Session {
    /// The client that opened it; only it may commit to or release it.
    pub client: ClientId,
    /// The node covering the last committed turn (the root when that turn
    /// held no whole page); locked once by the session unless it is the root.
    pub node: u32,
    /// The serial of the session's lock on `node` (see `Arena::lock_path`).
    pub serial: u32,
    pub last_access: Instant,
}

/// The registered names: id `i + 1` is `names[i]`.
#[derive(Debug, Default)]
pub(crate) struct Namespaces {
    pub(super) ids: HashMap<String, u32>,
    pub(super) names: Vec<String>,
}

impl Engine<HeapRegion> {
    /// An empty engine on the heap.
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        Self::with_host(config, 0)
    }

    /// An empty engine on the heap with a host tier of `host_pages` pages
    /// (see `host`; 0: none): device nodes evicted with a host copy stay,
    /// host-only, until host eviction takes them.
    pub fn with_host(config: Config, host_pages: u32) -> Result<Self, ConfigError> {
        let layout = EngineLayout::with_host(config.page_size, config.capacity, host_pages)?;
        let region = HeapRegion::zeroed(layout.size()).ok_or(ConfigError::OutOfMemory {
            bytes: layout.size(),
        })?;
        Self::in_region(region, layout)
    }
}

impl Engine<HeapRegion> {
    /// An empty engine on the heap caching `components` beside FULL.
    pub fn with_components(
        config: Config,
        components: Components,
    ) -> Result<Self, ComponentsError> {
        let mut e = Self::new(config).map_err(|e| ComponentsError(e.to_string()))?;
        e.set_components(components)?;
        Ok(e)
    }
}

impl<R: Region> Engine<R> {
    /// Empties the cache and from now on caches `components` beside FULL
    /// (their pools start empty of data: every SWA page and state free).
    pub fn set_components(&mut self, components: Components) -> Result<(), ComponentsError> {
        components.check()?;
        if self.arena.host.is_some() && !components.is_full_only() {
            return Err(ComponentsError(
                "the host tier serves full attention alone: SWA and MAMBA have no host copy yet"
                    .to_owned(),
            ));
        }
        let l = self.arena.layout;
        self.arena.hybrid = Hybrid::new(components, l.node_cap, l.capacity);
        self.reset();
        Ok(())
    }

    /// Sets what a split counts as a use of (see [`Recency`]); the cache
    /// keeps what it holds.
    pub fn set_recency(&mut self, recency: Recency) {
        self.arena.lru.set_recency(recency);
    }

    /// What a split counts as a use of.
    pub fn recency(&self) -> Recency {
        self.arena.lru.recency()
    }

    /// Empties the cache and from now on evicts by `policy` (SGLang's
    /// `--radix-eviction-policy`; LRU by default). The recency rule applies
    /// to every policy's last use, and under [`Recency::Sglang`] a split's
    /// upper half is also made anew (its creation is the split's), as in
    /// SGLang's `RadixCache`.
    pub fn set_policy(&mut self, policy: Policy) {
        self.arena.lru.set_policy(policy);
        self.reset();
    }

    /// The eviction policy.
    pub fn policy(&self) -> Policy {
        self.arena.lru.policy()
    }

    /// The components this engine caches.
    pub fn components(&self) -> Components {
        self.arena
            .hybrid
            .as_deref()
            .map_or_else(Components::full, Hybrid::components)
    }

    /// An empty engine formatted over `region`, which must be at least
    /// `layout.size()` bytes.
    pub fn in_region(region: R, layout: EngineLayout) -> Result<Self, ConfigError> {
        Ok(Self {
            arena: Arena::new(region, layout)?,
            locks: LockMap::default(),
            serials: LockMap::default(),
            sessions: HashMap::new(),
            walked: Vec::new(),
            namespaces: Namespaces::default(),
        })
    }

    /// Tokens per page.
    pub fn page_size(&self) -> u32 {
        self.arena.layout.page_size
    }

    /// Pages in the pool.
    pub fn capacity(&self) -> u32 {
        self.arena.layout.capacity
    }

    /// The region the engine lives in.
    pub fn region(&self) -> &R {
        self.arena.region()
    }

    /// Where everything sits in the region (for a [`TreeReader`](super::TreeReader)).
    pub fn layout(&self) -> EngineLayout {
        self.arena.layout
    }

    pub(super) fn aligned(&self, len: usize) -> usize {
        let p = self.page_size() as usize;
        len / p * p
    }

    /// Drops every lock, session and page `client` holds, as when it dies.
    pub fn release_client(&mut self, client: ClientId) {
        self.release_client_sessions(client);
        let mut held: Vec<(u32, u32)> = Vec::new();
        self.locks.retain(|&(c, node), &mut count| {
            if c == client {
                held.push((node, count));
            }
            c != client
        });
        for (node, count) in held {
            for _ in 0..count {
                let serial = self.take_serial(client, node, None);
                self.arena.unlock_path(node, serial);
            }
        }
        let owned: Vec<u32> = (0..self.capacity())
            .filter(|&i| {
                let pg = &self.arena.pages()[i as usize];
                pg.state == PAGE_OWNED && pg.owner_or_run == client
            })
            .collect();
        for page in owned {
            self.arena.pool_release_owned(page);
        }
        self.arena.hy_release_states(client);
    }

    /// Empties the tree but keeps what clients own: every lock and session
    /// of every client goes (their handles name evicted nodes afterwards:
    /// `stale`), then every cached page is evicted as `evict` evicts (KV
    /// events report them removed), with the SWA pages and states the tree
    /// held. Owned pages and state slots stay their owners'. What a daemon
    /// does when its pool's binding changes: the KV the cached pages index
    /// lived in another buffer than the next binder's.
    pub fn drop_cached(&mut self) {
        let mut with_sessions: Vec<ClientId> = self.sessions.values().map(|s| s.client).collect();
        with_sessions.sort_unstable();
        with_sessions.dedup();
        for client in with_sessions {
            self.release_client_sessions(client);
        }
        let held: Vec<((ClientId, u32), u32)> = self.locks.drain().collect();
        for ((client, node), count) in held {
            for _ in 0..count {
                let serial = self.take_serial(client, node, None);
                self.arena.unlock_path(node, serial);
            }
        }
        let c = self.components();
        let all = |on: bool| if on { u64::MAX } else { 0 };
        // Cannot fail: only the components this engine keeps are asked for.
        let _ = self.evict_components(u64::MAX, all(c.swa.is_some()), all(c.mamba.is_some()));
        // Eviction demoted what had a host copy; those copies live in the
        // bound server's host pool, which goes with its binding, and the
        // host locks with the transfers they kept.
        self.host_unlock_all();
        self.evict_host(u64::MAX, &mut Vec::new());
    }

    /// Empties the cache: every page free, every lock and handle gone.
    pub fn reset(&mut self) {
        self.arena.format();
        self.arena.record(|_| CacheEvent::Cleared);
        self.locks.clear();
        self.serials.clear();
        self.sessions.clear();
    }
}
