//! The L3's side of the host tier: each node's page digests (SGLang's
//! `hash_value`, the storage keys; computed by the client, which knows the
//! key from the root and SGLang's hash), and `insert_host`, which files
//! pages prefetched from the L3 into the host pool as host copies.

use super::{Digest, HostError};
use crate::engine::cache::Engine;
use crate::engine::layout::ROOT;
use crate::engine::lock::Handle;
use crate::engine::region::Region;

/// The answer to [`Engine::insert_host`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostInserted {
    /// Tokens of the key whose nodes had a host copy already: the caller
    /// frees the host pages it fetched for them (SGLang's `prefix_len`
    /// under write-through, `host_prefix_len`).
    pub prefix_len: usize,
    /// The node covering the whole key, when it has a host copy now
    /// (SGLang's `inserted_host_node`).
    pub node: Option<Handle>,
    /// The rest of the key was dropped: it would have hung below a node
    /// without a host copy (write-through keeps copies closed under
    /// ancestors); the caller frees its host pages.
    pub dropped: bool,
}

impl<R: Region> Engine<R> {
    /// Sets the page digests of the node `handle` names, one per page.
    pub fn set_digests(&mut self, handle: u64, digests: &[Digest]) -> Result<(), HostError> {
        let node = self.host_resolve(handle)?;
        let pages = self.arena.edge_pages(node) as usize;
        if digests.len() != pages {
            return Err(HostError::DigestCount {
                expected: pages,
                got: digests.len(),
            });
        }
        if let Some(t) = self.arena.host.as_deref_mut() {
            t.digests[node as usize] = Some(digests.to_vec());
        }
        Ok(())
    }

    /// The page digests of the node `handle` names (`None`: never hashed;
    /// SGLang's `hash_value`).
    pub fn digests(&self, handle: u64) -> Result<Option<Vec<Digest>>, HostError> {
        let node = self.host_resolve(handle)?;
        Ok(self.tier()?.digests[node as usize].clone())
    }

    /// The digests of the ancestors of the node `handle` names, root side
    /// first, from its parent up to the first ancestor never hashed
    /// (SGLang's `get_prefix_hash_values`: the root counts as hashed).
    pub fn prefix_digests(&self, handle: u64) -> Result<Vec<Digest>, HostError> {
        let node = self.host_resolve(handle)?;
        let t = self.tier()?;
        let mut chunks = Vec::new();
        let mut at = self.arena.nodes()[node as usize].parent;
        let mut hops = 0;
        while at != ROOT {
            hops = self.arena.hop(hops);
            let Some(d) = t.digests[at as usize].as_ref() else {
                break;
            };
            chunks.push(d.as_slice());
            at = self.arena.nodes()[at as usize].parent;
        }
        Ok(chunks.into_iter().rev().flatten().copied().collect())
    }

    /// The nodes never hashed, each after its parent (SGLang's
    /// `backfill_missing_hash_values` walks them so, to hash each against
    /// its parent's last digest).
    pub fn unhashed(&self) -> Result<Vec<Handle>, HostError> {
        let t = self.tier()?;
        let nodes = self.arena.nodes();
        let mut out: Vec<(u32, u32)> = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            let i = i as u32;
            if i == ROOT || !self.arena.is_node(i) || t.digests[i as usize].is_some() {
                continue;
            }
            let (mut depth, mut at, mut hops) = (0, n.parent, 0);
            while at != ROOT {
                hops = self.arena.hop(hops);
                depth += 1;
                at = nodes[at as usize].parent;
            }
            out.push((depth, i));
        }
        out.sort_unstable();
        Ok(out.into_iter().map(|(_, i)| self.handle_of(i)).collect())
    }

    /// Files pages prefetched from the L3 below the node `anchor` names
    /// (`None`: the root of the current namespace), SGLang's `insert_host`
    /// under write-through: `key` (whole pages) continues the anchor's
    /// prefix, `host_pages` and `digests` (empty: none) one per page.
    /// Walking the key down device and host-only nodes (splitting where it
    /// leaves one), a node without a host copy takes the fetched pages at
    /// its place (a refill: and the digests, if it had none); a node with
    /// one counts toward `prefix_len`; the rest becomes a new host-only
    /// node, unless it would hang below a node without a copy (`dropped`).
    /// Every host page must be free. All or nothing.
    pub fn insert_host(
        &mut self,
        anchor: Option<u64>,
        key: &[u32],
        host_pages: &[u32],
        digests: &[Digest],
    ) -> Result<HostInserted, HostError> {
        let mut node = match anchor {
            Some(h) => self.host_resolve(h)?,
            None => {
                self.tier()?;
                ROOT
            }
        };
        let p = self.page_size() as usize;
        let key = &key[..self.aligned(key.len())];
        let n = key.len() / p;
        if host_pages.len() != n {
            return Err(HostError::CountMismatch {
                expected: n,
                got: host_pages.len(),
            });
        }
        if !digests.is_empty() && digests.len() != n {
            return Err(HostError::DigestCount {
                expected: n,
                got: digests.len(),
            });
        }
        self.check_host_pages(host_pages)?;
        let digest =
            |from: usize, to: usize| (!digests.is_empty()).then(|| digests[from..to].to_vec());
        let (mut at, mut prefix, mut refilled) = (0, 0, false);
        while at < n {
            // Below a node without a copy nothing may take one (the backed
            // set is closed under ancestors): the rest is dropped. Only the
            // anchor can be such a node; the walk refills what it enters.
            if node != ROOT && !self.arena.backed(node) {
                break;
            }
            let Some((child, same)) = self.child_along(node, &key[at * p..]) else {
                break;
            };
            node = child;
            let end = at + same;
            if !self.arena.backed(node) {
                self.arena
                    .host_adopt(node, &host_pages[at..end], Vec::new());
                if let Some(t) = self.arena.host.as_deref_mut() {
                    if t.digests[node as usize].is_none() {
                        t.digests[node as usize] = digest(at, end);
                    }
                }
                refilled = true;
            } else if !refilled {
                prefix += same;
            }
            at = end;
        }
        let name = |e: &Self, node: u32| (node != ROOT).then(|| e.handle_of(node));
        let mut answer = HostInserted {
            prefix_len: prefix * p,
            node: None,
            dropped: false,
        };
        if at == n {
            answer.node = name(self, node).filter(|_| self.arena.backed(node));
        } else if node != ROOT && !self.arena.backed(node) {
            answer.dropped = true;
        } else {
            let leaf = self
                .arena
                .host_leaf(node, &key[at * p..], &host_pages[at..]);
            if let Some(t) = self.arena.host.as_deref_mut() {
                t.digests[leaf as usize] = digest(at, n);
            }
            answer.node = name(self, leaf);
            node = leaf;
        }
        self.arena.touch(node);
        self.arena.host_rekey(node);
        Ok(answer)
    }

    /// The child of `node` (device or host-only) that `key` (whole pages)
    /// enters, split where the key leaves it, and the pages it matched.
    fn child_along(&mut self, node: u32, key: &[u32]) -> Option<(u32, usize)> {
        let p = self.page_size() as usize;
        let ns = self.arena.leaf_namespace(node);
        if let Some(child) = self.arena.find_child(node, ns, key.get(..p)?) {
            let len = self.arena.nodes()[child as usize].num_pages as usize;
            let same = self.arena.edge_matches(child, key);
            let child = if same < len {
                self.arena.split_at(child, same as u32)
            } else {
                child
            };
            return Some((child, same));
        }
        let (child, same, _) = self.arena.host_enter(node, key)?;
        Some((child, same))
    }

    /// Checks that every page of `host_pages` is in range, free and named
    /// once.
    pub(super) fn check_host_pages(&self, host_pages: &[u32]) -> Result<(), HostError> {
        let t = self.tier()?;
        for (i, &page) in host_pages.iter().enumerate() {
            if page >= t.capacity {
                return Err(HostError::OutOfRange {
                    page,
                    capacity: t.capacity,
                });
            }
            if t.owner[page as usize] != crate::engine::layout::NIL
                || host_pages[..i].contains(&page)
            {
                return Err(HostError::InUse { page });
            }
        }
        Ok(())
    }
}
