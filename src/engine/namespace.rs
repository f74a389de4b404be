//! Namespaces: disjoint parts of one tree, as SGLang's
//! `RadixKey(extra_key=...)` keeps a LoRA adapter's or a `cache_salt`'s
//! prefixes apart. A prefix cached in one namespace never matches in
//! another; eviction stays one LRU order over all of them.
//!
//! A namespace is a name (1 to [`MAX_NAMESPACE_LEN`] bytes of UTF-8)
//! registered on first use and given a small id, never reused while the
//! engine lives (a reset keeps them), so an id a client resolved once stays
//! right. The id is mixed into the child-table key of the root's children
//! (and stored in every node, a child's being its parent's): the default
//! namespace, id 0, hashes exactly as a tree without namespaces, so an
//! engine whose clients use none does nothing more than before. The names
//! live in the writer's private memory; a lock-free reader is given the id.

use std::collections::HashMap;
use std::fmt;

use super::cache::Engine;
use super::event::CacheEvent;
use super::layout::{NODE_LIVE, ROOT};
use super::region::Region;

/// Longest namespace name, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 256;
/// Most namespaces one engine registers over its life (the default one
/// not counted).
pub const MAX_NAMESPACES: u32 = 1 << 20;

/// Why a namespace name was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamespaceError {
    /// The empty name (the default namespace is named by no name at all).
    Empty,
    /// A name longer than [`MAX_NAMESPACE_LEN`] bytes.
    TooLong { len: usize },
    /// [`MAX_NAMESPACES`] names are registered already.
    Full,
}

impl fmt::Display for NamespaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => write!(
                f,
                "a namespace name is 1 to {MAX_NAMESPACE_LEN} bytes (leave \"ns\" out for the default namespace)"
            ),
            Self::TooLong { len } => write!(
                f,
                "a namespace name of {len} bytes is longer than {MAX_NAMESPACE_LEN}"
            ),
            Self::Full => write!(f, "{MAX_NAMESPACES} namespaces are in use already"),
        }
    }
}

impl std::error::Error for NamespaceError {}

/// Checks a namespace name's length (any UTF-8 string of 1 to
/// [`MAX_NAMESPACE_LEN`] bytes).
pub fn check_namespace(name: &str) -> Result<(), NamespaceError> {
    check_namespace_len(name.len())
}

/// The length part of [`check_namespace`], for a reader that checks it
/// before copying the name.
pub fn check_namespace_len(len: usize) -> Result<(), NamespaceError> {
    match len {
        0 => Err(NamespaceError::Empty),
        len if len > MAX_NAMESPACE_LEN => Err(NamespaceError::TooLong { len }),
        _ => Ok(()),
    }
}

/// Tokens cached in one namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceSize {
    /// `None`: the default namespace.
    pub name: Option<String>,
    pub id: u32,
    pub tokens: u64,
}

impl<R: Region> Engine<R> {
    /// The id of namespace `name`, registered now if it is new.
    pub fn namespace(&mut self, name: &str) -> Result<u32, NamespaceError> {
        check_namespace(name)?;
        let ns = &mut self.namespaces;
        if let Some(&id) = ns.ids.get(name) {
            return Ok(id);
        }
        if ns.names.len() as u32 >= MAX_NAMESPACES {
            return Err(NamespaceError::Full);
        }
        ns.names.push(name.to_owned());
        let id = ns.names.len() as u32;
        ns.ids.insert(name.to_owned(), id);
        self.arena.record(|_| CacheEvent::Namespace {
            id,
            name: name.to_owned(),
        });
        Ok(id)
    }

    /// The name of namespace `id` (`None`: the default one, or no such id).
    pub fn namespace_name(&self, id: u32) -> Option<&str> {
        let i = id.checked_sub(1)?;
        self.namespaces.names.get(i as usize).map(String::as_str)
    }

    /// Runs `f` with every walk from the root, and every leaf hung under
    /// it, in namespace `ns` (an id from [`Engine::namespace`]); in the
    /// default namespace again afterwards. Operations that start from a
    /// node (anchors, handles, a session's release) are in that node's
    /// namespace whatever this says.
    pub fn with_namespace<T>(&mut self, ns: u32, f: impl FnOnce(&mut Self) -> T) -> T {
        self.arena.ns = ns;
        let out = f(self);
        self.arena.ns = 0;
        out
    }

    /// A [`CacheEvent::Namespace`] for every registered namespace, for a
    /// snapshot of the tree (see [`Engine::cached_runs`]).
    pub(crate) fn namespace_events(&self) -> impl Iterator<Item = CacheEvent> + '_ {
        let names = self.namespaces.names.iter();
        names.enumerate().map(|(i, name)| CacheEvent::Namespace {
            id: i as u32 + 1,
            name: name.clone(),
        })
    }

    /// Tokens cached per namespace that holds any, by id (the default
    /// namespace first), counted over the nodes: for statistics, not for
    /// a hot path.
    pub fn namespace_sizes(&self) -> Vec<NamespaceSize> {
        let p = u64::from(self.page_size());
        let mut tokens: HashMap<u32, u64> = HashMap::new();
        for (i, n) in self.arena.nodes().iter().enumerate() {
            if i as u32 != ROOT && n.state == NODE_LIVE {
                *tokens.entry(n.ns).or_default() += u64::from(n.num_pages) * p;
            }
        }
        let mut out: Vec<NamespaceSize> = tokens
            .into_iter()
            .map(|(id, tokens)| NamespaceSize {
                name: self.namespace_name(id).map(str::to_owned),
                id,
                tokens,
            })
            .collect();
        out.sort_by_key(|s| s.id);
        out
    }
}
