//! The anchored path of `match_prefix` and `insert`: read the tree
//! lock-free first and send the daemon only where the match ended (and,
//! for an insert, the tokens after it), falling back to the full request
//! when the tree moved. Apart from the cache calls because it changes for
//! its own reasons (how anchors are named and checked), never what a call
//! answers.

use super::{inserted, unexpected, Client, ClientError, InsertResult, MatchResult};
use crate::engine::{Handle, InsertHints, Peeked};
use crate::op::{ErrorKind, Reply, Request};
use crate::wire::{self, Call};

/// See [`Client::set_anchoring`].
#[derive(Clone, Copy, Debug)]
pub(super) struct Anchoring {
    pub(super) on: bool,
    /// Calls answered without sending the key's matched part.
    pub(super) hits: u64,
    /// Calls that read the tree, then sent the full request after all.
    pub(super) fallbacks: u64,
}

impl Client {
    /// Turns anchoring on (the default) or off. On, [`Client::match_prefix`]
    /// and [`Client::insert`] first read the tree lock-free
    /// ([`Client::peek_anchored`]) and send the daemon only where the match
    /// ended (and, for an insert, the tokens after it); the daemon acts
    /// there only if that node is unchanged, else the client sends the
    /// full request. A match of nothing is answered without a round trip.
    /// Answers are those of the full requests either way; off, every call
    /// sends the whole key (for comparison and tests). A rank of a group
    /// ([`Client::join`]) always sends the whole key: its steps must read
    /// the same as its group's other ranks', whatever its view of the tree.
    pub fn set_anchoring(&mut self, on: bool) {
        self.anchoring.on = on && self.group.is_none();
    }

    /// Whether anchoring is on (see [`Client::set_anchoring`]).
    pub fn anchoring(&self) -> bool {
        self.anchoring.on
    }

    /// `match_prefix` and `insert` calls answered by the anchored path
    /// (without sending the matched part of the key) so far.
    pub fn anchored_hits(&self) -> u64 {
        self.anchoring.hits
    }

    /// Anchored calls that fell back to the full request (the tree moved
    /// under the anchor, or the read kept colliding with writes) so far.
    pub fn anchored_fallbacks(&self) -> u64 {
        self.anchoring.fallbacks
    }

    /// The read before an anchored call standing in for a full request
    /// of `payload` bytes whose answer needs `reply` bytes: `None`
    /// (counted as a fallback) when it kept colliding with the daemon's
    /// writes.
    fn read_anchor(
        &mut self,
        tokens: &[u32],
        payload: usize,
        reply: usize,
        pages: &mut Vec<u32>,
    ) -> Result<Option<Peeked>, ClientError> {
        // Abandoned requests first: what they change comes before the read.
        self.resync()?;
        // A full request too large to send fails so (as `batch` checks it)
        // whichever way it goes: the answer must not depend on the path,
        // nor on a fallback.
        let reply = reply.max(wire::MIN_REPLY_WINDOW);
        let half = self.layout.config.scratch_bytes as usize / 2;
        if payload > half || reply > half {
            return Err(ClientError::TooLarge {
                bytes: payload.max(reply),
                room: half,
            });
        }
        match self.peek_into(tokens, pages) {
            Ok(read) => Ok(Some(read)),
            Err(ClientError::Contended) => {
                self.anchoring.fallbacks += 1;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Sends an anchored request: `None` (counted) when the tree moved
    /// under the anchor and the full request must follow.
    fn call_anchored(&mut self, call: Call<'_>) -> Result<Option<Reply>, ClientError> {
        match self.send(call) {
            Ok(reply) => {
                self.anchoring.hits += 1;
                Ok(Some(reply))
            }
            Err(ClientError::Rejected(r)) if r.kind == ErrorKind::Moved => {
                self.anchoring.fallbacks += 1;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// `match_prefix` by anchor, with the tokens FULL alone matched;
    /// `None`: send the full request. `extra_reply`: bytes the full
    /// request's answer needs beyond the pages (so both fail alike when
    /// too large).
    pub(super) fn match_anchored(
        &mut self,
        tokens: &[u32],
        lock: bool,
        extra_reply: usize,
    ) -> Result<Option<(MatchResult, usize)>, ClientError> {
        // `Match`'s payload is the tokens, its answer the pages.
        let p = self.page_size().max(1) as usize;
        let mut pages = Vec::new();
        let reply = tokens.len() / p * 4 + extra_reply;
        let read = self.read_anchor(tokens, tokens.len() * 4, reply, &mut pages)?;
        let Some(peeked) = read else {
            return Ok(None);
        };
        let Some(anchor) = peeked.anchor else {
            // Nothing cached: the full request would change nothing (the
            // root is never touched or locked) and answer just this.
            self.anchoring.hits += 1;
            let none = MatchResult {
                len: 0,
                pages: Vec::new(),
                handle: None,
            };
            return Ok(Some((none, 0)));
        };
        // The anchor holds only where FULL's walk ends: there.
        let full_len = pages.len() * p;
        let call = Call::MatchAt {
            anchor,
            matched_pages: pages.len() as u32,
            next_hash: peeked.next_hash,
            lock,
        };
        match self.call_anchored(call)? {
            None => Ok(None),
            Some(Reply::Matched { len, handle, .. }) => {
                // A hybrid engine cuts the match back to where every
                // component serves it (SWA window, MAMBA state): the pages
                // read are FULL's, so only those of the answer's length
                // are the match's.
                pages.truncate(len as usize / p);
                let m = MatchResult {
                    len: len as usize,
                    pages,
                    handle: handle.map(Handle::from_raw),
                };
                Ok(Some((m, full_len)))
            }
            Some(other) => Err(unexpected(other)),
        }
    }

    /// `insert` of a prompt whose prefix the last `match_prefix` just
    /// matched, sending only the rest under the node that match ended at;
    /// `None`: send the full request (no such match, or the tree moved).
    pub(super) fn insert_anchored(
        &mut self,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
        hints: InsertHints,
    ) -> Result<Option<InsertResult>, ClientError> {
        let Some(anchor) = self.last_match.take() else {
            return Ok(None);
        };
        let len = self.last_key.len();
        let p = self.page_size().max(1) as usize;
        if tokens.get(..len) != Some(&self.last_key[..]) || len % p != 0 {
            return Ok(None);
        }
        // A full request too large to send fails so whichever way it goes.
        let half = self.layout.config.scratch_bytes as usize / 2;
        let payload = (tokens.len() + pages.len()) * 4;
        if payload > half {
            return Err(ClientError::TooLarge {
                bytes: payload,
                room: half,
            });
        }
        let matched_pages = (len / p) as u32;
        let hinted;
        let call = if hints == InsertHints::default() {
            Call::InsertAt {
                anchor,
                matched_pages,
                tokens: &tokens[len..],
                pages,
                lock,
            }
        } else {
            hinted = Request::Hinted {
                hints,
                request: Box::new(Request::InsertAt {
                    anchor,
                    matched_pages,
                    tokens: tokens[len..].to_vec(),
                    pages: pages.to_vec(),
                    lock,
                }),
            };
            Call::of(&hinted)
        };
        match self.call_anchored(call)? {
            None => Ok(None),
            Some(reply) => inserted(reply).map(Some),
        }
    }

    /// Remembers where the match of `tokens` that answered `len` tokens
    /// and `handle` ended, for an `insert` of the same prompt next.
    pub(super) fn remember_match(&mut self, tokens: &[u32], len: usize, handle: Option<Handle>) {
        self.last_match = None;
        let Some(h) = handle.filter(|_| self.anchoring.on) else {
            return;
        };
        // The handle names the node holding exactly the matched tokens
        // (a match splits there): its version and page count now.
        // A lock's handle (SWA) carries the lock's serial, not the node's
        // generation: the lock it names holds that node in place.
        let Some(anchor) = self.reader().ok().and_then(|r| {
            let generation = if h.is_lock() {
                r.generation_of(h.node())?
            } else {
                h.generation
            };
            r.anchor_of(h.node(), generation)
        }) else {
            return;
        };
        self.last_key.clear();
        self.last_key.extend_from_slice(&tokens[..len]);
        self.last_match = Some(anchor);
    }
}
