//! A named shared-memory segment: a plain file under `/dev/shm`, mapped with
//! `memmap2::MmapRaw`, with a checked header at offset 0.
//!
//! Creation builds the whole segment under a temporary name (created
//! `O_EXCL` with an explicit mode, sized, daemon lock taken, header written,
//! `ready` set last) and then publishes it with `link(2)`, which fails if the
//! name exists: a client never sees a half-built segment, and two daemons
//! never both own a name. An existing name whose daemon lock is free is a
//! stale segment from a dead daemon: it is unlinked and replaced.

use core::fmt;
use core::ptr::NonNull;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use memmap2::MmapRaw;

use crate::doorbell::Doorbell;
use crate::layout::SegmentLayout;
use crate::liveness::{self, OfdLocks, DAEMON_BYTE};
use crate::ring::{Entry as RingEntry, RingHeader};
use crate::scratch::Scratch;
use crate::shm::{Offset, Plain, ShmSafe};
use crate::slots::{
    Claim, ClaimError, ClientSlot, LivenessError, SlotError, SlotTable, TableOutOfBounds,
};
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// Magic number at offset 0 ("RADIXSHM", little-endian).
pub const MAGIC: u64 = u64::from_le_bytes(*b"RADIXSHM");
/// Version of this crate's segment header layout.
pub const HEADER_VERSION: u32 = 1;
/// Directory holding segments.
pub const SHM_DIR: &str = "/dev/shm";
/// Size of [`SegmentHeader`]; user regions start at or after it.
pub const HEADER_SIZE: u64 = 64;

/// Header at offset 0 of every segment. Written once by the creator before
/// `ready` is set; read-only afterwards.
#[repr(C)]
#[derive(Debug)]
pub struct SegmentHeader {
    magic: AtomicU64,
    version: AtomicU32,
    _pad0: u32,
    layout_hash: AtomicU64,
    total_size: AtomicU64,
    daemon_pid: AtomicU64,
    incarnation: AtomicU64,
    /// Set to 1 last, with Release; pairs with Acquire in `open`.
    ready: AtomicU32,
    _pad1: u32,
    _reserved: u64,
}

const _: () = assert!(size_of::<SegmentHeader>() as u64 == HEADER_SIZE);

// SAFETY: std atomics and never-accessed padding; every bit pattern valid.
unsafe impl ShmSafe for SegmentHeader {}

/// What a segment's header says about its creator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderInfo {
    /// Header layout version.
    pub version: u32,
    /// Layout hash supplied by the creator.
    pub layout_hash: u64,
    /// Total mapped size in bytes.
    pub total_size: u64,
    /// Pid of the daemon that created the segment (informational).
    pub daemon_pid: u64,
    /// Value new for every daemon start.
    pub incarnation: u64,
}

/// Errors of [`Segment::create`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateError {
    /// Name empty, too long, or containing `/` or NUL, or starting with `.`.
    InvalidName,
    /// Size below [`HEADER_SIZE`] or not representable.
    InvalidSize(u64),
    /// A live daemon owns the name.
    AlreadyRunning,
    /// The name is taken by a file that is not provably a radixd segment
    /// (another program's file, a directory, a link): it is left alone.
    NotASegment,
    /// The file system holding segments has too little room.
    NoSpace {
        /// Bytes the segment needs.
        needed: u64,
        /// Bytes free for an unprivileged user when creation was tried.
        free: u64,
    },
    /// The OS refused access (e.g. another user's segment).
    PermissionDenied,
    /// Any other OS error.
    Io(io::ErrorKind),
}

/// Errors of [`Segment::open`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenError {
    /// Name empty, too long, or containing `/` or NUL, or starting with `.`.
    InvalidName,
    /// No segment of that name.
    NotFound,
    /// Not allowed to open it.
    PermissionDenied,
    /// Smaller than its header or than the size its header claims.
    TooSmall {
        /// Size of the file.
        file: u64,
        /// Size required.
        needed: u64,
    },
    /// Header not marked ready.
    NotReady,
    /// Not a radixd segment.
    BadMagic(u64),
    /// Header layout version differs.
    VersionMismatch {
        /// Our version.
        expected: u32,
        /// The segment's.
        found: u32,
    },
    /// The creator's layout hash differs from ours (different build/config).
    LayoutMismatch {
        /// Our hash.
        expected: u64,
        /// The segment's.
        found: u64,
    },
    /// The daemon that created it is dead (stale segment).
    DaemonDead,
    /// Any other OS error.
    Io(io::ErrorKind),
}

/// Errors of region resolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionError {
    /// `offset + len` overflows or exceeds the segment.
    OutOfBounds {
        /// Requested offset.
        offset: u64,
        /// Requested length in bytes.
        len: u64,
        /// Segment size.
        size: u64,
    },
    /// A client slot index beyond the layout's slots.
    NoSuchClient {
        /// The index asked for.
        index: u32,
        /// Slots in the layout.
        clients: u32,
    },
    /// Offset not aligned for the requested type.
    Misaligned {
        /// Requested offset.
        offset: u64,
        /// Required alignment.
        align: u64,
    },
}

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidName => f.write_str("invalid segment name"),
            Self::InvalidSize(s) => write!(f, "invalid segment size {s}"),
            Self::AlreadyRunning => f.write_str("a live daemon already owns this segment"),
            Self::NotASegment => f.write_str(
                "the name is taken by a file that is not a radixd segment; it was left alone",
            ),
            Self::NoSpace { needed, free } => write!(
                f,
                "the segment needs {} but only {} are free there (enlarge the tmpfs, \
                 e.g. docker --shm-size, or lower --capacity/--scratch-bytes)",
                human_bytes(*needed),
                human_bytes(*free)
            ),
            Self::PermissionDenied => f.write_str("permission denied creating segment"),
            Self::Io(k) => write!(f, "creating segment: {k}"),
        }
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidName => f.write_str("invalid segment name"),
            Self::NotFound => f.write_str("no such segment (is the daemon running?)"),
            Self::PermissionDenied => f.write_str("permission denied opening segment"),
            Self::TooSmall { file, needed } if *needed == HEADER_SIZE => {
                write!(
                    f,
                    "not a radixd segment ({file} bytes, smaller than a header)"
                )
            }
            Self::TooSmall { file, needed } => {
                write!(f, "segment is {file} bytes, its header says {needed}")
            }
            Self::NotReady => f.write_str("segment header not ready"),
            Self::BadMagic(m) => write!(f, "not a radixd segment (magic {m:#x})"),
            Self::VersionMismatch { expected, found } => {
                write!(f, "segment layout version {found}, expected {expected}")
            }
            Self::LayoutMismatch { expected, found } => {
                write!(f, "segment layout hash {found:#x}, expected {expected:#x} (different build or config)")
            }
            Self::DaemonDead => f.write_str("the daemon that created the segment is dead"),
            Self::Io(k) => write!(f, "opening segment: {k}"),
        }
    }
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OutOfBounds { offset, len, size } => {
                write!(f, "region {offset}+{len} outside segment of {size} bytes")
            }
            Self::NoSuchClient { index, clients } => {
                write!(f, "client slot {index} of {clients}")
            }
            Self::Misaligned { offset, align } => {
                write!(f, "offset {offset} not aligned to {align}")
            }
        }
    }
}

impl std::error::Error for CreateError {}
impl std::error::Error for OpenError {}
impl std::error::Error for RegionError {}

impl From<io::Error> for CreateError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::PermissionDenied => Self::PermissionDenied,
            k => Self::Io(k),
        }
    }
}

impl From<io::Error> for OpenError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::NotFound => Self::NotFound,
            io::ErrorKind::PermissionDenied => Self::PermissionDenied,
            k => Self::Io(k),
        }
    }
}

/// `bytes` for people: "279.3 MiB".
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Bytes an unprivileged user may still allocate in the file system of `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `statvfs` is a plain C struct for which all zero is valid.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `st` a valid out-pointer.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Gives `file` `size` bytes of real storage now, so that a full tmpfs is a
/// clean error here instead of a SIGBUS at the first touch of a sparse page.
fn reserve(file: &File, dir: &Path, size: u64) -> Result<(), CreateError> {
    use std::os::fd::AsRawFd;
    let len = libc::off_t::try_from(size).map_err(|_| CreateError::InvalidSize(size))?;
    // Refuse what cannot fit before asking for it: on tmpfs, fallocate takes
    // page after page of RAM until it fails, so a request larger than the
    // free room would first squeeze every other process of the host (the
    // OOM killer picks them, not us). fallocate still guards the race with
    // other allocations below.
    if let Some(free) = free_bytes(dir).filter(|&free| free < size) {
        return Err(CreateError::NoSpace { needed: size, free });
    }
    // SAFETY: `file` is an open, writable descriptor for the call's duration.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    match rc {
        0 => Ok(()),
        libc::ENOSPC | libc::EFBIG => Err(CreateError::NoSpace {
            needed: size,
            free: free_bytes(dir).unwrap_or(0),
        }),
        // A file system without fallocate: glibc already fell back to
        // writing; anything else is an ordinary I/O error.
        e => Err(io::Error::from_raw_os_error(e).into()),
    }
}

/// Opens an existing file for reading and writing without following a
/// symbolic link or blocking on a FIFO, and only if it is a regular file.
/// `Ok(None)` for anything else under the name.
fn open_regular(path: &Path) -> io::Result<Option<File>> {
    let opened = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    match opened {
        Ok(file) => Ok(file.metadata()?.is_file().then_some(file)),
        // A directory, a symbolic link, a device without a reader.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EISDIR | libc::ELOOP | libc::ENXIO)
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 200 && !name.starts_with('.') && !name.contains(['/', '\0'])
}

/// A mapped segment. The creator (daemon) unlinks it on drop.
#[derive(Debug)]
pub struct Segment {
    map: MmapRaw,
    file: File,
    path: PathBuf,
    /// `(dev, ino)` of our file, to never unlink someone else's.
    id: (u64, u64),
    owner: bool,
    claim: Mutex<Option<Claim>>,
}

/// One client slot's shared pieces, resolved inside a mapping
/// ([`Segment::client_block`]).
pub struct ClientBlock<'s, Req, Resp> {
    /// Request ring state (the client produces, the daemon consumes).
    pub request_header: &'s RingHeader,
    /// Request ring entries.
    pub request_slots: &'s [RingEntry<Req>],
    /// Response ring state (the daemon produces, the client consumes).
    pub response_header: &'s RingHeader,
    /// Response ring entries.
    pub response_slots: &'s [RingEntry<Resp>],
    /// The doorbell the daemon rings after posting a response.
    pub response_doorbell: &'s Doorbell,
    /// The client's scratch area.
    pub scratch: Scratch<'s>,
}

/// Removes a temporary file on early return.
struct TmpGuard(Option<PathBuf>);

impl Drop for TmpGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn incarnation() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // Mix in the pid so two daemons started in the same nanosecond differ.
    (nanos ^ (u64::from(std::process::id()) << 40)) | 1
}

impl Segment {
    /// Creates segment `name` of `size` bytes with permission bits `mode`
    /// (0o600 for the daemon's user only, 0o660 to admit its group), stamped
    /// with `layout_hash`. Takes over a stale segment left by a dead daemon;
    /// fails with [`CreateError::AlreadyRunning`] if its daemon is alive.
    pub fn create(
        name: &str,
        size: u64,
        mode: u32,
        layout_hash: u64,
    ) -> Result<Segment, CreateError> {
        Self::create_in(Path::new(SHM_DIR), name, size, mode, layout_hash)
    }

    /// [`Segment::create`] in directory `dir` (tests, non-default tmpfs).
    pub fn create_in(
        dir: &Path,
        name: &str,
        size: u64,
        mode: u32,
        layout_hash: u64,
    ) -> Result<Segment, CreateError> {
        if !valid_name(name) {
            return Err(CreateError::InvalidName);
        }
        let len = usize::try_from(size).map_err(|_| CreateError::InvalidSize(size))?;
        if size < HEADER_SIZE || isize::try_from(len).is_err() {
            return Err(CreateError::InvalidSize(size));
        }
        let path = dir.join(name);
        let tmp = dir.join(format!(
            ".{name}.{}.{:x}",
            std::process::id(),
            incarnation()
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true) // O_CREAT | O_EXCL
            .mode(mode & 0o777)
            .custom_flags(libc::O_CLOEXEC)
            .open(&tmp)?;
        let mut guard = TmpGuard(Some(tmp.clone()));
        // Explicit chmod: the umask may have masked bits of `mode`.
        file.set_permissions(std::fs::Permissions::from_mode(mode & 0o777))?;
        reserve(&file, dir, size)?;
        if !liveness::try_lock(file.as_fd(), DAEMON_BYTE)? {
            return Err(CreateError::Io(io::ErrorKind::WouldBlock));
        }
        let map = memmap2::MmapOptions::new().len(len).map_raw(&file)?;
        let meta = file.metadata()?;
        let seg = Segment {
            map,
            file,
            path,
            id: (meta.dev(), meta.ino()),
            owner: false, // becomes the owner once published under `name`
            claim: Mutex::new(None),
        };
        let h = seg.header();
        // Relaxed: all published by the Release store of `ready` below.
        h.magic.store(MAGIC, Ordering::Relaxed);
        h.version.store(HEADER_VERSION, Ordering::Relaxed);
        h.layout_hash.store(layout_hash, Ordering::Relaxed);
        h.total_size.store(size, Ordering::Relaxed);
        h.daemon_pid
            .store(u64::from(std::process::id()), Ordering::Relaxed);
        h.incarnation.store(incarnation(), Ordering::Relaxed);
        // Release: publishes the header; pairs with Acquire in `open`.
        h.ready.store(1, Ordering::Release);

        let mut seg = seg;
        // A few attempts: after a stale segment is removed, the link must win
        // unless another daemon raced us to it.
        for _ in 0..3 {
            match std::fs::hard_link(&tmp, &seg.path) {
                Ok(()) => {
                    seg.owner = true;
                    drop(guard.0.take().map(std::fs::remove_file));
                    return Ok(seg);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => remove_stale(&seg.path)?,
                Err(e) => return Err(e.into()),
            }
        }
        Err(CreateError::AlreadyRunning)
    }

    /// Opens segment `name`, refusing a wrong magic, version or layout hash,
    /// a truncated file, or a segment whose daemon is dead.
    pub fn open(name: &str, layout_hash: u64) -> Result<Segment, OpenError> {
        Self::open_in(Path::new(SHM_DIR), name, layout_hash)
    }

    /// [`Segment::open`] in directory `dir`.
    pub fn open_in(dir: &Path, name: &str, layout_hash: u64) -> Result<Segment, OpenError> {
        Self::open_checked(dir, name, Some(layout_hash))
    }

    /// Opens segment `name` checking everything [`Segment::open`] does but
    /// the layout hash, for a peer that learns the layout from the segment
    /// itself; it must then compare its own hash with [`Segment::info`].
    pub fn open_unverified(name: &str) -> Result<Segment, OpenError> {
        Self::open_checked(Path::new(SHM_DIR), name, None)
    }

    /// [`Segment::open_unverified`] in directory `dir`.
    pub fn open_unverified_in(dir: &Path, name: &str) -> Result<Segment, OpenError> {
        Self::open_checked(dir, name, None)
    }

    fn open_checked(
        dir: &Path,
        name: &str,
        layout_hash: Option<u64>,
    ) -> Result<Segment, OpenError> {
        if !valid_name(name) {
            return Err(OpenError::InvalidName);
        }
        let path = dir.join(name);
        let file = open_regular(&path)?.ok_or(OpenError::BadMagic(0))?;
        let meta = file.metadata()?;
        let file_len = meta.len();
        if file_len < HEADER_SIZE {
            return Err(OpenError::TooSmall {
                file: file_len,
                needed: HEADER_SIZE,
            });
        }
        let len =
            usize::try_from(file_len).map_err(|_| OpenError::Io(io::ErrorKind::InvalidData))?;
        let map = memmap2::MmapOptions::new().len(len).map_raw(&file)?;
        let seg = Segment {
            map,
            file,
            path,
            id: (meta.dev(), meta.ino()),
            owner: false,
            claim: Mutex::new(None),
        };
        let h = seg.header();
        // Magic first: a foreign file is "not a radixd segment", whatever
        // its other bytes say. Relaxed: a name is only ever linked to a
        // segment whose header is complete (see `create`), so the magic of a
        // real segment is never seen half-written.
        let magic = h.magic.load(Ordering::Relaxed);
        if magic != MAGIC {
            return Err(OpenError::BadMagic(magic));
        }
        // Acquire: pairs with the Release store of `ready` in `create`.
        if h.ready.load(Ordering::Acquire) != 1 {
            return Err(OpenError::NotReady);
        }
        let info = seg.info();
        if info.version != HEADER_VERSION {
            return Err(OpenError::VersionMismatch {
                expected: HEADER_VERSION,
                found: info.version,
            });
        }
        if let Some(expected) = layout_hash.filter(|&h| h != info.layout_hash) {
            return Err(OpenError::LayoutMismatch {
                expected,
                found: info.layout_hash,
            });
        }
        if info.total_size != file_len {
            return Err(OpenError::TooSmall {
                file: file_len,
                needed: info.total_size,
            });
        }
        if !seg.is_daemon_alive().map_err(|e| OpenError::Io(e.0))? {
            return Err(OpenError::DaemonDead);
        }
        Ok(seg)
    }

    fn header(&self) -> &SegmentHeader {
        // SAFETY: the mapping is page-aligned and at least HEADER_SIZE bytes
        // (checked by create/open), and `SegmentHeader` is `ShmSafe`: atomics
        // valid for any bit pattern, so a shared reference is sound while
        // peers write.
        unsafe { &*self.map.as_ptr().cast::<SegmentHeader>() }
    }

    /// The header's contents.
    pub fn info(&self) -> HeaderInfo {
        let h = self.header();
        // Relaxed: immutable after `ready`, which create/open ordered.
        HeaderInfo {
            version: h.version.load(Ordering::Relaxed),
            layout_hash: h.layout_hash.load(Ordering::Relaxed),
            total_size: h.total_size.load(Ordering::Relaxed),
            daemon_pid: h.daemon_pid.load(Ordering::Relaxed),
            incarnation: h.incarnation.load(Ordering::Relaxed),
        }
    }

    /// Size of the mapping in bytes.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Always false: a segment holds at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Path of the segment file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this handle created the segment (and unlinks it on drop).
    pub fn is_owner(&self) -> bool {
        self.owner
    }

    /// Whether the daemon holding the segment's lock is alive. For the
    /// creator itself this reports false (own locks are invisible to it).
    pub fn is_daemon_alive(&self) -> Result<bool, LivenessError> {
        Ok(liveness::is_locked(self.file.as_fd(), DAEMON_BYTE)?)
    }

    /// Whether the client in slot `index` holds its liveness lock (probed
    /// through this handle's own file description).
    pub fn is_client_alive(&self, index: u32) -> Result<bool, LivenessError> {
        Ok(liveness::is_locked(
            self.file.as_fd(),
            liveness::client_byte(index),
        )?)
    }

    /// Bounds-checked pointer to `len` bytes at `offset`.
    pub fn region(&self, offset: u64, len: u64) -> Result<NonNull<u8>, RegionError> {
        let size = self.len();
        let oob = RegionError::OutOfBounds { offset, len, size };
        let end = offset.checked_add(len).ok_or(oob)?;
        if end > size {
            return Err(oob);
        }
        let off = usize::try_from(offset).map_err(|_| oob)?;
        // SAFETY: `offset <= size`, so the result stays within (or one past)
        // the mapping.
        let ptr = unsafe { self.map.as_mut_ptr().add(off) };
        NonNull::new(ptr).ok_or(oob)
    }

    fn typed<T>(&self, offset: u64, count: u64) -> Result<NonNull<T>, RegionError> {
        let align = align_of::<T>() as u64;
        if offset % align != 0 {
            return Err(RegionError::Misaligned { offset, align });
        }
        let size = self.len();
        let bytes = (size_of::<T>() as u64)
            .checked_mul(count)
            .ok_or(RegionError::OutOfBounds {
                offset,
                len: u64::MAX,
                size,
            })?;
        Ok(self.region(offset, bytes)?.cast())
    }

    /// A checked shared reference to the `T` at `offset`.
    pub fn get<T: ShmSafe>(&self, offset: Offset<T>) -> Result<&T, RegionError> {
        let ptr = self.typed::<T>(offset.get(), 1)?;
        // SAFETY: in bounds and aligned (checked; the mapping is page
        // aligned), lives as long as `self`, and `T: ShmSafe` is valid for
        // any bits and only mutated through atomics/UnsafeCell.
        Ok(unsafe { ptr.as_ref() })
    }

    /// A checked shared slice of `count` `T`s at `offset`.
    pub fn slice<T: ShmSafe>(&self, offset: Offset<T>, count: u64) -> Result<&[T], RegionError> {
        let ptr = self.typed::<T>(offset.get(), count)?;
        let n = usize::try_from(count).map_err(|_| RegionError::OutOfBounds {
            offset: offset.get(),
            len: count,
            size: self.len(),
        })?;
        // SAFETY: as in `get`, for `count` contiguous elements.
        Ok(unsafe { core::slice::from_raw_parts(ptr.as_ptr(), n) })
    }

    /// A bounds-checked scratch region of `len` bytes at `offset`.
    pub fn scratch(&self, offset: u64, len: u64) -> Result<Scratch<'_>, RegionError> {
        let ptr = self.region(offset, len)?;
        // SAFETY: `region` checked that `len` bytes at `ptr` lie within the
        // mapping, which outlives the returned borrow of `self`.
        Ok(unsafe { Scratch::from_raw(ptr, len) })
    }

    /// The client slot table at `offset` (`count` slots), probing liveness
    /// through this handle.
    pub fn slots(
        &self,
        offset: Offset<ClientSlot>,
        count: u32,
    ) -> Result<SlotTable<'_, OfdLocks<'_>>, RegionError> {
        let slots = self.slice(offset, u64::from(count))?;
        Ok(SlotTable::new(slots, OfdLocks::new(self.file.as_fd())))
    }

    /// The rings, doorbell and scratch of client slot `index` of `layout`,
    /// resolved and bounds-checked: what the daemon and the client each
    /// build their end of the rings from.
    pub fn client_block<Req: Plain, Resp: Plain>(
        &self,
        layout: &SegmentLayout<Req, Resp>,
        index: u32,
    ) -> Result<ClientBlock<'_, Req, Resp>, RegionError> {
        let c = layout.client(index).ok_or(RegionError::NoSuchClient {
            index,
            clients: layout.config.clients,
        })?;
        Ok(ClientBlock {
            request_header: self.get(c.request_header)?,
            request_slots: self
                .slice(c.request_slots, u64::from(layout.config.request_capacity))?,
            response_header: self.get(c.response_header)?,
            response_slots: self
                .slice(c.response_slots, u64::from(layout.config.response_capacity))?,
            response_doorbell: self.get(c.response_doorbell)?,
            scratch: self.scratch(c.scratch, c.scratch_len)?,
        })
    }

    /// The slot table for this process's own claim.
    fn own_slots(
        &self,
        offset: Offset<ClientSlot>,
        count: u32,
    ) -> Result<SlotTable<'_, OfdLocks<'_>>, TableOutOfBounds> {
        self.slots(offset, count).map_err(|_| TableOutOfBounds {
            offset: offset.get(),
            count,
        })
    }

    /// Claims a client slot for this process (at most one per handle) and
    /// publishes the claim; the daemon adopts it (resets its rings, marks it
    /// ACTIVE) before it may be used: see [`Segment::is_adopted`].
    pub fn claim_slot(&self, offset: Offset<ClientSlot>, count: u32) -> Result<Claim, ClaimError> {
        let table = self.own_slots(offset, count)?;
        let mut held = self.claim.lock().unwrap_or_else(|p| p.into_inner());
        if held.is_some() {
            return Err(ClaimError::AlreadyClaimed);
        }
        let claim = table.claim(std::process::id())?;
        *held = Some(claim);
        Ok(claim)
    }

    /// Whether the daemon has adopted this handle's claim (its rings are
    /// reset and published); false without a claim.
    pub fn is_adopted(&self, offset: Offset<ClientSlot>, count: u32) -> bool {
        let held = *self.claim.lock().unwrap_or_else(|p| p.into_inner());
        match (held, self.own_slots(offset, count)) {
            (Some(claim), Ok(table)) => table.is_current(claim),
            _ => false,
        }
    }

    /// Releases the claim taken by [`Segment::claim_slot`].
    pub fn release_slot(&self, offset: Offset<ClientSlot>, count: u32) -> Result<(), SlotError> {
        let table = self.own_slots(offset, count)?;
        let mut held = self.claim.lock().unwrap_or_else(|p| p.into_inner());
        match held.take() {
            Some(claim) => table.release(claim),
            None => Err(SlotError::Stale),
        }
    }
}

/// Removes `path` if it provably is a stale radixd segment: a regular file
/// with radixd's magic whose daemon lock is free. Anything else under the
/// name is left alone ([`CreateError::NotASegment`]).
///
/// The probe and the unlink happen while this process holds the stale
/// file's daemon lock, so two daemons taking over at once cannot both get
/// past the probe, and a fresh segment published meanwhile (by `link`,
/// which never replaces a name) cannot be the file unlinked: the unlink is
/// checked against the very inode that was probed and locked.
fn remove_stale(path: &Path) -> Result<(), CreateError> {
    let existing = match open_regular(path) {
        Ok(Some(f)) => f,
        Ok(None) => return Err(CreateError::NotASegment),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let mut magic = [0u8; 8];
    {
        use std::os::unix::fs::FileExt;
        match existing.read_exact_at(&mut magic, 0) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(CreateError::NotASegment)
            }
            Err(e) => return Err(e.into()),
        }
    }
    if u64::from_le_bytes(magic) != MAGIC {
        return Err(CreateError::NotASegment);
    }
    // Taking the daemon lock both proves the old daemon dead and keeps any
    // other daemon from taking the same file over until we are done.
    if !liveness::try_lock(existing.as_fd(), DAEMON_BYTE)? {
        return Err(CreateError::AlreadyRunning);
    }
    let probed = existing.metadata()?;
    match std::fs::symlink_metadata(path) {
        Ok(now) if now.dev() == probed.dev() && now.ino() == probed.ino() => {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e.into()),
                _ => Ok(()),
            }
        }
        _ => Ok(()),
    }
    // Dropping `existing` releases the lock on the unlinked file.
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.owner {
            if let Ok(meta) = std::fs::metadata(&self.path) {
                if (meta.dev(), meta.ino()) == self.id {
                    let _ = std::fs::remove_file(&self.path);
                }
            }
        }
        // Closing `file` (after this) drops our OFD locks.
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
