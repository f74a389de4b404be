//! What the engine reports of the pages it caches and forgets, for KV events
//! ([`CacheEvent`]). Apart from the recording hooks (`record`) because the
//! arena holds the log of these facts, below the code that appends to it.

/// A change to the set of cached pages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheEvent {
    /// `pages` became cached, one run of a node hanging under the page
    /// `parent` (`None`: under the root), with one page of `tokens` each.
    Stored {
        /// Last page of the parent node; `None` at the root.
        parent: Option<u32>,
        /// The new pages, in order from the root.
        pages: Vec<u32>,
        /// `pages.len() * page_size` tokens.
        tokens: Vec<u32>,
        /// The namespace the run is cached in (0: the default one), an id
        /// a [`CacheEvent::Namespace`] named before.
        ns: u32,
    },
    /// `pages` stopped being cached (evicted from the end of one node, so
    /// the last page of the node goes first).
    Removed {
        /// The evicted pages, in the order they went.
        pages: Vec<u32>,
    },
    /// Every cached page went (reset).
    Cleared,
    /// Namespace `id` is named `name` (recorded when it is registered, and
    /// again in a resynchronising snapshot); ids are never reused.
    Namespace { id: u32, name: String },
}
