//! The cache calls a scheduler makes, each one round trip (or none, by
//! anchor): match and lock, insert, alloc and free, evict, the hybrid
//! engine's component calls and the paired calls of its step, sessions,
//! and the engine's figures.

use super::{
    inserted, unexpected, Client, ClientError, InsertPaired, InsertResult, LockPaired, MatchResult,
};
use crate::engine::{
    ComponentStats, Evicted, Handle, InsertExtra, InsertHints, InsertedExtra, MatchExtra, Stats,
};
use crate::op::{Reply, Request};
use crate::wire::Call;

impl Client {
    /// The longest cached prefix of `tokens`, optionally locked (by
    /// anchor: see [`Client::set_anchoring`]).
    pub fn match_prefix(&mut self, tokens: &[u32], lock: bool) -> Result<MatchResult, ClientError> {
        let anchored = if self.anchoring.on {
            self.match_anchored(tokens, lock, 0)?
        } else {
            None
        };
        let m = match anchored {
            Some((m, _)) => m,
            None => match self.send(Call::Match(tokens, lock))? {
                Reply::Matched {
                    len, pages, handle, ..
                } => MatchResult {
                    len: len as usize,
                    pages,
                    handle: handle.map(Handle::from_raw),
                },
                other => return Err(unexpected(other)),
            },
        };
        self.remember_match(tokens, m.len.min(tokens.len()), m.handle);
        Ok(m)
    }

    /// [`Client::match_prefix`] with the hybrid parts of the answer: how
    /// far FULL alone matched and the state slot the match ends at (see
    /// [`crate::engine::Engine::match_with`]). By anchor (see
    /// [`Client::set_anchoring`]) unless MAMBA is on (the state is the
    /// daemon's to say).
    pub fn match_with(
        &mut self,
        tokens: &[u32],
        lock: bool,
    ) -> Result<(MatchResult, MatchExtra), ClientError> {
        // Without MAMBA the extras are FULL's walk, which the anchored
        // read knows: no state to learn from the daemon.
        if self.anchoring.on && self.components.mamba.is_none() {
            if let Some((m, full_len)) = self.match_anchored(tokens, lock, 4)? {
                self.remember_match(tokens, m.len.min(tokens.len()), m.handle);
                let extra = MatchExtra {
                    full_len,
                    mamba_state: None,
                };
                return Ok((m, extra));
            }
        }
        match self.send(Call::MatchWith(tokens, lock))? {
            Reply::MatchedWith {
                len,
                pages,
                handle,
                full_len,
                mamba_state,
            } => {
                let handle = handle.map(Handle::from_raw);
                self.remember_match(tokens, (len as usize).min(tokens.len()), handle);
                let m = MatchResult {
                    len: len as usize,
                    pages,
                    handle,
                };
                let extra = MatchExtra {
                    full_len: full_len as usize,
                    mamba_state,
                };
                Ok((m, extra))
            }
            other => Err(unexpected(other)),
        }
    }

    /// Locks a node (and its ancestors); answers the lock's handle, which
    /// with SWA names this lock for [`Client::unlock`] (else `handle`).
    pub fn lock(&mut self, handle: Handle) -> Result<Handle, ClientError> {
        match self.send(Call::Lock(handle.to_raw()))? {
            Reply::Done => Ok(handle),
            Reply::Locked(lock) => Ok(Handle::from_raw(lock)),
            other => Err(unexpected(other)),
        }
    }

    /// Drops one of this client's locks.
    pub fn unlock(&mut self, handle: Handle) -> Result<(), ClientError> {
        self.done(Call::Unlock(handle.to_raw()))
    }

    /// Caches `tokens` with `pages` (by anchor: see
    /// [`Client::set_anchoring`]).
    pub fn insert(
        &mut self,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
    ) -> Result<InsertResult, ClientError> {
        self.insert_hinted(tokens, pages, lock, InsertHints::default())
    }

    /// [`Client::insert`] with what the daemon's eviction policy reads of
    /// an insert (see [`crate::engine::Engine::insert_hinted`]): the
    /// request's priority and the tokens it inserted before. With the
    /// default hints, exactly `insert`; else the request carries them
    /// ([`Request::Hinted`]), by anchor too.
    pub fn insert_hinted(
        &mut self,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
        hints: InsertHints,
    ) -> Result<InsertResult, ClientError> {
        // A hybrid engine's anchored insert does what the full one does
        // (SWA tombstone recovery and pairing checks walk the same path).
        if self.anchoring.on {
            if let Some(r) = self.insert_anchored(tokens, pages, lock, hints)? {
                return Ok(r);
            }
        }
        if hints == InsertHints::default() {
            return inserted(self.send(Call::Insert(tokens, pages, lock))?);
        }
        let request = Request::Hinted {
            hints,
            request: Box::new(Request::Insert {
                tokens: tokens.to_vec(),
                pages: pages.to_vec(),
                lock,
            }),
        };
        inserted(self.send(Call::of(&request))?)
    }

    /// [`Client::insert`] with the extras of a hybrid engine (see
    /// [`crate::engine::Engine::insert_with`]): a state slot this client
    /// owns to checkpoint at the key's end, and the leading tokens whose
    /// SWA pages it freed. Always the full request.
    pub fn insert_with(
        &mut self,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
        extra: InsertExtra,
    ) -> Result<(InsertResult, InsertedExtra), ClientError> {
        self.last_match = None;
        let call = Call::InsertWith {
            tokens,
            pages,
            lock,
            mamba_state: extra.mamba_state,
            swa_evicted: extra.swa_evicted,
        };
        match self.send(call)? {
            Reply::InsertedWith {
                cached,
                len,
                handle,
                locked,
                mamba_exist,
            } => Ok((
                InsertResult {
                    cached: cached as usize,
                    len: len as usize,
                    handle: handle.filter(|_| locked).map(Handle::from_raw),
                    node: handle.filter(|_| !locked).map(Handle::from_raw),
                },
                InsertedExtra { mamba_exist },
            )),
            other => Err(unexpected(other)),
        }
    }

    /// Takes `n` pages from the pool, evicting as needed.
    pub fn alloc(&mut self, n: u64) -> Result<Vec<u32>, ClientError> {
        match self.send(Call::Alloc(n))? {
            Reply::Pages(pages) => Ok(pages),
            other => Err(unexpected(other)),
        }
    }

    /// Returns owned pages to the pool.
    pub fn free(&mut self, pages: &[u32]) -> Result<(), ClientError> {
        self.done(Call::Free(pages))
    }

    /// Evicts `ceil(tokens / page_size)` pages; returns the tokens evicted.
    pub fn evict(&mut self, tokens: u64) -> Result<u64, ClientError> {
        match self.send(Call::Evict(tokens))? {
            Reply::Evicted(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    /// Evicts the least recently used unlocked leaf whole (see
    /// [`crate::engine::Engine::evict_leaf`]): the leaf's handle as it was
    /// (stale now) and the tokens freed, or `None` when no leaf is
    /// evictable.
    pub fn evict_leaf(&mut self) -> Result<Option<(u64, u64)>, ClientError> {
        match self.send(Call::EvictLeaf)? {
            Reply::EvictedLeaf { handle, tokens } => Ok(handle.map(|h| (h, tokens))),
            other => Err(unexpected(other)),
        }
    }

    /// Evicts per component: `tokens` FULL tokens (leaves, with their SWA
    /// pages and states), then SWA tokens and MAMBA states until the call
    /// freed `swa_tokens` and `mamba_states` (see
    /// [`crate::engine::Engine::evict_components`]).
    pub fn evict_components(
        &mut self,
        tokens: u64,
        swa_tokens: u64,
        mamba_states: u64,
    ) -> Result<Evicted, ClientError> {
        let call = Call::EvictComponents {
            tokens,
            swa_tokens,
            mamba_states,
        };
        match self.send(call)? {
            Reply::EvictedComponents {
                tokens,
                swa_tokens,
                mamba_states,
            } => Ok(Evicted {
                tokens,
                swa_tokens,
                mamba_states,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Takes a MAMBA state slot from the pool (evicting a cached state
    /// when none is free).
    pub fn alloc_state(&mut self) -> Result<u32, ClientError> {
        match self.send(Call::AllocState)? {
            Reply::State { state } => Ok(state),
            other => Err(unexpected(other)),
        }
    }

    /// Returns a state slot this client owns to the pool.
    pub fn free_state(&mut self, state: u64) -> Result<(), ClientError> {
        self.done(Call::FreeState(state))
    }

    /// Frees the SWA pages paired with `pages` (owned FULL pages whose
    /// tokens slid out of the window); returns how many SWA pages went.
    pub fn free_swa(&mut self, pages: &[u32]) -> Result<u64, ClientError> {
        match self.send(Call::FreeSwa(pages))? {
            Reply::SwaFreed { n } => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    /// The SWA page paired with each of `pages` (where its sliding-window
    /// KV lives; SGLang's `translate_loc_from_full_to_swa`), `None` where a
    /// page has none.
    pub fn swa_pages(&mut self, pages: &[u32]) -> Result<Vec<Option<u32>>, ClientError> {
        match self.send(Call::SwaPages(pages))? {
            Reply::SwaPages(paired) => Ok(peers(paired)),
            other => Err(unexpected(other)),
        }
    }
}

/// The hybrid step's paired calls: each answers in one round trip what a
/// call and the reads after it would (the SWA pairing of the pages it
/// names or hands out, the protected tokens a lock took), and the state
/// slots a step takes or gives back together.
impl Client {
    /// [`Client::alloc`] answering also the SWA page paired with each new
    /// page (none without SWA): `(pages, swa_pages)`.
    pub fn alloc_paired(&mut self, n: u64) -> Result<(Vec<u32>, Vec<u32>), ClientError> {
        match self.send(Call::AllocPaired(n))? {
            Reply::PagesPaired { pages, swa_pages } => Ok((pages, swa_pages)),
            other => Err(unexpected(other)),
        }
    }

    /// [`Client::lock`] answering also the protected tokens it took and
    /// the SWA page paired with each of `pages` (checked before the lock:
    /// a bad one changes nothing).
    pub fn lock_paired(
        &mut self,
        handle: Handle,
        pages: &[u32],
    ) -> Result<LockPaired, ClientError> {
        match self.send(Call::LockPaired(handle.to_raw(), pages))? {
            Reply::LockedPaired {
                lock,
                delta,
                swa_pages,
            } => Ok(LockPaired {
                lock: Handle::from_raw(lock),
                delta,
                swa_pages: peers(swa_pages),
            }),
            other => Err(unexpected(other)),
        }
    }

    /// [`Client::insert_with`] answering also the key's pages as the tree
    /// holds them now and the SWA page paired with each of the last `tail`
    /// of them (SWA on when `tail > 0`). Always the full request.
    pub fn insert_paired(
        &mut self,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
        extra: InsertExtra,
        tail: u32,
    ) -> Result<InsertPaired, ClientError> {
        self.last_match = None;
        let call = Call::InsertPaired {
            tokens,
            pages,
            lock,
            mamba_state: extra.mamba_state,
            swa_evicted: extra.swa_evicted,
            tail,
        };
        match self.send(call)? {
            Reply::InsertedPaired {
                cached,
                len,
                handle,
                locked,
                mamba_exist,
                pages,
                swa_pages,
            } => Ok(InsertPaired {
                result: InsertResult {
                    cached: cached as usize,
                    len: len as usize,
                    // Without a lock the answer names the key's node.
                    handle: handle.filter(|_| locked).map(Handle::from_raw),
                    node: handle.filter(|_| !locked).map(Handle::from_raw),
                },
                mamba_exist,
                pages,
                swa_pages: peers(swa_pages),
            }),
            other => Err(unexpected(other)),
        }
    }

    /// `n` MAMBA state slots, all or none (what `n` [`Client::alloc_state`]
    /// calls hand out).
    pub fn alloc_states(&mut self, n: u64) -> Result<Vec<u32>, ClientError> {
        match self.send(Call::AllocStates(n))? {
            Reply::States(states) => Ok(states),
            other => Err(unexpected(other)),
        }
    }

    /// Returns state slots this client owns to the pool, all or none.
    pub fn free_states(&mut self, states: &[u32]) -> Result<(), ClientError> {
        self.done(Call::FreeStates(states))
    }
}

/// SWA pages as answered (`u32::MAX`: none) as options.
fn peers(pages: Vec<u32>) -> Vec<Option<u32>> {
    pages
        .into_iter()
        .map(|p| (p != u32::MAX).then_some(p))
        .collect()
}

/// Sessions: a conversation's pages cached and locked under its name.
impl Client {
    /// Commits a session's whole conversation so far.
    pub fn session_commit(
        &mut self,
        session: &str,
        tokens: &[u32],
        pages: &[u32],
    ) -> Result<InsertResult, ClientError> {
        match self.send(Call::SessionCommit(session, tokens, pages))? {
            Reply::Inserted { cached, len, .. } => Ok(InsertResult {
                cached: cached as usize,
                len: len as usize,
                handle: None,
                node: None,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Drops a session's lock and forgets it.
    pub fn session_release(&mut self, session: &str) -> Result<(), ClientError> {
        self.done(Call::SessionRelease(session))
    }

    /// Tokens resident for a session.
    pub fn session_status(&mut self, session: &str) -> Result<u64, ClientError> {
        match self.send(Call::SessionStatus(session))? {
            Reply::Session {
                resident_tokens, ..
            } => Ok(resident_tokens),
            other => Err(unexpected(other)),
        }
    }
}

/// The engine's figures and checks.
impl Client {
    /// The engine's figures and the number of live sessions.
    pub fn stats(&mut self) -> Result<(Stats, u64), ClientError> {
        match self.send(Call::Stats)? {
            Reply::Stats { stats, sessions } => Ok((stats, sessions)),
            other => Err(unexpected(other)),
        }
    }

    /// The secondary components' figures; `None` when only FULL is on.
    pub fn component_stats(&mut self) -> Result<Option<ComponentStats>, ClientError> {
        match self.send(Call::StatsWith)? {
            Reply::StatsWith { components, .. } => Ok(components),
            other => Err(unexpected(other)),
        }
    }

    /// Checks every invariant of the daemon's engine.
    pub fn validate(&mut self) -> Result<(), ClientError> {
        self.done(Call::Validate)
    }
}
