//! The components' rules on the arena: the hooks FULL calls, match
//! validation, window locks, insert commits and the eviction walks.

use super::list::List;
use super::{Hybrid, Mamba, Swa};
use crate::engine::arena::Arena;
use crate::engine::layout::{NIL, ROOT};
use crate::engine::region::Region;

impl<R: Region> Arena<R> {
    /// Tokens on `node`'s edge.
    pub(crate) fn node_tokens(&self, node: u32) -> u64 {
        u64::from(self.nodes()[node as usize].num_pages) * u64::from(self.layout.page_size)
    }

    /// `node`'s pages, in order (bounded by its page count; a link out of
    /// the pool is corruption, as everywhere the tree follows one).
    pub(crate) fn node_page_list(&self, node: u32) -> Vec<u32> {
        let n = self.nodes()[node as usize];
        let mut out = Vec::with_capacity(n.num_pages as usize);
        let mut page = n.first_page;
        while page != NIL && out.len() < n.num_pages as usize {
            out.push(page);
            let pg = self.pages().get(page as usize);
            page = pg
                .unwrap_or_else(|| crate::engine::arena::corrupt("page list"))
                .next;
        }
        out
    }

    /// `node` and its ancestors, `node` first, the root excluded.
    pub(crate) fn path_up(&self, node: u32) -> Vec<u32> {
        let mut out = Vec::new();
        self.path_into(node, &mut out);
        out
    }

    /// [`Self::path_up`] into `out` (cleared first).
    fn path_into(&self, mut node: u32, out: &mut Vec<u32>) {
        out.clear();
        let mut hops = 0;
        while node != ROOT {
            hops = self.hop(hops);
            out.push(node);
            node = self.nodes()[node as usize].parent;
        }
    }

    /// Whether every node from `node` up to the root holds SWA pages.
    pub(crate) fn path_holds_swa(&self, mut node: u32) -> bool {
        let Some(s) = self.swa() else { return true };
        let mut hops = 0;
        while node != ROOT {
            hops = self.hop(hops);
            if !s.live[node as usize] {
                return false;
            }
            node = self.nodes()[node as usize].parent;
        }
        true
    }

    pub(crate) fn swa(&self) -> Option<&Swa> {
        self.hybrid.as_deref().and_then(|h| h.swa.as_ref())
    }

    pub(crate) fn mamba(&self) -> Option<&Mamba> {
        self.hybrid.as_deref().and_then(|h| h.mamba.as_ref())
    }

    fn swa_mut(&mut self) -> Option<&mut Swa> {
        self.hybrid.as_deref_mut().and_then(|h| h.swa.as_mut())
    }

    fn mamba_mut(&mut self) -> Option<&mut Mamba> {
        self.hybrid.as_deref_mut().and_then(|h| h.mamba.as_mut())
    }

    fn hybrid_mut(&mut self) -> Option<&mut Hybrid> {
        self.hybrid.as_deref_mut()
    }

    // ---- Hooks FULL calls ----

    /// `upper` was cut off the top of `lower`: SWA pages split with the
    /// edge (both halves keep the node's lock count and LRU place, the
    /// upper one just older); a state stays with the lower half, where its
    /// tokens end.
    pub(crate) fn hy_split(&mut self, upper: u32, lower: u32) {
        let Some(h) = self.hybrid_mut() else { return };
        if let Some(s) = h.swa.as_mut() {
            let (u, l) = (upper as usize, lower as usize);
            s.live[u] = s.live[l];
            s.lock[u] = s.lock[l];
            if s.live[l] {
                s.list.insert_after(lower, upper);
            }
        }
        if let Some(m) = h.mamba.as_mut() {
            m.state[upper as usize] = NIL;
            m.lock[upper as usize] = 0;
        }
    }

    /// The unlocked leaf `node` is about to lose its last page `page`: its
    /// SWA page goes too, and so does its state, which no longer ends
    /// where the edge does.
    pub(crate) fn hy_trim(&mut self, node: u32, page: u32) {
        let p = u64::from(self.layout.page_size);
        let Some(h) = self.hybrid_mut() else { return };
        h.tally.full_pages += 1;
        if let Some(s) = h.swa.as_mut() {
            let sp = std::mem::replace(&mut s.pair[page as usize], NIL);
            if sp != NIL {
                s.free.push_back(sp);
            }
            if s.live[node as usize] {
                s.evictable -= p;
                h.tally.swa_tokens += p;
            }
        }
        if let Some(m) = h.mamba.as_mut() {
            let st = std::mem::replace(&mut m.state[node as usize], NIL);
            if st != NIL {
                m.put(st);
                m.list.remove(node);
                m.evictable -= 1;
                h.tally.mamba_states += 1;
                // Inside the leaf's version (the trim's change).
                self.nodes_mut()[node as usize].mamba = 0;
            }
        }
    }

    /// `node` left the tree (all its pages trimmed already).
    pub(crate) fn hy_remove(&mut self, node: u32) {
        let Some(h) = self.hybrid_mut() else { return };
        if let Some(s) = h.swa.as_mut() {
            let i = node as usize;
            s.live[i] = false;
            s.lock[i] = 0;
            s.list.remove(node);
            // The slot's next node starts with no lock: the serials so far
            // are this one's.
            s.born[i] = s.serial[i];
        }
        if let Some(m) = h.mamba.as_mut() {
            m.lock[node as usize] = 0;
            m.list.remove(node);
        }
        // Inside the node's version (its removal).
        let n = &mut self.nodes_mut()[node as usize];
        n.swa = 0;
        n.mamba = 0;
    }

    /// A client's `page` went back to the pool: its SWA page goes too
    /// (SGLang's `free` frees both).
    pub(crate) fn hy_release_page(&mut self, page: u32) {
        if let Some(s) = self.swa_mut() {
            let sp = std::mem::replace(&mut s.pair[page as usize], NIL);
            if sp != NIL {
                s.free.push_back(sp);
            }
        }
    }

    /// Takes a lock on `node`'s components: SWA on the nodes that cover
    /// the last `window` tokens (tombstones counted, as SGLang's segment
    /// lock does), MAMBA on `node` alone. Returns the lock's serial, which
    /// names its SWA receipt (0 without SWA).
    pub(crate) fn hy_lock(&mut self, node: u32) -> u32 {
        if self.hybrid.is_none() || node == ROOT {
            return 0;
        }
        let mut serial = 0;
        if let Some(window) = self.swa().map(|s| u64::from(s.window)) {
            let reach = self.swa_walk(node, window, true);
            if let Some(s) = self.swa_mut() {
                let i = node as usize;
                s.serial[i] = s.serial[i].wrapping_add(1);
                serial = s.serial[i];
                s.receipts
                    .entry(node)
                    .or_default()
                    .push(super::Receipt { serial, reach });
            }
        }
        self.mamba_lock(node, true);
        serial
    }

    /// Drops the lock on `node` whose serial is `serial` (the oldest one
    /// when no lock of `node` has it): SWA walks up exactly as far as that
    /// lock's receipt says (splits since keep the sum of the covered
    /// edges), MAMBA at `node`.
    pub(crate) fn hy_unlock(&mut self, node: u32, serial: u32) {
        if self.hybrid.is_none() || node == ROOT {
            return;
        }
        let reach = self.swa_mut().and_then(|s| {
            let r = s.receipts.get_mut(&node)?;
            let at = r.iter().position(|x| x.serial == serial).unwrap_or(0);
            let reach = (at < r.len()).then(|| r.remove(at).reach);
            if r.is_empty() {
                s.receipts.remove(&node);
            }
            reach
        });
        if let Some(reach) = reach {
            self.swa_walk(node, reach, false);
        }
        self.mamba_lock(node, false);
    }

    /// Takes (`up`) or drops one SWA lock on the nodes from `node` up until
    /// `reach` tokens are covered; returns the tokens covered.
    fn swa_walk(&mut self, node: u32, reach: u64, up: bool) -> u64 {
        let mut covered = 0;
        let mut cur = node;
        let mut hops = 0;
        while cur != ROOT && covered < reach {
            hops = self.hop(hops);
            let t = self.node_tokens(cur);
            let parent = self.nodes()[cur as usize].parent;
            if let Some(s) = self.swa_mut() {
                let i = cur as usize;
                if up {
                    if s.lock[i] == 0 && s.live[i] {
                        s.evictable -= t;
                        s.protected += t;
                    }
                    s.lock[i] += 1;
                } else {
                    if s.lock[i] == 1 && s.live[i] {
                        s.evictable += t;
                        s.protected -= t;
                    }
                    s.lock[i] -= 1;
                }
            }
            covered += t;
            cur = parent;
        }
        covered
    }

    /// Takes (`up`) or drops a MAMBA lock on `node`.
    fn mamba_lock(&mut self, node: u32, up: bool) {
        if let Some(m) = self.mamba_mut() {
            let i = node as usize;
            let held = m.state[i] != NIL;
            if up {
                if m.lock[i] == 0 && held {
                    m.evictable -= 1;
                    m.protected += 1;
                }
                m.lock[i] += 1;
            } else {
                if m.lock[i] == 1 && held {
                    m.evictable += 1;
                    m.protected -= 1;
                }
                m.lock[i] -= 1;
            }
        }
    }

    /// Whether `serial` names a lock taken on `node`'s current node (see
    /// [`super::Swa::names`]); `false` without SWA.
    pub(crate) fn hy_names(&self, node: u32, serial: u32) -> bool {
        self.swa()
            .is_some_and(|s| (node as usize) < s.serial.len() && s.names(node, serial))
    }

    // ---- Match ----

    /// The node a match that walked down to `deepest` may use: the
    /// deepest on its path where every validator passes (SGLang's
    /// `_match_prefix_helper`), with its depth in pages. Then marks it
    /// used in each component's list (`MATCH_END`).
    pub(crate) fn hy_match(&mut self, deepest: u32) -> (u32, usize) {
        let mut path = self
            .hybrid_mut()
            .map(|h| std::mem::take(&mut h.path))
            .unwrap_or_default();
        self.path_into(deepest, &mut path);
        let window = self.swa().map(|s| u64::from(s.window));
        let mamba = self.mamba().is_some();
        // SWA: tokens since the last tombstone; "infinite" before one.
        let mut since = u64::MAX;
        let (mut best, mut best_pages, mut pages) = (ROOT, 0usize, 0usize);
        for &node in path.iter().rev() {
            pages += self.nodes()[node as usize].num_pages as usize;
            let mut valid = true;
            if let (Some(w), Some(s)) = (window, self.swa()) {
                if s.live[node as usize] {
                    since = since.saturating_add(self.node_tokens(node));
                    valid &= since >= w;
                } else {
                    since = 0;
                    valid = false;
                }
            }
            if mamba {
                valid &= self.mamba().is_some_and(|m| m.state[node as usize] != NIL);
            }
            if valid {
                best = node;
                best_pages = pages;
            }
        }
        if let Some(h) = self.hybrid_mut() {
            h.path = path;
        }
        self.hy_refresh(best, true);
        (best, best_pages)
    }

    /// Marks `node` used in the component lists: SWA moves the nodes
    /// covering its last `window + page_size` tokens to the front, `node`
    /// first; MAMBA moves `node`'s state (on a match only: an insert's
    /// commit placed it already).
    pub(crate) fn hy_refresh(&mut self, node: u32, matched: bool) {
        if node == ROOT {
            return;
        }
        if let Some(span) = self
            .swa()
            .map(|s| u64::from(s.window) + u64::from(self.layout.page_size))
        {
            let mut chain = self
                .hybrid_mut()
                .map(|h| std::mem::take(&mut h.chain))
                .unwrap_or_default();
            chain.clear();
            let (mut cur, mut covered, mut hops) = (node, 0, 0);
            while cur != ROOT && covered < span {
                hops = self.hop(hops);
                chain.push(cur);
                covered += self.node_tokens(cur);
                cur = self.nodes()[cur as usize].parent;
            }
            if let Some(h) = self.hybrid_mut() {
                if let Some(s) = h.swa.as_mut() {
                    s.list.promote_chain(&chain);
                }
                h.chain = chain;
            }
        }
        if matched {
            if let Some(m) = self.mamba_mut() {
                if m.state[node as usize] != NIL {
                    m.list.promote(node);
                }
            }
        }
    }

    // ---- Insert ----

    /// Gives the unlocked-or-locked `node` SWA pages, moving them from the
    /// client's `incoming` pages (one per page of the node, each paired):
    /// the node keeps its FULL pages, the incoming ones keep none (they go
    /// back to the pool as duplicates). SGLang's tombstone recovery.
    pub(crate) fn hy_swa_recover(&mut self, node: u32, incoming: &[u32]) {
        let cached = self.node_page_list(node);
        let Some(s) = self.swa_mut() else { return };
        for (&c, &i) in cached.iter().zip(incoming) {
            let sp = std::mem::replace(&mut s.pair[i as usize], NIL);
            s.pair[c as usize] = sp;
        }
        self.swa_publish(node);
    }

    /// `node` now holds SWA pages: it joins the list at the front, and
    /// readers see it (one change of the node).
    pub(crate) fn swa_publish(&mut self, node: u32) {
        let tokens = self.node_tokens(node);
        let Some(s) = self.swa_mut() else { return };
        let i = node as usize;
        s.live[i] = true;
        s.list.insert_mru(node);
        if s.lock[i] > 0 {
            s.protected += tokens;
        } else {
            s.evictable += tokens;
        }
        self.node_change(node, |a| a.nodes_mut()[i].swa = 1);
    }

    /// Publishes a new leaf's SWA pages from `from_page` on (those before
    /// were freed by the client: the leaf's top becomes a tombstone of its
    /// own), capping the live part at one page-aligned window so that a
    /// lock pins one window only (SGLang's `_maybe_split_leaf_for_swa_lock`).
    pub(crate) fn hy_swa_commit_leaf(&mut self, leaf: u32, from_page: u32) {
        let Some(window) = self.swa().map(|s| s.window) else {
            return;
        };
        let p = self.layout.page_size;
        let n = self.nodes()[leaf as usize].num_pages;
        if from_page >= n {
            return;
        }
        if from_page > 0 {
            self.split_at(leaf, from_page);
        }
        let live = self.nodes()[leaf as usize].num_pages;
        let tail = window.div_ceil(p);
        let mut upper = None;
        if live > tail && self.swa().is_some_and(|s| s.lock[leaf as usize] == 0) {
            upper = Some(self.split_at(leaf, live - tail));
        }
        for node in upper.into_iter().chain([leaf]) {
            self.swa_publish(node);
        }
    }

    /// Stores `state` (owned by the inserting client) at `node`, the end of
    /// an insert's key; `true` when the node had one already (SGLang's
    /// `mamba_exist`): then `state` stays the client's, to free or reuse.
    pub(crate) fn hy_mamba_commit(&mut self, node: u32, state: u32) -> bool {
        let Some(m) = self.mamba_mut() else {
            return false;
        };
        let i = node as usize;
        if node == ROOT {
            return true;
        }
        if m.state[i] != NIL {
            m.list.promote(node);
            return true;
        }
        m.adopt(state);
        m.state[i] = state;
        m.list.insert_mru(node);
        if m.lock[i] > 0 {
            m.protected += 1;
        } else {
            m.evictable += 1;
        }
        self.node_change(node, |a| a.nodes_mut()[i].mamba = state + 1);
        false
    }

    // ---- Eviction ----

    /// Evicts the whole unlocked leaf `node` (all its components).
    pub(crate) fn evict_whole(&mut self, node: u32) {
        let n = u64::from(self.nodes()[node as usize].num_pages);
        self.evict_leaf(node, n);
    }

    /// SGLang's SWA eviction walk, until `want` SWA tokens were freed in
    /// this call (counting what FULL's cascades freed).
    pub(crate) fn hy_swa_evict(&mut self, want: u64) {
        self.secondary_evict(Secondary::Swa, want);
    }

    /// SGLang's MAMBA eviction walk, until `want` states were freed in
    /// this call.
    pub(crate) fn hy_mamba_evict(&mut self, want: u64) {
        self.secondary_evict(Secondary::Mamba, want);
    }

    /// One walk of a secondary component's list from its least recently
    /// used end (`SWAComponent` / `MambaComponent._evict_device_next_node`):
    /// a locked node is passed, an unlocked FULL leaf goes whole (all its
    /// components), any other node becomes a tombstone of this component.
    /// The walk resumes past every node it took, whatever the cascade
    /// removed (see `list`), so each node is visited at most once.
    fn secondary_evict(&mut self, which: Secondary, want: u64) {
        let Some(list) = self.list_mut(which) else {
            return;
        };
        list.walk_begin();
        while self.freed(which) < want {
            let Some((x, locked)) = self.walk_step(which) else {
                break;
            };
            if locked {
                continue;
            }
            if self.evictable(x) {
                self.evict_whole(x);
            } else {
                self.tombstone(which, x);
            }
        }
        if let Some(list) = self.list_mut(which) {
            list.walk_end();
        }
    }

    fn list_mut(&mut self, which: Secondary) -> Option<&mut List> {
        match which {
            Secondary::Swa => self.swa_mut().map(|s| &mut s.list),
            Secondary::Mamba => self.mamba_mut().map(|m| &mut m.list),
        }
    }

    /// What the current eviction call freed of `which`.
    fn freed(&self, which: Secondary) -> u64 {
        let t = self.hy_tally();
        match which {
            Secondary::Swa => t.swa_tokens,
            Secondary::Mamba => t.mamba_states,
        }
    }

    /// The walk's next node, counted as visited, and whether this
    /// component's lock holds it.
    fn walk_step(&mut self, which: Secondary) -> Option<(u32, bool)> {
        match which {
            Secondary::Swa => {
                let s = self.swa_mut()?;
                let x = s.list.walk_next()?;
                s.scanned += 1;
                Some((x, s.lock[x as usize] > 0))
            }
            Secondary::Mamba => {
                let m = self.mamba_mut()?;
                let x = m.list.walk_next()?;
                m.scanned += 1;
                Some((x, m.lock[x as usize] > 0))
            }
        }
    }

    /// Frees `which`'s data on the unlocked `x`, keeping its FULL pages (one
    /// change of the node for readers).
    fn tombstone(&mut self, which: Secondary, x: u32) {
        let pages = match which {
            Secondary::Swa => self.node_page_list(x),
            Secondary::Mamba => Vec::new(),
        };
        let t = self.node_tokens(x);
        let Some(h) = self.hybrid_mut() else { return };
        match which {
            Secondary::Swa => {
                if let Some(s) = h.swa.as_mut() {
                    for p in pages {
                        let sp = std::mem::replace(&mut s.pair[p as usize], NIL);
                        if sp != NIL {
                            s.free.push_back(sp);
                        }
                    }
                    s.live[x as usize] = false;
                    s.list.remove(x);
                    s.evictable -= t;
                    h.tally.swa_tokens += t;
                }
                self.node_change(x, |a| a.nodes_mut()[x as usize].swa = 0);
            }
            Secondary::Mamba => {
                if let Some(m) = h.mamba.as_mut() {
                    let st = std::mem::replace(&mut m.state[x as usize], NIL);
                    m.put(st);
                    m.list.remove(x);
                    m.evictable -= 1;
                    h.tally.mamba_states += 1;
                }
                self.node_change(x, |a| a.nodes_mut()[x as usize].mamba = 0);
            }
        }
    }
}

/// A secondary component, for the eviction walk both share.
#[derive(Clone, Copy, Debug)]
enum Secondary {
    Swa,
    Mamba,
}

impl<R: Region> Arena<R> {
    /// Starts counting what an eviction call frees.
    pub(crate) fn hy_tally_reset(&mut self) {
        if let Some(h) = self.hybrid_mut() {
            h.tally = Default::default();
        }
    }

    /// What the current eviction call freed.
    pub(crate) fn hy_tally(&self) -> super::Tally {
        self.hybrid.as_deref().map(|h| h.tally).unwrap_or_default()
    }

    /// Pairs the newly allocated `page` with a free SWA page (the caller
    /// checked that one is free).
    pub(crate) fn hy_pair(&mut self, page: u32) {
        if let Some(s) = self.swa_mut() {
            if let Some(sp) = s.free.pop_front() {
                s.pair[page as usize] = sp;
            }
        }
    }

    /// Frees `page`'s SWA page, if it has one; whether it had.
    pub(crate) fn hy_unpair(&mut self, page: u32) -> bool {
        let Some(s) = self.swa_mut() else {
            return false;
        };
        let sp = std::mem::replace(&mut s.pair[page as usize], NIL);
        if sp != NIL {
            s.free.push_back(sp);
        }
        sp != NIL
    }

    /// A free state slot for `client`, if any.
    pub(crate) fn hy_take_state(&mut self, client: u32) -> Option<u32> {
        self.mamba_mut()?.take(client)
    }

    /// Frees the slot `client` owns.
    pub(crate) fn hy_free_state(
        &mut self,
        client: u32,
        state: u64,
    ) -> Result<(), super::ComponentError> {
        let Some(m) = self.mamba_mut() else {
            return Err(super::ComponentError::NotEnabled(super::Component::Mamba));
        };
        if !m.owns(client, state) {
            return Err(super::ComponentError::StateNotOwned { state });
        }
        m.put(state as u32);
        Ok(())
    }

    /// Frees every slot `client` owns (it is gone).
    pub(crate) fn hy_release_states(&mut self, client: u32) {
        if let Some(m) = self.mamba_mut() {
            for slot in m.owned_by(client) {
                m.put(slot);
            }
        }
    }
}
