//! The child table: finds a node's child by the tokens of its first page.
//!
//! One open-addressed table for the whole tree, keyed by
//! `(parent index, first page's tokens)` hashed with xxh3, linear probing,
//! deletion by backward shift (no tombstones). A hit is always verified
//! token by token: equal hashes never make equal keys.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::arena::{corrupt, Arena};
use super::layout::{Bucket, Node, NIL};
use super::region::Region;

/// Hash of a child key. The parent index and the namespace seed the hash
/// so the same first page under two parents, or under the root in two
/// namespaces, lands in different buckets; the default namespace (0)
/// hashes as if there were none.
#[inline]
pub(crate) fn child_hash(parent: u32, ns: u32, page: &[u32]) -> u32 {
    let bytes: Vec<u8>;
    let view: &[u8] = if cfg!(target_endian = "little") {
        // SAFETY: `u32` has no padding and `u8` no alignment; the byte view
        // covers exactly the slice's memory and lives no longer than it.
        unsafe {
            std::slice::from_raw_parts(page.as_ptr().cast::<u8>(), std::mem::size_of_val(page))
        }
    } else {
        bytes = page.iter().flat_map(|t| t.to_le_bytes()).collect();
        &bytes
    };
    xxh3_64_with_seed(view, u64::from(parent) | u64::from(ns) << 32) as u32
}

impl<R: Region> Arena<R> {
    /// The probe mask, from this process's own layout: never from the
    /// shared header, which another process could have overwritten.
    #[inline]
    fn mask(&self) -> u32 {
        self.layout.buckets - 1
    }

    /// The child of `parent` in namespace `ns` whose first page holds
    /// exactly `page`.
    #[inline]
    pub fn find_child(&self, parent: u32, ns: u32, page: &[u32]) -> Option<u32> {
        self.probe(parent, child_hash(parent, ns, page), |n| {
            n.ns == ns && self.page_is(n.first_page, page)
        })
    }

    /// Whether some child of `parent` is filed under `hash`: a child whose
    /// first page hashes so may exist (a miss is certain, a hit is not).
    pub fn has_child_hashed(&self, parent: u32, hash: u32) -> bool {
        self.probe(parent, hash, |_| true).is_some()
    }

    /// The first child of `parent` filed under `hash` that `accept`s.
    #[inline]
    fn probe(&self, parent: u32, hash: u32, accept: impl Fn(&Node) -> bool) -> Option<u32> {
        let mask = self.mask();
        let (buckets, nodes) = (self.buckets(), self.nodes());
        let mut i = hash & mask;
        // At most one lap: a table with no empty bucket is corrupt, and a
        // miss is the honest answer (the daemon's loop must end).
        for _ in 0..=mask {
            let b = buckets[i as usize];
            if b.node == NIL {
                return None;
            }
            if b.hash == hash {
                let n = nodes
                    .get(b.node as usize)
                    .unwrap_or_else(|| corrupt("bucket"));
                if n.parent == parent && accept(n) {
                    return Some(b.node);
                }
            }
            i = (i + 1) & mask;
        }
        None
    }

    /// Files `node` under its `hash` (already stored in the node), inside
    /// the table's version.
    pub fn table_insert(&mut self, node: u32) {
        self.table_change(|a| a.table_insert_inner(node));
    }

    fn table_insert_inner(&mut self, node: u32) {
        let hash = self.nodes()[node as usize].hash;
        let mask = self.mask();
        let buckets = self.buckets_mut();
        let mut i = hash & mask;
        let mut probes = 0;
        while buckets[i as usize].node != NIL {
            i = (i + 1) & mask;
            probes += 1;
            if probes > mask {
                corrupt("child table has no empty bucket");
            }
        }
        buckets[i as usize] = Bucket { hash, node };
    }

    /// The bucket that files `node`.
    fn table_slot(&self, node: u32) -> Option<u32> {
        let hash = self.nodes()[node as usize].hash;
        let mask = self.mask();
        let buckets = self.buckets();
        let mut i = hash & mask;
        for _ in 0..=mask {
            match buckets[i as usize].node {
                NIL => return None,
                n if n == node => return Some(i),
                _ => i = (i + 1) & mask,
            }
        }
        None
    }

    /// Makes the bucket that files `old` file `new` instead; both nodes have
    /// the same parent and first page (a split hands the key to its upper
    /// half).
    ///
    /// Not inside the table's version: the caller (a split) brackets this
    /// and the lower half's re-filing as one change, so that no probe finds
    /// the upper half filed and the lower half not yet filed under it.
    pub fn table_replace_unversioned(&mut self, old: u32, new: u32) {
        if let Some(i) = self.table_slot(old) {
            self.buckets_mut()[i as usize].node = new;
        }
    }

    /// [`Self::table_insert`] without the table's version, for a caller
    /// that brackets several changes as one.
    pub fn table_insert_unversioned(&mut self, node: u32) {
        self.table_insert_inner(node);
    }

    /// Unfiles `node`, shifting later entries of its probe run back so that
    /// every remaining entry stays reachable from its home bucket. Inside
    /// the table's version: a probe racing the shift may miss an entry.
    pub fn table_remove(&mut self, node: u32) {
        self.table_change(|a| a.table_remove_inner(node));
    }

    fn table_remove_inner(&mut self, node: u32) {
        let Some(mut hole) = self.table_slot(node) else {
            return;
        };
        let mask = self.mask();
        let buckets = self.buckets_mut();
        let mut j = hole;
        for _ in 0..mask {
            j = (j + 1) & mask;
            let b = buckets[j as usize];
            if b.node == NIL {
                break;
            }
            let home = b.hash & mask;
            // `b` may move into the hole only if its home is not cyclically
            // inside (hole, j]: otherwise its probe would no longer pass the
            // hole.
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                buckets[hole as usize] = b;
                hole = j;
            }
        }
        buckets[hole as usize] = Bucket { hash: 0, node: NIL };
    }
}
