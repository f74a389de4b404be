//! The page pool: a FIFO ring of free page ids, as SGLang's KV allocator hands
//! them out (oldest freed first), and the state word of every page.
//!
//! Beside the ring, the engine's requests on its pools: `alloc` (evicting
//! the shortfall), `free` and `evict`, and their counterparts for SWA pages
//! and state slots.

use super::arena::Arena;
use super::cache::{ClientId, Engine};
use super::error::PageError;
use super::hybrid::{Component, ComponentError, Evicted};
use super::layout::{NIL, PAGE_CLAIMED, PAGE_FREE, PAGE_OWNED};
use super::lock::Handle;
use super::region::Region;

/// What [`Engine::evict_leaf`] evicted: the leaf's handle as it was (stale
/// once answered, unless the leaf had a host copy: then it names the
/// host-only node it became) and its tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EvictedLeaf {
    pub handle: Handle,
    pub tokens: u64,
}

impl<R: Region> Arena<R> {
    /// Returns `page` to the free ring. The caller has unlinked it from
    /// whatever held it.
    pub fn pool_put(&mut self, page: u32) {
        let cap = self.layout.capacity;
        let h = self.hdr();
        let tail = (h.free_head as u64 + h.free_len as u64) % cap as u64;
        self.free_ring_mut()[tail as usize] = page;
        self.hdr_mut().free_len += 1;
        let p = &mut self.pages_mut()[page as usize];
        p.state = PAGE_FREE;
        p.owner_or_run = NIL;
        p.next = NIL;
        p.prev = NIL;
    }

    /// Hands the oldest free page to `client`; the caller checked that one is
    /// free.
    pub fn pool_take(&mut self, client: u32) -> u32 {
        let cap = self.layout.capacity;
        let h = self.hdr_mut();
        debug_assert!(h.free_len > 0);
        let at = h.free_head;
        h.free_head = (at + 1) % cap;
        h.free_len -= 1;
        h.owned_pages += 1;
        let page = self.free_ring()[at as usize];
        let p = &mut self.pages_mut()[page as usize];
        p.state = PAGE_OWNED;
        p.owner_or_run = client;
        page
    }

    /// Frees a page `client` owns.
    pub fn pool_release_owned(&mut self, page: u32) {
        self.hy_release_page(page);
        self.hdr_mut().owned_pages -= 1;
        self.pool_put(page);
    }
}

impl<R: Region> Engine<R> {
    /// Hands `n` pages to `client`, evicting exactly the shortfall when the
    /// free pool is short. Fails, changing nothing, when free plus evictable
    /// pages are fewer than `n`.
    ///
    /// With a [`Grace`](super::Grace) set ([`Engine::set_grace`]), evicted pages pass
    /// through limbo: `alloc` first reclaims what readers have released
    /// (with no reader announced, what it evicts is reusable at once). Pages
    /// still in limbo count as on their way back, so the shortfall is
    /// evicted once, however often the caller retries. If readers still
    /// hold what it needs after a bounded few microseconds, it fails with
    /// [`PageError::HeldByReaders`] and hands out nothing (what it evicted
    /// waits in limbo, counted in [`Engine::in_limbo`]).
    pub fn alloc(&mut self, client: ClientId, n: u64) -> Result<Vec<u32>, PageError> {
        let mut pages = Vec::new();
        self.alloc_into(client, n, &mut pages).map(|()| pages)
    }

    /// [`Engine::alloc`] into `pages` (cleared first; left empty on error),
    /// for a caller that reuses its buffer.
    pub fn alloc_into(
        &mut self,
        client: ClientId,
        n: u64,
        pages: &mut Vec<u32>,
    ) -> Result<(), PageError> {
        pages.clear();
        self.arena.reclaim();
        let h = self.arena.hdr();
        let free = u64::from(h.free_len);
        let held = u64::from(self.arena.in_limbo().0);
        let evictable = h.evictable_tokens / u64::from(self.page_size());
        if n > free + held + evictable {
            return Err(PageError::Insufficient {
                requested: n,
                available: free + held + evictable,
            });
        }
        if n > free {
            self.arena.evict_pages(n - free - held.min(n - free));
            // n <= free + held + evictable <= capacity, so it fits in u32.
            self.arena.reclaim_until_free(n as u32);
            let free = u64::from(self.arena.hdr().free_len);
            if free < n {
                return Err(PageError::HeldByReaders {
                    requested: n,
                    free,
                    held: u64::from(self.arena.in_limbo().0),
                });
            }
        }
        if let Some(free) = self.arena.swa().map(|s| s.free.len() as u64) {
            // SGLang's SWA allocator pairs each page with an SWA page,
            // evicting SWA data when its pool is short.
            if n > free {
                self.arena.hy_tally_reset();
                let p = u64::from(self.page_size());
                self.arena.hy_swa_evict((n - free) * p);
                let free = self.arena.swa().map_or(0, |s| s.free.len() as u64);
                if n > free {
                    return Err(PageError::SwaInsufficient {
                        requested: n,
                        available: free,
                    });
                }
            }
        }
        pages.extend((0..n).map(|_| self.arena.pool_take(client)));
        if self.arena.swa().is_some() {
            for &page in pages.iter() {
                self.arena.hy_pair(page);
            }
        }
        Ok(())
    }

    /// Returns pages `client` owns to the free pool; all or none.
    pub fn free(&mut self, client: ClientId, pages: &[u32]) -> Result<(), PageError> {
        self.check_range(pages)?;
        self.claim(client, pages, |_, _| false)?;
        for &page in pages {
            self.arena.pool_release_owned(page);
        }
        Ok(())
    }

    pub(super) fn check_range(&self, pages: &[u32]) -> Result<(), PageError> {
        let capacity = self.capacity();
        match pages.iter().find(|&&p| p >= capacity) {
            Some(&page) => Err(PageError::OutOfRange {
                page: u64::from(page),
                capacity,
            }),
            None => Ok(()),
        }
    }

    /// Marks every page of `pages` that `keep(i, page)` does not excuse as
    /// claimed, checking that `client` owns it; a page named twice fails the
    /// second time. On failure every mark is undone.
    pub(super) fn claim(
        &mut self,
        client: ClientId,
        pages: &[u32],
        keep: impl Fn(usize, u32) -> bool,
    ) -> Result<(), PageError> {
        for (i, &page) in pages.iter().enumerate() {
            if keep(i, page) {
                continue;
            }
            let pg = &mut self.arena.pages_mut()[page as usize];
            if pg.state != PAGE_OWNED || pg.owner_or_run != client {
                for (j, &undo) in pages[..i].iter().enumerate() {
                    let pg = &mut self.arena.pages_mut()[undo as usize];
                    if !keep(j, undo) && pg.state == PAGE_CLAIMED {
                        pg.state = PAGE_OWNED;
                    }
                }
                return Err(PageError::NotOwned { page });
            }
            pg.state = PAGE_CLAIMED;
        }
        Ok(())
    }

    /// Evicts `ceil(tokens / page_size)` pages (fewer only when fewer are
    /// evictable); returns the tokens evicted.
    ///
    /// With a [`Grace`](super::Grace) set, what readers have released is reclaimed first
    /// and after (with no reader announced, all of what was just evicted).
    pub fn evict(&mut self, tokens: u64) -> u64 {
        let p = u64::from(self.page_size());
        self.arena.reclaim();
        let evicted = self.arena.evict_pages(tokens.div_ceil(p)) * p;
        self.arena.reclaim();
        evicted
    }

    /// Evicts the least recently used unlocked leaf whole (by the
    /// engine's eviction policy; with SWA or MAMBA, its pages and states
    /// go with it, as [`Engine::evict`]'s victims'): one step of SGLang's
    /// eviction walk (`evict_device_next_node` and `evict_device_leaf`),
    /// which checks its stop rule after every leaf. Answers the leaf's
    /// handle (stale from now on; with a host copy the leaf is demoted and
    /// the handle names it, host-only) and the tokens freed, or `None`
    /// when nothing is evictable.
    pub fn evict_leaf(&mut self) -> Option<EvictedLeaf> {
        let p = u64::from(self.page_size());
        self.arena.reclaim();
        let victim = self.arena.lru.oldest();
        let evicted = victim.map(|node| {
            let handle = self.handle_of(node);
            let pages = u64::from(self.arena.nodes()[node as usize].num_pages);
            self.arena.evict_leaf(node, pages);
            self.arena.hdr_mut().evict_scanned += 1;
            EvictedLeaf {
                handle,
                tokens: pages * p,
            }
        });
        self.arena.reclaim();
        evicted
    }

    /// Evicts per component, as SGLang's `evict(EvictParams)`: FULL first
    /// (`tokens`, leaves least recently used first, with their SWA pages
    /// and states), then SWA until `swa_tokens` SWA tokens went in this
    /// call, then MAMBA until `mamba_states` states did; each walk counts
    /// what the earlier ones freed. A nonzero request for a component the
    /// engine lacks fails, changing nothing.
    pub fn evict_components(
        &mut self,
        tokens: u64,
        swa_tokens: u64,
        mamba_states: u64,
    ) -> Result<Evicted, ComponentError> {
        if swa_tokens > 0 && self.arena.swa().is_none() {
            return Err(ComponentError::NotEnabled(Component::Swa));
        }
        if mamba_states > 0 && self.arena.mamba().is_none() {
            return Err(ComponentError::NotEnabled(Component::Mamba));
        }
        if self.arena.hybrid.is_none() {
            return Ok(Evicted {
                tokens: self.evict(tokens),
                ..Evicted::default()
            });
        }
        let p = u64::from(self.page_size());
        self.arena.reclaim();
        self.arena.hy_tally_reset();
        self.arena.evict_pages(tokens.div_ceil(p));
        self.arena.hy_swa_evict(swa_tokens);
        self.arena.hy_mamba_evict(mamba_states);
        self.arena.reclaim();
        let t = self.arena.hy_tally();
        Ok(Evicted {
            tokens: t.full_pages * p,
            swa_tokens: t.swa_tokens,
            mamba_states: t.mamba_states,
        })
    }

    /// Hands a free state slot to `client`, evicting one state (least
    /// recently used, unlocked) when none is free.
    pub fn alloc_state(&mut self, client: ClientId) -> Result<u32, ComponentError> {
        if self.arena.mamba().is_none() {
            return Err(ComponentError::NotEnabled(Component::Mamba));
        }
        if self.arena.mamba().is_some_and(|m| m.free.is_empty()) {
            self.arena.reclaim();
            self.arena.hy_tally_reset();
            self.arena.hy_mamba_evict(1);
            self.arena.reclaim();
        }
        self.arena
            .hy_take_state(client)
            .ok_or(ComponentError::NoFreeState)
    }

    /// Returns the state slot `client` owns to the pool.
    pub fn free_state(&mut self, client: ClientId, state: u64) -> Result<(), ComponentError> {
        self.arena.hy_free_state(client, state)
    }

    /// Hands `n` state slots to `client`, all or none: what `n` calls of
    /// [`Engine::alloc_state`] hand out (each evicting one cached state
    /// when none is free). Fails with [`ComponentError::NoFreeState`],
    /// changing nothing, when fewer than `n` are free or evictable.
    pub fn alloc_states(&mut self, client: ClientId, n: u64) -> Result<Vec<u32>, ComponentError> {
        let Some(m) = self.arena.mamba().and(self.component_stats()) else {
            return Err(ComponentError::NotEnabled(Component::Mamba));
        };
        if n > m.mamba_free_states + m.mamba_evictable_states {
            return Err(ComponentError::NoFreeState);
        }
        let mut states = Vec::with_capacity(n as usize);
        for _ in 0..n {
            match self.alloc_state(client) {
                Ok(state) => states.push(state),
                Err(e) => {
                    // Not expected after the check above; what was taken
                    // goes back, so the call hands out nothing.
                    for &s in &states {
                        let _ = self.arena.hy_free_state(client, u64::from(s));
                    }
                    return Err(e);
                }
            }
        }
        Ok(states)
    }

    /// Returns the state slots `client` owns to the pool, all or none: a
    /// slot it does not own, or one named twice, fails the call
    /// ([`ComponentError::StateNotOwned`]) and frees nothing.
    pub fn free_states(&mut self, client: ClientId, states: &[u32]) -> Result<(), ComponentError> {
        let Some(m) = self.arena.mamba() else {
            return Err(ComponentError::NotEnabled(Component::Mamba));
        };
        let mut seen = std::collections::HashSet::with_capacity(states.len());
        if let Some(&bad) = states
            .iter()
            .find(|&&s| !m.owns(client, u64::from(s)) || !seen.insert(s))
        {
            return Err(ComponentError::StateNotOwned {
                state: u64::from(bad),
            });
        }
        for &s in states {
            self.arena.hy_free_state(client, u64::from(s))?;
        }
        Ok(())
    }

    /// Frees the SWA pages paired with `pages` (which `client` owns), as
    /// SGLang frees a running request's SWA pages that slid out of its
    /// window; returns how many SWA pages went. An insert of these pages
    /// then names them with `swa_evicted`.
    pub fn free_swa(&mut self, client: ClientId, pages: &[u32]) -> Result<u64, PageError> {
        if self.arena.swa().is_none() {
            return Err(PageError::Component(ComponentError::NotEnabled(
                Component::Swa,
            )));
        }
        self.check_range(pages)?;
        for &page in pages {
            let pg = &self.arena.pages()[page as usize];
            if pg.state != PAGE_OWNED || pg.owner_or_run != client {
                return Err(PageError::NotOwned { page });
            }
        }
        Ok(pages.iter().filter(|&&p| self.arena.hy_unpair(p)).count() as u64)
    }

    /// The SWA page paired with each of `pages` (SGLang's
    /// `translate_loc_from_full_to_swa`): where a scheduler reads and
    /// writes a page's sliding-window KV; `u32::MAX` where a page has none
    /// (free, an SWA tombstone's, or freed with `free_swa`). Reads only.
    pub fn swa_pages(&self, pages: &[u32]) -> Result<Vec<u32>, PageError> {
        let Some(s) = self.arena.swa() else {
            return Err(PageError::Component(ComponentError::NotEnabled(
                Component::Swa,
            )));
        };
        self.check_range(pages)?;
        Ok(pages.iter().map(|&p| s.pair[p as usize]).collect())
    }
}
