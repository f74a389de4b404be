//! Lock-free reads of the shared tree (`peek` and its kin): no round trip,
//! no lock, no LRU touch, each walk announced to the daemon as a reader so
//! it reuses no node or page the walk may return. Apart from the calls
//! because they never touch the rings.

use radixd_ipc::RegionError;

use super::{Client, ClientError, ProtocolError};
use crate::engine::{Peeked, TreeReader, Usable};

/// Walks a `peek` starts over after the daemon expired its announcement.
const PEEK_TRIES: u32 = 3;

impl Client {
    /// The longest cached prefix of `tokens` and its pages, read straight
    /// from the shared tree: no round trip, no lock, no LRU touch (for
    /// scoring requests; `match_prefix` is what a scheduler acts on).
    ///
    /// With components on (a hybrid model) the answer is what a match would
    /// serve: cut back to where the SWA window holds or a state was
    /// checkpointed ([`Client::peek_usable`]).
    pub fn peek(&self, tokens: &[u32]) -> Result<(usize, Vec<u32>), ClientError> {
        if !self.components.is_full_only() {
            return self.peek_usable(tokens).map(|(u, pages)| (u.len, pages));
        }
        self.peek_anchored(tokens).map(|(p, pages)| (p.len, pages))
    }

    /// The usable prefix of `tokens` a hybrid engine's match would answer
    /// (its length, the state at its end) and its pages, read straight from
    /// the shared tree as [`Client::peek`] reads; on a FULL-only engine,
    /// the same as `peek`.
    pub fn peek_usable(&self, tokens: &[u32]) -> Result<(Usable, Vec<u32>), ClientError> {
        let reader = self.reader()?;
        let mut pages = Vec::new();
        let usable = self.announced(|| reader.peek_usable(tokens, &mut pages).map(|(u, _)| u))?;
        Ok((usable, pages))
    }

    /// [`Client::peek`], also naming where the match ended in the tree
    /// (see [`TreeReader::peek_anchored`]).
    pub fn peek_anchored(&self, tokens: &[u32]) -> Result<(Peeked, Vec<u32>), ClientError> {
        let mut pages = Vec::new();
        self.peek_into(tokens, &mut pages).map(|p| (p, pages))
    }

    /// A reader of the shared tree through this client's mapping.
    pub(super) fn reader(&self) -> Result<TreeReader, ClientError> {
        let base = self
            .segment
            .region(self.layout.engine_at, self.layout.engine.size() as u64)
            .map_err(ProtocolError::Region)?;
        // SAFETY: the engine region lies inside our mapping (checked just
        // now), which lives as long as `self` and therefore the reader
        // (only ever used within a `&self` call); it is page aligned (the
        // layout puts it after a page-aligned stats page), and the reader
        // only copies out of it.
        Ok(unsafe { TreeReader::new(base, self.layout.engine) })
    }

    /// [`Client::peek_anchored`] into `pages` (cleared first).
    pub(super) fn peek_into(
        &self,
        tokens: &[u32],
        pages: &mut Vec<u32>,
    ) -> Result<Peeked, ClientError> {
        let reader = self.reader()?;
        self.announced(|| reader.peek_anchored(tokens, pages))
    }

    /// Runs the walk `read` announced to the daemon as a reader (see
    /// `peek_into`), again while its announcement was expired under it.
    pub(super) fn announced<T>(&self, read: impl FnMut() -> Option<T>) -> Result<T, ClientError> {
        let (clock, slots) = self
            .layout
            .readers(&self.segment)
            .map_err(ProtocolError::Region)?;
        let Some(announce) = slots.get(self.slot as usize) else {
            return Err(ProtocolError::Region(RegionError::NoSuchClient {
                index: self.slot,
                clients: slots.len() as u32,
            })
            .into());
        };
        // Announced, the daemon reuses no node or page a walk may return;
        // an announcement it expired (this process stalled for
        // `daemon::READER_EXPIRY`) makes that walk's copy untrustworthy,
        // and `read` walks again.
        announce
            .read(clock, PEEK_TRIES, read)
            .flatten()
            .ok_or(ClientError::Contended)
    }
}
