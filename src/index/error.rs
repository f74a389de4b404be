//! Why an event was not (wholly) applied.

use std::fmt;

/// Why [`KvIndex`](super::KvIndex) refused an event, or part of one.
///
/// Every kind but [`ApplyError::BlockNotFound`] leaves the index as it
/// was; a removal goes on past an unknown block, as Dynamo's does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyError {
    /// A `BlockStored` whose parent this worker does not hold (Dynamo's
    /// `ParentBlockNotFound`): skipped.
    ParentNotFound,
    /// A `BlockRemoved` naming a block this worker does not hold (Dynamo's
    /// `BlockNotFound`): that block is skipped, the others removed.
    BlockNotFound,
    /// A `BlockStored` naming a hash twice, or its own parent (Dynamo's
    /// `InvalidBlockSequence`): skipped.
    InvalidBlockSequence,
    /// A `BlockStored` whose `block_size` is not the index's.
    BlockSize {
        /// The event's.
        got: u32,
        /// The index's.
        want: u32,
    },
    /// A `BlockStored` with fewer `token_ids` than its blocks need.
    TokensShort,
    /// A store by local hashes on an index keyed by `sha256-cbor`, which
    /// chains over tokens.
    NeedsTokens,
    /// A batch's `data_parallel_rank` that is not a `u32`.
    BadRank,
    /// `clear` of a worker the index does not know.
    UnknownWorker,
}

impl ApplyError {
    /// A short stable name (the `radixd index` figures and error answers).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ParentNotFound => "parent_not_found",
            Self::BlockNotFound => "block_not_found",
            Self::InvalidBlockSequence => "invalid_block_sequence",
            Self::BlockSize { .. } => "block_size",
            Self::TokensShort => "tokens_short",
            Self::NeedsTokens => "needs_tokens",
            Self::BadRank => "bad_rank",
            Self::UnknownWorker => "unknown_worker",
        }
    }

    /// Every kind, in the order of [`ApplyError::index`].
    pub const KINDS: [&'static str; 8] = [
        "parent_not_found",
        "block_not_found",
        "invalid_block_sequence",
        "block_size",
        "tokens_short",
        "needs_tokens",
        "bad_rank",
        "unknown_worker",
    ];

    /// Position of this kind in [`ApplyError::KINDS`].
    pub fn index(&self) -> usize {
        match self {
            Self::ParentNotFound => 0,
            Self::BlockNotFound => 1,
            Self::InvalidBlockSequence => 2,
            Self::BlockSize { .. } => 3,
            Self::TokensShort => 4,
            Self::NeedsTokens => 5,
            Self::BadRank => 6,
            Self::UnknownWorker => 7,
        }
    }
}

impl fmt::Display for ApplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ParentNotFound => write!(f, "the parent block is not held by this worker"),
            Self::BlockNotFound => write!(f, "a removed block is not held by this worker"),
            Self::InvalidBlockSequence => {
                write!(
                    f,
                    "a stored event names a block hash twice or its own parent"
                )
            }
            Self::BlockSize { got, want } => {
                write!(f, "block size {got}, the index's is {want}")
            }
            Self::TokensShort => write!(f, "fewer token ids than the blocks need"),
            Self::NeedsTokens => write!(f, "a sha256-cbor index needs token ids, not local hashes"),
            Self::BadRank => write!(f, "data_parallel_rank is not a u32"),
            Self::UnknownWorker => write!(f, "no such worker"),
        }
    }
}

impl std::error::Error for ApplyError {}
