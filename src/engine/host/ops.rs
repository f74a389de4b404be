//! The host tier's operations: the tree's side (demote, promote, private
//! splits and walks, host leaves) on the arena, the requests on the
//! engine, and the tier's invariants.

use std::collections::HashSet;

use super::{unfile, HostError, HostNode, HostPart, HostStats, HostTier};
use crate::engine::arena::Arena;
use crate::engine::cache::{ClientId, Engine};
use crate::engine::error::InvariantError;
use crate::engine::heap::{Entry, Heap};
use crate::engine::layout::{Node, NIL, NODE_FREE, NODE_HOST, NODE_LIVE, ROOT};
use crate::engine::lock::Handle;
use crate::engine::lru::Recency;
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
        self.record_stored(parent, &tokens, pages);
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
        let m = self.node_alloc();
        let c = self.nodes()[node as usize];
        {
            let n = &mut self.nodes_mut()[m as usize];
            let generation = n.generation;
            *n = Node::empty(generation, NODE_HOST, NIL);
            n.parent = c.parent;
            n.ns = c.ns;
            n.lock_ref = c.lock_ref;
            n.children = 0;
        }
        self.version(m).end();
        self.hdr_mut().nodes_live -= 1;
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
            self.host_rekey(node);
        }
        self.lru.stamp(m);
        m
    }

    /// The host-only child of `parent` whose first page is `key`'s, and how
    /// many of its pages `key` (whole pages) matches (at least one).
    fn host_follow(&self, parent: u32, key: &[u32]) -> Option<(u32, u32)> {
        let p = self.layout.page_size as usize;
        let t = self.host.as_deref()?;
        let first = key.get(..p)?;
        let ns = if parent == ROOT {
            self.ns
        } else {
            self.nodes()[parent as usize].ns
        };
        let nodes = self.nodes();
        let child = t.kids.get(&parent)?.iter().copied().find(|&k| {
            nodes[k as usize].ns == ns
                && t.part(k)
                    .is_some_and(|part| part.tokens.get(..p) == Some(first))
        })?;
        let tokens = &t.part(child)?.tokens;
        let same = tokens
            .chunks_exact(p)
            .zip(key.chunks_exact(p))
            .take_while(|(a, b)| a == b)
            .count();
        Some((child, same as u32))
    }

    /// Follows `key` (whole pages) from the device node `node` through its
    /// host-only descendants, splitting the one it ends inside; appends the
    /// host pages passed to `host_pages`. Returns the deepest node reached
    /// and the pages matched.
    fn host_walk(&mut self, mut node: u32, key: &[u32], host_pages: &mut Vec<u32>) -> (u32, usize) {
        let p = self.layout.page_size as usize;
        let mut pos = 0;
        while let Some((child, same)) = self.host_follow(node, &key[pos..]) {
            let len = self
                .host
                .as_deref()
                .and_then(|t| t.part(child))
                .map_or(0, |part| part.pages.len());
            let child = if (same as usize) < len {
                self.host_split_private(child, same)
            } else {
                child
            };
            if let Some(part) = self.host.as_deref().and_then(|t| t.part(child)) {
                host_pages.extend_from_slice(&part.pages);
            }
            pos += same as usize * p;
            node = child;
            if (same as usize) < len {
                break;
            }
        }
        (node, pos / p)
    }

    /// Whether host eviction may take `node` now: host-only, unlocked, no
    /// host-only children.
    fn host_evictable(&self, node: u32) -> bool {
        let Some(t) = self.host.as_deref() else {
            return false;
        };
        let n = &self.nodes()[node as usize];
        n.state == NODE_HOST && n.lock_ref == 0 && !t.kids.contains_key(&node)
    }

    /// Puts `node` among host eviction's candidates or takes it out, as
    /// [`Self::host_evictable`] says.
    pub(crate) fn host_refile(&mut self, node: u32) {
        if self.host.is_none() {
            return;
        }
        let stamp = self.lru.stamp_of(node);
        let evictable = self.host_evictable(node);
        let Some(t) = self.host.as_deref_mut() else {
            return;
        };
        match (evictable, t.slot[node as usize]) {
            (true, 0) => t.leaves.push(&mut t.slot, Entry { key: stamp, node }),
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
    fn host_unleaf(&mut self, node: u32) {
        if let Some(t) = self.host.as_deref_mut() {
            if let Some(at) = t.slot[node as usize].checked_sub(1) {
                t.leaves.remove_at(&mut t.slot, at as usize);
            }
        }
    }

    /// Moves the candidate `node` to the place its new stamp gives it.
    fn host_rekey(&mut self, node: u32) {
        let stamp = self.lru.stamp_of(node);
        if let Some(t) = self.host.as_deref_mut() {
            if let Some(at) = t.slot[node as usize].checked_sub(1) {
                t.leaves.rekey(&mut t.slot, at as usize, stamp);
            }
        }
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
    fn tier(&self) -> Result<&HostTier, HostError> {
        self.arena.host.as_deref().ok_or(HostError::NoHostTier)
    }

    /// The node `handle` names, device or host-only.
    fn host_resolve(&self, handle: u64) -> Result<u32, HostError> {
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
        let t = self.tier()?;
        for (i, &page) in host_pages.iter().enumerate() {
            if page >= t.capacity {
                return Err(HostError::OutOfRange {
                    page,
                    capacity: t.capacity,
                });
            }
            if t.owner[page as usize] != NIL || host_pages[..i].contains(&page) {
                return Err(HostError::InUse { page });
            }
        }
        let Some(t) = self.arena.host.as_deref_mut() else {
            return Err(HostError::NoHostTier);
        };
        for &page in host_pages {
            t.owner[page as usize] = node;
        }
        t.used += host_pages.len() as u32;
        t.parts[node as usize] = Some(HostPart {
            pages: host_pages.to_vec(),
            tokens: Vec::new(),
        });
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
            let Some((child, same)) = self.arena.host_follow(node, &key[pos..]) else {
                break;
            };
            let len = self
                .arena
                .host
                .as_deref()
                .and_then(|t| t.part(child))
                .map_or(0, |part| part.pages.len());
            let child = if (same as usize) < len {
                self.arena.host_split_private(child, same)
            } else {
                child
            };
            let same = same as usize;
            self.arena.promote(child, &pages[cached..cached + same]);
            cached += same;
            pos += same * p;
            node = child;
            if same < len {
                break;
            }
        }
        (node, cached)
    }
}

impl<R: Region> Engine<R> {
    /// The host tier's invariants (see the module's).
    pub(crate) fn validate_host(&self) -> Result<(), InvariantError> {
        macro_rules! ensure {
            ($cond:expr, $($msg:tt)+) => {
                if !$cond {
                    return Err(InvariantError(format!($($msg)+)));
                }
            };
        }
        let a = &self.arena;
        let nodes = a.nodes();
        let p = a.layout.page_size as usize;
        let Some(t) = a.host.as_deref() else {
            ensure!(
                nodes.iter().all(|n| n.state != NODE_HOST),
                "a host-only node without a host tier"
            );
            return Ok(());
        };
        let filed: HashSet<u32> = a
            .buckets()
            .iter()
            .map(|b| b.node)
            .filter(|&n| n != NIL)
            .collect();
        let (mut used, mut host_nodes) = (0u32, 0u32);
        for (i, n) in nodes.iter().enumerate() {
            let i = i as u32;
            let part = t.part(i);
            match n.state {
                NODE_FREE => ensure!(part.is_none(), "free node {i} keeps a host copy"),
                NODE_LIVE if i != ROOT => {
                    ensure!(
                        a.nodes()[n.parent as usize].state == NODE_LIVE,
                        "device node {i} under a host-only node"
                    );
                    if let Some(part) = part {
                        ensure!(
                            part.pages.len() == n.num_pages as usize && part.tokens.is_empty(),
                            "device node {i}'s host copy does not match its pages"
                        );
                    }
                }
                NODE_HOST => {
                    host_nodes += 1;
                    let Some(part) = part else {
                        return Err(InvariantError(format!("host-only node {i} has no copy")));
                    };
                    ensure!(
                        !part.pages.is_empty() && part.tokens.len() == part.pages.len() * p,
                        "host-only node {i} holds {} tokens for {} host pages",
                        part.tokens.len(),
                        part.pages.len()
                    );
                    ensure!(
                        n.num_pages == 0 && n.first_page == NIL && n.children == 0,
                        "host-only node {i} holds device pages or children"
                    );
                    ensure!(
                        !filed.contains(&i),
                        "host-only node {i} is in the child table"
                    );
                    let parent = nodes.get(n.parent as usize).map(|u| u.state);
                    ensure!(
                        n.parent == ROOT || matches!(parent, Some(NODE_LIVE | NODE_HOST)),
                        "host-only node {i} hangs under a free node"
                    );
                    ensure!(
                        t.kids.get(&n.parent).is_some_and(|k| k
                            .iter()
                            .filter(|&&c| c == i)
                            .count()
                            == 1),
                        "host-only node {i} is not filed once under its parent"
                    );
                    if n.parent != ROOT {
                        ensure!(
                            nodes[n.parent as usize].ns == n.ns,
                            "host-only node {i} is in another namespace than its parent"
                        );
                    }
                }
                _ => {}
            }
            if let Some(part) = part {
                ensure!(i != ROOT, "the root has a host copy");
                ensure!(
                    n.parent == ROOT || t.part(n.parent).is_some(),
                    "node {i} is backed up but its parent is not"
                );
                for &page in &part.pages {
                    ensure!(
                        page < t.capacity && t.owner[page as usize] == i,
                        "host page {page} of node {i} is not recorded as its"
                    );
                }
                used += part.pages.len() as u32;
            }
        }
        let owned = t.owner.iter().filter(|&&o| o != NIL).count() as u32;
        ensure!(
            used == t.used && owned == used,
            "host pages: {used} in copies, {owned} owned, {} counted",
            t.used
        );
        ensure!(
            host_nodes == t.host_nodes,
            "{host_nodes} host-only nodes, {} counted",
            t.host_nodes
        );
        for (&parent, list) in &t.kids {
            ensure!(
                !list.is_empty(),
                "node {parent} files an empty list of host children"
            );
            let mut firsts: Vec<&[u32]> = Vec::new();
            for &k in list {
                let n = &nodes[k as usize];
                ensure!(
                    n.state == NODE_HOST && n.parent == parent,
                    "node {k} filed as a host child of {parent}"
                );
                let first = t
                    .part(k)
                    .and_then(|part| part.tokens.get(..p))
                    .unwrap_or(&[]);
                ensure!(
                    !firsts.iter().any(|f| *f == first && !first.is_empty())
                        && a.find_child(parent, n.ns, first).is_none(),
                    "two children of {parent} begin with the same page"
                );
                firsts.push(first);
            }
        }
        let heap = t.leaves.entries();
        for (at, e) in heap.iter().enumerate() {
            ensure!(
                a.host_evictable(e.node) && t.slot[e.node as usize] == at as u32 + 1,
                "host heap holds node {}, not a host leaf in its place",
                e.node
            );
            ensure!(
                e.key == a.lru.stamp_of(e.node),
                "host heap key of node {} is stale",
                e.node
            );
            if at > 0 {
                let up = heap[Heap::<u64>::parent_of(at)];
                ensure!(up.key <= e.key, "host heap order broken at node {}", e.node);
            }
        }
        let leaves = (0..nodes.len() as u32)
            .filter(|&i| a.host_evictable(i))
            .count();
        ensure!(
            leaves == heap.len(),
            "{leaves} host leaves, {} candidates",
            heap.len()
        );
        Ok(())
    }
}
