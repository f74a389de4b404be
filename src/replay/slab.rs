//! Index-based intrusive doubly linked lists over a `Vec` slab.
//!
//! Several [`List`]s may share one [`Slab`]; each node sits in at most one
//! list at a time. Links are `u32` indices rather than pointers, so there is
//! no `unsafe` and a node costs its payload plus 8 bytes.

/// The "no node" index.
pub(crate) const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Node<T> {
    value: T,
    prev: u32,
    next: u32,
}

/// Arena of list nodes with a free list for reuse.
#[derive(Debug, Clone)]
pub(crate) struct Slab<T> {
    nodes: Vec<Node<T>>,
    free: Vec<u32>,
}

impl<T> Slab<T> {
    /// An empty slab with room for `capacity` nodes.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            nodes: Vec::with_capacity(capacity),
            free: Vec::new(),
        }
    }

    /// Stores `value` in an unlinked node and returns its index.
    pub(crate) fn insert(&mut self, value: T) -> u32 {
        let node = Node {
            value,
            prev: NIL,
            next: NIL,
        };
        if let Some(idx) = self.free.pop() {
            self.nodes[idx as usize] = node;
            idx
        } else {
            let idx = u32::try_from(self.nodes.len())
                .ok()
                .filter(|&i| i != NIL)
                .unwrap_or_else(|| panic!("slab holds at most {} nodes", NIL));
            self.nodes.push(node);
            idx
        }
    }

    /// Returns node `idx` to the free list. It must already be unlinked.
    pub(crate) fn remove(&mut self, idx: u32) {
        debug_assert!(self.nodes[idx as usize].prev == NIL && self.nodes[idx as usize].next == NIL);
        self.free.push(idx);
    }

    /// The payload of node `idx`.
    #[inline]
    pub(crate) fn get(&self, idx: u32) -> &T {
        &self.nodes[idx as usize].value
    }

    /// The payload of node `idx`, mutably.
    #[inline]
    pub(crate) fn get_mut(&mut self, idx: u32) -> &mut T {
        &mut self.nodes[idx as usize].value
    }
}

/// A FIFO/recency list threaded through a [`Slab`]: head is oldest.
#[derive(Debug, Clone, Copy)]
pub(crate) struct List {
    head: u32,
    tail: u32,
    len: usize,
}

impl Default for List {
    fn default() -> Self {
        Self {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

impl List {
    /// Number of nodes in the list.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the list is empty.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The oldest node, if any.
    #[inline]
    pub(crate) fn head(&self) -> Option<u32> {
        (self.head != NIL).then_some(self.head)
    }

    /// Links the unlinked node `idx` at the tail.
    #[inline]
    pub(crate) fn push_back<T>(&mut self, slab: &mut Slab<T>, idx: u32) {
        {
            let node = &mut slab.nodes[idx as usize];
            node.prev = self.tail;
            node.next = NIL;
        }
        if self.tail == NIL {
            self.head = idx;
        } else {
            slab.nodes[self.tail as usize].next = idx;
        }
        self.tail = idx;
        self.len += 1;
    }

    /// Unlinks node `idx`, which must be in this list.
    #[inline]
    pub(crate) fn unlink<T>(&mut self, slab: &mut Slab<T>, idx: u32) {
        let (prev, next) = {
            let node = &mut slab.nodes[idx as usize];
            let links = (node.prev, node.next);
            node.prev = NIL;
            node.next = NIL;
            links
        };
        if prev == NIL {
            self.head = next;
        } else {
            slab.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            slab.nodes[next as usize].prev = prev;
        }
        self.len -= 1;
    }

    /// Unlinks and returns the head, if any.
    #[inline]
    pub(crate) fn pop_front<T>(&mut self, slab: &mut Slab<T>) -> Option<u32> {
        let idx = self.head()?;
        self.unlink(slab, idx);
        Some(idx)
    }

    /// Moves node `idx` (in this list) to the tail.
    #[inline]
    pub(crate) fn move_to_back<T>(&mut self, slab: &mut Slab<T>, idx: u32) {
        if self.tail != idx {
            self.unlink(slab, idx);
            self.push_back(slab, idx);
        }
    }

    /// Node indices from head to tail (for tests and `validate`).
    #[cfg(test)]
    pub(crate) fn indices<T>(&self, slab: &Slab<T>) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len);
        let mut cur = self.head;
        while cur != NIL {
            out.push(cur);
            cur = slab.nodes[cur as usize].next;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(list: &List, slab: &Slab<u64>) -> Vec<u64> {
        list.indices(slab).iter().map(|&i| *slab.get(i)).collect()
    }

    #[test]
    fn push_unlink_pop_and_reuse() {
        let mut slab = Slab::with_capacity(4);
        let mut a = List::default();
        let mut b = List::default();
        let n1 = slab.insert(1);
        let n2 = slab.insert(2);
        let n3 = slab.insert(3);
        a.push_back(&mut slab, n1);
        a.push_back(&mut slab, n2);
        b.push_back(&mut slab, n3);
        assert_eq!(values(&a, &slab), [1, 2]);
        a.move_to_back(&mut slab, n1);
        assert_eq!(values(&a, &slab), [2, 1]);
        a.unlink(&mut slab, n1);
        b.push_back(&mut slab, n1);
        assert_eq!(values(&a, &slab), [2]);
        assert_eq!(values(&b, &slab), [3, 1]);
        assert_eq!(b.pop_front(&mut slab), Some(n3));
        slab.remove(n3);
        // The freed slot is reused before the slab grows.
        assert_eq!(slab.insert(4), n3);
        assert_eq!(a.len() + b.len(), 2);
        assert!(!a.is_empty());
    }
}
