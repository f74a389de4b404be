//! The radix tree: walking, splitting, growing, locking and evicting nodes.
//!
//! These are the raw mechanisms; `Engine` checks a request in full before it
//! calls any of them, so nothing here has to undo anything.

use super::arena::Arena;
use super::event::CacheEvent;
use super::layout::{Node, NIL, NODE_FREE, NODE_LIVE, PAGE_CACHED, ROOT};
use super::lru::Recency;
use super::region::Region;
use super::table::child_hash;

/// Where a walk down the tree stopped.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Walk {
    /// Deepest node whose whole edge matched (the root when none did).
    pub node: u32,
    /// The child of `node` in which the match stopped part-way: the child,
    /// its first unmatched page, and how many of its pages matched.
    pub partial: Option<(u32, u32, u32)>,
    /// Pages matched in all.
    pub pages: usize,
    /// The namespace walked: the children of `node` are looked up in it.
    pub ns: u32,
}

impl<R: Region> Arena<R> {
    fn page_size(&self) -> usize {
        self.layout.page_size as usize
    }

    /// Follows `key` (whole pages only) down from the root of the current
    /// namespace, appending the ids
    /// of the matched pages to `out`. Changes nothing.
    pub fn walk(&self, key: &[u32], out: &mut Vec<u32>) -> Walk {
        let root = Walk {
            node: ROOT,
            partial: None,
            pages: 0,
            ns: self.ns,
        };
        self.walk_on(root, key, out)
    }

    /// Goes on from `walk` (a walk, or an anchor's place) with `key`, the
    /// whole pages after those `walk` matched: first through the rest of
    /// the part-matched child, if any, then down the tree. Changes nothing.
    pub fn walk_on(&self, mut walk: Walk, key: &[u32], out: &mut Vec<u32>) -> Walk {
        let p = self.page_size();
        let nodes = self.nodes();
        let mut pos = 0;
        if let Some((child, page, in_child)) = walk.partial.take() {
            if !self.follow(&mut walk, child, page, in_child, key, &mut pos, out) {
                return walk;
            }
            walk.node = child;
        }
        while pos + p <= key.len() {
            let Some(child) = self.find_child(walk.node, walk.ns, &key[pos..pos + p]) else {
                break;
            };
            // `find_child` verified the first page.
            let page = nodes[child as usize].first_page;
            out.push(page);
            pos += p;
            walk.pages += 1;
            let next = self.pages()[page as usize].next;
            if !self.follow(&mut walk, child, next, 1, key, &mut pos, out) {
                return walk;
            }
            walk.node = child;
        }
        walk
    }

    /// Matches `child`'s pages from `page` (its `in_child`th; `NIL`: none
    /// left) against `key` at `pos`; true when all of them matched, else
    /// notes where the match stopped in `walk.partial`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn follow(
        &self,
        walk: &mut Walk,
        child: u32,
        mut page: u32,
        mut in_child: u32,
        key: &[u32],
        pos: &mut usize,
        out: &mut Vec<u32>,
    ) -> bool {
        let p = self.page_size();
        let pages = self.pages();
        let num_pages = self.nodes()[child as usize].num_pages;
        // Ends: every step consumes at least a page of `key`.
        while page != NIL {
            // A run of consecutive pages: their tokens lie side by side,
            // compared as one slice (a `memcmp`), ids without the links.
            let run = pages[page as usize]
                .owner_or_run
                .min(num_pages.saturating_sub(in_child))
                .min(((key.len() - *pos) / p) as u32);
            if run >= 2 {
                let (first, n) = (page as usize, run as usize);
                let stored = self.tokens().get(first * p..(first + n) * p);
                let stored = stored.unwrap_or_else(|| super::arena::corrupt("page run"));
                let wanted = &key[*pos..*pos + n * p];
                let same = if stored == wanted {
                    n
                } else {
                    stored
                        .chunks_exact(p)
                        .zip(wanted.chunks_exact(p))
                        .take_while(|(a, b)| a == b)
                        .count()
                };
                out.extend((0..same as u32).map(|i| page + i));
                *pos += same * p;
                in_child += same as u32;
                walk.pages += same;
                if same < n {
                    walk.partial = Some((child, page + same as u32, in_child));
                    return false;
                }
                page = pages[first + n - 1].next;
                continue;
            }
            if *pos + p > key.len() || !self.page_is(page, &key[*pos..*pos + p]) {
                walk.partial = Some((child, page, in_child));
                return false;
            }
            out.push(page);
            *pos += p;
            in_child += 1;
            walk.pages += 1;
            page = pages[page as usize].next;
        }
        true
    }

    /// The node whose path from the root is exactly what `walk` matched,
    /// splitting the partially matched child if there is one.
    ///
    /// The caller then touches the path, the new upper node with it. By
    /// default ([`Recency::Exact`]) that is the only use: the lower half,
    /// which the match did not reach, keeps its last use. Under
    /// [`Recency::Sglang`] the split is a use of both halves, the lower one
    /// older, as SGLang touches the node it splits (and the upper node it
    /// makes is newer still).
    pub fn settle(&mut self, walk: Walk) -> u32 {
        match walk.partial {
            None => walk.node,
            Some((child, at, upper)) => {
                let m = self.split(child, at, upper);
                if self.lru.recency() == Recency::Sglang {
                    self.lru.stamp(child);
                }
                // A fresh stamp either way (the slot's last one is a freed
                // node's), newer than the lower half's.
                self.lru.stamp(m);
                m
            }
        }
    }

    /// Cuts `child` before page `at`: a new node takes the first `upper`
    /// pages (and the child's place under its parent, key and lock count);
    /// `child` keeps the rest, its identity and its handles.
    fn split(&mut self, child: u32, at: u32, upper: u32) -> u32 {
        let m = self.node_change(child, |a| a.split_inner(child, at, upper));
        self.hy_split(m, child);
        self.host_split(m, child, upper);
        self.facts_split(m, child, upper);
        m
    }

    /// Cuts `node` after its first `upper` pages (`0 < upper <` its pages)
    /// and returns the new upper node; `node` keeps the rest.
    pub(crate) fn split_at(&mut self, node: u32, upper: u32) -> u32 {
        let mut at = self.nodes()[node as usize].first_page;
        for _ in 0..upper {
            at = self.pages()[at as usize].next;
        }
        self.split(node, at, upper)
    }

    fn split_inner(&mut self, child: u32, at: u32, upper: u32) -> u32 {
        let c = self.nodes()[child as usize];
        let upper_last = self.pages()[at as usize].prev;
        self.pages_mut()[upper_last as usize].next = NIL;
        self.pages_mut()[at as usize].prev = NIL;
        let m = self.node_alloc();
        {
            let n = &mut self.nodes_mut()[m as usize];
            n.parent = c.parent;
            n.first_page = c.first_page;
            n.last_page = upper_last;
            n.num_pages = upper;
            n.children = 1;
            n.lock_ref = c.lock_ref;
            n.hash = c.hash;
            n.ns = c.ns;
            // SWA pages split with the edge; a state stays below.
            n.swa = c.swa;
        }
        // The upper half is complete before the table can lead to it.
        self.version(m).end();
        // The bucket for (parent, first page) now leads to the upper half,
        // and the lower half is filed under it, in one change of the table:
        // a probe between the two would find the upper half childless and
        // report a shorter prefix than was ever the longest cached.
        let hash = child_hash(m, c.ns, self.page_tokens(at));
        self.table_change(|a| {
            a.table_replace_unversioned(child, m);
            {
                let n = &mut a.nodes_mut()[child as usize];
                n.parent = m;
                n.first_page = at;
                n.num_pages -= upper;
                n.hash = hash;
            }
            a.table_insert_unversioned(child);
        });
        m
    }

    /// Hangs a new leaf under `parent` holding `pages` (claimed by the caller)
    /// with the tokens `key`, one page per `page_size` tokens.
    pub fn add_leaf(&mut self, parent: u32, key: &[u32], pages: &[u32]) -> u32 {
        self.add_leaf_inner(parent, key, pages)
    }

    /// The namespace of a leaf hung under `parent`: under the root, the
    /// operation's; below, the parent's.
    pub(crate) fn leaf_namespace(&self, parent: u32) -> u32 {
        if parent == ROOT {
            self.ns
        } else {
            self.nodes()[parent as usize].ns
        }
    }

    fn add_leaf_inner(&mut self, parent: u32, key: &[u32], pages: &[u32]) -> u32 {
        self.record_stored(parent, key, pages);
        let leaf = self.node_alloc();
        let ns = self.leaf_namespace(parent);
        {
            let n = &mut self.nodes_mut()[leaf as usize];
            n.parent = parent;
            n.ns = ns;
        }
        self.fill(leaf, key, pages);
        // The leaf is complete before the table can lead to it.
        self.version(leaf).end();
        self.table_insert(leaf);
        self.nodes_mut()[parent as usize].children += 1;
        self.facts_leaf(leaf, parent);
        self.lru.stamp(leaf);
        self.refile(leaf);
        self.refile(parent);
        self.count_cached(leaf, pages.len());
        leaf
    }

    /// Records that `pages` (with the tokens `key`) became cached below
    /// `parent`, while KV events are recorded.
    pub(crate) fn record_stored(&mut self, parent: u32, key: &[u32], pages: &[u32]) {
        let ns = self.leaf_namespace(parent);
        self.record_stored_in(parent, key, pages, ns);
    }

    /// [`Self::record_stored`] of a run cached in namespace `ns` (a
    /// promote's: the node's own, whatever the call's namespace is).
    pub(crate) fn record_stored_in(&mut self, parent: u32, key: &[u32], pages: &[u32], ns: u32) {
        if !self.recording() {
            return;
        }
        let p = self.page_size();
        let parent_page = self.run_parent(parent);
        let pages_copy = self.record_copy(pages);
        let tokens = self.record_copy(&key[..pages.len() * p]);
        self.record(|_| CacheEvent::Stored {
            parent: parent_page,
            pages: pages_copy,
            tokens,
            ns,
        });
    }

    /// Gives `node` (inside its version, its parent and namespace set)
    /// `pages` (claimed by the caller) holding the tokens `key`, one page
    /// per `page_size` tokens, and the hash it is filed under.
    pub(crate) fn fill(&mut self, node: u32, key: &[u32], pages: &[u32]) {
        let p = self.page_size();
        let mut prev = NIL;
        // Runs of consecutive ids: their records lie side by side, so each
        // run's are numbered in one pass over one slice.
        let mut start = 0;
        for i in 1..=pages.len() {
            if i == pages.len() || pages[i] != pages[i - 1].wrapping_add(1) {
                let (first, len) = (pages[start] as usize, i - start);
                for (k, pg) in self.pages_mut()[first..first + len].iter_mut().enumerate() {
                    pg.owner_or_run = (len - k) as u32;
                }
                start = i;
            }
        }
        for (i, &page) in pages.iter().enumerate() {
            let at = page as usize * p;
            self.tokens_mut()[at..at + p].copy_from_slice(&key[i * p..(i + 1) * p]);
            let pg = &mut self.pages_mut()[page as usize];
            pg.state = PAGE_CACHED;
            pg.prev = prev;
            pg.next = NIL;
            if prev != NIL {
                self.pages_mut()[prev as usize].next = page;
            }
            prev = page;
        }
        let n = self.nodes()[node as usize];
        let hash = child_hash(n.parent, n.ns, &key[..p]);
        let n = &mut self.nodes_mut()[node as usize];
        n.first_page = pages[0];
        n.last_page = prev;
        n.num_pages = pages.len() as u32;
        n.hash = hash;
    }

    /// Counts the `pages` just cached on `node` (owned by a client until
    /// now): cached tokens, evictable or protected as `node` is locked.
    pub(crate) fn count_cached(&mut self, node: u32, pages: usize) {
        let tokens = (pages * self.page_size()) as u64;
        let locked = self.nodes()[node as usize].lock_ref > 0;
        let h = self.hdr_mut();
        h.owned_pages -= pages as u32;
        h.total_tokens += tokens;
        if locked {
            h.protected_tokens += tokens;
        } else {
            h.evictable_tokens += tokens;
        }
    }

    /// Takes a lock on `node` and every ancestor (the root excluded), moving
    /// tokens from evictable to protected on each 0 → 1 transition.
    /// Returns the lock's serial, which its release names (0 without SWA,
    /// whose locks are all alike).
    pub fn lock_path(&mut self, node: u32) -> u32 {
        self.lock_path_inner(node);
        let serial = self.hy_lock(node);
        // Only `node` can be a leaf: its ancestors have children (but for
        // the device node above a host-only one: `host_relocked`).
        self.refile(node);
        self.host_relocked(node);
        serial
    }

    fn lock_path_inner(&mut self, mut node: u32) {
        let p = self.page_size() as u64;
        let mut hops = 0;
        while node != ROOT {
            hops = self.hop(hops);
            let n = self.nodes()[node as usize];
            if n.lock_ref == 0 {
                let t = u64::from(n.num_pages) * p;
                let h = self.hdr_mut();
                h.evictable_tokens -= t;
                h.protected_tokens += t;
            }
            self.nodes_mut()[node as usize].lock_ref += 1;
            node = n.parent;
        }
    }

    /// The mirror of [`Self::lock_path`]: drops the lock `serial` names.
    pub fn unlock_path(&mut self, node: u32, serial: u32) {
        self.unlock_path_inner(node);
        self.hy_unlock(node, serial);
        self.refile(node);
        self.host_relocked(node);
    }

    fn unlock_path_inner(&mut self, mut node: u32) {
        let p = self.page_size() as u64;
        let mut hops = 0;
        while node != ROOT {
            hops = self.hop(hops);
            let n = self.nodes()[node as usize];
            if n.lock_ref == 1 {
                let t = u64::from(n.num_pages) * p;
                let h = self.hdr_mut();
                h.evictable_tokens += t;
                h.protected_tokens -= t;
            }
            self.nodes_mut()[node as usize].lock_ref -= 1;
            node = n.parent;
        }
    }

    /// Frees up to `want` pages, least recently used unlocked leaf first,
    /// each trimmed from its end page by page. Returns the pages freed.
    ///
    /// The victims are the oldest candidates of `lru` (unlocked leaves), so
    /// no locked or inner node is ever visited; a parent that a victim
    /// leaves an unlocked leaf joins them at its place (under root-MRU
    /// chains, as the next victim).
    pub fn evict_pages(&mut self, want: u64) -> u64 {
        let (mut freed, mut visited) = (0, 0);
        while freed < want {
            let Some(victim) = self.lru.oldest() else {
                break;
            };
            visited += 1;
            let n = u64::from(self.nodes()[victim as usize].num_pages);
            // A node with a host copy loses its device pages whole (it is
            // demoted, as SGLang's HiCache frees a backed-up leaf's value).
            let take = if self.backed(victim) {
                n
            } else {
                (want - freed).min(n)
            };
            self.evict_leaf(victim, take);
            freed += take;
        }
        let h = self.hdr_mut();
        h.evict_scanned += visited;
        freed
    }

    /// Trims `take` pages from the end of the unlocked leaf `victim`,
    /// removing it when that is all of them (its parent may then become a
    /// candidate: usually the next victim, its stamp being the next after
    /// its last child's under root-MRU chains). A victim with a host copy
    /// that loses all its pages is demoted instead: it stays, host-only
    /// (see `host`).
    pub(crate) fn evict_leaf(&mut self, victim: u32, take: u64) {
        let n = self.nodes()[victim as usize];
        let whole = take == u64::from(n.num_pages);
        let demote = whole && self.backed(victim);
        if demote {
            self.host_keep_tokens(victim);
        }
        let mut gone = if self.recording() {
            Vec::with_capacity(take as usize)
        } else {
            Vec::new()
        };
        // One change of the leaf: readers standing on it retry.
        self.version(victim).begin();
        for _ in 0..take {
            let page = self.trim_last_page(victim);
            if self.recording() {
                gone.push(page);
            }
        }
        if demote {
            self.demote_unversioned(victim);
        } else if whole {
            self.node_remove(victim);
        } else {
            self.host_trimmed(victim);
        }
        self.version(victim).end();
        // Exactly the pages trimmed from this leaf's end.
        self.record(|_| CacheEvent::Removed { pages: gone });
        if whole {
            self.lru.remove(victim);
            self.refile(n.parent);
        }
        if demote {
            self.host_refile(victim);
        }
        self.hdr_mut().evicted_pages += take;
    }

    /// Returns the last page of the unlocked leaf `node` to the pool (or to
    /// limbo, when readers are given a grace period), and names it. Inside
    /// the node's version.
    fn trim_last_page(&mut self, node: u32) -> u32 {
        let last = self.nodes()[node as usize].last_page;
        let prev = self.pages()[last as usize].prev;
        if prev != NIL {
            self.pages_mut()[prev as usize].next = NIL;
        }
        {
            let n = &mut self.nodes_mut()[node as usize];
            n.last_page = prev;
            n.num_pages -= 1;
            if n.num_pages == 0 {
                n.first_page = NIL;
            }
        }
        self.hy_trim(node, last);
        self.release_evicted_page(last);
        let p = self.page_size() as u64;
        let h = self.hdr_mut();
        h.total_tokens -= p;
        h.evictable_tokens -= p;
        last
    }

    /// Unhooks a node that has lost all its pages and children (inside the
    /// node's version), and frees it or retires it to limbo. The caller
    /// takes it out of the LRU heap.
    fn node_remove(&mut self, node: u32) {
        self.hy_remove(node);
        self.host_forget(node);
        self.table_remove(node);
        let parent = self.nodes()[node as usize].parent;
        self.nodes_mut()[parent as usize].children -= 1;
        self.node_unlink(node);
        if !self.retire_node(node) {
            self.node_push_free(node);
        }
    }

    /// Takes a free slot and makes it an empty live node, with its version
    /// begun: the caller fills it, then ends the version before anything
    /// (the child table) leads a reader to it.
    pub(crate) fn node_alloc(&mut self) -> u32 {
        let node = self.hdr().node_free;
        // Cannot run dry: each non-root node holds a page of its own, and
        // there are `capacity + 1` slots.
        debug_assert_ne!(node, NIL);
        let next = self.nodes()[node as usize].link;
        let h = self.hdr_mut();
        h.node_free = next;
        h.nodes_live += 1;
        self.version(node).begin();
        let n = &mut self.nodes_mut()[node as usize];
        *n = Node::empty(n.generation.wrapping_add(1), NODE_LIVE, NIL);
        node
    }

    /// Marks `node` free (not yet reusable): a handle to it is stale from
    /// now on, even before reuse. Inside the node's version.
    fn node_unlink(&mut self, node: u32) {
        let n = &mut self.nodes_mut()[node as usize];
        n.state = NODE_FREE;
        n.generation = n.generation.wrapping_add(1);
        n.parent = NIL;
        n.link = NIL;
        self.hdr_mut().nodes_live -= 1;
    }

    /// Makes the free `node` reusable: pushes it on the free-node stack.
    pub(crate) fn node_push_free(&mut self, node: u32) {
        let head = self.hdr().node_free;
        self.nodes_mut()[node as usize].link = head;
        self.hdr_mut().node_free = node;
    }
}

impl<R: Region> Arena<R> {
    /// Marks the path from the root to `node` as just used, `node` first,
    /// so the root side is newest.
    pub fn touch(&mut self, mut node: u32) {
        let mut hops = 0;
        while node != ROOT {
            hops = self.hop(hops);
            self.lru.stamp(node);
            node = self.nodes()[node as usize].parent;
        }
    }

    /// Whether eviction may take `node` now: a live unlocked leaf.
    pub fn evictable(&self, node: u32) -> bool {
        let n = &self.nodes()[node as usize];
        node != ROOT && n.state == NODE_LIVE && n.children == 0 && n.lock_ref == 0
    }

    /// Puts `node` in the heap or takes it out, as [`Self::evictable`]
    /// says, after its children or locks changed.
    pub fn refile(&mut self, node: u32) {
        match (self.evictable(node), self.lru.contains(node)) {
            (true, false) => self.lru.insert(node),
            (false, true) => self.lru.remove(node),
            _ => {}
        }
    }
}
