//! Streaming sessions: a multi-turn conversation that commits each turn into
//! the tree and keeps one lock on its deepest node.
//!
//! A session is a lifecycle boundary, never an eviction boundary: releasing
//! it only drops its lock, and the LRU then reclaims its pages page by page
//! like any other unlocked branch.

use std::fmt;
use std::time::{Duration, Instant};

use super::cache::{ClientId, Engine, Session};
use super::error::PageError;
use super::layout::ROOT;
use super::prefix::Inserted;
use super::region::Region;

/// Errors of the session operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionError {
    /// No live session has this id.
    Unknown(String),
    /// The session belongs to another client.
    NotOwned(String),
    /// The commit's pages were rejected.
    Page(PageError),
}

impl fmt::Display for SessionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown(s) => write!(f, "no live session {s:?}"),
            Self::NotOwned(s) => write!(f, "session {s:?} belongs to another client"),
            Self::Page(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for SessionError {}

impl From<PageError> for SessionError {
    fn from(e: PageError) -> Self {
        Self::Page(e)
    }
}

/// What `session_status` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionStatus {
    /// Tokens from the root to the session's node.
    pub resident_tokens: u64,
    /// Milliseconds since the last commit.
    pub idle_ms: u64,
}

impl<R: Region> Engine<R> {
    /// Commits the whole conversation so far: inserts it as `insert` would,
    /// locks the new deepest node, and only then drops the lock on the
    /// previous one. The first commit opens the session.
    pub fn session_commit(
        &mut self,
        client: ClientId,
        session: &str,
        tokens: &[u32],
        pages: &[u32],
    ) -> Result<Inserted, SessionError> {
        let previous = match self.sessions.get(session) {
            Some(s) if s.client != client => return Err(SessionError::NotOwned(session.into())),
            Some(s) => Some((s.node, s.serial)),
            None => None,
        };
        let (node, inserted, _) = self.insert_node(
            client,
            tokens,
            pages,
            Default::default(),
            Default::default(),
        )?;
        let serial = if node != ROOT {
            self.arena.lock_path(node)
        } else {
            0
        };
        if let Some((old, old_serial)) = previous.filter(|&(old, _)| old != ROOT) {
            self.arena.unlock_path(old, old_serial);
        }
        let last_access = Instant::now();
        self.sessions.insert(
            session.into(),
            Session {
                client,
                node,
                serial,
                last_access,
            },
        );
        // The session's node is its own: the caller is named none.
        Ok(Inserted {
            node: None,
            ..inserted
        })
    }

    /// Drops the session's lock and forgets it; frees no page itself.
    pub fn session_release(&mut self, client: ClientId, session: &str) -> Result<(), SessionError> {
        match self.sessions.get(session) {
            None => Err(SessionError::Unknown(session.into())),
            Some(s) if s.client != client => Err(SessionError::NotOwned(session.into())),
            Some(_) => {
                self.drop_session(session);
                Ok(())
            }
        }
    }

    /// Tokens resident for the session, and how long it has been idle.
    pub fn session_status(&self, session: &str) -> Result<SessionStatus, SessionError> {
        let s = self
            .sessions
            .get(session)
            .ok_or_else(|| SessionError::Unknown(session.into()))?;
        let p = u64::from(self.page_size());
        let nodes = self.arena.nodes();
        let (mut at, mut pages, mut hops) = (s.node, 0u64, 0);
        while at != ROOT {
            hops = self.arena.hop(hops);
            pages += u64::from(nodes[at as usize].num_pages);
            at = nodes[at as usize].parent;
        }
        let idle_ms = s
            .last_access
            .elapsed()
            .as_millis()
            .try_into()
            .unwrap_or(u64::MAX);
        Ok(SessionStatus {
            resident_tokens: pages * p,
            idle_ms,
        })
    }

    /// Live sessions.
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Releases every session idle for longer than `ttl` at `now`; returns
    /// how many went.
    pub fn expire_sessions(&mut self, ttl: Duration, now: Instant) -> usize {
        let idle: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, s)| now.saturating_duration_since(s.last_access) > ttl)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &idle {
            self.drop_session(id);
        }
        idle.len()
    }

    /// Releases every session `client` opened.
    pub(crate) fn release_client_sessions(&mut self, client: ClientId) {
        let owned: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.client == client)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &owned {
            self.drop_session(id);
        }
    }

    fn drop_session(&mut self, session: &str) {
        if let Some(s) = self.sessions.remove(session) {
            if s.node != ROOT {
                self.arena.unlock_path(s.node, s.serial);
            }
        }
    }

    /// Locks sessions hold, as `(node, count)`.
    pub(crate) fn session_locks(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.sessions
            .values()
            .filter(|s| s.node != ROOT)
            .map(|s| (s.node, 1))
    }
}
