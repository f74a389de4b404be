//! The invariant checker: walks everything and cross-checks every count,
//! link and state. Tests and fuzzers call it after every operation.

use std::collections::HashMap;

use super::cache::Engine;
use super::error::InvariantError;
use super::heap::Heap;
use super::layout::{
    NIL, NODE_FREE, NODE_HOST, NODE_LIVE, PAGE_CACHED, PAGE_CLAIMED, PAGE_FREE, PAGE_OWNED,
    PAGE_RETIRED, ROOT,
};
use super::policy::Key;
use super::region::Region;
use super::table::child_hash;

/// Returns the invariant error `$msg` describes unless `$cond` holds (the
/// caller has `InvariantError` in scope).
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(InvariantError(format!($($msg)+)));
        }
    };
}
pub(super) use ensure;

impl<R: Region> Engine<R> {
    /// Checks every invariant of the engine; the first broken one is
    /// described in the error.
    pub fn validate(&self) -> Result<(), InvariantError> {
        let a = &self.arena;
        let h = a.hdr();
        let (nodes, pages) = (a.nodes(), a.pages());
        let p = u64::from(a.layout.page_size);
        let cap = a.layout.capacity as usize;

        // Pages: a state each; the free ring holds exactly the free ones.
        let mut in_ring = vec![false; cap];
        for k in 0..h.free_len {
            let page = a.free_ring()[((h.free_head + k) as usize) % cap];
            ensure!(
                (page as usize) < cap,
                "free ring holds page {page} out of range"
            );
            ensure!(
                !in_ring[page as usize],
                "page {page} twice in the free ring"
            );
            in_ring[page as usize] = true;
            ensure!(
                pages[page as usize].state == PAGE_FREE,
                "page {page} in ring but not free"
            );
        }
        let mut owned = 0u32;
        let mut retired = 0u32;
        let (limbo_pages, limbo_nodes) = a.in_limbo();
        for (i, pg) in pages.iter().enumerate() {
            match pg.state {
                PAGE_RETIRED => retired += 1,
                PAGE_FREE => ensure!(in_ring[i], "free page {i} missing from the ring"),
                PAGE_OWNED => owned += 1,
                PAGE_CACHED => {}
                PAGE_CLAIMED => ensure!(false, "page {i} left claimed"),
                s => ensure!(false, "page {i} has state {s}"),
            }
        }
        ensure!(
            retired == limbo_pages,
            "{retired} retired pages, {limbo_pages} in limbo"
        );
        ensure!(
            owned == h.owned_pages,
            "owned pages {owned} != header {}",
            h.owned_pages
        );

        // Nodes: tree shape, page lists, child table, token counts.
        let mut cached_by = vec![NIL; cap];
        let mut children = vec![0u32; nodes.len()];
        let (mut live, mut total, mut evictable, mut protected) = (0u32, 0u64, 0u64, 0u64);
        let mut host_only = 0u32;
        for (i, n) in nodes.iter().enumerate() {
            let i = i as u32;
            match n.state {
                NODE_FREE => continue,
                // Checked with the host tier (`validate_host`).
                NODE_HOST => {
                    host_only += 1;
                    continue;
                }
                NODE_LIVE => live += 1,
                s => ensure!(false, "node {i} has state {s}"),
            }
            if i == ROOT {
                ensure!(
                    n.num_pages == 0 && n.parent == NIL,
                    "root holds pages or a parent"
                );
                continue;
            }
            ensure!(
                (n.parent as usize) < nodes.len(),
                "node {i} has parent {}",
                n.parent
            );
            let parent = &nodes[n.parent as usize];
            ensure!(
                parent.state == NODE_LIVE,
                "node {i} hangs under a free node"
            );
            children[n.parent as usize] += 1;
            ensure!(n.num_pages > 0, "node {i} holds no page");
            let (mut page, mut prev, mut count) = (n.first_page, NIL, 0u32);
            while page != NIL {
                ensure!(
                    (page as usize) < cap,
                    "node {i} links page {page} out of range"
                );
                let pg = &pages[page as usize];
                ensure!(
                    pg.state == PAGE_CACHED,
                    "node {i} links uncached page {page}"
                );
                ensure!(cached_by[page as usize] == NIL, "page {page} in two nodes");
                ensure!(pg.prev == prev, "page {page} has a wrong back link");
                // The run: at least this page, and consecutive ids as far
                // as it says (or to the node's end, whichever is first).
                ensure!(pg.owner_or_run >= 1, "page {page} has an empty run");
                if pg.owner_or_run >= 2 && pg.next != NIL {
                    ensure!(
                        pg.next == page + 1
                            && pages[pg.next as usize].owner_or_run == pg.owner_or_run - 1,
                        "page {page}'s run of {} breaks at the next page",
                        pg.owner_or_run
                    );
                }
                cached_by[page as usize] = i;
                prev = page;
                page = pg.next;
                count += 1;
                ensure!(
                    count <= n.num_pages,
                    "node {i} has more pages than it counts"
                );
            }
            ensure!(
                count == n.num_pages && prev == n.last_page,
                "node {i} page list broken"
            );
            if n.parent != ROOT {
                let up = nodes.get(n.parent as usize).map(|u| u.ns);
                ensure!(
                    up == Some(n.ns),
                    "node {i} is in another namespace than its parent"
                );
            }
            let hash = child_hash(n.parent, n.ns, a.page_tokens(n.first_page));
            ensure!(n.hash == hash, "node {i} filed under a wrong hash");
            ensure!(
                a.find_child(n.parent, n.ns, a.page_tokens(n.first_page)) == Some(i),
                "node {i} not found from its parent by its first page"
            );
            let t = u64::from(n.num_pages) * p;
            total += t;
            if n.lock_ref == 0 {
                evictable += t;
            } else {
                protected += t;
            }
        }
        for (i, pg) in pages.iter().enumerate() {
            if pg.state == PAGE_CACHED {
                ensure!(cached_by[i] != NIL, "cached page {i} belongs to no node");
            }
        }
        ensure!(
            live == h.nodes_live,
            "live nodes {live} != header {}",
            h.nodes_live
        );
        for (i, n) in nodes.iter().enumerate() {
            if n.state == NODE_LIVE {
                ensure!(
                    n.children == children[i],
                    "node {i} counts {} children, has {}",
                    n.children,
                    children[i]
                );
            }
        }
        ensure!(
            total == h.total_tokens,
            "total tokens {total} != header {}",
            h.total_tokens
        );
        ensure!(
            evictable == h.evictable_tokens,
            "evictable {evictable} != header {}",
            h.evictable_tokens
        );
        ensure!(
            protected == h.protected_tokens,
            "protected {protected} != header {}",
            h.protected_tokens
        );
        let filed = a.buckets().iter().filter(|b| b.node != NIL).count() as u32;
        ensure!(
            filed + 1 == live,
            "child table files {filed} nodes, {live} live"
        );

        // Free-node stack holds exactly the free slots.
        let (mut free_nodes, mut at) = (0u32, h.node_free);
        while at != NIL {
            ensure!((at as usize) < nodes.len(), "free-node stack links {at}");
            ensure!(
                nodes[at as usize].state == NODE_FREE,
                "free-node stack holds live {at}"
            );
            free_nodes += 1;
            ensure!(free_nodes as usize <= nodes.len(), "free-node stack loops");
            at = nodes[at as usize].link;
        }
        ensure!(
            free_nodes + live + host_only + limbo_nodes == nodes.len() as u32,
            "node slots leak"
        );

        // Locks: lock_ref = locks held on the node and its descendants.
        let mut direct: HashMap<u32, u32> = HashMap::new();
        for (&(_, node), &count) in &self.locks {
            ensure!(count > 0, "empty lock record on node {node}");
            *direct.entry(node).or_insert(0) += count;
        }
        for (node, count) in self.session_locks() {
            *direct.entry(node).or_insert(0) += count;
        }
        let mut expect = vec![0u32; nodes.len()];
        for (&node, &count) in &direct {
            ensure!(
                matches!(nodes[node as usize].state, NODE_LIVE | NODE_HOST),
                "lock held on free node {node}"
            );
            let mut at = node;
            while at != ROOT {
                expect[at as usize] += count;
                at = nodes[at as usize].parent;
            }
        }
        for (i, n) in nodes.iter().enumerate() {
            if matches!(n.state, NODE_LIVE | NODE_HOST) && i as u32 != ROOT {
                ensure!(
                    n.lock_ref == expect[i],
                    "node {i} lock_ref {} but {} locks below",
                    n.lock_ref,
                    expect[i]
                );
            }
        }

        // LRU: every node used no later than its parent (root-MRU chains);
        // the heap holds exactly the unlocked leaves, in heap order.
        let lru = &a.lru;
        for (i, n) in nodes.iter().enumerate() {
            // A hybrid match cut back by a component marks only the usable
            // part used, as SGLang does: a node below may be the newer.
            if a.hybrid.is_none() && n.state == NODE_LIVE && i as u32 != ROOT && n.parent != ROOT {
                ensure!(
                    lru.stamp_of(n.parent) >= lru.stamp_of(i as u32),
                    "node {i} is newer than its parent {}",
                    n.parent
                );
            }
        }
        let listed = lru.listed();
        let heap: Vec<(u32, u64)> = lru.heaped().collect();
        for pair in listed.windows(2) {
            ensure!(
                lru.stamp_of(pair[0]) < lru.stamp_of(pair[1]),
                "LRU list out of order at node {}",
                pair[1]
            );
        }
        for (at, &(node, stamp)) in heap.iter().enumerate() {
            ensure!(
                stamp == lru.stamp_of(node),
                "LRU heap key of node {node} is stale"
            );
            if at > 0 {
                let (up, up_stamp) = heap[super::lru::Lru::parent_of(at)];
                ensure!(
                    up_stamp < stamp,
                    "LRU heap order broken at node {node} (under {up})"
                );
            }
        }
        let keyed = self.validate_policy()?;
        let candidates: Vec<u32> = listed
            .iter()
            .copied()
            .chain(heap.iter().map(|&(node, _)| node))
            .chain(keyed)
            .collect();
        for &node in &candidates {
            ensure!((node as usize) < nodes.len(), "LRU holds node {node}");
            ensure!(
                a.evictable(node),
                "LRU holds node {node}, not an unlocked leaf"
            );
            ensure!(lru.contains(node), "LRU position of {node} lost");
        }
        let heap = candidates;
        let leaves = (0..nodes.len() as u32).filter(|&i| a.evictable(i)).count();
        ensure!(
            leaves == heap.len(),
            "{leaves} unlocked leaves, {} LRU candidates",
            heap.len()
        );
        self.validate_components()?;
        self.validate_host()
    }

    /// The eviction policy's heap (none under LRU): every key as the
    /// node's facts give it, in heap order, and under T-LRU each live
    /// node's tokens above it as its path counts them and its branch's
    /// high-water mark no shallower than its end nor deeper than its
    /// parent's. Returns the heap's nodes, which the caller checks are the
    /// unlocked leaves.
    fn validate_policy(&self) -> Result<Vec<u32>, InvariantError> {
        let a = &self.arena;
        let Some(k) = a.lru.keyed.as_deref() else {
            return Ok(Vec::new());
        };
        let entries = k.heap.entries();
        for (at, e) in entries.iter().enumerate() {
            ensure!(
                e.key == k.key(e.node, a.lru.stamp_of(e.node)),
                "policy heap key of node {} is stale",
                e.node
            );
            if at > 0 {
                let up = &entries[Heap::<Key>::parent_of(at)];
                ensure!(
                    up.key <= e.key,
                    "policy heap order broken at node {} (under {})",
                    e.node,
                    up.node
                );
            }
        }
        if k.tlru() {
            let nodes = a.nodes();
            let p = u64::from(a.layout.page_size);
            for (i, n) in nodes.iter().enumerate() {
                if i as u32 == ROOT || n.state != NODE_LIVE {
                    continue;
                }
                let (mut above, mut at) = (0, n.parent);
                while at != ROOT {
                    above += u64::from(nodes[at as usize].num_pages) * p;
                    at = nodes[at as usize].parent;
                }
                ensure!(
                    k.above[i] == above,
                    "node {i}: T-LRU counts {} tokens above it, its path {above}",
                    k.above[i]
                );
                let end = above + u64::from(n.num_pages) * p;
                ensure!(
                    k.history[i] >= end,
                    "node {i}: T-LRU history {} short of its end {end}",
                    k.history[i]
                );
                ensure!(
                    n.parent == ROOT || k.history[n.parent as usize] >= k.history[i],
                    "node {i}: T-LRU history deeper than its parent's"
                );
            }
        }
        Ok(entries.iter().map(|e| e.node).collect())
    }

    /// The secondary components' invariants: SWA pages paired with exactly
    /// the cached pages of SWA-holding nodes (and clients' pages), each
    /// SWA page once, the lists holding exactly the nodes with data, lock
    /// counts as the holders' windows say, sizes as the nodes add up.
    fn validate_components(&self) -> Result<(), InvariantError> {
        let a = &self.arena;
        let nodes = a.nodes();
        let p = u64::from(a.layout.page_size);
        let holders: Vec<(u32, u32)> = self
            .locks
            .iter()
            .map(|(&(_, node), &count)| (node, count))
            .chain(self.session_locks())
            .collect();
        let live_node = |i: usize| i as u32 != ROOT && nodes[i].state == NODE_LIVE;
        // What readers see: each live node's component words.
        for (i, n) in nodes.iter().enumerate() {
            if !live_node(i) {
                continue;
            }
            let swa = a.swa().is_some_and(|s| s.live[i]);
            let state = a.mamba().map_or(NIL, |m| m.state[i]);
            ensure!(
                n.swa == u32::from(swa),
                "node {i}: swa word {} but SWA {swa}",
                n.swa
            );
            ensure!(
                n.mamba == state.wrapping_add(1),
                "node {i}: mamba word {} but state {state}",
                n.mamba
            );
        }
        if let Some(s) = a.swa() {
            let mut seen = vec![false; s.capacity as usize];
            for &sp in &s.free {
                ensure!(
                    (sp as usize) < seen.len(),
                    "SWA free page {sp} out of range"
                );
                ensure!(!seen[sp as usize], "SWA page {sp} twice in the free list");
                seen[sp as usize] = true;
            }
            let mut paired_pages = vec![false; a.layout.capacity as usize];
            let (mut evictable, mut protected) = (0u64, 0u64);
            for i in 0..nodes.len() {
                if !live_node(i) {
                    ensure!(
                        !s.live[i] && !s.list.contains(i as u32),
                        "free node {i} holds SWA"
                    );
                    continue;
                }
                let pages = a.node_page_list(i as u32);
                for &pg in &pages {
                    let sp = s.pair[pg as usize];
                    ensure!(
                        (sp != NIL) == s.live[i],
                        "page {pg} of node {i} paired {} but the node's SWA is {}",
                        sp != NIL,
                        s.live[i]
                    );
                    paired_pages[pg as usize] = true;
                }
                ensure!(
                    s.live[i] == s.list.contains(i as u32),
                    "SWA list membership of node {i}"
                );
                if s.live[i] {
                    let t = pages.len() as u64 * p;
                    if s.lock[i] > 0 {
                        protected += t;
                    } else {
                        evictable += t;
                    }
                }
            }
            for (pg, page) in a.pages().iter().enumerate() {
                let sp = s.pair[pg];
                if sp == NIL {
                    continue;
                }
                ensure!(
                    paired_pages[pg] || page.state == PAGE_OWNED,
                    "page {pg} (state {}) holds SWA page {sp}",
                    page.state
                );
                ensure!((sp as usize) < seen.len(), "SWA page {sp} out of range");
                ensure!(
                    !seen[sp as usize],
                    "SWA page {sp} paired twice or also free"
                );
                seen[sp as usize] = true;
            }
            ensure!(
                seen.iter().all(|&x| x),
                "an SWA page is neither free nor paired"
            );
            ensure!(
                s.list.len() as usize == s.list.order().len(),
                "SWA list length {} but {} linked",
                s.list.len(),
                s.list.order().len()
            );
            ensure!(
                (evictable, protected) == (s.evictable, s.protected),
                "SWA sizes {}/{} but nodes add up to {evictable}/{protected}",
                s.evictable,
                s.protected
            );
            let mut expect = vec![0u32; nodes.len()];
            let mut held = std::collections::HashMap::new();
            for &(node, count) in &holders {
                *held.entry(node).or_insert(0u32) += count;
            }
            // Each holder's serials, and nothing else, are its node's receipts.
            let mut serials: std::collections::HashMap<u32, Vec<u32>> = Default::default();
            for (&(_, node), held) in &self.serials {
                serials.entry(node).or_default().extend(held);
            }
            for session in self.sessions.values().filter(|x| x.node != ROOT) {
                serials
                    .entry(session.node)
                    .or_default()
                    .push(session.serial);
            }
            for (&node, receipts) in &s.receipts {
                ensure!(
                    held.get(&node) == Some(&(receipts.len() as u32)),
                    "node {node} has {} SWA receipts for {:?} locks",
                    receipts.len(),
                    held.get(&node)
                );
                let mut want = serials.remove(&node).unwrap_or_default();
                let mut have: Vec<u32> = receipts.iter().map(|r| r.serial).collect();
                want.sort_unstable();
                have.sort_unstable();
                ensure!(
                    want == have,
                    "node {node}'s SWA receipts {have:?} but its holders' serials {want:?}"
                );
                ensure!(
                    have.iter().all(|&x| s.names(node, x)),
                    "node {node} has a receipt from before its node"
                );
                for r in receipts.iter().map(|r| r.reach) {
                    let (mut cur, mut covered, mut hops) = (node, 0u64, 0);
                    while cur != ROOT && covered < r {
                        hops = a.hop(hops);
                        expect[cur as usize] += 1;
                        covered += a.node_tokens(cur);
                        cur = nodes[cur as usize].parent;
                    }
                    ensure!(
                        covered == r,
                        "node {node}'s SWA receipt {r} ends mid-edge at {covered}"
                    );
                }
            }
            ensure!(
                held.keys().all(|n| s.receipts.contains_key(n)),
                "a locked node has no SWA receipt"
            );
            ensure!(
                serials.is_empty(),
                "lock serials on nodes without receipts: {serials:?}"
            );
            for (i, &e) in expect.iter().enumerate() {
                ensure!(
                    s.lock[i] == e,
                    "node {i} SWA lock {} but windows say {e}",
                    s.lock[i]
                );
            }
        }
        if let Some(m) = a.mamba() {
            let mut held = vec![false; m.capacity as usize];
            for &slot in &m.free {
                ensure!(
                    (slot as usize) < held.len(),
                    "free state {slot} out of range"
                );
                ensure!(
                    m.is_free(slot) && !held[slot as usize],
                    "state {slot} free twice or owned"
                );
                held[slot as usize] = true;
            }
            let (mut evictable, mut protected) = (0u64, 0u64);
            for i in 0..nodes.len() {
                let st = m.state[i];
                ensure!(
                    (st != NIL) == m.list.contains(i as u32),
                    "MAMBA list membership of node {i}"
                );
                if st == NIL {
                    continue;
                }
                ensure!(live_node(i), "free node {i} holds state {st}");
                ensure!(m.cached(st), "state {st} of node {i} not marked cached");
                ensure!(!held[st as usize], "state {st} held twice");
                held[st as usize] = true;
                if m.lock[i] > 0 {
                    protected += 1;
                } else {
                    evictable += 1;
                }
            }
            for slot in 0..m.capacity {
                if !held[slot as usize] {
                    ensure!(
                        !m.is_free(slot) && !m.cached(slot),
                        "state {slot} lost (neither free, cached nor owned)"
                    );
                }
            }
            ensure!(
                (evictable, protected) == (m.evictable, m.protected),
                "MAMBA sizes {}/{} but nodes add up to {evictable}/{protected}",
                m.evictable,
                m.protected
            );
            let mut expect = vec![0u32; nodes.len()];
            for &(node, count) in &holders {
                if node != ROOT {
                    expect[node as usize] += count;
                }
            }
            for (i, &e) in expect.iter().enumerate() {
                ensure!(
                    m.lock[i] == e,
                    "node {i} MAMBA lock {} but holders say {e}",
                    m.lock[i]
                );
            }
        }
        Ok(())
    }
}
