//! The engine's optional record of what it caches and forgets, for KV
//! events (`radixd serve --kv-events`).
//!
//! The engine only appends plain facts (page ids and tokens) to a `Vec`
//! while recording is on; hashing, encoding and publishing happen elsewhere
//! (`crate::events`), off the request path. With recording off every hook
//! is one predictable branch on `Option::is_some`.
//!
//! Here are the arena's hooks, which the tree calls, and the engine's
//! requests that turn the record on and hand its facts out; the facts
//! themselves ([`CacheEvent`]) are in `event`, below the arena.

use super::arena::Arena;
use super::cache::Engine;
use super::event::CacheEvent;
use super::layout::{NIL, NODE_LIVE, ROOT};
use super::region::Region;

/// Recycled event buffers an engine keeps at most.
pub const SPARE_BUFFERS: usize = 64;
/// Longest recycled event buffer kept (elements): 64 KiB of tokens.
pub const SPARE_BUFFER_LEN: usize = 16 * 1024;

impl<R: Region> Arena<R> {
    /// Whether a recording is on (the one branch every hook pays when off).
    #[inline]
    pub fn recording(&self) -> bool {
        self.events.is_some()
    }

    /// Appends `event` when recording.
    #[inline]
    pub fn record(&mut self, event: impl FnOnce(&Self) -> CacheEvent) {
        if self.events.is_some() {
            let e = event(self);
            if let Some(log) = self.events.as_mut() {
                log.push(e);
            }
        }
    }

    /// A copy of `src` in a recycled buffer when there is one, in chunks
    /// clear of glibc's slow `rep movsb` case (see `radixd_ipc::copy`).
    pub fn record_copy(&mut self, src: &[u32]) -> Vec<u32> {
        let Some(mut buf) = self.spares.pop() else {
            return radixd_ipc::copy::to_vec(src);
        };
        buf.clear();
        buf.reserve(src.len());
        for chunk in src.chunks(radixd_ipc::copy::CHUNK / 4) {
            buf.extend_from_slice(chunk);
        }
        buf
    }

    /// The last page of `node`, or `None` for the root.
    pub fn run_parent(&self, node: u32) -> Option<u32> {
        (node != ROOT).then(|| self.nodes()[node as usize].last_page)
    }

    /// A `Stored` fact for every live node, parents before children, so a
    /// consumer that applies them in order rebuilds the whole tree.
    pub fn cached_runs(&self) -> Vec<CacheEvent> {
        let nodes = self.nodes();
        let mut children: Vec<Vec<u32>> = vec![Vec::new(); nodes.len()];
        for (i, n) in nodes.iter().enumerate() {
            if i as u32 != ROOT && n.state == NODE_LIVE && (n.parent as usize) < nodes.len() {
                children[n.parent as usize].push(i as u32);
            }
        }
        let p = self.layout.page_size as usize;
        let mut out = Vec::new();
        let mut stack = vec![ROOT];
        while let Some(node) = stack.pop() {
            if node != ROOT {
                let n = nodes[node as usize];
                let mut pages = Vec::with_capacity(n.num_pages as usize);
                let mut tokens = Vec::with_capacity(n.num_pages as usize * p);
                let mut page = n.first_page;
                // Bounded by the page count, whatever the links say.
                while page != NIL && pages.len() < n.num_pages as usize {
                    pages.push(page);
                    tokens.extend_from_slice(self.page_tokens(page));
                    page = self.pages()[page as usize].next;
                }
                out.push(CacheEvent::Stored {
                    parent: self.run_parent(n.parent),
                    pages,
                    tokens,
                    ns: n.ns,
                });
            }
            stack.extend(children[node as usize].iter().rev());
        }
        out
    }
}

impl<R: Region> Engine<R> {
    /// Starts (or stops) recording what becomes cached and what goes, for
    /// KV events: see [`CacheEvent`] and [`Engine::take_events`]. Off by
    /// default; when off, each hook costs one branch. Turned on, the
    /// record starts with the namespaces registered so far.
    pub fn record_events(&mut self, on: bool) {
        self.arena.events = on.then(|| self.namespace_events().collect());
        if !on {
            self.arena.spares = Vec::new();
        }
    }

    /// Whether [`Engine::record_events`] is on.
    pub fn recording_events(&self) -> bool {
        self.arena.recording()
    }

    /// Hands back an emptied buffer of a consumed [`CacheEvent::Stored`],
    /// so the next one copies into it instead of allocating. Keeps at most
    /// [`SPARE_BUFFERS`] of at most [`SPARE_BUFFER_LEN`] elements; returns
    /// whether it was kept.
    pub fn recycle_event_buffer(&mut self, buf: Vec<u32>) -> bool {
        let keep = self.arena.recording()
            && self.arena.spares.len() < SPARE_BUFFERS
            && buf.capacity() <= SPARE_BUFFER_LEN;
        if keep {
            self.arena.spares.push(buf);
        }
        keep
    }

    /// How many recycled buffers the engine holds now.
    pub fn spare_event_buffers(&self) -> usize {
        self.arena.spares.len()
    }

    /// Moves the facts recorded since the last call to the end of `out`.
    pub fn take_events(&mut self, out: &mut Vec<CacheEvent>) {
        if let Some(log) = self.arena.events.as_mut() {
            out.append(log);
        }
    }

    /// Every registered namespace ([`CacheEvent::Namespace`]), then one
    /// [`CacheEvent::Stored`] per cached run (node), parents first: applied
    /// after a [`CacheEvent::Cleared`], they rebuild exactly the cached
    /// pages. For resynchronising event consumers.
    pub fn cached_runs(&self) -> Vec<CacheEvent> {
        let mut out: Vec<CacheEvent> = self.namespace_events().collect();
        out.extend(self.arena.cached_runs());
        out
    }
}
