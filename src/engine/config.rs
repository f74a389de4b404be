//! What an engine is built with ([`Config`]) and why building one fails
//! ([`ConfigError`]). Apart from the operations' errors (`error`) because
//! the region's layout, which those errors sit above, already returns it.

use std::fmt;

/// What an engine is built with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Tokens per page, `1..=1024`.
    pub page_size: u32,
    /// Pages in the KV pool, `1..=2^30`.
    pub capacity: u32,
}

/// Why an engine could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// Page size outside `1..=1024`.
    PageSize(u32),
    /// Capacity outside `1..=2^30` pages.
    Capacity(u32),
    /// A host tier larger than `2^30` pages less the device pool.
    HostCapacity(u32),
    /// A valid page size and capacity whose region would not fit this
    /// machine's address space.
    TooLarge { page_size: u32, capacity: u32 },
    /// The region given is smaller than the layout needs.
    RegionTooSmall { need: usize, have: usize },
    /// The heap refused the region.
    OutOfMemory { bytes: usize },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::PageSize(p) => write!(f, "page size {p} is outside 1..=1024"),
            Self::Capacity(c) => write!(f, "capacity {c} is outside 1..=2^30 pages"),
            Self::HostCapacity(h) => write!(
                f,
                "a host tier of {h} pages is too large: device and host pages together are at \
                 most 2^30"
            ),
            Self::TooLarge {
                page_size,
                capacity,
            } => write!(
                f,
                "{capacity} pages of {page_size} tokens need more memory than can be addressed"
            ),
            Self::RegionTooSmall { need, have } => {
                write!(
                    f,
                    "region of {have} bytes is smaller than the {need} bytes needed"
                )
            }
            Self::OutOfMemory { bytes } => write!(f, "could not allocate {bytes} bytes"),
        }
    }
}

impl std::error::Error for ConfigError {}
