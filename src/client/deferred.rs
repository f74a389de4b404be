//! Unlocks held until the next request: [`Client::unlock_later`].
//!
//! A scheduler drops a lock and, a moment later, makes its next cache call
//! (SGLang's controller moves a request's lock with `dec_lock_ref` then
//! `inc_lock_ref`, and releases it just before the next eviction or match).
//! Nobody reads an unlock's answer, so it need not cost a round trip of its
//! own: it is posted with the next request, ahead of it, in the same round
//! trip. The daemon carries the requests out in order, so every request of
//! this client finds the unlock done; other clients see the node locked
//! until then (as if the unlock had come that much later), and lock-free
//! reads (`peek`) never look at locks. An unlock the daemon refuses (a
//! stale handle, a lock not held) changed nothing; it is kept for
//! [`Client::take_unlock_failures`] instead of failing the request it rode
//! with, whose own answer is the caller's.
//!
//! A rank of a group unlocks at once: its steps go one by one.

use super::{Client, ClientError};
use crate::engine::Handle;
use crate::op::{Rejection, Reply};
use crate::wire::{Call, EncodedRequest};

/// Most unlocks held at once: the next one goes at once with them (a ring
/// holds 64 records; a request rides behind them).
pub(super) const MOST_HELD: usize = 32;

/// Unlocks held for the next request, and the refusals of those sent.
#[derive(Debug, Default)]
pub(super) struct Deferred {
    held: Vec<u64>,
    failed: Vec<(Handle, Rejection)>,
}

impl Deferred {
    pub(super) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

impl Client {
    /// Drops one of this client's locks with its next request (see the
    /// module doc): no round trip now. A refusal is kept for
    /// [`Client::take_unlock_failures`]. A rank of a group, or a client
    /// holding 32 unlocks already, sends them at once.
    pub fn unlock_later(&mut self, handle: Handle) -> Result<(), ClientError> {
        if self.group.is_some() {
            return self.unlock(handle);
        }
        self.deferred.held.push(handle.to_raw());
        if self.deferred.held.len() >= MOST_HELD {
            return self.flush_unlocks();
        }
        Ok(())
    }

    /// Sends the unlocks held (one round trip), if any.
    pub fn flush_unlocks(&mut self) -> Result<(), ClientError> {
        if self.deferred.held.is_empty() {
            return Ok(());
        }
        // `Stats` changes nothing: the unlocks ride ahead of it.
        self.send(Call::Stats).map(drop)
    }

    /// Unlocks held and not yet sent.
    pub fn unlocks_held(&self) -> usize {
        self.deferred.held.len()
    }

    /// The unlocks the daemon refused since the last call, with why (the
    /// newest 32).
    pub fn take_unlock_failures(&mut self) -> Vec<(Handle, Rejection)> {
        std::mem::take(&mut self.deferred.failed)
    }

    /// The held unlocks as records to post ahead of the next request, and
    /// their handles (for [`Client::settle_unlocks`]); none are held after.
    pub(super) fn take_unlocks(&mut self) -> (Vec<u64>, Vec<EncodedRequest<'static>>) {
        let held = std::mem::take(&mut self.deferred.held);
        let encoded = held
            .iter()
            .map(|&h| self.encode_call(Call::Unlock(h), false))
            .collect();
        (held, encoded)
    }

    /// Takes the answers of the unlocks `held` off the front of `answers`
    /// (as many as arrived), keeping their refusals.
    pub(super) fn settle_unlocks(
        &mut self,
        held: &[u64],
        answers: &mut Vec<Result<Reply, Rejection>>,
    ) {
        let n = held.len().min(answers.len());
        for (&h, answer) in held.iter().zip(answers.drain(..n)) {
            // The newest refusals are kept, as many as may be held: a caller
            // that never takes them does not grow this without end.
            if let Err(r) = answer {
                let failed = &mut self.deferred.failed;
                if failed.len() == MOST_HELD {
                    failed.remove(0);
                }
                failed.push((Handle::from_raw(h), r));
            }
        }
    }
}
