//! Carving a segment: aligned offsets for
//! `[header][daemon doorbell][slot table][client blocks][user area]`
//! and a stable layout hash over every size, alignment and version, so a
//! peer built with a different message type or configuration is refused
//! at [`Segment::open`](crate::segment::Segment::open).
//!
//! A client block is `[request ring header][request entries]
//! [response ring header][response entries][response doorbell][scratch]`,
//! page aligned, one per client slot index.

use core::fmt;
use core::marker::PhantomData;

use crate::doorbell::Doorbell;
use crate::ring::{Entry, RingHeader};
use crate::shm::{Offset, Plain};
use crate::slots::ClientSlot;

/// Crate-side layout version mixed into every hash.
const IPC_LAYOUT_VERSION: u64 = 3;
/// Where the info block sits in every [`SegmentLayout`]: right after the
/// header and the daemon doorbell, whatever the configuration, so a peer can
/// read the configuration before it knows the rest of the layout.
pub const INFO_OFFSET: u64 = 128;
/// Size of the info block.
pub const INFO_BYTES: u64 = 256;
/// Segment header size (kept equal to `segment::HEADER_SIZE`).
const HEADER_BYTES: u64 = 64;
const PAGE: u64 = 4096;

/// Errors of layout computation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutError {
    /// Sizes overflow `u64`.
    Overflow,
    /// Alignment not a power of two.
    BadAlign(u64),
    /// A ring capacity is not a non-zero power of two.
    BadCapacity(u32),
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Overflow => f.write_str("segment layout overflows"),
            Self::BadAlign(a) => write!(f, "alignment {a} is not a power of two"),
            Self::BadCapacity(c) => write!(f, "ring capacity {c} is not a non-zero power of two"),
        }
    }
}

impl std::error::Error for LayoutError {}

/// Sequential allocator of aligned offsets that hashes what it allocates
/// (FNV-1a 64 over sizes and alignments: stable across builds and hosts).
#[derive(Clone, Debug)]
pub struct LayoutBuilder {
    cursor: u64,
    hash: u64,
}

impl LayoutBuilder {
    /// Starts right after the segment header, hashing `user_version`.
    pub fn new(user_version: u32) -> Self {
        let mut b = Self {
            cursor: HEADER_BYTES,
            hash: 0xcbf2_9ce4_8422_2325,
        };
        b.mix(IPC_LAYOUT_VERSION);
        b.mix(u64::from(user_version));
        b
    }

    /// Mixes `value` (a config figure, a type size) into the hash.
    pub fn mix(&mut self, value: u64) {
        for byte in value.to_le_bytes() {
            self.hash ^= u64::from(byte);
            self.hash = self.hash.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// Reserves `size` bytes aligned to `align`; returns their offset.
    pub fn reserve(&mut self, size: u64, align: u64) -> Result<u64, LayoutError> {
        if !align.is_power_of_two() {
            return Err(LayoutError::BadAlign(align));
        }
        let start = self
            .cursor
            .checked_add(align - 1)
            .ok_or(LayoutError::Overflow)?
            & !(align - 1);
        self.cursor = start.checked_add(size).ok_or(LayoutError::Overflow)?;
        self.mix(size);
        self.mix(align);
        Ok(start)
    }

    /// Reserves an array of `count` `T`s.
    pub fn array<T>(&mut self, count: u64) -> Result<Offset<T>, LayoutError> {
        let size = (size_of::<T>() as u64)
            .checked_mul(count)
            .ok_or(LayoutError::Overflow)?;
        self.reserve(size, align_of::<T>() as u64).map(Offset::new)
    }

    /// Current end offset.
    pub fn end(&self) -> u64 {
        self.cursor
    }

    /// `(total size rounded up to a page, layout hash)`.
    pub fn finish(self) -> Result<(u64, u64), LayoutError> {
        let total = self
            .cursor
            .checked_add(PAGE - 1)
            .ok_or(LayoutError::Overflow)?
            & !(PAGE - 1);
        Ok((total, self.hash))
    }
}

/// Parameters of a [`SegmentLayout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutConfig {
    /// Number of client slots.
    pub clients: u32,
    /// Request ring capacity (power of two).
    pub request_capacity: u32,
    /// Response ring capacity (power of two).
    pub response_capacity: u32,
    /// Scratch bytes per client (4 MiB holds 1M `u32` tokens).
    pub scratch_bytes: u64,
    /// Bytes of the user area (e.g. the cache's arena).
    pub user_bytes: u64,
    /// Version of the user's own structures, mixed into the hash.
    pub user_version: u32,
}

/// Offsets of one client's block.
#[derive(Debug)]
pub struct ClientRegions<Req, Resp> {
    /// Request ring state (client produces, daemon consumes).
    pub request_header: Offset<RingHeader>,
    /// Request entries (`request_capacity` of them).
    pub request_slots: Offset<Entry<Req>>,
    /// Response ring state (daemon produces, client consumes).
    pub response_header: Offset<RingHeader>,
    /// Response entries (`response_capacity` of them).
    pub response_slots: Offset<Entry<Resp>>,
    /// Doorbell the daemon rings after posting a response.
    pub response_doorbell: Offset<Doorbell>,
    /// Start of the scratch region (page aligned).
    pub scratch: u64,
    /// Scratch length in bytes.
    pub scratch_len: u64,
}

impl<Req, Resp> Clone for ClientRegions<Req, Resp> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<Req, Resp> Copy for ClientRegions<Req, Resp> {}

/// The standard radixd segment layout, typed by its message types.
#[derive(Debug)]
pub struct SegmentLayout<Req, Resp> {
    /// The configuration it was computed from.
    pub config: LayoutConfig,
    /// Doorbell clients ring after posting a request (daemon sleeps on it).
    pub daemon_doorbell: Offset<Doorbell>,
    /// The user's fixed-size info block ([`INFO_OFFSET`], [`INFO_BYTES`]).
    pub info: u64,
    /// Client slot table (`config.clients` slots).
    pub slots: Offset<ClientSlot>,
    /// Offset of client 0's block.
    pub clients_base: u64,
    /// Distance between client blocks (page multiple).
    pub client_stride: u64,
    /// Offset of the user area (page aligned).
    pub user: u64,
    /// Total segment size (page multiple).
    pub total_size: u64,
    /// Layout hash to pass to `Segment::create`/`open`.
    pub hash: u64,
    block: ClientRegions<Req, Resp>,
    _types: PhantomData<fn() -> (Req, Resp)>,
}

impl<Req: Plain, Resp: Plain> SegmentLayout<Req, Resp> {
    /// Computes the layout for `config`.
    pub fn new(config: LayoutConfig) -> Result<Self, LayoutError> {
        for cap in [config.request_capacity, config.response_capacity] {
            if cap == 0 || !cap.is_power_of_two() {
                return Err(LayoutError::BadCapacity(cap));
            }
        }
        let mut b = LayoutBuilder::new(config.user_version);
        for v in [
            size_of::<RingHeader>(),
            size_of::<Entry<Req>>(),
            size_of::<Entry<Resp>>(),
            size_of::<ClientSlot>(),
            size_of::<Doorbell>(),
            size_of::<Req>(),
            align_of::<Req>(),
            size_of::<Resp>(),
            align_of::<Resp>(),
        ] {
            b.mix(v as u64);
        }
        let daemon_doorbell = b.array::<Doorbell>(1)?;
        let info = b.reserve(INFO_BYTES, 64)?;
        debug_assert_eq!(info, INFO_OFFSET);
        let slots = b.array::<ClientSlot>(u64::from(config.clients))?;
        let clients_base = b.reserve(0, PAGE)?;

        // One block, relative to a page-aligned base.
        let mut blk = LayoutBuilder { cursor: 0, hash: 0 };
        let request_header = blk.array::<RingHeader>(1)?;
        let request_slots = blk.array(u64::from(config.request_capacity))?;
        let response_header = blk.array::<RingHeader>(1)?;
        let response_slots = blk.array(u64::from(config.response_capacity))?;
        let response_doorbell = blk.array::<Doorbell>(1)?;
        let scratch = blk.reserve(config.scratch_bytes, PAGE)?;
        let client_stride = blk.finish()?.0.max(PAGE);
        b.mix(client_stride);
        b.mix(config.scratch_bytes);

        let blocks = client_stride
            .checked_mul(u64::from(config.clients))
            .ok_or(LayoutError::Overflow)?;
        b.reserve(blocks, PAGE)?;
        let user = b.reserve(config.user_bytes, PAGE)?;
        let (total_size, hash) = b.finish()?;
        Ok(Self {
            config,
            daemon_doorbell,
            info,
            slots,
            clients_base,
            client_stride,
            user,
            total_size,
            hash,
            block: ClientRegions {
                request_header,
                request_slots,
                response_header,
                response_slots,
                response_doorbell,
                scratch,
                scratch_len: config.scratch_bytes,
            },
            _types: PhantomData,
        })
    }

    /// Absolute offsets of client `index`'s block, `None` if out of range.
    pub fn client(&self, index: u32) -> Option<ClientRegions<Req, Resp>> {
        if index >= self.config.clients {
            return None;
        }
        let base = self
            .clients_base
            .checked_add(self.client_stride.checked_mul(u64::from(index))?)?;
        let b = &self.block;
        Some(ClientRegions {
            request_header: Offset::new(base + b.request_header.get()),
            request_slots: Offset::new(base + b.request_slots.get()),
            response_header: Offset::new(base + b.response_header.get()),
            response_slots: Offset::new(base + b.response_slots.get()),
            response_doorbell: Offset::new(base + b.response_doorbell.get()),
            scratch: base + b.scratch,
            scratch_len: b.scratch_len,
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn cfg() -> LayoutConfig {
        LayoutConfig {
            clients: 4,
            request_capacity: 64,
            response_capacity: 64,
            scratch_bytes: 4 << 20,
            user_bytes: 1 << 20,
            user_version: 1,
        }
    }

    #[test]
    fn offsets_are_aligned_disjoint_and_hash_is_sensitive() {
        let l = SegmentLayout::<[u64; 4], [u64; 2]>::new(cfg()).unwrap();
        assert_eq!(l.daemon_doorbell.get(), 64);
        assert_eq!(l.info, INFO_OFFSET);
        assert_eq!(l.slots.get(), INFO_OFFSET + INFO_BYTES);
        assert_eq!(l.clients_base % 4096, 0);
        let c0 = l.client(0).unwrap();
        let c3 = l.client(3).unwrap();
        assert!(l.client(4).is_none());
        assert_eq!(c0.request_header.get() % 128, 0);
        assert_eq!(c0.scratch % 4096, 0);
        assert!(c0.scratch + c0.scratch_len <= l.clients_base + l.client_stride);
        assert!(c3.scratch + c3.scratch_len <= l.user);
        assert!(l.user + (1 << 20) <= l.total_size);
        let again = SegmentLayout::<[u64; 4], [u64; 2]>::new(cfg()).unwrap();
        assert_eq!(l.hash, again.hash);
        let other_msg = SegmentLayout::<[u64; 5], [u64; 2]>::new(cfg()).unwrap();
        assert_ne!(l.hash, other_msg.hash);
        let other_cfg = SegmentLayout::<[u64; 4], [u64; 2]>::new(LayoutConfig {
            clients: 5,
            ..cfg()
        })
        .unwrap();
        assert_ne!(l.hash, other_cfg.hash);
        assert_eq!(
            SegmentLayout::<u64, u64>::new(LayoutConfig {
                request_capacity: 3,
                ..cfg()
            })
            .err(),
            Some(LayoutError::BadCapacity(3))
        );
    }
}
