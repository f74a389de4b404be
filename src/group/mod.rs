//! The ranks of one tensor-parallel server on one tree.
//!
//! SGLang runs one scheduler process per TP rank, in lockstep: each gets the
//! same batches and makes the same cache calls in the same order, and each
//! rank's KV pool holds its shard of the same page ids. A *group* lets those
//! ranks share one tree: the first rank to make its step `s` has it carried
//! out, once, on behalf of the group (the group owns the pages, locks and
//! sessions, as a client does), and every other rank's step `s` is checked
//! against that one and answered the same: the same match, the same pages,
//! the same evictions, the same handles. A rank whose step `s` differs is
//! out of step: it gets [`ErrorKind::Desync`] naming the step, what
//! differs first (the op, or the first token position where the keys
//! differ: [`first_difference`]) and both operations, then and for every
//! later step, never a different answer.
//!
//! Each step is kept until every rank that can still read it has (a rank
//! that has not joined yet included: it starts at step 0). A rank more than
//! [`LAG_STEPS`] steps (or [`LAG_BYTES`]) ahead of the slowest waits
//! ([`ErrorKind::GroupLag`], which the daemon turns into a wait of up to
//! [`LAG_WAIT`]). A rank that disconnects or dies leaves: the others go on
//! without it, and when the last joined rank has left the group is finished,
//! its key is remembered as such (a late rank is refused, not handed a fresh
//! group), and the caller releases what the group held
//! ([`Groups::leave`]).
//!
//! What is stepped ([`is_stepped`]): every request that reads or changes the
//! tree, the pool or the figures a scheduler decides by (`stats` too: ranks
//! that admitted requests by different figures would fall out of step).
//! Not stepped: `bind`, `join`, `validate`, namespace ids and the store,
//! whose keys are per rank (each rank stores its own KV shard).
//!
//! Knows nothing of IPC: the daemon hands it decoded requests and a way to
//! run one ([`Groups::step`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use crate::engine::ClientId;
pub use crate::op::Join;
use crate::op::{ErrorKind, Rejection, Reply, Request};

mod desync;

use desync::{clipped, fitted};
pub use desync::{describe, first_difference};

/// Most ranks in a group (one bit each in a step's waiting set).
pub const MAX_RANKS: u32 = 64;
/// Longest group key, in bytes.
pub const MAX_GROUP_KEY: usize = 256;
/// Steps a rank may run ahead of the slowest rank of its group.
pub const LAG_STEPS: usize = 16 * 1024;
/// Bytes of kept steps (requests and answers) past which the leading rank
/// waits too.
pub const LAG_BYTES: usize = 64 << 20;
/// Longest a rank waits for the slowest one before its step is refused
/// ([`ErrorKind::GroupLag`]).
pub const LAG_WAIT: Duration = Duration::from_secs(10);
/// Finished groups' keys remembered (oldest forgotten first).
const FINISHED_KEPT: usize = 4096;
/// Bit of a group's [`ClientId`]: never a client slot's index.
pub const GROUP_CLIENT: ClientId = 1 << 31;

/// Whether `request` goes through a group's steps (see the module doc).
pub fn is_stepped(request: &Request) -> bool {
    !matches!(
        request,
        Request::Join(_)
            | Request::Bind { .. }
            | Request::Validate
            | Request::Namespace { .. }
            | Request::Store(_)
    )
}

/// What a rank is to its group.
#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Not joined yet: steps wait for it.
    Awaited,
    Joined,
    /// Out of step: every stepped request gets this error.
    OutOfStep(String),
    /// Disconnected or died.
    Left,
}

#[derive(Debug)]
struct Member {
    state: State,
    /// The number of this rank's next step.
    next: u64,
}

/// One step as carried out: what was asked, by whom, what it answered and
/// which ranks have yet to take it.
#[derive(Debug)]
struct Entry {
    request: Request,
    result: Result<Reply, Rejection>,
    leader: u32,
    waiting: u64,
    bytes: usize,
}

#[derive(Debug)]
struct Group {
    key: String,
    size: u32,
    page_size: u32,
    members: Vec<Member>,
    /// The step number of `log[0]`.
    base: u64,
    log: VecDeque<Entry>,
    /// Bytes held by `log`.
    bytes: usize,
}

impl Group {
    /// Ranks that still read steps (joined or awaited), as bits.
    fn readers(&self) -> u64 {
        self.members
            .iter()
            .enumerate()
            .filter(|(_, m)| matches!(m.state, State::Awaited | State::Joined))
            .fold(0, |bits, (rank, _)| bits | 1 << rank)
    }

    /// Stops waiting for `rank` (it left or fell out of step).
    fn drop_reader(&mut self, rank: u32) {
        for e in &mut self.log {
            e.waiting &= !(1u64 << rank);
        }
        self.pop_read();
    }

    /// Forgets the steps at the front that every rank has taken.
    fn pop_read(&mut self) {
        while self.log.front().is_some_and(|e| e.waiting == 0) {
            if let Some(e) = self.log.pop_front() {
                self.bytes -= e.bytes;
                self.base += 1;
            }
        }
    }

    /// Whether a rank about to lead a step must wait for the slowest.
    fn full(&self) -> bool {
        self.log.len() >= LAG_STEPS || self.bytes >= LAG_BYTES
    }

    /// The reading rank furthest behind, and its next step.
    fn slowest(&self) -> Option<(u32, u64)> {
        self.members
            .iter()
            .enumerate()
            .filter(|(_, m)| matches!(m.state, State::Awaited | State::Joined))
            .min_by_key(|(_, m)| m.next)
            .map(|(rank, m)| (rank as u32, m.next))
    }

    /// Ranks that have joined (some may have left since).
    fn joined(&self) -> u32 {
        self.members
            .iter()
            .filter(|m| m.state != State::Awaited)
            .count() as u32
    }

    /// Whether a joined rank is still connected.
    fn connected(&self) -> bool {
        self.members
            .iter()
            .any(|m| matches!(m.state, State::Joined | State::OutOfStep(_)))
    }
}

/// The daemon's groups: which client is which rank of which group, and each
/// group's kept steps.
#[derive(Debug, Default)]
pub struct Groups {
    /// Index `i` is the group whose client id is `GROUP_CLIENT | i`.
    groups: Vec<Option<Group>>,
    by_key: HashMap<String, u32>,
    /// Client → (group index, rank).
    members: HashMap<ClientId, (u32, u32)>,
    finished: VecDeque<String>,
    finished_keys: HashSet<String>,
}

/// Figures of the groups, for `radixd stat`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupFigures {
    /// Groups with a connected rank.
    pub groups: u64,
    /// Ranks connected, over all groups.
    pub ranks: u64,
    /// Steps kept for ranks that have not taken them yet.
    pub kept_steps: u64,
}

fn mismatch(message: String) -> Rejection {
    Rejection::new(ErrorKind::GroupMismatch, message)
}

fn closed(message: String) -> Rejection {
    Rejection::new(ErrorKind::GroupClosed, message)
}

impl Groups {
    /// No groups.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether no client is in a group (the daemon's fast path).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Whether `client` is a rank of a group.
    pub fn is_member(&self, client: ClientId) -> bool {
        self.members.contains_key(&client)
    }

    /// The client id a group's pages, locks and sessions belong to.
    pub fn group_client(index: u32) -> ClientId {
        GROUP_CLIENT | index
    }

    /// Makes `client` rank `join.rank` of group `join.group`, creating the
    /// group on its first rank. `acted_alone`: the client has made stepped
    /// requests on its own (its pages and locks are its own, so it cannot
    /// become a rank). `page_size` is the daemon's. Answers
    /// [`Reply::Joined`]; every refusal changes nothing.
    pub fn join(
        &mut self,
        client: ClientId,
        acted_alone: bool,
        join: &Join,
        page_size: u32,
    ) -> Result<Reply, Rejection> {
        let Join {
            group: key,
            rank,
            size,
            page_size: rank_page_size,
        } = join;
        let (rank, size) = (*rank, *size);
        if key.is_empty() || key.len() > MAX_GROUP_KEY {
            return Err(Rejection::new(
                ErrorKind::Malformed,
                format!(
                    "a group key is 1..={MAX_GROUP_KEY} bytes, not {}",
                    key.len()
                ),
            ));
        }
        if let Some(&(index, was)) = self.members.get(&client) {
            let name = self.groups[index as usize]
                .as_ref()
                .map_or("?", |g| g.key.as_str());
            return Err(mismatch(format!(
                "this connection is rank {was} of group {name:?} already; a connection is one rank of one group"
            )));
        }
        if acted_alone {
            return Err(mismatch(
                "join before any cache operation: this connection has made some on its own, and what it holds is not the group's".to_owned(),
            ));
        }
        if !(1..=MAX_RANKS).contains(&size) {
            return Err(mismatch(format!(
                "a group has 1..={MAX_RANKS} ranks, not {size}"
            )));
        }
        if rank >= size {
            return Err(mismatch(format!(
                "rank {rank} is not below the group's size {size}"
            )));
        }
        if *rank_page_size != page_size {
            return Err(mismatch(format!(
                "rank {rank} has pages of {rank_page_size} tokens, the daemon's are {page_size}"
            )));
        }
        if self.finished_keys.contains(key) {
            return Err(closed(format!(
                "group {key:?} is finished: all its ranks have left, and a group does not start again"
            )));
        }
        let index = match self.by_key.get(key) {
            Some(&index) => {
                let g = self.groups[index as usize]
                    .as_ref()
                    .ok_or_else(|| closed(format!("group {key:?} is gone")))?;
                if g.size != size {
                    return Err(mismatch(format!(
                        "group {key:?} has {} ranks; rank {rank} says {size}",
                        g.size
                    )));
                }
                if g.page_size != *rank_page_size {
                    return Err(mismatch(format!(
                        "group {key:?} has pages of {} tokens; rank {rank} says {rank_page_size}",
                        g.page_size
                    )));
                }
                match &g.members[rank as usize].state {
                    State::Awaited => {}
                    State::Joined | State::OutOfStep(_) => {
                        return Err(closed(format!(
                            "rank {rank} of group {key:?} has joined already"
                        )))
                    }
                    State::Left => {
                        return Err(closed(format!(
                            "rank {rank} of group {key:?} left; a rank does not join again (the steps it missed are gone)"
                        )))
                    }
                }
                index
            }
            None => {
                let group = Group {
                    key: key.clone(),
                    size,
                    page_size: *rank_page_size,
                    members: (0..size)
                        .map(|_| Member {
                            state: State::Awaited,
                            next: 0,
                        })
                        .collect(),
                    base: 0,
                    log: VecDeque::new(),
                    bytes: 0,
                };
                let index = match self.groups.iter().position(Option::is_none) {
                    Some(free) => {
                        self.groups[free] = Some(group);
                        free
                    }
                    None => {
                        self.groups.push(Some(group));
                        self.groups.len() - 1
                    }
                } as u32;
                self.by_key.insert(key.clone(), index);
                index
            }
        };
        let Some(g) = self.groups[index as usize].as_mut() else {
            return Err(closed(format!("group {key:?} is gone")));
        };
        g.members[rank as usize].state = State::Joined;
        self.members.insert(client, (index, rank));
        Ok(Reply::Joined {
            joined: g.joined(),
            size,
            board: None,
        })
    }

    /// `(group index, rank)` of `client`, if it is a rank.
    pub fn position(&self, client: ClientId) -> Option<(u32, u32)> {
        self.members.get(&client).copied()
    }

    /// The next step of rank `rank` of group `index`.
    pub fn next_step(&self, index: u32, rank: u32) -> Option<u64> {
        let g = self.groups.get(index as usize)?.as_ref()?;
        Some(g.members.get(rank as usize)?.next)
    }

    /// Steps group `index` keeps for ranks behind.
    pub fn kept(&self, index: u32) -> usize {
        self.groups
            .get(index as usize)
            .and_then(Option::as_ref)
            .map_or(0, |g| g.log.len())
    }

    /// The request of step `step` of group `index`, while it is kept.
    pub fn kept_request(&self, index: u32, step: u64) -> Option<&Request> {
        let g = self.groups.get(index as usize)?.as_ref()?;
        let at = usize::try_from(step.checked_sub(g.base)?).ok()?;
        g.log.get(at).map(|e| &e.request)
    }

    /// Rank `rank` of group `index` says it has taken every step below
    /// `taken` another way (off the group's board, `radixd_ipc::Board`):
    /// its steps up to there are done. Untrusted: a number past the steps
    /// carried out, or behind what the rank has made, changes nothing
    /// beyond them.
    pub fn catch_up(&mut self, index: u32, rank: u32, taken: u64) {
        let Some(g) = self.groups.get_mut(index as usize).and_then(Option::as_mut) else {
            return;
        };
        let Some(m) = g.members.get(rank as usize) else {
            return;
        };
        if m.state != State::Joined {
            return;
        }
        let end = g.base + g.log.len() as u64;
        let to = taken.min(end);
        if to <= m.next {
            return;
        }
        let bit = !(1u64 << rank);
        let from = (m.next - g.base) as usize;
        for e in g.log.range_mut(from..(to - g.base) as usize) {
            e.waiting &= bit;
        }
        g.members[rank as usize].next = to;
        g.pop_read();
    }

    /// [`Groups::catch_up`] for every joined rank of group `index`, each
    /// rank's cursor read by `taken`.
    pub fn catch_up_all(&mut self, index: u32, taken: impl Fn(u32) -> u64) {
        let Some(size) = self
            .groups
            .get(index as usize)
            .and_then(Option::as_ref)
            .map(|g| g.size)
        else {
            return;
        };
        for rank in 0..size {
            self.catch_up(index, rank, taken(rank));
        }
    }

    /// Runs `request`, a stepped request ([`is_stepped`]) of `client`, a
    /// rank of a group ([`Groups::is_member`]): as the next step of its
    /// group if it leads, by `run` with the group's client id; or answered
    /// as the rank that led this step was, if it asked the same. `None`:
    /// `client` is in no group.
    pub fn step(
        &mut self,
        client: ClientId,
        request: Request,
        run: impl FnOnce(ClientId, Request) -> Result<Reply, Rejection>,
    ) -> Option<Result<Reply, Rejection>> {
        self.step_leading(client, request, run).map(|(r, _)| r)
    }

    /// [`Groups::step`], also saying which step `client` led, if it led
    /// one (the caller publishes it on the group's board: the request is
    /// [`Groups::kept_request`] while other ranks have yet to take it).
    pub fn step_leading(
        &mut self,
        client: ClientId,
        request: Request,
        run: impl FnOnce(ClientId, Request) -> Result<Reply, Rejection>,
    ) -> Option<(Result<Reply, Rejection>, Option<u64>)> {
        let &(index, rank) = self.members.get(&client)?;
        let g = self.groups.get_mut(index as usize)?.as_mut()?;
        let end = g.base + g.log.len() as u64;
        let leads = g.members[rank as usize].next == end;
        let result = Self::step_in(g, index, rank, request, run);
        let led = (leads && g.base + g.log.len() as u64 == end + 1).then_some(end);
        Some((result, led))
    }

    fn step_in(
        g: &mut Group,
        index: u32,
        rank: u32,
        request: Request,
        run: impl FnOnce(ClientId, Request) -> Result<Reply, Rejection>,
    ) -> Result<Reply, Rejection> {
        if matches!(request, Request::MatchAt { .. } | Request::InsertAt { .. }) {
            // A reader's anchor is its own view of the tree: ranks send
            // whole keys, so that every rank's step reads the same.
            return Err(Rejection::new(
                ErrorKind::Malformed,
                "a rank of a group sends whole keys, not anchored requests",
            ));
        }
        let member = &g.members[rank as usize];
        if let State::OutOfStep(why) = &member.state {
            return Err(Rejection::new(ErrorKind::Desync, why.clone()));
        }
        let step = member.next;
        let Some(at) = step.checked_sub(g.base).map(|at| at as usize) else {
            // Cannot happen: a reading rank's steps are kept until it
            // takes them.
            return Err(Rejection::new(
                ErrorKind::Protocol,
                format!("step {step} of rank {rank} is no longer kept"),
            ));
        };
        if let Some(e) = g.log.get_mut(at) {
            if e.request == request {
                e.waiting &= !(1u64 << rank);
                let result = e.result.clone();
                g.members[rank as usize].next += 1;
                g.pop_read();
                return result;
            }
            // What differs first, then both calls: a reply window keeps at
            // least the first `MIN_REPLY_WINDOW` bytes of a message.
            let why = fitted(format!(
                "rank {rank} of group {} is out of step at step {step}: {}; it sent {} where rank {} sent {}",
                clipped(&g.key),
                first_difference(&request, &e.request, e.leader),
                describe(&request),
                e.leader,
                describe(&e.request)
            ));
            g.members[rank as usize].state = State::OutOfStep(why.clone());
            g.drop_reader(rank);
            return Err(Rejection::new(ErrorKind::Desync, why));
        }
        if g.full() {
            let (slow, at) = g.slowest().unwrap_or((rank, step));
            return Err(Rejection::new(
                ErrorKind::GroupLag,
                format!(
                    "rank {rank} of group {} is at step {step}, rank {slow} at step {at}: {} steps ({} bytes) wait for it",
                    clipped(&g.key),
                    g.log.len(),
                    g.bytes
                ),
            ));
        }
        let waiting = g.readers() & !(1u64 << rank);
        g.members[rank as usize].next += 1;
        let client = Groups::group_client(index);
        if waiting == 0 {
            // Nobody else will read it (the log is empty then: a rank
            // behind would be waiting for it).
            g.base += 1;
            return run(client, request);
        }
        let kept = request.clone();
        let result = run(client, request);
        let bytes = 128 + 4 * (payload_words(&kept) + answer_words(&result));
        g.bytes += bytes;
        g.log.push_back(Entry {
            request: kept,
            result: result.clone(),
            leader: rank,
            waiting,
            bytes,
        });
        result
    }

    /// Whether `client` leads its group by so much that its next step
    /// would have to wait ([`ErrorKind::GroupLag`]).
    pub fn lagging(&self, client: ClientId) -> bool {
        self.members.get(&client).is_some_and(|&(index, rank)| {
            self.groups[index as usize].as_ref().is_some_and(|g| {
                let next = g.members[rank as usize].next;
                g.full() && next >= g.base + g.log.len() as u64
            })
        })
    }

    /// `client` disconnected or died: its group goes on without it. When it
    /// was the group's last connected rank the group is finished, and the
    /// group's client id is returned: its pages, locks and sessions are to
    /// be released as a dead client's are.
    pub fn leave(&mut self, client: ClientId) -> Option<ClientId> {
        let (index, rank) = self.members.remove(&client)?;
        let g = self.groups.get_mut(index as usize)?.as_mut()?;
        g.members[rank as usize].state = State::Left;
        g.drop_reader(rank);
        if g.connected() {
            return None;
        }
        let key = g.key.clone();
        self.groups[index as usize] = None;
        self.by_key.remove(&key);
        if self.finished.len() == FINISHED_KEPT {
            if let Some(old) = self.finished.pop_front() {
                self.finished_keys.remove(&old);
            }
        }
        self.finished_keys.insert(key.clone());
        self.finished.push_back(key);
        Some(Self::group_client(index))
    }

    /// Figures for `radixd stat`.
    pub fn figures(&self) -> GroupFigures {
        let live = self.groups.iter().flatten();
        GroupFigures {
            groups: live.clone().count() as u64,
            ranks: self.members.len() as u64,
            kept_steps: live.map(|g| g.log.len() as u64).sum(),
        }
    }
}

/// Words a request carries (tokens and pages), for the kept-bytes count.
fn payload_words(request: &Request) -> usize {
    match request {
        Request::Insert { tokens, pages, .. }
        | Request::InsertWith { tokens, pages, .. }
        | Request::InsertPaired { tokens, pages, .. }
        | Request::SessionCommit { tokens, pages, .. } => tokens.len() + pages.len(),
        Request::Match { tokens, .. }
        | Request::MatchWith { tokens, .. }
        | Request::Walk { tokens } => tokens.len(),
        Request::Free { pages }
        | Request::FreeSwa { pages }
        | Request::SwaPages { pages }
        | Request::LockPaired { pages, .. }
        | Request::FreeStates { states: pages } => pages.len(),
        Request::Namespaced { ns, request } => ns.len() / 4 + 1 + payload_words(request),
        Request::Counted(request) => payload_words(request),
        Request::Hinted { request, .. } => 4 + payload_words(request),
        _ => 0,
    }
}

/// Words an answer carries.
fn answer_words(result: &Result<Reply, Rejection>) -> usize {
    match result {
        Ok(reply) => reply_words(reply),
        Err(r) => r.message.len() / 4 + 1,
    }
}

/// Words a successful answer carries.
fn reply_words(reply: &Reply) -> usize {
    match reply {
        Reply::Pages(p) | Reply::SwaPages(p) | Reply::States(p) => p.len(),
        Reply::Matched { pages, .. } | Reply::MatchedWith { pages, .. } => pages.len(),
        Reply::PagesPaired { pages, swa_pages }
        | Reply::InsertedPaired {
            pages, swa_pages, ..
        } => pages.len() + swa_pages.len(),
        Reply::LockedPaired { swa_pages, .. } => swa_pages.len(),
        Reply::Counted { reply, .. } => reply_words(reply) + 6,
        _ => 0,
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod desync_messages;
