//! The store's errors: [`StoreError`] for what a request asks, and
//! [`AdoptError`] for a store file the daemon will not take over.

use std::fmt;

use super::layout::{ConfigError, MAX_KEY, MAX_NAME, NAMESPACES};

/// Why a store request was refused (nothing changed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// The daemon runs without `--store`.
    NoStore,
    /// A key (or parent key) that is empty or longer than [`MAX_KEY`].
    BadKey { len: usize },
    /// A namespace name that is empty or longer than [`MAX_NAME`].
    BadName { len: usize },
    /// A value, or a namespace registration, of another size than the
    /// namespace's.
    SizeMismatch { expected: u64, got: u64 },
    /// A value larger than an extent.
    ValueTooLarge { value_size: u64, extent: u64 },
    /// No namespace with that id.
    UnknownNamespace { ns: u32 },
    /// Every namespace slot is taken.
    TooManyNamespaces,
    /// Every value is reserved or held by readers: nothing can be evicted.
    StoreFull { needed: usize },
    /// A commit or abort of a slot the client does not hold reserved.
    NotReserved { index: u32 },
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoStore => {
                f.write_str("the daemon has no store (start it with `radixd serve --store SIZE`)")
            }
            Self::BadKey { len } => write!(f, "a key must be 1..={MAX_KEY} bytes, not {len}"),
            Self::BadName { len } => {
                write!(
                    f,
                    "a namespace name must be 1..={MAX_NAME} bytes, not {len}"
                )
            }
            Self::SizeMismatch { expected, got } => write!(
                f,
                "the namespace's values are {expected} bytes, this one is {got}"
            ),
            Self::ValueTooLarge { value_size, extent } => write!(
                f,
                "values of {value_size} bytes do not fit the store's {extent}-byte extents"
            ),
            Self::UnknownNamespace { ns } => write!(f, "no namespace {ns}"),
            Self::TooManyNamespaces => write!(f, "all {NAMESPACES} namespaces are taken"),
            Self::StoreFull { needed } => write!(
                f,
                "no room for {needed} values: everything else is reserved or still read"
            ),
            Self::NotReserved { index } => {
                write!(f, "slot {index} is not reserved by this client")
            }
        }
    }
}

impl std::error::Error for StoreError {}

/// Why an existing store file was not adopted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdoptError {
    /// Not a store file, or one of another radixd.
    Magic,
    Version {
        found: u64,
    },
    /// Header fields that give no layout or another file size.
    Header(String),
    /// The file was made with another `--store SIZE`.
    Size {
        file: u64,
        asked: u64,
    },
    /// A namespace record out of bounds.
    Namespace {
        index: u32,
        why: &'static str,
    },
    /// An index entry out of bounds.
    Entry {
        index: u32,
        why: &'static str,
    },
    Config(ConfigError),
}

impl fmt::Display for AdoptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Magic => f.write_str("not a radixd store file (bad magic)"),
            Self::Version { found } => write!(f, "store layout version {found} is not ours"),
            Self::Header(why) => write!(f, "bad store header: {why}"),
            Self::Size { file, asked } => write!(
                f,
                "the store file holds a store of {file} bytes, not the {asked} asked"
            ),
            Self::Namespace { index, why } => write!(f, "namespace {index}: {why}"),
            Self::Entry { index, why } => write!(f, "index entry {index}: {why}"),
            Self::Config(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for AdoptError {}
