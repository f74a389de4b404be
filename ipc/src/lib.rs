//! Shared-memory plumbing for radixd: a named segment with a checked header,
//! offsets instead of pointers, lock-free SPSC rings, futex doorbells (and
//! the spin-or-yield policy around them, `load`), a client slot table with
//! pid-reuse-proof liveness, reader epochs and per-record versions for lock-free readers in other
//! processes, scratch regions and a layout helper. It knows nothing about
//! caches.
//!
//! Modules whose code only makes sense over a real mapping (`segment`,
//! `liveness`, `scratch`) are compiled out under `--cfg loom`; the protocols
//! (`ring`, `doorbell`, `slots`) run unchanged under loom through [`sync`].

pub mod board;
pub mod copy;
pub mod doorbell;
pub mod epoch;
pub mod layout;
#[cfg(not(loom))]
pub mod liveness;
#[cfg(not(loom))]
pub mod load;
#[cfg(not(loom))]
pub mod mapfile;
pub mod ring;
#[cfg(not(loom))]
pub mod scratch;
#[cfg(not(loom))]
pub mod segment;
pub mod shm;
pub mod slots;
pub mod sync;
pub mod version;

pub use board::{Board, Taken, BOARD_DATA, BOARD_READERS, BOARD_SLOTS, HEAD_WORDS};
pub use doorbell::{Doorbell, Spin, Wake};
pub use epoch::{Blocked, Collector, EpochClock, ReaderSlot, Reclaimer};
pub use layout::{
    ClientRegions, LayoutBuilder, LayoutConfig, LayoutError, SegmentLayout, INFO_BYTES, INFO_OFFSET,
};
#[cfg(not(loom))]
pub use load::LoadSensor;
#[cfg(not(loom))]
pub use mapfile::{MapError, MappedFile, Part};
pub use ring::{
    Consumer, Entry as RingEntry, HeapRing, Producer, RingError, RingHeader, MAX_MESSAGE,
};
#[cfg(not(loom))]
pub use scratch::{Scratch, ScratchError};
#[cfg(not(loom))]
pub use segment::{ClientBlock, CreateError, HeaderInfo, OpenError, RegionError, Segment};
pub use shm::{Offset, Plain, ShmSafe};
pub use slots::{
    Claim, ClaimError, ClientSlot, LivenessError, SlotError, SlotLocks, SlotStatus, SlotTable,
    TableOutOfBounds, Tenancy,
};
pub use version::Version;
