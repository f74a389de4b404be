//! The host tier's operations: the tree's side (demote, promote, private
//! splits and walks, host leaves) on the arena, the requests on the
//! engine, and the tier's invariants.

use super::{unfile, HostError, HostNode, HostPart, HostStats, HostTier};
use crate::engine::arena::Arena;
use crate::engine::cache::{ClientId, Engine};
use crate::engine::heap::Entry;
use crate::engine::layout::{Node, NIL, NODE_FREE, NODE_HOST, NODE_LIVE, ROOT};
use crate::engine::lock::Handle;
use crate::engine::lru::Recency;
use crate::engine::policy::Key;
use crate::engine::region::Region;

/// The answer to [`Engine::match_host`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostMatched {
    /// Tokens matched on device (their pages went to the caller's buffer).
    pub device_len: usize,
    /// The deepest device node matched (SGLang's `last_device_node`);
    /// `None`: the root.
    pub device: Option<Handle>,
    /// Tokens matched past it in host-only nodes (SGLang's
    /// `host_hit_length`; their host pages went to the second buffer).
    pub host_len: usize,
    /// The deepest node matched, device or host-only (SGLang's
    /// `best_match_node`, `last_host_node`); `None`: the root.
    pub best: Option<Handle>,
}

impl<R: Region> Arena<R> {
    /// Whether `node` has a host copy.
    #[inline]
    pub(crate) fn backed(&self, node: u32) -> bool {
        self.host
            .as_deref()
            .is_some_and(|t| t.parts[node as usize].is_some())
    }

    /// A split made `m` the upper `upper` pages of `child`: `m` takes the
    /// first `upper` host pages of `child`'s copy (and, host-only, their
    /// tokens).
    pub(crate) fn host_split(&mut self, m: u32, child: u32, upper: u32) {
        let p = self.layout.page_size as usize;
        let Some(t) = self.host.as_deref_mut() else {
            return;
        };
        let (m, c) = (m as usize, child as usize);
        if let Some(d) = t.digests[c].as_mut() {
            let lower = d.split_off((upper as usize).min(d.len()));
            t.digests[m] = Some(std::mem::replace(d, lower));
        }
        // The upper half is under every lock the child was; a segment that
        // ended at the child now ends above it.
        t.host_locks[m] = t.host_locks[c];
        if t.host_locks[c] > 0 {
            for seg in t.receipts.values_mut().filter(|seg| seg.1 == child) {
                seg.1 = m as u32;
            }
        }
        let (m, child) = (m as u32, child);
        let Some(c) = t.parts[child as usize].as_mut() else {
            return;
        };
        let upper = upper as usize;
        let lower = HostPart {
            pages: c.pages.split_off(upper),
            tokens: if c.tokens.is_empty() {
                Vec::new()
            } else {
                c.tokens.split_off(upper * p)
            },
        };
        let top = std::mem::replace(c, lower);
        for &page in &top.pages {
            t.owner[page as usize] = m;
        }
        t.parts[m as usize] = Some(top);
    }

    /// Copies the tokens of `node`'s pages into its host copy, before a
    /// demote takes the pages.
    pub(crate) fn host_keep_tokens(&mut self, node: u32) {
        let n = self.nodes()[node as usize];
        let p = self.layout.page_size as usize;
        let mut tokens = Vec::with_capacity(n.num_pages as usize * p);
        let mut page = n.first_page;
        let mut hops = 0;
        while page != NIL {
            hops = self.hop(hops);
            tokens.extend_from_slice(self.page_tokens(page));
            page = self.pages()[page as usize].next;
        }
        if let Some(part) = self
            .host
            .as_deref_mut()
            .and_then(|t| t.parts[node as usize].as_mut())
        {
            part.tokens = tokens;
        }
    }

    /// Makes the backed leaf `node`, whose pages were just trimmed, host-only
    /// (inside its version, as `node_remove` is): out of the child table,
    /// counted as its parent's host-only child; its slot and generation stay.
    pub(crate) fn demote_unversioned(&mut self, node: u32) {
        self.table_remove(node);
        let parent = self.nodes()[node as usize].parent;
        self.nodes_mut()[parent as usize].children -= 1;
        let n = &mut self.nodes_mut()[node as usize];
        n.state = NODE_HOST;
        n.link = NIL;
        self.hdr_mut().nodes_live -= 1;
        if let Some(t) = self.host.as_deref_mut() {
            t.kids.entry(parent).or_default().push(node);
            t.host_nodes += 1;
        }
    }

    /// Files the host-only `node` as a device node again with `pages`
    /// (claimed by the caller), which take its tokens: a load-back, or an
    /// insert meeting it. Its parent is a device node or the root.
    pub(crate) fn promote(&mut self, node: u32, pages: &[u32]) {
        let parent = self.nodes()[node as usize].parent;
        let Some(t) = self.host.as_deref_mut() else {
            return;
        };
        let tokens = t.parts[node as usize]
            .as_mut()
            .map(|part| std::mem::take(&mut part.tokens))
            .unwrap_or_default();
        unfile(&mut t.kids, parent, node);
        t.host_nodes -= 1;
        self.host_unleaf(node);
        // The node's namespace, not the call's (a load-back of a root child
        // runs in any namespace).
        let ns = self.nodes()[node as usize].ns;
        self.record_stored_in(parent, &tokens, pages, ns);
        self.version(node).begin();
        self.fill(node, &tokens, pages);
        self.nodes_mut()[node as usize].state = NODE_LIVE;
        // Complete before the table can lead to it, as a new leaf is.
        self.version(node).end();
        self.table_insert(node);
        self.nodes_mut()[parent as usize].children += 1;
        self.hdr_mut().nodes_live += 1;
        self.refile(node);
        self.refile(parent);
        self.count_cached(node, pages.len());
    }

    /// Cuts the host-only `node` after its first `upper` pages; returns the
    /// new upper node (host-only too), as a device split does.
    fn host_split_private(&mut self, node: u32, upper: u32) -> u32 {
        let c = self.nodes()[node as usize];
        let m = self.host_node_alloc(c.parent, c.ns, c.lock_ref);
        self.nodes_mut()[node as usize].parent = m;
        self.host_split(m, node, upper);
        if let Some(t) = self.host.as_deref_mut() {
            if let Some(list) = t.kids.get_mut(&c.parent) {
                for k in list.iter_mut().filter(|k| **k == node) {
                    *k = m;
                }
            }
            t.kids.insert(m, vec![node]);
            t.host_nodes += 1;
        }
        self.facts_split(m, node, upper);
        if self.lru.recency() == Recency::Sglang {
            self.lru.stamp(node);
        }
        // The split moved the lower half's facts (T-LRU: the tokens above it).
        self.host_rekey(node);
        self.lru.stamp(m);
        m
    }

    /// Whether slot `node` holds a node, device or host-only.
    pub(super) fn is_node(&self, node: u32) -> bool {
        matches!(self.nodes()[node as usize].state, NODE_LIVE | NODE_HOST)
    }

    /// How many leading pages of the device node `node`'s edge `key`
    /// (whole pages) holds.
    pub(super) fn edge_matches(&self, node: u32, key: &[u32]) -> usize {
        let p = self.layout.page_size as usize;
        let (mut page, mut same, mut hops) = (self.nodes()[node as usize].first_page, 0, 0);
        while page != NIL && (same + 1) * p <= key.len() {
            hops = self.hop(hops);
            if !self.page_is(page, &key[same * p..(same + 1) * p]) {
                break;
            }
            same += 1;
            page = self.pages()[page as usize].next;
        }
        same
    }

    /// Records that `node` has a host copy on `pages` (checked free by the
    /// caller); `tokens` for a host-only node.
    pub(super) fn host_adopt(&mut self, node: u32, pages: &[u32], tokens: Vec<u32>) {
        if let Some(t) = self.host.as_deref_mut() {
            for &page in pages {
                t.owner[page as usize] = node;
            }
            t.used += pages.len() as u32;
            t.parts[node as usize] = Some(HostPart::new(pages, tokens));
        }
    }

    /// Hangs a new host-only node under `parent` holding `key`'s tokens on
    /// the host pages `pages` (checked free by the caller).
    pub(super) fn host_leaf(&mut self, parent: u32, key: &[u32], pages: &[u32]) -> u32 {
        let ns = self.leaf_namespace(parent);
        let leaf = self.host_node_alloc(parent, ns, 0);
        self.host_adopt(leaf, pages, key.to_vec());
        if let Some(t) = self.host.as_deref_mut() {
            t.kids.entry(parent).or_default().push(leaf);
            t.host_nodes += 1;
        }
        // Made now, no hits, its parent's priority (SGLang's
        // `_new_node(priority=node.priority)` in `insert_host`).
        self.facts_leaf(leaf, parent);
        if let Some(k) = self.lru.keyed.as_deref_mut() {
            k.priority[leaf as usize] = k.priority[parent as usize];
        }
        self.lru.stamp(leaf);
        self.host_refile(leaf);
        self.host_refile(parent);
        leaf
    }

    /// Pages of `node`'s edge: its device pages, or a host-only node's host
    /// pages.
    pub(crate) fn edge_pages(&self, node: u32) -> u64 {
        let n = &self.nodes()[node as usize];
        if n.state != NODE_HOST {
            return u64::from(n.num_pages);
        }
        self.host
            .as_deref()
            .and_then(|t| t.part(node))
            .map_or(0, |part| part.pages.len() as u64)
    }

    /// A fresh host-only node under `parent` (counted by the caller): a
    /// slot of its own, never in the child table.
    pub(super) fn host_node_alloc(&mut self, parent: u32, ns: u32, lock_ref: u32) -> u32 {
        let m = self.node_alloc();
        {
            let n = &mut self.nodes_mut()[m as usize];
            let generation = n.generation;
            *n = Node::empty(generation, NODE_HOST, NIL);
            n.parent = parent;
            n.ns = ns;
            n.lock_ref = lock_ref;
        }
        self.version(m).end();
        self.hdr_mut().nodes_live -= 1;
        m
    }

    /// The host-only child of `parent` whose first page is `key`'s, and how
    /// many of its pages `key` (whole pages) matches (at least one).
    fn host_follow(&self, parent: u32, key: &[u32]) -> Option<(u32, u32)> {
        let p = self.layout.page_size as usize;
        let t = self.host.as_deref()?;
        let first = key.get(..p)?;
        let ns = self.leaf_namespace(parent);
        let nodes = self.nodes();
        let child = t.kids.get(&parent)?.iter().copied().find(|&k| {
            nodes[k as usize].ns == ns
                && t.part(k)
                    .is_some_and(|part| part.tokens.get(..p) == Some(first))
        })?;
        let tokens = &t.part(child)?.tokens;
        // Whole pages both sides hold, compared as one slice (a `memcmp`)
        // before page by page, as the device walk compares a run.
        let n = tokens.len().min(key.len() / p * p);
        let same = if tokens[..n] == key[..n] {
            n / p
        } else {
            tokens
                .chunks_exact(p)
                .zip(key.chunks_exact(p))
                .take_while(|(a, b)| a == b)
                .count()
        };
        Some((child, same as u32))
    }

    /// Follows `key` (whole pages) from the device node `node` through its
    /// host-only descendants, splitting the one it ends inside; appends the
    /// host pages passed to `host_pages`. Returns the deepest node reached
    /// and the pages matched.
    fn host_walk(&mut self, mut node: u32, key: &[u32], host_pages: &mut Vec<u32>) -> (u32, usize) {
        let p = self.layout.page_size as usize;
        let mut pos = 0;
        while let Some((child, same, whole)) = self.host_enter(node, &key[pos..]) {
            if let Some(part) = self.host.as_deref().and_then(|t| t.part(child)) {
                host_pages.extend_from_slice(&part.pages);
            }
            pos += same * p;
            node = child;
            if !whole {
                break;
            }
        }
        (node, pos / p)
    }

    /// The host-only child of `node` that `key` (whole pages) enters, split
    /// where the key leaves it; the pages it matched, and whether that was
    /// all of it (the walk goes on below only then).
    pub(super) fn host_enter(&mut self, node: u32, key: &[u32]) -> Option<(u32, usize, bool)> {
        let (child, same) = self.host_follow(node, key)?;
        if u64::from(same) < self.edge_pages(child) {
            return Some((self.host_split_private(child, same), same as usize, false));
        }
        Some((child, same as usize, true))
    }

    /// Whether host eviction may take `node` now: host-only, unlocked, no
    /// host-only children.
    pub(super) fn host_evictable(&self, node: u32) -> bool {
        let Some(t) = self.host.as_deref() else {
            return false;
        };
        let n = &self.nodes()[node as usize];
        n.state == NODE_HOST
            && n.lock_ref == 0
            && t.host_locks[node as usize] == 0
            && !t.kids.contains_key(&node)
    }

    /// After eviction trimmed pages from the end of the device node `node`
    /// (no host copy: it stays): its digests, one per page, lose theirs.
    pub(crate) fn host_trimmed(&mut self, node: u32) {
        let left = self.nodes()[node as usize].num_pages as usize;
        if let Some(d) = self
            .host
            .as_deref_mut()
            .and_then(|t| t.digests[node as usize].as_mut())
        {
            d.truncate(left);
        }
    }

    /// Forgets what the tier knew of `node`, which leaves the tree (a
    /// device node without a host copy: only its digests).
    pub(crate) fn host_forget(&mut self, node: u32) {
        if let Some(t) = self.host.as_deref_mut() {
            t.digests[node as usize] = None;
        }
    }

    /// Puts `node` among host eviction's candidates or takes it out, as
    /// [`Self::host_evictable`] says.
    pub(crate) fn host_refile(&mut self, node: u32) {
        if self.host.is_none() {
            return;
        }
        let key = self.host_key(node);
        let evictable = self.host_evictable(node);
        let Some(t) = self.host.as_deref_mut() else {
            return;
        };
        match (evictable, t.slot[node as usize]) {
            (true, 0) => t.leaves.push(&mut t.slot, Entry { key, node }),
            (false, at) if at > 0 => t.leaves.remove_at(&mut t.slot, at as usize - 1),
            _ => {}
        }
    }

    /// After a lock on `node` was taken or dropped: it may be a host leaf,
    /// and when it is host-only, the device node above its host-only
    /// ancestors may be a device leaf (its children are all host-only).
    pub(crate) fn host_relocked(&mut self, node: u32) {
        if self.host.is_none() {
            return;
        }
        self.host_refile(node);
        let mut at = node;
        let mut hops = 0;
        while self.nodes()[at as usize].state == NODE_HOST {
            hops = self.hop(hops);
            at = self.nodes()[at as usize].parent;
        }
        if at != node {
            self.refile(at);
        }
    }

    /// Takes `node` out of host eviction's candidates.
    pub(super) fn host_unleaf(&mut self, node: u32) {
        if let Some(t) = self.host.as_deref_mut() {
            if let Some(at) = t.slot[node as usize].checked_sub(1) {
                t.leaves.remove_at(&mut t.slot, at as usize);
            }
        }
    }

    /// Moves the candidate `node` to the place its new stamp or facts
    /// give it.
    pub(super) fn host_rekey(&mut self, node: u32) {
        let key = self.host_key(node);
        if let Some(t) = self.host.as_deref_mut() {
            if let Some(at) = t.slot[node as usize].checked_sub(1) {
                t.leaves.rekey(&mut t.slot, at as usize, key);
            }
        }
    }

    /// `node`'s place among host eviction's candidates: the device
    /// policy's key (SGLang's `drive_host_eviction` orders by the same
    /// strategy as device eviction).
    pub(super) fn host_key(&self, node: u32) -> Key {
        let stamp = self.lru.stamp_of(node);
        self.lru
            .keyed
            .as_deref()
            .map_or((0, stamp), |k| k.key(node, stamp))
    }

    /// Deletes the host leaf `node`: its host pages go to `freed`, its slot
    /// is free. Readers cannot reach it (it is in no table), and its version
    /// moved when it was demoted and moves again here, so it is freed at
    /// once.
    fn host_delete(&mut self, node: u32, freed: &mut Vec<u32>) {
        self.host_unleaf(node);
        let parent = self.nodes()[node as usize].parent;
        let Some(t) = self.host.as_deref_mut() else {
            return;
        };
        if let Some(part) = t.parts[node as usize].take() {
            for &page in &part.pages {
                t.owner[page as usize] = NIL;
            }
            t.used -= part.pages.len() as u32;
            freed.extend_from_slice(&part.pages);
        }
        unfile(&mut t.kids, parent, node);
        t.host_nodes -= 1;
        t.digests[node as usize] = None;
        self.node_change(node, |a| {
            let n = &mut a.nodes_mut()[node as usize];
            n.state = NODE_FREE;
            n.generation = n.generation.wrapping_add(1);
            n.parent = NIL;
            n.lock_ref = 0;
        });
        self.node_push_free(node);
        self.host_refile(parent);
    }
}

impl<R: Region> Engine<R> {
    pub(super) fn tier(&self) -> Result<&HostTier, HostError> {
        self.arena.host.as_deref().ok_or(HostError::NoHostTier)
    }

    /// The node `handle` names, device or host-only.
    pub(super) fn host_resolve(&self, handle: u64) -> Result<u32, HostError> {
        self.tier()?;
        Ok(self.resolve(handle)?)
    }

    /// The host tier's counts; `None` without one.
    pub fn host_stats(&self) -> Option<HostStats> {
        self.arena.host.as_deref().map(|t| HostStats {
            capacity: t.capacity,
            used: t.used,
            host_only_nodes: t.host_nodes,
        })
    }

    /// Where the KV of the node `handle` names lives (SGLang's
    /// `is_backuped`, `is_full_device_evicted`, `build_backup_spec`).
    pub fn host_node(&self, handle: u64) -> Result<HostNode, HostError> {
        let node = self.host_resolve(handle)?;
        Ok(HostNode {
            device_pages: self.arena.nodes()[node as usize].num_pages,
            host_pages: self
                .tier()?
                .part(node)
                .map(|p| p.pages.clone())
                .unwrap_or_default(),
        })
    }

    /// The nodes a write-through of the node `handle` names backs up, root
    /// side first: it and its ancestors without a host copy (SGLang's
    /// `_build_backup_kv_action` chain). Empty when it is backed up.
    pub fn backup_chain(&self, handle: u64) -> Result<Vec<Handle>, HostError> {
        let mut node = self.host_resolve(handle)?;
        let mut chain = Vec::new();
        let mut hops = 0;
        while node != ROOT && !self.arena.backed(node) {
            hops = self.arena.hop(hops);
            chain.push(self.handle_of(node));
            node = self.arena.nodes()[node as usize].parent;
        }
        chain.reverse();
        Ok(chain)
    }

    /// Records that the device node `handle` names has a host copy in
    /// `host_pages`, one per page (SGLang's `commit_backup`). Its parent
    /// must be backed up or the root. All or nothing.
    pub fn backup(&mut self, handle: u64, host_pages: &[u32]) -> Result<(), HostError> {
        let node = self.host_resolve(handle)?;
        if self.arena.backed(node) {
            return Err(HostError::AlreadyBacked(handle));
        }
        let n = self.arena.nodes()[node as usize];
        if n.parent != ROOT && !self.arena.backed(n.parent) {
            return Err(HostError::ParentNotBacked(handle));
        }
        if host_pages.len() != n.num_pages as usize {
            return Err(HostError::CountMismatch {
                expected: n.num_pages as usize,
                got: host_pages.len(),
            });
        }
        self.check_host_pages(host_pages)?;
        self.arena.host_adopt(node, host_pages, Vec::new());
        Ok(())
    }

    /// Finds the longest prefix of `tokens` cached on device or host
    /// (SGLang's `match_prefix` with HiCache on): device pages to `pages`,
    /// then the host pages of the host-only nodes past them to
    /// `host_pages` (both cleared first). Splits the node the match ends
    /// inside and marks the path up from the deepest node as just used.
    pub fn match_host(
        &mut self,
        tokens: &[u32],
        pages: &mut Vec<u32>,
        host_pages: &mut Vec<u32>,
    ) -> HostMatched {
        let key = &tokens[..self.aligned(tokens.len())];
        let p = self.page_size() as usize;
        pages.clear();
        host_pages.clear();
        let walk = self.arena.walk(key, pages);
        let device = self.arena.settle(walk);
        let (best, host) = if walk.partial.is_none() && self.arena.host.is_some() {
            self.arena
                .host_walk(device, &key[walk.pages * p..], host_pages)
        } else {
            (device, 0)
        };
        self.arena.touch(best);
        self.arena.host_rekey(best);
        let name = |node: u32| (node != ROOT).then(|| self.handle_of(node));
        HostMatched {
            device_len: walk.pages * p,
            device: name(device),
            host_len: host * p,
            best: name(best),
        }
    }

    /// The host-only nodes a load-back of the node `handle` names fills,
    /// root side first with their host pages: from the first host-only node
    /// below a device node down to it (SGLang's `build_load_back_spec`).
    /// Empty when it holds device pages.
    pub fn load_back_chain(&self, handle: u64) -> Result<Vec<(Handle, Vec<u32>)>, HostError> {
        let mut node = self.host_resolve(handle)?;
        let t = self.tier()?;
        let mut chain = Vec::new();
        let mut hops = 0;
        while node != ROOT && self.arena.nodes()[node as usize].state == NODE_HOST {
            hops = self.arena.hop(hops);
            let pages = t.part(node).map(|p| p.pages.clone()).unwrap_or_default();
            chain.push((self.handle_of(node), pages));
            node = self.arena.nodes()[node as usize].parent;
        }
        chain.reverse();
        Ok(chain)
    }

    /// Loads the chain [`Engine::load_back_chain`] names back to device:
    /// `pages` (owned by `client`, one per host page of the chain, root
    /// side first) take its nodes' tokens, and each node is a device node
    /// again, its host copy kept (SGLang's `commit_load_back`). Returns the
    /// tokens loaded. All or nothing.
    pub fn load_back(
        &mut self,
        client: ClientId,
        handle: u64,
        pages: &[u32],
    ) -> Result<usize, HostError> {
        let chain = self.load_back_chain(handle)?;
        if chain.is_empty() {
            return Err(HostError::NotHostOnly(handle));
        }
        let expected = chain.iter().map(|(_, host)| host.len()).sum();
        if pages.len() != expected {
            return Err(HostError::CountMismatch {
                expected,
                got: pages.len(),
            });
        }
        self.check_range(pages).map_err(HostError::Page)?;
        self.claim(client, pages, |_, _| false)
            .map_err(HostError::Page)?;
        let mut at = 0;
        for (h, host) in chain {
            self.arena.promote(h.node(), &pages[at..at + host.len()]);
            at += host.len();
        }
        Ok(expected * self.page_size() as usize)
    }

    /// Frees at least `pages` host pages (fewer only when fewer are
    /// evictable), least recently used host leaf first, each whole
    /// (SGLang's `drive_host_eviction`); appends the freed host page ids to
    /// `freed` in eviction order.
    pub fn evict_host(&mut self, pages: u64, freed: &mut Vec<u32>) {
        let start = freed.len();
        while ((freed.len() - start) as u64) < pages {
            let Some(victim) = self
                .arena
                .host
                .as_deref()
                .and_then(|t| t.leaves.top().map(|e| e.node))
            else {
                break;
            };
            self.arena.host_delete(victim, freed);
        }
    }

    /// Inserts past a device node: the host-only nodes `key` (whole pages,
    /// from page `cached` of the insert on) runs into are promoted with the
    /// insert's own pages there (SGLang's `_unevict_node_on_insert`: the
    /// request's pages are adopted, not freed). Returns the node reached
    /// and the pages cached now.
    pub(crate) fn host_relink(
        &mut self,
        mut node: u32,
        key: &[u32],
        pages: &[u32],
        mut cached: usize,
    ) -> (u32, usize) {
        let p = self.page_size() as usize;
        let mut pos = 0;
        while cached < pages.len() {
            let Some((child, same, whole)) = self.arena.host_enter(node, &key[pos..]) else {
                break;
            };
            self.arena.promote(child, &pages[cached..cached + same]);
            cached += same;
            pos += same * p;
            node = child;
            if !whole {
                break;
            }
        }
        (node, cached)
    }
}
