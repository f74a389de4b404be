//! Lock-free reads of a tree another process is changing: the longest
//! cached prefix of a key, without a round trip and without taking locks.
//!
//! Validation is per record, not per tree. Every node has a version
//! ([`Version`], a sequence word of its own, in an array apart from the
//! records) that the writer makes odd before and even after any change a
//! reader could see on that node: creation (before the child table leads
//! to it), a split (both halves), a trim of its last page, its removal, its
//! freeing and reuse. The child table has one version of its own, bumped
//! around every insert, replace and removal (a probe racing a
//! backward-shift deletion could miss an entry). LRU touches and lock
//! counts change no version and disturb no reader.
//!
//! A walk keeps a stack of (node, version it validated, tokens and pages so
//! far). Each step looks the next child up under the table's version
//! (retrying the lookup alone when the table moved), copies the child's
//! record, page ids and tokens under the child's version (comparing tokens
//! with the key as it goes), then re-checks the parent's version. A child
//! that changed is retried from its parent; a parent that changed pops the
//! walk to the deepest frame whose node is still at the version it had, and
//! the walk resumes there: never from the root unless the root changed
//! (only `format` changes it). Every loop is bounded; `peek` gives up
//! (`None`) only after [`NODE_TRIES`] failures in a row without getting
//! deeper: the node it stands on, the child below it or the child table
//! kept changing all that time. Failed tries spin briefly, then yield, so
//! a writer preempted in the middle of a change gets the core back.
//!
//! # Guarantee
//!
//! The prefix `peek` returns (its length and pages) was entirely cached,
//! with exactly those pages, at one instant during the call. Why: a live
//! node's path from the root (tokens and pages) never changes while its
//! version does not: a split of an ancestor keeps the path, eviction takes
//! only leaves (so never an ancestor of a live node), and everything else
//! that touches the node moves its version. Each frame's copy was validated
//! while its parent was unchanged (the parent's re-check came after the
//! child's copy), so by induction the frames spell the node's path. The
//! answer is the deepest frame's path, plus the pages matched in a child
//! copied after it (or a validated miss), at an instant inside that last
//! copy, when the frame was unchanged. It was also the longest cached
//! prefix at that instant: a split files its upper half and re-files the
//! lower half under it in one change of the table, so no validated probe
//! finds the upper half childless (`loom_tests/tests/walk.rs` checks this
//! stronger property).
//!
//! # Anchors
//!
//! [`TreeReader::peek_anchored`] also names where the answer came from: the
//! deepest frame, or the child copied after it when the match stopped
//! inside that child, with the version it was validated at
//! ([`Anchor`]). By the guarantee's argument, while that node's version
//! stands still its path from the root, and so the answer's tokens and
//! pages, stay cached as read; the engine checks exactly that before it
//! acts on an anchor (`Engine::match_at`, `Engine::insert_at`).
//!
//! Reused records are never misread: freeing and reusing a node moves its
//! version, and a page changes owner only after the node that held it was
//! trimmed (its version moved). The segment is never unmapped under a
//! reader and every byte of it is a valid record, so torn copies are only
//! thrown away. Pages a reader returns are kept from reuse for a grace
//! period by the engine's [`Grace`](super::Grace), when the daemon sets one.
//!
//! Every load goes through a [`TreeMem`]: volatile loads of the mapping in
//! production, a loom-visible mirror of the engine's stores under loom, so
//! `loom_tests/tests/walk.rs` runs this very walk against the real writer.

use std::mem::{offset_of, size_of};
use std::ptr::NonNull;

use radixd_ipc::sync::{spin_loop, yield_now};
use radixd_ipc::Version;

use super::layout::{
    Bucket, EngineLayout, Header, Node, Page, COMPONENT_MAMBA, COMPONENT_SWA, NIL, NODE_LIVE,
    PAGE_CACHED, ROOT,
};
use super::mem::{Mapped, TreeMem};
use super::table::child_hash;

/// Reads a region mapped (possibly read-only) from a running engine,
/// through `M` (volatile loads of a mapping by default; see
/// [`TreeMem`]).
pub struct TreeReader<M = Mapped> {
    mem: M,
    layout: EngineLayout,
}

/// Tries on one node (or one lookup) before a reader that keeps colliding
/// with changes of that very node gives up.
pub const NODE_TRIES: u32 = 64;

/// Where a [`TreeReader::peek_anchored`] match ended: the node holding
/// its last page, as the reader validated it. The daemon can act on the
/// match from here (lock it, insert below it) without the tokens that led
/// there, after checking that the node is still at `version`: while a
/// live node's version stands still, so does its path from the root (see
/// the module's guarantee), so the anchor still spells the same prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Anchor {
    /// The node's index (never the root).
    pub node: u32,
    /// Its generation when copied (the high half of its handle).
    pub generation: u32,
    /// Its validated (even) version.
    pub version: u32,
    /// How many of its pages matched, `1..=num_pages`.
    pub pages_into_node: u32,
}

/// What [`TreeReader::peek_anchored`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peeked {
    /// Tokens of the longest cached prefix (whole pages).
    pub len: usize,
    /// Where the match ended; `None` when nothing matched.
    pub anchor: Option<Anchor>,
    /// When the match took the anchor's node whole and the key has another
    /// whole page: the child-table hash of `(node, that page)`, under which
    /// a child holding it would be filed (none was, when read). The daemon
    /// probes it to see whether such a child came since.
    pub next_hash: Option<u32>,
}

/// One step of the walk: a node the reader stands on.
#[derive(Clone, Copy, Debug)]
struct Frame {
    node: u32,
    /// Its generation and the version its copy was validated at.
    generation: u32,
    version: u32,
    /// Its pages (all of them matched).
    pages: u32,
    /// Key tokens matched down to and including this node.
    pos: usize,
    /// Hybrid engines: tokens since the last SWA tombstone on the path
    /// (saturating; `u32::MAX` before one), and the deepest point of the
    /// path every component can serve (see [`TreeReader::peek_usable`]):
    /// its pages and its state plus one (0: none). Compact: the frame
    /// stack is copied whole at each walk's start.
    since: u32,
    usable_pages: u32,
    usable_state: u32,
}

impl Frame {
    /// The anchor of a match that ends with this node whole.
    fn anchor(&self) -> Option<Anchor> {
        (self.node != ROOT).then_some(Anchor {
            node: self.node,
            generation: self.generation,
            version: self.version,
            pages_into_node: self.pages,
        })
    }

    /// The usable prefix this frame's path offers.
    fn usable(&self, page_size: usize) -> Usable {
        Usable {
            len: self.usable_pages as usize * page_size,
            mamba_state: self.usable_state.checked_sub(1),
        }
    }
}

/// What a hybrid engine would answer a match with: the deepest point of the
/// FULL match every component can serve (SWA: the last `window` tokens
/// hold SWA pages; MAMBA: a state there).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usable {
    /// Tokens of the usable prefix.
    pub len: usize,
    /// The MAMBA state slot at its end, if any.
    pub mamba_state: Option<u32>,
}

/// The components a region's header names, for the reader.
#[derive(Clone, Copy, Debug, Default)]
struct Comps {
    swa: bool,
    mamba: bool,
    window: u64,
}

impl Comps {
    fn any(&self) -> bool {
        self.swa || self.mamba
    }

    /// The SWA count and usable point (pages, state plus one) of a frame
    /// below `top` that matched `tokens` more tokens, `pages` in all, of a
    /// node with component words `swa` and `mamba` (0 for a node a split
    /// would cut: its state stays below).
    fn step(
        &self,
        top: &Frame,
        tokens: usize,
        pages: usize,
        swa: u32,
        mamba: u32,
    ) -> (u32, u32, u32) {
        let mut since = top.since;
        let mut valid = true;
        if self.swa {
            if swa != 0 {
                since = since.saturating_add(u32::try_from(tokens).unwrap_or(u32::MAX));
                valid &= u64::from(since) >= self.window;
            } else {
                since = 0;
                valid = false;
            }
        }
        if self.mamba {
            valid &= mamba != 0;
        }
        if valid {
            // At most the pool's pages: a u32.
            (since, pages as u32, mamba)
        } else {
            (since, top.usable_pages, top.usable_state)
        }
    }
}

/// The walk's frames, on the stack of the caller: the deepest
/// [`FrameStack::DEPTH`] of them. A resume that pops past the oldest kept
/// frame restarts from the root, as when the root itself changed: slower,
/// never wrong.
struct FrameStack {
    frames: [Frame; Self::DEPTH],
    len: usize,
}

impl FrameStack {
    const DEPTH: usize = 16;

    fn new(root: Frame) -> Self {
        Self {
            frames: [root; Self::DEPTH],
            len: 1,
        }
    }

    fn last(&self) -> Option<&Frame> {
        self.len.checked_sub(1).map(|i| &self.frames[i])
    }

    fn push(&mut self, frame: Frame) {
        if self.len == Self::DEPTH {
            self.frames.copy_within(1.., 0);
            self.len -= 1;
        }
        self.frames[self.len] = frame;
        self.len += 1;
    }

    fn pop(&mut self) {
        self.len = self.len.saturating_sub(1);
    }
}

/// A validated child copy: generation, pages matched, whether all of
/// them, and the node's component words.
type ChildCopy = (u32, usize, bool, (u32, u32));

/// What copying a candidate child found.
enum Copied {
    /// The node changed (or was mid-change) while copied.
    Torn,
    /// Not a child of the parent holding the key's next page.
    NotChild,
    /// The child: its generation and validated version, how many of its
    /// pages matched (appended to the caller's pages) and whether that is
    /// all of them.
    Child {
        generation: u32,
        version: u32,
        matched: usize,
        whole: bool,
        comps: (u32, u32),
    },
}

/// What a lookup found.
enum Lookup {
    /// The child and its validated copy.
    Found {
        node: u32,
        generation: u32,
        version: u32,
        matched: usize,
        whole: bool,
        /// The node's `swa` and `mamba` words (0 when not read).
        comps: (u32, u32),
    },
    /// No child holds the key's next page (validated under the table),
    /// whose child-table hash this is.
    Miss { hash: u32 },
    /// The child or the table kept changing.
    Torn,
}

/// Waits before try `tries + 1`: a spin hint for the first few (a change
/// takes well under a microsecond), then a yield, so that a writer
/// preempted in the middle of a change gets the core back.
fn backoff(tries: u32) {
    if tries < 8 {
        spin_loop();
    } else {
        yield_now();
    }
}

impl TreeReader {
    /// A reader of the engine region of `layout` at `base`.
    ///
    /// # Safety
    ///
    /// `base` must be aligned to [`REGION_ALIGN`](super::REGION_ALIGN) and
    /// valid for reads of `layout.size()` bytes for as long as the reader
    /// lives (a shared mapping that stays mapped). Other processes or
    /// threads may write it; this reader only ever copies out of it.
    pub unsafe fn new(base: NonNull<u8>, layout: EngineLayout) -> Self {
        // SAFETY: forwarded from the caller.
        Self::over(unsafe { Mapped::new(base, layout) })
    }
}

impl<M: TreeMem> TreeReader<M> {
    /// A reader of the region `mem` reads.
    pub fn over(mem: M) -> Self {
        let layout = mem.layout();
        Self { mem, layout }
    }

    fn table_version(&self) -> &Version {
        // SAFETY: offset 0 holds the table's version (see `layout`).
        unsafe { self.mem.version(0) }
    }

    fn version(&self, node: u32) -> Option<&Version> {
        if node >= self.layout.node_cap {
            return None;
        }
        // SAFETY: `node < node_cap`: the offset of node `node`'s version.
        Some(unsafe {
            self.mem
                .version(self.layout.versions_at + node as usize * size_of::<Version>())
        })
    }

    /// Word `field` (a byte offset inside the record) of record `index` of
    /// the array of `len` records of `T` at `at`, if in range.
    fn field<T>(&self, at: usize, len: usize, index: u32, field: usize) -> Option<u32> {
        let index = index as usize;
        if index >= len {
            return None;
        }
        debug_assert!(field + size_of::<u32>() <= size_of::<T>() && field % 4 == 0);
        // SAFETY: the layout placed `len` records of `T` at `at` inside
        // the region, and `index < len`; `field` is a u32 field of `T` (a
        // `repr(C)` record of u32s), so the word is inside and aligned.
        Some(unsafe { self.mem.word(at + index * size_of::<T>() + field) })
    }

    /// Word `field` (an `offset_of!(Node, ..)`) of node `i`, if in range:
    /// the walk loads a node's fields one by one, each when it needs it.
    fn node(&self, i: u32, field: usize) -> Option<u32> {
        let (at, len) = (self.layout.nodes_at, self.layout.node_cap as usize);
        self.field::<Node>(at, len, i, field)
    }

    /// The state, run and next link of page `i` (one load each), if in
    /// range.
    fn page_link(&self, i: u32) -> Option<(u32, u32, u32)> {
        let (at, len) = (self.layout.pages_at, self.layout.capacity as usize);
        let f = |field| self.field::<Page>(at, len, i, field);
        Some((
            f(offset_of!(Page, state))?,
            f(offset_of!(Page, owner_or_run))?,
            f(offset_of!(Page, next))?,
        ))
    }

    /// Bucket `i` of the child table, if in range.
    fn bucket(&self, i: u32) -> Option<Bucket> {
        let (at, len) = (self.layout.buckets_at, self.layout.buckets as usize);
        let f = |field| self.field::<Bucket>(at, len, i, field);
        Some(Bucket {
            hash: f(offset_of!(Bucket, hash))?,
            node: f(offset_of!(Bucket, node))?,
        })
    }

    /// Whether the `key.len() / p` pages from `first` on, consecutive,
    /// hold exactly `key` (one slice of tokens: a run); `None` if they run
    /// past the pool.
    fn run_is(&self, first: u32, key: &[u32]) -> Option<bool> {
        let p = self.layout.page_size as usize;
        let pages = (key.len() / p) as u64;
        if u64::from(first) + pages > u64::from(self.layout.capacity) {
            return None;
        }
        let at = self.layout.tokens_at + first as usize * p * size_of::<u32>();
        // SAFETY: `first + pages <= capacity`, so the run's `pages * p`
        // tokens lie inside the token array, aligned for u32.
        Some(unsafe { self.mem.same(at, &key[..pages as usize * p]) })
    }

    /// Whether `page` holds exactly the first page of `key`; `None` if the
    /// page is out of range or `key` is shorter than a page.
    fn page_is(&self, page: u32, key: &[u32]) -> Option<bool> {
        self.run_is(page, key.get(..self.layout.page_size as usize)?)
    }

    /// Copies candidate `node` (found under `parent`) and the pages of it
    /// that match `key` from `pos`, under the node's version. On anything
    /// but `Child`, `out` is as it was.
    #[allow(clippy::too_many_arguments)]
    fn copy_child(
        &self,
        parent: u32,
        ns: u32,
        node: u32,
        key: &[u32],
        pos: usize,
        out: &mut Vec<u32>,
        comps: Comps,
    ) -> Copied {
        let Some(version) = self.version(node) else {
            return Copied::Torn;
        };
        let p = self.layout.page_size as usize;
        let start = out.len();
        // `None`: torn; `Some(None)`: not the child; else (generation,
        // matched, whole, component words).
        let copy = || -> Option<Option<ChildCopy>> {
            let state = self.node(node, offset_of!(Node, state))?;
            if state != NODE_LIVE
                || self.node(node, offset_of!(Node, parent))? != parent
                // Only the root's children are filed by namespace: below
                // them a child is in its parent's (one load saved a hop).
                || (parent == ROOT && self.node(node, offset_of!(Node, ns))? != ns)
            {
                return Some(None);
            }
            let num_pages = self.node(node, offset_of!(Node, num_pages))?;
            if num_pages == 0 || num_pages > self.layout.capacity {
                return None;
            }
            let first_page = self.node(node, offset_of!(Node, first_page))?;
            let (mut page, mut matched, mut at) = (first_page, 0usize, pos);
            while matched < num_pages as usize {
                if at + p > key.len() {
                    break;
                }
                let (state, run, next) = self.page_link(page)?;
                if state != PAGE_CACHED {
                    return None;
                }
                // A run of consecutive pages (see `Page::owner_or_run`):
                // their tokens side by side, their ids without the links.
                // The node's version vouches for the run as for the links.
                let run = (run as usize)
                    .min(num_pages as usize - matched)
                    .min((key.len() - at) / p);
                if run >= 2 && matched > 0 {
                    let mut same = 0;
                    if self.run_is(page, &key[at..at + run * p])? {
                        same = run;
                    }
                    while same < run
                        && self.page_is(page.checked_add(same as u32)?, &key[at + same * p..])?
                    {
                        same += 1;
                    }
                    out.extend((0..same as u32).map(|j| page + j));
                    matched += same;
                    at += same * p;
                    if same < run {
                        break;
                    }
                    let (_, _, next) = self.page_link(page + run as u32 - 1)?;
                    page = next;
                    continue;
                }
                if !self.page_is(page, &key[at..at + p])? {
                    if matched == 0 {
                        return Some(None);
                    }
                    break;
                }
                out.push(page);
                matched += 1;
                at += p;
                page = next;
            }
            let whole = matched == num_pages as usize;
            if whole && page != NIL {
                return None;
            }
            let generation = self.node(node, offset_of!(Node, generation))?;
            // Read only for hybrid engines: a FULL-only walk loads what it
            // always did.
            let words = if comps.any() {
                (
                    self.node(node, offset_of!(Node, swa))?,
                    self.node(node, offset_of!(Node, mamba))?,
                )
            } else {
                (0, 0)
            };
            Some(Some((generation, matched, whole, words)))
        };
        match version.read(copy) {
            Some((Some(Some((generation, matched, whole, words))), v)) => Copied::Child {
                generation,
                version: v,
                matched,
                whole,
                comps: words,
            },
            Some((Some(None), _)) => {
                out.truncate(start);
                Copied::NotChild
            }
            _ => {
                out.truncate(start);
                Copied::Torn
            }
        }
    }

    /// The child of `parent` whose first page is `key[pos..pos + p]`,
    /// copied; retries the probe (not the child) while the table moves.
    fn lookup(
        &self,
        parent: u32,
        ns: u32,
        key: &[u32],
        pos: usize,
        out: &mut Vec<u32>,
        comps: Comps,
    ) -> Lookup {
        let p = self.layout.page_size as usize;
        let hash = child_hash(parent, ns, &key[pos..pos + p]);
        let mask = self.layout.buckets - 1;
        for attempt in 0..NODE_TRIES {
            let Some(tv) = self.table_version().stable() else {
                backoff(attempt);
                continue;
            };
            let mut i = hash & mask;
            // At most one lap: a table with no empty bucket is torn.
            for _ in 0..self.layout.buckets {
                let Some(b) = self.bucket(i) else { break };
                if b.node == NIL {
                    break;
                }
                if b.hash == hash {
                    match self.copy_child(parent, ns, b.node, key, pos, out, comps) {
                        Copied::Child {
                            generation,
                            version,
                            matched,
                            whole,
                            comps,
                        } => {
                            return Lookup::Found {
                                node: b.node,
                                generation,
                                version,
                                matched,
                                whole,
                                comps,
                            };
                        }
                        Copied::NotChild => {}
                        Copied::Torn => return Lookup::Torn,
                    }
                }
                i = (i + 1) & mask;
            }
            if self.table_version().still(tv) {
                return Lookup::Miss { hash };
            }
            backoff(attempt);
        }
        Lookup::Torn
    }

    /// The root's frame, and the components the header names, read while
    /// the root's version stood still (only `format`, which rewrites the
    /// header, moves it).
    fn root(&self) -> Option<(Frame, Comps)> {
        let v = self.version(ROOT)?;
        let header = |field| self.field::<Header>(self.layout.header_at, 1, 0, field);
        for attempt in 0..NODE_TRIES {
            let copy = || -> Option<Comps> {
                let bits = header(offset_of!(Header, components))?;
                Some(Comps {
                    swa: bits & COMPONENT_SWA != 0,
                    mamba: bits & COMPONENT_MAMBA != 0,
                    window: u64::from(header(offset_of!(Header, swa_window))?),
                })
            };
            if let Some((Some(comps), version)) = v.read(copy) {
                let frame = Frame {
                    node: ROOT,
                    generation: 0,
                    version,
                    pages: 0,
                    pos: 0,
                    since: u32::MAX,
                    usable_pages: 0,
                    usable_state: 0,
                };
                return Some((frame, comps));
            }
            backoff(attempt);
        }
        None
    }

    /// Node `index`'s generation as it stands (one load): for the node a
    /// lock's handle names, whose generation the lock holds still.
    pub fn generation_of(&self, index: u32) -> Option<u32> {
        self.node(index, offset_of!(Node, generation))
    }

    /// The anchor of a match that took node `index` (of `generation`)
    /// whole, as a `match` answer's handle names it: its version and page
    /// count, copied while it stood still; `None` when it is not that live
    /// node, or kept changing. Untrusted like every anchor: the daemon
    /// re-checks it, and the depth a caller claims with it, in full.
    pub fn anchor_of(&self, index: u32, generation: u32) -> Option<Anchor> {
        if index == ROOT {
            return None;
        }
        let v = self.version(index)?;
        for attempt in 0..NODE_TRIES {
            let copy = || {
                let live = self.node(index, offset_of!(Node, state))? == NODE_LIVE
                    && self.node(index, offset_of!(Node, generation))? == generation;
                live.then(|| self.node(index, offset_of!(Node, num_pages)))?
            };
            if let Some((pages, version)) = v.read(copy) {
                return Some(Anchor {
                    node: index,
                    generation,
                    version,
                    pages_into_node: pages?,
                });
            }
            backoff(attempt);
        }
        None
    }

    /// The length of the longest cached page-aligned prefix of `tokens`,
    /// with its pages in `pages`; `None` after `NODE_TRIES` failures in a
    /// row at one depth. See the module's guarantee.
    pub fn peek(&self, tokens: &[u32], pages: &mut Vec<u32>) -> Option<usize> {
        self.peek_anchored(tokens, pages).map(|p| p.len)
    }

    /// Tokens cached per namespace id that holds any (the default, 0,
    /// first), counted over the live nodes without a lock: a best-effort
    /// figure for `radixd stat`, exact while the tree stands still.
    pub fn namespace_tokens(&self) -> Vec<(u32, u64)> {
        let p = u64::from(self.layout.page_size);
        let mut tokens = std::collections::BTreeMap::<u32, u64>::new();
        for i in (0..self.layout.node_cap).filter(|&i| i != ROOT) {
            let field = |f| self.node(i, f);
            if field(offset_of!(Node, state)) != Some(NODE_LIVE) {
                continue;
            }
            let (Some(ns), Some(pages)) = (
                field(offset_of!(Node, ns)),
                field(offset_of!(Node, num_pages)),
            ) else {
                continue;
            };
            *tokens.entry(ns).or_default() += u64::from(pages) * p;
        }
        tokens.into_iter().collect()
    }

    /// [`TreeReader::peek`] in namespace `ns` (an id the daemon gave; 0:
    /// the default namespace).
    pub fn peek_in(&self, ns: u32, tokens: &[u32], pages: &mut Vec<u32>) -> Option<usize> {
        self.peek_anchored_in(ns, tokens, pages).map(|p| p.len)
    }

    /// [`TreeReader::peek_anchored`] in namespace `ns`.
    pub fn peek_anchored_in(
        &self,
        ns: u32,
        tokens: &[u32],
        pages: &mut Vec<u32>,
    ) -> Option<Peeked> {
        self.walk(ns, tokens, pages).map(|(peeked, _)| peeked)
    }

    /// [`TreeReader::peek_usable`] in namespace `ns`.
    pub fn peek_usable_in(
        &self,
        ns: u32,
        tokens: &[u32],
        pages: &mut Vec<u32>,
    ) -> Option<(Usable, Peeked)> {
        let (peeked, usable) = self.walk(ns, tokens, pages)?;
        pages.truncate(usable.len / self.layout.page_size as usize);
        Some((usable, peeked))
    }

    /// [`TreeReader::peek`], also naming where the match ended (the same
    /// walk: the anchor is the frame or copy the answer came from).
    pub fn peek_anchored(&self, tokens: &[u32], pages: &mut Vec<u32>) -> Option<Peeked> {
        self.walk(0, tokens, pages).map(|(peeked, _)| peeked)
    }

    /// What a hybrid engine (SWA or MAMBA on) would match: the FULL walk of
    /// [`TreeReader::peek_anchored`], cut back to the deepest point every
    /// component serves, `pages` cut with it; the same as `peek` on a
    /// FULL-only engine. Returns the usable prefix and the FULL answer.
    pub fn peek_usable(&self, tokens: &[u32], pages: &mut Vec<u32>) -> Option<(Usable, Peeked)> {
        self.peek_usable_in(0, tokens, pages)
    }

    /// The walk of every peek, in namespace `ns`: the FULL answer and the
    /// usable one.
    fn walk(&self, ns: u32, tokens: &[u32], pages: &mut Vec<u32>) -> Option<(Peeked, Usable)> {
        let p = self.layout.page_size as usize;
        let key = &tokens[..tokens.len() / p * p];
        pages.clear();
        pages.reserve(key.len() / p);
        let (root, comps) = self.root()?;
        // FULL-only: the usable prefix is the FULL one.
        let usable = |full: usize, f: &Frame| {
            if comps.any() {
                f.usable(p)
            } else {
                Usable {
                    len: full,
                    mamba_state: None,
                }
            }
        };
        let mut stack = FrameStack::new(root);
        // Failures since the walk last went deeper.
        let mut tries = 0u32;
        // Every iteration goes deeper (at most once per key page) or counts
        // a failure; failures reset when it goes deeper.
        let steps = (key.len() / p + 1).saturating_mul(NODE_TRIES as usize + 1);
        for _ in 0..steps {
            let Some(&top) = stack.last() else {
                stack.push(self.root()?.0);
                continue;
            };
            if top.pos + p > key.len() {
                let peeked = Peeked {
                    len: top.pos,
                    anchor: top.anchor(),
                    next_hash: None,
                };
                return Some((peeked, usable(top.pos, &top)));
            }
            let before = pages.len();
            let found = self.lookup(top.node, ns, key, top.pos, pages, comps);
            let parent_still = || self.version(top.node).is_some_and(|v| v.still(top.version));
            match found {
                Lookup::Found {
                    node,
                    generation,
                    version,
                    matched,
                    whole,
                    comps: (swa, mamba),
                } if parent_still() => {
                    let pos = top.pos + matched * p;
                    if !whole {
                        let anchor = Anchor {
                            node,
                            generation,
                            version,
                            // matched <= num_pages, a u32.
                            pages_into_node: matched as u32,
                        };
                        // The engine splits the node here: the upper half
                        // keeps its SWA pages, the state stays below.
                        let (since, usable_pages, usable_state) =
                            comps.step(&top, matched * p, pos / p, swa, 0);
                        let cut = Frame {
                            since,
                            usable_pages,
                            usable_state,
                            ..top
                        };
                        let peeked = Peeked {
                            len: pos,
                            anchor: Some(anchor),
                            next_hash: None,
                        };
                        return Some((peeked, usable(pos, &cut)));
                    }
                    let (since, usable_pages, usable_state) =
                        comps.step(&top, matched * p, pos / p, swa, mamba);
                    stack.push(Frame {
                        node,
                        generation,
                        version,
                        pages: matched as u32,
                        pos,
                        since,
                        usable_pages,
                        usable_state,
                    });
                    tries = 0;
                    continue;
                }
                Lookup::Miss { hash } if parent_still() => {
                    let anchor = top.anchor();
                    let peeked = Peeked {
                        len: top.pos,
                        anchor,
                        next_hash: anchor.map(|_| hash),
                    };
                    return Some((peeked, usable(top.pos, &top)));
                }
                Lookup::Torn => {}
                // The parent changed: resume at the deepest frame whose
                // node is still what it was.
                _ => {
                    while let Some(f) = stack.last() {
                        if self.version(f.node).is_some_and(|v| v.still(f.version)) {
                            break;
                        }
                        stack.pop();
                    }
                }
            }
            tries += 1;
            if tries >= NODE_TRIES {
                return None;
            }
            pages.truncate(before.min(stack.last().map_or(0, |f| f.pos / p)));
            backoff(tries);
        }
        None
    }
}

#[cfg(test)]
mod tests;
