//! The engine's optional record of what it caches and forgets, for KV
//! events (`radixd serve --kv-events`).
//!
//! The engine only appends plain facts (page ids and tokens) to a `Vec`
//! while recording is on; hashing, encoding and publishing happen elsewhere
//! (`crate::events`), off the request path. With recording off every hook
//! is one predictable branch on `Option::is_some`.

use super::arena::Arena;
use super::event::CacheEvent;
use super::layout::{NIL, NODE_LIVE, ROOT};
use super::region::Region;

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
