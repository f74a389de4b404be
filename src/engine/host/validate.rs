//! The host tier's invariants (see the module's), which `validate`
//! checks after the tree's own.

use std::collections::HashSet;

use crate::engine::cache::Engine;
use crate::engine::error::InvariantError;
use crate::engine::heap::Heap;
use crate::engine::layout::{NIL, NODE_FREE, NODE_HOST, NODE_LIVE, ROOT};
use crate::engine::policy::Key;
use crate::engine::region::Region;
use crate::engine::validate::ensure;

impl<R: Region> Engine<R> {
    /// The host tier's invariants (see the module's).
    pub(crate) fn validate_host(&self) -> Result<(), InvariantError> {
        let a = &self.arena;
        let nodes = a.nodes();
        let p = a.layout.page_size as usize;
        let Some(t) = a.host.as_deref() else {
            ensure!(
                nodes.iter().all(|n| n.state != NODE_HOST),
                "a host-only node without a host tier"
            );
            return Ok(());
        };
        let filed: HashSet<u32> = a
            .buckets()
            .iter()
            .map(|b| b.node)
            .filter(|&n| n != NIL)
            .collect();
        let (mut used, mut host_nodes) = (0u32, 0u32);
        for (i, n) in nodes.iter().enumerate() {
            let i = i as u32;
            let part = t.part(i);
            match n.state {
                NODE_FREE => ensure!(part.is_none(), "free node {i} keeps a host copy"),
                NODE_LIVE if i != ROOT => {
                    ensure!(
                        a.nodes()[n.parent as usize].state == NODE_LIVE,
                        "device node {i} under a host-only node"
                    );
                    if let Some(part) = part {
                        ensure!(
                            part.pages.len() == n.num_pages as usize && part.tokens.is_empty(),
                            "device node {i}'s host copy does not match its pages"
                        );
                    }
                }
                NODE_HOST => {
                    host_nodes += 1;
                    let Some(part) = part else {
                        return Err(InvariantError(format!("host-only node {i} has no copy")));
                    };
                    ensure!(
                        !part.pages.is_empty() && part.tokens.len() == part.pages.len() * p,
                        "host-only node {i} holds {} tokens for {} host pages",
                        part.tokens.len(),
                        part.pages.len()
                    );
                    ensure!(
                        n.num_pages == 0 && n.first_page == NIL && n.children == 0,
                        "host-only node {i} holds device pages or children"
                    );
                    ensure!(
                        !filed.contains(&i),
                        "host-only node {i} is in the child table"
                    );
                    let parent = nodes.get(n.parent as usize).map(|u| u.state);
                    ensure!(
                        n.parent == ROOT || matches!(parent, Some(NODE_LIVE | NODE_HOST)),
                        "host-only node {i} hangs under a free node"
                    );
                    ensure!(
                        t.kids.get(&n.parent).is_some_and(|k| k
                            .iter()
                            .filter(|&&c| c == i)
                            .count()
                            == 1),
                        "host-only node {i} is not filed once under its parent"
                    );
                    if n.parent != ROOT {
                        ensure!(
                            nodes[n.parent as usize].ns == n.ns,
                            "host-only node {i} is in another namespace than its parent"
                        );
                    }
                }
                _ => {}
            }
            if let Some(part) = part {
                ensure!(i != ROOT, "the root has a host copy");
                ensure!(
                    n.parent == ROOT || t.part(n.parent).is_some(),
                    "node {i} is backed up but its parent is not"
                );
                for &page in &part.pages {
                    ensure!(
                        page < t.capacity && t.owner[page as usize] == i,
                        "host page {page} of node {i} is not recorded as its"
                    );
                }
                used += part.pages.len() as u32;
            }
        }
        let owned = t.owner.iter().filter(|&&o| o != NIL).count() as u32;
        ensure!(
            used == t.used && owned == used,
            "host pages: {used} in copies, {owned} owned, {} counted",
            t.used
        );
        ensure!(
            host_nodes == t.host_nodes,
            "{host_nodes} host-only nodes, {} counted",
            t.host_nodes
        );
        for (&parent, list) in &t.kids {
            ensure!(
                !list.is_empty(),
                "node {parent} files an empty list of host children"
            );
            // Children of the root in different namespaces may share a first
            // page (the child table keys them by namespace too).
            let mut firsts: Vec<(u32, &[u32])> = Vec::new();
            for &k in list {
                let n = &nodes[k as usize];
                ensure!(
                    n.state == NODE_HOST && n.parent == parent,
                    "node {k} filed as a host child of {parent}"
                );
                let first = t
                    .part(k)
                    .and_then(|part| part.tokens.get(..p))
                    .unwrap_or(&[]);
                ensure!(
                    !firsts
                        .iter()
                        .any(|&(ns, f)| ns == n.ns && f == first && !first.is_empty())
                        && a.find_child(parent, n.ns, first).is_none(),
                    "two children of {parent} begin with the same page"
                );
                firsts.push((n.ns, first));
            }
        }
        let mut locks = vec![0u32; nodes.len()];
        for (&receipt, &(bottom, top)) in &t.receipts {
            let (mut at, mut hops) = (bottom, 0);
            loop {
                ensure!(
                    hops <= nodes.len() && at != NIL && a.backed(at),
                    "host lock {receipt} runs through a node without a copy"
                );
                locks[at as usize] += 1;
                if at == top {
                    break;
                }
                at = nodes[at as usize].parent;
                hops += 1;
            }
        }
        ensure!(
            locks == t.host_locks,
            "host lock counts disagree with the receipts held"
        );
        for (i, d) in t.digests.iter().enumerate() {
            let Some(d) = d else { continue };
            let n = &nodes[i];
            let pages = match n.state {
                NODE_LIVE => n.num_pages as usize,
                NODE_HOST => t.part(i as u32).map_or(0, |part| part.pages.len()),
                _ => usize::MAX,
            };
            ensure!(
                i as u32 != ROOT && d.len() == pages,
                "node {i} has {} digests for {pages} pages",
                d.len()
            );
        }
        let heap = t.leaves.entries();
        for (at, e) in heap.iter().enumerate() {
            ensure!(
                a.host_evictable(e.node) && t.slot[e.node as usize] == at as u32 + 1,
                "host heap holds node {}, not a host leaf in its place",
                e.node
            );
            ensure!(
                e.key == a.host_key(e.node),
                "host heap key of node {} is stale",
                e.node
            );
            if at > 0 {
                let up = heap[Heap::<Key>::parent_of(at)];
                ensure!(up.key <= e.key, "host heap order broken at node {}", e.node);
            }
        }
        let leaves = (0..nodes.len() as u32)
            .filter(|&i| a.host_evictable(i))
            .count();
        ensure!(
            leaves == heap.len(),
            "{leaves} host leaves, {} candidates",
            heap.len()
        );
        Ok(())
    }
}
