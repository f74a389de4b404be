//! Carrying a request out on an engine: [`apply`] and [`apply_with`], the
//! one dispatch from each [`Request`] to the engine call it makes and the
//! [`Reply`] it gives, and the [`Spare`] lists a server reuses between
//! requests. Apart from the vocabulary (`op`) and its errors (`error`):
//! this changes when what an op does changes.

use crate::engine::{
    ClientId, Component, ComponentError, Engine, InsertExtra, InsertHints, Inserted, InsertedExtra,
    Region,
};

use super::{check_session_id, ErrorKind, Rejection, Reply, Request};

/// Buffers a server hands from one request to the next: the token and
/// page lists of decoded requests and of answers come from here and go
/// back after each answer, so a warm server serves without allocating.
#[derive(Debug, Default)]
pub struct Spare {
    lists: Vec<Vec<u32>>,
}

impl Spare {
    /// Lists kept at most (a request holds two, its answer one).
    const KEEP: usize = 8;
    /// Longest list kept, in words: a rare huge request does not pin its
    /// memory for the daemon's lifetime.
    const KEEP_WORDS: usize = 1 << 16;

    /// An empty list, with room if one was given back.
    pub fn list(&mut self) -> Vec<u32> {
        self.lists.pop().unwrap_or_default()
    }

    /// Gives `list` back for a later [`Spare::list`].
    pub fn keep(&mut self, mut list: Vec<u32>) {
        if self.lists.len() < Self::KEEP && (1..=Self::KEEP_WORDS).contains(&list.capacity()) {
            list.clear();
            self.lists.push(list);
        }
    }

    /// Gives back the lists of an answer once it has been sent.
    pub fn keep_reply(&mut self, reply: Result<Reply, Rejection>) {
        match reply {
            Ok(
                Reply::Pages(pages)
                | Reply::Matched { pages, .. }
                | Reply::MatchedWith { pages, .. }
                | Reply::PagesPaired { pages, .. }
                | Reply::InsertedPaired { pages, .. },
            ) => self.keep(pages),
            Ok(Reply::Counted { reply, .. }) => self.keep_reply(Ok(*reply)),
            _ => {}
        }
    }
}

/// Carries out `request` for `client` on `engine`.
pub fn apply<R: Region>(
    engine: &mut Engine<R>,
    client: ClientId,
    request: Request,
) -> Result<Reply, Rejection> {
    apply_with(engine, client, request, &mut Spare::default())
}

/// [`apply`], taking the answer's lists from `spare` and giving the
/// request's back to it.
pub fn apply_with<R: Region>(
    engine: &mut Engine<R>,
    client: ClientId,
    request: Request,
    spare: &mut Spare,
) -> Result<Reply, Rejection> {
    if let Some(session) = request.session() {
        check_session_id(session.as_bytes())?;
    }
    Ok(match request {
        // An engine alone has no store: the daemon routes store requests
        // to its own (`apply_store`) before they reach here.
        Request::Store(_) => return Err(crate::store::StoreError::NoStore.into()),
        Request::Alloc { n } => {
            let mut pages = spare.list();
            engine.alloc_into(client, n, &mut pages)?;
            Reply::Pages(pages)
        }
        Request::Free { pages } => {
            let freed = engine.free(client, &pages);
            spare.keep(pages);
            freed?;
            Reply::Done
        }
        Request::Insert {
            tokens,
            pages,
            lock,
        } => {
            let r = engine.insert(client, &tokens, &pages, lock);
            spare.keep(tokens);
            spare.keep(pages);
            inserted(r?, lock)
        }
        Request::Match { tokens, lock } => {
            let mut pages = spare.list();
            let r = engine.match_prefix(client, &tokens, lock, &mut pages);
            spare.keep(tokens);
            Reply::Matched {
                len: r.len as u64,
                pages,
                handle: r.handle.map(|h| h.to_raw()),
            }
        }
        Request::Lock { handle } => {
            let lock = engine.lock(client, handle)?;
            if lock.is_lock() {
                Reply::Locked(lock.to_raw())
            } else {
                Reply::Done
            }
        }
        Request::Unlock { handle } => {
            engine.unlock(client, handle)?;
            Reply::Done
        }
        Request::Evict { tokens } => Reply::Evicted(engine.evict(tokens)),
        Request::EvictLeaf => match engine.evict_leaf() {
            Some(e) => Reply::EvictedLeaf {
                handle: Some(e.handle.to_raw()),
                tokens: e.tokens,
            },
            None => Reply::EvictedLeaf {
                handle: None,
                tokens: 0,
            },
        },
        Request::SessionCommit {
            session,
            tokens,
            pages,
        } => {
            let r = engine.session_commit(client, &session, &tokens, &pages)?;
            // A session's lock is its own, never handed to the caller.
            inserted(
                Inserted {
                    handle: None,
                    node: None,
                    ..r
                },
                false,
            )
        }
        Request::SessionRelease { session } => {
            engine.session_release(client, &session)?;
            Reply::Done
        }
        Request::SessionStatus { session } => {
            let s = engine.session_status(&session)?;
            Reply::Session {
                resident_tokens: s.resident_tokens,
                idle_ms: s.idle_ms,
            }
        }
        Request::Stats => Reply::Stats {
            stats: engine.stats(),
            sessions: engine.sessions() as u64,
        },
        Request::Reset => {
            engine.reset();
            Reply::Done
        }
        Request::Validate => {
            engine
                .validate()
                .map_err(|e| Rejection::new(ErrorKind::Invariant, e.to_string()))?;
            Reply::Done
        }
        Request::MatchAt {
            anchor,
            matched_pages,
            next_hash,
            lock,
        } => {
            let m = matched_pages as usize;
            let r = engine.match_at(client, &anchor, m, next_hash, lock, None)?;
            Reply::Matched {
                len: r.len as u64,
                pages: Vec::new(),
                handle: r.handle.map(|h| h.to_raw()),
            }
        }
        Request::InsertAt {
            anchor,
            matched_pages,
            tokens,
            pages,
            lock,
        } => {
            let m = matched_pages as usize;
            let r = engine.insert_at(client, &anchor, m, &tokens, &pages, lock);
            spare.keep(tokens);
            spare.keep(pages);
            inserted(r?, lock)
        }
        Request::MatchWith { tokens, lock } => {
            let mut pages = spare.list();
            let (r, extra) = engine.match_with(client, &tokens, lock, &mut pages);
            spare.keep(tokens);
            Reply::MatchedWith {
                len: r.len as u64,
                pages,
                handle: r.handle.map(|h| h.to_raw()),
                full_len: extra.full_len as u64,
                mamba_state: extra.mamba_state,
            }
        }
        request @ (Request::InsertWith { .. } | Request::InsertPaired { .. }) => {
            hybrid_insert(engine, client, request, InsertHints::default(), spare)?
        }
        Request::EvictComponents {
            tokens,
            swa_tokens,
            mamba_states,
        } => {
            let e = engine.evict_components(tokens, swa_tokens, mamba_states)?;
            Reply::EvictedComponents {
                tokens: e.tokens,
                swa_tokens: e.swa_tokens,
                mamba_states: e.mamba_states,
            }
        }
        Request::AllocState => Reply::State {
            state: engine.alloc_state(client)?,
        },
        Request::FreeState { state } => {
            engine.free_state(client, state)?;
            Reply::Done
        }
        Request::FreeSwa { pages } => {
            let freed = engine.free_swa(client, &pages);
            spare.keep(pages);
            Reply::SwaFreed { n: freed? }
        }
        Request::SwaPages { pages } => {
            let paired = engine.swa_pages(&pages);
            spare.keep(pages);
            Reply::SwaPages(paired?)
        }
        Request::StatsWith => Reply::StatsWith {
            stats: engine.stats(),
            sessions: engine.sessions() as u64,
            components: engine.component_stats(),
        },
        Request::Bind { .. } => return Err(Rejection::new(
            ErrorKind::NotPermitted,
            "pool bindings are a daemon's: an in-process engine has one client, whose buffer it is",
        )),
        Request::Namespaced { ns, request } => {
            if !request.takes_namespace() {
                return Err(Rejection::new(
                    ErrorKind::Malformed,
                    "only match, insert and session_commit take a namespace",
                ));
            }
            let id = engine.namespace(&ns)?;
            engine.with_namespace(id, |e| apply_with(e, client, *request, spare))?
        }
        Request::Namespace { name } => Reply::Namespace {
            id: engine.namespace(&name)?,
        },
        Request::Walk { tokens } => {
            let mut pages = spare.list();
            let len = engine.peek(&tokens, &mut pages);
            spare.keep(tokens);
            Reply::Matched {
                len: len as u64,
                pages,
                handle: None,
            }
        }
        Request::Join(_) => {
            return Err(Rejection::new(
                ErrorKind::NotPermitted,
                "groups are a daemon's: an in-process engine has one client, which is every rank",
            ))
        }
        Request::AllocPaired { n } => {
            let mut pages = spare.list();
            engine.alloc_into(client, n, &mut pages)?;
            // Fresh pages are paired as they are taken (with SWA on).
            let swa_pages = match engine.components().swa {
                Some(_) => engine.swa_pages(&pages)?,
                None => Vec::new(),
            };
            Reply::PagesPaired { pages, swa_pages }
        }
        Request::LockPaired { handle, pages } => {
            // Read first, so a bad page changes nothing: a lock moves no
            // SWA page, so the pairing after it is this one.
            let swa_pages = if pages.is_empty() {
                Vec::new()
            } else {
                engine.swa_pages(&pages)?
            };
            spare.keep(pages);
            let before = engine.stats().protected_tokens;
            let lock = engine.lock(client, handle)?;
            let after = engine.stats().protected_tokens;
            Reply::LockedPaired {
                lock: if lock.is_lock() {
                    lock.to_raw()
                } else {
                    handle
                },
                delta: before as i64 - after as i64,
                swa_pages,
            }
        }
        Request::AllocStates { n } => Reply::States(engine.alloc_states(client, n)?),
        Request::FreeStates { states } => {
            let freed = engine.free_states(client, &states);
            spare.keep(states);
            freed?;
            Reply::Done
        }
        Request::Hinted { hints, request } => match *request {
            Request::Insert {
                tokens,
                pages,
                lock,
            } => {
                let r = engine.insert_hinted(client, &tokens, &pages, lock, hints);
                spare.keep(tokens);
                spare.keep(pages);
                inserted(r?, lock)
            }
            Request::InsertAt {
                anchor,
                matched_pages,
                tokens,
                pages,
                lock,
            } => {
                let m = matched_pages as usize;
                let r = engine.insert_at_hinted(client, &anchor, m, &tokens, &pages, lock, hints);
                spare.keep(tokens);
                spare.keep(pages);
                inserted(r?, lock)
            }
            request @ (Request::InsertWith { .. } | Request::InsertPaired { .. }) => {
                hybrid_insert(engine, client, request, hints, spare)?
            }
            other => {
                return Err(Rejection::new(
                    ErrorKind::Malformed,
                    format!("{} takes no insert hints", other.name()),
                ))
            }
        },
        Request::Counted(request) => {
            if !request.takes_count() {
                return Err(Rejection::new(
                    ErrorKind::Malformed,
                    format!("{} takes no count", request.name()),
                ));
            }
            let reply = apply_with(engine, client, *request, spare)?;
            Reply::Counted {
                reply: Box::new(reply),
                free: engine.free_counts(),
            }
        }
    })
}

/// A hybrid engine's insert (`InsertWith`, or `InsertPaired`: the insert,
/// then the key's pages as a `Walk` reads them and the pairing of the last
/// `tail`), with the policy's `hints`, and its answer.
fn hybrid_insert<R: Region>(
    engine: &mut Engine<R>,
    client: ClientId,
    request: Request,
    hints: InsertHints,
    spare: &mut Spare,
) -> Result<Reply, Rejection> {
    let (tokens, pages, lock, mamba_state, swa_evicted, tail) = match request {
        Request::InsertWith {
            tokens,
            pages,
            lock,
            mamba_state,
            swa_evicted,
        } => (tokens, pages, lock, mamba_state, swa_evicted, None),
        Request::InsertPaired {
            tokens,
            pages,
            lock,
            mamba_state,
            swa_evicted,
            tail,
        } => (tokens, pages, lock, mamba_state, swa_evicted, Some(tail)),
        other => {
            return Err(Rejection::new(
                ErrorKind::Malformed,
                format!("{} is not a hybrid insert", other.name()),
            ))
        }
    };
    if tail.is_some_and(|t| t > 0) && engine.components().swa.is_none() {
        return Err(ComponentError::NotEnabled(Component::Swa).into());
    }
    let extra = InsertExtra {
        mamba_state,
        swa_evicted,
    };
    let r = engine.insert_with_hinted(client, &tokens, &pages, lock, extra, hints);
    spare.keep(pages);
    let (r, ie) = match r {
        Ok(done) => done,
        Err(e) => {
            spare.keep(tokens);
            return Err(e.into());
        }
    };
    let Some(tail) = tail else {
        spare.keep(tokens);
        return Ok(inserted_with(r, lock, ie));
    };
    // The key's pages as a `Walk` reads them now, and the pairing of the
    // window's (which SWA tombstone recovery may have moved).
    let mut key_pages = spare.list();
    engine.peek(&tokens, &mut key_pages);
    spare.keep(tokens);
    let tail = key_pages.len().min(tail as usize);
    let swa_pages = match tail {
        0 => Vec::new(),
        _ => engine.swa_pages(&key_pages[key_pages.len() - tail..])?,
    };
    // Without a lock the answer names the key's node (`inserted`).
    let handle = if lock { r.handle } else { r.node };
    Ok(Reply::InsertedPaired {
        cached: r.cached as u64,
        len: r.len as u64,
        handle: handle.map(|h| h.to_raw()),
        locked: lock,
        mamba_exist: ie.mamba_exist,
        pages: key_pages,
        swa_pages,
    })
}

/// The answer to an `InsertWith` that did `r` and `extra`: the lock's
/// handle, or without a lock the node's (as [`inserted`]).
fn inserted_with(r: Inserted, locked: bool, extra: InsertedExtra) -> Reply {
    let handle = if locked { r.handle } else { r.node };
    Reply::InsertedWith {
        cached: r.cached as u64,
        len: r.len as u64,
        handle: handle.map(|h| h.to_raw()),
        locked,
        mamba_exist: extra.mamba_exist,
    }
}

/// The answer to an insert that did `r` (and locked when `locked`): the
/// lock's handle, or without a lock the node's (`locked` false).
fn inserted(r: Inserted, locked: bool) -> Reply {
    let handle = if locked { r.handle } else { r.node };
    Reply::Inserted {
        cached: r.cached as u64,
        len: r.len as u64,
        handle: handle.map(|h| h.to_raw()),
        locked,
    }
}
