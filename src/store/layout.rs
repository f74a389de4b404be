//! The store file's records and where each part lies.
//!
//! ```text
//! | Header | namespace table | bucket heads | entries |  read-only to clients
//! | use clock | per-client counters | use stamps | data extents |  read-write
//! ```
//!
//! Every record is `#[repr(C)]`, holds offsets and indices only, and is
//! made of atomics (readers in other processes load what the daemon
//! stores). [`StoreLayout::new`] derives every offset from the header's
//! configuration fields, so a client and an adopting daemon recompute the
//! layout and compare it with the file rather than trust stored offsets.

use radixd_ipc::sync::{AtomicU32, AtomicU64};
use radixd_ipc::Version;

/// First word of a store file.
pub const MAGIC: u64 = u64::from_le_bytes(*b"RADIXKVS");
/// Version of the records below; mixed into the layout hash.
pub const LAYOUT_VERSION: u64 = 1;
/// Longest key, in bytes (SGLang's keys are 64-byte SHA-256 hex strings,
/// with suffixes).
pub const MAX_KEY: usize = 256;
/// Words of a key.
pub const KEY_WORDS: usize = MAX_KEY / 8;
/// Longest namespace name, in bytes.
pub const MAX_NAME: usize = 255;
/// Namespaces a store holds (two under loom: each is 35 loom atomics, and
/// the models use one).
pub const NAMESPACES: u32 = if cfg!(loom) { 2 } else { 64 };
/// "No entry".
pub const NIL: u32 = u32::MAX;
/// Page size the read-only and read-write parts are cut at.
pub const PAGE: u64 = 4096;
/// Alignment of the data region (a huge page).
pub const DATA_ALIGN: u64 = 2 << 20;
/// Largest extent: the unit of memory that moves between value sizes.
pub const MAX_EXTENT: u64 = 16 << 20;
/// A store is cut into at least this many extents (fewer, larger ones
/// above 128 MiB): a small store still takes values of a quarter of it.
pub const EXTENTS_AT_LEAST: u64 = 8;
/// Smallest store.
pub const MIN_STORE: u64 = 1 << 20;
/// Largest store (1 TiB).
pub const MAX_STORE: u64 = 1 << 40;
/// Store bytes per index entry: one entry per 32 KiB of data, so a store
/// of 64 KiB pages never runs out of entries first.
pub const BYTES_PER_ENTRY: u64 = 32 << 10;
/// Fewest and most entries.
pub const MIN_ENTRIES: u32 = 1024;
pub const MAX_ENTRIES: u32 = 1 << 24;

/// [`Entry::state`]: unused (on the free list or in limbo).
pub const FREE: u32 = 0;
/// [`Entry::state`]: reserved by a client that is copying its value in.
pub const RESERVED: u32 = 1;
/// [`Entry::state`]: committed, served to readers.
pub const COMMITTED: u32 = 2;

/// The header at offset 0; written by the daemon before it serves.
#[repr(C)]
#[derive(Debug)]
pub struct Header {
    pub magic: AtomicU64,
    pub version: AtomicU64,
    /// [`StoreLayout::hash`] of the configuration below.
    pub hash: AtomicU64,
    /// The configuration (what `StoreLayout::new` needs).
    pub data_bytes: AtomicU64,
    pub extent_bytes: AtomicU64,
    pub entries: AtomicU64,
    pub clients: AtomicU64,
    /// The whole file's length.
    pub file_bytes: AtomicU64,
    /// Live figures, written by the daemon only.
    pub values: AtomicU64,
    pub bytes: AtomicU64,
    pub evicted: AtomicU64,
    pub failed_reserves: AtomicU64,
    pub namespaces: AtomicU64,
    /// Hits and misses of the clients whose slots were claimed again
    /// since (their counters restart from zero with each claim).
    pub retired_hits: AtomicU64,
    pub retired_misses: AtomicU64,
    pub _reserved: [AtomicU64; 49],
}

#[cfg(not(loom))]
const _: () = assert!(size_of::<Header>() == 512);

/// A namespace: who may read a value, and its one value size.
#[repr(C)]
#[derive(Debug)]
pub struct Namespace {
    /// 0: free; 1: registered (stored last, Release).
    pub state: AtomicU32,
    pub name_len: AtomicU32,
    pub value_size: AtomicU64,
    pub name: [AtomicU64; KEY_WORDS],
}

#[cfg(not(loom))]
const _: () = assert!(size_of::<Namespace>() == 272);

/// One index record; written by the daemon only, under its `version`.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Entry {
    /// Sequence word: odd while the daemon changes the record.
    pub version: Version,
    /// [`FREE`], [`RESERVED`] or [`COMMITTED`].
    pub state: AtomicU32,
    /// Namespace index.
    pub ns: AtomicU32,
    pub key_len: AtomicU32,
    pub hash: AtomicU64,
    /// Offset of the value from the start of the data region.
    pub data: AtomicU64,
    /// Next entry of the bucket's chain ([`NIL`]: none).
    pub next: AtomicU32,
    /// Bumped each time the record is reused.
    pub generation: AtomicU32,
    /// The entry of the value stored before this one ([`NIL`]: none) and
    /// its generation then.
    pub parent: AtomicU32,
    pub parent_generation: AtomicU32,
    pub _pad: [u32; 4],
    /// The key, zero padded.
    pub key: [AtomicU64; KEY_WORDS],
}

#[cfg(not(loom))]
const _: () = assert!(size_of::<Entry>() == 320);

/// One client's read figures, on a cache line of its own.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

#[cfg(not(loom))]
const _: () = assert!(size_of::<Counters>() == 64);

// SAFETY: atomics and integers only; every bit pattern is a value (readers
// check every index and length they load). (Not under loom, whose atomics
// are handles, not words.)
#[cfg(not(loom))]
unsafe impl radixd_ipc::ShmSafe for Header {}
// SAFETY: as above.
#[cfg(not(loom))]
unsafe impl radixd_ipc::ShmSafe for Namespace {}
// SAFETY: as above.
#[cfg(not(loom))]
unsafe impl radixd_ipc::ShmSafe for Entry {}
// SAFETY: as above.
#[cfg(not(loom))]
unsafe impl radixd_ipc::ShmSafe for Counters {}

/// What sizes a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// Bytes of the data region (a whole number of extents).
    pub data_bytes: u64,
    /// Bytes of one extent (a multiple of [`PAGE`]).
    pub extent_bytes: u64,
    /// Index entries (the most values the store holds).
    pub entries: u32,
    /// Client slots (one counter slot each).
    pub clients: u32,
}

/// Why a store cannot be laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// Below [`MIN_STORE`] or above [`MAX_STORE`].
    Size(u64),
    /// An extent that is not a positive multiple of [`PAGE`] up to
    /// [`MAX_EXTENT`], or data not a whole number of extents.
    Extent(u64),
    /// Entries outside `1..=MAX_ENTRIES`.
    Entries(u32),
    /// Clients outside 1..=1024.
    Clients(u32),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Size(n) => write!(
                f,
                "a store of {n} bytes is outside {MIN_STORE}..={MAX_STORE} bytes"
            ),
            Self::Extent(n) => write!(f, "extents of {n} bytes do not tile the store"),
            Self::Entries(n) => write!(f, "{n} index entries is outside 1..={MAX_ENTRIES}"),
            Self::Clients(n) => write!(f, "{n} clients is outside 1..=1024"),
        }
    }
}

impl std::error::Error for ConfigError {}

impl StoreConfig {
    /// The configuration `radixd serve --store SIZE` uses: extents of
    /// `min(16 MiB, SIZE / 8)` (page aligned), one entry per 32 KiB.
    pub fn for_size(store_bytes: u64, clients: u32) -> Result<Self, ConfigError> {
        if !(MIN_STORE..=MAX_STORE).contains(&store_bytes) {
            return Err(ConfigError::Size(store_bytes));
        }
        let extent_bytes = (store_bytes / EXTENTS_AT_LEAST).min(MAX_EXTENT) / PAGE * PAGE;
        let extents = store_bytes / extent_bytes;
        let entries = (store_bytes / BYTES_PER_ENTRY)
            .clamp(u64::from(MIN_ENTRIES), u64::from(MAX_ENTRIES)) as u32;
        let config = Self {
            data_bytes: extents * extent_bytes,
            extent_bytes,
            entries,
            clients,
        };
        StoreLayout::new(config)?;
        Ok(config)
    }
}

/// Where everything lies, derived from a [`StoreConfig`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreLayout {
    pub config: StoreConfig,
    pub namespaces_at: u64,
    pub buckets_at: u64,
    /// Buckets: the power of two at or above the entries.
    pub buckets: u32,
    pub entries_at: u64,
    /// Bytes of the read-only part (page aligned).
    pub ro_bytes: u64,
    /// The read-write part starts with the use clock.
    pub clock_at: u64,
    pub counters_at: u64,
    pub stamps_at: u64,
    pub data_at: u64,
    /// Extents of the data region.
    pub extents: u32,
    /// Length of the file.
    pub file_bytes: u64,
    /// Hash of the configuration and the record versions.
    pub hash: u64,
}

/// `x` rounded up to a multiple of `to`, saturating: a value size read
/// from a client or an adopted file near `u64::MAX` must come out too
/// large for any extent, never wrap to a small stride.
fn align(x: u64, to: u64) -> u64 {
    x.div_ceil(to).saturating_mul(to)
}

impl StoreLayout {
    /// The layout of a store configured so.
    pub fn new(config: StoreConfig) -> Result<Self, ConfigError> {
        let StoreConfig {
            data_bytes,
            extent_bytes,
            entries,
            clients,
        } = config;
        if !(1..=1024).contains(&clients) {
            return Err(ConfigError::Clients(clients));
        }
        if !(1..=MAX_ENTRIES).contains(&entries) {
            return Err(ConfigError::Entries(entries));
        }
        if extent_bytes == 0
            || extent_bytes % PAGE != 0
            || extent_bytes > MAX_EXTENT
            || data_bytes == 0
            || data_bytes % extent_bytes != 0
            || data_bytes > MAX_STORE
        {
            return Err(ConfigError::Extent(extent_bytes));
        }
        let extents = u32::try_from(data_bytes / extent_bytes)
            .map_err(|_| ConfigError::Extent(extent_bytes))?;
        let namespaces_at = PAGE;
        let buckets_at = namespaces_at + u64::from(NAMESPACES) * size_of::<Namespace>() as u64;
        let buckets = entries.next_power_of_two();
        let entries_at = align(buckets_at + u64::from(buckets) * 4, 64);
        let ro_bytes = align(
            entries_at + u64::from(entries) * size_of::<Entry>() as u64,
            PAGE,
        );
        let clock_at = ro_bytes;
        let counters_at = clock_at + 64;
        let stamps_at = counters_at + u64::from(clients) * size_of::<Counters>() as u64;
        let data_at = align(stamps_at + u64::from(entries) * 8, DATA_ALIGN);
        let file_bytes = data_at + data_bytes;
        let mut hash = xxhash_rust::xxh3::xxh3_64(&MAGIC.to_le_bytes());
        for x in [
            LAYOUT_VERSION,
            data_bytes,
            extent_bytes,
            u64::from(entries),
            u64::from(clients),
            size_of::<Header>() as u64,
            size_of::<Namespace>() as u64,
            size_of::<Entry>() as u64,
            size_of::<Counters>() as u64,
        ] {
            hash = xxhash_rust::xxh3::xxh3_64_with_seed(&x.to_le_bytes(), hash);
        }
        Ok(Self {
            config,
            namespaces_at,
            buckets_at,
            buckets,
            entries_at,
            ro_bytes,
            clock_at,
            counters_at,
            stamps_at,
            data_at,
            extents,
            file_bytes,
            hash,
        })
    }

    /// Bytes of the read-write part.
    pub fn rw_bytes(&self) -> u64 {
        self.file_bytes - self.ro_bytes
    }
}

/// Slot stride of values of `value_size` bytes: cache-line aligned, page
/// aligned from a page up (so large values copy from aligned addresses).
pub fn stride(value_size: u64) -> u64 {
    if value_size >= PAGE {
        align(value_size, PAGE)
    } else {
        align(value_size.max(1), 64)
    }
}

/// The hash of key `key` in namespace `ns`.
pub fn key_hash(ns: u32, key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(key, u64::from(ns).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// `key` as zero-padded words (`key.len() <= MAX_KEY`).
pub fn key_words(key: &[u8]) -> [u64; KEY_WORDS] {
    let mut words = [0u64; KEY_WORDS];
    for (w, chunk) in words.iter_mut().zip(key.chunks(8)) {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        *w = u64::from_le_bytes(b);
    }
    words
}

/// Parses a size such as `64GiB`, `512M`, `1.5G` or `1048576`: IEC units
/// (`K`, `KiB`, `M`, `MiB`, `G`, `GiB`, `T`, `TiB`: powers of 1024) or SI
/// ones (`kB`, `MB`, `GB`, `TB`: powers of 1000), case-insensitive.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(format!("{text:?} is not a size like 64GiB")),
    };
    let bad = || format!("{text:?} is not a size like 64GiB");
    if let Ok(n) = number.parse::<u64>() {
        return n.checked_mul(scale).ok_or_else(bad);
    }
    let x: f64 = number.parse().map_err(|_| bad())?;
    let bytes = x * scale as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_give_extents_entries_and_an_aligned_file() {
        let c = StoreConfig::for_size(64 << 20, 16).unwrap();
        assert_eq!(c.extent_bytes, 8 << 20);
        assert_eq!(c.data_bytes, 64 << 20);
        assert_eq!(c.entries, 2048);
        let l = StoreLayout::new(c).unwrap();
        assert_eq!(l.ro_bytes % PAGE, 0);
        assert_eq!(l.data_at % DATA_ALIGN, 0);
        assert_eq!(l.file_bytes, l.data_at + (64 << 20));
        assert_eq!(l.buckets, 2048);
        let big = StoreConfig::for_size(64 << 30, 16).unwrap();
        assert_eq!(big.extent_bytes, MAX_EXTENT);
        assert!(StoreConfig::for_size(1000, 1).is_err());
        let other = StoreLayout::new(StoreConfig { clients: 8, ..c }).unwrap();
        assert_ne!(l.hash, other.hash);
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("64GiB"), Ok(64 << 30));
        assert_eq!(parse_size("64G"), Ok(64 << 30));
        assert_eq!(parse_size("1.5MiB"), Ok(3 << 19));
        assert_eq!(parse_size("2MB"), Ok(2_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn strides_and_keys() {
        assert_eq!(stride(1), 64);
        assert_eq!(stride(100), 128);
        assert_eq!(stride(65536), 65536);
        assert_eq!(stride(5000), 8192);
        // Found by the store_adopt fuzz target: a value size near u64::MAX
        // once overflowed (a panic in debug, a wrapped stride in release).
        assert_eq!(stride(u64::MAX - 10), u64::MAX);
        assert_eq!(stride(u64::MAX), u64::MAX);
        let w = key_words(b"abcdefghi");
        assert_eq!(w[0], u64::from_le_bytes(*b"abcdefgh"));
        assert_eq!(w[1], u64::from(b'i'));
        assert_ne!(key_hash(0, b"k"), key_hash(1, b"k"));
    }
}
