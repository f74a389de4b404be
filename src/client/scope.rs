//! What a connection acts within beyond the plain default: a namespace of
//! the tree, the pool binding (which KV buffer the daemon's pages index),
//! and a group of ranks sharing one tree (with a rank's steps taken off its
//! group's board). Apart from the cache calls because each changes what
//! those calls mean, not how they are sent.

use std::time::{Duration, Instant};

use radixd_ipc::sync::spin_loop;
use radixd_ipc::Offset;

use super::{inserted, unexpected, Client, ClientError, InsertResult, MatchResult, ProtocolError};
use crate::binding::{BindingBoard, BoardError, PoolBinding, PoolIdentity};
use crate::engine::Handle;
use crate::op::{ErrorKind, Join, Reply, Request};
use crate::wire::{self, BadReply, Call};

/// Longest a rank other than 0 waits for a step to appear on its group's
/// board before it asks the daemon itself (rank 0 always asks: in
/// lockstep, it leads and the others take its steps off the board).
const STEP_WAIT: Duration = Duration::from_micros(50);

/// A client's place in a group (see [`crate::group`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rank {
    /// The group's key.
    pub group: String,
    pub rank: u32,
    /// Ranks in the group.
    pub size: u32,
}

/// The pool binding (see [`crate::binding`]): which KV buffer the daemon's
/// pages index.
impl Client {
    /// [`Client::connect`], then [`Client::bind`] to `pool`: a client of
    /// another buffer than the one the daemon's pool is bound to gets
    /// [`ClientError::Rejected`] of kind `pool_mismatch` (its message says
    /// what to do) and holds nothing.
    pub fn connect_bound(name: &str, pool: &PoolIdentity) -> Result<Self, ClientError> {
        let mut client = Self::connect(name)?;
        client.bind(pool)?;
        Ok(client)
    }

    /// Binds this connection to the KV buffer `pool`: the first binder
    /// binds the daemon's pool (the tree emptied first, every client's
    /// locks included: nothing cached before is matched under it), a
    /// client of the same buffer joins the binding, one of another is
    /// refused (`pool_mismatch`, naming every key that differs first,
    /// whole; nothing changes). The binding is held until this client
    /// disconnects or dies, when the last holder leaving empties the tree
    /// again; returns how many clients hold it now. While the pool is
    /// bound, a client that has not bound it may read, lock, give back and
    /// evict, not fill it (`not_permitted`: see `crate::binding`).
    pub fn bind(&mut self, pool: &PoolIdentity) -> Result<u64, ClientError> {
        match self.send(Call::Bind(pool.as_str()))? {
            Reply::Bound { holders } => Ok(holders),
            other => Err(unexpected(other)),
        }
    }

    /// What the daemon's pool is bound to (`None`: nothing), read from the
    /// segment without a round trip.
    pub fn pool_binding(&self) -> Result<Option<PoolBinding>, ClientError> {
        let board: &BindingBoard = self
            .segment
            .get(Offset::new(self.layout.binding))
            .map_err(ProtocolError::Region)?;
        board.read().map_err(|e| match e {
            BoardError::Changing => ClientError::Contended,
            BoardError::Garbled => {
                ProtocolError::BadReply(BadReply::BadField("pool binding")).into()
            }
        })
    }
}

/// Groups (see [`crate::group`]): the ranks of one tensor-parallel server
/// share one tree, each step carried out once and every rank answered the
/// same.
impl Client {
    /// Makes this connection rank `rank` of the `size` ranks of group
    /// `group` (a key every rank of the server agrees on, unique to it),
    /// before any cache call: from then on every cache call is a step of
    /// the group, which owns what the calls take (pages, locks, sessions)
    /// until its last rank is gone. Anchoring goes off for good (see
    /// [`Client::set_anchoring`]). Returns how many ranks have joined so
    /// far; a refusal (`group_mismatch`, `group_closed`) changes nothing.
    ///
    /// A rank should wait without a timeout: a call given up on is still a
    /// step, and what its late answer hands over would be given back in
    /// steps the other ranks do not make.
    pub fn join(&mut self, group: &str, rank: u32, size: u32) -> Result<u32, ClientError> {
        self.join_as(&Join {
            group: group.to_owned(),
            rank,
            size,
            page_size: self.page_size(),
        })
    }

    /// [`Client::join`] with the rank's page size given (the daemon
    /// refuses one that is not its own).
    pub fn join_as(&mut self, join: &Join) -> Result<u32, ClientError> {
        match self.send(Call::Join(join))? {
            Reply::Joined { joined, board, .. } => {
                self.anchoring.on = false;
                self.board = board;
                self.step = 0;
                self.group = Some(Rank {
                    group: join.group.clone(),
                    rank: join.rank,
                    size: join.size,
                });
                Ok(joined)
            }
            other => Err(unexpected(other)),
        }
    }

    /// The group this connection is a rank of, if any.
    pub fn rank(&self) -> Option<&Rank> {
        self.group.as_ref()
    }

    /// A rank's step `s`: taken off the group's board when the rank that
    /// led it put it there and it is this very request (its digest), else
    /// sent to the daemon, which leads it, answers it as it was led, or
    /// says how it differs. Either way the rank's step count follows.
    pub(super) fn send_step(
        &mut self,
        call: Call<'_>,
        counted: bool,
    ) -> Result<Reply, ClientError> {
        let (Some(rank), Some(index)) = (self.group.as_ref().map(|g| g.rank as usize), self.board)
        else {
            return self.post(call, counted);
        };
        if rank == 0 {
            // Rank 0 leads: its steps go to the daemon, which answers a
            // step another rank led (rank 0 fell behind) as it was led.
            // Reading the board first would cost it a cache miss a step.
            return self.post(call, counted);
        }
        let s = self.step;
        let key = wire::digest(&self.encode_call(call, counted));
        let taken = {
            let buf = &mut self.board_buf;
            let board = self.layout.board(&self.segment, index);
            board.and_then(|b| {
                let start = Instant::now();
                let mut spins = 0u32;
                loop {
                    if let Some(t) = b.take(s, buf) {
                        // Another request than the step led: the daemon
                        // says how (`desync`).
                        return (t.key == key)
                            .then(|| wire::decode_reply(&wire::reply_of_words(0, t.head), buf).ok())
                            .flatten()
                            .map(|answer| (b, answer));
                    }
                    // Counted but not there (too large, or its slot reused
                    // by then): ask the daemon.
                    if b.published() > s {
                        return None;
                    }
                    spins += 1;
                    if spins % 64 == 0 && start.elapsed() > STEP_WAIT {
                        return None;
                    }
                    spin_loop();
                }
            })
        };
        if let Some((board, answer)) = taken {
            board.set_taken(rank, s + 1);
            self.step = s + 1;
            return answer.map_err(ClientError::Rejected);
        }
        let answer = self.post(call, counted);
        if let Some(b) = self.layout.board(&self.segment, index) {
            // Acquire (in `told`) after the answer's pop: the daemon told
            // before it pushed.
            self.step = self.step.max(b.told(rank));
        }
        if matches!(&answer, Err(ClientError::Rejected(r)) if r.kind == ErrorKind::Desync) {
            // Out of step for good: every later step is the daemon's to
            // refuse, never one to take off the board.
            self.board = None;
        }
        answer
    }
}

/// Namespaces (see [`crate::engine::Engine::namespace`]): a prefix cached
/// in one never matches in another. Each call names its namespace; the
/// plain calls are in the default one. A namespaced `match` or `insert`
/// sends its whole key (no anchored path).
impl Client {
    /// The id of namespace `name` (the daemon registers it on first use),
    /// asked once per name and client.
    pub fn namespace_id(&mut self, name: &str) -> Result<u32, ClientError> {
        if let Some(&id) = self.namespaces.get(name) {
            return Ok(id);
        }
        match self.send(Call::Namespace(name))? {
            Reply::Namespace { id } => {
                self.namespaces.insert(name.to_owned(), id);
                Ok(id)
            }
            other => Err(unexpected(other)),
        }
    }

    /// [`Client::peek`] in namespace `ns`.
    pub fn peek_in(&mut self, ns: &str, tokens: &[u32]) -> Result<(usize, Vec<u32>), ClientError> {
        let id = self.namespace_id(ns)?;
        let reader = self.reader()?;
        let mut pages = Vec::new();
        let len = if self.components.is_full_only() {
            self.announced(|| {
                reader
                    .peek_anchored_in(id, tokens, &mut pages)
                    .map(|p| p.len)
            })?
        } else {
            self.announced(|| {
                reader
                    .peek_usable_in(id, tokens, &mut pages)
                    .map(|(u, _)| u.len)
            })?
        };
        Ok((len, pages))
    }

    /// [`Client::match_prefix`] in namespace `ns`.
    pub fn match_prefix_in(
        &mut self,
        ns: &str,
        tokens: &[u32],
        lock: bool,
    ) -> Result<MatchResult, ClientError> {
        let request = Request::Namespaced {
            ns: ns.to_owned(),
            request: Box::new(Request::Match {
                tokens: tokens.to_vec(),
                lock,
            }),
        };
        match self.call(&request)? {
            Reply::Matched {
                len, pages, handle, ..
            } => Ok(MatchResult {
                len: len as usize,
                pages,
                handle: handle.map(Handle::from_raw),
            }),
            other => Err(unexpected(other)),
        }
    }

    /// [`Client::insert`] in namespace `ns`.
    pub fn insert_in(
        &mut self,
        ns: &str,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
    ) -> Result<InsertResult, ClientError> {
        let request = Request::Namespaced {
            ns: ns.to_owned(),
            request: Box::new(Request::Insert {
                tokens: tokens.to_vec(),
                pages: pages.to_vec(),
                lock,
            }),
        };
        inserted(self.call(&request)?)
    }

    /// [`Client::insert_hinted`] in namespace `ns`.
    pub fn insert_hinted_in(
        &mut self,
        ns: &str,
        tokens: &[u32],
        pages: &[u32],
        lock: bool,
        hints: crate::engine::InsertHints,
    ) -> Result<InsertResult, ClientError> {
        let request = Request::Namespaced {
            ns: ns.to_owned(),
            request: Box::new(Request::Hinted {
                hints,
                request: Box::new(Request::Insert {
                    tokens: tokens.to_vec(),
                    pages: pages.to_vec(),
                    lock,
                }),
            }),
        };
        inserted(self.call(&request)?)
    }

    /// [`Client::session_commit`] in namespace `ns`.
    pub fn session_commit_in(
        &mut self,
        ns: &str,
        session: &str,
        tokens: &[u32],
        pages: &[u32],
    ) -> Result<InsertResult, ClientError> {
        let request = Request::Namespaced {
            ns: ns.to_owned(),
            request: Box::new(Request::SessionCommit {
                session: session.to_owned(),
                tokens: tokens.to_vec(),
                pages: pages.to_vec(),
            }),
        };
        match self.call(&request)? {
            Reply::Inserted { cached, len, .. } => Ok(InsertResult {
                cached: cached as usize,
                len: len as usize,
                handle: None,
                node: None,
            }),
            other => Err(unexpected(other)),
        }
    }
}
