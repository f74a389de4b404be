//! The page pool: a FIFO ring of free page ids, as SGLang's KV allocator hands
//! them out (oldest freed first), and the state word of every page.

use super::arena::Arena;
use super::layout::{NIL, PAGE_FREE, PAGE_OWNED};
use super::region::Region;

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
